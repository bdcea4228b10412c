//! A parity replica's held map on the node (`held.rs`): what it answers, what survives a
//! crashed process, and what it refuses.

use super::*;

const MB: u64 = 1 << 20;
const B: u64 = 4096;

fn held(n: &Node, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, Refusal> {
    let h = req(Op::Held, 1, 3, offset, len);
    let (_, payload) = n.serve(&Frame::new(h, Bytes::new()))?;
    let extents = trireme_proto::decode_extents_within(&payload, len).unwrap();
    assert_eq!(
        extents.iter().map(|e| e.length).sum::<u64>(),
        len,
        "covers the range"
    );
    Ok(trireme_proto::data_ranges(&extents, offset))
}

fn held_ok(n: &Node, offset: u64, len: u64) -> Vec<(u64, u64)> {
    held(n, offset, len).unwrap_or_else(|Refusal(s, m)| panic!("held refused: {s:?} {m}"))
}

fn open(d: &std::path::Path) -> Node {
    let store = trireme_store::open_store(trireme_store::StoreKind::File, d, None).unwrap();
    let n = Node::new(7, store);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    n
}

fn create_parity(d: &std::path::Path) -> Node {
    let store = trireme_store::open_store(trireme_store::StoreKind::File, d, None).unwrap();
    let n = Node::new(7, store);
    let mut h = req(Op::CreateReplica, 1, 0, 0, 8 * MB);
    h.flags |= trireme_proto::FLAG_HELD;
    serve_ok(&n, h, &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    n
}

/// Writes and zeroes are held at once; a trim lets its whole blocks go (a part block it
/// zeroes stays held). A process that dies keeps every bit (the live copy); after a power
/// loss or a reboot the node keeps what its last flush made durable, and loses the bits of
/// writes no flush followed, never the other way round.
#[test]
fn the_map_answers_writes_and_trims_and_a_crash_keeps_every_bit() {
    let d = tempfile::tempdir().unwrap();
    let n = create_parity(d.path());
    assert_eq!(held_ok(&n, 0, 8 * MB), vec![]);
    serve_ok(&n, req(Op::Write, 1, 3, 5 * B, 0), &[1; 2 * B as usize]);
    serve_ok(&n, req(Op::WriteZeroes, 1, 3, MB, 3 * B), &[]);
    assert_eq!(held_ok(&n, 0, 8 * MB), vec![(5 * B, 2 * B), (MB, 3 * B)]);
    serve_ok(&n, req(Op::Flush, 1, 3, 0, 0), &[]);
    // A trim from the middle of block 5 to the end of block 6: block 6 goes, block 5 stays.
    let mut trim = req(Op::WriteZeroes, 1, 3, 5 * B + 100, 2 * B - 100);
    trim.flags |= trireme_proto::FLAG_MAY_TRIM;
    serve_ok(&n, trim, &[]);
    assert_eq!(held_ok(&n, 0, 8 * MB), vec![(5 * B, B), (MB, 3 * B)]);
    // Written after the last flush: held, in the live copy too.
    serve_ok(&n, req(Op::Write, 1, 3, 2 * MB, 0), &[2; B as usize]);
    assert!(held_ok(&n, 2 * MB, MB).contains(&(2 * MB, B)));
    drop(n); // the process dies: no flush came

    let n = open(d.path());
    let flushed = vec![(5 * B, B), (MB, 3 * B)];
    assert_eq!(
        held_ok(&n, 0, 8 * MB),
        [&flushed[..], &[(2 * MB, B)]].concat(),
        "the next process in this boot takes the live copy: the unflushed write is held"
    );
    serve_ok(&n, req(Op::Write, 1, 3, 6 * MB, 0), &[6; B as usize]);
    drop(n);
    // A reboot or a power loss: the live copy is not read (here it is gone).
    std::fs::remove_file(trireme_store::FileLedger::live_path(d.path(), 1)).unwrap();
    let n = open(d.path());
    assert_eq!(
        held_ok(&n, 0, 8 * MB),
        flushed,
        "the trim was durable before its bytes went; writes no flush followed are not held"
    );
    // A FUA write is durable with its bit; a clean close keeps the rest.
    let mut fua = req(Op::Write, 1, 3, 3 * MB, 0);
    fua.flags |= trireme_proto::FLAG_FUA;
    serve_ok(&n, fua, &[3; B as usize]);
    serve_ok(&n, req(Op::Write, 1, 3, 4 * MB, 0), &[4; B as usize]);
    let after_fua = held_ok(&n, 0, 8 * MB);
    n.close_all();
    drop(n);
    let n = open(d.path());
    assert_eq!(held_ok(&n, 0, 8 * MB), after_fua);
    assert!(after_fua.contains(&(3 * MB, B)) && after_fua.contains(&(4 * MB, B)));
}

/// Trims sent together share their flushes (the first makes every mark so far durable):
/// none of them may be answered before its own clear is durable. After a power loss, no
/// block any of them trimmed is held, and every block they did not trim still is.
#[test]
fn trims_sent_together_are_each_durable_when_answered() {
    let d = tempfile::tempdir().unwrap();
    let n = std::sync::Arc::new(create_parity(d.path()));
    serve_ok(&n, req(Op::Write, 1, 3, 0, 0), &[7; 64 * B as usize]);
    serve_ok(&n, req(Op::Flush, 1, 3, 0, 0), &[]);
    let trims: Vec<_> = (0..16u64)
        .map(|k| {
            let n = n.clone();
            std::thread::spawn(move || {
                // Every other block of the first 32, then one more each in a second round.
                for b in [2 * k, 32 + 2 * k] {
                    let mut trim = req(Op::WriteZeroes, 1, 3, b * B, B);
                    trim.flags |= trireme_proto::FLAG_MAY_TRIM;
                    serve_ok(&n, trim, &[]);
                }
            })
        })
        .collect();
    trims.into_iter().for_each(|t| t.join().unwrap());
    let kept: Vec<(u64, u64)> = (0..32).map(|k| ((2 * k + 1) * B, B)).collect();
    assert_eq!(held_ok(&n, 0, MB), kept);
    drop(std::sync::Arc::into_inner(n).expect("the threads are done"));
    std::fs::remove_file(trireme_store::FileLedger::live_path(d.path(), 1)).unwrap();
    let n = open(d.path());
    assert_eq!(
        held_ok(&n, 0, MB),
        kept,
        "each trim was durable when answered"
    );
}

/// Bytes the replica's data file takes on disk.
fn on_disk(d: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(d.join(format!("replica-{:016x}.data", 1)))
        .unwrap()
        .blocks()
        * 512
}

fn trim(n: &Node, offset: u64, len: u64) {
    let mut t = req(Op::WriteZeroes, 1, 3, offset, len);
    t.flags |= trireme_proto::FLAG_MAY_TRIM;
    serve_ok(n, t, &[]);
}

/// An overlay write into a punched grain reserves the whole grain, so the grain's other
/// blocks take their first writes without allocating; the trim that leaves the grain with
/// nothing held punches it whole, so the reserve is given back. A write under way in the
/// grain (between its data and its bit) keeps the grain: a trim never punches it away.
#[test]
fn an_overlay_write_reserves_its_grain_and_the_last_trim_gives_it_back() {
    const G: u64 = trireme_store::GRAIN;
    let d = tempfile::tempdir().unwrap();
    let n = create_parity(d.path());
    let empty = on_disk(d.path());
    serve_ok(&n, req(Op::Write, 1, 3, G + 2 * B, 0), &[1; B as usize]);
    let one = on_disk(d.path()) - empty;
    assert!(one >= G, "the grain is reserved whole: {one} bytes");
    // Beside the first: the file system's extents stay as many (no extent block to count).
    serve_ok(&n, req(Op::Write, 1, 3, G + 3 * B, 0), &[2; B as usize]);
    assert_eq!(
        on_disk(d.path()) - empty,
        one,
        "the second block was reserved"
    );
    trim(&n, G + 2 * B, B);
    assert_eq!(held_ok(&n, G, G), vec![(G + 3 * B, B)]);
    assert!(
        on_disk(d.path()) - empty >= one - B,
        "a block still held keeps its grain"
    );
    trim(&n, G + 3 * B, B);
    assert_eq!(held_ok(&n, 0, MB), vec![]);
    assert_eq!(
        on_disk(d.path()),
        empty,
        "the last trim punched the grain whole"
    );
    let read = |offset: u64| {
        let (_, data) = n
            .serve(&Frame::new(req(Op::Read, 1, 3, offset, B), Bytes::new()))
            .unwrap_or_else(|Refusal(s, m)| panic!("read refused: {s:?} {m}"));
        data
    };
    assert_eq!(&read(G + 3 * B)[..], &[0; B as usize][..]);

    // A write under way in grain 3 (its data taken, its bit not yet set): the trim of the
    // grain's only held block punches that block alone.
    serve_ok(&n, req(Op::Write, 1, 3, 3 * G, 0), &[3; B as usize]);
    let turn = n
        .held
        .writing(1, 3 * G + 7 * B, B)
        .expect("a parity replica");
    n.held.wrote(1, 3 * G + 7 * B, 0).unwrap();
    trim(&n, 3 * G, B);
    assert!(on_disk(d.path()) - empty >= G - B, "the grain was kept");
    drop(turn);
    trim(&n, 3 * G, B);
    assert_eq!(
        on_disk(d.path()),
        empty,
        "with the write done, punched whole"
    );
}

/// Asked wrongly, or of a replica that keeps no map, or of a map that read back corrupt:
/// a clear refusal, never an answer that would pass for "nothing held".
#[test]
fn bad_questions_and_unreadable_maps_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let n = create_parity(d.path());
    let status =
        |r: Result<Vec<(u64, u64)>, Refusal>| r.map_err(|Refusal(s, m)| (s, m)).unwrap_err();
    assert_eq!(status(held(&n, 100, B)).0, Status::Invalid, "part blocks");
    assert_eq!(status(held(&n, 0, 8 * MB + B)).0, Status::OutOfRange);
    let stale = n.serve(&Frame::new(req(Op::Held, 1, 2, 0, B), Bytes::new()));
    assert!(
        matches!(stale, Err(Refusal(Status::Fenced, _))),
        "epoch-checked"
    );
    // A parity copy keeps its size and its history.
    let resize = n.serve(&Frame::new(
        req(Op::ResizeReplica, 1, 3, 0, 16 * MB),
        Bytes::new(),
    ));
    assert!(matches!(resize, Err(Refusal(Status::Unsupported, _))));
    // A mirror's replica keeps no map.
    serve_ok(&n, req(Op::CreateReplica, 2, 0, 0, MB), &[]);
    let mirror = n.serve(&Frame::new(req(Op::Held, 2, 0, 0, B), Bytes::new()));
    match mirror {
        Err(Refusal(Status::Unsupported, m)) => assert!(m.contains("keeps no held map"), "{m}"),
        Err(Refusal(s, m)) => panic!("{s:?} {m}"),
        Ok(_) => panic!("a mirror's replica answered a held query"),
    }
    serve_ok(&n, req(Op::Write, 1, 3, 0, 0), &[1; B as usize]);
    serve_ok(&n, req(Op::Flush, 1, 3, 0, 0), &[]);
    serve_ok(&n, req(Op::Write, 1, 3, B, 0), &[1; B as usize]);
    serve_ok(&n, req(Op::Flush, 1, 3, 0, 0), &[]);
    drop(n);
    // Both slots of page 0 spoiled: the map is unreadable, and says so.
    let path = trireme_store::FileLedger::held_path(d.path(), 1);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 1;
    bytes[4096 + 100] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let n = open(d.path());
    let (s, m) = status(held(&n, 0, B));
    assert_eq!(s, Status::Io);
    assert!(m.contains("unreadable"), "{m}");
    // A deleted replica's map goes with it; a mirror made under its id keeps none.
    serve_ok(&n, req(Op::DeleteReplica, 1, 0, 0, 0), &[]);
    assert!(!path.exists());
    serve_ok(&n, req(Op::CreateReplica, 1, 0, 0, MB), &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    assert_eq!(status(held(&n, 0, B)).0, Status::Unsupported);
}

/// The bookkeeping's sync drops an extent from the activity log on disk only once the held
/// bits of the writes in it are durable too: a crash after it keeps them, so whatever held
/// bits a crash loses lie in extents the log still shows.
#[test]
fn an_extent_leaves_the_log_on_disk_only_with_its_held_bits_durable() {
    let d = tempfile::tempdir().unwrap();
    let n = create_parity(d.path());
    n.keep_books();
    serve_ok(&n, req(Op::ActivityStart, 1, 3, 0, MB), &[]);
    serve_ok(&n, req(Op::Write, 1, 3, 3 * B, 0), &[7; B as usize]);
    assert_eq!(n.log_extents_on_disk(1), Some(1));
    // The writer clears the extent; the sync drops it on disk.
    serve_ok(&n, req(Op::ActivityClear, 1, 3, 0, MB), &[]);
    n.sync_books();
    assert_eq!(n.log_extents_on_disk(1), Some(0));
    drop(n); // the process dies: no flush came

    let n = open(d.path());
    assert_eq!(
        held_ok(&n, 0, 8 * MB),
        vec![(3 * B, B)],
        "held: no extent on disk says otherwise"
    );
}

/// A write into a grain that is a hole in the store fills the grain whole, so its later
/// writes are overwrites: its data where it was written, zeros around it (as the hole read),
/// only its own block held. While the fill is under way another write to the grain waits and
/// a trim leaves the grain alone. Not filled: a grain with anything on disk, one another write
/// is in, and a write that is not within one grain and less than all of it.
#[test]
fn a_write_into_a_hole_fills_its_grain_and_holds_only_its_own_blocks() {
    const G: u64 = trireme_store::GRAIN;
    let d = tempfile::tempdir().unwrap();
    let n = create_parity(d.path());
    let r = n.replica(1).unwrap();
    let turn = n.held.filling(1, &*r, G + 2 * B, B).expect("a hole");
    assert_eq!(turn.filled(), Some(1));
    assert!(
        n.held.filling(1, &*r, G + 5 * B, B).is_none(),
        "one fill a grain"
    );
    // A trim beside it meanwhile is not widened over the grain (it would punch the fill).
    let empty = on_disk(d.path());
    let t = n.held.trimming(1, &*r, G + 9 * B, B).unwrap();
    assert_eq!((t.offset, t.len), (G + 9 * B, B));
    drop(t);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let t = n.held.writing(1, G + 5 * B, B);
            tx.send(t.is_some()).unwrap();
        });
        let waited = rx.recv_timeout(std::time::Duration::from_millis(300));
        assert!(waited.is_err(), "a write to the grain waits for the fill");
        drop(turn);
        let went = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(went, Ok(true), "and goes on once it is done");
    });
    assert_eq!(on_disk(d.path()), empty, "nothing was written yet");

    serve_ok(&n, req(Op::Write, 1, 3, G + 2 * B, 0), &[7; B as usize]);
    assert!(
        on_disk(d.path()) - empty >= G,
        "the grain was written whole"
    );
    assert_eq!(
        held_ok(&n, 0, MB),
        vec![(G + 2 * B, B)],
        "only its block is held"
    );
    let (_, data) = n
        .serve(&Frame::new(req(Op::Read, 1, 3, G, G), Bytes::new()))
        .unwrap_or_else(|Refusal(s, m)| panic!("read refused: {s:?} {m}"));
    let mut want = vec![0u8; G as usize];
    want[2 * B as usize..3 * B as usize].fill(7);
    assert!(data[..] == want[..], "its data, zeros around it");
    assert!(
        n.held.filling(1, &*r, G + 5 * B, B).is_none(),
        "a grain with bytes on disk"
    );
    // Whole grains, writes across two grains, and a grain with a write under way.
    assert!(n.held.filling(1, &*r, 4 * G, G).is_none(), "a whole grain");
    assert!(
        n.held.filling(1, &*r, 5 * G - B, 2 * B).is_none(),
        "across two"
    );
    let w = n.held.writing(1, 6 * G, B).expect("a parity replica");
    assert!(
        n.held.filling(1, &*r, 6 * G + B, B).is_none(),
        "a write in it"
    );
    drop(w);
    assert!(
        n.held.filling(1, &*r, 6 * G + B, B).is_some(),
        "then a hole again"
    );
}
