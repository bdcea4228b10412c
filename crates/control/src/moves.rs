//! Moving replicas off a node: `node drain` (the node stays, empty) and `node remove` (the node
//! leaves the cluster; it may already be dead).
//!
//! Each volume with a replica on the node is moved by its writer, while I/O goes on:
//! 1. a target is chosen (an active node that answers, holds no replica of the volume, and holds
//!    the fewest replicas); the new replica is recorded as *failed* in the metadata first (so a
//!    crash leaves a copy nobody reads), then created on the target;
//! 2. the writer adds it: it takes every new write at once and a full-compare resync copies the
//!    rest (rate-limited by `--rate`), then it is recorded in sync;
//! 3. the writer retires the old replica (recorded outdated with writes paused, then left out
//!    of the write set), the metadata drops it (never the last in-sync copy:
//!    `replication::removal`), and the node deletes it (skipped if the node is dead).
//!
//! Who does steps 2 and 3 is the volume's writer:
//! * the one in the manager's process (`up`'s export), called directly;
//! * a writer on another host (`trireme attach`, holding the volume's attach record): the
//!   manager writes a [`MoveRequest`] under `moves/<volume>`, the writer (watching that key)
//!   does steps 2 and 3 and reports progress and outcome there, and the manager finishes;
//! * none: the manager attaches the volume itself for the move (on etcd under its own attach
//!   record, so a client's attach meanwhile is refused rather than fenced) and detaches after.
//!   A volume whose writer died without detaching is reconciled first.
//!
//! A volume held by a writer that cannot take requests (`trireme nbd` beside `up`) is refused:
//! a move must not fence it.
//!
//! Jobs are recorded under `jobs/<node>`, so a manager that takes over resumes the running ones
//! ([`Manager::resume_jobs`]): a request its predecessor made is waited for; a copy its
//! predecessor's own writer had begun is resumed. Any move run again finds the copy an
//! earlier attempt left (`ReplicaRecord::moving_from`) and resumes it, or discards it when its
//! node does not answer: no orphan copy stays in the volume (`add_target`).

use crate::error::{refused, ManagerError};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trireme_client::{
    AttachInfo, BoxFut, Membership, MembershipError, ResyncProgress, Volume, VolumeOptions,
};
use trireme_meta::{
    AttachRecord, MoveRequest, MoveRequestState, NodeState, ReplicaRecord, VolumeRecord,
};
use trireme_proto::{Header, Op, Status};
use trireme_replication::ReplicaState;

use crate::manager::{Manager, Result};

/// One `node drain` / `node remove` as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveStatus {
    pub kind: MoveKind,
    pub node: u32,
    pub state: MoveState,
    pub error: Option<String>,
    /// Copy rate limit in bytes per second, if any.
    pub rate: Option<u64>,
    /// Volumes that had a replica on the node when the move started, and how many are moved.
    pub volumes_total: usize,
    pub volumes_done: usize,
    /// The volume being moved now, where to, and its copy's progress.
    pub volume: Option<String>,
    pub to: Option<u32>,
    pub progress: Option<ResyncProgress>,
}

/// What a move job does with the node once its replicas are off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveKind {
    /// `node drain`: the node stays, empty, until `node undrain`.
    Drain,
    /// `node remove`: the node leaves the cluster.
    Remove,
}

impl MoveKind {
    fn of(remove: bool) -> MoveKind {
        if remove {
            MoveKind::Remove
        } else {
            MoveKind::Drain
        }
    }
}

impl std::fmt::Display for MoveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MoveKind::Drain => "drain",
            MoveKind::Remove => "remove",
        })
    }
}

/// Where a move job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveState {
    Running,
    Done,
    Failed,
}

impl std::fmt::Display for MoveState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MoveState::Running => "running",
            MoveState::Done => "done",
            MoveState::Failed => "failed",
        })
    }
}

/// How often a move looks at its copy's progress.
const POLL: Duration = Duration::from_millis(200);
/// How long a volume open for writing without an attach record is given for its writer to put
/// the record back, before the manager attaches it itself.
const REATTACH_GRACE: Duration = Duration::from_secs(5);
/// How often, and how many times, the manager tries to record a job while the metadata store
/// is unreachable (two minutes).
const SAVE_JOB_RETRY: Duration = Duration::from_millis(500);
const SAVE_JOB_TRIES: u32 = 240;
/// How often a remote writer's progress is read from, and written to, the metadata.
const REMOTE_POLL: Duration = Duration::from_secs(1);

/// Who carries out a volume's move.
enum Mover {
    /// A writer in this process; `ours` if attached for the move (detach after), with the
    /// epoch of the attach record it holds on etcd.
    Here {
        writer: Arc<Volume>,
        ours: bool,
        record: Option<u64>,
    },
    /// The writer of `epoch` on another host, asked through a [`MoveRequest`].
    Remote { epoch: u64, host: String },
}

/// The metadata, as a writer attached by the manager itself needs it.
#[derive(Debug)]
struct ManagerMembership(Weak<Manager>);

impl ManagerMembership {
    fn get(&self) -> std::result::Result<Arc<Manager>, MembershipError> {
        self.0.upgrade().ok_or_else(|| ManagerError::Stopped.into())
    }
}

impl Membership for ManagerMembership {
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> BoxFut<'a, std::result::Result<(), MembershipError>> {
        Box::pin(async move {
            self.get()?
                .set_replica_state(volume, epoch, node, state, incarnation)
                .await
                .map(|_| ())
                .map_err(MembershipError::from)
        })
    }
    fn locate<'a>(
        &'a self,
        volume: &'a str,
    ) -> BoxFut<'a, std::result::Result<AttachInfo, MembershipError>> {
        Box::pin(async move { Ok(self.get()?.locate(volume).await?) })
    }
    fn detach<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
    ) -> BoxFut<'a, std::result::Result<(), MembershipError>> {
        Box::pin(async move {
            self.get()?.detach(volume, epoch).await?;
            Ok(())
        })
    }
}

impl Manager {
    /// Starts draining (`remove == false`) or removing a node in the background and returns its
    /// job; asking again while it runs returns the running job.
    pub async fn start_move(
        self: &Arc<Self>,
        node: u32,
        remove: bool,
        rate: Option<u64>,
    ) -> Result<MoveStatus> {
        let rec = self.node(node).await?;
        if rec.state == NodeState::Removed {
            return Err(refused(format!("node {node} was removed from the cluster")));
        }
        let kind = MoveKind::of(remove);
        let volumes: Vec<String> = self
            .meta()
            .volumes()
            .await?
            .into_iter()
            .filter(|v| v.replicas.iter().any(|r| r.node == node))
            .map(|v| v.name)
            .collect();
        let job = {
            let mut moves = self.moves.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(m) = moves
                .iter()
                .find(|m| m.node == node && m.state == MoveState::Running)
            {
                if m.kind == kind {
                    return Ok(m.clone());
                }
                return Err(refused(format!(
                    "a {} of node {node} is already running",
                    m.kind
                )));
            }
            let job = MoveStatus {
                kind,
                node,
                state: MoveState::Running,
                error: None,
                rate,
                volumes_total: volumes.len(),
                volumes_done: 0,
                volume: None,
                to: None,
                progress: None,
            };
            moves.retain(|m| m.node != node);
            moves.push(job.clone());
            job
        };
        // No new replicas go to it from now on.
        self.set_node_state(node, NodeState::Draining).await?;
        self.save_job(node).await;
        tracing::info!(node, %kind, volumes = ?volumes, rate, "moving replicas off a node");
        self.spawn_job(node, remove, rate, volumes);
        Ok(job)
    }

    /// Runs a job in the background, recording how it ends.
    fn spawn_job(
        self: &Arc<Self>,
        node: u32,
        remove: bool,
        rate: Option<u64>,
        volumes: Vec<String>,
    ) {
        let kind = MoveKind::of(remove);
        let me = self.clone();
        tokio::spawn(async move {
            let r = me.run_move(node, remove, rate, &volumes).await;
            me.update_move(node, |m| {
                m.volume = None;
                m.to = None;
                m.progress = None;
                match &r {
                    Ok(()) => m.state = MoveState::Done,
                    Err(e) => {
                        m.state = MoveState::Failed;
                        m.error = Some(e.to_string());
                    }
                }
            });
            me.save_job(node).await;
            match r {
                Ok(()) => tracing::info!(node, %kind, "node {kind} done"),
                Err(e) => tracing::error!(node, %kind, "node {kind} failed: {e}"),
            }
        });
    }

    /// Records job `node` in the metadata, trying again while the store is unreachable (for
    /// up to [`SAVE_JOB_TRIES`] rounds): a job whose end is not recorded shows as running to
    /// every reader of the store, for good. A deposed manager writes nothing, and its
    /// successor goes on from the last record.
    async fn save_job(&self, node: u32) {
        for _ in 0..SAVE_JOB_TRIES {
            // The latest state each time: the job may have moved on while the store was out.
            let Some(job) = self.moves().into_iter().find(|m| m.node == node) else {
                return;
            };
            match self.meta().put_job(node, &job).await {
                Ok(()) => return,
                Err(trireme_meta::MetaError::Unavailable(e)) => {
                    tracing::warn!(
                        node,
                        "recording the job: metadata store unreachable, trying again: {e}"
                    );
                    tokio::time::sleep(SAVE_JOB_RETRY).await;
                }
                Err(e) => {
                    tracing::warn!(node, "recording the job: {e}");
                    return;
                }
            }
        }
        tracing::error!(
            node,
            "recording the job: metadata store unreachable; giving up"
        );
    }

    /// Takes over the jobs a previous manager recorded: finished ones are shown by `status`,
    /// running ones go on (the volumes that still have a replica on the node).
    pub async fn resume_jobs(self: &Arc<Self>) -> Result<()> {
        let jobs: Vec<MoveStatus> = self.meta().jobs().await?;
        let vols = self.meta().volumes().await?;
        for job in jobs {
            let running = job.state == MoveState::Running;
            {
                let mut moves = self.moves.lock().unwrap_or_else(|e| e.into_inner());
                if moves.iter().any(|m| m.node == job.node) {
                    continue;
                }
                moves.push(MoveStatus {
                    progress: None,
                    ..job.clone()
                });
            }
            if running {
                let volumes: Vec<String> = vols
                    .iter()
                    .filter(|v| v.replicas.iter().any(|r| r.node == job.node))
                    .map(|v| v.name.clone())
                    .collect();
                tracing::info!(node = job.node, kind = %job.kind, volumes = ?volumes, "resuming the job of the previous manager");
                self.spawn_job(job.node, job.kind == MoveKind::Remove, job.rate, volumes);
            }
        }
        Ok(())
    }

    /// Re-creates elsewhere the replicas of a node whose daemon has been down (no lease) for
    /// `after`, like Ceph marking an OSD out: the node is drained (its copies re-created from
    /// the others, at `rate`) and stays, empty, until `node undrain`. Checks every 2 s.
    pub fn start_down_out(self: &Arc<Self>, after: Duration, rate: Option<u64>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut down_since: std::collections::HashMap<u32, tokio::time::Instant> =
                Default::default();
            // Tried once per time down: a failed job shows in `status`, not in a retry loop.
            let mut tried: std::collections::HashSet<u32> = Default::default();
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Some(m) = me.upgrade() else { return };
                let (Ok(alive), Ok(nodes), Ok(vols)) = (
                    m.meta().alive().await,
                    m.meta().nodes().await,
                    m.meta().volumes().await,
                ) else {
                    continue;
                };
                let now = tokio::time::Instant::now();
                down_since.retain(|id, _| !alive.contains_key(id));
                tried.retain(|id| down_since.contains_key(id));
                for n in nodes.iter().filter(|n| n.state == NodeState::Active) {
                    if alive.contains_key(&n.id) {
                        continue;
                    }
                    let since = *down_since.entry(n.id).or_insert(now);
                    let holds = vols
                        .iter()
                        .any(|v| v.replicas.iter().any(|r| r.node == n.id));
                    if holds && now - since >= after && tried.insert(n.id) {
                        tracing::warn!(
                            node = n.id,
                            "node down for {after:?}: re-creating its replicas on other nodes"
                        );
                        if let Err(e) = m.start_move(n.id, false, rate).await {
                            tracing::error!(
                                node = n.id,
                                "re-creating the replicas of a down node: {e}"
                            );
                        }
                    }
                }
            }
        });
    }

    /// A drained node takes new replicas again (refused while a move off it runs).
    pub async fn undrain(&self, node: u32) -> Result<String> {
        let rec = self.node(node).await?;
        match rec.state {
            NodeState::Removed => {
                return Err(refused(format!("node {node} was removed from the cluster")))
            }
            NodeState::Active => return Ok(format!("node {node} is active")),
            NodeState::Draining => {}
        }
        if self
            .moves()
            .iter()
            .any(|m| m.node == node && m.state == MoveState::Running)
        {
            return Err(refused(format!(
                "a move off node {node} is running; wait for it to end"
            )));
        }
        self.set_node_state(node, NodeState::Active).await?;
        Ok(format!("node {node} takes new replicas again"))
    }

    async fn set_node_state(&self, node: u32, state: NodeState) -> Result<()> {
        let rec = self.node(node).await?;
        self.meta()
            .put_node(&trireme_meta::NodeRecord { state, ..rec })
            .await
            .map_err(ManagerError::from)
    }

    pub(crate) fn moves(&self) -> Vec<MoveStatus> {
        self.moves.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update_move(&self, node: u32, f: impl FnOnce(&mut MoveStatus)) {
        let mut moves = self.moves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = moves.iter_mut().find(|m| m.node == node) {
            f(m);
        }
    }

    async fn run_move(
        self: &Arc<Self>,
        node: u32,
        remove: bool,
        rate: Option<u64>,
        volumes: &[String],
    ) -> Result<()> {
        for name in volumes {
            let v = match self.meta().volume(name).await {
                Ok(v) => v,
                Err(trireme_meta::MetaError::NoVolume(_)) => continue, // deleted meanwhile
                Err(e) => return Err(e.into()),
            };
            if v.replicas.iter().any(|r| r.node == node) {
                self.update_move(node, |m| m.volume = Some(name.clone()));
                self.move_volume(&v, node, rate)
                    .await
                    .map_err(|e| refused(format!("volume {name}: {e}")))?;
            }
            self.update_move(node, |m| m.volumes_done += 1);
            self.save_job(node).await;
        }
        if remove {
            self.set_node_state(node, NodeState::Removed).await?;
            // Its process, if one runs under the supervisor, is stopped for good.
            if let Err(e) = self.stop_node_process(node).await {
                tracing::info!(node, "removed node not stopped: {e}");
            }
        }
        Ok(())
    }

    /// Who moves `v`'s replica: its writer here, its writer on another host, or a writer
    /// attached here for the move.
    async fn mover(self: &Arc<Self>, v: &VolumeRecord) -> Result<Mover> {
        if let Some(w) = self.writer(&v.name) {
            return Ok(Mover::Here {
                writer: w,
                ours: false,
                record: None,
            });
        }
        // A manager that holds its role by a lease (on etcd) works beside writers whose
        // attach records are lease-bound too; `up`'s manager (no lease) beside writers that
        // may hold none (`trireme nbd`).
        let on_leases = self.meta().fence_lease().is_some();
        let mut held = self.meta().attachment(&v.name).await?;
        if held.is_none() && v.writer_open && on_leases {
            // A live writer whose lease expired (etcd was out for longer than its TTL) puts
            // its record back as soon as etcd answers: give it that time before taking the
            // volume for a dead writer's.
            tokio::time::sleep(REATTACH_GRACE).await;
            held = self.meta().attachment(&v.name).await?;
        }
        if let Some((a, _)) = held {
            return Ok(Mover::Remote {
                epoch: a.epoch,
                host: a.host,
            });
        }
        // On etcd every writer holds an attach record: writer-open without one is a writer
        // that died, and attaching reconciles first. Beside `up`, it may be `trireme nbd`.
        if v.writer_open && !on_leases {
            return Err(refused(format!(
                "volume {} is attached by a writer outside the cluster process; detach it first (a move through another writer would fence it)",
                v.name
            )));
        }
        let (info, record) = match self.meta().fence_lease() {
            Some(lease) => {
                let rec = AttachRecord {
                    epoch: 0,
                    host: crate::hostname(),
                    pid: std::process::id(),
                    exports: vec![],
                    identity: None,
                };
                let (v, unclean) = self.meta().attach(&v.name, &rec, lease, false).await?;
                let mut info = crate::attach_info(self.meta(), &v).await?;
                info.reconcile = unclean;
                (info, Some(v.epoch))
            }
            None => (self.attach(&v.name).await?, None),
        };
        let membership: Arc<dyn Membership> = Arc::new(ManagerMembership(Arc::downgrade(self)));
        let w = Volume::attach_managed(info, VolumeOptions::default(), membership).await?;
        self.register_client(w.clone());
        Ok(Mover::Here {
            writer: w,
            ours: true,
            record,
        })
    }

    async fn move_volume(
        self: &Arc<Self>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        match self.mover(v).await? {
            Mover::Here {
                writer,
                ours,
                record,
            } => {
                let r = self.move_with(&writer, v, from, rate).await;
                if ours {
                    self.unregister_client(&writer);
                    if let Err(e) = writer.detach().await {
                        tracing::warn!(volume = %v.name, "detaching the move's writer: {e}");
                    }
                    if let Some(epoch) = record {
                        let _ = self.meta().release_attachment(&v.name, epoch).await;
                    }
                }
                r
            }
            Mover::Remote { epoch, host } => self.move_remote(v, from, rate, epoch, &host).await,
        }
    }

    /// The node a new replica of `v` goes to.
    async fn pick_target(&self, v: &VolumeRecord) -> Result<u32> {
        let vols = self.meta().volumes().await?;
        let mut candidates: Vec<(usize, u32)> = Vec::new();
        for n in self.meta().nodes().await? {
            if n.state != NodeState::Active || v.replicas.iter().any(|r| r.node == n.id) {
                continue;
            }
            if self
                .node_call(&n, Header::request(Op::Ping, 0))
                .await
                .is_err()
            {
                continue;
            }
            let load = vols
                .iter()
                .filter(|x| x.replicas.iter().any(|r| r.node == n.id))
                .count();
            candidates.push((load, n.id));
        }
        candidates.sort_unstable();
        candidates.first().map(|c| c.1).ok_or_else(|| {
            refused(format!(
                "no node can take a replica of {}: every active node that answers holds one already (add a node: `trireme up --nodes N+1`)",
                v.name
            ))
        })
    }

    /// Step 1: picks a target, records the new replica failed and creates it there. A copy
    /// an earlier attempt at this move left unfinished (the job failed, the manager
    /// restarted) is resumed when its node answers — the resync compares what it holds and
    /// copies the rest — and discarded when it does not.
    async fn add_target(&self, v: &VolumeRecord, from: u32) -> Result<(u32, VolumeRecord)> {
        let earlier = v.replicas.iter().find(|r| r.moving_from == Some(from));
        if let Some(r) = earlier.filter(|r| r.state == ReplicaState::InSync) {
            // The writer finished the copy after the attempt ended: only the retirement is left.
            tracing::info!(volume = %v.name, from, to = r.node, "the copy of an earlier attempt is in sync");
            return Ok((r.node, v.clone()));
        }
        let unfinished = earlier.map(|r| r.node);
        let mut v = v.clone();
        if let Some(to) = unfinished {
            let target = self.node(to).await?;
            let resumed = match self.replica_op(&target, Op::CreateReplica, &v).await {
                Ok(Status::Ok | Status::Exists) => true,
                other => {
                    tracing::info!(volume = %v.name, node = to, "the unfinished copy of an earlier attempt cannot be resumed ({other:?}); discarding it");
                    false
                }
            };
            if resumed {
                self.pin_new_replica(&target, &v).await;
                tracing::info!(volume = %v.name, from, to, "resuming the unfinished copy of an earlier attempt");
                self.update_move(from, |m| m.to = Some(to));
                self.save_job(from).await;
                return Ok((to, v));
            }
            v = self.discard_replica(&v, to).await?;
        }
        let to = self.pick_target(&v).await?;
        self.update_move(from, |m| m.to = Some(to));
        self.save_job(from).await;
        // Recorded failed first: a crash from here on leaves a copy that is never read.
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                if rec.replicas.iter().any(|r| r.node == to) {
                    return Err(trireme_meta::MetaError::Refused(format!(
                        "node {to} already holds a replica"
                    )));
                }
                rec.replicas.push(ReplicaRecord {
                    incarnation: 0,
                    node: to,
                    state: ReplicaState::Failed,
                    moving_from: Some(from),
                });
                Ok(())
            })
            .await?;
        let target = self.node(to).await?;
        let mut created = self.replica_op(&target, Op::CreateReplica, &v).await;
        if let Ok(Status::Exists) = created {
            // Not in the layout until the update above: a copy left behind while the node
            // was down (its replica re-created elsewhere then). Stale; replaced.
            tracing::info!(volume = %v.name, node = to, "deleting a stale replica the node kept");
            created = match self.replica_op(&target, Op::DeleteReplica, &v).await {
                Ok(Status::Ok | Status::NoReplica) => {
                    self.replica_op(&target, Op::CreateReplica, &v).await
                }
                other => other,
            };
        }
        match created {
            Ok(Status::Ok) => {
                self.pin_new_replica(&target, &v).await;
                Ok((to, v))
            }
            outcome => {
                let _ = self
                    .meta()
                    .update_volume(&v.name, &mut |rec| {
                        rec.replicas.retain(|r| r.node != to);
                        Ok(())
                    })
                    .await;
                Err(refused(format!(
                    "creating the new replica on node {to}: {outcome:?}"
                )))
            }
        }
    }

    /// Drops replica `node` (never an in-sync one) from the layout and deletes it there.
    async fn discard_replica(&self, v: &VolumeRecord, node: u32) -> Result<VolumeRecord> {
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                if rec
                    .replicas
                    .iter()
                    .any(|r| r.node == node && r.state == ReplicaState::InSync)
                {
                    return Err(trireme_meta::MetaError::Refused(format!(
                        "the replica on node {node} is in sync"
                    )));
                }
                rec.replicas.retain(|r| r.node != node);
                Ok(())
            })
            .await?;
        self.delete_old(&v, node).await;
        Ok(v)
    }

    /// Step 3, after the writer retired `from`: the layout drops it, its node deletes it.
    async fn finish_move(&self, v: &VolumeRecord, from: u32) -> Result<()> {
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                let states: Vec<(u32, ReplicaState)> =
                    rec.replicas.iter().map(|r| (r.node, r.state)).collect();
                let i = trireme_replication::removal(&states, from)?;
                rec.replicas.remove(i);
                for r in &mut rec.replicas {
                    if r.moving_from == Some(from) {
                        r.moving_from = None;
                    }
                }
                Ok(())
            })
            .await?;
        self.delete_old(&v, from).await;
        Ok(())
    }

    async fn delete_old(&self, v: &VolumeRecord, node: u32) {
        match self.node(node).await {
            Ok(n) => match self.replica_op(&n, Op::DeleteReplica, v).await {
                Ok(Status::Ok | Status::NoReplica) => {}
                other => {
                    tracing::warn!(volume = %v.name, node, "old replica not deleted (the node may be down): {other:?}")
                }
            },
            Err(e) => tracing::warn!(volume = %v.name, node, "{e}"),
        }
    }

    async fn move_with(
        &self,
        writer: &Arc<Volume>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        let (to, v) = self.add_target(v, from).await?;
        tracing::info!(volume = %v.name, from, to, "moving a replica");
        copy_then_retire(self.meta(), writer, from, to, rate, &mut |p| {
            self.update_move(from, |m| m.progress = p.cloned())
        })
        .await?;
        self.finish_move(&v, from).await?;
        tracing::info!(volume = %v.name, from, to, "replica moved");
        Ok(())
    }

    /// Steps 2 and 3 by the writer of `epoch` on `host`, through a [`MoveRequest`]. A request
    /// of this move already under way (a previous manager made it) is waited for, not made
    /// again.
    async fn move_remote(
        &self,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
        epoch: u64,
        host: &str,
    ) -> Result<()> {
        let name = v.name.as_str();
        let meta = self.meta();
        let pending = meta.move_request(name).await?;
        let to = match pending {
            Some((r, _))
                if r.from == from && r.epoch == epoch && r.state != MoveRequestState::Failed =>
            {
                tracing::info!(
                    volume = name,
                    from,
                    to = r.to,
                    "waiting for the move its writer is making"
                );
                self.update_move(from, |m| m.to = Some(r.to));
                r.to
            }
            _ => {
                let (to, _) = self.add_target(v, from).await?;
                let req = MoveRequest {
                    from,
                    to,
                    rate,
                    epoch,
                    state: MoveRequestState::Asked,
                    progress: None,
                    error: None,
                };
                meta.delete_move_request(name).await?;
                if meta.put_move_request(name, &req, 0).await?.is_none() {
                    return Err(refused("another move request was made meanwhile"));
                }
                tracing::info!(
                    volume = name,
                    from,
                    to,
                    host,
                    "asked the volume's writer to move a replica"
                );
                to
            }
        };
        let outcome = loop {
            tokio::time::sleep(REMOTE_POLL).await;
            let req = meta.move_request(name).await;
            match req {
                Ok(Some((r, _))) if r.from == from && r.to == to => match r.state {
                    MoveRequestState::Done => break Ok(()),
                    MoveRequestState::Failed => {
                        break Err(refused(format!(
                            "the writer on {host}: {}",
                            r.error.unwrap_or_default()
                        )))
                    }
                    MoveRequestState::Asked | MoveRequestState::Copying => {
                        self.update_move(from, |m| m.progress = r.progress.clone())
                    }
                },
                Ok(_) => break Err(refused("the move request was replaced or deleted")),
                Err(e) => {
                    tracing::debug!(volume = name, "reading the move request: {e}");
                    continue;
                }
            }
            match meta.attachment(name).await {
                Ok(Some((a, _))) if a.epoch == epoch => {}
                Ok(_) => {
                    break Err(refused(format!(
                        "the writer on {host} detached or was replaced during the move; run the command again"
                    )))
                }
                Err(_) => {}
            }
        };
        if let Err(e) = outcome {
            let _ = meta.delete_move_request(name).await;
            return Err(e);
        }
        let v = meta.volume(name).await?;
        self.finish_move(&v, from).await?;
        meta.delete_move_request(name).await?;
        tracing::info!(
            volume = name,
            from,
            to,
            host,
            "replica moved by the volume's writer"
        );
        Ok(())
    }
}

/// Steps 2 and 3 as the writer does them: adds the replica on `to` (it takes new writes at
/// once), waits while the resync fills it (`progress` sees each look), then retires `from`.
/// Fails if the writer is fenced by a newer attach meanwhile.
pub async fn copy_then_retire(
    meta: &trireme_meta::ClusterMeta,
    writer: &Volume,
    from: u32,
    to: u32,
    rate: Option<u64>,
    progress: &mut (dyn FnMut(Option<&ResyncProgress>) + Send),
) -> Result<()> {
    let name = writer.info().name.clone();
    writer.add_replica(to, rate).await?;
    loop {
        let epoch = meta.volume(&name).await?.epoch;
        if epoch != writer.info().epoch {
            return Err(refused(
                "the writer was fenced by a newer attach; run the command again",
            ));
        }
        let view = writer.replica_views().into_iter().find(|r| r.node == to);
        match view {
            Some(r) if r.state == ReplicaState::InSync => break,
            Some(r) => progress(r.resync.as_ref()),
            None => {
                return Err(refused(format!(
                    "the writer dropped the new replica on node {to}"
                )))
            }
        }
        tokio::time::sleep(POLL).await;
    }
    progress(None);
    writer
        .retire_replica(from)
        .await
        .map_err(ManagerError::from)
}
