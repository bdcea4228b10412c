//! A parity copy's move with the old copy kept until the new one is whole: the writer's side
//! of the core's follower (`replication/src/follow.rs`).
//!
//! | step | what the writer does |
//! |---|---|
//! | [`Volume::follow_replica`] | the new copy (on record beside the old one, `moving_from` it) follows the old one's place, every request held meanwhile; the resync task rebuilds it whole |
//! | [`Volume::caught_up`] | says when it is whole |
//! | [`Volume::promote_replica`] | with every request held: a flush of the new copy, then the record (the new copy in sync, then the old one outdated), then the new copy takes the place and the old one is moved off |
//!
//! The record says at every moment which copy holds the place ([`resolve_followers`], at
//! attach): the new one once it is in sync on record and the old one is not; else the old
//! one, and the new one is left out (a move run again follows anew).

use std::time::Duration;

use trireme_replication::{Refusal, ReplicaState};

use crate::{AttachInfo, MembershipError, Volume, VolumeError};

/// How long a follow waits for encodes past their flush to finish their trims.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);

/// Whether a move's new copy is whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Following {
    /// Its resync is still going (or will start again: it failed).
    Filling,
    /// Whole: it may take the place.
    CaughtUp,
    /// It holds the place already.
    InPlace,
}

impl Volume {
    /// The copy on `to`, created and on record beside the one on `from` (`moving_from` it),
    /// follows `from`'s place: it takes every request that place takes, and the resync task
    /// rebuilds it whole at most `rate` bytes per second. The old copy keeps serving.
    pub async fn follow_replica(
        &self,
        from: u32,
        to: u32,
        rate: Option<u64>,
    ) -> Result<(), VolumeError> {
        self.membership()?;
        let deadline = tokio::time::Instant::now() + FOLLOW_WAIT;
        loop {
            let _all = self.core.acquire(0, self.size()).await;
            let _g = self.membership_lock.lock().await;
            self.drop_stale_follower(from, to).await;
            let followed = {
                let mut core = self.core();
                self.name_next_slot(&core, to);
                core.follow(from, to, rate.unwrap_or(0))
            };
            match followed {
                Ok((_, false)) => return Ok(()),
                Ok((i, true)) => {
                    self.set_conn(i, None);
                    tracing::info!(volume = %self.info.name, from, to, "the new copy follows the old one's place; a whole resync follows");
                    return Ok(());
                }
                // An encode past its flush trims the place's node alone: let it end.
                Err(Refusal::Switching) if tokio::time::Instant::now() < deadline => {}
                Err(r) => return Err(self.degrade(to, r)),
            }
            drop((_all, _g));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A follower of `from`'s place on another node than `to` is an earlier attempt's the
    /// manager gave up (its node did not answer, and the record dropped it): it goes, or it
    /// would refuse this move and keep every encode waiting.
    async fn drop_stale_follower(&self, from: u32, to: u32) {
        let stale = {
            let core = self.core();
            core.follower()
                .filter(|&f| core.place_node(f) == from && core.node(f) != to)
                .map(|f| core.node(f))
        };
        if let Some(node) = stale {
            tracing::info!(volume = %self.info.name, from, node, to, "an earlier attempt's copy no longer follows");
            self.drop_follower(node).await;
        }
    }

    /// Where the copy on `to` stands in a move (None: it is neither following nor placed).
    pub fn caught_up(&self, to: u32) -> Option<Following> {
        let core = self.core();
        let i = core.slot_of(to)?;
        if core.is_caught_up(i) {
            return Some(Following::CaughtUp);
        }
        if core.follower() == Some(i) {
            return Some(Following::Filling);
        }
        let placed = core
            .region_map()
            .is_some_and(|m| m.stripes().nodes.contains(&to));
        (placed && core.set().state(i) == ReplicaState::InSync).then_some(Following::InPlace)
    }

    /// The caught-up copy on `to` takes the place of the one on `from` (see the module docs).
    /// Done already: nothing to do.
    pub async fn promote_replica(&self, from: u32, to: u32) -> Result<(), VolumeError> {
        let m = self.membership()?;
        let i = match (self.caught_up(to), self.slot_of(to)) {
            (Some(Following::InPlace), _) => return Ok(()),
            (Some(Following::CaughtUp), Some(i)) => i,
            _ => return Err(self.degrade(to, Refusal::NotCaughtUp(to))),
        };
        // What it acknowledged is durable before it counts. Before the holds: a failed
        // flush takes it out, and a take-out takes the membership lock (simulator seed
        // 5928: the writer stopped for good, the flush's take-out waiting on its caller).
        self.flush_resynced(i).await?;
        let _all = self.core.acquire(0, self.size()).await;
        let _g = self.membership_lock.lock().await;
        let (incarnation, old_in_sync) = {
            let core = self.core();
            let old_in_sync = core
                .slot_of(from)
                .is_some_and(|o| core.set().state(o) == ReplicaState::InSync);
            (core.caught_up_as(i), old_in_sync)
        };
        // Taken out since the flush: it fills again.
        let Some(incarnation) = incarnation else {
            return Err(self.degrade(to, Refusal::NotCaughtUp(to)));
        };
        let (name, epoch) = (&self.info.name, self.info.epoch);
        m.set_state(name, epoch, to, ReplicaState::InSync, incarnation)
            .await
            .map_err(|e| self.degrade(to, e))?;
        // From here the record names the new copy for the place.
        if old_in_sync {
            match m
                .set_state(name, epoch, from, ReplicaState::Outdated, 0)
                .await
            {
                Ok(()) | Err(MembershipError::NotOnRecord(_)) => {}
                Err(e) => return Err(self.degrade(from, e)),
            }
        }
        let old = self.core().promote(to).map_err(|r| self.degrade(to, r))?;
        if let Some(o) = old {
            self.set_conn(o, None);
            self.drop_records(o).await;
        }
        self.copies.wake();
        tracing::info!(volume = %self.info.name, from, to, "the new copy took the old one's place");
        Ok(())
    }

    /// Drops the follower on `to` (its move was given up, and the record dropped it): it
    /// takes nothing from now on.
    pub async fn unfollow_replica(&self, to: u32) {
        let _g = self.membership_lock.lock().await;
        self.drop_follower(to).await;
    }

    /// [`Volume::unfollow_replica`], the membership lock held.
    async fn drop_follower(&self, to: u32) {
        let dropped = self.core().unfollow(to);
        if let Some(i) = dropped {
            self.set_conn(i, None);
            self.drop_records(i).await;
            tracing::info!(volume = %self.info.name, to, "the new copy no longer follows");
        }
    }
}

/// A parity volume's record as a writer attaches it: a copy that follows another's place
/// (`follows`) takes that place if it is in sync on record and the other is not (its
/// promotion was recorded); else it is left out, and the move follows anew.
pub(crate) fn resolve_followers(mut info: AttachInfo) -> AttachInfo {
    if info.layout.is_mirror() {
        return info;
    }
    let followers: Vec<usize> = (0..info.replicas.len())
        .filter(|&k| {
            info.replicas[k]
                .follows
                .is_some_and(|x| info.replicas.iter().any(|r| r.node == x))
        })
        .collect();
    for &k in followers.iter().rev() {
        let mut f = info.replicas.remove(k);
        let x = f.follows.take().expect("a follower");
        let at = info
            .replicas
            .iter()
            .position(|r| r.node == x)
            .expect("checked above");
        if f.state == ReplicaState::InSync && info.replicas[at].state != ReplicaState::InSync {
            tracing::info!(volume = %info.name, from = x, to = f.node, "the new copy of a move holds the place on record");
            info.replicas[at] = f;
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::resolve_followers;
    use crate::{AttachInfo, ReplicaTarget};
    use trireme_replication::{Layout, Parity, ReplicaState};

    fn info(replicas: &[(u32, ReplicaState, Option<u32>)], layout: Layout) -> AttachInfo {
        let replicas = replicas
            .iter()
            .map(|&(node, state, follows)| ReplicaTarget {
                node,
                addr: format!("127.0.0.1:{node}"),
                local_addr: None,
                state,
                incarnation: u64::from(node),
                follows,
            })
            .collect();
        AttachInfo {
            name: "v".into(),
            id: 1,
            size: 1 << 20,
            epoch: 1,
            replicas,
            reconcile: false,
            min_copies: 0,
            preallocate: false,
            layout,
            regions: Vec::new(),
            limits: Default::default(),
        }
    }

    fn nodes(i: &AttachInfo) -> Vec<(u32, ReplicaState)> {
        i.replicas.iter().map(|r| (r.node, r.state)).collect()
    }

    /// The record says which copy holds a place: the new one once it is in sync on record
    /// and the old one not, else the old one (the new one left out, to follow anew).
    #[test]
    fn a_follower_holds_the_place_only_once_its_promotion_is_recorded() {
        use ReplicaState::{Failed, InSync, Outdated};
        let parity = Layout::Parity(Parity {
            data: 2,
            parity: 1,
            mirror_share: 20,
        });
        // Node 4's copy follows node 2's place.
        let moving = |states: [(u32, ReplicaState); 4]| {
            info(&states.map(|(n, s)| (n, s, (n == 4).then_some(2))), parity)
        };
        let r = resolve_followers(moving([(1, InSync), (2, InSync), (3, InSync), (4, Failed)]));
        assert_eq!(nodes(&r), vec![(1, InSync), (2, InSync), (3, InSync)]);
        // The writer stopped between its two records: both in sync, the old one holds.
        let half = moving([(1, InSync), (2, InSync), (3, InSync), (4, InSync)]);
        assert_eq!(nodes(&resolve_followers(half))[1], (2, InSync));
        let r = resolve_followers(moving([
            (1, InSync),
            (2, Outdated),
            (3, InSync),
            (4, InSync),
        ]));
        assert_eq!(nodes(&r), vec![(1, InSync), (4, InSync), (3, InSync)]);
        assert_eq!(r.replicas[1].follows, None);
        // A mirror's new copy is one more beside the others.
        let mirror = info(
            &[(1, InSync), (2, Outdated), (4, InSync)].map(|(n, s)| (n, s, (n == 4).then_some(2))),
            Layout::Mirror,
        );
        assert_eq!(nodes(&resolve_followers(mirror)).len(), 3);
    }
}
