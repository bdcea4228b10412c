//! One NBD connection: handshake, then transmission.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Semaphore};

use crate::codec::{decode_go, decode_meta, decode_request, Request, REQUEST_LEN};
use crate::consts::*;
use crate::{Backend, BackendError, Exports, MAX_REQUEST, PREFERRED_BLOCK};

/// Option payloads above this are refused with `NBD_REP_ERR_TOO_BIG`.
const MAX_OPTION: u32 = 64 * 1024;
/// Option payloads above this close the connection instead of being skipped.
const MAX_OPTION_SKIP: u32 = 16 * 1024 * 1024;
/// In-flight budget per connection, in 64 KiB units (128 MiB): requests being served and
/// replies not yet written to the socket both hold theirs, so a client that stops reading its
/// replies stops this connection, and pins at most this much memory.
const INFLIGHT_UNITS: u32 = 2048;

/// A reply on its way to the writer, with the budget it holds until it is written.
type Queued = (Reply, Option<tokio::sync::OwnedSemaphorePermit>);

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The client is not allowed in (no TLS where it is required, a failed TLS handshake, a
    /// certificate that names no client).
    #[error("refused: {0}")]
    Refused(String),
}

/// TLS on an NBD listener: nothing but `NBD_OPT_STARTTLS` (and abort) is served before TLS is
/// on (the protocol's FORCEDTLS mode), and the client must present a certificate of the
/// cluster's CA that names a client.
#[derive(Clone)]
pub struct NbdTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Which client (by its certificate's name) may open which export; `None`: every client
    /// of the CA may open every export.
    pub allow: Option<Allow>,
}

/// `allow(export, client)`: true if that client may open that export.
pub type Allow = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// The client on a TLS connection, and what it may open.
struct Gate<'a> {
    client: &'a str,
    allow: &'a Allow,
}

impl Gate<'_> {
    fn denies(gate: Option<&Self>, export: &str) -> bool {
        match gate {
            Some(g) if !(g.allow)(export, g.client) => {
                tracing::warn!(
                    client = g.client,
                    export,
                    "refused: the client is not on the volume's access list"
                );
                true
            }
            _ => false,
        }
    }
}

impl std::fmt::Debug for NbdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NbdTls")
    }
}

/// Where the option haggling stands with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls {
    /// A plain listener: STARTTLS is not offered.
    Off,
    /// TLS is required and not on yet: only STARTTLS and abort are served.
    Required,
    /// TLS is on.
    On,
}

/// How the option haggling ended.
enum Outcome<B> {
    Go(Session<B>),
    StartTls,
    Quit,
}

/// What the handshake agreed on.
struct Session<B> {
    backend: Arc<B>,
    structured: bool,
    meta_base_allocation: bool,
}

/// Serves one client connection to the end, in plain text.
pub async fn serve_connection<S, B>(mut stream: S, exports: Arc<Exports<B>>) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    let no_zeroes = greet(&mut stream).await?;
    match options(&mut stream, &exports, no_zeroes, Tls::Off, None).await? {
        Outcome::Go(session) => {
            let (rd, wr) = tokio::io::split(stream);
            transmission(rd, wr, session).await
        }
        Outcome::StartTls | Outcome::Quit => Ok(()),
    }
}

/// Serves one client connection to the end over TLS (see [`NbdTls`]).
pub async fn serve_connection_tls<S, B>(
    mut stream: S,
    exports: Arc<Exports<B>>,
    tls: &NbdTls,
) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    let no_zeroes = greet(&mut stream).await?;
    match options(&mut stream, &exports, no_zeroes, Tls::Required, None).await? {
        Outcome::StartTls => {}
        Outcome::Go(_) | Outcome::Quit => return Ok(()),
    }
    let mut stream = tls
        .acceptor
        .accept(stream)
        .await
        .map_err(|e| NbdError::Refused(format!("TLS handshake failed: {e}")))?;
    let client = match trireme_tls::peer_role(stream.get_ref().1) {
        Some(trireme_tls::Role::Client(name)) => {
            tracing::debug!(client = %name, "NBD client on TLS");
            name
        }
        other => {
            return Err(NbdError::Refused(format!(
                "the certificate names {}, not a client",
                other.map_or_else(|| "no trireme role".to_string(), |r| r.to_string())
            )))
        }
    };
    let gate = tls.allow.as_ref().map(|allow| Gate {
        client: &client,
        allow,
    });
    match options(&mut stream, &exports, no_zeroes, Tls::On, gate.as_ref()).await? {
        Outcome::Go(session) => {
            let (rd, wr) = tokio::io::split(stream);
            transmission(rd, wr, session).await
        }
        Outcome::StartTls | Outcome::Quit => Ok(()),
    }
}

async fn opt_reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    opt: u32,
    kind: u32,
    data: &[u8],
) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b).await
}

async fn opt_error<W: AsyncWrite + Unpin>(
    w: &mut W,
    opt: u32,
    kind: u32,
    msg: &str,
) -> std::io::Result<()> {
    tracing::debug!(opt, kind, "option refused: {msg}");
    opt_reply(w, opt, kind, msg.as_bytes()).await
}

fn transmission_flags<B: Backend>(b: &B, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS
        | TF_SEND_FLUSH
        | TF_SEND_FUA
        | TF_SEND_TRIM
        | TF_SEND_WRITE_ZEROES
        | TF_SEND_FAST_ZERO;
    if structured {
        f |= TF_SEND_DF;
    }
    if b.can_multi_conn() {
        f |= TF_CAN_MULTI_CONN;
    }
    f
}

/// Sends the greeting and reads the client's flags; returns whether it wants no zeroes.
async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<bool, NbdError> {
    let mut greet = Vec::with_capacity(18);
    greet.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greet.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greet.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greet).await?;
    s.flush().await?;
    let client_flags = s.read_u32().await?;
    if client_flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(NbdError::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    Ok(client_flags & CLIENT_NO_ZEROES != 0)
}

/// Runs the option haggling on `s` (everything negotiated before TLS is forgotten after it).
async fn options<S, B>(
    s: &mut S,
    exports: &Exports<B>,
    no_zeroes: bool,
    tls: Tls,
    gate: Option<&Gate<'_>>,
) -> Result<Outcome<B>, NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    B: Backend,
{
    let mut structured = false;
    let mut meta_base_allocation = false;
    let mut warned = false;
    loop {
        s.flush().await?;
        let magic = match s.read_u64().await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Outcome::Quit),
            Err(e) => return Err(e.into()),
        };
        if magic != IHAVEOPT {
            return Err(NbdError::Protocol(format!(
                "expected an option, got magic {magic:#018x}"
            )));
        }
        let opt = s.read_u32().await?;
        let len = s.read_u32().await?;
        if len > MAX_OPTION {
            if len > MAX_OPTION_SKIP {
                return Err(NbdError::Protocol(format!(
                    "option {opt} with a {len}-byte payload"
                )));
            }
            tokio::io::copy(&mut (&mut *s).take(u64::from(len)), &mut tokio::io::sink()).await?;
            opt_error(s, opt, REP_ERR_TOO_BIG, "option payload too large").await?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).await?;
        if tls == Tls::Required && opt != OPT_STARTTLS && opt != OPT_ABORT {
            if opt == OPT_EXPORT_NAME {
                // No error reply exists for this option: closing is the answer.
                return Err(NbdError::Refused(
                    "a plaintext client asked for an export; this listener requires TLS".into(),
                ));
            }
            if !warned {
                tracing::warn!(
                    opt,
                    "NBD client sent an option before STARTTLS: refused, this listener requires TLS"
                );
                warned = true;
            }
            opt_error(
                s,
                opt,
                REP_ERR_TLS_REQD,
                "TLS is required: send NBD_OPT_STARTTLS first",
            )
            .await?;
            continue;
        }
        match opt {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                if Gate::denies(gate, &name) {
                    // No error reply exists for this option: closing is the answer.
                    return Err(NbdError::Refused(format!(
                        "export {name:?} is not open to this client"
                    )));
                }
                let Some((_, _, b)) = exports.get(&name) else {
                    // The protocol has no error reply here: closing is the answer.
                    return Err(NbdError::Protocol(format!("unknown export {name:?}")));
                };
                let mut out = Vec::with_capacity(134);
                out.extend_from_slice(&b.size().to_be_bytes());
                out.extend_from_slice(&transmission_flags(&**b, structured).to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&out).await?;
                s.flush().await?;
                return Ok(Outcome::Go(Session {
                    backend: b.clone(),
                    structured,
                    meta_base_allocation,
                }));
            }
            OPT_ABORT => {
                opt_reply(s, opt, REP_ACK, &[]).await?;
                s.flush().await?;
                return Ok(Outcome::Quit);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    opt_error(s, opt, REP_ERR_INVALID, "NBD_OPT_LIST takes no data").await?;
                    continue;
                }
                for (name, _) in exports.names() {
                    if gate.is_some_and(|g| !(g.allow)(name, g.client)) {
                        continue;
                    }
                    let mut d = Vec::with_capacity(4 + name.len());
                    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    opt_reply(s, opt, REP_SERVER, &d).await?;
                }
                opt_reply(s, opt, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                let req = match decode_go(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        opt_error(s, opt, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                if Gate::denies(gate, &req.name) {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_POLICY,
                        &format!("export {:?} is not open to this client", req.name),
                    )
                    .await?;
                    continue;
                }
                let Some((name, desc, b)) = exports.get(&req.name) else {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", req.name),
                    )
                    .await?;
                    continue;
                };
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&b.size().to_be_bytes());
                d.extend_from_slice(&transmission_flags(&**b, structured).to_be_bytes());
                opt_reply(s, opt, REP_INFO, &d).await?;
                for &i in &req.info {
                    let mut d = Vec::new();
                    d.extend_from_slice(&i.to_be_bytes());
                    match i {
                        INFO_NAME => d.extend_from_slice(name.as_bytes()),
                        INFO_DESCRIPTION => d.extend_from_slice(desc.as_bytes()),
                        INFO_BLOCK_SIZE => {
                            d.extend_from_slice(&1u32.to_be_bytes());
                            d.extend_from_slice(&PREFERRED_BLOCK.to_be_bytes());
                            d.extend_from_slice(&MAX_REQUEST.to_be_bytes());
                        }
                        _ => continue,
                    }
                    opt_reply(s, opt, REP_INFO, &d).await?;
                }
                opt_reply(s, opt, REP_ACK, &[]).await?;
                if opt == OPT_GO {
                    s.flush().await?;
                    return Ok(Outcome::Go(Session {
                        backend: b.clone(),
                        structured,
                        meta_base_allocation,
                    }));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )
                    .await?;
                    continue;
                }
                structured = true;
                opt_reply(s, opt, REP_ACK, &[]).await?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if !structured {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    )
                    .await?;
                    continue;
                }
                let req = match decode_meta(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        opt_error(s, opt, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                if exports.get(&req.name).is_none() {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", req.name),
                    )
                    .await?;
                    continue;
                }
                let listing = opt == OPT_LIST_META_CONTEXT;
                let matches =
                    |q: &str| q == BASE_ALLOCATION || (listing && (q == "base:" || q.is_empty()));
                let selected = if listing && req.queries.is_empty() {
                    true
                } else {
                    req.queries.iter().any(|q| matches(q))
                };
                if !listing {
                    meta_base_allocation = selected;
                }
                if selected {
                    let mut d = Vec::new();
                    d.extend_from_slice(
                        &(if listing { 0 } else { BASE_ALLOCATION_ID }).to_be_bytes(),
                    );
                    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    opt_reply(s, opt, REP_META_CONTEXT, &d).await?;
                }
                opt_reply(s, opt, REP_ACK, &[]).await?;
            }
            OPT_STARTTLS => match tls {
                Tls::Off => {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_UNSUP,
                        "no TLS on this listener (a unix socket, or a TCP export started with --insecure)",
                    )
                    .await?
                }
                Tls::On => opt_error(s, opt, REP_ERR_INVALID, "TLS is already on").await?,
                Tls::Required if !data.is_empty() => {
                    opt_error(s, opt, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data").await?
                }
                Tls::Required => {
                    opt_reply(s, opt, REP_ACK, &[]).await?;
                    s.flush().await?;
                    return Ok(Outcome::StartTls);
                }
            },
            _ => opt_error(s, opt, REP_ERR_UNSUP, "unsupported option").await?,
        }
    }
}

/// A reply ready to be written: header bytes and optional data.
type Reply = (BytesMut, Bytes);

fn simple_reply(cookie: u64, error: u32) -> BytesMut {
    let mut b = BytesMut::with_capacity(16);
    b.put_u32(SIMPLE_REPLY_MAGIC);
    b.put_u32(error);
    b.put_u64(cookie);
    b
}

fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> BytesMut {
    let mut b = BytesMut::with_capacity(20 + 8);
    b.put_u32(STRUCTURED_REPLY_MAGIC);
    b.put_u16(flags);
    b.put_u16(kind);
    b.put_u64(cookie);
    b.put_u32(len);
    b
}

fn error_reply(structured: bool, cookie: u64, e: &BackendError) -> Reply {
    if !structured {
        return (simple_reply(cookie, e.errno), Bytes::new());
    }
    let msg = &e.message.as_bytes()[..e.message.len().min(1024)];
    let mut b = chunk_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        6 + msg.len() as u32,
    );
    b.put_u32(e.errno);
    b.put_u16(msg.len() as u16);
    b.put_slice(msg);
    (b, Bytes::new())
}

fn invalid(errno: u32, message: impl Into<String>) -> BackendError {
    BackendError {
        errno,
        message: message.into(),
    }
}

async fn write_replies<W: AsyncWrite + Unpin>(
    wr: W,
    rx: mpsc::UnboundedReceiver<Queued>,
) -> std::io::Result<()> {
    if wr.is_write_vectored() {
        write_replies_vectored(wr, rx).await
    } else {
        write_replies_buffered(wr, rx).await
    }
}

/// Writes every reply ready at once in one `writev`: the data goes from the backend's buffer
/// to the socket with no copy on the way (a 4K read reply was copied into a buffer first).
async fn write_replies_vectored<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) -> std::io::Result<()> {
    let mut parts: Vec<Bytes> = Vec::new();
    let mut permits = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(((h, d), permit)) = next {
            parts.push(h.freeze());
            if !d.is_empty() {
                parts.push(d);
            }
            permits.push(permit);
            next = if parts.len() < BATCH_PARTS {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        write_all_parts(&mut w, &mut parts).await?;
        // Written: the budget the replies held goes back.
        permits.clear();
    }
    w.shutdown().await
}

/// The most buffers in one `writev` (Linux's `IOV_MAX` is 1024).
const BATCH_PARTS: usize = 256;

/// Writes `parts` in order, as few `writev` calls as the socket takes, and empties it.
async fn write_all_parts<W: AsyncWrite + Unpin>(
    w: &mut W,
    parts: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < parts.len() {
        let n = {
            let slices: Vec<std::io::IoSlice<'_>> = parts[done..]
                .iter()
                .map(|p| std::io::IoSlice::new(p))
                .collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut n = n;
        while n > 0 {
            let len = parts[done].len();
            if n >= len {
                n -= len;
                done += 1;
            } else {
                bytes::Buf::advance(&mut parts[done], n);
                n = 0;
            }
        }
    }
    parts.clear();
    w.flush().await
}

/// For streams without vectored writes (TLS): replies copied into one buffer per batch.
async fn write_replies_buffered<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(256 * 1024, wr);
    while let Some(((h, d), permit)) = rx.recv().await {
        w.write_all(&h).await?;
        w.write_all(&d).await?;
        drop(permit);
        while let Ok(((h, d), permit)) = rx.try_recv() {
            w.write_all(&h).await?;
            w.write_all(&d).await?;
            drop(permit);
        }
        w.flush().await?;
    }
    w.shutdown().await
}

async fn transmission<R, W, B>(rd: R, wr: W, s: Session<B>) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    let mut rd = tokio::io::BufReader::with_capacity(256 * 1024, rd);
    // Unbounded as a channel, bounded by the budget every queued reply holds.
    let (tx, rx) = mpsc::unbounded_channel::<Queued>();
    let writer = tokio::spawn(write_replies(wr, rx));
    let budget = Arc::new(Semaphore::new(INFLIGHT_UNITS as usize));
    let s = Arc::new(s);
    let size = s.backend.size();
    let result = loop {
        let mut hb = [0u8; REQUEST_LEN];
        match rd.read_exact(&mut hb).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e.into()),
        }
        let req = match decode_request(&hb) {
            Ok(r) => r,
            Err(e) => break Err(NbdError::Protocol(e.to_string())),
        };
        if req.command == CMD_DISC {
            break Ok(());
        }
        let structured_read = s.structured && req.command == CMD_READ;
        // A write's payload follows its header: read it now, before the next request.
        let mut payload = Bytes::new();
        if req.command == CMD_WRITE {
            if req.length > MAX_REQUEST {
                let e = invalid(
                    EOVERFLOW,
                    format!(
                        "write of {} bytes over the {MAX_REQUEST}-byte limit",
                        req.length
                    ),
                );
                // The last reply: the connection ends.
                let _ = tx.send((error_reply(false, req.cookie, &e), None));
                break Err(NbdError::Protocol(
                    "oversized write; cannot skip its payload safely".into(),
                ));
            }
            payload = match read_payload(&mut rd, req.length as usize).await {
                Ok(p) => p,
                Err(e) => break Err(e.into()),
            };
        }
        let end = req.offset.checked_add(u64::from(req.length));
        let refused = if req.flags & !KNOWN_CMD_FLAGS != 0 {
            Some(invalid(
                EINVAL,
                format!("unknown command flags {:#x}", req.flags),
            ))
        } else if !matches!(req.command, CMD_FLUSH) && end.is_none_or(|e| e > size) {
            let errno = if req.command == CMD_WRITE || req.command == CMD_WRITE_ZEROES {
                ENOSPC
            } else {
                EINVAL
            };
            Some(invalid(
                errno,
                format!(
                    "range {}+{} beyond the {size}-byte export",
                    req.offset, req.length
                ),
            ))
        } else if req.command == CMD_READ && req.length > MAX_REQUEST {
            Some(invalid(
                EINVAL,
                format!(
                    "read of {} bytes over the {MAX_REQUEST}-byte limit",
                    req.length
                ),
            ))
        } else {
            None
        };
        if let Some(e) = refused {
            // Error replies are small, but a client that never reads them must not pile up
            // an unbounded queue either: each holds one unit.
            let Ok(permit) = budget.clone().acquire_owned().await else {
                break Ok(());
            };
            let _ = tx.send((error_reply(structured_read, req.cookie, &e), Some(permit)));
            continue;
        }
        let units = (1 + req.length / (64 * 1024)).min(INFLIGHT_UNITS);
        let Ok(permit) = budget.clone().acquire_many_owned(units).await else {
            break Ok(());
        };
        let (s2, tx2) = (s.clone(), tx.clone());
        tokio::spawn(async move {
            let reply = execute(&s2, req, payload).await;
            // The budget goes with the reply: released once it is written.
            let _ = tx2.send((reply, Some(permit)));
        });
    };
    drop(tx);
    // Wait for in-flight requests to be answered before closing (a clean DISC completes them).
    let _ = writer.await;
    result
}

/// Reads a write's `len` payload bytes (bounded by `MAX_REQUEST`) into spare capacity: nothing
/// is zero-filled before the data overwrites it.
async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> std::io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *rd).take(want).read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

async fn execute<B: Backend>(s: &Session<B>, req: Request, payload: Bytes) -> Reply {
    let b = &*s.backend;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let cookie = req.cookie;
    let done = |r: Result<(), BackendError>| match r {
        Ok(()) => (simple_reply(cookie, 0), Bytes::new()),
        Err(e) => error_reply(false, cookie, &e),
    };
    match req.command {
        CMD_READ => match b.read(req.offset, req.length).await {
            Ok(data) if s.structured => {
                if data.is_empty() {
                    return (
                        chunk_header(cookie, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0),
                        Bytes::new(),
                    );
                }
                let mut h = chunk_header(
                    cookie,
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    8 + data.len() as u32,
                );
                h.put_u64(req.offset);
                (h, data)
            }
            Ok(data) => (simple_reply(cookie, 0), data),
            Err(e) => error_reply(s.structured, cookie, &e),
        },
        CMD_WRITE => done(b.write(req.offset, payload, fua).await),
        CMD_FLUSH => done(b.flush().await),
        CMD_TRIM => done(b.write_zeroes(req.offset, req.length, true, fua).await),
        CMD_WRITE_ZEROES => {
            let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
            if req.flags & CMD_FLAG_FAST_ZERO != 0 && no_hole {
                // Writing real zeros is not fast; say so, as FAST_ZERO asks.
                return done(Err(invalid(ENOTSUP, "fast zero needs hole punching")));
            }
            done(b.write_zeroes(req.offset, req.length, !no_hole, fua).await)
        }
        CMD_BLOCK_STATUS => {
            if req.length == 0 {
                return error_reply(
                    s.structured,
                    cookie,
                    &invalid(EINVAL, "zero-length block status"),
                );
            }
            if !s.meta_base_allocation {
                return error_reply(
                    s.structured,
                    cookie,
                    &invalid(EINVAL, "no metadata context negotiated"),
                );
            }
            match b.block_status(req.offset, req.length).await {
                Ok(ext) => {
                    let take = if req.flags & CMD_FLAG_REQ_ONE != 0 {
                        1
                    } else {
                        ext.len()
                    };
                    let ext: Vec<_> = ext
                        .into_iter()
                        .filter(|e| e.length > 0)
                        .take(take.max(1))
                        .collect();
                    let mut h = chunk_header(
                        cookie,
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_BLOCK_STATUS,
                        4 + 8 * ext.len() as u32,
                    );
                    h.put_u32(BASE_ALLOCATION_ID);
                    for e in ext {
                        h.put_u32(e.length.min(u64::from(u32::MAX)) as u32);
                        h.put_u32(e.flags & (STATE_HOLE | STATE_ZERO));
                    }
                    (h, Bytes::new())
                }
                Err(e) => error_reply(true, cookie, &e),
            }
        }
        other => error_reply(
            false,
            cookie,
            &invalid(EINVAL, format!("unknown command {other}")),
        ),
    }
}

#[cfg(test)]
mod write_tests {
    use super::*;
    use std::io::IoSlice;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket that takes at most `max` bytes per write, as a full socket buffer does.
    struct Trickle {
        got: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            self.calls += 1;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.max - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Short writes that end inside a buffer and across buffers still put every byte out once,
    /// in order; a socket that takes everything gets one call.
    #[tokio::test]
    async fn replies_go_out_whole_and_in_order_through_short_writes() {
        let parts: Vec<Bytes> = (0..40u8)
            .map(|k| Bytes::from(vec![k; 1 + (k as usize * 37) % 300]))
            .collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for max in [1, 7, 16, 4096, 1 << 20] {
            let mut w = Trickle {
                got: Vec::new(),
                max,
                calls: 0,
            };
            let mut p = parts.clone();
            write_all_parts(&mut w, &mut p).await.unwrap();
            assert!(p.is_empty());
            assert_eq!(w.got, want, "max {max}");
            if max == 1 << 20 {
                assert_eq!(w.calls, 1);
            }
        }
    }
}
