//! Clones: a replica whose blocks not yet written read from a snapshot of another replica on
//! the same node (its *parent*), as a qcow2 image reads its backing file.
//!
//! A [`BackedStore`] sits under the [`crate::VersionedStore`] and over the sealed and bottom
//! stores, so it sees *physical* blocks: a clone's own snapshots, redirects and pool work
//! unchanged above it. Each physical 4 KiB block below the clone's size at creation is either
//! *filled* (its bytes are in the replica below) or not (they are the parent snapshot's block
//! of the same number). A write fills the blocks it touches: a block written in part is first
//! filled with the parent's bytes (copy-up), under a lock per block so two writes into one
//! block keep both; a zeroing fills too (the block reads zeros from then on, not the
//! parent's). Reads of blocks not filled go to the parent's `read_snapshot`, and
//! `block_status` there asks the parent's `snapshot_status`. Blocks only go from not filled to
//! filled, so a read that saw a block not filled and read the parent is never wrong: a write
//! racing it marks the block filled only after its bytes are below.
//!
//! **Durability** (`file.rs`): the map of filled blocks is a checksummed file replaced
//! atomically; each block a write fills is appended to a log before the write is answered
//! (written, not synced: a process crash keeps it, as the file store keeps O_DIRECT writes),
//! the log is synced at each flush after the replica below, and folded into the map file
//! when it grows long and at close. So a clone keeps every answered write through a crash
//! of its process and every flushed write through a power loss.
//!
//! **Flatten** copies every block not filled from the parent, a megabyte at a time with the
//! writes' block locks held, skipping what the parent's snapshot says reads zeros, with I/O
//! going on; then the clone forgets its parent and its files go. The node refuses to drop a parent's snapshot (or the parent) while a clone on it
//! still reads from it.

pub mod file;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::{check_range, Extent, Replica, Store, StoreError};
use file::{CloneFiles, Saved};

/// The unit of filling.
const BLOCK: u64 = 4096;
/// Locks over blocks being filled.
const STRIPES: usize = 64;
/// Past this many log records (1 MiB), a flush folds the log into the map file.
const LOG_RECORDS: u64 = 65_536;
/// Bytes copied at once by a flatten.
const FLATTEN_CHUNK: u64 = 1 << 20;

/// What a clone's copy reads from its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackingInfo {
    /// The parent's volume id.
    pub parent: u64,
    /// The parent's snapshot id.
    pub snapshot: u64,
    /// Bytes still read from the parent (what a flatten copies).
    pub from_parent: u64,
    /// False until the node has found the parent's replica (reads of blocks not filled fail
    /// until then).
    pub linked: bool,
}

/// A store whose replicas may be clones (see the module docs).
#[derive(Debug)]
pub struct BackedStore {
    inner: Arc<dyn Store>,
    /// Where the maps of filled blocks persist; `None` keeps them in memory.
    dir: Option<PathBuf>,
}

impl BackedStore {
    pub fn new(inner: Arc<dyn Store>, dir: Option<&Path>) -> BackedStore {
        BackedStore {
            inner,
            dir: dir.map(Path::to_path_buf),
        }
    }

    fn files(&self, volume: u64) -> Option<CloneFiles> {
        self.dir.as_ref().map(|d| CloneFiles::new(d, volume))
    }

    fn wrap(&self, inner: Arc<dyn Replica>, state: Option<Backing>) -> Arc<dyn Replica> {
        let files = self.files(inner.volume());
        Arc::new(BackedReplica {
            inner,
            files,
            backing: RwLock::new(state.map(Arc::new)),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            persist: RwLock::new(()),
            logged: AtomicU64::new(0),
            unsynced: AtomicBool::new(false),
        })
    }
}

impl crate::filter::StoreFilter for BackedStore {
    fn next(&self) -> &dyn Store {
        &*self.inner
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        if let Some(f) = self.files(volume) {
            f.remove_all();
        }
        let r = self.inner.create(volume, size)?;
        Ok(self.wrap(r, None))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.inner
            .open_all()
            .into_iter()
            .map(|r| {
                let r = r?;
                let state = match self.files(r.volume()) {
                    // Every block filled: a flatten that stopped before its files went.
                    Some(f) => match f.load(r.volume())? {
                        Some(s) if s.unfilled.count == 0 => {
                            f.remove_all();
                            None
                        }
                        s => s.map(Backing::from_saved),
                    },
                    None => None,
                };
                Ok(self.wrap(r, state))
            })
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

/// A clone's tie to its parent.
#[derive(Debug)]
struct Backing {
    parent_volume: u64,
    snapshot: u64,
    /// Blocks below this may read from the parent.
    blocks: u64,
    /// Bit set: the block is not filled (reads from the parent).
    unfilled: Mutex<Bits>,
    parent: RwLock<Option<Arc<dyn Replica>>>,
}

impl Backing {
    fn from_saved(s: Saved) -> Backing {
        Backing {
            parent_volume: s.parent,
            snapshot: s.snapshot,
            blocks: s.blocks,
            unfilled: Mutex::new(s.unfilled),
            parent: RwLock::new(None),
        }
    }
    fn bits(&self) -> MutexGuard<'_, Bits> {
        self.unfilled.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn parent(&self, volume: u64) -> Result<Arc<dyn Replica>, StoreError> {
        self.parent
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Io {
                volume,
                op: "read a clone's parent",
                source: std::io::Error::other(format!(
                    "the parent (volume {}, snapshot {}) is not on this node",
                    self.parent_volume, self.snapshot
                )),
            })
    }
    fn unfilled(&self, l: u64) -> bool {
        l < self.blocks && self.bits().get(l)
    }
    /// Whether each block of `first..=last` is not filled, under one hold of the lock. A block
    /// seen filled stays filled; one seen not filled is looked at again under its own lock
    /// before it is filled.
    fn unfilled_in(&self, first: u64, last: u64) -> Vec<bool> {
        let bits = self.bits();
        (first..=last)
            .map(|l| l < self.blocks && bits.get(l))
            .collect()
    }
}

/// One bit per block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bits {
    pub words: Vec<u64>,
    /// Bits set.
    pub count: u64,
}

impl Bits {
    fn all(blocks: u64) -> Bits {
        let mut words = vec![u64::MAX; blocks.div_ceil(64) as usize];
        if !blocks.is_multiple_of(64) {
            if let Some(w) = words.last_mut() {
                *w = (1u64 << (blocks % 64)) - 1;
            }
        }
        Bits {
            words,
            count: blocks,
        }
    }
    fn get(&self, l: u64) -> bool {
        self.words
            .get((l / 64) as usize)
            .is_some_and(|w| w & (1 << (l % 64)) != 0)
    }
    /// Clears bit `l`; true if it was set.
    fn clear(&mut self, l: u64) -> bool {
        match self.words.get_mut((l / 64) as usize) {
            Some(w) if *w & (1 << (l % 64)) != 0 => {
                *w &= !(1 << (l % 64));
                self.count -= 1;
                true
            }
            _ => false,
        }
    }
    /// The next set bit at or after `l`, below `end`.
    fn next_set(&self, mut l: u64, end: u64) -> Option<u64> {
        while l < end {
            let w = self.words.get((l / 64) as usize)? >> (l % 64);
            if w != 0 {
                let at = l + u64::from(w.trailing_zeros());
                return (at < end).then_some(at);
            }
            l = (l / 64 + 1) * 64;
        }
        None
    }
}

#[derive(Debug)]
struct BackedReplica {
    inner: Arc<dyn Replica>,
    files: Option<CloneFiles>,
    /// `None`: not a clone (or flattened); every call passes straight through.
    backing: RwLock<Option<Arc<Backing>>>,
    stripes: Vec<Mutex<()>>,
    /// Held shared while a block's fill is marked and logged, exclusive to fold the log into
    /// the map file (so no record is lost between the two).
    persist: RwLock<()>,
    /// Records in the log since it was last emptied.
    logged: AtomicU64,
    /// The log has records not synced yet.
    unsynced: AtomicBool,
}

impl BackedReplica {
    fn state(&self) -> Option<Arc<Backing>> {
        self.backing
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn vol(&self) -> u64 {
        self.inner.volume()
    }
    fn stripe(&self, l: u64) -> MutexGuard<'_, ()> {
        self.stripes[(l % STRIPES as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Clears the bits of `filled` (blocks whose bytes are below now), for the callers that
    /// did not under the block's lock.
    fn clear(&self, b: &Backing, filled: &[u64]) {
        let mut bits = b.bits();
        for &l in filled {
            bits.clear(l);
        }
    }

    /// Logs `filled` (their bits cleared) before the write that filled them is answered. The
    /// caller holds `persist` shared from before it cleared them, so a fold of the log into
    /// the map file either saw them cleared or comes after these records.
    fn log(&self, filled: &[u64]) -> Result<(), StoreError> {
        if filled.is_empty() {
            return Ok(());
        }
        if let Some(f) = &self.files {
            f.append(filled)?;
            self.logged.fetch_add(filled.len() as u64, Ordering::AcqRel);
            self.unsynced.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn persist_shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.persist.read().unwrap_or_else(|e| e.into_inner())
    }

    /// With block `l`'s lock held: fills it if it is not yet, with `piece` at `within` over
    /// the parent's bytes; the block filled (to log), or `None` if it was already (then
    /// `piece` is not written: the caller writes it).
    fn fill(
        &self,
        b: &Backing,
        l: u64,
        within: u64,
        piece: &[u8],
    ) -> Result<Option<u64>, StoreError> {
        if !b.unfilled(l) {
            return Ok(None);
        }
        let mut block = vec![0u8; BLOCK as usize];
        if piece.len() < BLOCK as usize {
            b.parent(self.vol())?
                .read_snapshot(b.snapshot, l * BLOCK, &mut block)?;
        }
        block[within as usize..within as usize + piece.len()].copy_from_slice(piece);
        self.inner.write(l * BLOCK, &block, false)?;
        // Under the block's lock: a write after this one writes over it, never fills again.
        b.bits().clear(l);
        Ok(Some(l))
    }

    /// Writes `data` at `offset`, filling the blocks it touches that are not filled.
    fn write_backed(&self, b: &Backing, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let _p = self.persist_shared();
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let mut filled = Vec::new();
        let mut run: Option<u64> = None; // start of a run of filled blocks written at once
        let flush_run = |from: u64, to: u64| -> Result<(), StoreError> {
            let (a, z) = ((from * BLOCK).max(offset), (to * BLOCK).min(end));
            self.inner.write(
                a,
                &data[(a - offset) as usize..(z - offset) as usize],
                false,
            )
        };
        let unfilled = b.unfilled_in(first, last);
        let mut r = Ok(());
        for l in first..=last {
            if !unfilled[(l - first) as usize] {
                run.get_or_insert(l);
                continue;
            }
            if let Some(s) = run.take() {
                r = flush_run(s, l);
                if r.is_err() {
                    break;
                }
            }
            let (a, z) = ((l * BLOCK).max(offset), ((l + 1) * BLOCK).min(end));
            let piece = &data[(a - offset) as usize..(z - offset) as usize];
            let _s = self.stripe(l);
            match self.fill(b, l, a - l * BLOCK, piece) {
                Ok(Some(l)) => filled.push(l),
                // Filled meanwhile by another write: this piece goes on top.
                Ok(None) => r = self.inner.write(a, piece, false),
                Err(e) => r = Err(e),
            }
            if r.is_err() {
                break;
            }
        }
        if r.is_ok() {
            if let Some(s) = run {
                r = flush_run(s, last + 1);
            }
        }
        // Blocks filled before a failure hold their bytes below: logged all the same.
        self.log(&filled)?;
        r
    }

    /// Reads `buf` at `offset`: runs of filled blocks from below, the others from the parent.
    fn read_backed(&self, b: &Backing, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let end = offset + buf.len() as u64;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let from_parent = b.unfilled_in(first, last);
        let mut l = first;
        while l <= last {
            let p = from_parent[(l - first) as usize];
            let mut k = l + 1;
            while k <= last && from_parent[(k - first) as usize] == p {
                k += 1;
            }
            let (a, z) = ((l * BLOCK).max(offset), (k * BLOCK).min(end));
            let out = &mut buf[(a - offset) as usize..(z - offset) as usize];
            match p {
                true => b.parent(self.vol())?.read_snapshot(b.snapshot, a, out)?,
                false => self.inner.read(a, out)?,
            }
            l = k;
        }
        Ok(())
    }

    fn status_backed(&self, b: &Backing, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |e: Extent| match out.last_mut() {
            Some(last) if last.flags == e.flags => last.length += e.length,
            _ => out.push(e),
        };
        let first = offset / BLOCK;
        let from_parent = b.unfilled_in(first, (end - 1) / BLOCK);
        let mut pos = offset;
        while pos < end {
            let l = pos / BLOCK;
            let p = from_parent[(l - first) as usize];
            let mut k = l + 1;
            while k * BLOCK < end && from_parent[(k - first) as usize] == p {
                k += 1;
            }
            let z = (k * BLOCK).min(end);
            let parts = match p {
                true => b
                    .parent(self.vol())?
                    .snapshot_status(b.snapshot, pos, z - pos)?,
                false => self.inner.block_status(pos, z - pos)?,
            };
            for e in parts {
                push(e);
            }
            pos = z;
        }
        Ok(out)
    }

    /// Folds the log into the map file (or, flattened, removes both).
    fn checkpoint(&self, b: Option<&Backing>) -> Result<(), StoreError> {
        let Some(f) = &self.files else {
            return Ok(());
        };
        let _p = self.persist.write().unwrap_or_else(|e| e.into_inner());
        match b {
            Some(b) => {
                f.save(&saved_of(self.vol(), b))?;
                f.empty_log()?;
            }
            None => f.remove_all(),
        }
        self.logged.store(0, Ordering::Release);
        self.unsynced.store(false, Ordering::Release);
        Ok(())
    }
}

impl crate::filter::ReplicaFilter for BackedReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    /// A clone's hole reads its backing; only a replica that is no clone reads the store's.
    fn hole(&self, offset: u64, len: u64) -> bool {
        self.state().is_none() && self.inner.hole(offset, len)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        match self.state() {
            Some(b) if !buf.is_empty() => {
                check_range(offset, buf.len() as u64, self.inner.size())?;
                self.read_backed(&b, offset, buf)
            }
            _ => self.inner.read(offset, buf),
        }
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        match self.state() {
            Some(b) if !data.is_empty() => {
                check_range(offset, data.len() as u64, self.inner.size())?;
                self.write_backed(&b, offset, data)?;
                if fua {
                    crate::filter::ReplicaFilter::flush(self)?;
                }
                Ok(())
            }
            _ => self.inner.write(offset, data, fua),
        }
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        let Some(b) = self.state() else {
            return self.inner.write_zeroes(offset, len, may_trim, fua);
        };
        check_range(offset, len, self.inner.size())?;
        // Whole blocks read zeros from now on, not the parent's: the zeroing below, then
        // marked filled. Partial blocks are written as zeros, filling them with a copy-up.
        let end = offset + len;
        let (a, z) = (offset.div_ceil(BLOCK) * BLOCK, end / BLOCK * BLOCK);
        if a < z {
            let _p = self.persist_shared();
            self.inner.write_zeroes(a, z - a, may_trim, false)?;
            let (first, last) = (a / BLOCK, z / BLOCK - 1);
            let filled: Vec<u64> = (first..=last)
                .zip(b.unfilled_in(first, last))
                .filter_map(|(l, u)| u.then_some(l))
                .collect();
            self.clear(&b, &filled);
            self.log(&filled)?;
        }
        let parts = match a < z {
            true => [(offset, a), (z, end)],
            false => [(offset, end), (end, end)],
        };
        for (s, e) in parts {
            if s < e {
                let zeros = vec![0u8; (e - s) as usize];
                self.write_backed(&b, s, &zeros)?;
            }
        }
        if fua {
            crate::filter::ReplicaFilter::flush(self)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()?;
        let Some(b) = self.state() else {
            return Ok(());
        };
        if self.logged.load(Ordering::Acquire) >= LOG_RECORDS {
            return self.checkpoint(Some(&b));
        }
        if self.unsynced.swap(false, Ordering::AcqRel) {
            if let Some(f) = &self.files {
                if let Err(e) = f.sync_log() {
                    self.unsynced.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        match self.state() {
            Some(b) if len > 0 => {
                check_range(offset, len, self.inner.size())?;
                self.status_backed(&b, offset, len)
            }
            _ => self.inner.block_status(offset, len),
        }
    }

    fn resize(&self, size: u64) -> Result<(), StoreError> {
        self.inner.resize(size)?;
        if let Some(b) = self.state() {
            // Blocks past a smaller end are gone; grown again, they read zeros.
            let blocks = size / BLOCK;
            let gone: Vec<u64> = {
                let bits = b.bits();
                let mut v = Vec::new();
                let mut l = blocks;
                while let Some(x) = bits.next_set(l, b.blocks) {
                    v.push(x);
                    l = x + 1;
                }
                v
            };
            let _p = self.persist_shared();
            self.clear(&b, &gone);
            self.log(&gone)?;
        }
        Ok(())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.inner.flush()?;
        if let Some(b) = self.state() {
            self.checkpoint(Some(&b))?;
        }
        self.inner.close()
    }

    fn backing(&self) -> Option<BackingInfo> {
        self.state().map(|b| BackingInfo {
            parent: b.parent_volume,
            snapshot: b.snapshot,
            from_parent: b.bits().count * BLOCK,
            linked: b.parent.read().unwrap_or_else(|e| e.into_inner()).is_some(),
        })
    }

    fn set_backing(&self, parent: Arc<dyn Replica>, snapshot: u64) -> Result<(), StoreError> {
        let mut slot = self.backing.write().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(StoreError::Invalid(format!(
                "replica {} is a clone already",
                self.vol()
            )));
        }
        if self.inner.allocated_bytes() > 0 {
            return Err(StoreError::Invalid(format!(
                "replica {} has been written: only a fresh replica becomes a clone",
                self.vol()
            )));
        }
        // The parent must hold the snapshot, as large as the clone.
        let size = self.inner.size();
        let Some(of) = parent.snapshots()?.into_iter().find(|s| s.id == snapshot) else {
            return Err(StoreError::NoSnapshot {
                volume: parent.volume(),
                id: snapshot,
            });
        };
        if of.size < size {
            return Err(StoreError::Invalid(format!(
                "clone of {size} bytes over a snapshot of {}",
                of.size
            )));
        }
        let blocks = size / BLOCK;
        let b = Backing {
            parent_volume: parent.volume(),
            snapshot,
            blocks,
            unfilled: Mutex::new(Bits::all(blocks)),
            parent: RwLock::new(Some(parent)),
        };
        // Durable before the clone is served: without its file it would read zeros. (No log
        // yet: the first fill opens it.)
        if let Some(f) = &self.files {
            f.save(&saved_of(self.vol(), &b))?;
        }
        *slot = Some(Arc::new(b));
        Ok(())
    }

    fn link_backing(&self, parent: Arc<dyn Replica>) -> Result<(), StoreError> {
        let Some(b) = self.state() else {
            return Ok(());
        };
        if parent.volume() != b.parent_volume {
            return Err(StoreError::Invalid(format!(
                "replica {} is a clone of volume {}, not {}",
                self.vol(),
                b.parent_volume,
                parent.volume()
            )));
        }
        if !parent.snapshots()?.iter().any(|s| s.id == b.snapshot) {
            return Err(StoreError::NoSnapshot {
                volume: b.parent_volume,
                id: b.snapshot,
            });
        }
        *b.parent.write().unwrap_or_else(|e| e.into_inner()) = Some(parent);
        Ok(())
    }

    fn flatten(&self) -> Result<(), StoreError> {
        let Some(b) = self.state() else {
            return Ok(());
        };
        let parent = b.parent(self.vol())?;
        let mut buf = vec![0u8; FLATTEN_CHUNK as usize];
        let mut l = 0;
        loop {
            let next = b.bits().next_set(l, b.blocks);
            let Some(start) = next else { break };
            // A run of blocks not filled, at most a chunk, read from the parent at once.
            let most = (start + FLATTEN_CHUNK / BLOCK).min(b.blocks);
            let run = b.unfilled_in(start, most - 1);
            let end = start + run.iter().take_while(|&&u| u).count() as u64;
            // Where the parent's snapshot reads zeros, the block below does too (a block not
            // filled was never written): only marked. The rest is read at once and written.
            let zeros = zero_blocks(
                &parent.snapshot_status(b.snapshot, start * BLOCK, (end - start) * BLOCK)?,
                start,
            );
            let chunk = &mut buf[..((end - start) * BLOCK) as usize];
            if zeros.len() as u64 != end - start {
                parent.read_snapshot(b.snapshot, start * BLOCK, chunk)?;
            }
            let _p = self.persist_shared();
            // Every block lock at once, in order (a write holds one at most): the runs to
            // copy are written whole, and a block a write filled meanwhile keeps its bytes.
            let _all: Vec<MutexGuard<'_, ()>> = self
                .stripes
                .iter()
                .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
                .collect();
            let filled: Vec<u64> = (start..end)
                .zip(b.unfilled_in(start, end - 1))
                .filter_map(|(k, u)| u.then_some(k))
                .collect();
            let mut i = 0;
            while i < filled.len() {
                if zeros.contains(&filled[i]) {
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < filled.len()
                    && filled[j] == filled[j - 1] + 1
                    && !zeros.contains(&filled[j])
                {
                    j += 1;
                }
                let (a, z) = (
                    (filled[i] - start) * BLOCK,
                    (filled[j - 1] + 1 - start) * BLOCK,
                );
                self.inner
                    .write(filled[i] * BLOCK, &chunk[a as usize..z as usize], false)?;
                i = j;
            }
            self.clear(&b, &filled);
            self.log(&filled)?;
            l = end;
        }
        // Every block is below now: durable, then the parent is forgotten.
        self.inner.flush()?;
        *self.backing.write().unwrap_or_else(|e| e.into_inner()) = None;
        self.checkpoint(None)?;
        tracing::info!(
            volume = self.vol(),
            parent = b.parent_volume,
            "clone flattened"
        );
        Ok(())
    }
}

/// What a clone's map file holds of `b`.
fn saved_of(volume: u64, b: &Backing) -> Saved {
    Saved {
        volume,
        parent: b.parent_volume,
        snapshot: b.snapshot,
        blocks: b.blocks,
        unfilled: b.bits().clone(),
    }
}

/// The blocks from `first` on that `extents` (in order, from `first`'s start) say read zeros.
fn zero_blocks(extents: &[Extent], first: u64) -> std::collections::BTreeSet<u64> {
    let mut out = std::collections::BTreeSet::new();
    let mut pos = first * BLOCK;
    for e in extents {
        if e.flags & Extent::ZERO != 0 {
            out.extend(pos.div_ceil(BLOCK)..(pos + e.length) / BLOCK);
        }
        pos += e.length;
    }
    out
}

#[cfg(test)]
mod tests;
