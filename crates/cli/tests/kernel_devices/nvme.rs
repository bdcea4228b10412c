//! Linux's own NVMe/TCP initiator in the guest: two paths to two servers (ANA), the
//! optimized one killed -9 under a file system; then `bench/nvmf-kernel.sh` as shipped.

use super::*;

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
# The device, and both paths under it: the second controller's namespace may come a moment
# after the device does.
i=0; until [ -b /dev/nvme0n1 ] && [ -e /sys/block/nvme0c0n1/ana_state ] && [ -e /sys/block/nvme0c1n1/ana_state ]; do
  i=$((i+1)); [ $i -gt 100 ] && { ls /sys/block; fail "no /dev/nvme0n1 with two paths"; }; sleep 0.2
done
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
        include_str!("../../../../bench/nvmf-kernel.sh"),
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
