//! Durable bookkeeping beside a replica's bytes: where a node keeps the activity log and the
//! records of what its peers missed, so that a restart forgets neither (issue 17).
//!
//! A store that survives restarts hands out one [`Ledger`] per replica; volatile stores have
//! none (their replicas come back empty, and with them any history). What the bytes mean is the
//! node's business (`trireme-node`); the ledger only offers the two kinds of durable write the
//! node needs, each at its cost:
//!
//! * a **paged log** written in place, one 4 KiB page at a time, durable (`fdatasync`) when the
//!   call returns: the activity log, written on the write path when a write reaches an extent
//!   not yet marked on disk. A page is written whole; if power fails during the write the page
//!   may be torn, which the node detects by its checksum (and then assumes the worst).
//! * a **record blob** replaced atomically (a temporary file, `fsync`, rename, `fsync` of the
//!   directory): the peers' dirty records, saved lazily.
//!
//! A parity volume's replica has a third part, the **held map** (`held.rs`): pages written in
//! place, several per call and durable when it returns. Its file exists only for such a
//! replica: that it exists is how a restarted node knows to keep the map. Beside it, the
//! map's **live copy**: the map as the node holds it in memory, bytes rewritten in place on
//! every change and never synced, so it outlives the node's process but not the machine. It
//! is read back only in the boot of the machine that wrote it (the kernel's boot id, as the
//! file store tells a process crash from a power loss).
//!
//! File store layout: `replica-<volume>.al` (the paged log), `replica-<volume>.dirty` (the
//! records), `replica-<volume>.held` (the held map) and `replica-<volume>.live` (its live
//! copy: a header page naming the boot, then the bits), next to the replica's data and
//! metadata files.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::StoreError;

/// Size of one page of the paged log.
pub const PAGE: usize = 4096;

/// Writes whole `pages` at page `first` of a log kept in memory (the simulator's ledgers,
/// tests'), lengthening it as a file would.
pub fn put_pages(log: &mut Vec<u8>, first: u64, pages: &[u8]) {
    let at = first as usize * PAGE;
    if log.len() < at + pages.len() {
        log.resize(at + pages.len(), 0);
    }
    log[at..at + pages.len()].copy_from_slice(pages);
}

/// Durable bookkeeping of one replica (see the module docs).
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// The whole paged log as last written (empty if it was never written).
    fn read_log(&self) -> Result<Vec<u8>, StoreError>;
    /// Writes whole pages at page `first`; durable when this returns.
    fn write_log(&self, first: u64, pages: &[u8]) -> Result<(), StoreError>;
    /// The record blob as last saved, or `None` if none was ever saved.
    fn read_records(&self) -> Result<Option<Vec<u8>>, StoreError>;
    /// Replaces the record blob: after a crash, either the old or the new one is read back.
    fn save_records(&self, bytes: &[u8]) -> Result<(), StoreError>;
    /// The held map as last written, or `None` if the replica keeps none.
    fn read_held(&self) -> Result<Option<Vec<u8>>, StoreError>;
    /// Starts an empty held map of `len` bytes (zeroes), durably: from now on the replica
    /// keeps one.
    fn create_held(&self, len: u64) -> Result<(), StoreError>;
    /// Writes whole pages of the held map, each at its page index; durable when this returns.
    fn write_held(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError>;
    /// The held map's live copy as the node's last process left it, if that process ran in
    /// this boot of the machine; `None` after a reboot or a power loss (the copy is never
    /// synced), or if none was started.
    fn read_live_held(&self) -> Result<Option<Vec<u8>>, StoreError>;
    /// Starts the live copy as `bits`, of this boot from now (a crash meanwhile leaves none).
    fn start_live_held(&self, bits: &[u8]) -> Result<(), StoreError>;
    /// Writes `bytes` at byte `at` of the live copy's bits: they outlive the process once this
    /// returns, not the machine.
    fn write_live_held(&self, at: u64, bytes: &[u8]) -> Result<(), StoreError>;
}

const LIVE_MAGIC: &[u8; 4] = b"TRLV";
const LIVE_VERSION: u32 = 1;
/// Where the boot id sits in the live copy's header, and its room.
const BOOT_AT: usize = 16;
const BOOT_LEN: usize = 64;

/// The live copy's header page: magic, version, the bits' length, the boot (empty: not
/// started), crc32c of the rest.
fn live_header(boot: &str, len: u64) -> Vec<u8> {
    let mut h = vec![0u8; PAGE];
    h[..4].copy_from_slice(LIVE_MAGIC);
    h[4..8].copy_from_slice(&LIVE_VERSION.to_le_bytes());
    h[8..16].copy_from_slice(&len.to_le_bytes());
    let b = &boot.as_bytes()[..boot.len().min(BOOT_LEN)];
    h[BOOT_AT..BOOT_AT + b.len()].copy_from_slice(b);
    let crc = crc32c::crc32c(&h[..BOOT_AT + BOOT_LEN]);
    h[BOOT_AT + BOOT_LEN..BOOT_AT + BOOT_LEN + 4].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The bits of a live copy's file if a process of boot `boot` started it (and wrote every
/// byte it holds); `None` for any other bytes. An unknown boot trusts none.
pub fn live_bits<'a>(file: &'a [u8], boot: &str) -> Option<&'a [u8]> {
    let (h, bits) = (file.get(..PAGE)?, &file[PAGE.min(file.len())..]);
    let len = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let ok = boot != UNKNOWN_BOOT
        && !boot.is_empty()
        && boot.len() <= BOOT_LEN
        && h == live_header(boot, len)
        && bits.len() as u64 == len;
    ok.then_some(bits)
}

/// What [`boot_id`] says where the kernel does not tell.
pub const UNKNOWN_BOOT: &str = "unknown";

/// This boot of the kernel: a reboot or a power loss changes it.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| UNKNOWN_BOOT.into())
}

/// The file store's ledger: two files beside the replica.
#[derive(Debug)]
pub struct FileLedger {
    volume: u64,
    dir: PathBuf,
    log_path: PathBuf,
    records_path: PathBuf,
    held_path: PathBuf,
    /// Opened at the first log access.
    log: Mutex<Option<File>>,
    /// The held map's live copy, open once started.
    live: Mutex<Option<File>>,
    /// This boot of the machine ([`boot_id`]).
    boot: String,
}

impl FileLedger {
    pub fn new(dir: &Path, volume: u64) -> FileLedger {
        let (log_path, records_path) = FileLedger::paths(dir, volume);
        FileLedger {
            volume,
            dir: dir.to_path_buf(),
            log_path,
            records_path,
            held_path: FileLedger::held_path(dir, volume),
            log: Mutex::new(None),
            live: Mutex::new(None),
            boot: boot_id(),
        }
    }

    /// As [`FileLedger::new`], as if the machine ran boot `boot` (tests of a reboot).
    pub fn in_boot(dir: &Path, volume: u64, boot: &str) -> FileLedger {
        FileLedger {
            boot: boot.into(),
            ..FileLedger::new(dir, volume)
        }
    }

    /// The ledger's two files for `volume` in `dir`.
    pub fn paths(dir: &Path, volume: u64) -> (PathBuf, PathBuf) {
        (
            dir.join(format!("replica-{volume:016x}.al")),
            dir.join(format!("replica-{volume:016x}.dirty")),
        )
    }

    /// The held map's file for `volume` in `dir` (a parity replica's only).
    pub fn held_path(dir: &Path, volume: u64) -> PathBuf {
        dir.join(format!("replica-{volume:016x}.held"))
    }

    /// The held map's live copy for `volume` in `dir`.
    pub fn live_path(dir: &Path, volume: u64) -> PathBuf {
        dir.join(format!("replica-{volume:016x}.live"))
    }

    /// Removes the ledger files of `volume` (a deleted or re-created replica).
    pub fn remove(dir: &Path, volume: u64) {
        let (a, b) = FileLedger::paths(dir, volume);
        let _ = std::fs::remove_file(a);
        let _ = std::fs::remove_file(b);
        let _ = std::fs::remove_file(FileLedger::held_path(dir, volume));
        let _ = std::fs::remove_file(FileLedger::live_path(dir, volume));
    }

    fn io(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
        let volume = self.volume;
        move |source| StoreError::Io { volume, op, source }
    }

    fn with_log<T>(&self, f: impl FnOnce(&File) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut g = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let file = crate::private::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.log_path)
                .map_err(self.io("open activity log"))?;
            *g = Some(file);
        }
        f(g.as_ref().expect("opened above"))
    }
}

impl Ledger for FileLedger {
    fn read_log(&self) -> Result<Vec<u8>, StoreError> {
        match std::fs::read(&self.log_path) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(self.io("read activity log")(e)),
        }
    }

    fn write_log(&self, first: u64, pages: &[u8]) -> Result<(), StoreError> {
        if pages.is_empty() || !pages.len().is_multiple_of(PAGE) {
            return Err(StoreError::Invalid(format!(
                "activity log writes are whole {PAGE}-byte pages, not {} bytes",
                pages.len()
            )));
        }
        self.with_log(|f| {
            f.write_all_at(pages, first * PAGE as u64)
                .map_err(self.io("write activity log"))?;
            f.sync_data().map_err(self.io("sync activity log"))
        })
    }

    fn read_records(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match std::fs::read(&self.records_path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read dirty records")(e)),
        }
    }

    fn save_records(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.records_path.with_extension("dirty.tmp");
        let write = || -> std::io::Result<()> {
            {
                let f = crate::private::create(&tmp)?;
                f.write_all_at(bytes, 0)?;
                f.sync_all()?;
            }
            std::fs::rename(&tmp, &self.records_path)?;
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(self.io("save dirty records"))
    }

    fn read_held(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match std::fs::read(&self.held_path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read held map")(e)),
        }
    }

    fn create_held(&self, len: u64) -> Result<(), StoreError> {
        // Sized before it is named: a crash leaves no map, or a whole empty one.
        let tmp = self.held_path.with_extension("held.tmp");
        let create = || -> std::io::Result<()> {
            {
                let f = crate::private::create(&tmp)?;
                f.set_len(len)?;
                f.sync_all()?;
            }
            std::fs::rename(&tmp, &self.held_path)?;
            File::open(&self.dir)?.sync_all()
        };
        create().map_err(self.io("create held map"))
    }

    fn write_held(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        if let Some((_, p)) = pages.iter().find(|(_, p)| p.len() != PAGE) {
            return Err(StoreError::Invalid(format!(
                "held map writes are whole {PAGE}-byte pages, not {} bytes",
                p.len()
            )));
        }
        // Opened per flush: a flush that changes the map is rarer than a data write.
        let f = crate::private::options()
            .write(true)
            .open(&self.held_path)
            .map_err(self.io("open held map"))?;
        for (page, bytes) in pages {
            f.write_all_at(bytes, page * PAGE as u64)
                .map_err(self.io("write held map"))?;
        }
        f.sync_data().map_err(self.io("sync held map"))
    }

    fn read_live_held(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let path = FileLedger::live_path(&self.dir, self.volume);
        match std::fs::read(path) {
            Ok(b) => Ok(live_bits(&b, &self.boot).map(<[u8]>::to_vec)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read held map's live copy")(e)),
        }
    }

    fn start_live_held(&self, bits: &[u8]) -> Result<(), StoreError> {
        let mut g = self.live.lock().unwrap_or_else(|e| e.into_inner());
        *g = None;
        let f = crate::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(FileLedger::live_path(&self.dir, self.volume))
            .map_err(self.io("open held map's live copy"))?;
        // Not of this boot until every bit is in: a crash meanwhile leaves a copy no one takes.
        let len = bits.len() as u64;
        f.write_all_at(&live_header("", len), 0)
            .and_then(|()| f.set_len(PAGE as u64 + len))
            .and_then(|()| f.write_all_at(bits, PAGE as u64))
            .and_then(|()| f.write_all_at(&live_header(&self.boot, len), 0))
            .map_err(self.io("start held map's live copy"))?;
        *g = Some(f);
        Ok(())
    }

    fn write_live_held(&self, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let g = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let f = g.as_ref().ok_or_else(|| {
            StoreError::Invalid("the held map's live copy was not started".into())
        })?;
        f.write_all_at(bytes, PAGE as u64 + at)
            .map_err(self.io("write held map's live copy"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_records_round_trip_and_survive_reopening() {
        let d = tempfile::tempdir().unwrap();
        let l = FileLedger::new(d.path(), 7);
        assert!(l.read_log().unwrap().is_empty());
        assert_eq!(l.read_records().unwrap(), None);
        l.write_log(1, &[3u8; PAGE]).unwrap();
        l.write_log(0, &[1u8; 2 * PAGE]).unwrap();
        assert!(l.write_log(0, &[1u8; 10]).is_err(), "whole pages only");
        l.save_records(b"first").unwrap();
        l.save_records(b"second").unwrap();
        let again = FileLedger::new(d.path(), 7);
        assert_eq!(again.read_log().unwrap(), vec![1u8; 2 * PAGE]);
        assert_eq!(again.read_records().unwrap().unwrap(), b"second");
        assert_eq!(
            l.read_held().unwrap(),
            None,
            "a mirror's replica keeps no held map"
        );
        assert!(
            l.write_held(&[(0, &[1u8; PAGE])]).is_err(),
            "no map to write"
        );
        l.create_held(3 * PAGE as u64).unwrap();
        assert_eq!(l.read_held().unwrap().unwrap(), vec![0u8; 3 * PAGE]);
        l.write_held(&[(2, &[7u8; PAGE]), (0, &[5u8; PAGE])])
            .unwrap();
        assert!(
            l.write_held(&[(1, &[1u8; 10])]).is_err(),
            "whole pages only"
        );
        let held = again.read_held().unwrap().unwrap();
        assert_eq!(held[..PAGE], [5u8; PAGE]);
        assert_eq!(held[PAGE..2 * PAGE], [0u8; PAGE]);
        assert_eq!(held[2 * PAGE..], [7u8; PAGE]);
        FileLedger::remove(d.path(), 7);
        assert_eq!(FileLedger::new(d.path(), 7).read_held().unwrap(), None);
        assert!(!FileLedger::live_path(d.path(), 7).exists());
        assert!(FileLedger::new(d.path(), 7).read_log().unwrap().is_empty());
        assert_eq!(FileLedger::new(d.path(), 7).read_records().unwrap(), None);
    }

    #[test]
    fn the_live_copy_is_read_back_in_its_boot_only() {
        let d = tempfile::tempdir().unwrap();
        let l = FileLedger::in_boot(d.path(), 7, "boot-a");
        assert_eq!(l.read_live_held().unwrap(), None, "never started");
        assert!(l.write_live_held(0, &[1]).is_err(), "not started");
        l.start_live_held(&[0u8; 64]).unwrap();
        l.write_live_held(8, &[0xff, 0x01]).unwrap();
        let mut want = vec![0u8; 64];
        want[8..10].copy_from_slice(&[0xff, 0x01]);
        // The process dies; the next one in the same boot reads every byte written...
        let again = FileLedger::in_boot(d.path(), 7, "boot-a");
        assert_eq!(again.read_live_held().unwrap(), Some(want.clone()));
        // ...and one after a reboot or a power loss, none.
        assert_eq!(
            FileLedger::in_boot(d.path(), 7, "boot-b")
                .read_live_held()
                .unwrap(),
            None
        );
        assert_eq!(
            FileLedger::in_boot(d.path(), 7, UNKNOWN_BOOT)
                .read_live_held()
                .unwrap(),
            None,
            "a machine that does not tell its boot trusts no live copy"
        );
        // Started again (a shorter map): what it started with.
        again.start_live_held(&[3u8; 16]).unwrap();
        assert_eq!(l.read_live_held().unwrap(), Some(vec![3u8; 16]));
        // A start cut short (header not yet naming the boot) is no copy.
        let path = FileLedger::live_path(d.path(), 7);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..PAGE].copy_from_slice(&live_header("", 16));
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(l.read_live_held().unwrap(), None);
    }

    proptest::proptest! {
        /// Any bytes are refused or give bits of the length the header says, of this boot
        /// only (`fuzz/held_live` searches deeper).
        #[test]
        fn any_bytes_are_refused_or_are_this_boots_copy(
            noise in proptest::collection::vec((0usize..PAGE + 64, proptest::num::u8::ANY), 0..8),
        ) {
            let mut file = live_header("boot-a", 64);
            file.extend_from_slice(&[0u8; 64]);
            for (at, b) in noise {
                file[at] ^= b;
            }
            proptest::prop_assert_eq!(live_bits(&file, "boot-b"), None);
            if let Some(bits) = live_bits(&file, "boot-a") {
                proptest::prop_assert_eq!(bits.len(), 64);
                proptest::prop_assert_eq!(&file[..PAGE], &live_header("boot-a", 64)[..]);
            }
        }
    }
}
