//! The file store: a data file per replica, opened with `O_DIRECT`, a pool file for what the
//! replica grew by, through the page cache, and a checksummed metadata file holding the
//! replica's size, epoch and allocation map.
//!
//! Files in the store's directory:
//! * `LOCK` — held with `flock` while a node uses the directory (two nodes never share one).
//! * `replica-<volume>.data` — the bytes: a sparse file that takes space as blocks are written
//!   (thin), or reserved whole with `fallocate` ([`Store::preallocate`], thick). Regions never
//!   written or trimmed read as zeros (holes, fresh extents or punched holes).
//! * `replica-<volume>.pool` — the bytes past the replica's size at creation (the snapshot
//!   pool under versions), written through the cache and behind; see `file/data.rs` for why and how.
//!   Replicas created before it existed have none.
//! * `replica-<volume>.meta` — [`crate::file::meta`] format, replaced atomically (write a temp
//!   file, fsync, rename, fsync the directory).

mod data;
pub mod meta;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::aligned::{align_down, align_up, with_scratch, AlignedBuf, ALIGN};
use crate::ledger::boot_id;
use crate::map::{whole_grains, AllocMap};
use crate::{check_range, Extent, Replica, Store, StoreError, StoreKind, GRAIN};
use meta::ReplicaMeta;

const STRIPES: usize = 64;
const ZERO_CHUNK: usize = 1 << 20;

#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    /// Never reserves a replica's space, even when asked (the fast tier of a tiered store,
    /// whose room is taken extent by extent).
    thin: bool,
    _lock: File,
    replicas: Mutex<HashMap<u64, Arc<FileReplica>>>,
}

#[derive(Debug)]
struct FileReplica {
    volume: u64,
    /// Changed only by `resize`, under `persist_lock` with the map.
    size: AtomicU64,
    data: data::Data,
    meta_path: PathBuf,
    dir: PathBuf,
    epoch: AtomicU64,
    map: AllocMap,
    map_dirty: AtomicBool,
    /// Replaced when a sync fails: the copy's history is unknown from then on.
    incarnation: AtomicU64,
    /// Set by `close`: the next persist records a clean shutdown.
    closed: AtomicBool,
    /// Opened after its last process died with it open ([`Replica::unclean_stop`]).
    unclean: AtomicBool,
    persist_lock: Mutex<()>,
    stripes: Vec<Mutex<()>>,
    ledger: Arc<crate::FileLedger>,
}

fn io(volume: u64, op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { volume, op, source }
}

/// How long opening a store waits for its directory's lock held by another process: a node
/// of the last `up`, killed, stops on its own (its parent's death sends it SIGTERM) and may
/// still be closing its replicas when the next `up` starts it again.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the store directory's lock (`LOCK`), waiting up to [`LOCK_WAIT`] for another process
/// to let it go.
fn lock_dir(lock: &std::fs::File, dir: &Path) -> Result<(), StoreError> {
    let t0 = std::time::Instant::now();
    let mut said = false;
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(StoreError::Io {
                volume: 0,
                op: "lock the store directory",
                source: e,
            });
        }
        if t0.elapsed() >= LOCK_WAIT {
            return Err(StoreError::Invalid(format!(
                "store directory {} is in use by another process (waited {} s for it to stop)",
                dir.display(),
                LOCK_WAIT.as_secs()
            )));
        }
        if !std::mem::replace(&mut said, true) {
            tracing::warn!(dir = %dir.display(), "waiting for another process to let the store directory go");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

impl FileStore {
    /// Opens (creating if needed) the store directory and locks it for this process.
    pub fn open(dir: &Path) -> Result<FileStore, StoreError> {
        FileStore::open_with(dir, false)
    }

    /// A store whose data files are sparse: a replica takes space only where it is written.
    pub fn open_thin(dir: &Path) -> Result<FileStore, StoreError> {
        FileStore::open_with(dir, true)
    }

    fn open_with(dir: &Path, thin: bool) -> Result<FileStore, StoreError> {
        crate::private::create_dir_all(dir).map_err(io(0, "create store directory"))?;
        let lock = crate::private::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(io(0, "open LOCK"))?;
        lock_dir(&lock, dir)?;
        Ok(FileStore {
            dir: dir.to_path_buf(),
            thin,
            _lock: lock,
            replicas: Mutex::default(),
        })
    }

    fn paths(&self, volume: u64) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("replica-{volume:016x}.data")),
            self.dir.join(format!("replica-{volume:016x}.meta")),
        )
    }

    fn open_replica(&self, meta_path: &Path) -> Result<Arc<FileReplica>, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt {
            path: meta_path.display().to_string(),
            what,
        };
        let bytes = std::fs::read(meta_path).map_err(|e| corrupt(e.to_string()))?;
        let m = meta::decode(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let (data_path, expect_meta) = self.paths(m.volume);
        if expect_meta != meta_path {
            return Err(corrupt(format!(
                "names volume {} in another file",
                m.volume
            )));
        }
        let data = open_data(&data_path, false).map_err(io(m.volume, "open data file"))?;
        let data = data::Data::open(data, &data_path).map_err(io(m.volume, "open pool file"))?;
        let len = data.len().map_err(io(m.volume, "stat data files"))?;
        if len > m.size {
            // A resize that did not finish: a grow lengthens the files before the metadata
            // says so, a shrink shortens them after. The metadata decides.
            tracing::warn!(
                volume = m.volume,
                "data (and pool) file of {len} bytes, metadata says {}: an unfinished resize, undone",
                m.size
            );
            data.set_len(m.size)
                .and_then(|()| data.sync_all())
                .map_err(io(m.volume, "undo an unfinished resize"))?;
        } else if len != m.size {
            return Err(corrupt(format!(
                "its data (and pool) file hold {len} bytes, metadata says {}",
                m.size
            )));
        }
        let mut map = AllocMap::from_bytes(m.size, m.grain, &m.map)
            .ok_or_else(|| corrupt("allocation map has the wrong length".into()))?;
        let boot_path = meta_path.with_extension("boot");
        let boot_now = boot_id();
        let mut incarnation = m.incarnation;
        if m.flags & meta::FLAG_OPEN != 0 {
            // The last process died without persisting the map: writes since its last flush may
            // be on disk but not in the map. The files say where they hold data (`rebuild_map`).
            map = rebuild_map(m.volume, m.size, m.grain, &data);
            // A process crash loses nothing written with O_DIRECT (the kernel and device have
            // it); a power loss or reboot may lose whatever was not flushed. So a replica that
            // was open in another boot is a new history: peers must not trust their record of
            // what it missed, and it gets a full (compare) resync.
            let same_boot = boot_now != crate::ledger::UNKNOWN_BOOT
                && std::fs::read_to_string(&boot_path).ok().as_deref() == Some(&boot_now);
            if !same_boot {
                incarnation = 0;
            }
            tracing::warn!(
                volume = m.volume,
                same_boot,
                allocated = map.allocated_grains() * m.grain,
                "replica was not shut down cleanly; its allocation map rebuilt from its files"
            );
        }
        if incarnation == 0 {
            incarnation = crate::new_incarnation();
        }
        crate::private::write(&boot_path, boot_now.as_bytes())
            .map_err(io(m.volume, "record boot id"))?;
        let r = Arc::new(FileReplica::new(
            m.volume,
            m.size,
            m.epoch,
            incarnation,
            data,
            meta_path,
            map,
        ));
        r.unclean
            .store(m.flags & meta::FLAG_OPEN != 0, Ordering::Release);
        // Record "open" before serving anything, so a crash from here on is noticed.
        r.persist()?;
        Ok(r)
    }
}

/// How long opening one replica after an unclean stop may spend asking its files where they
/// hold data; what is left is counted as allocated.
const REBUILD_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

/// The allocation map of a replica whose last process died, from its files (`SEEK_DATA`):
/// every grain holding data, so a read never skips bytes a write left, and none that holds
/// none, so space is not overstated for ever (issue 63: a node counted each copy at its full
/// size after any kill -9). Holes read as zeros, so a grain left out is never wrong. Past
/// [`REBUILD_BUDGET`], or on a file system that cannot say, the rest counts as allocated.
fn rebuild_map(volume: u64, size: u64, grain: u64, data: &data::Data) -> AllocMap {
    let t0 = std::time::Instant::now();
    let found = data.find_data(t0 + REBUILD_BUDGET);
    let map = AllocMap::new(size, grain);
    for &(o, l) in &found.ranges {
        map.set_range(o, l.min(size.saturating_sub(o)));
    }
    if let Some(from) = found.unknown_from {
        tracing::warn!(
            volume,
            from,
            took_ms = t0.elapsed().as_millis() as u64,
            "where the replica holds data is unknown past this offset (time ran out, or the file system cannot say): counted as allocated"
        );
        map.set_range(from, size.saturating_sub(from));
    }
    tracing::info!(
        volume,
        extents = found.ranges.len(),
        took_ms = t0.elapsed().as_millis() as u64,
        "allocation map rebuilt from the replica's files"
    );
    map
}

fn open_data(path: &Path, create: bool) -> std::io::Result<File> {
    let mut o = crate::private::options();
    o.read(true).write(true).create_new(create);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok(f),
        // Filesystems without O_DIRECT (tmpfs on old kernels) still work, through the cache.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(path = %path.display(), "O_DIRECT not supported; using buffered I/O");
            o.open(path)
        }
        Err(e) => Err(e),
    }
}

impl FileReplica {
    fn new(
        volume: u64,
        size: u64,
        epoch: u64,
        incarnation: u64,
        data: data::Data,
        meta_path: &Path,
        map: AllocMap,
    ) -> FileReplica {
        FileReplica {
            volume,
            size: AtomicU64::new(size),
            data,
            meta_path: meta_path.to_path_buf(),
            dir: meta_path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            epoch: AtomicU64::new(epoch),
            map,
            map_dirty: AtomicBool::new(false),
            incarnation: AtomicU64::new(incarnation),
            closed: AtomicBool::new(false),
            unclean: AtomicBool::new(false),
            persist_lock: Mutex::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            ledger: Arc::new(crate::FileLedger::new(
                meta_path.parent().unwrap_or_else(|| Path::new(".")),
                volume,
            )),
        }
    }

    fn persist(&self) -> Result<(), StoreError> {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.persist_locked()
    }

    /// [`FileReplica::persist`], with `persist_lock` held by the caller.
    fn persist_locked(&self) -> Result<(), StoreError> {
        let m = ReplicaMeta {
            volume: self.volume,
            size: self.size.load(Ordering::Acquire),
            grain: self.map.grain(),
            epoch: self.epoch.load(Ordering::Acquire),
            flags: if self.closed.load(Ordering::Acquire) {
                0
            } else {
                meta::FLAG_OPEN
            },
            incarnation: self.incarnation.load(Ordering::Acquire),
            map: self.map.to_bytes(),
        };
        write_atomically(&self.meta_path, &self.dir, &meta::encode(&m))
            .map_err(io(self.volume, "persist metadata"))
    }

    /// A sync failed: which of the writes since the last good one reached the device is
    /// unknown, whatever the kernel says next (a failed `fdatasync` may drop dirty pages and
    /// report success the next time). The copy takes a new incarnation, so no peer's record of
    /// what it missed is trusted again: its next resync compares everything.
    fn lose_history(&self, e: StoreError) -> StoreError {
        let new = crate::new_incarnation();
        let old = self.incarnation.swap(new, Ordering::AcqRel);
        tracing::error!(
            volume = self.volume,
            old,
            new,
            "{e}: the replica's history is now unknown"
        );
        if let Err(p) = self.persist() {
            tracing::error!(volume = self.volume, "recording the new incarnation: {p}");
        }
        e
    }

    fn stripe(&self, block: u64) -> usize {
        (block / ALIGN as u64) as usize % STRIPES
    }

    /// Locks the stripes of a write's partial edge blocks, in a fixed order (no deadlock).
    fn lock_edges(&self, a: Option<u64>, b: Option<u64>) -> [Option<MutexGuard<'_, ()>>; 2] {
        let mut s: Vec<usize> = [a, b]
            .into_iter()
            .flatten()
            .map(|x| self.stripe(x))
            .collect();
        s.sort_unstable();
        s.dedup();
        let mut it = s
            .into_iter()
            .map(|i| self.stripes[i].lock().unwrap_or_else(|e| e.into_inner()));
        [it.next(), it.next()]
    }

    fn punch(&self, offset: u64, len: u64) -> Result<(), StoreError> {
        let punched = self.data.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        );
        if punched.is_ok() {
            return Ok(());
        }
        // No hole punching here: write real zeros so the bytes still read as zeros.
        let zeros = AlignedBuf::new(ZERO_CHUNK.min(len as usize));
        let mut pos = offset;
        while pos < offset + len {
            let n = (offset + len - pos).min(zeros.len() as u64) as usize;
            self.data
                .write_all_at(&zeros[..n], pos)
                .map_err(io(self.volume, "write zeros"))?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Zeroes `[offset, offset+len)`, a range within fewer than one whole grain's worth at
    /// each end of a trim. With `may_trim`, its whole 4 KiB blocks in allocated grains are
    /// punched, so their space is free again, and only the part blocks at either end are
    /// written. The grains stay allocated in the map: their other blocks may hold data, and
    /// a write to one of them may be under way (the map overstates, never understates).
    /// Without it (or where punching is not supported), zeros are written.
    ///
    /// A parity volume's fold-backs trim scattered overlay blocks: written as zeros, each
    /// stayed allocated, and under random writes its copies grew past a 3-way mirror's.
    fn zero_part(&self, offset: u64, len: u64, may_trim: bool) -> Result<(), StoreError> {
        let (a, b) = (align_up(offset), align_down(offset + len));
        if !may_trim || a >= b {
            return self.zero_allocated(offset, len);
        }
        self.zero_allocated(offset, a - offset)?;
        for g in a / GRAIN..b.div_ceil(GRAIN) {
            if self.map.is_set(g) {
                let (s, e) = ((g * GRAIN).max(a), ((g + 1) * GRAIN).min(b));
                self.punch(s, e - s)?;
            }
        }
        self.zero_allocated(b, offset + len - b)
    }

    /// Writes zeros over the allocated grains of `[offset, offset+len)`; holes already read zero.
    fn zero_allocated(&self, offset: u64, len: u64) -> Result<(), StoreError> {
        let zeros = vec![0u8; ZERO_CHUNK.min(len as usize)];
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let g = pos / GRAIN;
            let next = ((g + 1) * GRAIN).min(end).min(pos + zeros.len() as u64);
            if self.map.is_set(g) {
                self.write(pos, &zeros[..(next - pos) as usize], false)?;
            }
            pos = next;
        }
        Ok(())
    }
}

/// Replaces the file at `path` (in directory `dir`) with `bytes` so that a crash leaves the old
/// or the new content, never a mix: a temporary file beside it (`<name>.tmp`), fsync, rename,
/// fsync of the directory.
pub(crate) fn write_atomically(path: &Path, dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let f = crate::private::create(&tmp)?;
        f.write_all_at(bytes, 0)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

impl Store for FileStore {
    fn kind(&self) -> StoreKind {
        StoreKind::File
    }
    fn blocking(&self) -> bool {
        true
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        if size == 0 || !size.is_multiple_of(ALIGN as u64) {
            return Err(StoreError::Invalid(format!(
                "replica size {size} must be a non-zero multiple of {ALIGN}"
            )));
        }
        let mut reps = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        let (data_path, meta_path) = self.paths(volume);
        if reps.contains_key(&volume) || meta_path.exists() {
            return Err(StoreError::Exists { volume });
        }
        let data = open_data(&data_path, true).map_err(io(volume, "create data file"))?;
        // Sparse: space is taken as blocks are written (`preallocate` reserves it all).
        data.set_len(size).map_err(io(volume, "size data file"))?;
        data.sync_all().map_err(io(volume, "sync data file"))?;
        let data =
            data::Data::create(data, &data_path, size).map_err(io(volume, "create pool file"))?;
        // A new history: bookkeeping left by an earlier replica of this volume id is not its.
        crate::FileLedger::remove(&self.dir, volume);
        let r = Arc::new(FileReplica::new(
            volume,
            size,
            0,
            crate::new_incarnation(),
            data,
            &meta_path,
            AllocMap::new(size, GRAIN),
        ));
        crate::private::write(&meta_path.with_extension("boot"), boot_id().as_bytes())
            .map_err(io(volume, "record boot id"))?;
        r.persist()?;
        reps.insert(volume, r.clone());
        Ok(r)
    }

    fn preallocate(&self, volume: u64) -> Result<(), StoreError> {
        let r = self
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
            .ok_or(StoreError::NoReplica { volume })?;
        if self.thin {
            return Ok(());
        }
        // Mode 0 allocates the holes and keeps every byte already written.
        if let Err(err) = r.data.fallocate(0, 0, r.size.load(Ordering::Acquire)) {
            return Err(match err.raw_os_error() {
                Some(libc::ENOSPC) => StoreError::NoSpace {
                    size: r.size.load(Ordering::Acquire),
                    what: format!(
                        "the file system of {} cannot reserve {}: {err}",
                        self.dir.display(),
                        trireme_proto::human(r.size.load(Ordering::Acquire))
                    ),
                },
                // A file system without fallocate: the replica stays thin, and says so.
                Some(libc::EOPNOTSUPP) => StoreError::Invalid(format!(
                    "the file system of {} cannot reserve space (fallocate: {err}); create the volume without --preallocate",
                    self.dir.display()
                )),
                _ => StoreError::Io {
                    volume,
                    op: "preallocate",
                    source: err,
                },
            });
        }
        r.data.sync_all().map_err(io(volume, "sync data file"))
    }

    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        let mut metas: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "meta")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("replica-"))
            })
            .collect();
        metas.sort();
        let mut reps = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        for p in metas {
            out.push(self.open_replica(&p).map(|r| {
                reps.insert(r.volume, r.clone());
                r as Arc<dyn Replica>
            }));
        }
        out
    }

    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        let mut reps = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        let (data_path, meta_path) = self.paths(volume);
        if reps.remove(&volume).is_none() && !meta_path.exists() {
            return Err(StoreError::NoReplica { volume });
        }
        // Metadata first: a crash in between leaves an orphan data file, never a replica
        // without its bytes.
        std::fs::remove_file(&meta_path).map_err(io(volume, "delete metadata"))?;
        let _ = std::fs::remove_file(data::pool_path(&data_path));
        let _ = std::fs::remove_file(&data_path);
        let _ = std::fs::remove_file(meta_path.with_extension("boot"));
        crate::FileLedger::remove(&self.dir, volume);
        // Durable before the node answers: a deleted replica must not reappear after a power
        // loss (its node would serve a copy the metadata no longer lists).
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(volume, "sync store directory"))
    }
}

impl Replica for FileReplica {
    fn reserve(&self, offset: u64, len: u64) {
        // This allocates the holes (as unwritten extents: they still read zeros) and keeps
        // every byte already written. An O_DIRECT write into a hole allocates under the
        // file's exclusive lock; into an allocated extent, it shares the lock. A range whose
        // grains were all written has no hole: no call, which would take the file's lock
        // exclusive (and stall the reads and writes sharing it) to find that out.
        if self.map.all_set(offset, len) {
            return;
        }
        if let Err(e) = self.data.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, len) {
            tracing::debug!(volume = self.volume, offset, len, "reserving space: {e}");
        }
    }
    fn hole(&self, offset: u64, len: u64) -> bool {
        !self.map.any_set(offset, len)
    }
    fn volume(&self) -> u64 {
        self.volume
    }
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        self.epoch.store(epoch, Ordering::Release);
        self.persist()
    }
    fn allocated_bytes(&self) -> u64 {
        self.map.allocated_grains() * self.map.grain()
    }
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        crate::check_size(size)?;
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.size.load(Ordering::Acquire);
        if size == old {
            return Ok(());
        }
        let resize_data = |len: u64| {
            self.data
                .set_len(len)
                .and_then(|()| self.data.sync_all())
                .map_err(io(self.volume, "resize data file"))
        };
        // A crash at any step leaves the old size or the new (see `open_replica`): a grow
        // lengthens the files first, a shrink shortens them last (`data.rs` says in which
        // order). New bytes are a hole.
        if size > old {
            resize_data(size)?;
        }
        self.map.resize(size);
        self.size.store(size, Ordering::Release);
        if let Err(e) = self.persist_locked() {
            self.map.resize(old);
            self.size.store(old, Ordering::Release);
            return Err(e);
        }
        if size < old {
            resize_data(size)?;
        }
        Ok(())
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        if len == 0 {
            return Ok(());
        }
        let any_data = (offset / GRAIN..=(offset + len - 1) / GRAIN).any(|g| self.map.is_set(g));
        if !any_data {
            buf.fill(0);
            return Ok(());
        }
        // Holes inside the range read as zeros from the file itself (fresh or punched extents).
        let (a0, a1) = (align_down(offset), align_up(offset + len));
        with_scratch((a1 - a0) as usize, |tmp| {
            self.data
                .read_exact_at(&mut tmp[..(a1 - a0) as usize], a0)
                .map_err(io(self.volume, "read"))?;
            let at = (offset - a0) as usize;
            buf.copy_from_slice(&tmp[at..at + buf.len()]);
            Ok(())
        })
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        let len = data.len() as u64;
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        if len == 0 {
            return Ok(());
        }
        let (a0, a1) = (align_down(offset), align_up(offset + len));
        let span = (a1 - a0) as usize;
        let last = a1 - ALIGN as u64;
        let head = offset != a0;
        let tail = offset + len != a1;
        with_scratch(span, |tmp| {
            // Partial blocks are read-modify-written under their stripe lock, so two writes to
            // different sectors of one block never lose each other's bytes. Every byte of the
            // span is overwritten below (edge blocks by the read, the rest by the data), so
            // whatever the scratch buffer held never reaches the file.
            let _g = self.lock_edges(head.then_some(a0), tail.then_some(last));
            if head {
                self.data
                    .read_exact_at(&mut tmp[..ALIGN], a0)
                    .map_err(io(self.volume, "read for partial write"))?;
            }
            if tail && (last != a0 || !head) {
                self.data
                    .read_exact_at(&mut tmp[span - ALIGN..span], last)
                    .map_err(io(self.volume, "read for partial write"))?;
            }
            let at = (offset - a0) as usize;
            tmp[at..at + data.len()].copy_from_slice(data);
            self.data
                .write_all_at(&tmp[..span], a0)
                .map_err(io(self.volume, "write"))
        })?;
        if self.map.set_range(offset, len) {
            self.map_dirty.store(true, Ordering::Release);
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        if len == 0 {
            return Ok(());
        }
        let whole = if may_trim {
            whole_grains(offset, len, GRAIN)
        } else {
            0..0
        };
        if !whole.is_empty() {
            for g in whole.clone() {
                if self.map.clear(g) {
                    self.map_dirty.store(true, Ordering::Release);
                }
            }
            let (s, e) = (
                whole.start * GRAIN,
                (whole.end * GRAIN).min(self.size.load(Ordering::Acquire)),
            );
            self.punch(s, e - s)?;
            self.zero_part(offset, s - offset, may_trim)?;
            self.zero_part(e, offset + len - e, may_trim)?;
        } else {
            self.zero_part(offset, len, may_trim)?;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        if let Err(e) = self.data.sync_data() {
            return Err(self.lose_history(io(self.volume, "flush")(e)));
        }
        if self.map_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.persist() {
                self.map_dirty.store(true, Ordering::Release);
                return Err(self.lose_history(e));
            }
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        Ok(self.map.extents(offset, len))
    }
    fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }
    fn ledger(&self) -> Option<Arc<dyn crate::Ledger>> {
        Some(self.ledger.clone())
    }
    fn unclean_stop(&self) -> bool {
        self.unclean.load(Ordering::Acquire)
    }
    fn close(&self) -> Result<(), StoreError> {
        self.data.sync_data().map_err(io(self.volume, "flush"))?;
        self.closed.store(true, Ordering::Release);
        self.map_dirty.store(false, Ordering::Release);
        self.persist()
    }
}
