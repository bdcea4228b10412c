//! Moving a parity volume's copy off a node. A parity copy is its place in the stripes (its
//! chunk of each stripe and the regions it mirrors), so the new copy cannot sit beside the
//! old one as a mirror's does: it follows the old one's place, then takes it. The old copy
//! serves throughout, so a drain never leaves the volume one loss short.
//!
//! | step | who | what |
//! |---|---|---|
//! | 1 | the manager | a target chosen (zones: none holding more than M of the stripe's chunks), the new copy on record beside the old one, failed and `moving_from` it, and created (`add_target`, as for a mirror) |
//! | 2 | the writer, here or on another host (a `MoveRequest`) | the new copy follows the old one's place: it takes every request that place takes while its resync rebuilds it whole; then, every request held, it is flushed, recorded in sync, the old copy recorded outdated, and it takes the place (`follow_then_promote`) |
//! | 3 | the manager | the record names the new copy in the old one's place, and the old node deletes its copy ([`Manager::finish_follow`]) |
//!
//! At every step the record says which copy holds the place (a writer attaching reads it so:
//! `trireme_client`'s `resolve_followers`): the new one once it is in sync and the old one
//! is not, else the old one. A move run again finds the copy an earlier attempt recorded
//! (`moving_from`) and goes on with it.

use trireme_meta::{MetaError, VolumeRecord};
use trireme_replication::ReplicaState;

use crate::manager::{Manager, Result};

impl Manager {
    /// The end of a move, once the writer of `epoch` has the new copy in the old one's
    /// place: a mirror's record drops the old copy ([`Manager::finish_move`]); a parity
    /// volume's names the new copy in the old one's place ([`Manager::finish_follow`]).
    pub(super) async fn finish(&self, v: &VolumeRecord, from: u32, epoch: u64) -> Result<()> {
        match v.layout.is_mirror() {
            true => self.finish_move(v, from, epoch).await,
            false => self.finish_follow(&v.name, from).await,
        }
    }

    /// Step 3 (see the module docs): the copy that moved from `from` takes its place on
    /// record, and `from`'s node deletes its copy. Refused unless the writer recorded the
    /// new copy in sync and the old one not: until then the old copy holds the place for
    /// any writer that attaches. Any writer's: one that attached since read the same.
    pub(super) async fn finish_follow(&self, name: &str, from: u32) -> Result<()> {
        let mut moved = None;
        let v = self
            .meta()
            .update_volume(name, &mut |rec| {
                let Some(k) = rec.replicas.iter().position(|r| r.moving_from == Some(from))
                else {
                    return Err(MetaError::Refused(format!(
                        "no copy of {name} moves off node {from} on record"
                    )));
                };
                let new = rec.replicas[k].clone();
                moved = Some(new.node);
                let Some(at) = rec.replicas.iter().position(|r| r.node == from) else {
                    // Finished already but for `moving_from` (an earlier form of the move).
                    rec.replicas[k].moving_from = None;
                    return Ok(());
                };
                if new.state != ReplicaState::InSync || rec.replicas[at].state == ReplicaState::InSync
                {
                    return Err(MetaError::Refused(format!(
                        "the new copy of {name} on node {} has not taken node {from}'s place on record",
                        new.node
                    )));
                }
                rec.replicas[at] = trireme_meta::ReplicaRecord {
                    moving_from: None,
                    ..new
                };
                rec.replicas.remove(k);
                Ok(())
            })
            .await?;
        self.delete_old(&v, from).await;
        tracing::info!(volume = %name, from, to = ?moved, "parity copy moved");
        Ok(())
    }
}
