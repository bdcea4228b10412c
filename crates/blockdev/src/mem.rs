//! A device in memory, for frontends' tests and fuzz targets.

use std::sync::Mutex;

use bytes::Bytes;

use crate::{BlockDevice, Caps, DevError, ErrorKind, Extent, Want};

/// Bytes in memory; every block reads as allocated data.
#[derive(Debug)]
pub struct MemDevice(pub Mutex<Vec<u8>>);

impl MemDevice {
    pub fn new(size: usize) -> MemDevice {
        MemDevice(Mutex::new(vec![0; size]))
    }

    fn range(&self, offset: u64, len: u32) -> Result<std::ops::Range<usize>, DevError> {
        let end = offset
            .checked_add(u64::from(len))
            .filter(|&e| e <= self.size());
        match end {
            Some(end) => Ok(offset as usize..end as usize),
            None => Err(DevError::new(ErrorKind::Invalid, "past the end")),
        }
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
    fn caps(&self) -> Caps {
        Caps {
            shared_flush: true,
            ..Caps::default()
        }
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DevError> {
        let r = self.range(offset, len)?;
        let v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Bytes::copy_from_slice(&v[r]))
    }
    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), DevError> {
        let r = self.range(offset, data.len() as u32)?;
        self.0.lock().unwrap_or_else(|e| e.into_inner())[r].copy_from_slice(&data);
        Ok(())
    }
    async fn flush(&self) -> Result<(), DevError> {
        Ok(())
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _may_trim: bool,
        _fua: bool,
    ) -> Result<(), DevError> {
        let r = self.range(offset, len)?;
        self.0.lock().unwrap_or_else(|e| e.into_inner())[r].fill(0);
        Ok(())
    }
    async fn block_status(
        &self,
        offset: u64,
        len: u32,
        _want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        self.range(offset, len)?;
        Ok(vec![Extent {
            length: u64::from(len),
            flags: 0,
        }])
    }
}
