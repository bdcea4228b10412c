//! Endpoints: a connection to a peer worker, the active messages sent on it, and what UCX
//! says of its lanes.

#[allow(unused_imports)]
use super::*;

/// `transport/device` of every `lane[i]:  k:tl/dev.n ...` line of `ucp_ep_print_info`, joined
/// with `+` (`?` if there is none).
pub fn lane_summary(info: &str) -> String {
    let lanes: Vec<&str> = info
        .lines()
        .filter_map(|l| {
            let rest = l.split("lane[").nth(1)?;
            let field = rest.split_whitespace().nth(1)?; // "1:sysv/memory.0"
            let tl_dev = field.split_once(':')?.1;
            Some(tl_dev.rsplit_once('.').map_or(tl_dev, |(a, _)| a))
        })
        .collect();
    if lanes.is_empty() {
        "?".into()
    } else {
        lanes.join("+")
    }
}

/// Runs `f` with a FILE that writes into memory and returns what it wrote.
fn memstream(f: impl FnOnce(*mut sys::FILE)) -> String {
    let mut buf: *mut libc::c_char = ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: `buf`/`len` receive the stream's buffer, valid after fclose.
    let file = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if file.is_null() {
        return String::new();
    }
    f(file as *mut sys::FILE);
    // SAFETY: `file` is the stream opened above, closed once; afterwards `buf` holds `len`
    // bytes that we copy and free.
    unsafe {
        libc::fclose(file);
        let s =
            String::from_utf8_lossy(std::slice::from_raw_parts(buf as *const u8, len)).into_owned();
        libc::free(buf as *mut c_void);
        s
    }
}

/// Returns true if the send is still under way (it needs progress to finish).
pub(crate) fn am_send(
    ep: sys::ucp_ep_h,
    pending: &Arc<AtomicIsize>,
    id: u32,
    header: Vec<u8>,
    data: Payload,
    flags: u32,
    done: SendDone,
) -> bool {
    let ctx = Box::into_raw(Box::new(SendCtx {
        done: Some(done),
        pending: pending.clone(),
        _header: header,
        _data: data,
    }));
    let mut param = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_FLAGS
            | sys::UCP_OP_ATTR_FIELD_DATATYPE,
        flags,
        user_data: ctx as *mut c_void,
        datatype: sys::DT_BYTES,
        ..Default::default()
    };
    param.cb.send = Some(send_cb);
    // SAFETY: `ctx` is live; the header and payload it owns stay put (their heap buffers do not
    // move when the box is read) until the callback or the immediate path frees the box.
    let (h, d) = unsafe { ((*ctx)._header.as_slice(), (*ctx)._data.slice()) };
    // SAFETY: the endpoint is live (its owner closes it only after its last send) and its
    // worker takes any thread (multi-thread mode); buffers as above.
    let r = unsafe {
        sys::ucp_am_send_nbx(
            ep,
            id,
            h.as_ptr() as *const c_void,
            h.len(),
            d.as_ptr() as *const c_void,
            d.len(),
            &param,
        )
    };
    if sys::ucs_ptr_is_ptr(r) {
        pending.fetch_add(1, Ordering::AcqRel);
        return true; // `send_cb` finishes it.
    }
    // SAFETY: no request was created, so the callback will not run: the box is ours again.
    let mut ctx = unsafe { Box::from_raw(ctx) };
    if let Some(d) = ctx.done.take() {
        d(check("send", sys::ucs_ptr_status(r)));
    }
    false
}

/// A connection to a peer worker.
#[derive(Debug)]
pub struct Endpoint {
    /// Null once closed.
    pub(crate) h: sys::ucp_ep_h,
    /// Its worker's count of pending sends.
    pub(crate) pending: Arc<AtomicIsize>,
    /// Keeps the worker (and its context) alive while the endpoint is.
    pub(crate) _worker: Arc<Worker>,
}

// SAFETY: the endpoint's worker is in multi-thread mode: UCX serializes calls on it.
unsafe impl Send for Endpoint {}
// SAFETY: as above; closing takes the endpoint by value, so no `&Endpoint` outlives it.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Sends active message `id`: `header` (small: it always goes eagerly) and `data`. With
    /// `reply`, the receiver's handler gets a [`ReplyEp`] to answer on. `done` runs when the
    /// buffers are no longer needed (eager: copied out; rendezvous: fetched by the peer).
    /// Returns true if the send is still under way: the worker must be progressed to finish it.
    pub fn am_send(
        &self,
        id: u32,
        header: Vec<u8>,
        data: Payload,
        reply: bool,
        done: SendDone,
    ) -> bool {
        let flags = if reply {
            sys::UCP_AM_SEND_FLAG_REPLY
        } else {
            0
        };
        am_send(self.h, &self.pending, id, header, data, flags, done)
    }

    /// The endpoint's identity (its handle's address; see [`ReplyEp::id`]).
    pub fn id(&self) -> usize {
        self.h as usize
    }

    /// The lanes UCX chose for this endpoint (transport/device per lane), as UCX prints them.
    pub fn lanes(&self) -> String {
        // SAFETY: the endpoint is live; `f` is a FILE the closure may write to.
        memstream(|f| unsafe { sys::ucp_ep_print_info(self.h, f) })
    }

    /// The lanes in short: each lane's `transport/device`, e.g. `sysv/memory+tcp/lo`.
    pub fn lane_summary(&self) -> String {
        lane_summary(&self.lanes())
    }

    /// Closes the endpoint, flushing what was sent (or cancelling it with `force`: the sends
    /// complete with an error). Does not wait: the worker's progress finishes the close.
    pub fn close(mut self, force: bool) {
        self.close_now(force);
    }

    fn close_now(&mut self, force: bool) {
        if self.h.is_null() {
            return;
        }
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
            flags: if force {
                sys::UCP_EP_CLOSE_FLAG_FORCE
            } else {
                0
            },
            ..Default::default()
        };
        // SAFETY: the endpoint is live (not null) and closed once: the handle is cleared below.
        let r = unsafe { sys::ucp_ep_close_nbx(self.h, &param) };
        self.h = ptr::null_mut();
        if sys::ucs_ptr_is_ptr(r) {
            // SAFETY: `r` is the live close request, released once: UCX frees a request
            // released before it completes when it completes (we need no callback).
            unsafe { sys::ucp_request_free(r) };
        }
    }
}

/// An endpoint dropped without [`Endpoint::close`] is closed, cancelling what it still sends.
impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close_now(true);
    }
}
