//! Typed requests and answers of the snapshot ops: the writer or manager `put`s a request, the
//! node `read`s it (and the other way for answers), and neither spells which field carries
//! what.

use crate::{DecodeError, Header};

/// `Snapshot`: take snapshot `id` (never 0) of the replica; `created` in seconds since the
/// Unix epoch. `Rollback` and `SnapshotDelete` name the snapshot the same way (`created` 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotRequest {
    pub id: u64,
    pub created: u64,
}

impl SnapshotRequest {
    pub fn put(&self, h: &mut Header) {
        h.offset = self.id;
        h.length = self.created;
    }
    pub fn read(h: &Header) -> Result<SnapshotRequest, DecodeError> {
        if h.offset == 0 {
            return Err(DecodeError::MalformedPayload {
                what: "snapshot id 0 is reserved",
            });
        }
        Ok(SnapshotRequest {
            id: h.offset,
            created: h.length,
        })
    }
}

/// `SnapshotRead`: `[offset, offset+length)` of snapshot `id` (the payload, 8 bytes LE).
pub fn snapshot_id_payload(id: u64) -> Vec<u8> {
    id.to_le_bytes().to_vec()
}

/// The snapshot id a `SnapshotRead` names.
pub fn read_snapshot_id(payload: &[u8]) -> Result<u64, DecodeError> {
    match <[u8; 8]>::try_from(payload).map(u64::from_le_bytes) {
        Ok(id) if id != 0 => Ok(id),
        _ => Err(DecodeError::MalformedPayload {
            what: "a snapshot id is 8 bytes, not 0",
        }),
    }
}

/// `SnapshotChanged`: which blocks of `[offset, offset+length)` differ between snapshot `from`
/// and version `to` (another snapshot, or the replica now for `None`). The payload is 16
/// bytes LE: `from`, then `to` (0 for the replica now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangedRequest {
    pub from: u64,
    pub to: Option<u64>,
}

/// The flag of an extent `SnapshotChanged` answers with: its blocks changed.
pub const EXTENT_CHANGED: u32 = 1;

impl ChangedRequest {
    pub fn payload(&self) -> Vec<u8> {
        let mut b = self.from.to_le_bytes().to_vec();
        b.extend_from_slice(&self.to.unwrap_or(0).to_le_bytes());
        b
    }
    pub fn read(payload: &[u8]) -> Result<ChangedRequest, DecodeError> {
        let Ok(b) = <[u8; 16]>::try_from(payload) else {
            return Err(DecodeError::MalformedPayload {
                what: "a changed-blocks request is 16 bytes",
            });
        };
        let from = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        let to = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
        if from == 0 {
            return Err(DecodeError::MalformedPayload {
                what: "snapshot id 0 is reserved",
            });
        }
        Ok(ChangedRequest {
            from,
            to: (to != 0).then_some(to),
        })
    }
}

/// The extents covering exactly `[offset, offset+len)` that say which of it is in `changed`
/// (byte ranges in order, within it): flag [`EXTENT_CHANGED`] or 0.
pub fn changed_extents(offset: u64, len: u64, changed: &[(u64, u64)]) -> Vec<crate::Extent> {
    let mut out = Vec::with_capacity(2 * changed.len() + 1);
    let mut pos = offset;
    let end = offset + len;
    for &(a, n) in changed {
        let (a, b) = (a.max(pos), (a + n).min(end));
        if a >= b {
            continue;
        }
        if a > pos {
            out.push(crate::Extent {
                length: a - pos,
                flags: 0,
            });
        }
        out.push(crate::Extent {
            length: b - a,
            flags: EXTENT_CHANGED,
        });
        pos = b;
    }
    if pos < end {
        out.push(crate::Extent {
            length: end - pos,
            flags: 0,
        });
    }
    out
}

/// One snapshot as a node lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedSnapshot {
    pub id: u64,
    pub created: u64,
    /// Bytes only this snapshot holds on the node's copy.
    pub exclusive_bytes: u64,
    /// Its size in bytes; 0 from a node that did not say (one from before snapshots had
    /// sizes, whose snapshots all have the replica's size).
    pub size: u64,
}

const LISTED_LEN: usize = 24;
/// A `SnapshotList` request with this `length` asks for entries with each snapshot's size
/// ([`LISTED_SIZED_LEN`] bytes each); the answer's `length` is this when it holds them. A
/// node from before answers 24-byte entries with `length` 0 (it ignores the request's).
pub const LIST_SIZED: u64 = 32;
const LISTED_SIZED_LEN: usize = 32;

/// `SnapshotList`'s answer: the replica's snapshots, oldest first, 24 bytes each, or 32 with
/// their sizes if `sized`.
pub fn encode_snapshot_list(list: &[ListedSnapshot], sized: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(list.len() * LISTED_SIZED_LEN);
    for s in list {
        b.extend_from_slice(&s.id.to_le_bytes());
        b.extend_from_slice(&s.created.to_le_bytes());
        b.extend_from_slice(&s.exclusive_bytes.to_le_bytes());
        if sized {
            b.extend_from_slice(&s.size.to_le_bytes());
        }
    }
    b
}

/// Decodes a `SnapshotList` answer whose header's `length` is `length` ([`LIST_SIZED`]: with
/// sizes).
pub fn decode_snapshot_list(b: &[u8], length: u64) -> Result<Vec<ListedSnapshot>, DecodeError> {
    let sized = length == LIST_SIZED;
    let n = if sized { LISTED_SIZED_LEN } else { LISTED_LEN };
    if !b.len().is_multiple_of(n) {
        return Err(DecodeError::MalformedPayload {
            what: "a snapshot list is a whole number of 24- or 32-byte entries",
        });
    }
    let u = |c: &[u8], at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&c[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let list: Vec<ListedSnapshot> = b
        .chunks_exact(n)
        .map(|c| ListedSnapshot {
            id: u(c, 0),
            created: u(c, 8),
            exclusive_bytes: u(c, 16),
            size: if sized { u(c, 24) } else { 0 },
        })
        .collect();
    if sized
        && list
            .iter()
            .any(|s| s.size == 0 || !s.size.is_multiple_of(4096))
    {
        return Err(DecodeError::MalformedPayload {
            what: "a snapshot's size in a list is 0 or not a multiple of 4096",
        });
    }
    if list.iter().any(|s| s.id == 0) {
        return Err(DecodeError::MalformedPayload {
            what: "snapshot id 0 in a list",
        });
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_lists_round_trip_and_bad_ones_are_refused() {
        let mut h = Header::default();
        let r = SnapshotRequest { id: 7, created: 99 };
        r.put(&mut h);
        assert_eq!(SnapshotRequest::read(&h), Ok(r));
        h.offset = 0;
        assert!(SnapshotRequest::read(&h).is_err());
        assert_eq!(read_snapshot_id(&snapshot_id_payload(5)), Ok(5));
        assert!(read_snapshot_id(&[0; 8]).is_err() && read_snapshot_id(&[1; 7]).is_err());
        let mut list = vec![
            ListedSnapshot {
                id: 1,
                created: 2,
                exclusive_bytes: 4096,
                size: 1 << 20,
            },
            ListedSnapshot {
                id: 9,
                created: 3,
                exclusive_bytes: 0,
                size: 2 << 20,
            },
        ];
        let b = encode_snapshot_list(&list, true);
        assert_eq!(b.len(), 64);
        assert_eq!(decode_snapshot_list(&b, LIST_SIZED), Ok(list.clone()));
        assert!(decode_snapshot_list(&b[..40], LIST_SIZED).is_err());
        let mut bad = b.clone();
        bad[56..64].copy_from_slice(&4095u64.to_le_bytes());
        assert!(decode_snapshot_list(&bad, LIST_SIZED).is_err());
        // A node from before: 24-byte entries, sizes not said.
        let old = encode_snapshot_list(&list, false);
        for s in &mut list {
            s.size = 0;
        }
        assert_eq!(decode_snapshot_list(&old, 0), Ok(list));
        assert!(decode_snapshot_list(&old[..30], 0).is_err());
        assert!(decode_snapshot_list(&[0; 24], 0).is_err());
        for c in [
            ChangedRequest { from: 3, to: None },
            ChangedRequest {
                from: 3,
                to: Some(8),
            },
        ] {
            assert_eq!(ChangedRequest::read(&c.payload()), Ok(c));
        }
        assert!(ChangedRequest::read(&[0; 16]).is_err());
        assert!(ChangedRequest::read(&[1; 15]).is_err());
    }

    #[test]
    fn changed_extents_cover_the_range_exactly() {
        let e = |length, flags| crate::Extent { length, flags };
        assert_eq!(changed_extents(0, 100, &[]), vec![e(100, 0)]);
        assert_eq!(
            changed_extents(10, 100, &[(0, 20), (50, 10), (100, 50)]),
            vec![e(10, 1), e(30, 0), e(10, 1), e(40, 0), e(10, 1)]
        );
        assert_eq!(changed_extents(0, 8, &[(0, 8)]), vec![e(8, 1)]);
    }
}

/// `CreateClone`'s payload, 16 bytes LE: the parent's volume id, then its snapshot's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloneRequest {
    pub parent: u64,
    pub snapshot: u64,
}

impl CloneRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.parent.to_le_bytes().to_vec();
        v.extend_from_slice(&self.snapshot.to_le_bytes());
        v
    }
    pub fn decode(payload: &[u8]) -> Result<CloneRequest, DecodeError> {
        let bad = DecodeError::MalformedPayload {
            what: "a clone request is 16 bytes: the parent's id, then a snapshot id not 0",
        };
        if payload.len() != 16 {
            return Err(bad);
        }
        let u = |i: usize| u64::from_le_bytes(payload[i..i + 8].try_into().expect("8 bytes"));
        let (parent, snapshot) = (u(0), u(8));
        if snapshot == 0 {
            return Err(bad);
        }
        Ok(CloneRequest { parent, snapshot })
    }
}
