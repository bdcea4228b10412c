//! The activity log: which extents of a volume may have writes in flight.
//!
//! When a writer dies, writes it had in flight may have reached some replicas and not others.
//! The next writer must make the replicas agree before it serves I/O, and without a record it
//! would have to compare the whole volume. So each replica keeps a log, as DRBD does: every write
//! it receives marks its extent (a coarse region, 4 MiB by default) *before* it is applied, and
//! the writer clears extents in which it has had no write in flight for a while (holding the
//! range, so no write races the clear). After an unclean writer change, the new writer compares
//! only the union of the replicas' marked extents.
//!
//! A write marks the log with one atomic OR, so the log costs the write path a map lookup and
//! no lock. The log lives in the process's memory: a node that restarts answers "no log", and
//! the next writer then compares everything — slower, never wrong.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use trireme_proto::Extent;

/// Smallest extent a writer may ask for.
pub const MIN_EXTENT: u64 = 64 << 10;
/// Largest extent a writer may ask for.
pub const MAX_EXTENT: u64 = 1 << 30;
/// Most extents one volume's log may have (a 2 MiB bitmap).
pub const MAX_EXTENTS: u64 = 1 << 24;

#[derive(Debug)]
struct Log {
    /// Epoch of the writer that started it.
    epoch: u64,
    shift: u32,
    /// The volume's size (its last extent may be short).
    size: u64,
    bits: Vec<AtomicU64>,
}

impl Log {
    fn extents(&self) -> u64 {
        self.size.div_ceil(1 << self.shift)
    }

    fn is_set(&self, k: u64) -> bool {
        self.bits
            .get((k / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (k % 64)) != 0)
    }
}

/// What a query returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityView {
    /// 0 when the volume has no log on this node.
    pub epoch: u64,
    pub extent: u64,
    /// Marked extents as data, the rest as holes, covering the queried range.
    pub extents: Vec<Extent>,
}

/// The activity logs of every volume on this node.
#[derive(Debug, Default)]
pub struct ActivityLogs {
    logs: RwLock<HashMap<u64, Arc<Log>>>,
}

impl ActivityLogs {
    fn get(&self, volume: u64) -> Option<Arc<Log>> {
        self.logs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
    }

    /// Starts an empty log for the writer of `epoch`, replacing any older one.
    pub fn start(&self, volume: u64, epoch: u64, extent: u64, size: u64) -> Result<(), String> {
        if !extent.is_power_of_two() || !(MIN_EXTENT..=MAX_EXTENT).contains(&extent) {
            return Err(format!(
                "activity-log extent {extent} is not a power of two from {MIN_EXTENT} to {MAX_EXTENT}"
            ));
        }
        let n = size.div_ceil(extent);
        if n > MAX_EXTENTS {
            return Err(format!(
                "activity log of {n} extents is too large (at most {MAX_EXTENTS}); use larger extents"
            ));
        }
        let log = Log {
            epoch,
            shift: extent.trailing_zeros(),
            size,
            bits: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        };
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, Arc::new(log));
        Ok(())
    }

    /// A write of `[offset, offset+len)` arrived: marks its extents. Called before the write is
    /// applied, so a replica never holds a write its log does not show.
    pub fn on_write(&self, volume: u64, offset: u64, len: u64) {
        let Some(log) = self.get(volume) else { return };
        if len == 0 {
            return;
        }
        let first = offset >> log.shift;
        let last = ((offset + len - 1) >> log.shift).min(log.extents().saturating_sub(1));
        for k in first..=last {
            if let Some(w) = log.bits.get((k / 64) as usize) {
                w.fetch_or(1 << (k % 64), Ordering::AcqRel);
            }
        }
    }

    /// Clears the extents lying wholly inside `[offset, offset+len)`.
    pub fn clear(&self, volume: u64, offset: u64, len: u64) {
        let Some(log) = self.get(volume) else { return };
        let extent = 1u64 << log.shift;
        let first = offset.div_ceil(extent);
        // The last extent may be short: it is wholly inside when the range reaches the end.
        let stop = offset + len;
        let end = if stop >= log.size {
            log.extents()
        } else {
            stop >> log.shift
        };
        for k in first..end {
            if let Some(w) = log.bits.get((k / 64) as usize) {
                w.fetch_and(!(1 << (k % 64)), Ordering::AcqRel);
            }
        }
    }

    pub fn query(&self, volume: u64, offset: u64, len: u64) -> ActivityView {
        match self.get(volume) {
            None => ActivityView {
                epoch: 0,
                extent: 0,
                extents: trireme_store::extents_from(offset, len, MIN_EXTENT, |_| false),
            },
            Some(log) => {
                let extent = 1u64 << log.shift;
                ActivityView {
                    epoch: log.epoch,
                    extent,
                    extents: trireme_store::extents_from(offset, len, extent, |k| log.is_set(k)),
                }
            }
        }
    }

    /// Forgets a deleted volume's log.
    pub fn forget(&self, volume: u64) {
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&volume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = MIN_EXTENT;

    fn marked(l: &ActivityLogs, len: u64) -> Vec<(u64, u64)> {
        trireme_proto::data_ranges(&l.query(1, 0, len).extents, 0)
    }

    #[test]
    fn writes_mark_their_extents_and_clears_take_whole_ones() {
        let l = ActivityLogs::default();
        l.on_write(1, 0, 4096);
        assert_eq!(l.query(1, 0, E).epoch, 0, "no log yet");
        l.start(1, 7, E, 100 * E).unwrap();
        l.on_write(1, 3 * E - 1, 2); // straddles extents 2 and 3
        l.on_write(1, 70 * E, 1); // in the second bitmap word
        l.on_write(2, 0, E); // another volume
        assert_eq!(marked(&l, 100 * E), vec![(2 * E, 2 * E), (70 * E, E)]);
        let v = l.query(1, 0, E);
        assert_eq!((v.epoch, v.extent), (7, E));
        l.clear(1, E / 2, 3 * E); // wholly covers extents 1 and 2 only
        assert_eq!(marked(&l, 100 * E), vec![(3 * E, E), (70 * E, E)]);
        l.start(1, 8, E, 100 * E).unwrap();
        assert_eq!(marked(&l, 100 * E), vec![], "a new writer starts empty");
        l.forget(1);
        assert_eq!(l.query(1, 0, E).epoch, 0);
    }

    #[test]
    fn the_short_last_extent_is_marked_and_cleared() {
        let l = ActivityLogs::default();
        let size = 10 * E + 4096;
        l.start(1, 1, E, size).unwrap();
        l.on_write(1, size - 4096, 4096);
        assert_eq!(marked(&l, 11 * E), vec![(10 * E, E)]);
        l.clear(1, 10 * E + 1, 4095);
        assert_eq!(marked(&l, 11 * E), vec![(10 * E, E)], "not wholly inside");
        l.clear(1, 10 * E, 4096);
        assert_eq!(marked(&l, 11 * E), vec![]);
    }

    #[test]
    fn bad_extent_sizes_are_refused() {
        let l = ActivityLogs::default();
        assert!(l.start(1, 1, 3 * E, E).is_err());
        assert!(l.start(1, 1, E / 2, E).is_err());
        assert!(l.start(1, 1, E, E * (MAX_EXTENTS + 1)).is_err());
        assert_eq!(l.query(1, 0, E).epoch, 0, "nothing started");
    }
}
