//! The writer's side of the activity log (the nodes' side is `trireme-node`'s `activity.rs`).
//!
//! Every replica marks the extent of each write it receives before applying it. This writer
//! remembers, per extent, the tick of its last write there; a background task clears extents on
//! the replicas once they have been quiet for [`QUIET_TICKS`] full ticks, or the oldest ones
//! when more than [`VolumeOptions::activity_extents`](crate::VolumeOptions) are marked. A clear
//! is sent while
//! holding the extent's range, so no write is in flight there: every replica that took part
//! agrees on it. After this writer dies, the next one compares only the extents some replica
//! still has marked.
//!
//! A parity volume's table is kept where the nodes' logs are: at its blocks' places on the
//! nodes ([`Places`]), in extents of the same size as a mirror's. A clear holds every region
//! whose mirrored part meets the extents it clears, so no write the nodes mark there is in
//! flight; chunk slots in those extents hold no write a reconcile needs (an encode not
//! switched is abandoned). With 64 KiB extents in volume space, as before, a 4 KiB write
//! over a cold range marked a new extent on disk at every write (0.36x a mirror's cold
//! writes, `bench/parity.sh`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use bytes::Bytes;
use trireme_proto::Op;

use crate::Volume;

/// Smallest extent the nodes accept.
pub(crate) const MIN_EXTENT: u64 = 64 << 10;
/// Most extents a writer tracks (its table stays at 8 MiB or less).
const MAX_EXTENTS: u64 = 1 << 20;
/// Extents cleared under one range hold.
const RUN: u64 = 64;
/// Full ticks an extent stays unwritten before it is cleared. A clear costs the next write
/// there a mark on every node's disk (a page and its `fdatasync`) before it is applied. With
/// one tick, an extent written a few times a second (the cold part of a hot-zone load over a
/// parity volume, whose node-space extents hold two thirds of what a mirror's do) was found
/// quiet often enough to be cleared and marked again over and over: a 4+2 volume's hot-zone
/// writes at QD1 had a p99 of 650-810 us against 310 us with four
/// (`bench/results/parity-2026-12-06.txt`).
const QUIET_TICKS: u64 = 4;

/// Where a parity volume's mirrored blocks are on its nodes, in bytes: region `r`'s part
/// at `r * stride`, `region` bytes long (`Stripes::node_block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Places {
    pub(crate) region: u64,
    pub(crate) stride: u64,
}

impl Places {
    /// The place on the nodes of volume byte `offset`.
    fn node(&self, offset: u64) -> u64 {
        offset / self.region * self.stride + offset % self.region
    }

    /// The whole regions of the volume whose places meet `[start, end)` of the nodes'.
    fn volume_over(&self, start: u64, end: u64) -> (u64, u64) {
        (
            start / self.stride * self.region,
            end.div_ceil(self.stride) * self.region,
        )
    }
}

/// Per-extent record of this writer's writes.
#[derive(Debug)]
pub(crate) struct Activity {
    shift: u32,
    /// A parity volume's: the table is at the nodes' places, not the volume's.
    places: Option<Places>,
    /// Per extent: the tick of its last write, 0 when clear on every replica as far as this
    /// writer knows. Behind a lock only so that a resize can lengthen it.
    last: RwLock<Vec<AtomicU64>>,
    tick: AtomicU64,
}

impl Activity {
    /// The table for a volume of `size` bytes, at `extent` bytes per extent or the smallest
    /// power of two that keeps the table bounded; with `places`, over the nodes' copies
    /// (`size` is theirs).
    pub(crate) fn new(size: u64, extent: u64, places: Option<Places>) -> Activity {
        let mut e = extent.next_power_of_two().max(MIN_EXTENT);
        while size.div_ceil(e) > MAX_EXTENTS {
            e *= 2;
        }
        Activity {
            shift: e.trailing_zeros(),
            places,
            last: RwLock::new((0..size.div_ceil(e)).map(|_| AtomicU64::new(0)).collect()),
            tick: AtomicU64::new(1),
        }
    }

    pub(crate) fn extent(&self) -> u64 {
        1 << self.shift
    }

    fn last(&self) -> std::sync::RwLockReadGuard<'_, Vec<AtomicU64>> {
        self.last.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The table for the volume grown to `size` (at most [`MAX_EXTENTS`]: writes past it are
    /// marked on the replicas and never cleared, so a reconcile compares them: slower, never
    /// wrong).
    pub(crate) fn grow(&self, size: u64) {
        let n = size.div_ceil(self.extent()).min(MAX_EXTENTS) as usize;
        let mut last = self.last.write().unwrap_or_else(|e| e.into_inner());
        if n > last.len() {
            last.resize_with(n, || AtomicU64::new(0));
        }
    }

    /// A write of `[offset, offset+len)` of the volume is about to go out (its range is
    /// held; for parity, within one region).
    pub(crate) fn touch(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let offset = self.places.map_or(offset, |p| p.node(offset));
        let t = self.tick.load(Ordering::Relaxed);
        let last = self.last();
        for k in offset >> self.shift..=(offset + len - 1) >> self.shift {
            if let Some(a) = last.get(k as usize) {
                a.store(t, Ordering::Relaxed);
            }
        }
    }

    /// Heat by region of `region` bytes, as of now: the last tick any of its extents was
    /// written in (0: none since the cleaner last cleared them). The encoder's measure of
    /// which regions are cold.
    pub(crate) fn heat_by(&self, region: u64) -> impl Fn(u64) -> u64 {
        let ticks: Vec<u64> = self
            .last()
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        let shift = self.shift;
        let places = self.places;
        move |r: u64| {
            let at = places.map_or(r * region, |p| p.node(r * region));
            let first = at >> shift;
            let last = (at + region - 1) >> shift;
            (first..=last)
                .filter_map(|k| ticks.get(k as usize))
                .copied()
                .max()
                .unwrap_or(0)
        }
    }

    /// Extents that may be marked on the replicas now.
    #[cfg(test)]
    fn marked(&self) -> usize {
        self.last()
            .iter()
            .filter(|a| a.load(Ordering::Relaxed) != 0)
            .count()
    }

    /// Starts a new tick and picks the extents to clear: those not written during the last
    /// [`QUIET_TICKS`] full ticks, then the least recently written ones beyond `cap`. Sorted.
    fn due(&self, cap: usize) -> Vec<u64> {
        let now = self.tick.fetch_add(1, Ordering::Relaxed) + 1;
        let mut quiet = Vec::new();
        let mut busy = Vec::new();
        for (k, a) in self.last().iter().enumerate() {
            match a.load(Ordering::Relaxed) {
                0 => {}
                t if t + QUIET_TICKS < now => quiet.push(k as u64),
                t => busy.push((t, k as u64)),
            }
        }
        if busy.len() > cap {
            busy.sort_unstable();
            quiet.extend(busy[..busy.len() - cap].iter().map(|&(_, k)| k));
            quiet.sort_unstable();
        }
        quiet
    }
}

/// Contiguous runs of sorted extent numbers, at most [`RUN`] long: `(first, count)`.
fn runs(ks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &k in ks {
        match out.last_mut() {
            Some((f, n)) if *f + *n == k && *n < RUN => *n += 1,
            _ => out.push((k, 1)),
        }
    }
    out
}

impl Volume {
    /// Starts an empty activity log on `targets` for this writer's epoch (they hold nothing of
    /// this writer in flight yet). Fails if any fails.
    pub(crate) async fn start_activity(&self, targets: &[usize]) -> Result<(), crate::VolumeError> {
        let h = self.header(Op::ActivityStart, 0, self.activity.extent());
        self.to_all(targets, h, Bytes::new()).await
    }

    /// One tick of the cleaner: clears quiet extents (and the oldest beyond the cap) on every
    /// replica taking writes.
    pub(crate) async fn clean_activity(&self) {
        let due = self.activity.due(self.opts.activity_extents);
        let extent = self.activity.extent();
        for (first, n) in runs(&due) {
            let (start, end) = (first * extent, (first + n) * extent);
            // No write is in flight in the run while it is held, so the replicas agree on it.
            // Past the end of a volume that shrank since, there is nothing left to clear.
            let within = |a: u64, b: u64, size: u64| (a.min(size), b.min(size));
            let (hold, clear) = match self.activity.places {
                Some(p) => {
                    let (a, b) = p.volume_over(start, end);
                    let size = self.replica_size(self.size());
                    (within(a, b, self.size()), within(start, end, size))
                }
                None => {
                    let r = within(start, end, self.size());
                    (r, r)
                }
            };
            let _r = self.core.acquire(hold.0, hold.1).await;
            let targets = self.write_targets();
            let cleared = match clear.0 < clear.1 {
                true => self.clear_activity(&targets, clear.0, clear.1).await,
                false => Ok(()),
            };
            match cleared {
                Ok(()) => {
                    let last = self.activity.last();
                    for k in first..first + n {
                        if let Some(a) = last.get(k as usize) {
                            a.store(0, Ordering::Relaxed);
                        }
                    }
                }
                // Left marked: the next tick tries again, and a failing replica is taken
                // out by the writes themselves.
                Err(e) => {
                    tracing::debug!(volume = %self.info.name, "activity-log clear failed: {e}");
                    return;
                }
            }
        }
    }
}

impl Volume {
    /// Clears `[start, end)` of `targets`' logs (the table's places: the nodes' for parity).
    async fn clear_activity(
        &self,
        targets: &[usize],
        start: u64,
        end: u64,
    ) -> Result<(), crate::VolumeError> {
        let h = self.header(Op::ActivityClear, start, end - start);
        self.to_all(targets, h, Bytes::new()).await
    }
}

/// Runs the cleaner until the volume is dropped.
pub(crate) fn spawn_cleaner(v: &Arc<Volume>) {
    let weak: Weak<Volume> = Arc::downgrade(v);
    let period = v.opts.activity_period;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let Some(v) = weak.upgrade() else { return };
            v.clean_activity().await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_extents_and_the_oldest_beyond_the_cap_are_due() {
        let a = Activity::new(100 << 20, 1 << 20, None);
        assert_eq!(a.extent(), 1 << 20);
        a.touch(0, 1); // tick 1
        a.touch(5 << 20, 2 << 20); // extents 5 and 6
        assert_eq!(a.due(10), Vec::<u64>::new(), "written this tick");
        a.touch(9 << 20, 1); // tick 2
        for _ in 0..QUIET_TICKS - 1 {
            assert_eq!(a.due(10), Vec::<u64>::new(), "not quiet for long enough");
        }
        // Extents written in tick 1 have been quiet for QUIET_TICKS whole ticks.
        assert_eq!(a.due(10), vec![0, 5, 6]);
        for k in [0, 5, 6] {
            a.last()[k].store(0, Ordering::Relaxed);
        }
        a.touch(20 << 20, 1);
        a.touch(30 << 20, 1);
        assert_eq!(a.marked(), 3);
        // Next tick: 9 is quiet; 20 and 30 are busy but the cap is 1: 20 and 30 tie, one goes.
        let d = a.due(1);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0], 9);
    }

    #[test]
    fn a_parity_table_is_at_the_nodes_places_and_a_clear_holds_whole_regions() {
        // 2+1 with 512 KiB of data a region and 1 MiB a stride (two 256 KiB chunk slots).
        let p = Places {
            region: 512 << 10,
            stride: 1 << 20,
        };
        let a = Activity::new(4 << 20, 1 << 20, Some(p));
        assert_eq!(a.extent(), 1 << 20);
        // Region 2's first block is at 2 MiB on the nodes: extent 2, not the volume's 1.
        a.touch(1 << 20, 4096);
        let last: Vec<u64> = a.last().iter().map(|t| t.load(Ordering::Relaxed)).collect();
        assert_eq!(last, vec![0, 0, 1, 0]);
        let heat = a.heat_by(512 << 10);
        assert_eq!((heat(1), heat(2)), (0, 1));
        // Node extent 1 holds region 1's mirrored part and its slots: that region only.
        assert_eq!(p.volume_over(1 << 20, 2 << 20), (512 << 10, 1 << 20));
        // A range over a stride's end holds both regions it meets.
        assert_eq!(
            p.volume_over(1536 << 10, 2560 << 10),
            (512 << 10, 1536 << 10)
        );
        assert_eq!(p.node((512 << 10) + 8192), (1 << 20) + 8192);
    }

    #[test]
    fn the_table_stays_bounded_and_runs_split() {
        let a = Activity::new(1 << 50, 4 << 20, None);
        assert!(a.last().len() as u64 <= MAX_EXTENTS);
        assert_eq!(Activity::new(1 << 20, 4096, None).extent(), MIN_EXTENT);
        assert_eq!(runs(&[1, 2, 3, 7, 8]), vec![(1, 3), (7, 2)]);
        let long: Vec<u64> = (0..RUN + 1).collect();
        assert_eq!(runs(&long), vec![(0, RUN), (RUN, 1)]);
    }
}
