//! Versions of a replica: snapshots and rollback by redirect-on-write, over any store.
//!
//! A [`VersionedStore`] wraps a store; each of its replicas keeps the versions of the replica
//! it wraps (the *physical* replica) in a [`table::Table`]: per version, where each 4 KiB block
//! lives. Until the first snapshot the table is the identity and every call passes straight
//! through (the cost is one shared lock). After one, a write to a block a snapshot holds goes
//! to a fresh block past the replica's logical end (the *pool*, grown in steps with
//! `Replica::resize` of the physical replica), and the head's map records it; reads look up one
//! entry per block whatever the number of snapshots. Because the layers below see physical
//! blocks, the seals of a `SealedStore` underneath follow the blocks.
//!
//! **Durability.** With a directory, the maps persist in the files of [`format`]: the head's
//! changes at the next flush (after the physical replica's flush, so a map never names a block
//! whose bytes are not durable), a snapshot, delete or rollback before it returns. A crash
//! keeps every flushed write and every snapshot: blocks a change freed are taken again only
//! after the change is durable, and with no I/O in flight. Without a directory (a volatile
//! store) the versions live as long as the process, like the bytes.
//!
//! **Limits.** A replica whose blocks a snapshot moved cannot be resized (until its head is
//! folded back: not built); a replica on a tiered store takes no snapshot (its physical
//! replica does not grow).

pub mod format;
pub mod table;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::{check_range, Extent, Replica, SnapshotInfo, Store, StoreError, GRAIN};
use table::{entry, Map, Place, Table, VersionError, BLOCK, ZERO};

/// The pool grows by at least this much, and by a sixteenth of the replica beyond it.
const GROW_MIN: u64 = 64 << 20;
/// Locks over blocks being redirected, so that two writes to parts of one block keep both.
const STRIPES: usize = 64;
/// Freed blocks waiting past this many make a flush wait for I/O to pause to reuse them.
const SETTLE_AT: usize = 4096;
/// Zeros written at once for a zeroing that must stay allocated.
const ZERO_CHUNK: usize = 1 << 20;

/// A store whose replicas keep versions (see the module docs).
#[derive(Debug)]
pub struct VersionedStore {
    inner: Arc<dyn Store>,
    /// Where versions persist; `None` keeps them in memory (a volatile store).
    dir: Option<PathBuf>,
}

impl VersionedStore {
    pub fn new(inner: Arc<dyn Store>, dir: Option<&Path>) -> VersionedStore {
        VersionedStore {
            inner,
            dir: dir.map(Path::to_path_buf),
        }
    }

    fn files(&self, volume: u64) -> Option<Files> {
        self.dir.as_ref().map(|d| Files {
            dir: d.clone(),
            volume,
        })
    }

    fn wrap(&self, r: Arc<dyn Replica>, fresh: bool) -> Result<Arc<dyn Replica>, StoreError> {
        let files = self.files(r.volume());
        let phys_blocks = r.size() / BLOCK;
        let (size, table) = match &files {
            Some(f) if fresh => {
                f.remove_all();
                (r.size(), Table::new(phys_blocks, phys_blocks))
            }
            Some(f) => match f.load(r.size())? {
                Some((size, table, open)) => {
                    if open {
                        // The process died holding it: the head's map of its last moments
                        // (redirects since the last flush) is gone while the writes it
                        // acknowledged are on disk. Peers must not trust their record of what
                        // this copy missed: its next resync compares everything.
                        tracing::warn!(
                            volume = r.volume(),
                            "versions were not closed cleanly: the copy's history is unknown"
                        );
                        r.forget_history()?;
                    }
                    (size, table)
                }
                None => (r.size(), Table::new(phys_blocks, phys_blocks)),
            },
            None => (r.size(), Table::new(phys_blocks, phys_blocks)),
        };
        let r = Arc::new(VersionedReplica {
            plain: AtomicBool::new(table.is_identity()),
            size: AtomicU64::new(size),
            table: Mutex::new(table),
            inner: r,
            files,
            gate: RwLock::new(()),
            dirty: AtomicBool::new(false),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            persist: Mutex::new(()),
            closed: AtomicBool::new(false),
        });
        // Marked open before anything is served, so a crash from here on is noticed.
        if !r.plain.load(Ordering::Acquire) {
            r.persist_main()?;
        }
        Ok(r)
    }
}

impl crate::filter::StoreFilter for VersionedStore {
    fn next(&self) -> &dyn Store {
        &*self.inner
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        let r = self.inner.create(volume, size)?;
        self.wrap(r, true)
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.inner
            .open_all()
            .into_iter()
            .map(|r| r.and_then(|r| self.wrap(r, false)))
            .collect()
    }
    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        self.inner.delete(volume)?;
        if let Some(f) = self.files(volume) {
            f.remove_all();
        }
        Ok(())
    }
}

/// A replica's version files.
#[derive(Debug)]
struct Files {
    dir: PathBuf,
    volume: u64,
}

impl Files {
    fn prefix(&self) -> String {
        format!("replica-{:016x}.", self.volume)
    }
    fn main(&self) -> PathBuf {
        self.dir.join(format!("{}versions", self.prefix()))
    }
    fn snap(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{}snap-{id:016x}", self.prefix()))
    }

    /// Every snapshot file of the replica, by id.
    fn snap_files(&self) -> Vec<(u64, PathBuf)> {
        let start = format!("{}snap-", self.prefix());
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = u64::from_str_radix(name.strip_prefix(&start)?, 16).ok()?;
                Some((id, e.path()))
            })
            .collect()
    }

    fn remove_all(&self) {
        let _ = std::fs::remove_file(self.main());
        for (_, p) in self.snap_files() {
            let _ = std::fs::remove_file(p);
        }
    }

    fn save(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        crate::file::write_atomically(path, &self.dir, bytes).map_err(|source| StoreError::Io {
            volume: self.volume,
            op: "save versions",
            source,
        })
    }

    fn corrupt(&self, path: &Path, what: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            path: path.display().to_string(),
            what: what.to_string(),
        }
    }

    /// The logical size and table on disk, or `None` if the replica has no versions. Snapshot
    /// files the main file does not list (a snapshot or delete a crash cut short) are removed.
    /// With the table, whether it was open (not closed cleanly).
    fn load(&self, phys_size: u64) -> Result<Option<(u64, Table, bool)>, StoreError> {
        let path = self.main();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.remove_all();
                return Ok(None);
            }
            Err(e) => return Err(self.corrupt(&path, e)),
        };
        let m = format::decode_main(&bytes).map_err(|e| self.corrupt(&path, e))?;
        if m.volume != self.volume
            || m.size == 0
            || !m.size.is_multiple_of(BLOCK)
            || m.size > phys_size
            || !phys_size.is_multiple_of(BLOCK)
        {
            return Err(self.corrupt(
                &path,
                format!(
                    "volume {} of {} bytes over {phys_size} physical bytes",
                    m.volume, m.size
                ),
            ));
        }
        let (blocks, phys_blocks) = (m.size / BLOCK, phys_size / BLOCK);
        let check = |map: &Map, path: &Path| -> Result<(), StoreError> {
            match map
                .iter()
                .find(|(&l, e)| l >= blocks || (e.phys != ZERO && e.phys >= phys_blocks))
            {
                Some((l, e)) => Err(self.corrupt(
                    path,
                    format!("block {l} maps to {} outside the replica", e.phys),
                )),
                None => Ok(()),
            }
        };
        let mut listed = m.snaps.clone();
        listed.sort_by_key(|s| s.gen);
        let mut snaps = std::collections::BTreeMap::new();
        let mut prev: Option<(u64, Map)> = None;
        for s in &listed {
            let p = self.snap(s.id);
            let b = std::fs::read(&p).map_err(|e| self.corrupt(&p, e))?;
            let f = format::decode_snap(&b).map_err(|e| self.corrupt(&p, e))?;
            let want_base = prev.as_ref().map_or(0, |(id, _)| *id);
            if f.volume != self.volume || f.id != s.id || f.base != want_base {
                return Err(self.corrupt(&p, format!("names base {}, not {want_base}", f.base)));
            }
            let base = prev.map(|(_, m)| m).unwrap_or_default();
            let map = format::apply(&base, &f.records);
            check(&map, &p)?;
            snaps.insert(
                s.id,
                table::Snap {
                    gen: s.gen,
                    created: s.created,
                    map: map.clone(),
                },
            );
            prev = Some((s.id, map));
        }
        let base_id = prev.as_ref().map_or(0, |(id, _)| *id);
        if m.base != base_id {
            return Err(self.corrupt(
                &path,
                format!("head diff against {}, not {base_id}", m.base),
            ));
        }
        let head = format::apply(&prev.map(|(_, m)| m).unwrap_or_default(), &m.head);
        check(&head, &path)?;
        for (id, p) in self.snap_files() {
            if !snaps.contains_key(&id) {
                tracing::warn!(
                    volume = self.volume,
                    id,
                    "removing an unlisted snapshot file"
                );
                let _ = std::fs::remove_file(p);
            }
        }
        let t = Table::rebuilt(blocks, phys_blocks, m.gen, head, snaps);
        Ok(Some((m.size, t, m.flags & format::FLAG_OPEN != 0)))
    }
}

#[derive(Debug)]
struct VersionedReplica {
    inner: Arc<dyn Replica>,
    files: Option<Files>,
    /// Held shared by every I/O; exclusive to take, delete or roll back to a snapshot, to grow
    /// the pool, and to reuse freed blocks (no read may still be on its way to one).
    gate: RwLock<()>,
    table: Mutex<Table>,
    /// True while the table is the identity: I/O passes straight through.
    plain: AtomicBool,
    /// The logical size.
    size: AtomicU64,
    /// The head's map changed since it was last persisted.
    dirty: AtomicBool,
    stripes: Vec<Mutex<()>>,
    /// Serialises persisting.
    persist: Mutex<()>,
    /// Set by `close`: the main file records a clean shutdown.
    closed: AtomicBool,
}

fn version_error(volume: u64, e: VersionError) -> StoreError {
    match e {
        VersionError::Exists(id) => StoreError::SnapshotExists { volume, id },
        VersionError::Missing(id) => StoreError::NoSnapshot { volume, id },
        VersionError::ZeroId => StoreError::Invalid(e.to_string()),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl VersionedReplica {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }
    fn exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|e| e.into_inner())
    }
    fn stripe(&self, l: u64) -> MutexGuard<'_, ()> {
        self.stripes[(l % STRIPES as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
    fn vol(&self) -> u64 {
        self.inner.volume()
    }

    /// Writes the main file (the head's map and the snapshot list). The physical replica must
    /// have been flushed since the blocks the head names were written.
    fn persist_main(&self) -> Result<(), StoreError> {
        let _p = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        self.dirty.store(false, Ordering::Release);
        let Some(f) = &self.files else {
            return Ok(());
        };
        let (gen, head, mut listed) = {
            let t = self.table();
            let listed: Vec<(u64, table::Snap)> =
                t.snaps.iter().map(|(id, s)| (*id, s.clone())).collect();
            (t.gen, t.head.clone(), listed)
        };
        listed.sort_by_key(|(_, s)| s.gen);
        let (base, base_map) = listed
            .last()
            .map_or((0, Map::new()), |(id, s)| (*id, s.map.clone()));
        let m = format::Main {
            flags: match self.closed.load(Ordering::Acquire) {
                true => 0,
                false => format::FLAG_OPEN,
            },
            volume: self.vol(),
            size: self.size.load(Ordering::Acquire),
            gen,
            base,
            snaps: listed
                .iter()
                .map(|(id, s)| format::Listed {
                    id: *id,
                    gen: s.gen,
                    created: s.created,
                })
                .collect(),
            head: format::diff(&base_map, &head),
        };
        let r = f.save(&f.main(), &format::encode_main(&m));
        if r.is_err() {
            self.dirty.store(true, Ordering::Release);
        }
        r
    }

    /// Writes snapshot `id`'s file as a diff against the snapshot before it.
    fn persist_snap(&self, id: u64) -> Result<(), StoreError> {
        let Some(f) = &self.files else {
            return Ok(());
        };
        let (base, base_map, map) = {
            let t = self.table();
            let s = t.snaps.get(&id).ok_or(StoreError::NoSnapshot {
                volume: self.vol(),
                id,
            })?;
            let before = t
                .snaps
                .iter()
                .filter(|(_, o)| o.gen < s.gen)
                .max_by_key(|(_, o)| o.gen)
                .map_or((0, Map::new()), |(id, o)| (*id, o.map.clone()));
            (before.0, before.1, s.map.clone())
        };
        let file = format::SnapFile {
            volume: self.vol(),
            id,
            base,
            records: format::diff(&base_map, &map),
        };
        f.save(&f.snap(id), &format::encode_snap(&file))
    }

    /// With the gate held exclusive: makes every change durable, then lets new writes take the
    /// blocks changes freed, giving their space back where they make whole grains.
    fn settle_locked(&self) -> Result<(), StoreError> {
        if self.table().pending() == 0 {
            return self.fold_back_if_identity();
        }
        self.inner.flush()?;
        self.persist_main()?;
        let mut done = self.table().settle();
        done.sort_unstable();
        let per_grain = GRAIN / BLOCK;
        let mut i = 0;
        while i < done.len() {
            let mut j = i + 1;
            while j < done.len() && done[j] == done[j - 1] + 1 {
                j += 1;
            }
            // Only whole grains give space back; smaller runs are overwritten before reuse.
            let (a, b) = (done[i].div_ceil(per_grain), (done[j - 1] + 1) / per_grain);
            if a < b {
                let r = self
                    .inner
                    .write_zeroes(a * GRAIN, (b - a) * GRAIN, true, false);
                if let Err(e) = r {
                    tracing::warn!(volume = self.vol(), "giving freed blocks back: {e}");
                }
            }
            i = j;
        }
        self.fold_back_if_identity()
    }

    fn fold_back_if_identity(&self) -> Result<(), StoreError> {
        let identity = self.table().is_identity();
        if identity && !self.plain.load(Ordering::Acquire) {
            return self.fold_back();
        }
        Ok(())
    }

    /// With the gate held exclusive and the table the identity: drops the pool and the files,
    /// so the replica is plain again (and may be resized). A crash in between leaves the main
    /// file naming the logical size, with the physical replica of that size or larger.
    fn fold_back(&self) -> Result<(), StoreError> {
        let size = self.size.load(Ordering::Acquire);
        if self.inner.size() != size {
            self.inner.resize(size)?;
        }
        let blocks = size / BLOCK;
        *self.table() = Table::new(blocks, blocks);
        if let Some(f) = &self.files {
            f.remove_all();
        }
        self.plain.store(true, Ordering::Release);
        Ok(())
    }

    /// Grows the pool (or reuses freed blocks) so a redirect finds a free block.
    fn grow(&self) -> Result<(), StoreError> {
        let _g = self.exclusive();
        if self.table().free_blocks() > 0 {
            return Ok(());
        }
        self.settle_locked()?;
        if self.table().free_blocks() > 0 {
            return Ok(());
        }
        let phys = self.inner.size();
        let add = GROW_MIN.max(self.size.load(Ordering::Acquire) / 16) / BLOCK * BLOCK;
        self.inner.resize(phys + add)?;
        self.table().grow((phys + add) / BLOCK);
        tracing::debug!(volume = self.vol(), pool = phys + add, "snapshot pool grew");
        Ok(())
    }

    /// Writes `data` at `offset` into the head, redirecting blocks snapshots hold. `Ok(false)`
    /// if a redirect found no free block (the caller grows the pool and writes it all again:
    /// a write is idempotent).
    fn write_head(&self, offset: u64, data: &[u8]) -> Result<bool, StoreError> {
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        // Where each block is written in place, looked up at once; `None` to redirect.
        let places: Vec<Option<u64>> = {
            let t = self.table();
            (first..=last)
                .map(|l| {
                    let e = entry(&t.head, l);
                    let shared = t.newest_gen().is_some_and(|g| e.birth <= g);
                    (e.phys != ZERO && !shared).then_some(e.phys)
                })
                .collect()
        };
        let mut l = first;
        while l <= last {
            let at = |l: u64| (l * BLOCK).max(offset);
            let piece_end = |l: u64| ((l + 1) * BLOCK).min(end);
            match places[(l - first) as usize] {
                Some(p) => {
                    // A run of blocks written in place, physically contiguous.
                    let mut k = l + 1;
                    while k <= last && places[(k - first) as usize] == Some(p + (k - l)) {
                        k += 1;
                    }
                    let (a, b) = (at(l), piece_end(k - 1));
                    let bytes = &data[(a - offset) as usize..(b - offset) as usize];
                    self.inner
                        .write(p * BLOCK + (a - l * BLOCK), bytes, false)?;
                    l = k;
                }
                None => {
                    let (a, b) = (at(l), piece_end(l));
                    let piece = &data[(a - offset) as usize..(b - offset) as usize];
                    if !self.redirect(l, a - l * BLOCK, piece)? {
                        return Ok(false);
                    }
                    l += 1;
                }
            }
        }
        Ok(true)
    }

    /// Writes `piece` at `within` of logical block `l`, to a fresh block if it is shared.
    fn redirect(&self, l: u64, within: u64, piece: &[u8]) -> Result<bool, StoreError> {
        let _s = self.stripe(l);
        let place = self.table().place(l);
        match place {
            Place::Full => Ok(false),
            Place::InPlace(p) => self
                .inner
                .write(p * BLOCK + within, piece, false)
                .map(|()| true),
            Place::Redirect { to, from } => {
                let mut block = vec![0u8; BLOCK as usize];
                let mut r = Ok(());
                if piece.len() < BLOCK as usize && from.phys != ZERO {
                    r = self.inner.read(from.phys * BLOCK, &mut block);
                }
                if r.is_ok() {
                    block[within as usize..within as usize + piece.len()].copy_from_slice(piece);
                    r = self.inner.write(to * BLOCK, &block, false);
                }
                self.table().redirected(l, to, from, r.is_ok());
                self.dirty.store(true, Ordering::Release);
                r.map(|()| true)
            }
        }
    }

    /// Reads `buf` at `offset` of version `id` (the head for `None`).
    fn read_version(&self, id: Option<u64>, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let phys: Vec<u64> = {
            let t = self.table();
            let map = t.map(id).map_err(|e| version_error(self.vol(), e))?;
            (first..=last).map(|l| entry(map, l).phys).collect()
        };
        let mut l = first;
        while l <= last {
            let p = phys[(l - first) as usize];
            let mut k = l + 1;
            while k <= last && {
                let q = phys[(k - first) as usize];
                (p == ZERO && q == ZERO) || (p != ZERO && q == p + (k - l))
            } {
                k += 1;
            }
            let (a, b) = ((l * BLOCK).max(offset), ((k * BLOCK).min(end)));
            let out = &mut buf[(a - offset) as usize..(b - offset) as usize];
            if p == ZERO {
                out.fill(0);
            } else {
                self.inner.read(p * BLOCK + (a - l * BLOCK), out)?;
            }
            l = k;
        }
        Ok(())
    }

    /// Extents of the head over `[offset, offset+len)`: the identity's from the physical
    /// replica, moved blocks as data, zeroed ones as holes.
    fn head_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        let end = offset + len;
        let head = self.table().head.clone();
        let mut out: Vec<Extent> = Vec::new();
        fn push(e: Extent, out: &mut Vec<Extent>) {
            match out.last_mut() {
                Some(last) if last.flags == e.flags => last.length += e.length,
                _ => out.push(e),
            }
        }
        let mut pos = offset;
        for (&l, e) in head.range(offset / BLOCK..=(end - 1) / BLOCK) {
            let (a, b) = ((l * BLOCK).max(offset), ((l + 1) * BLOCK).min(end));
            if pos < a {
                for x in self.inner.block_status(pos, a - pos)? {
                    push(x, &mut out);
                }
            }
            let flags = if e.phys == ZERO {
                Extent::HOLE | Extent::ZERO
            } else {
                0
            };
            push(
                Extent {
                    length: b - a,
                    flags,
                },
                &mut out,
            );
            pos = b;
        }
        if pos < end {
            for x in self.inner.block_status(pos, end - pos)? {
                push(x, &mut out);
            }
        }
        Ok(out)
    }
}

impl crate::filter::ReplicaFilter for VersionedReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn resize(&self, size: u64) -> Result<(), StoreError> {
        let _g = self.exclusive();
        if !self.plain.load(Ordering::Acquire) {
            return Err(StoreError::Invalid(
                "a replica whose blocks snapshots moved cannot be resized yet".into(),
            ));
        }
        self.inner.resize(size)?;
        let blocks = size / BLOCK;
        *self.table() = Table::new(blocks, blocks);
        self.size.store(size, Ordering::Release);
        Ok(())
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let _g = self.shared();
        if self.plain.load(Ordering::Acquire) {
            return self.inner.read(offset, buf);
        }
        self.read_version(None, offset, buf)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        {
            let g = self.shared();
            if self.plain.load(Ordering::Acquire) {
                return self.inner.write(offset, data, fua);
            }
            check_range(offset, data.len() as u64, self.size.load(Ordering::Acquire))?;
            if data.is_empty() {
                return Ok(());
            }
            let mut done = self.write_head(offset, data)?;
            drop(g);
            while !done {
                self.grow()?;
                let _g = self.shared();
                done = self.write_head(offset, data)?;
            }
        }
        if fua {
            Replica::flush(self)?;
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
        {
            let _g = self.shared();
            if self.plain.load(Ordering::Acquire) {
                return self.inner.write_zeroes(offset, len, may_trim, fua);
            }
            check_range(offset, len, self.size.load(Ordering::Acquire))?;
            if may_trim {
                // Whole blocks: an entry that reads zeros; the block goes back to the pool.
                for l in offset.div_ceil(BLOCK)..(offset + len) / BLOCK {
                    let _s = self.stripe(l);
                    self.table().zero(l);
                    self.dirty.store(true, Ordering::Release);
                }
            }
        }
        // The rest (partial blocks, or all of it when the range must stay allocated): zeros
        // written, a chunk at a time.
        let end = offset + len;
        let (a, b) = (offset.div_ceil(BLOCK) * BLOCK, end / BLOCK * BLOCK);
        let parts = match may_trim && a < b {
            true => vec![(offset, a), (b, end)],
            false => vec![(offset, end)],
        };
        let zeros = vec![0u8; ZERO_CHUNK.min(len as usize)];
        for (mut pos, stop) in parts {
            while pos < stop {
                let n = (stop - pos).min(zeros.len() as u64);
                Replica::write(self, pos, &zeros[..n as usize], false)?;
                pos += n;
            }
        }
        if fua {
            Replica::flush(self)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        {
            let _g = self.shared();
            self.inner.flush()?;
            if self.plain.load(Ordering::Acquire) {
                return Ok(());
            }
            if self.dirty.load(Ordering::Acquire) {
                self.persist_main()?;
            }
        }
        let pending = self.table().pending();
        if pending >= SETTLE_AT {
            let _g = self.exclusive();
            self.settle_locked()?;
        } else if pending > 0 {
            if let Ok(_g) = self.gate.try_write() {
                self.settle_locked()?;
            }
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        let _g = self.shared();
        if self.plain.load(Ordering::Acquire) {
            return self.inner.block_status(offset, len);
        }
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.head_status(offset, len)
    }

    fn close(&self) -> Result<(), StoreError> {
        Replica::flush(self)?;
        if !self.plain.load(Ordering::Acquire) {
            self.closed.store(true, Ordering::Release);
            self.persist_main()?;
        }
        self.inner.close()
    }

    fn snapshot(&self, id: u64, created: u64) -> Result<(), StoreError> {
        let _g = self.exclusive();
        if self.inner.tiers().is_some() {
            return Err(StoreError::Invalid(
                "replicas on a tiered store take no snapshots yet".into(),
            ));
        }
        self.inner.flush()?;
        let created = if created == 0 { now_secs() } else { created };
        self.table()
            .snapshot(id, created)
            .map_err(|e| version_error(self.vol(), e))?;
        let r = self.persist_snap(id).and_then(|()| self.persist_main());
        if let Err(e) = r {
            // The snapshot shares every block with the head: dropping it frees nothing.
            let _ = self.table().delete(id);
            if let Some(f) = &self.files {
                let _ = std::fs::remove_file(f.snap(id));
            }
            return Err(e);
        }
        self.plain.store(false, Ordering::Release);
        Ok(())
    }

    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        let t = self.table().clone();
        let mut out: Vec<(u64, SnapshotInfo)> = t
            .snaps
            .iter()
            .map(|(&id, s)| {
                let exclusive_bytes = t.exclusive_bytes(id).unwrap_or(0);
                (
                    s.gen,
                    SnapshotInfo {
                        id,
                        created: s.created,
                        exclusive_bytes,
                    },
                )
            })
            .collect();
        out.sort_by_key(|(g, _)| *g);
        Ok(out.into_iter().map(|(_, s)| s).collect())
    }

    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        let _g = self.exclusive();
        let next = {
            let mut t = self.table();
            let gen = t.snaps.get(&id).map(|s| s.gen);
            let next = gen.and_then(|g| {
                t.snaps
                    .iter()
                    .filter(|(_, s)| s.gen > g)
                    .min_by_key(|(_, s)| s.gen)
                    .map(|(id, _)| *id)
            });
            t.delete(id).map_err(|e| version_error(self.vol(), e))?;
            next
        };
        // The snapshot after it is a diff against it on disk: rewritten against the one
        // before, then the list without it, then its file goes.
        if let Some(next) = next {
            self.persist_snap(next)?;
        }
        self.persist_main()?;
        if let Some(f) = &self.files {
            let _ = std::fs::remove_file(f.snap(id));
        }
        self.settle_locked()
    }

    fn rollback(&self, id: u64) -> Result<(), StoreError> {
        let _g = self.exclusive();
        self.inner.flush()?;
        self.table()
            .rollback(id)
            .map_err(|e| version_error(self.vol(), e))?;
        self.dirty.store(true, Ordering::Release);
        self.persist_main()?;
        self.plain.store(false, Ordering::Release);
        self.settle_locked()
    }

    fn read_snapshot(&self, id: u64, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let _g = self.shared();
        self.read_version(Some(id), offset, buf)
    }

    fn changed_since(&self, id: u64, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        let blocks = self
            .table()
            .changed(id, None)
            .map_err(|e| version_error(self.vol(), e))?;
        let end = offset + len;
        let mut out: Vec<(u64, u64)> = Vec::new();
        for l in blocks {
            let (a, b) = ((l * BLOCK).max(offset), ((l + 1) * BLOCK).min(end));
            if a >= b {
                continue;
            }
            match out.last_mut() {
                Some((s, n)) if *s + *n == a => *n += b - a,
                _ => out.push((a, b - a)),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
