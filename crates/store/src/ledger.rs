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
//! replica: that it exists is how a restarted node knows to keep the map.
//!
//! File store layout: `replica-<volume>.al` (the paged log), `replica-<volume>.dirty` (the
//! records) and `replica-<volume>.held` (the held map), next to the replica's data and
//! metadata files.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::StoreError;

/// Size of one page of the paged log.
pub const PAGE: usize = 4096;

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

    /// Removes the ledger files of `volume` (a deleted or re-created replica).
    pub fn remove(dir: &Path, volume: u64) {
        let (a, b) = FileLedger::paths(dir, volume);
        let _ = std::fs::remove_file(a);
        let _ = std::fs::remove_file(b);
        let _ = std::fs::remove_file(FileLedger::held_path(dir, volume));
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
        assert!(FileLedger::new(d.path(), 7).read_log().unwrap().is_empty());
        assert_eq!(FileLedger::new(d.path(), 7).read_records().unwrap(), None);
    }
}
