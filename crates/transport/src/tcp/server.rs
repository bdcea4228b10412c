//! The server end: listeners, admission, and one task per stream that reads requests and
//! hands them to the [`Handler`](crate::Handler).

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use trireme_proto::HEADER_LEN;

use super::frames::{
    read_payload_charged, skip_payload, write_one, FrameSink, FrameSource, ReadError,
};
use super::{data_tls, MAX_IN_FLIGHT_PER_STREAM, READ_BUFFER, WRITE_BUFFER};
use crate::Handler;
use trireme_net::{warn_throttled_by, Throttles};
use trireme_proto::decode_header;

/// How many connections a node admits: established links (TCP and same-host together), and
/// TLS handshakes in progress, of which few per source address, so that peers that never
/// finish (or never start) their handshake cannot take the places of those that do.
pub const LIMITS: trireme_net::Limits = trireme_net::Limits {
    established: MAX_CONNECTIONS,
    handshakes: 128,
    handshakes_per_source: 16,
};

/// How long an established link may stay silent: a client's streams send a keepalive ping
/// after a quarter of it (`client.rs`), so only a peer that went away, or one that keeps
/// sockets open and sends nothing, reaches it.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(600);

/// How long a frame header that has begun may take to arrive whole.
pub const HEADER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The process's admission to its node listeners (see [`LIMITS`]).
fn gate() -> &'static Arc<trireme_net::Gate> {
    static G: std::sync::OnceLock<Arc<trireme_net::Gate>> = std::sync::OnceLock::new();
    G.get_or_init(|| trireme_net::Gate::new("node", LIMITS))
}

/// Peers refused at a node's listeners: one log line a second at most.
static REFUSED: Throttles = Throttles::per_second();

/// Serves `handler` on `listener`, for good: a failed accept is retried (see
/// `trireme_net::accept`). Each admitted socket gets its own reader and writer task; each
/// request runs as its own task, at most `MAX_IN_FLIGHT_PER_STREAM` at once per socket. A
/// malformed frame closes that socket only. Admission is bounded by [`LIMITS`]; a TLS peer
/// is authenticated before any buffer of its link is allocated.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> std::io::Result<()> {
    let tls = data_tls().and_then(|t| t.server.clone());
    loop {
        let (sock, peer) = trireme_net::accept("node", || listener.accept()).await;
        let Some(handshake) = gate().handshake_tcp(sock.local_addr().ok(), peer) else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let h = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let r = match tls {
                None => {
                    let Some(_place) = gate().establish(handshake) else {
                        return;
                    };
                    let (rd, wr) = sock.into_split();
                    let rd = BufReader::with_capacity(READ_BUFFER, rd);
                    serve_stream(rd, wr, WRITE_BUFFER, h, crate::Peer::Trusted).await
                }
                Some(cfg) => {
                    let accepted = handshake
                        .run(tokio::time::timeout(TLS_HANDSHAKE, async {
                            // Its ClientHello arrived: it goes after silent peers if the
                            // gate must make room.
                            if matches!(sock.peek(&mut [0u8; 1]).await, Ok(n) if n > 0) {
                                handshake.spoke();
                            }
                            crate::records::accept(sock, cfg).await
                        }))
                        .await;
                    // Evicted to make room for another peer's handshake: it ends here.
                    let Some(accepted) = accepted else {
                        return;
                    };
                    let (rd, wr, role) = match accepted {
                        Ok(Ok(r)) => r,
                        Ok(Err(why)) => {
                            warn_throttled_by!(REFUSED, &why, %peer, "refused a connection: TLS handshake failed: {why}");
                            return;
                        }
                        Err(_) => {
                            warn_throttled_by!(REFUSED, "no handshake", %peer, "refused a connection: no TLS handshake within {TLS_HANDSHAKE:?}");
                            return;
                        }
                    };
                    let Some(_place) = gate().establish(handshake) else {
                        return;
                    };
                    tracing::debug!(%peer, %role, sealed_frames = rd.frames_sealed(), "TLS peer");
                    serve_stream(rd, wr, 0, h, crate::Peer::Cert(Arc::new(role))).await
                }
            };
            if let Err(e) = r {
                warn_throttled_by!(CLOSED, &e.to_string(), %peer, "closing connection: {e}");
            }
        });
    }
}

/// Links closed on an error (a peer that died mid-frame, a malformed frame): throttled too.
static CLOSED: Throttles = Throttles::per_second();

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

/// Serves `handler` on a unix socket listener (peers on the same host, of this process's user),
/// like [`serve`].
pub async fn serve_unix<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
) -> std::io::Result<()> {
    loop {
        let (sock, _) = trireme_net::accept("node (unix)", || listener.accept()).await;
        if let Err(why) = trireme_tls::local::check_peer(&sock) {
            warn_throttled_by!(
                REFUSED,
                &why.to_string(),
                "refused a same-host connection: {why}"
            );
            continue;
        }
        // A same-host peer holds a handshake's place (evictable, see `trireme_net::Gate`)
        // until its first frame starts, within the header deadline.
        let Some(handshake) = gate().handshake(None) else {
            continue;
        };
        let h = handler.clone();
        tokio::spawn(async move {
            let spoke = handshake
                .run(tokio::time::timeout(
                    HEADER_DEADLINE,
                    trireme_net::io::first_bytes(&sock),
                ))
                .await;
            if !matches!(spoke, Some(Ok(Ok(())))) {
                return;
            }
            let Some(place) = gate().establish(handshake) else {
                return;
            };
            let (rd, wr) = sock.into_split();
            let rd = BufReader::with_capacity(READ_BUFFER, rd);
            if let Err(e) = serve_stream(rd, wr, WRITE_BUFFER, h, crate::Peer::Trusted).await {
                warn_throttled_by!(CLOSED, &e.to_string(), "closing unix connection: {e}");
            }
            drop(place);
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
        let mut hb = [0u8; HEADER_LEN];
        match trireme_net::io::read_header(&mut rd, &mut hb, Some(IDLE), HEADER_DEADLINE).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(trireme_net::io::HeaderError::Io(e))
                if e.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                return Ok(())
            }
            Err(e) => return Err(ReadError::Header(e)),
        }
        let header = decode_header(&hb).map_err(ReadError::Decode)?;
        // Authorized on its header: a request its sender may not make is answered without
        // its payload being read into memory (the bytes are skipped).
        if let Some(refusal) = handler.refuse(&header, &peer) {
            skip_payload(&mut rd, header.payload_len as usize, PAYLOAD_DEADLINE).await?;
            let mut w = wr.lock().await;
            write_one(&mut w, &refusal.header, &refusal.payload, None)
                .await
                .map_err(ReadError::Io)?;
            w.flush().await.map_err(ReadError::Io)?;
            continue;
        }
        let mut frame = read_payload_charged(&mut rd, header, PAYLOAD_DEADLINE).await?;
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
                resp.payload = crate::ucx::encode_offer(
                    &resp.payload,
                    &secret,
                    crate::ucx::Locality::here().as_ref(),
                )
                .into();
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
