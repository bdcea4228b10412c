//! A cluster of several servers on a real 3-member etcd cluster, started and stopped by the
//! test. Every host is a network namespace of its own (three etcd members, four servers, two
//! client hosts), joined by a bridge in one more namespace, so nothing changes in the host's
//! namespace; without root it all runs on 127.0.0.1 instead, and the partition is skipped.
//!
//! `trireme node run` x4, `trireme --etcd ... volume create`, `trireme attach` on client 1, and
//! a verifying workload through NBD while, one at a time: a node daemon is killed; a node is
//! cut off (iptables DROP in its namespace); the daemon holding the manager role is killed;
//! an etcd member is killed; all of etcd is frozen for 10 s. Then a node is drained while the
//! manager is killed (its successor finishes the job), a node dies for good and its replica is
//! re-created elsewhere after `--down-out-interval`, and the writer is killed and the volume
//! attached from client 2, and last every daemon is restarted in turn (`maintenance
//! rolling`). After each: no I/O error, no lost, stale or corrupt block, every replica in sync
//! and identical, and the metadata's epoch is the one every replica holds. A second, smaller
//! world (one etcd member, three servers) restarts the last copy in sync while writes wait
//! below the minimum of copies; a third declares a node gone for good (`node lost`) so that
//! a volume whose other copy lost power attaches without it; a fourth drains a parity copy
//! through the volume's writer on the client host.
//!
//! Needs `etcd` (Debian's etcd-server); `TRIREME_SKIP_ETCD=1` skips it.

mod common;

mod etcd_world;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{assert_tcp_for_want_of_rdma, signal};
use etcd_world::*;

#[test]
fn a_cluster_on_etcd_survives_node_manager_etcd_and_writer_failures() {
    if skipped() {
        return;
    }
    // Registered, and a manager elected.
    let mut w = World::start(3, 4, 2);

    // A second daemon with a taken id refuses to start, saying who holds it.
    let host = w.servers[1].clone();
    let dup = w
        .cmd_on(&host)
        .args(["node", "run", "--id", "2", "--insecure", "--listen"])
        .arg(format!("{}:0", host.ip))
        .arg("--dir")
        .arg(w.dir.path().join("dup"))
        .output()
        .unwrap();
    assert_eq!(dup.status.code(), Some(2), "{dup:?}");
    let why = String::from_utf8_lossy(&dup.stderr);
    assert!(why.contains("node id 2 is already held"), "{why}");

    w.create_and_attach();
    // A second attach, from the other client host, is refused while the first holds its record.
    let second = w
        .cmd_on(&w.clients[1])
        .args(["attach", "vol", "--socket"])
        .arg(w.dir.path().join("other.sock"))
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2), "{second:?}");
    assert!(String::from_utf8_lossy(&second.stderr).contains("is attached by"));

    // Faults, one at a time, under a verifying workload.
    let b = w.bench(if w.net.on { 42 } else { 36 });
    std::thread::sleep(Duration::from_secs(3));
    // The writer runs on a client host, the manager on a server: `status` shows the writer's
    // I/O from the report it writes to etcd (`reports/vol`).
    let t0 = Instant::now();
    loop {
        let io = w.status()["volumes"][0]["io"].clone();
        if io["write_iops"].as_f64().is_some_and(|x| x > 0.0) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "status never showed the writer's I/O: {io}\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let reps = w.replica_nodes();
    let m = w.manager_node();
    let victim = *reps.iter().find(|&&n| n != m).unwrap();
    w.kill_node(victim);
    std::thread::sleep(Duration::from_secs(3));
    w.start_node(victim);
    std::thread::sleep(Duration::from_secs(3));
    if w.net.on {
        // Cut off longer than the replica timeout and the lease: taken out, shown down, then
        // back with a resync.
        let cut = *reps.iter().rev().find(|&&n| n != m).unwrap();
        w.servers[cut as usize - 1].cut(true);
        std::thread::sleep(Duration::from_secs(4));
        w.servers[cut as usize - 1].cut(false);
        std::thread::sleep(Duration::from_secs(3));
    }
    let m = w.kill_manager();
    let m2 = w.manager_node();
    assert_ne!(m2, m, "another daemon takes the manager role");
    // The events are kept in etcd: the new manager shows those its predecessor recorded (the
    // victim's death) and goes on from them.
    w.wait_for_events(&[
        &format!("node {victim} is down"),
        &format!("node {victim} is up"),
        &format!("node {m2} took the manager role"),
    ]);
    std::thread::sleep(Duration::from_secs(2));
    w.etcd.kill(0);
    std::thread::sleep(Duration::from_secs(3));
    w.etcd.spawn(0);
    std::thread::sleep(Duration::from_secs(3));
    w.etcd.signal_all(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(10));
    w.etcd.signal_all(libc::SIGCONT);
    w.finish_bench(b);
    w.wait_converged();

    // A drain whose manager dies half-way: the writer on the client host copies the replica
    // at the manager's request, and the next manager finishes the job.
    let spare = (1..=4).find(|n| !w.replica_nodes().contains(n)).unwrap();
    if w.manager_node() == spare {
        // The copy goes to the spare: keep the manager elsewhere so killing it stops no copy.
        w.kill_manager();
    }
    let b = w.bench(12);
    let m = w.manager_node();
    let drained = *w.replica_nodes().iter().find(|&&n| n != m).unwrap();
    w.cli_ok(&[
        "node",
        "drain",
        &drained.to_string(),
        "--rate",
        "12M",
        "--no-wait",
    ]);
    // The copy's progress shows in `status`, from the writer's report on etcd (the writer
    // runs on a client host, the manager on a server).
    w.wait_for("the copy's progress", Duration::from_secs(10), &|s| {
        s["volumes"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["state"] == "resyncing" && r["resync"]["done_bytes"].as_u64() > Some(0))
    });
    w.kill_manager();
    w.wait_job_done(drained, Duration::from_secs(40));
    w.finish_bench(b);
    w.wait_converged();
    assert!(!w.replica_nodes().contains(&drained));
    assert!(w.replica_nodes().contains(&spare));
    let writer_log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    // `status` shows the remote writer's links: between hosts without RDMA, trireme's TCP
    // (mutual TLS), not UCX's tcp lanes (`ucx::DEFAULT_TLS`), and says why.
    let s = w.status();
    let links = s["volumes"][0]["client_links"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(links.len(), 3, "{s}");
    if w.net.on {
        for l in &links {
            assert_tcp_for_want_of_rdma(l, &s);
        }
    }
    // No link went over to TCP after a stall while TCP answered: none was on UCX.
    assert!(!writer_log.contains("while TCP answered"), "{writer_log}");
    assert!(
        writer_log.contains("moving a replica at the manager's request"),
        "the writer on the client host made the copy:\n{}",
        w.log()
    );
    let nodes_log: String = (1..=4)
        .map(|i| std::fs::read_to_string(w.dir.path().join(format!("node-{i}.log"))).unwrap())
        .collect();
    assert!(
        nodes_log.contains("resuming the job of the previous manager"),
        "{}",
        w.log()
    );
    w.verify();

    // A scrub of a volume written on a client host runs in that writer, at the manager's
    // request, reports back through etcd, and repairs a copy corrupted behind its back.
    qemu_io(&w.sock(), "vol", "write -P 0x33 0 1M");
    let bad = w.replica_nodes()[1];
    w.corrupt(bad, w.status()["volumes"][0]["id"].as_u64().unwrap());
    let out = w.cli_ok(&["--output", "json", "volume", "scrub", "vol"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["bytes_compared"].as_u64(), Some(64 << 20), "{r}");
    assert_eq!(r["replicas"].as_array().map(Vec::len), Some(3), "{r}");
    assert_eq!(r["repaired"], serde_json::json!([[0, bad]]), "{r}");
    let writer_log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    assert!(
        writer_log.contains("scrubbing at the manager's request"),
        "{writer_log}"
    );
    w.verify();

    // `volume resize` of the volume the client host writes: its writer grows every copy at
    // the manager's request (through etcd), and a new NBD connection sees the new size.
    let out = w.cli_ok(&["volume", "resize", "vol", "96M"]);
    assert!(out.contains("from 64.0 MiB to 96.0 MiB"), "{out}");
    let writer_log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    assert!(
        writer_log.contains("resizing at the manager's request"),
        "{writer_log}"
    );
    let info = w.cli_ok(&["--output", "json", "volume", "info", "vol"]);
    let j: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(j["size"], 96u64 << 20, "{j}");
    qemu_io(&w.sock(), "vol", "write -P 0x55 95M 1M");
    qemu_io(&w.sock(), "vol", "read -P 0x55 95M 1M");
    w.verify();
    // A volume nobody writes is scrubbed through a writer the manager attaches for it.
    w.cli_ok(&[
        "volume",
        "create",
        "cold",
        "--size",
        "8M",
        "--replicas",
        "3",
    ]);
    let cold_sock = w.dir.path().join("cold.sock");
    let mut cold = w
        .cmd_on(&w.clients[1])
        .args(["attach", "cold", "--socket"])
        .arg(&cold_sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Read;
        let mut first = [0u8; 1];
        let _ = cold.stdout.as_mut().unwrap().read(&mut first);
    }
    qemu_io(&cold_sock, "cold", "write -P 0x44 0 1M");
    signal(cold.id() as i32, libc::SIGTERM);
    assert!(cold.wait().unwrap().success());
    let s = w.status();
    let cold_v = s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cold")
        .unwrap()
        .clone();
    let bad = cold_v["replicas"][2]["node"].as_u64().unwrap() as u32;
    w.corrupt(bad, cold_v["id"].as_u64().unwrap());
    let out = w.cli_ok(&["--output", "json", "volume", "scrub", "cold"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["repaired"], serde_json::json!([[0, bad]]), "{r}");
    let out = w.cli_ok(&["volume", "verify", "cold"]);
    assert!(out.contains("0 mismatching"), "{out}");
    let info = w.cli_ok(&["volume", "info", "cold"]);
    assert!(
        info.contains("last scrub: ") && info.contains("(operator, "),
        "{info}"
    );
    // ... and resized through one too: also while one of the manager's own writers comes
    // and goes (a scrub's), which the resize waits for or goes through, never asks as if it
    // were a writer on another host (it would read its leaving as a failed resize).
    w.cli_ok(&["volume", "resize", "cold", "24M"]);
    for (i, size) in ["32M", "40M", "48M", "56M"].iter().enumerate() {
        let mut scrub = w
            .cmd()
            .args(["volume", "scrub", "cold"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(40 * i as u64));
        w.cli_ok(&["volume", "resize", "cold", size]);
        assert!(scrub.wait().unwrap().success());
    }
    let out = w.cli_ok(&["volume", "verify", "cold"]);
    assert!(
        out.contains("0 mismatching") && out.contains("56.0 MiB"),
        "{out}"
    );
    w.cli_ok(&["volume", "delete", "cold", "--keep", "0"]);

    // Every daemon restarted so far was started without --zone or --iops-capacity: each
    // kept both.
    let s = w.status();
    for n in s["nodes"].as_array().unwrap() {
        assert_eq!(n["zone"], format!("rack-{}", n["id"]), "{s}");
        assert_eq!(
            n["iops_capacity"],
            n["id"].as_u64().unwrap() * 10_000,
            "{s}"
        );
    }

    // A node dies for good: after the down-out grace its replica is re-created elsewhere.
    w.cli_ok(&["node", "undrain", &drained.to_string()]);
    let b = w.bench(8);
    std::thread::sleep(Duration::from_secs(1));
    let m = w.manager_node();
    let dead = *w.replica_nodes().iter().find(|&&n| n != m).unwrap();
    w.kill_node(dead);
    w.finish_bench(b);
    w.wait_job_done(dead, Duration::from_secs(60));
    assert!(!w.replica_nodes().contains(&dead));
    // It comes back empty and drained; undrained, it may take replicas again.
    w.start_node(dead);
    w.wait_converged();
    w.cli_ok(&["node", "undrain", &dead.to_string()]);

    // The writer dies; client host 2 attaches (after its lease expires) and reconciles.
    if let Some(mut a) = w.attach.take() {
        let _ = a.kill();
        let _ = a.wait();
    }
    let t0 = Instant::now();
    w.attach(1, "second");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(15), "re-attach took {took:?}");
    let log = std::fs::read_to_string(w.dir.path().join("attach-second.log")).unwrap();
    assert!(log.contains("reconcil"), "{log}");
    let b = w.bench(5);
    w.finish_bench(b);
    w.wait_converged();
    w.verify();
    let s = w.status();
    let uris = s["volumes"][0]["writer"]["uris"].to_string();
    assert!(uris.contains("nbd+unix"), "{s}");
    assert!(s["volumes"][0]["writer"]["pid"].as_u64().is_some(), "{s}");

    // Every server dies at once (the rack loses power; each disk keeps what it was given)
    // and comes back: the writer on the client host holds its requests, links to each copy
    // again under its new address, and goes on, with no I/O error and no new epoch.
    let epoch = w.status()["volumes"][0]["epoch"].as_u64();
    let b = w.bench(14);
    std::thread::sleep(Duration::from_secs(2));
    for id in 1..=4 {
        w.kill_node(id);
    }
    std::thread::sleep(Duration::from_secs(2));
    for id in 1..=4 {
        w.start_node(id);
    }
    w.finish_bench(b);
    w.wait_converged();
    assert_eq!(w.status()["volumes"][0]["epoch"].as_u64(), epoch);
    w.verify();
    let log = std::fs::read_to_string(w.dir.path().join("attach-second.log")).unwrap();
    assert!(log.contains("linked the in-sync copy again"), "{log}");

    // Patch Tuesday on etcd (issue 17): every daemon restarted in turn — the manager's own
    // too, after it hands its role over — under the verifying workload. Each writer takes its
    // replica out before the daemon stops, so no write fails or waits for a timeout; each
    // daemon starts its binary again in place (same process) and resyncs incrementally.
    let pids: Vec<u32> = w.nodes.iter().flatten().map(|c| c.id()).collect();
    let b = w.bench(20);
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let out = w.cli_ok(&["--output", "json", "maintenance", "rolling"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    eprintln!("rolling restart on etcd in {:?}: {r}", t0.elapsed());
    let v = w.finish_bench(b);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    let restarted = r["nodes"].as_array().unwrap();
    assert_eq!(restarted.len(), 4, "{r}");
    let holders = w.replica_nodes();
    for n in restarted {
        let id = n["node"].as_u64().unwrap() as u32;
        let expect = if holders.contains(&id) {
            serde_json::json!(["vol"])
        } else {
            serde_json::json!([])
        };
        assert_eq!(n["volumes"], expect, "{r}");
        assert_eq!(n["full"], false, "incremental resyncs: {r}\n{}", w.log());
    }
    for (c, pid) in w.nodes.iter_mut().flatten().zip(pids) {
        assert!(c.try_wait().unwrap().is_none(), "{}", w.log());
        assert_eq!(c.id(), pid);
    }
    let nodes_log: String = (1..=4)
        .map(|i| std::fs::read_to_string(w.dir.path().join(format!("node-{i}.log"))).unwrap())
        .collect();
    assert!(
        nodes_log.contains("handed the manager role over"),
        "{}",
        w.log()
    );
    w.wait_converged();
    w.verify();
    // Below the minimum of copies the writer refuses, and nothing restarts.
    w.cli_ok(&["volume", "set", "vol", "--min-copies", "3"]);
    let bad = w.cli(&["node", "restart", &holders[0].to_string()]);
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(why.contains("minimum"), "{why}");
}

/// Writes wait below the minimum of copies, and the last copy in sync restarts meanwhile: its
/// link closes, and no request is left to link it again (every one waits on a write). The
/// writer links it again itself; without that, every resync of the other copies failed on
/// its old link, and the writes never resumed (once, in the test above, after the
/// whole-cluster restart).
#[test]
fn the_last_copy_in_sync_restarting_while_writes_wait_is_linked_again() {
    if skipped() {
        return;
    }
    let mut w = World::start(1, 3, 1);
    w.create_and_attach();
    let suspended = |s: &serde_json::Value| s["volumes"][0]["writes_suspended"] == true;
    let b = w.bench(30);
    std::thread::sleep(Duration::from_secs(2));
    // Two copies out (the manager's node kept): writes wait, reads soon wait behind them.
    let m = w.manager_node();
    let others: Vec<u32> = (1..=3).filter(|&n| n != m).collect();
    for &n in &others {
        w.kill_node(n);
    }
    w.wait_for("writes suspended", Duration::from_secs(15), &suspended);
    std::thread::sleep(Duration::from_secs(2));
    // The last copy in sync restarts.
    w.kill_node(m);
    std::thread::sleep(Duration::from_secs(1));
    w.start_node(m);
    // One copy back: its resync reads the last copy's record through the link made again.
    w.start_node(others[0]);
    w.wait_for("writes resumed", Duration::from_secs(40), &|s| {
        !suspended(s)
            && s["volumes"][0]["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["state"] == "in-sync")
                .count()
                >= 2
    });
    w.start_node(others[1]);
    let v = w.finish_bench(b);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    w.wait_converged();
    w.verify();
    let log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    assert!(log.contains("linked the in-sync copy again"), "{log}");
}

/// A node gone for good while the copy that stayed lost its unflushed writes: a 2-way
/// volume's writer is killed, both nodes of its copies crash, and the one that comes back
/// lost power (another boot, so its copy has a new history). The attach then waits for the
/// other, which may hold writes it lost, and says so; `node lost` of a node that answers is
/// refused, a dry run changes nothing, and `node lost --force` accepts the copy that answered
/// as it is: the next attach serves the volume's bytes, and the manager re-creates the second
/// copy elsewhere.
#[test]
fn a_node_gone_for_good_is_declared_lost_and_its_volume_attaches_without_it() {
    if skipped() {
        return;
    }
    let mut w = World::start(1, 3, 1);
    w.cli_ok(&[
        "volume",
        "create",
        "vol",
        "--size",
        "64M",
        "--replicas",
        "2",
    ]);
    w.attach(0, "first");
    qemu_io(&w.sock(), "vol", "write -P 0x5a 0 1M");
    let nodes = w.replica_nodes();
    let (kept, gone) = (nodes[0], nodes[1]);
    // The writer dies, then both copies' nodes; the kept one's copy comes back from
    // another boot (what a power loss looks like to it).
    if let Some(mut a) = w.attach.take() {
        let _ = a.kill();
        let _ = a.wait();
    }
    w.kill_node(kept);
    w.kill_node(gone);
    let dir = w.dir.path().join(format!("node-{kept}"));
    let mut boots = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "boot") {
            std::fs::write(e.path(), "another-boot").unwrap();
            boots += 1;
        }
    }
    assert!(boots > 0, "no boot file in {}", dir.display());
    w.start_node(kept);
    w.wait_for(
        "the gone node's lease lapsed",
        Duration::from_secs(20),
        &|s| {
            s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["id"] == gone && n["up"] == false)
                && s["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n["id"] == kept && n["up"] == true)
        },
    );
    let waits = w
        .cmd()
        .args(["attach", "vol", "--lease-ttl", "3s", "--socket"])
        .arg(w.sock())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&waits.stderr).into_owned();
    assert!(
        !waits.status.success(),
        "attached without the copy that may hold the writes"
    );
    assert!(said.contains("trireme node lost"), "{said}");

    let up = w.cli(&["node", "lost", &kept.to_string(), "--force"]);
    assert!(!up.status.success(), "a node that answers is not lost");
    assert!(
        String::from_utf8_lossy(&up.stderr).contains("is up"),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let dry = w.cli_ok(&["node", "lost", &gone.to_string()]);
    assert!(
        dry.contains("dry run") && dry.contains("would accept  vol"),
        "{dry}"
    );
    let still = w
        .cmd()
        .args(["attach", "vol", "--socket"])
        .arg(w.sock())
        .output()
        .unwrap();
    assert!(!still.status.success(), "a dry run changed nothing");

    let done = w.cli_ok(&["node", "lost", &gone.to_string(), "--force"]);
    assert!(done.contains("accepted  vol"), "{done}");
    w.attach(0, "after");
    qemu_io(&w.sock(), "vol", "read -P 0x5a 0 1M");
    qemu_io(&w.sock(), "vol", "write -P 0x6b 1M 1M");
    // The manager puts the second copy on the third node (down-out, or `node remove`).
    w.cli_ok(&["node", "remove", &gone.to_string(), "--no-wait"]);
    w.wait_for("two copies in sync again", Duration::from_secs(60), &|s| {
        let reps = s["volumes"][0]["replicas"].as_array().unwrap();
        reps.iter().filter(|r| r["state"] == "in-sync").count() == 2
            && reps.iter().all(|r| r["node"] != gone)
    });
    qemu_io(&w.sock(), "vol", "read -P 0x6b 1M 1M");
    w.verify();
    let events = w.cli_ok(&["events"]);
    assert!(
        events.contains(&format!("node {gone} declared lost")),
        "{events}"
    );
}

/// A parity copy moves off a node while its volume is attached on a client host: the
/// manager asks the writer there to take the old copy out, records the new one in its
/// place, and asks the writer to rebuild it, all under a verifying workload (a planned
/// restart of another node meanwhile is refused: the writer is busy); then the
/// volume's stripes and mirrors check clean.
#[test]
fn a_parity_copy_moves_through_its_writer_on_another_host() {
    if skipped() {
        return;
    }
    let mut w = World::start(1, 4, 1);
    w.cli_ok(&[
        "volume", "create", "vol", "--size", "64M", "--parity", "2+1",
    ]);
    w.attach(0, "first");
    let b = w.bench(16);
    let in_parity = |s: &serde_json::Value| {
        s["volumes"][0]["resiliency"]["regions"]["parity"]
            .as_u64()
            .unwrap_or(0)
    };
    w.wait_for("regions encoded", Duration::from_secs(15), &|s| {
        in_parity(s) > 0
    });
    let before = w.replica_nodes();
    let from = before[1];
    // Slowed down, so a planned restart of another node comes while the writer moves the
    // copy: the writer serves one request of each kind, and the restart must not replace
    // the drain's.
    w.cli_ok(&[
        "node",
        "drain",
        &from.to_string(),
        "--rate",
        "8M",
        "--no-wait",
    ]);
    w.wait_for("the copy moving", Duration::from_secs(30), &|s| {
        s["moves"][0]["progress"].is_object()
    });
    let o = w.cli(&["node", "restart", &before[2].to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains(&format!("busy with the move off node {from}")),
        "{err}"
    );
    w.wait_for("the drain done", Duration::from_secs(90), &|s| {
        s["moves"][0]["state"] == "done"
    });
    let v = w.finish_bench(b);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    let after = w.replica_nodes();
    assert!(!after.contains(&from) && after.len() == 3, "{after:?}");
    assert_eq!((after[0], after[2]), (before[0], before[2]), "in its place");
    w.wait_converged();
    let r = w.cli_ok(&["--output", "json", "volume", "scrub", "vol"]);
    let r: serde_json::Value = serde_json::from_str(&r).unwrap();
    assert_eq!(r["mismatched_regions"], 0, "{r}");
    assert_eq!(r["unresolved"].as_array().map(Vec::len), Some(0), "{r}");
    assert!(r["stripes_checked"].as_u64().unwrap() > 0, "{r}");
    let log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    assert!(
        log.contains("the new copy took the old one's place"),
        "{log}"
    );
    let all = w.log();
    assert!(
        all.contains("asked the volume's writer to move a replica"),
        "{all}"
    );
}
