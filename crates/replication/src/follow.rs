//! A parity copy's follower: the new copy of a move, kept beside the old one until it is
//! whole, so that a drain never leaves the volume one loss short.
//!
//! A parity copy is its place in the stripes (its chunk of each stripe, the regions it
//! mirrors), so a new copy cannot sit beside it as a mirror's does. A follower fills the
//! same place as a second node ([`VolumeCore::place_node`]):
//!
//! | | the place's node | its follower |
//! |---|---|---|
//! | writes, trims and zeroes of the regions the place mirrors, flushes | yes | yes |
//! | reads, rebuild sources, counts (in sync, a region's mirrors, K) | yes | no |
//! | its whole resync | | copies the regions the place mirrors, rebuilds its chunks |
//!
//! - While a follower is not in place, no encode switches (every copy must be in sync), so
//!   the chunks its resync rebuilds stay the stripes'. Following begins only when no encode
//!   is past its flush: that encode's trims name the place's node alone.
//! - Once its resync is done it is caught up and stays resyncing (taking writes, counted
//!   nowhere) until the writer records it and it takes the place in one step
//!   ([`VolumeCore::promote`]); the old copy is then moved off.

use crate::{Refusal, ReplicaState, ResyncProgress, VolumeCore};

impl VolumeCore {
    /// A follower of `from`'s place on `to` (a parity copy's move): it starts failed, for a
    /// whole resync at `rate` bytes per second (0: the volume's). `Ok((i, false))` if `to`
    /// follows `from` already, or holds its place already (asked again by a manager that
    /// took over).
    pub fn follow(&mut self, from: u32, to: u32, rate: u64) -> Result<(usize, bool), Refusal> {
        let Some(map) = &self.regions else {
            return Err(Refusal::NotParity);
        };
        let placed = |n: u32| map.stripes().nodes.contains(&n);
        if let Some(i) = self.slot_of(to) {
            if self.records[i].follows == Some(from) || (placed(to) && !placed(from)) {
                self.records[i].rate = rate;
                return Ok((i, false));
            }
            return Err(Refusal::HoldsACopy(to));
        }
        if !placed(from) {
            return Err(Refusal::NoPlace(from));
        }
        if let Some(f) = self.follower() {
            return Err(Refusal::Following(self.records[f].node));
        }
        if map.past_flush() {
            return Err(Refusal::Switching);
        }
        let (i, _) = self.add(to, rate)?;
        self.records[i].follows = Some(from);
        if let Some(map) = &mut self.regions {
            map.abandon_unswitched();
        }
        Ok((i, true))
    }

    /// The follower, if a move has one (at most one at a time).
    pub fn follower(&self) -> Option<usize> {
        (0..self.set.len()).find(|&i| {
            self.records[i].follows.is_some() && self.set.state(i) != ReplicaState::Removed
        })
    }

    /// Whether replica `i` is a follower whose resync is done.
    pub fn is_caught_up(&self, i: usize) -> bool {
        self.records[i].caught_up.is_some() && self.set.state(i) == ReplicaState::Resyncing
    }

    /// The incarnation a caught-up follower had when its resync was done (None: not a
    /// follower, or not caught up).
    pub fn caught_up_as(&self, i: usize) -> Option<u64> {
        self.records[i].caught_up.filter(|_| self.is_caught_up(i))
    }

    /// A follower's resync is done (`resync_done`): it holds its place's data as
    /// `incarnation`, and keeps taking writes until it takes the place.
    pub(crate) fn caught_up(&mut self, i: usize, incarnation: u64, progress: ResyncProgress) {
        self.records[i].caught_up = Some(incarnation);
        self.records[i].resync = None;
        self.finished.insert(self.records[i].node, progress);
    }

    /// The caught-up follower on `to` takes the place it follows: in sync from now on, the
    /// stripes naming it, and the old copy moved off. The writer has recorded it first, with
    /// every request held. `Ok(Some(old))`: the old copy's slot; `Ok(None)`: `to` holds
    /// the place already.
    pub fn promote(&mut self, to: u32) -> Result<Option<usize>, Refusal> {
        let Some(i) = self.slot_of(to) else {
            return Err(Refusal::NotFollowing(to));
        };
        let Some(from) = self.records[i].follows else {
            let placed = self
                .regions
                .as_ref()
                .is_some_and(|m| m.stripes().nodes.contains(&to));
            return placed.then_some(None).ok_or(Refusal::NotFollowing(to));
        };
        let Some(incarnation) = self.caught_up_as(i) else {
            return Err(Refusal::NotCaughtUp(to));
        };
        let old = self.slot_of(from);
        let map = self.regions.as_mut().ok_or(Refusal::NotParity)?;
        if map.switching() {
            return Err(Refusal::Switching);
        }
        map.replace_node(from, to);
        let r = &mut self.records[i];
        (r.follows, r.caught_up, r.incarnation) = (None, None, incarnation);
        self.set.set_state(i, ReplicaState::InSync);
        if let Some(o) = old {
            self.retire(o);
        }
        Ok(old)
    }

    /// The follower on `to` is dropped (its move failed or was given up): moved off, its
    /// slot returned.
    pub fn unfollow(&mut self, to: u32) -> Option<usize> {
        let i = self.slot_of(to)?;
        self.records[i].follows?;
        self.retire(i);
        Some(i)
    }
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
