//! Diffs move between trireme and a real Ceph cluster, both ways. The test starts one: a
//! monitor and one OSD (memstore, no cephx) on 127.0.0.1, in a temporary directory.
//! - `trireme volume diff` writes two diffs (to s1, then s1 to s2); Ceph's `rbd import-diff`
//!   applies them to an RBD image, whose snapshots s1 and s2 then read as trireme's.
//! - Ceph's `rbd export-diff` writes two of an RBD image (to a, then a to b, written by
//!   `rbd bench`); `trireme volume import-diff` applies them to a new volume, whose
//!   snapshots then read as Ceph's.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: &str = "32M";

/// A one-monitor, one-OSD Ceph cluster, stopped on drop.
struct Ceph {
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
}

impl Ceph {
    fn conf(&self) -> PathBuf {
        self.dir.path().join("ceph.conf")
    }

    /// A Ceph command against this cluster (`timeout`: a command with no monitor to reach
    /// waits forever).
    fn cmd(&self, tool: &str) -> Command {
        let mut c = Command::new("timeout");
        c.args(["120", tool]).arg("--conf").arg(self.conf());
        c
    }

    /// `TOOL ARGS`, which must succeed: what it printed.
    fn ok(&self, tool: &str, args: &[&str]) -> String {
        let o = self.cmd(tool).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "{tool} {args:?}: {}\n{}",
            text(&o),
            self.logs()
        );
        text(&o)
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["mon.a", "osd.0"] {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            out += &format!("--- {name}.log (last lines)\n");
            for l in tail.into_iter().rev() {
                out += l;
                out += "\n";
            }
        }
        out
    }

    /// Starts `TOOL -i ID` in the foreground: a child of the test, stopped on drop (and
    /// killed if the test's thread dies first).
    fn daemon(&mut self, tool: &str, id: &str) {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(tool);
        cmd.arg("--conf")
            .arg(self.conf())
            .args(["-f", "-i", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.daemons.push(cmd.spawn().unwrap());
    }

    fn start() -> Ceph {
        for t in [
            "ceph-mon",
            "ceph-osd",
            "ceph",
            "rbd",
            "monmaptool",
            "ceph-authtool",
        ] {
            need(t);
        }
        let mut c = Ceph {
            dir: tempfile::tempdir().unwrap(),
            daemons: Vec::new(),
        };
        let d = c.dir.path().to_str().unwrap().to_string();
        let port = free_port();
        let fsid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let fsid = fsid.trim();
        // No cephx: nothing but this test reaches 127.0.0.1 here. memstore: the OSD keeps
        // its objects in memory. One copy, and a monitor that does not stop on a host with
        // little free disk.
        let conf = format!(
            "[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{port}
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
osd objectstore = memstore
memstore device bytes = 536870912
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon data avail warn = 1
mon data avail crit = 0
osd crush chooseleaf type = 0
run dir = {d}
log file = {d}/$name.log
admin socket = {d}/$name.asok
mon data = {d}/mon
osd data = {d}/osd$id
keyring = {d}/keyring
mon initial members = a
"
        );
        std::fs::write(c.conf(), conf).unwrap();
        let keyring = format!("{d}/keyring");
        run(Command::new("ceph-authtool").args([
            "--create-keyring",
            &keyring,
            "--gen-key",
            "-n",
            "mon.",
            "--cap",
            "mon",
            "allow *",
        ]));
        let monmap = format!("{d}/monmap");
        run(Command::new("monmaptool").args([
            "--create",
            "--fsid",
            fsid,
            "--addv",
            "a",
            &format!("[v2:127.0.0.1:{port}]"),
            &monmap,
        ]));
        c.ok(
            "ceph-mon",
            &[
                "--mkfs",
                "-i",
                "a",
                "--monmap",
                &monmap,
                "--keyring",
                &keyring,
            ],
        );
        c.daemon("ceph-mon", "a");
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let uuid = uuid.trim();
        let id = c.ok("ceph", &["osd", "new", uuid]).trim().to_string();
        assert_eq!(id, "0");
        std::fs::create_dir(c.dir.path().join("osd0")).unwrap();
        c.ok("ceph-osd", &["--mkfs", "-i", &id, "--osd-uuid", uuid]);
        c.daemon("ceph-osd", &id);
        let t0 = Instant::now();
        while !c.ok("ceph", &["osd", "stat"]).contains("1 up") {
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "the OSD did not come up\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        c.ok("ceph", &["osd", "pool", "create", "rbd", "8", "8"]);
        c.ok(
            "ceph",
            &[
                "osd",
                "pool",
                "set",
                "rbd",
                "size",
                "1",
                "--yes-i-really-mean-it",
            ],
        );
        c.ok("rbd", &["pool", "init", "rbd"]);
        c
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// `qemu-io -c CMD` on the volume's export.
fn io(c: &Cluster, cmd: &str) {
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", cmd])
        .arg(&c.unix));
}

/// Snapshot `name` of `volume` reads exactly as `image`.
fn snapshot_reads_as(c: &Cluster, volume: &str, name: &str, image: &Path) {
    let export = format!("{volume}@{name}");
    let sock = c.path().join(format!("{volume}-{name}.sock"));
    let (mut nbd, uri) = spawn_nbd(c, &export, &sock);
    compare_image(image, &uri);
    let _ = nbd.kill();
    let _ = nbd.wait();
}

#[test]
fn diffs_move_between_trireme_and_a_ceph_cluster_both_ways() {
    for t in ["qemu-img", "qemu-io"] {
        need(t);
    }
    let ceph = Ceph::start();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let p = |name: &str| w.join(name).to_str().unwrap().to_string();
    let c = Cluster::start(&["--store", "file", "--size", SIZE]);

    // trireme to Ceph: s1 (writes, one unaligned), then s2 (overwrites, a discard, a write
    // across two blocks).
    io(&c, "write -P 7 0 1M");
    io(&c, "write -P 9 5000 70000");
    io(&c, "write -P 11 20M 3M");
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    io(&c, "write -P 13 4096 8192");
    io(&c, "discard 20M 1M");
    io(&c, "write -P 15 30M 4096");
    io(&c, "write -P 17 12286 4");
    ok(&c, &["volume", "snapshot", "create", "vol0", "s2"]);
    io(&c, "write -P 19 0 4096"); // after s2: in neither diff
    let (t1, t12) = (p("t1.rbdiff"), p("t12.rbdiff"));
    ok(&c, &["volume", "diff", "vol0@s1", "-o", &t1]);
    ok(&c, &["volume", "diff", "vol0@s1", "vol0@s2", "-o", &t12]);
    ceph.ok("rbd", &["create", "--size", SIZE, "rbd/fromtrireme"]);
    for f in [&t1, &t12] {
        ceph.ok(
            "rbd",
            &["import-diff", "--no-progress", f, "rbd/fromtrireme"],
        );
    }
    let snaps = ceph.ok("rbd", &["snap", "ls", "rbd/fromtrireme"]);
    assert!(snaps.contains("s1") && snaps.contains("s2"), "{snaps}");
    for s in ["s1", "s2"] {
        let img = p(&format!("ceph-{s}.img"));
        ceph.ok(
            "rbd",
            &[
                "export",
                "--no-progress",
                &format!("rbd/fromtrireme@{s}"),
                &img,
            ],
        );
        snapshot_reads_as(&c, "vol0", s, Path::new(&img));
    }
    assert_ne!(
        std::fs::read(p("ceph-s1.img")).unwrap(),
        std::fs::read(p("ceph-s2.img")).unwrap()
    );

    // Ceph to trireme: an image of random bytes, snapshot a; random 4 KiB writes by `rbd
    // bench`, snapshot b.
    let seed: Vec<u8> = (0..32u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(w.join("src.img"), &seed).unwrap();
    ceph.ok(
        "rbd",
        &["import", "--no-progress", &p("src.img"), "rbd/src"],
    );
    ceph.ok("rbd", &["snap", "create", "--no-progress", "rbd/src@a"]);
    ceph.ok(
        "rbd",
        &[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "4096",
            "--io-total",
            "2M",
            "--io-pattern",
            "rand",
            "rbd/src",
        ],
    );
    ceph.ok("rbd", &["snap", "create", "--no-progress", "rbd/src@b"]);
    ceph.ok(
        "rbd",
        &["export-diff", "--no-progress", "rbd/src@a", &p("ca.rbdiff")],
    );
    ceph.ok(
        "rbd",
        &[
            "export-diff",
            "--no-progress",
            "--from-snap",
            "a",
            "rbd/src@b",
            &p("cab.rbdiff"),
        ],
    );
    ok(&c, &["volume", "create", "fromceph", "--size", SIZE]);
    let said = ok(&c, &["volume", "import-diff", &p("ca.rbdiff"), "fromceph"]);
    assert!(said.contains("took snapshot fromceph@a"), "{said}");
    let said = ok(&c, &["volume", "import-diff", &p("cab.rbdiff"), "fromceph"]);
    assert!(said.contains("took snapshot fromceph@b"), "{said}");
    for s in ["a", "b"] {
        let img = p(&format!("src-{s}.img"));
        ceph.ok(
            "rbd",
            &["export", "--no-progress", &format!("rbd/src@{s}"), &img],
        );
        snapshot_reads_as(&c, "fromceph", s, Path::new(&img));
    }
    // `rbd bench` wrote something: b is not a.
    assert_ne!(
        std::fs::read(p("src-a.img")).unwrap(),
        std::fs::read(p("src-b.img")).unwrap()
    );
}
