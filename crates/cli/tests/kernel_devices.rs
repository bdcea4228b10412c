//! A volume as a kernel block device (`trireme map`), in a Linux guest under qemu (this
//! host's kernel has neither ublk nor an NBD client): the guest maps a volume of a cluster on
//! etcd running here, as a ublk device and then (another volume) through the kernel's NBD
//! client, makes a file system on it, and keeps writing while a node is killed -9 and while
//! `map` itself is killed -9 and started again. Nothing may fail, every file must read back
//! after a remount, and the copies must be identical.

mod common;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::guest::{self, Guest, GuestNet};
use common::BIN;

const ETCD: &str = "http://10.0.2.2:2379";

/// Processes stopped on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn node(net: &GuestNet, dir: &std::path::Path, id: u32) -> Child {
    net.cmd(BIN)
        .args([
            "--etcd",
            ETCD,
            "node",
            "run",
            "--insecure",
            "--id",
            &id.to_string(),
        ])
        .args([
            "--listen",
            "10.0.2.2:0",
            "--store",
            "file",
            "--lease-ttl",
            "2s",
        ])
        .arg("--dir")
        .arg(dir.join(format!("n{id}")))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("node-{id}.log"))).unwrap())
        .spawn()
        .unwrap()
}

/// `trireme ARGS` on the cluster, from the namespace.
fn trireme(net: &GuestNet, args: &[&str]) -> std::process::Output {
    net.cmd(BIN)
        .args(["--etcd", ETCD])
        .args(args)
        .output()
        .unwrap()
}

/// Runs `trireme ARGS` until `done` says so of its output (60 s at most).
fn until(net: &GuestNet, args: &[&str], what: &str, done: impl Fn(&std::process::Output) -> bool) {
    let t0 = Instant::now();
    loop {
        let o = trireme(net, args);
        if done(&o) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{what}: {o:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What the guest runs: map, mkfs, mount, write; a node killed under a write (the host does
/// it on `@@ KILL-NODE`); `map` killed -9 under a write and started again; remount and check.
const SCRIPT: &str = r#"
T="trireme --transport tcp --etcd http://10.0.2.2:2379"
fail() { echo "@@ FAIL $*"; dmesg | tail -30; tail -20 /tmp/map*.log; exit 1; }
mapped() { i=0; until grep -q /dev/ "$1" 2>/dev/null; do i=$((i+1)); [ $i -gt 600 ] && fail "map: $(cat $1.log)"; sleep 0.2; done; }
# Until no volume waits for the manager's scrub: it scrubs a volume nobody writes through a
# writer of its own, and a map or attach meanwhile is refused naming it (see docs/not-built.md).
calm() { i=0; while $T --output json status 2>/dev/null | grep -qi '"unverified"\|"resyncing"'; do i=$((i+1)); [ $i -gt 600 ] && fail "the volumes never settled"; sleep 0.5; done; sleep 1; }
# One round: device kind $1 for volume $2.
round() {
K=$1; V=$2
calm
rm -f /tmp/sums /tmp/stop /tmp/c.*
# A volume another process writes: refused, naming it, and nothing changed (it goes on).
$T attach $V --socket /tmp/a.sock >/tmp/att 2>/tmp/att.log &
ATT=$!
i=0; until [ -S /tmp/a.sock ]; do i=$((i+1)); [ $i -gt 600 ] && fail "attach: $(cat /tmp/att.log)"; sleep 0.2; done
$T map $V --device $K 2>/tmp/bad && fail "map of a volume attached elsewhere"
grep -q "is attached by pid" /tmp/bad || fail "map of an attached volume: $(cat /tmp/bad)"
kill -0 $ATT || fail "the refused map stopped the writer"
kill $ATT; wait $ATT
$T map $V --device $K --io-timeout 5s --dead-timeout 300s >/tmp/map1 2>/tmp/map1.log &
mapped /tmp/map1
DEV=$(cat /tmp/map1)
echo "@@ MAPPED $K $DEV"
$T device list
# Bad input changes nothing: a volume that does not exist, one this host maps already.
$T map nope --device $K 2>/tmp/bad && fail "map of a volume that does not exist"
grep -q "no volume" /tmp/bad || fail "map nope: $(cat /tmp/bad)"
$T map $V --device $K 2>/tmp/bad && fail "a second map of a mapped volume"
grep -q "served by pid" /tmp/bad || fail "map $V again: $(cat /tmp/bad)"
trireme unmap /dev/nbd9 2>/tmp/bad && fail "unmap of a device never mapped"
mkfs.ext4 -q -F $DEV || fail mkfs
mount $DEV /mnt || fail mount
dd if=/dev/urandom of=/mnt/a bs=64k count=32 conv=fsync 2>/dev/null || fail "write a"
sha256sum /mnt/a > /tmp/sums
# A fio verify job (every block written with its checksum, then read back and checked) across the node kill.
fio --name=verify --filename=/mnt/fio.dat --size=4M --rw=randwrite --bs=4k --direct=1 --ioengine=psync --verify=crc32c --do_verify=1 --randrepeat=0 >/tmp/fio.log 2>&1 &
FIO=$!
echo "@@ KILL-NODE"
# Files of 1 MiB, each fsynced: a node dies (the host kills it on the line above) under them.
i=0; while [ $i -lt 24 ]; do dd if=/dev/urandom of=/mnt/b.$i bs=64k count=16 conv=fsync 2>/dev/null || fail "write b.$i under a node kill"; i=$((i+1)); done
wait $FIO || fail "fio verify under a node kill: $(tail -5 /tmp/fio.log)"
grep -q "err= 0" /tmp/fio.log || fail "fio: $(cat /tmp/fio.log)"
echo "@@ FIO-VERIFIED"
# The same until told to stop, while map is killed -9 and started again (/tmp is not on it).
(i=0; while [ ! -e /tmp/stop ]; do echo $i > /tmp/c.at; dd if=/dev/urandom of=/mnt/c.$i bs=64k count=8 conv=fsync 2>/tmp/c.dd || { echo "c.$i: $(cat /tmp/c.dd)" > /tmp/c.err; break; }; i=$((i+1)); done; echo $i > /tmp/c.done) &
sleep 2
[ -e /tmp/c.done ] && fail "the writes ended before map was killed: $(cat /tmp/c.err)"
kill -9 $(pidof trireme) || fail "no map process"
# Nothing that may read the file system here: its reads wait for the next map.
before=$(cat /tmp/c.at)
echo "@@ MAP-KILLED after $before files"
$T map $V --device $K --io-timeout 5s --dead-timeout 300s >/tmp/map2 2>/tmp/map2.log &
mapped /tmp/map2
[ "$(cat /tmp/map2)" = "$DEV" ] || fail "the second map gave $(cat /tmp/map2), not $DEV"
echo "@@ MAPPED-AGAIN"
sleep 3
touch /tmp/stop
i=0; until [ -e /tmp/c.done ]; do i=$((i+1)); [ $i -gt 900 ] && fail "the writes never ended"; sleep 0.2; done
[ -e /tmp/c.err ] && fail "write $(cat /tmp/c.err) under the map kill"
after=$(cat /tmp/c.done)
[ "$after" -gt "$before" ] || fail "no file was written after the kill ($before, then $after)"
echo "@@ WRITES $before before the kill, $after in all"
sha256sum /mnt/b.* /mnt/c.* >> /tmp/sums
# Grown while mapped and mounted: the device follows (NBD: a reconfigure; ublk: Linux 6.16+).
$T volume resize $V 160M || fail "resize"
want=$((160*2048)); S=/sys/block/$(basename $DEV)/size
i=0; until [ "$(cat $S)" = $want ] || grep -q "keeps its size" /tmp/map2.log; do i=$((i+1)); [ $i -gt 300 ] && fail "the device neither grew nor said why: $(cat $S) sectors"; sleep 0.2; done
if [ "$(cat $S)" = $want ]; then
  dd if=$DEV of=/dev/null bs=4k skip=$((150*256)) count=1 2>/dev/null || fail "a read past the old end"
  echo "@@ GREW $K"
else
  [ $K = nbd ] && fail "the NBD device did not grow: $(grep 'keeps its size' /tmp/map2.log)"
  echo "@@ KEPT-SIZE $K: $(grep -o 'keeps its size.*' /tmp/map2.log | head -1)"
fi
trireme unmap $V 2>/tmp/busy && fail "unmap of a mounted device went through"
grep -q "in use" /tmp/busy || fail "unmap of a mounted device: $(cat /tmp/busy)"
umount /mnt || fail umount
$T volume snapshot create $V s1 || fail "snapshot"
mount $DEV /mnt || fail remount
sha256sum -c /tmp/sums >/dev/null || fail "checksums after a remount"
dd if=/dev/urandom of=/mnt/after bs=64k count=4 conv=fsync 2>/dev/null || fail "write after the snapshot"
umount /mnt
# The snapshot, read-only: the files as they were, nothing written after, no write taken.
$T map $V@s1 --device $K >/tmp/map3 2>/tmp/map3.log &
mapped /tmp/map3
SDEV=$(cat /tmp/map3)
[ "$SDEV" != "$DEV" ] || fail "the snapshot got the volume's device"
echo "@@ MAPPED-SNAPSHOT $SDEV"
mkdir -p /snap
mount -o ro $SDEV /snap || fail "mount the snapshot"
sed 's#/mnt/#/snap/#' /tmp/sums > /tmp/ssums
sha256sum -c /tmp/ssums >/dev/null || fail "the snapshot's files"
[ -e /snap/after ] && fail "the snapshot holds a file written after it"
umount /snap
dd if=/dev/zero of=$SDEV bs=4k count=1 2>/dev/null && fail "a write to the snapshot's device went through"
trireme unmap $V@s1 || fail "unmap the snapshot"
trireme unmap $V || fail unmap
[ -e $DEV ] && [ -s /sys/block/$(basename $DEV)/size ] && [ "$(cat /sys/block/$(basename $DEV)/size)" != 0 ] && fail "the device is still there"
dmesg | grep -i "i/o error" && fail "the kernel saw I/O errors"
echo "@@ ROUND-OK $K"
}
# Beside `up` (no etcd): `map` takes the writer from up's export through its control socket.
round_up() {
U="trireme --transport tcp --data-dir /up"
$U up --size 64M --node-capacity 96M --port 0 >/tmp/up.out 2>/tmp/up.log &
UP=$!
i=0; until grep -q "Press Ctrl-C" /tmp/up.out 2>/dev/null; do i=$((i+1)); [ $i -gt 900 ] && fail "up: $(tail -5 /tmp/up.log)"; sleep 0.2; done
$U map vol0 >/tmp/map1 2>/tmp/map1.log &
MAP=$!
mapped /tmp/map1
DEV=$(cat /tmp/map1)
echo "@@ UP-MAPPED $DEV"
mkfs.ext4 -q -F $DEV || fail "mkfs beside up"
mount $DEV /mnt || fail "mount beside up"
i=0; while [ $i -lt 8 ]; do dd if=/dev/urandom of=/mnt/u.$i bs=64k count=8 conv=fsync 2>/dev/null || fail "write u.$i beside up"; i=$((i+1)); done
(dd if=/dev/urandom of=/mnt/u.k bs=64k count=64 conv=fsync 2>/tmp/u.dd || echo "$(cat /tmp/u.dd)" > /tmp/u.err) &
W=$!
sleep 1
# SIGTERM this time: map closes its device (what the kernel asks waits), detaches and ends.
kill $MAP || fail "no map beside up"
wait $MAP
$U map vol0 >/tmp/map2 2>/tmp/map2.log &
mapped /tmp/map2
[ "$(cat /tmp/map2)" = "$DEV" ] || fail "the second map beside up gave $(cat /tmp/map2), not $DEV"
wait $W
[ -e /tmp/u.err ] && fail "a write across a SIGTERM of map beside up: $(cat /tmp/u.err)"
sha256sum /mnt/u.* > /tmp/usums
umount /mnt && mount $DEV /mnt || fail "remount beside up"
sha256sum -c /tmp/usums >/dev/null || fail "checksums beside up"
umount /mnt
trireme unmap vol0 || fail "unmap beside up"
kill $UP; wait $UP
echo "@@ UP-OK"
}
round ublk v
round nbd w
round_up
# The kernel-device benchmark runs as shipped (one second a job: TCG times nothing).
cat > /tmp/kd.sh <<'KD'
@@KERNEL-DEVICES-SH@@
KD
calm
SIZE=16M TRIREME="$T" sh /tmp/kd.sh v 1 >/tmp/kd.out 2>&1 || fail "bench/kernel-devices.sh: $(cat /tmp/kd.out)"
cat /tmp/kd.out
# Every row measured something (IOPS above 0), the socket's baseline included.
for t in nbd-socket nbd-device ublk-device; do
  awk -v t=$t '$1 == t && $2 == "randwrite" && $3 == 128 && $4 > 0 { ok = 1 } END { exit !ok }' /tmp/kd.out || fail "the benchmark's table ($t): $(cat /tmp/kd.out)"
done
echo "@@ RESULT-OK"
"#;

/// One guest at a time: two under emulation on two cores would starve each other.
static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn at a guest, or `None` (said as SKIPPED) where none can run here.
fn guest_turn() -> Option<std::sync::MutexGuard<'static, ()>> {
    if let Some(why) = guest::unavailable() {
        eprintln!("SKIPPED: no guest can run here (missing: {why})");
        return None;
    }
    common::need("etcd");
    Some(ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner()))
}

/// etcd and two nodes in `net`, both up.
fn cluster(net: &GuestNet, dir: &std::path::Path) -> Procs {
    let mut procs = Procs(Vec::new());
    procs.0.push(
        net.cmd("etcd")
            .args([
                "--name=g0",
                "--listen-client-urls",
                ETCD,
                "--advertise-client-urls",
                ETCD,
            ])
            .args([
                "--listen-peer-urls",
                "http://10.0.2.2:2380",
                "--log-level=warn",
            ])
            .args(["--initial-advertise-peer-urls", "http://10.0.2.2:2380"])
            .args(["--initial-cluster", "g0=http://10.0.2.2:2380"])
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    for id in 1..=2 {
        procs.0.push(node(net, dir, id));
    }
    until(net, &["--output", "json", "status"], "both nodes up", |o| {
        serde_json::from_slice::<serde_json::Value>(&o.stdout).is_ok_and(|s| {
            s["nodes"]
                .as_array()
                .is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["up"] == true))
        })
    });
    procs
}

#[test]
fn a_mapped_device_survives_a_node_kill_and_its_own_restart() {
    let Some(_one) = guest_turn() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let net = GuestNet::create();
    let mut procs = cluster(&net, dir.path());
    for v in ["v", "w"] {
        let o = trireme(
            &net,
            &["volume", "create", v, "--size", "128M", "--replicas", "2"],
        );
        assert!(o.status.success(), "volume create: {o:?}");
    }

    let bin = std::path::Path::new(BIN);
    let script = SCRIPT.replace(
        "@@KERNEL-DEVICES-SH@@",
        include_str!("../../../bench/kernel-devices.sh"),
    );
    let initrd = guest::initrd(
        dir.path(),
        &script,
        &[
            (bin, "/bin/trireme"),
            (std::path::Path::new("/sbin/mkfs.ext4"), "/sbin/mkfs.ext4"),
            (std::path::Path::new("/usr/bin/fio"), "/usr/bin/fio"),
        ],
    );
    let mut g = Guest::boot(&net, &initrd);
    g.expect("@@ GUEST-UP", Duration::from_secs(120));
    for kind in ["ublk", "nbd"] {
        let dev = g.expect("@@ MAPPED", Duration::from_secs(120));
        assert!(dev.contains(&format!("/dev/{kind}")), "{dev}");
        g.expect("@@ KILL-NODE", Duration::from_secs(180));
        // A node killed -9 under the write, back two seconds later.
        procs.0[1].kill().unwrap();
        let _ = procs.0[1].wait();
        std::thread::sleep(Duration::from_secs(2));
        procs.0[1] = node(&net, dir.path(), 1);
        g.expect("@@ MAP-KILLED", Duration::from_secs(180));
        g.expect("@@ MAPPED-AGAIN", Duration::from_secs(180));
        g.expect("@@ WRITES", Duration::from_secs(300));
        // NBD grows online; ublk where the kernel can (6.16+), else it says it keeps its size.
        let size = g.expect("@@ ", Duration::from_secs(120));
        let grew = size.contains("@@ GREW") || (kind == "ublk" && size.contains("@@ KEPT-SIZE"));
        assert!(grew, "{kind}: {size}; its console:\n{}", g.log.join("\n"));
        eprintln!("guest: {size}");
        g.expect("@@ MAPPED-SNAPSHOT", Duration::from_secs(300));
        g.expect("@@ ROUND-OK", Duration::from_secs(300));
    }
    let done = loop {
        let l = g.expect("@@ ", Duration::from_secs(300));
        if ["RESULT-OK", "FAIL", "GUEST-DONE"]
            .iter()
            .any(|w| l.contains(w))
        {
            break l;
        }
    };
    assert!(
        done.contains("RESULT-OK"),
        "the guest said {done}; its console:\n{}",
        g.log.join("\n")
    );
    // What happened, for `--nocapture`: the markers and the kernel's NBD lines.
    for l in g
        .log
        .iter()
        .filter(|l| l.contains("@@") || l.contains("nbd0") || l.contains("ublk"))
    {
        eprintln!("guest: {l}");
    }
    drop(g);
    // Every copy holds the same bytes, once resynced.
    for v in ["v", "w"] {
        until(&net, &["volume", "verify", v], "identical copies", |o| {
            o.status.success()
        });
    }
}

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

/// What the guest runs for NVMe/TCP: Linux's own initiator connects to both servers (two
/// paths, native multipath: one device), mkfs, mount, a fio verify job and files written
/// while the host kills the optimized server -9 (`@@ KILL-WRITER`); then a remount and every
/// file checked.
const NVME_SCRIPT: &str = r#"
fail() { echo "@@ FAIL $*"; dmesg | grep -i nvme | tail -30; exit 1; }
NQN=nqn.2026-12.io.trireme:trireme:n
for p in 4420 4421; do
  echo "transport=tcp,traddr=10.0.2.2,trsvcid=$p,nqn=$NQN,hostnqn=nqn.2026-12.io.trireme:guest,hostid=5a1c0d3e-7d21-4e6b-9b38-0c9f6d9a7a11" > /dev/nvme-fabrics || fail "connect $p"
done
# A host not on the access list is refused.
echo "transport=tcp,traddr=10.0.2.2,trsvcid=4420,nqn=$NQN,hostnqn=nqn.2014-08.org.nvmexpress:uuid:mallory,hostid=0d9c3b1e-1111-4e6b-9b38-0c9f6d9a7a11" > /dev/nvme-fabrics 2>/dev/null && fail "a stranger connected"
i=0; until [ -b /dev/nvme0n1 ]; do i=$((i+1)); [ $i -gt 100 ] && fail "no /dev/nvme0n1"; sleep 0.2; done
ls /sys/block
echo "@@ PATHS $(cat /sys/block/nvme0c0n1/ana_state) $(cat /sys/block/nvme0c1n1/ana_state)"
mkfs.ext4 -q -F /dev/nvme0n1 || fail mkfs
mount /dev/nvme0n1 /mnt || fail mount
dd if=/dev/urandom of=/mnt/a bs=64k count=32 conv=fsync 2>/dev/null || fail "write a"
sha256sum /mnt/a > /tmp/sums
fio --name=verify --filename=/mnt/fio.dat --size=4M --rw=randwrite --bs=4k --direct=1 --ioengine=psync --verify=crc32c --do_verify=1 --randrepeat=0 >/tmp/fio.log 2>&1 &
FIO=$!
echo "@@ KILL-WRITER"
i=0; while [ $i -lt 16 ]; do dd if=/dev/urandom of=/mnt/b.$i bs=64k count=16 conv=fsync 2>/dev/null || fail "write b.$i across the failover"; sha256sum /mnt/b.$i >> /tmp/sums; i=$((i+1)); done
wait $FIO || fail "fio verify: $(tail -20 /tmp/fio.log)"
grep -q "err= 0" /tmp/fio.log || fail "fio: $(cat /tmp/fio.log)"
umount /mnt || fail umount
mount /dev/nvme0n1 /mnt || fail remount
sha256sum -c /tmp/sums >/dev/null || fail "files after the remount"
umount /mnt
echo "@@ PATHS-AFTER $(cat /sys/block/nvme0c0n1/ana_state) $(cat /sys/block/nvme0c1n1/ana_state)"
dmesg | grep -ci "I/O error" | sed 's/^/@@ IO-ERRORS /'
for c in /sys/class/nvme/nvme*; do echo 1 > $c/delete_controller; done
echo "@@ NVME-OK"
# The kernel-initiator benchmark runs as shipped, on volume k, its target in the guest (one
# second a job: TCG times nothing).
cat > /tmp/nk.sh <<'NK'
@@NVMF-KERNEL-SH@@
NK
T="trireme --transport tcp --etcd http://10.0.2.2:2379"
i=0; while $T --output json status 2>/dev/null | grep -qi '"unverified"\|"resyncing"'; do i=$((i+1)); [ $i -gt 600 ] && fail "the volumes never settled"; sleep 0.5; done
SIZE=16M HOSTNQN=nqn.2026-12.io.trireme:guest HOSTID=5a1c0d3e-7d21-4e6b-9b38-0c9f6d9a7a11 TRIREME="$T" sh /tmp/nk.sh k 1 >/tmp/nk.out 2>&1 || fail "bench/nvmf-kernel.sh: $(cat /tmp/nk.out)"
cat /tmp/nk.out
awk '$1 == "randwrite" && $2 == 128 && $3 > 0 && $4 > 0 && $5 > 0 { ok = 1 } END { exit !ok }' /tmp/nk.out || fail "the benchmark's table: $(cat /tmp/nk.out)"
echo "@@ NVMF-KERNEL-OK"
"#;

/// `nvmf serve n` on port `port` (id `id`) in the guest's network, its log in `dir`.
fn nvmf_target(net: &GuestNet, dir: &std::path::Path, port: u16, id: u32) -> Child {
    net.cmd(BIN)
        .args(["--etcd", ETCD, "--transport", "tcp", "nvmf", "serve", "n"])
        .args(["--listen", &format!("10.0.2.2:{port}")])
        .args(["--port-id", &id.to_string(), "--lease-ttl", "2s"])
        .env("TRIREME_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("nvmf-{id}.log"))).unwrap())
        .spawn()
        .unwrap()
}

fn optimized(dir: &std::path::Path, id: u32) -> bool {
    std::fs::read_to_string(dir.join(format!("nvmf-{id}.log")))
        .unwrap_or_default()
        .contains("its path is ANA optimized")
}

#[test]
fn linux_nvme_tcp_multipath_survives_the_writers_server_kill() {
    let Some(_one) = guest_turn() else {
        return;
    };
    if !std::path::Path::new(guest::GUEST)
        .join("modules/nvme-tcp.ko")
        .exists()
    {
        eprintln!("SKIPPED: the guest has no nvme-tcp module (scripts/setup.sh unpacks it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let net = GuestNet::create();
    let mut procs = cluster(&net, dir.path());
    let create = ["volume", "create", "n", "--size", "128M", "--replicas", "2"];
    assert!(trireme(&net, &create).status.success());
    let allow = [
        "volume",
        "access",
        "n",
        "--allow",
        "nqn.2026-12.io.trireme:guest",
        "--deny",
        "*",
    ];
    assert!(trireme(&net, &allow).status.success());
    // The benchmark's volume (bench/nvmf-kernel.sh, run in the guest at the end).
    let create = ["volume", "create", "k", "--size", "64M", "--replicas", "2"];
    assert!(trireme(&net, &create).status.success());
    let allow_k = [
        "volume",
        "access",
        "k",
        "--allow",
        "nqn.2026-12.io.trireme:guest",
    ];
    assert!(trireme(&net, &allow_k).status.success());
    let a = procs.0.len();
    procs.0.push(nvmf_target(&net, dir.path(), 4420, 1));
    let t0 = Instant::now();
    while !optimized(dir.path(), 1) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "server 1 never took the writer"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    procs.0.push(nvmf_target(&net, dir.path(), 4421, 2));
    std::thread::sleep(Duration::from_secs(1));

    let script = NVME_SCRIPT.replace(
        "@@NVMF-KERNEL-SH@@",
        include_str!("../../../bench/nvmf-kernel.sh"),
    );
    let initrd = guest::initrd(
        dir.path(),
        &script,
        &[
            (std::path::Path::new(BIN), "/bin/trireme"),
            (std::path::Path::new("/sbin/mkfs.ext4"), "/sbin/mkfs.ext4"),
            (std::path::Path::new("/usr/bin/fio"), "/usr/bin/fio"),
        ],
    );
    let mut g = Guest::boot(&net, &initrd);
    g.expect("@@ GUEST-UP", Duration::from_secs(120));
    let paths = g.expect("@@ PATHS", Duration::from_secs(120));
    assert!(
        paths.contains("optimized") && paths.contains("inaccessible"),
        "{paths}"
    );
    g.expect("@@ KILL-WRITER", Duration::from_secs(300));
    std::thread::sleep(Duration::from_secs(1));
    procs.0[a].kill().unwrap();
    let _ = procs.0[a].wait();
    let after = g.expect("@@ PATHS-AFTER", Duration::from_secs(600));
    assert!(optimized(dir.path(), 2), "server 2 took the writer");
    eprintln!("guest: {paths} / {after}");
    let errors = g.expect("@@ IO-ERRORS", Duration::from_secs(60));
    assert!(errors.ends_with(" 0"), "{errors}\n{}", g.log.join("\n"));
    g.expect("@@ NVME-OK", Duration::from_secs(60));
    g.expect("@@ NVMF-KERNEL-OK", Duration::from_secs(600));
    for l in g
        .log
        .iter()
        .filter(|l| l.contains("nvme") || l.contains("rand"))
    {
        eprintln!("guest: {l}");
    }
    let v = trireme(&net, &["volume", "verify", "n"]);
    let out = String::from_utf8_lossy(&v.stdout);
    assert!(out.contains("0 mismatching"), "{out}");
}
