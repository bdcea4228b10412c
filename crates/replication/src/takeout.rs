//! Taking failed replicas out of the write set, as a state machine with no I/O.
//!
//! When a write fails on replica R but an in-sync replica holds it, the writer does not fail
//! the write: it records R out of sync in the metadata store, asks every surviving in-sync
//! replica to track what R misses (the write's range and every later write), and only then
//! acknowledges. A survivor that cannot be asked (it stopped answering too) is taken out as
//! well, as long as enough survivors remain: one for a mirror, K for a parity volume, whose
//! chunks are rebuilt from K in sync (its floor, [`TakeOut::with_floor`]). Below it nothing is
//! taken out: the request fails, or waits for the failed ones to answer again, as a mirror's
//! request does when its last copy fails. [`TakeOut`] is that procedure's bookkeeping: the
//! writer asks it for the next [`Step`] ([`TakeOut::step`]), carries the step out over the network and the
//! metadata store, reports each result, and asks again, until it gets [`Step::Apply`] (the
//! states its replica set takes now) or [`Step::NoneLeft`].

use crate::ReplicaState;

/// One request to a survivor: track what `replica` misses, from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub survivor: usize,
    pub replica: usize,
    /// The replica is going out now: the survivor starts a complete record of it (rather
    /// than adding to a record it keeps already).
    pub start: bool,
}

/// What the writer does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Record each replica's state in the metadata store, then report
    /// [`TakeOut::recorded`] for each. A record that fails ends the take-out: the request
    /// fails (its data is on the survivors, but R would still count as in sync).
    Record(Vec<(usize, ReplicaState)>),
    /// Send every mark, then report [`TakeOut::marked`] for each survivor.
    Mark(Vec<Mark>),
    /// Done: the replica set takes these states, and the request may be acknowledged.
    Apply(Vec<(usize, ReplicaState)>),
    /// Fewer in-sync replicas would remain than the floor (none, for a mirror): nothing is
    /// recorded, and the request fails (or waits for the failed ones to answer again).
    NoneLeft,
    /// Every survivor that held the request went silent before it could track what goes
    /// out: the survivors stay in sync (the request waits for one to answer again), and what
    /// goes out goes out failed, recorded so (nobody tracks what it misses: a full resync
    /// brings it back). The replica set takes these states; the request is not acknowledged.
    Stranded(Vec<(usize, ReplicaState)>),
    /// With a floor above one (a parity volume), fewer survivors than the floor could track
    /// what goes out: the replicas that went out for this request alone (their history
    /// kept) were recorded in sync again first, as they hold everything but this request,
    /// which waits for `waiting` (them and the silent survivors) to answer again. Failed in
    /// their stores, they could be the only copy that kept a region's newest data (the others
    /// of a region may lose power meanwhile); going out failed, a whole resync would copy
    /// over it. Those whose history is lost go out as `apply` says.
    Short {
        apply: Vec<(usize, ReplicaState)>,
        waiting: Vec<usize>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Records and marks for the current `out` set are to be sent.
    Recording,
    /// Marks were sent; `silent` holds the survivors that failed theirs so far.
    Marking {
        silent: Vec<usize>,
    },
    /// No survivor could track: recording what goes out as failed.
    Stranding,
    /// Fewer than the floor could track: recording in sync again those that went out for
    /// this request alone; `waiting` for the request.
    Restoring {
        waiting: Vec<usize>,
    },
    Done,
}

/// The take-out of some replicas of one volume.
#[derive(Debug, Clone)]
pub struct TakeOut {
    /// Each replica's state when the take-out began (the writer holds its membership lock
    /// throughout, so no other transition interleaves).
    states: Vec<ReplicaState>,
    /// Replicas going out, with the state each gets.
    out: Vec<(usize, ReplicaState)>,
    /// Replicas of `out` whose state is recorded (or needs no record).
    recorded: Vec<usize>,
    /// Replicas going out now, rather than failing again while already out.
    newly_out: Vec<usize>,
    /// The fewest in-sync replicas that may remain.
    floor: usize,
    phase: Phase,
}

impl TakeOut {
    /// Takes `failed` out of a set whose replicas are in `states`. With `lost_history` what
    /// they hold is unknown: they are recorded failed, which forces a full resync later.
    pub fn new(states: &[ReplicaState], failed: &[usize], lost_history: bool) -> TakeOut {
        let to = if lost_history {
            ReplicaState::Failed
        } else {
            ReplicaState::Outdated
        };
        TakeOut {
            states: states.to_vec(),
            out: failed.iter().map(|&i| (i, to)).collect(),
            recorded: Vec::new(),
            newly_out: failed
                .iter()
                .copied()
                .filter(|&i| states[i] == ReplicaState::InSync)
                .collect(),
            floor: 1,
            phase: Phase::Recording,
        }
    }

    /// At least `floor` in-sync replicas must remain (1 by default; K for a parity volume):
    /// a take-out that would leave fewer takes nothing out ([`Step::NoneLeft`]), and
    /// survivors that cannot track stay when the rest would be too few ([`Step::Stranded`]).
    pub fn with_floor(mut self, floor: usize) -> TakeOut {
        self.floor = floor.max(1);
        self
    }

    /// What to do now. Call again after reporting the results of the last step.
    pub fn step(&mut self) -> Step {
        // Every in-sync replica is among those failing: nothing holds what they miss, so
        // nothing is recorded either (a writer that reaches no copy, an attach that failed
        // everywhere, leaves every replica's state as it found it). Likewise below the
        // floor: a parity volume's chunk needs K in sync to be rebuilt, so K stay.
        if self.phase == Phase::Recording && self.survivors().len() < self.floor {
            self.phase = Phase::Done;
            return Step::NoneLeft;
        }
        if let Phase::Marking { silent } = &mut self.phase {
            if silent.is_empty() {
                self.phase = Phase::Done;
                return Step::Apply(self.out.clone());
            }
            let silent = std::mem::take(silent);
            let answering = self
                .survivors()
                .into_iter()
                .filter(|s| !silent.contains(s))
                .count();
            if answering < self.floor && self.floor > 1 {
                self.restore(silent);
            } else if answering < self.floor {
                // Too few are left to track what goes out: the silent survivors stay (the
                // newest data is theirs), and what goes out is recorded failed instead.
                for o in &mut self.out {
                    if o.1 != ReplicaState::Failed {
                        o.1 = ReplicaState::Failed;
                        self.recorded.retain(|&r| r != o.0);
                    }
                }
                self.phase = Phase::Stranding;
            } else {
                // Survivors that could not be asked go out too; another round asks the rest.
                self.newly_out.extend(silent.iter().copied());
                self.out
                    .extend(silent.into_iter().map(|s| (s, ReplicaState::Outdated)));
                self.phase = Phase::Recording;
            }
        }
        if self.phase == Phase::Done {
            return Step::Apply(self.out.clone());
        }
        // An in-sync replica is recorded out; one already out is recorded again only to
        // mark it failed (its history is lost).
        let mut to_record = Vec::new();
        for &(i, to) in &self.out {
            if self.recorded.contains(&i) {
                continue;
            }
            if self.states[i] == ReplicaState::InSync || to == ReplicaState::Failed {
                to_record.push((i, to));
            } else {
                self.recorded.push(i);
            }
        }
        if !to_record.is_empty() {
            return Step::Record(to_record);
        }
        if self.phase == Phase::Stranding {
            self.phase = Phase::Done;
            return Step::Stranded(self.out.clone());
        }
        if let Phase::Restoring { waiting } = &mut self.phase {
            let waiting = std::mem::take(waiting);
            self.phase = Phase::Done;
            let apply = self
                .out
                .iter()
                .copied()
                .filter(|&(_, to)| to != ReplicaState::InSync)
                .collect();
            return Step::Short { apply, waiting };
        }
        // Not empty: checked on entering this phase, and a round that left none answering
        // went to `Stranding` instead.
        let survivors = self.survivors();
        debug_assert!(!survivors.is_empty());
        let mut marks = Vec::with_capacity(survivors.len() * self.out.len());
        for &s in &survivors {
            for &(i, _) in &self.out {
                marks.push(Mark {
                    survivor: s,
                    replica: i,
                    start: self.newly_out.contains(&i),
                });
            }
        }
        self.phase = Phase::Marking { silent: Vec::new() };
        Step::Mark(marks)
    }

    /// Fewer than the floor answered the marks (`silent` did not): every replica that went
    /// out in sync with its history kept is recorded in sync again (see [`Step::Short`]).
    fn restore(&mut self, silent: Vec<usize>) {
        let mut waiting = silent;
        for o in &mut self.out {
            if self.newly_out.contains(&o.0) && o.1 == ReplicaState::Outdated {
                o.1 = ReplicaState::InSync;
                self.recorded.retain(|&r| r != o.0);
                waiting.push(o.0);
            }
        }
        waiting.sort_unstable();
        waiting.dedup();
        self.phase = Phase::Restoring { waiting };
    }

    /// `replica`'s state is recorded.
    pub fn recorded(&mut self, replica: usize) {
        if !self.recorded.contains(&replica) {
            self.recorded.push(replica);
        }
    }

    /// The outcome of one mark sent to `survivor` (false: it failed or did not answer).
    pub fn marked(&mut self, survivor: usize, ok: bool) {
        if let Phase::Marking { silent } = &mut self.phase {
            if !ok && !silent.contains(&survivor) {
                silent.push(survivor);
            }
        }
    }

    /// In-sync replicas that are not going out.
    fn survivors(&self) -> Vec<usize> {
        (0..self.states.len())
            .filter(|&i| self.states[i] == ReplicaState::InSync)
            .filter(|i| !self.out.iter().any(|(o, _)| o == i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ReplicaState::*;

    #[test]
    fn a_failed_replica_is_recorded_then_tracked_by_every_survivor() {
        let mut t = TakeOut::new(&[InSync, InSync, InSync], &[1], false);
        assert_eq!(t.step(), Step::Record(vec![(1, Outdated)]));
        t.recorded(1);
        let Step::Mark(marks) = t.step() else {
            panic!("marks expected")
        };
        assert_eq!(
            marks,
            vec![
                Mark {
                    survivor: 0,
                    replica: 1,
                    start: true
                },
                Mark {
                    survivor: 2,
                    replica: 1,
                    start: true
                },
            ]
        );
        t.marked(0, true);
        t.marked(2, true);
        assert_eq!(t.step(), Step::Apply(vec![(1, Outdated)]));
    }

    #[test]
    fn a_survivor_that_cannot_track_goes_out_too_but_never_the_last() {
        // Taking the failed one out when the only survivor cannot track: it goes out failed.
        let mut t = TakeOut::new(&[InSync, InSync], &[0], false);
        assert_eq!(t.step(), Step::Record(vec![(0, Outdated)]));
        t.recorded(0);
        assert!(matches!(t.step(), Step::Mark(_)));
        t.marked(1, false);
        assert_eq!(t.step(), Step::Record(vec![(0, Failed)]));
        t.recorded(0);
        assert_eq!(t.step(), Step::Stranded(vec![(0, Failed)]));

        let mut t = TakeOut::new(&[InSync, InSync, InSync], &[0], false);
        assert!(matches!(t.step(), Step::Record(_)));
        t.recorded(0);
        assert!(matches!(t.step(), Step::Mark(_)));
        t.marked(1, false);
        t.marked(2, true);
        assert_eq!(t.step(), Step::Record(vec![(1, Outdated)]));
        t.recorded(1);
        let Step::Mark(marks) = t.step() else {
            panic!("marks expected")
        };
        assert!(marks.iter().all(|m| m.survivor == 2));
        // The last survivor cannot track either: it stays, and the others go out failed.
        t.marked(2, false);
        assert_eq!(t.step(), Step::Record(vec![(0, Failed), (1, Failed)]));
        t.recorded(0);
        t.recorded(1);
        assert_eq!(t.step(), Step::Stranded(vec![(0, Failed), (1, Failed)]));
    }

    #[test]
    fn with_no_survivor_nothing_is_recorded() {
        let mut t = TakeOut::new(&[InSync, InSync, Outdated], &[0, 1], false);
        assert_eq!(t.step(), Step::NoneLeft);
        let mut t = TakeOut::new(&[InSync, Outdated], &[0], true);
        assert_eq!(t.step(), Step::NoneLeft);
    }

    #[test]
    fn a_parity_floor_keeps_k_in_sync() {
        // 2+1: two of three fail a flush; one survivor is fewer than K = 2.
        let mut t = TakeOut::new(&[InSync, InSync, InSync], &[0, 1], false).with_floor(2);
        assert_eq!(t.step(), Step::NoneLeft);
        // One fails; the second survivor cannot track: the failed one is recorded in sync
        // again (its data may be the only whole copy of a region whose other mirror loses
        // power meanwhile), and the request waits for both.
        let mut t = TakeOut::new(&[InSync, InSync, InSync], &[0], false).with_floor(2);
        assert_eq!(t.step(), Step::Record(vec![(0, Outdated)]));
        t.recorded(0);
        assert!(matches!(t.step(), Step::Mark(_)));
        t.marked(1, true);
        t.marked(2, false);
        assert_eq!(t.step(), Step::Record(vec![(0, InSync)]));
        t.recorded(0);
        assert_eq!(
            t.step(),
            Step::Short {
                apply: vec![],
                waiting: vec![0, 2]
            }
        );
        // Its history lost, it goes out failed all the same.
        let mut t = TakeOut::new(&[InSync, InSync, InSync], &[0], true).with_floor(2);
        assert_eq!(t.step(), Step::Record(vec![(0, Failed)]));
        t.recorded(0);
        assert!(matches!(t.step(), Step::Mark(_)));
        t.marked(1, false);
        t.marked(2, true);
        assert_eq!(
            t.step(),
            Step::Short {
                apply: vec![(0, Failed)],
                waiting: vec![1]
            }
        );
    }

    #[test]
    fn a_replica_already_out_is_recorded_again_only_to_fail_it() {
        let mut t = TakeOut::new(&[InSync, Resyncing], &[1], false);
        assert!(matches!(t.step(), Step::Mark(_)), "no record needed");
        let mut t = TakeOut::new(&[InSync, Resyncing], &[1], true);
        assert_eq!(t.step(), Step::Record(vec![(1, Failed)]));
    }

    fn state() -> impl Strategy<Value = ReplicaState> {
        prop_oneof![
            4 => Just(InSync),
            1 => Just(Resyncing),
            1 => Just(Outdated),
        ]
    }

    proptest! {
        /// Driven with random mark outcomes: the take-out ends; when it applies, every replica
        /// that goes out from in sync was recorded first, at least the floor of in-sync
        /// replicas remains, and in the last round every remaining survivor accepted a mark
        /// for every replica out; when fewer would remain it says so rather than apply.
        #[test]
        fn a_take_out_applies_only_what_the_guarantees_allow(
            states in prop::collection::vec(state(), 1..6),
            pick in prop::collection::vec(any::<bool>(), 6),
            lost in any::<bool>(),
            answers in prop::collection::vec(any::<bool>(), 64),
            floor in 1usize..4,
        ) {
            let failed: Vec<usize> = (0..states.len()).filter(|&i| pick[i]).collect();
            prop_assume!(!failed.is_empty());
            let mut t = TakeOut::new(&states, &failed, lost).with_floor(floor);
            let mut answers = answers.into_iter().cycle();
            let mut recorded = Vec::new();
            let mut last_round: Vec<Mark> = Vec::new();
            let mut ok_in_round: Vec<usize> = Vec::new();
            let mut silent: Vec<usize> = Vec::new();
            for _ in 0..100 {
                match t.step() {
                    Step::Record(list) => {
                        for (i, _) in list {
                            recorded.push(i);
                            t.recorded(i);
                        }
                    }
                    Step::Mark(marks) => {
                        ok_in_round.clear();
                        let mut survivors: Vec<usize> = marks.iter().map(|m| m.survivor).collect();
                        survivors.dedup();
                        for s in survivors {
                            let ok = answers.next().unwrap();
                            if ok {
                                ok_in_round.push(s);
                            } else {
                                silent.push(s);
                            }
                            t.marked(s, ok);
                        }
                        last_round = marks;
                    }
                    Step::Apply(out) => {
                        for &(i, to) in &out {
                            if states[i] == InSync || to == Failed {
                                prop_assert!(recorded.contains(&i), "{} applied unrecorded", i);
                            }
                        }
                        for &i in &failed {
                            prop_assert!(out.iter().any(|&(o, _)| o == i));
                        }
                        let left: Vec<usize> = (0..states.len())
                            .filter(|&i| states[i] == InSync && !out.iter().any(|&(o, _)| o == i))
                            .collect();
                        prop_assert!(left.len() >= floor, "{:?} left, below {}", left, floor);
                        for &s in &left {
                            prop_assert!(ok_in_round.contains(&s));
                            for &(i, _) in &out {
                                prop_assert!(last_round.iter().any(|m| m.survivor == s && m.replica == i));
                            }
                        }
                        return Ok(());
                    }
                    Step::NoneLeft => {
                        // Only when fewer in-sync replicas than the floor did not fail the
                        // request, and then before anything is recorded.
                        let well = (0..states.len())
                            .filter(|&i| states[i] == InSync && !failed.contains(&i))
                            .count();
                        prop_assert!(well < floor);
                        prop_assert!(recorded.is_empty(), "recorded {:?} with none left", recorded);
                        return Ok(());
                    }
                    Step::Short { apply, waiting } => {
                        // Above one only. What went out for this request with its history
                        // kept was recorded in sync again (its last record says so), and
                        // waits with the silent survivors; only failed ones go out; at least
                        // the floor stays in sync.
                        prop_assert!(floor > 1);
                        for &(i, to) in &apply {
                            prop_assert!(to != InSync);
                            if states[i] == InSync {
                                prop_assert_eq!(to, Failed);
                            }
                        }
                        for &i in &waiting {
                            let restored = recorded.contains(&i);
                            prop_assert!(restored || silent.contains(&i), "{} waits for nothing", i);
                            prop_assert!(!apply.iter().any(|&(o, _)| o == i));
                        }
                        let left = (0..states.len())
                            .filter(|&i| states[i] == InSync && !apply.iter().any(|&(o, _)| o == i))
                            .count();
                        prop_assert!(left >= floor, "{} left, below {}", left, floor);
                        return Ok(());
                    }
                    Step::Stranded(out) => {
                        // Every replica going out goes out failed (nobody tracks it), recorded
                        // so after the last record of it; the in-sync ones left are the floor at
                        // least, each a survivor asked in the last round, and some went silent.
                        for &(i, to) in &out {
                            prop_assert_eq!(to, Failed);
                            prop_assert_eq!(recorded.iter().rev().position(|&r| r == i).is_some(), true);
                        }
                        for &i in &failed {
                            prop_assert!(out.iter().any(|&(o, _)| o == i));
                        }
                        let left: Vec<usize> = (0..states.len())
                            .filter(|&i| states[i] == InSync && !out.iter().any(|&(o, _)| o == i))
                            .collect();
                        prop_assert!(left.len() >= floor, "{:?} left, below {}", left, floor);
                        for &s in &left {
                            prop_assert!(last_round.iter().any(|m| m.survivor == s));
                        }
                        prop_assert!(left.iter().any(|s| silent.contains(s)));
                        prop_assert!(left.iter().filter(|s| ok_in_round.contains(s)).count() < floor);
                        return Ok(());
                    }
                }
            }
            prop_assert!(false, "the take-out did not end");
        }
    }
}
