//! A device handed over to the next server: after [`Handover::close`] a call never answers,
//! and `close` returns once the calls already below have ended. A kernel device's process
//! that stops (SIGTERM) closes its device before it detaches the volume: what the kernel asks
//! meanwhile stays with the kernel, which asks the next server (ublk re-issues it after user
//! recovery; the NBD client sends it again on its next socket), instead of getting an I/O
//! error from a writer that has just let go.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::filter::Filter;
use crate::{BlockDevice, DevError, Extent, Want};

/// See the module docs.
#[derive(Debug)]
pub struct Handover<D> {
    next: D,
    closed: AtomicBool,
    below: AtomicUsize,
}

impl<D: BlockDevice> Handover<D> {
    pub fn new(next: D) -> Handover<D> {
        Handover {
            next,
            closed: AtomicBool::new(false),
            below: AtomicUsize::new(0),
        }
    }

    /// From now on no call answers; returns once every call that passed below has ended.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        while self.below.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Runs `f` below unless closed (then never returns).
    async fn pass<T>(&self, f: impl Future<Output = T>) -> T {
        // Counted before the check, as `close` sets before it counts: a call either sees
        // `closed` or is waited for.
        self.below.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.below.fetch_sub(1, Ordering::SeqCst);
            return std::future::pending().await;
        }
        let r = f.await;
        self.below.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

impl<D: BlockDevice> Filter for Handover<D> {
    type Next = D;
    fn next(&self) -> &D {
        &self.next
    }
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = Result<Bytes, DevError>> + Send {
        self.pass(self.next.read(offset, len))
    }
    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.pass(self.next.write(offset, data, fua))
    }
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        self.pass(self.next.flush())
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.pass(self.next.write_zeroes(offset, len, may_trim, fua))
    }
    fn trim(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.pass(self.next.trim(offset, len, fua))
    }
    fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.pass(self.next.block_status(offset, len, want))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDevice;
    use crate::Filtered;
    use std::sync::Arc;

    #[tokio::test]
    async fn after_close_nothing_answers_and_close_waits_for_what_was_below() {
        let dev = Arc::new(Filtered(Handover::new(MemDevice::new(1 << 20))));
        dev.write(0, Bytes::from(vec![1u8; 4096]), false)
            .await
            .unwrap();
        dev.0.close().await;
        let late = tokio::time::timeout(Duration::from_millis(50), dev.read(0, 4096)).await;
        assert!(late.is_err(), "a read after close answered: {late:?}");
        let late = tokio::time::timeout(Duration::from_millis(50), dev.flush()).await;
        assert!(late.is_err(), "a flush after close answered");
    }
}
