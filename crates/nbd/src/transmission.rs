//! Transmission: requests read in order, served concurrently, answered out of order.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, Semaphore};

use crate::codec::{decode_request, Request, REQUEST_LEN};
use crate::consts::*;
use crate::replies::*;
use crate::server::{Session, INFLIGHT_UNITS, PROCESS_UNITS};
use crate::{BackendError, BlockDevice, NbdError, Want, MAX_REQUEST};
use trireme_net::{warn_throttled, Throttle};

/// How long a request that has begun may take to arrive whole: its header, and a write's
/// payload once the header is in.
pub(crate) const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
pub(crate) const PAYLOAD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

static OVERSIZE: Throttle = Throttle::per_second();

/// Requests this process's NBD server refused before they reached the volume, by reason:
/// exported as `trireme_nbd_refused_requests_total` (a refusal is logged at most once a
/// second; the count says how many there were).
#[derive(Debug, Default)]
pub struct Refused {
    /// Over the 32 MiB request limit.
    pub oversize: std::sync::atomic::AtomicU64,
    /// Past the export's end.
    pub out_of_range: std::sync::atomic::AtomicU64,
    /// Unknown command or flags.
    pub invalid: std::sync::atomic::AtomicU64,
}

/// The process's counts (see [`Refused`]).
pub fn refusals() -> &'static Refused {
    static R: std::sync::OnceLock<Refused> = std::sync::OnceLock::new();
    R.get_or_init(Refused::default)
}

fn count(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The process's share of every connection's in-flight budget (see [`PROCESS_UNITS`]).
fn process_budget() -> &'static Arc<Semaphore> {
    static B: std::sync::OnceLock<Arc<Semaphore>> = std::sync::OnceLock::new();
    B.get_or_init(|| Arc::new(Semaphore::new(PROCESS_UNITS as usize)))
}

/// A request's in-flight budget: its connection's units and the process's, taken in that
/// order (so a connection that waits holds only its own), and given back together when its
/// reply has been written.
#[derive(Debug)]
pub(crate) struct Held {
    _connection: tokio::sync::OwnedSemaphorePermit,
    _process: tokio::sync::OwnedSemaphorePermit,
}

impl Held {
    async fn take(connection: &Arc<Semaphore>, units: u32) -> Option<Held> {
        let c = connection.clone().acquire_many_owned(units).await.ok()?;
        let p = process_budget()
            .clone()
            .acquire_many_owned(units)
            .await
            .ok()?;
        Some(Held {
            _connection: c,
            _process: p,
        })
    }
}

pub(crate) async fn transmission<R, W, B>(rd: R, wr: W, s: Session<B>) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
    B: BlockDevice,
{
    let mut rd = tokio::io::BufReader::with_capacity(256 * 1024, rd);
    // Unbounded as a channel, bounded by the budget every queued reply holds.
    let (tx, rx) = mpsc::unbounded_channel::<Queued>();
    let writer = tokio::spawn(write_replies(wr, rx));
    let budget = Arc::new(Semaphore::new(INFLIGHT_UNITS as usize));
    let s = Arc::new(s);
    let negotiated = s.backend.size();
    let result = loop {
        // A session may idle as long as its client likes (a VM's disk that nobody uses), but
        // a request that has begun must arrive whole within REQUEST_DEADLINE.
        let mut hb = [0u8; REQUEST_LEN];
        match trireme_net::io::read_header(&mut rd, &mut hb, None, REQUEST_DEADLINE).await {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(trireme_net::io::HeaderError::Io(e))
                if e.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                break Ok(())
            }
            Err(trireme_net::io::HeaderError::Io(e)) => break Err(e.into()),
            Err(e) => break Err(NbdError::Protocol(e.to_string())),
        }
        let req = match decode_request(&hb) {
            Ok(r) => r,
            Err(e) => break Err(NbdError::Protocol(e.to_string())),
        };
        if req.command == CMD_DISC {
            break Ok(());
        }
        let structured_read = s.structured && req.command == CMD_READ;
        let size = match s.live_size {
            true => s.backend.size(),
            false => negotiated,
        };
        let end = req.offset.checked_add(u64::from(req.length));
        let refused = if req.flags & !KNOWN_CMD_FLAGS != 0 {
            count(&refusals().invalid);
            Some(invalid(
                EINVAL,
                format!("unknown command flags {:#x}", req.flags),
            ))
        } else if !matches!(req.command, CMD_FLUSH) && end.is_none_or(|e| e > size) {
            count(&refusals().out_of_range);
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
            count(&refusals().oversize);
            warn_throttled!(
                OVERSIZE,
                length = req.length,
                "NBD read over the {MAX_REQUEST}-byte limit: refused"
            );
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
        // The budget first, for the payload to come and the reply to go: error replies are
        // small, but a client that never reads them must not pile up a queue either.
        // Only a read's reply and a write's payload are as large as the request's length: a
        // block status of 4 GiB answers a few KiB (it took the connection's whole budget).
        let units = match (&refused, req.command) {
            (Some(_), c) if c != CMD_WRITE => 1,
            (_, CMD_READ | CMD_WRITE) => (1 + req.length / (64 * 1024)).min(INFLIGHT_UNITS),
            _ => 1,
        };
        let Some(permit) = Held::take(&budget, units).await else {
            break Ok(());
        };
        // A write's payload follows its header: read it now, before the next request.
        let mut payload = Bytes::new();
        if req.command == CMD_WRITE {
            if req.length > MAX_REQUEST {
                count(&refusals().oversize);
                warn_throttled!(
                    OVERSIZE,
                    length = req.length,
                    "NBD write over the {MAX_REQUEST}-byte limit: refused, and the connection closed"
                );
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
            let read = read_payload(&mut rd, req.length as usize);
            payload = match tokio::time::timeout(PAYLOAD_DEADLINE, read).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => break Err(e.into()),
                Err(_) => {
                    break Err(NbdError::Protocol(format!(
                        "a {}-byte write's payload did not arrive within {PAYLOAD_DEADLINE:?}",
                        req.length
                    )))
                }
            };
        }
        if let Some(e) = refused {
            let _ = tx.send((error_reply(structured_read, req.cookie, &e), Some(permit)));
            continue;
        }
        let (s2, tx2) = (s.clone(), tx.clone());
        tokio::spawn(async move {
            let (cookie, command) = (req.cookie, req.command);
            // A bug in one request's handler (a panic) answers that request EIO and says so,
            // rather than leave the client waiting for a reply that never comes.
            let reply = match (Unwinding(execute(&s2, req, payload))).await {
                Ok(reply) => reply,
                Err(why) => {
                    tracing::error!(
                        command,
                        "an NBD request's handler failed ({why}): answered EIO"
                    );
                    let e = BackendError {
                        errno: EIO,
                        message: "internal error".into(),
                    };
                    error_reply(structured_read, cookie, &e)
                }
            };
            // The budget goes with the reply: released once it is written.
            let _ = tx2.send((reply, Some(permit)));
        });
    };
    drop(tx);
    // Wait for in-flight requests to be answered before closing (a clean DISC completes them).
    let _ = writer.await;
    result
}

/// A future whose panic is caught: `Err` carries the panic's message.
struct Unwinding<F>(F);

impl<F: std::future::Future> std::future::Future for Unwinding<F> {
    type Output = Result<F::Output, String>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        // SAFETY: the inner future is never moved out of the pinned wrapper.
        let inner = unsafe { self.map_unchecked_mut(|u| &mut u.0) };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(p) => p.map(Ok),
            Err(panic) => std::task::Poll::Ready(Err(panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into()))),
        }
    }
}

/// Reads a write's `len` payload bytes (bounded by `MAX_REQUEST`) into spare capacity: nothing
/// is zero-filled before the data overwrites it.
pub(crate) async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
) -> std::io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *rd).take(want).read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

pub(crate) async fn execute<B: BlockDevice>(s: &Session<B>, req: Request, payload: Bytes) -> Reply {
    let b = &*s.backend;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let cookie = req.cookie;
    let done = |r: Result<(), BackendError>| match r {
        Ok(()) => (simple_reply(cookie, 0), Bytes::new()),
        Err(e) => error_reply(false, cookie, &e),
    };
    let writes = matches!(req.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && b.caps().read_only {
        return done(Err(invalid(EPERM, "the export is read-only")));
    }
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
            Err(e) => error_reply(s.structured, cookie, &e.into()),
        },
        CMD_WRITE => done(b.write(req.offset, payload, fua).await.map_err(Into::into)),
        CMD_FLUSH => done(b.flush().await.map_err(Into::into)),
        CMD_TRIM => done(
            b.trim(req.offset, req.length, fua)
                .await
                .map_err(Into::into),
        ),
        CMD_WRITE_ZEROES => {
            let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
            if req.flags & CMD_FLAG_FAST_ZERO != 0 && no_hole {
                // Writing real zeros is not fast; say so, as FAST_ZERO asks.
                return done(Err(invalid(ENOTSUP, "fast zero needs hole punching")));
            }
            done(
                b.write_zeroes(req.offset, req.length, !no_hole, fua)
                    .await
                    .map_err(Into::into),
            )
        }
        CMD_BLOCK_STATUS => {
            if req.length == 0 {
                return error_reply(
                    s.structured,
                    cookie,
                    &invalid(EINVAL, "zero-length block status"),
                );
            }
            if s.contexts.is_empty() {
                return error_reply(
                    s.structured,
                    cookie,
                    &invalid(EINVAL, "no metadata context negotiated"),
                );
            }
            // One chunk per context the client set, the last one marked done. Each covers
            // the range or a prefix of it (the length is a hint): as many extents as the
            // backend found without going through the whole range.
            let mut out = BytesMut::new();
            let last = s.contexts.len() - 1;
            let one = req.flags & CMD_FLAG_REQ_ONE != 0;
            let want = if one { Want::One } else { Want::First };
            for (k, (id, name)) in s.contexts.iter().enumerate() {
                let base = name == BASE_ALLOCATION;
                let r = if base {
                    b.block_status(req.offset, req.length, want).await
                } else {
                    b.context_status(name, req.offset, req.length, want).await
                };
                let ext = match r {
                    Ok(ext) => ext,
                    Err(e) => return error_reply(true, cookie, &e.into()),
                };
                let ext = prefix_of(ext, req.length, one);
                if ext.is_empty() {
                    return error_reply(
                        true,
                        cookie,
                        &invalid(EIO, format!("no extent for context {name}")),
                    );
                }
                let flags = if k == last { REPLY_FLAG_DONE } else { 0 };
                out.extend_from_slice(&chunk_header(
                    cookie,
                    flags,
                    REPLY_TYPE_BLOCK_STATUS,
                    4 + 8 * ext.len() as u32,
                ));
                out.put_u32(*id);
                for e in ext {
                    out.put_u32(e.length.min(u64::from(u32::MAX)) as u32);
                    out.put_u32(if base {
                        e.flags & (STATE_HOLE | STATE_ZERO)
                    } else {
                        e.flags
                    });
                }
            }
            (out, Bytes::new())
        }
        other => {
            count(&refusals().invalid);
            error_reply(
                false,
                cookie,
                &invalid(EINVAL, format!("unknown command {other}")),
            )
        }
    }
}

/// A backend's extents as a reply carries them: none empty, one at most with `REQ_ONE`, and
/// no further than the request's length (the length is a hint to the server, not to what
/// it answers past).
pub(crate) fn prefix_of(ext: Vec<crate::Extent>, len: u32, one: bool) -> Vec<crate::Extent> {
    let mut left = u64::from(len);
    let mut out = Vec::with_capacity(ext.len().min(1024));
    for mut e in ext.into_iter().filter(|e| e.length > 0) {
        if left == 0 || (one && !out.is_empty()) {
            break;
        }
        e.length = e.length.min(left);
        left -= e.length;
        out.push(e);
    }
    out
}
