//! On-disk format of a replica's metadata file. Pure encode/decode (fuzzed in `fuzz/`).
//!
//! | offset | size | field                                   |
//! |-------:|-----:|-----------------------------------------|
//! | 0      | 8    | magic `TRIRMETA`                        |
//! | 8      | 4    | format version (2; 1 is still read)     |
//! | 12     | 4    | flags (bit 0: open, not shut down clean)|
//! | 16     | 8    | volume id                               |
//! | 24     | 8    | size in bytes                           |
//! | 32     | 8    | grain in bytes                          |
//! | 40     | 8    | epoch                                   |
//! | 48     | 4    | allocation map length in bytes          |
//! | 52     | 4    | crc32c of bytes 0..52, 56..64 and the map |
//! | 56     | 8    | incarnation (version 1: reserved, zero) |
//! | 64     | n    | allocation map (little-endian u64 words)|
//!
//! The incarnation names the replica's history: it is drawn at random when the replica is
//! created and kept for its life, so a peer that tracked the writes this replica missed can
//! tell it is talking to the same copy. The open flag is set while a process has the replica
//! open; finding it set at open means the last process died without persisting the map.

const MAGIC: &[u8; 8] = b"TRIRMETA";
const VERSION: u32 = 2;
/// Flag: a process had the replica open and did not shut down cleanly.
pub const FLAG_OPEN: u32 = 1;
const KNOWN_FLAGS: u32 = FLAG_OPEN;
pub const META_HEADER_LEN: usize = 64;
/// Largest replica the format describes (1 PiB), so a corrupt size cannot drive a huge map.
const MAX_SIZE: u64 = 1 << 50;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaMeta {
    pub volume: u64,
    pub size: u64,
    pub grain: u64,
    pub epoch: u64,
    pub flags: u32,
    pub incarnation: u64,
    pub map: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("file too short ({0} bytes)")]
    Short(usize),
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version {0}")]
    BadVersion(u32),
    #[error("implausible geometry: size {size}, grain {grain}")]
    Geometry { size: u64, grain: u64 },
    #[error("map length {found} does not match geometry (expected {expected})")]
    MapLength { found: u64, expected: u64 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("reserved header bytes are not zero")]
    Reserved,
}

fn map_len(size: u64, grain: u64) -> u64 {
    size.div_ceil(grain).div_ceil(64) * 8
}

fn checksum(version: u32, header: &[u8], map: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[0..52]);
    let crc = if version >= 2 {
        crc32c::crc32c_append(crc, &header[56..64])
    } else {
        crc
    };
    crc32c::crc32c_append(crc, map)
}

pub fn encode(m: &ReplicaMeta) -> Vec<u8> {
    let mut b = vec![0u8; META_HEADER_LEN];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&m.flags.to_le_bytes());
    b[16..24].copy_from_slice(&m.volume.to_le_bytes());
    b[24..32].copy_from_slice(&m.size.to_le_bytes());
    b[32..40].copy_from_slice(&m.grain.to_le_bytes());
    b[40..48].copy_from_slice(&m.epoch.to_le_bytes());
    b[48..52].copy_from_slice(&(m.map.len() as u32).to_le_bytes());
    b[56..64].copy_from_slice(&m.incarnation.to_le_bytes());
    let crc = checksum(VERSION, &b, &m.map);
    b[52..56].copy_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(&m.map);
    // Paired check: what we write must read back as what we meant.
    debug_assert_eq!(decode(&b).as_ref(), Ok(m));
    b
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub fn decode(b: &[u8]) -> Result<ReplicaMeta, MetaError> {
    if b.len() < META_HEADER_LEN {
        return Err(MetaError::Short(b.len()));
    }
    if &b[0..8] != MAGIC {
        return Err(MetaError::BadMagic);
    }
    let version = u32_at(b, 8);
    if !(1..=VERSION).contains(&version) {
        return Err(MetaError::BadVersion(version));
    }
    let flags = u32_at(b, 12);
    // Version 1 had these bytes reserved (and 56..64 outside its checksum): they must be zero.
    if (version == 1 && (flags != 0 || b[56..64] != [0; 8])) || flags & !KNOWN_FLAGS != 0 {
        return Err(MetaError::Reserved);
    }
    let (size, grain) = (u64_at(b, 24), u64_at(b, 32));
    if size == 0
        || size > MAX_SIZE
        || !grain.is_power_of_two()
        || !(4096..=1 << 26).contains(&grain)
    {
        return Err(MetaError::Geometry { size, grain });
    }
    let found = u64::from(u32_at(b, 48));
    let expected = map_len(size, grain);
    if found != expected || b.len() as u64 != META_HEADER_LEN as u64 + expected {
        return Err(MetaError::MapLength { found, expected });
    }
    let map = &b[META_HEADER_LEN..];
    if checksum(version, b, map) != u32_at(b, 52) {
        return Err(MetaError::Checksum);
    }
    Ok(ReplicaMeta {
        volume: u64_at(b, 16),
        size,
        grain,
        epoch: u64_at(b, 40),
        flags,
        incarnation: u64_at(b, 56),
        map: map.to_vec(),
    })
}
