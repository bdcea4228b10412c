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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::{
    AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use trireme_proto::{check_payload, decode_header, Header, HEADER_LEN};

use crate::{BoxFuture, Connection, ConnectionInfo, Frame, Handler, TransportError};

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

fn data_tls() -> Option<&'static TlsSetup> {
    DATA_TLS.get()
}

fn tls() -> Option<&'static TlsSetup> {
    TLS.get()
}

/// This process's TLS for TCP links, if set: the control API's TCP links use it too.
pub fn tls_setup() -> Option<&'static TlsSetup> {
    tls()
}

/// Requests a server runs at once per stream; a client that sends more waits in TCP's buffers.
const MAX_IN_FLIGHT_PER_STREAM: usize = 256;
/// Frames written per syscall batch at most.
const WRITE_BATCH: usize = 64;
/// Socket buffer sizes in user space: many small frames per read or write syscall.
const READ_BUFFER: usize = 256 * 1024;
const WRITE_BUFFER: usize = 256 * 1024;

type Pending = Arc<Mutex<PendingMap>>;

/// A frame queued to a stream's writer: its header, payload, and the payload's crc32c if the
/// caller computed it already.
type Outgoing = (Header, Bytes, Option<u32>);

#[derive(Default)]
struct PendingMap {
    closed: Option<String>,
    waiters: HashMap<u64, oneshot::Sender<Result<Frame, TransportError>>>,
}

#[derive(Debug)]
struct Stream {
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

fn fail_all(pending: &Pending, closed: &AtomicBool, peer: &str, reason: String) {
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
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Whether some reader is spinning now (one at a time).
static SPINNING: AtomicBool = AtomicBool::new(false);
/// Longest a reader waits by polling before it parks.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);
/// Spin only at queue depths this low: deeper queues always have other work for the CPU.
const SPIN_MAX_IN_FLIGHT: usize = 2;

/// At low queue depth, waits for the next response by turning the runtime's I/O driver
/// (`yield_now` lets it poll with a zero timeout) for up to [`SPIN`] rather than sleeping: a
/// sleeping process pays a full wake-up (an IPI on a VM) for every response. Never spins when
/// more than [`SPIN_MAX_IN_FLIGHT`] requests are in flight or another reader is spinning, so it
/// costs nothing under load.
async fn spin_for_data<R: FrameSource>(rd: &mut R, pending: &Pending) {
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

async fn read_responses<R: FrameSource>(mut rd: R, pending: &Pending, peer: &str) -> String {
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
            None => return format!("response to unknown request {}", frame.header.request_id),
        }
    }
}

/// Like [`read_frame`]; once a header has arrived, its payload must follow within `deadline`
/// (a peer that announces a payload and stalls is dropped, not waited for).
/// Reads one frame. `Ok(None)` on a clean end of stream between frames. Once a header has
/// arrived, its payload must follow within `deadline` (a peer that announces a payload and
/// stalls is dropped, not waited for).
async fn read_frame_within<R: FrameSource>(
    rd: &mut R,
    deadline: Option<std::time::Duration>,
) -> Result<Option<Frame>, ReadError> {
    let mut hb = [0u8; HEADER_LEN];
    match rd.read_exact(&mut hb).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(ReadError::Io(e)),
    }
    let header = decode_header(&hb).map_err(ReadError::Decode)?;
    let len = header.payload_len as usize;
    let payload = match deadline {
        _ if len == 0 => BytesMut::new(),
        None => read_payload(rd, len).await?,
        Some(d) => tokio::time::timeout(d, read_payload(rd, len))
            .await
            .map_err(|_| ReadError::Stalled { len, within: d })??,
    };
    if rd.payload_sealed() {
        trireme_proto::check_payload_len(&header, &payload)
    } else {
        check_payload(&header, &payload)
    }
    .map_err(ReadError::Decode)?;
    Ok(Some(Frame::new(header, payload.freeze())))
}

/// Reads a payload of `len` bytes (bounded by `decode_header`). Memory follows the bytes that
/// arrived, a megabyte ahead at most, not the length the peer announced; and nothing is
/// zero-filled before the data overwrites it.
async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> Result<BytesMut, ReadError> {
    const AHEAD: usize = 1 << 20;
    let mut payload = BytesMut::with_capacity(len.min(AHEAD));
    while payload.len() < len {
        let left = len - payload.len();
        if payload.capacity() == payload.len() {
            payload.reserve(left.min(payload.len().max(AHEAD)));
        }
        let n = (&mut *rd)
            .take(left as u64)
            .read_buf(&mut payload)
            .await
            .map_err(ReadError::Io)?;
        if n == 0 {
            return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok(payload)
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("read: {0}")]
    Io(std::io::Error),
    #[error("decode: {0}")]
    Decode(trireme_proto::DecodeError),
    #[error("a {len}-byte payload did not arrive within {within:?}")]
    Stalled {
        len: usize,
        within: std::time::Duration,
    },
}

/// The writer of a plain stream: each batch of queued frames goes out in one `writev`, headers
/// from a small array and payloads straight from their shared buffers. A payload sent to three
/// replicas is never copied into three stream buffers.
async fn write_frames_vectored<W: FrameSink>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    let mut headers: Vec<[u8; HEADER_LEN]> = Vec::with_capacity(WRITE_BATCH);
    let mut payloads: Vec<Bytes> = Vec::with_capacity(WRITE_BATCH);
    while let Some(first) = rx.recv().await {
        headers.clear();
        payloads.clear();
        let mut next = Some(first);
        while let Some((h, payload, crc)) = next.take() {
            headers.push(match crc {
                Some(crc) => {
                    debug_assert_eq!(crc, trireme_proto::payload_crc(&payload));
                    h.encode_with_crc(payload.len(), crc)
                }
                None => h.encode(&payload),
            });
            payloads.push(payload);
            if headers.len() < WRITE_BATCH {
                next = rx.try_recv().ok();
            }
        }
        let mut slices: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(2 * headers.len());
        for (h, p) in headers.iter().zip(&payloads) {
            slices.push(std::io::IoSlice::new(h));
            if !p.is_empty() {
                slices.push(std::io::IoSlice::new(p));
            }
        }
        let mut left = &mut slices[..];
        while !left.is_empty() {
            let n = w.write_vectored(left).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            std::io::IoSlice::advance_slices(&mut left, n);
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), w.shutdown()).await;
    Ok(())
}

async fn write_frames<W: FrameSink>(
    mut w: BufWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    while let Some((h, payload, crc)) = rx.recv().await {
        write_one(&mut w, &h, &payload, crc).await?;
        // Batch whatever else is already queued into the same flush.
        let mut n = 1;
        while n < WRITE_BATCH {
            match rx.try_recv() {
                Ok((h, p, crc)) => write_one(&mut w, &h, &p, crc).await?,
                Err(_) => break,
            }
            n += 1;
        }
        w.flush().await?;
    }
    // Every handle is gone: close our side, so the peer ends the link (and our reader with
    // it). Dropping a split TLS stream's write half would not: the read half still holds the
    // socket, and both ends would keep it open for good.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), w.shutdown()).await;
    Ok(())
}

async fn write_one<W: FrameSink>(
    w: &mut BufWriter<W>,
    h: &Header,
    payload: &[u8],
    crc: Option<u32>,
) -> std::io::Result<()> {
    let header = if w.get_ref().payload_sealed() {
        h.encode_unchecked_payload(payload.len())
    } else if let Some(crc) = crc {
        debug_assert_eq!(
            crc,
            trireme_proto::payload_crc(payload),
            "the caller's checksum"
        );
        h.encode_with_crc(payload.len(), crc)
    } else {
        h.encode(payload)
    };
    w.write_all(&header).await?;
    w.write_all(payload).await
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

/// Serves `handler` on `listener` until the listener fails. Each accepted socket gets its own
/// reader and writer task; each request runs as its own task, at most
/// `MAX_IN_FLIGHT_PER_STREAM` at once per socket. A malformed frame closes that socket only.
/// At most [`MAX_CONNECTIONS`] sockets are served at once (TCP and same-host together); one
/// over that is closed at once, with a log line.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> std::io::Result<()> {
    let tls = data_tls().and_then(|t| t.server.clone());
    loop {
        let (sock, peer) = listener.accept().await?;
        let Some(slot) = connection_slot(&peer.to_string()) else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let h = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let r = match tls {
                None => {
                    let (rd, wr) = sock.into_split();
                    let rd = BufReader::with_capacity(READ_BUFFER, rd);
                    serve_stream(rd, wr, WRITE_BUFFER, h, crate::Peer::Trusted).await
                }
                Some(cfg) => {
                    let accepted =
                        tokio::time::timeout(TLS_HANDSHAKE, crate::records::accept(sock, cfg))
                            .await;
                    let (rd, wr, role) = match accepted {
                        Ok(Ok(r)) => r,
                        Ok(Err(why)) => {
                            tracing::warn!(%peer, "refused a connection: TLS handshake failed: {why}");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!(%peer, "refused a connection: no TLS handshake within {TLS_HANDSHAKE:?}");
                            return;
                        }
                    };
                    tracing::debug!(%peer, %role, sealed_frames = rd.frames_sealed(), "TLS peer");
                    serve_stream(rd, wr, 0, h, crate::Peer::Cert(Arc::new(role))).await
                }
            };
            if let Err(e) = r {
                tracing::warn!(%peer, "closing connection: {e}");
            }
            drop(slot);
        });
    }
}

/// Where a stream's frames are read from: a plain socket under a [`BufReader`], or a TLS
/// link's reader (which is its own buffer).
pub(crate) trait FrameSource: AsyncBufRead + AsyncRead + Unpin + Send {
    /// Payload checksums are neither sent nor checked on this link: it authenticates every
    /// byte itself (a TLS link whose peer agreed, see `records::SEALED_FRAMES`); headers keep
    /// theirs.
    fn payload_sealed(&self) -> bool;
    /// Bytes that can be read now without waiting (fewer is fine, never more).
    fn ready_len(&mut self) -> usize;
}

impl<R: AsyncRead + Unpin + Send> FrameSource for BufReader<R> {
    fn payload_sealed(&self) -> bool {
        false
    }
    fn ready_len(&mut self) -> usize {
        self.buffer().len()
    }
}

impl FrameSource for crate::records::TlsReader {
    fn payload_sealed(&self) -> bool {
        self.frames_sealed()
    }
    fn ready_len(&mut self) -> usize {
        crate::records::TlsReader::ready_len(self)
    }
}

/// Where a stream's frames are written to; see [`FrameSource::payload_sealed`].
pub(crate) trait FrameSink: AsyncWrite + Unpin + Send {
    fn payload_sealed(&self) -> bool;
}

impl FrameSink for tokio::net::tcp::OwnedWriteHalf {
    fn payload_sealed(&self) -> bool {
        false
    }
}

impl FrameSink for tokio::net::unix::OwnedWriteHalf {
    fn payload_sealed(&self) -> bool {
        false
    }
}

impl FrameSink for crate::records::TlsWriter {
    fn payload_sealed(&self) -> bool {
        self.frames_sealed()
    }
}

/// A TLS server's side of a new connection: the handshake, within [`TLS_HANDSHAKE`] (a peer
/// that connects and says nothing holds nothing for long), and the role the client's
/// certificate names. `Err` says why the peer is refused.
pub async fn accept_tls<S: AsyncRead + AsyncWrite + Unpin>(
    acceptor: &tokio_rustls::TlsAcceptor,
    sock: S,
) -> Result<(tokio_rustls::server::TlsStream<S>, trireme_tls::Role), String> {
    let s = match tokio::time::timeout(TLS_HANDSHAKE, acceptor.accept(sock)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}")),
        Err(_) => return Err(format!("no TLS handshake within {TLS_HANDSHAKE:?}")),
    };
    match trireme_tls::peer_role(s.get_ref().1) {
        Some(role) => Ok((s, role)),
        None => Err("its certificate names no trireme role".into()),
    }
}

/// How long a TLS peer may take to finish its handshake (either side).
pub const TLS_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(3);

/// Most connections a process serves at once; the rest are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 1024;

/// How long a request's payload may take to arrive once its header has.
pub const PAYLOAD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A place among the [`MAX_CONNECTIONS`] served, or `None` (logged) when they are all taken.
fn connection_slot(peer: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
    static SLOTS: std::sync::OnceLock<Arc<Semaphore>> = std::sync::OnceLock::new();
    let slots = SLOTS.get_or_init(|| Arc::new(Semaphore::new(MAX_CONNECTIONS)));
    let slot = slots.clone().try_acquire_owned().ok();
    if slot.is_none() {
        tracing::warn!(%peer, "refused a connection: {MAX_CONNECTIONS} already served");
    }
    slot
}

/// Serves `handler` on a unix socket listener (peers on the same host), like [`serve`].
pub async fn serve_unix<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
) -> std::io::Result<()> {
    loop {
        let (sock, _) = listener.accept().await?;
        if let Err(why) = trireme_tls::local::check_peer(&sock) {
            tracing::warn!("refused a same-host connection: {why}");
            continue;
        }
        let Some(slot) = connection_slot("a same-host peer") else {
            continue;
        };
        let h = handler.clone();
        tokio::spawn(async move {
            let (rd, wr) = sock.into_split();
            let rd = BufReader::with_capacity(READ_BUFFER, rd);
            if let Err(e) = serve_stream(rd, wr, WRITE_BUFFER, h, crate::Peer::Trusted).await {
                tracing::warn!("closing unix connection: {e}");
            }
            drop(slot);
        });
    }
}

async fn serve_stream<H, R, W>(
    mut rd: R,
    wr: W,
    write_buffer: usize,
    handler: Arc<H>,
    peer: crate::Peer,
) -> Result<(), ReadError>
where
    H: Handler,
    R: FrameSource + 'static,
    W: FrameSink + 'static,
{
    // Inline requests are answered by this reader; concurrent ones by their own tasks. Both
    // write through one buffered writer; the reader flushes once it has drained its input, so
    // a burst of requests is answered with one write.
    let wr = Arc::new(tokio::sync::Mutex::new(BufWriter::with_capacity(
        write_buffer,
        wr,
    )));
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_STREAM));
    let mut origin = 0;
    // The UCX secrets handed out on this link; they die with it.
    let mut grants = crate::ucx::Grants::default();
    loop {
        let mut frame = match read_frame_within(&mut rd, Some(PAYLOAD_DEADLINE)).await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e),
        };
        if frame.header.op == trireme_proto::Op::Hello {
            origin = frame.header.offset;
            continue;
        }
        frame.origin = origin;
        frame.peer = peer.clone();
        if frame.header.op == trireme_proto::Op::UcxAddress {
            // The node's worker address goes out with a secret for this link: UCX requests
            // that do not carry it are dropped before anything is received.
            let mut resp = handler.clone().handle(frame).await;
            if resp.header.status == trireme_proto::Status::Ok {
                let secret = grants.grant(origin, peer.clone());
                resp.payload = crate::ucx::encode_offer(&resp.payload, &secret).into();
            }
            let mut w = wr.lock().await;
            write_one(&mut w, &resp.header, &resp.payload, None)
                .await
                .map_err(ReadError::Io)?;
            w.flush().await.map_err(ReadError::Io)?;
            continue;
        }
        if frame.header.is_response() {
            return Err(ReadError::Decode(
                trireme_proto::DecodeError::MalformedPayload {
                    what: "response frame sent to a server",
                },
            ));
        }
        if handler.inline(&frame) {
            let resp = handler.clone().handle(frame).await;
            let mut w = wr.lock().await;
            write_one(&mut w, &resp.header, &resp.payload, None)
                .await
                .map_err(ReadError::Io)?;
            if rd.ready_len() < HEADER_LEN {
                w.flush().await.map_err(ReadError::Io)?;
            }
            continue;
        }
        let Ok(permit) = limit.clone().acquire_owned().await else {
            return Ok(());
        };
        let (h, wr) = (handler.clone(), wr.clone());
        tokio::spawn(async move {
            let resp = h.handle(frame).await;
            let mut w = wr.lock().await;
            if write_one(&mut w, &resp.header, &resp.payload, None)
                .await
                .is_ok()
            {
                let _ = w.flush().await;
            }
            drop(permit);
        });
    }
}
