//! The CSI node service in the guest: staged, published, expanded and unstaged volumes.

use super::*;

/// The guest of the CSI test: the node service, then each line typed on its console, run.
const CSI_SCRIPT: &str = r#"
stty -echo 2>/dev/null
trireme --transport tcp --etcd http://10.0.2.2:2379 csi --node --endpoint tcp://0.0.0.0:10000 --node-id guest-1 --zone z1 >/tmp/csi.log 2>&1 &
echo "@@ CSI-UP"
while read -r line; do eval "$line"; done
"#;

/// Runs `cmd` in the guest (its console's script); its exit status.
fn run_in(g: &mut Guest, cmd: &str) -> i32 {
    g.send(&format!("( {cmd} ) 2>&1; echo \"@@ DONE $?\""));
    let l = g.expect("@@ DONE", Duration::from_secs(240));
    l.trim().rsplit(' ').next().unwrap().parse().unwrap()
}

fn ok_in(g: &mut Guest, cmd: &str) {
    let st = run_in(g, cmd);
    assert_eq!(st, 0, "guest: {cmd}; its console:\n{}", g.log.join("\n"));
}

/// The CSI node service on a real kernel: stage (map, mkfs, mount) and publish a filesystem
/// volume and a raw block volume, every call twice; files written through a node kill -9
/// and through a kill -9 of the volume's `map` (the service serves the device again); stats;
/// unpublish, unstage; grown while unstaged, then the filesystem grown at the next stage;
/// the files intact throughout; wrong calls get the spec's codes.
#[test]
fn the_csi_node_service_in_a_guest() {
    let Some(_one) = guest_turn() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let net = GuestNet::create();
    // This thread's sockets and children live in the guest's namespace from here on.
    net.enter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(csi_node_steps(&net, dir.path()));
}

async fn csi_node_steps(net: &GuestNet, dir: &std::path::Path) {
    use common::csi::{cap, channel, code, create_req, Controller};
    use tonic::Code;
    use trireme_csi::pb;
    let mut procs = cluster(net, dir);
    let sock = dir.join("csi.sock");
    let _ctl = common::csi::start(
        &["--etcd", ETCD, "--transport", "tcp"],
        &sock,
        &["--controller"],
        &[],
    );
    let mut ctl = Controller::new(channel(&sock).await);
    let port = common::free_port();
    let bin = std::path::Path::new(BIN);
    let initrd = guest::initrd(
        dir,
        CSI_SCRIPT,
        &[
            (bin, "/bin/trireme"),
            (std::path::Path::new("/sbin/mkfs.ext4"), "/sbin/mkfs.ext4"),
            (std::path::Path::new("/sbin/resize2fs"), "/sbin/resize2fs"),
        ],
    );
    let mut g = Guest::boot_with(net, &initrd, &[(port, 10000)]);
    g.expect("@@ CSI-UP", Duration::from_secs(120));
    let ep = format!("http://10.0.2.2:{port}");
    let t0 = Instant::now();
    let ch = loop {
        let e = tonic::transport::Endpoint::try_from(ep.clone()).unwrap();
        if let Ok(c) = e.connect().await {
            let mut id = pb::identity_client::IdentityClient::new(c.clone());
            if id.probe(pb::ProbeRequest {}).await.is_ok() {
                break c;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the guest's CSI node never answered"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut csi = pb::node_client::NodeClient::new(ch);
    let info = csi
        .node_get_info(pb::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "guest-1");
    assert_eq!(
        info.accessible_topology.unwrap().segments["topology.csi.trireme.io/zone"],
        "z1"
    );

    // A filesystem volume: created, published to the guest's node, staged and published twice.
    let fs = "pvc-fs";
    ctl.create_volume(create_req(fs, 256 << 20, &[("replicas", "2")]))
        .await
        .unwrap();
    let publish = |vol: &str| pb::ControllerPublishVolumeRequest {
        volume_id: vol.into(),
        node_id: "guest-1".into(),
        volume_capability: Some(cap(Some("ext4"))),
        ..Default::default()
    };
    ctl.controller_publish_volume(publish(fs)).await.unwrap();
    let stage = |vol: &str, c: pb::VolumeCapability| pb::NodeStageVolumeRequest {
        volume_id: vol.into(),
        staging_target_path: format!("/run/csi/stage/{vol}"),
        volume_capability: Some(c),
        ..Default::default()
    };
    let publish_n =
        |vol: &str, target: &str, c: pb::VolumeCapability| pb::NodePublishVolumeRequest {
            volume_id: vol.into(),
            staging_target_path: format!("/run/csi/stage/{vol}"),
            target_path: target.into(),
            volume_capability: Some(c),
            ..Default::default()
        };
    let target = "/run/pods/p1/vol";
    // Wrong calls first: nothing staged by them.
    assert_eq!(
        code(
            csi.node_stage_volume(stage("pvc-none", cap(Some("ext4"))))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            csi.node_publish_volume(publish_n(fs, target, cap(Some("ext4"))))
                .await
        ),
        Code::FailedPrecondition
    );
    let mut multi = cap(Some("ext4"));
    multi.access_mode = Some(pb::volume_capability::AccessMode {
        mode: pb::volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
    });
    assert_eq!(
        code(csi.node_stage_volume(stage(fs, multi)).await),
        Code::InvalidArgument
    );
    for _ in 0..2 {
        csi.node_stage_volume(stage(fs, cap(Some("ext4"))))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        csi.node_publish_volume(publish_n(fs, target, cap(Some("ext4"))))
            .await
            .unwrap();
    }
    ok_in(
        &mut g,
        "grep -q /run/pods/p1/vol /proc/mounts && trireme device list | grep -q /dev/ublkb",
    );
    // Files, each fsynced, while node 1 is killed -9 and comes back.
    g.send(&format!(
        "( i=0; while [ $i -lt 24 ]; do dd if=/dev/urandom of={target}/a.$i bs=64k count=8 conv=fsync 2>/dev/null || exit 9; i=$((i+1)); done; sha256sum {target}/a.* > /tmp/sums ) 2>&1; echo \"@@ DONE $?\""
    ));
    std::thread::sleep(Duration::from_secs(2));
    procs.0[1].kill().unwrap();
    let _ = procs.0[1].wait();
    std::thread::sleep(Duration::from_secs(2));
    procs.0[1] = node(net, dir, 1);
    let l = g.expect("@@ DONE", Duration::from_secs(240));
    assert!(
        l.ends_with(" 0"),
        "writes under a node kill: {l}\n{}",
        g.log.join("\n")
    );
    // The volume's map killed -9 under writes: the service serves the device again.
    ok_in(
        &mut g,
        &format!(
            "(i=0; while [ $i -lt 16 ]; do dd if=/dev/urandom of={target}/b.$i bs=64k count=8 conv=fsync 2>/dev/null || exit 9; i=$((i+1)); done) & w=$!; sleep 1; kill -9 $(sed 's/.*\"pid\":\\([0-9]*\\).*/\\1/' /run/trireme/devices/pvc-fs.json) || exit 8; wait $w || exit 7; sha256sum {target}/b.* >> /tmp/sums"
        ),
    );
    // Stats, once the device has its server again (the new map records itself).
    let t0 = Instant::now();
    let stats = loop {
        let s = csi
            .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                volume_id: fs.into(),
                volume_path: target.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let abnormal = s.volume_condition.as_ref().is_some_and(|c| c.abnormal);
        if !abnormal || t0.elapsed() > Duration::from_secs(20) {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(stats.usage[0].used > 10 << 20, "{stats:?}");
    let cond = stats.volume_condition.unwrap();
    assert!(!cond.abnormal, "{cond:?}");

    // Unpublish, unstage (twice each); grown while nobody has it; staged again, the
    // filesystem grown; the files intact.
    let unpublish = |vol: &str, t: &str| pb::NodeUnpublishVolumeRequest {
        volume_id: vol.into(),
        target_path: t.into(),
    };
    let unstage = |vol: &str| pb::NodeUnstageVolumeRequest {
        volume_id: vol.into(),
        staging_target_path: format!("/run/csi/stage/{vol}"),
    };
    for _ in 0..2 {
        csi.node_unpublish_volume(unpublish(fs, target))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        csi.node_unstage_volume(unstage(fs)).await.unwrap();
    }
    ok_in(
        &mut g,
        "! grep -q /run/csi /proc/mounts && trireme device list | grep -q 'no device'",
    );
    ctl.controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
        volume_id: fs.into(),
        node_id: "guest-1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    ctl.controller_expand_volume(pb::ControllerExpandVolumeRequest {
        volume_id: fs.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 384 << 20,
            limit_bytes: 0,
        }),
        volume_capability: Some(cap(Some("ext4"))),
        ..Default::default()
    })
    .await
    .unwrap();
    ctl.controller_publish_volume(publish(fs)).await.unwrap();
    // The manager grew the volume through a writer of its own (nobody had it), and may
    // still hold it (or scrub it next): the stage is refused, naming that writer, until it
    // lets go. A CO retries a refused NodeStage; so does this test, for a minute.
    let t0 = std::time::Instant::now();
    loop {
        match csi.node_stage_volume(stage(fs, cap(Some("ext4")))).await {
            Ok(_) => break,
            Err(e)
                if e.code() == tonic::Code::FailedPrecondition
                    && e.message().contains("is attached by")
                    && t0.elapsed() < Duration::from_secs(60) =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("stage after the expand: {e:?}"),
        }
    }
    let grown = csi
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: fs.into(),
            volume_path: format!("/run/csi/stage/{fs}"),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 384 << 20,
                limit_bytes: 0,
            }),
            volume_capability: Some(cap(Some("ext4"))),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 384 << 20);
    csi.node_publish_volume(publish_n(fs, target, cap(Some("ext4"))))
        .await
        .unwrap();
    ok_in(&mut g, "sha256sum -c /tmp/sums >/dev/null");
    ok_in(
        &mut g,
        &format!("[ $(df -k {target} | tail -1 | awk '{{print $2}}') -gt 300000 ]"),
    );

    // A raw block volume: the device itself at the target.
    let blk = "pvc-blk";
    let mut req = create_req(blk, 64 << 20, &[]);
    req.volume_capabilities = vec![cap(None)];
    ctl.create_volume(req).await.unwrap();
    ctl.controller_publish_volume(publish(blk)).await.unwrap();
    let dev_target = "/run/pods/p2/dev";
    for _ in 0..2 {
        csi.node_stage_volume(stage(blk, cap(None))).await.unwrap();
        csi.node_publish_volume(publish_n(blk, dev_target, cap(None)))
            .await
            .unwrap();
    }
    ok_in(
        &mut g,
        &format!("dd if=/dev/urandom of=/tmp/blk bs=64k count=16 2>/dev/null && dd if=/tmp/blk of={dev_target} bs=64k conv=fsync 2>/dev/null && dd if={dev_target} of=/tmp/back bs=64k count=16 2>/dev/null && cmp /tmp/blk /tmp/back"),
    );
    csi.node_unpublish_volume(unpublish(blk, dev_target))
        .await
        .unwrap();
    csi.node_unstage_volume(unstage(blk)).await.unwrap();
    csi.node_unpublish_volume(unpublish(fs, target))
        .await
        .unwrap();
    csi.node_unstage_volume(unstage(fs)).await.unwrap();
    ok_in(
        &mut g,
        "trireme device list | grep -q 'no device' && ! dmesg | grep -i 'i/o error'",
    );
    for v in [fs, blk] {
        ctl.delete_volume(pb::DeleteVolumeRequest {
            volume_id: v.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    for l in g.log.iter().filter(|l| l.contains("@@")) {
        eprintln!("guest: {l}");
    }
}
