//! The replicas of a move in the metadata: choosing the target, recording and creating the
//! new copy (resuming or discarding one an earlier attempt left), and dropping the old one.

use crate::error::refused;

use trireme_meta::{NodeRecord, NodeState, ReplicaRecord, VolumeRecord};
use trireme_proto::{Header, Op, Status};
use trireme_replication::{ReplicaState, TransitionError};

use crate::manager::{Manager, Result};

impl Manager {
    /// What an operator does when no node can take a copy: add one, as this cluster adds
    /// them.
    pub(crate) fn add_a_node_hint(&self) -> &'static str {
        match self.own_node() {
            0 => "add a node: restart `trireme up` with `--nodes N+1`",
            _ => "add a server: `trireme node run --id N ...` on a host that holds none",
        }
    }

    /// Whether some active node that answers holds no copy of `v` (other than `but`).
    pub(crate) async fn has_target(&self, v: &VolumeRecord, but: u32) -> Result<bool> {
        for n in self.meta().nodes().await? {
            let free = n.state == NodeState::Active
                && n.id != but
                && !v.replicas.iter().any(|r| r.node == n.id);
            if free
                && self
                    .node_call(&n, Header::request(Op::Ping, 0))
                    .await
                    .is_ok()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The node a new replica of `v` goes to. `replacing`: a parity copy's replacement, for
    /// which a node in a zone that holds M of the stripe's other chunks does not count (a
    /// lost zone would lose more than M chunks of a stripe).
    pub(super) async fn pick_target(
        &self,
        v: &VolumeRecord,
        replacing: Option<u32>,
    ) -> Result<u32> {
        let vols = self.meta().volumes().await?;
        let nodes = self.meta().nodes().await?;
        let zone_full = |zone: &Option<String>| -> bool {
            let (Some(from), Some(z), trireme_replication::Layout::Parity(p)) =
                (replacing, zone, v.layout)
            else {
                return false;
            };
            let in_zone = v
                .replicas
                .iter()
                .filter(|r| r.node != from)
                .filter(|r| {
                    nodes
                        .iter()
                        .any(|n| n.id == r.node && n.zone.as_ref() == Some(z))
                })
                .count();
            in_zone >= usize::from(p.parity)
        };
        let mut candidates: Vec<(usize, u32)> = Vec::new();
        for n in &nodes {
            if n.state != NodeState::Active
                || v.replicas.iter().any(|r| r.node == n.id)
                || zone_full(&n.zone)
            {
                continue;
            }
            if self
                .node_call(n, Header::request(Op::Ping, 0))
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
                "no node can take a replica of {}: every active node that answers holds one already ({})",
                v.name,
                self.add_a_node_hint()
            ))
        })
    }

    /// Step 1: picks a target, records the new replica failed and creates it there. A copy
    /// an earlier attempt at this move left unfinished (the job failed, the manager
    /// restarted) is resumed when its node answers — the resync compares what it holds and
    /// copies the rest — and discarded when it does not.
    pub(super) async fn add_target(
        &self,
        v: &VolumeRecord,
        from: u32,
    ) -> Result<(u32, VolumeRecord)> {
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
        // A parity copy's new copy takes the old one's place in the stripes: the zones of
        // the stripe's other chunks count.
        let replacing = (!v.layout.is_mirror()).then_some(from);
        let to = self.pick_target(&v, replacing).await?;
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
        // Not in the layout until the update above: a copy the node kept is stale.
        let target = self.node(to).await?;
        match self.create_fresh(&target, &v).await {
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

    /// Creates `v`'s replica on `target`, which the layout did not name before: a copy the
    /// node kept (left behind while it was down, its replica re-created elsewhere then) is
    /// stale and made anew.
    pub(super) async fn create_fresh(
        &self,
        target: &NodeRecord,
        v: &VolumeRecord,
    ) -> Result<Status> {
        let created = self.replica_op(target, Op::CreateReplica, v).await;
        if !matches!(created, Ok(Status::Exists)) {
            return created;
        }
        tracing::info!(volume = %v.name, node = target.id, "deleting a stale replica the node kept");
        match self.replica_op(target, Op::DeleteReplica, v).await {
            Ok(Status::Ok | Status::NoReplica) => {
                self.replica_op(target, Op::CreateReplica, v).await
            }
            other => other,
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

    /// Step 3, after the writer of `epoch` retired `from`: the layout drops it, its node
    /// deletes it. Refused with [`TransitionError::StaleEpoch`] if another writer attached
    /// since: it attached from a layout that still listed `from` and may be resyncing it back
    /// into its set, so only that writer can retire it (the move runs again through it).
    pub(super) async fn finish_move(&self, v: &VolumeRecord, from: u32, epoch: u64) -> Result<()> {
        let mut to = None;
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                if rec.epoch != epoch {
                    return Err(TransitionError::StaleEpoch {
                        request: epoch,
                        current: rec.epoch,
                    }
                    .into());
                }
                let states: Vec<(u32, ReplicaState)> =
                    rec.replicas.iter().map(|r| (r.node, r.state)).collect();
                let i = trireme_replication::removal(&states, from)?;
                rec.replicas.remove(i);
                for r in &mut rec.replicas {
                    if r.moving_from == Some(from) {
                        r.moving_from = None;
                        to = Some(r.node);
                    }
                }
                Ok(())
            })
            .await?;
        if let Some(to) = to {
            self.move_snapshot_records(&v, from, to).await;
        }
        self.delete_old(&v, from).await;
        Ok(())
    }

    /// The snapshots' records name the node a copy moved to in place of the one it left, for
    /// those its new copy holds (asked of it; the writer checked before retiring the old
    /// one). Best effort: `snapshot list` asks the nodes anyway.
    async fn move_snapshot_records(&self, v: &VolumeRecord, from: u32, to: u32) {
        let held = match self.node(to).await {
            Ok(n) => self.snapshots_at(v, &n).await,
            Err(e) => Err(e),
        };
        let held: Vec<u64> = match held {
            Ok(h) => h.iter().map(|s| s.id).collect(),
            Err(e) => {
                tracing::warn!(volume = %v.name, node = to, "asking the new copy for its snapshots: {e}");
                return;
            }
        };
        let recs = match self.meta().snapshots(v).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(volume = %v.name, "reading the snapshots' records: {e}");
                return;
            }
        };
        for mut rec in recs {
            if !held.contains(&rec.id) || rec.nodes.contains(&to) {
                continue;
            }
            rec.nodes.retain(|&n| n != from);
            rec.nodes.push(to);
            rec.nodes.sort_unstable();
            if let Err(e) = self.meta().put_snapshot_record(&v.name, &rec).await {
                tracing::warn!(volume = %v.name, snapshot = %rec.name, "recording where the snapshot moved: {e}");
            }
        }
    }

    pub(super) async fn delete_old(&self, v: &VolumeRecord, node: u32) {
        match self.node(node).await {
            Ok(n) => match self.replica_op(&n, Op::DeleteReplica, v).await {
                Ok(Status::Ok | Status::NoReplica) => {}
                // Clones' copies on that node read from it: they take their blocks first.
                Ok(Status::InUse) => match self.flatten_clones_on(v, &n).await {
                    Ok(()) => match self.replica_op(&n, Op::DeleteReplica, v).await {
                        Ok(Status::Ok | Status::NoReplica) => {}
                        other => {
                            tracing::warn!(volume = %v.name, node, "old replica not deleted after its clones' copies were flattened: {other:?}")
                        }
                    },
                    Err(e) => tracing::warn!(
                        volume = %v.name,
                        node,
                        "old replica not deleted: clones there read from it, and flattening them failed: {e}"
                    ),
                },
                other => {
                    tracing::warn!(volume = %v.name, node, "old replica not deleted (the node may be down): {other:?}")
                }
            },
            Err(e) => tracing::warn!(volume = %v.name, node, "{e}"),
        }
    }
}
