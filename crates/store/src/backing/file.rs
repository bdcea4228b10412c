//! A clone's files: the map of blocks not yet filled (`replica-<id>.clone`, checksummed,
//! replaced atomically) and the log of blocks filled since (`replica-<id>.clone-log`).
//!
//! Map file, little-endian: `TRCLONE1`, volume, parent volume, parent snapshot, blocks,
//! blocks not filled (u64 each), the bitmap (one u64 per 64 blocks, bit set: not filled),
//! then a crc32c of all of it. Log record, 16 bytes: the block (u64), a crc32c of the volume
//! and the block (u32), and [`RECORD_MAGIC`] (u32). A record that fails its checks (torn by
//! a power loss: never synced, so its write was never flushed) is skipped.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::Bits;
use crate::StoreError;

const MAGIC: &[u8; 8] = b"TRCLONE1";
const RECORD_MAGIC: u32 = 0x7e11_f111;
const HEADER: usize = 8 + 5 * 8;

/// A clone's state as its files hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub volume: u64,
    pub parent: u64,
    pub snapshot: u64,
    pub blocks: u64,
    pub unfilled: Bits,
}

pub fn encode(s: &Saved) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + s.unfilled.words.len() * 8 + 4);
    out.extend_from_slice(MAGIC);
    for v in [s.volume, s.parent, s.snapshot, s.blocks, s.unfilled.count] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for w in &s.unfilled.words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

pub fn decode(b: &[u8]) -> Result<Saved, String> {
    if b.len() < HEADER + 4 || &b[..8] != MAGIC {
        return Err("not a clone map (bad magic or too short)".into());
    }
    let (body, tail) = b.split_at(b.len() - 4);
    let crc = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    let u = |i: usize| u64::from_le_bytes(body[8 + i * 8..16 + i * 8].try_into().expect("8"));
    let (volume, parent, snapshot, blocks, count) = (u(0), u(1), u(2), u(3), u(4));
    let words: Vec<u64> = body[HEADER..]
        .chunks(8)
        .map(|c| c.try_into().map(u64::from_le_bytes))
        .collect::<Result<_, _>>()
        .map_err(|_| "bitmap is not whole words".to_string())?;
    if words.len() as u64 != blocks.div_ceil(64) {
        return Err(format!(
            "bitmap of {} words for {blocks} blocks",
            words.len()
        ));
    }
    let set: u64 = words.iter().map(|w| u64::from(w.count_ones())).sum();
    let past_end = match blocks % 64 {
        0 => 0,
        r => words.last().map_or(0, |w| w >> r),
    };
    if set != count || past_end != 0 {
        return Err(format!("bitmap has {set} blocks set, header says {count}"));
    }
    Ok(Saved {
        volume,
        parent,
        snapshot,
        blocks,
        unfilled: Bits { words, count },
    })
}

fn record(volume: u64, block: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&block.to_le_bytes());
    let mut keyed = [0u8; 16];
    keyed[..8].copy_from_slice(&volume.to_le_bytes());
    keyed[8..].copy_from_slice(&block.to_le_bytes());
    r[8..12].copy_from_slice(&crc32c::crc32c(&keyed).to_le_bytes());
    r[12..].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    r
}

/// The blocks of the log's valid records.
pub fn replay(volume: u64, log: &[u8]) -> Vec<u64> {
    log.chunks_exact(16)
        .filter_map(|c| {
            let block = u64::from_le_bytes(c[..8].try_into().expect("8"));
            (c == record(volume, block)).then_some(block)
        })
        .collect()
}

#[derive(Debug)]
pub(crate) struct CloneFiles {
    dir: PathBuf,
    volume: u64,
    /// The log, opened for appending at its first use.
    log: Mutex<Option<Arc<File>>>,
}

impl CloneFiles {
    pub(crate) fn new(dir: &Path, volume: u64) -> CloneFiles {
        CloneFiles {
            dir: dir.to_path_buf(),
            volume,
            log: Mutex::new(None),
        }
    }
    fn map_path(&self) -> PathBuf {
        self.dir.join(format!("replica-{:016x}.clone", self.volume))
    }
    fn log_path(&self) -> PathBuf {
        self.dir
            .join(format!("replica-{:016x}.clone-log", self.volume))
    }
    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            volume: self.volume,
            op,
            source,
        }
    }

    pub(crate) fn remove_all(&self) {
        *self.log.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let map = std::fs::remove_file(self.map_path()).is_ok();
        let log = std::fs::remove_file(self.log_path()).is_ok();
        // Durable only if something went (a fresh replica's creation has nothing to remove).
        if map || log {
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
        }
    }

    /// The clone's state, its log replayed; `None` if the replica is no clone.
    pub(crate) fn load(&self, volume: u64) -> Result<Option<Saved>, StoreError> {
        let path = self.map_path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = std::fs::remove_file(self.log_path());
                return Ok(None);
            }
            Err(e) => return Err(self.io("read clone map")(e)),
        };
        let corrupt = |what: String| StoreError::Corrupt {
            path: path.display().to_string(),
            what,
        };
        let mut s = decode(&bytes).map_err(corrupt)?;
        if s.volume != volume {
            return Err(corrupt(format!(
                "map of volume {} beside replica {volume}",
                s.volume
            )));
        }
        let log = match std::fs::read(self.log_path()) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(self.io("read clone log")(e)),
        };
        for l in replay(volume, &log) {
            if l < s.blocks {
                s.unfilled.clear(l);
            }
        }
        Ok(Some(s))
    }

    /// Replaces the map file atomically.
    pub(crate) fn save(&self, s: &Saved) -> Result<(), StoreError> {
        crate::file::write_atomically(&self.map_path(), &self.dir, &encode(s))
            .map_err(self.io("save clone map"))
    }

    fn log_file(&self) -> Result<Arc<File>, StoreError> {
        let mut g = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &*g {
            return Ok(f.clone());
        }
        let f = crate::private::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(self.io("open clone log"))?;
        let f = Arc::new(f);
        *g = Some(f.clone());
        Ok(f)
    }

    /// Appends one record per block, in one write (not synced).
    pub(crate) fn append(&self, blocks: &[u64]) -> Result<(), StoreError> {
        let mut buf = Vec::with_capacity(blocks.len() * 16);
        for &b in blocks {
            buf.extend_from_slice(&record(self.volume, b));
        }
        (&*self.log_file()?)
            .write_all(&buf)
            .map_err(self.io("append to clone log"))
    }

    pub(crate) fn sync_log(&self) -> Result<(), StoreError> {
        self.log_file()?
            .sync_data()
            .map_err(self.io("sync clone log"))
    }

    /// Empties the log (the map file holds all it held).
    pub(crate) fn empty_log(&self) -> Result<(), StoreError> {
        let f = self.log_file()?;
        f.set_len(0).map_err(self.io("empty clone log"))?;
        f.sync_all().map_err(self.io("sync clone log"))
    }

    #[cfg(test)]
    pub(crate) fn log_bytes(&self) -> Vec<u8> {
        std::fs::read(self.log_path()).expect("read log")
    }
}
