//! On-disk format of a replica's versions. Pure encode/decode (fuzzed in `fuzz/`).
//!
//! Two kinds of file, each replaced atomically, each with a crc32c over all its bytes:
//!
//! * `replica-<volume>.versions`, rewritten when the head's map changed and a flush comes, and
//!   at every snapshot, delete and rollback: the replica's logical size, the head's
//!   generation, the list of live snapshots, and the head's map as a diff against the newest
//!   snapshot's (`base`).
//! * `replica-<volume>.snap-<id>`, written once, before the main file first lists the
//!   snapshot (and again when the snapshot it was a diff against is deleted): its map as a
//!   diff against the snapshot taken before it (`base`; 0 for none, the identity).
//! * `replica-<volume>.vlog`, the redirect log ([`LogRecord`]): what changed since the main
//!   file was written. A snapshot taken while a main file exists is one record there (synced,
//!   or not: see [`LogRecord`]); its file and the main file listing it follow at the next
//!   flush.
//!
//! A diff is a list of records `(logical block, physical block, birth)`, by increasing logical
//! block; a physical block [`IDENTITY`] means "no entry here" (the block is back where it
//! started), [`ZERO`](super::table::ZERO) means "reads as zeros".
//!
//! Main file header (64 bytes, little-endian):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `TRIRVERS` |
//! | 8 | 4 | format version (2; 1 is read too) |
//! | 12 | 4 | flags (bit 0: open, not shut down clean) |
//! | 16 | 8 | volume id |
//! | 24 | 8 | logical size in bytes |
//! | 32 | 8 | the head's generation |
//! | 40 | 8 | base: the snapshot the head's diff is against (0: none) |
//! | 48 | 4 | number of snapshots |
//! | 52 | 4 | number of head diff records |
//! | 56 | 4 | crc32c of the file with these four bytes zero |
//! | 60 | 4 | reserved (0) |
//! | 64 | 8 | the last redirect-log sequence the head's map holds |
//! | 72 | 8 | homes: logical bytes below this start in place (version 2) |
//!
//! then per snapshot `(id, generation, created, size in bytes)` (32 bytes), then the head's
//! records (24 bytes each). Version 1, written before volumes with versions could be resized,
//! has a 72-byte header and 24-byte snapshots without a size: every version has the logical
//! size, and so do `homes`. A snapshot file (version 1) has the header `TRIRSNAP`, version,
//! flags, volume, id, base, record count (4), crc32c (4), 16 reserved bytes, then its records.

use super::table::{Entry, Map, ZERO};

const MAIN_MAGIC: &[u8; 8] = b"TRIRVERS";
const SNAP_MAGIC: &[u8; 8] = b"TRIRSNAP";
/// The main file's format; [`SNAP_VERSION`] the snapshot files'.
const VERSION: u32 = 2;
const SNAP_VERSION: u32 = 1;
const HEADER: usize = 64;
/// The main file's header: the common 64 bytes, the last redirect-log sequence it holds, and
/// `homes`; version 1 stopped before `homes`.
const MAIN_HEADER: usize = 80;
const MAIN_HEADER_V1: usize = 72;
const RECORD: usize = 24;
/// A snapshot's entry in the main file; version 1 had no size.
const LISTED: usize = 32;
/// Main file flag: a process has the replica open (found at open: it died without closing,
/// and the head's changes since the last flush are lost).
pub const FLAG_OPEN: u32 = 1;
/// A record's physical block for "no entry" (the identity).
pub const IDENTITY: u64 = u64::MAX - 1;
/// Largest physical block a record may name (a 1 PiB replica), so a corrupt record cannot
/// drive a huge allocation.
const MAX_BLOCK: u64 = 1 << 38;

/// One diff record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub block: u64,
    pub phys: u64,
    pub birth: u64,
}

/// A snapshot as the main file lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub id: u64,
    pub gen: u64,
    pub created: u64,
    /// Logical bytes.
    pub size: u64,
}

/// The main file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Main {
    pub flags: u32,
    pub volume: u64,
    pub size: u64,
    /// Logical bytes below this start in place ([`super::table::Table::homes`]).
    pub homes: u64,
    pub gen: u64,
    pub base: u64,
    pub snaps: Vec<Listed>,
    /// The sequence of the last redirect-log record the head below holds.
    pub applied: u64,
    pub head: Vec<Record>,
}

/// A snapshot file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapFile {
    pub volume: u64,
    pub id: u64,
    pub base: u64,
    pub records: Vec<Record>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("file too short ({0} bytes)")]
    Short(usize),
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version {0}")]
    BadVersion(u32),
    #[error("length {found} does not match its counts (expected {expected})")]
    Length { found: usize, expected: usize },
    #[error("checksum mismatch")]
    Checksum,
    #[error("reserved bytes or flags are not zero")]
    Reserved,
    #[error("record {0}: blocks out of order or out of range")]
    BadRecord(usize),
    #[error(
        "snapshot {0} is listed twice, has id 0, a generation not below the head's, or a size \
         below the replica's homes"
    )]
    BadSnapshot(u64),
    #[error("homes {homes} past the logical size {size}")]
    Homes { homes: u64, size: u64 },
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn crc_of(b: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&b[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &b[crc_at + 4..])
}

fn put_records(b: &mut Vec<u8>, records: &[Record]) {
    for r in records {
        b.extend_from_slice(&r.block.to_le_bytes());
        b.extend_from_slice(&r.phys.to_le_bytes());
        b.extend_from_slice(&r.birth.to_le_bytes());
    }
}

fn get_records(b: &[u8], n: usize) -> Result<Vec<Record>, FormatError> {
    let mut out: Vec<Record> = Vec::with_capacity(n);
    for (i, c) in b.chunks_exact(RECORD).take(n).enumerate() {
        let r = Record {
            block: u64_at(c, 0),
            phys: u64_at(c, 8),
            birth: u64_at(c, 16),
        };
        let ordered = out.last().is_none_or(|p| p.block < r.block);
        let phys_ok = r.phys == ZERO || r.phys == IDENTITY || r.phys < MAX_BLOCK;
        if !ordered || r.block >= MAX_BLOCK || !phys_ok {
            return Err(FormatError::BadRecord(i));
        }
        out.push(r);
    }
    Ok(out)
}

fn check_length(b: &[u8], expected: usize) -> Result<(), FormatError> {
    if b.len() != expected {
        return Err(FormatError::Length {
            found: b.len(),
            expected,
        });
    }
    Ok(())
}

/// Checks the common header; returns the format version, one of `versions`.
fn check_head(
    b: &[u8],
    magic: &[u8; 8],
    known_flags: u32,
    versions: &[u32],
) -> Result<u32, FormatError> {
    if b.len() < HEADER {
        return Err(FormatError::Short(b.len()));
    }
    if &b[0..8] != magic {
        return Err(FormatError::BadMagic);
    }
    let v = u32_at(b, 8);
    if !versions.contains(&v) {
        return Err(FormatError::BadVersion(v));
    }
    if u32_at(b, 12) & !known_flags != 0 {
        return Err(FormatError::Reserved);
    }
    Ok(v)
}

pub fn encode_main(m: &Main) -> Vec<u8> {
    let mut b = vec![0u8; MAIN_HEADER];
    b[0..8].copy_from_slice(MAIN_MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&m.flags.to_le_bytes());
    b[16..24].copy_from_slice(&m.volume.to_le_bytes());
    b[24..32].copy_from_slice(&m.size.to_le_bytes());
    b[32..40].copy_from_slice(&m.gen.to_le_bytes());
    b[40..48].copy_from_slice(&m.base.to_le_bytes());
    b[48..52].copy_from_slice(&(m.snaps.len() as u32).to_le_bytes());
    b[52..56].copy_from_slice(&(m.head.len() as u32).to_le_bytes());
    b[64..72].copy_from_slice(&m.applied.to_le_bytes());
    b[72..80].copy_from_slice(&m.homes.to_le_bytes());
    for s in &m.snaps {
        b.extend_from_slice(&s.id.to_le_bytes());
        b.extend_from_slice(&s.gen.to_le_bytes());
        b.extend_from_slice(&s.created.to_le_bytes());
        b.extend_from_slice(&s.size.to_le_bytes());
    }
    put_records(&mut b, &m.head);
    let c = crc_of(&b, 56);
    b[56..60].copy_from_slice(&c.to_le_bytes());
    debug_assert_eq!(decode_main(&b).as_ref(), Ok(m));
    b
}

pub fn decode_main(b: &[u8]) -> Result<Main, FormatError> {
    let v1 = check_head(b, MAIN_MAGIC, FLAG_OPEN, &[1, VERSION])? == 1;
    let (header, listed) = match v1 {
        true => (MAIN_HEADER_V1, RECORD),
        false => (MAIN_HEADER, LISTED),
    };
    if b.len() < header {
        return Err(FormatError::Short(b.len()));
    }
    if u32_at(b, 60) != 0 {
        return Err(FormatError::Reserved);
    }
    let (n_snaps, n_head) = (u32_at(b, 48) as usize, u32_at(b, 52) as usize);
    check_length(b, header + n_snaps * listed + n_head * RECORD)?;
    if crc_of(b, 56) != u32_at(b, 56) {
        return Err(FormatError::Checksum);
    }
    let (gen, size) = (u64_at(b, 32), u64_at(b, 24));
    let homes = match v1 {
        true => size,
        false => u64_at(b, 72),
    };
    if homes > size {
        return Err(FormatError::Homes { homes, size });
    }
    let mut snaps: Vec<Listed> = Vec::with_capacity(n_snaps);
    for c in b[header..header + n_snaps * listed].chunks_exact(listed) {
        let s = Listed {
            id: u64_at(c, 0),
            gen: u64_at(c, 8),
            created: u64_at(c, 16),
            size: match v1 {
                true => size,
                false => u64_at(c, 24),
            },
        };
        if s.id == 0
            || s.gen >= gen
            || s.size < homes
            || snaps.iter().any(|o| o.id == s.id || o.gen == s.gen)
        {
            return Err(FormatError::BadSnapshot(s.id));
        }
        snaps.push(s);
    }
    Ok(Main {
        flags: u32_at(b, 12),
        volume: u64_at(b, 16),
        size,
        homes,
        gen,
        base: u64_at(b, 40),
        snaps,
        applied: u64_at(b, 64),
        head: get_records(&b[header + n_snaps * listed..], n_head)?,
    })
}

pub fn encode_snap(s: &SnapFile) -> Vec<u8> {
    let mut b = vec![0u8; HEADER];
    b[0..8].copy_from_slice(SNAP_MAGIC);
    b[8..12].copy_from_slice(&SNAP_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&s.volume.to_le_bytes());
    b[24..32].copy_from_slice(&s.id.to_le_bytes());
    b[32..40].copy_from_slice(&s.base.to_le_bytes());
    b[40..44].copy_from_slice(&(s.records.len() as u32).to_le_bytes());
    put_records(&mut b, &s.records);
    let c = crc_of(&b, 44);
    b[44..48].copy_from_slice(&c.to_le_bytes());
    debug_assert_eq!(decode_snap(&b).as_ref(), Ok(s));
    b
}

pub fn decode_snap(b: &[u8]) -> Result<SnapFile, FormatError> {
    check_head(b, SNAP_MAGIC, 0, &[SNAP_VERSION])?;
    if b[48..64] != [0; 16] {
        return Err(FormatError::Reserved);
    }
    let n = u32_at(b, 40) as usize;
    check_length(b, HEADER + n * RECORD)?;
    if crc_of(b, 44) != u32_at(b, 44) {
        return Err(FormatError::Checksum);
    }
    let id = u64_at(b, 24);
    if id == 0 {
        return Err(FormatError::BadSnapshot(0));
    }
    Ok(SnapFile {
        volume: u64_at(b, 16),
        id,
        base: u64_at(b, 32),
        records: get_records(&b[HEADER..], n)?,
    })
}

/// One record of the redirect log (`replica-<volume>.vlog`). 40 bytes: sequence, then two
/// kinds told apart by the second field, then crc32c of the first 32 bytes and 4 zero bytes:
///
/// * the head's entry for a block changed, before the write that changed it was answered:
///   logical block, physical block, birth (u64 LE each). Written in place at slots, without a
///   sync: a process crash keeps them (as it keeps the O_DIRECT writes they point at); a power
///   loss gives the copy a new incarnation anyway.
/// * a snapshot of the head taken at this point of the sequence: [`SNAPSHOT_MARK`] (or
///   [`UNSYNCED_SNAPSHOT_MARK`]), its id, its creation time. Its map is the head the records
///   before it build. A synced one was written after the data was flushed and synced with
///   every record before it: a reopen takes it, without its own file (written later, at the
///   next checkpoint). An unsynced one was not: the bytes it would hold may not have survived
///   (a power loss), so a reopen drops it unless the main file lists it (a flush made it
///   durable); it still counts as a generation, as the table counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogRecord {
    Block {
        seq: u64,
        block: u64,
        entry: Entry,
    },
    Snapshot {
        seq: u64,
        id: u64,
        created: u64,
        synced: bool,
    },
}

impl LogRecord {
    pub fn seq(&self) -> u64 {
        match *self {
            LogRecord::Block { seq, .. } | LogRecord::Snapshot { seq, .. } => seq,
        }
    }
}

pub const LOG_RECORD: usize = 40;
/// A log record's second field for a synced snapshot record (never a logical block).
pub const SNAPSHOT_MARK: u64 = u64::MAX;
/// A log record's second field for an unsynced snapshot record.
pub const UNSYNCED_SNAPSHOT_MARK: u64 = u64::MAX - 1;

pub fn encode_log(r: &LogRecord) -> [u8; LOG_RECORD] {
    let (seq, a, b, c) = match *r {
        LogRecord::Block { seq, block, entry } => (seq, block, entry.phys, entry.birth),
        LogRecord::Snapshot {
            seq,
            id,
            created,
            synced,
        } => {
            let mark = match synced {
                true => SNAPSHOT_MARK,
                false => UNSYNCED_SNAPSHOT_MARK,
            };
            (seq, mark, id, created)
        }
    };
    let mut out = [0u8; LOG_RECORD];
    for (k, v) in [seq, a, b, c].into_iter().enumerate() {
        out[k * 8..k * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out[..32]);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The valid records of a log file, by sequence (slots never written or torn are skipped).
pub fn decode_log(b: &[u8]) -> Vec<LogRecord> {
    let mut out: Vec<LogRecord> = b
        .chunks_exact(LOG_RECORD)
        .filter(|c| crc32c::crc32c(&c[..32]) == u32_at(c, 32) && u32_at(c, 36) == 0)
        .filter_map(|c| {
            let (seq, a, b, c) = (u64_at(c, 0), u64_at(c, 8), u64_at(c, 16), u64_at(c, 24));
            match a {
                _ if seq == 0 => None,
                SNAPSHOT_MARK | UNSYNCED_SNAPSHOT_MARK if b != 0 => Some(LogRecord::Snapshot {
                    seq,
                    id: b,
                    created: c,
                    synced: a == SNAPSHOT_MARK,
                }),
                block if block < MAX_BLOCK && (b == ZERO || b < MAX_BLOCK) => {
                    Some(LogRecord::Block {
                        seq,
                        block,
                        entry: Entry { phys: b, birth: c },
                    })
                }
                _ => None,
            }
        })
        .collect();
    out.sort_unstable_by_key(|r| r.seq());
    out.dedup_by_key(|r| r.seq());
    out
}

/// The records that turn `base` into `map`.
pub fn diff(base: &Map, map: &Map) -> Vec<Record> {
    use super::table::Change;
    let mut out: Vec<Record> = base
        .diff(map)
        .into_iter()
        .map(|d| match d {
            Change::Add(block, e)
            | Change::Update {
                key: block, new: e, ..
            } => Record {
                block,
                phys: e.phys,
                birth: e.birth,
            },
            Change::Remove(block, _) => Record {
                block,
                phys: IDENTITY,
                birth: 0,
            },
        })
        .collect();
    out.sort_unstable_by_key(|r| r.block);
    out
}

/// `base` with `records` applied.
pub fn apply(base: &Map, records: &[Record]) -> Map {
    let mut m = base.clone();
    for r in records {
        if r.phys == IDENTITY {
            m.remove(&r.block);
        } else {
            m.insert(
                r.block,
                Entry {
                    phys: r.phys,
                    birth: r.birth,
                },
            );
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_records_round_trip_and_damaged_ones_are_skipped() {
        let block = LogRecord::Block {
            seq: 7,
            block: 3,
            entry: Entry { phys: 9, birth: 2 },
        };
        let zeroed = LogRecord::Block {
            seq: 8,
            block: 4,
            entry: Entry {
                phys: ZERO,
                birth: 2,
            },
        };
        let snap = LogRecord::Snapshot {
            seq: 9,
            id: 12,
            created: 1_700_000_000,
            synced: true,
        };
        let unsynced = LogRecord::Snapshot {
            seq: 10,
            id: 13,
            created: 1_700_000_001,
            synced: false,
        };
        // Written out of order, at slots of their own: read back by sequence.
        let bytes: Vec<u8> = [snap, block, unsynced, zeroed]
            .iter()
            .flat_map(encode_log)
            .collect();
        assert_eq!(decode_log(&bytes), vec![block, zeroed, snap, unsynced]);
        let mut torn = bytes.clone();
        torn[LOG_RECORD + 5] ^= 1;
        assert_eq!(decode_log(&torn), vec![zeroed, snap, unsynced]);
        // A snapshot record naming id 0, or a block record past any replica, is refused
        // even with a good checksum.
        for bad in [
            LogRecord::Snapshot {
                seq: 1,
                id: 0,
                created: 0,
                synced: true,
            },
            LogRecord::Block {
                seq: 1,
                block: MAX_BLOCK,
                entry: Entry { phys: 0, birth: 0 },
            },
        ] {
            assert_eq!(decode_log(&encode_log(&bad)), vec![]);
        }
    }

    #[test]
    fn files_round_trip_and_every_damage_is_refused() {
        let m = Main {
            flags: FLAG_OPEN,
            volume: 9,
            size: 1 << 20,
            homes: 1 << 19,
            gen: 4,
            base: 3,
            applied: 77,
            snaps: vec![
                Listed {
                    id: 2,
                    gen: 1,
                    created: 100,
                    size: 3 << 19,
                },
                Listed {
                    id: 3,
                    gen: 3,
                    created: 200,
                    size: 1 << 19,
                },
            ],
            head: vec![
                Record {
                    block: 1,
                    phys: 300,
                    birth: 4,
                },
                Record {
                    block: 7,
                    phys: IDENTITY,
                    birth: 0,
                },
            ],
        };
        let b = encode_main(&m);
        assert_eq!(decode_main(&b), Ok(m.clone()));
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x10;
            assert!(decode_main(&x).is_err(), "a flipped byte {i} was accepted");
        }
        assert_eq!(
            decode_main(&b[..b.len() - 1]).unwrap_err(),
            FormatError::Length {
                found: b.len() - 1,
                expected: b.len()
            }
        );
        let s = SnapFile {
            volume: 9,
            id: 3,
            base: 2,
            records: m.head.clone(),
        };
        let b = encode_snap(&s);
        assert_eq!(decode_snap(&b), Ok(s));
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x01;
            assert!(decode_snap(&x).is_err(), "a flipped byte {i} was accepted");
        }
    }

    /// A main file as format version 1 wrote it: the version 2 file without `homes` and
    /// without the snapshots' sizes.
    fn encode_main_v1(m: &Main) -> Vec<u8> {
        let v2 = encode_main(m);
        let mut b = v2[..MAIN_HEADER_V1].to_vec();
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        for s in v2[MAIN_HEADER..].chunks(LISTED).take(m.snaps.len()) {
            b.extend_from_slice(&s[..RECORD]);
        }
        b.extend_from_slice(&v2[MAIN_HEADER + m.snaps.len() * LISTED..]);
        let c = crc_of(&b, 56);
        b[56..60].copy_from_slice(&c.to_le_bytes());
        b
    }

    #[test]
    fn a_version_1_main_file_reads_with_every_size_the_logical_one() {
        let listed = |id, gen| Listed {
            id,
            gen,
            created: 100 * id,
            size: 1 << 20,
        };
        let m = Main {
            flags: 0,
            volume: 4,
            size: 1 << 20,
            homes: 1 << 20,
            gen: 3,
            base: 2,
            applied: 5,
            snaps: vec![listed(1, 1), listed(2, 2)],
            head: vec![Record {
                block: 3,
                phys: 256,
                birth: 3,
            }],
        };
        assert_eq!(decode_main(&encode_main_v1(&m)), Ok(m.clone()));
        // A version 2 file with homes past the size is refused, as is a snapshot smaller
        // than homes.
        let patched = |at: usize, v: u64| {
            let mut b = encode_main(&m);
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            let c = crc_of(&b, 56);
            b[56..60].copy_from_slice(&c.to_le_bytes());
            decode_main(&b)
        };
        assert_eq!(
            patched(72, 2 << 20),
            Err(FormatError::Homes {
                homes: 2 << 20,
                size: 1 << 20
            })
        );
        assert_eq!(
            patched(MAIN_HEADER + LISTED + 24, 1 << 19),
            Err(FormatError::BadSnapshot(2))
        );
    }

    #[test]
    fn a_diff_applied_to_its_base_gives_the_map() {
        let e = |phys| Entry { phys, birth: 1 };
        let base: Map = [(1u64, e(10)), (2, e(11)), (5, e(12))]
            .into_iter()
            .collect();
        let mut map = base.clone();
        map.remove(&2);
        map.insert(5, e(ZERO));
        map.insert(9, e(13));
        let d = diff(&base, &map);
        assert_eq!(d.len(), 3);
        assert_eq!(apply(&base, &d), map);
    }
}
