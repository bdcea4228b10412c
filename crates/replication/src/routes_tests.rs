use crate::{
    Action, Answers, Decision, Input, Mirrored, Parity, ReadFrom, Region, ReplicaOutcome,
    ReplicaState, Ticket, VolumeCore, WriteFailure,
};

/// 2+1 regions hold 2 chunks of 256 KiB.
const REGION: u64 = 512 << 10;

fn parity_core(states: [ReplicaState; 3]) -> VolumeCore {
    let r: Vec<(u32, ReplicaState)> = (1..=3).zip(states).collect();
    let p = Parity {
        data: 2,
        parity: 1,
        mirror_share: 20,
    };
    VolumeCore::new(&r, 0, false, 4)
        .with_stripes(p, 4 * REGION)
        .unwrap()
}

fn healthy() -> VolumeCore {
    parity_core([ReplicaState::InSync; 3])
}

fn data(offset: u64, len: u64) -> Mirrored {
    Mirrored::Data { offset, len }
}

fn go(c: &mut VolumeCore, request: Mirrored) -> (Option<Ticket>, Vec<usize>) {
    match c.step(Input::Submit(request)).pop() {
        Some(Action::Proceed { place, targets }) => (place, targets),
        other => panic!("{request:?}: {other:?}"),
    }
}

fn answer(
    c: &mut VolumeCore,
    place: Option<Ticket>,
    request: Mirrored,
    targets: &[usize],
    o: ReplicaOutcome,
) -> Vec<Action> {
    let outcomes = vec![o; targets.len()];
    c.step(Input::Answered(Answers {
        place,
        request,
        targets,
        outcomes: &outcomes,
        from_reserve: false,
    }))
}

#[test]
fn a_write_goes_to_its_regions_mirrors_and_a_flush_to_every_node() {
    let mut c = healthy();
    // Region r's mirrored copies are the nodes of its first M+1 = 2 chunks: r, r+1 (mod 3).
    assert_eq!(go(&mut c, data(0, 4096)).1, vec![0, 1]);
    assert_eq!(go(&mut c, data(REGION, 65536)).1, vec![1, 2]);
    assert_eq!(go(&mut c, data(2 * REGION + 8192, 4096)).1, vec![0, 2]);
    assert_eq!(go(&mut c, Mirrored::Flush).1, vec![0, 1, 2]);
    assert_eq!(go(&mut c, Mirrored::Snapshot).1, vec![0, 1, 2]);
    assert_eq!(c.region_end(REGION - 1), REGION);
    assert_eq!(c.region_end(REGION), 2 * REGION);
}

#[test]
fn a_write_across_a_regions_end_is_refused_before_it_takes_a_place() {
    let mut c = healthy();
    assert_eq!(
        c.step(Input::Submit(data(REGION - 4096, 8192))),
        vec![Action::Carry(Decision::Fail(WriteFailure::CrossesRegion {
            at: REGION
        }))]
    );
    assert_eq!(c.places(), 0);
    let mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert_eq!(mirror.region_end(REGION - 1), u64::MAX);
}

#[test]
fn a_waiting_write_is_granted_with_its_own_regions_targets() {
    let mut c = healthy();
    let (a, _) = go(&mut c, data(REGION, 8192));
    let Some(Action::Wait { place: b }) = c.step(Input::Submit(data(REGION + 4096, 4096))).pop()
    else {
        panic!("an overlapping write waits");
    };
    let out = answer(&mut c, a, data(REGION, 8192), &[1, 2], ReplicaOutcome::Done);
    assert_eq!(
        out,
        vec![
            Action::Granted {
                places: vec![(b, vec![1, 2])]
            },
            Action::Ack { wait_copies: false }
        ]
    );
    assert_eq!(c.place_targets(b), vec![1, 2]);
}

#[test]
fn a_parity_block_reads_from_the_mirrors_only_once_a_copy_holds_its_write() {
    let mut c = healthy();
    c.restore_regions(&[Region::Parity { slot: 0 }, Region::Mirror], [])
        .unwrap();
    let chunk = |c: &VolumeCore| matches!(c.parity_read(0), Some(Ok(ReadFrom::Chunk(_))));
    assert!(chunk(&c));
    // Failed everywhere (no control plane to take copies out): it stays on the stripe.
    let (p, t) = go(&mut c, data(0, 4096));
    let out = answer(&mut c, p, data(0, 4096), &t, ReplicaOutcome::Failed);
    assert!(matches!(out.as_slice(), [Action::Carry(Decision::Fail(_))]));
    c.step(Input::Release(p.unwrap()));
    assert!(
        chunk(&c),
        "a write no copy holds leaves the block on the stripe"
    );
    // Sent, not answered: still the stripe (the mirrors may not hold it yet).
    let (p, t) = go(&mut c, data(0, 4096));
    assert!(chunk(&c));
    answer(&mut c, p, data(0, 4096), &t, ReplicaOutcome::Done);
    assert_eq!(c.parity_read(0), Some(Ok(ReadFrom::Mirror(vec![1, 2]))));
    assert!(
        matches!(c.parity_read(1), Some(Ok(ReadFrom::Chunk(_)))),
        "only the blocks written"
    );
    assert_eq!(
        c.parity_read(REGION / 4096),
        Some(Ok(ReadFrom::Mirror(vec![2, 3])))
    );
}

#[test]
fn a_block_whose_chunk_is_out_is_rebuilt_from_k_others() {
    let mut c = parity_core([
        ReplicaState::Outdated,
        ReplicaState::InSync,
        ReplicaState::InSync,
    ]);
    c.restore_regions(&[Region::Parity { slot: 1 }; 4], [])
        .unwrap();
    let Some(Ok(ReadFrom::Rebuild { lost, from })) = c.parity_read(5) else {
        panic!("{:?}", c.parity_read(5));
    };
    assert_eq!(lost, 0);
    let nodes: Vec<u32> = from.iter().map(|f| f.node).collect();
    assert_eq!(nodes, vec![2, 3]);
    assert!(from.iter().all(|f| f.slot == 1 && f.block == 5));
    // A mirror volume reads by its read plan.
    let mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert_eq!(mirror.parity_read(0), None);
}

#[test]
fn a_parity_core_needs_its_k_plus_m_nodes_and_no_writer_serves_it_yet() {
    let p = Parity {
        data: 2,
        parity: 1,
        mirror_share: 20,
    };
    let two = [(1, ReplicaState::InSync), (2, ReplicaState::InSync)];
    assert!(VolumeCore::new(&two, 0, false, 4)
        .with_stripes(p, REGION)
        .is_err());
    assert!(healthy().with_layout(crate::Layout::Parity(p)).is_err());
}

#[test]
fn an_encode_reads_and_trims_only_under_a_hold_of_its_region_and_the_list_stays_fixed() {
    use crate::{EncodeAction, EncodeEnd, EncodeStep};
    let mut c = healthy();
    assert_eq!(c.encode_begin(1), Ok(()));
    let hold = |c: &mut VolumeCore| {
        let Some(Action::Proceed { place, .. }) = c
            .step(Input::Hold {
                start: REGION,
                end: 2 * REGION,
            })
            .pop()
        else {
            panic!("an idle region is held at once");
        };
        place
    };
    // The read, under a hold; the chunks' write, the flush and the switch without one.
    assert_eq!(
        c.encode_next(1, None),
        Some(EncodeAction::Hold {
            start: REGION,
            end: 2 * REGION
        })
    );
    let place = hold(&mut c);
    assert!(matches!(
        c.encode_next(1, place),
        Some(EncodeAction::Do(EncodeStep::Read { .. }))
    ));
    assert_eq!(c.encode_answered(1, true), EncodeEnd::Going);
    c.step(Input::Release(place.unwrap()));
    for _ in 0..3 {
        let Some(EncodeAction::Do(step)) = c.encode_next(1, None) else {
            panic!("{:?}", c.encode_next(1, None));
        };
        assert!(!matches!(step, EncodeStep::Free { .. }), "{step:?}");
        assert_eq!(c.encode_answered(1, true), EncodeEnd::Going);
    }
    assert_eq!(
        c.encode_next(1, None),
        Some(EncodeAction::Hold {
            start: REGION,
            end: 2 * REGION
        })
    );
    let Some(Action::Proceed { place, .. }) = c
        .step(Input::Hold {
            start: REGION,
            end: 2 * REGION,
        })
        .pop()
    else {
        panic!("an idle region is held at once");
    };
    let Some(EncodeAction::Do(EncodeStep::Free { blocks, .. })) = c.encode_next(1, place) else {
        panic!("held, the trim goes");
    };
    assert_eq!(blocks.len() as u64, REGION / 4096);
    // A write sent now waits for the hold, and the trim handed out stays the same.
    let Some(Action::Wait { .. }) = c.step(Input::Submit(data(REGION, 4096))).pop() else {
        panic!("a write waits for the trim's hold");
    };
    let Some(EncodeAction::Do(EncodeStep::Free { blocks: again, .. })) = c.encode_next(1, place)
    else {
        panic!()
    };
    assert_eq!(blocks, again);
    assert_eq!(c.encode_answered(1, true), EncodeEnd::Done);
    // Trimmed, the block reads from the stripe until a copy holds the waiting write.
    assert!(matches!(
        c.parity_read(REGION / 4096),
        Some(Ok(ReadFrom::Chunk(_)))
    ));
    assert_eq!(
        VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4).encode_begin(0),
        Err(crate::EncodeRefusal::NotParity)
    );
}

#[test]
fn a_returning_node_copies_its_regions_from_their_mirrors_and_rebuilds_its_chunks() {
    use crate::MirrorCopy;
    let mut c = parity_core([
        ReplicaState::Outdated,
        ReplicaState::InSync,
        ReplicaState::InSync,
    ]);
    c.restore_regions(&[Region::Parity { slot: 1 }, Region::Mirror], [])
        .unwrap();
    // Region 0's copies are nodes 1 and 2; region 1's are 2 and 3: node 1 does not mirror it.
    assert_eq!(c.parity_copy_source(0, 0), Some(MirrorCopy::From(1)));
    assert_eq!(
        c.parity_copy_source(REGION / 4096, 0),
        Some(MirrorCopy::NotMirrored)
    );
    // Its chunk of the parity region (chunk 0 of region 0), from the other two.
    let r = c.parity_rebuilds(0).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].to.node, r[0].to.chunk, r[0].to.slot), (1, 0, 1));
    let from: Vec<u32> = r[0].from.iter().map(|f| f.node).collect();
    assert_eq!(from, vec![2, 3]);
    // Node 2 out too: region 0 has no copy in sync, and the stripe too few chunks.
    let c2 = parity_core([
        ReplicaState::Outdated,
        ReplicaState::Outdated,
        ReplicaState::InSync,
    ]);
    assert_eq!(c2.parity_copy_source(0, 0), Some(MirrorCopy::NoSource));
    let mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert_eq!(mirror.parity_copy_source(0, 0), None);
}

#[test]
fn a_resync_waits_for_a_switch_being_recorded_and_abandons_encodes_before_theirs() {
    use crate::{EncodeAction, EncodeEnd, EncodeStep, Refusal, ResyncProgress};
    let progress = ResyncProgress::begun();
    let mut c = healthy();
    c.encode_begin(0).unwrap();
    c.encode_begin(1).unwrap();
    // Region 0 to its switch; region 1 read only.
    for _ in 0..3 {
        c.encode_answered(0, true);
    }
    c.encode_answered(1, true);
    assert!(matches!(
        c.encode_next(0, None),
        Some(EncodeAction::Do(EncodeStep::Switch { .. }))
    ));
    // Node 3 goes out; its resync waits while region 0's switch may be being recorded.
    c.apply(&[(2, ReplicaState::Outdated)]);
    assert_eq!(c.resync_start(2, 2), Err(Refusal::Switching));
    // Region 1's write of chunks now fails: a node of its stripe is out of sync.
    assert_eq!(c.encode_answered(1, true), EncodeEnd::Abandoned);
    assert_eq!(c.encode_answered(0, true), EncodeEnd::Going);
    assert!(c.resync_start(2, 2).is_ok());
    c.encode_begin(1).unwrap_err();
    c.resync_begun(2, progress);
    assert_eq!(
        c.encoding(),
        vec![0],
        "the switched encode goes on to its trim"
    );
}

#[test]
fn a_trim_over_a_stripe_or_an_encode_is_sent_as_zeroes() {
    let mut c = healthy();
    c.restore_regions(
        &[Region::Parity { slot: 0 }, Region::Mirror, Region::Mirror],
        [],
    )
    .unwrap();
    assert!(c.trim_needs_zeroes(0, 4096), "a stripe beneath");
    assert!(
        !c.trim_needs_zeroes(REGION, 4096),
        "nothing beneath a mirrored region"
    );
    c.encode_begin(1).unwrap();
    assert!(c.trim_needs_zeroes(REGION, 4096), "a stripe being made");
    assert!(!c.trim_needs_zeroes(2 * REGION, 8192));
    let mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert!(!mirror.trim_needs_zeroes(0, 4096));
}

/// The core offers the coldest mirrored region while over the layout's share (20% here: one
/// of four regions), and nothing to a mirror.
#[test]
fn the_core_offers_regions_to_encode_by_the_layouts_share() {
    let mut c = healthy();
    let heat = |r: u64| [3, 0, 2, 1][r as usize];
    assert_eq!(c.regions_to_encode(heat, 1), vec![1]);
    assert_eq!(
        c.regions_to_encode(heat, 8),
        vec![1, 3, 2, 0],
        "each counted as freed"
    );
    c.restore_regions(
        &[
            Region::Parity { slot: 0 },
            Region::Parity { slot: 0 },
            Region::Parity { slot: 0 },
            Region::Mirror,
        ],
        [],
    )
    .unwrap();
    // 25% mirrored is over 20%: the last mirrored region goes too.
    assert_eq!(c.regions_to_encode(heat, 8), vec![3]);
    // Past the share by how much: 25% against 20% and a headroom of 4 or 5 points.
    assert!(c.mirrored_past(0) && c.mirrored_past(4));
    assert!(!c.mirrored_past(5) && !c.mirrored_past(u8::MAX));
    let mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert_eq!(mirror.regions_to_encode(heat, 8), Vec::<u64>::new());
    assert!(!mirror.mirrored_past(0));
}

/// A writer attached again takes the recorded regions (the rest mirrored) and the overlay
/// its nodes' held maps gave; a record naming more regions than the volume has is refused,
/// as is a mirror asked to restore regions.
#[test]
fn a_restored_map_takes_the_record_and_the_overlay_and_refuses_a_longer_record() {
    let mut c = healthy();
    let regions = c.region_map().unwrap().regions().len();
    c.restore_regions(
        &[Region::Mirror, Region::Parity { slot: 1 }],
        [REGION / 4096 + 3],
    )
    .unwrap();
    let map = c.region_map().unwrap();
    assert_eq!(map.regions().len(), regions);
    assert_eq!(map.regions()[1], Region::Parity { slot: 1 });
    assert!(map.regions()[2..].iter().all(|r| *r == Region::Mirror));
    assert!(matches!(
        c.parity_read(REGION / 4096 + 3),
        Some(Ok(ReadFrom::Mirror(_)))
    ));
    assert!(matches!(
        c.parity_read(REGION / 4096 + 4),
        Some(Ok(ReadFrom::Chunk(_)))
    ));
    let longer = vec![Region::Mirror; regions + 1];
    assert_eq!(
        c.restore_regions(&longer, []),
        Err(crate::LayoutError::Regions {
            recorded: regions + 1,
            regions
        })
    );
    let mut mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert!(mirror.restore_regions(&[], []).is_err());
}

/// Copies out of a 2+1 volume leave it served while each region keeps a mirror, and each
/// region in parity K chunks: any one out, never two once a region is in parity (a mirror
/// volume is served by any copy in sync).
#[test]
fn a_parity_volume_is_served_without_up_to_m_copies_once_a_region_is_in_parity() {
    let mut c = healthy();
    assert!(c.serves_without(&[0]) && c.serves_without(&[2]));
    // Every region mirrored: the two mirrors of region 0 out leave it unserved.
    let mirrors_of_0: Vec<usize> = c
        .region_map()
        .unwrap()
        .stripes()
        .mirrors_of(0)
        .into_iter()
        .map(|n| n as usize - 1)
        .collect();
    assert!(
        !c.serves_without(&mirrors_of_0),
        "region 0 loses both mirrors"
    );
    c.restore_regions(&[Region::Mirror, Region::Parity { slot: 0 }], [])
        .unwrap();
    for out in [[0, 1], [0, 2], [1, 2]] {
        assert!(
            !c.serves_without(&out),
            "{out:?}: region 1 has one chunk of two"
        );
    }
    assert!(c.serves_without(&[1]));
    let mut down = parity_core([
        ReplicaState::InSync,
        ReplicaState::Outdated,
        ReplicaState::InSync,
    ]);
    down.restore_regions(&[Region::Parity { slot: 0 }], [])
        .unwrap();
    assert!(down.serves_without(&[]) && !down.serves_without(&[0]));
    let mirror = VolumeCore::new(&[(1, ReplicaState::InSync)], 0, false, 4);
    assert!(mirror.serves_without(&[0]));
}

/// The minimum of copies of a parity volume counts a write's region's mirrors (default M of
/// M+1), beside K nodes in sync for the stripes: a write waits only if its own region is
/// short, and a planned restart is refused if a region it mirrors would be.
#[test]
fn a_parity_write_waits_only_while_its_region_has_too_few_mirrors() {
    let states = [
        ReplicaState::InSync,
        ReplicaState::InSync,
        ReplicaState::Outdated,
    ];
    let r: Vec<(u32, ReplicaState)> = (1..=3).zip(states).collect();
    let p = Parity {
        data: 2,
        parity: 1,
        mirror_share: 20,
    };
    let managed = |min| {
        VolumeCore::new(&r, min, true, 4)
            .with_stripes(p, 4 * REGION)
            .unwrap()
    };
    // Region 0 is mirrored on nodes 1 and 2, region 1 on 2 and 3 (out).
    let c = managed(0);
    assert_eq!(c.min_copies(), 1, "M of M+1 by default");
    assert!(c.enough_for(data(0, 4096)) && c.enough_for(data(REGION, 4096)));
    let mut c = managed(2);
    assert_eq!(c.min_copies(), 2);
    assert!(c.enough_for(data(0, 4096)));
    assert!(
        !c.enough_for(data(REGION, 4096)),
        "one of its mirrors is out"
    );
    assert!(c.enough_for(Mirrored::Flush) && c.enough());
    assert_eq!(
        c.step(Input::Submit(data(REGION, 4096))),
        vec![Action::Short]
    );
    assert!(matches!(
        c.check_copies_for(data(REGION, 4096)).0,
        crate::Copies::Short { have: 1, need: 2 }
    ));
    // Two nodes in sync are the K a stripe needs: neither may go for a planned restart.
    assert!(c.planned_take_out(2).is_err());
    assert!(managed(0).planned_take_out(1).is_err());
    // At most a region's M+1 mirrors.
    c.set_min_copies(9);
    assert_eq!(c.min_copies(), 2);
}

/// 4+2: a planned restart keeps K nodes and, in every region the node mirrors, the minimum
/// of mirrors.
#[test]
fn a_planned_restart_keeps_each_regions_minimum_of_mirrors() {
    let r: Vec<(u32, ReplicaState)> = (1..=6).map(|n| (n, ReplicaState::InSync)).collect();
    let p = Parity {
        data: 4,
        parity: 2,
        mirror_share: 20,
    };
    let core = |min| {
        VolumeCore::new(&r, min, true, 8)
            .with_stripes(p, 64 << 20)
            .unwrap()
    };
    assert_eq!(core(0).planned_take_out(3), Ok(Some(2)));
    assert!(
        core(3).planned_take_out(3).is_err(),
        "every mirror of its regions must stay"
    );
}

/// A lost copy's replacement takes its place in every stripe: the regions it mirrored and its
/// chunks are the new node's, the other nodes' places stay, and the new copy comes back whole.
#[test]
fn a_replaced_copy_takes_the_old_ones_place_and_nothing_else_moves() {
    use crate::{MirrorCopy, Refusal};
    let mut c = parity_core([
        ReplicaState::InSync,
        ReplicaState::Failed,
        ReplicaState::InSync,
    ]);
    c.restore_regions(&[Region::Parity { slot: 0 }, Region::Mirror], [])
        .unwrap();
    let before = c.region_map().unwrap().stripes().nodes.clone();
    // Not a copy that takes writes, not a node with a copy, not a node with no place.
    assert_eq!(c.replace(1, 7, 0), Err(Refusal::TakesWrites(1)));
    assert_eq!(c.replace(2, 3, 0), Err(Refusal::HoldsACopy(3)));
    assert_eq!(c.replace(9, 7, 0), Err(Refusal::NoPlace(9)));
    assert_eq!(c.replace(2, 7, 0), Ok((3, true)));
    // Asked again (a manager that took over): the same slot, nothing changes.
    assert_eq!(c.replace(2, 7, 5), Ok((3, false)));
    assert_eq!(c.rate(3), Some(5));
    let s = c.region_map().unwrap().stripes().clone();
    assert_eq!(s.nodes, vec![before[0], 7, before[2]]);
    assert_eq!(c.slot_of(2), None, "the old copy is retired");
    assert_eq!(c.set().state(3), ReplicaState::Failed);
    // Region 0's mirrors were nodes 1 and 2: now 1 and 7; its parity chunk, node 3's, stays.
    assert_eq!(s.mirrors_of(0), vec![1, 7]);
    assert_eq!(c.parity_copy_source(0, 3), Some(MirrorCopy::From(0)));
    let r = c.parity_rebuilds(3).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].to.node, r[0].to.chunk), (7, 1));
    let from: Vec<u32> = r[0].from.iter().map(|f| f.node).collect();
    assert_eq!(from, vec![1, 3]);
    // A resync whole: the new copy has no history.
    assert!(matches!(
        c.resync_start(3, 42),
        Ok(crate::ResyncStart::From {
            incremental: false,
            ..
        })
    ));
    // A mirror's copy is added beside the others, never replaced.
    let mut mirror = VolumeCore::new(&[(1, ReplicaState::Failed)], 0, false, 4);
    assert_eq!(mirror.replace(1, 2, 0), Err(Refusal::NotParity));
}

/// Encodes a region from its begin to its end, holding what the core asks to hold.
fn encode_through(c: &mut VolumeCore, region: u64) -> crate::EncodeEnd {
    use crate::{EncodeAction, EncodeEnd};
    if let Err(e) = c.encode_begin(region) {
        panic!("region {region}: {e}");
    }
    let mut place = None;
    loop {
        match c.encode_next(region, place) {
            Some(EncodeAction::Hold { start, end }) => {
                let Some(Action::Proceed { place: p, .. }) =
                    c.step(Input::Hold { start, end }).pop()
                else {
                    panic!("an idle region is held at once");
                };
                place = p;
            }
            Some(EncodeAction::Do(_)) => match c.encode_answered(region, true) {
                EncodeEnd::Going => {}
                end => return end,
            },
            None => panic!("region {region}: no step"),
        }
    }
}

/// A replaced copy's old slot stays in the set, moved off: it must not stop the encodes that
/// follow once the new copy is in sync (they were all abandoned until the writer attached
/// again), nor a node that comes back to its place later.
#[test]
fn encodes_go_on_after_a_copy_is_replaced_and_its_node_comes_back() {
    use crate::{EncodeEnd, ResyncProgress};
    let progress = ResyncProgress::begun();
    let r = [
        (1, ReplicaState::InSync),
        (2, ReplicaState::Failed),
        (3, ReplicaState::InSync),
    ];
    let p = Parity {
        data: 2,
        parity: 1,
        mirror_share: 20,
    };
    let mut c = VolumeCore::new(&r, 0, false, 5)
        .with_stripes(p, 4 * REGION)
        .unwrap();
    assert_eq!(c.replace(2, 7, 0), Ok((3, true)));
    c.resync_begun(3, progress.clone());
    c.resync_done(3, 9, progress.clone());
    assert_eq!(encode_through(&mut c, 1), EncodeEnd::Done);
    // Node 2 takes the place back: its first slot is moved off, its new one in sync.
    let out = c.planned_take_out(7).unwrap().unwrap();
    c.apply(&[(out, ReplicaState::Outdated)]);
    assert_eq!(c.replace(7, 2, 0), Ok((4, true)));
    c.resync_begun(4, progress.clone());
    c.resync_done(4, 10, progress);
    assert_eq!(encode_through(&mut c, 2), EncodeEnd::Done);
}
