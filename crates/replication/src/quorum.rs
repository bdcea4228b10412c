//! When a mirrored write may be acknowledged.

/// What one replica said about a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaOutcome {
    /// The replica holds the data (durably, if the write was FUA).
    Done,
    /// The replica refused: a newer writer holds it. This writer must stop.
    Fenced,
    /// The replica failed the write, or could not be reached.
    Failed,
    /// The replica refused the request itself (out of range, malformed): a client bug.
    Refused,
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
}

/// Collects replies for one write. The write is acknowledged only when every target replica
/// holds it (synchronous mirroring, guarantee 1); any failure fails the write. A fenced reply
/// wins over other failures, because it tells the caller to stop writing at all.
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
        if self.targets.is_empty() {
            return Err(WriteFailure::NoReplicas);
        }
        let mut failure = None;
        for (k, r) in self.replies.iter().enumerate() {
            let replica = self.targets[k];
            match r {
                Some(ReplicaOutcome::Done) => {}
                Some(ReplicaOutcome::Fenced) => return Err(WriteFailure::Fenced),
                Some(ReplicaOutcome::Failed) | None => {
                    failure.get_or_insert(WriteFailure::ReplicaFailed { replica });
                }
                Some(ReplicaOutcome::Refused) => {
                    failure.get_or_insert(WriteFailure::Refused { replica });
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// The result when no replies are pending (used for an empty target list).
    pub fn finish_empty(&self) -> Option<Result<(), WriteFailure>> {
        self.targets.is_empty().then(|| self.result())
    }
}
