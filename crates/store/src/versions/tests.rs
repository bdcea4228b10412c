//! The versioned store over memory, file and sealed file stores: what each version reads,
//! through writes of every shape, trims, rollbacks and deletes, across a reopen and a crash.

use std::collections::BTreeMap;

use super::*;
use crate::{FileStore, MemoryStore, SealedStore};

pub(super) const SIZE: u64 = 1 << 20;

/// A store stack, and how to open it again over the same directory.
pub(super) struct Stack {
    pub(super) name: &'static str,
    pub(super) dir: Option<tempfile::TempDir>,
    store: Option<Arc<dyn Store>>,
}

impl Stack {
    pub(super) fn all() -> Vec<Stack> {
        ["memory", "file", "sealed file"]
            .into_iter()
            .map(|name| {
                let dir = (name != "memory").then(|| tempfile::tempdir().unwrap());
                let mut s = Stack {
                    name,
                    dir,
                    store: None,
                };
                s.store = Some(s.open());
                s
            })
            .collect()
    }

    pub(super) fn open(&self) -> Arc<dyn Store> {
        let dir = self.dir.as_ref().map(|d| d.path());
        let inner: Arc<dyn Store> = match self.name {
            "memory" => Arc::new(MemoryStore::default()),
            "file" => Arc::new(FileStore::open(dir.unwrap()).unwrap()),
            _ => Arc::new(SealedStore::new(
                Arc::new(FileStore::open(dir.unwrap()).unwrap()),
                dir,
            )),
        };
        Arc::new(VersionedStore::new(inner, dir))
    }

    pub(super) fn store(&self) -> &Arc<dyn Store> {
        self.store.as_ref().unwrap()
    }

    /// Drops the store (closing nothing: a process that died) and opens it again.
    pub(super) fn reopen(&mut self) -> Arc<dyn Replica> {
        self.store = None;
        let s = self.open();
        let mut all = s.open_all();
        self.store = Some(s);
        assert_eq!(all.len(), 1, "{}", self.name);
        all.pop().unwrap().unwrap()
    }
}

pub(super) fn read(r: &dyn Replica, id: Option<u64>, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xEE; len];
    match id {
        None => r.read(off, &mut b).unwrap(),
        Some(id) => r.read_snapshot(id, off, &mut b).unwrap(),
    }
    b
}

#[test]
fn a_snapshot_keeps_what_the_head_had_and_the_head_moves_on() {
    for s in Stack::all() {
        let r = s.store().create(1, SIZE).unwrap();
        r.write(0, &[1; 16384], false).unwrap();
        r.snapshot(5, 1000).unwrap();
        // A whole block, a part of one, one that spans two, a trim, and a fresh block.
        r.write(0, &[2; 4096], false).unwrap();
        r.write(4096 + 100, &[3; 200], false).unwrap();
        r.write(8192 + 4000, &[4; 200], false).unwrap();
        r.write_zeroes(12288, 4096, true, false).unwrap();
        r.write(65536, &[5; 4096], false).unwrap();
        let snap = read(&*r, Some(5), 0, 16384);
        assert_eq!(snap, vec![1; 16384], "{}", s.name);
        assert_eq!(read(&*r, Some(5), 65536, 4096), vec![0; 4096]);
        let head = read(&*r, None, 0, 16384);
        assert_eq!(&head[..4096], &[2; 4096][..]);
        assert_eq!(&head[4096..4196], &[1; 100][..]);
        assert_eq!(&head[4196..4396], &[3; 200][..]);
        assert_eq!(&head[4396..8192 + 4000], &vec![1; 8192 + 4000 - 4396][..]);
        assert_eq!(&head[12192..12288], &[4; 96][..]);
        assert_eq!(&head[12288..], &[0; 4096][..]);
        assert_eq!(read(&*r, None, 65536, 4096), vec![5; 4096]);
        assert_eq!(
            r.changed(5, None, 0, SIZE).unwrap(),
            vec![(0, 16384), (65536, 4096)],
            "{}",
            s.name
        );
        let ext = r.block_status(0, SIZE).unwrap();
        assert_eq!(ext.iter().map(|e| e.length).sum::<u64>(), SIZE);
        // Block 3 is the head's own since the write across blocks 2 and 3: zeroed in place,
        // it may read as data; past the new block at 64 KiB it is all hole.
        assert_eq!(ext[0].flags, 0, "{}: {ext:?}", s.name);
        assert!(ext[0].length >= 12288);
        let last = ext.last().unwrap();
        assert_eq!(
            (last.length, last.flags),
            (SIZE - 69632, Extent::HOLE | Extent::ZERO)
        );
        // The snapshot's own allocation: what was written before it, then holes (block 16
        // was written after it).
        let snap_ext = r.snapshot_status(5, 0, SIZE).unwrap();
        assert_eq!(snap_ext.iter().map(|e| e.length).sum::<u64>(), SIZE);
        assert_eq!(snap_ext[0].flags, 0, "{}: {snap_ext:?}", s.name);
        assert!(snap_ext[0].length >= 16384);
        assert_eq!(snap_ext.last().unwrap().flags, Extent::HOLE | Extent::ZERO);
        assert!(matches!(
            r.snapshot_status(6, 0, 4096),
            Err(StoreError::NoSnapshot { id: 6, .. })
        ));
        let list = r.snapshots().unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].id, list[0].created), (5, 1000));
        // Blocks 0..4 and block 16, which the head moved off (never written there before:
        // exclusive counts blocks, written or not).
        assert_eq!(list[0].exclusive_bytes, 20480, "{}", s.name);
        // Errors change nothing.
        assert!(matches!(
            r.snapshot(5, 0),
            Err(StoreError::SnapshotExists { id: 5, .. })
        ));
        assert!(matches!(
            r.delete_snapshot(6),
            Err(StoreError::NoSnapshot { id: 6, .. })
        ));
        assert!(matches!(
            r.rollback(6),
            Err(StoreError::NoSnapshot { id: 6, .. })
        ));
        assert_eq!(read(&*r, Some(5), 0, 16384), vec![1; 16384]);
    }
}

#[test]
fn rollback_and_delete_give_blocks_back_and_fold_the_replica_back() {
    for s in Stack::all() {
        let r = s.store().create(1, SIZE).unwrap();
        r.write(0, &[1; 8192], false).unwrap();
        r.snapshot(1, 0).unwrap();
        r.write(0, &[2; 8192], false).unwrap();
        r.snapshot(2, 0).unwrap();
        r.write(0, &[3; 4096], false).unwrap();
        r.rollback(1).unwrap();
        assert_eq!(read(&*r, None, 0, 8192), vec![1; 8192], "{}", s.name);
        assert_eq!(read(&*r, Some(2), 0, 8192), vec![2; 8192]);
        r.write(4096, &[4; 4096], false).unwrap();
        r.delete_snapshot(1).unwrap();
        assert_eq!(read(&*r, Some(2), 0, 8192), vec![2; 8192]);
        let head = read(&*r, None, 0, 8192);
        assert_eq!(
            (&head[..4096], &head[4096..]),
            (&[1; 4096][..], &[4; 4096][..])
        );
        r.delete_snapshot(2).unwrap();
        assert!(r.snapshots().unwrap().is_empty());
        assert_eq!(read(&*r, None, 0, 4096), vec![1; 4096]);
        // A snapshot with no write after it, deleted: the replica is plain again.
        let r2 = s.store().create(2, SIZE).unwrap();
        r2.write(0, &[9; 4096], false).unwrap();
        r2.snapshot(1, 0).unwrap();
        r2.delete_snapshot(1).unwrap();
        r2.resize(2 * SIZE).unwrap();
        assert_eq!(r2.size(), 2 * SIZE);
        assert_eq!(read(&*r2, None, 0, 4096), vec![9; 4096], "{}", s.name);
    }
}

#[test]
fn versions_survive_a_reopen_and_a_crash_keeps_every_flushed_write() {
    for mut s in Stack::all().into_iter().filter(|s| s.dir.is_some()) {
        let r = s.store().create(7, SIZE).unwrap();
        r.write(0, &[1; 8192], false).unwrap();
        r.snapshot(10, 0).unwrap();
        r.write(0, &[2; 4096], false).unwrap();
        r.snapshot(11, 0).unwrap();
        r.write(4096, &[3; 4096], false).unwrap();
        r.flush().unwrap();
        // Not flushed: may be lost, must not tear anything else.
        r.write(0, &[4; 4096], false).unwrap();
        let before = r.incarnation();
        drop(r);
        let r = s.reopen();
        // The redirect log gave back what the main file missed: the history is whole, and
        // the write the process answered before it died is there (O_DIRECT kept its bytes).
        assert_eq!(r.incarnation(), before, "{}", s.name);
        assert_eq!(r.size(), SIZE, "{}", s.name);
        assert_eq!(read(&*r, Some(10), 0, 8192), vec![1; 8192], "{}", s.name);
        let s11 = read(&*r, Some(11), 0, 8192);
        assert_eq!(
            (&s11[..4096], &s11[4096..]),
            (&[2; 4096][..], &[1; 4096][..])
        );
        let head = read(&*r, None, 0, 8192);
        assert!(
            head[..4096] == [2; 4096] || head[..4096] == [4; 4096],
            "{}",
            s.name
        );
        assert_eq!(&head[4096..], &[3; 4096][..]);
        // Deleting the first snapshot rewrites the second's file against nothing.
        r.delete_snapshot(10).unwrap();
        r.close().unwrap();
        let before = r.incarnation();
        drop(r);
        let r = s.reopen();
        assert_eq!(
            r.incarnation(),
            before,
            "{}: a clean close keeps it",
            s.name
        );
        assert_eq!(r.snapshots().unwrap().len(), 1);
        let s11 = read(&*r, Some(11), 0, 8192);
        assert_eq!(
            (&s11[..4096], &s11[4096..]),
            (&[2; 4096][..], &[1; 4096][..])
        );
        // A damaged file refuses the replica, loudly.
        drop(r);
        let main = s
            .dir
            .as_ref()
            .unwrap()
            .path()
            .join("replica-0000000000000007.versions");
        let mut b = std::fs::read(&main).unwrap();
        b[20] ^= 1;
        std::fs::write(&main, b).unwrap();
        s.store = None;
        let st = s.open();
        let all = st.open_all();
        assert!(
            matches!(&all[0], Err(StoreError::Corrupt { .. })),
            "{}",
            s.name
        );
    }
}

#[test]
fn the_pool_grows_and_freed_blocks_are_reused() {
    for s in Stack::all() {
        let r = s.store().create(3, SIZE).unwrap();
        let blocks = SIZE / BLOCK;
        for round in 0..3u8 {
            r.snapshot(1, 0).unwrap();
            for l in 0..blocks {
                r.write(l * BLOCK, &[round + 1; 4096], false).unwrap();
            }
            r.flush().unwrap();
            assert_eq!(read(&*r, Some(1), SIZE - 4096, 4096), vec![round; 4096]);
            r.delete_snapshot(1).unwrap();
        }
        // Each round moved every block once; the freed ones were taken again, so the pool
        // stayed one growth step.
        let phys = r.allocated_bytes();
        assert!(phys <= SIZE + GROW_MIN, "{}: {phys} bytes", s.name);
        assert_eq!(read(&*r, None, 0, SIZE as usize), vec![3; SIZE as usize]);
    }
}

#[test]
fn writes_to_two_parts_of_one_shared_block_keep_both() {
    for s in Stack::all() {
        let r = s.store().create(4, SIZE).unwrap();
        r.snapshot(1, 0).unwrap();
        std::thread::scope(|sc| {
            for i in 0..8u64 {
                let r = &r;
                sc.spawn(move || r.write(i * 512, &[i as u8 + 1; 512], false).unwrap());
            }
        });
        let head = read(&*r, None, 0, 4096);
        for i in 0..8 {
            assert_eq!(head[i * 512], i as u8 + 1, "{}: sector {i}", s.name);
        }
    }
}

/// Random writes, trims, snapshots, rollbacks and deletes against a model of every version,
/// with reopens of the file stacks.
#[test]
fn random_operations_match_a_model_of_every_version() {
    random_operations(0x9e3779b97f4a7c15);
}

/// The same over many seeds (`TRIREME_VERSIONS_SEEDS`, default 200): `cargo test -p
/// trireme-store --release -- --ignored random_operations_over_many_seeds`.
#[test]
#[ignore]
fn random_operations_over_many_seeds() {
    let n = std::env::var("TRIREME_VERSIONS_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200u64);
    for seed in 1..=n {
        random_operations(seed.wrapping_mul(0x9e3779b97f4a7c15));
    }
}

fn random_operations(seed: u64) {
    for mut s in Stack::all() {
        let mut rng = seed | 1;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut size = 24 * 4096;
        let mut r = s.store().create(9, size).unwrap();
        let mut head = vec![0u8; size as usize];
        let mut snaps: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut id = 1;
        // Resizes of a replica holding snapshots, each way.
        let (mut grown, mut shrunk) = (0, 0);
        for step in 0..300 {
            match next(23) {
                0..=10 => {
                    let off = next(size - 1);
                    let len = (next(3 * 4096) + 1).min(size - off);
                    let v = (step % 250) as u8 + 1;
                    r.write(off, &vec![v; len as usize], false).unwrap();
                    head[off as usize..(off + len) as usize].fill(v);
                }
                11 | 12 => {
                    let off = next(size - 1);
                    let len = (next(5 * 4096) + 1).min(size - off);
                    r.write_zeroes(off, len, next(2) == 0, false).unwrap();
                    head[off as usize..(off + len) as usize].fill(0);
                }
                13 | 14 => {
                    r.snapshot(id, 0).unwrap();
                    snaps.insert(id, head.clone());
                    id += 1;
                }
                15 => {
                    if let Some(&k) = snaps.keys().nth(next(4) as usize) {
                        r.delete_snapshot(k).unwrap();
                        snaps.remove(&k);
                    }
                }
                16 => {
                    if let Some(&k) = snaps.keys().nth(next(4) as usize) {
                        if snaps[&k].len() == head.len() {
                            r.rollback(k).unwrap();
                            head = snaps[&k].clone();
                        } else {
                            // Across sizes: refused, the volume is resized first.
                            assert!(r.rollback(k).is_err(), "{} step {step}", s.name);
                        }
                    }
                }
                20..=22 => {
                    // Every resize goes through, snapshots or not.
                    let new = (next(40) + 1) * 4096;
                    r.resize(new).unwrap();
                    match new < size {
                        true => shrunk += usize::from(!snaps.is_empty()),
                        false => grown += usize::from(!snaps.is_empty()),
                    }
                    size = new;
                    head.resize(new as usize, 0);
                    assert_eq!(r.size(), size, "{} step {step}", s.name);
                }
                17 | 18 => r.flush().unwrap(),
                // The process dies (no flush, no close): every answered write is kept, as the
                // file store keeps O_DIRECT writes, through the redirect log.
                _ if s.dir.is_some() => {
                    drop(r);
                    r = s.reopen();
                }
                _ => {}
            }
            assert_eq!(
                read(&*r, None, 0, size as usize),
                head,
                "{} step {step}",
                s.name
            );
            for (k, v) in &snaps {
                assert_eq!(&read(&*r, Some(*k), 0, v.len()), v, "{} snap {k}", s.name);
            }
        }
        assert!(grown > 0 && shrunk > 0, "{}: {grown} {shrunk}", s.name);
    }
}

/// Freed blocks whose space a crash left taken (here: bytes written straight into them while
/// the replica was closed) go back to the file system when the replica is opened again.
#[test]
fn space_a_crash_left_taken_goes_back_at_the_next_open() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        Arc::new(VersionedStore::new(
            Arc::new(FileStore::open(dir.path()).unwrap()),
            Some(dir.path()),
        ))
    };
    let len = SIZE as usize;
    let s = open();
    let r = s.create(1, SIZE).unwrap();
    r.write(0, &vec![1; len], false).unwrap();
    r.snapshot(1, 0).unwrap();
    // Every block moves to the pool; deleting the snapshot frees the blocks in place.
    r.write(0, &vec![2; len], false).unwrap();
    r.flush().unwrap();
    r.delete_snapshot(1).unwrap();
    r.close().unwrap();
    drop((r, s));
    let data = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .unwrap();
    let taken = || std::fs::metadata(&data).unwrap().blocks() * 512;
    let before = taken();
    // What a crash between the delete and its giving back leaves: the freed blocks' space.
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.write_all_at(&vec![7; len], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert!(taken() >= before + SIZE, "{} {before}", taken());
    let s = open();
    let r = s.open_all().pop().unwrap().unwrap();
    assert!(taken() <= before, "{} {before}", taken());
    assert_eq!(read(&*r, None, 0, len), vec![2; len]);
}

/// The pool's space is reserved a window ahead of the redirects (so each first write after a
/// snapshot does not allocate on its own), and only a window: it stays small beside a pool
/// step, and what the volume and its snapshot read is unchanged.
#[test]
fn redirects_reserve_the_pool_a_window_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let s: Arc<dyn Store> = Arc::new(VersionedStore::new(
        Arc::new(FileStore::open(dir.path()).unwrap()),
        Some(dir.path()),
    ));
    let r = s.create(1, SIZE).unwrap();
    let blocks = SIZE / BLOCK;
    r.write(0, &vec![1; SIZE as usize], false).unwrap();
    r.flush().unwrap();
    let taken = || crate::file::tests::replica_disk(dir.path(), 1).0;
    let before = taken();
    r.snapshot(1, 0).unwrap();
    r.write(0, &[2; 4096], false).unwrap();
    let first = taken();
    assert!(
        first >= before + RESERVE_AHEAD,
        "the first redirect reserved {} bytes",
        first - before
    );
    assert!(
        first <= before + 2 * RESERVE_AHEAD,
        "the first redirect reserved {} bytes, more than a window",
        first - before
    );
    // Every other block moves now, into the window: nothing more is allocated.
    assert!(blocks * BLOCK <= RESERVE_AHEAD);
    for l in 1..blocks {
        r.write(l * BLOCK, &[2; 4096], false).unwrap();
    }
    assert_eq!(taken(), first, "the redirects allocated past the window");
    assert_eq!(read(&*r, None, 0, SIZE as usize), vec![2; SIZE as usize]);
    assert_eq!(read(&*r, Some(1), 0, SIZE as usize), vec![1; SIZE as usize]);
    r.flush().unwrap();
    assert_eq!(read(&*r, None, 0, SIZE as usize), vec![2; SIZE as usize]);
}

/// The pool grows a step ahead of its redirects: the write whose redirect leaves less than a
/// quarter of a step free grows it, so the redirects after it find blocks free. Meanwhile
/// writer threads redirecting blocks between snapshots (the growths running beside their
/// I/O) keep every version's bytes, and a process that dies keeps them too.
#[test]
fn the_pool_grows_ahead_of_its_redirects_while_writers_go_on() {
    const STEP: u64 = 16;
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        let file = Arc::new(FileStore::open(dir.path()).unwrap());
        let sealed = Arc::new(SealedStore::new(file, Some(dir.path())));
        Arc::new(VersionedStore::new(sealed, Some(dir.path())).with_grow_min(STEP * BLOCK))
    };
    let s = open();
    let r = s.create(1, SIZE).unwrap();
    let blocks = SIZE / BLOCK;
    assert_eq!(blocks / 16, STEP, "a step is the minimum here");
    r.write(0, &vec![0; SIZE as usize], false).unwrap();
    r.flush().unwrap();
    let phys = || crate::file::tests::replica_disk(dir.path(), 1).1;
    r.snapshot(1, 0).unwrap();
    // The first redirect finds the pool empty and grows it; the one that leaves fewer than a
    // quarter of the step free grows it ahead.
    let low = STEP - STEP / 4 + 1;
    for l in 0..low - 1 {
        r.write(l * BLOCK, &[1; 4096], false).unwrap();
        assert_eq!(phys(), SIZE + STEP * BLOCK, "after {} redirects", l + 1);
    }
    r.write((low - 1) * BLOCK, &[1; 4096], false).unwrap();
    assert_eq!(phys(), SIZE + 2 * STEP * BLOCK, "not grown ahead");
    r.delete_snapshot(1).unwrap();
    r.flush().unwrap();

    // Four writers rewrite their blocks (every fourth) in each of twelve rounds; a snapshot
    // between rounds holds the round before.
    let fill = |round: u64, l: u64| {
        let mut b = vec![0u8; BLOCK as usize];
        for (i, w) in b.chunks_mut(8).enumerate() {
            w.copy_from_slice(&(round << 48 | l << 16 | i as u64).to_le_bytes());
        }
        b
    };
    const ROUNDS: u64 = 12;
    let barrier = std::sync::Barrier::new(5);
    std::thread::scope(|sc| {
        for k in 0..4 {
            let (r, barrier) = (&r, &barrier);
            sc.spawn(move || {
                for round in 1..=ROUNDS {
                    for l in (k..blocks).step_by(4) {
                        r.write(l * BLOCK, &fill(round, l), false).unwrap();
                    }
                    barrier.wait();
                    barrier.wait();
                }
            });
        }
        for round in 1..=ROUNDS {
            barrier.wait();
            r.snapshot(10 + round, 0).unwrap();
            barrier.wait();
        }
    });
    let check = |r: &dyn Replica, when: &str| {
        for round in 1..=ROUNDS {
            for l in 0..blocks {
                let got = read(r, Some(10 + round), l * BLOCK, BLOCK as usize);
                assert!(got == fill(round, l), "{when}: round {round}, block {l}");
            }
        }
        for l in 0..blocks {
            assert!(read(r, None, l * BLOCK, BLOCK as usize) == fill(ROUNDS, l));
        }
    };
    check(&*r, "served");
    assert!(
        phys() > SIZE + (ROUNDS - 1) * SIZE,
        "the pool holds every round"
    );
    drop((r, s));
    let s = open();
    let r = s.open_all().pop().unwrap().unwrap();
    check(&*r, "reopened");
}

/// After a crash the node names the logical ranges written since the last clean state (its
/// activity log); the seals below are physical. A block moved to the pool by a redirect and
/// rewritten there after a flush had its old seal kept, and failed it (issue 63: a drained
/// copy killed after its drain, then scrubbed). The versions translate the ranges through the
/// head's map, so the pool block's seal is dropped with its logical block's.
#[test]
fn seals_of_pool_blocks_written_since_the_last_flush_are_dropped_after_a_crash() {
    let mut s = Stack::all().pop().unwrap();
    assert_eq!(s.name, "sealed file");
    let r = s.store().create(9, SIZE).unwrap();
    r.write(0, &[1; 8192], false).unwrap();
    r.snapshot(10, 0).unwrap();
    // Block 1 moves to the pool; its seal there persists at the flush.
    r.write(4096, &[2; 4096], false).unwrap();
    r.flush().unwrap();
    // Rewritten in place in the pool, then the process dies before any flush.
    r.write(4096, &[3; 4096], false).unwrap();
    drop(r);
    let r = s.reopen();
    r.recover_seals(&[(0, 64 << 10)]);
    assert_eq!(read(&*r, None, 4096, 4096), vec![3; 4096]);
    assert_eq!(read(&*r, Some(10), 0, 8192), vec![1; 8192]);
    // Sealed again once written.
    r.write(4096, &[4; 4096], false).unwrap();
    assert_eq!(read(&*r, None, 4096, 4096), vec![4; 4096]);
}
