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
//! header followed by the secret of the TCP link it stands for (see `grants.rs`), the UCX
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
//!
//! Files: `hub.rs` (the process's worker, its handlers and its calls), `driver.rs` (the task
//! that progresses it), `grants.rs` (the secrets a node hands out), `wire.rs` (the active
//! messages' headers, checked before any payload is received), `connection.rs` (a client's
//! connection and its negotiation).

mod connection;
mod driver;
mod grants;
mod hub;
mod wire;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;

pub use connection::{negotiate, Fallback, UcxConnection};
pub use grants::Grants;
pub use hub::Hub;
pub use trireme_ucx::Config;
pub use wire::{
    decode_offer, encode_offer, parse_request_header, parse_response_header, Locality, Offer,
    LOCALITY_LEN, MAX_ADDRESS, OFFER_MAGIC, OFFER_MAGIC_LOCAL,
};

use crate::{Frame, TransportError};

/// Active-message id of a request.
pub const AM_REQUEST: u32 = 10;
/// Active-message id of a response.
pub const AM_RESPONSE: u32 = 11;
/// Length of the per-link secret every UCX request carries (see [`Grants`]).
pub const SECRET_LEN: usize = 16;
/// UCX transports when none are configured: neither CMA nor tcp (see [`Hub::start`]). So UCX
/// carries a link only over shared memory (a node of this host) or RDMA, never over its own
/// tcp lanes:
/// - they are plain text, where trireme's TCP links are mutual TLS (the secret each request
///   carries would cross the network in the clear, and so would the data);
/// - UCX 1.13 crashes live processes when such a lane fails: a node answering a request late,
///   on the reply endpoint UCX freed with the failed lane (SIGSEGV in `ucp_am_send_nbx`;
///   openucx/ucx#6722), and a writer purging a wire-up message still pending on it (an
///   assertion in `ucp_request_send_state_ff`, removed upstream after 1.13 in
///   openucx/ucx#8175). `scripts/peer-death.sh` found both: with tcp lanes a process died
///   within ten rounds in every run;
/// - without RDMA they offer nothing trireme's TCP does not.
///
/// Shared memory notices no death: the TCP link beside each endpoint does (see the module
/// docs). `TRIREME_UCX_TLS` overrides it (`tcp` to use the tcp lanes anyway).
pub const DEFAULT_TLS: &str = "^cma,tcp";
/// UCX transports, unless configured, of a process whose first node is in another network
/// namespace of this host, on a host with RDMA: no shared memory (see [`Locality`]), and
/// neither CMA nor tcp ([`DEFAULT_TLS`]).
pub const NETWORK_TLS: &str = "^sm,cma,tcp";
/// Why a link to a node that is not this host's shared-memory neighbour stays on TCP when
/// this host has no RDMA device and `TRIREME_UCX_TLS` is unset (see [`DEFAULT_TLS`]).
pub const NO_RDMA: &str = "no RDMA device here and the node is not on this host's shared memory: UCX would have only its tcp lanes, which carry no TLS (and crash peers on a failed lane in UCX 1.13); TRIREME_UCX_TLS=tcp uses them anyway";

/// Whether this host has an RDMA device (one the kernel lists in `/sys/class/infiniband`:
/// InfiniBand, RoCE, iWARP, soft-RoCE). Without one UCX reaches another host only over tcp
/// lanes, which trireme leaves to its own TCP ([`DEFAULT_TLS`]).
pub fn rdma_here() -> bool {
    static HERE: OnceLock<bool> = OnceLock::new();
    *HERE.get_or_init(|| {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
    })
}
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn closed(reason: &str) -> TransportError {
    TransportError::Closed {
        peer: "ucx".into(),
        reason: reason.into(),
    }
}
