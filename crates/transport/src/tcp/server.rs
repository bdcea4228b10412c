//! The server end: listeners, admission, and one task per stream that reads requests and
//! hands them to the [`Handler`](crate::Handler).

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use trireme_proto::HEADER_LEN;

use super::frames::{read_frame_within, write_one, FrameSink, FrameSource, ReadError};
use super::{data_tls, MAX_IN_FLIGHT_PER_STREAM, READ_BUFFER, WRITE_BUFFER};
use crate::Handler;

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
pub(crate) fn connection_slot(peer: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
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

pub(crate) async fn serve_stream<H, R, W>(
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
