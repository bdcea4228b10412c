//! A safe wrapper over the system UCX (`trireme-ucx-sys`): what trireme's UCX transport needs
//! and nothing more.
//!
//! * [`Context`]: one per process, configured through `ucp_config_modify` (not only the
//!   environment), with active messages as the only feature.
//! * [`Worker`]: created in UCX's multi-thread mode (`UCS_THREAD_MODE_MULTI`, with a mutex
//!   rather than a spinlock, see [`Context::new`]), so any thread may send on its endpoints
//!   while one thread progresses it: an async runtime's tasks send where they run, with no
//!   hand-off to a UCX thread. Progress is event driven: [`Worker::arm`] and the event fd let a
//!   runtime (or [`Worker::wait`]) sleep until there is work — never a busy loop.
//! * [`Endpoint`]: a connection to a peer worker's address. [`Endpoint::am_send`] sends an
//!   active message (a header and a payload, each one contiguous buffer: vectored sends over
//!   UCX's tcp lanes are several times slower); UCX picks eager for small payloads and
//!   rendezvous (zero-copy, RDMA read where the hardware has it) for large ones.
//! * Active-message handlers ([`Worker::set_am_handler`]) see each message's header and either
//!   its bytes (eager) or a [`RndvData`] to fetch into a buffer of the handler's choosing.
//! * [`MemPool`]: a region registered once (`ucp_mem_map`) and cut into chunks that
//!   rendezvous receives land in ([`Worker::recv_rndv`]), handed on as [`Received`] buffers that
//!   return their chunk when dropped.
//!
//! Completion is by callback: each send or rendezvous receive takes a closure that runs, inside
//! [`Worker::progress`] on whichever thread calls it, when UCX is done with the buffers (which
//! the wrapper owns until then).
//!
//! UCX 1.13 traits handled by the caller's configuration, see [`Config`]: the peer-failure
//! error mode turns the shared-memory transports off, so endpoints use no error handling and
//! peer death is learned elsewhere (trireme's TCP control connection); UCX adds a lane for every
//! network device unless `NET_DEVICES` names them; and registering memory before a `fork` is
//! unsafe, so a process creates its context only after it is done forking.

use std::ffi::{c_void, CStr, CString};
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trireme_ucx_sys as sys;

mod context;
mod endpoint;
mod pool;

pub use context::{Config, Context};
use endpoint::am_send;
pub use endpoint::{lane_summary, Endpoint};
pub use pool::{MemPool, PoolBuf};

/// A UCX failure: what was being done and UCX's status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("UCX {what}: {message}")]
pub struct Error {
    pub what: &'static str,
    pub status: i32,
    pub message: String,
}

impl Error {
    fn new(what: &'static str, status: sys::ucs_status_t) -> Error {
        // SAFETY: ucs_status_string returns a pointer to a static C string for any status.
        let message = unsafe { CStr::from_ptr(sys::ucs_status_string(status)) }
            .to_string_lossy()
            .into_owned();
        Error {
            what,
            status: status as i32,
            message,
        }
    }
}

fn check(what: &'static str, s: sys::ucs_status_t) -> Result<(), Error> {
    if s == sys::UCS_OK {
        Ok(())
    } else {
        Err(Error::new(what, s))
    }
}

/// A received payload: in a pool chunk, or in a buffer of its own.
#[derive(Debug)]
pub enum Received {
    Pool(PoolBuf),
    Vec(Vec<u8>),
}

impl AsRef<[u8]> for Received {
    fn as_ref(&self) -> &[u8] {
        match self {
            Received::Pool(b) => b.as_ref(),
            Received::Vec(v) => v,
        }
    }
}

/// What a handler is given for a message whose payload comes by rendezvous. A handler that
/// returns [`Taken::Kept`] keeps it past its return, and must later fetch it
/// ([`Worker::recv_rndv`]) or let it go ([`Worker::release_rndv`]) on the same worker.
#[derive(Debug)]
pub struct RndvData {
    desc: *mut c_void,
    pub length: usize,
}

// SAFETY: the descriptor is an opaque UCX handle; the worker it came from is in multi-thread
// mode, so it may be received or released from any thread (through that worker only).
unsafe impl Send for RndvData {}

/// What an active-message handler did with a message (its return value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Handled: an eager payload copied if wanted, a rendezvous fetched (or dropped, which
    /// completes the sender's send without an error).
    Done,
    /// A rendezvous descriptor kept, to fetch or release later (eager messages cannot be kept:
    /// this counts as [`Taken::Done`] for them).
    Kept,
    /// Refused: a rendezvous is declined unread and the sender's send fails; an eager message
    /// is dropped.
    Refused,
}

/// An active message as its handler sees it.
#[derive(Debug)]
pub enum AmData<'a> {
    /// The payload is here (eager); copy what you keep.
    Eager(&'a [u8]),
    /// The payload waits on the sender; fetch it with [`Worker::recv_rndv`] or drop it.
    Rndv(RndvData),
}

impl AmData<'_> {
    /// The payload's length (for a rendezvous: what the sender declares).
    pub fn len(&self) -> usize {
        match self {
            AmData::Eager(b) => b.len(),
            AmData::Rndv(r) => r.length,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The endpoint a reply to a message can go out on (the sender asked for one). On the side
/// that sent the message, it is the endpoint the message went out on: [`ReplyEp::id`] equals
/// that [`Endpoint::id`] (how a response is tied to the endpoint its request used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyEp(sys::ucp_ep_h);

impl ReplyEp {
    /// The endpoint's identity (its handle's address), to compare with [`Endpoint::id`].
    pub fn id(&self) -> usize {
        self.0 as usize
    }
}

// SAFETY: a reply endpoint is a plain handle; it is only used through the worker that received
// the message, on that worker's thread (`Worker::reply`).
unsafe impl Send for ReplyEp {}
// SAFETY: as above: sharing the handle lets other threads hold it, never use it.
unsafe impl Sync for ReplyEp {}

type AmHandler = dyn FnMut(&Worker, &[u8], AmData<'_>, Option<ReplyEp>) -> Taken + Send;

/// Completion callback of a send: runs inside the progress that completes it.
pub type SendDone = Box<dyn FnOnce(Result<(), Error>) + Send>;
/// Completion callback of a rendezvous receive: the buffer, filled.
pub type RecvDone = Box<dyn FnOnce(Result<Received, Error>) + Send>;

struct HandlerSlot {
    worker: *const Worker,
    f: Mutex<Box<AmHandler>>,
}

/// A UCX worker in multi-thread mode (see the crate docs); always behind an `Arc`, since its
/// handlers hold its address.
pub struct Worker {
    h: sys::ucp_worker_h,
    efd: RawFd,
    /// Boxed: UCX holds each slot's address, which must not move when the vector grows.
    #[allow(clippy::vec_box)]
    handlers: Mutex<Vec<Box<HandlerSlot>>>,
    /// Sends UCX could not finish at once (see [`Worker::sends_pending`]).
    pending: Arc<AtomicIsize>,
    // Keeps the context alive while the worker is.
    _ctx: Arc<Context>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("efd", &self.efd).finish()
    }
}

// SAFETY: the worker is created with UCS_THREAD_MODE_MULTI: UCX serializes every call on it
// with its own lock, so the handle may be used from any thread. Our handler slots are behind
// a Mutex and hold `Send` closures.
unsafe impl Send for Worker {}
// SAFETY: as above: every method takes `&self` and goes through UCX's worker lock or ours.
unsafe impl Sync for Worker {}

struct SendCtx {
    done: Option<SendDone>,
    /// The worker's count of pending sends, which this one is in once UCX made a request.
    pending: Arc<AtomicIsize>,
    _header: Vec<u8>,
    _data: bytes_keep::Keep,
}

struct RecvCtx {
    done: Option<RecvDone>,
    buf: Received,
}

impl RecvCtx {
    /// Hands the buffer, cut to `length` bytes, to the callback.
    fn finish(&mut self, status: sys::ucs_status_t, length: usize) {
        let mut buf = std::mem::replace(&mut self.buf, Received::Vec(Vec::new()));
        match &mut buf {
            Received::Vec(v) => v.truncate(length),
            Received::Pool(b) => b.set_len(length),
        }
        if let Some(done) = self.done.take() {
            done(check("receive", status).map(|()| buf));
        }
    }
}

mod bytes_keep {
    /// Owns a payload until UCX no longer reads it.
    pub enum Keep {
        Vec(Vec<u8>),
        Boxed(Box<dyn AsRef<[u8]> + Send>),
    }
    impl std::fmt::Debug for Keep {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Payload({} bytes)", self.slice().len())
        }
    }
    impl Keep {
        pub fn slice(&self) -> &[u8] {
            match self {
                Keep::Vec(v) => v,
                Keep::Boxed(b) => (**b).as_ref(),
            }
        }
    }
}

pub use bytes_keep::Keep as Payload;

unsafe extern "C" fn send_cb(request: *mut c_void, status: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: `user` is the `Box<SendCtx>` leaked by `am_send` for this request; UCX calls this
    // once, so the box is taken back once.
    let mut ctx = unsafe { Box::from_raw(user as *mut SendCtx) };
    // May run before `am_send` counted the request (progress on another thread): the count
    // is signed, and dips below zero for that moment.
    ctx.pending.fetch_sub(1, Ordering::AcqRel);
    if let Some(done) = ctx.done.take() {
        guarded("send completion", || done(check("send", status)));
    }
    // SAFETY: the request came from ucp_am_send_nbx and is released once, here.
    unsafe { sys::ucp_request_free(request) };
}

unsafe extern "C" fn recv_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    length: usize,
    user: *mut c_void,
) {
    // SAFETY: `user` is the `Box<RecvCtx>` leaked by `recv_rndv` for this request.
    let mut ctx = unsafe { Box::from_raw(user as *mut RecvCtx) };
    guarded("receive completion", || ctx.finish(status, length));
    // SAFETY: the request came from ucp_am_recv_data_nbx and is released once, here.
    unsafe { sys::ucp_request_free(request) };
}

unsafe extern "C" fn am_cb(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: `arg` is the `HandlerSlot` registered in `set_am_handler`, boxed and owned by
    // the worker, which outlives its handlers; the worker pointer in it is the worker that is
    // progressing now (handlers run inside `progress`, on its thread).
    let slot = unsafe { &*(arg as *const HandlerSlot) };
    // SAFETY: as above.
    let worker = unsafe { &*slot.worker };
    // SAFETY: UCX passes a valid parameter block for the duration of the callback.
    let p = unsafe { &*param };
    let hdr: &[u8] = if header_length == 0 {
        &[]
    } else {
        // SAFETY: UCX guarantees `header_length` readable bytes at `header` during the call.
        unsafe { std::slice::from_raw_parts(header as *const u8, header_length) }
    };
    let reply = (p.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0
        && !p.reply_ep.is_null())
    .then_some(ReplyEp(p.reply_ep));
    let msg = if p.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0 {
        AmData::Rndv(RndvData { desc: data, length })
    } else if length == 0 {
        AmData::Eager(&[])
    } else {
        // SAFETY: an eager message's `length` bytes are readable at `data` during the call.
        AmData::Eager(unsafe { std::slice::from_raw_parts(data as *const u8, length) })
    };
    let rndv = matches!(msg, AmData::Rndv(_));
    let mut f = match slot.f.try_lock() {
        Ok(f) => f,
        // A handler that panicked once is still the handler.
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        // Handlers run inside progress, which UCX's worker lock serializes, and they get no
        // progress call of their own: the slot is never held here. Drop rather than block —
        // with the only status UCX allows for the kind of message: an error fails a
        // rendezvous at its sender; an eager message can only be taken (UCS_OK).
        Err(std::sync::TryLockError::WouldBlock) => {
            return if rndv {
                sys::UCS_ERR_NO_RESOURCE
            } else {
                sys::UCS_OK
            };
        }
    };
    let mut taken = Taken::Refused;
    guarded("active-message handler", || {
        taken = f(worker, hdr, msg, reply)
    });
    // Eager data was copied by the handler if it wanted it; a rendezvous descriptor was handed
    // to `recv_rndv` (which owns it from then on), kept for later, or declined.
    match taken {
        Taken::Kept if rndv => sys::UCS_INPROGRESS,
        Taken::Refused if rndv => sys::UCS_ERR_REJECTED,
        _ => sys::UCS_OK,
    }
}

/// Runs user code called back from UCX: a panic must not unwind into C (that aborts the
/// process); it is logged and the callback returns.
fn guarded(what: &str, f: impl FnOnce()) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let why = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!("UCX {what} panicked: {why}");
    }
}

impl Worker {
    /// A worker that any thread may use.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Worker>, Error> {
        let params = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_MULTI,
            ..Default::default()
        };
        let mut h: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: the context is live (we hold an Arc); `h` receives the worker.
        check("worker create", unsafe {
            sys::ucp_worker_create(ctx.h, &params, &mut h)
        })?;
        let mut efd: i32 = -1;
        // SAFETY: `h` is the live worker; `efd` receives its event fd, owned by the worker.
        let s = unsafe { sys::ucp_worker_get_efd(h, &mut efd) };
        if let Err(e) = check("worker event fd", s) {
            // SAFETY: `h` was created above and is destroyed once.
            unsafe { sys::ucp_worker_destroy(h) };
            return Err(e);
        }
        Ok(Arc::new(Worker {
            h,
            efd,
            handlers: Mutex::default(),
            pending: Arc::default(),
            _ctx: ctx.clone(),
        }))
    }

    /// This worker's address, for a peer's [`Worker::connect`].
    pub fn address(&self) -> Result<Vec<u8>, Error> {
        let mut a: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: the worker is live; `a`/`len` receive a buffer UCX allocates.
        check("worker address", unsafe {
            sys::ucp_worker_get_address(self.h, &mut a, &mut len)
        })?;
        // SAFETY: UCX returned `len` readable bytes at `a`.
        let v = unsafe { std::slice::from_raw_parts(a as *const u8, len) }.to_vec();
        // SAFETY: the buffer came from ucp_worker_get_address on this worker; released once.
        unsafe { sys::ucp_worker_release_address(self.h, a) };
        Ok(v)
    }

    /// Runs UCX's progress engine once; true if anything happened (handlers and completion
    /// callbacks run inside it).
    pub fn progress(&self) -> bool {
        // SAFETY: the worker is live; UCX's lock serializes progress with every other call.
        unsafe { sys::ucp_worker_progress(self.h) != 0 }
    }

    /// The event fd that becomes readable when the worker has work (after [`Worker::arm`]).
    pub fn event_fd(&self) -> RawFd {
        self.efd
    }

    /// Arms the event fd. `false`: events are pending, progress first.
    pub fn arm(&self) -> Result<bool, Error> {
        // SAFETY: the worker is live.
        match unsafe { sys::ucp_worker_arm(self.h) } {
            s if s == sys::UCS_OK => Ok(true),
            s if s == sys::UCS_ERR_BUSY => Ok(false),
            s => Err(Error::new("worker arm", s)),
        }
    }

    /// Progresses until idle, then sleeps until the worker has work, `extra` (another fd, such
    /// as a command queue's eventfd) is readable, or `timeout` passes. Returns whether `extra`
    /// was readable.
    pub fn wait(&self, extra: Option<RawFd>, timeout: Duration) -> Result<bool, Error> {
        while self.progress() {}
        if !self.arm()? {
            return Ok(false);
        }
        let mut fds = [
            libc::pollfd {
                fd: self.efd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: extra.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = if extra.is_some() { 2 } else { 1 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` holds `n` valid pollfd entries for the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(Error {
                what: "poll",
                status: sys::UCS_ERR_IO_ERROR as i32,
                message: std::io::Error::last_os_error().to_string(),
            });
        }
        Ok(n == 2 && fds[1].revents & libc::POLLIN != 0)
    }

    /// Calls `f` for every active message `id` that arrives, inside [`Worker::progress`]; what
    /// it returns says what became of the message (see [`Taken`]). A handler that panics has
    /// refused its message.
    pub fn set_am_handler(
        &self,
        id: u32,
        f: impl FnMut(&Worker, &[u8], AmData<'_>, Option<ReplyEp>) -> Taken + Send + 'static,
    ) -> Result<(), Error> {
        let slot = Box::new(HandlerSlot {
            worker: self as *const Worker,
            f: Mutex::new(Box::new(f)),
        });
        let param = sys::ucp_am_handler_param_t {
            field_mask: (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS) as u64,
            id,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(am_cb),
            arg: &*slot as *const HandlerSlot as *mut c_void,
        };
        // SAFETY: the worker is live and lives in an `Arc` (its address is stable); `slot` is
        // kept in `handlers` (boxed: its address is stable) until the worker is destroyed, so
        // `arg` stays valid for every callback.
        check("set handler", unsafe {
            sys::ucp_worker_set_am_recv_handler(self.h, &param)
        })?;
        self.handlers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(slot);
        Ok(())
    }

    /// Fetches a rendezvous payload into a chunk of `pool` (when it fits and one is free) or
    /// a new buffer; `done` gets it when it has arrived. Call it from the handler that was
    /// given `data`. The pool must belong to this worker's context.
    pub fn recv_rndv(&self, data: RndvData, pool: Option<&Arc<MemPool>>, done: RecvDone) {
        let (buf, memh) = match pool.and_then(|p| p.take(data.length)) {
            Some(b) => {
                let memh = b.pool.memh;
                (Received::Pool(b), Some(memh))
            }
            None => (Received::Vec(vec![0u8; data.length]), None),
        };
        let ctx = Box::into_raw(Box::new(RecvCtx {
            done: Some(done),
            buf,
        }));
        let mut length: usize = 0;
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_RECV_INFO,
            user_data: ctx as *mut c_void,
            ..Default::default()
        };
        if let Some(m) = memh {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = m;
        }
        param.cb.recv_am = Some(recv_cb);
        param.recv_info.length = &mut length;
        // SAFETY: `ctx` was just leaked and is valid; its buffer has room for `data.length`
        // bytes (a Vec of that length, or a pool chunk at least that large, registered under
        // `memh`) and lives in the box until `recv_cb` (or the immediate path below) frees it.
        let buf = unsafe {
            match &(*ctx).buf {
                Received::Vec(v) => v.as_ptr() as *mut u8,
                Received::Pool(b) => b.ptr(),
            }
        };
        // SAFETY: `data.desc` is the descriptor UCX gave the handler; UCX owns it from now on.
        let r = unsafe {
            sys::ucp_am_recv_data_nbx(self.h, data.desc, buf as *mut c_void, data.length, &param)
        };
        if sys::ucs_ptr_is_ptr(r) {
            return; // `recv_cb` finishes it.
        }
        // SAFETY: no request was created, so the callback will not run: the box is ours again.
        let mut ctx = unsafe { Box::from_raw(ctx) };
        // UCX fills in the length when it completes at once; keep all if it did not.
        let length = if length != 0 { length } else { data.length };
        ctx.finish(sys::ucs_ptr_status(r), length);
    }

    /// Lets go of a rendezvous descriptor a handler kept ([`Taken::Kept`]) without fetching
    /// it: the sender's send completes.
    pub fn release_rndv(&self, data: RndvData) {
        // SAFETY: `data.desc` is a descriptor this worker's handler kept (returned
        // UCS_INPROGRESS for); it is released once, here, since `data` is consumed.
        unsafe { sys::ucp_am_data_release(self.h, data.desc) };
    }

    /// The context the worker was made in (for another worker of it).
    pub fn context(&self) -> &Arc<Context> {
        &self._ctx
    }

    /// Connects to a peer worker by its address.
    /// The endpoint holds the worker: it cannot outlive it.
    pub fn connect(self: &Arc<Self>, address: &[u8]) -> Result<Endpoint, Error> {
        let params = sys::ucp_ep_params_t {
            field_mask: (sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE) as u64,
            address: address.as_ptr() as *const sys::ucp_address_t,
            // The peer-failure mode would turn off the shared-memory transports in UCX 1.13.
            err_mode: sys::UCP_ERR_HANDLING_MODE_NONE,
            ..Default::default()
        };
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the worker is live; `address` is readable for the call (UCX copies what it
        // needs); `ep` receives the endpoint.
        check("connect", unsafe {
            sys::ucp_ep_create(self.h, &params, &mut ep)
        })?;
        Ok(Endpoint {
            h: ep,
            pending: self.pending.clone(),
            _worker: self.clone(),
        })
    }

    /// Sends an active message on a reply endpoint (see [`Endpoint::am_send`]). It names the
    /// endpoint it goes out on, so the receiver's handler gets a [`ReplyEp`]: the endpoint its
    /// own message went out on.
    pub fn reply(
        &self,
        ep: ReplyEp,
        id: u32,
        header: Vec<u8>,
        data: Payload,
        done: SendDone,
    ) -> bool {
        am_send(
            ep.0,
            &self.pending,
            id,
            header,
            data,
            sys::UCP_AM_SEND_FLAG_REPLY,
            done,
        )
    }

    /// True while a send UCX could not finish at once is under way: its completion needs
    /// progress, and with a full shared-memory FIFO nothing signals when it can go on. Sends
    /// that finished inside their call (the usual case) are never counted.
    pub fn sends_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire) > 0
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: every endpoint borrows the worker's handle only while the worker lives (they
        // are closed first by their owners), and the handlers' slots are dropped after this.
        unsafe { sys::ucp_worker_destroy(self.h) };
    }
}

#[cfg(test)]
mod tests;
