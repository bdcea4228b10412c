//! An NBD export, one connection per benchmark thread. Each thread connects from its own
//! runtime (see the engine), like one fio job per thread, so replies wake that thread the way
//! they wake any ordinary client.

use std::sync::{Arc, RwLock};

use bytes::Bytes;
use trireme_nbd::client::NbdClient;

use super::TargetError;

#[derive(Debug)]
pub struct NbdTarget {
    uri: String,
    size: u64,
    conns: Vec<RwLock<Option<Arc<NbdClient>>>>,
}

impl NbdTarget {
    /// Probes the export (its size, and that it answers); threads connect later.
    pub async fn connect(uri: &str, connections: usize) -> Result<NbdTarget, TargetError> {
        let probe = NbdClient::connect(uri)
            .await
            .map_err(|e| TargetError(e.to_string()))?;
        Ok(NbdTarget {
            uri: uri.to_string(),
            size: probe.size(),
            conns: (0..connections.max(1)).map(|_| RwLock::new(None)).collect(),
        })
    }

    /// Opens (or replaces) thread `slot`'s connection, from the runtime that will drive it.
    pub async fn connect_slot(&self, slot: usize) -> Result<(), TargetError> {
        let c = NbdClient::connect(&self.uri)
            .await
            .map_err(|e| TargetError(e.to_string()))?;
        *self.conns[slot % self.conns.len()]
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(c));
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn describe(&self) -> String {
        format!("{} ({} NBD connections)", self.uri, self.conns.len())
    }

    fn conn(&self, slot: usize) -> Result<Arc<NbdClient>, TargetError> {
        self.conns[slot % self.conns.len()]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| TargetError(format!("NBD connection {slot} is not open")))
    }

    pub async fn read(&self, slot: usize, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        self.conn(slot)?
            .read(offset, len as u32)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }

    pub async fn write(&self, slot: usize, offset: u64, data: Bytes) -> Result<(), TargetError> {
        self.conn(slot)?
            .write(offset, &data, false)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }
}
