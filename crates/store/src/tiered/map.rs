//! The tier map of one replica: which tier holds each extent, and the volume's pin. Pure
//! encode/decode (fuzzed in `fuzz/`); the file is replaced atomically, so a move's switch is
//! one durable step.
//!
//! | offset | size | field                                              |
//! |-------:|-----:|----------------------------------------------------|
//! | 0      | 8    | magic `TRMTIERS`                                   |
//! | 8      | 4    | format version (1)                                 |
//! | 12     | 1    | pin (0 auto, 1 fast, 2 slow)                       |
//! | 13     | 3    | reserved, zero                                     |
//! | 16     | 8    | volume id                                          |
//! | 24     | 8    | replica size in bytes                              |
//! | 32     | 8    | extent size in bytes                               |
//! | 40     | 8    | extent count (the size divided by the extent, up)  |
//! | 48     | 4    | crc32c of bytes 0..48 and the body                 |
//! | 52     | 4    | reserved, zero                                     |
//! | 56     | n    | one byte per extent: 0 slow, 1 fast                |

use crate::file::meta::{u32_at, u64_at};

const MAGIC: &[u8; 8] = b"TRMTIERS";
const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 56;
/// Largest replica the format describes (1 PiB), so a corrupt size cannot drive a huge map.
const MAX_SIZE: u64 = 1 << 50;

/// Where an extent lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Fast,
    Slow,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Fast => "fast",
            Tier::Slow => "slow",
        }
    }
}

/// Where an operator wants a volume: `Auto` follows heat; the others move every extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Pin {
    #[default]
    Auto,
    Fast,
    Slow,
}

impl Pin {
    pub fn parse(s: &str) -> Option<Pin> {
        match s {
            "auto" => Some(Pin::Auto),
            "fast" => Some(Pin::Fast),
            "slow" => Some(Pin::Slow),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Pin::Auto => "auto",
            Pin::Fast => "fast",
            Pin::Slow => "slow",
        }
    }
    pub fn code(self) -> u8 {
        match self {
            Pin::Auto => 0,
            Pin::Fast => 1,
            Pin::Slow => 2,
        }
    }
    pub fn from_code(c: u8) -> Option<Pin> {
        match c {
            0 => Some(Pin::Auto),
            1 => Some(Pin::Fast),
            2 => Some(Pin::Slow),
            _ => None,
        }
    }
    /// The tier every extent must reach, if pinned.
    pub fn target(self) -> Option<Tier> {
        match self {
            Pin::Auto => None,
            Pin::Fast => Some(Tier::Fast),
            Pin::Slow => Some(Tier::Slow),
        }
    }
}

/// A decoded tier map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierMapFile {
    pub volume: u64,
    pub size: u64,
    pub extent: u64,
    pub pin: Pin,
    pub tiers: Vec<Tier>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TierMapError {
    #[error("file too short ({0} bytes)")]
    Short(usize),
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version {0}")]
    BadVersion(u32),
    #[error("unknown pin {0}")]
    BadPin(u8),
    #[error("reserved bytes are not zero")]
    Reserved,
    #[error("implausible geometry: size {size}, extent {extent}")]
    Geometry { size: u64, extent: u64 },
    #[error("extent count {found} does not match the geometry (expected {expected})")]
    Count { found: u64, expected: u64 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("extent {index} has unknown tier {code}")]
    BadTier { index: u64, code: u8 },
}

/// True for an extent size the format accepts: a power of two from 64 KiB to 1 GiB.
pub fn valid_extent(extent: u64) -> bool {
    extent.is_power_of_two() && (crate::GRAIN..=1 << 30).contains(&extent)
}

fn checksum(header: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&header[0..48]), body)
}

pub fn encode(m: &TierMapFile) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12] = m.pin.code();
    b[16..24].copy_from_slice(&m.volume.to_le_bytes());
    b[24..32].copy_from_slice(&m.size.to_le_bytes());
    b[32..40].copy_from_slice(&m.extent.to_le_bytes());
    b[40..48].copy_from_slice(&(m.tiers.len() as u64).to_le_bytes());
    let body: Vec<u8> = m
        .tiers
        .iter()
        .map(|t| match t {
            Tier::Slow => 0,
            Tier::Fast => 1,
        })
        .collect();
    let crc = checksum(&b, &body);
    b[48..52].copy_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(&body);
    debug_assert_eq!(decode(&b).as_ref(), Ok(m));
    b
}

pub fn decode(b: &[u8]) -> Result<TierMapFile, TierMapError> {
    if b.len() < HEADER_LEN {
        return Err(TierMapError::Short(b.len()));
    }
    if &b[0..8] != MAGIC {
        return Err(TierMapError::BadMagic);
    }
    let version = u32_at(b, 8);
    if version != VERSION {
        return Err(TierMapError::BadVersion(version));
    }
    let pin = Pin::from_code(b[12]).ok_or(TierMapError::BadPin(b[12]))?;
    if b[13..16] != [0; 3] || b[52..56] != [0; 4] {
        return Err(TierMapError::Reserved);
    }
    let (size, extent) = (u64_at(b, 24), u64_at(b, 32));
    if size == 0 || size > MAX_SIZE || !valid_extent(extent) {
        return Err(TierMapError::Geometry { size, extent });
    }
    let found = u64_at(b, 40);
    let expected = size.div_ceil(extent);
    if found != expected || (b.len() - HEADER_LEN) as u64 != expected {
        return Err(TierMapError::Count { found, expected });
    }
    let body = &b[HEADER_LEN..];
    if checksum(b, body) != u32_at(b, 48) {
        return Err(TierMapError::Checksum);
    }
    let tiers = body
        .iter()
        .enumerate()
        .map(|(i, &c)| match c {
            0 => Ok(Tier::Slow),
            1 => Ok(Tier::Fast),
            code => Err(TierMapError::BadTier {
                index: i as u64,
                code,
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TierMapFile {
        volume: u64_at(b, 16),
        size,
        extent,
        pin,
        tiers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> TierMapFile {
        TierMapFile {
            volume: 7,
            size: 5 << 20,
            extent: 1 << 20,
            pin: Pin::Fast,
            tiers: vec![Tier::Slow, Tier::Fast, Tier::Fast, Tier::Slow, Tier::Fast],
        }
    }

    #[test]
    fn round_trips() {
        let m = sample();
        assert_eq!(decode(&encode(&m)), Ok(m));
    }

    #[test]
    fn refuses_damage_with_a_reason() {
        let good = encode(&sample());
        let mut b = good.clone();
        b[HEADER_LEN + 1] = 1 - b[HEADER_LEN + 1];
        assert_eq!(decode(&b), Err(TierMapError::Checksum));
        let mut b = good.clone();
        b[HEADER_LEN + 2] = 9;
        let crc = checksum(&b, &b[HEADER_LEN..]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&b), Err(TierMapError::BadTier { .. })));
        let mut b = good.clone();
        b[12] = 3;
        assert_eq!(decode(&b), Err(TierMapError::BadPin(3)));
        assert!(matches!(
            decode(&good[..good.len() - 1]),
            Err(TierMapError::Count { .. })
        ));
        assert_eq!(decode(&good[..10]), Err(TierMapError::Short(10)));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_refuse(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(m) = decode(&b) {
                prop_assert_eq!(encode(&m), b);
            }
        }

        #[test]
        fn any_map_round_trips(tiers in proptest::collection::vec(any::<bool>(), 1..300),
                               pin in 0u8..3) {
            let m = TierMapFile {
                volume: 3,
                size: tiers.len() as u64 * crate::GRAIN,
                extent: crate::GRAIN,
                pin: Pin::from_code(pin).unwrap(),
                tiers: tiers.iter().map(|&f| if f { Tier::Fast } else { Tier::Slow }).collect(),
            };
            prop_assert_eq!(decode(&encode(&m)), Ok(m));
        }
    }
}
