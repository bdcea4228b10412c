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
//! (`moving_from`) and goes on with it. A writer on another host is not asked (not built):
//! the volume is detached first.

use std::sync::Arc;
use std::time::Duration;

use trireme_client::Volume;
use trireme_meta::{MetaError, ReplicaRecord, VolumeRecord};
use trireme_proto::{Op, Status};
use trireme_replication::ReplicaState;

use crate::error::refused;
use crate::manager::{Manager, Result};

use super::POLL;

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
        let earlier = v.replicas.iter().find(|r| r.moving_from == Some(from));
        let to = match earlier {
            Some(r) => {
                tracing::info!(volume = %v.name, from, to = r.node, "resuming the replacement of a parity copy");
                // Never made anew: the writer may be rebuilding it, or have finished.
                if r.state != ReplicaState::InSync {
                    self.create_on(v, r.node, false).await?;
                }
                r.node
            }
            None => self.place_replacement(writer, v, from).await?,
        };
        self.update_move(from, |m| m.to = Some(to));
        self.save_job(from).await;
        tracing::info!(volume = %v.name, from, to, "replacing a parity copy in its place");
        writer.replace_replica(from, to, rate).await?;
        self.wait_rebuilt(writer, &v.name, from, to).await?;
        let v = self
            .meta()
            .update_volume(&v.name, &mut |rec| {
                for r in rec.replicas.iter_mut().filter(|r| r.node == to) {
                    r.moving_from = None;
                }
                Ok(())
            })
            .await?;
        self.delete_old(&v, from).await;
        tracing::info!(volume = %v.name, from, to, "parity copy replaced");
        Ok(())
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
            let tolerated = match v.layout {
                trireme_replication::Layout::Parity(p) => p.parity - 1,
                _ => 0,
            };
            tracing::warn!(volume = %v.name, from, to, "the parity copy on node {from} is out until its replacement on node {to} is rebuilt: the volume survives {tolerated} more lost node(s) meanwhile");
        }
        let recorded = self
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
            .await;
        let v = match recorded {
            Ok(v) => v,
            Err(e) => {
                writer.release_node(from);
                return Err(e.into());
            }
        };
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
            writer.release_node(from);
            if let Err(u) = undone {
                tracing::warn!(volume = %v.name, from, to, "putting the old copy back on record: {u}");
            }
            return Err(e);
        }
        Ok(to)
    }

    /// Creates `v`'s copy on `to`. `fresh`: the record named no copy there before this move,
    /// so one the node kept is stale and made anew; else one there is the move's own, kept
    /// (an earlier attempt's, resumed).
    async fn create_on(&self, v: &VolumeRecord, to: u32, fresh: bool) -> Result<()> {
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

    /// Step 3's wait: until the writer has the copy on `to` in sync. Fails if the writer is
    /// fenced by a newer attach meanwhile (the move then runs again through the new one).
    async fn wait_rebuilt(&self, writer: &Volume, name: &str, from: u32, to: u32) -> Result<()> {
        loop {
            let epoch = self.meta().volume(name).await?.epoch;
            if epoch != writer.info().epoch {
                return Err(refused(
                    "the writer was fenced by a newer attach; run the command again",
                ));
            }
            match writer.replica_views().into_iter().find(|r| r.node == to) {
                Some(r) if r.state == ReplicaState::InSync => break,
                Some(r) => {
                    let p = r.resync.clone();
                    self.update_move(from, |m| m.progress = p);
                }
                None => {
                    return Err(refused(format!(
                        "the writer dropped the new copy on node {to}"
                    )))
                }
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }
}
