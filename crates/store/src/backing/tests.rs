//! Clones over memory, file and sealed file stacks (versions above, as nodes stack them): what
//! a clone and its parent's snapshot read through writes of every shape, zeroings, the
//! clone's own snapshots, a crash, a flatten; and a map file that fails its checks.

use super::*;
use crate::{FileStore, MemoryStore, SealedStore, VersionedStore, GRAIN};

const SIZE: u64 = 1 << 20;
const PARENT: u64 = 1;
const CLONE: u64 = 2;
const SNAP: u64 = 10;

struct Stack {
    name: &'static str,
    dir: Option<tempfile::TempDir>,
}

impl Stack {
    fn all() -> Vec<Stack> {
        ["memory", "file", "sealed file"]
            .into_iter()
            .map(|name| Stack {
                name,
                dir: (name != "memory").then(|| tempfile::tempdir().unwrap()),
            })
            .collect()
    }
    fn open(&self) -> Arc<dyn Store> {
        let dir = self.dir.as_ref().map(|d| d.path());
        let bottom: Arc<dyn Store> = match self.name {
            "memory" => Arc::new(MemoryStore::default()),
            "file" => Arc::new(FileStore::open(dir.unwrap()).unwrap()),
            _ => Arc::new(SealedStore::new(
                Arc::new(FileStore::open(dir.unwrap()).unwrap()),
                dir,
            )),
        };
        let backed: Arc<dyn Store> = Arc::new(BackedStore::new(bottom, dir));
        Arc::new(VersionedStore::new(backed, dir))
    }
}

/// A deterministic byte pattern.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read_all(r: &dyn Replica) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    r.read(0, &mut b).unwrap();
    b
}

fn read_snap(r: &dyn Replica, id: u64) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    r.read_snapshot(id, 0, &mut b).unwrap();
    b
}

/// A parent with bytes in its first half and a hole after, snapshotted; the clone of it.
fn parent_and_clone(store: &Arc<dyn Store>) -> (Arc<dyn Replica>, Arc<dyn Replica>, Vec<u8>) {
    let p = store.create(PARENT, SIZE).unwrap();
    let mut model = vec![0u8; SIZE as usize];
    let bytes = pattern(1, (SIZE / 2) as usize);
    p.write(0, &bytes, false).unwrap();
    model[..bytes.len()].copy_from_slice(&bytes);
    p.snapshot(SNAP, 1).unwrap();
    let c = store.create(CLONE, SIZE).unwrap();
    c.set_backing(p.clone(), SNAP).unwrap();
    (p, c, model)
}

/// Random writes, zeroings and trims of every shape to `r`, mirrored into `model`.
fn churn(r: &dyn Replica, model: &mut [u8], seed: u64, n: u64) {
    let mut x = seed | 1;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for i in 0..n {
        let off = next(SIZE - 1);
        let len = 1 + next((SIZE - off).min(3 * BLOCK + 700));
        match next(4) {
            0 => {
                r.write_zeroes(off, len, i % 2 == 0, false).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            _ => {
                let data = pattern(seed + i, len as usize);
                r.write(off, &data, false).unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
        }
    }
}

#[test]
fn a_clone_reads_its_parents_snapshot_until_written_and_neither_sees_the_other() {
    for s in Stack::all() {
        let store = s.open();
        let (p, c, snap_model) = parent_and_clone(&store);
        assert_eq!(read_all(&*c), snap_model, "{}", s.name);
        let info = c.backing().unwrap();
        assert_eq!(
            (info.parent, info.snapshot, info.from_parent),
            (PARENT, SNAP, SIZE)
        );
        // The parent goes on after its snapshot; the clone does not see it.
        let mut parent_model = snap_model.clone();
        churn(&*p, &mut parent_model, 7, 200);
        let mut clone_model = snap_model.clone();
        churn(&*c, &mut clone_model, 11, 300);
        assert_eq!(read_all(&*c), clone_model, "{}", s.name);
        assert_eq!(read_all(&*p), parent_model, "{}", s.name);
        assert_eq!(read_snap(&*p, SNAP), snap_model, "{}", s.name);
        assert!(c.backing().unwrap().from_parent < SIZE);
        // A snapshot of the clone keeps blocks still read from the parent.
        c.snapshot(20, 1).unwrap();
        let at_20 = clone_model.clone();
        churn(&*c, &mut clone_model, 13, 200);
        assert_eq!(read_snap(&*c, 20), at_20, "{}", s.name);
        assert_eq!(read_all(&*c), clone_model, "{}", s.name);
        // Holes: the parent's second half is one, and so is the clone's where untouched.
        let ext = c.block_status(0, SIZE).unwrap();
        assert_eq!(ext.iter().map(|e| e.length).sum::<u64>(), SIZE);
    }
}

#[test]
fn a_crash_keeps_every_answered_fill_and_a_flatten_frees_the_parent() {
    for s in Stack::all().into_iter().filter(|s| s.dir.is_some()) {
        let store = s.open();
        let (p, c, snap_model) = parent_and_clone(&store);
        let mut clone_model = snap_model.clone();
        churn(&*c, &mut clone_model, 17, 300);
        c.flush().unwrap();
        churn(&*c, &mut clone_model, 19, 100);
        let left = c.backing().unwrap().from_parent;
        // The process dies: nothing closed.
        drop((p, c, store));
        let store = s.open();
        let all: Vec<Arc<dyn Replica>> = store.open_all().into_iter().map(|r| r.unwrap()).collect();
        let p = all.iter().find(|r| r.volume() == PARENT).unwrap().clone();
        let c = all.iter().find(|r| r.volume() == CLONE).unwrap().clone();
        let info = c.backing().unwrap();
        assert!(!info.linked, "{}", s.name);
        assert_eq!(info.from_parent, left, "{}", s.name);
        let mut b = vec![0u8; SIZE as usize];
        let unlinked = c.read(0, &mut b);
        assert!(unlinked.is_err(), "{}: read without its parent", s.name);
        c.link_backing(p.clone()).unwrap();
        assert_eq!(read_all(&*c), clone_model, "{}", s.name);
        // Flattened with writes going on from another thread.
        let writer = {
            let c = c.clone();
            let mut m = clone_model.clone();
            std::thread::spawn(move || {
                churn(&*c, &mut m, 23, 200);
                m
            })
        };
        c.flatten().unwrap();
        let clone_model = writer.join().unwrap();
        assert!(c.backing().is_none(), "{}", s.name);
        p.delete_snapshot(SNAP).unwrap();
        assert_eq!(read_all(&*c), clone_model, "{}", s.name);
        c.close().unwrap();
        p.close().unwrap();
        drop((p, c, store));
        let store = s.open();
        for r in store.open_all() {
            let r = r.unwrap();
            assert!(r.backing().is_none());
            if r.volume() == CLONE {
                assert_eq!(read_all(&*r), clone_model, "{}", s.name);
            }
        }
    }
}

#[test]
fn only_a_fresh_replica_becomes_a_clone_and_only_of_a_snapshot_its_parent_has() {
    let s = &Stack::all()[1];
    let store = s.open();
    let (p, c, _) = parent_and_clone(&store);
    assert!(c.set_backing(p.clone(), SNAP).is_err(), "a clone twice");
    let other = store.create(3, SIZE).unwrap();
    assert!(matches!(
        other.set_backing(p.clone(), 99),
        Err(StoreError::NoSnapshot { .. })
    ));
    other.write(0, b"x", false).unwrap();
    assert!(other.set_backing(p.clone(), SNAP).is_err(), "written");
    assert!(c.link_backing(other.clone()).is_err(), "another parent");
}

#[test]
fn a_map_file_that_fails_its_checks_is_refused_and_a_torn_log_record_is_skipped() {
    let saved = Saved {
        volume: 5,
        parent: 4,
        snapshot: 3,
        blocks: 100,
        unfilled: Bits::all(100),
    };
    let bytes = file::encode(&saved);
    assert_eq!(file::decode(&bytes).unwrap(), saved);
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x20;
        assert!(file::decode(&bad).is_err(), "byte {i} flipped");
    }
    for n in 0..bytes.len() {
        assert!(file::decode(&bytes[..n]).is_err(), "cut at {n}");
    }
    let dir = tempfile::tempdir().unwrap();
    let f = CloneFiles::new(dir.path(), 5);
    f.append(&[1, 2, 3]).unwrap();
    let mut log = f.log_bytes();
    assert_eq!(file::replay(5, &log), vec![1, 2, 3]);
    assert!(file::replay(6, &log).is_empty(), "another volume's records");
    log[20] ^= 1;
    log.truncate(40);
    assert_eq!(file::replay(5, &log), vec![1]);
}

#[test]
fn a_flatten_copies_only_what_the_parent_holds_not_its_holes() {
    for s in Stack::all().into_iter().filter(|s| s.name == "file") {
        let store = s.open();
        let (_p, c, model) = parent_and_clone(&store);
        c.flatten().unwrap();
        assert!(c.backing().is_none());
        assert_eq!(read_all(&*c), model);
        // The parent wrote its first half; its second half is a hole, and stays one here.
        assert_eq!(c.allocated_bytes(), SIZE / 2, "{}", s.name);
    }
}

/// `hole` through the stack a node opens: a replica that is no clone and has no snapshot
/// says hole where the file has nothing (a grain never written, or trimmed whole), and never
/// where a byte was written; a clone says no hole anywhere (its holes read the parent), nor
/// does a replica with a snapshot (its holes may be redirects). The memory store cannot tell.
#[test]
fn a_hole_is_told_only_where_it_reads_zeros_from_the_file() {
    for s in Stack::all() {
        let store = s.open();
        let (p, c, _) = parent_and_clone(&store);
        let r = store.create(3, SIZE).unwrap();
        let file = s.name != "memory";
        assert_eq!(r.hole(0, SIZE), file, "{}: a new replica", s.name);
        r.write(GRAIN + 5 * BLOCK, &[1; BLOCK as usize], false)
            .unwrap();
        assert!(!r.hole(GRAIN, GRAIN), "{}: a written grain", s.name);
        assert!(
            !r.hole(0, 2 * GRAIN),
            "{}: a range with a written grain",
            s.name
        );
        assert_eq!(r.hole(2 * GRAIN, GRAIN), file, "{}: the next grain", s.name);
        r.write_zeroes(GRAIN, GRAIN, true, false).unwrap();
        assert_eq!(r.hole(GRAIN, GRAIN), file, "{}: trimmed whole", s.name);
        assert!(
            !c.hole(SIZE / 2, GRAIN),
            "{}: a clone's hole reads its parent",
            s.name
        );
        assert!(
            !p.hole(SIZE / 2, GRAIN),
            "{}: a snapshotted replica",
            s.name
        );
    }
}
