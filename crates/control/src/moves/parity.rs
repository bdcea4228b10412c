//! Moving a parity volume's copy off a node. A parity copy is its chunks and the regions it
//! mirrors, not a whole copy another can sit beside, so the new copy takes the old one's
//! place in the stripes (`VolumeCore::replace`):
//! 1. the writer takes the old copy out if it takes writes, as for a planned restart (refused
//!    when one of its regions would keep fewer mirrors than the minimum, or the stripes fewer
//!    than K nodes);
//! 2. a target is chosen (as for a mirror's copy, and with zones, none holding more than M
//!    of the stripe's chunks), the record lists it in the old copy's place, failed and
//!    `moving_from` the old node, and its copy is created;
//! 3. the writer replaces the copy and rebuilds the new one whole; once it is in sync the
//!    record drops `moving_from` and the old node deletes its copy.
//!
//! Until the new copy is in sync the volume tolerates one loss fewer: `status` shows it
//! degraded meanwhile. A move run again finds the copy an earlier attempt recorded
//! (`moving_from`) and goes on with it. A writer on another host does steps 1 and 3 at the
//! manager's request (`parity_remote.rs`).

use std::sync::Arc;
use std::time::Duration;

use trireme_client::Volume;
use trireme_meta::{MetaError, ReplicaRecord, VolumeRecord};
use trireme_proto::{Op, Status};
use trireme_replication::ReplicaState;

use crate::error::refused;
use crate::manager::{Manager, Result};

/// How long the old copy is held out of resyncs while it is replaced (the replacement lets
/// it go at once; a refused one releases it).
const HOLD: Duration = Duration::from_secs(3600);

impl Manager {
    /// Moves `v`'s parity copy off `from` through `writer` (see the module docs).
    pub(super) async fn replace_with(
        &self,
        writer: &Arc<Volume>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        let to = match self.resume_replacement(v, from).await? {
            Some(to) => to,
            None => self.place_replacement(writer, v, from).await?,
        };
        self.update_move(from, |m| m.to = Some(to));
        self.save_job(from).await;
        tracing::info!(volume = %v.name, from, to, "replacing a parity copy in its place");
        super::mover::replace_then_rebuild(self.meta(), writer, from, to, rate, &mut |p| {
            self.update_move(from, |m| m.progress = p.cloned())
        })
        .await?;
        self.finish_replacement(&v.name, from, to).await
    }

    /// The copy an earlier attempt recorded in `from`'s place (`moving_from`), if any: its
    /// node, the copy created again if it is not in sync (never made anew: the writer may be
    /// rebuilding it, or have finished).
    pub(super) async fn resume_replacement(
        &self,
        v: &VolumeRecord,
        from: u32,
    ) -> Result<Option<u32>> {
        let Some(r) = v.replicas.iter().find(|r| r.moving_from == Some(from)) else {
            return Ok(None);
        };
        tracing::info!(volume = %v.name, from, to = r.node, "resuming the replacement of a parity copy");
        if r.state != ReplicaState::InSync {
            self.create_on(v, r.node, false).await?;
        }
        Ok(Some(r.node))
    }

    /// Steps 1 and 2: the old copy out, the new one on record in its place and created.
    async fn place_replacement(
        &self,
        writer: &Arc<Volume>,
        v: &VolumeRecord,
        from: u32,
    ) -> Result<u32> {
        let to = self.pick_target(v, Some(from)).await?;
        if writer.take_out_node(from, HOLD).await? {
            warn_meanwhile(v, from, to);
        }
        if let Err(e) = self.record_replacement(v, from, to).await {
            writer.release_node(from);
            return Err(e);
        }
        Ok(to)
    }

    /// Step 2: the copy on `to` on record in `from`'s place (failed, `moving_from`), once
    /// the writer has the old copy out, and created; put back as it was if creating fails.
    pub(super) async fn record_replacement(
        &self,
        v: &VolumeRecord,
        from: u32,
        to: u32,
    ) -> Result<()> {
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                let Some(at) = rec.replicas.iter().position(|r| r.node == from) else {
                    return Err(MetaError::Refused(format!(
                        "node {from} holds no copy of {} on record",
                        rec.name
                    )));
                };
                if rec.replicas[at].state == ReplicaState::InSync {
                    return Err(MetaError::Refused(format!(
                        "the copy on node {from} is still in sync on record: the writer could not take it out"
                    )));
                }
                if rec.replicas.iter().any(|r| r.node == to) {
                    return Err(MetaError::Refused(format!(
                        "node {to} already holds a copy"
                    )));
                }
                // In the old copy's place: the record's order is the stripes' chunk order.
                rec.replicas[at] = ReplicaRecord {
                    node: to,
                    state: ReplicaState::Failed,
                    incarnation: 0,
                    moving_from: Some(from),
                };
                Ok(())
            })
            .await?;
        if let Err(e) = self.create_on(&v, to, true).await {
            // Not told to the writer yet: the old copy goes back in its place, out of sync,
            // and its resync brings it back.
            let undone = self
                .meta()
                .update_volume(&v.name, &mut |rec| {
                    for r in rec.replicas.iter_mut().filter(|r| r.node == to) {
                        *r = ReplicaRecord {
                            node: from,
                            state: ReplicaState::Outdated,
                            incarnation: 0,
                            moving_from: None,
                        };
                    }
                    Ok(())
                })
                .await;
            if let Err(u) = undone {
                tracing::warn!(volume = %v.name, from, to, "putting the old copy back on record: {u}");
            }
            return Err(e);
        }
        Ok(())
    }

    /// The end of a replacement: the new copy in sync, the record forgets the move, and the
    /// old node deletes its copy.
    pub(super) async fn finish_replacement(&self, name: &str, from: u32, to: u32) -> Result<()> {
        let v = self
            .meta()
            .update_volume(name, &mut |rec| {
                for r in rec.replicas.iter_mut().filter(|r| r.node == to) {
                    r.moving_from = None;
                }
                Ok(())
            })
            .await?;
        self.delete_old(&v, from).await;
        tracing::info!(volume = %name, from, to, "parity copy replaced");
        Ok(())
    }

    /// Creates `v`'s copy on `to`. `fresh`: the record named no copy there before this move,
    /// so one the node kept is stale and made anew; else one there is the move's own, kept
    /// (an earlier attempt's, resumed).
    pub(super) async fn create_on(&self, v: &VolumeRecord, to: u32, fresh: bool) -> Result<()> {
        let target = self.node(to).await?;
        let created = match fresh {
            true => self.create_fresh(&target, v).await,
            false => match self.replica_op(&target, Op::CreateReplica, v).await {
                Ok(Status::Exists) => Ok(Status::Ok),
                other => other,
            },
        };
        match created {
            Ok(Status::Ok) => {
                self.pin_new_replica(&target, v).await;
                Ok(())
            }
            outcome => Err(refused(format!(
                "creating the new copy on node {to}: {outcome:?}"
            ))),
        }
    }
}

/// Said when a parity copy goes out until its replacement is rebuilt.
pub(super) fn warn_meanwhile(v: &VolumeRecord, from: u32, to: u32) {
    let tolerated = match v.layout {
        trireme_replication::Layout::Parity(p) => p.parity - 1,
        _ => 0,
    };
    tracing::warn!(volume = %v.name, from, to, "the parity copy on node {from} is out until its replacement on node {to} is rebuilt: the volume survives {tolerated} more lost node(s) meanwhile");
}
