//! Conformance tests every backend runs, and the seal checker's; the file store's own are in `file/tests.rs`.

use super::*;
use proptest::prelude::*;

pub(crate) const SIZE: u64 = 4 << 20;

fn stores() -> Vec<(Arc<dyn Store>, Option<tempfile::TempDir>)> {
    let d4 = tempfile::tempdir().unwrap();
    let versioned_file = VersionedStore::new(
        Arc::new(SealedStore::new(
            Arc::new(FileStore::open(d4.path()).unwrap()),
            Some(d4.path()),
        )),
        Some(d4.path()),
    );
    let d = tempfile::tempdir().unwrap();
    let d2 = tempfile::tempdir().unwrap();
    let d3 = tempfile::tempdir().unwrap();
    let tiers = TierConfig {
        fast_capacity: SIZE,
        disk: None,
        migrate_rate: 64 << 20,
        extent: GRAIN,
    };
    let tiered = TieredStore::open(d3.path(), tiers).unwrap();
    // Versions over tiers as a node stacks them, every write redirected: the pool grows the
    // tiered replica.
    let d5 = tempfile::tempdir().unwrap();
    let versioned_tiered = Snapshotted(Arc::new(VersionedStore::new(
        Arc::new(SealedStore::new(
            Arc::new(TieredStore::open(d5.path(), tiers).unwrap()),
            Some(d5.path()),
        )),
        Some(d5.path()),
    )));
    let sealed_file = SealedStore::new(
        Arc::new(FileStore::open(d2.path()).unwrap()),
        Some(d2.path()),
    );
    vec![
        (Arc::new(MemoryStore::default()), None),
        (Arc::new(FileStore::open(d.path()).unwrap()), Some(d)),
        (
            Arc::new(SealedStore::new(Arc::new(MemoryStore::default()), None)),
            None,
        ),
        (Arc::new(sealed_file), Some(d2)),
        (Arc::new(tiered), Some(d3)),
        (
            Arc::new(VersionedStore::new(Arc::new(MemoryStore::default()), None)),
            None,
        ),
        (Arc::new(versioned_file), Some(d4)),
        (
            Arc::new(Snapshotted(Arc::new(VersionedStore::new(
                Arc::new(MemoryStore::default()),
                None,
            )))),
            None,
        ),
        (Arc::new(versioned_tiered), Some(d5)),
    ]
}

/// A versioned store whose replicas have a snapshot from birth: every write to them is
/// redirected, so the suite runs over the redirect path too.
#[derive(Debug)]
struct Snapshotted(Arc<dyn Store>);

impl filter::StoreFilter for Snapshotted {
    fn next(&self) -> &dyn Store {
        &*self.0
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        let r = self.0.create(volume, size)?;
        r.snapshot(1, 1)?;
        Ok(r)
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.0.open_all()
    }
}

/// A replica of the snapshotted stack: its allocation is reported per 4 KiB block (not per
/// grain).
fn has_snapshots(r: &dyn Replica) -> bool {
    !r.snapshots().unwrap().is_empty()
}

pub(crate) fn read(r: &dyn Replica, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xEE; len];
    r.read(off, &mut b).unwrap();
    b
}

#[test]
fn fresh_replica_is_zero_and_all_hole() {
    for (s, _d) in stores() {
        let r = s.create(1, SIZE).unwrap();
        assert_eq!(read(&*r, 12345, 7000), vec![0; 7000], "{:?}", s.kind());
        assert_eq!(
            r.block_status(0, SIZE).unwrap(),
            vec![Extent {
                length: SIZE,
                flags: Extent::HOLE | Extent::ZERO
            }]
        );
        assert_eq!(r.allocated_bytes(), 0);
    }
}

#[test]
fn unaligned_writes_read_back_and_allocate_grains() {
    for (s, _d) in stores() {
        let r = s.create(1, SIZE).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        r.write(GRAIN - 100, &data, false).unwrap();
        assert_eq!(read(&*r, GRAIN - 100, data.len()), data);
        assert_eq!(
            read(&*r, GRAIN - 200, 100),
            vec![0; 100],
            "bytes before stay zero"
        );
        if has_snapshots(&*r) {
            continue;
        }
        let ext = r.block_status(0, 4 * GRAIN).unwrap();
        assert_eq!(
            ext,
            vec![
                Extent {
                    length: 2 * GRAIN,
                    flags: 0
                },
                Extent {
                    length: 2 * GRAIN,
                    flags: Extent::HOLE | Extent::ZERO
                },
            ]
        );
    }
}

#[test]
fn trim_makes_holes_and_zeros_partials() {
    for (s, _d) in stores() {
        let r = s.create(1, SIZE).unwrap();
        r.write(0, &vec![0xAB; (4 * GRAIN) as usize], false)
            .unwrap();
        r.write_zeroes(100, 3 * GRAIN, true, false).unwrap();
        let b = read(&*r, 0, (4 * GRAIN) as usize);
        assert!(b[..100].iter().all(|&x| x == 0xAB));
        assert!(b[100..(3 * GRAIN + 100) as usize].iter().all(|&x| x == 0));
        assert!(b[(3 * GRAIN + 100) as usize..].iter().all(|&x| x == 0xAB));
        let ext = r.block_status(0, 4 * GRAIN).unwrap();
        if has_snapshots(&*r) {
            // Per block: every block the trim covered whole.
            assert_eq!(ext[1].flags, Extent::HOLE | Extent::ZERO, "{ext:?}");
            assert_eq!(ext[1].length, 3 * GRAIN - 4096);
        } else {
            assert_eq!(
                ext[1],
                Extent {
                    length: 2 * GRAIN,
                    flags: Extent::HOLE | Extent::ZERO
                }
            );
        }
        // Rewriting part of a trimmed grain must not resurrect the old bytes around it.
        r.write(GRAIN + 10, b"x", false).unwrap();
        let b = read(&*r, GRAIN, GRAIN as usize);
        assert_eq!(b[10], b'x');
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 1);
        // Without may_trim the range is zeroed but stays allocated.
        r.write_zeroes(0, 50, false, true).unwrap();
        assert_eq!(read(&*r, 0, 50), vec![0; 50]);
    }
}

#[test]
fn out_of_range_is_refused_without_overflow() {
    for (s, _d) in stores() {
        let r = s.create(1, SIZE).unwrap();
        assert!(matches!(
            r.write(SIZE - 1, b"ab", false),
            Err(StoreError::OutOfRange { .. })
        ));
        let mut b = [0u8; 4];
        assert!(matches!(
            r.read(u64::MAX - 1, &mut b),
            Err(StoreError::OutOfRange { .. })
        ));
        assert!(r.write_zeroes(u64::MAX, 2, true, false).is_err());
        assert!(r.block_status(SIZE, 1).is_err());
        assert!(matches!(s.create(1, SIZE), Err(StoreError::Exists { .. })));
        assert!(matches!(s.delete(9), Err(StoreError::NoReplica { .. })));
    }
}

#[test]
fn concurrent_sector_writes_in_one_block_do_not_lose_each_other() {
    for (s, _d) in stores() {
        let r = s.create(1, SIZE).unwrap();
        std::thread::scope(|sc| {
            for t in 0..8u8 {
                let r = r.clone();
                sc.spawn(move || {
                    for round in 0..50u64 {
                        let off = round * 4096 + u64::from(t) * 512;
                        r.write(off, &[t + 1; 512], false).unwrap();
                    }
                });
            }
        });
        for round in 0..50u64 {
            let b = read(&*r, round * 4096, 4096);
            for t in 0..8usize {
                assert!(
                    b[t * 512..(t + 1) * 512].iter().all(|&x| x == t as u8 + 1),
                    "{:?}",
                    s.kind()
                );
            }
        }
    }
}

/// Every store resizes a replica: the new bytes read as zeros and take writes, bytes past a
/// smaller end are gone (zeros when it grows again), the rest stays.
#[test]
fn replicas_grow_and_shrink_keeping_their_bytes() {
    for (s, _d) in stores() {
        let r = s.create(1, SIZE).unwrap();
        r.write(SIZE - 4096, &[3u8; 4096], true).unwrap();
        r.resize(2 * SIZE).unwrap();
        assert_eq!(r.size(), 2 * SIZE, "{:?}", s.kind());
        assert_eq!(read(&*r, SIZE - 4096, 4096), vec![3u8; 4096]);
        assert_eq!(read(&*r, SIZE, 8192), vec![0u8; 8192], "{:?}", s.kind());
        r.write(2 * SIZE - 4096, &[9u8; 4096], true).unwrap();
        assert_eq!(read(&*r, 2 * SIZE - 4096, 4096), vec![9u8; 4096]);
        assert!(r.write(2 * SIZE, &[1u8; 512], false).is_err());
        r.flush().unwrap();
        r.resize(SIZE - 8192).unwrap();
        assert!(r.read(SIZE - 4096, &mut [0u8; 512]).is_err());
        r.resize(SIZE).unwrap();
        assert_eq!(
            read(&*r, SIZE - 4096, 4096),
            vec![0u8; 4096],
            "{:?}",
            s.kind()
        );
        assert!(r.resize(5).is_err(), "{:?}", s.kind());
    }
}

#[test]
fn null_store_discards_and_reads_zero() {
    let s = NullStore::default();
    let r = s.create(1, SIZE).unwrap();
    r.write(0, b"gone", true).unwrap();
    assert_eq!(read(&*r, 0, 4), vec![0; 4]);
    assert!(r.write(SIZE, b"x", false).is_err());
}

proptest! {
    #[test]
    fn meta_decoder_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = file::meta::decode(&b);
    }

    #[test]
    fn meta_round_trips(volume: u64, grains in 1u64..2000, epoch: u64, flags in 0u32..=1, incarnation: u64) {
        let size = grains * GRAIN;
        let map = AllocMap::new(size, GRAIN);
        map.set_range(0, GRAIN * (grains / 2 + 1));
        let m = file::meta::ReplicaMeta { volume, size, grain: GRAIN, epoch, flags, incarnation, map: map.to_bytes() };
        prop_assert_eq!(file::meta::decode(&file::meta::encode(&m)).unwrap(), m);
    }

    /// The memory store matches a plain byte array under any sequence of writes and trims.
    #[test]
    fn memory_store_matches_model(ops in proptest::collection::vec((0u64..SIZE, 1u64..200_000, any::<u8>(), any::<bool>()), 1..20)) {
        let s = MemoryStore::default();
        let r = s.create(1, SIZE).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        for (off, len, byte, trim) in ops {
            let len = len.min(SIZE - off);
            if trim {
                r.write_zeroes(off, len, true, false).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            } else {
                r.write(off, &vec![byte; len as usize], false).unwrap();
                model[off as usize..(off + len) as usize].fill(byte);
            }
        }
        prop_assert!(read(&*r, 0, SIZE as usize) == model);
    }
}

pub(crate) fn sealed_file_store(d: &std::path::Path) -> SealedStore {
    SealedStore::new(Arc::new(FileStore::open(d).unwrap()), Some(d))
}

/// Changes bytes of a file replica's data file behind the store's back.
/// Changes bytes of file replica `volume` at `at`, behind the store's back: in its data file,
/// or past that file's end in its pool file.
fn scribble(d: &std::path::Path, volume: u64, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let [data, pool] = crate::file::tests::replica_paths(d, volume);
    let split = std::fs::metadata(&data).unwrap().len();
    let (path, at) = match at < split {
        true => (data, at),
        false => (pool, at - split),
    };
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn sealed_blocks_catch_bytes_changed_behind_the_store() {
    let d = tempfile::tempdir().unwrap();
    let s = sealed_file_store(d.path());
    let r = s.create(3, SIZE).unwrap();
    r.write(8192, &[7u8; 8192], false).unwrap();
    r.write(100, b"partial", false).unwrap();
    r.flush().unwrap();
    scribble(d.path(), 3, 8192 + 4096 + 17, b"rot");
    let mut b = vec![0u8; 4096];
    r.read(8192, &mut b).unwrap();
    assert_eq!(b, vec![7u8; 4096], "the good block still reads");
    match r.read(8192 + 4096, &mut b) {
        Err(StoreError::BadBlock { volume: 3, offset }) => assert_eq!(offset, 12288),
        other => panic!("expected a bad block, got {other:?}"),
    }
    // A read of part of the bad block fails too; rewriting it heals it.
    assert!(r.read(12288 + 10, &mut b[..10]).is_err());
    r.write(12288, &[9u8; 4096], false).unwrap();
    assert_eq!(read(&*r, 12288, 4096), vec![9u8; 4096]);
    // A partial write keeps the block's seal right.
    assert_eq!(read(&*r, 100, 7), b"partial");
    scribble(d.path(), 3, 0, b"x");
    assert!(
        r.read(100, &mut b[..7]).is_err(),
        "partial block sealed too"
    );
}

#[test]
fn seals_survive_a_clean_restart_and_are_dropped_after_a_crash() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = sealed_file_store(d.path());
        let r = s.create(4, SIZE).unwrap();
        r.write(0, &[1u8; 4096], false).unwrap();
        r.close().unwrap();
    }
    scribble(d.path(), 4, 5, b"!");
    {
        let s = sealed_file_store(d.path());
        let r = s.open_all().into_iter().next().unwrap().unwrap();
        assert!(
            matches!(
                r.read(0, &mut [0u8; 4096]),
                Err(StoreError::BadBlock { .. })
            ),
            "seals kept across a clean restart catch the change"
        );
        r.write(0, &[2u8; 4096], false).unwrap();
        r.flush().unwrap();
        // Dropped without close: a crash. The seals on disk may not match the data.
    }
    scribble(d.path(), 4, 5, b"?");
    let s = sealed_file_store(d.path());
    let r = s.open_all().into_iter().next().unwrap().unwrap();
    let mut b = [0u8; 4096];
    r.read(0, &mut b).unwrap();
    assert_eq!(
        b[5], b'?',
        "after a crash the block is unsealed, not refused"
    );
    r.write(0, &[3u8; 4096], false).unwrap();
    scribble(d.path(), 4, 5, b"?");
    assert!(r.read(0, &mut b).is_err(), "sealed again once written");
    s.delete(4).unwrap();
    assert!(!d.path().join(format!("replica-{:016x}.seals", 4)).exists());
}

/// A grow writes the seals from the old end on and leaves the pages below it as they were
/// persisted: after a clean restart, bytes changed behind the store below the old end and in
/// the grown blocks are both caught, and the blocks around them read.
#[test]
fn a_grown_replica_keeps_its_seals_on_both_sides_of_the_old_end() {
    let d = tempfile::tempdir().unwrap();
    let blocks = SIZE / 4096;
    {
        let s = sealed_file_store(d.path());
        let r = s.create(6, SIZE).unwrap();
        for l in 0..blocks {
            r.write(l * 4096, &[(l % 200) as u8 + 1; 4096], false)
                .unwrap();
        }
        r.flush().unwrap();
        r.resize(SIZE + 16 * 4096).unwrap();
        r.write(SIZE, &[7u8; 4096], false).unwrap();
        r.close().unwrap();
    }
    scribble(d.path(), 6, 3 * 4096 + 9, b"rot");
    scribble(d.path(), 6, SIZE + 9, b"rot");
    let s = sealed_file_store(d.path());
    let r = s.open_all().pop().unwrap().unwrap();
    for at in [3 * 4096, SIZE] {
        assert!(
            matches!(
                r.read(at, &mut [0u8; 4096]),
                Err(StoreError::BadBlock { .. })
            ),
            "the change at {at} is caught"
        );
    }
    assert_eq!(read(&*r, 4 * 4096, 4096), vec![5u8; 4096]);
    assert_eq!(
        read(&*r, SIZE - 4096, 4096),
        vec![((blocks - 1) % 200) as u8 + 1; 4096]
    );
    assert_eq!(read(&*r, SIZE + 4096, 4096), vec![0u8; 4096]);
}

/// A new replica's seals are all "none": its seal file is a hole, not pages of zeros written
/// and synced (8 MiB on every node for each clone of a 4 GiB image), and a replica reopened
/// after a crash starts from a hole too.
#[test]
fn a_new_replicas_seal_file_is_a_hole() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join(format!("replica-{:016x}.seals", 6u64));
    let on_disk = || std::fs::metadata(&path).unwrap().blocks() * 512;
    {
        let s = sealed_file_store(d.path());
        let r = s.create(6, 256 << 20).unwrap();
        assert!(
            on_disk() <= 16 << 10,
            "a new seal file took {} bytes",
            on_disk()
        );
        assert!(
            std::fs::metadata(&path).unwrap().len() > (256 << 20) / 4096 * 8,
            "it still has its full length: a header and 8 bytes a block"
        );
        r.write(0, &[1u8; 4096], false).unwrap();
        r.flush().unwrap();
        // Dropped without close: a crash.
    }
    let s = sealed_file_store(d.path());
    let r = s.open_all().into_iter().next().unwrap().unwrap();
    assert!(
        on_disk() <= 16 << 10,
        "a reopened seal file took {} bytes",
        on_disk()
    );
    assert_eq!(read(&*r, 0, 4096), vec![1u8; 4096]);
    r.write(4096, &[2u8; 4096], false).unwrap();
    scribble(d.path(), 6, 4096 + 5, b"?");
    assert!(
        r.read(4096, &mut [0u8; 4096]).is_err(),
        "a block written after the reopen is sealed"
    );
}

#[test]
fn seals_name_the_lba_and_generation() {
    let block = [5u8; 4096];
    assert_ne!(sealed::seal(1, 1, &block), sealed::seal(2, 1, &block));
    assert_ne!(sealed::seal(1, 1, &block), sealed::seal(1, 2, &block));
    assert_eq!(sealed::seal(1, 7, &block) >> 32, 7);
}

#[test]
fn reads_racing_writes_of_the_same_block_never_see_a_false_mismatch() {
    let s = SealedStore::new(Arc::new(MemoryStore::default()), None);
    let r = s.create(5, SIZE).unwrap();
    std::thread::scope(|sc| {
        let w = r.clone();
        sc.spawn(move || {
            for i in 0..2000u32 {
                w.write(0, &[(i % 251) as u8; 8192], false).unwrap();
            }
        });
        for _ in 0..2 {
            let rd = r.clone();
            sc.spawn(move || {
                let mut b = vec![0u8; 8192];
                for _ in 0..2000 {
                    rd.read(0, &mut b).unwrap();
                }
            });
        }
    });
}

proptest! {
    #[test]
    fn seal_header_decoder_never_panics(b in proptest::collection::vec(any::<u8>(), 0..100), v: u64, n: u64) {
        let _ = sealed::check_header(&b, v, n);
    }
}

#[test]
fn writes_across_the_stripe_wrap_do_not_deadlock() {
    // Block 255 and block 256 take the last and the first stripe: ranges over the wrap and
    // ranges inside it, from many threads, must all finish.
    let s = SealedStore::new(Arc::new(MemoryStore::default()), None);
    let r = s.create(6, SIZE).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let r = r.clone();
            sc.spawn(move || {
                for i in 0..500u64 {
                    let first = [254, 255, 0, 511][((t + i) % 4) as usize];
                    r.write(first * 4096, &[t as u8; 3 * 4096], false).unwrap();
                }
            });
        }
    });
    let _ = read(&*r, 255 * 4096, 2 * 4096);
}
