//! Dirty-region tracking for peer replicas that are out of the in-sync set.
//!
//! When the writer takes a replica out (its node stopped answering), it tells the surviving
//! replicas to remember which regions that peer missed. Each survivor keeps one set of dirty
//! regions per (volume, peer), at `grain` granularity. In auto mode every write the survivor
//! receives is marked (also while the peer resyncs); in manual mode only explicit marks add
//! regions. Copied regions are cleared, and when the peer is back in sync the writer drops the
//! set.
//!
//! On a store with a [`Ledger`] (the file store) the records are saved lazily — by the node's
//! bookkeeping task, and before the activity log drops an extent on disk — and loaded when
//! the node starts, together with the activity log's extents: a write whose mark was not saved
//! yet lies in an extent that log still shows (`activity.rs`), so the union is complete and a
//! restarted survivor still serves an incremental resync. Without a ledger (a volatile store)
//! the records live in memory: a survivor that restarts answers "not tracked", and the next
//! resync compares whole replicas — slower, never wrong.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use trireme_proto::{DirtyPeer, Extent, DIRTY_AUTO, DIRTY_DROP, DIRTY_START};
use trireme_store::{Ledger, StoreError};

use crate::books::{self, StoredRecord};

/// Default tracking granularity.
pub const DEFAULT_GRAIN: u64 = 4096;

#[derive(Debug)]
struct PeerDirty {
    /// Epoch of the writer that started tracking.
    epoch: u64,
    incarnation: u64,
    mode: u8,
    regions: BTreeSet<u64>,
    /// Started when the peer went out, so it holds everything the peer missed through this
    /// replica. A record started later (this process restarted meanwhile) is kept up to date
    /// but reported as not tracked.
    complete: bool,
}

/// What a query returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyView {
    /// 0 when the peer is not tracked.
    pub epoch: u64,
    pub incarnation: u64,
    /// Dirty ranges as data extents, clean ones as holes, covering the queried range.
    pub extents: Vec<Extent>,
}

/// The records, and which volumes' records changed since they were last saved (one lock: the
/// write path marks both at once).
#[derive(Debug, Default)]
struct Books {
    peers: HashMap<(u64, u32), PeerDirty>,
    changed: HashSet<u64>,
}

/// Every tracked peer of every volume on this node.
#[derive(Debug)]
pub struct DirtyTracker {
    grain: u64,
    books: Mutex<Books>,
    /// Peers in auto mode, so the write path skips the lock when nothing is tracked.
    auto: AtomicUsize,
}

impl DirtyTracker {
    pub fn new(grain: u64) -> DirtyTracker {
        assert!(
            grain.is_power_of_two() && grain >= 4096,
            "checked by the caller"
        );
        DirtyTracker {
            grain,
            books: Mutex::default(),
            auto: AtomicUsize::new(0),
        }
    }

    pub fn grain(&self) -> u64 {
        self.grain
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn regions(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        offset / self.grain..=(offset + len.max(1) - 1) / self.grain
    }

    fn recount(&self, m: &HashMap<(u64, u32), PeerDirty>) {
        let n = m.values().filter(|p| p.mode == DIRTY_AUTO).count();
        self.auto.store(n, Ordering::Release);
    }

    /// A write of `[offset, offset+len)` arrived: mark it for every auto-mode peer of `volume`.
    /// Called before the write is applied, so a peer never misses a region this replica holds.
    pub fn on_write(&self, volume: u64, offset: u64, len: u64) {
        if self.auto.load(Ordering::Acquire) == 0 || len == 0 {
            return;
        }
        let mut m = self.lock();
        let mut any = false;
        for ((v, _), p) in m.peers.iter_mut() {
            if *v == volume && p.mode == DIRTY_AUTO {
                p.regions.extend(self.regions(offset, len));
                any = true;
            }
        }
        if any {
            m.changed.insert(volume);
        }
    }

    /// Marks a range for `peer` and puts it in auto mode: a mark means the peer is out (again),
    /// so every later write counts too. Starts tracking it if it was not tracked — a complete
    /// record only with `DIRTY_START` (the peer has just gone out).
    pub fn mark(&self, volume: u64, epoch: u64, peer: &DirtyPeer, offset: u64, len: u64) {
        let mut m = self.lock();
        let p = m
            .peers
            .entry((volume, peer.peer))
            .or_insert_with(|| PeerDirty {
                epoch,
                incarnation: peer.incarnation,
                mode: DIRTY_AUTO,
                regions: BTreeSet::new(),
                complete: peer.mode == DIRTY_START,
            });
        p.mode = DIRTY_AUTO;
        if len > 0 {
            p.regions.extend(self.regions(offset, len));
        }
        self.recount(&m.peers);
        m.changed.insert(volume);
    }

    /// Sets a peer's mode; `DIRTY_DROP` forgets it.
    pub fn track(&self, volume: u64, epoch: u64, peer: &DirtyPeer) {
        let mut m = self.lock();
        if peer.mode == DIRTY_DROP {
            m.peers.remove(&(volume, peer.peer));
        } else {
            m.peers
                .entry((volume, peer.peer))
                .or_insert_with(|| PeerDirty {
                    epoch,
                    incarnation: peer.incarnation,
                    mode: peer.mode,
                    regions: BTreeSet::new(),
                    complete: false,
                })
                .mode = if peer.mode == DIRTY_START {
                DIRTY_AUTO
            } else {
                peer.mode
            };
        }
        self.recount(&m.peers);
        m.changed.insert(volume);
    }

    /// Clears the regions of `peer` lying wholly inside `[offset, offset+len)`.
    pub fn clear(&self, volume: u64, peer: u32, offset: u64, len: u64) {
        let mut m = self.lock();
        if let Some(p) = m.peers.get_mut(&(volume, peer)) {
            let first = offset.div_ceil(self.grain);
            let end = (offset + len) / self.grain;
            if first < end {
                // Only the cleared keys are touched: O(k log n), not a rebuild of the set.
                let doomed: Vec<u64> = p.regions.range(first..end).copied().collect();
                for k in doomed {
                    p.regions.remove(&k);
                }
            }
        }
        m.changed.insert(volume);
    }

    pub fn query(&self, volume: u64, peer: u32, offset: u64, len: u64) -> DirtyView {
        let m = self.lock();
        match m.peers.get(&(volume, peer)).filter(|p| p.complete) {
            None => DirtyView {
                epoch: 0,
                incarnation: 0,
                extents: trireme_store::extents_from(offset, len, self.grain, |_| false),
            },
            Some(p) => DirtyView {
                epoch: p.epoch,
                incarnation: p.incarnation,
                extents: trireme_store::extents_from(offset, len, self.grain, |g| {
                    p.regions.contains(&g)
                }),
            },
        }
    }

    /// Number of dirty regions tracked for `peer` (for logs and tests).
    pub fn count(&self, volume: u64, peer: u32) -> usize {
        self.lock()
            .peers
            .get(&(volume, peer))
            .map_or(0, |p| p.regions.len())
    }

    /// Forgets every peer of a deleted volume.
    pub fn forget_volume(&self, volume: u64) {
        let mut m = self.lock();
        m.peers.retain(|(v, _), _| *v != volume);
        self.recount(&m.peers);
        m.changed.remove(&volume);
    }

    /// Whether `volume`'s records changed since they were last saved.
    pub fn is_changed(&self, volume: u64) -> bool {
        self.lock().changed.contains(&volume)
    }

    /// Saves `volume`'s records through `ledger` (atomically replaced). A change made while
    /// saving is saved next time.
    pub fn save(&self, volume: u64, size: u64, ledger: &dyn Ledger) -> Result<(), StoreError> {
        let records: Vec<StoredRecord> = {
            let mut m = self.lock();
            m.changed.remove(&volume);
            let mut r: Vec<StoredRecord> = m
                .peers
                .iter()
                .filter(|((v, _), _)| *v == volume)
                .map(|((_, peer), p)| StoredRecord {
                    peer: *peer,
                    mode: p.mode,
                    complete: p.complete,
                    epoch: p.epoch,
                    incarnation: p.incarnation,
                    ranges: runs(&p.regions, self.grain, size),
                })
                .collect();
            r.sort_by_key(|x| x.peer);
            r
        };
        let saved = ledger.save_records(&books::encode_records(volume, &records));
        if saved.is_err() {
            self.lock().changed.insert(volume);
        }
        saved
    }

    /// Loads `volume`'s saved records (at the node's start). `written` is where writes may have
    /// landed since they were saved — the activity log's extents on disk — and is added to
    /// every record; `None` (no usable log) keeps the records but no longer trusts them.
    pub fn load(
        &self,
        volume: u64,
        size: u64,
        ledger: &dyn Ledger,
        written: Option<&[(u64, u64)]>,
    ) -> Result<usize, String> {
        let Some(bytes) = ledger.read_records().map_err(|e| e.to_string())? else {
            return Ok(0);
        };
        let records = books::decode_records(&bytes, volume, size).map_err(|e| e.to_string())?;
        let n = records.len();
        let mut m = self.lock();
        for r in records {
            let mut regions = BTreeSet::new();
            for &(o, l) in r.ranges.iter().chain(written.unwrap_or(&[])) {
                regions.extend(self.regions(o, l));
            }
            m.peers.insert(
                (volume, r.peer),
                PeerDirty {
                    epoch: r.epoch,
                    incarnation: r.incarnation,
                    mode: r.mode,
                    regions,
                    complete: r.complete && written.is_some(),
                },
            );
        }
        self.recount(&m.peers);
        Ok(n)
    }
}

/// A set of regions as byte ranges inside `size`, adjacent regions merged.
fn runs(regions: &BTreeSet<u64>, grain: u64, size: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &g in regions {
        let (o, stop) = (g * grain, ((g + 1) * grain).min(size));
        if o >= stop {
            continue;
        }
        match out.last_mut() {
            Some((lo, ll)) if *lo + *ll == o => *ll = stop - *lo,
            _ => out.push((o, stop - o)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_proto::DIRTY_MANUAL;

    /// A replica that joins the tracking late (its process restarted while the peer was out)
    /// keeps a record but never claims it is complete.
    #[test]
    fn a_record_started_late_is_not_trusted() {
        let t = DirtyTracker::new(G);
        t.mark(1, 5, &peer(DIRTY_AUTO), 0, G);
        assert_eq!(t.query(1, 2, 0, G).epoch, 0);
        assert_eq!(t.count(1, 2), 1);
        t.track(1, 5, &peer(DIRTY_MANUAL));
        assert_eq!(t.query(1, 2, 0, G).epoch, 0);
        let u = DirtyTracker::new(G);
        u.track(1, 5, &peer(DIRTY_MANUAL));
        assert_eq!(
            u.query(1, 2, 0, G).epoch,
            0,
            "a mode change starts nothing trusted"
        );
    }

    const G: u64 = 64 * 1024;

    fn peer(mode: u8) -> DirtyPeer {
        DirtyPeer {
            peer: 2,
            incarnation: 77,
            mode,
        }
    }

    fn dirty(t: &DirtyTracker, len: u64) -> Vec<(u64, u64)> {
        trireme_proto::data_ranges(&t.query(1, 2, 0, len).extents, 0)
    }

    #[test]
    fn auto_mode_marks_writes_manual_mode_does_not() {
        let t = DirtyTracker::new(G);
        t.on_write(1, 0, 4096);
        assert_eq!(t.count(1, 2), 0, "nothing tracked yet");
        t.mark(1, 5, &peer(DIRTY_START), 10 * G + 1, 10);
        t.on_write(1, 3 * G - 1, 2); // straddles regions 2 and 3
        t.on_write(9, 0, G); // another volume
        assert_eq!(dirty(&t, 16 * G), vec![(2 * G, 2 * G), (10 * G, G)]);
        let v = t.query(1, 2, 0, G);
        assert_eq!((v.epoch, v.incarnation), (5, 77));
        t.track(1, 5, &peer(DIRTY_MANUAL));
        t.on_write(1, 0, G);
        assert_eq!(dirty(&t, 16 * G).len(), 2, "manual mode ignores writes");
        t.mark(1, 5, &peer(DIRTY_AUTO), 0, 1);
        assert_eq!(dirty(&t, 16 * G)[0], (0, G), "explicit marks still count");
        t.on_write(1, 5 * G, 1);
        assert_eq!(
            dirty(&t, 16 * G).len(),
            4,
            "a mark means the peer is out: auto again"
        );
    }

    #[test]
    fn clear_removes_only_whole_regions_and_drop_forgets() {
        let t = DirtyTracker::new(G);
        t.mark(1, 5, &peer(DIRTY_START), 0, 4 * G);
        t.clear(1, 2, G / 2, 2 * G); // wholly covers region 1 only
        assert_eq!(dirty(&t, 4 * G), vec![(0, G), (2 * G, 2 * G)]);
        t.track(1, 5, &peer(DIRTY_DROP));
        assert_eq!(t.query(1, 2, 0, G).epoch, 0);
        t.on_write(1, 0, G);
        assert_eq!(t.count(1, 2), 0);
    }
}
