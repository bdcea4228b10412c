//! An error-injecting wrapper for fault tests: any store, whose replicas fail reads, writes or
//! flushes with EIO at configured rates.
//!
//! The rates live in a small text file (`read=0.01 write=0.02 flush=0.1 seed=7`, any order,
//! whitespace or commas between; an empty or missing file injects nothing), re-read when it
//! changes, so a test can turn faults on and off while the node runs. A failed write or
//! write-zeroes may or may not have reached the store (as with a real device): the wrapper
//! applies it first when its coin says so.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Replica, Store, StoreError};

/// Injection rates, each a probability in `[0, 1]`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub read: f64,
    pub write: f64,
    pub flush: f64,
    pub seed: u64,
}

impl Rates {
    /// Parses `key=value` pairs; unknown keys and bad values are errors.
    pub fn parse(s: &str) -> Result<Rates, FaultSpecError> {
        let mut r = Rates::default();
        for item in s.split([',', ' ', '\n', '\t']).filter(|x| !x.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| FaultSpecError::NotKeyValue(item.to_string()))?;
            let not_number = || FaultSpecError::NotNumber {
                key: k.to_string(),
                value: v.to_string(),
            };
            let p = || -> Result<f64, FaultSpecError> {
                let p: f64 = v.parse().map_err(|_| not_number())?;
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(FaultSpecError::NotProbability {
                        key: k.to_string(),
                        p,
                    })
                }
            };
            match k {
                "read" => r.read = p()?,
                "write" => r.write = p()?,
                "flush" => r.flush = p()?,
                "seed" => r.seed = v.parse().map_err(|_| not_number())?,
                _ => return Err(FaultSpecError::UnknownKind(k.to_string())),
            }
        }
        Ok(r)
    }
}

/// What is wrong with a fault spec.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultSpecError {
    #[error("fault spec item {0:?} is not key=value")]
    NotKeyValue(String),
    #[error("{key}: {value:?} is not a number")]
    NotNumber { key: String, value: String },
    #[error("{key}: {p} is not a probability")]
    NotProbability { key: String, p: f64 },
    #[error("unknown fault kind {0:?} (read, write, flush, seed)")]
    UnknownKind(String),
}

#[derive(Debug)]
struct State {
    rates: Rates,
    rng: u64,
    /// The spec's text as last read (compared whole: a rewrite within one tick of the file
    /// system's clock leaves the modification time as it was).
    text: Option<String>,
    checked: Option<Instant>,
}

/// Reads the spec file (at most every 100 ms) and draws the coins.
#[derive(Debug)]
struct Injector {
    path: PathBuf,
    state: Mutex<State>,
}

impl Injector {
    /// True if this operation of kind `op` must fail.
    fn fail(&self, op: &str) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.checked
            .is_none_or(|t| now - t > Duration::from_millis(100))
        {
            s.checked = Some(now);
            let text = std::fs::read_to_string(&self.path).unwrap_or_default();
            if s.text.as_ref() != Some(&text) {
                match Rates::parse(&text) {
                    Ok(r) => {
                        if r.seed != s.rates.seed || s.rng == 0 {
                            s.rng = r.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                        }
                        s.rates = r;
                        tracing::warn!(path = %self.path.display(), rates = ?r, "fault injection");
                    }
                    Err(e) => {
                        tracing::error!(path = %self.path.display(), "fault spec ignored: {e}")
                    }
                }
                s.text = Some(text);
            }
        }
        let p = match op {
            "read" => s.rates.read,
            "flush" => s.rates.flush,
            _ => s.rates.write,
        };
        if p <= 0.0 {
            return false;
        }
        // xorshift64
        let mut x = s.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.rng = x;
        ((x >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// A store whose replicas fail at the rates in a spec file.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    injector: Arc<Injector>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>, spec: &Path) -> FaultyStore {
        FaultyStore {
            inner,
            injector: Arc::new(Injector {
                path: spec.to_path_buf(),
                state: Mutex::new(State {
                    rates: Rates::default(),
                    rng: 0,
                    text: None,
                    checked: None,
                }),
            }),
        }
    }

    fn wrap(&self, r: Arc<dyn Replica>) -> Arc<dyn Replica> {
        Arc::new(FaultyReplica {
            inner: r,
            injector: self.injector.clone(),
            lost: std::sync::atomic::AtomicU64::new(0),
        })
    }
}

impl crate::filter::StoreFilter for FaultyStore {
    fn next(&self) -> &dyn Store {
        &*self.inner
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        self.inner.create(volume, size).map(|r| self.wrap(r))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.inner
            .open_all()
            .into_iter()
            .map(|r| r.map(|r| self.wrap(r)))
            .collect()
    }
}

#[derive(Debug)]
struct FaultyReplica {
    inner: Arc<dyn Replica>,
    injector: Arc<Injector>,
    /// Set by an injected flush failure: as a real store does (`file.rs`), the copy's history
    /// is unknown from then on, so it answers a new incarnation (for this process's life: the
    /// wrapped store's own record is not changed).
    lost: std::sync::atomic::AtomicU64,
}

impl FaultyReplica {
    fn eio(&self, op: &'static str) -> StoreError {
        StoreError::Io {
            volume: self.inner.volume(),
            op,
            source: std::io::Error::other("injected fault"),
        }
    }
}

impl crate::filter::ReplicaFilter for FaultyReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn hole(&self, offset: u64, len: u64) -> bool {
        self.inner.hole(offset, len)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if self.injector.fail("read") {
            return Err(self.eio("read"));
        }
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        if self.injector.fail("write") {
            // Half the failed writes reached the device anyway.
            if self.injector.fail("write-applied") {
                let _ = self.inner.write(offset, data, fua);
            }
            return Err(self.eio("write"));
        }
        self.inner.write(offset, data, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        if self.injector.fail("write") {
            return Err(self.eio("write zeroes"));
        }
        self.inner.write_zeroes(offset, len, may_trim, fua)
    }
    fn flush(&self) -> Result<(), StoreError> {
        if self.injector.fail("flush") {
            self.lost.store(
                crate::new_incarnation(),
                std::sync::atomic::Ordering::Release,
            );
            return Err(self.eio("flush"));
        }
        self.inner.flush()
    }
    fn incarnation(&self) -> u64 {
        match self.lost.load(std::sync::atomic::Ordering::Acquire) {
            0 => self.inner.incarnation(),
            lost => lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_refuse_nonsense() {
        let r = Rates::parse("read=0.5, write=1 flush=0\nseed=9").unwrap();
        assert_eq!(
            r,
            Rates {
                read: 0.5,
                write: 1.0,
                flush: 0.0,
                seed: 9
            }
        );
        assert_eq!(Rates::parse("").unwrap(), Rates::default());
        assert!(Rates::parse("write=2").is_err());
        assert!(Rates::parse("trim=0.1").is_err());
        assert!(Rates::parse("write").is_err());
    }

    #[test]
    fn faults_follow_the_file() {
        let d = tempfile::tempdir().unwrap();
        let spec = d.path().join("faults");
        let s = FaultyStore::new(Arc::new(crate::MemoryStore::default()), &spec);
        let r = s.create(1, 1 << 20).unwrap();
        r.write(0, b"ok", false).unwrap();
        std::fs::write(&spec, "write=1 read=1 flush=1").unwrap();
        std::thread::sleep(Duration::from_millis(150));
        assert!(r.write(0, b"no", false).is_err());
        assert!(r.read(0, &mut [0u8; 2]).is_err());
        assert!(r.flush().is_err());
        std::fs::write(&spec, "").unwrap();
        std::thread::sleep(Duration::from_millis(150));
        r.write(0, b"ok", false).unwrap();
        r.flush().unwrap();
    }
}
