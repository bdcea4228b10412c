//! The key-value store's primitives in every backend: keys and revisions, transactions,
//! leases, watches, compaction (run from the conformance suite).

use std::time::Duration;

use crate::kv::{CmpOp, Compare, MetaStore, Op, Target, Txn};
use crate::MetaError;

pub(super) async fn keys_and_revisions(s: &dyn MetaStore) {
    let k = "/t/kr/a";
    assert_eq!(s.get(k).await.unwrap(), None);
    let r1 = s
        .txn(Txn::when(vec![]).then(vec![Op::put(k, "1")]))
        .await
        .unwrap();
    let a = s.get(k).await.unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.version), (&b"1"[..], 1));
    assert_eq!(a.create_revision, r1.revision);
    assert_eq!(a.mod_revision, r1.revision);
    let r2 = s
        .txn(Txn::when(vec![]).then(vec![Op::put(k, "2")]))
        .await
        .unwrap();
    assert!(r2.revision > r1.revision);
    let b = s.get(k).await.unwrap().unwrap();
    assert_eq!(
        (b.version, b.create_revision, b.mod_revision),
        (2, r1.revision, r2.revision)
    );
    // Reads take no revision.
    let r3 = s
        .txn(Txn::when(vec![]).then(vec![Op::get(k)]))
        .await
        .unwrap();
    assert_eq!(
        r3.revision, r2.revision,
        "a read-only transaction takes no revision"
    );
    // Delete then put starts the key over.
    s.txn(Txn::when(vec![]).then(vec![Op::delete(k)]))
        .await
        .unwrap();
    assert_eq!(s.get(k).await.unwrap(), None);
    let r4 = s
        .txn(Txn::when(vec![]).then(vec![Op::put(k, "3")]))
        .await
        .unwrap();
    let c = s.get(k).await.unwrap().unwrap();
    assert_eq!((c.version, c.create_revision), (1, r4.revision));
    // Range by prefix, in key order, not beyond it.
    s.txn(Txn::when(vec![]).then(vec![Op::put("/t/kr/b", "x"), Op::put("/t/kr0", "y")]))
        .await
        .unwrap();
    let (kvs, rev) = s.range("/t/kr/").await.unwrap();
    let keys: Vec<&str> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["/t/kr/a", "/t/kr/b"]);
    assert!(rev >= r4.revision);
}

pub(super) async fn transactions(s: &dyn MetaStore) {
    let k = "/t/tx/k";
    // Create only if absent: the first wins, the second sees the winner.
    let t = || {
        Txn::when(vec![Compare::absent(k)])
            .then(vec![Op::put(k, "first")])
            .otherwise(vec![Op::get(k)])
    };
    assert!(s.txn(t()).await.unwrap().succeeded);
    let lost = s.txn(t()).await.unwrap();
    assert!(!lost.succeeded);
    assert_eq!(lost.gets[0].as_ref().unwrap().value, b"first");
    // Compare-and-put on mod_revision: a stale revision changes nothing.
    let cur = s.get(k).await.unwrap().unwrap();
    let stale = s
        .txn(
            Txn::when(vec![Compare::mod_revision(k, cur.mod_revision - 1)])
                .then(vec![Op::put(k, "x")]),
        )
        .await
        .unwrap();
    assert!(!stale.succeeded);
    let ok = s
        .txn(
            Txn::when(vec![Compare::mod_revision(k, cur.mod_revision)])
                .then(vec![Op::put(k, "second")]),
        )
        .await
        .unwrap();
    assert!(ok.succeeded);
    // Value and version compares, and the operators.
    let v = |op, t| Compare {
        key: k.into(),
        op,
        target: t,
    };
    for (c, want) in [
        (v(CmpOp::Equal, Target::Value(b"second".to_vec())), true),
        (v(CmpOp::NotEqual, Target::Value(b"second".to_vec())), false),
        (v(CmpOp::Greater, Target::Version(1)), true),
        (v(CmpOp::Less, Target::Version(1)), false),
        (v(CmpOp::Equal, Target::Lease(0)), true),
        (
            Compare {
                key: "/t/tx/absent".into(),
                op: CmpOp::NotEqual,
                target: Target::Value(b"z".to_vec()),
            },
            false,
        ),
    ] {
        let r = s.txn(Txn::when(vec![c.clone()])).await.unwrap();
        assert_eq!(r.succeeded, want, "{c:?}");
    }
    // All ops of a branch land together.
    let r = s
        .txn(Txn::when(vec![]).then(vec![Op::put("/t/tx/a", "1"), Op::put("/t/tx/b", "2")]))
        .await
        .unwrap();
    let a = s.get("/t/tx/a").await.unwrap().unwrap();
    let b = s.get("/t/tx/b").await.unwrap().unwrap();
    assert_eq!((a.mod_revision, b.mod_revision), (r.revision, r.revision));
}

pub(super) async fn leases(s: &dyn MetaStore) {
    let l = s.grant(Duration::from_secs(2)).await.unwrap();
    assert_ne!(l, 0);
    s.txn(Txn::when(vec![]).then(vec![Op::put_leased("/t/l/a", "x", l)]))
        .await
        .unwrap();
    assert_eq!(s.get("/t/l/a").await.unwrap().unwrap().lease, l);
    assert!(
        s.txn(Txn::when(vec![Compare::lease("/t/l/a", l)]))
            .await
            .unwrap()
            .succeeded
    );
    assert!(s.keep_alive(l).await.unwrap());
    // Revoke deletes the key.
    s.revoke(l).await.unwrap();
    assert_eq!(s.get("/t/l/a").await.unwrap(), None);
    assert!(!s.keep_alive(l).await.unwrap());
    // A put bound to a dead lease fails whole, changing nothing.
    let r = s
        .txn(Txn::when(vec![]).then(vec![
            Op::put("/t/l/b", "y"),
            Op::put_leased("/t/l/c", "z", l),
        ]))
        .await;
    assert!(matches!(r, Err(MetaError::NoLease(_))), "{r:?}");
    assert_eq!(s.get("/t/l/b").await.unwrap(), None);
    // Expiry without refresh (etcd may round a short TTL up to its minimum).
    let l2 = s.grant(Duration::from_secs(1)).await.unwrap();
    s.txn(Txn::when(vec![]).then(vec![Op::put_leased("/t/l/d", "x", l2)]))
        .await
        .unwrap();
    let t0 = tokio::time::Instant::now();
    while s.get("/t/l/d").await.unwrap().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Refreshed, it outlives its TTL.
    let l3 = s.grant(Duration::from_secs(2)).await.unwrap();
    s.txn(Txn::when(vec![]).then(vec![Op::put_leased("/t/l/e", "x", l3)]))
        .await
        .unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(s.keep_alive(l3).await.unwrap());
    }
    assert!(
        s.get("/t/l/e").await.unwrap().is_some(),
        "a refreshed lease expired"
    );
    s.revoke(l3).await.unwrap();
}

pub(super) async fn watches(s: &dyn MetaStore) {
    let (_, rev0) = s.range("/t/w/").await.unwrap();
    let mut w = s.watch("/t/w/", 0).await.unwrap();
    s.txn(Txn::when(vec![]).then(vec![Op::put("/t/w/a", "1")]))
        .await
        .unwrap();
    s.txn(Txn::when(vec![]).then(vec![Op::put("/t/other", "1")]))
        .await
        .unwrap();
    s.txn(Txn::when(vec![]).then(vec![Op::put("/t/w/b", "2"), Op::put("/t/w/a", "3")]))
        .await
        .unwrap();
    let d = s
        .txn(Txn::when(vec![]).then(vec![Op::delete("/t/w/a")]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let e = tokio::time::timeout(Duration::from_secs(5), w.recv())
            .await
            .expect("watch event in time")
            .expect("watch open");
        seen.push((
            e.kv.key.clone(),
            e.kv.value.clone(),
            e.deleted,
            e.kv.mod_revision,
        ));
    }
    let names: Vec<(&str, bool)> = seen.iter().map(|(k, _, d, _)| (k.as_str(), *d)).collect();
    assert_eq!(names[0], ("/t/w/a", false));
    assert!(names[1..3].contains(&("/t/w/b", false)) && names[1..3].contains(&("/t/w/a", false)));
    assert_eq!(names[3], ("/t/w/a", true));
    assert_eq!(seen[3].3, d.revision, "a delete carries its revision");
    assert!(
        seen.windows(2).all(|p| p[0].3 <= p[1].3),
        "in revision order"
    );
    // From a past revision: the same history again.
    let mut again = s.watch("/t/w/", rev0 + 1).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), again.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.kv.key.as_str(), first.kv.value.as_slice()),
        ("/t/w/a", &b"1"[..])
    );
    // Lease expiry is seen as a delete.
    let l = s.grant(Duration::from_secs(1)).await.unwrap();
    s.txn(Txn::when(vec![]).then(vec![Op::put_leased("/t/w/l", "x", l)]))
        .await
        .unwrap();
    s.revoke(l).await.unwrap();
    let mut got = false;
    for _ in 0..4 {
        match tokio::time::timeout(Duration::from_secs(5), w.recv()).await {
            Ok(Some(e)) if e.kv.key == "/t/w/l" && e.deleted => {
                got = true;
                break;
            }
            Ok(Some(_)) => continue,
            _ => break,
        }
    }
    assert!(got, "a revoked lease's key is seen deleted");
}

/// History before a compacted revision is gone (a watch from it fails); compacting there
/// again is no error; a healthy etcd raises no alarm.
pub(super) async fn compaction(s: &dyn MetaStore) {
    for i in 0..10 {
        s.txn(Txn::when(vec![]).then(vec![Op::put("/c/k", format!("{i}"))]))
            .await
            .unwrap();
    }
    let (_, rev) = s.range("/c/").await.unwrap();
    s.compact(rev).await.unwrap();
    s.compact(rev - 5).await.unwrap();
    assert!(
        s.watch("/c/", rev - 5).await.is_err() || {
            // etcd may accept the watch and cancel it at once: no old event arrives.
            let mut w = s.watch("/c/", rev - 5).await.unwrap();
            tokio::time::timeout(Duration::from_millis(500), w.recv())
                .await
                .map_or(true, |e| e.is_none())
        }
    );
    assert_eq!(s.alarms().await.unwrap(), Vec::<String>::new());
}
