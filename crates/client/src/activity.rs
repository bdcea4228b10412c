//! The writer's side of the activity log (the nodes' side is `trireme-node`'s `activity.rs`).
//!
//! Every replica marks the extent of each write it receives before applying it. This writer
//! remembers, per extent, the tick of its last write there; a background task clears extents on
//! the replicas once they have been quiet for a full tick, or the oldest ones when more than
//! [`VolumeOptions::activity_extents`](crate::VolumeOptions) are marked. A clear is sent while
//! holding the extent's range, so no write is in flight there: every replica that took part
//! agrees on it. After this writer dies, the next one compares only the extents some replica
//! still has marked.

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

/// Per-extent record of this writer's writes.
#[derive(Debug)]
pub(crate) struct Activity {
    shift: u32,
    /// Per extent: the tick of its last write, 0 when clear on every replica as far as this
    /// writer knows. Behind a lock only so that a resize can lengthen it.
    last: RwLock<Vec<AtomicU64>>,
    tick: AtomicU64,
}

impl Activity {
    /// The table for a volume of `size` bytes, at `extent` bytes per extent or the smallest
    /// power of two that keeps the table bounded.
    pub(crate) fn new(size: u64, extent: u64) -> Activity {
        let mut e = extent.next_power_of_two().max(MIN_EXTENT);
        while size.div_ceil(e) > MAX_EXTENTS {
            e *= 2;
        }
        Activity {
            shift: e.trailing_zeros(),
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

    /// A write of `[offset, offset+len)` is about to go out (its range is held).
    pub(crate) fn touch(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
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
        move |r: u64| {
            let first = (r * region) >> shift;
            let last = ((r + 1) * region - 1) >> shift;
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
    /// full tick, then the least recently written ones beyond `cap`. Sorted.
    fn due(&self, cap: usize) -> Vec<u64> {
        let now = self.tick.fetch_add(1, Ordering::Relaxed) + 1;
        let mut quiet = Vec::new();
        let mut busy = Vec::new();
        for (k, a) in self.last().iter().enumerate() {
            match a.load(Ordering::Relaxed) {
                0 => {}
                t if t + 2 <= now => quiet.push(k as u64),
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
            let start = first * extent;
            let end = ((first + n) * extent).min(self.size());
            // No write is in flight in the run while it is held, so the replicas agree on it.
            let _r = self.core.acquire(start, end).await;
            let targets = self.write_targets();
            match self.clear_activity(&targets, start, end).await {
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
    /// Clears `[start, end)` of the volume on `targets`' logs: at its place on the nodes,
    /// a region at a time for a parity volume (`Volume::pieces`).
    async fn clear_activity(
        &self,
        targets: &[usize],
        start: u64,
        end: u64,
    ) -> Result<(), crate::VolumeError> {
        for (off, len) in self.pieces(start, end - start) {
            let h = self.node_range(self.header(Op::ActivityClear, off, len));
            self.to_all(targets, h, Bytes::new()).await?;
        }
        Ok(())
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
        let a = Activity::new(100 << 20, 1 << 20);
        assert_eq!(a.extent(), 1 << 20);
        a.touch(0, 1); // tick 1
        a.touch(5 << 20, 2 << 20); // extents 5 and 6
        assert_eq!(a.due(10), Vec::<u64>::new(), "written this tick");
        a.touch(9 << 20, 1); // tick 2
                             // Tick 3: extents written in tick 1 have been quiet for the whole of tick 2.
        assert_eq!(a.due(10), vec![0, 5, 6]);
        for k in [0, 5, 6] {
            a.last()[k].store(0, Ordering::Relaxed);
        }
        a.touch(20 << 20, 1);
        a.touch(30 << 20, 1);
        assert_eq!(a.marked(), 3);
        // Tick 4: 9 is quiet; 20 and 30 are busy but the cap is 1: 20 and 30 tie, one goes.
        let d = a.due(1);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0], 9);
    }

    #[test]
    fn the_table_stays_bounded_and_runs_split() {
        let a = Activity::new(1 << 50, 4 << 20);
        assert!(a.last().len() as u64 <= MAX_EXTENTS);
        assert_eq!(Activity::new(1 << 20, 4096).extent(), MIN_EXTENT);
        assert_eq!(runs(&[1, 2, 3, 7, 8]), vec![(1, 3), (7, 2)]);
        let long: Vec<u64> = (0..RUN + 1).collect();
        assert_eq!(runs(&long), vec![(0, RUN), (RUN, 1)]);
    }
}
