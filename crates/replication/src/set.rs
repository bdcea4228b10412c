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
    /// Unusable (its node is gone or its store failed).
    Failed,
}

impl fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicaState::InSync => "in-sync",
            ReplicaState::Outdated => "outdated",
            ReplicaState::Failed => "failed",
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

    /// Replicas every write must reach before it is acknowledged.
    pub fn write_targets(&self) -> Vec<usize> {
        (0..self.states.len())
            .filter(|&i| self.states[i] == ReplicaState::InSync)
            .collect()
    }

    /// The order in which to try replicas for a read: the local replica if in sync, otherwise
    /// in-sync replicas rotated by `spread` (a counter the caller advances per read), so reads
    /// spread over all copies. Only in-sync replicas appear (guarantee 3).
    pub fn read_order(&self, spread: usize) -> Vec<usize> {
        let in_sync = self.write_targets();
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
