//! The attach barrier (`serve.rs`, `io_replica`): a store whose writes stall until released
//! (`stuck.rs`) stands for a write stuck in a device.

use super::stuck::{release, wait_stuck, Stuck};
use super::*;

/// A writer that gave up on a write (it timed out in the device) and attached again from a
/// new connection gets the attach's answer only once that write has finished: the retry it
/// sends next, and any newer write in the same place, cannot be overtaken by the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_waits_for_the_writes_admitted_before_it() {
    let store = Arc::new(Stuck::default());
    let state = store.state.clone();
    let (node, old) = start(store).await;
    let ok = |f: Frame| assert_eq!(f.header.status, Status::Ok, "{f:?}");
    ok(old
        .call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), Bytes::new())
        .await
        .unwrap());
    ok(old
        .call(req(Op::Attach, 1, 4, 0, 0), Bytes::new())
        .await
        .unwrap());
    let old = Arc::new(old);
    let o = old.clone();
    let stuck = tokio::spawn(async move {
        o.call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"slow"))
            .await
    });
    // The old write is in the store, stuck.
    wait_stuck(&state, 1).await;
    let addr = old.info().peer.to_string();
    let new = TcpConnection::connect(&addr, 1).await.unwrap();
    let attach = tokio::spawn(async move {
        let f = new.call(req(Op::Attach, 1, 4, 0, 0), Bytes::new()).await;
        (new, f)
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let early = attach.is_finished();
    release(&state);
    assert!(
        !early,
        "the attach answered while a write admitted before it was still in the store"
    );
    let (new, f) = attach.await.unwrap();
    ok(f.unwrap());
    ok(stuck.await.unwrap().unwrap());
    ok(new
        .call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"new!"))
        .await
        .unwrap());
    let late = old
        .call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"late"))
        .await
        .unwrap();
    assert_eq!(late.header.status, Status::Superseded);
    let r = node.replica(1).unwrap_or_else(|_| panic!("replica"));
    let mut b = [0u8; 4];
    r.read(0, &mut b).unwrap();
    assert_eq!(&b, b"new!");
}
