//! The allocation map: one bit per [`GRAIN`](crate::GRAIN) of a replica.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Extent;

/// A lock-free bitmap of allocated grains.
#[derive(Debug)]
pub struct AllocMap {
    grain: u64,
    grains: u64,
    words: Vec<AtomicU64>,
}

impl AllocMap {
    pub fn new(size: u64, grain: u64) -> AllocMap {
        let grains = size.div_ceil(grain);
        let words = (0..grains.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        AllocMap {
            grain,
            grains,
            words,
        }
    }

    /// Rebuilds a map from bytes written by [`AllocMap::to_bytes`]; `None` if the length is wrong.
    pub fn from_bytes(size: u64, grain: u64, b: &[u8]) -> Option<AllocMap> {
        let m = AllocMap::new(size, grain);
        if b.len() != m.words.len() * 8 {
            return None;
        }
        for (w, c) in m.words.iter().zip(b.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            w.store(u64::from_le_bytes(a), Ordering::Relaxed);
        }
        Some(m)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.words.len() * 8);
        for w in &self.words {
            out.extend_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        out
    }

    pub fn grain(&self) -> u64 {
        self.grain
    }

    pub fn is_set(&self, g: u64) -> bool {
        g < self.grains
            && self.words[(g / 64) as usize].load(Ordering::Acquire) & (1 << (g % 64)) != 0
    }

    /// Marks every grain touching `[offset, offset+len)` allocated; true if any bit changed.
    pub fn set_range(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let mut changed = false;
        for g in offset / self.grain..=(offset + len - 1) / self.grain {
            let prev = self.words[(g / 64) as usize].fetch_or(1 << (g % 64), Ordering::AcqRel);
            changed |= prev & (1 << (g % 64)) == 0;
        }
        changed
    }

    /// Clears grain `g`; true if it was set.
    pub fn clear(&self, g: u64) -> bool {
        let prev = self.words[(g / 64) as usize].fetch_and(!(1 << (g % 64)), Ordering::AcqRel);
        prev & (1 << (g % 64)) != 0
    }

    pub fn allocated_grains(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    pub fn extents(&self, offset: u64, len: u64) -> Vec<Extent> {
        extents_from(offset, len, self.grain, |g| self.is_set(g))
    }
}

/// Builds the extent list of `[offset, offset+len)` from a per-grain allocation predicate,
/// merging neighbours with the same state.
pub fn extents_from(
    offset: u64,
    len: u64,
    grain: u64,
    allocated: impl Fn(u64) -> bool,
) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let end = offset + len;
    let mut pos = offset;
    while pos < end {
        let g = pos / grain;
        let next = ((g + 1) * grain).min(end);
        let flags = if allocated(g) {
            0
        } else {
            Extent::HOLE | Extent::ZERO
        };
        match out.last_mut() {
            Some(last) if last.flags == flags => last.length += next - pos,
            _ => out.push(Extent {
                length: next - pos,
                flags,
            }),
        }
        pos = next;
    }
    out
}

/// The whole grains inside `[offset, offset+len)`, as a grain index range.
pub fn whole_grains(offset: u64, len: u64, grain: u64) -> std::ops::Range<u64> {
    let first = offset.div_ceil(grain);
    let last = (offset + len) / grain;
    if first >= last {
        0..0
    } else {
        first..last
    }
}
