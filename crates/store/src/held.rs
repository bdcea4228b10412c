//! Which blocks of a parity volume's replica are held: written (data or zeroes) since they
//! were last trimmed, exactly, at 4 KiB (issue 67). A writer that restarts takes a parity
//! region's overlay as the blocks its mirrors hold; the allocation maps cannot say that (the
//! file store's grain is 64 KiB, and a partial trim writes zeroes). See ARCHITECTURE.md,
//! "The overlay after a crash".
//!
//! This file is the map and its format; keeping it durable beside a replica is the node's.
//! The rules it is made for:
//!
//! - a write sets its blocks in memory; they are on disk after the next flush's pages are
//!   (a write lost with its bit was never flushed: the stripe's older bytes may be read);
//! - a trim clears its blocks on disk *before* its bytes are punched (a crash in between
//!   reads the stripe, which holds the same bytes).
//!
//! **Format.** Pages of 4 KiB, each a 32-byte header (magic `TRHB`, version, page index,
//! sequence number, crc32c of the rest) and 32,512 blocks' bits. Page `p` has two slots,
//! `2p` and `2p + 1`, written in turn by sequence number: a write torn by a power loss spoils
//! only the slot it went to, and the other holds the page as it was. Read back, each page is
//! the valid slot of the higher sequence; a page never written, or whose first write tore,
//! has a slot of zeroes and reads empty; two spoiled slots are corrupt, never read as empty
//! or as full.

use std::collections::BTreeSet;

/// One slot's bytes.
pub const PAGE: usize = 4096;
const HEADER: usize = 32;
/// Blocks per page.
pub const BLOCKS_PER_PAGE: u64 = ((PAGE - HEADER) * 8) as u64;
const MAGIC: &[u8; 4] = b"TRHB";
const VERSION: u16 = 1;

/// Why a held map read back is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldError {
    #[error("held map: {got} bytes, not the {want} of {pages} pages of two slots")]
    Length { got: usize, want: usize, pages: u64 },
    #[error("held map: page {page} has no valid slot (both torn or overwritten)")]
    Corrupt { page: u64 },
    #[error("held map's live copy: {got} bytes, not {want}")]
    LiveLength { got: usize, want: usize },
    #[error("held map's live copy: block {block} is past the replica's end")]
    LivePastEnd { block: u64 },
}

/// The held blocks of one replica (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMap {
    blocks: u64,
    words: Vec<u64>,
    /// Per page: the sequence number of its last durable write (0: never written).
    seq: Vec<u64>,
    /// Pages changed since their last durable write.
    dirty: BTreeSet<u64>,
}

impl HeldMap {
    /// An empty map of a replica of `blocks` blocks.
    pub fn new(blocks: u64) -> HeldMap {
        let pages = blocks.div_ceil(BLOCKS_PER_PAGE);
        HeldMap {
            blocks,
            words: vec![0; (pages * BLOCKS_PER_PAGE / 64) as usize],
            seq: vec![0; pages as usize],
            dirty: BTreeSet::new(),
        }
    }

    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    fn pages(&self) -> u64 {
        self.seq.len() as u64
    }

    /// Bytes of the map on disk: two slots a page.
    pub fn disk_len(&self) -> usize {
        self.seq.len() * 2 * PAGE
    }

    /// Marks `count` blocks from `first` held (`on`) or not; blocks past the end are ignored.
    /// Returns the bytes of the [live image](HeldMap::live_image) that changed, as the offset
    /// of the first and the bytes from there (empty when nothing changed).
    pub fn mark(&mut self, first: u64, count: u64, on: bool) -> (u64, Vec<u8>) {
        let end = first.saturating_add(count).min(self.blocks);
        let mut changed: Option<(usize, usize)> = None;
        for b in first..end {
            let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            let was = self.words[w] & bit != 0;
            if was != on {
                self.words[w] ^= bit;
                self.dirty.insert(b / BLOCKS_PER_PAGE);
                changed = Some(changed.map_or((w, w), |(a, _)| (a, w)));
            }
        }
        match changed {
            Some((a, z)) => (8 * a as u64, words_le(&self.words[a..=z])),
            None => (0, Vec::new()),
        }
    }

    /// The map as the node holds it in memory, every block's bit (8 bytes per 64 blocks,
    /// little-endian): what the node keeps in the replica's **live copy**, rewritten where a
    /// mark changes it, so that the map outlives a crash of the node's process (not a power
    /// loss: nothing syncs it). See ARCHITECTURE.md, "The overlay after a crash".
    pub fn live_image(&self) -> Vec<u8> {
        words_le(&self.words)
    }

    /// Takes the bits of a live copy read back after the node's process died (in the same
    /// boot of the machine) as the map: the pages where it differs from what was durable are
    /// dirty, so the next flush makes them durable after their data. Refused, the map
    /// unchanged: a copy of another length, or with bits past the replica's end.
    pub fn adopt_live(&mut self, bytes: &[u8]) -> Result<u64, HeldError> {
        let want = 8 * self.words.len();
        if bytes.len() != want {
            return Err(HeldError::LiveLength {
                got: bytes.len(),
                want,
            });
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let tail = self.words.len() as u64 * 64;
        if let Some(b) =
            (self.blocks..tail).find(|&b| words[(b / 64) as usize] & (1 << (b % 64)) != 0)
        {
            return Err(HeldError::LivePastEnd { block: b });
        }
        let per_page = (BLOCKS_PER_PAGE / 64) as usize;
        let mut newer = 0;
        for (p, (now, live)) in self
            .words
            .chunks(per_page)
            .zip(words.chunks(per_page))
            .enumerate()
        {
            if now != live {
                self.dirty.insert(p as u64);
                newer += 1;
            }
        }
        self.words = words;
        Ok(newer)
    }

    pub fn is_held(&self, block: u64) -> bool {
        block < self.blocks && self.words[(block / 64) as usize] & (1 << (block % 64)) != 0
    }

    /// The held blocks of `[first, first + count)`, as runs of (first block, count).
    pub fn held(&self, first: u64, count: u64) -> Vec<(u64, u64)> {
        let end = first.saturating_add(count).min(self.blocks);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for b in first..end {
            if !self.is_held(b) {
                continue;
            }
            match out.last_mut() {
                Some((s, n)) if *s + *n == b => *n += 1,
                _ => out.push((b, 1)),
            }
        }
        out
    }

    /// Whether a page changed since it was last written.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The changed pages, each as the slot it goes to and its bytes. Nothing changes here:
    /// [`HeldMap::written`] says they are durable. Written again after a failure, a page goes
    /// to the same slot, never over the one that holds it as it was.
    pub fn pending(&self) -> Vec<(u64, Vec<u8>)> {
        self.dirty
            .iter()
            .map(|&p| {
                let seq = self.seq[p as usize] + 1;
                (2 * p + seq % 2, self.encode_page(p, seq))
            })
            .collect()
    }

    /// The pages [`HeldMap::pending`] gave are durable.
    pub fn written(&mut self, slots: &[u64]) {
        for &slot in slots {
            let p = slot / 2;
            if self.dirty.remove(&p) {
                self.seq[p as usize] += 1;
            }
        }
    }

    /// As [`HeldMap::pending`], and the pages are clean from now: marks made while they
    /// are being written dirty them again, for the next flush. [`HeldMap::settled`] says
    /// how the write went. One taker at a time (the node's flush lock): a second would
    /// write the same slots.
    pub fn take_pending(&mut self) -> Vec<(u64, Vec<u8>)> {
        let pages = self.pending();
        self.dirty.clear();
        pages
    }

    /// The pages [`HeldMap::take_pending`] gave are durable (`ok`), or their write failed
    /// and they go again with the next flush, to the same slots.
    pub fn settled(&mut self, slots: &[u64], ok: bool) {
        for &slot in slots {
            let p = slot / 2;
            let next = 2 * p + (self.seq[p as usize] + 1) % 2;
            match ok {
                true if slot == next => self.seq[p as usize] += 1,
                true => {}
                false => {
                    self.dirty.insert(p);
                }
            }
        }
    }

    fn encode_page(&self, page: u64, seq: u64) -> Vec<u8> {
        let mut out = vec![0u8; PAGE];
        out[..4].copy_from_slice(MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&page.to_le_bytes());
        out[16..24].copy_from_slice(&seq.to_le_bytes());
        let first = (page * BLOCKS_PER_PAGE / 64) as usize;
        let words = &self.words[first..first + (BLOCKS_PER_PAGE / 64) as usize];
        for (k, w) in words.iter().enumerate() {
            out[HEADER + 8 * k..HEADER + 8 * k + 8].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[HEADER..]);
        let crc = crc32c::crc32c_append(crc, &out[..24]);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// A map of a replica of `blocks` blocks read back from `bytes` (every page's two slots).
    pub fn decode(bytes: &[u8], blocks: u64) -> Result<HeldMap, HeldError> {
        let mut map = HeldMap::new(blocks);
        if bytes.len() != map.disk_len() {
            return Err(HeldError::Length {
                got: bytes.len(),
                want: map.disk_len(),
                pages: map.pages(),
            });
        }
        let per_page = (BLOCKS_PER_PAGE / 64) as usize;
        for p in 0..map.pages() {
            let slot =
                |s: u64| &bytes[(2 * p + s) as usize * PAGE..(2 * p + s + 1) as usize * PAGE];
            let best = [slot(0), slot(1)]
                .into_iter()
                .filter_map(|b| valid(b, p).map(|seq| (seq, b)))
                .max_by_key(|(seq, _)| *seq);
            let Some((seq, page)) = best else {
                // Never written, or its first write tore (a slot is written only once the
                // other holds the page whole, so after a first whole write one is valid).
                let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
                if zero(slot(0)) || zero(slot(1)) {
                    continue;
                }
                return Err(HeldError::Corrupt { page: p });
            };
            map.seq[p as usize] = seq;
            let words = &mut map.words[p as usize * per_page..(p as usize + 1) * per_page];
            for (k, w) in words.iter_mut().enumerate() {
                let at = HEADER + 8 * k;
                *w = u64::from_le_bytes(page[at..at + 8].try_into().expect("8 bytes"));
            }
        }
        // Bits past the replica's end are never held.
        let tail = map.words.len() as u64 * 64;
        for b in blocks..tail {
            map.words[(b / 64) as usize] &= !(1 << (b % 64));
        }
        Ok(map)
    }
}

fn words_le(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The sequence number of slot `b` if it is a valid slot of page `page`.
fn valid(b: &[u8], page: u64) -> Option<u64> {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    if &b[..4] != MAGIC || b[4..6] != VERSION.to_le_bytes() || u64_at(8) != page {
        return None;
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[HEADER..]), &b[..24]);
    let seq = u64_at(16);
    (b[24..28] == crc.to_le_bytes() && seq > 0).then_some(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes what is pending into `disk` (two slots a page), as a node would.
    fn persist(map: &mut HeldMap, disk: &mut [u8]) -> Vec<u64> {
        let pending = map.pending();
        for (slot, bytes) in &pending {
            let at = *slot as usize * PAGE;
            disk[at..at + PAGE].copy_from_slice(bytes);
        }
        let slots: Vec<u64> = pending.iter().map(|(s, _)| *s).collect();
        map.written(&slots);
        slots
    }

    #[test]
    fn marks_read_back_exactly_and_only_what_was_flushed() {
        let blocks = 2 * BLOCKS_PER_PAGE + 100;
        let mut m = HeldMap::new(blocks);
        let mut disk = vec![0u8; m.disk_len()];
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap(),
            m,
            "never written: empty"
        );
        m.mark(5, 3, true);
        m.mark(BLOCKS_PER_PAGE - 1, 2, true);
        m.mark(blocks - 1, 10, true);
        assert_eq!(
            m.held(0, blocks),
            vec![(5, 3), (BLOCKS_PER_PAGE - 1, 2), (blocks - 1, 1)]
        );
        assert_eq!(persist(&mut m, &mut disk).len(), 3, "three pages changed");
        assert!(!m.is_dirty());
        let back = HeldMap::decode(&disk, blocks).unwrap();
        assert_eq!(back.held(0, blocks), m.held(0, blocks));
        // Unflushed marks are not on disk; a mark that changes nothing dirties nothing.
        m.mark(6, 1, false);
        m.mark(5, 1, true);
        assert_eq!(m.pending().len(), 1);
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, 10),
            vec![(5, 3)]
        );
        persist(&mut m, &mut disk);
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, 10),
            vec![(5, 1), (7, 1)]
        );
    }

    #[test]
    fn the_live_image_follows_every_mark_and_is_taken_back_after_a_crash() {
        let blocks = 2 * BLOCKS_PER_PAGE + 5;
        let mut m = HeldMap::new(blocks);
        let mut disk = vec![0u8; m.disk_len()];
        let mut live = m.live_image();
        let apply = |live: &mut Vec<u8>, (at, bytes): (u64, Vec<u8>)| {
            live[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
        };
        apply(&mut live, m.mark(3, 2, true));
        persist(&mut m, &mut disk);
        apply(&mut live, m.mark(BLOCKS_PER_PAGE + 7, 70, true));
        apply(&mut live, m.mark(4, 1, false));
        assert_eq!(m.mark(3, 1, true), (0, Vec::new()), "nothing changed");
        assert_eq!(live, m.live_image());
        // The process dies: its disk has the first flush, its live copy every mark.
        let mut back = HeldMap::decode(&disk, blocks).unwrap();
        assert_eq!(back.held(0, blocks), vec![(3, 2)]);
        assert_eq!(
            back.adopt_live(&live),
            Ok(2),
            "two pages newer than on disk"
        );
        assert_eq!(back.held(0, blocks), m.held(0, blocks));
        // Its next flush makes them durable.
        persist(&mut back, &mut disk);
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, blocks),
            m.held(0, blocks)
        );
        // A copy of another size, or holding a block past the end: refused, nothing taken.
        assert_eq!(
            back.adopt_live(&live[..8]),
            Err(HeldError::LiveLength {
                got: 8,
                want: live.len()
            })
        );
        let mut past = live.clone();
        *past.last_mut().unwrap() |= 0x80;
        assert!(matches!(
            back.adopt_live(&past),
            Err(HeldError::LivePastEnd { .. })
        ));
        assert_eq!(back.held(0, blocks), m.held(0, blocks));
    }

    #[test]
    fn a_torn_write_leaves_the_page_as_it_was_and_two_are_corrupt() {
        let blocks = BLOCKS_PER_PAGE;
        let mut m = HeldMap::new(blocks);
        let mut disk = vec![0u8; m.disk_len()];
        m.mark(1, 1, true);
        persist(&mut m, &mut disk);
        m.mark(2, 1, true);
        // The next write goes to the other slot; torn halfway, it is refused and the page
        // reads as it was.
        let (slot, bytes) = m.pending().remove(0);
        let at = slot as usize * PAGE;
        disk[at..at + PAGE / 2].copy_from_slice(&bytes[..PAGE / 2]);
        disk[at + PAGE / 2..at + PAGE].fill(0xee);
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, 8),
            vec![(1, 1)]
        );
        // Written again after the failure: the same slot, not the one holding the page.
        assert_eq!(m.pending()[0].0, slot);
        persist(&mut m, &mut disk);
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, 8),
            vec![(1, 2)]
        );
        // Both slots spoiled: corrupt, neither empty nor full.
        disk[10] ^= 1;
        disk[PAGE + 10] ^= 1;
        assert_eq!(
            HeldMap::decode(&disk, blocks),
            Err(HeldError::Corrupt { page: 0 })
        );
        assert!(matches!(
            HeldMap::decode(&disk[..PAGE], blocks),
            Err(HeldError::Length { .. })
        ));
    }

    proptest::proptest! {
        /// Any bytes are refused or read as a map of the replica's size (`fuzz/held_map`
        /// searches deeper).
        #[test]
        fn any_bytes_are_refused_or_read_within_the_replica(
            pages in 1usize..3,
            noise in proptest::collection::vec((0usize..3 * 2 * PAGE, proptest::num::u8::ANY), 0..64),
            short in 0u64..100,
        ) {
            let blocks = pages as u64 * BLOCKS_PER_PAGE - short;
            let mut m = HeldMap::new(blocks);
            m.mark(0, blocks, true);
            let mut disk = vec![0u8; m.disk_len()];
            persist(&mut m, &mut disk);
            for (at, b) in noise {
                if let Some(x) = disk.get_mut(at) {
                    *x ^= b;
                }
            }
            if let Ok(back) = HeldMap::decode(&disk, blocks) {
                proptest::prop_assert!(back.held(blocks, u64::MAX).is_empty());
            }
        }

        /// Marks and flushes in any order, a flush torn at any byte by a power loss (after
        /// which the node reads the map back): every page reads as its last whole flush left
        /// it, or as the torn write would have, when the bytes it lost were there already.
        #[test]
        fn read_back_is_the_last_whole_flush_of_each_page(
            ops in proptest::collection::vec((0u64..3 * BLOCKS_PER_PAGE, 1u64..70_000, proptest::bool::ANY, 0u8..4), 1..40),
            tear in 0usize..PAGE,
        ) {
            let blocks = 3 * BLOCKS_PER_PAGE - 7;
            let mut m = HeldMap::new(blocks);
            let mut disk = vec![0u8; m.disk_len()];
            let mut flushed = m.clone();
            for (first, count, on, what) in ops {
                m.mark(first, count, on);
                // What a torn page may read as besides its last flush: the whole new page,
                // when the bytes that tore off equal what was there.
                let mut whole = flushed.clone();
                match what {
                    0 => {
                        persist(&mut m, &mut disk);
                        flushed = m.clone();
                    }
                    1 => {
                        // A flush torn in its first page: that page stays as it was.
                        if let Some((slot, bytes)) = m.pending().into_iter().next() {
                            let at = slot as usize * PAGE;
                            disk[at..at + tear].copy_from_slice(&bytes[..tear]);
                            let per = (BLOCKS_PER_PAGE / 64) as usize;
                            let w = (slot / 2) as usize * per;
                            whole.words[w..w + per].copy_from_slice(&m.words[w..w + per]);
                        }
                    }
                    _ => {}
                }
                let back = HeldMap::decode(&disk, blocks).unwrap();
                let held = back.held(0, blocks);
                proptest::prop_assert!(
                    held == flushed.held(0, blocks) || held == whole.held(0, blocks),
                    "read back {:?}", held
                );
                if what == 1 {
                    // A tear is a power loss: the node comes back with what the disk says.
                    m = back;
                    flushed = m.clone();
                }
            }
        }
    }

    #[test]
    fn marks_made_while_a_flush_is_written_go_with_the_next() {
        let blocks = BLOCKS_PER_PAGE;
        let mut m = HeldMap::new(blocks);
        let mut disk = vec![0u8; m.disk_len()];
        let write = |disk: &mut Vec<u8>, pages: &[(u64, Vec<u8>)]| {
            for (slot, bytes) in pages {
                let at = *slot as usize * PAGE;
                disk[at..at + PAGE].copy_from_slice(bytes);
            }
            pages.iter().map(|(s, _)| *s).collect::<Vec<u64>>()
        };
        m.mark(1, 1, true);
        let taken = m.take_pending();
        assert!(!m.is_dirty());
        m.mark(2, 1, true);
        let slots = write(&mut disk, &taken);
        m.settled(&slots, true);
        assert!(m.is_dirty(), "the mark made meanwhile is still to write");
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, 8),
            vec![(1, 1)]
        );
        // A failed write goes again, to the same slot.
        let again = m.take_pending();
        m.settled(&[again[0].0], false);
        assert_eq!(m.pending()[0].0, again[0].0);
        let slots = write(&mut disk, &m.take_pending());
        m.settled(&slots, true);
        assert_eq!(
            HeldMap::decode(&disk, blocks).unwrap().held(0, 8),
            vec![(1, 2)]
        );
        // The next write goes to the other slot.
        m.mark(3, 1, true);
        assert_ne!(m.pending()[0].0, slots[0]);
    }

    #[test]
    fn a_slot_of_another_page_is_not_taken_for_this_one() {
        let blocks = 2 * BLOCKS_PER_PAGE;
        let mut m = HeldMap::new(blocks);
        let mut disk = vec![0u8; m.disk_len()];
        m.mark(0, 1, true);
        persist(&mut m, &mut disk);
        // Page 0's slot copied over page 1's: not taken for page 1, which was never written
        // (its other slot is zeroes) and holds nothing.
        let (a, b) = disk.split_at_mut(2 * PAGE);
        b[PAGE..2 * PAGE].copy_from_slice(&a[PAGE..2 * PAGE]);
        let back = HeldMap::decode(&disk, blocks).unwrap();
        assert_eq!(back.held(0, blocks), vec![(0, 1)]);
        // Over both of page 1's slots: corrupt.
        let (a, b) = disk.split_at_mut(2 * PAGE);
        b[..PAGE].copy_from_slice(&a[PAGE..2 * PAGE]);
        assert_eq!(
            HeldMap::decode(&disk, blocks),
            Err(HeldError::Corrupt { page: 1 })
        );
    }
}
