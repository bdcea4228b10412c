//! The verification oracle: self-describing blocks, and the rule every read must obey.
//!
//! Every 4 KiB block the benchmark writes describes itself:
//!
//! | bytes   | field                                              |
//! |---------|----------------------------------------------------|
//! | 0..8    | magic `TRIRBLK1`                                   |
//! | 8..16   | target id (a hash of the target's name)            |
//! | 16..24  | LBA (block index)                                  |
//! | 24..32  | writer id                                          |
//! | 32..40  | sequence number (grows with every write issued)    |
//! | 40..48  | writer epoch (the volume attach epoch, else 0)     |
//! | 48..52  | crc32c of bytes 0..48 and 52..4096                 |
//! | 52..4096| filler derived from (LBA, sequence)                |
//!
//! For each block the oracle keeps a *floor* and the highest sequence *issued*. Writes to a
//! block that are in flight at the same time form a group; NBD gives no order among them, so
//! once the group drains the block may hold any of them, and the floor becomes the group's
//! lowest sequence (a single write is a group of one: its own sequence). A read must return a
//! block with `floor <= seq <= issued` (DESIGN.md guarantee 2: never older than the last
//! acknowledged write), a valid checksum and its own LBA. Anything else is **lost** (zeros
//! where an acknowledged write should be), **stale** (an older write), or **corrupt** (bad
//! checksum, wrong LBA, target or writer, or a sequence never issued). Groups that chain
//! (A overlaps B, B overlaps C) keep A's floor until all drain: lenient, never a false alarm.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use serde::Serialize;

pub const BLOCK: u64 = 4096;
const MAGIC: &[u8; 8] = b"TRIRBLK1";
/// Largest span verified (4 M blocks: about 160 MiB of oracle state).
pub const MAX_VERIFY_SPAN: u64 = 16 << 30;
/// Findings kept in detail; the rest are only counted.
const MAX_DETAILS: usize = 32;

/// What a block held, judged against the oracle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    /// Never written by this run and reads as zeros (or as anything: the oracle has no claim).
    Unwritten,
    Lost,
    Stale,
    Corrupt,
}

/// One bad block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub lba: u64,
    pub verdict: Verdict,
    pub detail: String,
}

/// Counts of what verification found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub blocks_checked: u64,
    pub lost: u64,
    pub stale: u64,
    pub corrupt: u64,
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.stale == 0 && self.corrupt == 0
    }
    fn add(&mut self, f: Finding) {
        match f.verdict {
            Verdict::Lost => self.lost += 1,
            Verdict::Stale => self.stale += 1,
            Verdict::Corrupt => self.corrupt += 1,
            Verdict::Ok | Verdict::Unwritten => return,
        }
        if self.findings.len() < MAX_DETAILS {
            self.findings.push(f);
        }
    }
}

/// Identity stamped into every block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub target: u64,
    pub writer: u64,
    pub epoch: u64,
}

fn filler(lba: u64, seq: u64, out: &mut [u8]) {
    let mut x = lba.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq;
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn crc(b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&b[0..48]), &b[52..BLOCK as usize])
}

/// Fills one 4 KiB block.
pub fn encode_block(stamp: Stamp, lba: u64, seq: u64, out: &mut [u8]) {
    assert_eq!(out.len(), BLOCK as usize);
    out[0..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&stamp.target.to_le_bytes());
    out[16..24].copy_from_slice(&lba.to_le_bytes());
    out[24..32].copy_from_slice(&stamp.writer.to_le_bytes());
    out[32..40].copy_from_slice(&seq.to_le_bytes());
    out[40..48].copy_from_slice(&stamp.epoch.to_le_bytes());
    filler(lba, seq, &mut out[52..]);
    let c = crc(out);
    out[48..52].copy_from_slice(&c.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Judges one block read back: `acked` is the highest sequence acknowledged before the read
/// was issued, `issued` the highest issued when it completed (0 and 0: never written).
pub fn check_block(stamp: Stamp, lba: u64, b: &[u8], acked: u64, issued: u64) -> (Verdict, String) {
    if b.len() != BLOCK as usize {
        return (
            Verdict::Corrupt,
            format!("short block of {} bytes", b.len()),
        );
    }
    if &b[0..8] != MAGIC {
        if acked == 0 {
            return (Verdict::Unwritten, String::new());
        }
        let zeros = b.iter().all(|&x| x == 0);
        return if zeros {
            (
                Verdict::Lost,
                format!("zeros, but write {acked} was acknowledged"),
            )
        } else {
            (Verdict::Corrupt, "not a trireme block".into())
        };
    }
    let want = u32::from_le_bytes([b[48], b[49], b[50], b[51]]);
    if crc(b) != want {
        return (Verdict::Corrupt, "checksum mismatch".into());
    }
    let (target, blba, writer, seq) = (u64_at(b, 8), u64_at(b, 16), u64_at(b, 24), u64_at(b, 32));
    if blba != lba {
        return (Verdict::Corrupt, format!("holds LBA {blba} (misdirected)"));
    }
    if target != stamp.target || writer != stamp.writer {
        // Another run's block: this run has no claim unless it wrote here.
        return if acked == 0 {
            (Verdict::Unwritten, String::new())
        } else {
            (
                Verdict::Stale,
                format!(
                    "holds another run's write (writer {writer:#x}), ours {acked} was acknowledged"
                ),
            )
        };
    }
    if seq > issued {
        return (
            Verdict::Corrupt,
            format!("sequence {seq} was never issued (highest {issued})"),
        );
    }
    if seq < acked {
        return (
            Verdict::Stale,
            format!("sequence {seq}, but {acked} was acknowledged"),
        );
    }
    (Verdict::Ok, String::new())
}

#[derive(Default)]
struct BlockState {
    /// Writes in flight to this block.
    inflight: u32,
    /// Lowest sequence of the current group of overlapping writes.
    group_min: u64,
    /// No read may return a sequence below this (0: never written).
    floor: u64,
    issued: u64,
}

/// The oracle of one run. Shared by every I/O loop.
pub struct Oracle {
    stamp: Stamp,
    blocks: Vec<Mutex<BlockState>>,
    next_seq: AtomicU64,
    report: Mutex<VerifyReport>,
}

impl std::fmt::Debug for Oracle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oracle")
            .field("stamp", &self.stamp)
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl Oracle {
    /// An oracle for `span` bytes. Fails for spans over [`MAX_VERIFY_SPAN`].
    pub fn new(span: u64, stamp: Stamp) -> Result<Oracle, crate::BenchError> {
        if span > MAX_VERIFY_SPAN {
            return Err(crate::BenchError::VerifySpan {
                max: MAX_VERIFY_SPAN,
            });
        }
        let n = span / BLOCK;
        Ok(Oracle {
            stamp,
            blocks: (0..n).map(|_| Mutex::default()).collect(),
            next_seq: AtomicU64::new(1),
            report: Mutex::default(),
        })
    }

    pub fn stamp(&self) -> Stamp {
        self.stamp
    }

    fn block(&self, lba: u64) -> std::sync::MutexGuard<'_, BlockState> {
        self.blocks[lba as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The payload of a write of `len` bytes at `offset` (both multiples of 4 KiB), and its
    /// sequence number. Marks the blocks as issued.
    pub fn prepare_write(&self, offset: u64, len: u64) -> (Bytes, u64) {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let mut buf = BytesMut::zeroed(len as usize);
        for (i, chunk) in buf.chunks_mut(BLOCK as usize).enumerate() {
            let lba = offset / BLOCK + i as u64;
            {
                let mut b = self.block(lba);
                b.issued = b.issued.max(seq);
                b.group_min = if b.inflight == 0 {
                    seq
                } else {
                    b.group_min.min(seq)
                };
                b.inflight += 1;
            }
            encode_block(self.stamp, lba, seq, chunk);
        }
        (buf.freeze(), seq)
    }

    /// Records that a write of `[offset, offset+len)` was acknowledged. A write that failed is
    /// not acknowledged: its blocks stay in flight and their floor does not rise.
    pub fn write_acked(&self, offset: u64, len: u64) {
        for lba in offset / BLOCK..(offset + len) / BLOCK {
            let mut b = self.block(lba);
            b.inflight -= 1;
            if b.inflight == 0 {
                b.floor = b.floor.max(b.group_min);
            }
        }
    }

    /// Call before issuing a read: the floor of each block.
    pub fn read_floor(&self, offset: u64, len: u64) -> Vec<u64> {
        (offset / BLOCK..(offset + len) / BLOCK)
            .map(|lba| self.block(lba).floor)
            .collect()
    }

    /// Checks a completed read against the floor taken before it; records what it finds and
    /// returns how many blocks were bad.
    pub fn check_read(&self, offset: u64, data: &[u8], floor: &[u64]) -> u64 {
        let mut bad = 0;
        let mut found = Vec::new();
        for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
            let lba = offset / BLOCK + i as u64;
            let issued = self.block(lba).issued;
            let (verdict, detail) = check_block(self.stamp, lba, chunk, floor[i], issued);
            if !matches!(verdict, Verdict::Ok | Verdict::Unwritten) {
                bad += 1;
                found.push(Finding {
                    lba,
                    verdict,
                    detail,
                });
            }
        }
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        r.blocks_checked += (data.len() as u64) / BLOCK;
        for f in found {
            r.add(f);
        }
        bad
    }

    /// The offset of every block this run wrote and saw acknowledged.
    pub fn written_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.blocks.len() as u64)
            .filter(|&lba| self.block(lba).floor > 0)
            .map(|lba| lba * BLOCK)
    }

    pub fn report(&self) -> VerifyReport {
        self.report
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A stable 64-bit id for a target name (FNV-1a).
pub fn target_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Stamp = Stamp {
        target: 7,
        writer: 9,
        epoch: 3,
    };

    #[test]
    fn verdicts() {
        let mut b = vec![0u8; 4096];
        assert_eq!(check_block(S, 5, &b, 0, 0).0, Verdict::Unwritten);
        assert_eq!(check_block(S, 5, &b, 4, 4).0, Verdict::Lost);
        encode_block(S, 5, 4, &mut b);
        assert_eq!(check_block(S, 5, &b, 4, 4).0, Verdict::Ok);
        assert_eq!(
            check_block(S, 5, &b, 3, 6).0,
            Verdict::Ok,
            "in-flight newer writes may or may not have landed"
        );
        assert_eq!(check_block(S, 5, &b, 6, 6).0, Verdict::Stale);
        assert_eq!(
            check_block(S, 5, &b, 1, 3).0,
            Verdict::Corrupt,
            "a sequence never issued"
        );
        assert_eq!(
            check_block(S, 6, &b, 1, 6).0,
            Verdict::Corrupt,
            "misdirected"
        );
        b[100] ^= 1;
        assert_eq!(check_block(S, 5, &b, 4, 4).0, Verdict::Corrupt);
        let other = Stamp { writer: 10, ..S };
        let mut o = vec![0u8; 4096];
        encode_block(other, 5, 1, &mut o);
        assert_eq!(check_block(S, 5, &o, 0, 0).0, Verdict::Unwritten);
        assert_eq!(check_block(S, 5, &o, 2, 2).0, Verdict::Stale);
    }

    #[test]
    fn oracle_tracks_acks_and_reads() {
        let o = Oracle::new(1 << 20, S).unwrap();
        let floor = o.read_floor(8192, 8192);
        let (data, _) = o.prepare_write(8192, 8192);
        o.write_acked(8192, 8192);
        assert_eq!(o.check_read(8192, &data, &floor), 0);
        // A read issued after the ack must not see the old (zero) contents.
        let floor = o.read_floor(8192, 8192);
        assert_eq!(o.check_read(8192, &[0u8; 8192], &floor), 2);
        let r = o.report();
        assert_eq!((r.lost, r.blocks_checked), (2, 4));
        assert_eq!(o.written_blocks().collect::<Vec<_>>(), vec![8192, 12288]);
        assert!(Oracle::new(MAX_VERIFY_SPAN + 1, S).is_err());
    }

    #[test]
    fn overlapping_writes_may_land_in_either_order() {
        let o = Oracle::new(1 << 20, S).unwrap();
        let (a, _) = o.prepare_write(0, 8192);
        let (b, _) = o.prepare_write(4096, 8192);
        // B is acknowledged first, then A lands on block 1 after it: both are legitimate.
        o.write_acked(4096, 8192);
        o.write_acked(0, 8192);
        let floor = o.read_floor(4096, 4096);
        assert_eq!(
            o.check_read(4096, &a[4096..], &floor),
            0,
            "A last is allowed"
        );
        assert_eq!(
            o.check_read(4096, &b[..4096], &floor),
            0,
            "B last is allowed"
        );
        // A later write that did not overlap in time supersedes both.
        let (c, _) = o.prepare_write(4096, 4096);
        o.write_acked(4096, 4096);
        let floor = o.read_floor(4096, 4096);
        assert_eq!(
            o.check_read(4096, &b[..4096], &floor),
            1,
            "stale after a later write"
        );
        assert_eq!(o.check_read(4096, &c, &floor), 0);
        assert_eq!(o.report().stale, 1);
    }
}
