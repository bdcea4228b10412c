//! The tiered store: each node has a fast tier (flash) and a slow tier (disk), and each extent
//! of a replica lives in exactly one of them. A tier, not a cache: there is no second copy to
//! keep coherent and no write-back to lose, so losing a drive is losing replicas, which
//! replication covers.
//!
//! Layout in the store's directory:
//! * `fast/` — a thin file store (space taken on write): the extents on flash, at their own
//!   offsets in a sparse file per replica.
//! * `slow/` — a file store behind the [disk model](crate::disk_model) when the host has no
//!   spinning disk: every other extent.
//! * `replica-<volume>.tiers` — the [tier map](map): which tier holds each extent, and the
//!   volume's pin. A replica exists when its map does: created last, deleted first.
//!
//! A move ([`TieredReplica::move_extent`]) holds the extent's lock against I/O, copies the
//! extent's allocated bytes to the other tier, makes them durable there, switches the map in
//! one durable step (the map file is replaced atomically) and then frees the old place. A
//! crash before the switch leaves the extent where it was, with a stray copy in the other
//! tier; after it, the extent is in its new tier with its old place not yet freed. Either
//! way, opening the store frees whatever the map does not point at, so nothing is lost and
//! nothing leaks past a restart. Block checksums sit above this store (`SealedStore`) and
//! cover the logical bytes, so they hold across moves.
//!
//! Heat, the migration plan and the mover thread: [`heat`], [`mover`].

pub mod heat;
pub mod map;
mod mover;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::disk_model::{DiskModel, DiskParams, ModeledStore};
use crate::file::write_atomically;
use crate::{check_range, Extent, FileStore, Replica, Store, StoreError, StoreKind};
use heat::Heat;
pub use map::{Pin, Tier, TierMapFile};

/// Default extent: the unit of heat and of migration.
pub const EXTENT: u64 = 1 << 20;

/// How a node's tiers are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierConfig {
    /// Bytes of the fast tier, shared by every replica on the node.
    pub fast_capacity: u64,
    /// The slow tier goes through this disk model (`None`: a real slow device).
    pub disk: Option<DiskParams>,
    /// Most bytes migrated per second (promotions and demotions together).
    pub migrate_rate: u64,
    pub extent: u64,
}

impl TierConfig {
    /// Default migration rate: about a fifth of the modeled disk's time at 1 MiB extents.
    pub const MIGRATE_RATE: u64 = 32 << 20;

    pub fn new(fast_capacity: u64) -> TierConfig {
        TierConfig {
            fast_capacity,
            disk: Some(DiskParams::HDD),
            migrate_rate: TierConfig::MIGRATE_RATE,
            extent: EXTENT,
        }
    }
}

/// A node's tiers, for reports: what `Op::TierInfo` carries, field for field.
pub type StoreTiers = trireme_proto::NodeTiers;

/// Where a read would be served from, for the writer's read preference and heat sharing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierHint {
    /// The slow tier holds (part of) the range.
    pub slow: bool,
    /// The read would heat its extents (small, not part of a scan).
    pub heated: bool,
}

/// One replica's tiers, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplicaTiers {
    pub pin: Pin,
    pub extent: u64,
    pub fast_extents: u64,
    pub slow_extents: u64,
    /// Read requests (pieces within one extent) served by each tier since the node started.
    pub reads_fast: u64,
    pub reads_slow: u64,
    pub promotions: u64,
    pub demotions: u64,
}

/// State the store and its mover share.
#[derive(Debug)]
struct Shared {
    cfg: TierConfig,
    dir: PathBuf,
    replicas: Mutex<HashMap<u64, Arc<TieredReplica>>>,
    /// Extents on the fast tier, counting promotions in flight.
    fast_used: AtomicU64,
    migrated_bytes: AtomicU64,
    /// Bytes moved in the last whole second (the mover measures it).
    migrating: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn fast_places(&self) -> u64 {
        self.cfg.fast_capacity / self.cfg.extent
    }

    /// Takes one fast place for a promotion; false if the tier is full.
    fn reserve_fast(&self) -> bool {
        let cap = self.fast_places();
        self.fast_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < cap).then_some(u + 1)
            })
            .is_ok()
    }
}

/// The tiered store (see the module docs).
#[derive(Debug)]
pub struct TieredStore {
    fast: Arc<dyn Store>,
    slow: Arc<dyn Store>,
    disk: Option<Arc<DiskModel>>,
    shared: Arc<Shared>,
    mover: Option<std::thread::JoinHandle<()>>,
}

fn io(volume: u64, op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { volume, op, source }
}

impl TieredStore {
    /// Opens (creating if needed) the tiers in `dir` and starts the mover.
    pub fn open(dir: &Path, cfg: TierConfig) -> Result<TieredStore, StoreError> {
        let s = TieredStore::open_still(dir, cfg)?;
        Ok(s.start_mover())
    }

    /// Opens the tiers without a mover: moves happen only when asked (tests).
    pub fn open_still(dir: &Path, cfg: TierConfig) -> Result<TieredStore, StoreError> {
        if !map::valid_extent(cfg.extent) {
            return Err(StoreError::Invalid(format!(
                "tier extent {} must be a power of two from 64 KiB to 1 GiB",
                cfg.extent
            )));
        }
        crate::private::create_dir_all(dir).map_err(io(0, "create store directory"))?;
        let fast: Arc<dyn Store> = Arc::new(FileStore::open_thin(&dir.join("fast"))?);
        let slow_files: Arc<dyn Store> = Arc::new(FileStore::open(&dir.join("slow"))?);
        let (slow, disk): (Arc<dyn Store>, _) = match cfg.disk {
            Some(p) => {
                let disk = Arc::new(DiskModel::new(p));
                (
                    Arc::new(ModeledStore::new(slow_files, disk.clone())),
                    Some(disk),
                )
            }
            None => (slow_files, None),
        };
        Ok(TieredStore {
            fast,
            slow,
            disk,
            shared: Arc::new(Shared {
                cfg,
                dir: dir.to_path_buf(),
                replicas: Mutex::default(),
                fast_used: AtomicU64::new(0),
                migrated_bytes: AtomicU64::new(0),
                migrating: AtomicU64::new(0),
                stop: AtomicBool::new(false),
            }),
            mover: None,
        })
    }

    fn start_mover(mut self) -> TieredStore {
        let shared = self.shared.clone();
        self.mover = Some(
            std::thread::Builder::new()
                .name("tier-mover".into())
                .spawn(move || mover::run(&shared))
                .expect("spawn the tier mover"),
        );
        self
    }

    /// The replica of `volume`, as the tiered store sees it (tests and the mover).
    pub fn replica(&self, volume: u64) -> Option<Arc<TieredReplica>> {
        self.shared
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
    }

    pub fn disk(&self) -> Option<&Arc<DiskModel>> {
        self.disk.as_ref()
    }

    fn map_path(&self, volume: u64) -> PathBuf {
        map_path(&self.shared.dir, volume)
    }

    /// Opens one replica from its map and its two inner replicas, and frees every place the
    /// map does not point at (a move or a create cut short).
    fn open_one(
        &self,
        path: &Path,
        fast: &mut HashMap<u64, Arc<dyn Replica>>,
        slow: &mut HashMap<u64, Arc<dyn Replica>>,
    ) -> Result<Arc<TieredReplica>, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt {
            path: path.display().to_string(),
            what,
        };
        let bytes = std::fs::read(path).map_err(|e| corrupt(e.to_string()))?;
        let m = map::decode(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if self.map_path(m.volume) != path {
            return Err(corrupt(format!(
                "names volume {} in another file",
                m.volume
            )));
        }
        let (Some(f), Some(s)) = (fast.remove(&m.volume), slow.remove(&m.volume)) else {
            return Err(corrupt(format!(
                "volume {}: a tier holds no replica of it",
                m.volume
            )));
        };
        if f.size() != m.size || s.size() != m.size {
            return Err(corrupt(format!(
                "map is for {} bytes; the fast tier holds {}, the slow tier {}",
                m.size,
                f.size(),
                s.size()
            )));
        }
        let r = TieredReplica::new(m, f, s, Arc::downgrade(&self.shared));
        r.reclaim()?;
        self.shared
            .fast_used
            .fetch_add(r.count(Tier::Fast), Ordering::AcqRel);
        Ok(Arc::new(r))
    }
}

fn map_path(dir: &Path, volume: u64) -> PathBuf {
    dir.join(format!("replica-{volume:016x}.tiers"))
}

impl Drop for TieredStore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(m) = self.mover.take() {
            let _ = m.join();
        }
    }
}

fn by_volume(
    all: Vec<Result<Arc<dyn Replica>, StoreError>>,
) -> (HashMap<u64, Arc<dyn Replica>>, Vec<StoreError>) {
    let mut ok = HashMap::new();
    let mut bad = Vec::new();
    for r in all {
        match r {
            Ok(r) => {
                ok.insert(r.volume(), r);
            }
            Err(e) => bad.push(e),
        }
    }
    (ok, bad)
}

impl Store for TieredStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Tiered
    }
    fn blocking(&self) -> bool {
        true
    }

    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        let path = self.map_path(volume);
        if path.exists() || self.replica(volume).is_some() {
            return Err(StoreError::Exists { volume });
        }
        // Orphans of a create or delete cut short would make the inner creates fail.
        let _ = self.fast.delete(volume);
        let _ = self.slow.delete(volume);
        let s = self.slow.create(volume, size)?;
        let f = match self.fast.create(volume, size) {
            Ok(f) => f,
            Err(e) => {
                let _ = self.slow.delete(volume);
                return Err(e);
            }
        };
        let extents = size.div_ceil(self.shared.cfg.extent);
        let m = TierMapFile {
            volume,
            size,
            extent: self.shared.cfg.extent,
            pin: Pin::Auto,
            tiers: vec![Tier::Slow; extents as usize],
        };
        let r = Arc::new(TieredReplica::new(m, f, s, Arc::downgrade(&self.shared)));
        if let Err(e) = r.persist() {
            let _ = self.fast.delete(volume);
            let _ = self.slow.delete(volume);
            return Err(e);
        }
        self.shared
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, r.clone());
        Ok(r)
    }

    /// The slow tier holds the whole replica; the fast tier takes room extent by extent, as
    /// the mover promotes them (it is thin whatever the volume asks).
    fn preallocate(&self, volume: u64) -> Result<(), StoreError> {
        self.slow.preallocate(volume)
    }

    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        let (mut fast, mut out) = by_volume(self.fast.open_all());
        let (mut slow, bad) = by_volume(self.slow.open_all());
        out.extend(bad);
        let mut out: Vec<Result<Arc<dyn Replica>, StoreError>> = out.into_iter().map(Err).collect();
        let mut maps: Vec<PathBuf> = std::fs::read_dir(&self.shared.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "tiers")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("replica-"))
            })
            .collect();
        maps.sort();
        for p in maps {
            let r = self.open_one(&p, &mut fast, &mut slow);
            if let Ok(r) = &r {
                self.shared
                    .replicas
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(r.volume, r.clone());
            }
            out.push(r.map(|r| r as Arc<dyn Replica>));
        }
        // Inner replicas without a map: a create or a delete cut short. Never served.
        for (volume, tier) in fast.keys().map(|v| (*v, &self.fast)).chain(
            slow.keys()
                .filter(|v| !fast.contains_key(v))
                .map(|v| (*v, &self.slow)),
        ) {
            tracing::warn!(volume, "tiers: removing a replica left without a map");
            let _ = tier.delete(volume);
            let _ = self.fast.delete(volume);
            let _ = self.slow.delete(volume);
        }
        out
    }

    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        let r = self
            .shared
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&volume);
        let path = self.map_path(volume);
        if r.is_none() && !path.exists() {
            return Err(StoreError::NoReplica { volume });
        }
        if let Some(r) = &r {
            r.retire();
        }
        // The map first: without it the replica no longer exists, and what is left of its
        // tiers is removed at the next open.
        std::fs::remove_file(&path).map_err(io(volume, "delete tier map"))?;
        File::open(&self.shared.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(volume, "sync store directory"))?;
        if let Some(r) = r {
            self.shared
                .fast_used
                .fetch_sub(r.count(Tier::Fast), Ordering::AcqRel);
        }
        let a = self.fast.delete(volume);
        let b = self.slow.delete(volume);
        for e in [a, b].into_iter().filter_map(Result::err) {
            if !matches!(e, StoreError::NoReplica { .. }) {
                tracing::warn!(
                    volume,
                    "tiers: deleting a tier's copy: {e} (removed at the next open)"
                );
            }
        }
        Ok(())
    }

    fn tiers(&self) -> Option<StoreTiers> {
        let s = &self.shared;
        Some(StoreTiers {
            fast_capacity: s.cfg.fast_capacity,
            fast_used: s.fast_used.load(Ordering::Acquire) * s.cfg.extent,
            extent: s.cfg.extent,
            migrate_rate: s.cfg.migrate_rate,
            migrated_bytes: s.migrated_bytes.load(Ordering::Relaxed),
            migrating_per_s: s.migrating.load(Ordering::Relaxed),
            slow_used: s
                .replicas
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|r| r.slow.allocated_bytes())
                .sum(),
            disk_model: self.disk.as_ref().map(|d| d.params().describe()),
        })
    }
}

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

const SLOW: u8 = 0;
const FAST: u8 = 1;

fn code(t: Tier) -> u8 {
    match t {
        Tier::Slow => SLOW,
        Tier::Fast => FAST,
    }
}

/// One replica over the two tiers.
#[derive(Debug)]
pub struct TieredReplica {
    volume: u64,
    size: u64,
    extent: u64,
    shift: u32,
    fast: Arc<dyn Replica>,
    slow: Arc<dyn Replica>,
    tiers: Vec<AtomicU8>,
    pin: AtomicU8,
    /// One per extent: I/O takes it shared, a move exclusive.
    locks: Vec<RwLock<()>>,
    heat: Heat,
    counters: Counters,
    map_path: PathBuf,
    dir: PathBuf,
    persist_lock: Mutex<()>,
    /// Deleted: the map must not be written again.
    retired: AtomicBool,
    /// A map switch could not be recorded either way: what the map on disk says is unknown,
    /// so the replica refuses all I/O until the node restarts (and its peers resync it).
    broken: AtomicBool,
    shared: Weak<Shared>,
}

impl TieredReplica {
    fn new(
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

    fn count(&self, t: Tier) -> u64 {
        (0..self.extents()).filter(|&e| self.tier(e) == t).count() as u64
    }

    fn range(&self, extent: u64) -> (u64, u64) {
        let off = extent << self.shift;
        (off, self.extent.min(self.size - off))
    }

    fn on(&self, t: Tier) -> &Arc<dyn Replica> {
        match t {
            Tier::Fast => &self.fast,
            Tier::Slow => &self.slow,
        }
    }

    fn snapshot(&self) -> TierMapFile {
        TierMapFile {
            volume: self.volume,
            size: self.size,
            extent: self.extent,
            pin: self.pin(),
            tiers: (0..self.extents()).map(|e| self.tier(e)).collect(),
        }
    }

    /// Writes the map from memory, atomically and durably.
    fn persist(&self) -> Result<(), StoreError> {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.retired.load(Ordering::Acquire) {
            return Err(StoreError::NoReplica {
                volume: self.volume,
            });
        }
        write_atomically(&self.map_path, &self.dir, &map::encode(&self.snapshot()))
            .map_err(io(self.volume, "persist tier map"))
    }

    fn retire(&self) {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.retired.store(true, Ordering::Release);
    }

    /// Frees every place the map does not point at: the stray copy of a move cut short before
    /// its switch, or the old place of one cut short after it.
    fn reclaim(&self) -> Result<(), StoreError> {
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

    fn check_usable(&self) -> Result<(), StoreError> {
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
    fn copy_and_switch(
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

#[cfg(test)]
mod tests;
