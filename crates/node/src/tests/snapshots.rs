//! The snapshot ops over TCP, on a versioned file store as the node daemon builds it.

use super::*;

#[tokio::test]
async fn snapshots_are_taken_under_the_epoch_read_listed_and_deleted() {
    let d = tempfile::tempdir().unwrap();
    let file = trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
    let store = Arc::new(trireme_store::VersionedStore::new(file, Some(d.path())));
    let (_node, c) = start(store).await;
    let call = |h: Header, p: &'static [u8]| c.call(h, Bytes::from_static(p));
    let ok = |f: &Frame| {
        assert_eq!(
            f.header.status,
            Status::Ok,
            "{}",
            String::from_utf8_lossy(&f.payload)
        )
    };
    ok(&call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), b"")
        .await
        .unwrap());
    ok(&call(req(Op::Attach, 1, 3, 0, 0), b"").await.unwrap());
    ok(&call(req(Op::Write, 1, 3, 0, 0), b"before").await.unwrap());
    let snap = |epoch: u64, id: u64| {
        let mut h = req(Op::Snapshot, 1, epoch, 0, 0);
        trireme_proto::SnapshotRequest { id, created: 77 }.put(&mut h);
        h
    };
    // A stale epoch is fenced; id 0 is malformed; a taken id is refused.
    let r = call(snap(2, 5), b"").await.unwrap();
    assert_eq!(r.header.status, Status::Fenced);
    assert_eq!(
        call(snap(3, 0), b"").await.unwrap().header.status,
        Status::Invalid
    );
    ok(&call(snap(3, 5), b"").await.unwrap());
    assert_eq!(
        call(snap(3, 5), b"").await.unwrap().header.status,
        Status::Exists
    );
    ok(&call(req(Op::Write, 1, 3, 0, 0), b"after!").await.unwrap());
    // Read without an epoch (a reader never fences the writer).
    let read_snap = |id: u64| {
        c.call(
            req(Op::SnapshotRead, 1, 0, 0, 6),
            Bytes::from(trireme_proto::snapshot_id_payload(id)),
        )
    };
    let r = read_snap(5).await.unwrap();
    ok(&r);
    assert_eq!(&r.payload[..], b"before");
    assert_eq!(
        read_snap(6).await.unwrap().header.status,
        Status::NoSnapshot
    );
    let r = call(req(Op::Read, 1, 3, 0, 6), b"").await.unwrap();
    assert_eq!(&r.payload[..], b"after!");
    // What changed since it: the first block, out of the first 64 KiB; without an epoch.
    let changed = |from: u64, to: Option<u64>| {
        c.call(
            req(Op::SnapshotChanged, 1, 0, 0, 65536),
            Bytes::from(trireme_proto::ChangedRequest { from, to }.payload()),
        )
    };
    let r = changed(5, None).await.unwrap();
    ok(&r);
    assert_eq!(
        trireme_proto::decode_extents(&r.payload).unwrap(),
        vec![
            trireme_proto::Extent {
                length: 4096,
                flags: trireme_proto::EXTENT_CHANGED
            },
            trireme_proto::Extent {
                length: 61440,
                flags: 0
            }
        ]
    );
    assert_eq!(
        changed(6, None).await.unwrap().header.status,
        Status::NoSnapshot
    );
    assert_eq!(
        c.call(
            req(Op::SnapshotChanged, 1, 0, 0, 4096),
            Bytes::from_static(&[0; 16])
        )
        .await
        .unwrap()
        .header
        .status,
        Status::Invalid
    );
    let r = call(req(Op::SnapshotList, 1, 0, 0, 0), b"").await.unwrap();
    ok(&r);
    let list = trireme_proto::decode_snapshot_list(&r.payload, r.header.length).unwrap();
    assert_eq!(list[0].size, 0, "sizes only when asked");
    let r = call(
        req(Op::SnapshotList, 1, 0, 0, trireme_proto::LIST_SIZED),
        b"",
    )
    .await
    .unwrap();
    ok(&r);
    assert_eq!(r.header.length, trireme_proto::LIST_SIZED);
    let sized = trireme_proto::decode_snapshot_list(&r.payload, r.header.length).unwrap();
    assert_eq!(sized.len(), 1);
    assert!(sized[0].size > 0, "{sized:?}");
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0].id, list[0].created, list[0].exclusive_bytes),
        (5, 77, 4096)
    );
    let mut del = req(Op::SnapshotDelete, 1, 0, 0, 0);
    trireme_proto::SnapshotRequest { id: 5, created: 0 }.put(&mut del);
    ok(&call(del, b"").await.unwrap());
    assert_eq!(
        call(del, b"").await.unwrap().header.status,
        Status::NoSnapshot
    );
    assert_eq!(
        read_snap(5).await.unwrap().header.status,
        Status::NoSnapshot
    );
}

/// Issue 63: an extent query flagged `FLAG_ONE` or `FLAG_FIRST` answers the first extents of a
/// fragmented range, covering a prefix of it, merged across the windows the node asks its
/// store in; one without the flags still answers the whole range. For the head, a snapshot
/// and what changed since a snapshot alike.
#[tokio::test]
async fn extent_queries_answer_the_first_extents_when_asked() {
    use trireme_proto::{decode_extents, Extent, FIRST_EXTENTS, FLAG_FIRST, FLAG_ONE};
    let d = tempfile::tempdir().unwrap();
    let file = trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
    let store = Arc::new(trireme_store::VersionedStore::new(file, Some(d.path())));
    let (_node, c) = start(store).await;
    const SIZE: u64 = 64 << 20;
    let ask = |h: Header, p: Vec<u8>| c.call(h, Bytes::from(p));
    let ok = |f: Frame| {
        assert_eq!(
            f.header.status,
            Status::Ok,
            "{}",
            String::from_utf8_lossy(&f.payload)
        );
        f
    };
    ok(ask(req(Op::CreateReplica, 1, 0, 0, SIZE), vec![])
        .await
        .unwrap());
    ok(ask(req(Op::Attach, 1, 3, 0, 0), vec![]).await.unwrap());
    let mut h = req(Op::Snapshot, 1, 3, 0, 0);
    trireme_proto::SnapshotRequest { id: 5, created: 1 }.put(&mut h);
    ok(ask(h, vec![]).await.unwrap());
    // Every other 4 KiB block of the first 12 MiB, after the snapshot: 4 KiB extents.
    for b in (0..3072u64).step_by(2) {
        ok(ask(req(Op::Write, 1, 3, b * 4096, 0), vec![7; 4096])
            .await
            .unwrap());
    }
    let mut h = req(Op::Snapshot, 1, 3, 0, 0);
    trireme_proto::SnapshotRequest { id: 6, created: 2 }.put(&mut h);
    ok(ask(h, vec![]).await.unwrap());
    let queries: [(Op, Vec<u8>); 3] = [
        (Op::BlockStatus, vec![]),
        (
            Op::SnapshotStatus,
            trireme_proto::snapshot_id_payload(6).to_vec(),
        ),
        (
            Op::SnapshotChanged,
            trireme_proto::ChangedRequest { from: 5, to: None }.payload(),
        ),
    ];
    for (op, p) in queries {
        let extents = |flags: u16| {
            let mut h = req(op, 1, 3, 4096, SIZE - 4096);
            h.flags |= flags;
            let p = p.clone();
            async move {
                let f = ok(ask(h, p).await.unwrap());
                decode_extents(&f.payload).unwrap()
            }
        };
        let total = |e: &[Extent]| e.iter().map(|x| x.length).sum::<u64>();
        let all = extents(0).await;
        assert_eq!(total(&all), SIZE - 4096, "{op:?}");
        assert_eq!(
            all.len(),
            3071,
            "{op:?}: 4 KiB extents, the last running to the end"
        );
        let one = extents(FLAG_ONE).await;
        assert_eq!(one, all[..1], "{op:?}");
        let first = extents(FLAG_FIRST).await;
        assert_eq!(
            first,
            all[..FIRST_EXTENTS],
            "{op:?}: a prefix, whole extents"
        );
        // The unfragmented end: one extent, merged across the windows it spans.
        let mut h = req(op, 1, 3, 16 << 20, SIZE - (16 << 20));
        h.flags |= FLAG_ONE;
        let f = ok(ask(h, p.clone()).await.unwrap());
        let tail = decode_extents(&f.payload).unwrap();
        assert_eq!(tail.len(), 1, "{op:?}");
        assert_eq!(tail[0].length, SIZE - (16 << 20), "{op:?}");
    }
}
