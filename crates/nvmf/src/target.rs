//! A port: a TCP listener whose connections are queues of controllers of its subsystems
//! and of its discovery subsystem.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use trireme_blockdev::BlockDevice;

use crate::ctrl::{lock, Registry, EVENT_NS_CHANGED};
use crate::subsystem::Subsystem;

/// A port's configuration and state.
pub struct Port<D> {
    /// 1 to 15: names the port in discovery logs and gives its controllers their id range
    /// (distinct on every server that serves the same subsystem).
    pub port_id: u16,
    /// The address hosts reach this port at (discovery log entries).
    pub addr: SocketAddr,
    pub subsystems: Vec<Arc<Subsystem<D>>>,
    pub registry: Registry,
    /// How long a host may take to send data it owes after an R2T before its queue is
    /// closed.
    pub transfer_timeout: Duration,
    /// Each subsystem's size as last seen by the size follower.
    sizes: std::sync::Mutex<Vec<u64>>,
}

impl<D> std::fmt::Debug for Port<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("port_id", &self.port_id)
            .field("addr", &self.addr)
            .field("subsystems", &self.subsystems)
            .finish()
    }
}

/// A host connected to a port, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
    pub peer: SocketAddr,
    pub io_queues: usize,
}

/// Queues (connections) a port serves at once; one more is closed as it comes.
pub const MAX_QUEUES: usize = 1024;

/// Port ids a port may have.
pub const PORT_IDS: std::ops::RangeInclusive<u16> = 1..=15;

impl<D: BlockDevice> Port<D> {
    pub fn new(port_id: u16, addr: SocketAddr, subsystems: Vec<Arc<Subsystem<D>>>) -> Port<D> {
        let sizes = subsystems.iter().map(|s| s.dev.size()).collect();
        Port {
            port_id,
            addr,
            subsystems,
            registry: Registry::new(port_id),
            transfer_timeout: crate::queue::TRANSFER_TIMEOUT,
            sizes: std::sync::Mutex::new(sizes),
        }
    }

    /// Ends every controller of this port (their queues close): a server that stops
    /// serving, as its hosts see a dead path.
    pub fn shut(&self) {
        for c in self.registry.all() {
            self.registry.remove(c.cntlid);
        }
    }

    /// The subsystem named `nqn`, with its index.
    pub(crate) fn subsystem(&self, nqn: &str) -> Option<(usize, &Arc<Subsystem<D>>)> {
        self.subsystems
            .iter()
            .enumerate()
            .find(|(_, s)| s.nqn == nqn)
    }

    /// The hosts connected, one entry per controller of a subsystem (discovery ones left
    /// out).
    pub fn connected(&self) -> Vec<Connected> {
        let mut out: Vec<Connected> = self
            .registry
            .all()
            .into_iter()
            .filter_map(|c| {
                let s = &self.subsystems[c.subsys?];
                Some(Connected {
                    cntlid: c.cntlid,
                    subnqn: s.nqn.clone(),
                    hostnqn: c.hostnqn.clone(),
                    peer: c.peer,
                    io_queues: lock(&c.queues).1.len(),
                })
            })
            .collect();
        out.sort_by_key(|c| c.cntlid);
        out
    }

    /// Tells every controller of a subsystem whose size changed (namespace attribute
    /// changed), and the controllers watching its ANA state when that changed. Runs until
    /// dropped.
    async fn follow(self: Arc<Self>) {
        let mut anas: Vec<_> = self.subsystems.iter().map(|s| s.ana.subscribe()).collect();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            self.registry.expire();
            self.sizes_changed();
            for (i, rx) in anas.iter_mut().enumerate() {
                if rx.has_changed().unwrap_or(false) {
                    let _ = rx.borrow_and_update();
                    self.to_controllers_of(i, crate::ctrl::EVENT_ANA_CHANGE, 1 << 11);
                }
            }
        }
    }

    fn sizes_changed(&self) {
        let mut sizes = lock(&self.sizes);
        for (i, s) in self.subsystems.iter().enumerate() {
            let now = s.dev.size();
            if sizes[i] != now {
                tracing::info!(subsystem = %s.nqn, from = sizes[i], to = now, "namespace size changed: hosts are told");
                sizes[i] = now;
                for c in self.registry.all() {
                    if c.subsys == Some(i) {
                        c.ns_changed
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        c.event(EVENT_NS_CHANGED, 1 << 8);
                    }
                }
            }
        }
    }

    fn to_controllers_of(&self, i: usize, event: u32, bit: u32) {
        for c in self.registry.all() {
            if c.subsys == Some(i) {
                c.event(event, bit);
            }
        }
    }

    /// Accepts connections on `listener` and serves each as a queue, until dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let follower = tokio::spawn(self.clone().follow());
        let _stop = AbortOnDrop(follower);
        let places = Arc::new(tokio::sync::Semaphore::new(MAX_QUEUES));
        loop {
            let (stream, peer) = trireme_net::accept("nvme/tcp", || listener.accept()).await;
            let Ok(place) = places.clone().try_acquire_owned() else {
                static FULL: trireme_net::Throttle = trireme_net::Throttle::per_second();
                trireme_net::warn_throttled!(FULL, %peer, "refused an NVMe/TCP connection: {MAX_QUEUES} queues are open on this port");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let port = self.clone();
            tokio::spawn(async move {
                let _place = place;
                if let Err(e) = crate::queue::serve(port, stream, peer).await {
                    static WARN: trireme_net::Throttles = trireme_net::Throttles::per_second();
                    let key = peer.ip().to_string();
                    trireme_net::warn_throttled_by!(WARN, &key, %peer, "NVMe/TCP queue closed: {e}");
                }
            });
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
