//! The process's UCX worker: the handlers of requests and responses, and the calls waiting
//! for their answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::{oneshot, Notify};
use trireme_net::{warn_throttled, Throttle};
use trireme_proto::Header;
use trireme_ucx::{AmData, Context, Endpoint, MemPool, Payload, ReplyEp, RndvData, Taken, Worker};

use super::driver::drive;
use super::grants::{granted, note_unknown_secret};
use super::wire::{frame_of, parse_request_header, parse_response_header, same_secret, AM_HEADER};
use super::*;
use crate::{Frame, Handler, TransportError};

/// The process's UCX worker, what it serves, and the calls waiting on it.
pub struct Hub {
    pub(super) worker: Arc<Worker>,
    /// Where rendezvous payloads land (`None` if UCX could not register it).
    pool: Option<Arc<MemPool>>,
    address: Vec<u8>,
    config: Config,
    /// Calls waiting for their answer, by request id.
    waiting: Mutex<HashMap<u64, Call>>,
    server: OnceLock<Arc<dyn Server>>,
    /// Answers handlers produced inside progress (where they cannot send), sent by the
    /// driver right after.
    pub(super) outbox: Mutex<Vec<(ReplyEp, Frame, [u8; SECRET_LEN])>>,
    /// Wakes the driver: a send is under way and needs progress to finish.
    pub(super) kick: Notify,
    /// Cleared when the driver task ends (its runtime shut down): the next user starts one.
    driver: Mutex<Option<Arc<AtomicBool>>>,
    /// Whether a driver runs, read without the lock on every call (see [`Hub::drive_here`]).
    pub(super) driven: AtomicBool,
    /// Request rendezvous waiting for payload budget (see [`Hub::receive_charged`]).
    deferred: AtomicUsize,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("config", &self.config).finish()
    }
}

static HUB: OnceLock<Result<&'static Hub, trireme_ucx::Error>> = OnceLock::new();

/// Warnings about requests and responses that were dropped: once a second at most.
static BAD_REQUEST: Throttle = Throttle::per_second();
static FORGED: Throttle = Throttle::per_second();

/// Most request rendezvous that wait for payload budget at once (see [`Hub::receive_charged`]).
const MAX_DEFERRED: usize = 1024;

impl Hub {
    /// The process's hub, created on first use. An error says why UCX cannot be used here.
    /// A runtime that uses it must call [`Hub::drive_here`] (negotiation and serving do).
    pub fn get() -> Result<&'static Hub, trireme_ucx::Error> {
        HUB.get_or_init(|| {
            let cfg = CONFIG.get().cloned().unwrap_or_else(|| Config {
                tls: std::env::var("TRIREME_UCX_TLS").ok(),
                net_devices: std::env::var("TRIREME_UCX_NET_DEVICES").ok(),
                ..Default::default()
            });
            Hub::start(cfg)
        })
        .clone()
    }

    fn start(mut config: Config) -> Result<&'static Hub, trireme_ucx::Error> {
        // CMA reads the peer's memory with process_vm_readv; if the peer dies mid-transfer,
        // UCX 1.13 (without the peer-failure mode, see the module docs) treats the error as
        // fatal and aborts this process. A node crash must never take its writer down, so CMA
        // is off unless TRIREME_UCX_TLS asks for it; large payloads then go through the
        // shared-memory transports in pieces.
        config.tls.get_or_insert_with(|| DEFAULT_TLS.to_string());
        // Each process's shared-memory FIFO takes the messages of all its peers. UCX's 64
        // entries (freed to senders in halves) fill under a few dozen requests in flight to
        // a 3-way volume; a sender that finds it full must poll until the receiver drains
        // it, since nothing signals that. UCX_MM_FIFO_SIZE, when set, still wins.
        // Without shared memory (a writer of nodes in other network namespaces) UCX calls the
        // variable invalid and says so on stdout, where `trireme nbd` prints its URI.
        if config.mm_fifo_size.is_none()
            && std::env::var_os("UCX_MM_FIFO_SIZE").is_none()
            && config.tls.as_deref().is_none_or(uses_shared_memory)
        {
            config.mm_fifo_size = Some(MM_FIFO_SIZE);
        }
        let ctx = Context::new(&config)?;
        let worker = Worker::new(&ctx)?;
        let address = worker.address()?;
        let pool = MemPool::new(&ctx, POOL_CHUNK, POOL_CHUNKS)
            .map_err(|e| tracing::warn!("UCX receive pool not registered, receiving without: {e}"))
            .ok();
        // The hub lives as long as the process: its worker's handlers refer to it.
        let hub: &'static Hub = Box::leak(Box::new(Hub {
            worker,
            pool,
            address,
            config,
            waiting: Mutex::default(),
            server: OnceLock::new(),
            outbox: Mutex::default(),
            kick: Notify::new(),
            driver: Mutex::default(),
            driven: AtomicBool::new(false),
            deferred: AtomicUsize::new(0),
        }));
        hub.install()?;
        tracing::debug!(
            address = %hub.address.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            config = ?hub.config,
            "UCX worker started"
        );
        Ok(hub)
    }

    /// This process's worker address (what a node advertises).
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Makes sure a task of some tokio runtime progresses the worker, starting one on the
    /// current runtime if none does. The task ends with its runtime; the next call after
    /// that (every UCX call makes one) starts another.
    pub fn drive_here(&'static self) {
        if self.driven.load(Ordering::Acquire) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut d = lock(&self.driver);
        if !d
            .as_ref()
            .is_some_and(|alive| alive.load(Ordering::Acquire))
        {
            let alive = Arc::new(AtomicBool::new(true));
            *d = Some(alive.clone());
            rt.spawn(drive(self, alive));
        }
        self.driven.store(true, Ordering::Release);
    }

    /// Serves `handler` for every UCX request this process receives. Requests the handler
    /// answers without waiting (an in-memory store) are answered by the driver itself; the
    /// rest run as tasks of the current tokio runtime.
    pub fn serve<H: Handler>(&'static self, handler: Arc<H>) {
        let _ = self.server.set(Arc::new(Served {
            handler,
            rt: tokio::runtime::Handle::current(),
            hub: self,
        }));
        self.drive_here();
    }

    /// The handlers of requests and responses. Both check everything their header says
    /// before any payload is received: a request must carry a secret this process handed out
    /// (see `grants.rs`); a response must answer a call waiting here, carry the secret that
    /// call's link was given, and come from the endpoint the call went out on. Anything else
    /// is declined unread (a rendezvous is never fetched), with a throttled warning.
    fn install(&'static self) -> Result<(), trireme_ucx::Error> {
        self.worker
            .set_am_handler(AM_REQUEST, move |w, hdr, data, reply| {
                let Some(ep) = reply else {
                    warn_throttled!(BAD_REQUEST, "UCX request without a reply endpoint dropped");
                    return Taken::Refused;
                };
                let (h, secret) = match parse_request_header(hdr) {
                    Ok((h, secret)) if h.payload_len as usize == data.len() => (h, secret),
                    Ok((h, _)) => {
                        warn_throttled!(
                            BAD_REQUEST,
                            "UCX request announcing {} payload bytes with {} dropped unread",
                            h.payload_len,
                            data.len()
                        );
                        return Taken::Refused;
                    }
                    Err(e) => {
                        warn_throttled!(BAD_REQUEST, "UCX request dropped unread: {e}");
                        return Taken::Refused;
                    }
                };
                // Unknown secret: dropped before anything is received or allocated.
                let Some((origin, peer)) = granted(&secret) else {
                    note_unknown_secret();
                    return Taken::Refused;
                };
                // Authorized on the header: what the peer may not ask costs no payload.
                if let Some(refusal) = self.server.get().and_then(|s| s.refuse(&h, &peer)) {
                    lock(&self.outbox).push((ep, refusal, secret));
                    return Taken::Done;
                }
                let then = move |payload| self.on_request(h, secret, origin, peer, payload, ep);
                match data {
                    AmData::Eager(b) => {
                        then(Ok(Bytes::copy_from_slice(b)));
                        Taken::Done
                    }
                    AmData::Rndv(r) => self.receive_charged(w, r, then),
                }
            })?;
        self.worker
            .set_am_handler(AM_RESPONSE, move |w, hdr, data, reply| {
                let (h, tag) = match parse_response_header(hdr, data.len()) {
                    Ok(x) => x,
                    Err(e) => {
                        warn_throttled!(FORGED, "UCX response dropped unread: {e}");
                        return Taken::Refused;
                    }
                };
                let from = reply.map(|r| r.id());
                let call = {
                    let mut waiting = lock(&self.waiting);
                    match waiting.get(&h.request_id) {
                        Some(c) if same_secret(&c.secret, &tag) && from == Some(c.ep) => {
                            waiting.remove(&h.request_id)
                        }
                        Some(_) => {
                            drop(waiting);
                            warn_throttled!(
                                FORGED,
                                request = h.request_id,
                                "UCX response with the wrong secret, or from an endpoint its \
                                 request did not go to, dropped unread"
                            );
                            return Taken::Refused;
                        }
                        // A late answer to a call given up (or a guess): nobody waits for it.
                        None => return Taken::Refused,
                    }
                };
                let Some(call) = call else {
                    return Taken::Refused;
                };
                let then = move |payload: Result<Bytes, String>| {
                    let r = payload.map_err(|e| closed(&e)).and_then(|p| frame_of(h, p));
                    let _ = call.reply.send(r);
                };
                match data {
                    AmData::Eager(b) => then(Ok(Bytes::copy_from_slice(b))),
                    AmData::Rndv(r) => w.recv_rndv(
                        r,
                        self.pool.as_ref(),
                        Box::new(move |got| {
                            then(got.map(Bytes::from_owner).map_err(|e| e.to_string()))
                        }),
                    ),
                }
                Taken::Done
            })
    }

    /// Fetches a request's rendezvous payload once the process's payload budget
    /// (`budget.rs`) has room for it: now, or later from a task while UCX keeps the
    /// descriptor (at most [`MAX_DEFERRED`] wait so; more are declined, and their senders'
    /// calls fail over to TCP).
    fn receive_charged(
        &'static self,
        w: &Worker,
        r: RndvData,
        then: impl FnOnce(Result<Bytes, String>) + Send + 'static,
    ) -> Taken {
        if let Some(charge) = crate::budget::try_charge(r.length) {
            self.receive(w, r, charge, then);
            return Taken::Done;
        }
        let Some(server) = self.server.get() else {
            return Taken::Refused;
        };
        if self.deferred.fetch_add(1, Ordering::AcqRel) >= MAX_DEFERRED {
            self.deferred.fetch_sub(1, Ordering::AcqRel);
            warn_throttled!(
                BAD_REQUEST,
                "UCX request declined: {MAX_DEFERRED} already wait for payload budget"
            );
            return Taken::Refused;
        }
        server.runtime().spawn(async move {
            let charge = crate::budget::charge(r.length).await;
            self.deferred.fetch_sub(1, Ordering::AcqRel);
            self.receive(&self.worker, r, charge, then);
            self.kick.notify_one();
        });
        Taken::Kept
    }

    /// Fetches a rendezvous payload (into a chunk of the registered pool when one fits,
    /// handed on without a copy), which pays `charge` back when dropped.
    fn receive(
        &self,
        w: &Worker,
        r: RndvData,
        charge: crate::budget::Charge,
        then: impl FnOnce(Result<Bytes, String>) + Send + 'static,
    ) {
        use crate::budget::Charged;
        w.recv_rndv(
            r,
            self.pool.as_ref(),
            Box::new(move |got| {
                then(
                    got.map(|b| Bytes::from_owner(Charged(b, Some(charge))))
                        .map_err(|e| e.to_string()),
                )
            }),
        )
    }

    pub(super) fn on_request(
        &'static self,
        h: Header,
        secret: [u8; SECRET_LEN],
        origin: u64,
        peer: crate::Peer,
        payload: Result<Bytes, String>,
        ep: ReplyEp,
    ) {
        let Some(server) = self.server.get() else {
            return;
        };
        match payload.map_err(|e| closed(&e)).and_then(|p| frame_of(h, p)) {
            Ok(mut f) => {
                f.origin = origin;
                f.peer = peer;
                if let Some(resp) = server.take(f, ep, secret) {
                    lock(&self.outbox).push((ep, resp, secret));
                }
            }
            Err(e) => warn_throttled!(BAD_REQUEST, "bad UCX request dropped: {e}"),
        }
    }

    /// Sends a node's answer on the reply endpoint of its request (from any thread), with the
    /// secret of the link the request came on.
    pub(super) fn send_answer(&'static self, ep: ReplyEp, resp: Frame, secret: [u8; SECRET_LEN]) {
        let mut header = Vec::with_capacity(AM_HEADER);
        header.extend_from_slice(&resp.header.encode(&resp.payload));
        header.extend_from_slice(&secret);
        let pending = self.worker.reply(
            ep,
            AM_RESPONSE,
            header,
            Payload::Boxed(Box::new(resp.payload)),
            Box::new(move |r| {
                if let Err(e) = r {
                    tracing::debug!("UCX answer not delivered: {e}");
                }
            }),
        );
        if pending {
            self.kick.notify_one();
        }
    }

    /// Sends a call on `ep` and returns where its answer will come.
    pub(super) fn start_call(
        &'static self,
        ep: &Endpoint,
        link: u64,
        secret: &[u8; SECRET_LEN],
        mut header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Waiting {
        header.request_id = next_id();
        let request_id = header.request_id;
        header.flags &= !trireme_proto::FLAG_RESPONSE;
        let encoded = match crc {
            Some(crc) => {
                debug_assert_eq!(crc, trireme_proto::payload_crc(&payload));
                header.encode_with_crc(payload.len(), crc)
            }
            None => header.encode(&payload),
        };
        let mut h = Vec::with_capacity(AM_HEADER);
        h.extend_from_slice(&encoded);
        h.extend_from_slice(secret);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(
            request_id,
            Call {
                link,
                secret: *secret,
                ep: ep.id(),
                reply: tx,
            },
        );
        let pending = ep.am_send(
            AM_REQUEST,
            h,
            Payload::Boxed(Box::new(payload)),
            true,
            Box::new(move |r| {
                if let Err(e) = r {
                    let waiting = lock(&self.waiting).remove(&request_id);
                    if let Some(c) = waiting {
                        let _ = c.reply.send(Err(closed(&e.to_string())));
                    }
                }
            }),
        );
        if pending {
            self.kick.notify_one();
        }
        Waiting {
            hub: self,
            request_id,
            rx,
            answered: false,
        }
    }

    /// Fails every call waiting on `link` with `reason`.
    pub(super) fn fail_link(&self, link: u64, reason: &str) {
        let failed: Vec<Reply> = {
            let mut w = lock(&self.waiting);
            let ids: Vec<u64> = w
                .iter()
                .filter(|(_, c)| c.link == link)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| w.remove(&id).map(|c| c.reply))
                .collect()
        };
        for reply in failed {
            let _ = reply.send(Err(closed(reason)));
        }
    }
}

/// A call waiting for its answer: what the answer must carry and where it must come from.
struct Call {
    /// The connection it went out on ([`Hub::fail_link`]).
    link: u64,
    /// That link's secret: the answer carries it.
    secret: [u8; SECRET_LEN],
    /// The endpoint it went out on: the answer comes from its peer.
    ep: usize,
    reply: Reply,
}

/// A call's answer to come. Dropping it (the caller gave up) forgets the call, so a late
/// answer finds nobody and is dropped.
pub(super) struct Waiting {
    hub: &'static Hub,
    request_id: u64,
    rx: oneshot::Receiver<Result<Frame, TransportError>>,
    answered: bool,
}

impl Waiting {
    pub(super) async fn answer(mut self) -> Result<Frame, TransportError> {
        let r = (&mut self.rx).await;
        self.answered = true;
        r.unwrap_or_else(|_| Err(closed("UCX call forgotten")))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.answered {
            lock(&self.hub.waiting).remove(&self.request_id);
        }
    }
}

/// What the hub serves requests with (a [`Handler`], type-erased).
trait Server: Send + Sync {
    /// Handles a request: the answer now, or `None` when it was handed to a task (which sends
    /// the answer itself, with `secret`).
    fn take(&self, f: Frame, ep: ReplyEp, secret: [u8; SECRET_LEN]) -> Option<Frame>;
    /// The runtime the handler's tasks run on.
    fn runtime(&self) -> &tokio::runtime::Handle;
    /// See [`Handler::refuse`].
    fn refuse(&self, h: &Header, peer: &crate::Peer) -> Option<Frame>;
}

struct Served<H: Handler> {
    handler: Arc<H>,
    rt: tokio::runtime::Handle,
    hub: &'static Hub,
}

impl<H: Handler> Server for Served<H> {
    fn take(&self, f: Frame, ep: ReplyEp, secret: [u8; SECRET_LEN]) -> Option<Frame> {
        let hub = self.hub;
        // An answer the handler gave later than the request's arrival goes out only while the
        // link the request came on is open. A peer that died meanwhile failed its lanes, and
        // UCX 1.13 frees the reply endpoint of a failed lane (openucx/ucx#6722): sending on it
        // crashed the node. The link's closing is usually seen first, not always (see
        // `docs/ucx.md`: for that reason no tcp lane is opened unless asked, `DEFAULT_TLS`).
        let answer = move |resp: Frame| {
            if super::grants::is_open(&secret) {
                hub.send_answer(ep, resp, secret);
            } else {
                tracing::debug!("UCX answer dropped: its link closed while it was handled");
            }
        };
        let h = self.handler.clone();
        if !h.inline(&f) {
            self.rt.spawn(async move { answer(h.handle(f).await) });
            return None;
        }
        // An inline request completes at its first poll; one that does not is finished as a
        // task (its waker is a no-op here, so it must move to a runtime that will poll it).
        let mut fut = Box::pin(h.handle(f));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::future::Future::poll(fut.as_mut(), &mut cx) {
            std::task::Poll::Ready(resp) => Some(resp),
            std::task::Poll::Pending => {
                self.rt.spawn(async move { answer(fut.await) });
                None
            }
        }
    }

    fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    fn refuse(&self, h: &Header, peer: &crate::Peer) -> Option<Frame> {
        self.handler.refuse(h, peer)
    }
}

/// Request ids of UCX calls: unique in the process, since one worker matches every answer.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Whether UCX's transport list `tls` (as `UCX_TLS`: names, or `^` and names left out) lets
/// it use shared memory.
fn uses_shared_memory(tls: &str) -> bool {
    let shm = |t: &str| {
        matches!(
            t.trim(),
            "sm" | "shm" | "mm" | "posix" | "sysv" | "xpmem" | "all"
        )
    };
    match tls.strip_prefix('^') {
        Some(out) => !out
            .split(',')
            .any(|t| matches!(t.trim(), "sm" | "shm" | "mm")),
        None => tls.split(',').any(shm),
    }
}

#[cfg(test)]
mod shm_tests {
    #[test]
    fn shared_memory_in_a_transport_list() {
        use super::uses_shared_memory as u;
        assert!(u("sm,cma,tcp") && u("all") && u("^cma") && u("posix,tcp"));
        assert!(!u("^sm,cma") && !u("tcp") && !u("rc,ud") && !u("^shm"));
    }
}
