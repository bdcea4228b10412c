//! The storage daemon: one process per node, serving that node's replicas to volume clients.
//!
//! [`Node`] implements the transport [`Handler`]: it decodes nothing itself (the transport
//! hands it checked frames), applies the fencing rule from the replication core to every I/O
//! request, and runs store calls inline for in-memory stores, and for device-backed ones on
//! its I/O threads (data requests: `io_threads.rs`) or tokio's blocking pool (the rest), so
//! the async threads never wait on a disk.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use trireme_proto::Status;
use trireme_store::{Replica, Store, StoreError};

mod access;
mod activity;
pub mod books;
mod dirty;
mod held;
mod holds;
mod integrity;
mod io_threads;
mod ops;
mod room;
mod schedule;
mod serve;

pub use access::VolumePolicy;
pub use activity::{ActivityLogs, ActivityView};
pub use dirty::{DirtyTracker, DirtyView, DEFAULT_GRAIN as DEFAULT_DIRTY_GRAIN};
pub use io_threads::DEFAULT_IO_THREADS;
pub use schedule::{Share, DEFAULT_RECOVERY_SHARE, MAX_WEIGHT};

/// Most tracking regions one `DirtyQuery` may cover (its answer stays under 12 MiB).
pub const MAX_DIRTY_QUERY_REGIONS: u64 = 1 << 20;

/// Largest range one `Checksum` request may cover.
pub const MAX_CHECKSUM_RANGE: u64 = 1 << 30;

/// Largest range one `BlockStatus` request may cover: at most 65,536 extents of the stores'
/// 64 KiB grain (a 1 MiB answer). NBD's own requests are no larger.
pub const MAX_BLOCK_STATUS_RANGE: u64 = 1 << 32;

/// What a node answers a client's `UcxAddress` request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UcxOffer {
    /// Its UCX worker's address (the client connects an endpoint to it).
    Address(Vec<u8>),
    /// Why it offers none; the client reads the reason and stays on TCP.
    Unavailable(String),
}

/// A storage node serving the replicas of one store.
#[derive(Debug)]
pub struct Node {
    id: u32,
    store: Arc<dyn Store>,
    replicas: RwLock<HashMap<u64, Arc<dyn Replica>>>,
    /// Serialises epoch changes so two attaches cannot interleave their check and update.
    attach_lock: Mutex<()>,
    /// What peers of our replicas missed while they were out.
    dirty: DirtyTracker,
    /// Which extents may have writes in flight, per volume (see `activity.rs`).
    activity: ActivityLogs,
    /// Per volume: the client connection that attached it last. I/O from any other connection
    /// is refused, so late frames of an abandoned connection cannot land after a resync.
    owners: RwLock<HashMap<u64, u64>>,
    /// Held (shared) by every request being served; `close_all` takes it exclusively and sets
    /// it, so no request runs during or after the close (a write landing after the replicas
    /// recorded a clean shutdown would not match what they recorded).
    closed: RwLock<bool>,
    /// The UCX worker address this node offers clients, or why it offers none.
    ucx: RwLock<Result<Bytes, String>>,
    /// What the metadata says of each volume, by id: its access list, newest epoch and
    /// writer (see `access.rs`). `None` until the node is told: clients get nothing then.
    policies: RwLock<Option<HashMap<u64, VolumePolicy>>>,
    /// The cluster's members, for node certificates (see `access.rs`); `None`: not known.
    members: RwLock<Option<std::collections::HashSet<u32>>>,
    /// Its capacity and over-commit limit: `CreateReplica` and `ResizeReplica` past them are
    /// refused (`room.rs`).
    room: room::Room,
    /// The activity log and dirty records are kept on disk for replicas with a ledger
    /// ([`Node::keep_books`]).
    books: std::sync::atomic::AtomicBool,
    /// Where data requests run when the store blocks (`io_threads.rs`).
    io: io_threads::IoThreads,
    /// What is noted of each copy's integrity until a scrub verifies it (`integrity.rs`).
    integrity: integrity::Integrity,
    /// Readers' holds on snapshots (`holds.rs`).
    holds: holds::Holds,
    /// Which blocks each parity replica holds (`held.rs`).
    held: held::HeldMaps,
}

/// What a node holds ([`Node::usage`]).
#[derive(Debug, Clone)]
pub struct NodeUsage {
    pub id: u32,
    pub store: &'static str,
    pub replicas: usize,
    /// The replicas' sizes, summed.
    pub provisioned: u64,
    /// Bytes in the replicas' allocated grains.
    pub allocated: u64,
    /// Most bytes the replicas may hold together (their sizes); 0: no limit set.
    pub capacity: u64,
    pub tiers: Option<trireme_store::StoreTiers>,
    /// Each tiered replica's extents and reads, by volume id.
    pub replica_tiers: Vec<(u64, trireme_store::ReplicaTiers)>,
    /// Reads and checksums that met a block failing its checksum, since the node started
    /// (summed over the replicas it serves).
    pub bad_block_reads: u64,
    /// Replicas opened after an unclean stop that no scrub has verified since.
    pub unverified: usize,
}

/// Why serving a request failed: a status for the client and a message for the log.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: {1}")]
pub struct Refusal(pub Status, pub String);

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        let s = match &e {
            StoreError::NoReplica { .. } => Status::NoReplica,
            StoreError::Exists { .. } | StoreError::SnapshotExists { .. } => Status::Exists,
            StoreError::NoSnapshot { .. } => Status::NoSnapshot,
            StoreError::OutOfRange { .. } => Status::OutOfRange,
            StoreError::NoSpace { .. } => Status::NoSpace,
            StoreError::Invalid(_) => Status::Invalid,
            StoreError::BadBlock { .. } => Status::Corrupt,
            StoreError::Io { .. } | StoreError::Corrupt { .. } => Status::Io,
        };
        Refusal(s, e.to_string())
    }
}

impl Node {
    /// Opens every replica in `store`. Replicas that fail their checks are logged and not served.
    pub fn new(id: u32, store: Arc<dyn Store>) -> Node {
        Node::with_dirty_grain(id, store, dirty::DEFAULT_GRAIN)
    }

    /// Like [`Node::new`], tracking peers' dirty regions at `grain` bytes (a power of two,
    /// 4 KiB or more).
    pub fn with_dirty_grain(id: u32, store: Arc<dyn Store>, grain: u64) -> Node {
        let mut replicas = HashMap::new();
        for r in store.open_all() {
            match r {
                Ok(r) => {
                    replicas.insert(r.volume(), r);
                }
                Err(e) => tracing::error!(node = id, "not serving a replica: {e}"),
            }
        }
        let node = Node {
            id,
            store,
            replicas: RwLock::new(replicas),
            attach_lock: Mutex::new(()),
            dirty: DirtyTracker::new(grain),
            activity: ActivityLogs::default(),
            owners: RwLock::default(),
            closed: RwLock::new(false),
            ucx: RwLock::new(Err("the node runs without UCX".into())),
            policies: RwLock::new(None),
            members: RwLock::new(None),
            room: room::Room::default(),
            books: std::sync::atomic::AtomicBool::new(false),
            io: io_threads::IoThreads::new(DEFAULT_IO_THREADS, format!("node{id}-io")),
            integrity: integrity::Integrity::default(),
            holds: holds::Holds::default(),
            held: held::HeldMaps::default(),
        };
        for r in node.all_replicas() {
            node.integrity.opened(&*r);
            if let Some(l) = r.ledger() {
                node.held.load(r.volume(), r.size(), l);
            }
        }
        node.link_clones();
        node
    }

    /// Serves data requests on at most `n` threads of its own (at least one; default
    /// [`DEFAULT_IO_THREADS`]) when the store blocks: the most requests it has on its disk
    /// at once.
    pub fn set_io_threads(&self, n: usize) {
        self.io.set_limit(n);
    }

    /// Recovery's share of the I/O threads while clients' requests wait too, in percent
    /// (1 to 99; `schedule.rs`).
    pub fn set_recovery_share(&self, percent: u32) {
        self.io.set_recovery_share(percent);
    }

    /// Every volume's reserve and weight, as the metadata says (volumes not named get the
    /// default: no reserve, weight 1).
    pub fn set_shares(&self, shares: HashMap<u64, Share>) {
        self.io.set_shares(shares);
    }

    /// A volume's reserve and weight on this node now.
    pub fn share(&self, volume: u64) -> Share {
        self.io.share(volume)
    }

    fn on_qos(&self, h: &trireme_proto::Header) -> Result<Bytes, Refusal> {
        let weight = u32::try_from(h.length)
            .ok()
            .filter(|w| (1..=MAX_WEIGHT).contains(w))
            .ok_or_else(|| {
                Refusal(
                    Status::Invalid,
                    format!("a weight of {}: give 1 to {MAX_WEIGHT}", h.length),
                )
            })?;
        self.replica(h.volume)?;
        let share = Share {
            reserve: h.offset,
            weight,
        };
        self.io.set_share(h.volume, share);
        tracing::info!(
            node = self.id,
            volume = h.volume,
            reserve = share.reserve,
            weight = share.weight,
            "the volume's claim on this node"
        );
        Ok(Bytes::new())
    }

    /// Keeps the activity log and the peers' dirty records on disk from now on, for every
    /// replica whose store offers a ledger (`activity.rs`, `dirty.rs`), and loads what the last
    /// process left there. Called once, before serving.
    pub fn keep_books(&self) {
        self.books.store(true, std::sync::atomic::Ordering::Release);
        let reps = self.all_replicas();
        for r in reps {
            let Some(ledger) = r.ledger() else { continue };
            let volume = r.volume();
            let written = match self.activity.load(volume, r.size(), ledger.clone()) {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(node = self.id, volume, "activity log not used: {e}");
                    None
                }
            };
            if let Some(w) = &written {
                // Writes since the last clean state all lie in these extents: block seals
                // from before an unclean stop still hold everywhere else.
                r.recover_seals(w);
            }
            match self
                .dirty
                .load(volume, r.size(), &*ledger, written.as_deref())
            {
                Ok(n) => tracing::info!(
                    node = self.id,
                    volume,
                    records = n,
                    log_extents = written.as_ref().map(Vec::len),
                    "bookkeeping loaded"
                ),
                Err(e) => tracing::warn!(node = self.id, volume, "dirty records not used: {e}"),
            }
        }
    }

    /// Every replica this node serves, at this moment.
    fn all_replicas(&self) -> Vec<Arc<dyn Replica>> {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn ledger_of(&self, r: &dyn Replica) -> Option<Arc<dyn trireme_store::Ledger>> {
        self.books
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| r.ledger())
            .flatten()
    }

    /// Brings the bookkeeping on disk up to date (every second, from [`run`]): saves changed
    /// dirty records, and lets the activity log drop on disk the extents the writer cleared,
    /// after the replica's data and the records are durable. Errors are logged; the next round
    /// tries again.
    pub fn sync_books(&self) {
        let closed = self.closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return;
        }
        let reps = self.all_replicas();
        for r in reps {
            let Some(ledger) = self.ledger_of(&*r) else {
                continue;
            };
            let (volume, size) = (r.volume(), r.size());
            let changed = self.dirty.is_changed(volume);
            let done = self.activity.sync(volume, || {
                // The data, then a parity replica's held map (`held.rs`): an extent cleared
                // on disk must not hide a held bit a crash would lose.
                self.held.flush(volume, &*r)?;
                self.dirty.save(volume, size, &*ledger)
            });
            let result = match done {
                Ok(false) if changed => self.dirty.save(volume, size, &*ledger),
                other => other.map(|_| ()),
            };
            if let Err(e) = result {
                tracing::warn!(node = self.id, volume, "saving bookkeeping: {e}");
            }
        }
    }

    /// Extents the activity log of `volume` shows on disk (tests and status).
    pub fn log_extents_on_disk(&self, volume: u64) -> Option<usize> {
        self.activity.marked_on_disk(volume)
    }

    /// Sets the bytes this node's replicas may hold: their sizes may sum to this times the
    /// over-commit limit.
    pub fn set_capacity(&self, bytes: u64) {
        self.room.set_capacity(bytes);
    }

    /// Sets the over-commit limit (at least 1): how many times its capacity the sizes of the
    /// node's thin replicas may sum to.
    pub fn set_overcommit(&self, ratio: f64) {
        self.room.set_overcommit(ratio);
    }

    /// The directory of the node's store: its file system's size and free space are reported
    /// with the node's room.
    pub fn set_space_dir(&self, dir: std::path::PathBuf) {
        self.room.set_dir(dir);
    }

    /// Measures the capacity on the file system of the node's directory (set first): what
    /// the directory takes plus a `1/nodes` share of the free space, each time it is needed.
    pub fn measure_capacity(&self, nodes: u32) {
        self.room.measure_capacity(nodes);
    }

    /// The node's room now: capacity, over-commit limit, what its replicas provision and hold,
    /// its file system.
    pub fn space(&self) -> trireme_proto::NodeSpace {
        let reps = self.all_replicas();
        self.room.space(
            reps.iter().map(|r| r.size()).sum(),
            reps.iter().map(|r| r.allocated_bytes()).sum(),
            reps.len() as u64,
        )
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    fn no_tiers(&self) -> Refusal {
        Refusal(
            Status::Unsupported,
            format!(
                "node {}'s store has no tiers (start it with --store tiered)",
                self.id
            ),
        )
    }

    /// What the node holds, for its metrics: read at a scrape, from the replicas' counters.
    pub fn usage(&self) -> NodeUsage {
        let replicas: Vec<Arc<dyn Replica>> = self
            .replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        NodeUsage {
            id: self.id,
            store: self.store.kind().as_str(),
            replicas: replicas.len(),
            provisioned: replicas.iter().map(|r| r.size()).sum(),
            allocated: replicas.iter().map(|r| r.allocated_bytes()).sum(),
            capacity: self.room.capacity(),
            tiers: self.store.tiers(),
            replica_tiers: replicas
                .iter()
                .filter_map(|r| r.tiers().map(|t| (r.volume(), t)))
                .collect(),
            bad_block_reads: replicas.iter().map(|r| r.bad_blocks().seen).sum(),
            unverified: replicas
                .iter()
                .filter(|r| self.integrity.report(&***r).unclean)
                .count(),
        }
    }

    /// The replica of `volume` this node serves, if it serves one (for the simulator's checks
    /// at the end of a run, which read it through the node's whole store stack).
    pub fn served(&self, volume: u64) -> Option<Arc<dyn Replica>> {
        self.replica(volume).ok()
    }

    /// Creates the replica of `volume`, `size` bytes, as a `CreateReplica` request with
    /// `flags` does (`FLAG_HELD`: a parity volume's copy, with its held map): for the
    /// simulator, which sets its nodes' disks up without a network.
    pub fn create_replica(&self, volume: u64, size: u64, flags: u16) -> Result<(), Refusal> {
        let h = trireme_proto::Header {
            volume,
            length: size,
            flags,
            ..trireme_proto::Header::request(trireme_proto::Op::CreateReplica, 0)
        };
        self.on_create_replica(&h).map(|_| ())
    }

    pub fn replica_count(&self) -> usize {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    fn replica(&self, volume: u64) -> Result<Arc<dyn Replica>, Refusal> {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
            .ok_or_else(|| Refusal(Status::NoReplica, format!("no replica of volume {volume}")))
    }

    /// Sets what the node answers `UcxAddress` with: its worker address, or why there is none.
    pub fn set_ucx(&self, offer: UcxOffer) {
        *self.ucx.write().unwrap_or_else(|e| e.into_inner()) = match offer {
            UcxOffer::Address(a) => Ok(Bytes::from(a)),
            UcxOffer::Unavailable(why) => Err(why),
        };
    }

    /// The dirty-region tracker (for tests and status).
    pub fn dirty(&self) -> &DirtyTracker {
        &self.dirty
    }

    /// Waits for the requests being served, refuses every later one, then flushes every
    /// replica and records a clean shutdown; used when the process exits.
    pub fn close_all(&self) {
        let mut closed = self.closed.write().unwrap_or_else(|e| e.into_inner());
        *closed = true;
        let reps = self.all_replicas();
        for r in reps {
            if let Some(ledger) = self.ledger_of(&*r) {
                if let Err(e) = self.dirty.save(r.volume(), r.size(), &*ledger) {
                    tracing::error!(node = self.id, "saving dirty records on shutdown: {e}");
                }
            }
            if let Err(e) = self.held.flush(r.volume(), &*r) {
                tracing::error!(node = self.id, "saving the held map on shutdown: {e}");
            }
            if let Err(e) = r.close() {
                tracing::error!(node = self.id, "close on shutdown: {e}");
            }
        }
    }
}

/// Binds the data-path listeners — TCP on `listen`, and a unix socket at `socket` for clients
/// on this host — reports the bound TCP address and whether the unix socket is up through
/// `on_bound`, and serves until a listener fails.
pub async fn run(
    node: Arc<Node>,
    listen: SocketAddr,
    socket: Option<&std::path::Path>,
    on_bound: impl FnOnce(SocketAddr, bool),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let unix = socket.and_then(|p| {
        trireme_tls::local::bind_private(p)
            .map_err(|e| tracing::warn!(path = %p.display(), "no same-host socket, TCP only: {e}"))
            .ok()
    });
    on_bound(listener.local_addr()?, unix.is_some());
    let books = tokio::spawn(keep_books(node.clone()));
    let _books = AbortOnDrop(books);
    let tcp = trireme_transport::tcp::serve(listener, node.clone());
    match unix {
        Some(u) => {
            tokio::select! {
                r = tcp => r,
                r = trireme_transport::tcp::serve_unix(u, node) => r,
            }
        }
        None => tcp.await,
    }
}

/// How often the bookkeeping on disk catches up ([`Node::sync_books`]).
pub const BOOKS_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

async fn keep_books(node: Arc<Node>) {
    loop {
        tokio::time::sleep(BOOKS_PERIOD).await;
        let n = node.clone();
        let _ = tokio::task::spawn_blocking(move || n.sync_books()).await;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
