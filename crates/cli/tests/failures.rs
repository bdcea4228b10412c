//! Failures under load, with real processes: a `trireme bench --verify` workload runs through the
//! NBD export of `trireme up` while the test kills (SIGKILL), freezes (SIGSTOP) and stops nodes.
//! Afterwards: the workload saw no error and the oracle found no lost, stale or corrupt block;
//! every replica is back in sync and byte-identical; and each resync copied no more than the
//! bound it is allowed (the writes of the run for an incremental one).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    assert_replicas_identical, cli_ok, finish_bench, node_pid, resyncs, signal, start_bench,
    status, wait_all_in_sync, wait_restarted, wait_state, Cluster, BIN,
};

/// One fault at a time, each after the previous one healed: a 3-way volume must survive any
/// single failure (and two at once, but then the third copy is the only one; a fault on it
/// while the others resync is beyond the contract). The workload runs throughout.
#[test]
fn killed_and_frozen_nodes_lose_nothing_and_resync_incrementally() {
    let c = Cluster::start(&["--store", "file", "--size", "128M"]);
    let bench = start_bench(&c, 20);
    std::thread::sleep(Duration::from_secs(2));
    // A crash: the supervisor restarts it, its file replica is the same history.
    let p2 = node_pid(&c, 2);
    signal(p2, libc::SIGKILL);
    wait_restarted(&c, 2, p2);
    wait_all_in_sync(&c);
    // A freeze longer than the replica timeout: taken out without an error to the client.
    let p3 = node_pid(&c, 3);
    signal(p3, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    signal(p3, libc::SIGCONT);
    wait_all_in_sync(&c);
    // Two at once: a crash and a freeze.
    let p1 = node_pid(&c, 1);
    let p3 = node_pid(&c, 3);
    signal(p3, libc::SIGSTOP);
    signal(p1, libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(1500));
    signal(p3, libc::SIGCONT);
    let v = finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");

    let max_ms = v["total"]["latency_us"]["max"].as_f64().unwrap() / 1000.0;
    assert!(max_ms < 5000.0, "I/O stalled for {max_ms} ms");
    let written = v["write"]["bytes"].as_u64().unwrap();
    let r = resyncs(&c);
    assert!(
        r.len() >= 4,
        "expected a resync per fault: {r:?}\n{}",
        c.log()
    );
    for (full, copied) in &r {
        assert!(
            !full,
            "same-history replicas must resync incrementally: {r:?}"
        );
        assert!(
            *copied <= written,
            "resync copied {copied} bytes, more than the {written} written: {r:?}\n{}",
            c.log()
        );
    }
}

#[test]
fn planned_stop_of_a_two_way_volume_and_a_lost_memory_replica() {
    let c = Cluster::start(&["--store", "memory", "--size", "64M", "--replicas", "2"]);
    let info = c.cli(&["--output", "json", "volume", "info", "vol0"]);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let node = info["replicas"][1]["node"].as_u64().unwrap() as u32;
    let bench = start_bench(&c, 6);
    std::thread::sleep(Duration::from_secs(2));
    let out = c.cli(&["node", "stop", &node.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_secs(2));
    // Writes go on with one copy, which the metadata says is the only in-sync one.
    let s = status(&c);
    let states: Vec<&str> = s["volumes"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == "in-sync").count(),
        1,
        "{states:?}"
    );
    let again = c.cli(&["node", "stop", &node.to_string()]);
    assert!(again.status.success());
    let out = c.cli(&["node", "start", &node.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dup = c.cli(&["node", "start", &node.to_string()]);
    assert!(!dup.status.success(), "starting a running node is refused");
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    // The memory replica came back empty: a full (compare) resync, never incremental.
    let r = resyncs(&c);
    assert!(
        !r.is_empty() && r.iter().all(|(full, _)| *full),
        "{r:?}\n{}",
        c.log()
    );
}

/// The resync target crashes midway, then (on the next attempt) a resync source does: each
/// time the copy resumes from what is still recorded, and everything converges.
#[test]
fn crashes_during_resync_of_target_and_source() {
    let c = Cluster::start(&["--store", "file", "--size", "64M", "--resync-rate", "4M"]);
    let bench = start_bench(&c, 18);
    std::thread::sleep(Duration::from_millis(500));
    let p3 = node_pid(&c, 3);
    signal(p3, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    signal(p3, libc::SIGCONT);
    wait_state(&c, 3, "resyncing");
    std::thread::sleep(Duration::from_millis(500));
    signal(p3, libc::SIGKILL);
    wait_restarted(&c, 3, p3);
    wait_state(&c, 3, "resyncing");
    std::thread::sleep(Duration::from_millis(500));
    let p1 = node_pid(&c, 1);
    signal(p1, libc::SIGKILL);
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    let r = resyncs(&c);
    assert!(r.iter().all(|(full, _)| !full), "{r:?}\n{}", c.log());
}

/// A writer frozen while another host attaches: the new writer reconciles (the old one left
/// writes in flight), and when the old one wakes up every request it sends is refused — the
/// volume's bytes do not change.
#[test]
fn a_zombie_writer_resumed_after_a_new_attach_changes_nothing() {
    common::need("nbdcopy");
    let c = Cluster::start(&["--store", "memory", "--size", "32M"]);
    let bench_on_volume = |secs: u32| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(c.path())
            .args(["--log", "info"])
            .args([
                "bench", "--verify", "-b4K", "-w50", "-r", "-t1", "-o8", "-W0",
            ])
            .arg(format!("-d{secs}"))
            .arg("volume:vol0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let zombie = bench_on_volume(30);
    let _zombie_guard = PidGuard(zombie.id() as i32);
    std::thread::sleep(Duration::from_secs(2));
    signal(zombie.id() as i32, libc::SIGSTOP);
    // The new writer: its verified run must be clean.
    let b = bench_on_volume(2).wait_with_output().unwrap();
    assert!(
        b.status.success(),
        "new writer: {}",
        String::from_utf8_lossy(&b.stderr)
    );
    let log = String::from_utf8_lossy(&b.stderr);
    assert!(
        log.contains("reconciled replicas after an unclean writer change"),
        "the new writer must reconcile: {log}"
    );
    // Snapshot the volume through a third writer, wake the zombie, snapshot again.
    let sock = c.path().join("reader.sock");
    let (reader, uri) = common::spawn_nbd(&c, "vol0", &sock);
    // Stopped even if an assertion fails below.
    let mut reader = KillOnDrop(reader);
    let snap = |name: &str| {
        let p = c.path().join(name);
        common::run(Command::new("nbdcopy").arg(&uri).arg(&p));
        std::fs::read(p).unwrap()
    };
    let before = snap("before.img");
    signal(zombie.id() as i32, libc::SIGCONT);
    let z = zombie.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&z.stderr);
    assert!(
        !z.status.success(),
        "the zombie must fail, not write: {err}"
    );
    assert!(err.contains("fenced"), "{err}");
    let after = snap("after.img");
    assert!(before == after, "the zombie changed the volume");
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(reader.0.id() as i32, libc::SIGTERM) };
    reader.0.wait().unwrap();
    assert_replicas_identical(&c, "vol0");
}

/// Kills a process by pid when the test ends, however it ends (even if it is stopped).
struct PidGuard(i32);

impl Drop for PidGuard {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child of this test; harmless if it already exited and was reaped
        // (the pid is not reused while the test process runs this quickly).
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
        }
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node whose store fails reads, writes and flushes with EIO now and then (an error-injecting
/// wrapper): the client sees no error, that replica is taken out and resynced, and once the
/// disk behaves, everything converges.
#[test]
fn store_errors_on_one_node_cost_no_error_and_converge() {
    let c = Cluster::start(&["--store", "file", "--size", "64M", "--inject-faults"]);
    let spec = c.path().join("node-2.faults");
    std::fs::write(&spec, "read=0.02 write=0.02 flush=0.2 seed=3").unwrap();
    let bench = start_bench(&c, 6);
    finish_bench(&c, bench);
    std::fs::write(&spec, "").unwrap();
    // The node rereads its spec at most every 100 ms: until then the faults go on, and
    // `verify` below would meet one.
    std::thread::sleep(Duration::from_millis(300));
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    let log = c.log();
    assert!(
        log.contains("node=2 state=outdated") || log.contains("node=2 state=failed"),
        "the failing disk's replica was taken out:\n{log}"
    );
}

/// A replica corrupted behind the system's back (bytes changed in its data file): `volume
/// verify` sees it, `volume scrub` repairs it from the majority while the volume stays online,
/// and the data reads back as written.
#[test]
fn scrub_repairs_a_corrupted_replica_from_the_majority() {
    common::need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);
    qemu_io(&c.unix, "write -P 0x5a 0 1M");
    let clean = c.cli(&["volume", "verify", "vol0"]);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    corrupt(&c, 3, 65536, 4096);
    let bad = c.cli(&["volume", "verify", "vol0"]);
    assert_eq!(bad.status.code(), Some(1), "verify must see the corruption");
    let out = c.cli(&["--output", "json", "volume", "scrub", "vol0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["mismatched_regions"], 1, "{r}");
    assert_eq!(r["repaired"][0][1], 3, "{r}");
    common::assert_replicas_identical(&c, "vol0");
    // Overlapping reads spread over the replicas: all of them must return the pattern.
    read_pattern_overlapping(&c.unix);
}

/// Runs one qemu-io command on an NBD URI (raw format); panics if it fails.
fn qemu_io(uri: &str, cmd: &str) {
    qemu_io_all(uri, &[cmd.to_string()]);
}

/// Overwrites `len` bytes at `at` of node `node`'s replica of volume 1 with 0xff, behind the
/// node's back (bit rot, a misdirected write).
fn corrupt(c: &Cluster, node: u32, at: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let data = c
        .path()
        .join(format!("node-{node}"))
        .join("replica-0000000000000001.data");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.write_all_at(&vec![0xff; len], at).unwrap();
    f.sync_all().unwrap();
}

/// Reads the first MiB `times` times through the export, in 64 KiB reads one after another
/// (so they stay on one copy, and move to the next after one fails); qemu-io fails unless
/// every byte is 0x5a.
fn read_pattern(c: &Cluster, times: usize) {
    let cmds: Vec<String> = (0..16)
        .map(|k| format!("read -P 0x5a {} 64K", k * 65536))
        .collect();
    for _ in 0..times {
        qemu_io_all(&c.unix, &cmds);
    }
}

/// Reads the first MiB as 16 reads in flight at once, which rotate over the in-sync copies,
/// so each copy serves some of it; qemu-io fails unless every byte is 0x5a.
fn read_pattern_overlapping(uri: &str) {
    let mut cmds: Vec<String> = (0..16)
        .map(|k| format!("aio_read -P 0x5a {} 64K", k * 65536))
        .collect();
    cmds.push("aio_flush".into());
    // qemu-io exits 0 when an aio_read's pattern check fails, so its report is read instead.
    let out = qemu_io_all(uri, &cmds);
    assert!(!out.contains("failed"), "{out}");
    assert_eq!(out.matches("read 65536/65536 bytes").count(), 16, "{out}");
}

/// Runs qemu-io commands on `uri` in one process (raw format); their output. Panics if
/// qemu-io fails.
fn qemu_io_all(uri: &str, cmds: &[String]) -> String {
    let mut q = Command::new("qemu-io");
    q.args(["-f", "raw"]);
    for cmd in cmds {
        q.args(["-c", cmd]);
    }
    common::run(q.arg(uri))
}

fn volume_nodes(c: &Cluster, name: &str) -> Vec<u32> {
    let out = c.cli(&["--output", "json", "volume", "info", name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_u64().unwrap() as u32)
        .collect()
}

/// `node drain` moves the replica of a live node while the workload writes through the export's
/// writer; `node remove` re-creates the replica of a dead node elsewhere, through a writer the
/// manager attaches itself (the volume has none). Nothing is lost and every copy matches.
#[test]
fn drain_and_remove_move_replicas_while_io_goes_on() {
    let c = Cluster::start(&[
        "--store",
        "memory",
        "--size",
        "64M",
        "--nodes",
        "4",
        "--replicas",
        "2",
    ]);
    cli_ok(
        &c,
        &[
            "volume",
            "create",
            "data1",
            "--size",
            "32M",
            "--replicas",
            "2",
        ],
    );
    cli_ok(
        &c,
        &[
            "bench",
            "-b64K",
            "-w100",
            "-s",
            "-t1",
            "-o4",
            "-d1",
            "-W0",
            "volume:data1",
        ],
    );
    let vol0 = volume_nodes(&c, "vol0");
    let data1 = volume_nodes(&c, "data1");
    assert!(
        vol0.iter().all(|n| !data1.contains(n)),
        "{vol0:?} {data1:?}"
    );

    let bench = start_bench(&c, 10);
    std::thread::sleep(Duration::from_secs(2));
    // Drain, rate-limited, while the workload runs.
    let drained = vol0[0];
    let out = cli_ok(
        &c,
        &["node", "drain", &drained.to_string(), "--rate", "32M"],
    );
    assert!(out.contains("done"), "{out}");
    let now = volume_nodes(&c, "vol0");
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(!now.contains(&drained), "{now:?}");
    // A dead node of the idle volume: removed, its replica re-created from the other copy.
    let dead = data1[1];
    cli_ok(&c, &["node", "stop", &dead.to_string()]);
    let out = cli_ok(&c, &["node", "remove", &dead.to_string()]);
    assert!(out.contains("done"), "{out}");
    let now1 = volume_nodes(&c, "data1");
    assert_eq!(now1.len(), 2, "{now1:?}");
    assert!(
        !now1.contains(&dead) && !now1.contains(&drained),
        "{now1:?}"
    );

    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    assert_replicas_identical(&c, "data1");
    assert_eq!(c.log().matches("replica moved").count(), 2, "{}", c.log());
    let s = status(&c);
    let nodes = s["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().all(|n| n["id"].as_u64() != Some(dead as u64)),
        "{s}"
    );
    let d = nodes
        .iter()
        .find(|n| n["id"].as_u64() == Some(drained as u64))
        .unwrap();
    assert_eq!(d["state"], "draining", "{s}");
    assert_eq!(d["replicas"], 0, "{s}");
    // A removed node stays removed; a bad node id is a clear error.
    let out = c.cli(&["node", "start", &dead.to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed"));
    let out = c.cli(&["node", "drain", "9"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("node 9"));
    cli_ok(&c, &["node", "undrain", &drained.to_string()]);
}

/// Block checksums tell which copy is bad even when there are only two: a read that meets the
/// bad copy is served from the other and repairs it, and scrub repairs without a majority.
#[test]
fn block_checksums_find_and_repair_a_bad_copy_of_a_two_way_volume() {
    common::need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "16M", "--replicas", "2"]);
    qemu_io(&c.unix, "write -P 0x5a 0 1M");
    let nodes = volume_nodes(&c, "vol0");
    // Scrub: two copies, one fails its checksums: repaired from the other.
    corrupt(&c, nodes[1], 65536, 512);
    let bad = c.cli(&["--output", "json", "volume", "verify", "vol0"]);
    assert_eq!(bad.status.code(), Some(1), "verify must see the bad copy");
    let v: serde_json::Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(v["mismatches"][0]["bad_copies"][0], nodes[1], "{v}");
    let out = cli_ok(&c, &["--output", "json", "volume", "scrub", "vol0"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["bad_copies"], 1, "{r}");
    assert_eq!(r["repaired"][0][1], nodes[1], "{r}");
    assert_eq!(r["unresolved"].as_array().unwrap().len(), 0, "{r}");
    assert_replicas_identical(&c, "vol0");
    // Reads: every one returns the good bytes; the one that meets a bad copy repairs it.
    // Each copy goes bad in a different place. Reads one at a time stay on one copy until one
    // fails there, then move to the other, so both places are met (within two passes).
    corrupt(&c, nodes[1], 4096 * 100, 512);
    corrupt(&c, nodes[0], 4096 * 200, 512);
    read_pattern(&c, 2);
    assert!(
        c.log().contains("repaired a bad copy from a good one"),
        "{}",
        c.log()
    );
    assert_replicas_identical(&c, "vol0");
}

/// Survivors that crash while a replica is out keep their record of what it missed, on disk
/// (issue 17): node 3 is stopped, then both other nodes are killed and restarted, one after
/// the other, under the workload. Node 3's resync is still incremental: each survivor came
/// back with its saved record plus its activity log's extents. With the records in memory
/// only (`--volatile-bookkeeping`) the same run ends in a full compare.
#[test]
fn survivors_killed_while_a_replica_is_out_keep_its_record() {
    let c = Cluster::start(&["--store", "file", "--size", "64M"]);
    let bench = start_bench(&c, 16);
    std::thread::sleep(Duration::from_secs(1));
    cli_ok(&c, &["node", "stop", "3"]);
    std::thread::sleep(Duration::from_secs(2));
    for n in [1, 2] {
        let p = node_pid(&c, n);
        signal(p, libc::SIGKILL);
        wait_restarted(&c, n, p);
        wait_state(&c, n, "in-sync");
        std::thread::sleep(Duration::from_secs(1));
    }
    cli_ok(&c, &["node", "start", "3"]);
    let v = finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    let r = resyncs(&c);
    eprintln!(
        "resyncs (full, copied bytes): {r:?}; written {}",
        v["write"]["bytes"]
    );
    assert!(r.len() >= 3, "a resync per node: {r:?}\n{}", c.log());
    assert!(
        r.iter().all(|(full, _)| !full),
        "every resync incremental: {r:?}\n{}",
        c.log()
    );
}

/// The whole cluster crashes at once — `up` (the writer) and every node, SIGKILL — under a
/// write load, three times at random moments, and `up` is started again on the same data
/// directory each time (issue 17). Every write that completed before a crash reads back; the
/// new writer's reconcile covers the extents the nodes' activity logs kept on disk (where the
/// load was writing), not the whole volume; and the replicas end identical.
#[test]
fn whole_cluster_crashes_lose_no_completed_write_and_reconcile_only_the_log() {
    common::need("qemu-io");
    const MB: u64 = 1 << 20;
    let args = ["--store", "file", "--size", "64M"];
    let mut c = Cluster::start(&args);
    let mut rng = u64::from(std::process::id()) | 1;
    for round in 0..3u64 {
        // A completed write of its own pattern per round, far from the load.
        let at = 40 + 8 * round;
        let pattern = format!("{:#x}", 0x30 + round);
        qemu_io(&c.unix, &format!("write -P {pattern} {at}M 1M"));
        // Writes in flight at the crash, on the first 16 MiB (four 4 MiB log extents).
        let mut load = Command::new(BIN)
            .arg("--data-dir")
            .arg(c.path())
            .args([
                "bench", "-b4K", "-w100", "-r", "-t2", "-o8", "-d60", "-W0", "--span", "16M",
            ])
            .arg(&c.unix)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(1500 + rng % 2000));
        let dir = c.crash();
        let _ = load.kill();
        let _ = load.wait();
        c = Cluster::start_in(dir, &args);

        let t0 = Instant::now();
        let line = loop {
            if let Some(l) = c.log().lines().find(|l| l.contains("reconciled replicas")) {
                break l.to_string();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no reconcile:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("no {k} in {line}"))
                .to_string()
        };
        let compared: u64 = field("compared_bytes").parse().unwrap();
        eprintln!("round {round}: {line}");
        assert_eq!(
            field("whole"),
            "false",
            "the activity logs survived: {line}"
        );
        // The load's four extents, and the one of this round's pattern if the crash came
        // before the writer let it go.
        assert!(
            compared <= 20 * MB,
            "reconcile compared {compared} bytes, more than the logged extents: {line}"
        );
        for r in 0..=round {
            qemu_io(
                &c.unix,
                &format!("read -P {:#x} {}M 1M", 0x30 + r, 40 + 8 * r),
            );
        }
    }
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
}

/// Minimum copies (issue 17): a 3-way volume (minimum 2) with two nodes stopped holds its
/// writes — no error, no acknowledgement — and `status` says so; they resume when one node is
/// back in sync, and nothing acknowledged is lost. With the minimum lowered to 1, the same two
/// stops let writes go on.
#[test]
fn writes_wait_below_the_minimum_of_copies() {
    let c = Cluster::start(&["--store", "file", "--size", "64M"]);
    let suspended = |c: &Cluster| status(c)["volumes"][0]["writes_suspended"] == true;
    let bench = start_bench(&c, 14);
    std::thread::sleep(Duration::from_secs(1));
    cli_ok(&c, &["node", "stop", "2"]);
    cli_ok(&c, &["node", "stop", "3"]);
    let t0 = Instant::now();
    while !suspended(&c) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "writes never suspended:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = cli_ok(&c, &["status"]);
    assert!(text.contains("WRITES SUSPENDED"), "{text}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(suspended(&c), "still waiting for a copy");
    cli_ok(&c, &["node", "start", "3"]);
    let t0 = Instant::now();
    while suspended(&c) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "writes never resumed:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = finish_bench(&c, bench);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    let log = c.log();
    assert!(
        log.contains("writes suspended") && log.contains("writes resumed"),
        "{log}"
    );
    cli_ok(&c, &["node", "start", "2"]);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");

    // Lowered to 1: two copies out, and writes go on.
    let out = cli_ok(&c, &["volume", "set", "vol0", "--min-copies", "1"]);
    assert!(out.contains("min copies 1"), "{out}");
    let bad = c.cli(&["volume", "set", "vol0", "--min-copies", "3"]);
    assert!(bad.status.success(), "3 of 3 is allowed");
    let bad = c.cli(&["volume", "set", "nosuch", "--min-copies", "1"]);
    assert!(!bad.status.success());
    cli_ok(&c, &["volume", "set", "vol0", "--min-copies", "1"]);
    let bench = start_bench(&c, 6);
    std::thread::sleep(Duration::from_secs(1));
    cli_ok(&c, &["node", "stop", "2"]);
    cli_ok(&c, &["node", "stop", "3"]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(!suspended(&c), "min copies 1: writes go on");
    let v = finish_bench(&c, bench);
    let max_ms = v["total"]["latency_us"]["max"].as_f64().unwrap() / 1000.0;
    assert!(max_ms < 5000.0, "I/O stalled for {max_ms} ms");
    cli_ok(&c, &["node", "start", "2"]);
    cli_ok(&c, &["node", "start", "3"]);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
}

/// Patch Tuesday (issue 17): `trireme maintenance rolling` restarts every node in turn under
/// the verifying workload. No I/O error, nothing lost, every resync incremental, and the
/// report says what each restart cost.
#[test]
fn rolling_restart_under_load_loses_nothing() {
    let c = Cluster::start(&["--store", "file", "--size", "64M"]);
    let bench = start_bench(&c, 25);
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let out = cli_ok(&c, &["--output", "json", "maintenance", "rolling"]);
    let took = t0.elapsed();
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    eprintln!("rolling restart in {took:?}: {r}");
    let nodes = r["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{r}");
    for n in nodes {
        assert_eq!(n["volumes"], serde_json::json!(["vol0"]), "{r}");
        assert_eq!(
            n["full"], false,
            "a planned restart resyncs incrementally: {r}"
        );
    }
    let v = finish_bench(&c, bench);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    let r = resyncs(&c);
    assert!(r.len() >= 3 && r.iter().all(|(full, _)| !full), "{r:?}");
    // A restart that would leave fewer copies than the minimum is refused.
    cli_ok(&c, &["volume", "set", "vol0", "--min-copies", "3"]);
    let bad = c.cli(&["node", "restart", "1"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("minimum"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// A writer dies with writes in flight, and the first copy — the one a reconcile copies from —
/// has a bad block (bytes changed on its disk) in the region the activity log marks (issue
/// 17). The next writer's reconcile does not copy from it: it takes the region from a copy
/// that passes its block checksums and rewrites the bad one. Before, the reconcile failed and
/// so did the attach.
#[test]
fn a_reconcile_never_copies_from_a_bad_block() {
    common::need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);
    let sock = c.path().join("w.sock");
    let (mut first, uri) = common::spawn_nbd(&c, "vol0", &sock);
    qemu_io(&uri, "write -P 0x5a 0 1M");
    // The writer dies: the next one reconciles what its activity logs mark.
    first.kill().unwrap();
    first.wait().unwrap();
    corrupt(&c, 1, 65536, 4096);
    let (second, uri) = common::spawn_nbd(&c, "vol0", &sock);
    let _second = KillOnDrop(second);
    // Every copy serves the pattern (overlapping reads rotate over the replicas).
    read_pattern_overlapping(&uri);
    drop(_second);
    assert_replicas_identical(&c, "vol0");
}

/// A drain that dies midway — the whole cluster crashes while the new copy is being filled —
/// leaves no orphan (issue 17): run again, it resumes that copy instead of adding another,
/// and the volume ends with its three copies, none on the drained node.
#[test]
fn a_drain_run_again_after_a_crash_resumes_its_copy() {
    let args = ["--store", "file", "--size", "32M", "--nodes", "4"];
    let mut c = Cluster::start(&args);
    cli_ok(
        &c,
        &[
            "bench",
            "-b1M",
            "-w100",
            "-s",
            "-t1",
            "-o4",
            "-d3",
            "-W0",
            "volume:vol0",
        ],
    );
    let before = volume_nodes(&c, "vol0");
    let from = before[0];
    cli_ok(
        &c,
        &[
            "node",
            "drain",
            &from.to_string(),
            "--rate",
            "4M",
            "--no-wait",
        ],
    );
    let t0 = Instant::now();
    while volume_nodes(&c, "vol0").len() < 4 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no copy added:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let dir = c.crash();
    c = Cluster::start_in(dir, &args);
    let mid = volume_nodes(&c, "vol0");
    assert_eq!(
        mid.len(),
        4,
        "the unfinished copy is still recorded: {mid:?}"
    );
    cli_ok(&c, &["node", "drain", &from.to_string()]);
    let log = c.log();
    assert!(
        log.contains("earlier attempt"),
        "the move saw its earlier copy:\n{log}"
    );
    let after = volume_nodes(&c, "vol0");
    assert_eq!(after.len(), 3, "no orphan copy: {after:?}\n{}", c.log());
    assert!(!after.contains(&from), "{after:?}");
    let added: Vec<u32> = mid
        .iter()
        .copied()
        .filter(|n| !before.contains(n))
        .collect();
    assert!(
        after.contains(&added[0]),
        "the copy was resumed, not replaced: {after:?}"
    );
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
}
