//! The client end: a connection of several streams, each with a writer task and a reader
//! that matches responses to their calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncRead, BufReader, BufWriter};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot};
use trireme_proto::Header;

use super::frames::{
    read_frame_within, write_frames, write_frames_vectored, FrameSink, FrameSource, KEEPALIVE_ID,
};
use super::{data_tls, READ_BUFFER, TLS_HANDSHAKE, WRITE_BUFFER};
use crate::{BoxFuture, Connection, ConnectionInfo, Frame, TransportError};

pub(crate) type Pending = Arc<Mutex<PendingMap>>;

/// A frame queued to a stream's writer: its header, payload, and the payload's crc32c if the
/// caller computed it already.
pub(crate) type Outgoing = (Header, Bytes, Option<u32>);

#[derive(Default)]
pub(crate) struct PendingMap {
    closed: Option<String>,
    waiters: HashMap<u64, oneshot::Sender<Result<Frame, TransportError>>>,
}

#[derive(Debug)]
pub(crate) struct Stream {
    tx: mpsc::UnboundedSender<Outgoing>,
    pending: Pending,
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for PendingMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingMap")
            .field("closed", &self.closed)
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

/// A connection to one node: `streams` sockets (TCP, or unix for `unix:` addresses) used
/// round-robin.
#[derive(Debug)]
pub struct TcpConnection {
    peer: String,
    kind: &'static str,
    streams: Vec<Stream>,
    next_stream: AtomicUsize,
    next_id: AtomicU64,
    /// Names this connection to the node (its `Hello`); UCX calls carry it too.
    token: u64,
    /// Woken when a stream closes.
    gone: Arc<tokio::sync::Notify>,
    /// Every stream is a TLS link that leaves payload checksums out.
    sealed: bool,
    /// This end's address (loopback for a unix socket): which device reaches the node.
    local: std::net::IpAddr,
}

impl TcpConnection {
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The address this end of the connection has (loopback for a unix socket).
    pub fn local_ip(&self) -> std::net::IpAddr {
        self.local
    }

    /// Resolves once the connection is closed (a stream failed: the peer is gone).
    pub async fn closed(&self) {
        loop {
            let n = self.gone.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_closed() {
                return;
            }
            n.await;
        }
    }

    /// Connects to `addr`: `host:port` for TCP, `unix:/path` for a unix socket.
    pub async fn connect(addr: &str, streams: usize) -> Result<Self, TransportError> {
        let mut out = Vec::with_capacity(streams.max(1));
        let mut sealed = true;
        let token = crate::new_token();
        let gone = Arc::new(tokio::sync::Notify::new());
        let mut local = std::net::IpAddr::from([127, 0, 0, 1]);
        let err = |source| TransportError::Connect {
            addr: addr.to_string(),
            source,
        };
        for _ in 0..streams.max(1) {
            if let Some(path) = addr.strip_prefix("unix:") {
                let (rd, wr) = UnixStream::connect(path).await.map_err(err)?.into_split();
                sealed = false;
                out.push(Stream::plain(rd, wr, addr.to_string(), gone.clone()));
            } else {
                let sock = TcpStream::connect(addr).await.map_err(err)?;
                let _ = sock.set_nodelay(true);
                if let Ok(a) = sock.local_addr() {
                    local = a.ip();
                }
                match data_tls().and_then(|t| t.client.clone()) {
                    Some(cfg) => {
                        let tls_err = |what: String| TransportError::Connect {
                            addr: addr.to_string(),
                            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, what),
                        };
                        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                        let host = host.trim_start_matches('[').trim_end_matches(']');
                        let name = rustls::pki_types::ServerName::try_from(host.to_string())
                            .map_err(|e| tls_err(format!("{host:?} as a TLS name: {e}")))?;
                        // Bounded: a node that accepted but is frozen (SIGSTOP) would
                        // otherwise hold an attach or a resync here for as long as it sleeps.
                        let (rd, wr) = tokio::time::timeout(
                            TLS_HANDSHAKE,
                            crate::records::connect(sock, cfg, name),
                        )
                        .await
                        .map_err(|_| tls_err(format!("no TLS handshake within {TLS_HANDSHAKE:?}")))?
                        .map_err(|e| tls_err(format!("TLS: {e}")))?;
                        // The TLS writer is the write buffer itself.
                        sealed &= wr.payload_sealed();
                        out.push(Stream::start(rd, wr, 0, addr.to_string(), gone.clone()));
                    }
                    None => {
                        let (rd, wr) = sock.into_split();
                        sealed = false;
                        out.push(Stream::plain(rd, wr, addr.to_string(), gone.clone()));
                    }
                }
            }
        }
        for s in &out {
            let hello = Header {
                offset: token,
                ..Header::request(trireme_proto::Op::Hello, 0)
            };
            let _ = s.tx.send((hello, Bytes::new(), None));
        }
        Ok(TcpConnection {
            kind: if addr.starts_with("unix:") {
                "unix"
            } else {
                "tcp"
            },
            peer: addr.to_string(),
            streams: out,
            next_stream: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            token,
            gone,
            sealed,
            local,
        })
    }
}

impl Stream {
    /// A stream over a plain socket: buffered both ways in user space.
    fn plain<R, W>(rd: R, wr: W, peer: String, gone: Arc<tokio::sync::Notify>) -> Stream
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: FrameSink + 'static,
    {
        let rd = BufReader::with_capacity(READ_BUFFER, rd);
        Stream::start(rd, wr, WRITE_BUFFER, peer, gone)
    }

    /// Starts the stream's writer and reader tasks; the writer buffers `write_buffer` bytes
    /// (0: `wr` buffers itself).
    fn start<R, W>(
        rd: R,
        wr: W,
        write_buffer: usize,
        peer: String,
        gone: Arc<tokio::sync::Notify>,
    ) -> Stream
    where
        R: FrameSource + 'static,
        W: FrameSink + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (p, c, pr, g) = (pending.clone(), closed.clone(), peer.clone(), gone.clone());
        tokio::spawn(async move {
            let written = if write_buffer == 0 {
                write_frames(BufWriter::with_capacity(0, wr), rx).await
            } else {
                write_frames_vectored(wr, rx).await
            };
            let reason = match written {
                Ok(()) => "connection dropped".to_string(),
                Err(e) => format!("write: {e}"),
            };
            fail_all(&p, &c, &pr, reason);
            g.notify_waiters();
        });
        let (p, c) = (pending.clone(), closed.clone());
        tokio::spawn(async move {
            let reason = read_responses(rd, &p, &peer).await;
            fail_all(&p, &c, &peer, reason);
            gone.notify_waiters();
        });
        Stream {
            tx,
            pending,
            closed,
        }
    }
}

pub(crate) fn fail_all(pending: &Pending, closed: &AtomicBool, peer: &str, reason: String) {
    closed.store(true, Ordering::Release);
    let waiters = {
        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.closed.is_none() {
            p.closed = Some(reason.clone());
        }
        std::mem::take(&mut p.waiters)
    };
    IN_FLIGHT.fetch_sub(waiters.len(), Ordering::Relaxed);
    for (_, w) in waiters {
        let _ = w.send(Err(TransportError::Closed {
            peer: peer.to_string(),
            reason: reason.clone(),
        }));
    }
}

/// Requests in flight over every stream of this process.
pub(crate) static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Whether some reader is spinning now (one at a time).
pub(crate) static SPINNING: AtomicBool = AtomicBool::new(false);
/// Longest a reader waits by polling before it parks.
pub(crate) const SPIN: std::time::Duration = std::time::Duration::from_micros(50);
/// Spin only at queue depths this low: deeper queues always have other work for the CPU.
pub(crate) const SPIN_MAX_IN_FLIGHT: usize = 2;

/// At low queue depth, waits for the next response by turning the runtime's I/O driver
/// (`yield_now` lets it poll with a zero timeout) for up to [`SPIN`] rather than sleeping: a
/// sleeping process pays a full wake-up (an IPI on a VM) for every response. Never spins when
/// more than [`SPIN_MAX_IN_FLIGHT`] requests are in flight or another reader is spinning, so it
/// costs nothing under load.
pub(crate) async fn spin_for_data<R: FrameSource>(rd: &mut R, pending: &Pending) {
    let waiting = !pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .waiters
        .is_empty();
    if !waiting
        || IN_FLIGHT.load(Ordering::Relaxed) > SPIN_MAX_IN_FLIGHT
        || rd.ready_len() > 0
        || SPINNING.swap(true, Ordering::Acquire)
    {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < SPIN {
        tokio::task::yield_now().await;
        // Polled with a no-op waker: this only looks at readiness the driver just refreshed.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if std::pin::Pin::new(&mut *rd)
            .poll_fill_buf(&mut cx)
            .is_ready()
        {
            break;
        }
    }
    SPINNING.store(false, Ordering::Release);
}

pub(crate) async fn read_responses<R: FrameSource>(
    mut rd: R,
    pending: &Pending,
    peer: &str,
) -> String {
    loop {
        spin_for_data(&mut rd, pending).await;
        let frame = match read_frame_within(&mut rd, None).await {
            Ok(Some(f)) => f,
            Ok(None) => return "peer closed the connection".into(),
            Err(e) => return e.to_string(),
        };
        if !frame.header.is_response() {
            return format!("{peer} sent a request on a client connection");
        }
        let waiter = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiters
            .remove(&frame.header.request_id);
        match waiter {
            Some(w) => {
                IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
                let _ = w.send(Ok(frame));
            }
            // The answer to a keepalive ping of the stream's writer.
            None if frame.header.request_id == KEEPALIVE_ID => {}
            None => return format!("response to unknown request {}", frame.header.request_id),
        }
    }
}

impl TcpConnection {
    /// Queues a request on the next stream and waits for its answer.
    async fn send(
        &self,
        mut header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Result<Frame, TransportError> {
        let i = self.next_stream.fetch_add(1, Ordering::Relaxed) % self.streams.len();
        let s = &self.streams[i];
        header.request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        header.flags &= !trireme_proto::FLAG_RESPONSE;
        let (tx, rx) = oneshot::channel();
        {
            let mut p = s.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(reason) = &p.closed {
                return Err(TransportError::Closed {
                    peer: self.peer.clone(),
                    reason: reason.clone(),
                });
            }
            p.waiters.insert(header.request_id, tx);
            IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        }
        if s.tx.send((header, payload, crc)).is_err() {
            let removed = s
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiters
                .remove(&header.request_id);
            if removed.is_some() {
                IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
            }
            return Err(TransportError::Closed {
                peer: self.peer.clone(),
                reason: "writer stopped".into(),
            });
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Closed {
                peer: self.peer.clone(),
                reason: "dropped".into(),
            }),
        }
    }
}

impl Connection for TcpConnection {
    fn call_crc(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> BoxFuture<'_, Result<Frame, TransportError>> {
        Box::pin(self.send(header, payload, crc))
    }

    fn checks_payloads(&self) -> bool {
        !self.sealed
    }

    fn info(&self) -> ConnectionInfo {
        ConnectionInfo {
            transport: self.kind.into(),
            peer: self.peer.clone(),
            streams: self.streams.len(),
            lanes: None,
            fallback: None,
        }
    }

    fn is_closed(&self) -> bool {
        self.streams
            .iter()
            .any(|s| s.closed.load(Ordering::Acquire))
    }
}
