//! Versions of a replica: snapshots and rollback by redirect-on-write, over any store.
//!
//! A [`VersionedStore`] wraps a store; each of its replicas keeps the versions of the replica
//! it wraps (the *physical* replica) in a [`table::Table`]: per version, where each 4 KiB block
//! lives. Until the first snapshot the table is the identity and every call passes straight
//! through (the cost is one shared lock). After one, a write to a block a snapshot holds goes
//! to a fresh block past the replica's logical end (the *pool*, grown in steps with
//! `Replica::resize` of the physical replica, ahead of need: see `grow`), and the head's map
//! records it; reads look up one entry per block whatever the number of snapshots. Because
//! the layers below see physical blocks, the seals of a `SealedStore` underneath follow the
//! blocks.
//!
//! **Durability.** With a directory, the maps persist in the files of [`format`]: a
//! snapshot, delete or rollback before it returns; each change of the head in the redirect
//! log, written (not synced) before the write that made it is answered, and synced at the
//! next flush (after the physical replica's flush, so a map never names a block whose bytes
//! are not durable). The main file, the whole head, is written at checkpoints: a full log
//! (with I/O going on: records go to a second log meanwhile, see `durable.rs`), a close, a
//! delete or rollback, and a flush after a snapshot only the log holds. So a process
//! crash keeps every answered write, as the file store keeps O_DIRECT writes (the log is
//! replayed at open), and a power loss keeps every flushed write and every snapshot (the copy
//! takes a new incarnation then anyway); a flush costs one sync of the log however many
//! blocks have moved. Blocks a change freed are
//! taken again only after the change is in the main file, and with no I/O in flight. Without
//! a directory (a volatile store) the versions live as long as the process, like the bytes.
//!
//! **Sizes.** Each version has its own size: a snapshot keeps the head's when it was taken,
//! and reads past it are refused. A resize changes the head's alone (the table's `homes`
//! says below which a block with no entry lies in place: `table.rs`); a grow adds blocks that
//! read zeros until written into the pool, and grows the physical replica to at least the
//! new size; the main file is written before the resize returns. A rollback to a snapshot of
//! another size is refused (the volume is resized first).

pub mod blockmap;
mod durable;
mod files;
pub mod format;
mod grow;
pub mod table;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use smallvec::SmallVec;

use crate::{check_range, Extent, Replica, SnapshotInfo, Store, StoreError};
use files::Files;
use table::{Table, VersionError, BLOCK, ZERO};

/// The pool grows by at least this much, and by a sixteenth of the replica beyond it.
const GROW_MIN: u64 = 64 << 20;
/// Locks over blocks being redirected, so that two writes to parts of one block keep both.
const STRIPES: usize = 64;
/// Freed blocks waiting past this many make a flush wait for I/O to pause to reuse them.
const SETTLE_AT: usize = 4096;
/// Past this many records (1.6 MB), or as many as the main file's head holds if more, a
/// flush folds the redirect log into the main file: rewriting a head of N entries once
/// every N records costs each redirect a constant share, however far the head has moved.
/// I/O goes on meanwhile: records go to a second log from the fold's start
/// ([`VersionedReplica::fold`]).
const LOG_SLOTS: u64 = 40_000;
/// Zeros written at once for a zeroing that must stay allocated.
const ZERO_CHUNK: usize = 1 << 20;

/// The redirect-log records of one write, on the stack for a few.
type Records = SmallVec<[format::LogRecord; 4]>;

/// A store whose replicas keep versions (see the module docs).
#[derive(Debug)]
pub struct VersionedStore {
    inner: Arc<dyn Store>,
    /// Where versions persist; `None` keeps them in memory (a volatile store).
    dir: Option<PathBuf>,
    /// The least the pool grows by.
    grow_min: u64,
    /// The least number of redirect-log records a flush folds into the main file.
    log_slots: u64,
}

impl VersionedStore {
    pub fn new(inner: Arc<dyn Store>, dir: Option<&Path>) -> VersionedStore {
        VersionedStore {
            inner,
            dir: dir.map(Path::to_path_buf),
            grow_min: GROW_MIN,
            log_slots: LOG_SLOTS,
        }
    }

    /// Folds the redirect log into the main file past `records` (at least 1), not
    /// [`LOG_SLOTS`]: for tests, whose volumes are a few blocks.
    pub fn with_log_slots(mut self, records: u64) -> VersionedStore {
        self.log_slots = records.max(1);
        self
    }

    /// Grows each replica's pool by at least `bytes` (a multiple of 4 KiB) at a time, not
    /// [`GROW_MIN`]: for the simulator, whose volumes are a few blocks and whose disks are
    /// memory.
    pub fn with_grow_min(mut self, bytes: u64) -> VersionedStore {
        self.grow_min = bytes.max(BLOCK) / BLOCK * BLOCK;
        self
    }

    fn files(&self, volume: u64) -> Option<Files> {
        self.dir.as_ref().map(|d| Files::new(d, volume))
    }

    fn wrap(&self, r: Arc<dyn Replica>, fresh: bool) -> Result<Arc<dyn Replica>, StoreError> {
        let files = self.files(r.volume());
        let phys_blocks = r.size() / BLOCK;
        let loaded = match &files {
            Some(f) if fresh => {
                f.remove_all();
                None
            }
            Some(f) => f.load(r.size())?,
            None => None,
        };
        let (size, table, last_seq, unsaved) = match loaded {
            Some(l) => {
                if l.open && l.replayed > 0 {
                    // The process died holding it: the redirect log gave back what the
                    // main file had not caught up with.
                    tracing::warn!(
                        volume = r.volume(),
                        replayed = l.replayed,
                        "versions were not closed cleanly: redirects replayed from the log"
                    );
                }
                (l.size, l.table, l.last_seq, l.replayed_snaps)
            }
            None => (
                r.size(),
                Table::new(phys_blocks, phys_blocks),
                0,
                Vec::new(),
            ),
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
            seq: AtomicU64::new(last_seq),
            slot: AtomicU64::new(0),
            log_side: RwLock::new(0),
            folding: Mutex::new(false),
            main_entries: AtomicU64::new(0),
            log_slots: self.log_slots,
            grow_min: self.grow_min,
            reserved: Mutex::new(0..0),
            low: AtomicBool::new(false),
            growing: Mutex::new(()),
            ahead_failed: AtomicBool::new(false),
            unsaved: Mutex::new(unsaved.into_iter().collect()),
        });
        r.ensure_main();
        // Marked open before anything is served, and the log folded in.
        if !r.plain.load(Ordering::Acquire) {
            r.checkpoint_locked()?;
            // A crash while freed blocks went back (a snapshot deleted) left their space
            // taken: it goes back now, before anything is served, at full speed (a range
            // given back already costs a look at a hole).
            let holes = r.hold_free();
            r.give_back(holes, None);
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

#[derive(Debug)]
struct VersionedReplica {
    inner: Arc<dyn Replica>,
    files: Option<Files>,
    /// Held shared by every I/O, and by a growth of the pool; exclusive to take, delete or
    /// roll back to a snapshot, and to reuse freed blocks (no read may still be on its way to
    /// one).
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
    /// The last sequence given to a redirect-log record.
    seq: AtomicU64,
    /// The next free slot of the redirect log records go to.
    slot: AtomicU64,
    /// Which of the two redirect logs records go to (0 or 1), held shared by each append
    /// and exclusive by a fold's switch, which so waits for the appends under way.
    log_side: RwLock<usize>,
    /// Held by the one fold under way ([`VersionedReplica::fold`]); true while the log not
    /// taking records holds some the main file may lack (a fold switched, and its main file
    /// is not written yet, or failed).
    folding: Mutex<bool>,
    /// The head's entries the main file held when last written: the log may hold as many
    /// records before a flush folds it in ([`LOG_SLOTS`]).
    main_entries: AtomicU64,
    /// [`LOG_SLOTS`], or what [`VersionedStore::with_log_slots`] set.
    log_slots: u64,
    /// The least the pool grows by ([`VersionedStore::with_grow_min`]).
    grow_min: u64,
    /// The physical bytes of the pool last reserved ([`VersionedReplica::reserve_ahead`]).
    reserved: Mutex<std::ops::Range<u64>>,
    /// Free blocks ran low at a redirect: the write grows the pool ahead
    /// ([`VersionedReplica::grow_ahead`]).
    low: AtomicBool,
    /// Held by the one write growing the pool ahead.
    growing: Mutex<()>,
    /// A growth ahead failed: the next is left to a redirect that finds no free block
    /// ([`VersionedReplica::grow`], which reports the error and clears this).
    ahead_failed: AtomicBool,
    /// Snapshots the redirect log holds whose files are not written yet: the next
    /// [`VersionedReplica::persist_main`] writes them before the main file lists them.
    unsaved: Mutex<std::collections::BTreeSet<u64>>,
}

/// How far ahead of a redirect's block the pool's space is reserved.
const RESERVE_AHEAD: u64 = 2 << 20;

/// The physical byte ranges where writes to the logical ranges `suspect` may have landed
/// under the head's map: the ranges themselves (blocks in place), and every block the head's
/// entries there name (blocks moved to the pool). Sorted and merged.
fn physical_suspects(t: &Table, suspect: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = suspect.to_vec();
    for &(offset, len) in suspect {
        if len == 0 {
            continue;
        }
        let (first, last) = (offset / BLOCK, (offset.saturating_add(len) - 1) / BLOCK);
        for (_, e) in t.head.range(first..=last) {
            if e.phys != ZERO {
                out.push((e.phys * BLOCK, BLOCK));
            }
        }
    }
    out.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(out.len());
    for (o, l) in out {
        match merged.last_mut() {
            Some((mo, ml)) if *mo + *ml >= o => *ml = (*ml).max(o + l - *mo),
            _ => merged.push((o, l)),
        }
    }
    merged
}

fn version_error(volume: u64, e: VersionError) -> StoreError {
    match e {
        VersionError::Exists(id) => StoreError::SnapshotExists { volume, id },
        VersionError::Missing(id) => StoreError::NoSnapshot { volume, id },
        VersionError::ZeroId | VersionError::Size { .. } => StoreError::Invalid(e.to_string()),
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

    /// A plain replica's resize, the gate held exclusive: the physical replica's, the table
    /// made again.
    fn resize_plain(&self, size: u64) -> Result<(), StoreError> {
        // The main file names the old size: gone first, written again after (a crash in
        // between leaves none, and the replica opens plain at its physical size).
        if let Some(f) = &self.files {
            f.remove_all();
        }
        self.inner.resize(size)?;
        let blocks = size / BLOCK;
        *self.table() = Table::new(blocks, blocks);
        self.size.store(size, Ordering::Release);
        self.ensure_main();
        Ok(())
    }

    /// The resize of a replica with versions, the gate held exclusive: the head's size
    /// changes, the snapshots keep theirs ([`Table::resize`]). A grow first grows the
    /// physical replica to the new size if it is smaller (the pool's space is past `homes`
    /// either way), then records the size; a shrink records it and drops the head's blocks
    /// past it, whose space goes back as a snapshot's delete gives it (the caller gives the
    /// holes returned back once it has let go of the gate). The snapshot files a shrink
    /// changed and the main file are written before this returns: a crash before the main
    /// file leaves the old size (and the old snapshot files are equivalent: the entries added
    /// name the blocks the old `homes` gave them), and the redirect log holds no record
    /// across a change of size.
    fn resize_versions(&self, size: u64) -> Result<durable::Holes, StoreError> {
        crate::check_size(size)?;
        let blocks = size / BLOCK;
        self.inner.flush()?;
        if size > self.inner.size() {
            self.inner.resize(size)?;
            self.table().grow(blocks);
        }
        // Snapshots whose maps changed get their files again, before the main file.
        let changed = self.table().resize(blocks);
        self.unsaved().extend(changed);
        self.size.store(size, Ordering::Release);
        self.dirty.store(true, Ordering::Release);
        self.persist_and_empty_log()?;
        self.settle_locked(true)
    }

    /// Takes snapshot `id` under the gate held exclusive; durable on return if `synced`, else
    /// from the next flush ([`Replica::snapshot_unsynced`]).
    ///
    /// With a main file on disk to replay onto, the snapshot is one record of the redirect
    /// log, after the records of every redirect before it: a reopen takes it at the same
    /// point if it is `synced` (the data flushed and the log synced first), and drops it
    /// otherwise unless a flush came first. Its file and the main file listing it are
    /// written at the next flush. I/O
    /// waits on this: the two files, each replaced atomically, took four fsyncs. Without a
    /// main file (the replica's first snapshot), they are written at once.
    fn take_snapshot(&self, id: u64, created: u64, synced: bool) -> Result<(), StoreError> {
        let _g = self.exclusive();
        let logged = self.files.as_ref().filter(|f| f.main().exists());
        if synced || logged.is_none() {
            self.inner.flush()?;
        }
        let created = if created == 0 { now_secs() } else { created };
        self.table()
            .snapshot(id, created)
            .map_err(|e| version_error(self.vol(), e))?;
        let r = match logged {
            Some(f) => self.log_snapshot(f, id, created, synced),
            None => self
                .persist_snap(id)
                .and_then(|()| self.persist_and_empty_log()),
        };
        if let Err(e) = r {
            // The snapshot shares every block with the head: dropping it frees nothing.
            let _ = self.table().delete(id);
            self.unsaved().remove(&id);
            if let Some(f) = &self.files {
                let _ = std::fs::remove_file(f.snap(id));
            }
            return Err(e);
        }
        self.plain.store(false, Ordering::Release);
        Ok(())
    }

    /// Reads `buf` at `offset` of version `id` (the head for `None`).
    fn read_version(&self, id: Option<u64>, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        let t = self.table();
        let map = t.map(id).map_err(|e| version_error(self.vol(), e))?;
        let blocks = t.blocks_of(id).map_err(|e| version_error(self.vol(), e))?;
        // Checked first: with it, `offset + len` cannot overflow.
        check_range(offset, len, blocks * BLOCK)?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let phys: SmallVec<[u64; 8]> = (first..=last).map(|l| t.entry(map, l).phys).collect();
        drop(t);
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

    /// Extents of version `id` (the head for `None`) over `[offset, offset+len)`: the
    /// identity's from the physical replica, moved blocks as data, zeroed ones as holes.
    fn version_status(
        &self,
        id: Option<u64>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<Extent>, StoreError> {
        let end = offset + len;
        let (head, homes) = {
            let t = self.table();
            let map = t.map(id).map_err(|e| version_error(self.vol(), e))?.clone();
            (map, t.homes * BLOCK)
        };
        let mut out: Vec<Extent> = Vec::new();
        fn push(e: Extent, out: &mut Vec<Extent>) {
            match out.last_mut() {
                Some(last) if last.flags == e.flags => last.length += e.length,
                _ => out.push(e),
            }
        }
        // Bytes no entry names: in place below `homes`, zeros past it.
        let gap = |a: u64, b: u64, out: &mut Vec<Extent>| -> Result<(), StoreError> {
            if a < b.min(homes) {
                for x in self.inner.block_status(a, b.min(homes) - a)? {
                    push(x, out);
                }
            }
            if b > a.max(homes) {
                let length = b - a.max(homes);
                let flags = Extent::HOLE | Extent::ZERO;
                push(Extent { length, flags }, out);
            }
            Ok(())
        };
        let mut pos = offset;
        for (l, e) in head.range(offset / BLOCK..=(end - 1) / BLOCK) {
            let (a, b) = ((l * BLOCK).max(offset), ((l + 1) * BLOCK).min(end));
            if pos < a {
                gap(pos, a, &mut out)?;
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
            gap(pos, end, &mut out)?;
        }
        Ok(out)
    }
}

impl crate::filter::ReplicaFilter for VersionedReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    /// While the table is the identity, the store's holes are the head's. (A snapshot taken
    /// right after the answer keeps the hole's zeros as its own: what was asked still reads
    /// zeros in both.)
    fn hole(&self, offset: u64, len: u64) -> bool {
        self.plain.load(Ordering::Acquire) && self.inner.hole(offset, len)
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn resize(&self, size: u64) -> Result<(), StoreError> {
        let holes = {
            let _g = self.exclusive();
            if self.plain.load(Ordering::Acquire) {
                return self.resize_plain(size);
            }
            self.resize_versions(size)?
        };
        self.give_back(holes, Some(durable::GIVE_BACK_RATE));
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
            if done && self.low.load(Ordering::Acquire) {
                self.grow_ahead();
            }
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
                // Logged in one write, before the trim is answered.
                let mut changed = Vec::new();
                for l in offset.div_ceil(BLOCK)..(offset + len) / BLOCK {
                    let _s = self.stripe(l);
                    let mut t = self.table();
                    t.zero(l);
                    changed.push(self.record(&t, l));
                }
                self.dirty.store(true, Ordering::Release);
                self.log(&changed)?;
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
                self.persist_head()?;
            }
            // With I/O going on: records go to the other log meanwhile.
            self.fold()?;
        }
        let pending = self.table().pending();
        let holes = if pending >= SETTLE_AT {
            let _g = self.exclusive();
            self.settle_locked(false)?
        } else if pending > 0 {
            match self.gate.try_write() {
                Ok(_g) => self.settle_locked(false)?,
                Err(_) => durable::Holes::default(),
            }
        } else {
            durable::Holes::default()
        };
        // Not rate-limited: a flush waits for it, and what a flush settles is what writes
        // freed since the last one.
        self.give_back(holes, None);
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
        self.version_status(None, offset, len)
    }

    fn close(&self) -> Result<(), StoreError> {
        Replica::flush(self)?;
        if !self.plain.load(Ordering::Acquire) {
            let _g = self.exclusive();
            self.closed.store(true, Ordering::Release);
            self.persist_and_empty_log()?;
        }
        self.inner.close()
    }

    fn snapshot(&self, id: u64, created: u64) -> Result<(), StoreError> {
        self.take_snapshot(id, created, true)
    }

    /// `suspect` is logical (the node's activity log); the seals below are physical. Each
    /// logical block written since the last clean state was written where the head now maps
    /// it: its own number, or a pool block its entry names (issue 63: a block rewritten in
    /// place in the pool after a flush kept its old seal, and failed it).
    fn recover_seals(&self, suspect: &[(u64, u64)]) {
        if self.plain.load(Ordering::Acquire) {
            return self.inner.recover_seals(suspect);
        }
        let physical = {
            let t = self.table();
            physical_suspects(&t, suspect)
        };
        self.inner.recover_seals(&physical)
    }

    fn snapshot_unsynced(&self, id: u64, created: u64) -> Result<(), StoreError> {
        self.take_snapshot(id, created, false)
    }

    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        // The maps are persistent: a copy of the versions costs pointers, and the table's
        // lock is not held while they are walked.
        let (snaps, head, homes) = {
            let t = self.table();
            (t.snaps.clone(), t.head.clone(), t.homes)
        };
        let exclusive = table::exclusive_all(homes, &head, &snaps);
        let mut out: Vec<(u64, SnapshotInfo)> = snaps
            .iter()
            .map(|(&id, s)| {
                (
                    s.gen,
                    SnapshotInfo {
                        id,
                        created: s.created,
                        exclusive_bytes: exclusive.get(&id).copied().unwrap_or(0),
                        size: s.blocks * BLOCK,
                    },
                )
            })
            .collect();
        out.sort_by_key(|(g, _)| *g);
        Ok(out.into_iter().map(|(_, s)| s).collect())
    }

    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        let holes = self.delete_locked(id)?;
        // The freed blocks' space goes back with I/O going on (a snapshot that held a whole
        // volume froze I/O for a third of a second while it went back under the gate).
        self.give_back(holes, Some(durable::GIVE_BACK_RATE));
        Ok(())
    }

    fn rollback(&self, id: u64) -> Result<(), StoreError> {
        let holes = {
            let _g = self.exclusive();
            self.inner.flush()?;
            self.table()
                .rollback(id)
                .map_err(|e| version_error(self.vol(), e))?;
            self.dirty.store(true, Ordering::Release);
            self.persist_and_empty_log()?;
            self.plain.store(false, Ordering::Release);
            self.settle_locked(true)?
        };
        self.give_back(holes, Some(durable::GIVE_BACK_RATE));
        Ok(())
    }

    fn read_snapshot(&self, id: u64, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let _g = self.shared();
        self.read_version(Some(id), offset, buf)
    }

    fn snapshot_status(&self, id: u64, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        let _g = self.shared();
        let blocks = self
            .table()
            .blocks_of(Some(id))
            .map_err(|e| version_error(self.vol(), e))?;
        check_range(offset, len, blocks * BLOCK)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.version_status(Some(id), offset, len)
    }

    fn changed(
        &self,
        from: u64,
        to: Option<u64>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let blocks = {
            let t = self.table();
            let of = |id| t.blocks_of(id).map_err(|e| version_error(self.vol(), e));
            check_range(offset, len, of(Some(from))?.max(of(to)?) * BLOCK)?;
            t.changed(from, to, offset / BLOCK..(offset + len).div_ceil(BLOCK))
                .map_err(|e| version_error(self.vol(), e))?
        };
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
mod log_tests;
#[cfg(test)]
mod tests;
