//! The memory store: thin replicas in RAM, a grain allocated on its first write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::map::{extents_from, whole_grains};
use crate::{check_range, Extent, Replica, Store, StoreError, StoreKind, GRAIN};

/// Largest memory replica accepted: the grain table itself costs ~40 bytes per grain.
const MAX_MEMORY_REPLICA: u64 = 256 << 30;

#[derive(Debug, Default)]
pub struct MemoryStore {
    replicas: Mutex<HashMap<u64, Arc<MemoryReplica>>>,
}

#[derive(Debug)]
struct MemoryReplica {
    volume: u64,
    epoch: AtomicU64,
    incarnation: u64,
    /// Taken shared by every request, exclusively by `resize`.
    state: RwLock<Grains>,
}

#[derive(Debug)]
struct Grains {
    size: u64,
    grains: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemoryReplica {
    fn state(&self) -> std::sync::RwLockReadGuard<'_, Grains> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemoryStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }
    fn blocking(&self) -> bool {
        false
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        if size > MAX_MEMORY_REPLICA {
            return Err(StoreError::NoSpace {
                size,
                what: format!("memory replicas are limited to {MAX_MEMORY_REPLICA} bytes"),
            });
        }
        let mut m = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        if m.contains_key(&volume) {
            return Err(StoreError::Exists { volume });
        }
        let n = size.div_ceil(GRAIN) as usize;
        let r = Arc::new(MemoryReplica {
            volume,
            epoch: AtomicU64::new(0),
            state: RwLock::new(Grains {
                size,
                grains: (0..n).map(|_| RwLock::new(None)).collect(),
            }),
            incarnation: crate::new_incarnation(),
        });
        m.insert(volume, r.clone());
        Ok(r)
    }
    fn preallocate(&self, volume: u64) -> Result<(), StoreError> {
        // Nothing is taken on write: a replica's room is what it is from its creation.
        let known = self
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&volume);
        match known {
            true => Ok(()),
            false => Err(StoreError::NoReplica { volume }),
        }
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        let m = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        m.values()
            .map(|r| Ok(r.clone() as Arc<dyn Replica>))
            .collect()
    }
    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        let mut m = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(&volume)
            .map(|_| ())
            .ok_or(StoreError::NoReplica { volume })
    }
}

/// Splits `[offset, offset+len)` into per-grain pieces: (grain, offset in grain, piece length).
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (usize, usize, usize)> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let g = pos / GRAIN;
        let within = pos - g * GRAIN;
        let n = (GRAIN - within).min(end - pos);
        pos += n;
        Some((g as usize, within as usize, n as usize))
    })
}

impl Replica for MemoryReplica {
    fn volume(&self) -> u64 {
        self.volume
    }
    fn size(&self) -> u64 {
        self.state().size
    }
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        self.epoch.store(epoch, Ordering::Release);
        Ok(())
    }
    fn allocated_bytes(&self) -> u64 {
        let st = self.state();
        let n = st
            .grains
            .iter()
            .filter(|g| g.read().unwrap_or_else(|e| e.into_inner()).is_some())
            .count();
        n as u64 * GRAIN
    }
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        crate::check_size(size)?;
        if size > MAX_MEMORY_REPLICA {
            return Err(StoreError::NoSpace {
                size,
                what: format!("memory replicas are limited to {MAX_MEMORY_REPLICA} bytes"),
            });
        }
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        st.grains
            .resize_with(size.div_ceil(GRAIN) as usize, || RwLock::new(None));
        // A shrink into a grain: its tail past the new end reads as zeros if it grows again.
        let tail = (size % GRAIN) as usize;
        if let (true, Some(last)) = (tail > 0, st.grains.last()) {
            if let Some(d) = last.write().unwrap_or_else(|e| e.into_inner()).as_mut() {
                d[tail..].fill(0);
            }
        }
        st.size = size;
        Ok(())
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let st = self.state();
        check_range(offset, buf.len() as u64, st.size)?;
        let mut at = 0;
        for (g, within, n) in pieces(offset, buf.len() as u64) {
            let slot = st.grains[g].read().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(d) => buf[at..at + n].copy_from_slice(&d[within..within + n]),
                None => buf[at..at + n].fill(0),
            }
            at += n;
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), StoreError> {
        let st = self.state();
        check_range(offset, data.len() as u64, st.size)?;
        let mut at = 0;
        for (g, within, n) in pieces(offset, data.len() as u64) {
            let mut slot = st.grains[g].write().unwrap_or_else(|e| e.into_inner());
            let d = slot.get_or_insert_with(|| vec![0u8; GRAIN as usize].into_boxed_slice());
            d[within..within + n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        Ok(())
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        _fua: bool,
    ) -> Result<(), StoreError> {
        let st = self.state();
        check_range(offset, len, st.size)?;
        let whole = if may_trim {
            whole_grains(offset, len, GRAIN)
        } else {
            0..0
        };
        for (g, within, n) in pieces(offset, len) {
            let mut slot = st.grains[g].write().unwrap_or_else(|e| e.into_inner());
            if whole.contains(&(g as u64)) {
                *slot = None;
            } else if let Some(d) = slot.as_mut() {
                d[within..within + n].fill(0);
            }
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        let st = self.state();
        check_range(offset, len, st.size)?;
        Ok(extents_from(offset, len, GRAIN, |g| {
            st.grains
                .get(g as usize)
                .is_some_and(|s| s.read().unwrap_or_else(|e| e.into_inner()).is_some())
        }))
    }
    fn incarnation(&self) -> u64 {
        self.incarnation
    }
}
