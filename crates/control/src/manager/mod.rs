//! The cluster manager: the one writer of the metadata store.
//!
//! Here: the manager's state, writers registered in this process, and the dispatch of API
//! requests. Its calls to nodes are in `links.rs`, volumes' lifecycle in `volumes.rs`, what
//! it reports in `status.rs`, what every writer records in `records.rs`, the control
//! listener in `serve.rs`.

mod capacity;
mod clones;
mod compact;
pub(crate) mod fence;
mod links;
mod lost;
mod own_writer;
mod policies;
mod records;
mod resize;
mod scrubs;
mod serve;
mod settings;
mod snapshots;
mod status;
mod trash;
mod volumes;
mod writers;

pub(crate) use own_writer::OwnWriter;
pub use policies::{PolicyInfo, PolicyMember};
pub use records::{attach_info, record_detach, record_replica_state, record_size};
pub use scrubs::ScrubSchedule;
#[cfg(test)]
pub(crate) use serve::error_reply;
pub use serve::{control_gate, serve, serve_conn, CONTROL_IDLE, CONTROL_LIMITS, REFUSED};
pub use snapshots::SnapshotInfo;

use crate::error::{refused, ManagerError};
use std::sync::Arc;
use std::time::Duration;
// tokio's clock: the real one in production, virtual in the simulator (heartbeats and
// liveness then follow simulated time).
use tokio::time::Instant;

use trireme_meta::{ClusterMeta, NodeState};
use trireme_proto::{Header, Op};

use crate::api::{LinkStatus, Request, Warned};
use settings::Settings;

/// How long the manager waits for a node on the control path.
const NODE_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest volume accepted (1 PiB, the replica format's limit).
const MAX_VOLUME: u64 = 1 << 50;

/// What [`Manager::on_access_change`] calls.
struct AccessHook(Box<AccessFn>);

type AccessFn = dyn Fn(&[trireme_meta::VolumeRecord]) + Send + Sync;

impl std::fmt::Debug for AccessHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessHook")
    }
}

/// The cluster manager. Cheap to share (`Arc`); every method is safe to call concurrently.
#[derive(Debug)]
pub struct Manager {
    pub(crate) meta: ClusterMeta,
    /// Serialises volume creation and deletion (placement reads then writes the metadata).
    volume_lock: tokio::sync::Mutex<()>,
    /// Volume clients running in this process (the `up` NBD export), shown by `status`.
    pub(crate) clients: std::sync::Mutex<Vec<Arc<trireme_client::Volume>>>,
    /// Told every volume's record after an access list changed, before the change is
    /// answered: `up`'s NBD server takes it at once ([`Manager::on_access_change`]).
    access_hook: std::sync::Mutex<Option<AccessHook>>,
    /// What each writer that attached through the control socket said of itself, by volume,
    /// with the epoch it took (`status` shows who writes a volume `trireme nbd` serves).
    local_writers:
        std::sync::Mutex<std::collections::HashMap<String, (u64, crate::api::WriterHello)>>,
    /// When the manager last wrote each volume's report for a client writer
    /// ([`crate::api::REPORT_EVERY`]).
    pub(crate) reported: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
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
    pub(crate) own_node: std::sync::atomic::AtomicU32,
    pub(crate) resign: tokio::sync::Notify,
    /// Planned restarts run one at a time.
    pub(crate) restart_lock: tokio::sync::Mutex<()>,
    /// The volumes whose writer on another host a job is asking something (`asks.rs`).
    pub(crate) asks: crate::asks::WriterAsks,
    /// The access list of a volume created without one: its creator's (see
    /// [`Manager::set_default_access`]).
    default_access: std::sync::Mutex<Vec<String>>,
    /// The scrub schedule's interval, once started.
    scrub_every: std::sync::Mutex<Option<Duration>>,
    /// Snapshot deletes a node missed (volume, snapshot), finished by
    /// [`Manager::start_finishing_deletes`].
    pub(crate) missed_deletes: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// What writers beside `up` said they did (`Request::WriterUsage`), by volume.
    pub(crate) usage: std::sync::Mutex<std::collections::HashMap<String, policies::Usage>>,
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
            access_hook: std::sync::Mutex::default(),
            local_writers: std::sync::Mutex::default(),
            reported: std::sync::Mutex::default(),
            last_seen: std::sync::Mutex::default(),
            links: std::sync::Mutex::default(),
            connector: std::sync::Mutex::default(),
            supervisor: std::sync::Mutex::default(),
            moves: std::sync::Mutex::default(),
            leases: std::sync::atomic::AtomicBool::new(false),
            own_node: std::sync::atomic::AtomicU32::new(0),
            resign: tokio::sync::Notify::new(),
            restart_lock: tokio::sync::Mutex::new(()),
            asks: Default::default(),
            default_access: std::sync::Mutex::new(trireme_meta::any_client()),
            scrub_every: std::sync::Mutex::new(None),
            missed_deletes: std::sync::Mutex::default(),
            usage: std::sync::Mutex::default(),
        }
    }

    /// Dials nodes through `c` instead of TCP (see the field's doc).
    pub fn set_connector(&self, c: Arc<dyn trireme_client::Connector>) {
        *self.connector.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// How this manager dials nodes, if not through the transports (see the field's doc): a
    /// writer it attaches itself dials the same way.
    pub(crate) fn connector(&self) -> Option<Arc<dyn trireme_client::Connector>> {
        self.connector
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    /// Stops reporting `v` (a writer this process let go of).
    pub fn unregister_client(&self, v: &Arc<trireme_client::Volume>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| !Arc::ptr_eq(c, v));
    }

    /// Lets `status` report the links of a volume client running in this process.
    /// `f` is told every volume's record after each access change, before the change is
    /// answered (an NBD server in this process gates its TLS clients with it).
    pub fn on_access_change(
        &self,
        f: impl Fn(&[trireme_meta::VolumeRecord]) + Send + Sync + 'static,
    ) {
        *self.access_hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(AccessHook(Box::new(f)));
    }

    pub(crate) async fn access_changed(&self) {
        if self
            .access_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return;
        }
        match self.meta.volumes().await {
            Ok(vs) => {
                if let Some(f) = &*self.access_hook.lock().unwrap_or_else(|e| e.into_inner()) {
                    (f.0)(&vs);
                }
            }
            Err(e) => tracing::warn!("access lists changed, but reading them back: {e}"),
        }
    }

    /// Records event `text` of `kind` in the cluster's list (`trireme events`, the dashboard)
    /// for what an operation did that no status shows: a snapshot, a rollback, the trash.
    /// A failure is logged: the operation is done either way.
    pub(crate) async fn event(&self, kind: &str, text: String) {
        let ev = trireme_meta::ClusterEvent::new(crate::events::now_ms(), kind, text);
        if let Err(e) = self.meta.append_events(&[ev]).await {
            tracing::debug!("recording an event: {e}");
        }
    }

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
                        reported: false,
                    });
                }
            }
        }
        out
    }

    pub fn meta(&self) -> &ClusterMeta {
        &self.meta
    }

    async fn handle(
        self: &Arc<Self>,
        req: Request,
        peer: &trireme_transport::Peer,
    ) -> Result<serde_json::Value> {
        fn to<T: serde::Serialize>(v: Result<T>) -> Result<serde_json::Value> {
            v.map(|x| serde_json::to_value(x).expect("serializable"))
        }
        match req {
            Request::NodeList => {
                let vols = self.meta.volumes().await?;
                let mut out = Vec::new();
                let alive = self.registered().await;
                let nodes = self.meta.nodes().await?;
                let reserves = crate::reserves::node_reserves(&nodes, &vols);
                for n in &nodes {
                    out.push(self.node_status(n, &vols, alive.as_ref(), &reserves).await);
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
                preallocate,
                layout,
                limits,
                qos_policy,
            } => to(async {
                let layout = layout.unwrap_or_default();
                self.create_volume_as(&name, size, replicas, access, preallocate, layout)
                    .await?;
                let s = Settings {
                    min_copies,
                    tier,
                    limits,
                    qos_policy,
                };
                let v = self.settle_new(&name, &s).await?;
                Ok(Warned::new(v, self.settings_warnings(&name, &s).await))
            }
            .await),
            Request::VolumeSet {
                name,
                min_copies,
                tier,
                limits,
                qos_policy,
            } => {
                let s = Settings {
                    min_copies,
                    tier,
                    limits,
                    qos_policy,
                };
                to(async {
                    let v = self.change_settings(&name, &s).await?;
                    Ok(Warned::new(v, self.settings_warnings(&name, &s).await))
                }
                .await)
            }
            Request::QosPolicyCreate {
                name,
                limits,
                aggregated,
            } => to(self.qos_policy_create(&name, &limits, aggregated).await),
            Request::QosPolicySet { name, limits } => to(async {
                let p = self.qos_policy_set(&name, &limits).await?;
                let members = match limits.iops_reserve {
                    Some(_) => self.policy_members(&name).await?,
                    None => vec![],
                };
                let names: Vec<&str> = members.iter().map(String::as_str).collect();
                Ok(Warned::new(p, self.reserve_warnings(&names).await))
            }
            .await),
            Request::QosPolicyDelete { name } => to(self.qos_policy_delete(&name).await),
            Request::QosPolicyList => to(self.qos_policy_list().await),
            Request::WriterUsage {
                name,
                epoch,
                units,
                throttled_seconds,
                overlay_blocks,
            } => {
                // Only the writer of record's: one fenced (`up`'s own export, superseded by
                // a `trireme nbd`) goes on telling, and would replace the live one's.
                if self
                    .meta
                    .volume(&name)
                    .await
                    .is_ok_and(|v| v.epoch == epoch)
                {
                    self.note_usage(&name, epoch, units, throttled_seconds, overlay_blocks);
                }
                to(Ok(()))
            }
            Request::VolumeAccess { name, allow, deny } => {
                to(self.set_access(&name, &allow, &deny).await)
            }
            Request::VolumeList => to(self.meta.volumes().await.map_err(ManagerError::from)),
            Request::VolumeFence { name, at } => to(self.fence_where(&name, &at).await),
            Request::VolumeInfo { name } => to(self.volume_info(&name).await),
            Request::VolumeDelete {
                name,
                force,
                keep_secs,
            } => to(self
                .delete_to_trash(
                    &name,
                    force,
                    keep_secs.map(std::time::Duration::from_secs),
                    &match peer {
                        trireme_transport::Peer::Trusted => "the control socket".to_string(),
                        p => p.to_string(),
                    },
                )
                .await),
            Request::TrashList => to(self.trash_list().await),
            Request::TrashRestore { name } => to(self.trash_restore(&name).await),
            Request::TrashPurge { name } => to(self.trash_purge(name.as_deref()).await),
            Request::CaRevoke { fingerprint, role } => to(async {
                let rec = trireme_meta::RevokedCert {
                    fingerprint: fingerprint.to_ascii_lowercase(),
                    role,
                    at: trash::now_secs(),
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
            Request::Attach { name, writer } => {
                let r = self.attach(&name).await;
                if let (Ok(info), Some(w)) = (&r, writer) {
                    self.local_writers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(name.clone(), (info.epoch, w));
                }
                to(r)
            }
            Request::Locate { name } => to(self.locate(&name).await),
            req @ (Request::SetReplicaState { .. }
            | Request::Detach { .. }
            | Request::SetVolumeSize { .. }
            | Request::SetRegion { .. }
            | Request::WriterAttach { .. }
            | Request::WriterReattach { .. }
            | Request::WriterRelease { .. }
            | Request::WriterAnswer { .. }
            | Request::WriterReport { .. }
            | Request::NvmfExport { .. }) => self.handle_writer(req, peer).await,
            Request::VolumeResize {
                name,
                size,
                allow_shrink,
            } => to(self.resize_volume(&name, size, allow_shrink).await),
            Request::SnapshotCreate { name, snapshot } => {
                to(self.snapshot_create(&name, &snapshot).await)
            }
            Request::SnapshotList { name } => to(self.snapshot_list(&name).await),
            Request::SnapshotDelete {
                name,
                snapshot,
                force,
            } => to(self.snapshot_delete(&name, &snapshot, force).await),
            Request::VolumeRollback {
                name,
                snapshot,
                force,
            } => to(self.snapshot_rollback(&name, &snapshot, force).await),
            Request::VolumeClone {
                source,
                snapshot,
                name,
            } => to(self.clone_volume(&source, &snapshot, &name).await),
            Request::VolumeFlatten { name } => to(self.flatten_volume(&name).await),
            Request::VolumeScrub { name, region, rate } => {
                to(self.scrub(&name, region, rate).await)
            }
            Request::NodeStop { id } => to(self.node_control(false, id).await),
            Request::NodeStart { id } => to(self.node_control(true, id).await),
            Request::NodeRestart { id } => to(self.restart_node(id).await),
            Request::NodeLost { id, force } => to(self.node_lost(id, force).await),
            Request::NodeUndrain { id } => to(self.undrain(id).await),
            Request::NodeSet { id, iops_capacity } => to(self.node_set(id, iops_capacity).await),
            Request::NodeDrain { id, rate } => to(self.start_move(id, false, rate).await),
            Request::NodeRemove { id, rate } => to(self.start_move(id, true, rate).await),
            Request::Status => to(self.status().await),
            Request::Events { limit } => to(self.meta.events(limit).await.map_err(Into::into)),
        }
    }
}
