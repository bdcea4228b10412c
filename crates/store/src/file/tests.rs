//! The file store's own tests: reopening, resizes across its data and pool files, thin and
//! thick space, what a crash keeps, and its metadata's format. The tests every store runs
//! are in `crate::tests`.

use super::*;
use crate::tests::{read, sealed_file_store, SIZE};
use crate::{Extent, GRAIN};

#[test]
fn file_store_survives_reopen_with_epoch_and_map() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = FileStore::open(d.path()).unwrap();
        let r = s.create(7, SIZE).unwrap();
        r.write(3 * GRAIN + 5, b"persist me", false).unwrap();
        r.set_epoch(42).unwrap();
        r.flush().unwrap();
        r.close().unwrap();
        assert!(
            FileStore::open(d.path()).is_err(),
            "directory is locked while in use"
        );
    }
    let s = FileStore::open(d.path()).unwrap();
    let all = s.open_all();
    assert_eq!(all.len(), 1);
    let r = all.into_iter().next().unwrap().unwrap();
    assert_eq!((r.volume(), r.size(), r.epoch()), (7, SIZE, 42));
    assert_eq!(read(&*r, 3 * GRAIN + 5, 10), b"persist me");
    assert_eq!(
        r.allocated_bytes(),
        GRAIN,
        "a clean shutdown keeps the map sparse"
    );
    s.delete(7).unwrap();
    assert!(s.open_all().is_empty());
}

/// A resized file replica (sealed, as nodes run it) reopens at its new size with its bytes
/// and seals; a data file longer than its metadata (a grow cut short) is cut back.
#[test]
fn a_resized_file_replica_reopens_at_its_new_size() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = sealed_file_store(d.path());
        let r = s.create(4, SIZE).unwrap();
        r.resize(3 * SIZE).unwrap();
        r.write(3 * SIZE - 4096, &[5u8; 4096], true).unwrap();
        r.flush().unwrap();
        r.close().unwrap();
    }
    {
        let s = sealed_file_store(d.path());
        let r = s.open_all().pop().unwrap().unwrap();
        assert_eq!(r.size(), 3 * SIZE);
        assert_eq!(read(&*r, 3 * SIZE - 4096, 4096), vec![5u8; 4096]);
        r.close().unwrap();
    }
    // A grow that lengthened the pool file and died before its metadata said so.
    let [data, pool] = replica_paths(d.path(), 4);
    let set_len = |p: &std::path::Path, len: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(len)
            .unwrap()
    };
    assert_eq!(
        std::fs::metadata(&data).unwrap().len(),
        SIZE,
        "grown in the pool file"
    );
    set_len(&pool, 4 * SIZE);
    {
        let s = sealed_file_store(d.path());
        let r = s.open_all().pop().unwrap().unwrap();
        assert_eq!(r.size(), 3 * SIZE);
        assert_eq!(replica_disk(d.path(), 4).1, 3 * SIZE);
        assert_eq!(read(&*r, 3 * SIZE - 4096, 4096), vec![5u8; 4096]);
        r.write(SIZE - 4096, &[6u8; 4096], false).unwrap();
        // A shrink past the split: the pool file emptied, then the data file shortened.
        r.resize(SIZE / 2).unwrap();
        assert_eq!(std::fs::metadata(&pool).unwrap().len(), 0);
        assert_eq!(std::fs::metadata(&data).unwrap().len(), SIZE / 2);
        // Grown again: the new end is in the pool file, from the new split.
        r.resize(2 * SIZE).unwrap();
        r.write(2 * SIZE - 4096, &[8u8; 4096], true).unwrap();
        r.close().unwrap();
    }
    assert_eq!(std::fs::metadata(&data).unwrap().len(), SIZE / 2);
    let s = sealed_file_store(d.path());
    let r = s.open_all().pop().unwrap().unwrap();
    assert_eq!(r.size(), 2 * SIZE);
    assert_eq!(read(&*r, 2 * SIZE - 4096, 4096), vec![8u8; 4096]);
    assert_eq!(
        read(&*r, SIZE - 4096, 4096),
        vec![0u8; 4096],
        "cut, then grown"
    );
    r.close().unwrap();
    drop((r, s));
    // A shrink past the split that died between emptying the pool file and shortening the
    // data file (its metadata says the smaller size first).
    let s = sealed_file_store(d.path());
    let r = s.open_all().pop().unwrap().unwrap();
    r.write(SIZE / 2 - 4096, &[9u8; 4096], true).unwrap();
    r.resize(SIZE / 4).unwrap();
    r.close().unwrap();
    drop((r, s));
    set_len(&data, SIZE / 2);
    let s = sealed_file_store(d.path());
    let r = s.open_all().pop().unwrap().unwrap();
    assert_eq!(r.size(), SIZE / 4);
    assert_eq!(replica_disk(d.path(), 4).1, SIZE / 4);
    r.resize(SIZE / 2).unwrap();
    assert_eq!(read(&*r, SIZE / 2 - 4096, 4096), vec![0u8; 4096]);
}

/// A replica created before the pool file existed (a data file and no pool file) keeps all
/// of its bytes in its data file, grown or not.
#[test]
fn a_replica_without_a_pool_file_keeps_its_bytes_in_its_data_file() {
    let d = tempfile::tempdir().unwrap();
    let [data, pool] = replica_paths(d.path(), 4);
    {
        let s = FileStore::open(d.path()).unwrap();
        let r = s.create(4, SIZE).unwrap();
        r.write(0, &[1u8; 4096], true).unwrap();
        r.close().unwrap();
    }
    std::fs::remove_file(&pool).unwrap();
    {
        let s = FileStore::open(d.path()).unwrap();
        let r = s.open_all().pop().unwrap().unwrap();
        r.resize(2 * SIZE).unwrap();
        r.write(SIZE, &[2u8; 4096], true).unwrap();
        r.close().unwrap();
    }
    assert!(!pool.exists());
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 2 * SIZE);
    let s = FileStore::open(d.path()).unwrap();
    let r = s.open_all().pop().unwrap().unwrap();
    assert_eq!(read(&*r, 0, 4096), vec![1u8; 4096]);
    assert_eq!(read(&*r, SIZE, 4096), vec![2u8; 4096]);
    s.delete(4).unwrap();
    assert!(!data.exists());
}

/// What a file replica grew by is in its pool file: written through the cache, read back
/// across the split in one request, durable at a flush, removed with the replica, and
/// readable by its owner only.
#[test]
fn the_pool_file_holds_what_a_replica_grew_by() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let [data, pool] = replica_paths(d.path(), 4);
    let s = FileStore::open(d.path()).unwrap();
    let r = s.create(4, SIZE).unwrap();
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), 0);
    assert_eq!(
        std::fs::metadata(&pool).unwrap().permissions().mode() & 0o077,
        0
    );
    r.resize(SIZE + (3 << 20)).unwrap();
    // In order across several MiB (written behind), and one write across the split.
    let mib: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    for m in 0..3u64 {
        r.write(SIZE + (m << 20), &mib, false).unwrap();
    }
    r.write(SIZE - 4096, &[3u8; 8192], false).unwrap();
    assert_eq!(read(&*r, SIZE - 4096, 8192), vec![3u8; 8192]);
    assert!(read(&*r, SIZE + (2 << 20), 1 << 20) == mib);
    r.flush().unwrap();
    assert_eq!(std::fs::metadata(&data).unwrap().len(), SIZE);
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), 3 << 20);
    // A trim in the pool file reads zeros and gives its space back.
    let before = replica_disk(d.path(), 4).0;
    r.write_zeroes(SIZE + (1 << 20), 1 << 20, true, true)
        .unwrap();
    assert_eq!(read(&*r, SIZE + (1 << 20), 4096), vec![0u8; 4096]);
    assert!(replica_disk(d.path(), 4).0 <= before - (1 << 20));
    r.close().unwrap();
    drop((r, s));
    let s = FileStore::open(d.path()).unwrap();
    let r = s.open_all().pop().unwrap().unwrap();
    assert!(read(&*r, SIZE + 4096, (1 << 20) - 4096) == mib[4096..]);
    assert_eq!(read(&*r, SIZE - 4096, 8192), vec![3u8; 8192]);
    drop(r);
    s.delete(4).unwrap();
    assert!(!pool.exists() && !data.exists());
}

/// File replicas are thin: the data file takes disk blocks only where written. A preallocated
/// one reserves every block and keeps what was written; the sealed wrapper passes it through.
#[test]
fn file_replicas_are_thin_until_preallocated() {
    let d = tempfile::tempdir().unwrap();
    let s = sealed_file_store(d.path());
    const BIG: u64 = 64 << 20;
    let r = s.create(9, BIG).unwrap();
    r.write(5 * GRAIN, &[7u8; 4096], true).unwrap();
    let on_disk = || replica_disk(d.path(), 9).0;
    assert!(
        on_disk() < 1 << 20,
        "a fresh replica took {} bytes",
        on_disk()
    );
    s.preallocate(9).unwrap();
    assert!(
        on_disk() >= BIG,
        "a thick replica took only {} bytes",
        on_disk()
    );
    assert_eq!(read(&*r, 5 * GRAIN, 4096), vec![7u8; 4096]);
    assert_eq!(
        read(&*r, 0, 4096),
        vec![0u8; 4096],
        "reserved blocks read as zeros"
    );
    assert!(matches!(
        s.preallocate(10),
        Err(StoreError::NoReplica { volume: 10 })
    ));
}

/// `reserve` allocates a file replica's holes in a range (the snapshot pool asks it as it
/// grows, so its first writes do not each allocate) and changes nothing a client sees: the
/// bytes written stay, the rest reads zeros, and the map still says hole there. A range with
/// no hole is passed over, and a trim makes one again.
#[test]
fn a_reserved_range_is_allocated_and_reads_as_before() {
    let d = tempfile::tempdir().unwrap();
    let s = sealed_file_store(d.path());
    const MIB: u64 = 1 << 20;
    let r = s.create(9, 16 * MIB).unwrap();
    r.write(6 * MIB, &[7u8; 4096], true).unwrap();
    let on_disk = || replica_disk(d.path(), 9).0;
    let before = on_disk();
    r.reserve(4 * MIB, 8 * MIB);
    assert!(
        on_disk() >= before + 8 * MIB - 4096,
        "reserving 8 MiB took {} bytes more",
        on_disk() - before
    );
    assert_eq!(read(&*r, 6 * MIB, 4096), vec![7u8; 4096]);
    assert_eq!(read(&*r, 5 * MIB, 4096), vec![0u8; 4096]);
    let ext = r.block_status(4 * MIB, 2 * MIB).unwrap();
    assert_eq!(ext.len(), 1, "{ext:?}");
    assert_ne!(
        ext[0].flags & Extent::HOLE,
        0,
        "a reserved range is still a hole to clients"
    );
    // A range written whole is passed over (no hole to allocate); one whose grain was trimmed
    // since has a hole again, and reserving allocates it.
    r.write(0, &vec![1u8; 2 * MIB as usize], false).unwrap();
    r.write_zeroes(MIB, GRAIN, true, false).unwrap();
    let trimmed = on_disk();
    r.reserve(0, 2 * MIB);
    assert!(
        on_disk() >= trimmed + GRAIN,
        "the trimmed grain was not reserved again: {} bytes more",
        on_disk() - trimmed
    );
    assert_eq!(read(&*r, MIB, 4096), vec![0u8; 4096]);
    assert_eq!(read(&*r, 0, 4096), vec![1u8; 4096]);
}

/// A process killed without flushing: the data written with O_DIRECT is on disk but the map is
/// not. The replica must still return it (the map is rebuilt from the file), keep its
/// incarnation, and stay the same history.
#[test]
fn file_store_after_a_crash_keeps_unflushed_writes_and_incarnation() {
    let d = tempfile::tempdir().unwrap();
    let incarnation;
    {
        let s = FileStore::open(d.path()).unwrap();
        let r = s.create(7, SIZE).unwrap();
        r.flush().unwrap();
        incarnation = r.incarnation();
        r.write(5 * GRAIN, b"not flushed", false).unwrap();
        // Dropped without close(): what kill -9 leaves behind.
    }
    let s = FileStore::open(d.path()).unwrap();
    let r = s.open_all().into_iter().next().unwrap().unwrap();
    assert_eq!(read(&*r, 5 * GRAIN, 11), b"not flushed");
    assert_eq!(
        r.allocated_bytes(),
        GRAIN,
        "the map rebuilt from the file: the one grain written"
    );
    assert_eq!(r.incarnation(), incarnation);
    let fresh = s.create(8, SIZE).unwrap();
    assert_ne!(
        fresh.incarnation(),
        incarnation,
        "a new replica is a new history"
    );
}

/// Files written by format version 1 (reserved bytes where flags and incarnation now live)
/// still open, and get an incarnation.
#[test]
fn file_meta_version_1_still_decodes() {
    let m = meta::ReplicaMeta {
        volume: 3,
        size: SIZE,
        grain: GRAIN,
        epoch: 9,
        flags: 0,
        incarnation: 0,
        map: AllocMap::new(SIZE, GRAIN).to_bytes(),
    };
    let mut b = meta::encode(&m);
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[0..52]), &b[64..]);
    b[52..56].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(meta::decode(&b).unwrap(), m);
    b[60] = 1;
    assert!(meta::decode(&b).is_err(), "v1 reserved bytes must be zero");
}

#[test]
fn corrupt_metadata_is_refused_and_named() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = FileStore::open(d.path()).unwrap();
        s.create(1, SIZE).unwrap();
        s.create(2, SIZE).unwrap();
    }
    let p = d.path().join(format!("replica-{:016x}.meta", 1));
    let mut b = std::fs::read(&p).unwrap();
    b[30] ^= 1;
    std::fs::write(&p, b).unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let all = s.open_all();
    assert_eq!(all.len(), 2);
    let errs: Vec<String> = all
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errs.len(), 1, "the intact replica still opens");
    assert!(
        errs[0].contains("replica-0000000000000001.meta"),
        "{}",
        errs[0]
    );
}

/// File replica `volume`'s data file and pool file in `d`.
pub(crate) fn replica_paths(d: &std::path::Path, volume: u64) -> [std::path::PathBuf; 2] {
    ["data", "pool"].map(|x| d.join(format!("replica-{volume:016x}.{x}")))
}

/// What file replica `volume`'s files take on disk, and their length (both files).
pub(crate) fn replica_disk(d: &std::path::Path, volume: u64) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    replica_paths(d, volume)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .fold((0, 0), |(b, l), m| (b + m.blocks() * 512, l + m.len()))
}

/// After a kill -9 the allocation map comes from the files themselves (`SEEK_DATA`), not from
/// "every grain" (issue 63: `pool` overstated use 5-30x after any crash, for ever): written
/// grains count, flushed or not, in the data file and in the pool file (through the page
/// cache); a grain trimmed after the last persisted map does not; reserved space (unwritten
/// extents) reads as zeros and counts nothing.
#[test]
fn after_a_crash_the_map_is_what_the_files_hold() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = FileStore::open(d.path()).unwrap();
        let r = s.create(7, SIZE).unwrap();
        r.write(GRAIN, &[1u8; 4096], false).unwrap();
        r.write(3 * GRAIN, &[2u8; 8192], false).unwrap();
        r.flush().unwrap();
        // Trimmed after the map was persisted with it, then written elsewhere, unflushed.
        r.write_zeroes(3 * GRAIN, GRAIN, true, false).unwrap();
        r.write(9 * GRAIN + 4096, &[3u8; 4096], false).unwrap();
        // Grown: the new bytes live in the pool file, written through the cache.
        r.resize(2 * SIZE).unwrap();
        r.write(SIZE + 2 * GRAIN, &[4u8; 4096], false).unwrap();
        r.reserve(SIZE + 8 * GRAIN, 4 * GRAIN);
        // Dropped without close(): what kill -9 leaves behind.
    }
    let s = FileStore::open(d.path()).unwrap();
    let r = s.open_all().into_iter().next().unwrap().unwrap();
    assert_eq!(r.size(), 2 * SIZE);
    assert_eq!(
        r.allocated_bytes(),
        3 * GRAIN,
        "grains 1, 9 and the pool's 2"
    );
    assert_eq!(read(&*r, GRAIN, 4096), vec![1u8; 4096]);
    assert_eq!(read(&*r, 3 * GRAIN, 8192), vec![0u8; 8192]);
    assert_eq!(read(&*r, 9 * GRAIN + 4096, 4096), vec![3u8; 4096]);
    assert_eq!(read(&*r, SIZE + 2 * GRAIN, 4096), vec![4u8; 4096]);
    let data: Vec<u64> = trireme_proto::data_ranges(&r.block_status(0, 2 * SIZE).unwrap(), 0)
        .into_iter()
        .map(|(o, _)| o / GRAIN)
        .collect();
    assert_eq!(
        data,
        vec![1, 9, SIZE / GRAIN + 2],
        "block status follows the map"
    );
}

/// A trim of whole 4 KiB blocks inside a grain frees their space (a parity volume's
/// fold-back trims scattered overlay blocks: written as zeros, each stayed allocated, and
/// the copies grew past a 3-way mirror's). Part blocks at a trim's ends are written; a
/// write of zeroes that may not trim frees nothing; the grain stays in the map.
#[test]
fn a_trim_of_blocks_inside_a_grain_frees_their_space() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let r = s.create(7, SIZE).unwrap();
    r.write(0, &vec![5u8; 4 * GRAIN as usize], false).unwrap();
    r.flush().unwrap();
    let on_disk = || replica_disk(d.path(), 7).0;
    let full = on_disk();
    // Every other block of the first three grains.
    for b in (0..3 * GRAIN / 4096).step_by(2) {
        r.write_zeroes(b * 4096, 4096, true, false).unwrap();
    }
    let freed = full - on_disk();
    assert!(
        freed >= 3 * GRAIN / 2 - 4096,
        "trimming half the blocks of three grains freed {freed} bytes"
    );
    // Not at a block's edges: the two whole blocks within go, the part ones are zeroed.
    let before = on_disk();
    r.write_zeroes(3 * GRAIN + 100, 3 * 4096, true, false)
        .unwrap();
    assert!(
        before - on_disk() >= 2 * 4096,
        "{} bytes freed",
        before - on_disk()
    );
    // Zeroes that may not trim take their space.
    let before = on_disk();
    r.write_zeroes(3 * GRAIN + 8 * 4096, 4 * 4096, false, false)
        .unwrap();
    assert_eq!(on_disk(), before);
    for b in 0..4 * GRAIN / 4096 {
        let want = match b {
            _ if b < 3 * GRAIN / 4096 => [5u8, 0][(b % 2 == 0) as usize],
            48 => 5,
            49..=51 | 56..=59 => 0,
            _ => 5,
        };
        let got = read(&*r, b * 4096, 4096);
        // Block 48's first 100 bytes and block 51's last ones keep their data.
        match b {
            48 => assert!(got[..100] == [5; 100] && got[100..].iter().all(|&x| x == 0)),
            51 => assert!(got[..100].iter().all(|&x| x == 0) && got[100..] == [5; 3996]),
            _ => assert_eq!(got, vec![want; 4096], "block {b}"),
        }
    }
    assert_eq!(r.allocated_bytes(), 4 * GRAIN, "the grains stay in the map");
    // A whole grain still goes from the map.
    r.write_zeroes(0, GRAIN, true, false).unwrap();
    assert_eq!(r.allocated_bytes(), 3 * GRAIN);
}
