//! The replica set of one attached volume.

use std::fmt;

/// State of one replica as the writer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaState {
    /// Holds every acknowledged write: takes writes, may serve reads.
    InSync,
    /// Missed writes: takes no reads and is no resync source until resynced.
    Outdated,
    /// Being resynced by the writer: takes every new write, serves no reads, and is still
    /// outdated in the metadata until the copy completes.
    Resyncing,
    /// Unusable (its node is gone or its store failed).
    Failed,
    /// Moved off (drained or removed): takes nothing and is never resynced. The writer's view
    /// only; the metadata drops the replica instead.
    Removed,
}

impl fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicaState::InSync => "in-sync",
            ReplicaState::Outdated => "outdated",
            ReplicaState::Resyncing => "resyncing",
            ReplicaState::Failed => "failed",
            ReplicaState::Removed => "removed",
        })
    }
}

/// The replicas of an attached volume, by index, with their states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSet {
    states: Vec<ReplicaState>,
    /// Index of a replica in the writer's own host or process, preferred for reads.
    local: Option<usize>,
}

impl ReplicaSet {
    pub fn new(states: Vec<ReplicaState>, local: Option<usize>) -> ReplicaSet {
        ReplicaSet { states, local }
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    pub fn state(&self, i: usize) -> ReplicaState {
        self.states[i]
    }

    pub fn set_state(&mut self, i: usize, s: ReplicaState) {
        self.states[i] = s;
    }

    /// Adds a replica (a move's new copy) and returns its index. Indices never change.
    pub fn push(&mut self, s: ReplicaState) -> usize {
        self.states.push(s);
        self.states.len() - 1
    }

    pub fn states(&self) -> &[ReplicaState] {
        &self.states
    }

    /// In-sync replicas: the ones that may serve reads and be resync sources.
    pub fn in_sync(&self) -> Vec<usize> {
        (0..self.states.len())
            .filter(|&i| self.states[i] == ReplicaState::InSync)
            .collect()
    }

    /// How many replicas are in sync, without building the list (the write path asks this for
    /// every write).
    pub fn in_sync_count(&self) -> usize {
        self.states
            .iter()
            .filter(|&&s| s == ReplicaState::InSync)
            .count()
    }

    /// Replicas every write is sent to: the in-sync ones and any being resynced.
    pub fn write_targets(&self) -> Vec<usize> {
        (0..self.states.len())
            .filter(|&i| {
                matches!(
                    self.states[i],
                    ReplicaState::InSync | ReplicaState::Resyncing
                )
            })
            .collect()
    }

    /// The order in which to try replicas for a read: the local replica if in sync, otherwise
    /// in-sync replicas rotated by `spread` (a counter the caller advances per read), so reads
    /// spread over all copies. Only in-sync replicas appear (guarantee 3).
    pub fn read_order(&self, spread: usize) -> Vec<usize> {
        let in_sync = self.in_sync();
        if in_sync.is_empty() {
            return in_sync;
        }
        let mut order: Vec<usize> = Vec::with_capacity(in_sync.len());
        if let Some(l) = self.local.filter(|l| in_sync.contains(l)) {
            order.push(l);
        }
        let start = spread % in_sync.len();
        for k in 0..in_sync.len() {
            let i = in_sync[(start + k) % in_sync.len()];
            if !order.contains(&i) {
                order.push(i);
            }
        }
        order
    }
}

/// Why a replica state change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error(
        "epoch {request} is not the volume's current epoch {current}: a newer writer holds it"
    )]
    StaleEpoch { request: u64, current: u64 },
    #[error("node {0} holds no replica of this volume")]
    NoSuchReplica(u32),
    #[error("replica on node {0} is the last in-sync copy; it cannot be taken out")]
    LastInSync(u32),
    #[error("a replica cannot be recorded as {0}")]
    NotStorable(ReplicaState),
}

/// The minimum of in-sync copies writes go on with when a volume sets none: one fewer than
/// its replicas (2 of 3, 1 of 2), and at least 1.
pub fn default_min_copies(replicas: usize) -> u32 {
    replicas.saturating_sub(1).max(1) as u32
}

/// The rule for changing a replica's recorded state, applied by the metadata owner inside the
/// same transaction as the change:
///
/// * only the current writer (its epoch equals the volume's) changes states — a fenced writer
///   must never take good replicas out;
/// * the last in-sync replica is never taken out: with nothing in sync there would be no copy
///   that holds every acknowledged write;
/// * `Resyncing` is the writer's view, never recorded (the replica stays outdated on record
///   until the copy completes), and so is `Removed` (the record drops the replica).
pub fn transition(
    states: &[(u32, ReplicaState)],
    volume_epoch: u64,
    request_epoch: u64,
    node: u32,
    to: ReplicaState,
) -> Result<usize, TransitionError> {
    if request_epoch != volume_epoch {
        return Err(TransitionError::StaleEpoch {
            request: request_epoch,
            current: volume_epoch,
        });
    }
    if matches!(to, ReplicaState::Resyncing | ReplicaState::Removed) {
        return Err(TransitionError::NotStorable(to));
    }
    let i = states
        .iter()
        .position(|(n, _)| *n == node)
        .ok_or(TransitionError::NoSuchReplica(node))?;
    if to != ReplicaState::InSync && states[i].1 == ReplicaState::InSync {
        let others = states
            .iter()
            .enumerate()
            .filter(|(k, (_, s))| *k != i && *s == ReplicaState::InSync)
            .count();
        if others == 0 {
            return Err(TransitionError::LastInSync(node));
        }
    }
    Ok(i)
}

/// The rule for dropping a replica from a volume's record (the end of a move): the last
/// in-sync copy is never dropped, and a volume keeps at least one replica. Returns its index.
pub fn removal(states: &[(u32, ReplicaState)], node: u32) -> Result<usize, TransitionError> {
    let i = states
        .iter()
        .position(|(n, _)| *n == node)
        .ok_or(TransitionError::NoSuchReplica(node))?;
    let others_in_sync = states
        .iter()
        .enumerate()
        .filter(|(k, (_, s))| *k != i && *s == ReplicaState::InSync)
        .count();
    if others_in_sync == 0 {
        return Err(TransitionError::LastInSync(node));
    }
    Ok(i)
}
