//! Typed answers of the node ops that answer in the header's fields as well as in the
//! payload: the node writes one with `put`, the writer or manager reads it with `read`, and
//! neither side spells which field carries what.

use crate::{decode_extents_within, encode_extents, DecodeError, Extent, Header};

/// `Attach`: the replica's incarnation, and its size (`None` from a node from before resizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachAnswer {
    pub incarnation: u64,
    pub size: Option<u64>,
}

impl AttachAnswer {
    pub fn put(&self, h: &mut Header) {
        h.length = self.incarnation;
        h.offset = self.size.unwrap_or(0);
    }
    pub fn read(h: &Header) -> AttachAnswer {
        AttachAnswer {
            incarnation: h.length,
            size: (h.offset != 0).then_some(h.offset),
        }
    }
}

/// `ReplicaInfo`: what the replica is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaInfoAnswer {
    pub size: u64,
    pub allocated_bytes: u64,
    pub epoch: u64,
    pub incarnation: u64,
    /// `None` from a node from before it.
    pub integrity: Option<ReplicaIntegrity>,
}

/// What a node knows of a copy's integrity until a scrub verifies it (issue 63).
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | flags: bit 0 `unclean` |
/// | 4..8 | zero |
/// | 8..16 | `bad_blocks` |
/// | 16..24 | `last_bad_offset` |
/// | 24..32 | `token` |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplicaIntegrity {
    /// The node stopped uncleanly with the copy open; no scrub has verified it since.
    pub unclean: bool,
    /// Reads that met a block failing its checksum since the last scrub verified the copy.
    pub bad_blocks: u64,
    /// The last such block's offset.
    pub last_bad_offset: u64,
    /// Names this state: a scrub that ends hands it back in `Verified`.
    pub token: u64,
}

const INTEGRITY_LEN: usize = 32;

impl ReplicaIntegrity {
    /// Nothing to verify.
    pub fn is_clean(&self) -> bool {
        !self.unclean && self.bad_blocks == 0
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&u32::from(self.unclean).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.bad_blocks.to_le_bytes());
        out.extend_from_slice(&self.last_bad_offset.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
    }

    fn decode(b: &[u8; INTEGRITY_LEN]) -> Result<ReplicaIntegrity, DecodeError> {
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let flags = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if flags > 1 || b[4..8] != [0; 4] {
            return Err(DecodeError::MalformedPayload {
                what: "a replica's integrity flags have unknown bits",
            });
        }
        Ok(ReplicaIntegrity {
            unclean: flags == 1,
            bad_blocks: word(8),
            last_bad_offset: word(16),
            token: word(24),
        })
    }
}

impl ReplicaInfoAnswer {
    pub fn put(&self, h: &mut Header) -> Vec<u8> {
        h.length = self.size;
        h.offset = self.allocated_bytes;
        h.epoch = self.epoch;
        let mut out = self.incarnation.to_le_bytes().to_vec();
        if let Some(i) = &self.integrity {
            i.encode(&mut out);
        }
        out
    }
    pub fn read(h: &Header, payload: &[u8]) -> Result<ReplicaInfoAnswer, DecodeError> {
        let (inc, rest) = match payload.len() {
            8 | 40 => payload.split_at(8),
            _ => {
                return Err(DecodeError::MalformedPayload {
                    what: "a replica's info is 8 bytes, or 40 with its integrity",
                })
            }
        };
        let incarnation = u64::from_le_bytes(inc.try_into().expect("8 bytes"));
        let integrity = match <&[u8; INTEGRITY_LEN]>::try_from(rest) {
            Ok(b) => Some(ReplicaIntegrity::decode(b)?),
            Err(_) => None,
        };
        Ok(ReplicaInfoAnswer {
            size: h.length,
            allocated_bytes: h.offset,
            epoch: h.epoch,
            incarnation,
            integrity,
        })
    }
}

/// `Ping`: the node's id (as text, what a person reads in a capture) and the most its
/// replicas may hold (`None`: no limit set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingAnswer {
    pub node: String,
    pub capacity: Option<u64>,
}

impl PingAnswer {
    pub fn put(&self, h: &mut Header) -> Vec<u8> {
        h.length = self.capacity.unwrap_or(0);
        self.node.as_bytes().to_vec()
    }
    pub fn read(h: &Header, payload: &[u8]) -> PingAnswer {
        PingAnswer {
            node: String::from_utf8_lossy(payload).into_owned(),
            capacity: (h.length > 0).then_some(h.length),
        }
    }
}

/// `Checksum`: crc32c of the range asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChecksumAnswer {
    pub crc: u32,
}

impl ChecksumAnswer {
    pub fn put(&self, h: &mut Header) {
        h.length = u64::from(self.crc);
    }
    pub fn read(h: &Header) -> Result<ChecksumAnswer, DecodeError> {
        u32::try_from(h.length)
            .map(|crc| ChecksumAnswer { crc })
            .map_err(|_| DecodeError::MalformedPayload {
                what: "a checksum is 32 bits",
            })
    }
}

/// `ActivityQuery`: the extents of the range asked about that the replica's activity log
/// holds, the epoch of the log (0: the node has none, it restarted), and its extent size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityAnswer {
    pub epoch: u64,
    pub extent: u64,
    pub extents: Vec<Extent>,
}

impl ActivityAnswer {
    pub fn put(&self, h: &mut Header) -> Vec<u8> {
        h.epoch = self.epoch;
        h.length = self.extent;
        encode_extents(&self.extents)
    }
    /// `span`: the length of the range asked about, which the extents may not run past.
    pub fn read(h: &Header, payload: &[u8], span: u64) -> Result<ActivityAnswer, DecodeError> {
        Ok(ActivityAnswer {
            epoch: h.epoch,
            extent: h.length,
            extents: decode_extents_within(payload, span)?,
        })
    }
}

/// `DirtyQuery`: what a peer missed in the range asked about, by the record of the epoch and
/// the peer's incarnation it was kept for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyAnswer {
    pub epoch: u64,
    pub incarnation: u64,
    pub extents: Vec<Extent>,
}

impl DirtyAnswer {
    pub fn put(&self, h: &mut Header) -> Vec<u8> {
        h.epoch = self.epoch;
        h.length = self.incarnation;
        encode_extents(&self.extents)
    }
    /// `span`: the length of the range asked about, which the extents may not run past.
    pub fn read(h: &Header, payload: &[u8], span: u64) -> Result<DirtyAnswer, DecodeError> {
        Ok(DirtyAnswer {
            epoch: h.epoch,
            incarnation: h.length,
            extents: decode_extents_within(payload, span)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Op, Status};

    #[test]
    fn answers_read_back_what_was_put() {
        let mut h = Header::request(Op::Attach, 1).response(Status::Ok);
        let a = AttachAnswer {
            incarnation: 7,
            size: Some(1 << 30),
        };
        a.put(&mut h);
        assert_eq!(AttachAnswer::read(&h), a);
        let mut i = ReplicaInfoAnswer {
            size: 4096,
            allocated_bytes: 0,
            epoch: 3,
            incarnation: 9,
            integrity: None,
        };
        let p = i.put(&mut h);
        assert_eq!(ReplicaInfoAnswer::read(&h, &p).unwrap(), i);
        assert!(ReplicaInfoAnswer::read(&h, &p[..7]).is_err());
        i.integrity = Some(ReplicaIntegrity {
            unclean: true,
            bad_blocks: 2,
            last_bad_offset: 1 << 20,
            token: 77,
        });
        let mut p = i.put(&mut h);
        assert_eq!(p.len(), 40);
        assert_eq!(ReplicaInfoAnswer::read(&h, &p).unwrap(), i);
        assert!(ReplicaInfoAnswer::read(&h, &p[..39]).is_err());
        p[9] = 1;
        assert!(ReplicaInfoAnswer::read(&h, &p).is_err(), "unknown flags");
        let d = DirtyAnswer {
            epoch: 2,
            incarnation: 5,
            extents: vec![Extent {
                length: 8192,
                flags: 1,
            }],
        };
        let p = d.put(&mut h);
        assert_eq!(DirtyAnswer::read(&h, &p, 8192).unwrap(), d);
        assert!(DirtyAnswer::read(&h, &p, 4096).is_err());
        let mut h = Header::request(Op::Checksum, 1);
        h.length = 1 << 32;
        assert!(ChecksumAnswer::read(&h).is_err());
    }
}
