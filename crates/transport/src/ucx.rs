//! The UCX transport: frames as UCX active messages, negotiated over a TCP connection.
//!
//! **Hub.** A process has one UCX worker, driven by one thread of its own (`trireme-ucx`), the
//! only thread that touches UCX. Tokio tasks talk to it through a command queue whose eventfd
//! wakes the thread from its sleep on the worker's event fd (no busy loop). The same worker
//! serves both ends: requests from remote clients (handed to the node's [`Handler`] on tokio,
//! answered on the reply endpoint) and responses to this process's own calls.
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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use trireme_proto::{check_payload, decode_header, Header, Op, Status, HEADER_LEN};
pub use trireme_ucx::Config;
use trireme_ucx::{AmData, Context, Endpoint, Payload, ReplyEp, Worker};

use crate::tcp::TcpConnection;
use crate::{BoxFuture, Connection, ConnectionInfo, Frame, Handler, TransportError};

/// Active-message id of a request.
pub const AM_REQUEST: u32 = 10;
/// Active-message id of a response.
pub const AM_RESPONSE: u32 = 11;
/// UCX header of a request: frame header and the client's connection token.
const REQUEST_HEADER: usize = HEADER_LEN + 8;
/// UCX transports when none are configured: everything but CMA (see [`Hub::start`]).
pub const DEFAULT_TLS: &str = "^cma";
/// How long the probe over a new UCX endpoint may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

type Reply = oneshot::Sender<Result<Frame, TransportError>>;

enum Cmd {
    Connect {
        address: Vec<u8>,
        reply: oneshot::Sender<Result<(u64, String), String>>,
    },
    Call {
        link: u64,
        header: Vec<u8>,
        request_id: u64,
        payload: Bytes,
        reply: Reply,
    },
    Answer {
        ep: ReplyEp,
        resp: Frame,
    },
    Close {
        link: u64,
        reason: String,
    },
    Serve(Arc<dyn Server>),
}

/// The process's UCX worker and the thread that drives it.
#[derive(Debug)]
pub struct Hub {
    /// `mpsc::Sender` is `Sync`: every task sends without a lock.
    cmds: mpsc::Sender<Cmd>,
    wake: Arc<OwnedFd>,
    /// Set by the UCX thread while it sleeps (or is about to): only then does a command need
    /// the eventfd written, which saves a syscall per command under load.
    sleeping: Arc<AtomicBool>,
    address: Vec<u8>,
    config: Config,
}

static HUB: OnceLock<Result<Arc<Hub>, String>> = OnceLock::new();
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
    /// The process's hub, started on first use. An error says why UCX cannot be used here.
    pub fn get() -> Result<Arc<Hub>, String> {
        HUB.get_or_init(|| {
            let cfg = CONFIG.get().cloned().unwrap_or_else(|| Config {
                tls: std::env::var("TRIREME_UCX_TLS").ok(),
                net_devices: std::env::var("TRIREME_UCX_NET_DEVICES").ok(),
            });
            Hub::start(cfg).map(Arc::new)
        })
        .clone()
    }

    fn start(mut config: Config) -> Result<Hub, String> {
        // CMA reads the peer's memory with process_vm_readv; if the peer dies mid-transfer,
        // UCX 1.13 (without the peer-failure mode, see the module docs) treats the error as
        // fatal and aborts this process. A node crash must never take its writer down, so CMA
        // is off unless TRIREME_UCX_TLS asks for it; large payloads then go through the
        // shared-memory transports in pieces.
        config.tls.get_or_insert_with(|| DEFAULT_TLS.to_string());
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let w = wake.clone();
        let cfg = config.clone();
        let sleeping = Arc::new(AtomicBool::new(false));
        let sl = sleeping.clone();
        std::thread::Builder::new()
            .name("trireme-ucx".into())
            .spawn(move || run(cfg, rx, w, sl, ready_tx))
            .map_err(|e| format!("UCX thread: {e}"))?;
        let address = ready_rx
            .recv()
            .map_err(|_| "UCX thread stopped while starting".to_string())??;
        Ok(Hub {
            cmds: tx,
            wake,
            sleeping,
            address,
            config,
        })
    }

    /// This process's worker address (what a node advertises).
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn send(&self, c: Cmd) -> bool {
        let ok = self.cmds.send(c).is_ok();
        // Pairs with the thread's store-then-check in `run` (both sequentially consistent):
        // either it sees the command before sleeping, or we see it asleep and wake it.
        if !self.sleeping.load(Ordering::SeqCst) {
            return ok;
        }
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd; failure (counter full) only
        // means the thread is already due to wake.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        ok
    }

    /// Serves `handler` for every UCX request this process receives. Requests the handler
    /// answers without waiting (an in-memory store) are answered on the UCX thread itself; the
    /// rest run on the current tokio runtime.
    pub fn serve<H: Handler>(self: &Arc<Self>, handler: Arc<H>) {
        self.send(Cmd::Serve(Arc::new(Served {
            handler,
            rt: tokio::runtime::Handle::current(),
            hub: self.clone(),
        })));
    }
}

/// What the UCX thread serves requests with (a [`Handler`], type-erased).
trait Server: Send + Sync {
    /// Handles a request: the answer now, or `None` when it was handed to tokio (which sends
    /// the answer through the hub).
    fn take(&self, f: Frame, ep: ReplyEp) -> Option<Frame>;
}

struct Served<H: Handler> {
    handler: Arc<H>,
    rt: tokio::runtime::Handle,
    hub: Arc<Hub>,
}

impl<H: Handler> Server for Served<H> {
    fn take(&self, f: Frame, ep: ReplyEp) -> Option<Frame> {
        let hub = self.hub.clone();
        let answer = move |resp: Frame| {
            hub.send(Cmd::Answer { ep, resp });
        };
        let h = self.handler.clone();
        if !h.inline(&f) {
            self.rt.spawn(async move { answer(h.handle(f).await) });
            return None;
        }
        // An inline request completes at its first poll; one that does not is finished on
        // tokio (its waker is a no-op here, so it must move to a runtime that will poll it).
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

/// Per-link calls waiting for their answer.
#[derive(Default)]
struct Waiting {
    calls: HashMap<u64, (u64, Reply)>,
}

struct State {
    links: HashMap<u64, Endpoint>,
    waiting: Waiting,
    next_link: u64,
    server: Option<Arc<dyn Server>>,
    /// Answers ready to go out, sent by the loop before it sleeps (handlers cannot send).
    outbox: Vec<(ReplyEp, Frame)>,
}

fn closed(reason: &str) -> TransportError {
    TransportError::Closed {
        peer: "ucx".into(),
        reason: reason.into(),
    }
}

/// Decodes a frame that came as an active message.
fn frame_of(hdr: &[u8], payload: Vec<u8>) -> Result<Frame, TransportError> {
    let header = decode_header(hdr).map_err(|source| TransportError::Decode {
        peer: "ucx".into(),
        source,
    })?;
    check_payload(&header, &payload).map_err(|source| TransportError::Decode {
        peer: "ucx".into(),
        source,
    })?;
    Ok(Frame::new(header, Bytes::from(payload)))
}

/// Gets an active message's payload: now (eager) or when the rendezvous completes.
fn with_payload(
    w: &Worker,
    data: AmData<'_>,
    then: impl FnOnce(Result<Vec<u8>, String>) + 'static,
) {
    match data {
        AmData::Eager(b) => then(Ok(b.to_vec())),
        AmData::Rndv(r) => {
            w.recv_rndv(r, Box::new(move |got| then(got.map_err(|e| e.to_string()))))
        }
    }
}

/// The UCX thread.
fn run(
    cfg: Config,
    rx: mpsc::Receiver<Cmd>,
    wake: Arc<OwnedFd>,
    sleeping: Arc<AtomicBool>,
    ready: mpsc::Sender<Result<Vec<u8>, String>>,
) {
    let setup = (|| {
        let ctx = Context::new(&cfg).map_err(|e| e.to_string())?;
        let w = Worker::new(&ctx).map_err(|e| e.to_string())?;
        let a = w.address().map_err(|e| e.to_string())?;
        Ok::<_, String>((w, a))
    })();
    let worker = match setup {
        Ok((w, a)) => {
            let _ = ready.send(Ok(a));
            w
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let state = std::rc::Rc::new(std::cell::RefCell::new(State {
        links: HashMap::new(),
        waiting: Waiting::default(),
        next_link: 1,
        server: None,
        outbox: Vec::new(),
    }));
    // Requests from clients: decoded here, served on tokio.
    let st = state.clone();
    let _ = worker.set_am_handler(AM_REQUEST, move |w, hdr, data, reply| {
        let Some(ep) = reply else { return };
        if hdr.len() != REQUEST_HEADER {
            tracing::warn!("UCX request with a {}-byte header dropped", hdr.len());
            return;
        }
        let (fh, token) = (hdr[..HEADER_LEN].to_vec(), &hdr[HEADER_LEN..]);
        let origin = u64::from_le_bytes(token.try_into().expect("8 bytes"));
        let st = st.clone();
        with_payload(w, data, move |payload| {
            let Some(server) = st.borrow().server.clone() else {
                return;
            };
            match payload
                .map_err(|e| closed(&e))
                .and_then(|p| frame_of(&fh, p))
            {
                Ok(mut f) if !f.header.is_response() => {
                    f.origin = origin;
                    if let Some(resp) = server.take(f, ep) {
                        st.borrow_mut().outbox.push((ep, resp));
                    }
                }
                Ok(_) => tracing::warn!("UCX response sent as a request, dropped"),
                Err(e) => tracing::warn!("bad UCX request dropped: {e}"),
            }
        });
    });
    // Answers to our calls.
    let st = state.clone();
    let _ = worker.set_am_handler(AM_RESPONSE, move |w, hdr, data, _| {
        let hdr = hdr.to_vec();
        let st = st.clone();
        with_payload(w, data, move |payload| {
            let r = payload
                .map_err(|e| closed(&e))
                .and_then(|p| frame_of(&hdr, p));
            let id = match &r {
                Ok(f) => f.header.request_id,
                Err(e) => {
                    tracing::warn!("bad UCX response dropped: {e}");
                    return;
                }
            };
            if let Some((_, reply)) = st.borrow_mut().waiting.calls.remove(&id) {
                let _ = reply.send(r);
            }
        });
    });
    let mut drain = [0u8; 8];
    let mut next: Option<Cmd> = None;
    loop {
        // Commands, then UCX's own work, then the answers handlers produced, until idle.
        loop {
            let cmd = match next.take().map_or_else(|| rx.try_recv(), Ok) {
                Ok(c) => c,
                Err(mpsc::TryRecvError::Empty) => break,
                // Every sender is gone: the hub is dropped with the process.
                Err(mpsc::TryRecvError::Disconnected) => return,
            };
            handle(&worker, &state, cmd);
        }
        while worker.progress() {}
        let out = std::mem::take(&mut state.borrow_mut().outbox);
        if !out.is_empty() {
            for (ep, resp) in out {
                send_answer(&worker, ep, resp);
            }
            continue;
        }
        // About to sleep: say so, then look once more for a command sent meanwhile.
        sleeping.store(true, Ordering::SeqCst);
        match rx.try_recv() {
            Ok(c) => {
                sleeping.store(false, Ordering::SeqCst);
                next = Some(c);
                continue;
            }
            Err(mpsc::TryRecvError::Disconnected) => return,
            Err(mpsc::TryRecvError::Empty) => {}
        }
        let woke = worker.wait(Some(wake.as_raw_fd()), Duration::from_millis(200));
        sleeping.store(false, Ordering::SeqCst);
        match woke {
            // SAFETY: reading 8 bytes into a live buffer from our eventfd (non-blocking).
            Ok(true) => unsafe {
                libc::read(wake.as_raw_fd(), drain.as_mut_ptr() as *mut libc::c_void, 8);
            },
            Ok(false) => {}
            Err(e) => {
                tracing::error!("UCX worker: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Sends a node's answer on the reply endpoint of its request.
fn send_answer(worker: &Worker, ep: ReplyEp, resp: Frame) {
    let header = resp.header.encode(&resp.payload).to_vec();
    worker.reply(
        ep,
        AM_RESPONSE,
        header,
        Payload::Boxed(Box::new(resp.payload)),
        Box::new(|r| {
            if let Err(e) = r {
                tracing::debug!("UCX answer not delivered: {e}");
            }
        }),
    );
}

fn handle(worker: &Worker, state: &std::rc::Rc<std::cell::RefCell<State>>, cmd: Cmd) {
    match cmd {
        Cmd::Connect { address, reply } => {
            let r = worker.connect(&address).map(|ep| {
                let mut s = state.borrow_mut();
                let id = s.next_link;
                s.next_link += 1;
                let lanes = ep.lane_summary();
                s.links.insert(id, ep);
                (id, lanes)
            });
            let _ = reply.send(r.map_err(|e| e.to_string()));
        }
        Cmd::Call {
            link,
            header,
            request_id,
            payload,
            reply,
        } => {
            let s = &mut *state.borrow_mut();
            let Some(ep) = s.links.get(&link) else {
                let _ = reply.send(Err(closed("UCX link closed")));
                return;
            };
            s.waiting.calls.insert(request_id, (link, reply));
            let st = state.clone();
            ep.am_send(
                AM_REQUEST,
                header,
                Payload::Boxed(Box::new(payload)),
                true,
                Box::new(move |r| {
                    if let Err(e) = r {
                        if let Some((_, reply)) = st.borrow_mut().waiting.calls.remove(&request_id)
                        {
                            let _ = reply.send(Err(closed(&e.to_string())));
                        }
                    }
                }),
            );
        }
        Cmd::Answer { ep, resp } => send_answer(worker, ep, resp),
        Cmd::Close { link, reason } => {
            let ep = {
                let mut s = state.borrow_mut();
                let failed: Vec<u64> = s
                    .waiting
                    .calls
                    .iter()
                    .filter(|(_, (l, _))| *l == link)
                    .map(|(id, _)| *id)
                    .collect();
                for id in failed {
                    if let Some((_, reply)) = s.waiting.calls.remove(&id) {
                        let _ = reply.send(Err(closed(&reason)));
                    }
                }
                s.links.remove(&link)
            };
            if let Some(ep) = ep {
                ep.close(true);
            }
        }
        Cmd::Serve(s) => state.borrow_mut().server = Some(s),
    }
}

/// A connection that carries its calls over UCX when it can, and over its TCP connection
/// otherwise (see the module docs).
#[derive(Debug)]
pub struct UcxConnection {
    tcp: TcpConnection,
    hub: Option<Arc<Hub>>,
    link: u64,
    lanes: String,
    /// Why calls go over TCP (`None` while UCX carries them).
    fallback: Mutex<Option<String>>,
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
    let tried = try_ucx(&tcp).await;
    let (hub, link, lanes, why) = match tried {
        Ok((hub, link, lanes)) => (Some(hub), link, lanes, None),
        Err(why) if fallback == Fallback::Allowed => {
            tracing::info!(peer = %tcp.peer(), "UCX not used, staying on TCP: {why}");
            (None, 0, String::new(), Some(why))
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
        link,
        lanes,
        fallback: Mutex::new(why),
    })
}

async fn try_ucx(tcp: &TcpConnection) -> Result<(Arc<Hub>, u64, String), String> {
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
    let hub = Hub::get().map_err(|e| format!("UCX cannot start here: {e}"))?;
    let (tx, rx) = oneshot::channel();
    hub.send(Cmd::Connect {
        address: offer.payload.to_vec(),
        reply: tx,
    });
    let (link, lanes) = rx
        .await
        .map_err(|_| "UCX thread stopped".to_string())?
        .map_err(|e| format!("UCX endpoint: {e}"))?;
    let probe = call_ucx(
        &hub,
        link,
        tcp.token(),
        next_id(),
        Header::request(Op::Ping, 0),
        Bytes::new(),
    );
    let ok = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(f)) if f.header.status == Status::Ok => Ok(()),
        Ok(Ok(f)) => Err(format!("probe answered {}", f.header.status.as_str())),
        Ok(Err(e)) => Err(format!("probe failed: {e}")),
        Err(_) => Err(format!("probe not answered within {PROBE_TIMEOUT:?}")),
    };
    if let Err(e) = ok {
        hub.send(Cmd::Close {
            link,
            reason: e.clone(),
        });
        return Err(e);
    }
    Ok((hub, link, lanes))
}

async fn call_ucx(
    hub: &Hub,
    link: u64,
    token: u64,
    request_id: u64,
    mut header: Header,
    payload: Bytes,
) -> Result<Frame, TransportError> {
    header.request_id = request_id;
    header.flags &= !trireme_proto::FLAG_RESPONSE;
    let mut h = header.encode(&payload).to_vec();
    h.extend_from_slice(&token.to_le_bytes());
    let (tx, rx) = oneshot::channel();
    if !hub.send(Cmd::Call {
        link,
        header: h,
        request_id,
        payload,
        reply: tx,
    }) {
        return Err(closed("UCX thread stopped"));
    }
    rx.await
        .unwrap_or_else(|_| Err(closed("UCX thread stopped")))
}

impl UcxConnection {
    fn on_ucx(&self) -> Option<&Arc<Hub>> {
        let f = self.fallback.lock().unwrap_or_else(|e| e.into_inner());
        f.is_none().then_some(self.hub.as_ref()).flatten()
    }
}

impl Drop for UcxConnection {
    fn drop(&mut self) {
        if let Some(hub) = &self.hub {
            hub.send(Cmd::Close {
                link: self.link,
                reason: "connection dropped".into(),
            });
        }
    }
}

impl Connection for UcxConnection {
    fn call(&self, header: Header, payload: Bytes) -> BoxFuture<'_, Result<Frame, TransportError>> {
        Box::pin(async move {
            if let Some(hub) = self.on_ucx() {
                let id = next_id();
                let ucx = call_ucx(
                    hub,
                    self.link,
                    self.tcp.token(),
                    id,
                    header,
                    payload.clone(),
                );
                // A dead node does not fail UCX calls (no peer-failure mode): its TCP
                // connection closing does.
                let r = tokio::select! {
                    r = ucx => r,
                    _ = self.tcp.closed() => Err(closed("the node's TCP connection closed")),
                };
                match r {
                    Ok(f) => return Ok(f),
                    // The node is gone: TCP will say so too; no point retrying.
                    Err(e) if self.tcp.is_closed() => return Err(e),
                    Err(e) => {
                        self.fall_back(&e.to_string());
                    }
                }
            }
            self.tcp.call(header, payload).await
        })
    }

    fn info(&self) -> ConnectionInfo {
        let mut i = self.tcp.info();
        match &*self.fallback.lock().unwrap_or_else(|e| e.into_inner()) {
            None => {
                i.transport = "ucx".into();
                i.lanes = Some(self.lanes.clone());
            }
            Some(why) => i.fallback = Some(why.clone()),
        }
        i
    }

    fn is_closed(&self) -> bool {
        self.tcp.is_closed()
    }

    fn fall_back(&self, why: &str) -> bool {
        let mut f = self.fallback.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_some() {
            return false;
        }
        tracing::warn!(peer = %self.tcp.peer(), "UCX path stopped, going on over TCP: {why}");
        *f = Some(why.to_string());
        if let Some(hub) = &self.hub {
            // Calls in flight on the link fail now and are sent again over TCP.
            hub.send(Cmd::Close {
                link: self.link,
                reason: why.to_string(),
            });
        }
        true
    }
}
