use super::*;
use proptest::prelude::*;

#[test]
fn placement_spreads_and_refuses_too_few_nodes() {
    let nodes: Vec<NodeLoad> = (1..=4)
        .map(|n| NodeLoad {
            node: n,
            replicas: 0,
            zone: None,
        })
        .collect();
    assert_eq!(place(&nodes, 3).unwrap(), vec![1, 2, 3]);
    let loaded = vec![
        NodeLoad {
            node: 1,
            replicas: 2,
            zone: None,
        },
        NodeLoad {
            node: 2,
            replicas: 0,
            zone: None,
        },
        NodeLoad {
            node: 3,
            replicas: 1,
            zone: None,
        },
        NodeLoad {
            node: 4,
            replicas: 0,
            zone: None,
        },
    ];
    assert_eq!(place(&loaded, 2).unwrap(), vec![2, 4]);
    assert_eq!(
        place(&nodes[..2], 3),
        Err(PlacementError::NotEnoughNodes {
            replicas: 3,
            nodes: 2
        })
    );
    assert_eq!(place(&nodes, 0), Err(PlacementError::BadReplicaCount(0)));
}

#[test]
fn fencing_rules() {
    assert_eq!(fence(5, 5, false), FenceDecision::Accept);
    assert_eq!(fence(4, 5, false), FenceDecision::Fenced { current: 5 });
    assert_eq!(fence(4, 5, true), FenceDecision::Fenced { current: 5 });
    assert_eq!(fence(6, 5, true), FenceDecision::Advance { new_epoch: 6 });
    assert_eq!(
        fence(6, 5, false),
        FenceDecision::NotAttached { current: 5 }
    );
}

#[test]
fn write_is_acked_only_when_every_target_holds_it() {
    let mut q = WriteQuorum::new(vec![0, 1, 2]);
    assert_eq!(q.record(2, ReplicaOutcome::Done), None);
    assert_eq!(q.record(0, ReplicaOutcome::Done), None);
    assert_eq!(q.record(1, ReplicaOutcome::Done), Some(Ok(())));

    let mut q = WriteQuorum::new(vec![0, 1, 2]);
    q.record(0, ReplicaOutcome::Failed);
    q.record(1, ReplicaOutcome::Done);
    assert_eq!(
        q.record(2, ReplicaOutcome::Fenced),
        Some(Err(WriteFailure::Fenced))
    );

    let mut q = WriteQuorum::new(vec![0, 2]);
    q.record(0, ReplicaOutcome::Done);
    assert_eq!(
        q.record(1, ReplicaOutcome::Failed),
        Some(Err(WriteFailure::ReplicaFailed { replica: 2 }))
    );
    assert_eq!(
        WriteQuorum::new(vec![]).finish_empty(),
        Some(Err(WriteFailure::NoReplicas))
    );
}

#[test]
fn reads_never_go_to_outdated_replicas_and_prefer_local() {
    use ReplicaState::*;
    let s = ReplicaSet::new(vec![InSync, Outdated, InSync], Some(2));
    for spread in 0..10 {
        let o = s.read_order(spread);
        assert_eq!(o[0], 2);
        assert!(!o.contains(&1));
        assert_eq!(o.len(), 2);
    }
    let s = ReplicaSet::new(vec![InSync, InSync, InSync], None);
    let firsts: std::collections::BTreeSet<usize> = (0..3).map(|k| s.read_order(k)[0]).collect();
    assert_eq!(firsts.len(), 3, "reads spread over all copies");
    assert_eq!(s.write_targets(), vec![0, 1, 2]);
}

proptest! {
    #[test]
    fn check_io_never_overflows(offset: u64, len: u64, size: u64) {
        if check_io(offset, len, size, u64::MAX).is_ok() {
            prop_assert!(offset.checked_add(len).is_some_and(|e| e <= size));
        }
    }

    #[test]
    fn placement_is_distinct(loads in proptest::collection::vec((0u32..10, 0usize..5), 3..10), r in 1usize..=3) {
        let nodes: Vec<NodeLoad> = loads.iter().map(|&(node, replicas)| NodeLoad { node, replicas, zone: None }).collect();
        if let Ok(p) = place(&nodes, r) {
            let mut d = p.clone();
            d.dedup();
            prop_assert_eq!(d.len(), r);
        }
    }
}

#[test]
fn resyncing_replicas_take_writes_but_never_reads() {
    use ReplicaState::*;
    let s = ReplicaSet::new(vec![InSync, Resyncing, Outdated], None);
    assert_eq!(s.write_targets(), vec![0, 1]);
    for spread in 0..4 {
        assert_eq!(s.read_order(spread), vec![0]);
    }
    assert_eq!(s.in_sync(), vec![0]);
}

#[test]
fn state_changes_need_the_current_epoch_and_keep_one_copy_in_sync() {
    use ReplicaState::*;
    let two = [(1, InSync), (2, InSync)];
    assert_eq!(transition(&two, 5, 5, 2, Outdated), Ok(1));
    assert_eq!(
        transition(&two, 5, 4, 2, Outdated),
        Err(TransitionError::StaleEpoch {
            request: 4,
            current: 5
        }),
        "a fenced writer cannot take replicas out"
    );
    let one_left = [(1, InSync), (2, Outdated)];
    assert_eq!(
        transition(&one_left, 5, 5, 1, Outdated),
        Err(TransitionError::LastInSync(1))
    );
    assert_eq!(transition(&one_left, 5, 5, 2, InSync), Ok(1));
    assert_eq!(transition(&one_left, 5, 5, 2, Failed), Ok(1), "already out");
    assert_eq!(
        transition(&one_left, 5, 5, 3, Outdated),
        Err(TransitionError::NoSuchReplica(3))
    );
    assert!(transition(&one_left, 5, 5, 2, Resyncing).is_err());
}

#[test]
fn a_move_adds_a_replica_and_drops_one_only_while_another_is_in_sync() {
    use ReplicaState::*;
    let mut s = ReplicaSet::new(vec![InSync, InSync], None);
    let new = s.push(Failed);
    assert_eq!(new, 2);
    assert_eq!(s.write_targets(), vec![0, 1]);
    s.set_state(new, Resyncing);
    assert_eq!(s.write_targets(), vec![0, 1, 2]);
    s.set_state(new, InSync);
    s.set_state(1, Removed);
    assert_eq!(s.write_targets(), vec![0, 2]);
    assert_eq!(s.in_sync(), vec![0, 2]);
    assert!((0..4).all(|k| !s.read_order(k).contains(&1)));

    let rec = [(1, InSync), (2, Outdated), (4, InSync)];
    assert_eq!(removal(&rec, 2), Ok(1));
    assert_eq!(removal(&rec, 4), Ok(2));
    assert_eq!(
        removal(&[(1, InSync), (2, Outdated)], 1),
        Err(TransitionError::LastInSync(1))
    );
    assert_eq!(removal(&rec, 9), Err(TransitionError::NoSuchReplica(9)));
    assert!(transition(&rec, 1, 1, 2, Removed).is_err(), "not storable");
}

#[test]
fn placement_spreads_copies_over_zones() {
    let n = |node, replicas, zone: &str| NodeLoad {
        node,
        replicas,
        zone: Some(zone.to_string()),
    };
    // Nodes 1 and 2 share rack a and are the least loaded: one of them, then b and c.
    let nodes = [n(1, 0, "a"), n(2, 0, "a"), n(3, 5, "b"), n(4, 6, "c")];
    assert_eq!(place(&nodes, 3).unwrap(), vec![1, 3, 4]);
    // Fewer zones than copies: distinct zones first, then the least loaded of the rest.
    let nodes = [n(1, 0, "a"), n(2, 1, "a"), n(3, 9, "b")];
    assert_eq!(place(&nodes, 3).unwrap(), vec![1, 2, 3]);
    assert_eq!(place(&nodes, 2).unwrap(), vec![1, 3]);
}

fn outcome() -> impl Strategy<Value = ReplicaOutcome> {
    prop_oneof![
        4 => Just(ReplicaOutcome::Done),
        2 => Just(ReplicaOutcome::Failed),
        1 => Just(ReplicaOutcome::StoreFailed),
        1 => Just(ReplicaOutcome::Fenced),
        1 => Just(ReplicaOutcome::Refused),
        1 => Just(ReplicaOutcome::NoSpace),
    ]
}

fn state() -> impl Strategy<Value = ReplicaState> {
    prop_oneof![
        3 => Just(ReplicaState::InSync),
        1 => Just(ReplicaState::Resyncing),
        1 => Just(ReplicaState::Outdated),
    ]
}

proptest! {
    /// The writer's rule after a mirrored request, against the guarantees: an acknowledged
    /// request is held by every target, or by an in-sync one while every target that failed
    /// is taken out; a fenced writer never acknowledges; a request the replicas refused is
    /// never absorbed; nothing is taken out without a control plane to record it; a copy that
    /// refused for want of space is never taken out, and gets the request again (with its
    /// reserve) exactly when another copy wrote it, unless the request is a snapshot's
    /// barrier (no reserve: it fails).
    #[test]
    fn a_mirrored_request_is_acked_only_where_the_guarantees_hold(
        states in prop::collection::vec(state(), 1..5),
        replies in prop::collection::vec(outcome(), 5),
        kind in 0..3u8,
        can_take_out in any::<bool>(),
    ) {
        let set = ReplicaSet::new(states.clone(), None);
        let targets = set.write_targets();
        let replies = &replies[..targets.len()];
        let (flush, snapshot) = (kind == 1, kind == 2);
        let request = match kind {
            1 => Mirrored::Flush,
            2 => Mirrored::Snapshot,
            _ => Mirrored::Data { offset: 4096, len: 8192 },
        };
        let d = decide(request, &targets, replies, &set, can_take_out);
        let all_done = replies.iter().all(|&r| r == ReplicaOutcome::Done);
        let fenced = replies.contains(&ReplicaOutcome::Fenced);
        let refused = replies.contains(&ReplicaOutcome::Refused);
        let no_space = replies.contains(&ReplicaOutcome::NoSpace);
        let written = replies.contains(&ReplicaOutcome::Done);
        match &d {
            Decision::Ack => prop_assert!(all_done && !targets.is_empty()),
            Decision::Fail(f) => {
                prop_assert!(!all_done || targets.is_empty());
                prop_assert_eq!(fenced, *f == WriteFailure::Fenced);
                prop_assert!(!no_space || !written || fenced || refused || snapshot);
                if no_space && !fenced && !refused {
                    prop_assert!(matches!(f, WriteFailure::NoSpace { .. }), "{:?}", f);
                }
            }
            Decision::UseReserve { replicas } => {
                prop_assert!(written && !fenced && !refused && !snapshot);
                let full: Vec<usize> = targets.iter().zip(replies)
                    .filter(|(_, r)| **r == ReplicaOutcome::NoSpace)
                    .map(|(&i, _)| i).collect();
                prop_assert_eq!(replicas, &full);
            }
            Decision::TakeOut { replicas, range, lost_history } => {
                prop_assert!(can_take_out && !fenced);
                prop_assert!(!refused && !no_space);
                // Exactly the targets that failed go out; one in sync holds the request.
                let failed: Vec<usize> = targets.iter().zip(replies)
                    .filter(|(_, r)| !matches!(r, ReplicaOutcome::Done))
                    .map(|(&i, _)| i).collect();
                prop_assert_eq!(replicas, &failed);
                prop_assert!(!replicas.is_empty());
                prop_assert!(targets.iter().zip(replies).any(|(&i, &r)|
                    r == ReplicaOutcome::Done && states[i] == ReplicaState::InSync));
                // Survivors track the bytes of a data request; a flush or a snapshot their
                // store failed leaves the copies' history unknown.
                prop_assert_eq!(range.is_some(), !flush && !snapshot);
                prop_assert_eq!(*lost_history,
                    (flush || snapshot) && replies.contains(&ReplicaOutcome::StoreFailed));
            }
        }
    }
}
