//! A replica's bytes, in one file or two.
//!
//! Below the *split* they are in the data file, `replica-<volume>.data`, opened with
//! `O_DIRECT`. From the split on they are in the pool file, `replica-<volume>.pool`, through
//! the page cache. The split is the replica's size when it was created, so the pool file holds
//! what the replica grew by. Under versions that is the snapshot pool, where redirected writes
//! land (`versions/grow.rs`); on a plain replica it is what a resize added.
//!
//! **Why two files.** A redirect writes a fresh block of the pool, the pool filling lowest
//! first. Written direct, each is a device request and ext4 converting an unwritten extent:
//! 26-28 µs of machine CPU per 4 KiB on this project's test host, against 5.5-6.2 µs written
//! through the cache and behind, in large requests (`docs/not-built.md`). But a buffered write
//! takes the file's inode lock exclusive, and ext4 holds it shared through every `O_DIRECT`
//! read and write until the device answers: in the data file itself, each fresh block waited
//! for the I/O in flight. A file of its own, with no direct I/O on it, has no such wait.
//!
//! **Writing behind.** A write that ends a MiB of the pool file starts that MiB's writeback
//! (`sync_file_range`) and drops the MiB two before it from the cache (`POSIX_FADV_DONTNEED`):
//! a pool filled in order is on its way to the disk in large requests and does not fill the
//! cache. Reads take `RWF_DONTCACHE` (Linux 6.14; a plain read where it is refused). Durability
//! is unchanged: a flush syncs both files (the pool only if it was written since its last sync),
//! and a process crash loses nothing either way (the kernel holds what was written).
//!
//! **The split is the data file's length**, always, so no record holds it. A grow lengthens
//! the pool file; a shrink to or past the split empties the pool file first and then shortens
//! the data file, so a crash in between leaves a pool file of 0 bytes beside a data file still
//! at the old split: both read as the old size, longer than the metadata's, which `open`
//! undoes (`file.rs`). Replicas created before the pool file existed have none, and keep all
//! their bytes in the data file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Written behind a MiB at a time.
const CHUNK: u64 = 1 << 20;
/// How many MiB behind the one just written the cache is dropped.
const KEEP_CHUNKS: u64 = 2;

/// Where the bytes of a data file at `data_path` go past its split.
pub(crate) fn pool_path(data_path: &Path) -> PathBuf {
    data_path.with_extension("pool")
}

/// A piece of a range in the pool file: the file, the offset in it, the length.
type PoolPiece<'a> = (&'a File, u64, u64);

#[derive(Debug)]
pub(crate) struct Data {
    main: File,
    pool: Option<File>,
    /// The data file's length: where the pool file starts (`u64::MAX` without one).
    split: AtomicU64,
    /// Written since its last sync (a flush skips a clean pool file: fewer device flushes).
    pool_dirty: AtomicBool,
    /// `RWF_DONTCACHE` was refused once: plain reads from then on.
    no_dontcache: AtomicBool,
}

impl Data {
    /// A new replica's files: `main`, just created at `size`, and a new, empty pool file.
    pub(crate) fn create(main: File, data_path: &Path, size: u64) -> std::io::Result<Data> {
        let pool = crate::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(pool_path(data_path))?;
        Ok(Data::new(main, Some(pool), size))
    }

    /// An existing replica's files (the pool file, if it has one).
    pub(crate) fn open(main: File, data_path: &Path) -> std::io::Result<Data> {
        let split = main.metadata()?.len();
        let pool = match crate::private::options()
            .read(true)
            .write(true)
            .open(pool_path(data_path))
        {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(Data::new(main, pool, split))
    }

    fn new(main: File, pool: Option<File>, split: u64) -> Data {
        let split = if pool.is_some() { split } else { u64::MAX };
        Data {
            main,
            pool,
            split: AtomicU64::new(split),
            pool_dirty: AtomicBool::new(false),
            no_dontcache: AtomicBool::new(false),
        }
    }

    /// The replica's length in bytes: both files.
    pub(crate) fn len(&self) -> std::io::Result<u64> {
        let mut n = self.main.metadata()?.len();
        if let Some(p) = &self.pool {
            n += p.metadata()?.len();
        }
        Ok(n)
    }

    /// The pieces of `[off, off+len)`: in the data file at its offset, then in the pool file at
    /// its own (offset from the split).
    fn pieces(&self, off: u64, len: u64) -> (Option<(u64, u64)>, Option<PoolPiece<'_>>) {
        let s = self.split.load(Ordering::Acquire);
        let end = off + len;
        let main = (off < s).then(|| (off, end.min(s) - off));
        let pool = match &self.pool {
            Some(p) if end > s => {
                let a = off.max(s);
                Some((p, a - s, end - a))
            }
            _ => None,
        };
        (main, pool)
    }

    pub(crate) fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        let (main, pool) = self.pieces(off, buf.len() as u64);
        let (a, b) = buf.split_at_mut(main.map_or(0, |(_, l)| l as usize));
        if let Some((o, _)) = main {
            self.main.read_exact_at(a, o)?;
        }
        if let Some((p, o, _)) = pool {
            self.read_pool(p, b, o)?;
        }
        Ok(())
    }

    pub(crate) fn write_all_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        let (main, pool) = self.pieces(off, buf.len() as u64);
        let (a, b) = buf.split_at(main.map_or(0, |(_, l)| l as usize));
        if let Some((o, _)) = main {
            self.main.write_all_at(a, o)?;
        }
        if let Some((p, o, l)) = pool {
            self.changed(p.write_all_at(b, o))?;
            write_behind(p, o + l);
        }
        Ok(())
    }

    /// `fallocate(mode)` over the range, on the file or files that hold it.
    pub(crate) fn fallocate(&self, mode: libc::c_int, off: u64, len: u64) -> std::io::Result<()> {
        let (main, pool) = self.pieces(off, len);
        if let Some((o, l)) = main {
            fallocate(&self.main, mode, o, l)?;
        }
        if let Some((p, o, l)) = pool {
            self.changed(fallocate(p, mode, o, l))?;
        }
        Ok(())
    }

    /// Gives the replica `total` bytes (see the module docs for the order).
    pub(crate) fn set_len(&self, total: u64) -> std::io::Result<()> {
        let Some(p) = &self.pool else {
            return self.main.set_len(total);
        };
        let s = self.split.load(Ordering::Acquire);
        if total >= s {
            return self.changed(p.set_len(total - s));
        }
        p.set_len(0)?;
        p.sync_all()?;
        self.main.set_len(total)?;
        self.split.store(total, Ordering::Release);
        Ok(())
    }

    /// After a change to the pool file (done or failed: a failed write may have left dirty
    /// pages): the next flush syncs it. Marked after the change, not before, so a flush that
    /// swapped the mark while the change ran cannot leave it unsynced for every later flush.
    fn changed<T>(&self, r: std::io::Result<T>) -> std::io::Result<T> {
        self.pool_dirty.store(true, Ordering::Release);
        r
    }

    pub(crate) fn sync_data(&self) -> std::io::Result<()> {
        self.sync_pool(File::sync_data)?;
        self.main.sync_data()
    }

    pub(crate) fn sync_all(&self) -> std::io::Result<()> {
        self.sync_pool(File::sync_all)?;
        self.main.sync_all()
    }

    fn sync_pool(&self, sync: fn(&File) -> std::io::Result<()>) -> std::io::Result<()> {
        let Some(p) = &self.pool else { return Ok(()) };
        if !self.pool_dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        sync(p).inspect_err(|_| self.pool_dirty.store(true, Ordering::Release))
    }

    /// Reads from the pool file past the cache where the kernel can.
    fn read_pool(&self, f: &File, buf: &mut [u8], mut off: u64) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            if self.no_dontcache.load(Ordering::Relaxed) {
                return f.read_exact_at(&mut buf[done..], off);
            }
            let iov = libc::iovec {
                iov_base: buf[done..].as_mut_ptr().cast(),
                iov_len: buf.len() - done,
            };
            // SAFETY: the iovec points into `buf`, which outlives the call.
            let n = unsafe {
                libc::preadv2(
                    f.as_raw_fd(),
                    &iov,
                    1,
                    off as libc::off_t,
                    libc::RWF_DONTCACHE,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
                        self.no_dontcache.store(true, Ordering::Relaxed);
                        continue;
                    }
                    Some(libc::EINTR) => continue,
                    _ => return Err(e),
                }
            }
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "read past the end of the pool file",
                ));
            }
            done += n as usize;
            off += n as u64;
        }
        Ok(())
    }
}

/// Where a file holds data, as the file system says (`SEEK_DATA`/`SEEK_HOLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Byte ranges `(offset, len)` of the replica that hold data, in order.
    pub(crate) ranges: Vec<(u64, u64)>,
    /// From here on nothing was looked at (the time ran out, or the file system cannot say):
    /// count it all as data.
    pub(crate) unknown_from: Option<u64>,
}

impl Data {
    /// Where the replica's files hold data, in the replica's offsets: what a write since the
    /// last persisted map may have allocated is there too (written direct, or dirty in the
    /// page cache, which the file system reports as data). Looks until `deadline`.
    pub(crate) fn find_data(&self, deadline: std::time::Instant) -> Found {
        let s = self.split.load(Ordering::Acquire);
        let mut found = Found {
            ranges: Vec::new(),
            unknown_from: None,
        };
        let main_len = self.main.metadata().map_or(0, |m| m.len()).min(s);
        let mut parts = vec![(&self.main, 0u64, main_len)];
        if let Some(p) = &self.pool {
            parts.push((p, s, p.metadata().map_or(0, |m| m.len())));
        }
        for (f, base, len) in parts {
            match seek_data(f, len, deadline) {
                Ok(r) => found.ranges.extend(r.iter().map(|&(o, l)| (base + o, l))),
                Err(at) => {
                    found.unknown_from = Some(base + at);
                    break;
                }
            }
        }
        found
    }
}

/// The data ranges of `f` below `len`; `Err(offset)` from where it could not say (the file
/// system has no `SEEK_DATA`, or `deadline` passed).
fn seek_data(f: &File, len: u64, deadline: std::time::Instant) -> Result<Vec<(u64, u64)>, u64> {
    let fd = f.as_raw_fd();
    let seek = |off: u64, whence: libc::c_int| -> std::io::Result<u64> {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
        match r {
            r if r >= 0 => Ok(r as u64),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let mut out = Vec::new();
    let mut off = 0;
    while off < len {
        if std::time::Instant::now() >= deadline {
            return Err(off);
        }
        let start = match seek(off, libc::SEEK_DATA) {
            Ok(x) => x,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(_) => return Err(off),
        };
        if start >= len {
            break;
        }
        let end = seek(start, libc::SEEK_HOLE).map_err(|_| start)?.min(len);
        out.push((start, end - start));
        off = end;
    }
    Ok(out)
}

fn fallocate(f: &File, mode: libc::c_int, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let rc =
        unsafe { libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// After a write to the pool file ending at `end`: if it ended a MiB, that MiB's writeback
/// starts, and the MiB [`KEEP_CHUNKS`] before it leaves the cache. Advice only: a failure
/// changes nothing (the data is in the cache, and a flush syncs it).
fn write_behind(f: &File, end: u64) {
    if !end.is_multiple_of(CHUNK) {
        return;
    }
    // SAFETY: on a descriptor we own; no memory is passed.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            (end - CHUNK) as libc::off64_t,
            CHUNK as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
        if let Some(old) = end.checked_sub((KEEP_CHUNKS + 1) * CHUNK) {
            libc::posix_fadvise(
                f.as_raw_fd(),
                old as libc::off_t,
                CHUNK as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
}
