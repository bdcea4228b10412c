//! Kernel block devices for a volume (Linux).
//!
//! | file | what |
//! |---|---|
//! | `netlink.rs` | generic netlink: a family's id, requests with attributes, replies parsed with every length checked (fuzzed: `netlink_replies`) |
//! | `nbd.rs` | the kernel's NBD client (`nbd.ko`) over netlink: connect a device to a socket, hand it a new socket after the server died (reconfigure), disconnect, list |
//! | `ublk.rs` | ublk (`ublk_drv`) through `libublk`: a device with user recovery, a queue per CPU (up to 4) whose requests go to a [`ublk::Server`] and come back through an eventfd |
//! | `loopdev.rs` | a loop device over a FUSE file (`nbdfuse`, `losetup`), for a host with neither driver: no recovery |
//! | `process.rs` | whether a pid in a record is a live process (not a zombie, not a thread that took the id) |
//! | `mapped.rs` | the devices this host has mapped, one small record each under `/run/trireme/devices`, so a second `map` finds the device the first one left, and `unmap` and `device list` find it |
//!
//! An NBD device's server is the NBD frontend's transmission phase
//! (`trireme_nbd::serve_kernel`) on the other end of a socket pair: the kernel negotiates
//! nothing. A ublk device's server is this process's queue thread.

pub mod loopdev;
pub mod mapped;
pub mod nbd;
pub mod netlink;
pub mod process;
pub mod ublk;

/// What failed while setting a kernel device up or down.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The kernel refused a netlink request.
    #[error("{what}: the kernel says {}", std::io::Error::from_raw_os_error(*errno))]
    Refused { what: String, errno: i32 },
    /// The kernel has no such device driver loaded.
    #[error("{0}")]
    NoDriver(String),
    /// A netlink reply that does not parse.
    #[error("a netlink reply that does not parse: {0}")]
    Malformed(String),
    /// A device record that does not say what it should.
    #[error("{0}")]
    Record(String),
}

impl KernelError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KernelError {
        let what = what.into();
        move |source| KernelError::Io { what, source }
    }
}
