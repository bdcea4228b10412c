//! One replica over the two tiers: its extents, the lock each holds against a move, the move
//! itself (copy, make durable, switch the map, free the old place) and the pin.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use super::heat::{Heat, View};
use super::{io, map, map_path, Pin, ReplicaTiers, Shared, Tier, TierHint, TierMapFile};
use crate::file::write_atomically;
use crate::{check_range, check_size, Extent, Replica, StoreError};

/// Where a move was cut short, for the crash tests: the move stops right after this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveStep {
    /// The bytes are in the new tier, not yet durable.
    Copied,
    /// The bytes are durable in the new tier; the map still points at the old one.
    Durable,
    /// The map points at the new tier; the old place is not yet freed.
    Switched,
}

#[derive(Debug, Default)]
struct Counters {
    reads_fast: AtomicU64,
    reads_slow: AtomicU64,
    promotions: AtomicU64,
    demotions: AtomicU64,
}

pub(super) const SLOW: u8 = 0;
pub(super) const FAST: u8 = 1;

fn code(t: Tier) -> u8 {
    match t {
        Tier::Slow => SLOW,
        Tier::Fast => FAST,
    }
}

/// What a replica keeps per extent, and its size: held shared by I/O and moves, exclusive by a
/// shrink throughout and by a grow only to add extents (each so waits for the I/O and moves
/// under way, and they for it).
#[derive(Debug)]
pub(super) struct Extents {
    size: u64,
    extent: u64,
    shift: u32,
    tiers: Vec<AtomicU8>,
    /// One per extent: I/O takes it shared, a move exclusive.
    locks: Vec<RwLock<()>>,
    heat: Heat,
}

impl Extents {
    fn count(&self) -> u64 {
        self.tiers.len() as u64
    }

    fn tier(&self, extent: u64) -> Tier {
        match self.tiers[extent as usize].load(Ordering::Acquire) {
            FAST => Tier::Fast,
            _ => Tier::Slow,
        }
    }

    fn on_tier(&self, t: Tier) -> u64 {
        (0..self.count()).filter(|&e| self.tier(e) == t).count() as u64
    }

    /// The bytes of extent `extent`: (offset, length; the last may be short).
    pub(super) fn range(&self, extent: u64) -> (u64, u64) {
        let off = extent << self.shift;
        (off, self.extent.min(self.size - off))
    }

    /// Sets the size: extents past it go, new ones start on the slow tier, cold.
    fn set_size(&mut self, size: u64) {
        let n = size.div_ceil(self.extent) as usize;
        self.size = size;
        self.tiers.resize_with(n, || AtomicU8::new(SLOW));
        self.locks.resize_with(n, || RwLock::new(()));
        self.heat.resize(n as u64);
    }
}

/// A test's code run at a point of an operation.
#[cfg(test)]
pub(super) struct TestHook(pub(super) Box<dyn Fn() + Send>);

#[cfg(test)]
impl std::fmt::Debug for TestHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestHook")
    }
}

/// One replica over the two tiers.
#[derive(Debug)]
pub struct TieredReplica {
    pub(super) volume: u64,
    pub(super) extent: u64,
    pub(super) fast: Arc<dyn Replica>,
    pub(super) slow: Arc<dyn Replica>,
    ext: RwLock<Extents>,
    pub(super) pin: AtomicU8,
    counters: Counters,
    pub(super) map_path: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) persist_lock: Mutex<()>,
    /// One resize at a time (a grow holds the extents' lock only to add extents).
    resizing: Mutex<()>,
    /// Runs between the two tiers' grows (tests: I/O must go on meanwhile).
    #[cfg(test)]
    pub(super) mid_grow: Mutex<Option<TestHook>>,
    /// Deleted: the map must not be written again.
    pub(super) retired: AtomicBool,
    /// A map switch could not be recorded either way: what the map on disk says is unknown,
    /// so the replica refuses all I/O until the node restarts (and its peers resync it).
    pub(super) broken: AtomicBool,
    pub(super) shared: Weak<Shared>,
}

impl TieredReplica {
    pub(super) fn new(
        m: TierMapFile,
        fast: Arc<dyn Replica>,
        slow: Arc<dyn Replica>,
        shared: Weak<Shared>,
    ) -> TieredReplica {
        let dir = shared.upgrade().map(|s| s.dir.clone()).unwrap_or_default();
        let shift = m.extent.trailing_zeros();
        TieredReplica {
            volume: m.volume,
            extent: m.extent,
            fast,
            slow,
            ext: RwLock::new(Extents {
                size: m.size,
                extent: m.extent,
                shift,
                tiers: m.tiers.iter().map(|t| AtomicU8::new(code(*t))).collect(),
                locks: m.tiers.iter().map(|_| RwLock::new(())).collect(),
                heat: Heat::new(m.tiers.len() as u64, shift),
            }),
            pin: AtomicU8::new(m.pin.code()),
            counters: Counters::default(),
            map_path: map_path(&dir, m.volume),
            dir,
            persist_lock: Mutex::new(()),
            resizing: Mutex::new(()),
            #[cfg(test)]
            mid_grow: Mutex::new(None),
            retired: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            shared,
        }
    }

    /// The extents, held shared. Never taken twice by one thread: a resize waiting between
    /// the two would hold both up.
    pub(super) fn ext(&self) -> RwLockReadGuard<'_, Extents> {
        self.ext.read().unwrap_or_else(|e| e.into_inner())
    }

    fn ext_mut(&self) -> RwLockWriteGuard<'_, Extents> {
        self.ext.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn extents(&self) -> u64 {
        self.ext().count()
    }

    pub fn tier(&self, extent: u64) -> Tier {
        self.ext().tier(extent)
    }

    pub fn pin(&self) -> Pin {
        Pin::from_code(self.pin.load(Ordering::Acquire)).unwrap_or_default()
    }

    /// Halves every extent's heat (the mover, once a second).
    pub(super) fn decay_heat(&self) {
        self.ext().heat.decay();
    }

    /// Each extent as the planner sees it.
    pub(super) fn views(&self) -> Vec<View> {
        let x = self.ext();
        let pin = self.pin();
        (0..x.count())
            .map(|e| View {
                volume: self.volume,
                extent: e,
                heat: x.heat.get(e),
                tier: x.tier(e),
                pin,
            })
            .collect()
    }

    pub(super) fn count(&self, t: Tier) -> u64 {
        self.ext().on_tier(t)
    }

    pub(super) fn on(&self, t: Tier) -> &Arc<dyn Replica> {
        match t {
            Tier::Fast => &self.fast,
            Tier::Slow => &self.slow,
        }
    }

    fn map_of(&self, x: &Extents) -> TierMapFile {
        TierMapFile {
            volume: self.volume,
            size: x.size,
            extent: self.extent,
            pin: self.pin(),
            tiers: (0..x.count()).map(|e| x.tier(e)).collect(),
        }
    }

    /// Writes the map from memory (`x`: the extents, held), atomically and durably.
    pub(super) fn persist(&self, x: &Extents) -> Result<(), StoreError> {
        self.write_map(&self.map_of(x))
    }

    fn write_map(&self, m: &TierMapFile) -> Result<(), StoreError> {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.retired.load(Ordering::Acquire) {
            return Err(StoreError::NoReplica {
                volume: self.volume,
            });
        }
        write_atomically(&self.map_path, &self.dir, &map::encode(m))
            .map_err(io(self.volume, "persist tier map"))
    }

    pub(super) fn retire(&self) {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.retired.store(true, Ordering::Release);
    }

    /// Frees every place the map does not point at: the stray copy of a move cut short before
    /// its switch, or the old place of one cut short after it.
    pub(super) fn reclaim(&self) -> Result<(), StoreError> {
        let x = self.ext();
        for e in 0..x.count() {
            let (off, len) = x.range(e);
            let other = self.on(match x.tier(e) {
                Tier::Fast => Tier::Slow,
                Tier::Slow => Tier::Fast,
            });
            let stray = other
                .block_status(off, len)?
                .iter()
                .any(|x| x.flags & Extent::HOLE == 0);
            if stray {
                other.write_zeroes(off, len, true, false)?;
            }
        }
        self.fast.flush()?;
        self.slow.flush()
    }

    pub(super) fn check_usable(&self) -> Result<(), StoreError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(StoreError::Io {
                volume: self.volume,
                op: "tiered I/O",
                source: std::io::Error::other(
                    "the tier map could not be recorded; restart the node",
                ),
            });
        }
        Ok(())
    }

    /// Runs `f` on each piece of `[offset, offset+len)` that lies in one extent, under the
    /// extent's shared lock, with the tier that holds it: (tier, replica, piece offset,
    /// piece length, position in the request).
    fn each_piece(
        &self,
        x: &Extents,
        offset: u64,
        len: u64,
        mut f: impl FnMut(Tier, &dyn Replica, u64, u64, usize) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        check_range(offset, len, x.size)?;
        self.check_usable()?;
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let e = pos >> x.shift;
            let next = ((e + 1) << x.shift).min(end);
            let _g = x.locks[e as usize]
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let t = x.tier(e);
            f(
                t,
                self.on(t).as_ref(),
                pos,
                next - pos,
                (pos - offset) as usize,
            )?;
            pos = next;
        }
        Ok(())
    }

    /// Moves extent `e` to tier `to` (see the module docs). False if it was there already or
    /// the fast tier has no room. `stop_after` cuts the move short, as a crash would (tests).
    pub fn move_extent(
        &self,
        e: u64,
        to: Tier,
        stop_after: Option<MoveStep>,
    ) -> Result<bool, StoreError> {
        self.check_usable()?;
        let x = self.ext();
        if e >= x.count() {
            return Err(StoreError::Invalid(format!(
                "extent {e} outside a replica of {} extents",
                x.count()
            )));
        }
        let shared = self.shared.upgrade();
        let _g = x.locks[e as usize]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let from = x.tier(e);
        if from == to {
            return Ok(false);
        }
        if to == Tier::Fast && !shared.as_ref().is_some_and(|s| s.reserve_fast()) {
            return Ok(false);
        }
        let release = |s: &Option<Arc<Shared>>| {
            if let Some(s) = s {
                s.fast_used.fetch_sub(1, Ordering::AcqRel);
            }
        };
        match self.copy_and_switch(&x, e, from, to, stop_after) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(err) => {
                if to == Tier::Fast {
                    release(&shared);
                }
                return Err(err);
            }
        }
        let (src, (off, len)) = (self.on(from), x.range(e));
        match to {
            Tier::Fast => self.counters.promotions.fetch_add(1, Ordering::Relaxed),
            Tier::Slow => {
                release(&shared);
                self.counters.demotions.fetch_add(1, Ordering::Relaxed)
            }
        };
        if let Some(s) = &shared {
            s.migrated_bytes.fetch_add(len, Ordering::Relaxed);
        }
        if stop_after == Some(MoveStep::Switched) {
            return Ok(true);
        }
        // Free the old place. If this fails, the next open frees it.
        if let Err(err) = src.write_zeroes(off, len, true, false) {
            tracing::warn!(
                volume = self.volume,
                extent = e,
                "tiers: freeing a moved extent's old place: {err}"
            );
        }
        Ok(true)
    }

    /// The copy and the switch of a move, under the extent's exclusive lock. Ok(false): cut
    /// short by `stop_after` before the switch.
    fn copy_and_switch(
        &self,
        x: &Extents,
        e: u64,
        from: Tier,
        to: Tier,
        stop_after: Option<MoveStep>,
    ) -> Result<bool, StoreError> {
        let (src, dst) = (self.on(from), self.on(to));
        let (off, len) = x.range(e);
        // The new place starts empty: a stray copy left there by an earlier move whose free
        // failed must not show through the source's holes.
        dst.write_zeroes(off, len, true, false)?;
        let data: Vec<Extent> = src.block_status(off, len)?;
        if data.iter().any(|x| x.flags & Extent::HOLE == 0) {
            let mut buf = crate::aligned::AlignedBuf::new(len as usize);
            src.read(off, &mut buf[..len as usize])?;
            let mut pos = off;
            for x in &data {
                if x.flags & Extent::HOLE == 0 {
                    let at = (pos - off) as usize;
                    dst.write(pos, &buf[at..at + x.length as usize], false)?;
                }
                pos += x.length;
            }
        }
        if stop_after == Some(MoveStep::Copied) {
            return Ok(false);
        }
        dst.flush()?;
        if stop_after == Some(MoveStep::Durable) {
            return Ok(false);
        }
        x.tiers[e as usize].store(code(to), Ordering::Release);
        if let Err(err) = self.persist(x) {
            x.tiers[e as usize].store(code(from), Ordering::Release);
            if self.retired.load(Ordering::Acquire) {
                // Deleted meanwhile: nothing was written, nothing is left to serve.
                return Err(err);
            }
            // Whether the new map reached the disk is unknown: try to record the old one.
            if let Err(again) = self.persist(x) {
                tracing::error!(
                    volume = self.volume,
                    "tiers: {err}; then {again}: refusing I/O"
                );
                self.broken.store(true, Ordering::Release);
            }
            return Err(err);
        }
        Ok(true)
    }

    /// Pins the volume's extents to a tier (or lets heat decide). A pin to fast reserves room
    /// for every extent, and is refused if the node's fast tier cannot hold them.
    pub fn set_pin(&self, pin: Pin) -> Result<(), StoreError> {
        let shared = self.shared.upgrade().ok_or(StoreError::NoReplica {
            volume: self.volume,
        })?;
        if pin == Pin::Fast {
            let reps = shared.replicas.lock().unwrap_or_else(|e| e.into_inner());
            self.fits_fast(&shared, &reps, self.extents(), "pinning to fast")?;
        }
        let x = self.ext();
        let old = self.pin.swap(pin.code(), Ordering::AcqRel);
        if let Err(e) = self.persist(&x) {
            self.pin.store(old, Ordering::Release);
            return Err(e);
        }
        Ok(())
    }

    /// Whether the fast tier holds `extents` of this replica beside those other volumes pinned
    /// to fast claim (`reps`: the store's replicas, held).
    fn fits_fast(
        &self,
        shared: &Shared,
        reps: &HashMap<u64, Arc<TieredReplica>>,
        extents: u64,
        what: &str,
    ) -> Result<(), StoreError> {
        let claimed: u64 = reps
            .values()
            .filter(|r| r.volume != self.volume && r.pin() == Pin::Fast)
            .map(|r| r.extents())
            .sum();
        let places = shared.fast_places();
        if claimed + extents <= places {
            return Ok(());
        }
        Err(StoreError::NoSpace {
            size: extents * self.extent,
            what: format!(
                "{what} needs {extents} extents of {} bytes; the fast tier has {places} places, {claimed} pinned by other volumes",
                self.extent,
            ),
        })
    }

    /// Resizes the replica (see [`Replica::resize`]). A crash at any step leaves the old size
    /// or the new one: a grow lengthens both tiers before the map names the new size, a
    /// shrink writes the map first and shortens the tiers after; opening the store cuts a
    /// tier longer than its map back to it. A grow lets I/O and moves below the old end go
    /// on while the tiers grow and the map is written (the versions' pool grows ahead of its
    /// redirects so; each step took six fsyncs with every request held), holding the
    /// extents' lock exclusive only to add the new extents; a shrink holds it throughout. A volume pinned to fast may grow past what the
    /// fast tier holds (a resize, or the pool of its snapshots' redirected blocks: refusing
    /// would fail its writes for space): the extents that do not fit stay on the slow tier,
    /// and the grow says so in the log.
    fn resize_to(&self, size: u64) -> Result<(), StoreError> {
        check_size(size)?;
        self.check_usable()?;
        let shared = self.shared.upgrade();
        let extents = size.div_ceil(self.extent);
        let _one = self.resizing.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.ext().size;
        if size > old {
            // No request comes past the old end before this returns (the trait's contract).
            self.grow_tiers(old, size)?;
            self.ext_mut().set_size(size);
            let persisted = self.persist(&self.ext());
            if let Err(e) = persisted {
                self.ungrow(old, shared.as_deref());
                return Err(e);
            }
            // Outside the extents' lock: the store's replicas are taken before it (`set_pin`).
            if let Some(s) = shared.filter(|_| self.pin() == Pin::Fast) {
                let reps = s.replicas.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = self.fits_fast(&s, &reps, extents, "a volume pinned to fast") {
                    tracing::warn!(
                        volume = self.volume,
                        "tiers: grown past the fast tier, the rest stays on the slow tier: {e}"
                    );
                }
            }
            return Ok(());
        }
        let mut x = self.ext_mut();
        if size == old {
            return Ok(());
        }
        let gone_fast = (extents..x.count())
            .filter(|&e| x.tier(e) == Tier::Fast)
            .count() as u64;
        let mut m = self.map_of(&x);
        m.size = size;
        m.tiers.truncate(extents as usize);
        self.write_map(&m)?;
        x.set_size(size);
        if let Some(s) = &shared {
            s.fast_used.fetch_sub(gone_fast, Ordering::AcqRel);
        }
        // The map names the new size: a tier left longer is cut at the next grow, or open.
        self.slow.resize(size)?;
        self.fast.resize(size)
    }

    /// A grow whose map could not be written: back to `old` bytes, the map recorded again at
    /// that size (a move meanwhile may have recorded the new one), and the tiers cut back; if
    /// even that cannot be recorded, the replica refuses I/O until the node restarts, as for
    /// a move whose map is unknown.
    fn ungrow(&self, old: u64, shared: Option<&Shared>) {
        let mut x = self.ext_mut();
        let extents = old.div_ceil(self.extent);
        let gone_fast = (extents..x.count())
            .filter(|&e| x.tier(e) == Tier::Fast)
            .count() as u64;
        x.set_size(old);
        if let Some(s) = shared {
            s.fast_used.fetch_sub(gone_fast, Ordering::AcqRel);
        }
        if let Err(e) = self.persist(&x) {
            if !self.retired.load(Ordering::Acquire) {
                tracing::error!(
                    volume = self.volume,
                    "tiers: a grow's map could not be written, nor the old one again: {e}; refusing I/O"
                );
                self.broken.store(true, Ordering::Release);
            }
            return;
        }
        let _ = self.slow.resize(old);
        let _ = self.fast.resize(old);
    }

    /// Lengthens both tiers from `old` to `size` bytes: first cut back to `old` any tier a
    /// shrink left longer (its bytes past `old` must not show again), then grow; on an error,
    /// both go back to `old`.
    fn grow_tiers(&self, old: u64, size: u64) -> Result<(), StoreError> {
        let grow = |t: &Arc<dyn Replica>| -> Result<(), StoreError> {
            if t.size() != old {
                t.resize(old)?;
            }
            t.resize(size)
        };
        let r = grow(&self.slow).and_then(|()| {
            #[cfg(test)]
            if let Some(f) = &*self.mid_grow.lock().unwrap_or_else(|e| e.into_inner()) {
                (f.0)();
            }
            grow(&self.fast)
        });
        if r.is_err() {
            let _ = self.slow.resize(old);
            let _ = self.fast.resize(old);
        }
        r
    }

    pub fn tier_stats(&self) -> ReplicaTiers {
        let x = self.ext();
        let fast = x.on_tier(Tier::Fast);
        ReplicaTiers {
            pin: self.pin(),
            extent: self.extent,
            fast_extents: fast,
            slow_extents: x.count() - fast,
            reads_fast: self.counters.reads_fast.load(Ordering::Relaxed),
            reads_slow: self.counters.reads_slow.load(Ordering::Relaxed),
            promotions: self.counters.promotions.load(Ordering::Relaxed),
            demotions: self.counters.demotions.load(Ordering::Relaxed),
        }
    }
}

impl Replica for TieredReplica {
    fn volume(&self) -> u64 {
        self.volume
    }
    fn size(&self) -> u64 {
        self.ext().size
    }
    fn epoch(&self) -> u64 {
        self.slow.epoch()
    }
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        self.slow.set_epoch(epoch)
    }
    fn allocated_bytes(&self) -> u64 {
        self.fast.allocated_bytes() + self.slow.allocated_bytes()
    }
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        self.resize_to(size)
    }
    /// To the tier holding each extent of the range (the fast tier's thin store ignores it):
    /// the versions' pool asks it ahead of its redirects.
    fn reserve(&self, offset: u64, len: u64) {
        let x = self.ext();
        let Some(end) = offset.checked_add(len).filter(|&e| e <= x.size) else {
            return;
        };
        let mut pos = offset;
        while pos < end {
            let e = pos >> x.shift;
            let next = ((e + 1) << x.shift).min(end);
            self.on(x.tier(e)).reserve(pos, next - pos);
            pos = next;
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        let x = self.ext();
        check_range(offset, len, x.size)?;
        x.heat.touch(offset, len);
        self.each_piece(&x, offset, len, |t, r, off, n, at| {
            match t {
                Tier::Fast => &self.counters.reads_fast,
                Tier::Slow => &self.counters.reads_slow,
            }
            .fetch_add(1, Ordering::Relaxed);
            r.read(off, &mut buf[at..at + n as usize])
        })
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        let x = self.ext();
        check_range(offset, data.len() as u64, x.size)?;
        x.heat.touch(offset, data.len() as u64);
        self.each_piece(&x, offset, data.len() as u64, |_, r, off, n, at| {
            r.write(off, &data[at..at + n as usize], fua)
        })
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        self.each_piece(&self.ext(), offset, len, |_, r, off, n, _| {
            r.write_zeroes(off, n, may_trim, fua)
        })
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.check_usable()?;
        self.fast.flush()?;
        self.slow.flush()
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        let mut out: Vec<Extent> = Vec::new();
        self.each_piece(&self.ext(), offset, len, |_, r, off, n, _| {
            for x in r.block_status(off, n)? {
                match out.last_mut() {
                    Some(last) if last.flags == x.flags => last.length += x.length,
                    _ => out.push(x),
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
    fn incarnation(&self) -> u64 {
        // A new history in either tier is a new history of the replica.
        (self.slow.incarnation().rotate_left(17) ^ self.fast.incarnation()).max(1)
    }
    fn close(&self) -> Result<(), StoreError> {
        self.fast.close()?;
        self.slow.close()
    }
    fn ledger(&self) -> Option<Arc<dyn crate::Ledger>> {
        self.slow.ledger()
    }
    fn unclean_stop(&self) -> bool {
        self.slow.unclean_stop() || self.fast.unclean_stop()
    }
    fn tiers(&self) -> Option<ReplicaTiers> {
        Some(self.tier_stats())
    }
    fn set_pin(&self, pin: Pin) -> Result<(), StoreError> {
        TieredReplica::set_pin(self, pin)
    }
    fn tier_of(&self, offset: u64, len: u64) -> Option<TierHint> {
        let x = self.ext();
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= x.size && len > 0)?;
        let slow = (offset >> x.shift..=(end - 1) >> x.shift).any(|e| x.tier(e) == Tier::Slow);
        Some(TierHint {
            slow,
            heated: x.heat.would_heat(offset, len),
        })
    }
    fn add_heat(&self, offset: u64, count: u32) {
        let x = self.ext();
        if offset < x.size {
            x.heat.add(offset >> x.shift, count);
        }
    }
}
