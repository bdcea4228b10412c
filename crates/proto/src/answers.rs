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
}

impl ReplicaInfoAnswer {
    pub fn put(&self, h: &mut Header) -> Vec<u8> {
        h.length = self.size;
        h.offset = self.allocated_bytes;
        h.epoch = self.epoch;
        self.incarnation.to_le_bytes().to_vec()
    }
    pub fn read(h: &Header, payload: &[u8]) -> Result<ReplicaInfoAnswer, DecodeError> {
        let incarnation = <[u8; 8]>::try_from(payload)
            .map(u64::from_le_bytes)
            .map_err(|_| DecodeError::MalformedPayload {
                what: "a replica's incarnation is 8 bytes",
            })?;
        Ok(ReplicaInfoAnswer {
            size: h.length,
            allocated_bytes: h.offset,
            epoch: h.epoch,
            incarnation,
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
        let i = ReplicaInfoAnswer {
            size: 4096,
            allocated_bytes: 0,
            epoch: 3,
            incarnation: 9,
        };
        let p = i.put(&mut h);
        assert_eq!(ReplicaInfoAnswer::read(&h, &p).unwrap(), i);
        assert!(ReplicaInfoAnswer::read(&h, &p[..7]).is_err());
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
