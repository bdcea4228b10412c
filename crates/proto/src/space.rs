//! Payload of the `Space` response: a node's room for replicas. Ten little-endian u64s; a
//! longer payload (a newer node's) is read for the fields known here.
//!
//! | offset | field                                                                  |
//! |-------:|------------------------------------------------------------------------|
//! | 0      | capacity: bytes the node's replicas may hold (`u64::MAX`: no limit)    |
//! | 8      | over-commit limit, thousandths (1000: sizes may sum to the capacity)   |
//! | 16     | provisioned: the replicas' sizes, summed                               |
//! | 24     | allocated: bytes the replicas hold (written, not trimmed)              |
//! | 32     | replicas                                                               |
//! | 40     | reserved, 0                                                            |
//! | 48     | file-system size under the node's directory (0: none, not a file store)|
//! | 56     | file-system bytes free to the node                                     |
//! | 64     | reserved, 0                                                            |
//! | 72     | reserved, 0                                                            |

use crate::DecodeError;

/// Bytes of a `Space` payload this version writes.
pub const NODE_SPACE_LEN: usize = 80;

/// What a node may still take, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeSpace {
    pub capacity: u64,
    pub overcommit_milli: u64,
    pub provisioned: u64,
    pub allocated: u64,
    pub replicas: u64,
    pub fs_size: u64,
    pub fs_free: u64,
}

impl NodeSpace {
    /// Most bytes the replicas' sizes may sum to: the capacity times the over-commit limit.
    pub fn limit(&self) -> u64 {
        let l = u128::from(self.capacity) * u128::from(self.overcommit_milli) / 1000;
        u64::try_from(l).unwrap_or(u64::MAX)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(NODE_SPACE_LEN);
        for v in [
            self.capacity,
            self.overcommit_milli,
            self.provisioned,
            self.allocated,
            self.replicas,
            0,
            self.fs_size,
            self.fs_free,
            0,
            0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<NodeSpace, DecodeError> {
        if b.len() < NODE_SPACE_LEN {
            return Err(DecodeError::MalformedPayload {
                what: "a space report shorter than its fields",
            });
        }
        let at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let s = NodeSpace {
            capacity: at(0),
            overcommit_milli: at(1),
            provisioned: at(2),
            allocated: at(3),
            replicas: at(4),
            fs_size: at(6),
            fs_free: at(7),
        };
        if s.overcommit_milli == 0 {
            return Err(DecodeError::MalformedPayload {
                what: "an over-commit limit of 0",
            });
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let s = NodeSpace {
            capacity: 10 << 30,
            overcommit_milli: 2500,
            provisioned: 20 << 30,
            allocated: 1 << 20,
            replicas: 2,
            fs_size: 100 << 30,
            fs_free: 40 << 30,
        };
        let b = s.encode();
        assert_eq!(b.len(), NODE_SPACE_LEN);
        assert_eq!(NodeSpace::decode(&b), Ok(s));
        assert_eq!(s.limit(), 25 << 30);
        // A newer node's longer payload: the known fields still read.
        let mut longer = b.clone();
        longer.extend_from_slice(&[7; 16]);
        assert_eq!(NodeSpace::decode(&longer), Ok(s));
        assert!(NodeSpace::decode(&b[..NODE_SPACE_LEN - 1]).is_err());
        let unlimited = NodeSpace {
            capacity: u64::MAX,
            overcommit_milli: 4000,
            ..s
        };
        assert_eq!(unlimited.limit(), u64::MAX);
        let zero = NodeSpace {
            overcommit_milli: 0,
            ..s
        };
        assert!(NodeSpace::decode(&zero.encode()).is_err());
    }
}
