//! A volume as a kernel block device (`trireme map`), in a Linux guest under qemu (this
//! host's kernel has neither ublk nor an NBD client): the guest maps a volume of a cluster on
//! etcd running here, as a ublk device and then (another volume) through the kernel's NBD
//! client, makes a file system on it, and keeps writing while a node is killed -9 and while
//! `map` itself is killed -9 and started again. Nothing may fail, every file must read back
//! after a remount, and the copies must be identical. The CSI node service (`csi.rs`) and
//! Linux's NVMe/TCP initiator (`nvme.rs`) run in the same guest, one test at a time.

#[path = "../common/mod.rs"]
mod common;
mod csi;
mod nvme;
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
# A map's output file is written by the background job's shell: one left by the last round
# could be read before that shell truncates it.
rm -f /tmp/sums /tmp/stop /tmp/c.* /tmp/map* /tmp/a.sock
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
# The same until told to stop, while map is killed -9 and started again (/tmp is not on it),
# over 48 names in turn: however long the round, the file system never fills.
# The count goes in by a rename: read while a plain `>` had just emptied it, it was "".
(i=0; while [ ! -e /tmp/stop ]; do echo $i > /tmp/c.at.new; mv /tmp/c.at.new /tmp/c.at; dd if=/dev/urandom of=/mnt/c.$((i % 48)) bs=64k count=8 conv=fsync 2>/tmp/c.dd || { echo "c.$i: $(cat /tmp/c.dd)" > /tmp/c.err; break; }; i=$((i+1)); done; echo $i > /tmp/c.done) &
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
rm -f /tmp/map*
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
        include_str!("../../../../bench/kernel-devices.sh"),
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
