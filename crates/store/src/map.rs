//! The allocation map: one bit per [`GRAIN`](crate::GRAIN) of a replica.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::Extent;

/// A bitmap of allocated grains: bits change without a lock; the bitmap is behind a
/// read-write lock only so that [`AllocMap::resize`] can replace it (taken shared by every
/// other method, uncontended but for a resize).
#[derive(Debug)]
pub struct AllocMap {
    grain: u64,
    bits: RwLock<Bits>,
}

#[derive(Debug)]
struct Bits {
    grains: u64,
    words: Vec<AtomicU64>,
}

impl Bits {
    fn is_set(&self, g: u64) -> bool {
        g < self.grains
            && self.words[(g / 64) as usize].load(Ordering::Acquire) & (1 << (g % 64)) != 0
    }

    fn new(size: u64, grain: u64) -> Bits {
        let grains = size.div_ceil(grain);
        Bits {
            grains,
            words: (0..grains.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }
}

impl AllocMap {
    pub fn new(size: u64, grain: u64) -> AllocMap {
        AllocMap {
            grain,
            bits: RwLock::new(Bits::new(size, grain)),
        }
    }

    fn bits(&self) -> std::sync::RwLockReadGuard<'_, Bits> {
        self.bits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Rebuilds a map from bytes written by [`AllocMap::to_bytes`]; `None` if the length is wrong.
    pub fn from_bytes(size: u64, grain: u64, b: &[u8]) -> Option<AllocMap> {
        let m = AllocMap::new(size, grain);
        {
            let bits = m.bits();
            if b.len() != bits.words.len() * 8 {
                return None;
            }
            for (w, c) in bits.words.iter().zip(b.chunks_exact(8)) {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                w.store(u64::from_le_bytes(a), Ordering::Relaxed);
            }
        }
        Some(m)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let bits = self.bits();
        let mut out = Vec::with_capacity(bits.words.len() * 8);
        for w in &bits.words {
            out.extend_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        out
    }

    /// The map of a replica of `size` bytes: grains past the old end start free, grains past
    /// the new end are forgotten. Marks made meanwhile below both ends are kept: they are
    /// made under the map's lock, which this holds while it copies.
    pub fn resize(&self, size: u64) {
        let mut bits = self.bits.write().unwrap_or_else(|e| e.into_inner());
        let new = Bits::new(size, self.grain);
        for (i, w) in new.words.iter().enumerate() {
            let mut v = bits.words.get(i).map_or(0, |o| o.load(Ordering::Acquire));
            // Bits past the last grain stay clear (a shrink into this word).
            let first = i as u64 * 64;
            if new.grains < first + 64 {
                let keep = new.grains.saturating_sub(first);
                v &= (1u64 << keep).wrapping_sub(1);
            }
            w.store(v, Ordering::Relaxed);
        }
        *bits = new;
    }

    pub fn grain(&self) -> u64 {
        self.grain
    }

    pub fn is_set(&self, g: u64) -> bool {
        self.bits().is_set(g)
    }

    /// Marks every grain touching `[offset, offset+len)` allocated; true if any bit changed.
    pub fn set_range(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let bits = self.bits();
        let mut changed = false;
        let last = ((offset + len - 1) / self.grain).min(bits.grains.saturating_sub(1));
        for g in offset / self.grain..=last {
            let prev = bits.words[(g / 64) as usize].fetch_or(1 << (g % 64), Ordering::AcqRel);
            changed |= prev & (1 << (g % 64)) == 0;
        }
        changed
    }

    /// True if every grain touching `[offset, offset+len)` is allocated (an empty range is).
    pub fn all_set(&self, offset: u64, len: u64) -> bool {
        let bits = self.bits();
        (offset / self.grain..(offset + len).div_ceil(self.grain)).all(|g| bits.is_set(g))
    }

    /// True if any grain touching `[offset, offset+len)` is allocated.
    pub fn any_set(&self, offset: u64, len: u64) -> bool {
        let bits = self.bits();
        (offset / self.grain..(offset + len).div_ceil(self.grain)).any(|g| bits.is_set(g))
    }

    /// Clears grain `g`; true if it was set.
    pub fn clear(&self, g: u64) -> bool {
        let bits = self.bits();
        if g >= bits.grains {
            return false;
        }
        let prev = bits.words[(g / 64) as usize].fetch_and(!(1 << (g % 64)), Ordering::AcqRel);
        prev & (1 << (g % 64)) != 0
    }

    pub fn allocated_grains(&self) -> u64 {
        self.bits()
            .words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    pub fn extents(&self, offset: u64, len: u64) -> Vec<Extent> {
        let bits = self.bits();
        extents_from(offset, len, self.grain, |g| bits.is_set(g))
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

#[cfg(test)]
mod resize_tests {
    use super::*;

    #[test]
    fn resizing_keeps_the_bits_below_the_smaller_end() {
        let m = AllocMap::new(100 * 4096, 4096);
        m.set_range(0, 4096);
        m.set_range(70 * 4096, 30 * 4096);
        m.resize(1000 * 4096);
        assert!(m.is_set(0) && m.is_set(99) && !m.is_set(100) && !m.is_set(999));
        assert_eq!(m.allocated_grains(), 31);
        m.set_range(999 * 4096, 4096);
        m.resize(80 * 4096);
        assert_eq!(m.allocated_grains(), 11, "grains 0 and 70..80");
        assert!(!m.is_set(80) && !m.clear(999));
        m.resize(200 * 4096);
        assert!(!m.is_set(90), "a grain dropped by a shrink comes back free");
        assert_eq!(m.to_bytes().len(), 4 * 8);
    }
}
