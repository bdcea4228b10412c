//! Tiered nodes (`--store tiered`): a verifying hot-zone workload while extents migrate and a
//! node is killed, and pins that move every extent within the migration rate. The slow tier
//! is the disk model (this host has no spinning disk).

mod common;

use common::*;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn info(c: &Cluster, volume: &str) -> serde_json::Value {
    let out = c.cli(&["--output", "json", "volume", "info", volume]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (node, extents on fast, extents on slow, promotions) of each replica.
fn tiers(c: &Cluster, volume: &str) -> Vec<(u64, u64, u64, u64)> {
    info(c, volume)["tiers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_u64().unwrap();
            (
                n("node"),
                n("fast_extents"),
                n("slow_extents"),
                n("promotions"),
            )
        })
        .collect()
}

/// Every node's map covers the volume, its fast-tier accounting matches its map, and its fast
/// file takes no more space than the extents the map puts there (nothing leaked by a move cut
/// short). A move in flight has its place reserved and its copy written before the map names
/// it, so this holds between moves: it is checked until the mover has let it be (20 s at most).
fn check_maps(c: &Cluster, extents: u64) {
    let t0 = Instant::now();
    loop {
        let problems = map_problems(c, extents);
        if problems.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{problems:?}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn map_problems(c: &Cluster, extents: u64) -> Vec<String> {
    let mut p = Vec::new();
    let st = status(c);
    let t = tiers(c, "vol0");
    if t.len() != 3 {
        p.push(format!("tiers of {} replicas: {t:?}", t.len()));
    }
    for (node, fast, slow, _) in t {
        if fast + slow != extents {
            p.push(format!(
                "node {node}: {fast} + {slow} extents, not {extents}"
            ));
        }
        let n = st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"].as_u64() == Some(node))
            .unwrap();
        if n["tiers"]["fast_used"].as_u64() != Some(fast * MIB) {
            p.push(format!("node {node}: accounting {n} for {fast} extents"));
        }
        use std::os::unix::fs::MetadataExt;
        // The data file and the pool file (what the replica grew by).
        let used: u64 = ["data", "pool"]
            .iter()
            .filter_map(|x| {
                let p = c
                    .path()
                    .join(format!("node-{node}/fast/replica-0000000000000001.{x}"));
                std::fs::metadata(p).ok()
            })
            .map(|m| m.blocks() * 512)
            .sum();
        if used > fast * MIB + 64 * 1024 {
            p.push(format!(
                "node {node}: fast file takes {used} bytes for {fast} extents"
            ));
        }
    }
    p
}

/// Waits (20 s at most) until a copy of vol0 has promoted an extent, then kills node 2 (-9)
/// and waits for it to be restarted: the kill lands while extents migrate.
fn kill_node_2_once_promoting(c: &Cluster) {
    let t0 = Instant::now();
    while tiers(c, "vol0").iter().all(|t| t.3 == 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "nothing promoted: {:?}\n{}",
            tiers(c, "vol0"),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let p2 = node_pid(c, 2);
    signal(p2, libc::SIGKILL);
    wait_restarted(c, 2, p2);
}

#[test]
fn a_hot_zone_workload_loses_nothing_while_extents_migrate_and_a_node_dies() {
    // A 26-extent hot zone promoted at 4 MiB/s: migration runs for seconds, across the kill.
    let c = Cluster::start(&[
        "--store",
        "tiered",
        "--size",
        "128M",
        "--fast-size",
        "32M",
        "--migrate-rate",
        "4M",
    ]);
    let bench = std::process::Command::new(env!("CARGO_BIN_EXE_trireme"))
        .arg("--data-dir")
        .arg(c.path())
        .args([
            "--output",
            "json",
            "bench",
            "--verify",
            "-b4K",
            "-w30",
            "-rdpct90/20",
            "-t2",
            "-o4",
            "-d16",
            "-W0",
        ])
        .arg(&c.unix)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-migration: some hot extents are up, most are still to come.
    kill_node_2_once_promoting(&c);
    let v = check_workload(bench, 300, &|| c.log());
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    check_maps(&c, 128);
    let t = &v["tier"];
    assert!(
        t["reads_fast"].as_u64().unwrap() > 0,
        "no read served by the fast tier: {t}"
    );
    assert!(
        t["disk_model"].as_str().unwrap().contains("disk model"),
        "{t}"
    );
}

/// Waits until every replica of vol0 has `fast` extents on the fast tier; returns how long.
fn wait_fast(c: &Cluster, fast: u64, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let t = tiers(c, "vol0");
        if t.len() == 3 && t.iter().all(|x| x.1 == fast) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "after {:?}: {t:?}\n{}",
            t0.elapsed(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn pins_move_every_extent_within_the_rate_and_a_pin_that_does_not_fit_is_refused() {
    let c = Cluster::start(&[
        "--store",
        "tiered",
        "--size",
        "16M",
        "--fast-size",
        "24M",
        "--migrate-rate",
        "8M",
    ]);
    let q = |cmd: &str| {
        let out = std::process::Command::new("qemu-io")
            .args(["-f", "raw", "-c", cmd, &c.unix])
            .output()
            .unwrap();
        assert!(
            out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("fail"),
            "qemu-io {cmd}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    need("qemu-io");
    q("write -P 0x5a 0 16M");
    // 16 MiB at 8 MiB/s: 2 s, with room for the mover's 100 ms ticks and the polling.
    let bound = Duration::from_millis(2000 + 1500);
    let out = c.cli(&["volume", "set", "vol0", "--tier", "fast"]);
    assert!(out.status.success(), "{out:?}");
    let took = wait_fast(&c, 16, Duration::from_secs(30));
    assert!(took <= bound, "pinning to fast took {took:?}");
    q("read -P 0x5a 0 16M");
    let out = c.cli(&["volume", "set", "vol0", "--tier", "slow"]);
    assert!(out.status.success(), "{out:?}");
    let took = wait_fast(&c, 0, Duration::from_secs(30));
    assert!(took <= bound, "pinning to slow took {took:?}");
    q("read -P 0x5a 0 16M");
    assert_replicas_identical(&c, "vol0");
    check_maps(&c, 16);

    // A second volume pinned to fast does not fit beside the room the first could take back:
    // 16 + 16 extents of 24.
    let out = c.cli(&["volume", "set", "vol0", "--tier", "fast"]);
    assert!(out.status.success());
    let out = c.cli(&["volume", "create", "big", "--size", "16M", "--tier", "fast"]);
    assert!(
        !out.status.success(),
        "a pin past the fast tier was accepted"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fast tier has 24 places"), "{err}");
    let list = String::from_utf8_lossy(&c.cli(&["volume", "list"]).stdout).to_string();
    assert!(!list.contains("big"), "the refused volume was kept: {list}");
    let info = info(&c, "vol0");
    assert_eq!(info["tier"], "fast", "{info}");
}

#[test]
fn a_drained_copy_of_a_pinned_volume_is_pinned_on_its_new_node() {
    let c = Cluster::start(&[
        "--nodes",
        "4",
        "--store",
        "tiered",
        "--size",
        "16M",
        "--fast-size",
        "24M",
        "--migrate-rate",
        "16M",
    ]);
    let out = c.cli(&["volume", "set", "vol0", "--tier", "fast"]);
    assert!(out.status.success(), "{out:?}");
    let before: Vec<u64> = tiers(&c, "vol0").iter().map(|t| t.0).collect();
    let spare = (1..=4u64).find(|n| !before.contains(n)).unwrap();
    let out = c.cli(&["node", "drain", &before[0].to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t0 = Instant::now();
    loop {
        let t = tiers(&c, "vol0");
        let info = info(&c, "vol0");
        let pinned = info["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["node"].as_u64() == Some(spare) && x["pin"] == "fast");
        if pinned && t.iter().any(|x| x.0 == spare && x.1 == 16) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the new copy on node {spare} is not on the fast tier: {info}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_replicas_identical(&c, "vol0");
}

/// Versions on tiered nodes, end to end: the volume grows, takes a snapshot, is rewritten
/// whole (every block redirected into a pool that grows each node's tiered replica), is
/// cloned, and has its rewritten blocks promoted to flash by a read workload while a node is
/// killed; then the snapshot, the clone and the volume each read back exactly, and the copies
/// are identical, snapshots included.
#[test]
fn a_tiered_volume_grows_takes_snapshots_and_clones_and_keeps_them_through_a_kill() {
    need("qemu-img");
    let work = tempfile::tempdir().unwrap();
    let c = Cluster::start(&[
        "--store",
        "tiered",
        "--size",
        "16M",
        "--fast-size",
        "24M",
        "--migrate-rate",
        "32M",
    ]);
    let size = 24 << 20;
    ok(&c, &["volume", "resize", "vol0", "24M"]);
    assert_eq!(tiers(&c, "vol0").iter().map(|t| t.1 + t.2).max(), Some(24));
    let (one, two) = (work.path().join("one.img"), work.path().join("two.img"));
    random_file(&one, size, 11);
    random_file(&two, size, 22);
    write_image(&one, &c.unix);
    let s = ok(&c, &["volume", "snapshot", "create", "vol0", "one"]);
    assert!(s.contains("on nodes 1, 2, 3"), "{s}");
    write_image(&two, &c.unix);
    ok(&c, &["volume", "clone", "vol0@one", "copy"]);
    let grown = tiers(&c, "vol0");
    assert!(
        grown.iter().all(|t| t.1 + t.2 > 24),
        "the pool grew no node's tiered replica: {grown:?}"
    );
    // Random reads over the volume heat its extents, the pool's among them (they hold what
    // the head reads now); node 2 is killed once promotions have begun.
    let bench = std::process::Command::new(env!("CARGO_BIN_EXE_trireme"))
        .arg("--data-dir")
        .arg(c.path())
        .args(["bench", "-b4K", "-w0", "-t2", "-o4", "-d6", "-W0"])
        .arg(&c.unix)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    kill_node_2_once_promoting(&c);
    let out = wait_within(bench, Duration::from_secs(60), &|| c.log());
    assert!(out.status.success(), "{}", text(&out));
    wait_all_in_sync(&c);
    compare_image(&two, &c.unix);
    for (name, image) in [("vol0@one", &one), ("copy", &one)] {
        let sock = work.path().join(format!("{}.sock", name.replace('@', "-")));
        let (mut child, uri) = spawn_nbd(&c, name, &sock);
        compare_image(image, &uri);
        let _ = child.kill();
        let _ = child.wait();
    }
    let v: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "verify", "vol0"])).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0, "{v}");
    let snaps = v["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 1, "{v}");
    assert!(snaps[0]["mismatches"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(snaps[0]["nodes"], serde_json::json!([1, 2, 3]), "{v}");
}
