//! Snapshots with real processes: taken online through `up`'s writer while a node is killed,
//! kept through a whole-cluster kill -9, read back read-only over NBD byte for byte, deleted
//! from the middle of the chain without disturbing the others, rolled back to; bad requests
//! refused.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

const SIZE: usize = 32 << 20;

/// Changes a few random regions of `model` (seeded) and writes the whole image to the volume.
fn change(c: &Cluster, model: &mut [u8], dir: &Path, seed: u64) {
    let mut x = seed | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..8 {
        let len = (next(64) as usize + 1) * 4096;
        let at = next((SIZE - len) as u64 / 512) as usize * 512;
        for b in &mut model[at..at + len] {
            *b = next(256) as u8;
        }
    }
    let img = dir.join("model.img");
    std::fs::write(&img, &*model).unwrap();
    write_image(&img, &c.unix);
}

#[test]
fn snapshots_are_taken_online_survive_crashes_and_read_back_exactly() {
    for t in ["qemu-img", "nbdinfo", "/usr/bin/python3"] {
        need(t);
    }
    let work = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(&["--store", "file", "--size", "32M"]);
    let mut model = vec![0u8; SIZE];
    for k in 1..=5u64 {
        change(&c, &mut model, work.path(), k * 7919);
        if k == 3 {
            // A copy stops answering just before the snapshot: the writer takes it out, the
            // snapshot is on the two others, then the copy is killed (-9) and comes back.
            let pid = node_pid(&c, 2);
            signal(pid, libc::SIGSTOP);
            change(&c, &mut model, work.path(), 4242);
            let s = ok(&c, &["volume", "snapshot", "create", "vol0", "s3"]);
            assert!(s.contains("on nodes 1, 3"), "{s}");
            std::fs::write(work.path().join("s3.img"), &model).unwrap();
            // Written while the copy is still out, after s3: its resync must give it s3 as
            // s3 was, not as the volume is now, in these blocks too.
            change(&c, &mut model, work.path(), 4343);
            signal(pid, libc::SIGKILL);
            wait_restarted(&c, 2, pid);
            wait_all_in_sync(&c);
        } else {
            let s = ok(
                &c,
                &["volume", "snapshot", "create", "vol0", &format!("s{k}")],
            );
            assert!(s.contains("on nodes 1, 2, 3"), "{s}");
        }
        if k != 3 {
            std::fs::write(work.path().join(format!("s{k}.img")), &model).unwrap();
        }
        if k == 1 {
            // Its map has the holes the volume had when it was taken (most of it was never
            // written), so a copy of it skips them.
            let (mut child, uri) = spawn_nbd(&c, "vol0@s1", &work.path().join("map.sock"));
            let map = run(Command::new("nbdinfo").arg("--map").arg(&uri));
            assert!(map.contains("hole") && map.contains("data"), "{map}");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    wait_all_in_sync(&c);
    // Every snapshot, and the volume itself, after a kill -9 of the whole cluster.
    let dir = c.crash();
    let c = Cluster::start_in(dir, &["--store", "file", "--size", "32M"]);
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2", "s3", "s4", "s5"], "{list}");
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["state"] == "ready"));
    // Node 2 was out when s3 was taken; its resync gave it s3 first (`catch_up.rs`), so it
    // holds it too, byte for byte (`volume verify` compares each snapshot on every copy that
    // holds it).
    assert_eq!(list[2]["nodes"], serde_json::json!([1, 2, 3]), "{list}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "verify", "vol0"])).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0, "{v}");
    let snaps = v["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 5, "{v}");
    for s in snaps {
        assert!(s["mismatches"].as_array().unwrap().is_empty(), "{v}");
    }
    assert_eq!(snaps[2]["nodes"], serde_json::json!([1, 2, 3]), "{v}");
    // `volume info` shows them too, each with when it was taken and what only it holds.
    let info: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "info", "vol0"])).unwrap();
    let shown = info["snapshots"].as_array().unwrap();
    assert_eq!(shown.len(), 5, "{info}");
    assert!(
        shown.iter().all(|s| s["created"].as_u64().unwrap() > 0),
        "{info}"
    );
    assert!(
        shown
            .iter()
            .any(|s| s["exclusive_bytes"].as_u64().unwrap() > 0),
        "{info}"
    );
    compare_image(&work.path().join("s5.img"), &c.unix);
    let mut exports = Vec::new();
    for k in 1..=5 {
        let sock = work.path().join(format!("s{k}.sock"));
        let (child, uri) = spawn_nbd(&c, &format!("vol0@s{k}"), &sock);
        compare_image(&work.path().join(format!("s{k}.img")), &uri);
        exports.push((child, uri));
    }
    // Read-only, as NBD says it; a client that writes anyway (libnbd's checks off) gets
    // EPERM from the server, and the snapshot is unchanged.
    let info = run(Command::new("nbdinfo").arg(&exports[0].1));
    assert!(info.contains("is_read_only: true"), "{info}");
    let py = format!(
        "import nbd\nh = nbd.NBD()\nh.set_strict_mode(0)\nh.connect_uri({:?})\ntry:\n    h.pwrite(b'x' * 4096, 0)\n    print('WROTE')\nexcept nbd.Error as e:\n    print('refused', e.errno)\n",
        exports[0].1
    );
    // Debian's python3, which has python3-libnbd.
    let out = run(Command::new("/usr/bin/python3").args(["-c", &py]));
    assert!(out.contains("refused EPERM"), "{out}");
    compare_image(&work.path().join("s1.img"), &exports[0].1);
    // Deleting one in the middle leaves the others whole (the next one's map is re-based).
    // Its own export holds it: refused, until that export stops.
    refused(
        &c,
        &["volume", "snapshot", "delete", "vol0", "s2"],
        "is exported read-only by export vol0@s2",
    );
    signal(exports[1].0.id() as i32, libc::SIGTERM);
    assert!(exports[1].0.wait().unwrap().success());
    ok(&c, &["volume", "snapshot", "delete", "vol0", "s2"]);
    for k in [1, 3, 4, 5] {
        compare_image(&work.path().join(format!("s{k}.img")), &exports[k - 1].1);
    }
    // Bad requests change nothing.
    refused(
        &c,
        &["volume", "snapshot", "create", "vol0", "s1"],
        "already has a snapshot named",
    );
    refused(
        &c,
        &["volume", "snapshot", "create", "vol0", "a/b"],
        "invalid snapshot name",
    );
    refused(
        &c,
        &["volume", "snapshot", "create", "nosuch", "x"],
        "no volume named",
    );
    refused(
        &c,
        &["volume", "snapshot", "delete", "vol0", "s2"],
        "no snapshot named",
    );
    let o = Command::new(BIN)
        .arg("--data-dir")
        .arg(c.path())
        .args(["nbd", "vol0@nosuch", "--socket"])
        .arg(work.path().join("x.sock"))
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("no snapshot named"),
        "{}",
        text(&o)
    );
    for (mut child, _) in exports {
        let _ = child.kill();
        let _ = child.wait();
    }
    compare_image(&work.path().join("s5.img"), &c.unix);
    // Rollback: refused while up's writer holds the volume; --force fences it, every copy
    // then holds s3, and up's export, attached again, serves it.
    refused(&c, &["volume", "rollback", "vol0", "s3"], "is in use");
    refused(
        &c,
        &["volume", "rollback", "vol0", "nosuch", "--force"],
        "no snapshot named",
    );
    ok(&c, &["volume", "rollback", "vol0", "s3", "--force"]);
    let s3 = work.path().join("s3.img");
    let t0 = std::time::Instant::now();
    while !Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", "raw"])
        .arg(&s3)
        .arg(&c.unix)
        .status()
        .unwrap()
        .success()
    {
        assert!(
            t0.elapsed().as_secs() < 30,
            "vol0 does not hold s3 after the rollback:\n{}",
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert_replicas_identical(&c, "vol0");
}

/// A snapshot a second under `bench --verify`, with a copy killed (-9) in the middle: no
/// acknowledged write is lost or torn, every snapshot is taken (on the copies in sync at its
/// moment), and each reads back over NBD whole. The writer's log says how long I/O paused.
#[test]
fn snapshots_under_load_and_a_node_kill_lose_nothing() {
    need("qemu-img");
    let c = Cluster::start(&["--store", "file", "--size", "64M"]);
    let bench = start_bench(&c, 12);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let mut killed = None;
    for k in 1..=10 {
        if k == 5 && std::env::var("NOKILL").is_err() {
            let pid = node_pid(&c, 3);
            signal(pid, libc::SIGKILL);
            killed = Some(pid);
        }
        ok(
            &c,
            &["volume", "snapshot", "create", "vol0", &format!("load{k}")],
        );
        std::thread::sleep(std::time::Duration::from_millis(700));
    }
    finish_bench(&c, bench);
    if let Some(k) = killed {
        wait_restarted(&c, 3, k);
    }
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    assert_eq!(list.as_array().unwrap().len(), 10, "{list}");
    for s in list.as_array().unwrap() {
        assert_eq!(s["state"], "ready", "{list}");
        assert!(s["nodes"].as_array().unwrap().len() >= 2, "{list}");
    }
    let work = tempfile::tempdir().unwrap();
    let sock = work.path().join("load5.sock");
    let (mut child, uri) = spawn_nbd(&c, "vol0@load5", &sock);
    let copy = work.path().join("load5.img");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&uri)
        .arg(&copy));
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), 64 << 20);
    let _ = child.kill();
    let _ = child.wait();
    let paused: Vec<u64> = c
        .log()
        .lines()
        .filter(|l| l.contains("snapshot taken") && l.contains("paused_ms"))
        .filter_map(|l| {
            l.split("paused_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    eprintln!("I/O paused per snapshot (ms): {paused:?}");
}

/// A copy that fails the snapshot's barrier itself is taken out, as for a failed write, and
/// the snapshot is taken on the others: the command succeeds. First node 3 is stopped
/// (SIGSTOP) with nothing in flight, so the barrier is the first request it leaves unanswered;
/// then it is killed (-9), so the barrier finds its link closed. Each time its resync gives it
/// the snapshot as it was, though the volume was written after it, and every copy holds the
/// same bytes. (CI, stop 54: a kill -9 just before a snapshot failed the command.)
#[test]
fn a_copy_that_fails_the_barrier_is_taken_out_and_the_snapshot_is_taken() {
    need("qemu-img");
    let work = tempfile::tempdir().unwrap();
    let c = Cluster::start(&["--store", "file", "--size", "32M"]);
    let mut model = vec![0u8; SIZE];
    for (k, sig) in [(1u64, libc::SIGSTOP), (2, libc::SIGKILL)] {
        change(&c, &mut model, work.path(), k * 15485863);
        let pid = node_pid(&c, 3);
        signal(pid, sig);
        let s = ok(
            &c,
            &["volume", "snapshot", "create", "vol0", &format!("s{k}")],
        );
        assert!(s.contains("on nodes 1, 2"), "{s}\n{}", c.log());
        std::fs::write(work.path().join(format!("s{k}.img")), &model).unwrap();
        // Written after the snapshot, while node 3 is out.
        change(&c, &mut model, work.path(), k * 104723);
        if sig == libc::SIGSTOP {
            signal(pid, libc::SIGCONT);
        } else {
            wait_restarted(&c, 3, pid);
        }
        wait_all_in_sync(&c);
    }
    assert!(
        c.log().contains("snapshot failed on a copy"),
        "no barrier failed on a copy: the test proves nothing\n{}",
        c.log()
    );
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    for s in list.as_array().unwrap() {
        assert_eq!(s["nodes"], serde_json::json!([1, 2, 3]), "{list}");
    }
    compare_image(&work.path().join("model.img"), &c.unix);
    for k in 1..=2 {
        let sock = work.path().join(format!("s{k}.sock"));
        let (mut child, uri) = spawn_nbd(&c, &format!("vol0@s{k}"), &sock);
        compare_image(&work.path().join(format!("s{k}.img")), &uri);
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_replicas_identical(&c, "vol0");
}

/// Snapshots move with a copy: three drains in turn move every copy of vol0 to a node that
/// never held it, and each snapshot still reads back byte for byte, from copies that were
/// given it (`catch_up.rs`, history unknown: the first whole, the next as what changed since
/// the one before), identical on every copy, its holes still holes.
#[test]
fn snapshots_move_with_their_copies_on_drains() {
    need("qemu-img");
    let work = tempfile::tempdir().unwrap();
    let c = Cluster::start(&["--store", "file", "--size", "32M", "--nodes", "4"]);
    let mut model = vec![0u8; SIZE];
    for k in 1..=3u64 {
        change(&c, &mut model, work.path(), k * 104729);
        ok(
            &c,
            &["volume", "snapshot", "create", "vol0", &format!("s{k}")],
        );
        std::fs::write(work.path().join(format!("s{k}.img")), &model).unwrap();
    }
    change(&c, &mut model, work.path(), 7);
    std::fs::write(work.path().join("head.img"), &model).unwrap();
    let first = replica_nodes(&c, "vol0");
    assert_eq!(first, [1, 2, 3]);
    // Each drain moves the copy to the one node holding none; the node drained before is
    // taken back so that the next drain has somewhere to go.
    for (k, node) in first.iter().enumerate() {
        if k > 0 {
            ok(&c, &["node", "undrain", &first[k - 1].to_string()]);
        }
        ok(&c, &["node", "drain", &node.to_string()]);
    }
    let now = replica_nodes(&c, "vol0");
    assert_eq!(now, [1, 2, 4], "every copy moved at least once");
    wait_all_in_sync(&c);
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    for s in list.as_array().unwrap() {
        assert_eq!(s["nodes"], serde_json::json!(now), "{list}");
        assert!(s.get("lost").is_none(), "{list}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "verify", "vol0"])).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0, "{v}");
    for s in v["snapshots"].as_array().unwrap() {
        assert!(s["mismatches"].as_array().unwrap().is_empty(), "{v}");
        let mut nodes: Vec<u64> = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        nodes.sort_unstable();
        assert_eq!(nodes, now, "{v}");
    }
    compare_image(&work.path().join("head.img"), &c.unix);
    for k in 1..=3 {
        let (mut child, uri) = spawn_nbd(
            &c,
            &format!("vol0@s{k}"),
            &work.path().join(format!("s{k}.sock")),
        );
        compare_image(&work.path().join(format!("s{k}.img")), &uri);
        if k == 1 {
            // Most of the volume was never written when s1 was taken: the moved copies
            // hold those blocks as holes, not as written zeros.
            let map = run(Command::new("nbdinfo").arg("--map").arg(&uri));
            assert!(map.contains("hole"), "{map}");
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        c.log().contains("a snapshot the copy lacked, given to it"),
        "{}",
        c.log()
    );
}

/// Files under `dir` whose paths contain `part`, at any depth.
fn files_named(dir: &Path, part: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_named(&p, part));
        } else if p.to_string_lossy().contains(part) {
            out.push(p);
        }
    }
    out
}

/// A node that misses a snapshot delete (stopped, then killed -9 and restarted by `up`) keeps
/// the snapshot, and its record stays `deleting`; the manager finishes the delete by itself
/// once the node is back: the record goes and so does the node's copy of the snapshot. A
/// delete left `deleting` when the whole cluster died is finished by the next `up`.
#[test]
fn a_delete_a_node_missed_is_finished_once_it_is_back() {
    let mut c = Cluster::start(&["--store", "file", "--size", "32M"]);
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    let id = list[0]["id"].as_u64().unwrap();
    let file = format!("snap-{id:016x}");
    let node2 = c.path().join("node-2");
    assert_eq!(files_named(&node2, &file).len(), 1, "node 2 holds s1");
    // Node 2 stops answering, and the delete of s1 misses it: its pid.
    let miss_delete = |c: &Cluster| -> i32 {
        let pid = node_pid(c, 2);
        signal(pid, libc::SIGSTOP);
        refused(
            c,
            &["volume", "snapshot", "delete", "vol0", "s1"],
            "the manager finishes the delete once they answer",
        );
        pid
    };
    let pid = miss_delete(&c);
    let state = |c: &Cluster| -> Vec<String> {
        let l: serde_json::Value = serde_json::from_str(&ok(
            c,
            &["--output", "json", "volume", "snapshot", "list", "vol0"],
        ))
        .unwrap();
        l.as_array()
            .unwrap()
            .iter()
            .map(|s| s["state"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(state(&c), ["deleting"]);
    // Waits (a minute at most) until no snapshot record is left.
    let finished = |c: &Cluster, what: &str| {
        let t0 = std::time::Instant::now();
        while !state(c).is_empty() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "{what}:\n{}",
                c.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    // Killed while stopped: the request it had not read is gone with it.
    signal(pid, libc::SIGKILL);
    wait_restarted(&c, 2, pid);
    finished(&c, "the delete was not finished");
    assert!(
        files_named(&node2, &file).is_empty(),
        "node 2 still holds s1"
    );
    assert!(c
        .log()
        .contains("a snapshot delete that a node had missed is finished"));
    // The name is free again, on every node.
    let s = ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    assert!(s.contains("on nodes 1, 2, 3"), "{s}");
    // A delete missed under one manager is finished by the next: the whole cluster is killed
    // -9 with the record `deleting`, and the new `up` finds it among the records.
    miss_delete(&c);
    let dir = c.crash();
    let c = Cluster::start_in(dir, &["--store", "file", "--size", "32M"]);
    finished(&c, "the delete left by the last manager was not finished");
    assert!(
        files_named(&c.path().join("node-2"), "snap-").is_empty(),
        "node 2 still holds a snapshot"
    );
}

/// A copy that resyncs while snapshots keep coming still gets back in sync, with every
/// snapshot. Node 3 misses 3 s of writes scattered over the whole volume (counted from its
/// take-out, so a slow host writes less but never nothing), and the load goes on, so each
/// resync of it copies up to 64 MiB at 32 MiB/s: on a fast host 2 s, on one shared with other
/// tests 8 MiB (250 ms), still longer than the snapshots' 200 ms period. Its first resyncs
/// end lacking the snapshots taken meanwhile and go out again; the third holds new snapshots
/// off until it ends (without that, every resync ended lacking one for as long as the load
/// ran). The snapshots a catch-up gives are copied no faster than the resync rate.
#[test]
fn a_copy_resyncing_while_snapshots_keep_coming_gets_back_with_them_all() {
    const RATE: u64 = 32 << 20;
    let c = Cluster::start(&["--store", "file", "--size", "64M", "--resync-rate", "32M"]);
    let bench = start_bench(&c, 30);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let p3 = node_pid(&c, 3);
    signal(p3, libc::SIGSTOP);
    common::secure::wait_for("node 3 taken out", || {
        c.log()
            .contains("replica taken out; writes continue on the others volume=vol0 node=3")
    });
    std::thread::sleep(std::time::Duration::from_secs(3));
    signal(p3, libc::SIGCONT);
    wait_state(&c, 3, "resyncing");
    let t0 = std::time::Instant::now();
    let mut k = 0;
    while replica_state(&c, 3) != "in-sync" {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "node 3 not back in sync after {k} snapshots:\n{}",
            c.log()
        );
        k += 1;
        ok(
            &c,
            &["volume", "snapshot", "create", "vol0", &format!("s{k}")],
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let back = t0.elapsed();
    let log = c.log();
    assert!(
        log.contains("a snapshot was taken while it resynced"),
        "its first resync did not end lacking a snapshot ({k} taken): the test proves nothing\n{log}"
    );
    assert!(
        log.contains("new snapshots wait until this one ends"),
        "{log}"
    );
    finish_bench(&c, bench);
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    assert_eq!(list.as_array().unwrap().len(), k, "{list}");
    for s in list.as_array().unwrap() {
        assert_eq!(s["nodes"].as_array().unwrap().len(), 3, "{list}");
    }
    assert_replicas_identical(&c, "vol0");
    // Each snapshot given whole enough to measure took at least its bytes at the rate.
    let given: Vec<(u64, u64)> = log
        .lines()
        .filter(|l| l.contains("given to it before its"))
        .filter_map(|l| {
            let field = |name: &str| -> Option<u64> {
                l.split(&format!("{name}="))
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            };
            Some((field("bytes")?, field("ms")?))
        })
        .collect();
    assert!(!given.is_empty(), "no snapshot given to node 3:\n{log}");
    for &(bytes, ms) in &given {
        assert!(
            ms + 1 >= bytes * 1000 / RATE,
            "{bytes} bytes given in {ms} ms: faster than the resync rate"
        );
    }
    eprintln!(
        "{k} snapshots while node 3 resynced, in sync after {} ms; catch-ups (bytes, ms): {given:?}",
        back.as_millis()
    );
}

/// A copy out while a snapshot is taken and the volume then grows comes back with its
/// history known: it is given the snapshot at the snapshot's size (resized down to it, then
/// back), the head's bytes past it resynced, so the snapshot and the volume read back exactly
/// and every copy holds both, identical.
#[test]
fn a_copy_out_across_a_snapshot_and_a_grow_gets_the_snapshot_at_its_size() {
    need("qemu-img");
    let w = tempfile::tempdir().unwrap();
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);
    let (a, b, g) = (
        w.path().join("a.img"),
        w.path().join("b.img"),
        w.path().join("g.img"),
    );
    random_file(&a, 16 << 20, 11);
    write_image(&a, &c.unix);
    // Node 2 stops answering: the writer takes it out at the next writes.
    let pid = node_pid(&c, 2);
    signal(pid, libc::SIGSTOP);
    random_file(&b, 16 << 20, 12);
    write_image(&b, &c.unix);
    let s = ok(&c, &["volume", "snapshot", "create", "vol0", "small"]);
    assert!(s.contains("on nodes 1, 3"), "{s}");
    ok(&c, &["volume", "resize", "vol0", "32M"]);
    random_file(&g, 32 << 20, 13);
    write_image(&g, &c.unix);
    signal(pid, libc::SIGKILL);
    wait_restarted(&c, 2, pid);
    wait_all_in_sync(&c);
    assert!(
        c.log()
            .contains("a snapshot the copy missed while out, given to it before its resync"),
        "not the catch-up of a copy whose history is known:\n{}",
        c.log()
    );
    let list: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "snapshot", "list", "vol0"],
    ))
    .unwrap();
    assert_eq!(list[0]["nodes"], serde_json::json!([1, 2, 3]), "{list}");
    assert_eq!(list[0]["size"], 16u64 << 20, "{list}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "verify", "vol0"])).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0, "{v}");
    let snap = &v["snapshots"][0];
    assert_eq!(snap["nodes"], serde_json::json!([1, 2, 3]), "{v}");
    assert_eq!(snap["bytes_compared"], 16u64 << 20, "{v}");
    assert!(snap["mismatches"].as_array().unwrap().is_empty(), "{v}");
    export_is(&c, "vol0@small", &b, w.path());
    compare_image(&g, &c.unix);
}

/// Issue 63: a copy built by a drain, on a grown volume with a snapshot, written while it
/// moved and after, then killed -9: its node kept the seals of pool blocks rewritten since its
/// last flush (the activity log names logical blocks, the seals sit under the versions), and
/// a scrub found them bad while everything said healthy. Now its kept seals hold: `volume
/// verify` finds every copy the same, and the workload read nothing stale.
#[test]
fn a_drained_copy_killed_after_its_drain_holds_no_bad_block() {
    need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "32M", "--nodes", "4"]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x11 0 16M", &c.unix]));
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    ok(&c, &["volume", "resize", "vol0", "64M"]);
    let bench = start_bench(&c, 14);
    std::thread::sleep(std::time::Duration::from_secs(2));
    ok(&c, &["node", "drain", "1"]);
    assert_eq!(replica_nodes(&c, "vol0"), [2, 3, 4]);
    // Written some seconds after the drain ended, then killed.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let pid = node_pid(&c, 4);
    signal(pid, libc::SIGKILL);
    wait_restarted(&c, 4, pid);
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    let node_log = || std::fs::read_to_string(c.path().join("node-4.log")).unwrap();
    assert!(
        node_log().contains("block seals kept after an unclean stop"),
        "node 4 kept no seals: the test proves nothing\n{}",
        node_log()
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "verify", "vol0"])).unwrap();
    assert_eq!(
        v["mismatches"].as_array().unwrap().len(),
        0,
        "{v}\n{}",
        node_log()
    );
    assert!(!node_log().contains("fails its checksum"), "{}", node_log());
    // Defence in depth: the copy was `unverified` (never `healthy`) until the manager's own
    // scrub compared it; then healthy again.
    let t0 = std::time::Instant::now();
    loop {
        let evs: Vec<serde_json::Value> =
            serde_json::from_str(&ok(&c, &["--output", "json", "events"])).unwrap();
        let said = |kind: &str, part: &str| {
            evs.iter()
                .any(|e| e["kind"] == kind && e["text"].as_str().unwrap().contains(part))
        };
        if said("health", "→ unverified: node 4 stopped uncleanly")
            && said("scrub", "node 2, 3, 4 verified")
            && said("health", "unverified → healthy")
        {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(40),
            "{evs:#?}\n{}",
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// Issue 63: a snapshot export under a deep queue. fio with 4 jobs of 256 requests in flight
/// each (1,024 at once) reads back, verified, what 4 jobs wrote before the snapshot, while the
/// volume is written over after it. Each request in flight used to open its own links to the
/// nodes, until their handshake gate cut them and reads failed with EIO.
#[test]
fn a_snapshot_export_serves_1024_requests_in_flight() {
    need("fio");
    let work = tempfile::tempdir().unwrap();
    let c = Cluster::start(&["--store", "file", "--size", "128M"]);
    let job = |uri: &str, rw: &str, extra: &[&str]| {
        let mut cmd = Command::new("fio");
        cmd.args([
            "--name=deep",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            "--bs=4k",
            "--numjobs=4",
            "--size=8M",
            "--offset_increment=32M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--group_reporting",
        ])
        .args(extra);
        let out = run(&mut cmd);
        assert!(out.contains("err= 0"), "{out}\n{}", c.log());
    };
    job(&c.unix, "randwrite", &["--iodepth=16", "--do_verify=0"]);
    ok(&c, &["volume", "snapshot", "create", "vol0", "deep"]);
    // Written over after the snapshot: the export must still read the snapshot's bytes.
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x77 0 100M", &c.unix]));
    let (mut child, uri) = spawn_nbd(&c, "vol0@deep", &work.path().join("deep.sock"));
    for _ in 0..2 {
        job(&uri, "randread", &["--iodepth=256", "--verify_only"]);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Issue 63: a snapshot an export serves is not deleted by a mistyped command: the delete is
/// refused, naming the export; with `--force` it goes, and the export says in its log why its
/// reads fail from then on (it answered EIO with no word before).
#[test]
fn deleting_an_exported_snapshot_is_refused_unless_forced() {
    use std::os::unix::process::CommandExt;
    need("qemu-io");
    let work = tempfile::tempdir().unwrap();
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x42 0 1M", &c.unix]));
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    let log = work.path().join("export.log");
    let sock = work.path().join("s1.sock");
    let mut cmd = Command::new(BIN);
    cmd.arg("--data-dir")
        .arg(c.path())
        .args(["nbd", "vol0@s1", "--socket"])
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut export = cmd.spawn().unwrap();
    let uri = format!("nbd+unix:///vol0@s1?socket={}", sock.display());
    // It holds the snapshot before it listens.
    let t0 = std::time::Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed().as_secs() < 10, "no export");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = c.cli(&["volume", "snapshot", "delete", "vol0", "s1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("snapshot vol0@s1 is exported read-only by export vol0@s1 (pid ")
            && said.contains("held on node 1, 2, 3")
            && said.contains("--force"),
        "{said}"
    );
    run(Command::new("qemu-io").args(["-r", "-f", "raw", "-c", "read -P 0x42 0 1M", &uri]));
    ok(
        &c,
        &["volume", "snapshot", "delete", "vol0", "s1", "--force"],
    );
    let o = Command::new("qemu-io")
        .args(["-r", "-f", "raw", "-c", "read 0 4K", &uri])
        .output()
        .unwrap();
    assert!(
        !o.status.success() || text(&o).contains("error"),
        "{}",
        text(&o)
    );
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("gone from every copy")
    {
        assert!(
            t0.elapsed().as_secs() < 10,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = export.kill();
    let _ = export.wait();
}
