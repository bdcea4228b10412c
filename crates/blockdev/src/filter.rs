//! Filters: a layer above a device that passes every call down, changing what it is for (as
//! nbdkit's filters do). A filter implements [`Filter`], overriding only the calls it
//! changes; [`Filtered`] makes it a [`BlockDevice`] for a frontend or the next filter up.
//!
//! ```text
//! frontend ── Filtered<Limit<…>> ── Filtered<ReadOnly<D>> ── D (a volume, a snapshot)
//! ```

use std::future::Future;

use bytes::Bytes;

use crate::{BlockDevice, Caps, DevError, ErrorKind, Extent, Want};

/// A layer above device [`Filter::Next`]. Every call defaults to the device below.
pub trait Filter: Send + Sync + 'static {
    type Next: BlockDevice;
    /// The device below.
    fn next(&self) -> &Self::Next;

    fn size(&self) -> u64 {
        self.next().size()
    }
    fn caps(&self) -> Caps {
        self.next().caps()
    }
    fn min_block(&self) -> u32 {
        self.next().min_block()
    }
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = Result<Bytes, DevError>> + Send {
        self.next().read(offset, len)
    }
    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.next().write(offset, data, fua)
    }
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        self.next().flush()
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.next().write_zeroes(offset, len, may_trim, fua)
    }
    fn trim(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.next().trim(offset, len, fua)
    }
    fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.next().block_status(offset, len, want)
    }
    fn changed_since(
        &self,
        snapshot: u64,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.next().changed_since(snapshot, offset, len, want)
    }
    fn contexts(&self) -> impl Future<Output = Vec<String>> + Send {
        self.next().contexts()
    }
    fn context_status(
        &self,
        name: &str,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.next().context_status(name, offset, len, want)
    }
}

/// Filter `F` as a device.
#[derive(Debug)]
pub struct Filtered<F>(pub F);

impl<F> std::ops::Deref for Filtered<F> {
    type Target = F;
    fn deref(&self) -> &F {
        &self.0
    }
}

impl<F: Filter> BlockDevice for Filtered<F> {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn caps(&self) -> Caps {
        self.0.caps()
    }
    fn min_block(&self) -> u32 {
        self.0.min_block()
    }
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = Result<Bytes, DevError>> + Send {
        self.0.read(offset, len)
    }
    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        self.0.flush()
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.0.write_zeroes(offset, len, may_trim, fua)
    }
    fn trim(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.0.trim(offset, len, fua)
    }
    fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.0.block_status(offset, len, want)
    }
    fn changed_since(
        &self,
        snapshot: u64,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.0.changed_since(snapshot, offset, len, want)
    }
    fn contexts(&self) -> impl Future<Output = Vec<String>> + Send {
        self.0.contexts()
    }
    fn context_status(
        &self,
        name: &str,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        self.0.context_status(name, offset, len, want)
    }
}

/// A device shared with others (an `Arc`), as the device below a filter: every call passes.
#[derive(Debug)]
pub struct Shared<D>(pub std::sync::Arc<D>);

impl<D: BlockDevice> Filter for Shared<D> {
    type Next = D;
    fn next(&self) -> &D {
        &self.0
    }
}

/// Takes no write: says so in its caps, and refuses writes, zeroes and trims itself, should a
/// frontend pass one down. A snapshot is served through it; a later `map VOL@SNAP` too.
#[derive(Debug)]
pub struct ReadOnly<D>(pub D);

fn refused(what: &str) -> DevError {
    DevError::new(
        ErrorKind::ReadOnly,
        format!("{what}: the device is read-only"),
    )
}

impl<D: BlockDevice> Filter for ReadOnly<D> {
    type Next = D;
    fn next(&self) -> &D {
        &self.0
    }
    fn caps(&self) -> Caps {
        Caps {
            read_only: true,
            // Nothing is written: every connection reads the same bytes.
            shared_flush: true,
            trim: false,
        }
    }
    async fn write(&self, _: u64, _: Bytes, _: bool) -> Result<(), DevError> {
        Err(refused("a write"))
    }
    async fn write_zeroes(&self, _: u64, _: u32, _: bool, _: bool) -> Result<(), DevError> {
        Err(refused("a write of zeroes"))
    }
    async fn trim(&self, _: u64, _: u32, _: bool) -> Result<(), DevError> {
        Err(refused("a trim"))
    }
    /// Nothing to make durable.
    async fn flush(&self) -> Result<(), DevError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDevice;

    /// A filter that overrides nothing passes everything through.
    struct Pass(MemDevice);
    impl Filter for Pass {
        type Next = MemDevice;
        fn next(&self) -> &MemDevice {
            &self.0
        }
    }

    #[tokio::test]
    async fn a_filter_passes_what_it_does_not_change() {
        let d = Filtered(Pass(MemDevice::new(1 << 16)));
        d.write(4096, Bytes::from(vec![7; 4096]), false)
            .await
            .unwrap();
        assert_eq!(d.read(4096, 4096).await.unwrap(), vec![7; 4096]);
        assert_eq!(d.size(), 1 << 16);
        assert_eq!(d.caps(), MemDevice::new(1).caps());
        d.trim(4096, 4096, false).await.unwrap();
        assert_eq!(d.read(4096, 4096).await.unwrap(), vec![0; 4096]);
        let e = d.changed_since(1, 0, 4096, Want::First).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
    }

    #[tokio::test]
    async fn read_only_refuses_every_write_and_reads_what_is_below() {
        let m = MemDevice::new(1 << 16);
        m.write(0, Bytes::from(vec![9; 512]), false).await.unwrap();
        let d = Filtered(ReadOnly(m));
        assert!(d.caps().read_only);
        for e in [
            d.write(0, Bytes::from(vec![1; 512]), true)
                .await
                .unwrap_err(),
            d.write_zeroes(0, 512, true, false).await.unwrap_err(),
            d.trim(0, 512, false).await.unwrap_err(),
        ] {
            assert_eq!(e.kind, ErrorKind::ReadOnly, "{e}");
        }
        d.flush().await.unwrap();
        assert_eq!(d.read(0, 512).await.unwrap(), vec![9; 512]);
    }
}
