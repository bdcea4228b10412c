//! A replica's version files (`format.rs` says what is in them): the main file, one file
//! per snapshot, and the redirect log; reading them back at open.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::format;
use super::table::{self, Map, Table, BLOCK, ZERO};
use crate::StoreError;

/// A replica's version files.
#[derive(Debug)]
pub(super) struct Files {
    pub(super) dir: PathBuf,
    pub(super) volume: u64,
    /// The two redirect logs, each opened at its first use (the lock is held only to open
    /// it). Records go to one at a time; a fold switches them (`durable.rs`).
    log: [Mutex<Option<Arc<File>>>; 2],
    /// A log file was created since the directory was last synced for it.
    log_created: std::sync::atomic::AtomicBool,
}

impl Files {
    fn prefix(&self) -> String {
        format!("replica-{:016x}.", self.volume)
    }
    pub(super) fn main(&self) -> PathBuf {
        self.dir.join(format!("{}versions", self.prefix()))
    }
    pub(super) fn snap(&self, id: u64) -> PathBuf {
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

    pub(super) fn new(dir: &Path, volume: u64) -> Files {
        Files {
            dir: dir.to_path_buf(),
            volume,
            log: [Mutex::new(None), Mutex::new(None)],
            log_created: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(super) fn remove_all(&self) {
        let _ = std::fs::remove_file(self.main());
        // An open log goes with its file: records appended to an unlinked file would be
        // lost to the next open.
        for side in 0..2 {
            let mut log = self.log[side].lock().unwrap_or_else(|e| e.into_inner());
            *log = None;
            let _ = std::fs::remove_file(self.log_path(side));
        }
        for (_, p) in self.snap_files() {
            let _ = std::fs::remove_file(p);
        }
    }

    pub(super) fn save(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
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
    pub(super) fn load(&self, phys_size: u64) -> Result<Option<Loaded>, StoreError> {
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
            || !m.homes.is_multiple_of(BLOCK)
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
        let (blocks, homes, phys_blocks) = (m.size / BLOCK, m.homes / BLOCK, phys_size / BLOCK);
        // A version's entries lie below its own size; they name blocks inside the replica.
        let check = |map: &Map, blocks: u64, path: &Path| -> Result<(), StoreError> {
            match map
                .iter()
                .find(|&(l, e)| l >= blocks || (e.phys != ZERO && e.phys >= phys_blocks))
            {
                Some((l, e)) => Err(self.corrupt(
                    path,
                    format!("block {l} maps to {} outside the replica", e.phys),
                )),
                None => Ok(()),
            }
        };
        if let Some(s) = m
            .snaps
            .iter()
            .find(|s| !s.size.is_multiple_of(BLOCK) || s.size > phys_size)
        {
            return Err(self.corrupt(
                &path,
                format!(
                    "snapshot {} of {} bytes over {phys_size} physical bytes",
                    s.id, s.size
                ),
            ));
        }
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
            check(&map, s.size / BLOCK, &p)?;
            snaps.insert(
                s.id,
                table::Snap {
                    gen: s.gen,
                    created: s.created,
                    blocks: s.size / BLOCK,
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
        let mut head = format::apply(&prev.map(|(_, m)| m).unwrap_or_default(), &m.head);
        // The redirects answered since the main file was written, in the order they were made.
        // A snapshot record takes the head those before it built, as the table did.
        let mut last_seq = m.applied;
        let mut replayed = 0;
        let mut gen = m.gen;
        let mut replayed_snaps = Vec::new();
        for r in self.read_log()? {
            if r.seq() <= m.applied {
                continue;
            }
            match r {
                format::LogRecord::Block { block, entry, .. } => {
                    head.insert(block, entry);
                }
                format::LogRecord::Snapshot {
                    id, synced: false, ..
                } => {
                    // Never flushed: what it would hold may be gone (see `LogRecord`).
                    tracing::warn!(
                        volume = self.volume,
                        id,
                        "dropping a snapshot that was never flushed"
                    );
                    gen += 1;
                }
                format::LogRecord::Snapshot { id, created, .. } => {
                    // A resize writes the main file before any record follows it: the head
                    // had the main file's size.
                    check(&head, blocks, &self.log_path(0))?;
                    if snaps.contains_key(&id) {
                        return Err(self
                            .corrupt(&self.log_path(0), format!("snapshot {id} is taken twice")));
                    }
                    let map = head.clone();
                    snaps.insert(
                        id,
                        table::Snap {
                            gen,
                            created,
                            blocks,
                            map,
                        },
                    );
                    gen += 1;
                    replayed_snaps.push(id);
                }
            }
            last_seq = r.seq();
            replayed += 1;
        }
        check(&head, blocks, &self.log_path(0))?;
        check(&head, blocks, &path)?;
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
        let table = Table::rebuilt(blocks, homes, phys_blocks, gen, head, snaps);
        Ok(Some(Loaded {
            size: m.size,
            table,
            last_seq,
            replayed,
            replayed_snaps,
            open: m.flags & format::FLAG_OPEN != 0,
        }))
    }

    /// Redirect log `side` (0 or 1).
    fn log_path(&self, side: usize) -> PathBuf {
        match side {
            0 => self.dir.join(format!("{}vlog", self.prefix())),
            _ => self.dir.join(format!("{}vlog2", self.prefix())),
        }
    }

    /// The valid records of both redirect logs, by sequence.
    fn read_log(&self) -> Result<Vec<format::LogRecord>, StoreError> {
        let mut out = Vec::new();
        for side in 0..2 {
            match std::fs::read(self.log_path(side)) {
                Ok(b) => out.extend(format::decode_log(&b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.corrupt(&self.log_path(side), e)),
            }
        }
        out.sort_unstable_by_key(|r| r.seq());
        out.dedup_by_key(|r| r.seq());
        Ok(out)
    }

    /// Writes `records` from `slot` of redirect log `side` on, in one write (no sync: see
    /// `format::LogRecord`).
    pub(super) fn append(
        &self,
        side: usize,
        slot: u64,
        records: &[format::LogRecord],
    ) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            volume: self.volume,
            op: "write the redirect log",
            source,
        };
        let f = {
            let mut log = self.log[side].lock().unwrap_or_else(|e| e.into_inner());
            match &*log {
                Some(f) => f.clone(),
                None => {
                    // Perhaps created: its directory entry is synced with its first sync.
                    self.log_created
                        .store(true, std::sync::atomic::Ordering::Release);
                    let f = Arc::new(
                        crate::private::options()
                            .create(true)
                            .truncate(false)
                            .read(true)
                            .write(true)
                            .open(self.log_path(side))
                            .map_err(io)?,
                    );
                    *log = Some(f.clone());
                    f
                }
            }
        };
        let bytes: smallvec::SmallVec<[u8; 256]> =
            records.iter().flat_map(format::encode_log).collect();
        f.write_all_at(&bytes, slot * format::LOG_RECORD as u64)
            .map_err(io)
    }

    /// Makes both redirect logs durable, every record written so far (and their directory
    /// entries, if a file is new). Both: while a fold writes the main file, records answered
    /// before the switch are in the log it retired. A log with nothing written since its
    /// last sync costs a system call.
    pub(super) fn sync_log(&self) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            volume: self.volume,
            op: "sync the redirect log",
            source,
        };
        for log in &self.log {
            let f = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(f) = f {
                f.sync_data().map_err(io)?;
            }
        }
        if self
            .log_created
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            if let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
                self.log_created
                    .store(true, std::sync::atomic::Ordering::Release);
                return Err(io(e));
            }
        }
        Ok(())
    }

    /// Empties redirect log `side`: the main file holds every record in it. The caller keeps
    /// appends to it out meanwhile.
    pub(super) fn truncate_log(&self, side: usize) -> Result<(), StoreError> {
        let log = self.log[side].lock().unwrap_or_else(|e| e.into_inner());
        let r = match &*log {
            Some(f) => f.set_len(0),
            None => match std::fs::remove_file(self.log_path(side)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        };
        r.map_err(|source| StoreError::Io {
            volume: self.volume,
            op: "empty the redirect log",
            source,
        })
    }
}

/// What [`Files::load`] found.
#[derive(Debug)]
pub(super) struct Loaded {
    pub(super) size: u64,
    pub(super) table: Table,
    /// The last redirect-log sequence the table holds.
    pub(super) last_seq: u64,
    /// Log records applied over the main file (redirects answered after its last write).
    pub(super) replayed: usize,
    /// Snapshots the log holds and the main file does not list: their files are written at
    /// the checkpoint that follows the open.
    pub(super) replayed_snaps: Vec<u64>,
    /// The main file said open: the last process did not close it.
    pub(super) open: bool,
}
