//! The kernel's NBD client (`nbd.ko`), driven over generic netlink as `rbd-nbd` and
//! Vitastor's `netlink-revive` do (`nbd-client` cannot hand a device a new socket).
//!
//! - [`connect`]: a new device (`/dev/nbdN`, the kernel picks N) served over the sockets
//!   given, with a request timeout and a dead-connection timeout: when the server dies, its
//!   requests are requeued at their timeout and wait that long for a new server.
//! - [`reconfigure`]: hands a device whose server died a new socket; the requests that waited
//!   go to it. The device, and a file system mounted on it, see no error.
//! - [`disconnect`]: the kernel sends the server `NBD_CMD_DISC` and the device goes.

use std::os::fd::RawFd;

use crate::netlink::{attr_u32, parse_attrs, Attrs, Genl};
use crate::KernelError;

const FAMILY: &str = "nbd";
const VERSION: u8 = 1;
const CMD_CONNECT: u8 = 1;
const CMD_DISCONNECT: u8 = 2;
const CMD_RECONFIGURE: u8 = 3;
const ATTR_INDEX: u16 = 1;
const ATTR_SIZE_BYTES: u16 = 2;
const ATTR_BLOCK_SIZE_BYTES: u16 = 3;
const ATTR_TIMEOUT: u16 = 4;
const ATTR_SERVER_FLAGS: u16 = 5;
const ATTR_CLIENT_FLAGS: u16 = 6;
const ATTR_SOCKETS: u16 = 7;
const ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
const ATTR_BACKEND_IDENTIFIER: u16 = 10;
const SOCK_ITEM: u16 = 1;
const SOCK_FD: u16 = 1;
/// The device goes once disconnected (no `/dev/nbdN` left behind).
const CFLAG_DESTROY_ON_DISCONNECT: u64 = 1;

/// How a new device is set up.
#[derive(Debug, Clone)]
pub struct Config {
    pub size: u64,
    pub block_size: u64,
    /// The NBD transmission flags the server would advertise.
    pub server_flags: u16,
    /// A request unanswered this long is requeued (on another socket, or for the next server).
    pub timeout_s: u64,
    /// How long requests wait for a new server once every socket is dead; then they fail.
    pub dead_conn_timeout_s: u64,
    /// What the device says it serves (`/sys/block/nbdN/backend`), checked at reconfigure.
    pub identifier: String,
}

fn family(g: &mut Genl) -> Result<u16, KernelError> {
    g.family(FAMILY)?.ok_or_else(|| {
        KernelError::NoDriver(
            "the kernel's NBD client is not loaded: `modprobe nbd` (package linux-modules, \
             kernel option CONFIG_BLK_DEV_NBD), or map with --device ublk"
                .into(),
        )
    })
}

fn sockets(fds: &[RawFd]) -> Attrs {
    fds.iter().fold(Attrs::new(), |a, &fd| {
        a.nested(SOCK_ITEM, Attrs::new().u32(SOCK_FD, fd as u32))
    })
}

/// Connects a new NBD device to `fds` (the kernel's ends of socket pairs, each served by the
/// caller); returns its index N (`/dev/nbdN`).
pub fn connect(cfg: &Config, fds: &[RawFd]) -> Result<u32, KernelError> {
    let mut g = Genl::open()?;
    let f = family(&mut g)?;
    let attrs = Attrs::new()
        .u64(ATTR_SIZE_BYTES, cfg.size)
        .u64(ATTR_BLOCK_SIZE_BYTES, cfg.block_size)
        .u64(ATTR_SERVER_FLAGS, u64::from(cfg.server_flags))
        .u64(ATTR_CLIENT_FLAGS, CFLAG_DESTROY_ON_DISCONNECT)
        .u64(ATTR_TIMEOUT, cfg.timeout_s)
        .u64(ATTR_DEAD_CONN_TIMEOUT, cfg.dead_conn_timeout_s)
        .str(ATTR_BACKEND_IDENTIFIER, &cfg.identifier)
        .nested(ATTR_SOCKETS, sockets(fds));
    let replies = g.request(f, CMD_CONNECT, VERSION, &attrs, "connecting an NBD device")?;
    for r in &replies {
        if let Some(i) = attr_u32(&parse_attrs(r)?, ATTR_INDEX) {
            return Ok(i);
        }
    }
    Err(KernelError::Malformed(
        "the kernel connected a device and did not say which".into(),
    ))
}

/// Hands device `index`, whose server died, the sockets `fds` in place of its dead ones.
/// `identifier`: what the device must be serving (refused otherwise, by the kernel).
pub fn reconfigure(index: u32, identifier: &str, fds: &[RawFd]) -> Result<(), KernelError> {
    let mut g = Genl::open()?;
    let f = family(&mut g)?;
    let attrs = Attrs::new()
        .u32(ATTR_INDEX, index)
        .str(ATTR_BACKEND_IDENTIFIER, identifier)
        .nested(ATTR_SOCKETS, sockets(fds));
    g.request(
        f,
        CMD_RECONFIGURE,
        VERSION,
        &attrs,
        &format!("handing /dev/nbd{index} a new server"),
    )?;
    Ok(())
}

/// Gives device `index` (serving `identifier`) a new size, online (Linux 5.3+: a
/// reconfigure that carries a size).
pub fn resize(index: u32, identifier: &str, size: u64) -> Result<(), KernelError> {
    let mut g = Genl::open()?;
    let f = family(&mut g)?;
    let attrs = Attrs::new()
        .u32(ATTR_INDEX, index)
        .str(ATTR_BACKEND_IDENTIFIER, identifier)
        .u64(ATTR_SIZE_BYTES, size);
    g.request(
        f,
        CMD_RECONFIGURE,
        VERSION,
        &attrs,
        &format!("resizing /dev/nbd{index}"),
    )?;
    Ok(())
}

/// Disconnects device `index`: the kernel sends its server `NBD_CMD_DISC`, and the device
/// goes.
pub fn disconnect(index: u32) -> Result<(), KernelError> {
    let mut g = Genl::open()?;
    let f = family(&mut g)?;
    g.request(
        f,
        CMD_DISCONNECT,
        VERSION,
        &Attrs::new().u32(ATTR_INDEX, index),
        &format!("disconnecting /dev/nbd{index}"),
    )?;
    Ok(())
}

/// What device `index` says it serves (`/sys/block/nbdN/backend`), if it exists and is
/// connected.
pub fn backend(index: u32) -> Option<String> {
    std::fs::read_to_string(format!("/sys/block/nbd{index}/backend"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether the kernel has its NBD client (the `nbd` netlink family).
pub fn available() -> bool {
    Genl::open()
        .and_then(|mut g| g.family(FAMILY))
        .is_ok_and(|f| f.is_some())
}
