//! The null store: discards writes and reads zeros, like dm-zero. Replicas and epochs are kept
//! in memory so fencing still works; the bytes are not.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::{check_range, Extent, Replica, Store, StoreError, StoreKind};

#[derive(Debug, Default)]
pub struct NullStore {
    replicas: Mutex<HashMap<u64, Arc<NullReplica>>>,
}

#[derive(Debug)]
struct NullReplica {
    volume: u64,
    size: AtomicU64,
    epoch: AtomicU64,
    incarnation: u64,
}

impl Store for NullStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Null
    }
    fn blocking(&self) -> bool {
        false
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        let mut m = self.replicas.lock().unwrap_or_else(|e| e.into_inner());
        if m.contains_key(&volume) {
            return Err(StoreError::Exists { volume });
        }
        let r = Arc::new(NullReplica {
            volume,
            size: AtomicU64::new(size),
            epoch: AtomicU64::new(0),
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

impl Replica for NullReplica {
    fn volume(&self) -> u64 {
        self.volume
    }
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        self.epoch.store(epoch, Ordering::Release);
        Ok(())
    }
    fn allocated_bytes(&self) -> u64 {
        0
    }
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        crate::check_size(size)?;
        self.size.store(size, Ordering::Release);
        Ok(())
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(offset, buf.len() as u64, self.size.load(Ordering::Acquire))?;
        buf.fill(0);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), StoreError> {
        check_range(offset, data.len() as u64, self.size.load(Ordering::Acquire))
    }
    fn write_zeroes(&self, offset: u64, len: u64, _: bool, _: bool) -> Result<(), StoreError> {
        check_range(offset, len, self.size.load(Ordering::Acquire))
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        if len == 0 {
            return Ok(Vec::new());
        }
        Ok(vec![Extent {
            length: len,
            flags: Extent::HOLE | Extent::ZERO,
        }])
    }
    fn incarnation(&self) -> u64 {
        self.incarnation
    }
}
