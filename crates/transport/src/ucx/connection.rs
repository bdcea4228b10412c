//! A client's connection: UCX while a probe over it answers, its TCP connection otherwise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use trireme_proto::{Header, Op, Status};
use trireme_ucx::Endpoint;

use super::hub::{next_id, Hub, Waiting};
use super::{closed, lock, Config, PROBE_TIMEOUT, SECRET_LEN};
use crate::tcp::TcpConnection;
use crate::{BoxFuture, Connection, ConnectionInfo, Frame, TransportError};

/// A connection that carries its calls over UCX when it can, and over its TCP connection
/// otherwise (see the module docs).
#[derive(Debug)]
pub struct UcxConnection(Arc<Link>);

/// A connection's state, shared with its watchdog (see [`watch`]).
#[derive(Debug)]
struct Link {
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
    /// Calls sent over UCX and calls of those done: what the watchdog looks at.
    started: AtomicU64,
    finished: AtomicU64,
}

/// How often a link's watchdog looks at its calls: when calls were waiting at its last look
/// and none has finished since, it checks the UCX path (see [`Link::ucx_stalled`]); also how
/// long the check's ping over UCX may take.
const STALL_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

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
            if first_telling(tcp.peer(), &why) {
                tracing::info!(peer = %tcp.peer(), "UCX not used, staying on TCP: {why}");
            } else {
                tracing::debug!(peer = %tcp.peer(), "UCX not used, staying on TCP: {why}");
            }
            (None, None, String::new(), Some(why), [0; SECRET_LEN])
        }
        Err(why) => {
            return Err(TransportError::Connect {
                addr: tcp.peer().to_string(),
                source: std::io::Error::other(format!("UCX required but not usable: {why}")),
            })
        }
    };
    let on_ucx = why.is_none();
    let l = Arc::new(Link {
        tcp,
        hub,
        ep: RwLock::new(ep),
        link,
        lanes,
        fallback: Mutex::new(why),
        secret,
        started: AtomicU64::new(0),
        finished: AtomicU64::new(0),
    });
    if on_ucx {
        tokio::spawn(watch(Arc::downgrade(&l)));
    }
    Ok(UcxConnection(l))
}

/// True the first time this process is told that links to `peer` stay on TCP for `why`: a
/// writer linking again every half second to a node that is down said it at each try.
fn first_telling(peer: &str, why: &str) -> bool {
    static TOLD: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let mut told = lock(&TOLD);
    if told.iter().any(|(p, w)| p == peer && w == why) {
        return false;
    }
    // Bounded: a node that restarted many times has had as many addresses.
    if told.len() >= 256 {
        told.clear();
    }
    told.push((peer.to_string(), why.to_string()));
    true
}

/// A link's watchdog, while UCX carries its calls: every [`STALL_CHECK`] it looks at the
/// calls. When some were waiting at its last look and none has finished since, a call has
/// waited at least that long: it checks the UCX path ([`Link::ucx_stalled`]), which sends
/// the link over to TCP if UCX stopped carrying answers (a peer that stopped reading, a
/// jammed queue); the calls in flight then go again over TCP. Costs a call two counter
/// increments and no timer. Ends with the link, or when the link is on TCP.
async fn watch(link: std::sync::Weak<Link>) {
    let mut before = (0u64, 0u64);
    loop {
        tokio::time::sleep(STALL_CHECK).await;
        let Some(l) = link.upgrade() else { return };
        if lock(&l.fallback).is_some() {
            return;
        }
        let now = (
            l.started.load(Ordering::Acquire),
            l.finished.load(Ordering::Acquire),
        );
        let waited = before.0 > before.1 && now.1 == before.1;
        before = now;
        if waited && l.ucx_stalled().await {
            return;
        }
    }
}

async fn try_ucx(
    tcp: &TcpConnection,
    link: u64,
) -> Result<(&'static Hub, Endpoint, String, [u8; SECRET_LEN]), String> {
    // Bounded like the steps below: a node that accepted but does not answer (frozen) leaves
    // the link on TCP, where the caller's own timeouts decide about the node.
    let offer = tokio::time::timeout(
        PROBE_TIMEOUT,
        tcp.call(Header::request(Op::UcxAddress, 0), Bytes::new()),
    )
    .await
    .map_err(|_| format!("the node did not give its UCX address within {PROBE_TIMEOUT:?}"))?
    .map_err(|e| format!("asking for the node's UCX address: {e}"))?;
    if offer.header.status != Status::Ok {
        return Err(format!(
            "the node offers no UCX: {}",
            String::from_utf8_lossy(&offer.payload)
        ));
    }
    // The worker address, where the node runs, this link's secret (see `grants.rs`).
    let offer = super::decode_offer(&offer.payload)?;
    let (address, secret) = (offer.address, offer.secret);
    let asked = std::env::var("TRIREME_UCX_TLS").ok();
    let here = super::Locality::here();
    worth_trying(offer.locality, here, asked.is_some(), super::rdma_here())?;
    // A node in another network namespace of this host cannot be reached through shared
    // memory (see `Locality`): unless told otherwise, this process's worker leaves it out.
    let across = offer
        .locality
        .zip(here)
        .is_some_and(|(node, me)| me.across_namespaces(&node));
    // This process's worker listens on the device that reaches the node, not on every one
    // (unless configured otherwise before: a node's own, or TRIREME_UCX_NET_DEVICES).
    super::configure(Config {
        tls: asked
            .clone()
            .or_else(|| across.then(|| super::NETWORK_TLS.to_string())),
        net_devices: std::env::var("TRIREME_UCX_NET_DEVICES")
            .ok()
            .or_else(|| super::device_of(tcp.local_ip())),
        ..Default::default()
    });
    let hub = Hub::get().map_err(|e| format!("UCX cannot start here: {e}"))?;
    if across && asked.is_none() && hub.config().tls.as_deref() != Some(super::NETWORK_TLS) {
        return Err(format!("the node runs in another network namespace of this host, which UCX's shared memory does not reach, and this process's UCX already uses shared memory (TRIREME_UCX_TLS={} leaves it out)", super::NETWORK_TLS));
    }
    reach(hub, address).await?;
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

/// Whether a link to a node at `node` may try UCX from a process at `here`: `Err` says why it
/// stays on TCP. A node this process cannot reach through shared memory (another host, or
/// another network namespace of this one: see `Locality`; or either end unknown, as with a
/// node too old to say) is reached over RDMA or not at all: UCX's tcp lanes are left to
/// trireme's TCP (`DEFAULT_TLS`), unless `TRIREME_UCX_TLS` was set (`asked`).
fn worth_trying(
    node: Option<super::Locality>,
    here: Option<super::Locality>,
    asked: bool,
    rdma: bool,
) -> Result<(), String> {
    let neighbour = node.is_some() && node == here;
    match neighbour || asked || rdma {
        true => Ok(()),
        false => Err(super::NO_RDMA.into()),
    }
}

/// Whether UCX reaches the node's worker at `address` at all, found out without risking this
/// process's worker. `ucp_ep_create` connects UCX's TCP lanes itself, blocking, under the
/// worker's lock: on a path that drops packets (a firewall that lets only the node's port
/// through) it would hold every link of the process for the kernel's connect timeout, about
/// two minutes. So an endpoint is first made on a worker of its own, on a thread of its own;
/// if that takes longer than the probe may, the link stays on TCP, and the thread ends by
/// itself later (not a runtime's blocking thread: a process that exits must not wait for it).
async fn reach(hub: &Hub, address: &[u8]) -> Result<(), String> {
    let ctx = hub.worker.context().clone();
    let address = address.to_vec();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("ucx-reach".into())
        .spawn(move || {
            let r = trireme_ucx::Worker::new(&ctx)
                .map_err(|e| format!("UCX worker: {e}"))
                .and_then(|w| {
                    w.connect(&address)
                        .map(|ep| ep.close(true))
                        .map_err(|e| format!("UCX endpoint: {e}"))
                });
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Err(format!("no thread to check the UCX path: {e}"));
    }
    match tokio::time::timeout(PROBE_TIMEOUT, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err("the UCX path check ended without an answer".into()),
        Err(_) => Err(format!(
            "UCX could not connect to the node within {PROBE_TIMEOUT:?} (its lanes' packets dropped on the way?)"
        )),
    }
}

impl Link {
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

impl Drop for Link {
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
        Box::pin(self.0.send(header, payload, crc))
    }

    fn checks_payloads(&self) -> bool {
        // UCX frames always carry checksums; a fall-back to TLS might not need them, but a
        // checksum computed once for a write costs less than asking on every call.
        true
    }

    fn info(&self) -> ConnectionInfo {
        self.0.info_now()
    }

    fn is_closed(&self) -> bool {
        self.0.tcp.is_closed()
    }

    fn fall_back(&self, why: &str) -> bool {
        self.0.fall_back_now(why)
    }
}

impl Link {
    /// A call over UCX while that path works, else over the TCP connection.
    async fn send(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Result<Frame, TransportError> {
        {
            if let Some(waiting) = self.start_ucx(header, &payload, crc) {
                self.started.fetch_add(1, Ordering::AcqRel);
                // A dead node does not fail UCX calls (no peer-failure mode): its TCP
                // connection closing does. A UCX path that stopped carrying answers (a peer
                // that stopped reading, a jammed queue) is found by the link's watchdog,
                // which fails this call: it goes again over TCP.
                let r = tokio::select! {
                    r = waiting.answer() => r,
                    _ = self.tcp.closed() => Err(closed("the node's TCP connection closed")),
                };
                self.finished.fetch_add(1, Ordering::AcqRel);
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

    /// Checks the UCX path of a link whose calls have waited [`STALL_CHECK`]: a ping over UCX
    /// and one over TCP. True when TCP answered and UCX did not within [`STALL_CHECK`]: UCX
    /// no longer carries this link, which has fallen back to TCP (its calls in flight fail
    /// and go again over TCP). False when UCX answered (the calls are just slow) or neither
    /// did (the node is: its replica timeout decides).
    async fn ucx_stalled(&self) -> bool {
        let ucx = async {
            match self.start_ucx(Header::request(Op::Ping, 0), &Bytes::new(), None) {
                Some(w) => tokio::time::timeout(STALL_CHECK, w.answer())
                    .await
                    .is_ok_and(|r| r.is_ok()),
                None => true,
            }
        };
        let tcp = tokio::time::timeout(
            4 * STALL_CHECK,
            self.tcp.call(Header::request(Op::Ping, 0), Bytes::new()),
        );
        let (ucx_ok, tcp_ok) = tokio::join!(ucx, tcp);
        if ucx_ok || !matches!(tcp_ok, Ok(Ok(_))) {
            return false;
        }
        self.fall_back_now(&format!(
            "UCX calls waited over {STALL_CHECK:?} and a UCX ping went unanswered while TCP answered"
        ))
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
    use super::super::{Locality, NO_RDMA};
    use super::worth_trying;

    #[test]
    fn ucx_is_tried_for_a_shared_memory_neighbour_over_rdma_or_when_asked() {
        let here = Locality {
            boot: [1; 16],
            netns: 7,
        };
        let other_ns = Locality { netns: 8, ..here };
        let other_host = Locality {
            boot: [2; 16],
            ..here
        };
        let no = Err(NO_RDMA.to_string());
        // A neighbour: shared memory, whatever else.
        assert_eq!(worth_trying(Some(here), Some(here), false, false), Ok(()));
        // Not one (another host, another namespace, or unknown at either end): TCP
        // without RDMA, UCX with it, or when asked.
        for (node, me) in [
            (Some(other_host), Some(here)),
            (Some(other_ns), Some(here)),
            (None, Some(here)),
            (Some(here), None),
            (None, None),
        ] {
            assert_eq!(worth_trying(node, me, false, false), no, "{node:?} {me:?}");
            assert_eq!(worth_trying(node, me, false, true), Ok(()));
            assert_eq!(worth_trying(node, me, true, false), Ok(()));
        }
    }
}
