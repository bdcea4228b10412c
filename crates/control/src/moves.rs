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
//! The writer is the one in the cluster process (`up`'s export) when there is one; otherwise the
//! manager attaches the volume itself for the move and detaches after. A volume held by a writer
//! elsewhere (`trireme nbd`) is refused: a move must not fence it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trireme_client::{AttachInfo, BoxFut, Membership, ResyncProgress, Volume, VolumeOptions};
use trireme_meta::{NodeState, ReplicaRecord, VolumeRecord};
use trireme_proto::{Header, Op, Status};
use trireme_replication::ReplicaState;

use crate::manager::{Manager, Result};

/// One `node drain` / `node remove` as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveStatus {
    /// `drain` or `remove`.
    pub kind: String,
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

/// The metadata, as a writer attached by the manager itself needs it.
#[derive(Debug)]
struct ManagerMembership(Weak<Manager>);

impl ManagerMembership {
    fn get(&self) -> std::result::Result<Arc<Manager>, String> {
        self.0.upgrade().ok_or_else(|| "the manager stopped".into())
    }
}

impl Membership for ManagerMembership {
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
    ) -> BoxFut<'a, std::result::Result<(), String>> {
        Box::pin(async move {
            self.get()?
                .set_replica_state(volume, epoch, node, state)
                .await
                .map(|_| ())
        })
    }
    fn locate<'a>(
        &'a self,
        volume: &'a str,
    ) -> BoxFut<'a, std::result::Result<AttachInfo, String>> {
        Box::pin(async move { self.get()?.locate(volume).await })
    }
    fn detach<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
    ) -> BoxFut<'a, std::result::Result<(), String>> {
        Box::pin(async move { self.get()?.detach(volume, epoch).await.map(|_| ()) })
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
            return Err(format!("node {node} was removed from the cluster"));
        }
        let kind = if remove { "remove" } else { "drain" };
        let volumes: Vec<String> = self
            .meta()
            .volumes()
            .await
            .map_err(|e| e.to_string())?
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
                return Err(format!("a {} of node {node} is already running", m.kind));
            }
            let job = MoveStatus {
                kind: kind.into(),
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
        tracing::info!(node, kind, volumes = ?volumes, rate, "moving replicas off a node");
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
                        m.error = Some(e.clone());
                    }
                }
            });
            match r {
                Ok(()) => tracing::info!(node, kind, "node {kind} done"),
                Err(e) => tracing::error!(node, kind, "node {kind} failed: {e}"),
            }
        });
        Ok(job)
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
            NodeState::Removed => return Err(format!("node {node} was removed from the cluster")),
            NodeState::Active => return Ok(format!("node {node} is active")),
            NodeState::Draining => {}
        }
        if self
            .moves()
            .iter()
            .any(|m| m.node == node && m.state == MoveState::Running)
        {
            return Err(format!(
                "a move off node {node} is running; wait for it to end"
            ));
        }
        self.set_node_state(node, NodeState::Active).await?;
        Ok(format!("node {node} takes new replicas again"))
    }

    async fn set_node_state(&self, node: u32, state: NodeState) -> Result<()> {
        let rec = self.node(node).await?;
        self.meta()
            .put_node(&trireme_meta::NodeRecord { state, ..rec })
            .await
            .map_err(|e| e.to_string())
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
                Err(e) => return Err(e.to_string()),
            };
            if v.replicas.iter().any(|r| r.node == node) {
                self.update_move(node, |m| m.volume = Some(name.clone()));
                self.move_volume(&v, node, rate)
                    .await
                    .map_err(|e| format!("volume {name}: {e}"))?;
            }
            self.update_move(node, |m| m.volumes_done += 1);
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

    /// The writer of `name` in this process, or a new one attached for the move (and whether
    /// it is ours to detach).
    async fn mover(self: &Arc<Self>, v: &VolumeRecord) -> Result<(Arc<Volume>, bool)> {
        if let Some(w) = self.writer(&v.name) {
            return Ok((w, false));
        }
        if v.writer_open {
            return Err(format!(
                "volume {} is attached by a writer outside the cluster process; detach it first (a move through another writer would fence it)",
                v.name
            ));
        }
        let info = self.attach(&v.name).await?;
        let membership: Arc<dyn Membership> = Arc::new(ManagerMembership(Arc::downgrade(self)));
        let w = Volume::attach_managed(info, VolumeOptions::default(), membership)
            .await
            .map_err(|e| e.to_string())?;
        self.register_client(w.clone());
        Ok((w, true))
    }

    async fn move_volume(
        self: &Arc<Self>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        let (writer, ours) = self.mover(v).await?;
        let r = self.move_with(&writer, v, from, rate).await;
        if ours {
            self.unregister_client(&writer);
            if let Err(e) = writer.detach().await {
                tracing::warn!(volume = %v.name, "detaching the move's writer: {e}");
            }
        }
        r
    }

    /// The node a new replica of `v` goes to.
    async fn pick_target(&self, v: &VolumeRecord) -> Result<u32> {
        let vols = self.meta().volumes().await.map_err(|e| e.to_string())?;
        let mut candidates: Vec<(usize, u32)> = Vec::new();
        for n in self.meta().nodes().await.map_err(|e| e.to_string())? {
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
            format!(
                "no node can take a replica of {}: every active node that answers holds one already (add a node: `trireme up --nodes N+1`)",
                v.name
            )
        })
    }

    async fn move_with(
        &self,
        writer: &Arc<Volume>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        let to = self.pick_target(v).await?;
        self.update_move(from, |m| m.to = Some(to));
        // 1. Recorded failed first: a crash from here on leaves a copy that is never read.
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                if rec.replicas.iter().any(|r| r.node == to) {
                    return Err(format!("node {to} already holds a replica"));
                }
                rec.replicas.push(ReplicaRecord {
                    node: to,
                    state: ReplicaState::Failed,
                });
                Ok(())
            })
            .await
            .map_err(|e| e.to_string())?;
        let target = self.node(to).await?;
        match self.replica_op(&target, Op::CreateReplica, &v).await {
            Ok(Status::Ok) => {}
            outcome => {
                let _ = self
                    .meta()
                    .update_volume(&v.name, &mut |rec| {
                        rec.replicas.retain(|r| r.node != to);
                        Ok(())
                    })
                    .await;
                return Err(format!(
                    "creating the new replica on node {to}: {outcome:?}"
                ));
            }
        }
        tracing::info!(volume = %v.name, from, to, "moving a replica");
        // 2. The writer copies the volume to it.
        writer
            .add_replica(to, rate)
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let epoch = self
                .meta()
                .volume(&v.name)
                .await
                .map_err(|e| e.to_string())?
                .epoch;
            if epoch != writer.info().epoch {
                return Err(
                    "the writer was fenced by a newer attach; run the command again".into(),
                );
            }
            let view = writer.replica_views().into_iter().find(|r| r.node == to);
            match view {
                Some(r) if r.state == ReplicaState::InSync => break,
                Some(r) => self.update_move(from, |m| m.progress = r.resync.clone()),
                None => return Err(format!("the writer dropped the new replica on node {to}")),
            }
            tokio::time::sleep(POLL).await;
        }
        // 3. The old copy goes.
        writer
            .retire_replica(from)
            .await
            .map_err(|e| e.to_string())?;
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                let states: Vec<(u32, ReplicaState)> =
                    rec.replicas.iter().map(|r| (r.node, r.state)).collect();
                let i = trireme_replication::removal(&states, from).map_err(|e| e.to_string())?;
                rec.replicas.remove(i);
                Ok(())
            })
            .await
            .map_err(|e| e.to_string())?;
        match self.node(from).await {
            Ok(n) => match self.replica_op(&n, Op::DeleteReplica, &v).await {
                Ok(Status::Ok | Status::NoReplica) => {}
                other => {
                    tracing::warn!(volume = %v.name, node = from, "old replica not deleted (the node may be down): {other:?}")
                }
            },
            Err(e) => tracing::warn!(volume = %v.name, node = from, "{e}"),
        }
        tracing::info!(volume = %v.name, from, to, "replica moved");
        Ok(())
    }
}
