//! Stream transport: length-prefixed frames over TCP (TCP_NODELAY) or, for a peer on the same
//! host, a unix stream socket (`unix:/path` addresses), with several streams per peer.
//!
//! Each stream has one writer task (it batches whatever frames are queued into one `write`
//! syscall where it can) and one reader task (it matches responses to waiting calls by id).
//!
//! TCP streams are mutual TLS once the process has its identity ([`set_tls`]): a client checks
//! the node's certificate against the cluster's CA and the address it dialed, and presents its
//! own; a node accepts only peers whose certificate its CA issued, before it decodes a single
//! frame. rustls does the handshake; the records are sealed and opened by `records.rs`. Unix
//! sockets stay plain (same host; the socket's mode guards them).

//!
//! Files: `client.rs` (the client end), `server.rs` (listeners and the server end),
//! `frames.rs` (reading and writing frames, with their deadlines).

mod client;
mod frames;
mod server;

use std::sync::Arc;

pub use client::TcpConnection;
pub use frames::ReadError;
pub use server::{accept_tls, serve, serve_unix, MAX_CONNECTIONS, PAYLOAD_DEADLINE, TLS_HANDSHAKE};

/// This process's TLS configurations for the data path, set once at start.
#[derive(Clone, Debug)]
pub struct TlsSetup {
    /// For connections to nodes.
    pub client: Option<Arc<rustls::ClientConfig>>,
    /// For a node's listener (requires client certificates).
    pub server: Option<Arc<rustls::ServerConfig>>,
}

static TLS: std::sync::OnceLock<TlsSetup> = std::sync::OnceLock::new();
/// The data path's variant of [`TLS`]: rustls hands the traffic secrets over after the
/// handshake (the transport seals records itself: `records.rs`), and servers send no session
/// tickets (links never resume; a ticket would be one more message to carry).
static DATA_TLS: std::sync::OnceLock<TlsSetup> = std::sync::OnceLock::new();

/// Sets this process's TLS for TCP links (once; later calls are ignored and return false).
pub fn set_tls(t: TlsSetup) -> bool {
    let data = TlsSetup {
        client: t.client.as_ref().map(|c| {
            let mut c = (**c).clone();
            c.enable_secret_extraction = true;
            c.alpn_protocols = vec![crate::records::SEALED_FRAMES.to_vec()];
            Arc::new(c)
        }),
        server: t.server.as_ref().map(|c| {
            let mut c = (**c).clone();
            c.enable_secret_extraction = true;
            c.send_tls13_tickets = 0;
            c.alpn_protocols = vec![crate::records::SEALED_FRAMES.to_vec()];
            Arc::new(c)
        }),
    };
    if TLS.set(t).is_err() {
        return false;
    }
    let _ = DATA_TLS.set(data);
    true
}

pub(crate) fn data_tls() -> Option<&'static TlsSetup> {
    DATA_TLS.get()
}

pub(crate) fn tls() -> Option<&'static TlsSetup> {
    TLS.get()
}

/// This process's TLS for TCP links, if set: the control API's TCP links use it too.
pub fn tls_setup() -> Option<&'static TlsSetup> {
    tls()
}

/// Requests a server runs at once per stream; a client that sends more waits in TCP's buffers.
pub(crate) const MAX_IN_FLIGHT_PER_STREAM: usize = 256;
/// Frames written per syscall batch at most.
pub(crate) const WRITE_BATCH: usize = 64;
/// Socket buffer sizes in user space: many small frames per read or write syscall.
pub(crate) const READ_BUFFER: usize = 256 * 1024;
pub(crate) const WRITE_BUFFER: usize = 256 * 1024;
