use crate::{
    Action, Input, MirrorCopy, Mirrored, Parity, ReadFrom, Refusal, Region, ReplicaState,
    ResyncProgress, ResyncStart, VolumeCore,
};

/// 2+1 regions hold 2 chunks of 256 KiB.
const REGION: u64 = 512 << 10;

/// A 2+1 volume of four regions on nodes 1, 2, 3, all in sync; region 0 in parity.
fn core() -> VolumeCore {
    let r: Vec<(u32, ReplicaState)> = (1..=3).map(|n| (n, ReplicaState::InSync)).collect();
    let p = Parity {
        data: 2,
        parity: 1,
        mirror_share: 20,
    };
    let mut c = VolumeCore::new(&r, 0, true, 6)
        .with_stripes(p, 4 * REGION)
        .unwrap();
    c.restore_regions(&[Region::Parity { slot: 0 }], [])
        .unwrap();
    c
}

fn progress() -> ResyncProgress {
    ResyncProgress::begun()
}

fn targets(c: &mut VolumeCore, request: Mirrored) -> Vec<usize> {
    match c.step(Input::Submit(request)).pop() {
        Some(Action::Proceed { targets, place }) => {
            if let Some(p) = place {
                c.step(Input::Release(p));
            }
            targets
        }
        other => panic!("{request:?}: {other:?}"),
    }
}

/// A follower takes what its place takes and serves nothing; whole, it stays counted
/// nowhere until it takes the place; then the old copy is moved off.
#[test]
fn a_follower_takes_its_places_writes_and_then_the_place() {
    let mut c = core();
    assert_eq!(c.follow(2, 7, 0), Ok((3, true)));
    assert_eq!(c.follow(2, 7, 5), Ok((3, false)), "asked again");
    assert_eq!(c.rate(3), Some(5));
    assert_eq!(c.place_node(3), 2);
    // Whole: every region node 2 mirrors copied from another mirror in sync, its chunk
    // rebuilt from the others.
    assert!(matches!(
        c.resync_start(3, 42),
        Ok(ResyncStart::From {
            incremental: false,
            ..
        })
    ));
    c.resync_begun(3, progress());
    // Region 0 (parity) mirrors on 1 and 2; region 1 on 2 and 3; region 2 on 3 and 1.
    let data = |r: u64| Mirrored::Data {
        offset: r * REGION,
        len: 4096,
    };
    assert_eq!(targets(&mut c, data(1)), vec![1, 2, 3]);
    assert_eq!(targets(&mut c, data(2)), vec![0, 2]);
    assert_eq!(targets(&mut c, Mirrored::Flush), vec![0, 1, 2, 3]);
    // From slot 1, node 2: the place's node is a source like another mirror.
    assert_eq!(
        c.parity_copy_source(REGION / 4096, 3),
        Some(MirrorCopy::From(1))
    );
    assert_eq!(
        c.parity_copy_source(2 * REGION / 4096, 3),
        Some(MirrorCopy::NotMirrored)
    );
    let r = c.parity_rebuilds(3).unwrap();
    assert_eq!((r.len(), r[0].to.node, r[0].to.chunk), (1, 2, 1));
    // Reads never name it.
    match c.parity_read(REGION / 4096) {
        Some(Ok(ReadFrom::Mirror(nodes))) => assert_eq!(nodes, vec![2, 3]),
        other => panic!("{other:?}"),
    }
    // Not whole: no promotion, and no encode switches meanwhile.
    assert_eq!(c.promote(7), Err(Refusal::NotCaughtUp(7)));
    assert!(!c.every_copy_in_sync());
    c.resync_done(3, 99, progress());
    assert!(c.is_caught_up(3));
    assert_eq!(c.set().state(3), ReplicaState::Resyncing);
    assert_eq!(c.set().in_sync_count(), 3);
    assert_eq!(c.incarnation(3), 0, "no history until it takes the place");
    assert_eq!(c.to_resync(std::time::Duration::ZERO), Vec::<usize>::new());
    // It takes the place: the old copy is moved off, nothing else moves.
    assert_eq!(c.promote(7), Ok(Some(1)));
    assert_eq!(c.promote(7), Ok(None), "asked again");
    assert_eq!(c.region_map().unwrap().stripes().nodes, vec![1, 7, 3]);
    assert_eq!(c.slot_of(2), None);
    assert_eq!(c.set().state(3), ReplicaState::InSync);
    assert_eq!(c.incarnation(3), 99);
    assert!(c.every_copy_in_sync());
    assert_eq!(targets(&mut c, data(1)), vec![2, 3]);
    assert_eq!(c.follower(), None);
}

/// What a follower is refused, and what it refuses.
#[test]
fn a_follower_is_one_at_a_time_and_only_of_a_place() {
    let mut c = core();
    assert_eq!(c.follow(9, 7, 0), Err(Refusal::NoPlace(9)));
    assert_eq!(c.follow(2, 3, 0), Err(Refusal::HoldsACopy(3)));
    assert_eq!(c.follow(2, 7, 0), Ok((3, true)));
    assert_eq!(c.follow(1, 8, 0), Err(Refusal::Following(7)));
    assert_eq!(c.follow(1, 7, 0), Err(Refusal::HoldsACopy(7)));
    // A replacement waits for the move in progress.
    let out = c.planned_take_out(1).unwrap().unwrap();
    c.apply(&[(out, ReplicaState::Outdated)]);
    assert_eq!(c.replace(1, 8, 0), Err(Refusal::Following(7)));
    assert_eq!(c.promote(9), Err(Refusal::NotFollowing(9)));
    assert_eq!(c.promote(3), Ok(None), "node 3 holds its place");
    // Given up: moved off, and another may follow.
    assert_eq!(c.unfollow(7), Some(3));
    assert_eq!(c.unfollow(3), None, "not a follower");
    assert_eq!(c.follower(), None);
    assert_eq!(c.follow(2, 8, 0), Ok((4, true)));
    let mut mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert_eq!(mirror.follow(1, 2, 0), Err(Refusal::NotParity));
}

/// A follower that fails a write goes out, and comes back whole: it has no history.
#[test]
fn a_follower_that_fails_comes_back_whole() {
    let mut c = core();
    c.follow(2, 7, 0).unwrap();
    c.resync_begun(3, progress());
    c.resync_done(3, 99, progress());
    c.apply(&[(3, ReplicaState::Outdated)]);
    assert!(!c.is_caught_up(3));
    assert_eq!(c.promote(7), Err(Refusal::NotCaughtUp(7)));
    assert_eq!(c.to_resync(std::time::Duration::ZERO), vec![3]);
    assert!(matches!(
        c.resync_start(3, 99),
        Ok(ResyncStart::From {
            incremental: false,
            ..
        })
    ));
    // Filling again, it is not whole: what it missed while out is not copied yet.
    c.resync_begun(3, progress());
    assert!(!c.is_caught_up(3));
    assert_eq!(c.promote(7), Err(Refusal::NotCaughtUp(7)));
}
