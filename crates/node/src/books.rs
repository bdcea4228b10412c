//! On-disk formats of a node's bookkeeping (kept through `trireme_store::Ledger`): pure encode
//! and decode, fuzzed (`fuzz/fuzz_targets/books.rs`). What they hold and when they are written
//! is in `activity.rs` (the activity log) and `dirty.rs` (peers' dirty records).
//!
//! **Activity log** (paged, written in place, one page per write on the write path):
//!
//! | page | offset | size | field                                             |
//! |-----:|-------:|-----:|---------------------------------------------------|
//! | 0    | 0      | 8    | magic `TRIRALOG`                                  |
//! |      | 8      | 4    | version (1)                                       |
//! |      | 12     | 4    | extent shift (log2 of the extent size)            |
//! |      | 16     | 8    | volume id                                         |
//! |      | 24     | 8    | volume size in bytes                              |
//! |      | 32     | 8    | epoch of the writer that started the log          |
//! |      | 40     | 4    | crc32c of bytes 0..40                             |
//! | 1..  | 0      | 4080 | 510 little-endian u64 words of the extent bitmap  |
//! |      | 4080   | 8    | epoch (as in the header)                          |
//! |      | 4088   | 4    | page number                                       |
//! |      | 4092   | 4    | crc32c of bytes 0..4092                           |
//!
//! A bitmap page that is missing, torn (its checksum fails), or from another log (epoch or
//! number differ) is read as *every extent marked*: more to compare after a crash, never less.
//! A header that fails its checks means no log at all (the whole volume is compared).
//!
//! **Dirty records** (one blob, replaced atomically): magic `TRIRDIRT`, version u32 (1),
//! volume u64, record count u32; per record: peer u32, mode u8, complete u8, two zero bytes,
//! epoch u64, incarnation u64, range count u64, then that many (offset u64, length u64) byte
//! ranges, in order and not overlapping, inside the volume; and a crc32c of everything before.

use trireme_store::ledger::PAGE;

/// u64 words of bitmap per log page.
pub const WORDS_PER_PAGE: usize = 510;
const LOG_MAGIC: &[u8; 8] = b"TRIRALOG";
const DIRTY_MAGIC: &[u8; 8] = b"TRIRDIRT";
const VERSION: u32 = 1;
/// Largest volume the formats describe (1 PiB), so corrupt sizes cannot drive huge allocations.
const MAX_SIZE: u64 = 1 << 50;

/// Why stored bookkeeping was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BooksError {
    #[error("{0} bytes: too short")]
    Short(usize),
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported version {0}")]
    BadVersion(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("kept for volume {found}, not {expected}")]
    OtherVolume { found: u64, expected: u64 },
    #[error("implausible geometry: size {size}, extent shift {shift}")]
    Geometry { size: u64, shift: u32 },
    #[error("bad record: {0}")]
    Record(String),
}

/// The log's geometry and owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHeader {
    pub volume: u64,
    pub size: u64,
    pub shift: u32,
    pub epoch: u64,
}

impl LogHeader {
    pub fn extents(&self) -> u64 {
        self.size.div_ceil(1 << self.shift)
    }
    pub fn words(&self) -> usize {
        self.extents().div_ceil(64) as usize
    }
    /// Bitmap pages after the header page.
    pub fn pages(&self) -> usize {
        self.words().div_ceil(WORDS_PER_PAGE)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The header page.
pub fn encode_log_header(h: &LogHeader) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    p[0..8].copy_from_slice(LOG_MAGIC);
    p[8..12].copy_from_slice(&VERSION.to_le_bytes());
    p[12..16].copy_from_slice(&h.shift.to_le_bytes());
    p[16..24].copy_from_slice(&h.volume.to_le_bytes());
    p[24..32].copy_from_slice(&h.size.to_le_bytes());
    p[32..40].copy_from_slice(&h.epoch.to_le_bytes());
    let crc = crc32c::crc32c(&p[0..40]);
    p[40..44].copy_from_slice(&crc.to_le_bytes());
    p
}

/// Bitmap page `n` (1-based: page 0 is the header) holding `words`, at most
/// [`WORDS_PER_PAGE`] of them.
pub fn encode_log_page(epoch: u64, n: u32, words: &[u64]) -> Vec<u8> {
    assert!(
        words.len() <= WORDS_PER_PAGE,
        "a page holds {WORDS_PER_PAGE} words"
    );
    let mut p = vec![0u8; PAGE];
    for (i, w) in words.iter().enumerate() {
        p[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    p[4080..4088].copy_from_slice(&epoch.to_le_bytes());
    p[4088..4092].copy_from_slice(&n.to_le_bytes());
    let crc = crc32c::crc32c(&p[0..4092]);
    p[4092..4096].copy_from_slice(&crc.to_le_bytes());
    p
}

/// A whole log as stored: header, bitmap, and how many pages had to be assumed fully marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedLog {
    pub header: LogHeader,
    pub words: Vec<u64>,
    pub assumed_pages: usize,
}

/// Reads a stored log of `volume`. `Ok(None)`: nothing stored.
pub fn decode_log(b: &[u8], volume: u64) -> Result<Option<DecodedLog>, BooksError> {
    if b.is_empty() {
        return Ok(None);
    }
    if b.len() < PAGE {
        return Err(BooksError::Short(b.len()));
    }
    if &b[0..8] != LOG_MAGIC {
        return Err(BooksError::BadMagic);
    }
    if crc32c::crc32c(&b[0..40]) != u32_at(b, 40) {
        return Err(BooksError::Checksum);
    }
    let version = u32_at(b, 8);
    if version != VERSION {
        return Err(BooksError::BadVersion(version));
    }
    let header = LogHeader {
        shift: u32_at(b, 12),
        volume: u64_at(b, 16),
        size: u64_at(b, 24),
        epoch: u64_at(b, 32),
    };
    if header.volume != volume {
        return Err(BooksError::OtherVolume {
            found: header.volume,
            expected: volume,
        });
    }
    let extent_ok = (crate::activity::MIN_EXTENT.trailing_zeros()
        ..=crate::activity::MAX_EXTENT.trailing_zeros())
        .contains(&header.shift);
    if !extent_ok
        || header.size == 0
        || header.size > MAX_SIZE
        || header.extents() > crate::activity::MAX_EXTENTS
    {
        return Err(BooksError::Geometry {
            size: header.size,
            shift: header.shift,
        });
    }
    let mut words = vec![0u64; header.words()];
    let mut assumed_pages = 0;
    for (k, chunk) in words.chunks_mut(WORDS_PER_PAGE).enumerate() {
        let n = k + 1;
        let page = b.get(n * PAGE..(n + 1) * PAGE);
        let good = page.filter(|p| {
            crc32c::crc32c(&p[0..4092]) == u32_at(p, 4092)
                && u64_at(p, 4080) == header.epoch
                && u32_at(p, 4088) as usize == n
        });
        match good {
            Some(p) => {
                for (i, w) in chunk.iter_mut().enumerate() {
                    *w = u64_at(p, i * 8);
                }
            }
            None => {
                assumed_pages += 1;
                chunk.fill(u64::MAX);
            }
        }
    }
    // Bits past the last extent mean nothing; keep them clear.
    let extents = header.extents();
    if !extents.is_multiple_of(64) {
        if let Some(last) = words.last_mut() {
            *last &= (1u64 << (extents % 64)) - 1;
        }
    }
    Ok(Some(DecodedLog {
        header,
        words,
        assumed_pages,
    }))
}

/// One peer's dirty record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub peer: u32,
    pub mode: u8,
    pub complete: bool,
    pub epoch: u64,
    pub incarnation: u64,
    /// Byte ranges, in order, not overlapping.
    pub ranges: Vec<(u64, u64)>,
}

pub fn encode_records(volume: u64, records: &[StoredRecord]) -> Vec<u8> {
    let mut b = Vec::with_capacity(24 + records.len() * 32);
    b.extend_from_slice(DIRTY_MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&volume.to_le_bytes());
    b.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        b.extend_from_slice(&r.peer.to_le_bytes());
        b.push(r.mode);
        b.push(u8::from(r.complete));
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&r.epoch.to_le_bytes());
        b.extend_from_slice(&r.incarnation.to_le_bytes());
        b.extend_from_slice(&(r.ranges.len() as u64).to_le_bytes());
        for &(o, l) in &r.ranges {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&l.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Reads stored records of `volume`, whose size bounds every range.
pub fn decode_records(b: &[u8], volume: u64, size: u64) -> Result<Vec<StoredRecord>, BooksError> {
    if b.len() < 28 {
        return Err(BooksError::Short(b.len()));
    }
    if &b[0..8] != DIRTY_MAGIC {
        return Err(BooksError::BadMagic);
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body) != u32_at(crc, 0) {
        return Err(BooksError::Checksum);
    }
    let version = u32_at(body, 8);
    if version != VERSION {
        return Err(BooksError::BadVersion(version));
    }
    let found = u64_at(body, 12);
    if found != volume {
        return Err(BooksError::OtherVolume {
            found,
            expected: volume,
        });
    }
    let count = u32_at(body, 20) as usize;
    let bad = |what: String| BooksError::Record(what);
    let mut at = 24;
    let mut out = Vec::new();
    for _ in 0..count {
        let head = body
            .get(at..at + 32)
            .ok_or_else(|| bad("truncated record".into()))?;
        if head[6] != 0 || head[7] != 0 || head[5] > 1 {
            return Err(bad("reserved bytes set".into()));
        }
        let n = u64_at(head, 24);
        at += 32;
        // Each range takes 16 bytes: a count the blob cannot hold is refused before anything
        // is allocated for it.
        let need = n
            .checked_mul(16)
            .filter(|need| *need <= (body.len() - at) as u64)
            .ok_or_else(|| bad(format!("{n} ranges do not fit")))?;
        let mut ranges = Vec::with_capacity(n as usize);
        let mut end = 0u64;
        for k in 0..n as usize {
            let o = u64_at(body, at + k * 16);
            let l = u64_at(body, at + k * 16 + 8);
            let stop = o
                .checked_add(l)
                .filter(|s| l > 0 && o >= end && *s <= size)
                .ok_or_else(|| {
                    bad(format!(
                        "range ({o}, {l}) out of order or outside the volume"
                    ))
                })?;
            end = stop;
            ranges.push((o, l));
        }
        at += need as usize;
        out.push(StoredRecord {
            peer: u32_at(head, 0),
            mode: head[4],
            complete: head[5] == 1,
            epoch: u64_at(head, 8),
            incarnation: u64_at(head, 16),
            ranges,
        });
    }
    if at != body.len() {
        return Err(bad(format!("{} bytes after the records", body.len() - at)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// What the fuzz target `books` checks, on every test run: any bytes read back as a
        /// log or as records either decode consistently or are refused; never a panic.
        #[test]
        fn any_bytes_decode_or_are_refused(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..9000)) {
            if let Ok(Some(log)) = decode_log(&data, 1) {
                proptest::prop_assert_eq!(log.words.len(), log.header.words());
            }
            if let Ok(r) = decode_records(&data, 1, 1 << 30) {
                proptest::prop_assert_eq!(encode_records(1, &r), data);
            }
        }

        /// A valid log with any page damaged reads back with that page fully marked.
        #[test]
        fn a_damaged_page_is_fully_marked(at in 0usize..3 * PAGE, bit in 0u8..8) {
            let h = LogHeader { volume: 1, size: 1200 * 64 * (64 << 10), shift: 16, epoch: 2 };
            let mut b = encode_log_header(&h);
            let words = vec![0u64; h.words()];
            for (k, c) in words.chunks(WORDS_PER_PAGE).enumerate() {
                b.extend(encode_log_page(2, k as u32 + 1, c));
            }
            b[PAGE + at] ^= 1 << bit;
            let d = decode_log(&b, 1).unwrap().unwrap();
            let page = at / PAGE;
            proptest::prop_assert_eq!(d.assumed_pages, 1);
            let first = page * WORDS_PER_PAGE;
            let last = (first + WORDS_PER_PAGE).min(d.words.len());
            proptest::prop_assert!(d.words[first..last].iter().all(|w| *w != 0));
        }
    }

    fn header() -> LogHeader {
        LogHeader {
            volume: 9,
            size: 2000 * 64 * (64 << 10) + 4096, // 128,001 extents: 251 pages
            shift: 16,
            epoch: 4,
        }
    }

    fn log(h: &LogHeader, words: &[u64]) -> Vec<u8> {
        let mut b = encode_log_header(h);
        for (k, c) in words.chunks(WORDS_PER_PAGE).enumerate() {
            b.extend(encode_log_page(h.epoch, k as u32 + 1, c));
        }
        b
    }

    #[test]
    fn a_log_round_trips_and_bad_pages_read_as_fully_marked() {
        let h = header();
        let mut words = vec![0u64; h.words()];
        words[0] = 0b101;
        words[WORDS_PER_PAGE + 3] = 1 << 63;
        let b = log(&h, &words);
        let d = decode_log(&b, 9).unwrap().unwrap();
        assert_eq!((d.header, d.assumed_pages), (h, 0));
        assert_eq!(d.words, words);
        assert_eq!(decode_log(&[], 9), Ok(None));

        // A torn second page, a page of an older log, and a missing last page.
        let mut torn = b.clone();
        torn[2 * PAGE + 17] ^= 1;
        let d = decode_log(&torn, 9).unwrap().unwrap();
        assert_eq!(d.assumed_pages, 1);
        assert!(d.words[WORDS_PER_PAGE..2 * WORDS_PER_PAGE]
            .iter()
            .all(|w| *w == u64::MAX));
        assert_eq!(d.words[0], 0b101, "other pages are as written");
        let mut stale = b.clone();
        stale[PAGE..2 * PAGE].copy_from_slice(&encode_log_page(3, 1, &words[..WORDS_PER_PAGE]));
        assert_eq!(decode_log(&stale, 9).unwrap().unwrap().assumed_pages, 1);
        let short = &b[..b.len() - PAGE];
        let d = decode_log(short, 9).unwrap().unwrap();
        assert_eq!(d.assumed_pages, 1);
        let last = *d.words.last().unwrap();
        assert_eq!(
            last,
            (1u64 << (h.extents() % 64)) - 1,
            "no bits past the end"
        );
    }

    #[test]
    fn a_bad_header_is_no_log() {
        let b = log(&header(), &vec![0; header().words()]);
        assert_eq!(
            decode_log(&b, 8),
            Err(BooksError::OtherVolume {
                found: 9,
                expected: 8
            })
        );
        let mut c = b.clone();
        c[20] ^= 1;
        assert_eq!(decode_log(&c, 9), Err(BooksError::Checksum));
        assert_eq!(decode_log(&b[..100], 9), Err(BooksError::Short(100)));
        let odd = LogHeader {
            shift: 12,
            ..header()
        };
        assert!(matches!(
            decode_log(&encode_log_header(&odd), 9),
            Err(BooksError::Geometry { .. })
        ));
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let recs = vec![
            StoredRecord {
                peer: 2,
                mode: 1,
                complete: true,
                epoch: 7,
                incarnation: 99,
                ranges: vec![(0, 4096), (65536, 8192)],
            },
            StoredRecord {
                peer: 3,
                mode: 2,
                complete: false,
                epoch: 7,
                incarnation: 5,
                ranges: vec![],
            },
        ];
        let b = encode_records(1, &recs);
        assert_eq!(decode_records(&b, 1, 1 << 20).unwrap(), recs);
        assert!(decode_records(&b, 2, 1 << 20).is_err(), "another volume");
        assert!(
            decode_records(&b, 1, 65536).is_err(),
            "a range past the end"
        );
        let mut c = b.clone();
        c[30] ^= 1;
        assert_eq!(decode_records(&c, 1, 1 << 20), Err(BooksError::Checksum));
        // A range count the blob cannot hold, with a valid checksum.
        let mut huge = encode_records(1, &recs[1..]);
        huge.truncate(huge.len() - 4);
        huge[24 + 24..24 + 32].copy_from_slice(&u64::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&huge);
        huge.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_records(&huge, 1, 1 << 20),
            Err(BooksError::Record(_))
        ));
    }
}
