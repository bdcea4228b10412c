//! The kernel devices this host has mapped: one record per volume in
//! `/run/trireme/devices/VOLUME.json` (tmpfs: a reboot ends every device, and their records
//! with them). A `map` that finds the record of a device whose server died hands the same
//! device a new server; `unmap` and `device list` read them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::KernelError;

/// Where the records live.
pub const DIR: &str = "/run/trireme/devices";

/// One mapped device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapped {
    pub volume: String,
    /// `nbd`, `ublk` or `loop`.
    pub kind: String,
    pub index: u32,
    /// The process serving it now.
    pub pid: u32,
    /// The writer's epoch.
    pub epoch: u64,
    /// Why this kind of device (`--device`, or what the kernel has).
    pub why: String,
    /// The sockets an NBD device was connected with (one per CPU, at most 4); a record from
    /// before they were counted had one.
    #[serde(default = "one")]
    pub conns: u32,
}

fn one() -> u32 {
    1
}

impl Mapped {
    /// Its block device.
    pub fn path(&self) -> PathBuf {
        match self.kind.as_str() {
            "ublk" => PathBuf::from(format!("/dev/ublkb{}", self.index)),
            "loop" => PathBuf::from(format!("/dev/loop{}", self.index)),
            _ => PathBuf::from(format!("/dev/nbd{}", self.index)),
        }
    }

    /// What the device says it serves, for the kernel to check at a reconfigure.
    pub fn identifier(volume: &str) -> String {
        format!("trireme:{volume}")
    }

    /// Whether the process that serves it runs: exists, and is no zombie (killed, and not
    /// reaped yet by a parent that died too, as in a container whose init reaps late).
    pub fn serving(&self) -> bool {
        self.pid != 0 && crate::process::alive(self.pid)
    }
}

fn file(dir: &Path, volume: &str) -> PathBuf {
    dir.join(format!("{volume}.json"))
}

/// The record of `volume`'s device, if there is one. A record that does not decode is an
/// error naming the file: it is never taken for a device.
pub fn get(dir: &Path, volume: &str) -> Result<Option<Mapped>, KernelError> {
    let p = file(dir, volume);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            KernelError::Record(format!(
                "{}: {e} (remove it if no device serves it)",
                p.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(KernelError::io(p.display().to_string())(e)),
    }
}

/// Writes `m` (created private to root, replaced whole by a rename).
pub fn put(dir: &Path, m: &Mapped) -> Result<(), KernelError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(KernelError::io(dir.display().to_string()))?;
    let p = file(dir, &m.volume);
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(KernelError::io(tmp.display().to_string()))?;
    let body = serde_json::to_vec(m).expect("a record always serializes");
    f.write_all(&body)
        .and_then(|()| f.sync_all())
        .map_err(KernelError::io(tmp.display().to_string()))?;
    std::fs::rename(&tmp, &p).map_err(KernelError::io(p.display().to_string()))
}

/// Forgets `volume`'s device.
pub fn remove(dir: &Path, volume: &str) {
    let _ = std::fs::remove_file(file(dir, volume));
}

/// Every record, by volume; one that does not decode is returned as its error.
pub fn list(dir: &Path) -> Vec<Result<Mapped, KernelError>> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Result<Mapped, KernelError>> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let vol = name.strip_suffix(".json")?.to_string();
            get(dir, &vol).transpose()
        })
        .collect();
    out.sort_by(|a, b| match (a, b) {
        (Ok(a), Ok(b)) => a.volume.cmp(&b.volume),
        _ => std::cmp::Ordering::Equal,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_a_bad_one_is_named() {
        let d = std::env::temp_dir().join(format!("trireme-mapped-{}", std::process::id()));
        let m = Mapped {
            volume: "v".into(),
            kind: "nbd".into(),
            index: 3,
            pid: std::process::id(),
            epoch: 7,
            why: "ublk_drv is not loaded".into(),
            conns: 2,
        };
        put(&d, &m).unwrap();
        assert_eq!(get(&d, "v").unwrap(), Some(m.clone()));
        assert!(m.serving());
        assert_eq!(m.path(), PathBuf::from("/dev/nbd3"));
        // A record from before sockets were counted: one.
        std::fs::write(
            d.join("u.json"),
            br#"{"volume":"u","kind":"nbd","index":1,"pid":1,"epoch":1,"why":""}"#,
        )
        .unwrap();
        assert_eq!(get(&d, "u").unwrap().unwrap().conns, 1);
        remove(&d, "u");
        std::fs::write(d.join("w.json"), b"{not json").unwrap();
        let e = get(&d, "w").unwrap_err().to_string();
        assert!(e.contains("w.json"), "{e}");
        assert_eq!(list(&d).len(), 2);
        remove(&d, "v");
        assert_eq!(get(&d, "v").unwrap(), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
