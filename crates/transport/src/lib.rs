//! The transport seam: how frames travel between a volume client and a storage node.
//!
//! Everything above this crate (the volume client, the node, the NBD frontend) speaks only the
//! two traits here, so a new transport slots in without touching replication code:
//!
//! * [`Connection`] — the client end. `call` sends one request frame and resolves with its
//!   response. Many calls may be in flight on one connection at once; responses can complete in
//!   any order (they are matched by `request_id`, which the connection assigns). A connection is
//!   shared (`Arc<dyn Connection>`) by every task of a volume; it is `Send + Sync`.
//! * [`Handler`] — the server end. A transport's `serve` function calls `handle` once per
//!   request, concurrently, and sends back whatever frame it returns. The handler never sees the
//!   byte stream.
//!
//! Lifecycle: a connection is usable until [`Connection::is_closed`] turns true (peer gone, a
//! malformed frame, an I/O error). From then on every pending and future `call` fails with
//! [`TransportError::Closed`]; the caller decides whether to reconnect. Nothing is retried here,
//! because only the replication layer knows whether a retry is safe.
//!
//! Transports: [`tcp`] (TCP, or unix sockets on one host) and [`ucx`] (UCX active messages,
//! negotiated over a TCP connection, with TCP as the fallback). A new one implements
//! `Connection` for the client end and a `serve` loop that drives a `Handler`, and [`connect`]
//! learns to pick it. API version:
//! [`TRANSPORT_API_VERSION`]; bump it when the traits change.

pub mod budget;
#[doc(hidden)]
pub mod fuzzing;
mod records;
pub mod tcp;
pub mod ucx;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use trireme_proto::{DecodeError, Header};

/// Version of the traits in this crate (DRBD's `DRBD_TRANSPORT_API_VERSION` habit).
pub const TRANSPORT_API_VERSION: u32 = 2;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One frame: a decoded header and its payload (already checksum-verified when received).
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub header: Header,
    pub payload: Bytes,
    /// On a server: the token of the client connection the frame arrived on (its `Hello`), or
    /// 0 if the client sent none. Not on the wire; 0 elsewhere.
    pub origin: u64,
    /// On a server: who sent it (see [`Peer`]). Not on the wire.
    pub peer: Peer,
}

/// Who sent a request, as the server end of a link knows it. Set by the transport on every
/// frame it hands a [`Handler`]; the handler decides what each kind of peer may do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Peer {
    /// A link the cluster trusts as its own: a same-host socket of the same user (checked by
    /// peer credentials), or TCP when the cluster runs without TLS (`--insecure`).
    #[default]
    Trusted,
    /// A mutual-TLS peer, by the role its certificate names.
    Cert(Arc<trireme_tls::Role>),
}

impl Peer {
    /// True if the peer may do every node operation (create, delete or attach any replica).
    pub fn is_cluster(&self) -> bool {
        match self {
            Peer::Trusted => true,
            Peer::Cert(r) => r.is_cluster(),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Trusted => f.write_str("a trusted link"),
            Peer::Cert(r) => write!(f, "{r}"),
        }
    }
}

impl Frame {
    pub fn new(header: Header, payload: Bytes) -> Frame {
        Frame {
            header,
            payload,
            origin: 0,
            peer: Peer::Trusted,
        }
    }
}

/// A fresh connection token (never 0).
pub fn new_token() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Time, pid and a counter: distinct across connections, processes and restarts.
    (t ^ (u64::from(std::process::id()) << 40))
        .wrapping_add(
            NEXT.fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )
        .max(1)
}

/// Errors of a transport. A failed `call` means the request may or may not have been applied by
/// the peer; only the caller can tell whether repeating it is safe.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Could not reach the peer.
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// The connection is closed (peer gone, I/O error or a protocol violation).
    #[error("connection to {peer} closed: {reason}")]
    Closed { peer: String, reason: String },
    /// The peer sent a frame that failed to decode.
    #[error("bad frame from {peer}: {source}")]
    Decode { peer: String, source: DecodeError },
    /// The request did not get a response in time.
    #[error("request to {peer} timed out")]
    Timeout { peer: String },
}

/// What a connection is, for `trireme status` and the benchmark reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// `"tcp"`, `"unix"` or `"ucx"`.
    pub transport: String,
    pub peer: String,
    /// How many underlying streams carry this connection (its TCP side, for UCX).
    pub streams: usize,
    /// For UCX: the lanes UCX chose, `transport/device` joined by `+`.
    pub lanes: Option<String>,
    /// Why a connection that could have used UCX runs over TCP.
    pub fallback: Option<String>,
}

/// The client end of a connection to a node. See the crate docs for the contract.
pub trait Connection: Send + Sync + std::fmt::Debug {
    /// Sends `header` (its `request_id` is overwritten) with `payload`; resolves with the
    /// response frame. `crc` is the payload's crc32c when the caller computed it already (a
    /// write mirrored to several replicas computes it once for all of them); otherwise the
    /// transport computes it, if the link carries payload checksums.
    fn call_crc(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> BoxFuture<'_, Result<Frame, TransportError>>;
    /// [`Connection::call_crc`] with the checksum left to the transport.
    fn call(&self, header: Header, payload: Bytes) -> BoxFuture<'_, Result<Frame, TransportError>> {
        self.call_crc(header, payload, None)
    }
    /// Whether frames on this link carry payload checksums. A TLS link whose peer agreed does
    /// not (its records authenticate every byte), so a caller need not compute one for it.
    fn checks_payloads(&self) -> bool {
        true
    }
    fn info(&self) -> ConnectionInfo;
    fn is_closed(&self) -> bool;
    /// Stops using a faster path this connection negotiated (UCX), for fault tests and when
    /// that path misbehaves: calls in flight on it are sent again on the base path. True if
    /// there was such a path to stop.
    fn fall_back(&self, why: &str) -> bool {
        let _ = why;
        false
    }
}

/// The server end: what a node plugs into a transport.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request and returns its response frame. Called concurrently.
    fn handle(self: Arc<Self>, request: Frame) -> impl Future<Output = Frame> + Send;

    /// True if `request` completes without waiting (an in-memory store): the transport then
    /// runs it on the connection's own reader, in order, with no task hand-off. Requests that
    /// wait on a device must return false so they run concurrently.
    fn inline(&self, request: &Frame) -> bool {
        let _ = request;
        false
    }

    /// Refuses a request on its header alone, before its payload is read or received: the
    /// answer to send instead (a `Denied` response), or `None` to go on. A request its sender
    /// may not make then costs no memory for its payload.
    fn refuse(&self, header: &Header, peer: &Peer) -> Option<Frame> {
        let _ = (header, peer);
        None
    }
}

/// Which transport to use for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// TCP (or a unix socket) only.
    Tcp,
    /// UCX where the node offers it and a probe works, else TCP (the default).
    Auto,
    /// UCX or nothing: a connection that cannot use it fails.
    Ucx,
}

impl TransportKind {
    pub fn parse(s: &str) -> Option<TransportKind> {
        match s {
            "tcp" => Some(TransportKind::Tcp),
            "auto" => Some(TransportKind::Auto),
            "ucx" => Some(TransportKind::Ucx),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Auto => "auto",
            TransportKind::Ucx => "ucx",
        }
    }
}

/// Connects to a node at `addr` over `kind`, with `streams` parallel streams (of TCP).
pub async fn connect(
    kind: TransportKind,
    addr: &str,
    streams: usize,
) -> Result<Arc<dyn Connection>, TransportError> {
    connect_within(kind, addr, streams, None).await
}

/// As [`connect`], with the TCP connection (and its TLS handshake) given at most `limit`.
/// The UCX negotiation that follows bounds each of its steps itself and ends on TCP when UCX
/// is slow or blocked: a caller that cut it short with a bound of its own would never reach a
/// node whose UCX path takes longer than that bound (a resync gave up after 1 s every time
/// while the UCX probe may take 2 s).
pub async fn connect_within(
    kind: TransportKind,
    addr: &str,
    streams: usize,
    limit: Option<std::time::Duration>,
) -> Result<Arc<dyn Connection>, TransportError> {
    let tcp = tcp::TcpConnection::connect(addr, streams);
    let tcp = match limit {
        Some(limit) => {
            tokio::time::timeout(limit, tcp)
                .await
                .map_err(|_| TransportError::Connect {
                    addr: addr.to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection within {limit:?}"),
                    ),
                })??
        }
        None => tcp.await?,
    };
    let fallback = match kind {
        TransportKind::Tcp => return Ok(Arc::new(tcp)),
        TransportKind::Auto => ucx::Fallback::Allowed,
        TransportKind::Ucx => ucx::Fallback::Refused,
    };
    Ok(Arc::new(ucx::negotiate(tcp, fallback).await?))
}
