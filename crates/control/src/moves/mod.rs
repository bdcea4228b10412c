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
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trireme_client::ResyncProgress;
use trireme_meta::NodeState;

use crate::manager::{Manager, Result};

mod mover;
mod parity;
mod replicas;

pub use mover::move_as_writer;

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

/// Whether `v` has a copy on `node` to move, or one moving off it still (a new copy on
/// record names the node it moves from, `moving_from`, until the move ends).
fn has_a_move_off(v: &trireme_meta::VolumeRecord, node: u32) -> bool {
    v.replicas
        .iter()
        .any(|r| r.node == node || r.moving_from == Some(node))
}

/// How often a move looks at its copy's progress.
const POLL: Duration = Duration::from_millis(200);
/// How long, counting only while the metadata store answers, a volume open for writing
/// without an attach record is given for its writer to put the record back, before the
/// manager attaches it itself.
const REATTACH_GRACE: Duration = Duration::from_secs(10);
/// How often, and how many times, the manager tries to record a job while the metadata store
/// is unreachable (two minutes).
const SAVE_JOB_RETRY: Duration = Duration::from_millis(500);
const SAVE_JOB_TRIES: u32 = 240;
/// How often a remote writer's progress is read from, and written to, the metadata.
const REMOTE_POLL: Duration = Duration::from_secs(1);

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
        let held: Vec<_> = self
            .meta()
            .volumes()
            .await?
            .into_iter()
            .filter(|v| has_a_move_off(v, node))
            .collect();
        // A parity copy's new copy rebuilds its chunks from K others in sync: with fewer,
        // it could not be made. Said now, with the node left as it was.
        let short: Vec<String> = held
            .iter()
            .filter_map(|v| {
                let trireme_replication::Layout::Parity(p) = v.layout else {
                    return None;
                };
                let others = v
                    .replicas
                    .iter()
                    .filter(|r| {
                        r.node != node && r.state == trireme_replication::ReplicaState::InSync
                    })
                    .count();
                (others < usize::from(p.data)).then(|| {
                    format!(
                        "{} ({others} other copies in sync of the {} its stripes need)",
                        v.name, p.data
                    )
                })
            })
            .collect();
        if !short.is_empty() {
            return Err(refused(format!(
                "a {kind} of node {node} could not make the new copies of {}: they are rebuilt from the copies in sync, and too few are. Bring its other copies back in sync first; node {node} is left as it was",
                short.join(", ")
            )));
        }
        // A copy is made from a copy in sync: a node that does not answer and holds the only
        // one of a volume leaves nothing to copy from. Said now, not by a job that fails.
        let only_here: Vec<&str> = held
            .iter()
            .filter(|v| {
                let mut in_sync = v
                    .replicas
                    .iter()
                    .filter(|r| r.state == trireme_replication::ReplicaState::InSync);
                matches!((in_sync.next(), in_sync.next()), (Some(r), None) if r.node == node)
            })
            .map(|v| v.name.as_str())
            .collect();
        if !only_here.is_empty()
            && self
                .node_call(
                    &rec,
                    trireme_proto::Header::request(trireme_proto::Op::Ping, 0),
                )
                .await
                .is_err()
        {
            return Err(refused(format!(
                "node {node} does not answer and holds the only copy in sync of {}: a {kind} would have nothing to copy from, and its data would be lost. Bring the node back first (its copies are then moved off)",
                only_here.join(", ")
            )));
        }
        // Each copy needs somewhere to go: said now, with the node left as it was (it stayed
        // `draining` after a job that could only fail).
        let mut stuck = Vec::new();
        for v in &held {
            // A copy an earlier attempt left is resumed, not made again.
            let resumed = v.replicas.iter().any(|r| r.moving_from == Some(node));
            if !resumed && !self.has_target(v, node).await? {
                stuck.push(v.name.clone());
            }
        }
        if !stuck.is_empty() {
            return Err(refused(format!(
                "no node can take the copies of {} on node {node}: every other active node that answers holds one already ({}); node {node} is left as it was",
                stuck.join(", "),
                self.add_a_node_hint()
            )));
        }
        let volumes: Vec<String> = held.into_iter().map(|v| v.name).collect();
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
                    .filter(|v| has_a_move_off(v, job.node))
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
        // Its finished job goes with it: `status` said `drain: done` of an active node.
        self.moves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|m| m.node != node);
        if let Err(e) = self.meta().delete_job(node).await {
            tracing::warn!(node, "forgetting the finished job: {e}");
        }
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
            if has_a_move_off(&v, node) {
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
}
