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
//! A resize ([`TieredReplica`]'s `resize_to`) lengthens or shortens both tiers and rewrites
//! the map: a grow lengthens the tiers first and names the new size in the map last, with I/O
//! and moves below the old end going on (it holds them only to add the new extents); a
//! shrink writes the map first and holds every extent throughout. Opening the store cuts a
//! tier longer than its map back to it. Grown extents start on the slow tier. So replicas
//! grow with their volume, and with the pool of a snapshotted replica (`versions`).
//!
//! Heat, the migration plan and the mover thread: [`heat`], [`mover`].

pub mod heat;
pub mod map;
mod mover;
mod replica;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::disk_model::{DiskModel, DiskParams, ModeledStore};
use crate::{FileStore, Replica, Store, StoreError, StoreKind};
pub use map::{Pin, Tier, TierMapFile};
pub use replica::{MoveStep, TieredReplica};

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
        if f.size() < m.size || s.size() < m.size {
            return Err(corrupt(format!(
                "map is for {} bytes; the fast tier holds {}, the slow tier {}",
                m.size,
                f.size(),
                s.size()
            )));
        }
        // A tier longer than the map: a grow cut short before the map named it, or a shrink
        // after (see `TieredReplica::resize_to`). The map is the replica's size.
        for t in [&f, &s] {
            if t.size() > m.size {
                tracing::info!(
                    volume = m.volume,
                    from = t.size(),
                    to = m.size,
                    "tiers: cutting a tier back to its map's size"
                );
                t.resize(m.size)?;
            }
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
        let persisted = r.persist(&r.ext());
        if let Err(e) = persisted {
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

#[cfg(test)]
mod tests;
