//! The block device a volume is, whatever protocol a host speaks to it.
//!
//! A frontend (the NBD server today; ublk, the kernel's NBD client and NVMe/TCP are its
//! siblings) turns its protocol's requests into calls of [`BlockDevice`] and the answers and
//! [`DevError`]s back into its own replies and status codes. Nothing here knows a protocol.
//!
//! | layer | what | where |
//! |---|---|---|
//! | frontends | decode requests, check ranges against [`BlockDevice::size`], encode replies, map [`ErrorKind`] to their codes | `trireme-nbd`, later ublk and NVMe/TCP |
//! | filters | pass every call through to the device below, changing some: read-only, a handover to the next server ([`handover`]), later limits or a cache | [`filter`] |
//! | devices | a volume's writer that waits for a copy to come back ([`VolumeDevice`]), a snapshot (`trireme-daemon`), memory in tests | [`volume`] |
//!
//! Ranges are checked by the frontend before a call: a device may assume
//! `offset + len <= size()` as of the call.

pub mod filter;
pub mod handover;
#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod volume;

use std::future::Future;

use bytes::Bytes;
pub use filter::{Filter, Filtered, ReadOnly, Shared};
pub use handover::Handover;
pub use trireme_proto::Extent;
pub use volume::{Slot, VolumeDevice};

/// What a device can do, for a frontend to advertise (NBD's transmission flags, ublk's
/// parameters, NVMe's identify data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Takes no write: the frontend says so to the host, and refuses writes, trims and
    /// zeroes without calling the device.
    pub read_only: bool,
    /// A flush through any connection makes every write completed through any connection
    /// durable (NBD's multi-conn; several ublk or NVMe queues on one device).
    pub shared_flush: bool,
    /// Trims deallocate (a frontend may advertise discard).
    pub trim: bool,
}

impl Default for Caps {
    /// A writable device whose flush covers only its own connection's writes, with trim.
    fn default() -> Self {
        Caps {
            read_only: false,
            shared_flush: false,
            trim: true,
        }
    }
}

/// How many extents a block-status call answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The first ones, covering a prefix of the range, in time that grows with what is
    /// answered (an NBD reply; a frontend asks again from where it ended).
    First,
    /// The first one only (NBD's `REQ_ONE`).
    One,
}

/// What went wrong, in words every frontend maps to its own codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The data could not be read or made durable: an I/O error to the host.
    Io,
    /// The request itself is wrong (a range or argument the device refuses); asking again
    /// changes nothing.
    Invalid,
    /// No room for the write (the pool is full, or past the end).
    NoSpace,
    /// A write to a device that takes none.
    ReadOnly,
    /// The device does not do this (a metadata context it does not have).
    Unsupported,
}

/// A failed call: its kind, for the frontend's code, and a message for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DevError {
    pub kind: ErrorKind,
    pub message: String,
}

impl DevError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> DevError {
        DevError {
            kind,
            message: message.into(),
        }
    }
}

/// A block device. Methods are called concurrently, from many requests and connections.
pub trait BlockDevice: Send + Sync + 'static {
    /// Its size in bytes, now (a volume may grow while it serves).
    fn size(&self) -> u64;
    fn caps(&self) -> Caps;
    /// The smallest request it takes whole, in bytes: 1 for any; 4096 for a parity volume,
    /// which refuses part blocks. A frontend tells the host (NBD's block-size info), so the
    /// host merges part blocks itself.
    fn min_block(&self) -> u32 {
        1
    }
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = Result<Bytes, DevError>> + Send;
    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send;
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send;
    /// Zeroes a range; `may_trim` allows deallocating it.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send;
    /// Deallocates a range; it reads back as zeroes.
    fn trim(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.write_zeroes(offset, len, true, fua)
    }
    /// Allocation extents from `offset`: covering `[offset, offset+len)` or a prefix of it.
    fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send;
    /// The blocks changed since snapshot `snapshot` (by id), from `offset`, as
    /// [`BlockDevice::block_status`] gives extents: flags carry
    /// [`trireme_proto::EXTENT_CHANGED`] where a block was written or trimmed since.
    fn changed_since(
        &self,
        snapshot: u64,
        _offset: u64,
        _len: u32,
        _want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        async move {
            Err(DevError::new(
                ErrorKind::Unsupported,
                format!("this device keeps no changes since snapshot {snapshot}"),
            ))
        }
    }
    /// The metadata contexts the device offers beyond allocation, by full name
    /// (`qemu:dirty-bitmap:NAME`), as of now.
    fn contexts(&self) -> impl Future<Output = Vec<String>> + Send {
        async { Vec::new() }
    }
    /// The extents of context `name` (one [`BlockDevice::contexts`] offered), with that
    /// context's flags.
    fn context_status(
        &self,
        name: &str,
        _offset: u64,
        _len: u32,
        _want: Want,
    ) -> impl Future<Output = Result<Vec<Extent>, DevError>> + Send {
        let message = format!("no metadata context {name:?} on this device");
        async move { Err(DevError::new(ErrorKind::Invalid, message)) }
    }
}
