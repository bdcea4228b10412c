//! The UCX transport: frames as UCX active messages, negotiated over a TCP connection.
//!
//! **Hub.** A process has one UCX worker ([`Hub`]), in UCX's multi-thread mode: a tokio task
//! sends its call on the worker from the thread it runs on, with no hand-off. One task of the
//! runtime, the driver, progresses the worker; it sleeps on the worker's event fd in tokio's
//! reactor, like any socket, so an answer costs one wake-up on each side, as on TCP (no busy
//! loop, no UCX thread). The same worker serves both ends: requests from remote clients
//! (answered by the driver itself when the node's [`Handler`] needs no wait, else by a task)
//! and responses to this process's own calls.
//!
//! **Frames.** A request is active message [`AM_REQUEST`]: the UCX header is the 64-byte frame
//! header followed by the client's connection token (what `Hello` carries on TCP), the UCX
//! payload is the frame payload. UCX sends small payloads eagerly and large ones by rendezvous
//! (zero-copy; an RDMA read where the hardware has one). The response is [`AM_RESPONSE`] on the
//! reply endpoint, matched to its call by `request_id`. Payload checksums are checked as on TCP.
//!
//! **Negotiation.** Every connection starts on TCP ([`TcpConnection`]). The client asks the
//! node for its worker address (`Op::UcxAddress`), connects an endpoint to it and sends a
//! `Ping` over UCX; if that answers, calls go over UCX from then on. The TCP connection stays
//! open: its closing is how a dead node is noticed (UCX endpoints run without the peer-failure
//! mode, which would turn shared memory off in UCX 1.13), and it carries every call after UCX
//! fails. A call that fails on UCX is sent again over TCP; requests are safe to repeat because
//! the volume client holds a write's range until it is answered, so nothing can land between
//! the two attempts.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{oneshot, Notify};
use trireme_proto::{check_payload, decode_header, Header, Op, Status, HEADER_LEN};
pub use trireme_ucx::Config;
use trireme_ucx::{AmData, Context, Endpoint, MemPool, Payload, ReplyEp, Worker};

use crate::tcp::TcpConnection;
use crate::{BoxFuture, Connection, ConnectionInfo, Frame, Handler, TransportError};

/// Active-message id of a request.
pub const AM_REQUEST: u32 = 10;
/// Active-message id of a response.
pub const AM_RESPONSE: u32 = 11;
/// UCX header of a request: frame header and the client's connection token.
const REQUEST_HEADER: usize = HEADER_LEN + SECRET_LEN;
/// Length of the per-link secret every UCX request carries (see [`Grants`]).
pub const SECRET_LEN: usize = 16;
/// UCX transports when none are configured: everything but CMA (see [`Hub::start`]).
pub const DEFAULT_TLS: &str = "^cma";
/// How long the probe over a new UCX endpoint may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Progress calls the driver makes before it lets the runtime's other tasks run.
const PROGRESS_BATCH: usize = 64;
/// The registered receive pool: chunks of 1 MiB (a resync chunk or a large NBD write), 32 of
/// them. Larger payloads, or any while all chunks are in use, get a buffer of their own.
const POOL_CHUNK: usize = 1 << 20;
const POOL_CHUNKS: usize = 32;
/// Entries of the shared-memory receive FIFO (see [`Hub::start`]).
const MM_FIFO_SIZE: u32 = 256;
/// How often the driver yields the CPU to a receiver while UCX holds a pending send, before
/// it sleeps (see [`drive`]), and how long it then sleeps at most.
const SEND_YIELDS: u32 = 8;
const SEND_RETRY: Duration = Duration::from_millis(1);
/// How long, and for at least how many rounds, `ucp_worker_arm` may answer "busy" with no
/// progress before the driver waits up to [`SEND_RETRY`] between tries instead of yielding.
/// Both: on a 2-core host one preemption can outlast a millisecond, and a quick run of busy
/// answers is normal while a peer drains a full FIFO.
const BUSY_SPIN: Duration = Duration::from_millis(10);
const BUSY_ROUNDS: u32 = 64;
/// How often the driver yields the CPU, looking for work after each, when a round found
/// nothing, before it arms the worker and sleeps. Under load this lets the processes that
/// are about to send run first, so their messages are found without a signal and a
/// wake-up; `bench/transport.sh` measured +30-50% IOPS with 2 against none, and 4 or 8 were
/// worse than 2 (they take turns from the processes that do the work).
const IDLE_YIELDS: u32 = 2;
/// How long after its last work the driver keeps looking for more before the idle yields and
/// sleep: one `sched_yield` and a turn of the runtime between looks, so any runnable process
/// or task goes first. At queue depth 1 the next message comes within this (a 3-way write
/// took 20-30 us), and is then found by a memory read instead of a signal and a wake-up on
/// each side; an idle process stops looking 50 us after its last message.
const SPIN: Duration = Duration::from_micros(50);

type Reply = oneshot::Sender<Result<Frame, TransportError>>;

/// The process's UCX worker, what it serves, and the calls waiting on it.
pub struct Hub {
    worker: Arc<Worker>,
    /// Where rendezvous payloads land (`None` if UCX could not register it).
    pool: Option<Arc<MemPool>>,
    address: Vec<u8>,
    config: Config,
    /// Calls waiting for their answer: request id -> (link, reply).
    waiting: Mutex<HashMap<u64, (u64, Reply)>>,
    server: OnceLock<Arc<dyn Server>>,
    /// Answers handlers produced inside progress (where they cannot send), sent by the
    /// driver right after.
    outbox: Mutex<Vec<(ReplyEp, Frame)>>,
    /// Wakes the driver: a send is under way and needs progress to finish.
    kick: Notify,
    /// Cleared when the driver task ends (its runtime shut down): the next user starts one.
    driver: Mutex<Option<Arc<AtomicBool>>>,
    /// Whether a driver runs, read without the lock on every call (see [`Hub::drive_here`]).
    driven: AtomicBool,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("config", &self.config).finish()
    }
}

static HUB: OnceLock<Result<&'static Hub, trireme_ucx::Error>> = OnceLock::new();
static CONFIG: OnceLock<Config> = OnceLock::new();

/// Sets how the process's UCX context is configured; call before the first UCX connection or
/// server (later calls have no effect). Without it: `TRIREME_UCX_TLS` and
/// `TRIREME_UCX_NET_DEVICES` from the environment, else UCX's own defaults.
pub fn configure(cfg: Config) {
    let _ = CONFIG.set(cfg);
}

/// The network device that holds `ip` (`lo` for 127.0.0.1), to keep UCX's network lanes on
/// it; `None` for a wildcard address or if no device holds it.
pub fn device_of(ip: std::net::IpAddr) -> Option<String> {
    if ip.is_unspecified() {
        return None;
    }
    let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `ifs` receives a list that we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifs;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned, which stays valid until freed.
        let i = unsafe { &*p };
        p = i.ifa_next;
        if i.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr whose family says its real type.
        let family = i32::from(unsafe { (*i.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so this is a sockaddr_in.
                let sin = unsafe { &*(i.ifa_addr as *const libc::sockaddr_in) };
                std::net::IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so this is a sockaddr_in6.
                let sin6 = unsafe { &*(i.ifa_addr as *const libc::sockaddr_in6) };
                std::net::IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        if addr == ip {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(i.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: `ifs` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifs) };
    found
}

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
        if config.mm_fifo_size.is_none() && std::env::var_os("UCX_MM_FIFO_SIZE").is_none() {
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
        }));
        hub.install()?;
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

    /// The handlers of requests and responses.
    fn install(&'static self) -> Result<(), trireme_ucx::Error> {
        self.worker
            .set_am_handler(AM_REQUEST, move |w, hdr, data, reply| {
                let Some(ep) = reply else { return };
                let secret = match parse_request_header(hdr) {
                    Ok((h, secret)) if h.payload_len as usize == data.len() => secret,
                    Ok((h, _)) => {
                        tracing::warn!(
                            "UCX request announcing {} payload bytes with {} dropped unread",
                            h.payload_len,
                            data.len()
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::warn!("UCX request dropped unread: {e}");
                        return;
                    }
                };
                // Unknown secret: dropped before anything is received or allocated (a
                // rendezvous is declined by not receiving it).
                let Some((origin, peer)) = granted(&secret) else {
                    note_unknown_secret();
                    return;
                };
                let fh = hdr[..HEADER_LEN].to_vec();
                self.with_payload(w, data, move |payload| {
                    self.on_request(fh, origin, peer, payload, ep)
                });
            })?;
        self.worker
            .set_am_handler(AM_RESPONSE, move |w, hdr, data, _| {
                let hdr = hdr.to_vec();
                self.with_payload(w, data, move |payload| self.on_response(&hdr, payload));
            })
    }

    /// Gets an active message's payload: now (eager) or when the rendezvous completes (into
    /// a chunk of the registered pool when one fits, handed on without a copy).
    fn with_payload(
        &self,
        w: &Worker,
        data: AmData<'_>,
        then: impl FnOnce(Result<Bytes, String>) + Send + 'static,
    ) {
        match data {
            AmData::Eager(b) if b.len() > trireme_proto::MAX_PAYLOAD as usize => then(Err(
                format!("a {}-byte payload, over the frame limit", b.len()),
            )),
            AmData::Eager(b) => then(Ok(Bytes::copy_from_slice(b))),
            // The length is the sender's word: checked before anything is allocated for it.
            // Dropping the descriptor (returning from the handler without receiving) is how
            // UCX is told the data is not wanted.
            AmData::Rndv(r) if r.length > trireme_proto::MAX_PAYLOAD as usize => {
                then(Err(format!(
                    "a {}-byte rendezvous, over the {}-byte frame limit: dropped unread",
                    r.length,
                    trireme_proto::MAX_PAYLOAD
                )))
            }
            AmData::Rndv(r) => w.recv_rndv(
                r,
                self.pool.as_ref(),
                Box::new(move |got| then(got.map(Bytes::from_owner).map_err(|e| e.to_string()))),
            ),
        }
    }

    fn on_request(
        &self,
        fh: Vec<u8>,
        origin: u64,
        peer: crate::Peer,
        payload: Result<Bytes, String>,
        ep: ReplyEp,
    ) {
        let Some(server) = self.server.get() else {
            return;
        };
        match payload
            .map_err(|e| closed(&e))
            .and_then(|p| frame_of(&fh, p))
        {
            Ok(mut f) if !f.header.is_response() => {
                f.origin = origin;
                f.peer = peer;
                if let Some(resp) = server.take(f, ep) {
                    lock(&self.outbox).push((ep, resp));
                }
            }
            Ok(_) => tracing::warn!("UCX response sent as a request, dropped"),
            Err(e) => tracing::warn!("bad UCX request dropped: {e}"),
        }
    }

    fn on_response(&self, hdr: &[u8], payload: Result<Bytes, String>) {
        let r = payload
            .map_err(|e| closed(&e))
            .and_then(|p| frame_of(hdr, p));
        let id = match &r {
            Ok(f) => f.header.request_id,
            Err(e) => {
                tracing::warn!("bad UCX response dropped: {e}");
                return;
            }
        };
        let waiting = lock(&self.waiting).remove(&id);
        if let Some((_, reply)) = waiting {
            let _ = reply.send(r);
        }
    }

    /// Sends a node's answer on the reply endpoint of its request (from any thread).
    fn send_answer(&'static self, ep: ReplyEp, resp: Frame) {
        let header = resp.header.encode(&resp.payload).to_vec();
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
    fn start_call(
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
        let mut h = Vec::with_capacity(HEADER_LEN + SECRET_LEN);
        h.extend_from_slice(&encoded);
        h.extend_from_slice(secret);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(request_id, (link, tx));
        let pending = ep.am_send(
            AM_REQUEST,
            h,
            Payload::Boxed(Box::new(payload)),
            true,
            Box::new(move |r| {
                if let Err(e) = r {
                    let waiting = lock(&self.waiting).remove(&request_id);
                    if let Some((_, reply)) = waiting {
                        let _ = reply.send(Err(closed(&e.to_string())));
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
    fn fail_link(&self, link: u64, reason: &str) {
        let failed: Vec<Reply> = {
            let mut w = lock(&self.waiting);
            let ids: Vec<u64> = w
                .iter()
                .filter(|(_, (l, _))| *l == link)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| w.remove(&id).map(|(_, r)| r))
                .collect()
        };
        for reply in failed {
            let _ = reply.send(Err(closed(reason)));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A call's answer to come. Dropping it (the caller gave up) forgets the call, so a late
/// answer finds nobody and is dropped.
struct Waiting {
    hub: &'static Hub,
    request_id: u64,
    rx: oneshot::Receiver<Result<Frame, TransportError>>,
    answered: bool,
}

impl Waiting {
    async fn answer(mut self) -> Result<Frame, TransportError> {
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

/// The worker's event fd, as tokio's reactor watches it (the worker owns and closes it).
struct EventFd(RawFd);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Clears the driver's flags when its task ends.
struct Alive(&'static Hub, Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.1.store(false, Ordering::Release);
        // A driver started meanwhile sets it again on the next call's slow path.
        self.0.driven.store(false, Ordering::Release);
    }
}

/// The task that progresses the worker: until idle (a batch at a time, so other tasks of a
/// single-threaded runtime get their turn), then the answers handlers produced, then asleep
/// on the worker's event fd (armed) or a kick. No busy loop and no thread of its own: an
/// answer wakes the runtime that waits for it, as a TCP socket would.
async fn drive(hub: &'static Hub, alive: Arc<AtomicBool>) {
    let _alive = Alive(hub, alive);
    let efd = EventFd(hub.worker.event_fd());
    // SAFETY: the event fd is the worker's, open for as long as the worker, which lives as
    // long as the process (the hub is never dropped); `EventFd` always returns the same fd.
    let fd = match unsafe { AsyncFd::register_with_interest(efd, Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("UCX worker's event fd cannot be watched: {e}");
            return;
        }
    };
    let (mut yields, mut busy) = (0, None);
    let mut worked = std::time::Instant::now();
    loop {
        let mut n = 0;
        while n < PROGRESS_BATCH && hub.worker.progress() {
            n += 1;
        }
        if n > 0 {
            busy = None;
            worked = std::time::Instant::now();
        }
        let out = std::mem::take(&mut *lock(&hub.outbox));
        for (ep, resp) in out {
            hub.send_answer(ep, resp);
        }
        if n == PROGRESS_BATCH {
            tokio::task::yield_now().await;
            continue;
        }
        // Sends UCX left pending: with a shared-memory FIFO full, only progress after the
        // receiver drains it completes them, and nothing will wake us for that. Give the CPU
        // to the receiver a few times, then sleep with a short timeout rather than for good.
        let sending = hub.worker.sends_pending();
        if sending && yields < SEND_YIELDS {
            yields += 1;
            std::thread::yield_now();
            continue;
        }
        yields = 0;
        // Work came in lately: look again soon, the next message is likely on its way (see
        // SPIN). Each look gives the CPU to whoever can run first.
        if !sending && worked.elapsed() < SPIN {
            std::thread::yield_now();
            tokio::task::yield_now().await;
            continue;
        }
        // Nothing came in this round: before arming (which costs the peers a signal and us a
        // wake-up for their next message), give the CPU to a runnable process a couple of
        // times and look again. On a busy host a peer that is about to send usually is one;
        // on an idle one the yields return at once. Bounded: this is not a poll loop.
        if n == 0 && !sending && idle_yields(hub) {
            worked = std::time::Instant::now();
            continue;
        }
        match hub.worker.arm() {
            Ok(true) => busy = None,
            // Events came in meanwhile: progress again. UCX also says busy while a send waits
            // for room in a peer's FIFO, which a dead peer never makes: never loop without
            // letting the runtime run, and once busy has lasted both BUSY_ROUNDS rounds and
            // BUSY_SPIN with nothing done, wait for an event or a short timeout between tries.
            Ok(false) => {
                let (since, rounds) = busy.get_or_insert_with(|| (std::time::Instant::now(), 0));
                *rounds += 1;
                if *rounds > BUSY_ROUNDS && since.elapsed() > BUSY_SPIN {
                    tokio::select! {
                        r = fd.readable() => { if let Ok(mut g) = r { g.clear_ready(); } }
                        _ = hub.kick.notified() => {}
                        _ = tokio::time::sleep(SEND_RETRY) => {}
                    }
                } else {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            Err(e) => {
                tracing::error!("UCX worker: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let retry = async {
            if sending {
                tokio::time::sleep(SEND_RETRY).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            r = fd.readable() => {
                if let Ok(mut g) = r {
                    g.clear_ready();
                }
            }
            _ = hub.kick.notified() => {}
            _ = retry => {}
        }
    }
}

/// Yields the CPU up to [`IDLE_YIELDS`] times, progressing the worker after each; true as
/// soon as that finds work.
fn idle_yields(hub: &Hub) -> bool {
    (0..IDLE_YIELDS).any(|_| {
        std::thread::yield_now();
        hub.worker.progress()
    })
}

/// What the hub serves requests with (a [`Handler`], type-erased).
trait Server: Send + Sync {
    /// Handles a request: the answer now, or `None` when it was handed to a task (which sends
    /// the answer itself).
    fn take(&self, f: Frame, ep: ReplyEp) -> Option<Frame>;
}

struct Served<H: Handler> {
    handler: Arc<H>,
    rt: tokio::runtime::Handle,
    hub: &'static Hub,
}

impl<H: Handler> Server for Served<H> {
    fn take(&self, f: Frame, ep: ReplyEp) -> Option<Frame> {
        let hub = self.hub;
        let answer = move |resp: Frame| hub.send_answer(ep, resp);
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
}

fn closed(reason: &str) -> TransportError {
    TransportError::Closed {
        peer: "ucx".into(),
        reason: reason.into(),
    }
}

/// Decodes a frame that came as an active message.
/// Splits a UCX request's active-message header: the frame header (decoded and checked: a
/// request, its payload length within the frame limit), then the link's secret. Runs before
/// anything of the payload is received.
pub fn parse_request_header(hdr: &[u8]) -> Result<(Header, [u8; SECRET_LEN]), String> {
    if hdr.len() != REQUEST_HEADER {
        return Err(format!("a {}-byte header, not {REQUEST_HEADER}", hdr.len()));
    }
    let h = decode_header(&hdr[..HEADER_LEN]).map_err(|e| e.to_string())?;
    if h.is_response() {
        return Err("a response sent as a request".into());
    }
    let secret = hdr[HEADER_LEN..]
        .try_into()
        .map_err(|_| "a short secret".to_string())?;
    Ok((h, secret))
}

fn frame_of(hdr: &[u8], payload: Bytes) -> Result<Frame, TransportError> {
    let header = decode_header(hdr).map_err(|source| TransportError::Decode {
        peer: "ucx".into(),
        source,
    })?;
    check_payload(&header, &payload).map_err(|source| TransportError::Decode {
        peer: "ucx".into(),
        source,
    })?;
    Ok(Frame::new(header, payload))
}

/// A connection that carries its calls over UCX when it can, and over its TCP connection
/// otherwise (see the module docs).
#[derive(Debug)]
pub struct UcxConnection {
    tcp: TcpConnection,
    hub: Option<&'static Hub>,
    /// The UCX endpoint while UCX carries the calls. Sends hold it shared; stopping the UCX
    /// path takes it, so no send can use a closed endpoint.
    ep: RwLock<Option<Endpoint>>,
    /// Names this connection's calls in the hub's waiting list.
    link: u64,
    lanes: String,
    /// Why calls go over TCP (`None` while UCX carries them).
    fallback: Mutex<Option<String>>,
    /// The secret the node handed out with its address over the TCP link; every request
    /// carries it.
    secret: [u8; SECRET_LEN],
}

/// The UCX secrets a server handed out, each with the link it went out on (its `Hello`
/// token and its peer): a UCX request is served as if it came on that link.
static GRANTED: RwLock<Option<GrantMap>> = RwLock::new(None);

/// Secret → (the link's `Hello` token, its peer).
type GrantMap = HashMap<[u8; SECRET_LEN], (u64, crate::Peer)>;

/// The link a secret was handed out on, if it still is open.
fn granted(secret: &[u8; SECRET_LEN]) -> Option<(u64, crate::Peer)> {
    GRANTED
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .get(secret)
        .cloned()
}

/// Logs UCX requests with an unknown secret, at most once a second.
fn note_unknown_secret() {
    static DROPPED: AtomicU64 = AtomicU64::new(0);
    static LAST: AtomicU64 = AtomicU64::new(0);
    let n = DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(
            dropped = n,
            "UCX request without a valid secret dropped unread"
        );
    }
}

/// The UCX secrets handed out on one server link: revoked when the link closes (dropped).
#[derive(Debug, Default)]
pub struct Grants(Vec<[u8; SECRET_LEN]>);

impl Grants {
    /// A fresh secret for UCX requests of the link `origin` from `peer`.
    pub fn grant(&mut self, origin: u64, peer: crate::Peer) -> [u8; SECRET_LEN] {
        let mut secret = [0u8; SECRET_LEN];
        fill_random(&mut secret);
        GRANTED
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(secret, (origin, peer));
        self.0.push(secret);
        secret
    }
}

impl Drop for Grants {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut g = GRANTED.write().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = g.as_mut() {
            for s in &self.0 {
                m.remove(s);
            }
        }
    }
}

/// Fills `buf` from the kernel's random source.
fn fill_random(buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into the rest of `buf`, which we own.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n > 0 {
            done += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // getrandom(2) does not fail on Linux 3.17+ once the pool is initialised.
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// Request ids of UCX calls: unique in the process, since one worker matches every answer.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// What [`negotiate`] may do when UCX does not work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Use TCP and say why in the connection's info.
    Allowed,
    /// Fail the connection.
    Refused,
}

/// Moves `tcp`'s data path to UCX if the node offers it and a probe over it answers.
pub async fn negotiate(
    tcp: TcpConnection,
    fallback: Fallback,
) -> Result<UcxConnection, TransportError> {
    let link = next_id();
    let tried = try_ucx(&tcp, link).await;
    let (hub, ep, lanes, why, secret) = match tried {
        Ok((hub, ep, lanes, secret)) => (Some(hub), Some(ep), lanes, None, secret),
        Err(why) if fallback == Fallback::Allowed => {
            tracing::info!(peer = %tcp.peer(), "UCX not used, staying on TCP: {why}");
            (None, None, String::new(), Some(why), [0; SECRET_LEN])
        }
        Err(why) => {
            return Err(TransportError::Connect {
                addr: tcp.peer().to_string(),
                source: std::io::Error::other(format!("UCX required but not usable: {why}")),
            })
        }
    };
    Ok(UcxConnection {
        tcp,
        hub,
        ep: RwLock::new(ep),
        link,
        lanes,
        fallback: Mutex::new(why),
        secret,
    })
}

async fn try_ucx(
    tcp: &TcpConnection,
    link: u64,
) -> Result<(&'static Hub, Endpoint, String, [u8; SECRET_LEN]), String> {
    let offer = tcp
        .call(Header::request(Op::UcxAddress, 0), Bytes::new())
        .await
        .map_err(|e| format!("asking for the node's UCX address: {e}"))?;
    if offer.header.status != Status::Ok {
        return Err(format!(
            "the node offers no UCX: {}",
            String::from_utf8_lossy(&offer.payload)
        ));
    }
    // The worker address, then this link's secret (see [`Grants`]).
    let Some(cut) = offer.payload.len().checked_sub(SECRET_LEN) else {
        return Err("the node's UCX offer is too short to hold a secret".into());
    };
    let (address, secret) = offer.payload.split_at(cut);
    let secret: [u8; SECRET_LEN] = secret.try_into().expect("split at the secret's length");
    let hub = Hub::get().map_err(|e| format!("UCX cannot start here: {e}"))?;
    hub.drive_here();
    let ep = hub
        .worker
        .connect(address)
        .map_err(|e| format!("UCX endpoint: {e}"))?;
    let lanes = ep.lane_summary();
    let probe = hub
        .start_call(
            &ep,
            link,
            &secret,
            Header::request(Op::Ping, 0),
            Bytes::new(),
            None,
        )
        .answer();
    let ok = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(f)) if f.header.status == Status::Ok => Ok(()),
        Ok(Ok(f)) => Err(format!("probe answered {}", f.header.status.as_str())),
        Ok(Err(e)) => Err(format!("probe failed: {e}")),
        Err(_) => Err(format!("probe not answered within {PROBE_TIMEOUT:?}")),
    };
    if let Err(e) = ok {
        ep.close(true);
        return Err(e);
    }
    Ok((hub, ep, lanes, secret))
}

impl UcxConnection {
    /// Sends a call over UCX if UCX carries this connection's calls.
    fn start_ucx(&self, header: Header, payload: &Bytes, crc: Option<u32>) -> Option<Waiting> {
        let hub = self.hub?;
        hub.drive_here();
        let ep = self.ep.read().unwrap_or_else(|e| e.into_inner());
        let ep = ep.as_ref()?;
        Some(hub.start_call(ep, self.link, &self.secret, header, payload.clone(), crc))
    }

    /// Stops the UCX path: closes the endpoint (sends under way fail) and fails the calls
    /// waiting on it with `why`.
    fn stop_ucx(&self, why: &str) {
        let ep = self.ep.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(ep) = ep {
            ep.close(true);
        }
        if let Some(hub) = self.hub {
            hub.fail_link(self.link, why);
        }
    }
}

impl Drop for UcxConnection {
    fn drop(&mut self) {
        self.stop_ucx("connection dropped");
    }
}

impl Connection for UcxConnection {
    fn call_crc(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> BoxFuture<'_, Result<Frame, TransportError>> {
        Box::pin(self.send(header, payload, crc))
    }

    fn checks_payloads(&self) -> bool {
        // UCX frames always carry checksums; a fall-back to TLS might not need them, but a
        // checksum computed once for a write costs less than asking on every call.
        true
    }

    fn info(&self) -> ConnectionInfo {
        self.info_now()
    }

    fn is_closed(&self) -> bool {
        self.tcp.is_closed()
    }

    fn fall_back(&self, why: &str) -> bool {
        self.fall_back_now(why)
    }
}

impl UcxConnection {
    /// A call over UCX while that path works, else over the TCP connection.
    async fn send(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Result<Frame, TransportError> {
        {
            if let Some(waiting) = self.start_ucx(header, &payload, crc) {
                // A dead node does not fail UCX calls (no peer-failure mode): its TCP
                // connection closing does.
                let r = tokio::select! {
                    r = waiting.answer() => r,
                    _ = self.tcp.closed() => Err(closed("the node's TCP connection closed")),
                };
                match r {
                    Ok(f) => return Ok(f),
                    // The node is gone: TCP will say so too; no point retrying. Close the
                    // endpoint now: sends stuck on it (its FIFO full, its reader dead) would
                    // keep the worker busy for good.
                    Err(e) if self.tcp.is_closed() => {
                        self.stop_ucx("the node's TCP connection closed");
                        return Err(e);
                    }
                    Err(e) => {
                        self.fall_back_now(&e.to_string());
                    }
                }
            }
        }
        self.tcp.call_crc(header, payload, crc).await
    }

    fn info_now(&self) -> ConnectionInfo {
        let mut i = self.tcp.info();
        match &*lock(&self.fallback) {
            None => {
                i.transport = "ucx".into();
                i.lanes = Some(self.lanes.clone());
            }
            Some(why) => i.fallback = Some(why.clone()),
        }
        i
    }

    fn fall_back_now(&self, why: &str) -> bool {
        {
            let mut f = lock(&self.fallback);
            if f.is_some() {
                return false;
            }
            tracing::warn!(peer = %self.tcp.peer(), "UCX path stopped, going on over TCP: {why}");
            *f = Some(why.to_string());
        }
        // Calls in flight on the link fail now and are sent again over TCP.
        self.stop_ucx(why);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_headers_are_checked_before_the_payload() {
        let h = Header::request(Op::Write, 3).encode(&[1, 2, 3]);
        let mut hdr = h.to_vec();
        hdr.extend_from_slice(&[9; SECRET_LEN]);
        let (got, secret) = parse_request_header(&hdr).unwrap();
        assert_eq!(
            (got.op, got.payload_len, secret),
            (Op::Write, 3, [9; SECRET_LEN])
        );
        // A header without its secret, one with a byte more, a broken crc, a response.
        assert!(parse_request_header(&hdr[..HEADER_LEN + 8]).is_err());
        assert!(parse_request_header(&[&hdr[..], &[0]].concat()).is_err());
        let mut bad = hdr.clone();
        bad[20] ^= 1;
        assert!(parse_request_header(&bad).is_err());
        let mut resp = Header::request(Op::Write, 3)
            .response(Status::Ok)
            .encode(&[])
            .to_vec();
        resp.extend_from_slice(&[9; SECRET_LEN]);
        assert!(parse_request_header(&resp).is_err());
        // Any bytes: an error or a request, never a panic.
        for n in 0..200usize {
            let b: Vec<u8> = (0..REQUEST_HEADER)
                .map(|i| (i * 31 + n * 7) as u8)
                .collect();
            let _ = parse_request_header(&b[..n.min(b.len())]);
        }
    }
}
