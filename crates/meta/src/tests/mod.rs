//! One conformance suite for every backend: memory, embedded (redb) and a real etcd server
//! started by the test on 127.0.0.1 (`etcd` from Debian's `etcd-server`; set
//! `TRIREME_SKIP_ETCD=1` to skip where it is not installed).

use std::sync::Arc;
use std::time::Duration;

mod events;
mod kv;
mod records;
mod regions;

use crate::kv::{MetaStore, Op, Txn};
use crate::{
    AliveRecord, AttachRecord, ClusterMeta, EmbeddedMeta, EtcdMeta, ManagerRecord, MetaError,
    NodeRecord, VolumeRecord,
};
use trireme_replication::ReplicaState;

/// A throwaway etcd server: one member on free 127.0.0.1 ports, killed on drop.
pub(crate) struct EtcdServer {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    pub url: String,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EtcdServer {
    pub(crate) fn start() -> Option<EtcdServer> {
        if std::env::var_os("TRIREME_SKIP_ETCD").is_some() {
            eprintln!("TRIREME_SKIP_ETCD set: etcd conformance skipped");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (c, p) = (trireme_testkit::port(), trireme_testkit::port());
        let url = format!("http://127.0.0.1:{c}");
        let child = std::process::Command::new("etcd")
            .args([
                "--name=t",
                &format!("--data-dir={}", dir.path().join("etcd").display()),
                &format!("--listen-client-urls={url}"),
                &format!("--advertise-client-urls={url}"),
                &format!("--listen-peer-urls=http://127.0.0.1:{p}"),
                &format!("--initial-advertise-peer-urls=http://127.0.0.1:{p}"),
                &format!("--initial-cluster=t=http://127.0.0.1:{p}"),
                "--log-level=error",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcd must be installed (apt-get install etcd-server) or TRIREME_SKIP_ETCD=1");
        Some(EtcdServer {
            child,
            _dir: dir,
            url,
        })
    }

    pub(crate) async fn connect(&self) -> EtcdMeta {
        let t0 = std::time::Instant::now();
        loop {
            if let Ok(m) = EtcdMeta::connect(std::slice::from_ref(&self.url), None).await {
                if m.range("/").await.is_ok() {
                    return m;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "etcd did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs the whole suite on one store.
async fn conformance(s: Arc<dyn MetaStore>) {
    kv::keys_and_revisions(&*s).await;
    kv::transactions(&*s).await;
    kv::leases(&*s).await;
    kv::watches(&*s).await;
    cluster_records(s.clone()).await;
    concurrent_updates(s).await;
}

fn node(id: u32) -> NodeRecord {
    NodeRecord {
        id,
        addr: format!("127.0.0.1:{}", 7000 + id),
        local_addr: None,
        store: "memory".into(),
        state: Default::default(),
        zone: None,
        http: None,
        iops_capacity: None,
    }
}

async fn cluster_records(s: Arc<dyn MetaStore>) {
    let m = ClusterMeta::new(s.clone());
    for id in [3, 1, 2] {
        m.put_node(&node(id)).await.unwrap();
    }
    assert_eq!(
        m.nodes()
            .await
            .unwrap()
            .iter()
            .map(|n| n.id)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let v = m.create_volume("vol0", 1 << 20, &[1, 2, 3]).await.unwrap();
    assert!(matches!(
        m.create_volume("vol0", 1, &[1]).await,
        Err(MetaError::VolumeExists(_))
    ));
    assert!(matches!(
        m.create_volume("bad name", 1, &[1]).await,
        Err(MetaError::BadName(_))
    ));
    let v2 = m.create_volume("vol1", 4096, &[2]).await.unwrap();
    assert_eq!(v2.id, v.id + 1);
    let u = m
        .update_volume("vol0", &mut |v| {
            v.replicas[1].state = ReplicaState::Outdated;
            v.epoch += 1;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!((u.epoch, u.replicas[1].state), (1, ReplicaState::Outdated));
    // A claim with no limit is kept (it once went unstored: the record skipped limits
    // that limited nothing).
    let claim = trireme_replication::qos::Limits {
        weight: Some(9),
        ..Default::default()
    };
    m.update_volume("vol1", &mut |v| {
        v.limits = claim;
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(m.volume("vol1").await.unwrap().limits, claim);
    let refused = m
        .update_volume("vol0", &mut |v| {
            v.epoch = 99;
            Err(MetaError::Refused("no".into()))
        })
        .await;
    assert!(matches!(refused, Err(MetaError::Refused(_))));
    assert_eq!(
        m.volume("vol0").await.unwrap().epoch,
        1,
        "a refused update writes nothing"
    );
    assert!(matches!(
        m.volume("nope").await,
        Err(MetaError::NoVolume(_))
    ));
    m.delete_volume("vol1").await.unwrap();
    let v3 = m.create_volume("vol1", 4096, &[2]).await.unwrap();
    assert!(v3.id > v2.id, "ids are never reused");
    assert_eq!(m.volumes().await.unwrap().len(), 2);
    // The trash keeps a deleted volume as it was, and gives it back under its name once the
    // name is free again.
    let before = m.volume("vol1").await.unwrap();
    let stale = VolumeRecord {
        epoch: before.epoch + 1,
        ..before.clone()
    };
    assert!(matches!(
        m.trash_volume(&stale, 1, 2, "").await,
        Err(MetaError::Refused(_))
    ));
    let t = m.trash_volume(&before, 10, 20, "admin").await.unwrap();
    assert_eq!((t.deleted_at, t.purge_at), (10, 20));
    assert!(matches!(
        m.volume("vol1").await,
        Err(MetaError::NoVolume(_))
    ));
    assert_eq!(m.trashed().await.unwrap(), vec![t]);
    let taken = m.create_volume("vol1", 4096, &[1]).await.unwrap();
    assert!(taken.id > before.id);
    assert!(matches!(
        m.restore_volume(before.id).await,
        Err(MetaError::VolumeExists(_))
    ));
    m.delete_volume("vol1").await.unwrap();
    assert_eq!(m.restore_volume(before.id).await.unwrap(), before);
    assert_eq!(m.volume("vol1").await.unwrap(), before);
    assert!(m.trashed().await.unwrap().is_empty());
    assert!(matches!(
        m.restore_volume(before.id).await,
        Err(MetaError::Refused(_))
    ));
    m.set_setting("store", "memory").await.unwrap();
    assert_eq!(m.setting("store").await.unwrap().as_deref(), Some("memory"));

    // One daemon per node id.
    let l1 = s.grant(Duration::from_secs(5)).await.unwrap();
    let l2 = s.grant(Duration::from_secs(5)).await.unwrap();
    let alive = |pid| AliveRecord {
        id: 7,
        addr: "127.0.0.1:1".into(),
        host: "h".into(),
        pid,
    };
    m.register_alive(&alive(1), &node(7), l1).await.unwrap();
    let twice = m.register_alive(&alive(2), &node(7), l2).await;
    assert!(
        matches!(&twice, Err(MetaError::Refused(m)) if m.contains("pid 1")),
        "{twice:?}"
    );
    assert_eq!(m.alive().await.unwrap()[&7].pid, 1);
    s.revoke(l1).await.unwrap();
    assert!(!m.alive().await.unwrap().contains_key(&7));
    m.register_alive(&alive(2), &node(7), l2).await.unwrap();

    // The manager role: one holder; a deposed one writes nothing.
    let rec = |node| ManagerRecord {
        node,
        control: "127.0.0.1:1".into(),
        host: "h".into(),
        pid: 1,
        http: None,
    };
    let la = s.grant(Duration::from_secs(5)).await.unwrap();
    let lb = s.grant(Duration::from_secs(5)).await.unwrap();
    assert!(m.campaign(&rec(1), la).await.unwrap());
    assert!(!m.campaign(&rec(2), lb).await.unwrap());
    let ma = m.fenced(la);
    let mb = m.fenced(lb);
    ma.put_node(&node(8)).await.unwrap();
    assert!(matches!(
        mb.put_node(&node(9)).await,
        Err(MetaError::Deposed(_))
    ));
    assert!(matches!(
        mb.update_volume("vol0", &mut |v| {
            v.epoch += 1;
            Ok(())
        })
        .await,
        Err(MetaError::Deposed(_))
    ));
    s.revoke(la).await.unwrap();
    assert!(matches!(
        ma.put_node(&node(8)).await,
        Err(MetaError::Deposed(_))
    ));
    assert!(m.campaign(&rec(2), lb).await.unwrap());
    mb.put_node(&node(9)).await.unwrap();
    assert_eq!(m.manager().await.unwrap().unwrap().0.node, 2);

    // Attach: a new epoch, one holder unless forced, unclean when not detached.
    let w1 = s.grant(Duration::from_secs(5)).await.unwrap();
    let w2 = s.grant(Duration::from_secs(5)).await.unwrap();
    let arec = AttachRecord {
        epoch: 0,
        host: "h".into(),
        pid: 1,
        exports: vec![],
        identity: None,
    };
    let (a1, unclean) = m.attach("vol0", &arec, w1, false).await.unwrap();
    assert_eq!((a1.epoch, unclean, a1.writer_open), (2, false, true));
    assert!(matches!(
        m.attach("vol0", &arec, w2, false).await,
        Err(MetaError::Attached {
            epoch: 2,
            force_fences: true,
            ..
        })
    ));
    let (a2, unclean) = m.attach("vol0", &arec, w2, true).await.unwrap();
    assert_eq!(
        (a2.epoch, unclean),
        (3, true),
        "forced: the first writer never detached"
    );
    assert_eq!(m.attachment("vol0").await.unwrap().unwrap().0.epoch, 3);
    // A writer whose lease was lost puts its record back, unless a newer writer attached.
    let w3 = s.grant(Duration::from_secs(5)).await.unwrap();
    let mine = AttachRecord {
        epoch: 3,
        ..arec.clone()
    };
    m.reattach("vol0", &mine, w3).await.unwrap();
    assert_eq!(m.attachment("vol0").await.unwrap().unwrap().1.lease, w3);
    s.revoke(w3).await.unwrap();
    assert!(
        m.attachment("vol0").await.unwrap().is_none(),
        "gone with its lease"
    );
    let w4 = s.grant(Duration::from_secs(5)).await.unwrap();
    m.reattach("vol0", &mine, w4).await.unwrap();
    assert_eq!(m.attachment("vol0").await.unwrap().unwrap().1.lease, w4);
    let stale = AttachRecord {
        epoch: 2,
        ..arec.clone()
    };
    assert!(matches!(
        m.reattach("vol0", &stale, w4).await,
        Err(MetaError::Attached { epoch: 3, .. })
    ));
    m.release_attachment("vol0", 2).await.unwrap();
    assert!(
        m.attachment("vol0").await.unwrap().is_some(),
        "a stale epoch releases nothing"
    );
    // A change while no writer holds it (`node lost`): refused while one does, and it
    // fences the last one (no reattach at its epoch after it).
    let lost = |v: &mut VolumeRecord| {
        v.replicas[2].state = ReplicaState::Failed;
        Ok(())
    };
    assert!(matches!(
        m.update_unattached("vol0", &mut lost.clone()).await,
        Err(MetaError::Attached { epoch: 3, .. })
    ));
    m.release_attachment("vol0", 3).await.unwrap();
    assert!(m.attachment("vol0").await.unwrap().is_none());
    let u = m
        .update_unattached("vol0", &mut lost.clone())
        .await
        .unwrap();
    assert_eq!((u.epoch, u.replicas[2].state), (4, ReplicaState::Failed));
    let w5 = s.grant(Duration::from_secs(5)).await.unwrap();
    assert!(
        m.reattach("vol0", &mine, w5).await.is_err(),
        "the writer of epoch 3 is fenced"
    );
    s.revoke(w5).await.unwrap();

    // Move requests: created only if absent, updated only at the revision read.
    let req = crate::MoveRequest {
        from: 1,
        to: 4,
        rate: None,
        epoch: 3,
        state: crate::MoveRequestState::Asked,
        progress: None,
        error: None,
    };
    let r1 = m.put_move_request("vol0", &req, 0).await.unwrap().unwrap();
    assert!(m.put_move_request("vol0", &req, 0).await.unwrap().is_none());
    let taken = crate::MoveRequest {
        state: crate::MoveRequestState::Copying,
        ..req.clone()
    };
    let r2 = m
        .put_move_request("vol0", &taken, r1)
        .await
        .unwrap()
        .unwrap();
    assert!(m
        .put_move_request("vol0", &req, r1)
        .await
        .unwrap()
        .is_none());
    assert_eq!(m.move_request("vol0").await.unwrap(), Some((taken, r2)));
    m.delete_move_request("vol0").await.unwrap();
    assert_eq!(m.move_request("vol0").await.unwrap(), None);

    // Take-out requests (planned restarts) take turns the same way.
    let ask = crate::TakeOutRequest {
        node: 2,
        epoch: 3,
        state: crate::TakeOutState::Asked,
        error: None,
        resynced_bytes: 0,
        full: false,
    };
    let r1 = m.put_takeout("vol0", &ask, 0).await.unwrap().unwrap();
    assert!(m.put_takeout("vol0", &ask, 0).await.unwrap().is_none());
    let out = crate::TakeOutRequest {
        state: crate::TakeOutState::Out,
        ..ask.clone()
    };
    let r2 = m.put_takeout("vol0", &out, r1).await.unwrap().unwrap();
    assert!(m.put_takeout("vol0", &ask, r1).await.unwrap().is_none());
    assert_eq!(m.takeout("vol0").await.unwrap(), Some((out, r2)));
    m.delete_takeout("vol0").await.unwrap();
    assert_eq!(m.takeout("vol0").await.unwrap(), None);

    // A restart order, and the lease a daemon registered under.
    assert_eq!(m.alive_lease(7).await.unwrap(), Some(l2));
    assert_eq!(m.alive_lease(99).await.unwrap(), None);
    let order = crate::RestartOrder { node: 7, lease: l2 };
    m.put_restart_order(&order).await.unwrap();
    assert_eq!(m.restart_order(7).await.unwrap(), Some(order));
    m.delete_restart_order(7).await.unwrap();
    assert_eq!(m.restart_order(7).await.unwrap(), None);

    // Resigning gives the manager role up only for the lease that holds it.
    if let Some((_, kv)) = m.manager().await.unwrap() {
        m.resign(kv.lease + 1).await.unwrap();
        assert!(m.manager().await.unwrap().is_some());
        m.resign(kv.lease).await.unwrap();
        assert!(m.manager().await.unwrap().is_none());
    }
    for l in [l2, lb, w1, w2, w4] {
        s.revoke(l).await.unwrap();
    }
    events::events(&m).await;
}

/// Two writers changing one volume at once never lose an update.
async fn concurrent_updates(s: Arc<dyn MetaStore>) {
    let m = ClusterMeta::new(s);
    m.create_volume("race", 4096, &[1]).await.unwrap();
    let bump = |m: ClusterMeta| async move {
        for _ in 0..20 {
            m.update_volume("race", &mut |v| {
                v.epoch += 1;
                Ok(())
            })
            .await
            .unwrap();
        }
    };
    let (a, b) = (tokio::spawn(bump(m.clone())), tokio::spawn(bump(m.clone())));
    a.await.unwrap();
    b.await.unwrap();
    assert_eq!(m.volume("race").await.unwrap().epoch, 40);
}

#[test]
fn memory_backend_conforms() {
    rt().block_on(conformance(Arc::new(EmbeddedMeta::in_memory())));
}

#[test]
fn embedded_backend_conforms_and_persists() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("meta.redb");
    rt().block_on(async {
        let s = Arc::new(EmbeddedMeta::open(&p).unwrap());
        conformance(s.clone()).await;
        let l = s.grant(Duration::from_secs(60)).await.unwrap();
        s.txn(Txn::when(vec![]).then(vec![Op::put_leased("/t/p/leased", "x", l)]))
            .await
            .unwrap();
    });
    rt().block_on(async {
        let s = Arc::new(EmbeddedMeta::open(&p).unwrap());
        let m = ClusterMeta::new(s.clone());
        assert_eq!(m.volume("vol0").await.unwrap().epoch, 4);
        assert_eq!(m.setting("store").await.unwrap().as_deref(), Some("memory"));
        assert_eq!(
            s.get("/t/p/leased").await.unwrap(),
            None,
            "leases end with the process"
        );
        // Revisions go on from where they were.
        let before = s.get("/t/kr/a").await.unwrap().unwrap().mod_revision;
        let r = s
            .txn(Txn::when(vec![]).then(vec![Op::put("/t/kr/a", "4")]))
            .await
            .unwrap();
        assert!(r.revision > before);
    });
}

#[test]
fn etcd_backend_conforms() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    rt().block_on(async {
        let s = Arc::new(server.connect().await);
        conformance(s.clone()).await;
        kv::compaction(&*s).await;
    });
}

#[test]
fn etcd_unreachable_is_an_error_not_a_hang() {
    rt().block_on(async {
        let port = trireme_testkit::port();
        let t0 = std::time::Instant::now();
        let r = match EtcdMeta::connect(&[format!("http://127.0.0.1:{port}")], None).await {
            Ok(m) => m.range("/").await.map(|_| ()),
            Err(e) => Err(e),
        };
        assert!(matches!(r, Err(MetaError::Unavailable(_))), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    });
}

#[test]
fn bad_endpoints_are_refused() {
    assert!(crate::parse_endpoints("").is_err());
    assert!(crate::parse_endpoints("ftp://a:1").is_err());
    assert!(crate::parse_endpoints("a:notaport").is_err());
    assert_eq!(
        crate::parse_endpoints("a:1, http://b:2").unwrap(),
        ["http://a:1", "http://b:2"]
    );
    assert_eq!(
        crate::parse_endpoints("https://a:1").unwrap(),
        ["https://a:1"]
    );
    // TLS endpoints need an identity; plain and TLS ones do not mix.
    rt().block_on(async {
        let e = |eps: &[&str]| eps.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let r = EtcdMeta::connect(&e(&["https://127.0.0.1:1"]), None).await;
        assert!(
            matches!(r, Err(MetaError::BadEndpoints(ref w)) if w.contains("TLS identity")),
            "{r:?}"
        );
        let tls = crate::EtcdTls {
            ca_pem: vec![],
            cert_pem: vec![],
            key_pem: vec![],
        };
        let r = EtcdMeta::connect(
            &e(&["https://127.0.0.1:1", "http://127.0.0.1:2"]),
            Some(&tls),
        )
        .await;
        assert!(
            matches!(r, Err(MetaError::BadEndpoints(ref w)) if w.contains("mixed")),
            "{r:?}"
        );
    });
}

#[test]
fn corrupt_embedded_records_are_reported() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("meta.redb");
    rt().block_on(async {
        let s = Arc::new(EmbeddedMeta::open(&p).unwrap());
        s.txn(Txn::when(vec![]).then(vec![Op::put(crate::cluster::key("volumes/v"), "{not json")]))
            .await
            .unwrap();
        s.txn(Txn::when(vec![]).then(vec![Op::put(crate::cluster::key("layouts/v"), "{}")]))
            .await
            .unwrap();
        let m = ClusterMeta::new(s);
        assert!(matches!(
            m.volume("v").await,
            Err(MetaError::Corrupt { .. })
        ));
    });
}
