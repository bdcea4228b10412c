//! Payload of the `TierInfo` response: a node's tiers and, when the request named a replica
//! the node holds, that replica's. All integers little-endian.
//!
//! | size | field                                                        |
//! |-----:|--------------------------------------------------------------|
//! | 8    | fast-tier capacity, bytes                                    |
//! | 8    | fast-tier bytes in use (whole extents)                       |
//! | 8    | extent size, bytes                                           |
//! | 8    | migration rate limit, bytes per second                       |
//! | 8    | bytes migrated since the node started                        |
//! | 8    | slow-tier bytes in use (allocated)                           |
//! | 8    | bytes migrated in the last second                            |
//! | 2    | length of the disk-model text (0: the slow tier is real)     |
//! | n    | the disk-model text, UTF-8                                   |
//! | 1    | 1 if a replica part follows, else 0                          |
//! | 1    | replica: pin (0 auto, 1 fast, 2 slow)                        |
//! | 8×6  | replica: extents fast, extents slow, reads fast, reads slow, promotions, demotions |

use crate::DecodeError;

/// Longest disk-model text accepted.
pub const MAX_MODEL_TEXT: usize = 512;

/// A node's tiers (the tiered store reports them in this form too).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeTiers {
    pub fast_capacity: u64,
    /// Bytes of extents on the fast tier (whole extents, allocated or not).
    pub fast_used: u64,
    /// The unit of heat and of migration.
    pub extent: u64,
    /// Most bytes migrated per second.
    pub migrate_rate: u64,
    /// Bytes moved between the tiers since the node started.
    pub migrated_bytes: u64,
    /// Bytes the slow tier holds (allocated).
    pub slow_used: u64,
    /// Bytes moved between the tiers in the last second.
    pub migrating_per_s: u64,
    /// The disk model in front of the slow tier, if any.
    pub disk_model: Option<String>,
}

/// One replica's tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplicaTierInfo {
    /// 0 auto, 1 fast, 2 slow.
    pub pin: u8,
    pub fast_extents: u64,
    pub slow_extents: u64,
    pub reads_fast: u64,
    pub reads_slow: u64,
    pub promotions: u64,
    pub demotions: u64,
}

/// The whole `TierInfo` response payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierReport {
    pub node: NodeTiers,
    pub replica: Option<ReplicaTierInfo>,
}

const fn malformed(what: &'static str) -> DecodeError {
    DecodeError::MalformedPayload { what }
}

impl TierReport {
    pub fn encode(&self) -> Vec<u8> {
        let n = &self.node;
        let mut b = Vec::with_capacity(100);
        for x in [
            n.fast_capacity,
            n.fast_used,
            n.extent,
            n.migrate_rate,
            n.migrated_bytes,
            n.slow_used,
            n.migrating_per_s,
        ] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        let text = n.disk_model.as_deref().unwrap_or("");
        let text = &text.as_bytes()[..text.len().min(MAX_MODEL_TEXT)];
        b.extend_from_slice(&(text.len() as u16).to_le_bytes());
        b.extend_from_slice(text);
        match &self.replica {
            None => b.push(0),
            Some(r) => {
                b.push(1);
                b.push(r.pin);
                for x in [
                    r.fast_extents,
                    r.slow_extents,
                    r.reads_fast,
                    r.reads_slow,
                    r.promotions,
                    r.demotions,
                ] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<TierReport, DecodeError> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], DecodeError> {
            let s = b
                .get(at..at + n)
                .ok_or(malformed("tier report is too short"))?;
            at += n;
            Ok(s)
        };
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let mut nums = [0u64; 7];
        for x in &mut nums {
            *x = u64_of(take(8)?);
        }
        let len = u16::from_le_bytes(take(2)?.try_into().expect("2 bytes")) as usize;
        if len > MAX_MODEL_TEXT {
            return Err(malformed("tier report's disk-model text is too long"));
        }
        let text = std::str::from_utf8(take(len)?)
            .map_err(|_| malformed("tier report's disk-model text is not UTF-8"))?;
        let replica = match take(1)?[0] {
            0 => None,
            1 => {
                let pin = take(1)?[0];
                if pin > 2 {
                    return Err(malformed("tier report names an unknown pin"));
                }
                let mut r = [0u64; 6];
                for x in &mut r {
                    *x = u64_of(take(8)?);
                }
                Some(ReplicaTierInfo {
                    pin,
                    fast_extents: r[0],
                    slow_extents: r[1],
                    reads_fast: r[2],
                    reads_slow: r[3],
                    promotions: r[4],
                    demotions: r[5],
                })
            }
            _ => return Err(malformed("tier report's replica flag is not 0 or 1")),
        };
        if at != b.len() {
            return Err(malformed("tier report has trailing bytes"));
        }
        Ok(TierReport {
            node: NodeTiers {
                fast_capacity: nums[0],
                fast_used: nums[1],
                extent: nums[2],
                migrate_rate: nums[3],
                migrated_bytes: nums[4],
                slow_used: nums[5],
                migrating_per_s: nums[6],
                disk_model: (!text.is_empty()).then(|| text.to_string()),
            },
            replica,
        })
    }
}

/// Encoded size of one `TierHeat` entry.
pub const HEAT_ENTRY_LEN: usize = 12;
/// Most entries in one `TierHeat` payload.
pub const MAX_HEAT_ENTRIES: usize = 4096;

/// Encodes `TierHeat` entries: (byte offset, count).
pub fn encode_heat(entries: &[(u64, u32)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(entries.len() * HEAT_ENTRY_LEN);
    for (off, n) in entries.iter().take(MAX_HEAT_ENTRIES) {
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
    }
    b
}

/// Decodes a `TierHeat` payload.
pub fn decode_heat(b: &[u8]) -> Result<Vec<(u64, u32)>, DecodeError> {
    if !b.len().is_multiple_of(HEAT_ENTRY_LEN) {
        return Err(malformed("heat payload is not whole 12-byte entries"));
    }
    if b.len() / HEAT_ENTRY_LEN > MAX_HEAT_ENTRIES {
        return Err(malformed("heat payload has too many entries"));
    }
    Ok(b.chunks_exact(HEAT_ENTRY_LEN)
        .map(|c| {
            (
                u64::from_le_bytes(c[0..8].try_into().expect("8 bytes")),
                u32::from_le_bytes(c[8..12].try_into().expect("4 bytes")),
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_bytes_decode_or_refuse(b in proptest::collection::vec(any::<u8>(), 0..160)) {
            if let Ok(r) = TierReport::decode(&b) {
                prop_assert_eq!(r.encode(), b);
            }
        }

        #[test]
        fn heat_decodes_or_refuses(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(e) = decode_heat(&b) {
                prop_assert_eq!(encode_heat(&e), b);
            }
        }

        #[test]
        fn heat_round_trips(e in proptest::collection::vec((any::<u64>(), any::<u32>()), 0..50)) {
            prop_assert_eq!(decode_heat(&encode_heat(&e)), Ok(e));
        }

        #[test]
        fn reports_round_trip(nums in proptest::array::uniform7(any::<u64>()),
                              text in "[ -~]{0,40}",
                              rep in proptest::option::of((0u8..3, proptest::array::uniform6(any::<u64>())))) {
            let r = TierReport {
                node: NodeTiers {
                    fast_capacity: nums[0],
                    fast_used: nums[1],
                    extent: nums[2],
                    migrate_rate: nums[3],
                    migrated_bytes: nums[4],
                    slow_used: nums[5],
                    migrating_per_s: nums[6],
                    disk_model: (!text.is_empty()).then(|| text.clone()),
                },
                replica: rep.map(|(pin, x)| ReplicaTierInfo {
                    pin,
                    fast_extents: x[0],
                    slow_extents: x[1],
                    reads_fast: x[2],
                    reads_slow: x[3],
                    promotions: x[4],
                    demotions: x[5],
                }),
            };
            prop_assert_eq!(TierReport::decode(&r.encode()), Ok(r));
        }
    }
}
