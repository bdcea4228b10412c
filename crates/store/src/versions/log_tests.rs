//! The redirect log: what a flush syncs, when the log is folded into the main file (with I/O
//! going on: records go to a second log meanwhile), what a reopen replays from it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

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
    let r = snapshotted(&s);
    // Both logs: a fold empties the one it retires, and records go to the other.
    let len = || log_len(dir.path(), "vlog") + log_len(dir.path(), "vlog2");
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

/// Volume 5 of `s`, written whole with ones, then snapshot 1 taken and flushed: every write
/// after it is a redirect, one record of the log.
fn snapshotted(s: &Arc<dyn Store>) -> Arc<dyn Replica> {
    let r = s.create(5, SIZE).unwrap();
    r.write(0, &[1; SIZE as usize], false).unwrap();
    r.snapshot(1, 0).unwrap();
    r.flush().unwrap();
    r
}

/// The length of volume 5's file `name` in `dir` (0 if there is none).
fn log_len(dir: &std::path::Path, name: &str) -> u64 {
    std::fs::metadata(dir.join(format!("replica-0000000000000005.{name}"))).map_or(0, |m| m.len())
}

/// A replica whose flushes, once armed, let `pass` through and then wait for the test.
#[derive(Debug)]
struct HeldFlush {
    inner: Arc<dyn Replica>,
    hold: Arc<Hold>,
}

#[derive(Debug, Default)]
struct Hold {
    /// (flushes still to let through while armed, armed, one waiting, released)
    state: Mutex<(usize, bool, bool, bool)>,
    cv: Condvar,
}

impl Hold {
    fn arm(&self, pass: usize) {
        *self.state.lock().unwrap() = (pass, true, false, false);
    }
    /// Waits until a flush is held.
    fn wait_held(&self) {
        let g = self.state.lock().unwrap();
        let (g, t) = self
            .cv
            .wait_timeout_while(g, std::time::Duration::from_secs(10), |s| !s.2)
            .unwrap();
        assert!(!t.timed_out() && g.2, "no flush was held");
    }
    fn release(&self) {
        self.state.lock().unwrap().3 = true;
        self.cv.notify_all();
    }
    fn at_flush(&self) {
        let mut g = self.state.lock().unwrap();
        if !g.1 {
            return;
        }
        if g.0 > 0 {
            g.0 -= 1;
            return;
        }
        g.2 = true;
        self.cv.notify_all();
        let _g = self.cv.wait_while(g, |s| !s.3).unwrap();
    }
}

impl crate::filter::ReplicaFilter for HeldFlush {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.hold.at_flush();
        self.inner.flush()
    }
}

#[derive(Debug)]
struct HeldStore {
    inner: Arc<dyn Store>,
    hold: Arc<Hold>,
}

impl crate::filter::StoreFilter for HeldStore {
    fn next(&self) -> &dyn Store {
        &*self.inner
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        Ok(Arc::new(HeldFlush {
            inner: self.inner.create(volume, size)?,
            hold: self.hold.clone(),
        }))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.inner
            .open_all()
            .into_iter()
            .map(|r| {
                r.map(|inner| {
                    Arc::new(HeldFlush {
                        inner,
                        hold: self.hold.clone(),
                    }) as Arc<dyn Replica>
                })
            })
            .collect()
    }
}

/// A fold writes the main file with I/O going on: while it is held in its physical flush
/// (after the log's switch and the head's capture), writes that redirect blocks and reads
/// are answered, their records going to the other log. A process that dies then (the main
/// file not written) reopens to every write, from both logs; one that dies after the fold
/// too, and the fold emptied the log it retired. Before, a fold held every I/O off until
/// the main file was written.
#[test]
fn a_fold_lets_io_go_on_and_a_crash_on_either_side_of_it_loses_nothing() {
    const BLOCKS: u64 = SIZE / 4096;
    for crash_in_fold in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let hold = Arc::new(Hold::default());
        let open = || -> Arc<dyn Store> {
            Arc::new(
                VersionedStore::new(
                    Arc::new(HeldStore {
                        inner: Arc::new(FileStore::open(dir.path()).unwrap()),
                        hold: hold.clone(),
                    }),
                    Some(dir.path()),
                )
                .with_log_slots(16),
            )
        };
        let s = open();
        let r = snapshotted(&s);
        // 64 redirects: the log is full.
        for b in 0..64 {
            r.write(b * 4096, &[2; 4096], false).unwrap();
        }
        let len = |n: &str| log_len(dir.path(), n);
        let first = len("vlog");
        assert!(first > 0 && len("vlog2") == 0);
        // The flush's own physical flush passes; the fold's is held.
        hold.arm(1);
        let done = Arc::new(AtomicBool::new(false));
        let flusher = {
            let (r, done) = (r.clone(), done.clone());
            std::thread::spawn(move || {
                r.flush().unwrap();
                done.store(true, Ordering::Release);
            })
        };
        hold.wait_held();
        let during = AtomicUsize::new(0);
        for b in 64..BLOCKS {
            r.write(b * 4096, &[3; 4096], false).unwrap();
            assert_eq!(read(&*r, None, b * 4096, 4096), vec![3; 4096]);
            during.fetch_add(1, Ordering::Relaxed);
        }
        assert!(!done.load(Ordering::Acquire), "the fold did not wait");
        assert_eq!(during.load(Ordering::Relaxed) as u64, BLOCKS - 64);
        assert!(
            len("vlog2") > 0,
            "the writes during the fold went to the old log"
        );
        let check = |r: &dyn Replica| {
            for b in 0..BLOCKS {
                let want = if b < 64 { 2 } else { 3 };
                assert_eq!(read(r, None, b * 4096, 4096), vec![want; 4096], "block {b}");
            }
            assert_eq!(read(r, Some(1), 0, SIZE as usize), vec![1; SIZE as usize]);
        };
        if crash_in_fold {
            // Copies of the files as they are, mid-fold: a process that died there.
            let copy = tempfile::tempdir().unwrap();
            for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
                std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
            }
            hold.release();
            flusher.join().unwrap();
            let s2: Arc<dyn Store> = Arc::new(VersionedStore::new(
                Arc::new(FileStore::open(copy.path()).unwrap()),
                Some(copy.path()),
            ));
            let r2 = s2.open_all().pop().unwrap().unwrap();
            check(&*r2);
        } else {
            hold.release();
            flusher.join().unwrap();
            assert_eq!(len("vlog"), 0, "the fold left the log it retired");
            drop((r, s));
            let s = open();
            let r = s.open_all().pop().unwrap().unwrap();
            check(&*r);
        }
    }
}
