//! The node's I/O threads (`io_threads.rs`): reads and writes of a blocking store run on a
//! bounded set of threads; everything else does not queue behind them.

use super::stuck::{release, wait_stuck, Stuck};
use super::*;

/// With every I/O thread holding a stuck write, a read waits for one of them (the node has
/// at most that many I/Os on its disk), while a flush and a snapshot listing, which run
/// elsewhere, are answered; once released, everything completes, and the writes ran on the
/// node's own threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_share_a_bounded_set_of_threads_that_nothing_else_waits_for() {
    let store = Arc::new(Stuck::default());
    let state = store.state.clone();
    let (node, conn) = start(store).await;
    node.set_io_threads(2);
    let conn = Arc::new(conn);
    let ok = |f: Frame| assert_eq!(f.header.status, Status::Ok, "{f:?}");
    ok(conn
        .call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), Bytes::new())
        .await
        .unwrap());
    ok(conn
        .call(req(Op::Attach, 1, 4, 0, 0), Bytes::new())
        .await
        .unwrap());
    let stuck: Vec<_> = (0..2u64)
        .map(|i| {
            let c = conn.clone();
            tokio::spawn(async move {
                c.call(
                    req(Op::Write, 1, 4, i * 4096, 0),
                    Bytes::from_static(b"slow"),
                )
                .await
            })
        })
        .collect();
    wait_stuck(&state, 2).await;
    let c = conn.clone();
    let read =
        tokio::spawn(async move { c.call(req(Op::Read, 1, 4, 8192, 4096), Bytes::new()).await });
    // Every outcome is taken before the writes are released, and checked after: a failed
    // check with writes still stuck would hang the runtime's shutdown.
    let timely = std::time::Duration::from_secs(10);
    let flush =
        tokio::time::timeout(timely, conn.call(req(Op::Flush, 1, 4, 0, 0), Bytes::new())).await;
    let list = tokio::time::timeout(
        timely,
        conn.call(req(Op::SnapshotList, 1, 0, 0, 0), Bytes::new()),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let early = read.is_finished();
    release(&state);
    ok(flush
        .expect("a flush waited behind the stuck writes")
        .unwrap());
    ok(list
        .expect("a snapshot listing waited behind the stuck writes")
        .unwrap());
    assert!(
        !early,
        "a read ran beside two stuck writes on two I/O threads"
    );
    for w in stuck {
        ok(w.await.unwrap().unwrap());
    }
    let r = read.await.unwrap().unwrap();
    ok(r.clone());
    assert_eq!(&r.payload[..], &[0u8; 4096][..]);
    let threads = state.0.lock().unwrap().threads.clone();
    assert_eq!(threads, HashSet::from(["node7-io".to_string()]));
}
