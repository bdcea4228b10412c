//! The node against a real TCP connection on 127.0.0.1.

use super::*;
use std::collections::HashSet;
use trireme_proto::{DirtyPeer, Header, Op};
use trireme_transport::{tcp::TcpConnection, Connection, Frame, Handler, Peer};

async fn start(store: Arc<dyn Store>) -> (Arc<Node>, TcpConnection) {
    let node = Arc::new(Node::new(7, store));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let n = node.clone();
    tokio::spawn(run(n, "127.0.0.1:0".parse().unwrap(), None, move |a, _| {
        let _ = tx.send(a);
    }));
    let addr = rx.await.unwrap();
    (
        node,
        TcpConnection::connect(&addr.to_string(), 2).await.unwrap(),
    )
}

fn req(op: Op, volume: u64, epoch: u64, offset: u64, length: u64) -> Header {
    Header {
        volume,
        epoch,
        offset,
        length,
        ..Header::request(op, 0)
    }
}

#[tokio::test]
async fn write_read_and_fencing_over_tcp() {
    let d = tempfile::tempdir().unwrap();
    let store = trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
    let (_node, c) = start(store).await;
    let ok = |f: &Frame| {
        assert_eq!(
            f.header.status,
            Status::Ok,
            "{:?}",
            String::from_utf8_lossy(&f.payload)
        )
    };
    ok(&c
        .call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), Bytes::new())
        .await
        .unwrap());
    ok(&c
        .call(req(Op::Attach, 1, 3, 0, 0), Bytes::new())
        .await
        .unwrap());
    ok(&c
        .call(req(Op::Write, 1, 3, 512, 0), Bytes::from_static(b"hello"))
        .await
        .unwrap());
    let r = c
        .call(req(Op::Read, 1, 3, 512, 5), Bytes::new())
        .await
        .unwrap();
    ok(&r);
    assert_eq!(&r.payload[..], b"hello");

    // A newer writer attaches: the old epoch is refused from now on, for I/O and for attach.
    ok(&c
        .call(req(Op::Attach, 1, 4, 0, 0), Bytes::new())
        .await
        .unwrap());
    let r = c
        .call(req(Op::Write, 1, 3, 0, 0), Bytes::from_static(b"zombie"))
        .await
        .unwrap();
    assert_eq!((r.header.status, r.header.epoch), (Status::Fenced, 4));
    let r = c
        .call(req(Op::Attach, 1, 3, 0, 0), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.header.status, Status::Fenced);
    let r = c
        .call(req(Op::Read, 1, 4, 0, 6), Bytes::new())
        .await
        .unwrap();
    assert_eq!(
        &r.payload[..],
        &[0u8; 6],
        "the zombie write changed nothing"
    );

    // Bad requests get a status, and the connection keeps serving.
    let r = c
        .call(req(Op::Read, 1, 4, (1 << 20) - 2, 5), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.header.status, Status::OutOfRange);
    let r = c
        .call(req(Op::Read, 1, 4, 0, u64::MAX), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.header.status, Status::OutOfRange);
    let r = c
        .call(req(Op::Write, 99, 4, 0, 0), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.header.status, Status::NoReplica);
    // Checksums obey the epoch fence: a short range's checksum would reveal its bytes.
    let r = c
        .call(req(Op::Checksum, 1, 0, 0, 1), Bytes::new())
        .await
        .unwrap();
    assert_ne!(r.header.status, Status::Ok, "checksum without the epoch");
    let r = c
        .call(req(Op::Checksum, 1, 4, 0, 1 << 20), Bytes::new())
        .await
        .unwrap();
    ok(&r);
    // An attach that leaps the epoch to the end of its range (which would fence every real
    // writer for good) is refused, and the next real one still works.
    let r = c
        .call(req(Op::Attach, 1, u64::MAX, 0, 0), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.header.status, Status::Invalid);
    ok(&c
        .call(req(Op::Attach, 1, 5, 0, 0), Bytes::new())
        .await
        .unwrap());
    ok(&c
        .call(req(Op::Checksum, 1, 5, 0, 4096), Bytes::new())
        .await
        .unwrap());
    let r = c
        .call(req(Op::ReplicaInfo, 1, 0, 0, 0), Bytes::new())
        .await
        .unwrap();
    assert_eq!((r.header.length, r.header.epoch), (1 << 20, 5));
    assert!(!c.is_closed());
}

#[tokio::test]
async fn garbage_bytes_close_only_that_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (node, c) = start(Arc::new(trireme_store::MemoryStore::default())).await;
    let addr = c.info().peer;
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    raw.write_all(&[0xFFu8; 200]).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut b))
        .await
        .unwrap();
    assert_eq!(
        n.unwrap(),
        0,
        "server closes a connection that sends garbage"
    );
    // A header announcing a huge payload is refused before any allocation.
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut hb = Header::request(Op::Write, 1).encode(&[]);
    hb[52..56].copy_from_slice(&u32::MAX.to_le_bytes());
    raw.write_all(&hb).await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut b))
        .await
        .unwrap();
    assert_eq!(n.unwrap(), 0);
    let r = c
        .call(Header::request(Op::Ping, 0), Bytes::new())
        .await
        .unwrap();
    assert_eq!(&r.payload[..], node.id().to_string().as_bytes());
}

/// A writer that re-attaches through a new connection (same epoch) abandons the old one: frames
/// still arriving on it are refused, so they cannot overwrite what a resync copied since.
#[tokio::test]
async fn a_reattach_supersedes_the_old_connection() {
    let (node, old) = start(Arc::new(trireme_store::MemoryStore::default())).await;
    let status = |f: Frame| f.header.status;
    assert_eq!(
        status(
            old.call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), Bytes::new())
                .await
                .unwrap()
        ),
        Status::Ok
    );
    assert_eq!(
        status(
            old.call(req(Op::Attach, 1, 4, 0, 0), Bytes::new())
                .await
                .unwrap()
        ),
        Status::Ok
    );
    let addr = old.info().peer.to_string();
    let new = TcpConnection::connect(&addr, 1).await.unwrap();
    assert_eq!(
        status(
            new.call(req(Op::Attach, 1, 4, 0, 0), Bytes::new())
                .await
                .unwrap()
        ),
        Status::Ok
    );
    let late = old
        .call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"late"))
        .await
        .unwrap();
    assert_eq!(late.header.status, Status::Superseded);
    assert_eq!(
        status(
            new.call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"new!"))
                .await
                .unwrap()
        ),
        Status::Ok
    );
    let r = node.replica(1).unwrap_or_else(|_| panic!("replica"));
    let mut b = [0u8; 4];
    r.read(0, &mut b).unwrap();
    assert_eq!(&b, b"new!");
    // Checksums (verification, status) are not tied to a connection.
    let c = old
        .call(req(Op::Checksum, 1, 4, 0, 4096), Bytes::new())
        .await
        .unwrap();
    assert_eq!(c.header.status, Status::Ok);
}

/// After `close_all` (the process is exiting), nothing lands: a write that arrived late would
/// not match the seals the file store recorded at close.
#[tokio::test]
async fn a_closed_node_refuses_every_request() {
    let store: Arc<dyn Store> = Arc::new(trireme_store::MemoryStore::default());
    let (node, c) = start(store).await;
    for h in [
        req(Op::CreateReplica, 1, 0, 0, 1 << 20),
        req(Op::Attach, 1, 3, 0, 0),
    ] {
        assert_eq!(
            c.call(h, Bytes::new()).await.unwrap().header.status,
            Status::Ok
        );
    }
    node.close_all();
    let f = c
        .call(req(Op::Write, 1, 3, 0, 0), Bytes::from_static(b"late"))
        .await
        .unwrap();
    assert_eq!(f.header.status, Status::Io);
    assert!(String::from_utf8_lossy(&f.payload).contains("shutting down"));
    let mut buf = [0u8; 4];
    node.replica(1).ok().unwrap().read(0, &mut buf).unwrap();
    assert_eq!(buf, [0; 4], "the late write did not land");
}

/// What each identity may do: a client only on volumes whose access list names it, only
/// while it is the volume's writer, and never create or delete a replica; a node only while it
/// is a member; operators everything; no attach past the metadata's newest epoch. Refusals
/// mark nothing, and are decided on the header alone (`Handler::refuse`).
#[tokio::test]
async fn identities_reach_only_what_they_may() {
    use trireme_tls::Role;
    let node = Arc::new(Node::new(
        7,
        Arc::new(trireme_store::MemoryStore::default()),
    ));
    let as_peer = |role: Role, h: Header, p: &'static [u8]| {
        let mut f = Frame::new(h, Bytes::from_static(p));
        f.peer = Peer::Cert(Arc::new(role));
        let n = node.clone();
        async move { n.handle(f).await.header.status }
    };
    let alice = || Role::Client("alice".into());
    let bob = || Role::Client("bob".into());
    let policy = |access: &[&str], epoch, writer: Option<&str>| {
        HashMap::from([(
            1,
            VolumePolicy {
                access: access.iter().map(|s| s.to_string()).collect(),
                epoch,
                writer: writer.map(String::from),
            },
        )])
    };
    // A client may not create or delete replicas, an operator may.
    let create = req(Op::CreateReplica, 1, 0, 0, 1 << 20);
    assert_eq!(as_peer(alice(), create, b"").await, Status::Denied);
    assert_eq!(as_peer(Role::Server, create, b"").await, Status::Denied);
    assert_eq!(as_peer(Role::Admin, create, b"").await, Status::Ok);
    // A volume's claim on the node: an operator sets it, its writer does not.
    let qos = req(Op::Qos, 1, 0, 5_000, 3);
    assert_eq!(as_peer(Role::Admin, qos, b"").await, Status::Ok);
    assert_eq!(
        node.share(1),
        Share {
            reserve: 5_000,
            weight: 3
        }
    );
    for bad_weight in [0, 1001, u64::MAX] {
        let h = req(Op::Qos, 1, 0, 1, bad_weight);
        assert_eq!(as_peer(Role::Admin, h, b"").await, Status::Invalid);
    }
    assert_eq!(
        as_peer(Role::Admin, req(Op::Qos, 9, 0, 1, 1), b"").await,
        Status::NoReplica
    );
    // Until the node knows the volume, clients reach nothing.
    assert_eq!(
        as_peer(alice(), req(Op::Attach, 1, 1, 0, 0), b"").await,
        Status::Denied
    );
    // On the list but nobody attached, or another writer: still nothing.
    node.set_policies(policy(&["alice", "bob"], 1, None));
    assert_eq!(
        as_peer(alice(), req(Op::Attach, 1, 1, 0, 0), b"").await,
        Status::Denied
    );
    node.set_policies(policy(&["alice", "bob"], 1, Some("client alice")));
    assert_eq!(
        as_peer(alice(), req(Op::Attach, 1, 1, 0, 0), b"").await,
        Status::Ok
    );
    assert_eq!(
        as_peer(alice(), req(Op::Qos, 1, 1, 1 << 40, 1000), b"").await,
        Status::Denied,
        "even its writer does not give a volume a claim"
    );
    assert_eq!(
        node.share(1),
        Share {
            reserve: 5_000,
            weight: 3
        }
    );
    // Bob is listed too, but alice writes: he may not take the replica at her epoch, nor
    // write, read or query it behind her back.
    for op in [
        Op::Attach,
        Op::Read,
        Op::Checksum,
        Op::ReplicaInfo,
        Op::DirtyQuery,
        Op::ActivityQuery,
        Op::Held,
        Op::Qos,
    ] {
        assert_eq!(
            as_peer(bob(), req(op, 1, 1, 0, 4), b"").await,
            Status::Denied,
            "{op:?}"
        );
    }
    assert_eq!(
        as_peer(bob(), req(Op::Write, 1, 1, 0, 0), b"evil").await,
        Status::Denied
    );
    // The refusal is decided on the header: a transport asks before reading a payload.
    assert!(node
        .refuse(&req(Op::Write, 1, 1, 0, 4), &Peer::Cert(Arc::new(bob())))
        .is_some_and(|f| f.header.status == Status::Denied));
    assert!(node
        .refuse(&req(Op::Write, 1, 1, 0, 4), &Peer::Cert(Arc::new(alice())))
        .is_none());
    assert_eq!(
        as_peer(alice(), req(Op::DeleteReplica, 1, 0, 0, 0), b"").await,
        Status::Denied
    );
    // Nor, even as the volume's writer, make a clone of its snapshot (a volume that would
    // read it), flatten one or delete a snapshot: the manager does those. An operator's
    // same request gets past the rule (and is refused by the store: memory keeps no versions).
    // (Alice writes volume 2 too, which this node holds no copy of: only the op's rule
    // stands between her and a clone of volume 1's snapshot there.)
    const CLONE_OF_1: &[u8] = &[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
    let mut both = policy(&["alice", "bob"], 1, Some("client alice"));
    both.insert(2, both[&1].clone());
    node.set_policies(both);
    for (op, volume, p) in [
        (Op::CreateClone, 2, CLONE_OF_1),
        (Op::Flatten, 1, &[][..]),
        (Op::SnapshotDelete, 1, &[][..]),
    ] {
        assert_eq!(
            as_peer(alice(), req(op, volume, 1, 0, 1 << 20), p).await,
            Status::Denied,
            "{op:?}"
        );
    }
    assert_eq!(
        as_peer(
            Role::Admin,
            req(Op::CreateClone, 2, 0, 0, 1 << 20),
            CLONE_OF_1
        )
        .await,
        Status::Invalid
    );
    node.set_policies(policy(&["alice", "bob"], 1, Some("client alice")));
    assert_eq!(
        as_peer(bob(), req(Op::Ping, 0, 0, 0, 0), b"").await,
        Status::Ok
    );
    // No attach past the metadata's newest epoch, whoever asks: a leap would fence the
    // volume for good.
    for who in [alice(), Role::Admin] {
        assert_eq!(
            as_peer(who, req(Op::Attach, 1, 1 << 31, 0, 0), b"").await,
            Status::Denied
        );
    }
    assert_eq!(node.replica(1).ok().unwrap().epoch(), 1);
    // A node certificate counts while its node is a member.
    node.set_members(Some(HashSet::from([7, 8])));
    assert_eq!(
        as_peer(Role::Node(8), req(Op::ReplicaInfo, 1, 1, 0, 0), b"").await,
        Status::Ok
    );
    assert_eq!(
        as_peer(Role::Node(9), req(Op::ReplicaInfo, 1, 1, 0, 0), b"").await,
        Status::Denied
    );
    // `*` opens it to every client (that writes it).
    node.set_policies(policy(&["*"], 2, Some("client bob")));
    assert_eq!(
        as_peer(bob(), req(Op::ReplicaInfo, 1, 1, 0, 0), b"").await,
        Status::Ok
    );
    assert_eq!(node.replica_count(), 1);
}

/// Replicas count against the node's capacity; ranges are checked before anything is marked.
#[tokio::test]
async fn capacity_and_ranges_are_checked_first() {
    let store: Arc<dyn Store> = Arc::new(trireme_store::MemoryStore::default());
    let (node, c) = start(store).await;
    node.set_capacity(3 << 20);
    let st = |f: Frame| f.header.status;
    assert_eq!(
        st(
            c.call(req(Op::CreateReplica, 1, 0, 0, 2 << 20), Bytes::new())
                .await
                .unwrap()
        ),
        Status::Ok
    );
    let f = c
        .call(req(Op::CreateReplica, 2, 0, 0, 2 << 20), Bytes::new())
        .await
        .unwrap();
    assert_eq!(f.header.status, Status::NoSpace);
    assert!(String::from_utf8_lossy(&f.payload).contains("does not fit"));
    let f = c
        .call(req(Op::CreateReplica, 3, 0, 0, u64::MAX), Bytes::new())
        .await
        .unwrap();
    assert_eq!(f.header.status, Status::NoSpace);
    assert_eq!(node.replica_count(), 1);
    assert_eq!(
        st(
            c.call(req(Op::CreateReplica, 2, 0, 0, 1 << 20), Bytes::new())
                .await
                .unwrap()
        ),
        Status::Ok
    );
    assert_eq!(
        st(c.call(req(Op::Attach, 1, 1, 0, 0), Bytes::new())
            .await
            .unwrap()),
        Status::Ok
    );
    assert_eq!(
        st(c.call(
            req(Op::ActivityStart, 1, 1, 0, activity::MIN_EXTENT),
            Bytes::new()
        )
        .await
        .unwrap()),
        Status::Ok
    );
    // A huge WriteZeroes and a write past the end: refused, nothing marked for the activity log.
    for (op, off, len) in [
        (Op::WriteZeroes, 4096, u64::MAX - 1),
        (Op::WriteZeroes, 0, 4 << 20),
        (Op::BlockStatus, 0, 1 << 40),
    ] {
        let s = st(c.call(req(op, 1, 1, off, len), Bytes::new()).await.unwrap());
        assert!(
            matches!(s, Status::OutOfRange | Status::Invalid),
            "{op:?}: {s:?}"
        );
    }
    let s = st(c
        .call(
            req(Op::Write, 1, 1, (2 << 20) - 2, 0),
            Bytes::from_static(b"past"),
        )
        .await
        .unwrap());
    assert_eq!(s, Status::OutOfRange);
    let v = node.activity.query(1, 0, 2 << 20);
    assert_eq!(v.epoch, 1);
    assert!(
        v.extents.iter().all(|e| e.flags != 0),
        "nothing marked active: {v:?}"
    );
    // The same write inside the range is marked.
    let s = st(c
        .call(req(Op::Write, 1, 1, 0, 0), Bytes::from_static(b"in"))
        .await
        .unwrap());
    assert_eq!(s, Status::Ok);
    let v = node.activity.query(1, 0, 2 << 20);
    assert!(v.extents.iter().any(|e| e.flags == 0), "{v:?}");
}

/// Serves one request in this thread; panics with the node's message on a refusal.
fn serve_ok(n: &Node, h: Header, payload: &[u8]) -> Header {
    match n.serve(&Frame::new(h, Bytes::copy_from_slice(payload))) {
        Ok((h, _)) => h,
        Err(Refusal(s, m)) => panic!("{:?} refused: {s:?} {m}", h.op),
    }
}

fn dirty_of(n: &Node, peer: u32, size: u64) -> (u64, Vec<(u64, u64)>) {
    let v = n.dirty.query(1, peer, 0, size);
    (v.epoch, trireme_proto::data_ranges(&v.extents, 0))
}

fn log_of(n: &Node, size: u64) -> (u64, Vec<(u64, u64)>) {
    let v = n.activity.query(1, 0, size);
    (v.epoch, trireme_proto::data_ranges(&v.extents, 0))
}

/// A node whose process dies (no close) comes back with its activity log and its record of
/// what a peer missed: the writes since the record was last saved are covered by the log's
/// extents, so a restarted survivor still serves an incremental resync and bounds a
/// reconcile. Without `keep_books` (a volatile node) both are gone, as before.
#[test]
fn bookkeeping_survives_a_crashed_node_process() {
    const MB: u64 = 1 << 20;
    const SIZE: u64 = 16 * MB;
    let d = tempfile::tempdir().unwrap();
    let open = |books: bool| {
        let store =
            trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
        let n = Node::new(7, store);
        if books {
            n.keep_books();
        }
        n
    };
    let peer = DirtyPeer {
        peer: 2,
        incarnation: 77,
        mode: trireme_proto::DIRTY_START,
    };
    let n = open(true);
    serve_ok(&n, req(Op::CreateReplica, 1, 0, 0, SIZE), &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    serve_ok(&n, req(Op::ActivityStart, 1, 3, 0, MB), &[]);
    assert_eq!(n.log_extents_on_disk(1), Some(0));
    serve_ok(&n, req(Op::DirtyMark, 1, 3, 0, 0), &peer.encode());
    serve_ok(&n, req(Op::Write, 1, 3, 0, 0), &[1; 4096]);
    serve_ok(&n, req(Op::Write, 1, 3, 5 * MB + 4096, 0), &[2; 4096]);
    assert_eq!(
        n.log_extents_on_disk(1),
        Some(2),
        "cold extents go to disk first"
    );
    // The writer clears extent 0; the next sync saves the records, then drops it on disk.
    serve_ok(&n, req(Op::ActivityClear, 1, 3, 0, MB), &[]);
    n.sync_books();
    assert_eq!(n.log_extents_on_disk(1), Some(1));
    // A write after the save: only the activity log (on disk, extent 9) knows of it.
    serve_ok(&n, req(Op::Write, 1, 3, 9 * MB, 0), &[3; 4096]);
    drop(n); // the process dies: nothing closed, nothing saved

    let n = open(true);
    let (epoch, extents) = log_of(&n, SIZE);
    assert_eq!(epoch, 3);
    assert_eq!(extents, vec![(5 * MB, MB), (9 * MB, MB)]);
    let (epoch, dirty) = dirty_of(&n, 2, SIZE);
    assert_eq!(
        epoch, 3,
        "the record is complete: trusted for an incremental resync"
    );
    assert_eq!(
        dirty,
        vec![(0, 4096), (5 * MB, MB), (9 * MB, MB)],
        "saved regions plus the log's extents"
    );
    assert_eq!(n.dirty.query(1, 2, 0, SIZE).incarnation, 77);
    // Still marking for the peer, and still logging.
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    serve_ok(&n, req(Op::Write, 1, 3, 12 * MB, 0), &[4; 4096]);
    assert!(dirty_of(&n, 2, SIZE).1.contains(&(12 * MB, 4096)));
    n.close_all();
    drop(n);

    // A torn page of the log on disk: its extents all count as written.
    let (al, _) = trireme_store::FileLedger::paths(d.path(), 1);
    let mut b = std::fs::read(&al).unwrap();
    b[4096 + 100] ^= 0xff;
    std::fs::write(&al, &b).unwrap();
    let n = open(true);
    assert_eq!(log_of(&n, SIZE).1, vec![(0, SIZE)]);
    drop(n);

    // A node that keeps no books comes back knowing nothing.
    let n = open(false);
    assert_eq!(log_of(&n, SIZE).0, 0);
    assert_eq!(dirty_of(&n, 2, SIZE).0, 0);
}

/// A new writer's log starts empty on disk only after what the old one covered is durable:
/// the dirty marks of the old writer's last writes survive a crash right after the start.
#[test]
fn a_new_log_saves_the_records_first() {
    const MB: u64 = 1 << 20;
    let d = tempfile::tempdir().unwrap();
    let open = || {
        let store =
            trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
        let n = Node::new(7, store);
        n.keep_books();
        n
    };
    let peer = DirtyPeer {
        peer: 2,
        incarnation: 77,
        mode: trireme_proto::DIRTY_START,
    };
    let n = open();
    serve_ok(&n, req(Op::CreateReplica, 1, 0, 0, 8 * MB), &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    serve_ok(&n, req(Op::ActivityStart, 1, 3, 0, MB), &[]);
    serve_ok(&n, req(Op::DirtyMark, 1, 3, 0, 0), &peer.encode());
    serve_ok(&n, req(Op::Write, 1, 3, 3 * MB, 0), &[1; 4096]);
    serve_ok(&n, req(Op::Attach, 1, 4, 0, 0), &[]);
    serve_ok(&n, req(Op::ActivityStart, 1, 4, 0, MB), &[]);
    drop(n);
    let n = open();
    assert_eq!(log_of(&n, 8 * MB), (4, vec![]));
    assert_eq!(dirty_of(&n, 2, 8 * MB), (3, vec![(3 * MB, 4096)]));
}

/// After a crash, block seals hold outside the extents the activity log kept on disk: a block
/// there corrupted behind the node's back is still caught (`Corrupt`), while one inside a
/// logged extent is unsealed (it may have been in flight), as every block was before.
#[test]
fn seals_outside_the_log_survive_a_crash() {
    use std::os::unix::fs::FileExt;
    const MB: u64 = 1 << 20;
    let d = tempfile::tempdir().unwrap();
    let open = || {
        let file =
            trireme_store::open_store(trireme_store::StoreKind::File, d.path(), None).unwrap();
        let store = Arc::new(trireme_store::SealedStore::new(file, Some(d.path())));
        let n = Node::new(7, store);
        n.keep_books();
        n
    };
    let n = open();
    serve_ok(&n, req(Op::CreateReplica, 1, 0, 0, 8 * MB), &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    serve_ok(&n, req(Op::ActivityStart, 1, 3, 0, MB), &[]);
    serve_ok(&n, req(Op::Write, 1, 3, 0, 0), &[1; 4096]);
    serve_ok(&n, req(Op::Write, 1, 3, 5 * MB, 0), &[2; 4096]);
    // Extent 0 goes quiet: the sync flushes (seals persisted) and drops it on disk.
    serve_ok(&n, req(Op::ActivityClear, 1, 3, 0, MB), &[]);
    n.sync_books();
    serve_ok(&n, req(Op::Write, 1, 3, 5 * MB + 4096, 0), &[3; 4096]);
    drop(n); // crash

    let data = d.path().join("replica-0000000000000001.data");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.write_all_at(&[0xee; 4096], 0).unwrap();
    f.write_all_at(&[0xee; 4096], 5 * MB).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let n = open();
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    let read = |off: u64| n.serve(&Frame::new(req(Op::Read, 1, 3, off, 4096), Bytes::new()));
    match read(0) {
        Err(Refusal(s, _)) => assert_eq!(s, Status::Corrupt, "sealed outside the log"),
        Ok(_) => panic!("a corrupted block outside the log was served"),
    }
    let (_, inside) = read(5 * MB)
        .map_err(|Refusal(s, m)| format!("{s:?} {m}"))
        .unwrap();
    assert_eq!(&inside[..], &[0xee; 4096][..], "inside the log: unsealed");
}

/// A tiered node flags its read replies (tiered; served from slow; heated), takes heat other
/// copies saw (`TierHeat`) and promotes by it, and reports its tiers; an untiered node sets
/// no flag and refuses tier ops as unsupported.
#[test]
fn tiered_reads_are_flagged_and_shared_heat_promotes() {
    use trireme_proto::{FLAG_HEATED, FLAG_SLOW, FLAG_TIERED};
    const MB: u64 = 1 << 20;
    let d = tempfile::tempdir().unwrap();
    let cfg = trireme_store::TierConfig {
        fast_capacity: 4 * MB,
        disk: None,
        migrate_rate: 64 * MB,
        extent: MB,
    };
    let store =
        trireme_store::open_store(trireme_store::StoreKind::Tiered, d.path(), Some(cfg)).unwrap();
    let n = Node::new(1, store);
    serve_ok(&n, req(Op::CreateReplica, 1, 0, 0, 16 * MB), &[]);
    serve_ok(&n, req(Op::Attach, 1, 3, 0, 0), &[]);
    let h = serve_ok(&n, req(Op::Read, 1, 3, 5 * MB, 4096), &[]);
    assert_eq!(
        h.flags & (FLAG_TIERED | FLAG_SLOW | FLAG_HEATED),
        FLAG_TIERED | FLAG_SLOW | FLAG_HEATED
    );
    // The next piece of a scan does not heat.
    let h = serve_ok(&n, req(Op::Read, 1, 3, 5 * MB + 4096, 4096), &[]);
    assert_eq!(h.flags & FLAG_HEATED, 0);
    // Another copy's reads of extent 9, told by the writer: promoted here too.
    let heat = trireme_proto::encode_heat(&[(9 * MB, 40)]);
    serve_ok(&n, req(Op::TierHeat, 1, 3, 0, 0), &heat);
    let t0 = std::time::Instant::now();
    loop {
        let h = serve_ok(&n, req(Op::Read, 1, 3, 9 * MB, 4096), &[]);
        if h.flags & FLAG_SLOW == 0 {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "extent 9 not promoted"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let info = match n.serve(&Frame::new(req(Op::TierInfo, 1, 0, 0, 0), Bytes::new())) {
        Ok((_, p)) => trireme_proto::TierReport::decode(&p).unwrap(),
        Err(Refusal(s, m)) => panic!("{s:?} {m}"),
    };
    assert_eq!(info.node.fast_capacity, 4 * MB);
    assert!(info.replica.unwrap().promotions >= 1);
    assert!(matches!(
        n.serve(&Frame::new(
            req(Op::TierHeat, 1, 3, 0, 0),
            Bytes::from_static(b"odd")
        )),
        Err(Refusal(Status::Invalid, _))
    ));

    let plain = Node::new(2, Arc::new(trireme_store::MemoryStore::default()));
    serve_ok(&plain, req(Op::CreateReplica, 1, 0, 0, 16 * MB), &[]);
    serve_ok(&plain, req(Op::Attach, 1, 3, 0, 0), &[]);
    let h = serve_ok(&plain, req(Op::Read, 1, 3, 0, 4096), &[]);
    assert_eq!(h.flags & (FLAG_TIERED | FLAG_SLOW | FLAG_HEATED), 0);
    assert!(matches!(
        plain.serve(&Frame::new(req(Op::TierSet, 1, 0, 1, 0), Bytes::new())),
        Err(Refusal(Status::Unsupported, _))
    ));
    // Heat for an untiered copy is harmless.
    serve_ok(&plain, req(Op::TierHeat, 1, 3, 0, 0), &heat);
}

mod barrier;
mod clones;
mod held;
mod io_threads;
mod resize;
mod schedule;
mod snapshots;
mod stuck;
