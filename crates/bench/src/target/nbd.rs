//! An NBD export, one connection per benchmark thread.

use bytes::Bytes;
use trireme_nbd::client::NbdClient;

use super::TargetError;

#[derive(Debug)]
pub struct NbdTarget {
    uri: String,
    conns: Vec<NbdClient>,
}

impl NbdTarget {
    pub async fn connect(uri: &str, connections: usize) -> Result<NbdTarget, TargetError> {
        let mut conns = Vec::new();
        for _ in 0..connections.max(1) {
            conns.push(
                NbdClient::connect(uri)
                    .await
                    .map_err(|e| TargetError(e.to_string()))?,
            );
        }
        Ok(NbdTarget {
            uri: uri.to_string(),
            conns,
        })
    }

    pub fn size(&self) -> u64 {
        self.conns[0].size()
    }

    pub fn describe(&self) -> String {
        format!("{} ({} NBD connections)", self.uri, self.conns.len())
    }

    fn conn(&self, slot: usize) -> &NbdClient {
        &self.conns[slot % self.conns.len()]
    }

    pub async fn read(&self, slot: usize, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        self.conn(slot)
            .read(offset, len as u32)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }

    pub async fn write(&self, slot: usize, offset: u64, data: Bytes) -> Result<(), TargetError> {
        self.conn(slot)
            .write(offset, &data, false)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }
}
