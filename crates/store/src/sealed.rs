//! Per-block checksums ("seals") over any store: every 4 KiB block written gets a crc32c over
//! its LBA, a generation (how many times the block was written) and its bytes, and every read
//! checks the blocks it returns. A block whose bytes do not match its seal — bit rot, a write
//! the device lost (stale bytes), a write that landed at another LBA, bytes changed behind the
//! node's back — fails the read with [`StoreError::BadBlock`] instead of returning wrong data,
//! so the writer reads another copy and repairs this one.
//!
//! Seals live in memory, one `u64` per block (`generation << 32 | crc`; 0 means "not sealed":
//! never written, trimmed, or not known after a crash). With a directory, they are persisted
//! to `replica-<volume>.seals` on every flush and at close, with a header whose *open* flag is
//! set while the replica is served. Found set at open (the process died), the seals on disk
//! may be older or newer than the data where writes were in flight, so they are dropped: the
//! replica is unsealed until its blocks are written again, and scrub still compares it with
//! the other copies — unless the node knows where writes may have been in flight (its
//! activity log on disk, `Replica::recover_seals`): the seals kept from before the stop are
//! then taken back everywhere else. The node's log drops an extent on disk only after a flush
//! (which persists the seals), and marks it on disk again before any later write there.
//!
//! A read that races a write of the same block can see new bytes and an old seal; so a
//! mismatch is checked again under the block's lock (writes hold it while they write the bytes
//! and the seal) before it is reported.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::{Replica, Store, StoreError};

/// The sealed unit.
pub const BLOCK: u64 = 4096;
const STRIPES: usize = 256;
const MAGIC: &[u8; 8] = b"TRMSEALS";
const VERSION: u32 = 1;
const HEADER: u64 = 64;
const FLAG_OPEN: u32 = 1;
/// Seals per persisted page (4 KiB of seals).
const PAGE: usize = 512;

/// The seal of one block's bytes at `lba` and `generation`.
pub fn seal(lba: u64, generation: u32, block: &[u8]) -> u64 {
    let mut c = crc32c::crc32c(&lba.to_le_bytes());
    c = crc32c::crc32c_append(c, &generation.to_le_bytes());
    c = crc32c::crc32c_append(c, block);
    (u64::from(generation) << 32) | u64::from(c)
}

/// Deletes every seal file in `dir`: a node about to run unsealed there (its writes would
/// leave them stale).
pub fn forget_all(dir: &Path) -> Result<(), StoreError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "seals") {
            std::fs::remove_file(&p).map_err(|source| StoreError::Io {
                volume: 0,
                op: "delete seals",
                source,
            })?;
        }
    }
    Ok(())
}

/// A store whose replicas seal every block (see the module docs).
#[derive(Debug)]
pub struct SealedStore {
    inner: Arc<dyn Store>,
    /// Where seals persist; `None` keeps them in memory (a volatile store).
    dir: Option<PathBuf>,
}

impl SealedStore {
    pub fn new(inner: Arc<dyn Store>, dir: Option<&Path>) -> SealedStore {
        SealedStore {
            inner,
            dir: dir.map(Path::to_path_buf),
        }
    }

    fn path(&self, volume: u64) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("replica-{volume:016x}.seals")))
    }

    fn wrap(&self, r: Arc<dyn Replica>, fresh: bool) -> Result<Arc<dyn Replica>, StoreError> {
        let blocks = r.size().div_ceil(BLOCK) as usize;
        let seals: Vec<AtomicU64> = (0..blocks).map(|_| AtomicU64::new(0)).collect();
        let pages = blocks.div_ceil(PAGE);
        let sealed = SealedReplica {
            seals: RwLock::new(seals),
            dirty: RwLock::new((0..pages).map(|_| AtomicBool::new(false)).collect()),
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            file: None,
            pending: Mutex::new(None),
            bad_seen: AtomicU64::new(0),
            last_bad: AtomicU64::new(0),
            inner: r,
        };
        let sealed = match self.path(sealed.volume()) {
            None => sealed,
            Some(p) => sealed.attach_file(&p, fresh)?,
        };
        Ok(Arc::new(sealed))
    }
}

impl crate::filter::StoreFilter for SealedStore {
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
        if let Some(p) = self.path(volume) {
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }
}

#[derive(Debug)]
struct SealedReplica {
    inner: Arc<dyn Replica>,
    /// Behind a lock only so that `resize` can replace them (taken shared everywhere else;
    /// lock order: `file`, `seals`, `dirty`).
    seals: RwLock<Vec<AtomicU64>>,
    /// Pages of `seals` changed since they were last persisted.
    dirty: RwLock<Vec<AtomicBool>>,
    locks: Vec<Mutex<()>>,
    file: Option<Mutex<std::fs::File>>,
    /// Seals read from the file of an unclean stop, held back until `recover_seals` says
    /// where they still hold.
    pending: Mutex<Option<Vec<u64>>>,
    /// Reads that met a block failing its seal, and the last one's offset.
    bad_seen: AtomicU64,
    last_bad: AtomicU64,
}

/// A request's view of a replica's seals and their dirty pages (shared locks, held for the
/// request; only `resize` takes them exclusively, with no request running).
struct Table<'a> {
    seals: std::sync::RwLockReadGuard<'a, Vec<AtomicU64>>,
    dirty: std::sync::RwLockReadGuard<'a, Vec<AtomicBool>>,
}

impl Table<'_> {
    fn set(&self, b: u64, v: u64) {
        self.seals[b as usize].store(v, Ordering::Release);
        self.dirty[b as usize / PAGE].store(true, Ordering::Release);
    }

    /// Seals block `b` as holding `block`, at its next generation.
    fn reseal(&self, b: u64, block: &[u8]) {
        let g = (self.seals[b as usize].load(Ordering::Acquire) >> 32) as u32;
        self.set(b, seal(b, g.wrapping_add(1).max(1), block));
    }
}

fn header(volume: u64, blocks: u64, flags: u32) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&flags.to_le_bytes());
    h[16..24].copy_from_slice(&volume.to_le_bytes());
    h[24..32].copy_from_slice(&blocks.to_le_bytes());
    let c = crc32c::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&c.to_le_bytes());
    h
}

/// What is wrong with a seal file's header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealHeaderError {
    #[error("header is {0} bytes, not {HEADER}")]
    Short(usize),
    #[error("bad magic")]
    Magic,
    #[error("header checksum mismatch")]
    Checksum,
    #[error("version {0}, expected {VERSION}")]
    Version(u32),
    #[error(
        "for volume {found_volume:x} with {found_blocks} blocks, expected {volume:x} with {blocks}"
    )]
    OtherReplica {
        found_volume: u64,
        found_blocks: u64,
        volume: u64,
        blocks: u64,
    },
}

/// Checks a seal file's header; returns its flags.
pub fn check_header(h: &[u8], volume: u64, blocks: u64) -> Result<u32, SealHeaderError> {
    if h.len() < HEADER as usize {
        return Err(SealHeaderError::Short(h.len()));
    }
    if &h[0..8] != MAGIC {
        return Err(SealHeaderError::Magic);
    }
    let c = u32::from_le_bytes(h[60..64].try_into().expect("4 bytes"));
    if crc32c::crc32c(&h[..60]) != c {
        return Err(SealHeaderError::Checksum);
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(SealHeaderError::Version(version));
    }
    let v = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
    if v != volume || b != blocks {
        return Err(SealHeaderError::OtherReplica {
            found_volume: v,
            found_blocks: b,
            volume,
            blocks,
        });
    }
    Ok(u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")))
}

impl SealedReplica {
    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            volume: self.inner.volume(),
            op,
            source,
        }
    }

    /// Loads the seals from `path` if the replica was closed cleanly, then marks the file open.
    fn attach_file(mut self, path: &Path, fresh: bool) -> Result<SealedReplica, StoreError> {
        let volume = self.inner.volume();
        let blocks = self.seals().len() as u64;
        let mut f = crate::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(self.io("open seals"))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).map_err(self.io("read seals"))?;
        let want = (HEADER + blocks * 8) as usize;
        let read = |bytes: &[u8]| -> Vec<u64> {
            (0..blocks as usize)
                .map(|i| {
                    let o = HEADER as usize + i * 8;
                    u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
                })
                .collect()
        };
        let loaded = if fresh || bytes.is_empty() {
            false
        } else {
            match check_header(&bytes, volume, blocks) {
                Ok(flags) if flags & FLAG_OPEN == 0 && bytes.len() == want => true,
                Ok(_) if bytes.len() == want => {
                    tracing::warn!(volume, path = %path.display(), "replica was not closed cleanly: its block seals are dropped until blocks are written again, or until the node's activity log says where they still hold");
                    *self.pending.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(read(&bytes));
                    false
                }
                Ok(_) => {
                    tracing::warn!(volume, path = %path.display(), "replica was not closed cleanly and its seal file is short: block seals dropped");
                    false
                }
                Err(what) => {
                    tracing::warn!(volume, path = %path.display(), "block seals unusable ({what}); dropped");
                    false
                }
            }
        };
        if loaded {
            for (s, v) in self.seals().iter().zip(read(&bytes)) {
                s.store(v, Ordering::Relaxed);
            }
        } else {
            // No seal is known yet (memory holds zeros): the file becomes all zeros by being
            // cut to nothing and lengthened, a hole the file system reads as zeros. Writing
            // every page instead cost a clone of a 4 GiB image 8 MiB written and synced on
            // each node.
            f.set_len(0)
                .and_then(|()| f.set_len(want as u64))
                .map_err(self.io("size seals"))?;
        }
        f.seek(SeekFrom::Start(0)).map_err(self.io("seek seals"))?;
        f.write_all(&header(volume, blocks, FLAG_OPEN))
            .map_err(self.io("write seals"))?;
        f.sync_all().map_err(self.io("sync seals"))?;
        self.file = Some(Mutex::new(f));
        if !loaded {
            self.persist(false)?;
        }
        Ok(self)
    }

    /// Writes the changed pages of seals (and, with `clean`, a header without the open flag).
    fn persist(&self, clean: bool) -> Result<(), StoreError> {
        let Some(f) = &self.file else { return Ok(()) };
        let f = f.lock().unwrap_or_else(|e| e.into_inner());
        let (seals, dirty) = (self.seals(), self.dirty());
        let mut buf = Vec::with_capacity(PAGE * 8);
        let mut wrote = false;
        for (p, d) in dirty.iter().enumerate() {
            if !d.swap(false, Ordering::AcqRel) {
                continue;
            }
            buf.clear();
            let end = ((p + 1) * PAGE).min(seals.len());
            for s in &seals[p * PAGE..end] {
                buf.extend_from_slice(&s.load(Ordering::Acquire).to_le_bytes());
            }
            if let Err(e) = f.write_all_at(&buf, HEADER + (p * PAGE * 8) as u64) {
                d.store(true, Ordering::Release);
                return Err(self.io("write seals")(e));
            }
            wrote = true;
        }
        if wrote {
            f.sync_data().map_err(self.io("sync seals"))?;
        }
        if clean {
            // Only after the seals are on disk may the header say they are complete.
            let h = header(self.inner.volume(), seals.len() as u64, 0);
            f.write_all_at(&h, 0).map_err(self.io("write seals"))?;
            f.sync_data().map_err(self.io("sync seals"))?;
        }
        Ok(())
    }

    /// Locks the stripes of blocks `[first, last]`, each once, in ascending stripe order (the
    /// one order every caller uses, so two ranges never wait on each other in a cycle).
    fn lock(&self, first: u64, last: u64) -> Vec<MutexGuard<'_, ()>> {
        let n = (last - first + 1).min(STRIPES as u64) as usize;
        let start = (first % STRIPES as u64) as usize;
        // Consecutive blocks take consecutive stripes: `start..start+n`, wrapping past the end.
        let wrapped = (start + n).saturating_sub(STRIPES);
        let (low, high) = if n == STRIPES {
            (0..0, 0..STRIPES)
        } else {
            (0..wrapped, start..(start + n).min(STRIPES))
        };
        let mut held = Vec::with_capacity(n);
        for s in low.chain(high) {
            held.push(self.locks[s].lock().unwrap_or_else(|e| e.into_inner()));
        }
        held
    }

    fn seals(&self) -> std::sync::RwLockReadGuard<'_, Vec<AtomicU64>> {
        self.seals.read().unwrap_or_else(|e| e.into_inner())
    }

    fn dirty(&self) -> std::sync::RwLockReadGuard<'_, Vec<AtomicBool>> {
        self.dirty.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The seal table, taken once for a whole request (not once per block).
    fn table(&self) -> Table<'_> {
        Table {
            seals: self.seals(),
            dirty: self.dirty(),
        }
    }

    /// Reads whole blocks `[a, a+buf.len())` and checks them; the first bad block's offset on
    /// a mismatch.
    fn read_checked(&self, a: u64, buf: &mut [u8]) -> Result<Option<u64>, StoreError> {
        self.inner.read(a, buf)?;
        let seals = self.seals();
        for (k, block) in buf.chunks(BLOCK as usize).enumerate() {
            let b = a / BLOCK + k as u64;
            let s = seals[b as usize].load(Ordering::Acquire);
            if s != 0 && seal(b, (s >> 32) as u32, block) != s {
                return Ok(Some(b * BLOCK));
            }
        }
        Ok(None)
    }

    /// Reads whole blocks at `a` and checks them (see the module docs for the second look).
    fn read_blocks(&self, a: u64, whole: &mut [u8]) -> Result<(), StoreError> {
        let mut bad = self.read_checked(a, whole)?;
        if bad.is_some() {
            // Perhaps a write of the same block was between its bytes and its seal: again,
            // with writes of these blocks held off.
            let end = a + whole.len() as u64;
            let _held = self.lock(a / BLOCK, (end - 1) / BLOCK);
            bad = self.read_checked(a, whole)?;
        }
        match bad {
            None => Ok(()),
            Some(at) => {
                self.last_bad.store(at, Ordering::Release);
                self.bad_seen.fetch_add(1, Ordering::AcqRel);
                tracing::error!(
                    volume = self.volume(),
                    offset = at,
                    "block fails its checksum: this copy is bad"
                );
                Err(StoreError::BadBlock {
                    volume: self.volume(),
                    offset: at,
                })
            }
        }
    }

    /// Seals block `b` from what the store now holds (the edge of a partial write).
    fn reseal_from_store(&self, t: &Table<'_>, b: u64) -> Result<(), StoreError> {
        let off = b * BLOCK;
        let n = BLOCK.min(self.inner.size() - off) as usize;
        let mut block = vec![0u8; n];
        self.inner.read(off, &mut block)?;
        t.reseal(b, &block);
        Ok(())
    }
}

impl crate::filter::ReplicaFilter for SealedReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn hole(&self, offset: u64, len: u64) -> bool {
        self.inner.hole(offset, len)
    }
    /// The replica first, then its seals: blocks past the old end start unsealed, blocks past
    /// a smaller end are forgotten. The seal file changes length, its header and the pages
    /// from the old end on; a crash meanwhile leaves a header whose block count does not
    /// match, and the next open drops the seals (reads go unchecked until blocks are written
    /// again), never wrong ones.
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        let file = self
            .file
            .as_ref()
            .map(|f| f.lock().unwrap_or_else(|e| e.into_inner()));
        self.inner.resize(size)?;
        let blocks = size.div_ceil(BLOCK) as usize;
        {
            let mut seals = self.seals.write().unwrap_or_else(|e| e.into_inner());
            let mut dirty = self.dirty.write().unwrap_or_else(|e| e.into_inner());
            // The pages before the old end keep their place in the file: only the page the
            // old end falls in, and those after it, are written again (a pool that grows by a
            // step writes its step's seals, not the volume's).
            let from = seals.len().min(blocks) / PAGE;
            seals.resize_with(blocks, || AtomicU64::new(0));
            dirty.resize_with(blocks.div_ceil(PAGE), || AtomicBool::new(false));
            for d in dirty.iter().skip(from) {
                d.store(true, Ordering::Relaxed);
            }
        }
        if let Some(f) = &file {
            let want = HEADER + blocks as u64 * 8;
            f.set_len(want)
                .and_then(|()| {
                    f.write_all_at(&header(self.inner.volume(), blocks as u64, FLAG_OPEN), 0)
                })
                .and_then(|()| f.sync_all())
                .map_err(self.io("resize seals"))?;
        }
        drop(file);
        self.persist(false)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        crate::check_range(offset, len, self.inner.size())?;
        if len == 0 {
            return Ok(());
        }
        let a = offset / BLOCK * BLOCK;
        let end = (offset + len).div_ceil(BLOCK) * BLOCK;
        let end = end.min(self.inner.size());
        if a == offset && end == offset + len {
            return self.read_blocks(a, buf);
        }
        let mut whole = vec![0u8; (end - a) as usize];
        self.read_blocks(a, &mut whole)?;
        let s = (offset - a) as usize;
        buf.copy_from_slice(&whole[s..s + len as usize]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        let len = data.len() as u64;
        crate::check_range(offset, len, self.inner.size())?;
        if len == 0 {
            return self.inner.write(offset, data, fua);
        }
        let (first, last) = (offset / BLOCK, (offset + len - 1) / BLOCK);
        let _held = self.lock(first, last);
        self.inner.write(offset, data, fua)?;
        let (t, size) = (self.table(), self.inner.size());
        for b in first..=last {
            let bs = b * BLOCK;
            let be = (bs + BLOCK).min(size);
            if bs >= offset && be <= offset + len {
                t.reseal(b, &data[(bs - offset) as usize..(be - offset) as usize]);
            } else {
                self.reseal_from_store(&t, b)?;
            }
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
        crate::check_range(offset, len, self.inner.size())?;
        if len == 0 {
            return self.inner.write_zeroes(offset, len, may_trim, fua);
        }
        let (first, last) = (offset / BLOCK, (offset + len - 1) / BLOCK);
        let _held = self.lock(first, last);
        self.inner.write_zeroes(offset, len, may_trim, fua)?;
        let (t, size) = (self.table(), self.inner.size());
        for b in first..=last {
            let bs = b * BLOCK;
            let be = (bs + BLOCK).min(size);
            if bs >= offset && be <= offset + len {
                // Zeroed whole blocks are left unsealed (a trim of gigabytes stays cheap).
                if t.seals[b as usize].load(Ordering::Acquire) != 0 {
                    t.set(b, 0);
                }
            } else {
                self.reseal_from_store(&t, b)?;
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()?;
        self.persist(false)
    }
    fn close(&self) -> Result<(), StoreError> {
        self.inner.close()?;
        self.persist(true)
    }
    fn bad_blocks(&self) -> crate::BadBlocks {
        crate::BadBlocks {
            seen: self.bad_seen.load(Ordering::Acquire),
            last_offset: self.last_bad.load(Ordering::Acquire),
        }
    }
    fn recover_seals(&self, suspect: &[(u64, u64)]) {
        let Some(kept) = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let mut out = vec![false; self.seals().len()];
        for &(o, l) in suspect {
            let first = (o / BLOCK) as usize;
            let end = (o.saturating_add(l).div_ceil(BLOCK) as usize).min(out.len());
            for x in out.iter_mut().take(end).skip(first) {
                *x = true;
            }
        }
        let mut n = 0u64;
        let t = self.table();
        for (b, v) in kept.into_iter().enumerate() {
            // Written since the open: its own new seal stands.
            if v != 0 && !out[b] && t.seals[b].load(Ordering::Acquire) == 0 {
                t.set(b as u64, v);
                n += 1;
            }
        }
        tracing::info!(
            volume = self.inner.volume(),
            seals = n,
            "block seals kept after an unclean stop, outside the activity log's extents"
        );
    }
}
