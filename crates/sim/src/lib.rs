//! The seeded simulator: the real replication code under failures, in virtual time.
//!
//! What runs is the production code — the volume client (`trireme-client`: degraded writes,
//! dirty tracking, resync, reconciliation), real storage nodes (`trireme-node` over memory
//! stores), the writer's attach path and the manager election of a cluster on etcd
//! (`trireme-daemon`: the lease-bound attach record, replica states recorded by the writer,
//! candidates campaigning for the manager role over leases) — over an in-memory metadata store
//! with etcd's semantics (revisions, transactions, leases, watches) and an in-memory network.
//! A seeded PRNG decides every delay and every fault, and tokio's paused clock makes timeouts,
//! back-offs and lease TTLs cost no real time, so a 10-second run takes milliseconds and the
//! same seed replays the same run.
//!
//! Faults: network delay and reordering (each request sleeps a random time); node crashes
//! that keep the data (a process crash on a file store), lose what was not flushed (a power
//! loss: each unflushed write survives, vanishes or is torn, sector by sector; see `disk.rs`)
//! or lose it all (a memory store or a new disk), where a request in flight may be applied
//! without its answer ever arriving; restarts; freezes (requests wait, then land late, as on
//! SIGSTOP), partitions (requests hang until healed, then land late, as TCP retransmits; the
//! simulated links are in `net.rs`);
//! writer crashes (the process dies with writes in flight: its links close, its metadata calls
//! never return; a new writer is refused until the dead one's lease lapses, or fences it with
//! `--force`), three times in ten with every node's process (kill -9 of the whole cluster,
//! data kept; the next writer waits for the nodes); the metadata store unreachable from every process, sometimes for longer than a
//! lease TTL (take-outs wait and are never acknowledged without their record, leases lapse,
//! the attach record is put back, the manager role changes hands); a second host attaching
//! without `--force` (must be refused); the manager's process dying (another candidate
//! must take over within a TTL); and the manager draining a node onto the spare one (its
//! writer adds the new copy, resyncs it and retires the old one while I/O goes on; a drain that
//! fails is run again, as an operator would); the writer taking snapshots now and then, a copy
//! out, frozen, resyncing or crashing at the moment, and deleting one or rolling back to one
//! now and then (`snapshots.rs`; nodes keep versions in real files, which a lost disk takes
//! with it); and a clone of a snapshot made on the copies holding it, written, flattened on
//! some, written again, read and deleted, with the faults going on (`clones.rs`). Faults stay
//! within the contract: one replica
//! always stays in sync and healthy, so the workload must see no error at all. The manager
//! pings every node over the simulated network (heartbeats).
//!
//! Checked: every read returns a block written to that block no older than the last write
//! acknowledged before the read began, intact (each 4 KiB block is self-describing); after the
//! faults heal, every replica is back in sync, the replicas are byte-identical, and every block
//! reads back at or past its last acknowledged write; the writer holds its attach record at
//! its epoch; exactly one live process holds the manager role, the one the store names; a
//! vacant role was filled within a lease TTL of the store answering again, and no two live
//! processes held it for longer than a TTL; a node down longer than the heartbeats' limit
//! shows down, and after the heal the manager sees every node; a drain reported done left no
//! replica on its node and the volume its number of copies; every snapshot the writer took is
//! on a copy of the final layout, each block holding a write acknowledged no earlier than the
//! last one before it was asked for and issued no later than its answer, and it is
//! byte-identical on every copy that holds it; a clone reads, on every node that still holds
//! it, exactly the snapshot's bytes there with its own writes laid over them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use trireme_client::{
    BoxFut, Connector, ReconcileReport, ReplicaTarget, Volume, VolumeError, VolumeOptions,
};
use trireme_control::{Manager, MoveState, MoveStatus};
use trireme_daemon::attach::AttachConfig;
use trireme_daemon::manager_role::ManagerOptions;
use trireme_daemon::DaemonError;
use trireme_meta::{ClusterMeta, EmbeddedMeta, ManagerRecord, MetaError, NodeRecord, VolumeRecord};
use trireme_node::Node;
use trireme_proto::Header;
use trireme_replication::ReplicaState;
use trireme_store::Store;

mod clones;
pub mod core_steps;
mod disk;
mod driver;
mod faults;
mod managers;
mod net;
pub mod parity_steps;
mod procs;
mod snapshots;
use disk::SimDisk;
use driver::run_async;

mod panics;
use net::*;
use procs::{MetaNet, Proc, SimMeta};
use trireme_transport::{BoxFuture, Connection, ConnectionInfo, Frame, Handler, TransportError};

const BLOCK: u64 = 4096;
/// How long after a freeze or partition a node is not counted on (the replica timeout, 1 s, and
/// the take-out that may follow it).
const CALM: Duration = Duration::from_secs(3);
const VOLUME: &str = "sim";
/// TTL of every lease (writers' attach records, manager candidates): the shortest allowed.
const LEASE_TTL: Duration = trireme_daemon::lease::MIN_TTL;
/// How long past a lease's lapse a new writer or manager may take to appear (retry periods,
/// the campaign's round trip).
const TAKEOVER_SLACK: Duration = Duration::from_secs(1);
/// How long a writer's host tries again an attach that reached no in-sync copy: crashed and
/// powered-off nodes are back well within it.
const NO_COPY_LIMIT: Duration = Duration::from_secs(30);
/// The manager pings every node this often (production: 500 ms)...
const HEARTBEAT_EVERY: Duration = Duration::from_millis(200);
/// ...and logs one silent this long down (production: 3 s; shorter here, so that crashes of
/// up to 3.2 s outlast it and the check of what the manager sees runs on many of them).
const DOWN_AFTER: Duration = Duration::from_secs(1);

/// What one run does.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// Virtual seconds of workload with faults.
    pub secs: u64,
    /// Volume size in 4 KiB blocks (small, so writes collide).
    pub blocks: u64,
    /// Writes go to the first this many blocks (reads anywhere).
    pub hot: u64,
    /// The only fault is the writer crashing (to measure what the activity log saves).
    pub only_writer_crashes: bool,
    /// Concurrent I/O tasks of the writer.
    pub tasks: usize,
    pub replicas: usize,
    pub faults: bool,
    /// For the checker's own test: a node that restarts "with its data" has in fact lost it (a
    /// disk that lies about what it kept). Nothing in the product can know; the checks must
    /// catch the damage.
    pub sabotage: bool,
    /// For the checker's own test: a node that loses power does not notice (it keeps its
    /// replica's incarnation), so its torn and lost writes are not resynced.
    pub sabotage_power_loss: bool,
    /// The writer's resync rate limit (bytes per virtual second), if any: its pacing reads
    /// the clock, which must be tokio's (virtual here) for a seed to replay.
    pub resync_rate: Option<u64>,
    /// The writer takes snapshots now and then (`snapshots.rs`), each checked at the end.
    pub snapshots: bool,
    /// For the checker's own test: snapshots are taken on the copies directly, with writes
    /// in flight, not through the writer's barrier.
    pub sabotage_barrier: bool,
    /// For the checker's own test: a clone is made of another snapshot than the one it is
    /// checked against (`clones.rs`).
    pub sabotage_clone: bool,
    /// A parity volume of this layout (`K+M`, its mirrored share) instead of a mirror
    /// ([`Config::parity`]).
    pub parity: Option<trireme_replication::Parity>,
    /// How far past its share busy writes may take a parity volume's mirrored part before
    /// its encoder goes on beside them ([`VolumeOptions::encode_headroom`]): half the parity
    /// seeds take 0, so encodes race the writes from the first region over the share.
    pub encode_headroom: u8,
    /// For the checker's own test: a node's process that dies takes its held maps' live
    /// copies with it, so a parity replica comes back with the map of its last flush.
    pub sabotage_live_held: bool,
}

impl Config {
    pub fn new(seed: u64) -> Config {
        Config {
            seed,
            secs: 8,
            blocks: 64,
            hot: 64,
            only_writer_crashes: false,
            tasks: 3,
            replicas: 3,
            faults: true,
            sabotage: false,
            sabotage_power_loss: false,
            resync_rate: None,
            snapshots: true,
            sabotage_barrier: false,
            sabotage_clone: false,
            parity: None,
            encode_headroom: trireme_client::ENCODE_HEADROOM,
            sabotage_live_held: false,
        }
    }

    /// A parity volume of four regions, 2+1 on three of four nodes or 4+2 on six of seven
    /// (by the seed), its writer's encoder turning regions into stripes and folding the
    /// overlay back while the writes and the faults go on: at most M copies troubled at a
    /// time, as the layout tolerates; and now and then a drain (its copy replaced in its
    /// place through the writer, one loss fewer meanwhile: the faults count the old copy
    /// out) or more than M crashing at once. No snapshots or clones (refused).
    pub fn parity(seed: u64) -> Config {
        let spec = if (seed / 8) % 2 == 1 { "4+2" } else { "2+1" };
        let p = trireme_replication::Parity::parse(spec, Some(25)).expect("a valid layout");
        let blocks = 4 * trireme_replication::CHUNK_BLOCKS * u64::from(p.data);
        Config {
            blocks,
            hot: blocks,
            replicas: usize::from(p.data + p.parity),
            snapshots: false,
            parity: Some(p),
            encode_headroom: if (seed / 16) % 2 == 1 {
                0
            } else {
                trireme_client::ENCODE_HEADROOM
            },
            ..Config::new(seed)
        }
    }

    /// The volume's layout.
    fn layout(&self) -> trireme_replication::Layout {
        match self.parity {
            Some(p) => trireme_replication::Layout::Parity(p),
            None => trireme_replication::Layout::Mirror,
        }
    }

    /// How many copies may be troubled at once: all but one of a mirror's, M of a parity
    /// volume's.
    fn tolerance(&self) -> usize {
        match self.parity {
            Some(p) => usize::from(p.parity),
            None => self.replicas - 1,
        }
    }
}

/// What a successful run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub writes: u64,
    pub reads: u64,
    pub faults: Vec<String>,
    pub reconciles: Vec<ReconcileReport>,
    /// How long each new writer waited for the dead one's attach record to lapse.
    pub attach_waits: Vec<Duration>,
    /// From a manager's death (or the end of the outage that cost it the role) to a new one.
    pub takeovers: Vec<Duration>,
    /// The last writer's last finished resync of each replica.
    pub resyncs: Vec<trireme_replication::ResyncProgress>,
    /// A parity volume's regions in parity at the end (on record), and its overlay then,
    /// in blocks.
    pub parity_regions: u64,
    pub overlay_blocks: u64,
}

/// xorshift64*: small, seeded, and the same everywhere.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
}

type SharedRng = Arc<Mutex<Rng>>;

fn rand(r: &SharedRng) -> std::sync::MutexGuard<'_, Rng> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
struct NodeState {
    node: Arc<Node>,
    store: Arc<SimDisk>,
    /// Bumped by every restart: connections to an older process are dead.
    generation: u64,
    down: bool,
    /// While down: whether its restart comes back without data.
    lose_on_restart: Option<bool>,
    frozen_until: Option<Instant>,
    partitioned: bool,
    /// After a freeze or partition ends, requests that timed out meanwhile may still take the
    /// node out: until then it does not count as the healthy copy a fault must leave.
    calm_after: Option<Instant>,
}

#[derive(Debug)]
struct SimNode {
    id: u32,
    /// Where its replicas' versions (snapshots) persist: real files, which a process crash
    /// keeps, and which go with the disk when it is lost.
    versions: std::path::PathBuf,
    state: Mutex<NodeState>,
}

impl SimNode {
    fn st(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Its process, if it is up.
    fn up(&self) -> Option<Arc<Node>> {
        let s = self.st();
        (!s.down).then(|| s.node.clone())
    }
    fn healthy(&self) -> bool {
        let s = self.st();
        let now = Instant::now();
        !s.down
            && !s.partitioned
            && s.frozen_until.is_none_or(|t| t <= now)
            && s.calm_after.is_none_or(|t| t <= now)
    }
    /// The node is troubled until `until`, and not to be counted on for a while after.
    fn troubled_until(&self, until: Instant) {
        let mut s = self.st();
        s.calm_after = s.calm_after.max(Some(until + CALM));
    }
}

/// A node's store as production runs it: versions (kept in a directory of the node's, taken,
/// deleted and rolled back by the snapshot task of `snapshots.rs`) over clones (their maps in
/// the same directory; made, flattened and deleted by `clones.rs`) over every block sealed
/// with its checksum, over the simulated disk. The seals persist in the same directory, as
/// the file store's do: after a crash, a node keeps the seals its activity log says still
/// hold, and the end's read of every copy through its store checks them (with seals in
/// memory only, a copy whose kept seals were wrong went unseen: issue 63).
fn sealed(disk: &Arc<SimDisk>, versions: &std::path::Path) -> Arc<dyn Store> {
    let sealed = Arc::new(trireme_store::SealedStore::new(
        disk.clone() as Arc<dyn Store>,
        Some(versions),
    ));
    let backed = Arc::new(trireme_store::BackedStore::new(sealed, Some(versions)));
    // The pool grows by 16 blocks, not 64 MiB: the volume is 64 blocks, the disk memory. The
    // redirect log is folded into the main file past 16 records, not 40,000, so that runs
    // fold it (and switch the two logs) among their crashes.
    Arc::new(
        trireme_store::VersionedStore::new(backed, Some(versions))
            .with_grow_min(16 * BLOCK)
            .with_log_slots(16),
    )
}

/// Creates the volume's replica on `node` as the manager asks it: a parity volume's spans
/// its strides and keeps a held map.
fn create_replica(
    cfg: &Config,
    node: &Node,
    volume: u64,
    size: u64,
) -> Result<(), trireme_node::Refusal> {
    let flags = match cfg.parity {
        Some(_) => trireme_proto::FLAG_HELD,
        None => 0,
    };
    node.create_replica(volume, cfg.layout().replica_size(size), flags)
}

/// A self-describing block: (block, seq) repeated, so a torn, misplaced or stale block shows.
fn stamp(block: u64, seq: u64) -> Bytes {
    let mut b = Vec::with_capacity(BLOCK as usize);
    while b.len() < BLOCK as usize {
        b.extend_from_slice(&block.to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
    }
    Bytes::from(b)
}

/// The seq a block holds (0: never written), or why it is not a valid block.
fn parse(block: u64, data: &[u8]) -> Result<u64, String> {
    if data.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let b = u64::from_le_bytes(data[0..8].try_into().expect("8"));
    let seq = u64::from_le_bytes(data[8..16].try_into().expect("8"));
    if b != block || data != &stamp(block, seq)[..] {
        return Err(format!(
            "block {block} is corrupt or misplaced (says block {b}, seq {seq})"
        ));
    }
    Ok(seq)
}

/// What the writer has done to each block.
#[derive(Debug, Default)]
struct Model {
    next_seq: u64,
    /// Every seq issued per block (acknowledged or not).
    issued: HashMap<u64, Vec<u64>>,
    /// Last acknowledged seq per block.
    acked: HashMap<u64, u64>,
    writes: u64,
    reads: u64,
    /// What each new writer's reconciliation did.
    reconciles: Vec<ReconcileReport>,
    attach_waits: Vec<Duration>,
    takeovers: Vec<Duration>,
    violation: Option<String>,
    /// The snapshots taken, and what each must hold.
    snapshots: Vec<SnapshotOracle>,
    next_snapshot: u64,
    /// Clones made (`clones.rs`; ids from `CLONE_IDS` up): a node down at a clone's delete
    /// keeps it until the end.
    clones: u64,
}

/// What a snapshot must hold, block by block: a seq acknowledged no earlier than `floor` (the
/// last one acknowledged before it was asked for), issued no later than `ceiling` (the last
/// one issued before it was answered).
#[derive(Debug, Clone)]
struct SnapshotOracle {
    id: u64,
    floor: HashMap<u64, u64>,
    ceiling: u64,
    /// The copies the writer named as holding it (flushed there): the ones a clone is made
    /// on, as the manager makes it on the nodes of the snapshot's record.
    nodes: Vec<u32>,
    /// Its size: the volume's under the barrier (at least the workload's, which resizes
    /// never go below).
    size: u64,
}

/// A process that campaigns for the manager role (a node daemon's, in production).
struct Candidate {
    id: u32,
    proc_: Arc<Proc>,
    /// Its manager while it holds the role.
    current: tokio::sync::watch::Receiver<Option<Arc<Manager>>>,
}

/// The manager role as the simulator watches it.
#[derive(Default)]
struct Managers {
    candidates: Vec<Candidate>,
    next_id: u32,
    /// Whether any candidate has held the role yet.
    seen: bool,
    /// Since when no live candidate holds the role, if none does.
    vacant_since: Option<Instant>,
    /// Since when more than one live candidate believes it holds the role.
    doubled_since: Option<Instant>,
}

struct World {
    cfg: Config,
    rng: SharedRng,
    nodes: Vec<Arc<SimNode>>,
    /// The store itself, for the simulator's own reads and writes (never through an outage).
    meta: ClusterMeta,
    net: Arc<MetaNet>,
    /// Until when the metadata store counts as troubled (an outage and the lease lapses it
    /// may cause).
    meta_calm_after: Mutex<Instant>,
    managers: Mutex<Managers>,
    /// The current writer's process.
    writer: Mutex<Option<Arc<Proc>>>,
    tokens: Arc<AtomicU64>,
    model: Arc<Mutex<Model>>,
    /// Held shared by each I/O of the workload, exclusive by a rollback: a read's floor is
    /// taken before it is sent, and a rollback moves every floor back.
    io_gate: tokio::sync::RwLock<()>,
    log: Arc<Mutex<Vec<String>>>,
    volume_id: u64,
    size: u64,
    start: Instant,
}

impl World {
    fn note(&self, s: String) {
        let t = Instant::now() - self.start;
        if std::env::var_os("TRIREME_SIM_TRACE").is_some() {
            use std::io::Write;
            // Not eprintln!: the test harness captures that, and the interleaving with the
            // client's own log lines is the point.
            let _ = writeln!(std::io::stderr(), "SIM {:>9.3}s {s}", t.as_secs_f64());
        }
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{:>9.3}s {s}", t.as_secs_f64()));
    }

    fn model(&self) -> std::sync::MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn violate(&self, what: String) {
        self.note(format!("VIOLATION: {what}"));
        let mut m = self.model();
        if m.violation.is_none() {
            m.violation = Some(what);
        }
    }

    /// The metadata store as process `p` reaches it.
    fn meta_for(&self, p: &Arc<Proc>) -> ClusterMeta {
        ClusterMeta::new(Arc::new(SimMeta {
            inner: self.meta.store().clone(),
            net: self.net.clone(),
            proc_: p.clone(),
        }))
    }

    fn meta_calm_after(&self) -> Instant {
        *self
            .meta_calm_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn managers(&self) -> std::sync::MutexGuard<'_, Managers> {
        self.managers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One I/O task: random 4 KiB writes and reads, and now and then a flush, until `until`.
    async fn io_task(self: Arc<Self>, vol: Arc<Volume>, until: Instant) {
        while Instant::now() < until {
            let (block, write, flush, pause) = {
                let mut r = rand(&self.rng);
                let write = r.chance(0.6);
                let span = if write { self.cfg.hot } else { self.cfg.blocks };
                (r.below(span), write, r.chance(0.05), r.below(20_000))
            };
            let _io = self.io_gate.read().await;
            if flush {
                if let Err(e) = vol.flush().await {
                    self.violate(format!("flush failed: {e}"));
                }
            } else if write {
                let seq = {
                    let mut m = self.model();
                    m.next_seq += 1;
                    let s = m.next_seq;
                    m.issued.entry(block).or_default().push(s);
                    s
                };
                match vol.write(block * BLOCK, stamp(block, seq), false).await {
                    Ok(()) => {
                        let mut m = self.model();
                        m.writes += 1;
                        let a = m.acked.entry(block).or_insert(0);
                        *a = (*a).max(seq);
                    }
                    Err(e) => self.violate(format!("write of block {block} failed: {e}")),
                }
            } else {
                let floor = self.model().acked.get(&block).copied().unwrap_or(0);
                match vol.read(block * BLOCK, BLOCK).await {
                    Ok(d) => self.check(block, floor, &d),
                    Err(e) => self.violate(format!("read of block {block} failed: {e}")),
                }
                self.model().reads += 1;
            }
            drop(_io);
            tokio::time::sleep(Duration::from_micros(pause)).await;
        }
    }

    fn check(&self, block: u64, floor: u64, data: &[u8]) {
        match parse(block, data) {
            Err(e) => self.violate(e),
            Ok(seq) if seq < floor => self.violate(format!(
                "stale read: block {block} returned seq {seq}, but seq {floor} was acknowledged before the read"
            )),
            Ok(seq) if seq != 0 && !self.model().issued.get(&block).is_some_and(|v| v.contains(&seq)) => {
                self.violate(format!("block {block} holds seq {seq}, which was never written there"))
            }
            Ok(_) => {}
        }
    }

    /// The replicas in sync both as the writer sees them and on record (a take-out in progress
    /// shows on record first), on healthy nodes.
    fn healthy_in_sync(&self, vol: &Volume) -> Vec<u32> {
        let recorded = ready(self.meta.volume(VOLUME))
            .map(|v| v.replicas)
            .unwrap_or_default();
        vol.replica_views()
            .into_iter()
            .filter(|r| r.state == ReplicaState::InSync)
            .filter(|r| {
                recorded
                    .iter()
                    .any(|x| x.node == r.node && x.state == ReplicaState::InSync)
            })
            .map(|r| r.node)
            .filter(|&n| self.node(n).healthy())
            .collect()
    }

    fn node(&self, id: u32) -> &Arc<SimNode> {
        self.nodes.iter().find(|n| n.id == id).expect("node")
    }

    /// Restarts a node's process; with `lose`, on an empty store (its replica re-created, and
    /// recorded as failed first, as the manager does for a volatile store).
    /// Restarts a node that is down (a no-op if it is already up: the heal got there first).
    fn restart(&self, id: u32) {
        let n = self.node(id);
        let Some(lose) = n.st().lose_on_restart.take() else {
            return;
        };
        self.note(format!(
            "node {id} restarts{}",
            if lose { " empty" } else { "" }
        ));
        let mut holds = false;
        let store: Arc<SimDisk> = if lose {
            let _ = ready(self.meta.update_volume(VOLUME, &mut |v| {
                if let Some(r) = v.replicas.iter_mut().find(|r| r.node == id) {
                    r.state = ReplicaState::Failed;
                    holds = true;
                }
                Ok(())
            }));
            Arc::new(SimDisk::default())
        } else {
            let store = n.st().store.clone();
            if self.cfg.sabotage {
                if let Some(r) = store.open_all().into_iter().flatten().next() {
                    let _ = r.write_zeroes(0, self.size, true, false);
                }
            }
            store
        };
        if lose {
            // The versions go with the disk.
            let _ = std::fs::remove_dir_all(&n.versions);
            let _ = std::fs::create_dir_all(&n.versions);
        }
        let node = Node::with_dirty_grain(id, sealed(&store, &n.versions), BLOCK);
        if holds {
            // A new disk: its copy made again, empty, as the manager asks it.
            create_replica(&self.cfg, &node, self.volume_id, self.size).expect("create replica");
        }
        let mut s = n.st();
        s.node = Arc::new(node);
        // Its activity log and dirty records come back from the disk's ledger (gone with the
        // data on an empty restart).
        s.node.keep_books();
        s.store = store;
        s.generation += 1;
        s.down = false;
        drop(s);
        // Requests still in flight on links to the dead process fail for a while yet, and each
        // such failure may take the replica out again (then after the metadata store answers).
        n.troubled_until(self.meta_settled(Instant::now()));
    }

    /// When a node's trouble that ends at `until` is settled: a take-out it causes waits for
    /// the metadata store, so while the store is troubled, not before it is calm again.
    fn meta_settled(&self, until: Instant) -> Instant {
        let calm = self.meta_calm_after();
        if calm > Instant::now() {
            until.max(calm)
        } else {
            until
        }
    }
}

/// Runs one seed. `Err` carries the violation and the run's event log.
pub fn run(cfg: &Config) -> Result<Outcome, SimFailure> {
    if std::env::var_os("TRIREME_SIM_TRACE").is_some() {
        // The client's and nodes' own logs, interleaved with the run (for replaying a seed).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                std::env::var("TRIREME_SIM_TRACE")
                    .ok()
                    .filter(|f| f.len() > 1)
                    .unwrap_or_else(|| "info".into()),
            )
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(SimFailure::Runtime)?;
    // A run that never ends fails with its events instead of hanging the test run: past a
    // bound of virtual time (a loop that sleeps and never gets anywhere), or of real time (a
    // loop that never lets virtual time pass).
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let virtual_bound = Duration::from_secs(cfg.secs) + MAX_VIRTUAL_PAST_SCHEDULE;
    let (tx, rx) = std::sync::mpsc::channel();
    let (run_cfg, run_log) = (cfg.clone(), log.clone());
    std::thread::Builder::new()
        .name(format!("sim-{}", cfg.seed))
        .spawn(move || {
            panics::watch();
            let r = rt.block_on(async {
                tokio::time::timeout(virtual_bound, run_async(run_cfg, run_log)).await
            });
            // Tasks' panics are caught by the runtime and would pass unseen.
            drop(rt);
            let _ = tx.send((r, panics::taken()));
        })
        .map_err(SimFailure::Runtime)?;
    let stuck = |what: String| SimFailure::Guarantee {
        seed: cfg.seed,
        what,
        events: log.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    };
    match rx.recv_timeout(MAX_REAL) {
        Ok((Ok(Ok(_)), Some(panic))) => Err(stuck(format!(
            "a task panicked, and the run went on without it: {panic}"
        ))),
        Ok((Ok(r), _)) => r,
        Ok((Err(_), _)) => Err(stuck(format!(
            "the run went on past {virtual_bound:?} of virtual time: something retries forever"
        ))),
        Err(_) => Err(stuck(format!(
            "the run went on past {MAX_REAL:?} of real time without letting virtual time pass: something loops without pause"
        ))),
    }
}

/// How long a run may go on past its fault schedule (the checks at its end wait up to two
/// minutes each) before it counts as stuck.
const MAX_VIRTUAL_PAST_SCHEDULE: Duration = Duration::from_secs(600);
/// Real time a run may take (a seed takes milliseconds; a debug build under load, a second).
const MAX_REAL: Duration = Duration::from_secs(60);

/// Why a simulated run failed.
#[derive(Debug, thiserror::Error)]
pub enum SimFailure {
    /// A guarantee was broken: what, and the run's events up to then (to replay the seed).
    #[error("seed {seed}: {what}\nevents:\n{}", events.join("\n"))]
    Guarantee {
        seed: u64,
        what: String,
        events: Vec<String>,
    },
    /// The in-memory metadata store failed (setting the cluster up, or reading it at the end).
    #[error("the metadata store: {0}")]
    Meta(#[from] MetaError),
    #[error("the simulator's runtime: {0}")]
    Runtime(std::io::Error),
}

/// How the fault schedule ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FaultsEnd {
    /// The run's time is up.
    Done,
    /// The writer's process was killed: a new one attaches, and the schedule goes on.
    WriterCrashed,
    /// A guarantee was broken: the run stops here.
    Violated(String),
}

/// The node of a drain that failed with a replica of the volume still on it, if any (and the
/// node is still out of service: one put back since may have taken a replica again).
fn unfinished_drain(jobs: &[MoveStatus], nodes: &[NodeRecord], rec: &VolumeRecord) -> Option<u32> {
    jobs.iter()
        .filter(|j| j.state == MoveState::Failed)
        .map(|j| j.node)
        .filter(|&n| {
            nodes
                .iter()
                .any(|x| x.id == n && x.state == trireme_meta::NodeState::Draining)
        })
        // A parity copy's replacement names the old node only as where it moves from.
        .find(|&n| {
            rec.replicas
                .iter()
                .any(|r| r.node == n || r.moving_from == Some(n))
        })
}

/// Runs a call of the in-memory metadata store from code that cannot await: that store
/// answers on the first poll (it never waits on I/O).
fn ready<T>(f: impl std::future::Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("the in-memory metadata store never waits"),
    }
}

#[cfg(test)]
mod tests;
