//! When a mirrored write may be acknowledged, and what the writer does when it may not.

use crate::{ReplicaSet, ReplicaState};

/// What one replica said about a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaOutcome {
    /// The replica holds the data (durably, if the write was FUA).
    Done,
    /// The replica refused: a newer writer holds it. This writer must stop.
    Fenced,
    /// The replica could not be reached, did not answer in time, or dropped the link.
    Failed,
    /// The replica answered that its store failed the request (an I/O error): what it holds
    /// of the request's bytes is unknown.
    StoreFailed,
    /// The replica refused the request itself (out of range, malformed): a client bug.
    Refused,
    /// The replica refused a write for want of space, before writing anything.
    NoSpace,
}

/// Why a write cannot be acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WriteFailure {
    #[error("fenced: another writer attached the volume with a newer epoch")]
    Fenced,
    #[error("replica {replica} failed the write")]
    ReplicaFailed { replica: usize },
    #[error("replica {replica} refused the request")]
    Refused { replica: usize },
    #[error("no in-sync replica to write to")]
    NoReplicas,
    #[error("no space left on replica {replica}")]
    NoSpace { replica: usize },
    #[error("the request crosses the end of a parity region at byte {at}: each region's part goes on its own")]
    CrossesRegion { at: u64 },
}

/// Collects replies for one write. The write is acknowledged only when every target replica
/// holds it (synchronous mirroring, guarantee 1); any failure fails the write. A fenced reply
/// wins over other failures, because it tells the caller to stop writing at all; a refused
/// request wins over a failed replica, because it must not be absorbed by a take-out.
#[derive(Debug, Clone)]
pub struct WriteQuorum {
    targets: Vec<usize>,
    replies: Vec<Option<ReplicaOutcome>>,
}

impl WriteQuorum {
    pub fn new(targets: Vec<usize>) -> WriteQuorum {
        let n = targets.len();
        WriteQuorum {
            targets,
            replies: vec![None; n],
        }
    }

    pub fn targets(&self) -> &[usize] {
        &self.targets
    }

    /// Records the reply of the `k`-th target. Returns the write's result once it is known.
    pub fn record(
        &mut self,
        k: usize,
        outcome: ReplicaOutcome,
    ) -> Option<Result<(), WriteFailure>> {
        assert!(self.replies[k].is_none(), "target {k} answered twice");
        self.replies[k] = Some(outcome);
        if self.replies.iter().any(Option::is_none) {
            return None;
        }
        Some(self.result())
    }

    fn result(&self) -> Result<(), WriteFailure> {
        outcome(&self.targets, self.replies.iter().copied())
    }

    /// The result when no replies are pending (used for an empty target list).
    pub fn finish_empty(&self) -> Option<Result<(), WriteFailure>> {
        self.targets.is_empty().then(|| self.result())
    }
}

/// A write's result from its targets' replies (`None`: no answer, counted as failed). Fenced
/// wins (the writer must stop), then a refusal of the request itself (no replica may be taken
/// out for a request it refused: it never wrote it, and would still count as holding the data),
/// then a refusal for want of space (likewise), then a plain failure.
fn outcome(
    targets: &[usize],
    replies: impl Iterator<Item = Option<ReplicaOutcome>>,
) -> Result<(), WriteFailure> {
    if targets.is_empty() {
        return Err(WriteFailure::NoReplicas);
    }
    let mut refused = None;
    let mut no_space = None;
    let mut failed = None;
    for (&replica, r) in targets.iter().zip(replies) {
        match r {
            Some(ReplicaOutcome::Done) => {}
            Some(ReplicaOutcome::Fenced) => return Err(WriteFailure::Fenced),
            Some(ReplicaOutcome::Refused) => {
                refused.get_or_insert(WriteFailure::Refused { replica });
            }
            Some(ReplicaOutcome::NoSpace) => {
                no_space.get_or_insert(WriteFailure::NoSpace { replica });
            }
            Some(ReplicaOutcome::Failed | ReplicaOutcome::StoreFailed) | None => {
                failed.get_or_insert(WriteFailure::ReplicaFailed { replica });
            }
        }
    }
    refused.or(no_space).or(failed).map_or(Ok(()), Err)
}

/// A request mirrored to every write target, as [`decide`] needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mirrored {
    /// Bytes change in `[offset, offset + len)` (a write, write-zeroes or trim).
    Data { offset: u64, len: u64 },
    /// A flush: makes every completed write durable.
    Flush,
    /// A snapshot's barrier: each target records a snapshot of what it holds, with every
    /// write held. A target that fails it is taken out (its resync gives it the snapshot, as
    /// to any copy out when one is taken); one refused for space fails the snapshot, as a
    /// snapshot has no reserve to use.
    Snapshot,
}

/// What the writer does once every target of a mirrored request has answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every target holds it: acknowledge.
    Ack,
    /// Fail the request.
    Fail(WriteFailure),
    /// Take `replicas` out (recorded out of sync, the survivors tracking `range` for them and
    /// every later write), then acknowledge: an in-sync replica holds the request. With
    /// `lost_history`, what they hold is unknown (a flush their store failed), so they come
    /// back through a full resync rather than an incremental one.
    TakeOut {
        replicas: Vec<usize>,
        range: Option<(u64, u64)>,
        lost_history: bool,
    },
    /// Send the request again to `replicas`, which refused it for want of space while an
    /// in-sync replica wrote it, letting them use their reserve; then decide on every answer
    /// again, the new ones in place of the refusals (a refusal again counts as a failure of
    /// the store). The copies must not differ over a write answered either way: a guest that
    /// gets ENOSPC may read the range back, and must read the same from every copy.
    UseReserve { replicas: Vec<usize> },
}

/// The writer's rule for a mirrored request whose targets (`targets`, replica indexes into
/// `set`) answered `replies` (in the same order). A replica that failed is taken out rather
/// than the request failed only if the writer can record that (`can_take_out`: it has a
/// control plane), every failure is a plain one (no fencing, no refusal of the request
/// itself), and an in-sync replica holds the request. Otherwise every target must hold it.
/// Refusals for want of space are never taken out (the copy is well, its device full): if
/// another target wrote the request they get it again with leave to use their reserve
/// ([`Decision::UseReserve`]); if none did, the request fails with nothing written
/// ([`WriteFailure::NoSpace`], ENOSPC to the guest).
pub fn decide(
    request: Mirrored,
    targets: &[usize],
    replies: &[ReplicaOutcome],
    set: &ReplicaSet,
    can_take_out: bool,
) -> Decision {
    assert_eq!(targets.len(), replies.len(), "one reply per target");
    let no_space: Vec<usize> = targets
        .iter()
        .zip(replies)
        .filter(|(_, &r)| r == ReplicaOutcome::NoSpace)
        .map(|(&i, _)| i)
        .collect();
    let written = replies.contains(&ReplicaOutcome::Done);
    let refused = replies
        .iter()
        .any(|r| matches!(r, ReplicaOutcome::Fenced | ReplicaOutcome::Refused));
    if !no_space.is_empty() && written && !refused && request != Mirrored::Snapshot {
        return Decision::UseReserve { replicas: no_space };
    }
    let failure = match outcome(targets, replies.iter().copied().map(Some)) {
        Ok(()) => return Decision::Ack,
        Err(f) => f,
    };
    let failed: Vec<usize> = targets
        .iter()
        .zip(replies)
        .filter(|(_, r)| matches!(r, ReplicaOutcome::Failed | ReplicaOutcome::StoreFailed))
        .map(|(&i, _)| i)
        .collect();
    let held_in_sync = targets
        .iter()
        .zip(replies)
        .any(|(&i, &r)| r == ReplicaOutcome::Done && set.state(i) == ReplicaState::InSync);
    if !can_take_out || !matches!(failure, WriteFailure::ReplicaFailed { .. }) || !held_in_sync {
        return Decision::Fail(failure);
    }
    let store_failed = replies.contains(&ReplicaOutcome::StoreFailed);
    let (range, lost_history) = match request {
        Mirrored::Data { offset, len } => (Some((offset, len)), false),
        Mirrored::Flush | Mirrored::Snapshot => (None, store_failed),
    };
    Decision::TakeOut {
        replicas: failed,
        range,
        lost_history,
    }
}
