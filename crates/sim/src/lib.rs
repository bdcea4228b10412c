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
//! `--force`); the metadata store unreachable from every process, sometimes for longer than a
//! lease TTL (take-outs wait and are never acknowledged without their record, leases lapse,
//! the attach record is put back, the manager role changes hands); a second host attaching
//! without `--force` (must be refused); the manager's process dying (another candidate
//! must take over within a TTL); and the manager draining a node onto the spare one (its
//! writer adds the new copy, resyncs it and retires the old one while I/O goes on; a drain that
//! fails is run again, as an operator would). Faults stay within the contract: one replica
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
//! replica on its node and the volume its number of copies.

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

mod disk;
mod driver;
mod net;
mod procs;
use disk::SimDisk;
use driver::run_async;
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
    state: Mutex<NodeState>,
}

impl SimNode {
    fn st(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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

/// A node's store as production runs it: versions (none taken yet in the simulator: every
/// call passes through) over every block sealed with its checksum (in memory, as on a store
/// without a seals file: a restarted node is unsealed until blocks are written again), over
/// the simulated disk.
fn sealed(disk: &Arc<SimDisk>) -> Arc<dyn Store> {
    let sealed = Arc::new(trireme_store::SealedStore::new(
        disk.clone() as Arc<dyn Store>,
        None,
    ));
    Arc::new(trireme_store::VersionedStore::new(sealed, None))
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

    /// A new writer process attaches the way `trireme attach` does (`trireme_daemon::attach`:
    /// the lease-bound attach record, the epoch taken in one transaction, replica states
    /// recorded by the writer itself). After a writer crash (`dead_since`), it is refused while
    /// the dead writer's record lives and retries until the record lapses with its lease; or,
    /// by the seed's choice, fences it with `--force`.
    async fn attach(&self, dead_since: Option<Instant>) -> Result<Arc<Volume>, String> {
        let p = Arc::new(Proc::default());
        // Small activity-log extents and a small cap, so the log is cleared all the time and a
        // clear racing a write would show as replicas that differ after a writer crash.
        let (cap, period, force) = {
            let mut r = rand(&self.rng);
            (r.below(3) as usize, 50 + r.below(500), r.chance(0.3))
        };
        let cfg = AttachConfig {
            volume: VOLUME.into(),
            force,
            lease_ttl: LEASE_TTL,
            opts: VolumeOptions {
                connector: Some(Arc::new(SimConnector {
                    nodes: self.nodes.clone(),
                    rng: self.rng.clone(),
                    tokens: self.tokens.clone(),
                    proc_: p.clone(),
                })),
                activity_extent: 64 << 10,
                activity_extents: cap,
                activity_period: Duration::from_millis(period),
                resync_rate: self.cfg.resync_rate,
                // The seeds' volumes are counted by nobody: no metrics to update.
                metrics: false,
                ..VolumeOptions::default()
            },
        };
        let meta = self.meta_for(&p);
        let began = Instant::now();
        let attached = loop {
            match trireme_daemon::attach::attach(meta.clone(), &cfg, vec![]).await {
                Ok(a) => break a,
                Err(e @ DaemonError::Meta(MetaError::Attached { .. })) => {
                    let since = dead_since.unwrap_or(self.start);
                    let limit = (since + LEASE_TTL + TAKEOVER_SLACK).max(self.meta_calm_after());
                    if Instant::now() > limit {
                        return Err(format!(
                            "the dead writer's attach record outlived its lease: {e}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                // Every in-sync copy is down or cut off right now (crashes and power losses
                // under a copy that is still resyncing): the attach changed nothing, and a
                // writer's host tries again, as `up`'s export and an operator do.
                Err(e @ DaemonError::NoCopy(_)) => {
                    if began.elapsed() > NO_COPY_LIMIT {
                        return Err(format!("no in-sync copy came back: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(format!("attach: {e}")),
            }
        };
        let v = attached.volume.clone();
        if let Some(t) = dead_since {
            self.model().attach_waits.push(Instant::now() - t);
        }
        *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        self.note(format!(
            "writer attaches{}, epoch {}",
            if force { " with --force" } else { "" },
            v.info().epoch
        ));
        if let Some(r) = v.last_reconcile() {
            self.note(format!(
                "reconciled {} bytes ({}), copied {}",
                r.compared_bytes,
                if r.whole {
                    "whole volume"
                } else {
                    "activity log"
                },
                r.copied_bytes
            ));
            self.model().reconciles.push(r);
        }
        Ok(v)
    }

    /// A process that campaigns for the manager role, as every node daemon does
    /// (`trireme_daemon::manager_role::campaign` over a lease it keeps and takes again when
    /// lost). Its heartbeats, node pings and status cross the simulated network from its own
    /// process (a dead candidate's links die with it); re-creations of replicas stay off.
    fn spawn_candidate(self: &Arc<Self>) {
        let p = Arc::new(Proc::default());
        let meta = self.meta_for(&p);
        let id = {
            let mut m = self.managers();
            m.next_id += 1;
            100 + m.next_id
        };
        let (lease_tx, lease_rx) = tokio::sync::watch::channel(None);
        let (current_tx, current) = tokio::sync::watch::channel(None);
        let store = meta.store().clone();
        tokio::spawn(async move {
            loop {
                let Ok(l) = trireme_daemon::lease::grant(&*store, LEASE_TTL).await else {
                    return;
                };
                if lease_tx.send(Some(l)).is_err() {
                    return;
                }
                trireme_daemon::lease::keep(&*store, l, LEASE_TTL).await;
                let _ = lease_tx.send(None);
                let _ = store.revoke(l).await;
            }
        });
        let opts = ManagerOptions {
            heartbeat_every: HEARTBEAT_EVERY,
            down_after: DOWN_AFTER,
            down_out: None,
            rate: None,
            // The event recorder and the scrub schedule are observers: they change no
            // replica and no writer, and their status calls would only slow the runs.
            events: false,
            scrub: Default::default(),
            connector: Some(Arc::new(SimConnector {
                nodes: self.nodes.clone(),
                rng: self.rng.clone(),
                tokens: self.tokens.clone(),
                proc_: p.clone(),
            })),
            node_leases: false,
        };
        let rec = ManagerRecord {
            node: id,
            control: format!("sim:{id}"),
            host: "sim".into(),
            pid: id,
            http: None,
        };
        tokio::spawn(trireme_daemon::manager_role::campaign(
            meta, lease_rx, rec, opts, current_tx,
        ));
        let mut changes = current.clone();
        let me = self.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                me.role_changed();
            }
        });
        self.managers().candidates.push(Candidate {
            id,
            proc_: p,
            current,
        });
    }

    /// The manager of the live process holding the role, if one does.
    fn current_manager(&self) -> Option<Arc<Manager>> {
        self.managers()
            .candidates
            .iter()
            .filter(|c| !c.proc_.dead())
            .find_map(|c| c.current.borrow().clone())
    }

    /// A node crashed at `at` and is still down (generation `generation`): the manager's
    /// status must show it down, and its heartbeats must not have seen it since the crash.
    /// Skipped while no manager holds the role or the metadata store cannot be read.
    async fn check_seen_down(&self, id: u32, at: Instant, generation: u64) {
        let still_down = || {
            let s = self.node(id).st();
            s.down && s.generation == generation
        };
        let Some(m) = self.current_manager().filter(|_| still_down()) else {
            return;
        };
        // Taken before the status, which takes a while (it pings every node in turn): its row
        // for this node is computed later, so a heartbeat from before the crash shows as at
        // least this long ago.
        let since = Instant::now() - at;
        let Ok(st) = m.status().await else { return };
        // The node may be back meanwhile.
        if !still_down() {
            return;
        }
        let Some(n) = st.nodes.iter().find(|n| n.id == id) else {
            self.violate(format!("manager status has no node {id}"));
            return;
        };
        if n.up
            || n.last_seen_ms
                .is_some_and(|ms| ms + 100 < since.as_millis() as u64)
        {
            self.violate(format!(
                "node {id}, down for {since:?}: the manager shows up={} last seen {:?} ms ago",
                n.up, n.last_seen_ms
            ));
        }
    }

    /// The live candidates that believe they hold the role.
    fn holders(&self) -> Vec<u32> {
        self.managers()
            .candidates
            .iter()
            .filter(|c| !c.proc_.dead() && c.current.borrow().is_some())
            .map(|c| c.id)
            .collect()
    }

    /// Called whenever a candidate gains or loses the role, or dies: keeps when the role
    /// fell vacant (and how long each takeover took) and since when two hold it.
    fn role_changed(&self) {
        let now = Instant::now();
        let holders = self.holders();
        let mut m = self.managers();
        if holders.is_empty() {
            if m.seen {
                m.vacant_since.get_or_insert(now);
            }
        } else {
            m.seen = true;
            if let Some(since) = m.vacant_since.take() {
                drop(m);
                self.model().takeovers.push(now - since);
                self.note(format!(
                    "candidate {} takes the manager role after {:?}",
                    holders[0],
                    now - since
                ));
                m = self.managers();
            }
        }
        if holders.len() > 1 {
            m.doubled_since.get_or_insert(now);
        } else {
            m.doubled_since = None;
        }
    }

    /// Checks the manager role: a vacancy is filled within a lease TTL (plus the time the
    /// store was unreachable), and no two live processes believe they hold the role for
    /// longer than it takes a deposed one to notice.
    async fn watch_managers(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = Instant::now();
            let calm = self.meta_calm_after();
            let (vacant, doubled) = {
                let m = self.managers();
                (m.vacant_since, m.doubled_since)
            };
            if let Some(since) = vacant {
                if now > (since + LEASE_TTL + TAKEOVER_SLACK).max(calm) {
                    self.violate(format!("no manager for {:?}", now - since));
                    return;
                }
            }
            if let Some(since) = doubled {
                if now - since > LEASE_TTL {
                    self.violate(format!(
                        "candidates {:?} all hold the manager role for {:?}",
                        self.holders(),
                        now - since
                    ));
                    return;
                }
            }
        }
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
        let store: Arc<SimDisk> = if lose {
            let mut holds = false;
            let _ = ready(self.meta.update_volume(VOLUME, &mut |v| {
                if let Some(r) = v.replicas.iter_mut().find(|r| r.node == id) {
                    r.state = ReplicaState::Failed;
                    holds = true;
                }
                Ok(())
            }));
            let s = Arc::new(SimDisk::default());
            if holds {
                s.create(self.volume_id, self.size).expect("create replica");
            }
            s
        } else {
            let store = n.st().store.clone();
            if self.cfg.sabotage {
                if let Some(r) = store.open_all().into_iter().flatten().next() {
                    let _ = r.write_zeroes(0, self.size, true, false);
                }
            }
            store
        };
        let mut s = n.st();
        s.node = Arc::new(Node::with_dirty_grain(id, sealed(&store), BLOCK));
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

    /// The manager drains a node that holds a replica, as `trireme node drain` asks it to:
    /// it creates a copy on the node with room (the spare, or a node an earlier drain
    /// emptied), the writer adds and resyncs it while I/O goes on, then retires the old one,
    /// and the manager drops it from the record and deletes it. One drain at a time; a node
    /// an earlier drain emptied is put back in service first (`node undrain`), after a check
    /// that the drain left it nothing.
    async fn drain(&self, v: &Volume, pick: usize) {
        if Instant::now() < self.meta_calm_after() {
            return;
        }
        let Some(m) = self.current_manager() else {
            return;
        };
        let (Ok(jobs), Ok(rec), Ok(nodes)) = (
            self.meta.jobs::<MoveStatus>().await,
            self.meta.volume(VOLUME).await,
            self.meta.nodes().await,
        ) else {
            return;
        };
        if jobs.iter().any(|j| j.state == MoveState::Running) {
            return;
        }
        // A drain that failed (its writer was replaced, its target went down) is run again,
        // as its error tells an operator to: it resumes the copy it left.
        if let Some(id) = unfinished_drain(&jobs, &nodes, &rec) {
            self.start_drain(&m, id, true).await;
            return;
        }
        self.check_drains(&jobs, &nodes, &rec);
        for n in nodes
            .iter()
            .filter(|n| n.state == trireme_meta::NodeState::Draining)
        {
            match m.undrain(n.id).await {
                Ok(_) => self.note(format!("node {} takes replicas again", n.id)),
                Err(e) => {
                    self.note(format!("undrain of node {} refused: {e}", n.id));
                    return;
                }
            }
        }
        let id = rec.replicas[pick % rec.replicas.len()].node;
        if !self.healthy_in_sync(v).iter().any(|&n| n != id) {
            return;
        }
        self.start_drain(&m, id, false).await;
    }

    /// Asks manager `m` to drain node `id` (`again`: a drain that failed), and logs it.
    async fn start_drain(&self, m: &Arc<Manager>, id: u32, again: bool) {
        match m.start_move(id, false, None).await {
            Ok(_) => self.note(format!(
                "manager drains node {id}{}",
                if again { " again" } else { "" }
            )),
            Err(e) => self.note(format!("drain of node {id} refused: {e}")),
        }
    }

    /// Every drain reported done whose node is still out of service (not undrained since):
    /// the volume keeps its copies, none of them there.
    fn check_drains(&self, jobs: &[MoveStatus], nodes: &[NodeRecord], rec: &VolumeRecord) {
        for j in jobs.iter().filter(|j| j.state == MoveState::Done) {
            let out = nodes
                .iter()
                .any(|n| n.id == j.node && n.state == trireme_meta::NodeState::Draining);
            if out {
                self.check_drained(j.node, rec);
            }
        }
    }

    fn check_drained(&self, node: u32, rec: &VolumeRecord) {
        if rec.replicas.iter().any(|r| r.node == node) {
            self.violate(format!(
                "the drain of node {node} is done, but the volume keeps a replica there: {:?}",
                rec.replicas
            ));
        }
        if rec.replicas.len() != self.cfg.replicas {
            self.violate(format!(
                "after the drain of node {node} the volume has {} replicas, not {}",
                rec.replicas.len(),
                self.cfg.replicas
            ));
        }
    }

    /// Injects faults until `until`, never taking the last healthy in-sync replica.
    async fn faults(self: Arc<Self>, vol: Arc<Mutex<Arc<Volume>>>, until: Instant) -> FaultsEnd {
        while Instant::now() < until {
            let pause = rand(&self.rng).below(740) + 180;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if Instant::now() >= until {
                break;
            }
            let v = vol.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let (kind, pick, dur) = {
                let mut r = rand(&self.rng);
                (
                    r.below(10),
                    r.below(self.nodes.len() as u64) as usize,
                    r.below(3_000) + 200,
                )
            };
            if kind == 5 || self.cfg.only_writer_crashes {
                // The writer's process dies with writes in flight; a new one attaches.
                self.note("writer crashes".into());
                let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(p) = writer {
                    p.kill();
                }
                return FaultsEnd::WriterCrashed;
            }
            let dur = Duration::from_millis(dur);
            match kind {
                6 => {
                    // The metadata store is unreachable from every process, sometimes for
                    // longer than a lease TTL: take-outs wait, leases lapse, the attach
                    // record and the manager role are taken again.
                    self.note(format!("metadata store unreachable for {dur:?}"));
                    self.net.set_out(true);
                    let end = Instant::now() + dur;
                    {
                        let mut c = self
                            .meta_calm_after
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        *c = (*c).max(end + LEASE_TTL + TAKEOVER_SLACK);
                    }
                    // A node troubled now, or down, is taken out only once the store answers.
                    let now = Instant::now();
                    for n in &self.nodes {
                        let troubled = {
                            let s = n.st();
                            s.down || s.calm_after.is_some_and(|t| t > now)
                        };
                        if troubled {
                            n.troubled_until(self.meta_settled(now));
                        }
                    }
                    let net = self.net.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(end).await;
                        net.set_out(false);
                    });
                    continue;
                }
                7 => {
                    // Another host attaches without --force while the writer holds its
                    // record: refused, and the writer is untouched.
                    if Instant::now() < self.meta_calm_after() {
                        continue;
                    }
                    let p = Arc::new(Proc::default());
                    let cfg = AttachConfig {
                        volume: VOLUME.into(),
                        force: false,
                        lease_ttl: LEASE_TTL,
                        opts: VolumeOptions::default(),
                    };
                    let r = trireme_daemon::attach::attach(self.meta_for(&p), &cfg, vec![]).await;
                    p.kill();
                    match r {
                        Err(DaemonError::Meta(MetaError::Attached { .. })) => {
                            self.note("a second host's attach is refused".into());
                        }
                        Err(e) => self.violate(format!("a second attach failed oddly: {e}")),
                        Ok(_) => self.violate(
                            "a second writer attached while the first held its record".into(),
                        ),
                    }
                    continue;
                }
                8 => {
                    // The process holding the manager role dies (while another can take
                    // over); a new candidate starts later.
                    let holder = {
                        let m = self.managers();
                        let live = m.candidates.iter().filter(|c| !c.proc_.dead()).count();
                        m.candidates
                            .iter()
                            .find(|c| !c.proc_.dead() && c.current.borrow().is_some())
                            .filter(|_| live > 1)
                            .map(|c| (c.id, c.proc_.clone()))
                    };
                    let Some((cid, p)) = holder else { continue };
                    self.note(format!("manager (candidate {cid}) crashes"));
                    p.kill();
                    self.role_changed();
                    let me = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(dur).await;
                        me.spawn_candidate();
                    });
                    continue;
                }
                9 => {
                    self.drain(&v, pick).await;
                    continue;
                }
                _ => {}
            }
            let id = self.nodes[pick].id;
            let others = self
                .healthy_in_sync(&v)
                .into_iter()
                .filter(|&n| n != id)
                .count();
            if others == 0 {
                continue;
            }
            let n = self.node(id).clone();
            match kind {
                0 | 1 => {
                    let lose = kind == 1;
                    let power = !lose && rand(&self.rng).chance(0.5);
                    let disk = {
                        let mut s = n.st();
                        if s.down {
                            continue;
                        }
                        s.down = true;
                        s.lose_on_restart = Some(lose);
                        s.store.clone()
                    };
                    if power {
                        // Nothing is applied after `down`, so the cache is final now.
                        let rng = self.rng.clone();
                        let lost = disk
                            .lose_power(&mut |n| rand(&rng).below(n), self.cfg.sabotage_power_loss);
                        self.note(format!(
                            "node {id} loses power ({lost} sectors lose their last write)"
                        ));
                    } else {
                        self.note(format!(
                            "node {id} crashes ({})",
                            if lose { "data lost" } else { "data kept" }
                        ));
                    }
                    let me = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(dur).await;
                        me.restart(id);
                    });
                    // Long enough down for the manager's heartbeats to have missed it.
                    let look = DOWN_AFTER + HEARTBEAT_EVERY * 2;
                    if dur > look + Duration::from_millis(300) {
                        let (me, at, generation) =
                            (self.clone(), Instant::now(), n.st().generation);
                        tokio::spawn(async move {
                            tokio::time::sleep(look).await;
                            me.check_seen_down(id, at, generation).await;
                        });
                    }
                }
                2 => {
                    self.note(format!("node {id} freezes for {dur:?}"));
                    n.st().frozen_until = Some(Instant::now() + dur);
                    n.troubled_until(self.meta_settled(Instant::now() + dur));
                }
                3 => {
                    self.note(format!("node {id} partitioned for {dur:?}"));
                    n.st().partitioned = true;
                    n.troubled_until(self.meta_settled(Instant::now() + dur));
                    tokio::spawn(async move {
                        tokio::time::sleep(dur).await;
                        n.st().partitioned = false;
                    });
                }
                _ => {
                    // A short blip: freeze for less than the replica timeout.
                    let d = Duration::from_millis(dur.as_millis() as u64 % 900);
                    self.note(format!("node {id} stalls for {d:?}"));
                    n.st().frozen_until = Some(Instant::now() + d);
                    n.troubled_until(self.meta_settled(Instant::now() + d));
                }
            }
            let violation = self.model().violation.clone();
            if let Some(v) = violation {
                return FaultsEnd::Violated(v);
            }
        }
        FaultsEnd::Done
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
            let r = rt.block_on(async {
                tokio::time::timeout(virtual_bound, run_async(run_cfg, run_log)).await
            });
            let _ = tx.send(r);
        })
        .map_err(SimFailure::Runtime)?;
    let stuck = |what: String| SimFailure::Guarantee {
        seed: cfg.seed,
        what,
        events: log.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    };
    match rx.recv_timeout(MAX_REAL) {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(stuck(format!(
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
        .find(|&n| rec.replicas.iter().any(|r| r.node == n))
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
