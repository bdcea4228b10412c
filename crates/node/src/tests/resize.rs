//! `ResizeReplica`: under the replica's epoch, within the node's room; the bytes, the block
//! seals and the activity log (in memory and on disk) follow the new size.

use super::*;

fn refused(n: &Node, h: Header) -> (Status, String) {
    match n.serve(&Frame::new(h, Bytes::new())) {
        Ok(_) => panic!("{:?} was served", h.op),
        Err(Refusal(s, m)) => (s, m),
    }
}

#[test]
fn a_replica_grows_under_its_epoch_and_within_the_room() {
    const MB: u64 = 1 << 20;
    let d = tempfile::tempdir().unwrap();
    let open = || {
        let store =
            trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
        let store = Arc::new(trireme_store::SealedStore::new(store, Some(d.path())));
        let n = Node::new(7, store);
        n.keep_books();
        n.set_capacity(64 * MB);
        n
    };
    let n = open();
    serve_ok(&n, req(Op::CreateReplica, 1, 0, 0, 16 * MB), &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    serve_ok(&n, req(Op::ActivityStart, 1, 3, 0, MB), &[]);
    serve_ok(&n, req(Op::Write, 1, 3, 15 * MB, 4096), &[1u8; 4096]);

    // A writer of another epoch, a size that is no size, a size past the room: refused, and
    // nothing changes.
    assert_eq!(
        refused(&n, req(Op::ResizeReplica, 1, 2, 0, 32 * MB)).0,
        Status::Fenced
    );
    assert_eq!(
        refused(&n, req(Op::ResizeReplica, 1, 3, 0, 32 * MB + 1)).0,
        Status::Invalid
    );
    let (s, why) = refused(&n, req(Op::ResizeReplica, 1, 3, 0, 128 * MB));
    assert_eq!(s, Status::NoSpace);
    assert!(
        why.contains("growing a replica by 112.0 MiB does not fit") && why.contains("64.0 MiB"),
        "{why}"
    );
    assert_eq!(n.usage().provisioned, 16 * MB);

    serve_ok(&n, req(Op::ResizeReplica, 1, 3, 0, 48 * MB), &[]);
    assert_eq!(n.usage().provisioned, 48 * MB);
    // The new end takes writes, and the log marks them (on disk too).
    serve_ok(&n, req(Op::Write, 1, 3, 47 * MB, 4096), &[2u8; 4096]);
    assert_eq!(log_of(&n, 48 * MB), (3, vec![(15 * MB, MB), (47 * MB, MB)]));
    assert_eq!(n.log_extents_on_disk(1), Some(2));
    serve_ok(&n, req(Op::Flush, 1, 3, 0, 0), &[]);
    drop(n);

    // A process that dies: the size, the bytes, and the log's marks are all still there.
    let n = open();
    let info = serve_ok(&n, req(Op::ReplicaInfo, 1, 0, 0, 0), &[]);
    assert_eq!(info.length, 48 * MB, "{info:?}");
    serve_ok(&n, req(Op::Attach, 1, 4, 0, 0), &[]);
    let (h, b) = n
        .serve(&Frame::new(
            req(Op::Read, 1, 4, 47 * MB, 4096),
            Bytes::new(),
        ))
        .map_err(|Refusal(s, m)| format!("{s:?} {m}"))
        .unwrap();
    assert_eq!(h.status, Status::Ok);
    assert_eq!(&b[..], &[2u8; 4096][..]);
    assert_eq!(
        log_of(&n, 48 * MB).1,
        vec![(15 * MB, MB), (47 * MB, MB)],
        "the log loaded at its new size"
    );
}
