//! TLS 1.3 records sealed and opened by the transport itself once rustls has done the
//! handshake: a user-space kTLS (this kernel has none).
//!
//! rustls runs the handshake (certificates both ways, the key schedule) through its unbuffered
//! API, then hands the traffic secrets over ([`rustls::kernel`], made for kTLS) and keeps only
//! the job of computing the next secrets at a key update. From then on every record is sealed
//! straight from the frames into the stream's one write buffer, and opened in place in its one
//! read buffer. Over rustls's own buffered streams that saves a copy of every byte each way, an
//! allocation per record and a `writev` of many small pieces; what TLS adds to a plain link is
//! the AEAD pass and 22 bytes per record (up to 16 KiB of frames each).
//!
//! The records are RFC 8446's (section 5.2): outer type application_data, the inner content
//! type after the plaintext, the nonce the IV XOR the record's sequence number, the header as
//! additional data. A peer may send alerts (close_notify ends the stream), a KeyUpdate (the
//! next records use the next secret; one asking for ours gets it) and session tickets (ignored:
//! links do not resume). Each side replaces its key every [`REKEY_AFTER`] records, below
//! AES-GCM's confidentiality limit.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use ring::aead;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::ConnectionTrafficSecrets;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Largest plaintext of a record.
const MAX_PLAIN: usize = 1 << 14;
/// Largest ciphertext of a record a peer may send (RFC 8446: 2^14 + 256).
const MAX_CIPHER: usize = MAX_PLAIN + 256;
const HEADER: usize = 5;
const TAG: usize = 16;
const APPLICATION_DATA: u8 = 23;
const HANDSHAKE: u8 = 22;
const ALERT: u8 = 21;
const KEY_UPDATE: u8 = 24;
const NEW_SESSION_TICKET: u8 = 4;
/// The ALPN name two trireme processes agree on in the handshake when both leave the frames'
/// payload checksum out on the link (the record's AES-GCM tag covers those bytes). A peer
/// that does not offer it (a build from before, during a rolling upgrade) gets checksums.
pub const SEALED_FRAMES: &[u8] = b"trireme-sealed-frames/1";

/// Records sealed under one key before it is replaced (AES-GCM is good for 2^24.5 full records
/// per key; rustls replaces its own at 2^23). The tests replace keys all the time.
pub const REKEY_AFTER: u64 = if cfg!(test) { 8 } else { 1 << 22 };
/// The read buffer: many records per `read` syscall.
const READ_BUFFER: usize = 256 * 1024;
/// The buffer a handshake is read into (see `Handshake::new`).
const HANDSHAKE_BUFFER: usize = 64 * 1024;
/// Sealed bytes the writer holds before it must send them.
const WRITE_BUFFER: usize = 256 * 1024;

/// Drives `conn` through the handshake over `hs` until it may send application data (the
/// client and server connections have the same steps but no common trait).
macro_rules! drive {
    ($hs:ident, $conn:ident) => {
        loop {
            let UnbufferedStatus { mut discard, state } =
                $conn.process_tls_records(&mut $hs.incoming[..$hs.filled]);
            enum Next {
                Receive,
                Transmit,
                Again,
                Done,
            }
            let next = match state.map_err(|e| e.to_string())? {
                ConnectionState::EncodeTlsData(mut s) => loop {
                    match s.encode(&mut $hs.outgoing[$hs.sending..]) {
                        Ok(n) => {
                            $hs.sending += n;
                            break Next::Again;
                        }
                        Err(EncodeError::InsufficientSize(need)) => {
                            let len = $hs.sending + need.required_size;
                            $hs.outgoing.resize(len, 0);
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                },
                ConnectionState::TransmitTlsData(s) => {
                    s.done();
                    Next::Transmit
                }
                ConnectionState::BlockedHandshake => Next::Receive,
                ConnectionState::ReadTraffic(mut t) => {
                    while let Some(r) = t.next_record() {
                        let r = r.map_err(|e| e.to_string())?;
                        discard += r.discard;
                        $hs.early.extend_from_slice(r.payload);
                    }
                    Next::Again
                }
                ConnectionState::WriteTraffic(_) => Next::Done,
                s => return Err(format!("unexpected TLS state during the handshake: {s:?}")),
            };
            if discard > 0 {
                $hs.discard(discard);
            }
            match next {
                Next::Receive => $hs.receive().await?,
                // rustls counts the bytes as sent once `done` is called; they go now.
                Next::Transmit => $hs.transmit().await?,
                Next::Again => {}
                Next::Done => break,
            }
        }
        if $hs.sending > 0 {
            $hs.transmit().await?;
        }
    };
}

/// One direction's key, IV and sequence number.
struct Keys {
    key: aead::LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl Keys {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> io::Result<Keys> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => {
                return Err(broken(
                    "the negotiated cipher suite is not one trireme seals",
                ))
            }
        };
        let key = aead::UnboundKey::new(alg, key.as_ref())
            .map_err(|_| broken("rustls handed over a key of the wrong length"))?;
        let iv: [u8; aead::NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| broken("rustls handed over an IV of the wrong length"))?;
        Ok(Keys {
            key: aead::LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce (each sequence number is used once).
    fn next_nonce(&mut self) -> aead::Nonce {
        let mut n = self.iv;
        for (b, s) in n[aead::NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *b ^= s;
        }
        self.seq += 1;
        aead::Nonce::assume_unique_for_key(n)
    }
}

fn broken(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {why}"))
}

/// rustls's side of an established link: it computes the next secrets at a key update.
enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn next_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
        }
    }

    fn next_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_rx_secret(),
            Kernel::Server(k) => k.update_rx_secret(),
        }
    }
}

/// What the two halves of a link share.
struct Shared {
    kernel: Mutex<Kernel>,
    /// The peer asked for our next key (a KeyUpdate with update_requested).
    peer_asks_rekey: AtomicBool,
}

impl Shared {
    fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
        self.kernel.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The read half of a link: opens records in place and serves their plaintext.
pub struct TlsReader {
    io: OwnedReadHalf,
    buf: Box<[u8]>,
    /// Bytes in `buf` received from the socket.
    filled: usize,
    /// Where the next record starts.
    next: usize,
    /// The plaintext not yet consumed, in `buf`.
    plain: (usize, usize),
    keys: Keys,
    shared: Arc<Shared>,
    /// The peer sent close_notify, or closed the socket between records.
    done: bool,
    /// A record failed (its sequence number is spent): every later read fails too.
    failed: Option<(io::ErrorKind, String)>,
    /// Both ends agreed on [`SEALED_FRAMES`].
    sealed_frames: bool,
}

impl std::fmt::Debug for TlsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsReader")
            .field("buffered", &(self.filled - self.next))
            .finish()
    }
}

impl TlsReader {
    /// Whether both ends agreed to leave payload checksums out ([`SEALED_FRAMES`]).
    pub fn frames_sealed(&self) -> bool {
        self.sealed_frames
    }

    /// Plaintext ready now, opening the next record if it is whole in the buffer (no I/O).
    /// Less than is there when a frame spans records; never more.
    pub fn ready_len(&mut self) -> usize {
        loop {
            if self.plain.0 < self.plain.1 || self.done || self.failed.is_some() {
                return self.plain.1 - self.plain.0;
            }
            if !self.open_next() {
                return 0;
            }
        }
    }

    /// Opens the next record if it is whole in the buffer; a record that fails is kept in
    /// `failed`. False when there was none to open.
    fn open_next(&mut self) -> bool {
        let opened = match self.whole_record() {
            Ok(Some(len)) => self.open(len),
            Ok(None) => return false,
            Err(e) => Err(e),
        };
        if let Err(e) = opened {
            self.failed = Some((e.kind(), e.to_string()));
        }
        true
    }

    /// The length of the record at `next` after its header, if it is whole in the buffer.
    fn whole_record(&self) -> io::Result<Option<usize>> {
        let have = self.filled - self.next;
        if have < HEADER {
            return Ok(None);
        }
        let h = &self.buf[self.next..self.next + HEADER];
        let len = u16::from_be_bytes([h[3], h[4]]) as usize;
        if h[0] != APPLICATION_DATA
            || h[1] != 3
            || h[2] != 3
            || !(TAG + 1..=MAX_CIPHER).contains(&len)
        {
            return Err(broken("a malformed record header"));
        }
        Ok((have >= HEADER + len).then_some(len))
    }

    /// Opens the record at `self.next` (whole in the buffer, `len` bytes after its header).
    fn open(&mut self, len: usize) -> io::Result<()> {
        let at = self.next;
        let header: [u8; HEADER] = self.buf[at..at + HEADER].try_into().expect("five bytes");
        let nonce = self.keys.next_nonce();
        let body = &mut self.buf[at + HEADER..at + HEADER + len];
        let plain_len = self
            .keys
            .key
            .open_in_place(nonce, aead::Aad::from(header), body)
            .map_err(|_| broken("a record failed its authentication"))?
            .len();
        // The inner type is the last byte that is not zero padding.
        let Some(end) = body[..plain_len].iter().rposition(|&b| b != 0) else {
            return Err(broken("a record with no content type"));
        };
        let (kind, alert) = (body[end], (end == 2).then(|| body[1]));
        self.next = at + HEADER + len;
        let start = at + HEADER;
        match (kind, alert) {
            (APPLICATION_DATA, _) => self.plain = (start, start + end),
            (ALERT, Some(0)) => self.done = true,
            (ALERT, Some(d)) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("TLS: the peer sent alert {d}"),
                ))
            }
            (ALERT, None) => return Err(broken("a malformed alert")),
            (HANDSHAKE, _) => self.handshake(start, start + end)?,
            (t, _) => return Err(broken(&format!("a record of content type {t}"))),
        }
        Ok(())
    }

    /// Post-handshake messages of one record: KeyUpdate and NewSessionTicket.
    fn handshake(&mut self, mut at: usize, end: usize) -> io::Result<()> {
        while at < end {
            if end - at < 4 {
                return Err(broken("a handshake message split across records"));
            }
            let kind = self.buf[at];
            let len = u32::from_be_bytes([0, self.buf[at + 1], self.buf[at + 2], self.buf[at + 3]])
                as usize;
            let body = at + 4;
            if end - body < len {
                return Err(broken("a handshake message split across records"));
            }
            match kind {
                KEY_UPDATE if len == 1 && self.buf[body] <= 1 => {
                    if body + len != end {
                        return Err(broken("data after a KeyUpdate in its record"));
                    }
                    let next = self
                        .shared
                        .kernel()
                        .next_rx()
                        .map_err(|e| broken(&e.to_string()))?;
                    self.keys = Keys::new(next)?;
                    if self.buf[body] == 1 {
                        self.shared.peer_asks_rekey.store(true, Ordering::Release);
                    }
                }
                NEW_SESSION_TICKET => {}
                k => {
                    return Err(broken(&format!(
                        "a handshake message of type {k} after the handshake"
                    )))
                }
            }
            at = body + len;
        }
        Ok(())
    }
}

impl AsyncBufRead for TlsReader {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let me = self.get_mut();
        loop {
            if me.plain.0 < me.plain.1 {
                return Poll::Ready(Ok(&me.buf[me.plain.0..me.plain.1]));
            }
            if me.done {
                return Poll::Ready(Ok(&[]));
            }
            if let Some((kind, why)) = &me.failed {
                return Poll::Ready(Err(io::Error::new(*kind, why.clone())));
            }
            if me.open_next() {
                continue;
            }
            // Need more bytes: make room for a whole record first.
            if me.next == me.filled {
                me.next = 0;
                me.filled = 0;
            } else if me.buf.len() - me.next < HEADER + MAX_CIPHER {
                me.buf.copy_within(me.next..me.filled, 0);
                me.filled -= me.next;
                me.next = 0;
            }
            me.plain = (me.next, me.next);
            let mut rb = ReadBuf::new(&mut me.buf[me.filled..]);
            ready!(Pin::new(&mut me.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                if me.filled > me.next {
                    return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                }
                // A link ends with close_notify (our writer sends it on shutdown): a socket
                // closed without one may have been cut short by someone else.
                me.failed = Some((
                    io::ErrorKind::ConnectionAborted,
                    "the peer closed the link without close_notify".into(),
                ));
                continue;
            }
            me.filled += n;
        }
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let me = self.get_mut();
        me.plain.0 = (me.plain.0 + amt).min(me.plain.1);
    }
}

impl AsyncRead for TlsReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let have = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = have.len().min(out.remaining());
        out.put_slice(&have[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
}

/// The write half of a link: seals what it is given into records in its buffer, and sends
/// them at a flush (or when the buffer is full).
pub struct TlsWriter {
    io: OwnedWriteHalf,
    out: Vec<u8>,
    /// Bytes of `out` already sent.
    sent: usize,
    /// Where the record being filled starts in `out`, if one is.
    open: Option<usize>,
    keys: Keys,
    shared: Arc<Shared>,
    closed: bool,
    /// Both ends agreed on [`SEALED_FRAMES`].
    sealed_frames: bool,
}

impl std::fmt::Debug for TlsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsWriter")
            .field("buffered", &(self.out.len() - self.sent))
            .finish()
    }
}

impl TlsWriter {
    /// Whether both ends agreed to leave payload checksums out ([`SEALED_FRAMES`]).
    pub fn frames_sealed(&self) -> bool {
        self.sealed_frames
    }

    /// Starts a record at the end of the buffer, after a KeyUpdate when the key is due.
    fn start_record(&mut self) -> io::Result<usize> {
        if self.keys.seq >= REKEY_AFTER || self.shared.peer_asks_rekey.swap(false, Ordering::AcqRel)
        {
            // Sealed under the old key; every later record under the next one.
            self.seal_whole(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0])?;
            let next = self
                .shared
                .kernel()
                .next_tx()
                .map_err(|e| broken(&e.to_string()))?;
            self.keys = Keys::new(next)?;
        }
        let at = self.out.len();
        self.out.extend_from_slice(&[0; HEADER]);
        Ok(at)
    }

    /// Seals the record being filled, if any.
    fn seal(&mut self, kind: u8) -> io::Result<()> {
        let Some(at) = self.open.take() else {
            return Ok(());
        };
        self.out.push(kind);
        let len = self.out.len() - at - HEADER + TAG;
        let header = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
        self.out[at..at + HEADER].copy_from_slice(&header);
        let nonce = self.keys.next_nonce();
        let tag = self
            .keys
            .key
            .seal_in_place_separate_tag(
                nonce,
                aead::Aad::from(header),
                &mut self.out[at + HEADER..],
            )
            .map_err(|_| broken("sealing a record failed"))?;
        self.out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Seals one whole record of `kind` holding `data`.
    fn seal_whole(&mut self, kind: u8, data: &[u8]) -> io::Result<()> {
        debug_assert!(self.open.is_none());
        let at = self.out.len();
        self.out.extend_from_slice(&[0; HEADER]);
        self.out.extend_from_slice(data);
        self.open = Some(at);
        self.seal(kind)
    }

    /// Seals the open record and sends everything sealed.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.seal(APPLICATION_DATA)?;
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TlsWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if me.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if me.out.len() - me.sent >= WRITE_BUFFER {
            ready!(me.poll_send(cx))?;
        }
        let mut rest = data;
        while !rest.is_empty() {
            let at = match me.open {
                Some(at) => at,
                None => {
                    let at = me.start_record()?;
                    me.open = Some(at);
                    at
                }
            };
            let room = MAX_PLAIN - (me.out.len() - at - HEADER);
            let n = room.min(rest.len());
            me.out.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if n == room {
                me.seal(APPLICATION_DATA)?;
            }
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closed {
            self.seal(APPLICATION_DATA)?;
            self.seal_whole(ALERT, &[1, 0])?;
            self.closed = true;
        }
        ready!(self.poll_send(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The client's side: the handshake with the node at `name`, then the two halves.
pub async fn connect(
    sock: TcpStream,
    cfg: Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
) -> Result<(TlsReader, TlsWriter), String> {
    let mut conn = UnbufferedClientConnection::new(cfg, name).map_err(|e| e.to_string())?;
    let mut hs = Handshake::new(sock);
    drive!(hs, conn);
    check_version(conn.protocol_version())?;
    // The data path dials nodes only: a certificate of the CA that names another role (an
    // NBD export's `server` certificate valid for the same address, a client's) is no node.
    match trireme_tls::peer_role(&conn) {
        Some(trireme_tls::Role::Node(_)) => {}
        other => {
            return Err(format!(
                "the peer's certificate names {}, not a node",
                other.map_or_else(|| "no trireme role".to_string(), |r| r.to_string())
            ))
        }
    }
    let sealed = conn.alpn_protocol() == Some(SEALED_FRAMES);
    let (secrets, kernel) = conn
        .dangerous_into_kernel_connection()
        .map_err(|e| e.to_string())?;
    hs.finish(secrets, Kernel::Client(kernel), sealed)
}

/// The server's side: the handshake, then the two halves and the role the client's certificate
/// names.
pub async fn accept(
    sock: TcpStream,
    cfg: Arc<rustls::ServerConfig>,
) -> Result<(TlsReader, TlsWriter, trireme_tls::Role), String> {
    let mut conn = UnbufferedServerConnection::new(cfg).map_err(|e| e.to_string())?;
    let mut hs = Handshake::new(sock);
    drive!(hs, conn);
    check_version(conn.protocol_version())?;
    let role = trireme_tls::peer_role(&conn)
        .ok_or_else(|| "its certificate names no trireme role".to_string())?;
    let sealed = conn.alpn_protocol() == Some(SEALED_FRAMES);
    let (secrets, kernel) = conn
        .dangerous_into_kernel_connection()
        .map_err(|e| e.to_string())?;
    let (r, w) = hs.finish(secrets, Kernel::Server(kernel), sealed)?;
    Ok((r, w, role))
}

fn check_version(v: Option<rustls::ProtocolVersion>) -> Result<(), String> {
    match v {
        Some(rustls::ProtocolVersion::TLSv1_3) => Ok(()),
        v => Err(format!("the data path needs TLS 1.3; {v:?} was negotiated")),
    }
}

/// The socket and buffers of a handshake in progress.
struct Handshake {
    sock: TcpStream,
    incoming: Vec<u8>,
    filled: usize,
    outgoing: Vec<u8>,
    sending: usize,
    /// Application data that arrived with the handshake's last flight (opened by rustls).
    early: Vec<u8>,
}

impl Handshake {
    fn new(sock: TcpStream) -> Handshake {
        Handshake {
            sock,
            // Enough for any handshake flight of the cluster's certificates, and nothing like
            // a link's buffers: those are allocated once the peer is authenticated.
            incoming: vec![0; HANDSHAKE_BUFFER],
            filled: 0,
            outgoing: vec![0; MAX_CIPHER],
            sending: 0,
            early: Vec::new(),
        }
    }

    async fn receive(&mut self) -> Result<(), String> {
        if self.filled == self.incoming.len() {
            return Err("a handshake larger than the read buffer".into());
        }
        let n = self
            .sock
            .read(&mut self.incoming[self.filled..])
            .await
            .map_err(|e| format!("reading the handshake: {e}"))?;
        if n == 0 {
            return Err("the peer closed the connection during the handshake".into());
        }
        self.filled += n;
        Ok(())
    }

    async fn transmit(&mut self) -> Result<(), String> {
        self.sock
            .write_all(&self.outgoing[..self.sending])
            .await
            .map_err(|e| format!("sending the handshake: {e}"))?;
        self.sending = 0;
        Ok(())
    }

    fn discard(&mut self, n: usize) {
        self.incoming.copy_within(n..self.filled, 0);
        self.filled -= n;
    }

    /// The two halves, with what arrived past the handshake kept for the reader.
    fn finish(
        self,
        secrets: rustls::ExtractedSecrets,
        kernel: Kernel,
        sealed_frames: bool,
    ) -> Result<(TlsReader, TlsWriter), String> {
        let shared = Arc::new(Shared {
            kernel: Mutex::new(kernel),
            peer_asks_rekey: AtomicBool::new(false),
        });
        let e = |e: io::Error| e.to_string();
        let (rd, wr) = self.sock.into_split();
        let mut buf = vec![0u8; READ_BUFFER.max(self.early.len() + self.filled + MAX_CIPHER)];
        let early = self.early.len();
        buf[..early].copy_from_slice(&self.early);
        buf[early..early + self.filled].copy_from_slice(&self.incoming[..self.filled]);
        Ok((
            TlsReader {
                io: rd,
                buf: buf.into_boxed_slice(),
                filled: early + self.filled,
                next: early,
                plain: (0, early),
                keys: Keys::new(secrets.rx).map_err(e)?,
                shared: shared.clone(),
                done: false,
                failed: None,
                sealed_frames,
            },
            TlsWriter {
                io: wr,
                out: Vec::with_capacity(WRITE_BUFFER + MAX_CIPHER),
                sent: 0,
                open: None,
                keys: Keys::new(secrets.tx).map_err(e)?,
                shared,
                closed: false,
                sealed_frames,
            },
        ))
    }
}

/// The fuzz target `tls_records` (see `crate::fuzzing`): a link set up by a real handshake on
/// loopback, over which the server end sends what `data` says — records sealed with the
/// link's keys, of any inner content type and content (alerts, key updates, session tickets,
/// padding, junk), and raw bytes in between — while the client end reads until the link ends.
/// The reader must end with data or an error, never a panic or a hang; when every chunk was
/// plain data, what it read is exactly what was sent.
pub(crate) async fn fuzz_exchange(
    data: &[u8],
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let (sock, _) = l.accept().await.unwrap();
        accept(sock, server).await
    });
    let sock = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let Ok((mut cr, _cw)) = connect(sock, client, name).await else {
        return;
    };
    let Ok(Ok((_sr, mut sw, _))) = srv.await else {
        return;
    };
    let mut rest = data;
    let mut plain = Vec::new();
    let mut only_data = true;
    while rest.len() >= 3 {
        let op = rest[0];
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let chunk = &rest[3..3 + len];
        rest = &rest[3 + len..];
        if op & 1 == 1 {
            // Raw bytes, not sealed: whatever a middlebox or a broken peer puts on the wire.
            only_data = false;
            sw.out.extend_from_slice(chunk);
        } else if let Some((&kind, content)) = chunk.split_first() {
            if kind != APPLICATION_DATA || content.is_empty() || content.len() > MAX_PLAIN {
                only_data = false;
            } else {
                plain.extend_from_slice(content);
            }
            if content.len() + 1 + TAG > u16::MAX as usize || sw.seal_whole(kind, content).is_err()
            {
                return;
            }
        }
    }
    let sent = std::future::poll_fn(|cx| sw.poll_send(cx)).await;
    if sent.is_err() {
        return;
    }
    if only_data {
        let _ = sw.shutdown().await;
    }
    drop(sw);
    let mut got = Vec::new();
    let r = tokio::time::timeout(std::time::Duration::from_secs(5), cr.read_to_end(&mut got))
        .await
        .expect("the reader hung");
    if only_data {
        assert!(r.is_ok(), "{r:?}");
        assert!(got == plain, "the data came out changed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_tls::{Ca, Identity, Role, San};

    /// A node's server configuration and an operator's client configuration, of one new CA,
    /// set up as the data path sets them.
    fn configs() -> (
        tempfile::TempDir,
        Arc<rustls::ClientConfig>,
        Arc<rustls::ServerConfig>,
    ) {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::init(&d.path().join("ca")).unwrap();
        let ip = San::Ip("127.0.0.1".parse().unwrap());
        ca.issue(&Role::Node(1), &[ip])
            .unwrap()
            .write(&d.path().join("node"))
            .unwrap();
        ca.issue(&Role::Admin, &[])
            .unwrap()
            .write(&d.path().join("admin"))
            .unwrap();
        let node = Identity::load(&d.path().join("node"), "node").unwrap();
        let admin = Identity::load(&d.path().join("admin"), "admin").unwrap();
        let mut s = (*node.server_config().unwrap()).clone();
        s.enable_secret_extraction = true;
        s.send_tls13_tickets = 0;
        s.alpn_protocols = vec![SEALED_FRAMES.to_vec()];
        let mut c = (*admin.client_config().unwrap()).clone();
        c.enable_secret_extraction = true;
        c.alpn_protocols = vec![SEALED_FRAMES.to_vec()];
        (d, Arc::new(c), Arc::new(s))
    }

    async fn link() -> (TlsReader, TlsWriter, TlsReader, TlsWriter, Role) {
        let (_d, c, s) = configs();
        link_with(c, s).await
    }

    async fn link_with(
        c: Arc<rustls::ClientConfig>,
        s: Arc<rustls::ServerConfig>,
    ) -> (TlsReader, TlsWriter, TlsReader, TlsWriter, Role) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (sock, _) = l.accept().await.unwrap();
            accept(sock, s).await.unwrap()
        });
        let sock = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let (cr, cw) = connect(sock, c, name).await.unwrap();
        let (sr, sw, role) = server.await.unwrap();
        (cr, cw, sr, sw, role)
    }

    /// Bytes of many sizes, in writes of many sizes, cross a link both ways intact: records
    /// of every length up to the largest, many per read, frames across records, and a key
    /// update every few records in each direction (the tests' `REKEY_AFTER`).
    #[tokio::test]
    async fn bytes_cross_intact_across_records_and_key_updates() {
        let (mut cr, mut cw, mut sr, mut sw, role) = link().await;
        assert_eq!(role, Role::Admin);
        let echo = tokio::spawn(async move {
            let mut buf = vec![0u8; 70_000];
            let mut total = 0;
            loop {
                let n = sr.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                total += n;
                sw.write_all(&buf[..n]).await.unwrap();
                sw.flush().await.unwrap();
            }
            sw.shutdown().await.unwrap();
            total
        });
        let sizes = [
            1usize, 63, 64, 4096, 4160, 16383, 16384, 16385, 100_000, 300_000, 7,
        ];
        let mut sent = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let chunk: Vec<u8> = (0..n).map(|k| (k * 31 + i) as u8).collect();
            // Written in pieces of several sizes, flushed now and then.
            for piece in chunk.chunks(1 + (i * 997) % 5000) {
                cw.write_all(piece).await.unwrap();
            }
            if i % 3 == 0 {
                cw.flush().await.unwrap();
            }
            sent.extend_from_slice(&chunk);
        }
        cw.shutdown().await.unwrap();
        let mut back = Vec::new();
        cr.read_to_end(&mut back).await.unwrap();
        assert_eq!(echo.await.unwrap(), sent.len());
        assert_eq!(back.len(), sent.len());
        assert!(back == sent, "the bytes came back changed");
    }

    /// What the fuzz target `tls_records` runs, on a few inputs every test run: data alone
    /// arrives intact; alerts, a key update, a session ticket, padding-only records, unknown
    /// inner types, raw bytes between records and oversized records end the link with an
    /// error or data, never a panic or a hang.
    #[tokio::test]
    async fn the_fuzzed_exchange_holds_on_chosen_inputs() {
        let (_d, c, s) = configs();
        let rec = |op: u8, kind: u8, content: &[u8]| {
            let mut v = vec![op];
            v.extend_from_slice(&((content.len() + 1) as u16).to_le_bytes());
            v.push(kind);
            v.extend_from_slice(content);
            v
        };
        let raw = |bytes: &[u8]| {
            let mut v = vec![1u8];
            v.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            v.extend_from_slice(bytes);
            v
        };
        let inputs: Vec<Vec<u8>> = vec![
            [
                rec(0, APPLICATION_DATA, b"hello"),
                rec(0, APPLICATION_DATA, &[7; 16384]),
            ]
            .concat(),
            [rec(0, APPLICATION_DATA, b"a"), rec(0, ALERT, &[2, 40])].concat(),
            rec(0, ALERT, &[1, 0]),
            rec(0, HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 1]),
            rec(0, HANDSHAKE, &[NEW_SESSION_TICKET, 0, 0, 2, 9, 9]),
            rec(0, HANDSHAKE, &[KEY_UPDATE, 0, 0, 9]),
            rec(0, 0, &[]),
            rec(0, 99, b"what"),
            [
                rec(0, APPLICATION_DATA, b"x"),
                raw(b"\x17\x03\x03\x00\x20junk"),
            ]
            .concat(),
            rec(0, APPLICATION_DATA, &[1; 20000]),
        ];
        for i in inputs {
            fuzz_exchange(&i, c.clone(), s.clone()).await;
        }
    }

    /// A writer dials nodes only: a `server` certificate of the same CA, valid for the
    /// address (an NBD export's), does not pass for one.
    #[tokio::test]
    async fn only_a_node_certificate_passes_for_a_node() {
        let (d, c, _) = configs();
        let ca = Ca::open(&d.path().join("ca")).unwrap();
        ca.issue(&Role::Server, &[San::Ip("127.0.0.1".parse().unwrap())])
            .unwrap()
            .write(&d.path().join("server"))
            .unwrap();
        let server = Identity::load(&d.path().join("server"), "server").unwrap();
        let mut s = (*server.server_config().unwrap()).clone();
        s.enable_secret_extraction = true;
        s.alpn_protocols = vec![SEALED_FRAMES.to_vec()];
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let s = Arc::new(s);
        tokio::spawn(async move {
            let (sock, _) = l.accept().await.unwrap();
            let _ = accept(sock, s).await;
        });
        let sock = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let Err(e) = connect(sock, c, name).await else {
            panic!("a server passed for a node")
        };
        assert!(e.contains("names server, not a node"), "{e}");
    }

    /// A link that ends with close_notify reads to a clean end; one whose socket is closed
    /// without it (cut short by someone else, or a peer that died) fails the read instead.
    #[tokio::test]
    async fn a_link_must_end_with_close_notify() {
        let (mut cr, _cw, _sr, mut sw) = {
            let (cr, cw, sr, sw, _) = link().await;
            (cr, cw, sr, sw)
        };
        sw.write_all(b"bye").await.unwrap();
        sw.shutdown().await.unwrap();
        let mut got = Vec::new();
        cr.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");

        let (mut cr, _cw, _sr, mut sw, _) = link().await;
        sw.write_all(b"cut").await.unwrap();
        sw.flush().await.unwrap();
        drop(sw.io);
        let mut got = Vec::new();
        let e = cr.read_to_end(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted, "{e}");
        assert_eq!(got, b"cut");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Whatever bytes follow the handshake on the wire (a peer that is not what it
        /// claimed, a broken middlebox), the reader fails with an error: it never panics,
        /// never hangs, and never hands a byte of them to the frame decoder.
        #[test]
        fn any_bytes_after_the_handshake_are_refused(
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            header in proptest::prelude::any::<bool>(),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let (mut cr, _cw, _sr, sw, _) = link().await;
                let mut raw = sw.io;
                if header {
                    // A well-formed header, so the junk reaches the AEAD.
                    let len = junk.len().clamp(TAG + 1, MAX_CIPHER) as u16;
                    let [hi, lo] = len.to_be_bytes();
                    raw.write_all(&[APPLICATION_DATA, 3, 3, hi, lo]).await.unwrap();
                }
                raw.write_all(&junk).await.unwrap();
                raw.shutdown().await.unwrap();
                let mut got = Vec::new();
                let r = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    cr.read_to_end(&mut got),
                )
                .await
                .expect("the reader does not hang");
                assert!(got.is_empty(), "junk was served as plaintext");
                assert!(r.is_err() || (junk.is_empty() && !header), "{r:?}");
            });
        }
    }

    /// Payload checksums are left out only when both ends offered [`SEALED_FRAMES`]: a peer
    /// of an older build (no ALPN) keeps getting them.
    #[tokio::test]
    async fn sealed_frames_only_when_both_ends_agree() {
        let (_d, c, s) = configs();
        let (cr, cw, sr, sw, _) = link_with(c.clone(), s.clone()).await;
        assert!(
            cr.frames_sealed() && cw.frames_sealed() && sr.frames_sealed() && sw.frames_sealed()
        );
        let mut old_client = (*c).clone();
        old_client.alpn_protocols.clear();
        let (cr, _, sr, _, _) = link_with(Arc::new(old_client), s.clone()).await;
        assert!(!cr.frames_sealed() && !sr.frames_sealed());
        let mut old_server = (*s).clone();
        old_server.alpn_protocols.clear();
        let (cr, _, sr, _, _) = link_with(c, Arc::new(old_server)).await;
        assert!(!cr.frames_sealed() && !sr.frames_sealed());
    }

    /// A record changed on the wire fails its authentication: the reader says so and keeps
    /// failing, rather than serving its bytes.
    #[tokio::test]
    async fn a_changed_record_is_refused() {
        let (mut cr, _cw, _sr, mut sw, _) = link().await;
        sw.write_all(b"hello").await.unwrap();
        // Sealed, then one byte of the ciphertext flipped before it is sent.
        sw.seal(APPLICATION_DATA).unwrap();
        let last = sw.out.len() - TAG - 1;
        sw.out[last] ^= 1;
        sw.flush().await.unwrap();
        let mut buf = [0u8; 16];
        let e = cr.read(&mut buf).await.unwrap_err();
        assert!(e.to_string().contains("authentication"), "{e}");
        assert!(cr.read(&mut buf).await.is_err());
    }
}
