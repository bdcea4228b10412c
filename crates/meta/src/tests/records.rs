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
            throttled_seconds: 0.0,
            units_per_s: 0.0,
            overlay_blocks: Some(7),
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

#[test]
fn an_nvmf_port_id_is_held_by_one_process_and_goes_with_its_lease() {
    rt().block_on(async {
        let s: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::in_memory());
        let m = ClusterMeta::new(s.clone());
        let (a, b) = (
            s.grant(Duration::from_secs(30)).await.unwrap(),
            s.grant(Duration::from_secs(30)).await.unwrap(),
        );
        let rec = |pid, port_id| crate::NvmfExportRecord {
            volume: "v".into(),
            port_id,
            addr: "10.0.0.1:4420".into(),
            nqn: "nqn.2026-12.io.trireme:c:v".into(),
            host: "h".into(),
            pid,
            ana: "inaccessible".into(),
            hosts: vec![],
            more_hosts: 0,
            identity: None,
        };
        assert_eq!(m.put_nvmf_export(&rec(1, 1), a).await.unwrap(), None);
        // Another process asking for the same port id is told who holds it, and writes nothing.
        assert_eq!(
            m.put_nvmf_export(&rec(2, 1), b).await.unwrap(),
            Some(rec(1, 1))
        );
        assert_eq!(m.put_nvmf_export(&rec(2, 2), b).await.unwrap(), None);
        // Its holder updates it.
        let optimized = crate::NvmfExportRecord {
            ana: "optimized".into(),
            hosts: vec!["nqn.2014-08.org.nvmexpress:uuid:h1".into()],
            ..rec(1, 1)
        };
        assert_eq!(m.put_nvmf_export(&optimized, a).await.unwrap(), None);
        assert_eq!(
            m.nvmf_exports_of("v").await.unwrap(),
            vec![optimized, rec(2, 2)]
        );
        // Its process gone (the lease revoked), the port id is free again.
        s.revoke(a).await.unwrap();
        assert_eq!(m.nvmf_exports().await.unwrap(), vec![rec(2, 2)]);
        assert_eq!(m.put_nvmf_export(&rec(3, 1), b).await.unwrap(), None);
        // Records out of bounds are refused by their check.
        assert!(rec(1, 0).check().is_err());
        assert!(crate::NvmfExportRecord {
            ana: "fast".into(),
            ..rec(1, 1)
        }
        .check()
        .is_err());
        let crowd = crate::NvmfExportRecord {
            hosts: vec!["nqn.x".into(); crate::MAX_EXPORT_HOSTS + 1],
            ..rec(1, 1)
        };
        assert!(crowd.check().is_err());
        assert!(rec(1, 1).check().is_ok());
    });
}

/// A QoS policy: created once under its name, changed only from the revision read, deleted;
/// a volume's place under one is kept in its layout and gives its writer the lower limits.
#[test]
fn qos_policies_and_a_volumes_share_of_one() {
    use trireme_replication::qos::Limits;
    rt().block_on(async {
        let m = ClusterMeta::new(Arc::new(EmbeddedMeta::in_memory()));
        m.put_node(&node(1)).await.unwrap();
        let iops = |n| Limits {
            iops: Some(n),
            ..Limits::default()
        };
        let mut p = crate::QosPolicy {
            name: "gold".into(),
            limits: iops(1000),
            aggregated: true,
        };
        m.put_qos_policy(&p, 0).await.unwrap();
        assert!(matches!(
            m.put_qos_policy(&p, 0).await,
            Err(MetaError::Refused(_))
        ));
        for bad in ["none", "a/b", ""] {
            let q = crate::QosPolicy {
                name: bad.into(),
                ..p.clone()
            };
            assert!(m.put_qos_policy(&q, 0).await.is_err(), "{bad:?}");
        }
        let zero = crate::QosPolicy {
            name: "zero".into(),
            limits: iops(0),
            aggregated: false,
        };
        assert!(m.put_qos_policy(&zero, 0).await.is_err());
        let (read, rev) = m.qos_policy("gold").await.unwrap();
        assert_eq!(read, p);
        p.limits = iops(2000);
        m.put_qos_policy(&p, rev).await.unwrap();
        // A change from a revision no longer current is refused.
        assert!(m.put_qos_policy(&p, rev).await.is_err());
        assert_eq!(m.qos_policies().await.unwrap(), vec![p.clone()]);

        m.create_volume("v", 1 << 20, &[1]).await.unwrap();
        let v = m
            .update_volume("v", &mut |v| {
                v.limits = iops(300);
                v.qos = Some(crate::PolicyShare {
                    policy: "gold".into(),
                    limits: iops(500),
                });
                Ok(())
            })
            .await
            .unwrap();
        let back = m.volume("v").await.unwrap();
        assert_eq!(back.qos, v.qos);
        assert_eq!(back.limits_in_force(), iops(300));

        let (_, rev) = m.qos_policy("gold").await.unwrap();
        m.delete_qos_policy("gold", rev).await.unwrap();
        assert!(m.qos_policy("gold").await.is_err());
        assert!(m.qos_policies().await.unwrap().is_empty());
    });
}
