//! A parity volume's region records: fenced by the writer's epoch and the volume's id,
//! grouped, and gone with the volume.

use super::*;
use trireme_replication::Region;

/// Volume "p", made a 2+1 parity volume of `size` bytes (creation offers no parity yet:
/// its spec is written as `volume create --parity` will), attached: its id and epoch.
async fn parity_volume(s: &Arc<dyn MetaStore>, m: &ClusterMeta, size: u64) -> (u64, u64) {
    for n in 1..=3 {
        m.put_node(&node(n)).await.unwrap();
    }
    let v = m.create_volume("p", size, &[1, 2, 3]).await.unwrap();
    let spec = format!(
        r#"{{"id":{},"name":"p","size":{size},"layout":{{"kind":"parity","data":2,"parity":1,"mirror_share":20}}}}"#,
        v.id
    );
    s.txn(Txn::when(vec![]).then(vec![Op::put(crate::cluster::key("volumes/p"), spec)]))
        .await
        .unwrap();
    let lease = s.grant(Duration::from_secs(30)).await.unwrap();
    let rec = AttachRecord {
        epoch: 0,
        host: "h".into(),
        pid: 1,
        exports: vec![],
        identity: None,
    };
    let (v, _) = m.attach("p", &rec, lease, false).await.unwrap();
    (v.id, v.epoch)
}

#[test]
fn a_region_switches_for_the_writer_of_record_only() {
    rt().block_on(async {
        let s: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::in_memory());
        let m = ClusterMeta::new(s.clone());
        // 3 GiB: 6144 regions of 512 KiB, two groups.
        let (id, epoch) = parity_volume(&s, &m, 3 << 30).await;
        assert_eq!(m.regions(id).await.unwrap(), vec![]);
        let p0 = Region::Parity { slot: 0 };
        let p1 = Region::Parity { slot: 1 };
        m.record_region("p", id, epoch, 1, p0).await.unwrap();
        m.record_region("p", id, epoch, 5000, p1).await.unwrap();
        let r = m.regions(id).await.unwrap();
        assert_eq!(
            (r.len(), r[0], r[1], r[2], r[5000]),
            (5001, Region::Mirror, p0, Region::Mirror, p1)
        );
        // Refused, and nothing written: a superseded writer, another volume's id, a region
        // past the end.
        for (i, e, reg, what) in [
            (id, epoch + 1, 2, "fenced"),
            (id + 1, epoch, 2, "replaced"),
            (id, epoch, 6144, "no region 6144"),
        ] {
            let err = m.record_region("p", i, e, reg, p0).await.unwrap_err();
            assert!(err.to_string().contains(what), "{err}");
        }
        assert_eq!(m.regions(id).await.unwrap(), r);
        // Back to mirrored: the group's key goes once it names nothing.
        m.record_region("p", id, epoch, 5000, Region::Mirror)
            .await
            .unwrap();
        m.record_region("p", id, epoch, 1, Region::Mirror)
            .await
            .unwrap();
        assert_eq!(m.regions(id).await.unwrap(), vec![]);
        let (kvs, _) = s
            .range(&crate::cluster::key(&format!("regions/{id}/")))
            .await
            .unwrap();
        assert!(kvs.is_empty(), "{kvs:?}");
        // A mirror has no regions to switch.
        m.create_volume("m", 1 << 20, &[1]).await.unwrap();
        let mv = m.volume("m").await.unwrap();
        let err = m
            .record_region("m", mv.id, mv.epoch, 0, p0)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a parity volume"), "{err}");
    });
}

#[test]
fn a_corrupt_group_is_an_error_and_a_deleted_volume_leaves_none() {
    rt().block_on(async {
        let s: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::in_memory());
        let m = ClusterMeta::new(s.clone());
        let (id, epoch) = parity_volume(&s, &m, 8 << 20).await;
        m.record_region("p", id, epoch, 3, Region::Parity { slot: 1 })
            .await
            .unwrap();
        // A kind this build does not know is corrupt, never read as mirrored.
        let gk = crate::cluster::key(&format!("regions/{id}/0000000000"));
        s.txn(Txn::when(vec![]).then(vec![Op::put(gk.clone(), r#"{"kinds":"mmx1"}"#)]))
            .await
            .unwrap();
        let e = m.regions(id).await.unwrap_err();
        assert!(matches!(e, MetaError::Corrupt { .. }), "{e}");
        s.txn(Txn::when(vec![]).then(vec![Op::put(gk, r#"{"kinds":"mmm1"}"#)]))
            .await
            .unwrap();
        assert_eq!(m.regions(id).await.unwrap().len(), 4);
        // Deleted for good: its regions go with it.
        s.txn(Txn::when(vec![]).then(vec![Op::delete(crate::cluster::key("attach/p"))]))
            .await
            .unwrap();
        m.delete_volume("p").await.unwrap();
        assert_eq!(m.regions(id).await.unwrap(), vec![]);
    });
}
