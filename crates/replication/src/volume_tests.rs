//! The volume core alone, under random requests, replies, failures, resyncs, moves and time.

use super::*;
use crate::{Action, Answers, Decision, Input, Mirrored, ReplicaOutcome, TakeOutStep};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A write of `len` blocks at block `at`, its targets answering with `replies` (cycled).
    Write {
        at: u64,
        len: u64,
        replies: Vec<u8>,
    },
    /// A flush, its targets answering with `replies`.
    Flush(Vec<u8>),
    /// The `k`-th place still in the order is given up.
    Release(usize),
    Read {
        fails: Vec<bool>,
        overlapping: bool,
    },
    /// The resync task looks for replicas to bring back; the `k`-th answers as `returned`.
    ResyncStart {
        k: usize,
        returned: u64,
    },
    /// The `k`-th replica being resynced finishes, or fails midway.
    ResyncEnd {
        k: usize,
        ok: bool,
    },
    Add(u32),
    Retire(usize),
    PlannedTakeOut {
        node: u32,
        hold_ms: u64,
    },
    SetMin(u32),
    Tick(u64),
    /// A take-out's marks fail on these survivors (cycled).
    MarksFail(Vec<bool>),
}

fn op() -> impl Strategy<Value = Op> {
    let replies = proptest::collection::vec(0u8..10, 1..4);
    prop_oneof![
        6 => (0u64..16, 1u64..4, replies.clone()).prop_map(|(at, len, replies)| Op::Write { at, len, replies }),
        1 => replies.prop_map(Op::Flush),
        4 => (0usize..8).prop_map(Op::Release),
        2 => (proptest::collection::vec(any::<bool>(), 1..4), any::<bool>())
            .prop_map(|(fails, overlapping)| Op::Read { fails, overlapping }),
        2 => (0usize..4, 1u64..4).prop_map(|(k, returned)| Op::ResyncStart { k, returned }),
        2 => (0usize..4, any::<bool>()).prop_map(|(k, ok)| Op::ResyncEnd { k, ok }),
        1 => (1u32..8).prop_map(Op::Add),
        1 => (0usize..6).prop_map(Op::Retire),
        1 => (1u32..8, 0u64..3000).prop_map(|(node, hold_ms)| Op::PlannedTakeOut { node, hold_ms }),
        1 => (1u32..4).prop_map(Op::SetMin),
        1 => (0u64..2000).prop_map(Op::Tick),
        1 => proptest::collection::vec(any::<bool>(), 1..4).prop_map(Op::MarksFail),
    ]
}

/// A reply drawn from `r`: mostly done, sometimes a failure or a store failure.
fn outcome(r: u8) -> ReplicaOutcome {
    match r {
        0..=6 => ReplicaOutcome::Done,
        7 | 8 => ReplicaOutcome::Failed,
        _ => ReplicaOutcome::StoreFailed,
    }
}

/// Runs a take-out plan to its end, records always succeeding, marks failing per `marks`.
fn run_take_out(core: &mut VolumeCore, failed: &[usize], lost: bool, marks: &[bool]) -> bool {
    let mut plan = core.take_out(failed, lost);
    let mut k = 0;
    loop {
        match plan.step() {
            TakeOutStep::Record(rs) => {
                for (i, _) in rs {
                    plan.recorded(i);
                }
            }
            TakeOutStep::Mark(ms) => {
                for m in ms {
                    let ok = !marks.get(k % marks.len().max(1)).copied().unwrap_or(false);
                    k += 1;
                    plan.marked(m.survivor, ok);
                }
            }
            TakeOutStep::Apply(out) => {
                core.apply(&out);
                return true;
            }
            TakeOutStep::NoneLeft => return false,
            TakeOutStep::Stranded(out) | TakeOutStep::Short { apply: out, .. } => {
                core.apply(&out);
                return false;
            }
        }
    }
}

struct World {
    core: VolumeCore,
    now: Duration,
    /// Places in the order: (ticket, start, end).
    places: Vec<(Ticket, u64, u64)>,
    marks: Vec<bool>,
    suspended: bool,
    /// The incarnation each replica being resynced came back as.
    returned: std::collections::HashMap<usize, u64>,
    /// Replicas retired so far.
    removed: std::collections::HashSet<usize>,
}

impl World {
    fn check(&mut self) -> Result<(), TestCaseError> {
        let set = self.core.set().clone();
        // A retired replica stays out for good.
        for &i in &self.removed {
            prop_assert_eq!(
                set.state(i),
                ReplicaState::Removed,
                "a retired replica is back"
            );
        }
        self.removed
            .extend((0..set.len()).filter(|&i| set.state(i) == ReplicaState::Removed));
        let in_sync = set.in_sync();
        prop_assert!(
            !in_sync.is_empty(),
            "no in-sync replica left: {:?}",
            set.states()
        );
        for i in 0..set.len() {
            if set.state(i) == ReplicaState::Failed {
                prop_assert_eq!(
                    self.core.incarnation(i),
                    0,
                    "a failed replica kept its history"
                );
            }
        }
        let targets = self.core.write_targets();
        for &i in &in_sync {
            prop_assert!(targets.contains(&i), "an in-sync replica misses writes");
        }
        for &i in &targets {
            prop_assert!(matches!(
                set.state(i),
                ReplicaState::InSync | ReplicaState::Resyncing
            ));
        }
        // Ranges held at once never overlap (guarantee 2).
        let held: Vec<_> = self
            .places
            .iter()
            .filter(|p| self.core.may_hold(p.0))
            .collect();
        for a in &held {
            for b in &held {
                prop_assert!(
                    a.0 == b.0 || a.2 <= b.1 || b.2 <= a.1,
                    "overlapping ranges held"
                );
            }
        }
        // The suspended state follows the count, and each change is reported once.
        let (copies, change) = self.core.check_copies();
        let short = in_sync.len() < self.core.min_copies() as usize;
        prop_assert_eq!(matches!(copies, Copies::Short { .. }), short);
        prop_assert_eq!(self.core.enough(), !short);
        match change {
            Some(CopiesChange::Suspended) => prop_assert!(!self.suspended && short),
            Some(CopiesChange::Resumed) => prop_assert!(self.suspended && !short),
            None => prop_assert_eq!(self.suspended, short),
        }
        self.suspended = short;
        // Held nodes are not resynced; removed replicas never are.
        for i in self.core.clone().to_resync(self.now) {
            prop_assert!(matches!(
                set.state(i),
                ReplicaState::Outdated | ReplicaState::Failed
            ));
        }
        Ok(())
    }

    /// The answers `out` of a write that holds `place` go to the core.
    fn answer(
        &mut self,
        place: Ticket,
        req: Mirrored,
        targets: &[usize],
        out: &[ReplicaOutcome],
    ) -> Result<(), TestCaseError> {
        let c = &mut self.core;
        let answers = Answers {
            place: Some(place),
            request: req,
            targets,
            outcomes: out,
            from_reserve: false,
        };
        let actions = c.step(Input::Answered(answers));
        match actions.last() {
            Some(Action::Ack { wait_copies }) => {
                prop_assert_eq!(*wait_copies, !c.enough());
                prop_assert!(!c.may_hold(place), "an acknowledged write kept its place");
                self.places.retain(|p| p.0 != place);
            }
            Some(Action::Carry(Decision::TakeOut {
                replicas,
                lost_history,
                ..
            })) => {
                let done_in_sync = targets.iter().zip(out).any(|(&i, &o)| {
                    o == ReplicaOutcome::Done && c.set().state(i) == ReplicaState::InSync
                });
                prop_assert!(
                    done_in_sync,
                    "take-out without an in-sync copy holding the write"
                );
                prop_assert!(
                    c.may_hold(place),
                    "a write lost its place before its take-out"
                );
                let marks = self.marks.clone();
                run_take_out(c, replicas, *lost_history, &marks);
            }
            Some(Action::Carry(_)) => prop_assert!(c.may_hold(place)),
            other => prop_assert!(false, "after answers: {:?}", other),
        }
        self.granted(actions)
    }

    /// Places a step says may hold their ranges now do, and go to the write targets.
    fn granted(&mut self, actions: Vec<Action>) -> Result<(), TestCaseError> {
        for a in actions {
            if let Action::Granted { places } = a {
                for (p, targets) in places {
                    prop_assert_eq!(&targets, &self.core.write_targets());
                    prop_assert!(
                        self.core.may_hold(p),
                        "a granted place may not hold its range"
                    );
                }
            }
        }
        Ok(())
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        let c = &mut self.core;
        match op {
            Op::Write { at, len, replies } => {
                let (start, end) = (at * 4096, (at + len) * 4096);
                let req = Mirrored::Data {
                    offset: start,
                    len: end - start,
                };
                let enough = c.enough();
                match c.step(Input::Submit(req)).as_slice() {
                    [Action::Short] => prop_assert!(!enough, "short with enough copies"),
                    [Action::Wait { place }] => {
                        prop_assert!(enough && !c.may_hold(*place));
                        self.places.push((*place, start, end));
                    }
                    [Action::Proceed {
                        place: Some(place),
                        targets,
                    }] => {
                        prop_assert!(enough && c.may_hold(*place));
                        prop_assert_eq!(targets, &c.write_targets());
                        self.places.push((*place, start, end));
                        let out: Vec<_> = (0..targets.len())
                            .map(|k| outcome(replies[k % replies.len()]))
                            .collect();
                        let (place, targets) = (*place, targets.clone());
                        self.answer(place, req, &targets, &out)?;
                    }
                    other => prop_assert!(false, "a write's submit: {:?}", other),
                }
            }
            Op::Flush(replies) => {
                let Some(Action::Proceed {
                    place: None,
                    targets,
                }) = c.step(Input::Submit(Mirrored::Flush)).pop()
                else {
                    prop_assert!(!c.enough(), "a flush with enough copies did not go");
                    return Ok(());
                };
                let out: Vec<_> = (0..targets.len())
                    .map(|k| outcome(replies[k % replies.len()]))
                    .collect();
                let answers = Answers {
                    place: None,
                    request: Mirrored::Flush,
                    targets: &targets,
                    outcomes: &out,
                    from_reserve: false,
                };
                for a in c.step(Input::Answered(answers)) {
                    match a {
                        Action::Carry(Decision::TakeOut {
                            replicas,
                            lost_history,
                            ..
                        }) => {
                            let marks = self.marks.clone();
                            run_take_out(c, &replicas, lost_history, &marks);
                        }
                        Action::Granted { .. } => prop_assert!(false, "a flush freed a place"),
                        _ => {}
                    }
                }
            }
            Op::Release(k) => {
                if !self.places.is_empty() {
                    let (t, ..) = self.places.remove(k % self.places.len());
                    let out = c.step(Input::Release(t));
                    self.granted(out)?;
                }
            }
            Op::Read { fails, overlapping } => {
                let mut plan = c.read_begin(overlapping);
                let mut k = 0;
                while let Some(i) = plan.next(c.set()) {
                    prop_assert_eq!(c.set().state(i), ReplicaState::InSync);
                    if !fails[k % fails.len()] {
                        break;
                    }
                    if k == 0 {
                        c.read_moved();
                    }
                    plan.failed(i, k % 2 == 0);
                    k += 1;
                }
            }
            Op::ResyncStart { k, returned } => {
                let out = c.to_resync(self.now);
                if let Some(&i) = out.get(k % out.len().max(1)) {
                    let before = (c.set().state(i), c.incarnation(i));
                    match c.resync_start(i, returned) {
                        Ok(ResyncStart::From {
                            survivors,
                            incremental,
                        }) => {
                            prop_assert!(
                                !incremental
                                    || (before.0 == ReplicaState::Outdated
                                        && before.1 == returned
                                        && returned != 0),
                                "incremental resync without a known history: {:?} back as {}",
                                before,
                                returned
                            );
                            for s in &survivors {
                                prop_assert_eq!(c.set().state(*s), ReplicaState::InSync);
                            }
                            c.resync_begun(
                                i,
                                ResyncProgress {
                                    full: !incremental,
                                    total_bytes: 0,
                                    done_bytes: 0,
                                    copied_bytes: 0,
                                    elapsed_ms: 0,
                                },
                            );
                            self.returned.insert(i, returned);
                        }
                        Ok(ResyncStart::NotNeeded) => {
                            prop_assert!(false, "to_resync offered a replica that is not out")
                        }
                        Err(e) => prop_assert!(false, "no survivors: {e}"),
                    }
                }
            }
            Op::ResyncEnd { k, ok } => {
                // A resync's task may end after its replica was retired (a move's old copy,
                // or one the layout dropped): its end must not bring it back.
                let resyncing: Vec<usize> = (0..c.set().len())
                    .filter(|&i| {
                        c.resyncing(i)
                            || (c.set().state(i) == ReplicaState::Removed
                                && self.returned.contains_key(&i))
                    })
                    .collect();
                if let Some(&i) = resyncing.get(k % resyncing.len().max(1)) {
                    if ok {
                        let inc = self.returned[&i];
                        c.resync_done(
                            i,
                            inc,
                            ResyncProgress {
                                full: false,
                                total_bytes: 1,
                                done_bytes: 1,
                                copied_bytes: 1,
                                elapsed_ms: 1,
                            },
                        );
                        prop_assert!(
                            c.set().state(i) == ReplicaState::Removed
                                || c.last_resync(c.node(i)).is_some()
                        );
                    } else {
                        let marks = self.marks.clone();
                        run_take_out(c, &[i], false, &marks);
                        c.resync_failed(i);
                        prop_assert!(
                            !c.resyncing(i),
                            "a replica stays resyncing with no resync running"
                        );
                    }
                }
            }
            Op::Add(node) => {
                let before = c.set().len();
                match c.add(node, 0) {
                    Ok((i, true)) => {
                        prop_assert_eq!(i, before, "a replica index was reused");
                        prop_assert_eq!(c.set().state(i), ReplicaState::Failed);
                    }
                    Ok((i, false)) => prop_assert_eq!(c.node(i), node),
                    Err(Refusal::NoSlotLeft(n)) => prop_assert_eq!(n, before),
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
            Op::Retire(k) => {
                let i = k % c.set().len();
                if c.set().state(i) != ReplicaState::Removed {
                    match c.may_retire(i) {
                        Ok(_) => c.retire(i),
                        Err(Refusal::LastInSync) => prop_assert_eq!(c.set().in_sync(), vec![i]),
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                    prop_assert!(
                        c.slot_of(c.node(i)).is_none() || c.set().state(i) != ReplicaState::Removed
                    );
                }
            }
            Op::PlannedTakeOut { node, hold_ms } => match c.planned_take_out(node) {
                Ok(Some(i)) => {
                    prop_assert!(c.set().in_sync().len() > c.min_copies() as usize);
                    c.hold(node, self.now + Duration::from_millis(hold_ms));
                    let marks = self.marks.clone();
                    run_take_out(c, &[i], false, &marks);
                    if hold_ms > 0 {
                        prop_assert!(
                            !c.to_resync(self.now).contains(&i),
                            "a held replica is resynced"
                        );
                    }
                }
                Ok(None) => {}
                Err(Refusal::BelowMinimum { left, min }) => prop_assert!(left < min as usize),
                Err(e) => prop_assert!(false, "{e}"),
            },
            Op::SetMin(n) => {
                c.set_min_copies(n);
            }
            Op::Tick(ms) => self.now += Duration::from_millis(ms),
            Op::MarksFail(m) => self.marks = m,
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever happens, in whatever order: an in-sync copy remains, in-sync copies take every
    /// write, only they serve reads, overlapping ranges are never held at once, a replica
    /// whose history is lost is never resynced incrementally, indices are never reused, and
    /// writes are suspended exactly while too few copies are in sync.
    #[test]
    fn the_volume_core_keeps_the_guarantees(
        n in 1usize..4,
        min in 0u32..3,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let replicas: Vec<(u32, ReplicaState)> = (0..n).map(|k| (10 + k as u32, ReplicaState::InSync)).collect();
        let mut core = VolumeCore::new(&replicas, min, true, 6);
        for i in 0..n {
            core.attached(i, 1);
        }
        let mut w = World { core, now: Duration::ZERO, places: Vec::new(), marks: vec![false], suspended: false, returned: Default::default(), removed: Default::default() };
        w.check()?;
        for op in ops {
            w.step(op)?;
            w.check()?;
        }
        // Every place given up leaves an empty order.
        for (t, ..) in std::mem::take(&mut w.places) {
            w.core.step(Input::Release(t));
        }
        prop_assert_eq!(w.core.places(), 0);
    }
}

#[test]
fn without_a_control_plane_writes_never_wait_and_failures_fail() {
    let mut c = VolumeCore::new(
        &[(1, ReplicaState::InSync), (2, ReplicaState::InSync)],
        2,
        false,
        4,
    );
    assert_eq!(c.check_copies(), (Copies::Enough, None));
    let answers = Answers {
        place: None,
        request: Mirrored::Flush,
        targets: &[0, 1],
        outcomes: &[ReplicaOutcome::Done, ReplicaOutcome::Failed],
        from_reserve: false,
    };
    assert!(matches!(
        c.step(Input::Answered(answers)).as_slice(),
        [Action::Carry(Decision::Fail(_))]
    ));
    c.stop();
    assert_eq!(c.check_copies().0, Copies::Stopped);
}

#[test]
fn reads_one_at_a_time_stay_on_a_copy_and_overlapping_reads_rotate() {
    let mut c = VolumeCore::new(
        &[
            (1, ReplicaState::InSync),
            (2, ReplicaState::InSync),
            (3, ReplicaState::InSync),
        ],
        0,
        true,
        4,
    );
    let first = |c: &mut VolumeCore, overlapping: bool| {
        c.read_begin(overlapping)
            .next(c.set())
            .expect("an in-sync copy")
    };
    // One at a time: the same copy every time.
    let alone: Vec<usize> = (0..6).map(|_| first(&mut c, false)).collect();
    assert!(alone.iter().all(|&i| i == alone[0]), "{alone:?}");
    // Overlapping: each starts at the next copy, so three in flight use all three.
    let mut seen: Vec<usize> = (0..3).map(|_| first(&mut c, true)).collect();
    seen.sort();
    assert_eq!(seen, vec![0, 1, 2]);
    // A read whose first choice failed moves the next ones off that copy.
    let a = first(&mut c, false);
    c.read_moved();
    let b = first(&mut c, false);
    assert_ne!(a, b);
    // Never a copy that is not in sync, sticky or not.
    assert!(run_take_out(&mut c, &[b], false, &[false]));
    assert_ne!(c.set().state(b), ReplicaState::InSync);
    for overlapping in [false, true, false, true] {
        assert_ne!(first(&mut c, overlapping), b);
    }
}

#[test]
fn a_core_serves_a_mirror_and_refuses_a_layout_it_cannot_write() {
    let r = [(1, ReplicaState::InSync), (2, ReplicaState::InSync)];
    let c = VolumeCore::new(&r, 0, true, 4);
    assert_eq!(c.layout(), crate::Layout::Mirror);
    assert!(c.clone().with_layout(crate::Layout::Mirror).is_ok());
    let parity = crate::Layout::Parity(crate::Parity::parse("2+1", None).unwrap());
    assert!(matches!(
        c.clone().with_layout(parity),
        Err(crate::LayoutError::NotBuilt(_))
    ));
    assert_eq!(
        c.with_layout(crate::Layout::Unknown).err(),
        Some(crate::LayoutError::Unknown)
    );
}
