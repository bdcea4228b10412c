//! The table against a model that keeps every version's bytes: random writes, trims,
//! snapshots, deletes, rollbacks and resizes over a small replica, with a physical space that
//! records what each block holds.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Write(u64),
    Zero(u64),
    Snapshot,
    Delete(usize),
    Rollback(usize),
    Settle,
    Resize(u64),
}

fn op(blocks: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..blocks).prop_map(Op::Write),
        2 => (0..blocks).prop_map(Op::Zero),
        2 => Just(Op::Snapshot),
        1 => (0..8usize).prop_map(Op::Delete),
        1 => (0..8usize).prop_map(Op::Rollback),
        2 => Just(Op::Settle),
        1 => (1..blocks * 3 / 2).prop_map(Op::Resize),
    ]
}

/// The physical space: what each block holds (0: zeros), growing like the pool.
struct Disk {
    blocks: HashMap<u64, u32>,
}

impl Disk {
    fn read(&self, e: Entry) -> u32 {
        if e.phys == ZERO {
            0
        } else {
            self.blocks.get(&e.phys).copied().unwrap_or(0)
        }
    }
}

/// Bytes held by snapshot `id` alone, asked the slow way: each block it names, against every
/// other version.
fn exclusive_model(t: &Table, id: u64) -> u64 {
    let s = &t.snaps[&id];
    let mut others = t.clone();
    others.snaps.remove(&id);
    let mut n = s
        .map
        .iter()
        .filter(|&(l, e)| e.phys != ZERO && !others.in_use(l, e))
        .count() as u64;
    n += (0..t.homes)
        .filter(|l| !s.map.contains_key(l))
        .filter(|&l| !others.in_use(l, Entry::identity(l)))
        .count() as u64;
    n * BLOCK
}

fn check(t: &Table, disk: &Disk, head: &[u32], snaps: &BTreeMap<u64, Vec<u32>>) {
    let exclusive = exclusive_all(t.homes, &t.head, &t.snaps);
    assert_eq!(exclusive.len(), t.snaps.len());
    for id in t.snaps.keys() {
        assert_eq!(
            exclusive[id],
            exclusive_model(t, *id),
            "snapshot {id} alone"
        );
    }
    assert_eq!(t.blocks, head.len() as u64);
    assert!(
        t.head.range(t.blocks..).next().is_none(),
        "head entries past its end"
    );
    for l in 0..t.blocks {
        assert_eq!(
            disk.read(t.entry(&t.head, l)),
            head[l as usize],
            "head block {l}"
        );
    }
    for (id, want) in snaps {
        let s = &t.snaps[id];
        assert_eq!(s.blocks, want.len() as u64, "snapshot {id}'s size");
        assert!(t.homes <= s.blocks, "homes past snapshot {id}'s end");
        assert!(s.map.range(s.blocks..).next().is_none());
        for l in 0..s.blocks {
            let got = disk.read(t.entry(&s.map, l));
            assert_eq!(got, want[l as usize], "snapshot {id} block {l}");
        }
    }
    // No free block is in use by any version.
    let mut used = BTreeSet::new();
    for l in 0..t.blocks {
        used.insert(t.entry(&t.head, l).phys);
    }
    for s in t.snaps.values() {
        for l in 0..s.blocks {
            used.insert(t.entry(&s.map, l).phys);
        }
    }
    for f in t
        .free
        .iter()
        .chain(t.pending.iter())
        .chain(t.punching.iter())
    {
        assert!(!used.contains(f), "block {f} is free but in use");
    }
    // And no block is lost: every one is in use or on its way back.
    for p in 0..t.phys_blocks {
        assert!(
            used.contains(&p)
                || t.free.contains(&p)
                || t.pending.contains(&p)
                || t.punching.contains(&p),
            "block {p} is neither in use nor free"
        );
    }
    // What differs between two versions is reported changed (a backup built from `changed`
    // misses nothing), and a range asks only about itself. Past a version's end, it reads
    // zeros.
    let at = |v: &[u32], l: u64| v.get(l as usize).copied().unwrap_or(0);
    for (&from, old) in snaps {
        let mut tos: Vec<(Option<u64>, &[u32])> = vec![(None, head)];
        tos.extend(snaps.iter().map(|(id, v)| (Some(*id), &v[..])));
        for (to, new) in tos {
            let all = t.changed(from, to, 0..u64::MAX).unwrap();
            for l in 0..old.len().max(new.len()) as u64 {
                if at(old, l) != at(new, l) {
                    assert!(all.contains(&l), "block {l} differs from {from} to {to:?}");
                }
            }
            let part = t.changed(from, to, 3..7).unwrap();
            let want: Vec<u64> = all.iter().copied().filter(|l| (3..7).contains(l)).collect();
            assert_eq!(part, want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn every_version_reads_what_was_written(ops in proptest::collection::vec(op(12), 1..120)) {
        let blocks = 12;
        let mut t = Table::new(blocks, blocks);
        let mut disk = Disk { blocks: HashMap::new() };
        let mut head = vec![0u32; blocks as usize];
        let mut snaps: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        let mut next_value = 1u32;
        let mut next_id = 1u64;
        for op in ops {
            match op {
                Op::Write(l) => {
                    let l = l % t.blocks;
                    let v = next_value;
                    next_value += 1;
                    let place = match t.place(l) {
                        Place::Full => {
                            // As the pool's growth does: held blocks first, then more.
                            t.unhold_all();
                            match t.place(l) {
                                Place::Full => {
                                    t.grow(t.phys_blocks + 3);
                                    t.place(l)
                                }
                                p => p,
                            }
                        }
                        p => p,
                    };
                    match place {
                        Place::InPlace(p) => {
                            disk.blocks.insert(p, v);
                        }
                        Place::Redirect { to, from } => {
                            // A partial write would read `from` first: it must still hold
                            // the head's bytes.
                            prop_assert_eq!(disk.read(from), head[l as usize]);
                            disk.blocks.insert(to, v);
                            t.redirected(l, to, from, true);
                        }
                        Place::Full => prop_assert!(false, "full after growing"),
                    }
                    head[l as usize] = v;
                }
                Op::Zero(l) => {
                    let l = l % t.blocks;
                    t.zero(l);
                    head[l as usize] = 0;
                }
                Op::Snapshot => {
                    t.snapshot(next_id, 0).unwrap();
                    snaps.insert(next_id, head.clone());
                    next_id += 1;
                }
                Op::Delete(i) => {
                    if let Some(&id) = snaps.keys().nth(i) {
                        t.delete(id).unwrap();
                        snaps.remove(&id);
                    }
                }
                Op::Rollback(i) => {
                    if let Some(&id) = snaps.keys().nth(i) {
                        if snaps[&id].len() == head.len() {
                            t.rollback(id).unwrap();
                            head = snaps[&id].clone();
                        } else {
                            // Refused: the volume is resized first. Nothing changes.
                            let before = t.clone();
                            let refused = matches!(t.rollback(id), Err(VersionError::Size { .. }));
                            prop_assert!(refused, "a rollback across sizes");
                            prop_assert_eq!(t.head.len(), before.head.len());
                            prop_assert_eq!(t.blocks, before.blocks);
                        }
                    }
                }
                Op::Resize(n) => {
                    // As the replica does: the physical space first, at least the size.
                    if n > t.phys_blocks {
                        t.grow(n);
                    }
                    let before = t.clone();
                    let changed = t.resize(n);
                    // Only a shrink below homes adds entries, and only to snapshots.
                    for (id, s) in &t.snaps {
                        let was = &before.snaps[id].map;
                        prop_assert_eq!(changed.contains(id), s.map.len() != was.len());
                    }
                    head.resize(n as usize, 0);
                }
                Op::Settle => {
                    // Freed blocks are overwritten with junk: nothing may read them. Those of
                    // the lower half are held (their space going back) until the next settle.
                    t.unhold(0..t.phys_blocks);
                    for p in t.settle() {
                        disk.blocks.insert(p, u32::MAX);
                    }
                    let half = t.phys_blocks / 2;
                    t.hold(0..half);
                    // Held blocks are off the free list, so no write takes them meanwhile.
                    prop_assert!(t.free.range(0..half).next().is_none());
                }
            }
            check(&t, &disk, &head, &snaps);
            // A table rebuilt from its maps finds the same blocks in use.
            let r = Table::rebuilt(t.blocks, t.homes, t.phys_blocks, t.gen, t.head.clone(), t.snaps.clone());
            let mut free_now: BTreeSet<u64> = t.free.clone();
            free_now.extend(t.pending.iter().copied());
            free_now.extend(t.punching.iter().copied());
            prop_assert_eq!(&r.free, &free_now, "rebuilt free set");
        }
    }
}

#[test]
fn a_write_after_a_snapshot_goes_elsewhere_and_the_next_stays() {
    let mut t = Table::new(4, 4);
    assert_eq!(t.place(1), Place::InPlace(1));
    t.snapshot(7, 100).unwrap();
    t.grow(6);
    let Place::Redirect { to, from } = t.place(1) else {
        panic!("a shared block is written in place")
    };
    assert_eq!(from, Entry::identity(1));
    t.redirected(1, to, from, true);
    assert_eq!(t.place(1), Place::InPlace(to), "the head's own block");
    assert_eq!(t.changed(7, None, 0..4).unwrap(), vec![1]);
    assert_eq!(
        exclusive_all(t.homes, &t.head, &t.snaps),
        BTreeMap::from([(7, BLOCK)])
    );
    t.delete(7).unwrap();
    assert_eq!(
        t.settle(),
        vec![1],
        "identity block 1 is free once no snapshot holds it"
    );
    assert_eq!(t.snapshot(0, 0), Err(VersionError::ZeroId));
    assert_eq!(t.delete(7).unwrap_err(), VersionError::Missing(7));
}
