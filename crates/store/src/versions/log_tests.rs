//! The redirect log: what a flush syncs, when the log is folded into the main file, what a
//! reopen replays from it.

use super::tests::{read, Stack, SIZE};
use super::*;
use crate::FileStore;

/// A flush after writes that moved blocks syncs the redirect log and leaves the main file
/// alone: the main file holds the whole head, and writing it at every flush cost in
/// proportion to every block moved since the last snapshot. Files copied right after that
/// flush open to every flushed write, the log replayed over the main file.
#[test]
fn a_flush_syncs_the_redirect_log_and_leaves_the_main_file_to_checkpoints() {
    for mut s in Stack::all().into_iter().filter(|s| s.dir.is_some()) {
        let r = s.store().create(9, SIZE).unwrap();
        r.write(0, &[1; SIZE as usize], false).unwrap();
        r.snapshot(1, 0).unwrap();
        // The snapshot's record is in the log; this flush puts it in the main file.
        r.flush().unwrap();
        let dir = s.dir.as_ref().unwrap().path().to_path_buf();
        let main = dir.join("replica-0000000000000009.versions");
        let before = std::fs::read(&main).unwrap();
        for k in 0..SIZE / 8192 {
            r.write(k * 8192, &[2 + (k % 200) as u8; 4096], false)
                .unwrap();
        }
        r.flush().unwrap();
        assert_eq!(
            std::fs::read(&main).unwrap(),
            before,
            "{}: the flush rewrote the main file",
            s.name
        );
        drop(r);
        let r = s.reopen();
        for k in 0..SIZE / 8192 {
            assert_eq!(
                read(&*r, None, k * 8192, 8192),
                [vec![2 + (k % 200) as u8; 4096], vec![1; 4096]].concat(),
                "{}: block {k}",
                s.name
            );
        }
        assert_eq!(read(&*r, Some(1), 0, SIZE as usize), vec![1; SIZE as usize]);
    }
}

/// The redirect log is folded into the main file (which holds the whole head) only once it
/// holds as many records as that head has entries, or the least set: rewriting a head that
/// has moved far at every few records would cost each redirect in proportion to it. 256
/// redirects with a fold at 16 records at least: the folds come at heads of 16, 32, 64 and
/// 128 entries (16 folds, one per 16 records, before), and a reopen gives every write back.
#[test]
fn the_log_is_folded_in_no_more_often_than_the_head_it_rewrites_grows() {
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        Arc::new(
            VersionedStore::new(
                Arc::new(FileStore::open(dir.path()).unwrap()),
                Some(dir.path()),
            )
            .with_log_slots(16),
        )
    };
    let s = open();
    let r = s.create(5, SIZE).unwrap();
    r.write(0, &[1; SIZE as usize], false).unwrap();
    r.snapshot(1, 0).unwrap();
    r.flush().unwrap();
    let log = dir.path().join("replica-0000000000000005.vlog");
    let len = || std::fs::metadata(&log).map_or(0, |m| m.len());
    let (mut folds, mut last) = (0, len());
    for b in 0..SIZE / 4096 {
        r.write(b * 4096, &[2 + (b % 200) as u8; 4096], false)
            .unwrap();
        if b % 4 == 3 {
            r.flush().unwrap();
            let now = len();
            if now < last {
                folds += 1;
            }
            last = now;
        }
    }
    assert!(
        (3..=5).contains(&folds),
        "{folds} folds of the log for 256 redirects"
    );
    drop((r, s));
    let s = open();
    let r = s.open_all().pop().unwrap().unwrap();
    for b in 0..SIZE / 4096 {
        assert_eq!(
            read(&*r, None, b * 4096, 4096),
            vec![2 + (b % 200) as u8; 4096]
        );
    }
    assert_eq!(read(&*r, Some(1), 0, SIZE as usize), vec![1; SIZE as usize]);
}

/// A snapshot taken with a main file on disk is one record of the redirect log: no file of its
/// own until the next flush. The files as they are right after it open to every synced
/// snapshot, whose files that open writes; an unsynced one (`snapshot_unsynced`) is dropped
/// there, its bytes never flushed, and survives once a flush has run.
#[test]
fn a_snapshot_is_one_log_record_until_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let open = |d: &std::path::Path| -> Arc<dyn Store> {
        Arc::new(VersionedStore::new(
            Arc::new(FileStore::open(d).unwrap()),
            Some(d),
        ))
    };
    let s = open(dir.path());
    let r = s.create(4, SIZE).unwrap();
    let snap_file =
        |d: &std::path::Path, id: u64| d.join(format!("replica-{:016x}.snap-{id:016x}", 4u64));
    // A new replica has its main file already (the identity), for the log to build on.
    assert!(dir
        .path()
        .join("replica-0000000000000004.versions")
        .exists());
    r.write(0, &[1; 8192], false).unwrap();
    r.snapshot(1, 0).unwrap();
    r.write(0, &[2; 4096], false).unwrap();
    r.snapshot(2, 0).unwrap();
    for id in [1, 2] {
        assert!(
            !snap_file(dir.path(), id).exists(),
            "snapshot {id} has a file already"
        );
    }
    r.write(4096, &[3; 4096], false).unwrap();
    r.snapshot_unsynced(3, 0).unwrap();
    r.write(0, &[4; 4096], false).unwrap();
    // The files as they are now, opened elsewhere.
    let copy = |from: &std::path::Path| {
        let to = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, to.path().join(p.file_name().unwrap())).unwrap();
        }
        to
    };
    // The store over a directory and its one replica, opened.
    let reopen = |d: &std::path::Path| {
        let s = open(d);
        let r = s.open_all().pop().unwrap().unwrap();
        (s, r)
    };
    let at = |r: &dyn Replica, ids: &[Option<u64>]| -> Vec<Vec<u8>> {
        ids.iter().map(|&id| read(r, id, 0, 8192)).collect()
    };
    let v1 = [vec![1; 4096], vec![1; 4096]].concat();
    let v2 = [vec![2; 4096], vec![1; 4096]].concat();
    let v3 = [vec![2; 4096], vec![3; 4096]].concat();
    let head = [vec![4; 4096], vec![3; 4096]].concat();
    let ids =
        |r: &dyn Replica| -> Vec<u64> { r.snapshots().unwrap().iter().map(|s| s.id).collect() };
    let before = copy(dir.path());
    let (s2, r2) = reopen(before.path());
    assert_eq!(ids(&*r2), vec![1, 2], "the unsynced snapshot is dropped");
    let held = vec![v1.clone(), v2.clone(), head.clone()];
    assert_eq!(at(&*r2, &[Some(1), Some(2), None]), held);
    assert!((1..=2).all(|id| snap_file(before.path(), id).exists()));
    // Opened again from the files that open wrote, without the log's help; a snapshot taken
    // now does not take the dropped one's place in the order of generations.
    r2.close().unwrap();
    drop((r2, s2));
    let (s2, r2) = reopen(before.path());
    assert_eq!(at(&*r2, &[Some(1), Some(2), None]), held);
    r2.snapshot(5, 0).unwrap();
    r2.write(0, &[6; 4096], false).unwrap();
    assert_eq!(at(&*r2, &[Some(5)])[0], head);
    drop((r2, s2));
    // A flush makes the unsynced snapshot durable: the files then hold all three.
    r.flush().unwrap();
    assert!((1..=3).all(|id| snap_file(dir.path(), id).exists()));
    let after = copy(dir.path());
    let (s2, r2) = reopen(after.path());
    assert_eq!(ids(&*r2), vec![1, 2, 3]);
    assert_eq!(at(&*r2, &[Some(3)])[0], v3);
    drop((r2, s2));
    // Deleting the oldest snapshot rewrites the next one's file against nothing.
    r.delete_snapshot(1).unwrap();
    r.close().unwrap();
    drop((r, s));
    let (_s, r) = reopen(dir.path());
    assert_eq!(at(&*r, &[Some(2), Some(3), None]), [v2, v3, head]);
}

/// A replica folded back to plain drops its open redirect log with the file: the next
/// snapshot's redirects go to a log a reopen reads (they went to the unlinked file before).
#[test]
fn redirects_after_a_fold_back_reach_the_log_a_reopen_reads() {
    for mut s in Stack::all().into_iter().filter(|s| s.dir.is_some()) {
        let r = s.store().create(5, SIZE).unwrap();
        r.write(0, &[1; 4096], false).unwrap();
        r.snapshot(1, 0).unwrap();
        r.write(0, &[2; 4096], false).unwrap();
        r.rollback(1).unwrap();
        r.delete_snapshot(1).unwrap();
        assert!(r.snapshots().unwrap().is_empty(), "{}", s.name);
        r.snapshot(2, 0).unwrap();
        r.write(0, &[3; 4096], false).unwrap();
        drop(r);
        let r = s.reopen();
        assert!(
            read(&*r, None, 0, 4096) == [3; 4096],
            "{}: the write is lost",
            s.name
        );
        assert!(read(&*r, Some(2), 0, 4096) == [1; 4096], "{}", s.name);
    }
}
