//! One replica over the two tiers: its extents, the lock each holds against a move, the move
//! itself (copy, make durable, switch the map, free the old place) and the pin.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use super::heat::Heat;
use super::{io, map, map_path, Pin, ReplicaTiers, Shared, Tier, TierHint, TierMapFile};
use crate::file::write_atomically;
use crate::{check_range, Extent, Replica, StoreError};

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

/// One replica over the two tiers.
#[derive(Debug)]
pub struct TieredReplica {
    pub(super) volume: u64,
    pub(super) size: u64,
    pub(super) extent: u64,
    pub(super) shift: u32,
    pub(super) fast: Arc<dyn Replica>,
    pub(super) slow: Arc<dyn Replica>,
    pub(super) tiers: Vec<AtomicU8>,
    pub(super) pin: AtomicU8,
    /// One per extent: I/O takes it shared, a move exclusive.
    pub(super) locks: Vec<RwLock<()>>,
    pub(super) heat: Heat,
    counters: Counters,
    pub(super) map_path: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) persist_lock: Mutex<()>,
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
            size: m.size,
            extent: m.extent,
            shift,
            fast,
            slow,
            tiers: m.tiers.iter().map(|t| AtomicU8::new(code(*t))).collect(),
            pin: AtomicU8::new(m.pin.code()),
            locks: m.tiers.iter().map(|_| RwLock::new(())).collect(),
            heat: Heat::new(m.tiers.len() as u64, shift),
            counters: Counters::default(),
            map_path: map_path(&dir, m.volume),
            dir,
            persist_lock: Mutex::new(()),
            retired: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            shared,
        }
    }

    pub fn extents(&self) -> u64 {
        self.tiers.len() as u64
    }

    pub fn tier(&self, extent: u64) -> Tier {
        match self.tiers[extent as usize].load(Ordering::Acquire) {
            FAST => Tier::Fast,
            _ => Tier::Slow,
        }
    }

    pub fn pin(&self) -> Pin {
        Pin::from_code(self.pin.load(Ordering::Acquire)).unwrap_or_default()
    }

    pub fn heat(&self) -> &Heat {
        &self.heat
    }

    pub(super) fn count(&self, t: Tier) -> u64 {
        (0..self.extents()).filter(|&e| self.tier(e) == t).count() as u64
    }

    pub(super) fn range(&self, extent: u64) -> (u64, u64) {
        let off = extent << self.shift;
        (off, self.extent.min(self.size - off))
    }

    pub(super) fn on(&self, t: Tier) -> &Arc<dyn Replica> {
        match t {
            Tier::Fast => &self.fast,
            Tier::Slow => &self.slow,
        }
    }

    pub(super) fn snapshot(&self) -> TierMapFile {
        TierMapFile {
            volume: self.volume,
            size: self.size,
            extent: self.extent,
            pin: self.pin(),
            tiers: (0..self.extents()).map(|e| self.tier(e)).collect(),
        }
    }

    /// Writes the map from memory, atomically and durably.
    pub(super) fn persist(&self) -> Result<(), StoreError> {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.retired.load(Ordering::Acquire) {
            return Err(StoreError::NoReplica {
                volume: self.volume,
            });
        }
        write_atomically(&self.map_path, &self.dir, &map::encode(&self.snapshot()))
            .map_err(io(self.volume, "persist tier map"))
    }

    pub(super) fn retire(&self) {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.retired.store(true, Ordering::Release);
    }

    /// Frees every place the map does not point at: the stray copy of a move cut short before
    /// its switch, or the old place of one cut short after it.
    pub(super) fn reclaim(&self) -> Result<(), StoreError> {
        for e in 0..self.extents() {
            let (off, len) = self.range(e);
            let other = self.on(match self.tier(e) {
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
    pub(super) fn each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(Tier, &dyn Replica, u64, u64, usize) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        check_range(offset, len, self.size)?;
        self.check_usable()?;
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let e = pos >> self.shift;
            let next = ((e + 1) << self.shift).min(end);
            let _g = self.locks[e as usize]
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let t = self.tier(e);
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
        if e >= self.extents() {
            return Err(StoreError::Invalid(format!(
                "extent {e} outside a replica of {} extents",
                self.extents()
            )));
        }
        let shared = self.shared.upgrade();
        let _g = self.locks[e as usize]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let from = self.tier(e);
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
        match self.copy_and_switch(e, from, to, stop_after) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(err) => {
                if to == Tier::Fast {
                    release(&shared);
                }
                return Err(err);
            }
        }
        let (src, (off, len)) = (self.on(from), self.range(e));
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
    pub(super) fn copy_and_switch(
        &self,
        e: u64,
        from: Tier,
        to: Tier,
        stop_after: Option<MoveStep>,
    ) -> Result<bool, StoreError> {
        let (src, dst) = (self.on(from), self.on(to));
        let (off, len) = self.range(e);
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
        self.tiers[e as usize].store(code(to), Ordering::Release);
        if let Err(err) = self.persist() {
            self.tiers[e as usize].store(code(from), Ordering::Release);
            if self.retired.load(Ordering::Acquire) {
                // Deleted meanwhile: nothing was written, nothing is left to serve.
                return Err(err);
            }
            // Whether the new map reached the disk is unknown: try to record the old one.
            if let Err(again) = self.persist() {
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
            let claimed: u64 = reps
                .values()
                .filter(|r| r.volume != self.volume && r.pin() == Pin::Fast)
                .map(|r| r.extents())
                .sum();
            let places = shared.fast_places();
            if claimed + self.extents() > places {
                return Err(StoreError::NoSpace {
                    size: self.extents() * self.extent,
                    what: format!(
                        "pinning to fast needs {} extents of {} bytes; the fast tier has {} places, {} pinned by other volumes",
                        self.extents(),
                        self.extent,
                        places,
                        claimed
                    ),
                });
            }
        }
        let old = self.pin.swap(pin.code(), Ordering::AcqRel);
        if let Err(e) = self.persist() {
            self.pin.store(old, Ordering::Release);
            return Err(e);
        }
        Ok(())
    }

    pub fn tier_stats(&self) -> ReplicaTiers {
        let fast = self.count(Tier::Fast);
        ReplicaTiers {
            pin: self.pin(),
            extent: self.extent,
            fast_extents: fast,
            slow_extents: self.extents() - fast,
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
        self.size
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
        // Its tier map, heat and locks are per extent of a fixed count.
        Err(StoreError::Invalid(format!(
            "replica {} is on a tiered store, whose replicas cannot be resized yet (asked: {size} bytes)",
            self.volume
        )))
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size)?;
        self.heat.touch(offset, len);
        self.each_piece(offset, len, |t, r, off, n, at| {
            match t {
                Tier::Fast => &self.counters.reads_fast,
                Tier::Slow => &self.counters.reads_slow,
            }
            .fetch_add(1, Ordering::Relaxed);
            r.read(off, &mut buf[at..at + n as usize])
        })
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        check_range(offset, data.len() as u64, self.size)?;
        self.heat.touch(offset, data.len() as u64);
        self.each_piece(offset, data.len() as u64, |_, r, off, n, at| {
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
        self.each_piece(offset, len, |_, r, off, n, _| {
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
        self.each_piece(offset, len, |_, r, off, n, _| {
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
    fn tiers(&self) -> Option<ReplicaTiers> {
        Some(self.tier_stats())
    }
    fn set_pin(&self, pin: Pin) -> Result<(), StoreError> {
        TieredReplica::set_pin(self, pin)
    }
    fn tier_of(&self, offset: u64, len: u64) -> Option<TierHint> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.size && len > 0)?;
        let slow =
            (offset >> self.shift..=(end - 1) >> self.shift).any(|e| self.tier(e) == Tier::Slow);
        Some(TierHint {
            slow,
            heated: self.heat.would_heat(offset, len),
        })
    }
    fn add_heat(&self, offset: u64, count: u32) {
        if offset < self.size {
            self.heat.add(offset >> self.shift, count);
        }
    }
}
