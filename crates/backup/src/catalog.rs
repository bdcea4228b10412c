//! A backup directory: full and incremental backups of one volume, each an rbd diff file,
//! listed in `catalog.json` (replaced atomically). A backup is the diff from the previous
//! backup's snapshot to its own; restoring one applies the chain from the last full backup
//! before it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{BackupError, DiffStats};

pub const CATALOG: &str = "catalog.json";

/// One backup in a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The volume's snapshot it holds.
    pub snapshot: String,
    /// The snapshot of the backup it builds on (`None`: a full backup).
    pub from: Option<String>,
    /// Its diff file, in the directory.
    pub file: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// crc32c of the diff file.
    pub crc32c: u32,
    pub stats: DiffStats,
}

/// `catalog.json`: which volume, and its backups, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub volume: String,
    pub size: u64,
    pub backups: Vec<Entry>,
}

impl Catalog {
    /// The catalog in `dir`, if it has one.
    pub fn load(dir: &Path) -> Result<Option<Catalog>, BackupError> {
        let p = dir.join(CATALOG);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(invalid(format!("{}: {e}", p.display()))),
        };
        let c: Catalog = serde_json::from_str(&text)
            .map_err(|e| invalid(format!("{}: not a backup catalog: {e}", p.display())))?;
        c.check()
            .map_err(|e| invalid(format!("{}: {e}", p.display())))?;
        Ok(Some(c))
    }

    /// Every entry builds on one before it, names a plain file, and names a snapshot once.
    fn check(&self) -> Result<(), String> {
        for (k, e) in self.backups.iter().enumerate() {
            if self.backups[..k].iter().any(|x| x.snapshot == e.snapshot) {
                return Err(format!("backup {} is listed twice", e.snapshot));
            }
            if let Some(f) = &e.from {
                if !self.backups[..k].iter().any(|x| &x.snapshot == f) {
                    return Err(format!(
                        "backup {} builds on {f}, which is not listed before it",
                        e.snapshot
                    ));
                }
            }
            if e.file.contains('/') || e.file.starts_with('.') || e.file.is_empty() {
                return Err(format!("backup {} names file {:?}", e.snapshot, e.file));
            }
        }
        Ok(())
    }

    /// Writes the catalog to `dir`: a new file synced, then renamed over the old one.
    pub fn save(&self, dir: &Path) -> Result<(), BackupError> {
        let tmp = dir.join(format!("{CATALOG}.tmp"));
        let text = serde_json::to_string_pretty(self).expect("serializable");
        write_synced(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, dir.join(CATALOG))?;
        sync_dir(dir)
    }

    /// The chain that restores backup `snapshot` (the newest if `None`): from the full backup
    /// it builds on, oldest first.
    pub fn chain(&self, snapshot: Option<&str>) -> Result<Vec<&Entry>, BackupError> {
        let last = match snapshot {
            Some(s) => self
                .backups
                .iter()
                .find(|e| e.snapshot == s)
                .ok_or_else(|| {
                    invalid(format!(
                        "no backup of snapshot {s} here (there are: {})",
                        self.names()
                    ))
                })?,
            None => self
                .backups
                .last()
                .ok_or_else(|| invalid("the catalog lists no backup".into()))?,
        };
        let mut chain = vec![last];
        while let Some(f) = &chain.last().expect("one").from {
            let e = self
                .backups
                .iter()
                .find(|e| &e.snapshot == f)
                .expect("checked at load");
            chain.push(e);
        }
        chain.reverse();
        Ok(chain)
    }

    fn names(&self) -> String {
        self.backups
            .iter()
            .map(|e| e.snapshot.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn invalid(m: String) -> BackupError {
    BackupError::Invalid(m)
}

/// Creates `path` afresh for writing, mode 0600, refusing to follow a symbolic link or to
/// open a file that is there already (a stale one of ours, `.part` or `.tmp`, is removed first: the
/// directory is checked private by [`check_private_dir`]). Diffs and backups hold a volume's
/// data: nobody else may read them, nor point their name at another file.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::symlink_metadata(path) {
        Ok(m)
            if m.file_type().is_file()
                && path.extension().is_some_and(|e| e == "part" || e == "tmp") =>
        {
            std::fs::remove_file(path)?
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Refuses an output directory that another user may write (they could swap or plant the
/// files a diff or backup is written to, or read what lands there).
pub fn check_private_dir(dir: &Path) -> Result<(), BackupError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir)?;
    // SAFETY: geteuid takes nothing and cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me && m.uid() != 0 {
        return Err(invalid(format!(
            "{} belongs to another user (uid {}): diffs and backups go in a directory of yours",
            dir.display(),
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(invalid(format!(
            "{} may be written by other users (mode {:o}): diffs and backups go in a private directory (chmod go-w {})",
            dir.display(),
            m.mode() & 0o7777,
            dir.display()
        )));
    }
    Ok(())
}

/// Writes `bytes` to `path` (created afresh, 0600: [`create_private`]) and syncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), BackupError> {
    use std::io::Write;
    let mut f = create_private(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Syncs a directory, so the names in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// A file written through a crc32c of everything written.
#[derive(Debug)]
pub struct Summed<W> {
    pub inner: W,
    pub crc: u32,
}

impl<W: std::io::Write> std::io::Write for Summed<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(b)?;
        self.crc = crc32c::crc32c_append(self.crc, &b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The crc32c of a file's contents.
pub fn file_crc(path: &Path) -> Result<u32, BackupError> {
    crc_of(std::fs::File::open(path)?)
}

/// The crc32c of everything `f` reads.
pub fn crc_of(mut f: impl std::io::Read) -> Result<u32, BackupError> {
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
}

/// Where backup `snapshot`'s diff goes in `dir`.
pub fn file_for(dir: &Path, snapshot: &str) -> (String, PathBuf) {
    let name = format!("{snapshot}.rbdiff");
    let path = dir.join(&name);
    (name, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(s: &str, from: Option<&str>) -> Entry {
        Entry {
            snapshot: s.into(),
            from: from.map(String::from),
            file: format!("{s}.rbdiff"),
            created: 1,
            crc32c: 0,
            stats: DiffStats::default(),
        }
    }

    #[test]
    fn chains_go_back_to_the_full_backup_and_bad_catalogs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Catalog::load(dir.path()).unwrap(), None);
        let c = Catalog {
            volume: "v".into(),
            size: 4096,
            backups: vec![
                entry("a", None),
                entry("b", Some("a")),
                entry("c", None),
                entry("d", Some("c")),
                entry("e", Some("d")),
            ],
        };
        c.save(dir.path()).unwrap();
        let c = Catalog::load(dir.path()).unwrap().unwrap();
        let names = |ch: Vec<&Entry>| ch.iter().map(|e| e.snapshot.clone()).collect::<Vec<_>>();
        assert_eq!(names(c.chain(None).unwrap()), ["c", "d", "e"]);
        assert_eq!(names(c.chain(Some("b")).unwrap()), ["a", "b"]);
        assert!(c
            .chain(Some("zz"))
            .unwrap_err()
            .to_string()
            .contains("no backup"));
        for bad in [
            vec![entry("b", Some("a"))],
            vec![entry("a", None), entry("a", None)],
            vec![Entry {
                file: "../x".into(),
                ..entry("a", None)
            }],
        ] {
            let c = Catalog {
                volume: "v".into(),
                size: 1,
                backups: bad,
            };
            c.save(dir.path()).unwrap();
            assert!(Catalog::load(dir.path()).is_err());
        }
        std::fs::write(dir.path().join(CATALOG), "{").unwrap();
        assert!(Catalog::load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("not a backup catalog"));
    }
}
