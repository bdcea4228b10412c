//! The NBD server frontend.
//!
//! Speaks the fixed-newstyle handshake (with `NO_ZEROES`), the options `EXPORT_NAME`, `ABORT`,
//! `LIST`, `INFO`, `GO`, `STRUCTURED_REPLY`, `LIST_META_CONTEXT` and `SET_META_CONTEXT`
//! (`base:allocation`, and the contexts a backend offers, such as `qemu:dirty-bitmap:NAME`),
//! and answers every other option with `NBD_REP_ERR_UNSUP`. In transmission
//! it serves `READ`, `WRITE`, `FLUSH`, `TRIM`, `WRITE_ZEROES` (with `NO_HOLE` and `FAST_ZERO`),
//! `BLOCK_STATUS` and `DISC`, with `FUA`; requests run concurrently and are answered as they
//! complete, out of order.
//!
//! The server knows nothing of replication: an export is any [`BlockDevice`] (the crate
//! `trireme-blockdev`, which every frontend shares). `CAN_MULTI_CONN` is advertised only when
//! the device says a flush on one connection covers writes completed on every other
//! ([`trireme_blockdev::Caps::shared_flush`]); `READ_ONLY` when it takes no write.
//!
//! Bad input never panics: option payloads and request headers go through the pure decoders in
//! [`codec`] (fuzzed), lengths are checked before any allocation, and a protocol violation
//! closes that one connection after answering what it can.

pub mod client;
pub mod codec;
pub mod consts;
pub(crate) mod options;
mod replies;
mod server;
mod transmission;

use std::sync::Arc;

pub use server::{
    kernel_flags, serve_admitted, serve_admitted_tls, serve_connection, serve_connection_tls,
    serve_kernel, Admission, Allow, NbdError, NbdTls, NEGOTIATION,
};
pub use transmission::{refusals, Refused};
pub use trireme_blockdev::{BlockDevice, DevError, ErrorKind, Extent, Want};

/// Largest READ or WRITE payload accepted; advertised as the maximum block size.
pub const MAX_REQUEST: u32 = 32 * 1024 * 1024;
/// Preferred block size advertised to clients.
pub const PREFERRED_BLOCK: u32 = 4096;

/// An error to report to the client: an errno value from [`consts`] and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct BackendError {
    pub errno: u32,
    pub message: String,
}

/// A device's error as NBD's errno.
impl From<DevError> for BackendError {
    fn from(e: DevError) -> BackendError {
        let errno = match e.kind {
            ErrorKind::Io => consts::EIO,
            ErrorKind::Invalid => consts::EINVAL,
            ErrorKind::NoSpace => consts::ENOSPC,
            ErrorKind::ReadOnly => consts::EPERM,
            ErrorKind::Unsupported => consts::ENOTSUP,
        };
        BackendError {
            errno,
            message: e.message,
        }
    }
}

/// The exports a server offers, by name. The first one is also the default export (the empty
/// name), as qemu's `nbd://host` without a path asks for.
#[derive(Debug)]
pub struct Exports<B> {
    list: Vec<(String, String, Arc<B>)>,
}

impl<B: BlockDevice> Exports<B> {
    pub fn new() -> Exports<B> {
        Exports { list: Vec::new() }
    }

    pub fn add(&mut self, name: &str, description: &str, backend: Arc<B>) {
        self.list
            .push((name.to_string(), description.to_string(), backend));
    }

    pub fn get(&self, name: &str) -> Option<(&str, &str, &Arc<B>)> {
        let e = if name.is_empty() {
            self.list.first()
        } else {
            self.list.iter().find(|e| e.0 == name)
        };
        e.map(|(n, d, b)| (n.as_str(), d.as_str(), b))
    }

    pub fn names(&self) -> impl Iterator<Item = (&str, &str)> {
        self.list.iter().map(|(n, d, _)| (n.as_str(), d.as_str()))
    }
}

impl<B: BlockDevice> Default for Exports<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// How many NBD connections a process admits: sessions (after the client picked its export)
/// and negotiations in progress, of which a few per source address (see `trireme_net::Gate`).
pub const LIMITS: trireme_net::Limits = trireme_net::Limits {
    established: 256,
    handshakes: 64,
    handshakes_per_source: 8,
};

/// The process's NBD listeners' admission (unix and TCP together).
fn gate() -> &'static Arc<trireme_net::Gate> {
    static G: std::sync::OnceLock<Arc<trireme_net::Gate>> = std::sync::OnceLock::new();
    G.get_or_init(|| trireme_net::Gate::new("nbd", LIMITS))
}

/// Refused NBD clients: one log line a second at most.
static REFUSED: trireme_net::Throttles = trireme_net::Throttles::per_second();

/// Serves `exports` on an already bound unix socket listener, for good: a failed accept is
/// retried (see `trireme_net::accept`).
pub async fn serve_unix<B: BlockDevice>(
    listener: tokio::net::UnixListener,
    exports: Arc<Exports<B>>,
) -> std::io::Result<()> {
    loop {
        let (sock, _) = trireme_net::accept("nbd (unix)", || listener.accept()).await;
        if let Err(why) = trireme_tls::local::check_peer(&sock) {
            trireme_net::warn_throttled_by!(
                REFUSED,
                &why.to_string(),
                "refused an NBD client on the unix socket: {why}"
            );
            continue;
        }
        let Some(handshake) = gate().handshake(None) else {
            continue;
        };
        let admission = Admission {
            gate: gate().clone(),
            handshake,
        };
        let ex = exports.clone();
        tokio::spawn(async move {
            match serve_admitted(sock, ex, Some(admission)).await {
                Ok(()) => {}
                Err(e @ NbdError::Refused(_)) => {
                    trireme_net::warn_throttled_by!(
                        REFUSED,
                        &e.to_string(),
                        "NBD client (unix) {e}"
                    )
                }
                Err(e) => tracing::info!("nbd connection (unix) ended: {e}"),
            }
        });
    }
}

/// Serves `exports` on an already bound TCP listener, over TLS when `tls` is given (see
/// [`NbdTls`]; a client refused is logged with its address and why), for good.
pub async fn serve_tcp<B: BlockDevice>(
    listener: tokio::net::TcpListener,
    exports: Arc<Exports<B>>,
    tls: Option<NbdTls>,
) -> std::io::Result<()> {
    loop {
        let (sock, peer) = trireme_net::accept("nbd (tcp)", || listener.accept()).await;
        let Some(handshake) = gate().handshake_tcp(sock.local_addr().ok(), peer) else {
            continue;
        };
        let admission = Admission {
            gate: gate().clone(),
            handshake,
        };
        let _ = sock.set_nodelay(true);
        let ex = exports.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let r = match &tls {
                // rustls reads 4 KiB per call from what is beneath it: a buffer makes that a
                // copy, not a syscall (64 KiB holds several whole records).
                Some(t) => {
                    serve_admitted_tls(
                        tokio::io::BufReader::with_capacity(64 << 10, sock),
                        ex,
                        t,
                        Some(admission),
                    )
                    .await
                }
                None => serve_admitted(sock, ex, Some(admission)).await,
            };
            match r {
                Ok(()) => {}
                Err(e @ NbdError::Refused(_)) => {
                    trireme_net::warn_throttled_by!(REFUSED, &e.to_string(), %peer, "NBD client {e}");
                }
                Err(e) => tracing::info!(%peer, "nbd connection ended: {e}"),
            }
        });
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
