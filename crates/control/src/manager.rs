//! The cluster manager: the one writer of the metadata store.

use crate::error::{refused, ManagerError};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
// tokio's clock: the real one in production, virtual in the simulator (heartbeats and
// liveness then follow simulated time).
use tokio::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use trireme_client::{AttachInfo, ReplicaTarget};
use trireme_meta::{ClusterMeta, MetaError, NodeRecord, NodeState, TierPolicy, VolumeRecord};
use trireme_proto::{Header, Op, Status};
use trireme_replication::{place, NodeLoad, TransitionError};
use trireme_transport::{Peer, TransportKind};

use crate::api::{
    LinkStatus, NodeStatus, ReplicaStatus, ReplicaStatusState, Reply, Request, StatusReport,
    VolumeStatus, MAX_LINE,
};

/// How long the manager waits for a node on the control path.
const NODE_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest volume accepted (1 PiB, the replica format's limit).
const MAX_VOLUME: u64 = 1 << 50;

/// The cluster manager. Cheap to share (`Arc`); every method is safe to call concurrently.
#[derive(Debug)]
pub struct Manager {
    pub(crate) meta: ClusterMeta,
    /// Serialises volume creation and deletion (placement reads then writes the metadata).
    volume_lock: tokio::sync::Mutex<()>,
    /// Volume clients running in this process (the `up` NBD export), shown by `status`.
    pub(crate) clients: std::sync::Mutex<Vec<Arc<trireme_client::Volume>>>,
    /// When each node last answered a heartbeat.
    last_seen: std::sync::Mutex<std::collections::HashMap<u32, Instant>>,
    /// One link per node address, kept for the heartbeats and node operations (a new TCP and
    /// TLS handshake every half second per node would cost more than the ping).
    links: std::sync::Mutex<std::collections::HashMap<String, Link>>,
    /// How nodes are dialled; `None`: TCP to their address. The simulator plugs its in-memory
    /// network in here, so its heartbeats and node calls cross the same faults as the writer's.
    connector: std::sync::Mutex<Option<Arc<dyn trireme_client::Connector>>>,
    /// The process supervisor of `trireme up`, for `node stop` / `node start`.
    supervisor: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<NodeControl>>>,
    /// `node drain` / `node remove` jobs, the latest per node.
    pub(crate) moves: std::sync::Mutex<Vec<crate::moves::MoveStatus>>,
    /// Node daemons register a lease-bound key while they run (a cluster on etcd): a node
    /// without one is down at once, without waiting for pings to time out.
    leases: std::sync::atomic::AtomicBool,
    /// The node daemon this manager runs in (0: none, e.g. `trireme up`), and how it is asked
    /// to hand the role over (a planned restart of its own node).
    own_node: std::sync::atomic::AtomicU32,
    pub(crate) resign: tokio::sync::Notify,
    /// Planned restarts run one at a time.
    pub(crate) restart_lock: tokio::sync::Mutex<()>,
    /// The access list of a volume created without one: its creator's (see
    /// [`Manager::set_default_access`]).
    default_access: std::sync::Mutex<Vec<String>>,
}

/// A planned node operation for the process supervisor, with where to send its outcome.
#[derive(Debug)]
pub enum NodeControl {
    Stop(u32, tokio::sync::oneshot::Sender<Result<String>>),
    Start(u32, tokio::sync::oneshot::Sender<Result<String>>),
    /// Whether a process of the node runs (a stopped one may take a moment to exit).
    Running(u32, tokio::sync::oneshot::Sender<bool>),
}

pub(crate) type Result<T> = std::result::Result<T, ManagerError>;

type Link = Arc<dyn trireme_transport::Connection>;

impl Manager {
    /// Sets the access list a volume gets when it is created without one: its creator's,
    /// least privilege. `trireme up` gives its own client credentials (`local`), a cluster
    /// on etcd none (clients are named with `--allow`, `*` for all), a cluster without TLS
    /// every client (it has no identities to tell apart). Until set: every client.
    pub fn set_default_access(&self, access: Vec<String>) {
        *self
            .default_access
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = access;
    }

    pub fn new(meta: ClusterMeta) -> Manager {
        Manager {
            meta,
            volume_lock: tokio::sync::Mutex::new(()),
            clients: std::sync::Mutex::default(),
            last_seen: std::sync::Mutex::default(),
            links: std::sync::Mutex::default(),
            connector: std::sync::Mutex::default(),
            supervisor: std::sync::Mutex::default(),
            moves: std::sync::Mutex::default(),
            leases: std::sync::atomic::AtomicBool::new(false),
            own_node: std::sync::atomic::AtomicU32::new(0),
            resign: tokio::sync::Notify::new(),
            restart_lock: tokio::sync::Mutex::new(()),
            default_access: std::sync::Mutex::new(trireme_meta::any_client()),
        }
    }

    /// Dials nodes through `c` instead of TCP (see the field's doc).
    pub fn set_connector(&self, c: Arc<dyn trireme_client::Connector>) {
        *self.connector.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// Takes node liveness from the daemons' lease-bound keys (see the field's doc).
    pub fn set_liveness_from_leases(&self, on: bool) {
        self.leases.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Names the node daemon this manager runs in (see [`Manager::resigned`]).
    pub fn set_own_node(&self, id: u32) {
        self.own_node
            .store(id, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn own_node(&self) -> u32 {
        self.own_node.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Completes when this manager was asked to hand its role to another daemon (its own node
    /// is to restart): the role's holder then gives it up.
    pub async fn resigned(&self) {
        self.resign.notified().await
    }

    /// A planned restart of the node this manager runs in is run by the next manager: this
    /// one hands the role over (see [`Manager::resigned`]).
    fn hands_over_for(&self, req: &Request) -> bool {
        let own = self.own_node();
        let yes = own != 0 && matches!(req, Request::NodeRestart { id } if *id == own);
        if yes {
            tracing::info!(
                node = own,
                "planned restart of this manager's node: handing the role over"
            );
            self.resign.notify_one();
        }
        yes
    }

    /// Whether node liveness comes from leases (a cluster on etcd).
    pub(crate) fn leases_on(&self) -> bool {
        self.leases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The nodes whose daemon holds its lease, if liveness comes from leases.
    async fn registered(
        &self,
    ) -> Option<std::collections::BTreeMap<u32, trireme_meta::AliveRecord>> {
        if !self.leases.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        match self.meta.alive().await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!("reading node liveness: {e}");
                None
            }
        }
    }

    /// Lets `node stop` / `node start` reach the process supervisor.
    pub fn set_supervisor(&self, tx: tokio::sync::mpsc::UnboundedSender<NodeControl>) {
        *self.supervisor.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    }

    /// Stops a node's process for good (a removed node), if the supervisor runs it.
    pub(crate) async fn stop_node_process(&self, id: u32) -> Result<String> {
        self.node_control(false, id).await
    }

    pub(crate) async fn node_control(&self, start: bool, id: u32) -> Result<String> {
        if start && self.node(id).await?.state == NodeState::Removed {
            return Err(refused(format!("node {id} was removed from the cluster")));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cmd = if start {
            NodeControl::Start(id, tx)
        } else {
            NodeControl::Stop(id, tx)
        };
        let sent = self
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.send(cmd).is_ok());
        if sent != Some(true) {
            return Err(refused(
                "this cluster has no process supervisor (nodes run on their own)",
            ));
        }
        rx.await.map_err(|_| ManagerError::SupervisorStopped)?
    }

    pub(crate) async fn node_running(&self, id: u32) -> Result<bool> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = self
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.send(NodeControl::Running(id, tx)).is_ok());
        if sent != Some(true) {
            return Err(refused(
                "this cluster has no process supervisor (nodes run on their own)",
            ));
        }
        rx.await.map_err(|_| ManagerError::SupervisorStopped)
    }

    /// Pings every node every `every`; a node silent for `down_after` is declared down (logged
    /// once, and shown by `status`), and declared up again when it answers.
    pub fn start_heartbeats(self: &Arc<Self>, every: Duration, down_after: Duration) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut down: std::collections::HashSet<u32> = Default::default();
            loop {
                tokio::time::sleep(every).await;
                let Some(m) = me.upgrade() else { return };
                let Ok(nodes) = m.member_nodes().await else {
                    continue;
                };
                for n in nodes {
                    let ok = m
                        .node_call_within(&n, Header::request(Op::Ping, 0), down_after)
                        .await
                        .is_ok();
                    let now = Instant::now();
                    let seen = {
                        let mut ls = m.last_seen.lock().unwrap_or_else(|e| e.into_inner());
                        if ok {
                            ls.insert(n.id, now);
                        }
                        ls.get(&n.id).copied()
                    };
                    let silent = seen.is_none_or(|t| now - t >= down_after);
                    if silent && down.insert(n.id) {
                        tracing::warn!(
                            node = n.id,
                            "node declared down: no heartbeat for {down_after:?}"
                        );
                    } else if ok && down.remove(&n.id) {
                        tracing::info!(node = n.id, "node answers heartbeats again");
                    }
                }
            }
        });
    }

    fn last_seen_ms(&self, node: u32) -> Option<u64> {
        self.last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&node)
            .map(|t| t.elapsed().as_millis() as u64)
    }

    /// The writer of `volume` attached in this process, if any.
    pub(crate) fn writer(&self, volume: &str) -> Option<Arc<trireme_client::Volume>> {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients
            .iter()
            .rev()
            .find(|c| c.info().name == volume)
            .cloned()
    }

    /// Live replica views of a writer attached in this process, if any.
    fn writer_views(&self, volume: &str) -> Option<Vec<trireme_client::ReplicaView>> {
        self.writer(volume).map(|c| c.replica_views())
    }

    pub(crate) fn unregister_client(&self, v: &Arc<trireme_client::Volume>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| !Arc::ptr_eq(c, v));
    }

    /// Lets `status` report the links of a volume client running in this process.
    pub fn register_client(&self, v: Arc<trireme_client::Volume>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(v);
    }

    fn client_links(&self, volume: &str) -> Vec<LinkStatus> {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for c in clients.iter().filter(|c| c.info().name == volume) {
            for (node, link) in c.connections() {
                if let Some(l) = link {
                    out.push(LinkStatus {
                        node,
                        transport: l.transport,
                        peer: l.peer,
                        streams: l.streams,
                        lanes: l.lanes,
                        fallback: l.fallback,
                    });
                }
            }
        }
        out
    }

    pub fn meta(&self) -> &ClusterMeta {
        &self.meta
    }

    pub(crate) async fn node_call(
        &self,
        node: &NodeRecord,
        h: Header,
    ) -> Result<trireme_transport::Frame> {
        self.node_call_within(node, h, NODE_TIMEOUT).await
    }

    async fn node_call_within(
        &self,
        node: &NodeRecord,
        h: Header,
        limit: Duration,
    ) -> Result<trireme_transport::Frame> {
        let fut = async {
            let cached = {
                let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
                links.get(&node.addr).filter(|c| !c.is_closed()).cloned()
            };
            let c = match cached {
                Some(c) => c,
                None => {
                    let dialer = self
                        .connector
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    let c = match dialer {
                        Some(d) => {
                            let target = trireme_client::ReplicaTarget {
                                node: node.id,
                                addr: node.addr.clone(),
                                local_addr: None,
                                state: trireme_replication::ReplicaState::InSync,
                                incarnation: 0,
                            };
                            d.connect(&target).await.map_err(|e| e.to_string())?
                        }
                        None => trireme_transport::connect(TransportKind::Tcp, &node.addr, 1)
                            .await
                            .map_err(|e| e.to_string())?,
                    };
                    self.links
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(node.addr.clone(), c.clone());
                    c
                }
            };
            let r = c.call(h, Bytes::new()).await.map_err(|e| e.to_string());
            if r.is_err() {
                self.forget_link(&node.addr, &c);
            }
            r
        };
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| {
                // A node that does not answer may be frozen: the next call starts afresh.
                // (The lock is released before `forget_link` takes it again: a guard in an
                // `if let` scrutinee would live through the block, and deadlock.)
                let stale = self
                    .links
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&node.addr)
                    .cloned();
                if let Some(c) = stale {
                    self.forget_link(&node.addr, &c);
                }
                ManagerError::Node {
                    node: node.id,
                    what: format!("at {} did not answer in {limit:?}", node.addr),
                }
            })?
            .map_err(|what| ManagerError::Node {
                node: node.id,
                what,
            })
    }

    /// A volume's record, with who is attached to it.
    async fn volume_info(&self, name: &str) -> Result<crate::api::VolumeInfo> {
        let record = self.meta.volume(name).await?;
        let mut tiers = Vec::new();
        for r in &record.replicas {
            let Ok(n) = self.node(r.node).await else {
                continue;
            };
            if let Some(t) = self.tier_info(&n, record.id).await.and_then(|t| t.replica) {
                tiers.push(crate::api::ReplicaTierStatus::new(n.id, t));
            }
        }
        Ok(crate::api::VolumeInfo {
            tiers,
            writer: self.writer_text(name).await,
            client_links: self.client_links(name),
            record,
        })
    }

    /// Who writes `volume`, from its attach record (a cluster on etcd): process, host,
    /// identity, epoch and where it serves the volume.
    async fn writer_text(&self, volume: &str) -> Option<String> {
        let (a, _) = self.meta.attachment(volume).await.ok()??;
        Some(format!(
            "pid {} on {}{} (epoch {}){}",
            a.pid,
            a.host,
            a.identity
                .as_ref()
                .map_or_else(String::new, |i| format!(" as {i}")),
            a.epoch,
            if a.exports.is_empty() {
                String::new()
            } else {
                format!(": {}", a.exports.join(" "))
            }
        ))
    }

    /// A node's tiers and its replica of `volume`'s (`None`: no tiers, or no answer).
    async fn tier_info(&self, node: &NodeRecord, volume: u64) -> Option<trireme_proto::TierReport> {
        let h = Header {
            volume,
            ..Header::request(Op::TierInfo, 0)
        };
        match self.node_call(node, h).await {
            Ok(f) if f.header.status == Status::Ok => {
                match trireme_proto::TierReport::decode(&f.payload) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        tracing::warn!(node = node.id, "a tier report that does not decode: {e}");
                        None
                    }
                }
            }
            _ => None,
        }
    }

    fn forget_link(&self, addr: &str, c: &Link) {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if links.get(addr).is_some_and(|k| Arc::ptr_eq(k, c)) {
            links.remove(addr);
        }
    }

    pub(crate) async fn node(&self, id: u32) -> Result<NodeRecord> {
        self.meta
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.id == id)
            .ok_or_else(|| refused(format!("node {id} is not registered")))
    }

    pub(crate) async fn replica_op(
        &self,
        node: &NodeRecord,
        op: Op,
        v: &VolumeRecord,
    ) -> Result<Status> {
        let h = Header {
            volume: v.id,
            length: v.size,
            ..Header::request(op, 0)
        };
        let f = self.node_call(node, h).await?;
        Ok(f.header.status)
    }

    /// Pins the volume's replica on `node` to the volume's tier. A volume left to heat on a
    /// node without tiers is nothing to do; a pin there is refused with the node's reason.
    pub(crate) async fn apply_tier(
        &self,
        node: &NodeRecord,
        v: &VolumeRecord,
    ) -> std::result::Result<(), String> {
        let h = Header {
            volume: v.id,
            offset: v.tier.code(),
            ..Header::request(Op::TierSet, 0)
        };
        match self.node_call(node, h).await {
            Ok(f) if f.header.status == Status::Ok => Ok(()),
            Ok(f) if f.header.status == Status::Unsupported && v.tier.is_auto() => Ok(()),
            Ok(f) => Err(format!(
                "node {}: {}: {}",
                node.id,
                f.header.status.as_str(),
                String::from_utf8_lossy(&f.payload)
            )),
            Err(e) => Err(format!("node {}: {e}", node.id)),
        }
    }

    /// A new replica of a pinned volume takes the pin; if its node cannot (a full fast tier,
    /// no tiers), the copy stays where heat puts it and the operator is told.
    pub(crate) async fn pin_new_replica(&self, node: &NodeRecord, v: &VolumeRecord) {
        if v.tier.is_auto() {
            return;
        }
        if let Err(why) = self.apply_tier(node, v).await {
            tracing::warn!(volume = %v.name, node = node.id, tier = v.tier.as_str(), "the new replica is not on its volume's tier: {why}");
        }
    }

    /// Puts a volume's extents on a tier (`fast`, `slow`) or lets heat place them (`auto`),
    /// on every node holding a replica. A pin that one node refuses (its fast tier cannot hold
    /// the volume) is undone on the others and the record keeps the old setting.
    pub async fn set_tier(&self, name: &str, tier: TierPolicy) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let old = self.meta.volume(name).await?;
        let mut v = old.clone();
        v.tier = tier;
        let mut done = Vec::new();
        for r in &v.replicas {
            let node = self.node(r.node).await?;
            if let Err(why) = self.apply_tier(&node, &v).await {
                for n in &done {
                    if let Err(e) = self.apply_tier(n, &old).await {
                        tracing::warn!(volume = name, node = n.id, "undoing a tier pin: {e}");
                    }
                }
                return Err(refused(format!(
                    "volume {name:?} cannot be put on the {} tier: {why}",
                    tier.as_str()
                )));
            }
            done.push(node);
        }
        let v = self
            .meta
            .update_volume(name, &mut |rec| {
                rec.tier = tier;
                Ok(())
            })
            .await?;
        tracing::info!(volume = name, tier = tier.as_str(), "tier set");
        Ok(v)
    }

    pub async fn create_volume(
        &self,
        name: &str,
        size: u64,
        replicas: usize,
        access: Option<Vec<String>>,
    ) -> Result<VolumeRecord> {
        let access = access.unwrap_or_else(|| {
            self.default_access
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        });
        if size == 0 || !size.is_multiple_of(4096) || size > MAX_VOLUME {
            return Err(refused(format!(
                "volume size {size} must be a non-zero multiple of 4096 up to {MAX_VOLUME}"
            )));
        }
        let _g = self.volume_lock.lock().await;
        let nodes = self.meta.nodes().await?;
        let vols = self.meta.volumes().await?;
        // On etcd, only nodes whose daemon runs now (holds its lease) take new replicas.
        let alive = self.registered().await;
        let loads: Vec<NodeLoad> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Active)
            .filter(|n| alive.as_ref().is_none_or(|a| a.contains_key(&n.id)))
            .map(|n| NodeLoad {
                node: n.id,
                replicas: vols
                    .iter()
                    .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                    .count(),
                zone: n.zone.clone(),
            })
            .collect();
        let chosen = place(&loads, replicas)?;
        let v = self
            .meta
            .create_volume_for(name, size, &chosen, &access)
            .await?;
        let mut created = Vec::new();
        for &id in &chosen {
            let node = self.node(id).await?;
            match self.replica_op(&node, Op::CreateReplica, &v).await {
                Ok(Status::Ok) => created.push(node),
                outcome => {
                    // Undo: a volume exists with all its replicas or not at all.
                    for n in &created {
                        let _ = self.replica_op(n, Op::DeleteReplica, &v).await;
                    }
                    let _ = self.meta.delete_volume(name).await;
                    let why = match outcome {
                        Ok(s) => s.as_str().to_string(),
                        Err(e) => e.to_string(),
                    };
                    return Err(refused(format!(
                        "creating the replica of {name:?} on node {id} failed: {why}"
                    )));
                }
            }
        }
        tracing::info!(volume = name, size, nodes = ?chosen, "volume created");
        Ok(v)
    }

    /// Adds `allow` to a volume's access list and takes `deny` off it. Nodes on etcd apply it
    /// within a second; links a denied client already has stay up until they close.
    pub async fn set_access(
        &self,
        name: &str,
        allow: &[String],
        deny: &[String],
    ) -> Result<VolumeRecord> {
        for a in allow.iter().chain(deny) {
            trireme_meta::check_access_entry(a)?;
        }
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                v.access.retain(|a| !deny.contains(a));
                for a in allow {
                    if !v.access.contains(a) {
                        v.access.push(a.clone());
                    }
                }
                Ok(())
            })
            .await?;
        tracing::info!(volume = name, access = ?v.access, "access list changed");
        Ok(v)
    }

    /// Sets the fewest in-sync copies the volume's writer goes on writing with. A writer in
    /// this process hears at once; one elsewhere when it next reads the layout (at least once
    /// a second while its writes wait).
    pub async fn set_min_copies(&self, name: &str, n: u32) -> Result<VolumeRecord> {
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                if n == 0 || n as usize > v.replicas.len() {
                    return Err(trireme_meta::MetaError::Refused(format!(
                        "min copies {n} must be from 1 to the volume's {} replicas",
                        v.replicas.len()
                    )));
                }
                v.min_copies = n;
                Ok(())
            })
            .await?;
        if let Some(w) = self.writer(name) {
            w.set_min_copies(n);
        }
        tracing::info!(volume = name, min_copies = n, "min copies changed");
        Ok(v)
    }

    pub async fn delete_volume(&self, name: &str) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let v = self.meta.volume(name).await?;
        for r in &v.replicas {
            let node = self.node(r.node).await?;
            match self.replica_op(&node, Op::DeleteReplica, &v).await? {
                Status::Ok | Status::NoReplica => {}
                s => {
                    return Err(refused(format!(
                        "deleting the replica on node {}: {}",
                        r.node,
                        s.as_str()
                    )))
                }
            }
        }
        self.meta
            .delete_volume(name)
            .await
            .map_err(ManagerError::from)
    }

    async fn attach_info(&self, v: &VolumeRecord) -> Result<AttachInfo> {
        attach_info(&self.meta, v).await
    }

    /// A new writer: bumps the epoch durably, then says where the replicas are, and whether the
    /// previous writer left without detaching (then the new one reconciles the replicas).
    pub async fn attach(&self, name: &str) -> Result<AttachInfo> {
        let mut unclean = false;
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                unclean = v.writer_open;
                v.epoch += 1;
                v.writer_open = true;
                Ok(())
            })
            .await?;
        let mut info = self.attach_info(&v).await?;
        info.reconcile = unclean;
        Ok(info)
    }

    /// Records a replica state for the writer of `epoch` (see `replication::transition`).
    pub async fn set_replica_state(
        &self,
        name: &str,
        epoch: u64,
        node: u32,
        state: trireme_replication::ReplicaState,
        incarnation: u64,
    ) -> Result<VolumeRecord> {
        record_replica_state(&self.meta, name, epoch, node, state, incarnation)
            .await
            .map_err(ManagerError::from)
    }

    /// The writer of `epoch` left cleanly. A stale epoch changes nothing.
    pub async fn detach(&self, name: &str, epoch: u64) -> Result<VolumeRecord> {
        record_detach(&self.meta, name, epoch)
            .await
            .map_err(ManagerError::from)
    }

    pub async fn locate(&self, name: &str) -> Result<AttachInfo> {
        let v = self.meta.volume(name).await?;
        self.attach_info(&v).await
    }

    async fn node_status(
        &self,
        n: &NodeRecord,
        vols: &[VolumeRecord],
        alive: Option<&std::collections::BTreeMap<u32, trireme_meta::AliveRecord>>,
    ) -> NodeStatus {
        let t0 = Instant::now();
        let registered = alive.map(|a| a.contains_key(&n.id));
        // A node whose lease expired is down at once; no ping to wait out.
        let ping = match registered {
            Some(false) => None,
            _ => self.node_call(n, Header::request(Op::Ping, 0)).await.ok(),
        };
        let up = ping.is_some();
        // Its reply carries the node's capacity (0 from a node that sets none).
        let capacity = ping.as_ref().map(|f| f.header.length).filter(|&c| c > 0);
        let tiers = match up {
            true => self.tier_info(n, 0).await.map(|t| t.node.into()),
            false => None,
        };
        NodeStatus {
            tiers,
            id: n.id,
            addr: n.addr.clone(),
            store: n.store.clone(),
            up,
            ping_us: up.then(|| t0.elapsed().as_micros() as u64),
            transport: "tcp".into(),
            state: n.state,
            replicas: vols
                .iter()
                .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                .count(),
            last_seen_ms: self.last_seen_ms(n.id),
            registered,
            zone: n.zone.clone(),
            capacity,
        }
    }

    /// Every node still in the cluster (not removed).
    async fn member_nodes(&self) -> Result<Vec<NodeRecord>> {
        Ok(self
            .meta
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.state != NodeState::Removed)
            .collect())
    }

    pub async fn status(&self) -> Result<StatusReport> {
        let nodes = self.member_nodes().await?;
        let vols = self.meta.volumes().await?;
        let alive = self.registered().await;
        let mut ns = Vec::new();
        for n in &nodes {
            ns.push(self.node_status(n, &vols, alive.as_ref()).await);
        }
        let tiered: Vec<u32> = ns
            .iter()
            .filter(|n| n.tiers.is_some())
            .map(|n| n.id)
            .collect();
        let mut vs = Vec::new();
        for v in &vols {
            let views = self.writer_views(&v.name);
            let mut reps = Vec::new();
            for r in &v.replicas {
                // The writer in this process knows better than the record (resyncing, progress).
                let live = views
                    .as_ref()
                    .and_then(|vs| vs.iter().find(|x| x.node == r.node));
                let mut st = ReplicaStatus {
                    node: r.node,
                    state: live.map_or(r.state, |l| l.state).into(),
                    allocated_bytes: None,
                    epoch: None,
                    resync: live.and_then(|l| l.resync.clone()),
                    tier: None,
                };
                let down = ns.iter().any(|x| x.id == r.node && !x.up);
                match nodes.iter().find(|n| n.id == r.node) {
                    None => st.state = ReplicaStatusState::Unreachable,
                    // Down (no lease, or no answer to the ping just now): not asked again.
                    Some(_) if down => st.state = ReplicaStatusState::Unreachable,
                    Some(n) => {
                        let h = Header {
                            volume: v.id,
                            ..Header::request(Op::ReplicaInfo, 0)
                        };
                        match self.node_call(n, h).await {
                            Ok(f) if f.header.status == Status::Ok => {
                                st.allocated_bytes = Some(f.header.offset);
                                st.epoch = Some(f.header.epoch);
                                if tiered.contains(&n.id) {
                                    st.tier = self
                                        .tier_info(n, v.id)
                                        .await
                                        .and_then(|t| t.replica)
                                        .map(|t| crate::api::ReplicaTierStatus::new(n.id, t));
                                }
                            }
                            Ok(f) if f.header.status == Status::NoReplica => {
                                st.state = ReplicaStatusState::Missing
                            }
                            _ => st.state = ReplicaStatusState::Unreachable,
                        }
                    }
                }
                reps.push(st);
            }
            vs.push(VolumeStatus {
                name: v.name.clone(),
                id: v.id,
                size: v.size,
                epoch: v.epoch,
                access: v.access.clone(),
                replicas: reps,
                client_links: self.client_links(&v.name),
                writer: self.writer_text(&v.name).await,
                min_copies: v.min_copies(),
                writes_suspended: self.writer(&v.name).is_some_and(|w| w.writes_suspended()),
                tier: v.tier,
                scrub: self.writer(&v.name).and_then(|w| w.scrub_progress()),
            });
        }
        Ok(StatusReport {
            nodes: ns,
            volumes: vs,
            moves: self.moves(),
            manager: self.meta.manager().await.ok().flatten().map(|(m, _)| m),
        })
    }

    /// After a restart: replicas on volatile stores come back empty, so they are re-created.
    /// A re-created replica whose volume still has data elsewhere is recorded as failed (it
    /// needs a full resync and must never serve a read before); if every replica came back
    /// empty, the volume simply starts empty, as a volatile store promises.
    /// A replica missing from a persistent store is reported, never silently re-created empty.
    /// Nodes that do not answer are skipped (they are handled when they come back).
    pub async fn ensure_replicas(&self) -> Result<()> {
        let nodes = self.member_nodes().await?;
        for v in self.meta.volumes().await? {
            let mut missing = Vec::new();
            let mut present = 0;
            for r in &v.replicas {
                let Some(n) = nodes.iter().find(|n| n.id == r.node) else {
                    continue;
                };
                let h = Header {
                    volume: v.id,
                    ..Header::request(Op::ReplicaInfo, 0)
                };
                match self.node_call(n, h).await {
                    Ok(f) if f.header.status == Status::NoReplica => missing.push(n.clone()),
                    Ok(_) => present += 1,
                    Err(e) => {
                        tracing::warn!(volume = %v.name, node = n.id, "cannot check replica: {e}")
                    }
                }
            }
            for n in missing {
                if !trireme_store_kind_is_volatile(&n.store) {
                    tracing::error!(volume = %v.name, node = n.id, "replica is missing from a persistent store; not re-creating it empty");
                    continue;
                }
                if present > 0 {
                    // Record first: a crash between the two leaves it failed, never falsely in sync.
                    self.meta
                        .update_volume(&v.name, &mut |rec| {
                            if let Some(r) = rec.replicas.iter_mut().find(|r| r.node == n.id) {
                                r.state = trireme_replication::ReplicaState::Failed;
                            }
                            Ok(())
                        })
                        .await?;
                    tracing::warn!(volume = %v.name, node = n.id, "replica lost with its volatile store; re-created empty and marked failed until resynced");
                }
                self.replica_op(&n, Op::CreateReplica, &v).await?;
                self.pin_new_replica(&n, &v).await;
            }
        }
        Ok(())
    }

    async fn handle(self: &Arc<Self>, req: Request) -> Result<serde_json::Value> {
        fn to<T: serde::Serialize>(v: Result<T>) -> Result<serde_json::Value> {
            v.map(|x| serde_json::to_value(x).expect("serializable"))
        }
        match req {
            Request::NodeList => {
                let vols = self.meta.volumes().await?;
                let mut out = Vec::new();
                let alive = self.registered().await;
                for n in self.meta.nodes().await? {
                    out.push(self.node_status(&n, &vols, alive.as_ref()).await);
                }
                to(Ok(out))
            }
            Request::VolumeCreate {
                name,
                size,
                replicas,
                access,
                min_copies,
                tier,
            } => to(async {
                let mut v = self.create_volume(&name, size, replicas, access).await?;
                if let Some(n) = min_copies {
                    v = self.set_min_copies(&name, n).await?;
                }
                if let Some(t) = tier.filter(|t| !t.is_auto()) {
                    // A volume is created on its tier or not at all.
                    if let Err(e) = self.set_tier(&name, t).await {
                        if let Err(d) = self.delete_volume(&name).await {
                            tracing::warn!(
                                volume = name,
                                "removing a volume whose tier was refused: {d}"
                            );
                        }
                        return Err(e);
                    }
                    v = self.meta.volume(&name).await?;
                }
                Ok(v)
            }
            .await),
            Request::VolumeSet {
                name,
                min_copies,
                tier,
            } => to(async {
                if min_copies.is_none() && tier.is_none() {
                    return Err(refused(
                        "volume set: nothing to change (give a minimum of copies or a tier)",
                    ));
                }
                if let Some(n) = min_copies {
                    self.set_min_copies(&name, n).await?;
                }
                if let Some(t) = tier {
                    self.set_tier(&name, t).await?;
                }
                Ok(self.meta.volume(&name).await?)
            }
            .await),
            Request::VolumeAccess { name, allow, deny } => {
                to(self.set_access(&name, &allow, &deny).await)
            }
            Request::VolumeList => to(self.meta.volumes().await.map_err(ManagerError::from)),
            Request::VolumeInfo { name } => to(self.volume_info(&name).await),
            Request::VolumeDelete { name } => to(self.delete_volume(&name).await),
            Request::CaRevoke { fingerprint, role } => to(async {
                let rec = trireme_meta::RevokedCert {
                    fingerprint: fingerprint.to_ascii_lowercase(),
                    role,
                    at: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                };
                self.meta.revoke(&rec).await?;
                tracing::warn!(
                    fingerprint = rec.fingerprint,
                    role = rec.role,
                    "certificate revoked"
                );
                Ok(rec)
            }
            .await),
            Request::CaRevoked => to(self.meta.revoked().await.map_err(Into::into)),
            Request::Attach { name } => to(self.attach(&name).await),
            Request::Locate { name } => to(self.locate(&name).await),
            Request::SetReplicaState {
                name,
                epoch,
                node,
                state,
                incarnation,
            } => to(self
                .set_replica_state(&name, epoch, node, state, incarnation)
                .await),
            Request::Detach { name, epoch } => to(self.detach(&name, epoch).await),
            Request::VolumeScrub { name, region } => {
                let v = self.writer(&name).ok_or_else(|| {
                    refused(format!("no writer of {name:?} runs in the cluster process; a scrub repairs through it"))
                })?;
                to(v.scrub(region).await.map_err(ManagerError::from))
            }
            Request::NodeStop { id } => to(self.node_control(false, id).await),
            Request::NodeStart { id } => to(self.node_control(true, id).await),
            Request::NodeRestart { id } => to(self.restart_node(id).await),
            Request::NodeUndrain { id } => to(self.undrain(id).await),
            Request::NodeDrain { id, rate } => to(self.start_move(id, false, rate).await),
            Request::NodeRemove { id, rate } => to(self.start_move(id, true, rate).await),
            Request::Status => to(self.status().await),
        }
    }
}

/// Where a volume's replicas are, for a writer (`reconcile` false: the caller decides).
pub async fn attach_info(meta: &ClusterMeta, v: &VolumeRecord) -> Result<AttachInfo> {
    let nodes = meta.nodes().await?;
    let mut replicas = Vec::new();
    for r in &v.replicas {
        let n = nodes
            .iter()
            .find(|n| n.id == r.node)
            .ok_or_else(|| refused(format!("node {} is not registered", r.node)))?;
        replicas.push(ReplicaTarget {
            node: n.id,
            addr: n.addr.clone(),
            local_addr: n.local_addr.clone(),
            state: r.state,
            incarnation: r.incarnation,
        });
    }
    Ok(AttachInfo {
        name: v.name.clone(),
        id: v.id,
        size: v.size,
        epoch: v.epoch,
        replicas,
        reconcile: false,
        min_copies: v.min_copies(),
    })
}

/// Records a replica state for the writer of `epoch` (see `replication::transition`): what
/// the manager does for a writer in its process, and a writer on another host does itself.
pub async fn record_replica_state(
    meta: &ClusterMeta,
    name: &str,
    epoch: u64,
    node: u32,
    state: trireme_replication::ReplicaState,
    incarnation: u64,
) -> std::result::Result<VolumeRecord, trireme_meta::MetaError> {
    let v = meta
        .update_volume(name, &mut |v| {
            let states: Vec<(u32, trireme_replication::ReplicaState)> =
                v.replicas.iter().map(|r| (r.node, r.state)).collect();
            let i = trireme_replication::transition(&states, v.epoch, epoch, node, state)?;
            v.replicas[i].state = state;
            if state == trireme_replication::ReplicaState::InSync && incarnation != 0 {
                v.replicas[i].incarnation = incarnation;
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = name, node, %state, epoch, "replica state recorded");
    Ok(v)
}

/// The writer of `epoch` left cleanly: the next one need not reconcile. A stale epoch changes
/// nothing.
pub async fn record_detach(
    meta: &ClusterMeta,
    name: &str,
    epoch: u64,
) -> std::result::Result<VolumeRecord, trireme_meta::MetaError> {
    meta.update_volume(name, &mut |v| {
        if v.epoch == epoch {
            v.writer_open = false;
        }
        Ok(())
    })
    .await
}

/// True if a node's store keeps nothing across a restart (the node's record names its kind;
/// the names are `trireme_store::StoreKind`'s).
fn trireme_store_kind_is_volatile(store: &str) -> bool {
    !matches!(store, "file" | "tiered")
}

/// How many control connections a process admits (unix and TCP together), of which TLS
/// handshakes in progress, few per source address.
pub const CONTROL_LIMITS: trireme_net::Limits = trireme_net::Limits {
    established: 256,
    handshakes: 64,
    handshakes_per_source: 8,
};

/// A control connection that moves no byte either way for this long is closed: between
/// requests, or halfway through one. A request the manager takes long to answer (a restart)
/// is not held to it: nothing is read then.
pub const CONTROL_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a new same-host control connection may take to start its first request.
pub const FIRST_REQUEST: std::time::Duration = std::time::Duration::from_secs(10);

/// The process's admission to its control listeners.
pub fn control_gate() -> &'static Arc<trireme_net::Gate> {
    static G: std::sync::OnceLock<Arc<trireme_net::Gate>> = std::sync::OnceLock::new();
    G.get_or_init(|| trireme_net::Gate::new("control", CONTROL_LIMITS))
}

/// Refused control connections: one log line a second at most.
pub static REFUSED: trireme_net::Throttles = trireme_net::Throttles::per_second();

/// Serves the control API on a unix socket at `path`, for good: a failed accept is retried
/// (see `trireme_net::accept`).
pub async fn serve(path: &Path, manager: Arc<Manager>) -> std::io::Result<()> {
    let listener = trireme_tls::local::bind_private(path)?;
    loop {
        let (sock, _) = trireme_net::accept("control (unix)", || listener.accept()).await;
        if let Err(why) = trireme_tls::local::check_peer(&sock) {
            trireme_net::warn_throttled_by!(
                REFUSED,
                &why.to_string(),
                "refused a control connection: {why}"
            );
            continue;
        }
        // It holds a handshake's place (evictable) until its first request starts.
        let Some(handshake) = control_gate().handshake(None) else {
            continue;
        };
        let m = manager.clone();
        tokio::spawn(async move {
            let spoke = handshake
                .run(tokio::time::timeout(
                    FIRST_REQUEST,
                    trireme_net::io::first_bytes(&sock),
                ))
                .await;
            if !matches!(spoke, Some(Ok(Ok(())))) {
                return;
            }
            let Some(place) = control_gate().establish(handshake) else {
                return;
            };
            let sock = trireme_net::Guarded::new(sock, CONTROL_IDLE, Some(place));
            serve_conn(sock, m, Peer::Trusted).await
        });
    }
}

/// Refuses a request `peer` may not make: a client's certificate reads the cluster's state
/// only; nodes, operators (`admin`) and trusted links may do everything.
fn authorize(peer: &Peer, req: &Request) -> Result<()> {
    if peer.is_cluster() {
        return Ok(());
    }
    let read_only = matches!(
        req,
        Request::NodeList
            | Request::VolumeList
            | Request::VolumeInfo { .. }
            | Request::Locate { .. }
            | Request::Status
    );
    match peer {
        Peer::Cert(r) if read_only && matches!(**r, trireme_tls::Role::Client(_)) => Ok(()),
        _ => {
            let cmd = serde_json::to_value(req)
                .ok()
                .and_then(|v| v.get("cmd").and_then(|c| c.as_str()).map(String::from))
                .unwrap_or_default();
            trireme_net::warn_throttled_by!(
                REFUSED,
                &cmd,
                %peer,
                cmd,
                "refused a control request: only operators and nodes may"
            );
            Err(refused(format!(
                "{peer} may not {cmd}: only an operator (`trireme ca issue admin`) or a node may"
            )))
        }
    }
}

/// One control connection: a request line in, a reply line out, until it closes. `peer` is
/// who is on the other end (see [`authorize`]).
pub async fn serve_conn<S: crate::api::ControlStream>(sock: S, m: Arc<Manager>, peer: Peer) {
    let mut s = BufReader::new(sock);
    loop {
        let mut buf = Vec::new();
        let n = match (&mut s).take(MAX_LINE).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let reply = if n as u64 >= MAX_LINE && buf.last() != Some(&b'\n') {
            let r = Reply::Error(format!("request line over {MAX_LINE} bytes"));
            let _ = write_reply(&mut s, &r).await;
            return;
        } else {
            match serde_json::from_slice::<Request>(&buf) {
                Ok(req) => match authorize(&peer, &req) {
                    Err(e) => Reply::Error(e.to_string()),
                    Ok(()) if m.hands_over_for(&req) => Reply::Elsewhere(format!(
                        "node {} holds the manager role: it hands the role to another daemon, which runs the restart",
                        m.own_node()
                    )),
                    Ok(()) => match m.handle(req).await {
                        Ok(v) => Reply::Ok(v),
                        Err(e) => error_reply(e),
                    },
                },
                Err(e) => Reply::Error(format!("bad request: {e}")),
            }
        };
        if write_reply(&mut s, &reply).await.is_err() {
            return;
        }
    }
}

/// A failed request's reply: the message, and for a replica not on record its own variant.
pub(crate) fn error_reply(e: ManagerError) -> Reply {
    match e {
        ManagerError::Meta(MetaError::Transition(TransitionError::NoSuchReplica(node))) => {
            Reply::NotOnRecord {
                node,
                message: e.to_string(),
            }
        }
        e => Reply::Error(e.to_string()),
    }
}

async fn write_reply<S: crate::api::ControlStream>(
    s: &mut BufReader<S>,
    r: &Reply,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("replies serialize");
    line.push(b'\n');
    s.get_mut().write_all(&line).await
}
