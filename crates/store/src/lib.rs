//! Local replica stores: where a node keeps the bytes of the replicas it holds.
//!
//! A [`Store`] owns a node's replicas; a [`Replica`] is one volume's copy on this node. Four
//! backends exist, each behind the same two traits:
//!
//! * `null` — discards writes, reads zeros (the dm-zero of the DRBD measurements): it isolates
//!   the network and protocol cost.
//! * `memory` — bytes in RAM, thin: a grain is allocated on first write. Lost on restart.
//! * `file` — one preallocated data file per replica opened with `O_DIRECT`, plus a checksummed
//!   metadata file with the replica's epoch and allocation map. Survives restarts.
//! * `tiered` — a fast tier (flash) and a slow tier (disk, or the [`disk_model`] of one), each
//!   a file store; every extent lives in one of them and migrates by heat or by pin
//!   ([`tiered`]).
//!
//! Concurrency: every method may be called from many threads at once. Writes to disjoint byte
//! ranges never interfere, even inside one 4 KiB block; overlapping in-flight requests land in
//! some order (NBD gives no order between them either). Methods of a store whose
//! [`Store::blocking`] is true do device I/O and must run on a blocking thread.
//!
//! Durability: a write is durable once `flush` returns (or at once with `fua`). The allocation
//! map and epoch are persisted with it. `set_epoch` is durable when it returns.
//!
//! Adding a backend: implement [`Store`] and [`Replica`], add a variant to [`StoreKind`] and a
//! line to [`open_store`], and run the shared conformance tests in `tests.rs` against it.
//! API version: [`STORE_API_VERSION`].

pub mod aligned;
pub mod backing;
pub mod disk_model;
pub mod faulty;
mod file;
pub mod filter;
pub mod held;
pub mod ledger;
mod map;
mod memory;
mod null;
pub mod private;
pub mod sealed;
pub mod tiered;
pub mod versions;

pub use backing::{BackedStore, BackingInfo};
pub use faulty::FaultyStore;
pub use file::meta as file_meta;
pub use file::FileStore;
pub use ledger::{FileLedger, Ledger};
pub use map::{extents_from, AllocMap};
pub use memory::MemoryStore;
pub use null::NullStore;
pub use sealed::SealedStore;
pub use tiered::{Pin, ReplicaTiers, StoreTiers, Tier, TierConfig, TierHint, TieredStore};
pub use trireme_proto::Extent;
pub use versions::VersionedStore;

use std::path::Path;
use std::sync::Arc;

/// Version of the traits in this crate; bump it when they change.
pub const STORE_API_VERSION: u32 = 2;
/// Allocation granule: the unit of thin provisioning and of `base:allocation` holes.
pub const GRAIN: u64 = 64 * 1024;
/// Largest single read or write a store is asked to do (the wire's payload limit).
pub const MAX_IO: u64 = trireme_proto::MAX_PAYLOAD as u64;

/// Errors of a store. The message names the replica and the operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No replica of that volume on this node.
    #[error("no replica of volume {volume}")]
    NoReplica { volume: u64 },
    /// The replica already exists.
    #[error("replica of volume {volume} already exists")]
    Exists { volume: u64 },
    /// `[offset, offset+len)` is not inside the replica.
    #[error("range {offset}+{len} outside replica of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// The device failed.
    #[error("{op} on replica {volume}: {source}")]
    Io {
        volume: u64,
        op: &'static str,
        source: std::io::Error,
    },
    /// Metadata on disk failed its checks; the replica is not served.
    #[error("replica metadata {path}: {what}")]
    Corrupt { path: String, what: String },
    /// Not enough space (or memory) for the replica.
    #[error("no space for a replica of {}: {what}", trireme_proto::human(*size))]
    NoSpace { size: u64, what: String },
    /// The request is invalid (e.g. a zero-size replica).
    #[error("invalid: {0}")]
    Invalid(String),
    /// No snapshot `id` of the volume here.
    #[error("replica {volume} has no snapshot {id}")]
    NoSnapshot { volume: u64, id: u64 },
    /// A snapshot `id` of the volume exists already.
    #[error("replica {volume} already has a snapshot {id}")]
    SnapshotExists { volume: u64, id: u64 },
    /// A block's bytes do not match its checksum: this copy is bad there.
    #[error("replica {volume}: block at {offset} fails its checksum")]
    BadBlock { volume: u64, offset: u64 },
}

/// Blocks a replica found failing their checksums ([`Replica::bad_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BadBlocks {
    /// Reads that met one, since the process opened the replica.
    pub seen: u64,
    /// The offset of the last one.
    pub last_offset: u64,
}

/// Which backend a store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Null,
    Memory,
    File,
    Tiered,
}

impl StoreKind {
    pub fn parse(s: &str) -> Option<StoreKind> {
        match s {
            "null" => Some(StoreKind::Null),
            "memory" => Some(StoreKind::Memory),
            "file" => Some(StoreKind::File),
            "tiered" => Some(StoreKind::Tiered),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Null => "null",
            StoreKind::Memory => "memory",
            StoreKind::File => "file",
            StoreKind::Tiered => "tiered",
        }
    }
    /// True if the store keeps nothing across a restart.
    pub fn volatile(self) -> bool {
        !matches!(self, StoreKind::File | StoreKind::Tiered)
    }
}

/// A node's collection of replicas.
pub trait Store: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> StoreKind;
    /// True if methods do device I/O and must not run on an async executor thread.
    fn blocking(&self) -> bool;
    /// Creates an empty (all-zero, all-hole) replica of `size` bytes. It is thin: a store that
    /// keeps it on a device takes space only as blocks are written.
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError>;
    /// Reserves the device space of the whole replica of `volume` now (a thick replica: writes
    /// never find its device full), keeping every byte it holds; `NoSpace` if the device
    /// cannot. Nothing to do for a store whose space is not taken on write (memory, null).
    fn preallocate(&self, volume: u64) -> Result<(), StoreError>;
    /// Every replica found on the device; a replica that fails its checks is returned as an
    /// error and the rest still open.
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>>;
    /// Deletes a replica and its bytes.
    fn delete(&self, volume: u64) -> Result<(), StoreError>;
    /// The node's tiers, for a store that has them.
    fn tiers(&self) -> Option<StoreTiers> {
        None
    }
}

/// One volume's copy on this node. See the crate docs for concurrency and durability.
pub trait Replica: Send + Sync + std::fmt::Debug {
    fn volume(&self) -> u64;
    fn size(&self) -> u64;
    /// The newest writer epoch this replica has accepted.
    fn epoch(&self) -> u64;
    /// Records a new writer epoch durably.
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError>;
    /// Bytes in allocated grains.
    fn allocated_bytes(&self) -> u64;
    /// Makes the replica `size` bytes (a non-zero multiple of 4 KiB): bytes past the old end
    /// read as zeros, bytes past a smaller end are dropped. Durable when it returns; a crash
    /// meanwhile leaves the old size or the new. The caller keeps I/O to the replica out
    /// while it shrinks; while it grows, I/O below the old end may go on (the versions' pool
    /// grows ahead of its redirects so), and none may come past it before it returns.
    fn resize(&self, size: u64) -> Result<(), StoreError>;
    /// A hint: writes into `[offset, offset+len)` come soon. A store whose first write to a
    /// region allocates (a sparse file) may allocate it now, so those writes find it ready;
    /// what the bytes read stays as it was. No error: a store that cannot just does not.
    fn reserve(&self, _offset: u64, _len: u64) {}
    /// Whether `[offset, offset+len)` is a hole: no grain touching it holds anything on disk,
    /// so all of it reads as zeros. A store that cannot tell says false.
    fn hole(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError>;
    /// Zeros `[offset, offset+len)`. With `may_trim`, whole grains are deallocated (holes).
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError>;
    fn flush(&self) -> Result<(), StoreError>;
    /// Allocation extents covering exactly `[offset, offset+len)`.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError>;
    /// Names this replica's history: fixed for the replica's life, different for a replica
    /// re-created (or wiped) since. Peers compare it before trusting their record of what this
    /// replica missed.
    fn incarnation(&self) -> u64;
    /// Flushes and records a clean shutdown (the process is about to exit).
    fn close(&self) -> Result<(), StoreError> {
        self.flush()
    }
    /// Where the node keeps this replica's bookkeeping durably (`ledger.rs`); `None` for a
    /// volatile store, whose bookkeeping lives and dies with the process.
    fn ledger(&self) -> Option<Arc<dyn Ledger>> {
        None
    }
    /// After an unclean stop, called once before anything is served: every write since the
    /// last clean state lies in the byte ranges `suspect` (the node's activity log on disk),
    /// so per-block checksums kept from before the stop still hold everywhere else. A store
    /// that dropped them may take them back outside `suspect`. Never called: they stay
    /// dropped.
    fn recover_seals(&self, _suspect: &[(u64, u64)]) {}
    /// True when this process opened the replica after an unclean stop (its last process died
    /// with it open): what it holds is unverified until a scrub has compared it (issue 63).
    fn unclean_stop(&self) -> bool {
        false
    }
    /// Reads (and checksums) that met a block failing its checksum since the process opened
    /// the replica, and the offset of the last such block.
    fn bad_blocks(&self) -> BadBlocks {
        BadBlocks::default()
    }
    /// Where this replica's extents live, for a store with tiers.
    fn tiers(&self) -> Option<ReplicaTiers> {
        None
    }
    /// For a store with tiers: where a read of `[offset, offset+len)` would be served from,
    /// and whether it would heat its extents (asked just before the read; a hint).
    fn tier_of(&self, _offset: u64, _len: u64) -> Option<TierHint> {
        None
    }
    /// Heat another copy saw at `offset` (its reads), for a store with tiers.
    fn add_heat(&self, _offset: u64, _count: u32) {}
    /// Pins the replica's extents to a tier, or lets heat place them (`Pin::Auto`).
    fn set_pin(&self, _pin: Pin) -> Result<(), StoreError> {
        Err(StoreError::Invalid(
            "this store has no tiers (start the node with --store tiered)".into(),
        ))
    }

    // Versions (`versions`): a store that keeps them wraps the others in a `VersionedStore`.
    /// Takes snapshot `id` of what the replica holds now: every write that returned before
    /// the call, none that started after it returned. Durable when it returns. `created` is
    /// kept as given (seconds since the Unix epoch).
    fn snapshot(&self, _id: u64, _created: u64) -> Result<(), StoreError> {
        Err(no_versions())
    }
    /// As [`Replica::snapshot`], but durable only from the replica's next flush: a restart
    /// before it (a process crash or a power loss) drops the snapshot. For a writer that
    /// pauses I/O while the snapshot is taken and flushes once I/O goes on again.
    fn snapshot_unsynced(&self, id: u64, created: u64) -> Result<(), StoreError> {
        self.snapshot(id, created)
    }
    /// The replica's snapshots, oldest first.
    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        Ok(Vec::new())
    }
    /// Deletes snapshot `id`, freeing the blocks only it held. Durable when it returns.
    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        Err(StoreError::NoSnapshot {
            volume: self.volume(),
            id,
        })
    }
    /// Makes the replica hold what snapshot `id` holds (the snapshot stays). Durable when it
    /// returns. The caller keeps I/O out while it runs.
    fn rollback(&self, id: u64) -> Result<(), StoreError> {
        Err(StoreError::NoSnapshot {
            volume: self.volume(),
            id,
        })
    }
    /// Reads snapshot `id`.
    fn read_snapshot(&self, id: u64, _offset: u64, _buf: &mut [u8]) -> Result<(), StoreError> {
        Err(StoreError::NoSnapshot {
            volume: self.volume(),
            id,
        })
    }
    /// Allocation extents of snapshot `id` covering exactly `[offset, offset+len)`.
    fn snapshot_status(&self, id: u64, _offset: u64, _len: u64) -> Result<Vec<Extent>, StoreError> {
        Err(StoreError::NoSnapshot {
            volume: self.volume(),
            id,
        })
    }
    /// The byte ranges of `[offset, offset+len)`, in order and merged, where version `to` (a
    /// snapshot, or the replica now for `None`) may differ from snapshot `from`: blocks
    /// written or trimmed in between, at 4 KiB granularity.
    fn changed(
        &self,
        from: u64,
        _to: Option<u64>,
        _offset: u64,
        _len: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        Err(StoreError::NoSnapshot {
            volume: self.volume(),
            id: from,
        })
    }

    // Clones (`backing`): a store that has them wraps the others in a `BackedStore`.
    /// For a clone's copy: the parent snapshot its blocks not yet written read from.
    fn backing(&self) -> Option<BackingInfo> {
        None
    }
    /// Makes this fresh, never written replica a clone of snapshot `snapshot` of `parent` (a
    /// replica on this node): every block reads the parent's until written. Durable when it
    /// returns.
    fn set_backing(&self, _parent: Arc<dyn Replica>, _snapshot: u64) -> Result<(), StoreError> {
        Err(no_clones())
    }
    /// Gives a clone found at start its parent's replica, once the node has opened it.
    fn link_backing(&self, _parent: Arc<dyn Replica>) -> Result<(), StoreError> {
        Err(no_clones())
    }
    /// Copies every block a clone still reads from its parent into it, then forgets the
    /// parent. Durable when it returns; I/O may go on meanwhile. Nothing to do for a replica
    /// that is no clone.
    fn flatten(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// One snapshot of a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: u64,
    /// Seconds since the Unix epoch, as given when it was taken.
    pub created: u64,
    /// Bytes only this snapshot holds: what deleting it frees.
    pub exclusive_bytes: u64,
    /// Its size in bytes: the replica's when it was taken.
    pub size: u64,
}

fn no_clones() -> StoreError {
    StoreError::Invalid("this store keeps no clones".into())
}

fn no_versions() -> StoreError {
    StoreError::Invalid("this store keeps no snapshots".into())
}

/// A fresh random incarnation (never 0, which means "unknown").
pub fn new_incarnation() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let v = match random {
        Ok(()) => u64::from_le_bytes(b),
        // No /dev/urandom: time and pid still differ between two creations.
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ (u64::from(std::process::id()) << 32)
        }
    };
    v.max(1)
}

/// Checks `[offset, offset+len)` lies inside `size`, without overflow.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<(), StoreError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(StoreError::OutOfRange { offset, len, size }),
    }
}

/// A replica's size must be a non-zero multiple of 4 KiB.
pub fn check_size(size: u64) -> Result<(), StoreError> {
    match size > 0 && size.is_multiple_of(4096) {
        true => Ok(()),
        false => Err(StoreError::Invalid(format!(
            "replica size {size} must be a non-zero multiple of 4096"
        ))),
    }
}

/// Opens the store of `kind`; `dir` is used by the file and tiered stores, `tiers` by the
/// tiered store (which refuses to open without it).
pub fn open_store(
    kind: StoreKind,
    dir: &Path,
    tiers: Option<TierConfig>,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match kind {
        StoreKind::Null => Arc::new(NullStore::default()),
        StoreKind::Memory => Arc::new(MemoryStore::default()),
        StoreKind::File => Arc::new(FileStore::open(dir)?),
        StoreKind::Tiered => {
            let cfg = tiers.ok_or_else(|| {
                StoreError::Invalid("a tiered store needs its fast tier's size".into())
            })?;
            Arc::new(TieredStore::open(dir, cfg)?)
        }
    })
}

/// The size of the file system holding `dir` and the bytes of it free to an unprivileged
/// writer (`statvfs`: blocks times fragment size; available, not free, blocks).
pub fn fs_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: a plain C struct of integers, for which all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct we pass; `c` is a valid C string.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frag = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * frag, st.f_bavail as u64 * frag))
}

#[cfg(test)]
mod tests;
