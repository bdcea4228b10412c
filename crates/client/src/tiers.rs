//! What the writer learns of replicas on tiered nodes, from the flags on their read replies:
//! which copies hold an extent on their slow tier, so a read goes to a copy that holds it on
//! flash when there is one; and the heat of the reads each copy did not serve, sent to it in
//! batches (`Op::TierHeat`), so every copy keeps the same hot set and a failover finds the
//! next copy warm. Volumes on untiered nodes never set the flags, and pay one atomic load per
//! read.
//!
//! No clock: a copy avoided for an extent is asked again every `PROBE_EVERY`-th time (its
//! extent may have been promoted since), and heat goes out every `HEAT_BATCH` reads.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use trireme_proto::{FLAG_HEATED, FLAG_SLOW, FLAG_TIERED};

/// The extent the writer keys what it learns by (the tiered store's default extent).
pub(crate) const EXTENT_SHIFT: u32 = 20;
/// Every this many reads steered away from a copy for one of its extents, one goes to it.
const PROBE_EVERY: u32 = 16;
/// Heat goes to a copy once this many reads it did not serve have piled up...
const HEAT_BATCH: u32 = 64;
/// ...or this many distinct extents.
const HEAT_ENTRIES: usize = 512;

#[derive(Debug, Default)]
struct NodeView {
    slow: HashSet<u64>,
    avoided: u32,
    heat: HashMap<u64, u32>,
    pending: u32,
}

/// Heat owed to one node: (byte offset of the extent, reads).
pub(crate) type HeatBatch = (u32, Vec<(u64, u32)>);

/// Recent read ends the writer remembers to spot scans.
const STREAMS: usize = 8;
/// Reads this large stream by themselves (the tiered store's rule too).
const STREAM_LEN: u64 = 128 * 1024;

#[derive(Debug, Default)]
pub(crate) struct TierView {
    any: AtomicBool,
    nodes: Mutex<HashMap<u32, NodeView>>,
    /// Where recent reads ended, and the next slot to overwrite.
    ends: Mutex<([u64; STREAMS], usize)>,
}

impl TierView {
    /// Whether any replica answered as a tiered one.
    pub(crate) fn active(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<u32, NodeView>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a read continues a recent one (a scan): the writer sees every piece of it, where
    /// a copy sees only those it serves. Such reads are flagged so that no copy heats them.
    pub(crate) fn streams(&self, offset: u64, len: u64) -> bool {
        let mut g = self.ends.lock().unwrap_or_else(|e| e.into_inner());
        let (ends, next) = &mut *g;
        let end = offset.saturating_add(len);
        if let Some(e) = ends.iter_mut().find(|e| **e == offset && offset != 0) {
            *e = end;
            return true;
        }
        ends[*next] = end;
        *next = (*next + 1) % STREAMS;
        len >= STREAM_LEN
    }

    /// Whether a read of `extent` should go to another copy than `node` if one can serve it.
    pub(crate) fn avoid(&self, node: u32, extent: u64) -> bool {
        let mut nodes = self.nodes();
        let Some(v) = nodes.get_mut(&node) else {
            return false;
        };
        if !v.slow.contains(&extent) {
            return false;
        }
        v.avoided = v.avoided.wrapping_add(1);
        v.avoided % PROBE_EVERY != 0
    }

    /// Learns from `served`'s reply to a read of `extent` (its `flags`); the copies in
    /// `others` did not serve it. Returns the heat batches now due.
    pub(crate) fn learned(
        &self,
        served: u32,
        extent: u64,
        flags: u16,
        others: &[u32],
    ) -> Vec<HeatBatch> {
        if flags & FLAG_TIERED == 0 {
            return Vec::new();
        }
        self.any.store(true, Ordering::Relaxed);
        let mut nodes = self.nodes();
        let v = nodes.entry(served).or_default();
        if flags & FLAG_SLOW != 0 {
            v.slow.insert(extent);
        } else {
            v.slow.remove(&extent);
        }
        let mut due = Vec::new();
        if flags & FLAG_HEATED == 0 {
            return due;
        }
        for &o in others.iter().filter(|&&o| o != served) {
            let v = nodes.entry(o).or_default();
            *v.heat.entry(extent << EXTENT_SHIFT).or_default() += 1;
            v.pending += 1;
            if v.pending >= HEAT_BATCH || v.heat.len() >= HEAT_ENTRIES {
                v.pending = 0;
                let mut batch: Vec<(u64, u32)> = v.heat.drain().collect();
                batch.sort_unstable();
                due.push((o, batch));
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_are_seen_across_the_copies() {
        let t = TierView::default();
        assert!(!t.streams(1 << 20, 65536), "a first piece is a random read");
        assert!((1..100u64).all(|k| t.streams((1 << 20) + k * 65536, 65536)));
        assert!(!t.streams(77 << 20, 4096));
        assert!(
            t.streams(90 << 20, 1 << 20),
            "large reads stream by themselves"
        );
    }

    #[test]
    fn untiered_replies_leave_it_inactive() {
        let t = TierView::default();
        assert!(t.learned(1, 0, 0, &[2, 3]).is_empty());
        assert!(!t.active());
        assert!(!t.avoid(1, 0));
    }

    #[test]
    fn a_slow_copy_is_avoided_but_probed_and_learned_again() {
        let t = TierView::default();
        t.learned(1, 5, FLAG_TIERED | FLAG_SLOW, &[2]);
        assert!(t.active());
        let avoided = (0..32).filter(|_| t.avoid(1, 5)).count();
        assert_eq!(avoided, 30, "probed every 16th time");
        assert!(!t.avoid(1, 6), "only the extent it served from slow");
        t.learned(1, 5, FLAG_TIERED, &[2]);
        assert!(!t.avoid(1, 5), "promoted since");
    }

    #[test]
    fn heat_goes_in_batches_to_the_copies_that_did_not_serve() {
        let t = TierView::default();
        let mut due = Vec::new();
        for k in 0..HEAT_BATCH as u64 {
            due.extend(t.learned(1, k % 3, FLAG_TIERED | FLAG_HEATED, &[1, 2, 3]));
        }
        let mut nodes: Vec<u32> = due.iter().map(|d| d.0).collect();
        nodes.sort_unstable();
        assert_eq!(nodes, vec![2, 3]);
        for (_, batch) in &due {
            assert_eq!(batch.iter().map(|b| b.1).sum::<u32>(), HEAT_BATCH);
            assert_eq!(batch[1].0, 1 << EXTENT_SHIFT, "offsets, not extent numbers");
        }
        // Reads that did not heat (a scan) share nothing.
        for k in 0..1000u64 {
            assert!(t.learned(1, k, FLAG_TIERED, &[2, 3]).is_empty());
        }
    }
}
