//! The CSI driver's controller over its real gRPC socket, against a real cluster: the
//! lifecycle a CO drives (create, snapshot, clone, expand, modify, delete), every call asked
//! twice, wrong arguments and missing objects with the spec's codes, and nothing changed by a
//! refused call. Publishing between hosts, which fences, is in `csi_publish` (on etcd).

mod common;
use common::csi::*;
use common::*;

use trireme_csi::pb;

fn volumes(c: &Cluster) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&ok(c, &["--output", "json", "volume", "list"])).unwrap();
    let mut names: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn info(c: &Cluster, vol: &str) -> serde_json::Value {
    serde_json::from_str(&ok(c, &["--output", "json", "volume", "info", vol])).unwrap()
}

/// Writes `pattern` over the first MiB of `vol` through an NBD export of it, or reads it back.
fn io(c: &Cluster, vol: &str, op: &str, pattern: u8) {
    io_at(c, vol, op, pattern, 0)
}

/// [`io`] on the MiB at `at`.
fn io_at(c: &Cluster, vol: &str, op: &str, pattern: u8, at: u64) {
    let sock = c.path().join(format!("{vol}-io.sock"));
    let (mut nbd, _) = spawn_nbd(c, vol, &sock);
    let uri = format!("nbd+unix:///{vol}?socket={}", sock.display());
    let cmd = format!("{op} -P {pattern:#x} {at} 1M");
    let o = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", &cmd])
        .output()
        .unwrap();
    let out = text(&o);
    // A clean stop: the writer detaches (a snapshot next goes through the cluster's own).
    signal(nbd.id() as i32, libc::SIGTERM);
    let _ = nbd.wait();
    assert!(
        o.status.success() && !out.contains("Pattern verification failed"),
        "{cmd} on {vol}: {out}"
    );
}

/// The volume a CreateVolume that must succeed gives.
async fn created(ctl: &mut Controller, req: pb::CreateVolumeRequest) -> pb::Volume {
    ctl.create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// The snapshot a CreateSnapshot that must succeed gives.
async fn snapped(ctl: &mut Controller, req: pb::CreateSnapshotRequest) -> pb::Snapshot {
    ctl.create_snapshot(req)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

/// The ranges a SnapshotMetadata stream gives, and how many messages carried them.
async fn ranges<T>(
    r: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
    blocks: fn(&T) -> &Vec<pb::BlockMetadata>,
) -> Result<(Vec<(i64, i64)>, usize), tonic::Code> {
    let mut s = r.map_err(|e| e.code())?.into_inner();
    let (mut out, mut msgs) = (Vec::new(), 0);
    while let Some(m) = s.message().await.map_err(|e| e.code())? {
        msgs += 1;
        out.extend(blocks(&m).iter().map(|b| (b.byte_offset, b.size_bytes)));
    }
    Ok((out, msgs))
}

/// Changed-block tracking: a second snapshot after writes at 0 and at 8 MiB; the allocated
/// ranges of each, the delta between them (exactly what was written since, at 4 KiB), a
/// start in the middle, one range to a message; wrong order and unknown ids refused. The
/// second snapshot is deleted again.
async fn changed_blocks(
    ctl: &mut Controller,
    sock: &std::path::Path,
    c: &Cluster,
    vol: &str,
    s1: &str,
) {
    use pb::snapshot_metadata_client::SnapshotMetadataClient;
    use tonic::Code;
    io_at(c, vol, "write", 0x77, 8 << 20);
    let s2 = snapped(
        ctl,
        pb::CreateSnapshotRequest {
            source_volume_id: vol.into(),
            name: "snapshot-2".into(),
            ..Default::default()
        },
    )
    .await
    .snapshot_id;
    let mut md = SnapshotMetadataClient::new(channel(sock).await);
    let alloc = |id: &str, start: i64, max: i32| pb::GetMetadataAllocatedRequest {
        snapshot_id: id.into(),
        starting_offset: start,
        max_results: max,
        ..Default::default()
    };
    let delta = |base: &str, target: &str| pb::GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        ..Default::default()
    };
    let a: fn(&pb::GetMetadataAllocatedResponse) -> &Vec<pb::BlockMetadata> = |m| &m.block_metadata;
    let d: fn(&pb::GetMetadataDeltaResponse) -> &Vec<pb::BlockMetadata> = |m| &m.block_metadata;
    let mib = 1i64 << 20;
    // Allocation is the file store's, at its 64 KiB grain: every byte written is in it, and
    // at most a grain more (the volume's last grain shares the file with the copies' log).
    let grain = 64 << 10;
    let total = |r: &[(i64, i64)]| r.iter().map(|x| x.1).sum::<i64>();
    let (r1, _) = ranges(md.get_metadata_allocated(alloc(s1, 0, 0)).await, a)
        .await
        .unwrap();
    assert_eq!(r1[0], (0, mib), "{r1:?}");
    assert!(total(&r1) <= mib + grain, "{r1:?}");
    let (r2, n) = ranges(md.get_metadata_allocated(alloc(&s2, 0, 1)).await, a)
        .await
        .unwrap();
    assert_eq!(
        (&r2[..2], n),
        (&[(0, mib), (8 * mib, mib)][..], r2.len()),
        "one range a message"
    );
    assert!(total(&r2) <= 2 * mib + grain, "{r2:?}");
    let (from, _) = ranges(
        md.get_metadata_allocated(alloc(&s2, 8 * mib + 4096, 0))
            .await,
        a,
    )
    .await
    .unwrap();
    assert_eq!(from[0], (8 * mib + 4096, mib - 4096), "{from:?}");
    // Changes are the copies' own block maps: exactly what was written, at 4 KiB.
    let (dl, _) = ranges(md.get_metadata_delta(delta(s1, &s2)).await, d)
        .await
        .unwrap();
    assert_eq!(dl, vec![(0, mib), (8 * mib, mib)]);
    assert_eq!(
        ranges(md.get_metadata_delta(delta(&s2, s1)).await, d)
            .await
            .unwrap_err(),
        Code::InvalidArgument
    );
    assert_eq!(
        ranges(md.get_metadata_allocated(alloc("x@nothing", 0, 0)).await, a)
            .await
            .unwrap_err(),
        Code::NotFound
    );
    assert_eq!(
        ranges(md.get_metadata_allocated(alloc(s1, -1, 0)).await, a)
            .await
            .unwrap_err(),
        Code::InvalidArgument
    );
    ctl.delete_snapshot(pb::DeleteSnapshotRequest {
        snapshot_id: s2,
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_lifecycle_with_the_specs_codes() {
    need("qemu-io");
    let c = Cluster::start(&["--size", "64M"]);
    let sock = c.path().join("csi.sock");
    let dd = c.path().display().to_string();
    let _csi = start(&["--data-dir", &dd], &sock, &["--controller"], &[]);
    let ch = channel(&sock).await;
    let mut id = Identity::new(ch.clone());
    let mut ctl = Controller::new(ch);

    // Identity: the name, a controller, online expansion, ready.
    let info_r = id
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info_r.name, "csi.trireme.io");
    let caps = id
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 3, "{caps:?}");
    let probe = id.probe(pb::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let ccaps = ctl
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(ccaps.capabilities.len() >= 9, "{ccaps:?}");

    // Refused requests change nothing.
    let before = volumes(&c);
    let pvc = "pvc-0b6f3c0e-5d6e-4a49-8d4e-1f2a3b4c5d6e";
    use tonic::Code;
    assert_eq!(
        code(
            ctl.create_volume(create_req(pvc, 64 << 20, &[("replica", "2")]))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            ctl.create_volume(create_req(pvc, 64 << 20, &[("tier", "warm")]))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(ctl.create_volume(create_req("", 64 << 20, &[])).await),
        Code::InvalidArgument
    );
    let mut no_caps = create_req(pvc, 64 << 20, &[]);
    no_caps.volume_capabilities.clear();
    assert_eq!(
        code(ctl.create_volume(no_caps).await),
        Code::InvalidArgument
    );
    let mut multi = create_req(pvc, 64 << 20, &[]);
    multi.volume_capabilities[0].access_mode = Some(pb::volume_capability::AccessMode {
        mode: pb::volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
    });
    assert_eq!(code(ctl.create_volume(multi).await), Code::InvalidArgument);
    // More than any node has room for.
    assert_eq!(
        code(ctl.create_volume(create_req(pvc, 1 << 50, &[])).await),
        Code::ResourceExhausted
    );
    assert_eq!(volumes(&c), before, "a refused CreateVolume left something");

    // Create, twice: one volume, the same answer; another size for the name: ALREADY_EXISTS.
    let req = create_req(
        pvc,
        10_000_000,
        &[
            ("replicas", "2"),
            ("minCopies", "1"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ],
    );
    let a = created(&mut ctl, req.clone()).await;
    let b = created(&mut ctl, req).await;
    assert_eq!(a, b);
    assert_eq!(a.volume_id, pvc);
    assert_eq!(a.capacity_bytes, 10_002_432, "rounded up to 4 KiB blocks");
    let v = info(&c, pvc);
    assert_eq!(v["replicas"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["min_copies"], 1, "{v}");
    assert_eq!(v["access"], serde_json::json!(["*"]), "{v}");
    assert_eq!(
        code(ctl.create_volume(create_req(pvc, 1 << 30, &[])).await),
        Code::AlreadyExists
    );
    // A name trireme cannot take is hashed to one it can, the same way each time.
    let odd = created(&mut ctl, create_req("My Volume/1", 1 << 20, &[])).await;
    assert!(odd.volume_id.starts_with("csi-"), "{odd:?}");
    let again = created(&mut ctl, create_req("My Volume/1", 1 << 20, &[])).await;
    assert_eq!(odd, again);

    // Data, then a snapshot of it, twice; the name on another volume: ALREADY_EXISTS.
    io(&c, pvc, "write", 0xa5);
    let snap_req = pb::CreateSnapshotRequest {
        source_volume_id: pvc.into(),
        name: "snapshot-1".into(),
        ..Default::default()
    };
    let s1 = snapped(&mut ctl, snap_req.clone()).await;
    let s1b = snapped(&mut ctl, snap_req).await;
    assert_eq!(s1, s1b);
    assert!(s1.ready_to_use);
    assert_eq!(s1.snapshot_id, format!("{pvc}@snapshot-1"));
    assert_eq!(s1.size_bytes, a.capacity_bytes);
    let taken = pb::CreateSnapshotRequest {
        source_volume_id: odd.volume_id.clone(),
        name: "snapshot-1".into(),
        ..Default::default()
    };
    assert_eq!(code(ctl.create_snapshot(taken).await), Code::AlreadyExists);
    let nowhere = pb::CreateSnapshotRequest {
        source_volume_id: "pvc-none".into(),
        name: "snapshot-2".into(),
        ..Default::default()
    };
    assert_eq!(code(ctl.create_snapshot(nowhere).await), Code::NotFound);
    // The data changes after the snapshot.
    io(&c, pvc, "write", 0x5a);
    changed_blocks(&mut ctl, &sock, &c, pvc, &s1.snapshot_id).await;

    // A volume from the snapshot, bigger than it: the snapshot's bytes, the size asked.
    let mut from_snap = create_req("pvc-from-snap", 32 << 20, &[]);
    from_snap.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: s1.snapshot_id.clone(),
            },
        )),
    });
    let cl = created(&mut ctl, from_snap.clone()).await;
    assert_eq!(cl.capacity_bytes, 32 << 20);
    assert_eq!(cl.content_source, from_snap.volume_content_source);
    assert_eq!(created(&mut ctl, from_snap).await, cl);
    io(&c, "pvc-from-snap", "read", 0xa5);
    // Smaller than the snapshot: OUT_OF_RANGE... from a snapshot that is not there: NOT_FOUND.
    let mut bad_src = create_req("pvc-bad-src", 32 << 20, &[]);
    bad_src.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: format!("{pvc}@no-such"),
            },
        )),
    });
    assert_eq!(code(ctl.create_volume(bad_src).await), Code::NotFound);

    // A volume from a volume: today's bytes; its snapshot is not the CO's.
    let mut from_vol = create_req("pvc-from-vol", 16 << 20, &[]);
    from_vol.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Volume(
            pb::volume_content_source::VolumeSource {
                volume_id: pvc.into(),
            },
        )),
    });
    let vc = created(&mut ctl, from_vol.clone()).await;
    assert_eq!(vc.content_source, from_vol.volume_content_source);
    assert_eq!(created(&mut ctl, from_vol).await, vc);
    io(&c, "pvc-from-vol", "read", 0x5a);
    let all = ctl
        .list_snapshots(pb::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = all
        .entries
        .iter()
        .map(|e| e.snapshot.as_ref().unwrap().snapshot_id.as_str())
        .collect();
    assert_eq!(ids, vec![s1.snapshot_id.as_str()], "{all:?}");
    let by_id = ctl
        .list_snapshots(pb::ListSnapshotsRequest {
            snapshot_id: s1.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id.entries.len(), 1);
    let unknown = ctl
        .list_snapshots(pb::ListSnapshotsRequest {
            snapshot_id: "nothing@here".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unknown.entries.is_empty());

    // Expand: online, twice; smaller than it is: the size it has.
    let exp = |size: i64, fs: Option<&str>| pb::ControllerExpandVolumeRequest {
        volume_id: pvc.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capability: Some(cap(fs)),
        ..Default::default()
    };
    let e = ctl
        .controller_expand_volume(exp(48 << 20, Some("ext4")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (e.capacity_bytes, e.node_expansion_required),
        (48 << 20, true)
    );
    let e = ctl
        .controller_expand_volume(exp(48 << 20, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (e.capacity_bytes, e.node_expansion_required),
        (48 << 20, false)
    );
    let e = ctl
        .controller_expand_volume(exp(1 << 20, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(e.capacity_bytes, 48 << 20);
    assert_eq!(info(&c, pvc)["size"], 48 << 20);

    // Modify: the mutable parameters; an unknown one refused.
    let m = |k: &str, v: &str| pb::ControllerModifyVolumeRequest {
        volume_id: pvc.into(),
        mutable_parameters: kv(&[(k, v)]),
        ..Default::default()
    };
    ctl.controller_modify_volume(m("minCopies", "2"))
        .await
        .unwrap();
    assert_eq!(info(&c, pvc)["min_copies"], 2);
    // Limits (a VolumeAttributesClass), kept by the volume's record for its writer.
    ctl.controller_modify_volume(m("iopsLimit", "500"))
        .await
        .unwrap();
    ctl.controller_modify_volume(m("writeBpsLimit", "1048576"))
        .await
        .unwrap();
    assert_eq!(
        info(&c, pvc)["limits"],
        serde_json::json!({"iops": 500, "write_bps": 1048576})
    );
    ctl.controller_modify_volume(m("iopsLimit", "none"))
        .await
        .unwrap();
    assert_eq!(
        info(&c, pvc)["limits"],
        serde_json::json!({"write_bps": 1048576})
    );
    for (k, v) in [
        ("iopsLimit", "0"),
        ("bpsLimit", "-1"),
        ("limitBurstMs", "soon"),
    ] {
        assert_eq!(
            code(ctl.controller_modify_volume(m(k, v)).await),
            Code::InvalidArgument,
            "{k}={v}"
        );
    }
    assert_eq!(
        code(ctl.controller_modify_volume(m("replicas", "3")).await),
        Code::InvalidArgument
    );
    let mut gone = m("minCopies", "1");
    gone.volume_id = "pvc-none".into();
    assert_eq!(
        code(ctl.controller_modify_volume(gone).await),
        Code::NotFound
    );

    // Get, validate, list, capacity.
    let g = ctl
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: pvc.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let cond = g.status.unwrap().volume_condition.unwrap();
    assert!(!cond.abnormal, "{cond:?}");
    let val = |vol: &str, c: pb::VolumeCapability| pb::ValidateVolumeCapabilitiesRequest {
        volume_id: vol.into(),
        volume_capabilities: vec![c],
        ..Default::default()
    };
    let ok_caps = ctl
        .validate_volume_capabilities(val(pvc, cap(None)))
        .await
        .unwrap()
        .into_inner();
    assert!(ok_caps.confirmed.is_some(), "{ok_caps:?}");
    let mut many = cap(Some("ext4"));
    many.access_mode = Some(pb::volume_capability::AccessMode {
        mode: pb::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32,
    });
    let no = ctl
        .validate_volume_capabilities(val(pvc, many))
        .await
        .unwrap()
        .into_inner();
    assert!(
        no.confirmed.is_none() && no.message.contains("one node"),
        "{no:?}"
    );
    assert_eq!(
        code(
            ctl.validate_volume_capabilities(val("pvc-none", cap(None)))
                .await
        ),
        Code::NotFound
    );
    let first = ctl
        .list_volumes(pb::ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 2);
    let rest = ctl
        .list_volumes(pb::ListVolumesRequest {
            max_entries: 0,
            starting_token: first.next_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len() + rest.entries.len(), volumes(&c).len());
    assert!(rest.next_token.is_empty());
    assert_eq!(
        code(
            ctl.list_volumes(pb::ListVolumesRequest {
                max_entries: 1,
                starting_token: "x".into()
            })
            .await
        ),
        Code::Aborted
    );
    let cap_r = ctl
        .get_capacity(pb::GetCapacityRequest {
            parameters: kv(&[("replicas", "2")]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cap_r.available_capacity > 64 << 20, "{cap_r:?}");

    // Publish of a volume that is not there: NOT_FOUND; unpublish of one: done already.
    let publish = pb::ControllerPublishVolumeRequest {
        volume_id: "pvc-none".into(),
        node_id: "node-a".into(),
        volume_capability: Some(cap(Some("ext4"))),
        ..Default::default()
    };
    assert_eq!(
        code(ctl.controller_publish_volume(publish).await),
        Code::NotFound
    );
    ctl.controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
        volume_id: "pvc-none".into(),
        node_id: "node-a".into(),
        ..Default::default()
    })
    .await
    .unwrap();

    // Deletes: a volume with snapshots, or whose snapshot a clone reads, is refused (its
    // VolumeSnapshots first); a snapshot a clone reads too. Then in order, each twice.
    let del = |v: &str| pb::DeleteVolumeRequest {
        volume_id: v.into(),
        ..Default::default()
    };
    let del_snap = pb::DeleteSnapshotRequest {
        snapshot_id: s1.snapshot_id.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(ctl.delete_volume(del(pvc)).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(ctl.delete_snapshot(del_snap.clone()).await),
        Code::FailedPrecondition
    );
    for v in ["pvc-from-snap", "pvc-from-vol"] {
        ctl.delete_volume(del(v)).await.unwrap();
        ctl.delete_volume(del(v)).await.unwrap();
    }
    // A clone in the trash still reads its snapshot (it may be restored): the snapshot and
    // the source wait for the trash, whose time the operator may cut short.
    let held = ctl.delete_snapshot(del_snap.clone()).await.unwrap_err();
    assert_eq!(held.code(), Code::FailedPrecondition);
    assert!(held.message().contains("in the trash"), "{held:?}");
    for v in ["pvc-from-snap", "pvc-from-vol"] {
        ok(&c, &["volume", "trash", "purge", v]);
    }
    ctl.delete_snapshot(del_snap.clone()).await.unwrap();
    ctl.delete_snapshot(del_snap).await.unwrap();
    ctl.delete_volume(del(pvc)).await.unwrap();
    ctl.delete_volume(del(pvc)).await.unwrap();
    ctl.delete_volume(del(&odd.volume_id)).await.unwrap();
    ctl.delete_volume(del("no/such")).await.unwrap();
    assert_eq!(volumes(&c), before);
    // They wait in the trash: a deleted PVC's data is not gone by mistake.
    let trash = ok(&c, &["volume", "trash", "list"]);
    assert!(trash.contains(pvc), "{trash}");
}

/// Writes `pattern` over the first MiB through a writer's socket; whether it worked.
fn write_via(sock: &std::path::Path, pattern: u8) -> bool {
    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    let o = std::process::Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            &uri,
            "-c",
            &format!("write -P {pattern:#x} 0 1M"),
        ])
        .output()
        .unwrap();
    o.status.success() && !text(&o).contains("error")
}

/// Publishing moves a volume between hosts at once: to node B while node A's writer is
/// stopped (unreachable), the publish fences A and B's writer attaches without --force; A,
/// woken, writes nothing. Unpublish fences only the host named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_a_new_node_fences_the_old_writer_at_once() {
    use common::secure::*;
    need("etcd");
    need("qemu-io");
    let mut w = common::secure::start();
    create_v(&w);
    let a_sock = attach_env(&mut w, "alice", "v", &[("TRIREME_HOST", "node-a")]).unwrap();
    assert!(write_via(&a_sock, 0x11));
    let sock = w.p("csi.sock");
    let (etcd, admin, dd) = (w.etcd.clone(), w.p("admin"), w.p("csi-data"));
    let global = [
        "--etcd",
        &etcd,
        "--tls-identity",
        admin.to_str().unwrap(),
        "--data-dir",
        dd.to_str().unwrap(),
    ];
    let _csi = common::csi::start(&global, &sock, &["--controller"], &[]);
    let mut ctl = Controller::new(channel(&sock).await);
    let publish = |node: &str| pb::ControllerPublishVolumeRequest {
        volume_id: "v".into(),
        node_id: node.into(),
        volume_capability: Some(cap(Some("ext4"))),
        ..Default::default()
    };
    let unpublish = |node: &str| pb::ControllerUnpublishVolumeRequest {
        volume_id: "v".into(),
        node_id: node.into(),
        ..Default::default()
    };
    // To the node that writes it: nothing fenced.
    let p = ctl
        .controller_publish_volume(publish("node-a"))
        .await
        .unwrap()
        .into_inner();
    let epoch_a: u64 = p.publish_context["epoch"].parse().unwrap();
    assert!(
        write_via(&a_sock, 0x12),
        "publishing to its own node fenced the writer"
    );

    // Node A stops answering; the volume goes to node B.
    let alice = w.procs.0.last().unwrap().id() as i32;
    common::signal(alice, libc::SIGSTOP);
    let t0 = std::time::Instant::now();
    let p = ctl
        .controller_publish_volume(publish("node-b"))
        .await
        .unwrap()
        .into_inner();
    let took = t0.elapsed();
    let epoch_b: u64 = p.publish_context["epoch"].parse().unwrap();
    assert!(epoch_b > epoch_a, "{epoch_a} -> {epoch_b}");
    println!("publish to a new node with the old one stopped: {took:?}");
    // Asked again: the same, nothing more fenced.
    let again = ctl
        .controller_publish_volume(publish("node-b"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.publish_context["epoch"], epoch_b.to_string());
    let b_sock = attach_env(&mut w, "carol", "v", &[("TRIREME_HOST", "node-b")])
        .expect("node B attaches without --force once A is fenced");
    assert!(write_via(&b_sock, 0x22));
    // A wakes up: every write it tries is refused; B's bytes stay.
    common::signal(alice, libc::SIGCONT);
    assert!(!write_via(&a_sock, 0x13), "the fenced writer wrote");
    let uri = format!("nbd+unix:///v?socket={}", b_sock.display());
    let o = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", "read -P 0x22 0 1M"])
        .output()
        .unwrap();
    assert!(!text(&o).contains("verification failed"), "{}", text(&o));

    // Unpublish from A (where nothing writes now): B goes on. From B: B is fenced.
    ctl.controller_unpublish_volume(unpublish("node-a"))
        .await
        .unwrap();
    assert!(
        write_via(&b_sock, 0x23),
        "unpublishing node A fenced node B"
    );
    ctl.controller_unpublish_volume(unpublish("node-b"))
        .await
        .unwrap();
    ctl.controller_unpublish_volume(unpublish("node-b"))
        .await
        .unwrap();
    assert!(
        !write_via(&b_sock, 0x24),
        "node B wrote after its unpublish"
    );
    let events = w.ok(Some("admin"), &["events"]);
    assert!(events.contains("fenced"), "{events}");
}

/// contrib/kubernetes/ as a CO would read it: every trireme container started with its
/// manifest's arguments and environment serves its socket (a flag that does not exist, or a
/// service left out, fails here), the driver's name is the one the driver gives, and the
/// registrar points kubelet at the node plugin's socket.
#[test]
fn the_kubernetes_manifests_run_as_written() {
    need("python3");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/kubernetes");
    // Each document's kind, names, and each container's image, args and literal env.
    let o = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            r#"
import glob, json, sys, yaml
out = []
for f in sorted(glob.glob(sys.argv[1] + "/*.yaml")):
    for d in yaml.safe_load_all(open(f)):
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        cs = [{"name": c["name"], "image": c["image"], "args": c.get("args", []),
               "env": [e["name"] for e in c.get("env", [])]} for c in spec.get("containers", [])]
        out.append({"kind": d["kind"], "name": d["metadata"]["name"],
                    "driver": d.get("provisioner") or d.get("driver") or d.get("driverName"),
                    "containers": cs})
print(json.dumps(out))
"#,
        )
        .arg(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let docs: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let driver = trireme_csi::DRIVER_NAME;
    for d in &docs {
        if d["kind"] == "CSIDriver" {
            assert_eq!(d["name"], driver);
        }
        if let Some(name) = d["driver"].as_str() {
            assert_eq!(name, driver, "{d}");
        }
    }
    let work = tempfile::tempdir().unwrap();
    // The Secrets the manifests name: an operator's identity and a client's.
    let w = |rel: &str| work.path().join(rel).display().to_string();
    let issue = |what: &[&str], out: &str| {
        let mut a = vec!["ca", "issue"];
        a.extend_from_slice(what);
        let (ca, o) = (w("ca"), w(out));
        a.extend_from_slice(&["--ca", &ca, "--out", &o]);
        let r = std::process::Command::new(BIN).args(&a).output().unwrap();
        assert!(r.status.success(), "{}", text(&r));
    };
    let r = std::process::Command::new(BIN)
        .args(["ca", "init", "--dir", &w("ca")])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", text(&r));
    issue(&["admin"], "trireme-csi-controller-id");
    issue(&["client", "k8s-nodes"], "trireme-csi-node-id");
    let mut started = 0;
    for d in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
    {
        for c in d["containers"].as_array().unwrap() {
            let args: Vec<String> = c["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            if c["name"] == "node-driver-registrar" {
                let reg = args
                    .iter()
                    .find(|a| a.starts_with("--kubelet-registration-path="))
                    .unwrap();
                assert!(
                    reg.contains(&format!("/plugins/{driver}/csi.sock")),
                    "{reg}"
                );
            }
            if c["name"] != "trireme" {
                continue;
            }
            // Where the pod has /csi and its identity, the test has a directory of its own.
            let sock = work
                .path()
                .join(format!("{}.sock", d["name"].as_str().unwrap()));
            let args: Vec<String> = args
                .iter()
                .map(|a| match a.strip_prefix("--endpoint=") {
                    Some(_) => format!("--endpoint=unix://{}", sock.display()),
                    None => a
                        .replace(
                            "/identity",
                            &w(&format!("{}-id", d["name"].as_str().unwrap())),
                        )
                        .replace("/var/lib/trireme", &work.path().display().to_string()),
                })
                .collect();
            let env: Vec<String> = c["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap().to_string())
                .collect();
            assert!(env.contains(&"TRIREME_ETCD".to_string()), "{c}");
            let mut child = std::process::Command::new(BIN)
                .args(&args)
                // Nothing answers there: the driver serves its socket all the same.
                .env("TRIREME_ETCD", "http://127.0.0.1:9")
                .env("TRIREME_HOST", "k8s-node-1")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let t0 = std::time::Instant::now();
            while !sock.exists() {
                if let Some(st) = child.try_wait().unwrap() {
                    let mut err = String::new();
                    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err)
                        .unwrap();
                    panic!("{} with {args:?} exited ({st}): {err}", d["name"]);
                }
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(20),
                    "{args:?}: no socket"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            started += 1;
        }
    }
    assert_eq!(started, 2, "a controller and a node plugin");
}
