//! The CSI node service on this host, with no guest: volumes staged as loop devices over FUSE
//! (`--device loop`, for a host with neither ublk nor the NBD client), real mkfs.ext4 and
//! mounts. Two node services stand for two hosts: a pod's volume moves from node A, killed
//! -9 with its `map`, to node B, and its files come along. It prints how long a CO's calls
//! took (`bench/csi-here.sh` runs it for numbers); no assertion is on time.

mod common;
use common::csi::*;
use common::*;

use std::path::{Path, PathBuf};
use std::time::Instant;

use trireme_csi::pb;

type Node = pb::node_client::NodeClient<tonic::transport::Channel>;

/// The record of `vol`'s device on this host.
fn record(vol: &str) -> Option<serde_json::Value> {
    let s = std::fs::read_to_string(format!("/run/trireme/devices/{vol}.json")).ok()?;
    serde_json::from_str(&s).ok()
}

fn mounted(path: &Path) -> bool {
    let m = std::fs::read_to_string("/proc/mounts").unwrap();
    let p = path.display().to_string();
    m.lines().any(|l| l.split(' ').nth(1) == Some(p.as_str()))
}

/// Unmounts `path` lazily if something is mounted there (what a dead node left).
fn lazy_umount(path: &Path) {
    if mounted(path) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(path)
            .status();
    }
}

/// What the test leaves on this host if it fails midway, taken down when dropped: mounts
/// under its directory, the volume's FUSE file and nbdfuse, its loop devices and record.
struct Leftovers {
    dir: PathBuf,
    vol: String,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let work = format!("/run/trireme/devices/{}.loop", self.vol);
        // Loop devices first, while their files still show where they are.
        let loops = std::process::Command::new("losetup")
            .args(["--list", "--noheadings", "--output", "NAME,BACK-FILE"])
            .output();
        for l in String::from_utf8_lossy(&loops.map(|o| o.stdout).unwrap_or_default()).lines() {
            if let Some((dev, back)) = l.split_once(' ') {
                if back.contains(&work) {
                    let _ = std::process::Command::new("losetup")
                        .args(["-d", dev])
                        .status();
                }
            }
        }
        let m = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut points: Vec<&str> = m.lines().filter_map(|l| l.split(' ').nth(1)).collect();
        points.retain(|p| p.starts_with(self.dir.to_str().unwrap()) || p.starts_with(&work));
        for p in points {
            lazy_umount(Path::new(p));
        }
        let _ = std::process::Command::new("pkill")
            .args(["-f", &format!("nbdfuse .*{work}/")])
            .status();
        let _ = std::fs::remove_file(format!("/run/trireme/devices/{}.json", self.vol));
        let _ = std::fs::remove_dir_all(&work);
    }
}

/// `trireme csi ARGS` on the test's cluster as `identity`, its socket and data directory
/// named `name`.
fn csi_as(
    w: &common::secure::World,
    identity: &str,
    name: &str,
    args: &[&str],
) -> (Server, PathBuf) {
    let sock = w.p(&format!("{name}.sock"));
    let (id, dd) = (w.p(identity), w.p(name));
    let global = [
        "--etcd",
        &w.etcd,
        "--tls-identity",
        id.to_str().unwrap(),
        "--data-dir",
        dd.to_str().unwrap(),
    ];
    (start(&global, &sock, args, &[]), sock)
}

/// `trireme csi --node --device loop` as `identity`, named `node`.
fn node_service(w: &common::secure::World, identity: &str, node: &str) -> (Server, PathBuf) {
    let args = ["--node", "--node-id", node, "--device", "loop"];
    csi_as(w, identity, &format!("csi-{node}"), &args)
}

struct Paths {
    staging: String,
    target: String,
}

impl Paths {
    fn stage(&self, vol: &str) -> pb::NodeStageVolumeRequest {
        pb::NodeStageVolumeRequest {
            volume_id: vol.into(),
            staging_target_path: self.staging.clone(),
            volume_capability: Some(cap(Some("ext4"))),
            ..Default::default()
        }
    }
    fn publish(&self, vol: &str) -> pb::NodePublishVolumeRequest {
        pb::NodePublishVolumeRequest {
            volume_id: vol.into(),
            staging_target_path: self.staging.clone(),
            target_path: self.target.clone(),
            volume_capability: Some(cap(Some("ext4"))),
            ..Default::default()
        }
    }
}

fn paths(w: &common::secure::World, node: &str) -> Paths {
    Paths {
        staging: w.p(&format!("{node}/stage")).display().to_string(),
        target: w.p(&format!("{node}/pod/vol")).display().to_string(),
    }
}

fn controller_publish(vol: &str, node: &str) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: vol.into(),
        node_id: node.into(),
        volume_capability: Some(cap(Some("ext4"))),
        ..Default::default()
    }
}

/// Controller publish, stage and publish on `node`: the pod's path has the volume mounted.
async fn to_pod(ctl: &mut Controller, n: &mut Node, p: &Paths, vol: &str, node: &str) {
    ctl.controller_publish_volume(controller_publish(vol, node))
        .await
        .unwrap();
    n.node_stage_volume(p.stage(vol)).await.unwrap();
    n.node_publish_volume(p.publish(vol)).await.unwrap();
    assert!(mounted(Path::new(&p.target)), "{} is not mounted", p.target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_volume_mounts_here_and_moves_to_another_node_when_its_node_dies() {
    for t in ["etcd", "nbdfuse", "losetup", "mkfs.ext4"] {
        need(t);
    }
    assert!(
        Path::new("/dev/fuse").exists() && Path::new("/dev/loop-control").exists(),
        "this test needs /dev/fuse and /dev/loop-control (modprobe fuse loop)"
    );
    let w = common::secure::start();
    let vol = format!("pvc-here-{}", std::process::id());
    let _left = Leftovers {
        dir: w.p(""),
        vol: vol.clone(),
    };
    let (_ctl, ctl_sock) = csi_as(&w, "admin", "csi-ctl", &["--controller"]);
    let mut ctl = Controller::new(channel(&ctl_sock).await);
    let (mut a_srv, a_sock) = node_service(&w, "alice", "node-a");
    let (_b_srv, b_sock) = node_service(&w, "carol", "node-b");
    let mut a = Node::new(channel(&a_sock).await);
    let mut b = Node::new(channel(&b_sock).await);
    let (pa, pb_) = (paths(&w, "node-a"), paths(&w, "node-b"));

    // CreateVolume to a mounted filesystem on node A.
    let t0 = Instant::now();
    let req = create_req(
        &vol,
        256 << 20,
        &[("replicas", "2"), ("access", "alice, carol")],
    );
    ctl.create_volume(req).await.unwrap();
    to_pod(&mut ctl, &mut a, &pa, &vol, "node-a").await;
    let to_mounted = t0.elapsed();
    let m = record(&vol).expect("a device record");
    assert_eq!(m["kind"], "loop", "{m}");
    let file = Path::new(&pa.target).join("data");
    let bytes: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();

    // Node A dies (its service and its map, kill -9); the pod comes up on node B.
    let map_a = m["pid"].as_i64().unwrap() as i32;
    let t1 = Instant::now();
    a_srv.0.kill().unwrap();
    let _ = a_srv.0.wait();
    signal(map_a, libc::SIGKILL);
    to_pod(&mut ctl, &mut b, &pb_, &vol, "node-b").await;
    let moved = t1.elapsed();
    let got = std::fs::read(Path::new(&pb_.target).join("data")).unwrap();
    assert!(got == bytes, "the file read back on node B differs");
    let m = record(&vol).unwrap();
    assert_ne!(m["pid"].as_i64().unwrap() as i32, map_a, "{m}");
    // What node A left: its mounts over a device whose server is gone.
    lazy_umount(Path::new(&pa.target));
    lazy_umount(Path::new(&pa.staging));

    // Node B lets go and the volume is deleted.
    let t2 = Instant::now();
    b.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: vol.clone(),
        target_path: pb_.target.clone(),
    })
    .await
    .unwrap();
    b.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: vol.clone(),
        staging_target_path: pb_.staging.clone(),
    })
    .await
    .unwrap();
    ctl.controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
        volume_id: vol.clone(),
        node_id: "node-b".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    ctl.delete_volume(pb::DeleteVolumeRequest {
        volume_id: vol.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let deleted = t2.elapsed();
    assert!(!mounted(Path::new(&pb_.staging)) && !mounted(Path::new(&pb_.target)));
    assert!(
        record(&vol).is_none(),
        "the device record stays after unstage"
    );
    assert!(
        !Path::new(&format!("/run/trireme/devices/{vol}.loop")).exists(),
        "the loop device's directory stays after unstage"
    );
    let list = w.ok(Some("admin"), &["volume", "list"]);
    assert!(!list.contains(&vol), "{list}");
    // Read by bench/csi-here.sh.
    println!("@@ create-to-mounted {:.3}", to_mounted.as_secs_f64());
    println!(
        "@@ node-death-to-mounted-elsewhere {:.3}",
        moved.as_secs_f64()
    );
    println!("@@ unpublish-to-deleted {:.3}", deleted.as_secs_f64());
}

/// `map` on this host: with neither driver loaded, the error names both, how to load them,
/// and the loop device; a loop device without its programs names what to install; an
/// unmap of nothing says so. Exit 2 each, and nothing is attached.
#[test]
fn map_says_what_this_host_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], path: Option<&str>| {
        let mut c = std::process::Command::new(BIN);
        c.arg("--data-dir").arg(dir.path()).args(args);
        if let Some(p) = path {
            c.env("PATH", p);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let drivers = Path::new("/dev/ublk-control").exists() || Path::new("/sys/module/nbd").exists();
    if !drivers {
        let (code, err) = run(&["map", "vol0"], None);
        assert_eq!(code, Some(2), "{err}");
        for want in ["modprobe ublk_drv", "modprobe nbd", "--device loop"] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }
    let empty = dir.path().join("bin");
    std::fs::create_dir(&empty).unwrap();
    let (code, err) = run(
        &["map", "vol0", "--device", "loop"],
        Some(empty.to_str().unwrap()),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("nbdfuse (`apt install libnbd-bin`)"), "{err}");
    let (code, err) = run(&["unmap", "no-such-volume"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no device of no-such-volume is mapped"),
        "{err}"
    );
}
