//! Which replica serves a read, and which copies to repair after it: a plan with no I/O.
//!
//! A read goes to one in-sync replica (the local one first, then rotated so reads spread over
//! the copies). If it fails, the next in-sync replica is tried; one whose copy failed its block
//! checksums is remembered, and rewritten from the replica that finally served. The set is
//! looked at again before each try: while a read waits on a replica that stopped answering,
//! another replica may finish its resync and become a candidate.

use crate::ReplicaSet;

/// One read's progress through the replicas.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    spread: usize,
    tried: Vec<usize>,
    bad: Vec<usize>,
}

impl ReadPlan {
    /// A read whose rotation starts at `spread` (a counter advanced per read).
    pub fn new(spread: usize) -> ReadPlan {
        ReadPlan {
            spread,
            tried: Vec::new(),
            bad: Vec::new(),
        }
    }

    /// The replica to try next, or `None` when every in-sync replica has been tried.
    pub fn next(&mut self, set: &ReplicaSet) -> Option<usize> {
        let i = set
            .read_order(self.spread)
            .into_iter()
            .find(|i| !self.tried.contains(i))?;
        self.tried.push(i);
        Some(i)
    }

    /// Like [`ReadPlan::next`], but a replica for which `avoid` is true comes only after every
    /// other candidate (a copy that holds the range on its slow tier, when another holds it on
    /// flash). The same replicas are tried, each once; only the order changes.
    pub fn next_preferring(
        &mut self,
        set: &ReplicaSet,
        avoid: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let order: Vec<usize> = set
            .read_order(self.spread)
            .into_iter()
            .filter(|i| !self.tried.contains(i))
            .collect();
        let i = order
            .iter()
            .copied()
            .find(|&i| !avoid(i))
            .or_else(|| order.first().copied())?;
        self.tried.push(i);
        Some(i)
    }

    /// Replica `i` failed the read; `bad_copy` if its copy failed its block checksums.
    pub fn failed(&mut self, i: usize, bad_copy: bool) {
        if bad_copy && !self.bad.contains(&i) {
            self.bad.push(i);
        }
    }

    /// Replicas whose copy failed its block checksums: to be rewritten from the one that
    /// served the read.
    pub fn to_repair(&self) -> &[usize] {
        &self.bad
    }

    /// Replicas tried so far, in order.
    pub fn tried(&self) -> &[usize] {
        &self.tried
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReplicaState::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = crate::ReplicaState> {
        prop_oneof![
            Just(InSync),
            Just(Outdated),
            Just(Resyncing),
            Just(Failed),
            Just(Removed)
        ]
    }

    proptest! {
        /// With a preference, every in-sync replica is still tried exactly once, a preferred
        /// one always before an avoided one, and nothing out of sync is tried.
        #[test]
        fn preferring_reorders_only(
            states in proptest::collection::vec(state(), 1..6),
            avoid in proptest::collection::vec(any::<bool>(), 6),
            spread in 0usize..10,
        ) {
            let set = ReplicaSet::new(states.clone(), None);
            let mut plan = ReadPlan::new(spread);
            let mut got = Vec::new();
            while let Some(i) = plan.next_preferring(&set, |i| avoid[i]) {
                got.push(i);
            }
            let mut want = set.in_sync();
            want.sort_unstable();
            let mut sorted = got.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, want);
            let first_avoided = got.iter().position(|&i| avoid[i]).unwrap_or(got.len());
            prop_assert!(got[first_avoided..].iter().all(|&i| avoid[i]), "{:?}", got);
        }

        /// Every in-sync replica is tried exactly once, and nothing else is (guarantee 3:
        /// only in-sync copies serve reads), even when the set changes between tries.
        #[test]
        fn tries_each_in_sync_replica_once(
            states in proptest::collection::vec(state(), 1..6),
            later in proptest::collection::vec(state(), 1..6),
            local in proptest::option::of(0usize..6),
            spread in 0usize..100,
            change_after in 0usize..4,
            bad in proptest::collection::vec(any::<bool>(), 12),
        ) {
            let n = states.len();
            let mut set = ReplicaSet::new(states, local.filter(|&l| l < n));
            let mut plan = ReadPlan::new(spread);
            let mut seen = Vec::new();
            let mut steps = 0;
            while let Some(i) = plan.next(&set) {
                prop_assert_eq!(set.state(i), InSync, "read from a replica not in sync");
                prop_assert!(!seen.contains(&i), "replica tried twice");
                seen.push(i);
                plan.failed(i, bad[steps % bad.len()]);
                steps += 1;
                if steps == change_after {
                    for (k, s) in later.iter().enumerate().take(n) {
                        set.set_state(k, *s);
                    }
                }
            }
            for i in set.in_sync() {
                prop_assert!(seen.contains(&i), "in-sync replica {} never tried", i);
            }
            for &b in plan.to_repair() {
                prop_assert!(seen.contains(&b));
            }
        }
    }

    #[test]
    fn the_local_replica_serves_first_and_a_bad_copy_is_remembered() {
        let set = ReplicaSet::new(vec![InSync, InSync, InSync], Some(2));
        let mut plan = ReadPlan::new(7);
        assert_eq!(plan.next(&set), Some(2));
        plan.failed(2, true);
        let second = plan.next(&set).unwrap();
        assert_ne!(second, 2);
        assert_eq!(plan.to_repair(), &[2]);
    }
}
