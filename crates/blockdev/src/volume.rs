//! A volume's writer as a block device, and the wait for a copy to come back.
//!
//! A process serves a volume through one writer ([`trireme_client::Volume`]) at a time, held
//! in a [`Slot`]. When that writer has lost every copy at once (a whole-cluster restart), the
//! process attaches again and puts the new writer in the slot (`trireme-daemon`'s
//! `reattach_when_lost`); [`VolumeDevice`] meanwhile holds each failed request, up to the
//! volume's `reattach_wait`, and runs it once more on the new writer. Every request is
//! idempotent (a write or zeroes of the same bytes at the same place, a flush, a read), so
//! running one twice is safe: a frontend sees no error, the host's filesystem none either.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use trireme_client::{Volume, VolumeError};

use crate::{BlockDevice, Caps, DevError, ErrorKind, Extent, Want};

/// The writer requests go to; every request goes to the one there when it starts. A watch
/// channel holds it, so a request reads it under one lock and one waiting for a replacement
/// is woken by it.
#[derive(Debug)]
pub struct Slot(tokio::sync::watch::Sender<Arc<Volume>>);

impl Slot {
    pub fn new(v: Arc<Volume>) -> Slot {
        Slot(tokio::sync::watch::Sender::new(v))
    }

    /// The writer requests go to now.
    pub fn current(&self) -> Arc<Volume> {
        self.0.borrow().clone()
    }

    /// Puts `v` in place of the current writer, and returns the one it replaced.
    pub fn replace(&self, v: Arc<Volume>) -> Arc<Volume> {
        self.0.send_replace(v)
    }

    /// Waits up to `limit` for a writer other than `old`, and returns it.
    pub async fn replaced(&self, old: &Arc<Volume>, limit: Duration) -> Option<Arc<Volume>> {
        let mut rx = self.0.subscribe();
        let newer = tokio::time::timeout(limit, rx.wait_for(|v| !Arc::ptr_eq(v, old))).await;
        matches!(newer, Ok(Ok(_))).then(|| self.current())
    }
}

/// A volume client's error as a device error.
pub fn dev_error(e: VolumeError) -> DevError {
    let kind = match &e {
        VolumeError::Range(trireme_replication::RangeError::OutOfRange { .. }) => {
            ErrorKind::NoSpace
        }
        e if e.is_invalid_request() => ErrorKind::Invalid,
        e if e.is_no_space() => ErrorKind::NoSpace,
        _ => ErrorKind::Io,
    };
    DevError::new(kind, e.to_string())
}

/// The client's name for [`Want`].
pub fn extents(want: Want) -> trireme_client::Extents {
    match want {
        Want::First => trireme_client::Extents::First,
        Want::One => trireme_client::Extents::One,
    }
}

/// The volume served through the writer in `slot` (see the module's docs).
#[derive(Debug, Clone)]
pub struct VolumeDevice {
    pub slot: Arc<Slot>,
}

impl VolumeDevice {
    pub fn new(slot: Arc<Slot>) -> VolumeDevice {
        VolumeDevice { slot }
    }

    fn slot(&self) -> &Slot {
        &self.slot
    }

    /// Runs `op` on the current writer. If it fails because that writer has lost every copy,
    /// waits (up to the volume's `reattach_wait`) for the process to attach again and runs it
    /// once more on the new writer.
    async fn run<T, F, Fut>(&self, op: F) -> Result<T, DevError>
    where
        F: Fn(Arc<Volume>) -> Fut,
        Fut: std::future::Future<Output = Result<T, VolumeError>>,
    {
        let v = self.slot().current();
        let e = match op(v.clone()).await {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let wait = v.options().reattach_wait;
        if e.is_invalid_request() || e.is_no_space() || wait.is_zero() || !v.lost_every_copy() {
            return Err(dev_error(e));
        }
        match self.slot().replaced(&v, wait).await {
            Some(new) => op(new).await.map_err(dev_error),
            None => {
                tracing::error!(
                    volume = %v.info().name,
                    waited_s = wait.as_secs_f64(),
                    "no copy of the volume came back in time: the request fails with an I/O error ({e})"
                );
                Err(dev_error(e))
            }
        }
    }
}

impl BlockDevice for VolumeDevice {
    fn size(&self) -> u64 {
        self.slot().current().size()
    }
    /// Every connection of this process shares one volume client, and a flush reaches every
    /// replica and syncs the whole replica there, so a flush covers all connections' writes.
    fn caps(&self) -> Caps {
        Caps {
            read_only: false,
            shared_flush: true,
            trim: true,
        }
    }
    fn min_block(&self) -> u32 {
        self.slot().current().min_block()
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DevError> {
        self.run(|v| async move { v.read(offset, u64::from(len)).await })
            .await
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), DevError> {
        self.run(|v| {
            let data = data.clone();
            async move { v.write(offset, data, fua).await }
        })
        .await
    }
    async fn flush(&self) -> Result<(), DevError> {
        self.run(|v| async move { v.flush().await }).await
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), DevError> {
        self.run(|v| async move { v.write_zeroes(offset, u64::from(len), may_trim, fua).await })
            .await
    }
    async fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        let want = extents(want);
        self.run(|v| async move { v.block_status_of(offset, u64::from(len), want).await })
            .await
    }
    async fn changed_since(
        &self,
        snapshot: u64,
        offset: u64,
        len: u32,
        want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        let want = extents(want);
        self.run(|v| async move {
            v.changed_since_of(snapshot, offset, u64::from(len), want)
                .await
        })
        .await
    }
}
