//! The clone ops over TCP, on the stack the node daemon builds (versions over clones over a
//! file store): create a clone, read and write it, refuse what would take its parent away,
//! flatten it; and a restart that ties it to its parent again.

use super::*;

fn stack(dir: &std::path::Path) -> Arc<dyn Store> {
    let file = trireme_store::open_store(trireme_store::StoreKind::File, dir, None).unwrap();
    let backed = Arc::new(trireme_store::BackedStore::new(file, Some(dir)));
    Arc::new(trireme_store::VersionedStore::new(backed, Some(dir)))
}

fn clone_req(volume: u64, parent: u64, snapshot: u64) -> (Header, Bytes) {
    (
        req(Op::CreateClone, volume, 0, 0, 1 << 20),
        Bytes::from(trireme_proto::CloneRequest { parent, snapshot }.encode()),
    )
}

#[tokio::test]
async fn a_clone_reads_its_parents_snapshot_and_keeps_it_from_being_deleted_until_flattened() {
    let d = tempfile::tempdir().unwrap();
    let (node, c) = start(stack(d.path())).await;
    let call = |h: Header, p: Bytes| c.call(h, p);
    let status = |f: &Frame| f.header.status;
    let ok = |f: Frame| {
        assert_eq!(
            f.header.status,
            Status::Ok,
            "{}",
            String::from_utf8_lossy(&f.payload)
        );
        f
    };
    ok(call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), Bytes::new())
        .await
        .unwrap());
    ok(call(req(Op::Attach, 1, 3, 0, 0), Bytes::new())
        .await
        .unwrap());
    ok(
        call(req(Op::Write, 1, 3, 0, 0), Bytes::from_static(b"golden"))
            .await
            .unwrap(),
    );
    let mut h = req(Op::Snapshot, 1, 3, 0, 0);
    trireme_proto::SnapshotRequest { id: 5, created: 1 }.put(&mut h);
    ok(call(h, Bytes::new()).await.unwrap());
    ok(
        call(req(Op::Write, 1, 3, 0, 0), Bytes::from_static(b"parent"))
            .await
            .unwrap(),
    );
    // No such parent, no such snapshot, a malformed request: refused, nothing created.
    let (h, p) = clone_req(2, 9, 5);
    assert_eq!(status(&call(h, p).await.unwrap()), Status::NoReplica);
    let (h, p) = clone_req(2, 1, 6);
    assert_eq!(status(&call(h, p).await.unwrap()), Status::NoSnapshot);
    let (h, _) = clone_req(2, 1, 5);
    assert_eq!(
        status(&call(h, Bytes::from_static(b"short")).await.unwrap()),
        Status::Invalid
    );
    assert_eq!(node.replica_count(), 1);
    let (h, p) = clone_req(2, 1, 5);
    ok(call(h, p).await.unwrap());
    ok(call(req(Op::Attach, 2, 1, 0, 0), Bytes::new())
        .await
        .unwrap());
    let r = ok(call(req(Op::Read, 2, 1, 0, 6), Bytes::new()).await.unwrap());
    assert_eq!(&r.payload[..], b"golden");
    ok(call(req(Op::Write, 2, 1, 2, 0), Bytes::from_static(b"XY"))
        .await
        .unwrap());
    let r = ok(call(req(Op::Read, 2, 1, 0, 6), Bytes::new()).await.unwrap());
    assert_eq!(&r.payload[..], b"goXYen");
    // The parent's snapshot and the parent are in use.
    let mut h = req(Op::SnapshotDelete, 1, 0, 0, 0);
    trireme_proto::SnapshotRequest { id: 5, created: 0 }.put(&mut h);
    let f = call(h, Bytes::new()).await.unwrap();
    assert_eq!(status(&f), Status::InUse);
    assert!(String::from_utf8_lossy(&f.payload).contains("[2]"));
    let f = call(req(Op::DeleteReplica, 1, 0, 0, 0), Bytes::new())
        .await
        .unwrap();
    assert_eq!(status(&f), Status::InUse);
    ok(call(req(Op::Flatten, 2, 0, 0, 0), Bytes::new())
        .await
        .unwrap());
    let mut h = req(Op::SnapshotDelete, 1, 0, 0, 0);
    trireme_proto::SnapshotRequest { id: 5, created: 0 }.put(&mut h);
    ok(call(h, Bytes::new()).await.unwrap());
    ok(call(req(Op::DeleteReplica, 1, 0, 0, 0), Bytes::new())
        .await
        .unwrap());
    let r = ok(call(req(Op::Read, 2, 1, 0, 6), Bytes::new()).await.unwrap());
    assert_eq!(&r.payload[..], b"goXYen");
    assert_eq!(node.replica_count(), 1);
}

#[test]
fn a_node_that_starts_ties_each_clone_to_its_parent() {
    let d = tempfile::tempdir().unwrap();
    {
        let store = stack(d.path());
        let p = store.create(1, 1 << 20).unwrap();
        p.write(0, b"golden", false).unwrap();
        p.snapshot(5, 1).unwrap();
        let c = store.create(2, 1 << 20).unwrap();
        c.set_backing(p.clone(), 5).unwrap();
        c.write(2, b"XY", false).unwrap();
        // The process dies: nothing closed.
    }
    let node = Node::new(7, stack(d.path()));
    let c = node.replica(2).ok().unwrap();
    assert!(c.backing().unwrap().linked);
    let mut b = [0u8; 6];
    c.read(0, &mut b).unwrap();
    assert_eq!(&b, b"goXYen");
}
