//! Records one client or one bad key could spoil for the whole cluster: writer reports and
//! volume layouts.

use super::*;

#[test]
fn a_report_counts_only_from_the_writer_of_record() {
    rt().block_on(async {
        let s: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::in_memory());
        let m = ClusterMeta::new(s.clone());
        m.put_node(&node(1)).await.unwrap();
        m.create_volume("v", 1 << 20, &[1]).await.unwrap();
        let lease = s.grant(Duration::from_secs(30)).await.unwrap();
        let rec = AttachRecord {
            epoch: 0,
            host: "h".into(),
            pid: 1,
            exports: vec![],
            identity: Some("client alice".into()),
        };
        let (v, _) = m.attach("v", &rec, lease, false).await.unwrap();
        let report = |suspended| crate::WriterReport {
            epoch: v.epoch,
            replicas: vec![],
            writes_suspended: suspended,
            scrub: None,
            io: None,
            http: None,
            links: vec![],
        };
        // Carol, on the access list but not the writer, writes a report of her own: unread.
        m.put_report("v", Some("carol"), &report(true), 0)
            .await
            .unwrap();
        assert_eq!(m.report("v").await.unwrap(), None);
        m.put_report("v", Some("alice"), &report(false), 0)
            .await
            .unwrap();
        assert_eq!(m.report("v").await.unwrap(), Some(report(false)));
        // A report of another epoch, or too large, or not JSON, is not read either.
        let stale = crate::WriterReport {
            epoch: v.epoch + 1,
            ..report(true)
        };
        m.put_report("v", Some("alice"), &stale, 0).await.unwrap();
        assert_eq!(m.report("v").await.unwrap(), None);
        s.txn(Txn::when(vec![]).then(vec![Op::put(
            ClusterMeta::report_key_of("v", Some("alice")),
            vec![b' '; crate::cluster::MAX_REPORT + 1],
        )]))
        .await
        .unwrap();
        assert_eq!(m.reports().await.unwrap(), vec![]);
        let big = crate::WriterReport {
            http: Some("x".repeat(crate::cluster::MAX_REPORT)),
            ..report(false)
        };
        assert!(m.put_report("v", Some("alice"), &big, 0).await.is_err());
    });
}

#[test]
fn one_bad_layout_hides_only_its_volume() {
    rt().block_on(async {
        let s: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::in_memory());
        let m = ClusterMeta::new(s.clone());
        m.put_node(&node(1)).await.unwrap();
        m.create_volume("a", 4096, &[1]).await.unwrap();
        m.create_volume("b", 4096, &[1]).await.unwrap();
        s.txn(Txn::when(vec![]).then(vec![Op::put(crate::cluster::key("layouts/a"), "not json")]))
            .await
            .unwrap();
        let names: Vec<String> = m
            .volumes()
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["b"]);
        let (_, bad) = m.volumes_checked().await.unwrap();
        assert_eq!(bad.len(), 1);
        assert!(bad[0].to_string().contains("layouts/a"), "{}", bad[0]);
    });
}

#[test]
fn one_bad_node_record_hides_only_its_node() {
    rt().block_on(async {
        let s: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::in_memory());
        let m = ClusterMeta::new(s.clone());
        m.put_node(&node(1)).await.unwrap();
        m.put_node(&node(2)).await.unwrap();
        s.txn(Txn::when(vec![]).then(vec![Op::put(crate::cluster::key("nodes/2"), "{}")]))
            .await
            .unwrap();
        let ids: Vec<u32> = m.nodes().await.unwrap().into_iter().map(|n| n.id).collect();
        assert_eq!(ids, [1]);
    });
}
