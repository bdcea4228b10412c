//! The tier map against an in-memory model: random writes, trims, moves and crashes, a crash
//! at each step of a move included; after each reopen the bytes match the model, every extent
//! is in exactly one tier, and the fast tier's file holds no more than its extents.

use super::*;
use crate::Extent;
use proptest::prelude::*;
use std::os::unix::fs::MetadataExt;

const EXT: u64 = crate::GRAIN;
const EXTENTS: u64 = 12;
const SIZE: u64 = EXT * EXTENTS;
const PLACES: u64 = 5;

fn cfg() -> TierConfig {
    TierConfig {
        fast_capacity: PLACES * EXT,
        disk: None,
        migrate_rate: 0,
        extent: EXT,
    }
}

/// The store with its mover running, moving up to `extents` extents a second.
fn with_mover(dir: &Path, extents: u64) -> TieredStore {
    TieredStore::open(
        dir,
        TierConfig {
            migrate_rate: extents * EXT,
            ..cfg()
        },
    )
    .unwrap()
}

fn open(dir: &Path) -> (TieredStore, Arc<TieredReplica>) {
    let s = TieredStore::open_still(dir, cfg()).unwrap();
    let all = s.open_all();
    assert_eq!(all.len(), 1, "one replica: {all:?}");
    all.into_iter().next().unwrap().unwrap();
    let r = s.replica(1).unwrap();
    (s, r)
}

fn read_all(r: &dyn Replica) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    r.read(0, &mut b).unwrap();
    b
}

/// Every extent's bytes are in its tier only, and the fast file takes no more space than
/// the extents on the fast tier.
fn check_placement(dir: &Path, s: &TieredStore, r: &TieredReplica) {
    for e in 0..r.extents() {
        let (off, len) = r.ext().range(e);
        let other = r.on(match r.tier(e) {
            Tier::Fast => Tier::Slow,
            Tier::Slow => Tier::Fast,
        });
        let ext = other.block_status(off, len).unwrap();
        assert!(
            ext.iter().all(|x| x.flags & Extent::HOLE != 0),
            "extent {e} on {:?} has bytes in the other tier: {ext:?}",
            r.tier(e)
        );
    }
    let fast = r.count(Tier::Fast);
    assert!(fast <= PLACES);
    assert_eq!(
        s.tiers().unwrap().fast_used,
        fast * EXT,
        "fast-tier accounting"
    );
    let data = std::fs::metadata(dir.join("fast").join("replica-0000000000000001.data")).unwrap();
    // The file system counts its own extent-tree blocks too: a few KiB of slack, far less than
    // the 64 KiB grain a leaked place would take.
    assert!(
        data.blocks() * 512 <= fast * EXT + 16 * 1024,
        "fast file holds {} bytes for {fast} extents",
        data.blocks() * 512
    );
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        block: u64,
        blocks: u64,
        seed: u8,
    },
    Zero {
        block: u64,
        blocks: u64,
        trim: bool,
    },
    Move {
        extent: u64,
        fast: bool,
        crash: Option<u8>,
    },
    Flush,
    Reopen {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let blocks = SIZE / 4096;
    prop_oneof![
        4 => (0..blocks, 1u64..40, any::<u8>()).prop_map(|(block, n, seed)| Op::Write { block, blocks: n, seed }),
        1 => (0..blocks, 1u64..40, any::<bool>()).prop_map(|(block, n, trim)| Op::Zero { block, blocks: n, trim }),
        4 => (0..EXTENTS, any::<bool>(), proptest::option::weighted(0.3, 0u8..3))
            .prop_map(|(extent, fast, crash)| Op::Move { extent, fast, crash }),
        1 => Just(Op::Flush),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
    ]
}

fn step(c: u8) -> MoveStep {
    match c {
        0 => MoveStep::Copied,
        1 => MoveStep::Durable,
        _ => MoveStep::Switched,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn tier_map_matches_the_model_through_moves_and_crashes(ops in proptest::collection::vec(op(), 1..40)) {
        let d = tempfile::tempdir().unwrap();
        let mut model = vec![0u8; SIZE as usize];
        let mut s = TieredStore::open_still(d.path(), cfg()).unwrap();
        s.create(1, SIZE).unwrap();
        let mut r = s.replica(1).unwrap();
        for op in ops {
            match op {
                Op::Write { block, blocks, seed } => {
                    let off = block * 4096;
                    let len = (blocks * 4096).min(SIZE - off);
                    let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add((i / 512) as u8) | 1).collect();
                    r.write(off, &data, false).unwrap();
                    model[off as usize..(off + len) as usize].copy_from_slice(&data);
                }
                Op::Zero { block, blocks, trim } => {
                    let off = block * 4096;
                    let len = (blocks * 4096).min(SIZE - off);
                    r.write_zeroes(off, len, trim, false).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                Op::Flush => r.flush().unwrap(),
                Op::Move { extent, fast, crash } => {
                    let to = if fast { Tier::Fast } else { Tier::Slow };
                    let before = r.tier(extent);
                    let room = s.tiers().unwrap().fast_used < PLACES * EXT;
                    let moved = r.move_extent(extent, to, crash.map(step)).unwrap();
                    let expect = before != to && (to == Tier::Slow || room) && crash.is_none_or(|c| c == 2);
                    prop_assert_eq!(moved, expect, "move of {} to {:?} from {:?}", extent, to, before);
                    if let Some(c) = crash {
                        // The process dies here; the store is opened again.
                        drop(r);
                        drop(s);
                        (s, r) = open(d.path());
                        let want = if c == 2 && moved { to } else { before };
                        prop_assert_eq!(r.tier(extent), want, "after a crash at {:?}", step(c));
                        prop_assert_eq!(read_all(r.as_ref()), model.clone());
                        check_placement(d.path(), &s, &r);
                    }
                }
                Op::Reopen { clean } => {
                    if clean {
                        r.close().unwrap();
                    }
                    drop(r);
                    drop(s);
                    (s, r) = open(d.path());
                    check_placement(d.path(), &s, &r);
                }
            }
            prop_assert_eq!(read_all(r.as_ref()), model.clone());
        }
        drop(r);
        drop(s);
        let (s, r) = open(d.path());
        prop_assert_eq!(read_all(r.as_ref()), model);
        check_placement(d.path(), &s, &r);
    }
}

#[test]
fn a_pin_to_fast_that_does_not_fit_is_refused_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    s.create(1, SIZE).unwrap();
    s.create(2, 3 * EXT).unwrap();
    let big = s.replica(1).unwrap();
    let small = s.replica(2).unwrap();
    let e = big.set_pin(Pin::Fast).unwrap_err();
    assert!(matches!(e, StoreError::NoSpace { .. }), "{e}");
    assert_eq!(big.pin(), Pin::Auto);
    small.set_pin(Pin::Fast).unwrap();
    drop((big, small));
    drop(s);
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    assert_eq!(s.open_all().len(), 2);
    assert_eq!(s.replica(2).unwrap().pin(), Pin::Fast, "the pin is durable");
    assert_eq!(s.replica(1).unwrap().pin(), Pin::Auto);
}

#[test]
fn the_mover_promotes_hot_extents_and_honours_pins() {
    let d = tempfile::tempdir().unwrap();
    let s = with_mover(d.path(), 100);
    s.create(1, SIZE).unwrap();
    let r = s.replica(1).unwrap();
    r.write(0, &vec![7u8; SIZE as usize], false).unwrap();
    let mut b = vec![0u8; 4096];
    // Extents 3 and 8 are hot.
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !done() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "{what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    for i in 0..20 {
        r.read(3 * EXT + (i % 4) * 8192, &mut b).unwrap();
        r.read(8 * EXT + (i % 4) * 8192, &mut b).unwrap();
    }
    wait("hot extents promoted", &|| {
        r.tier(3) == Tier::Fast && r.tier(8) == Tier::Fast
    });
    assert_eq!(r.count(Tier::Fast), 2, "only the hot extents move");
    r.set_pin(Pin::Slow).unwrap();
    wait("pinned to slow", &|| r.count(Tier::Fast) == 0);
    assert_eq!(read_all(r.as_ref()), vec![7u8; SIZE as usize]);
    s.create(2, 4 * EXT).unwrap();
    let p = s.replica(2).unwrap();
    p.set_pin(Pin::Fast).unwrap();
    wait("pinned to fast", &|| p.count(Tier::Fast) == 4);
    let st = r.tier_stats();
    assert_eq!((st.promotions, st.demotions), (2, 2));
}

#[test]
fn a_full_scan_promotes_at_most_its_first_extent() {
    let d = tempfile::tempdir().unwrap();
    let s = with_mover(d.path(), 100);
    s.create(1, SIZE).unwrap();
    let r = s.replica(1).unwrap();
    let mut b = vec![0u8; 4096];
    for off in (0..SIZE).step_by(4096) {
        r.read(off, &mut b).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(400));
    // Its first piece is a random access like any other; the rest never heat.
    assert!(r.count(Tier::Fast) <= 1, "{}", r.count(Tier::Fast));
}

#[test]
fn a_replica_deleted_while_its_extents_move_leaves_nothing_behind() {
    let d = tempfile::tempdir().unwrap();
    let s = with_mover(d.path(), 1000);
    s.create(1, SIZE).unwrap();
    let r = s.replica(1).unwrap();
    r.write(0, &vec![3u8; SIZE as usize], false).unwrap();
    r.set_pin(Pin::Fast).unwrap_err(); // 12 extents do not fit in 5 places
    let mut b = vec![0u8; 4096];
    for e in 0..EXTENTS {
        for _ in 0..5 {
            r.read(e * EXT, &mut b).unwrap();
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(150));
    s.delete(1).unwrap();
    assert!(
        r.persist(&r.ext()).is_err(),
        "a deleted replica's map is never written again"
    );
    drop(r);
    drop(s);
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    assert!(s.open_all().is_empty());
    let left: Vec<String> = ["fast", "slow", "."]
        .iter()
        .flat_map(|sub| std::fs::read_dir(d.path().join(sub)).unwrap())
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("replica-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(s.tiers().unwrap().fast_used, 0);
}

/// A resize keeps every extent where it was: grown extents start on the slow tier (and move
/// like any other), a shrink gives back the fast places of the extents it drops, and the
/// sizes, tiers and bytes hold across a reopen.
#[test]
fn a_replica_grows_and_shrinks_with_its_extents_in_place() {
    let d = tempfile::tempdir().unwrap();
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    s.create(1, SIZE).unwrap();
    let r = s.replica(1).unwrap();
    for e in 0..EXTENTS {
        r.write(e * EXT, &[e as u8 + 1; 4096], false).unwrap();
    }
    assert!(r.move_extent(2, Tier::Fast, None).unwrap());
    assert!(r.move_extent(11, Tier::Fast, None).unwrap());
    r.resize(SIZE + 2 * EXT + 8192).unwrap();
    assert_eq!(
        (r.size(), r.extents()),
        (SIZE + 2 * EXT + 8192, EXTENTS + 3)
    );
    assert_eq!(r.tier(EXTENTS + 2), Tier::Slow);
    let mut b = vec![9u8; 8192];
    r.read(SIZE + 2 * EXT, &mut b).unwrap();
    assert_eq!(b, vec![0u8; 8192], "grown bytes read as zeros");
    // The short last extent takes writes and moves.
    r.write(SIZE + 2 * EXT, &[0xAB; 8192], false).unwrap();
    assert!(r.move_extent(EXTENTS + 2, Tier::Fast, None).unwrap());
    r.read(SIZE + 2 * EXT, &mut b).unwrap();
    assert_eq!(b, vec![0xABu8; 8192]);
    assert_eq!(s.tiers().unwrap().fast_used, 3 * EXT);
    // Shrinking drops extent 11 and the short one: their places on flash go back.
    r.resize(10 * EXT).unwrap();
    assert_eq!((r.size(), r.extents()), (10 * EXT, 10));
    assert_eq!(s.tiers().unwrap().fast_used, EXT);
    assert!(r.read(10 * EXT, &mut b).is_err());
    assert!(r.resize(4097).is_err(), "not a multiple of 4 KiB");
    r.flush().unwrap();
    drop(r);
    drop(s);
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    s.open_all().pop().unwrap().unwrap();
    let r = s.replica(1).unwrap();
    assert_eq!(
        (r.size(), r.extents(), r.tier(2)),
        (10 * EXT, 10, Tier::Fast)
    );
    assert_eq!(s.tiers().unwrap().fast_used, EXT);
    for e in 0..10 {
        let mut b = vec![0u8; 4096];
        r.read(e * EXT, &mut b).unwrap();
        assert_eq!(b, vec![e as u8 + 1; 4096], "extent {e}");
    }
    // Grown again, the dropped bytes do not come back.
    r.resize(SIZE).unwrap();
    let mut b = vec![9u8; 4096];
    r.read(11 * EXT, &mut b).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
}

/// A grow lets I/O below the old end go on while the tiers grow (the versions' pool grows
/// ahead of its redirects so): a read and a write from another thread, run while the grow is
/// between its two tiers, are answered before it goes on.
#[test]
fn io_below_the_old_end_goes_on_while_a_replica_grows() {
    let d = tempfile::tempdir().unwrap();
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    s.create(1, SIZE).unwrap();
    let r = s.replica(1).unwrap();
    r.write(0, &[4u8; 4096], false).unwrap();
    let io = r.clone();
    *r.mid_grow.lock().unwrap() = Some(replica::TestHook(Box::new(move || {
        let io = io.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut b = vec![0u8; 4096];
            io.read(0, &mut b).unwrap();
            io.write(EXT, &[5u8; 4096], false).unwrap();
            let _ = tx.send(b);
        });
        let b = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("I/O waited for the grow");
        assert_eq!(b, vec![4u8; 4096]);
    })));
    r.resize(2 * SIZE).unwrap();
    *r.mid_grow.lock().unwrap() = None;
    assert_eq!(r.size(), 2 * SIZE);
    let mut b = vec![0u8; 4096];
    r.read(EXT, &mut b).unwrap();
    assert_eq!(b, vec![5u8; 4096]);
}

/// A grow whose map cannot be written goes back (`ungrow`): the resize fails, and if even the
/// old map cannot be written again, the replica refuses I/O until the node restarts (what the
/// map on disk says is not known in between). After the restart the replica has the old size
/// and its bytes, and both tiers are cut back to it.
#[test]
fn a_grow_whose_map_cannot_be_written_goes_back() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = TieredStore::open_still(d.path(), cfg()).unwrap();
        s.create(1, SIZE).unwrap();
        let r = s.replica(1).unwrap();
        r.write(0, &[3u8; 4096], false).unwrap();
        r.flush().unwrap();
        // Between the tiers' grows: a directory where the map's new copy is written, so every
        // write of the map fails from then on.
        let tmp = {
            let mut t = r.map_path.clone().into_os_string();
            t.push(".tmp");
            std::path::PathBuf::from(t)
        };
        let blocker = tmp.clone();
        *r.mid_grow.lock().unwrap() = Some(replica::TestHook(Box::new(move || {
            std::fs::create_dir(&blocker).unwrap();
        })));
        let e = r.resize(2 * SIZE).unwrap_err();
        assert!(e.to_string().contains("persist tier map"), "{e}");
        assert_eq!(r.size(), SIZE, "back to the old size");
        let mut b = vec![0u8; 4096];
        let e = r.read(0, &mut b).unwrap_err();
        assert!(e.to_string().contains("restart the node"), "{e}");
        assert!(r.write(0, &[4u8; 4096], false).is_err());
        std::fs::remove_dir(&tmp).unwrap();
    }
    let (s, r) = open(d.path());
    assert_eq!(r.size(), SIZE, "the map on disk kept the old size");
    assert_eq!(r.slow.size(), SIZE, "the slow tier is cut back");
    assert_eq!(r.fast.size(), SIZE, "the fast tier is cut back");
    let mut b = vec![0u8; 4096];
    r.read(0, &mut b).unwrap();
    assert_eq!(b, vec![3u8; 4096]);
    // It grows once the map can be written.
    r.resize(2 * SIZE).unwrap();
    drop((s, r));
    let (_s, r) = open(d.path());
    assert_eq!(r.size(), 2 * SIZE);
}

/// A crash between a resize's steps leaves a tier longer than the map (a grow before the map
/// named the new size, a shrink after): the next open cuts it back, and what it held past the
/// map's end never shows, even when the replica grows over it again.
#[test]
fn a_tier_longer_than_its_map_is_cut_back_at_open() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = TieredStore::open_still(d.path(), cfg()).unwrap();
        s.create(1, SIZE).unwrap();
        let r = s.replica(1).unwrap();
        r.write(0, &[1u8; 4096], false).unwrap();
        r.flush().unwrap();
    }
    // As a grow cut short leaves it: the slow tier grown, and written past the map's end.
    {
        let slow = FileStore::open(&d.path().join("slow")).unwrap();
        let t = slow.open_all().pop().unwrap().unwrap();
        t.resize(SIZE + EXT).unwrap();
        t.write(SIZE, &[0xEE; 4096], false).unwrap();
        t.flush().unwrap();
        t.close().unwrap();
    }
    let (s, r) = open(d.path());
    assert_eq!(r.size(), SIZE, "the map is the size");
    assert_eq!(r.slow.size(), SIZE, "the slow tier is cut back");
    r.resize(SIZE + EXT).unwrap();
    let mut b = vec![9u8; 4096];
    r.read(SIZE, &mut b).unwrap();
    assert_eq!(b, vec![0u8; 4096], "bytes past the map's end are gone");
    drop((s, r));
    // A tier shorter than the map is not a step of any resize: refused, as corrupt.
    {
        let fast = FileStore::open_thin(&d.path().join("fast")).unwrap();
        let t = fast.open_all().pop().unwrap().unwrap();
        t.resize(SIZE).unwrap();
        t.close().unwrap();
    }
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    let e = s.open_all().pop().unwrap().unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
}

/// A volume pinned to fast grows past what the fast tier holds (its snapshots' pool grows it
/// too, and refusing would fail its writes for space): the mover puts as many of its extents
/// on flash as there are places, the rest stay on the slow tier, and every byte is kept.
#[test]
fn a_volume_pinned_to_fast_grows_past_the_fast_tier_and_the_rest_stays_slow() {
    let d = tempfile::tempdir().unwrap();
    let s = with_mover(d.path(), 100);
    s.create(1, 2 * EXT).unwrap();
    s.create(2, 2 * EXT).unwrap();
    let (a, b) = (s.replica(1).unwrap(), s.replica(2).unwrap());
    a.set_pin(Pin::Fast).unwrap();
    b.set_pin(Pin::Fast).unwrap();
    a.resize(6 * EXT).unwrap();
    for e in 0..6 {
        a.write(e * EXT, &[e as u8 + 1; 4096], false).unwrap();
    }
    let t = std::time::Instant::now();
    while a.count(Tier::Fast) + b.count(Tier::Fast) < PLACES {
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(a.count(Tier::Fast) + b.count(Tier::Fast), PLACES);
    assert_eq!(s.tiers().unwrap().fast_used, PLACES * EXT);
    for e in 0..6 {
        let mut buf = vec![0u8; 4096];
        a.read(e * EXT, &mut buf).unwrap();
        assert_eq!(buf, vec![e as u8 + 1; 4096], "extent {e}");
    }
    drop((a, b));
    drop(s);
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    assert_eq!(s.open_all().len(), 2);
    assert_eq!(s.replica(1).unwrap().size(), 6 * EXT);
    assert_eq!(s.replica(1).unwrap().pin(), Pin::Fast);
}

/// A reservation (the versions' pool asks one ahead of its redirects) reaches the slow tier,
/// whose file store allocates it; the bytes still read as zeros.
#[test]
fn a_reservation_reaches_the_slow_tier() {
    let d = tempfile::tempdir().unwrap();
    let s = TieredStore::open_still(d.path(), cfg()).unwrap();
    s.create(1, SIZE).unwrap();
    let r = s.replica(1).unwrap();
    let data = d.path().join("slow").join("replica-0000000000000001.data");
    let before = std::fs::metadata(&data).unwrap().blocks() * 512;
    r.reserve(EXT, 2 * EXT);
    let after = std::fs::metadata(&data).unwrap().blocks() * 512;
    assert!(after >= before + 2 * EXT, "{before} then {after}");
    let mut b = vec![9u8; 4096];
    r.read(EXT, &mut b).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
    r.reserve(SIZE - 4096, 8192); // past the end: ignored
}

/// Snapshots over a tiered replica, stacked as a node stacks them: the pool the redirects
/// take grows the tiered replica, extents (the pool's too) move between the tiers under the
/// versions, and every version reads back, before and after a reopen.
#[test]
fn snapshots_over_tiers_keep_every_version_while_extents_move() {
    use crate::{SealedStore, VersionedStore};
    let d = tempfile::tempdir().unwrap();
    let stack = |t: Arc<TieredStore>| {
        VersionedStore::new(
            Arc::new(SealedStore::new(t, Some(d.path()))),
            Some(d.path()),
        )
    };
    let pattern = |v: u8, e: u64| vec![v ^ e as u8; 4096];
    let check = |r: &dyn Replica, id: Option<u64>, v: u8| {
        for e in 0..EXTENTS {
            let mut b = vec![0u8; 4096];
            match id {
                Some(id) => r.read_snapshot(id, e * EXT + 4096, &mut b).unwrap(),
                None => r.read(e * EXT + 4096, &mut b).unwrap(),
            }
            assert_eq!(b, pattern(v, e), "version {id:?}, extent {e}");
        }
    };
    {
        let t = Arc::new(TieredStore::open_still(d.path(), cfg()).unwrap());
        let s = stack(t.clone());
        let r = s.create(1, SIZE).unwrap();
        for e in 0..EXTENTS {
            r.write(e * EXT + 4096, &pattern(1, e), false).unwrap();
        }
        r.snapshot(7, 100).unwrap();
        for e in 0..EXTENTS {
            r.write(e * EXT + 4096, &pattern(2, e), false).unwrap();
        }
        r.flush().unwrap();
        let tr = t.replica(1).unwrap();
        assert!(tr.extents() > EXTENTS, "the pool grew the tiered replica");
        // Every extent through the fast tier and back, a few at a time.
        for e in 0..tr.extents() {
            assert!(tr.move_extent(e, Tier::Fast, None).unwrap(), "extent {e}");
            if e >= 2 {
                assert!(tr.move_extent(e - 2, Tier::Slow, None).unwrap());
            }
        }
        check(&*r, Some(7), 1);
        check(&*r, None, 2);
        r.flush().unwrap();
        r.close().unwrap();
    }
    let t = Arc::new(TieredStore::open_still(d.path(), cfg()).unwrap());
    let s = stack(t.clone());
    let r = s.open_all().pop().unwrap().unwrap();
    check(&*r, Some(7), 1);
    check(&*r, None, 2);
    assert_eq!(t.replica(1).unwrap().count(Tier::Fast), 2);
}

/// A redirect places a block in the versions' pool: it heats nothing (else the pool's newest
/// extent, which takes every first overwrite, would be promoted and demoted in turn). A later
/// write to the same block, in place, heats as any write.
#[test]
fn redirects_into_the_pool_do_not_heat_and_later_writes_do() {
    use crate::VersionedStore;
    let d = tempfile::tempdir().unwrap();
    let t = Arc::new(TieredStore::open_still(d.path(), cfg()).unwrap());
    let s = VersionedStore::new(t.clone(), Some(d.path()));
    let r = s.create(1, SIZE).unwrap();
    r.write(0, &vec![1u8; 8 * 4096], false).unwrap();
    r.snapshot(1, 1).unwrap();
    let tr = t.replica(1).unwrap();
    let heat = |tr: &TieredReplica| -> u32 { tr.views().iter().map(|v| v.heat).sum() };
    let before = heat(&tr);
    for k in 0..8 {
        r.write(k * 4096, &[2u8; 4096], false).unwrap();
    }
    assert!(
        tr.extents() > EXTENTS,
        "the writes were redirected into the pool"
    );
    assert_eq!(heat(&tr), before, "redirects heated the pool");
    r.write(4096, &[3u8; 4096], false).unwrap();
    assert!(heat(&tr) > before, "a write in place heats");
    let mut b = vec![0u8; 4096];
    r.read_snapshot(1, 4096, &mut b).unwrap();
    assert_eq!(b, vec![1u8; 4096]);
}
