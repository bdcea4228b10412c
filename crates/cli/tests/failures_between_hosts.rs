//! Failures between hosts, with real processes: nodes in network namespaces of their own
//! (standing for hosts, reached over veth), under a `trireme bench --verify` workload, cut off
//! by iptables, killed, stopped, or given a failing disk. Afterwards, as in `failures.rs`: no
//! error, nothing lost, stale or corrupt, every replica back in sync and byte-identical, and
//! each resync within its bound.

mod common;

use std::time::Duration;

use common::netns::Netns;
use common::*;

/// Nodes in their own network namespaces, reached over veth and TCP only: a node cut off by
/// iptables (both directions) and a node killed, under the workload. The cut-off node is taken
/// out by the writer's timeout and declared down by the heartbeats, and both come back with an
/// incremental resync.
#[test]
fn partitioned_and_killed_nodes_in_network_namespaces() {
    if std::env::var_os("TRIREME_SKIP_NETNS").is_some() {
        eprintln!("TRIREME_SKIP_NETNS is set: skipping the network-namespace test");
        return;
    }
    let mut ns = Netns::create(3);
    let c = ns.cluster(&["--store", "file", "--size", "64M"]);
    let s = status(&c);
    let links = &s["volumes"][0]["client_links"];
    for l in links.as_array().unwrap() {
        // A node in a namespace stands for another host: with no RDMA here, the link is
        // trireme's TCP over the veth (UCX would have only its tcp lanes: `ucx::DEFAULT_TLS`).
        assert_tcp_for_want_of_rdma(l, &s);
        let net = format!("10.{}.", ns.net);
        assert!(l["peer"].as_str().unwrap().starts_with(&net), "{s}");
    }
    let bench = start_bench(&c, 14);
    std::thread::sleep(Duration::from_secs(2));
    // A partition longer than the replica timeout and the heartbeat limit.
    ns.partition(2);
    std::thread::sleep(Duration::from_millis(4000));
    let s = status(&c);
    let n2 = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == 2)
        .unwrap()
        .clone();
    assert_eq!(n2["up"], false, "{s}");
    let out = c.cli(&["--output", "json", "volume", "info", "vol0"]);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r2 = info["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == 2)
        .unwrap()
        .clone();
    assert_eq!(r2["state"], "outdated", "recorded out: {info}");
    ns.heal();
    wait_all_in_sync(&c);
    // A crash inside a namespace: restarted there.
    let p3 = node_pid(&c, 3);
    signal(p3, libc::SIGKILL);
    wait_restarted(&c, 3, p3);
    let v = finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    let written = v["write"]["bytes"].as_u64().unwrap();
    let r = resyncs(&c);
    assert!(r.len() >= 2, "{r:?}\n{}", c.log());
    for (full, copied) in &r {
        assert!(!full && *copied <= written, "{r:?}");
    }
    drop(c);
}

/// The same namespaces with `--transport tcp` (through its environment variable, which the
/// nodes inherit): every writer link is plain TCP over a veth, and the verify workload is clean.
#[test]
fn tcp_only_between_network_namespaces() {
    if std::env::var_os("TRIREME_SKIP_NETNS").is_some() {
        eprintln!("TRIREME_SKIP_NETNS is set: skipping the network-namespace test");
        return;
    }
    let ns = Netns::create(3);
    let c = ns.cluster_env(
        &["--store", "memory", "--size", "64M"],
        &[("TRIREME_TRANSPORT", "tcp")],
    );
    let s = status(&c);
    let links = s["volumes"][0]["client_links"].as_array().unwrap();
    assert_eq!(links.len(), 3, "{s}");
    for l in links {
        assert_eq!(l["transport"], "tcp", "{s}");
        let net = format!("10.{}.", ns.net);
        assert!(l["peer"].as_str().unwrap().starts_with(&net), "{s}");
    }
    let bench = start_bench(&c, 4);
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    drop(c);
}

/// A small seeded generator for the soak's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random faults, one after another, each under a `bench --verify` workload: SIGKILL, SIGSTOP,
/// planned stop, an iptables partition, or a failing disk, on a random node of a 3-way volume
/// whose nodes live in network namespaces (sometimes two nodes at once). After each: no error,
/// nothing lost or stale, and every replica back in sync; at the end, byte-identical replicas.
/// `TRIREME_SOAK_FAULTS` sets how many (10 by default, about a minute; `scripts/soak.sh` runs
/// 200),
/// `TRIREME_SOAK_SEED` replays a run.
#[test]
fn soak_random_faults_under_load() {
    if std::env::var_os("TRIREME_SKIP_NETNS").is_some() {
        eprintln!("TRIREME_SKIP_NETNS is set: skipping the soak");
        return;
    }
    let faults: u32 = std::env::var("TRIREME_SOAK_FAULTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seed: u64 = std::env::var("TRIREME_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("soak: {faults} faults, TRIREME_SOAK_SEED={seed}");
    let mut rng = Rng(seed);
    let mut ns = Netns::create(3);
    let c = ns.cluster(&[
        "--store",
        "file",
        "--size",
        "64M",
        "--inject-faults",
        "--restart-backoff",
        "200ms",
    ]);
    let kinds = ["kill", "freeze", "stop", "partition", "disk"];
    let mut written = 0;
    let mut disk_faults = false;
    for f in 0..faults {
        let first = rng.below(3) as u32 + 1;
        let mut victims = vec![first];
        if rng.below(5) == 0 {
            victims.push((first + rng.below(2) as u32) % 3 + 1);
        }
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let hold = Duration::from_millis(800 + rng.below(1700));
        eprintln!("soak fault {f}: {kind} on nodes {victims:?} for {hold:?} (seed {seed})");
        let bench = start_bench(&c, 4);
        std::thread::sleep(Duration::from_millis(500));
        let pids: Vec<i32> = victims.iter().map(|&n| node_pid(&c, n)).collect();
        for (&n, &pid) in victims.iter().zip(&pids) {
            match kind {
                "kill" => signal(pid, libc::SIGKILL),
                "freeze" => signal(pid, libc::SIGSTOP),
                "stop" => {
                    cli_ok(&c, &["node", "stop", &n.to_string()]);
                }
                "partition" => ns.partition(n),
                _ => {
                    disk_faults = true;
                    let spec = c.path().join(format!("node-{n}.faults"));
                    let s = format!("read=0.05 write=0.05 flush=0.2 seed={}", rng.next());
                    std::fs::write(spec, s).unwrap();
                }
            }
        }
        std::thread::sleep(hold);
        for (&n, &pid) in victims.iter().zip(&pids) {
            match kind {
                "kill" => {
                    wait_restarted(&c, n, pid);
                }
                "freeze" => signal(pid, libc::SIGCONT),
                "stop" => {
                    cli_ok(&c, &["node", "start", &n.to_string()]);
                }
                "partition" => ns.heal(),
                _ => std::fs::write(c.path().join(format!("node-{n}.faults")), "").unwrap(),
            }
        }
        let v = finish_bench(&c, bench);
        written += v["write"]["bytes"].as_u64().unwrap();
        wait_all_in_sync(&c);
    }
    assert_replicas_identical(&c, "vol0");
    for (full, copied) in resyncs(&c) {
        assert!(
            full && disk_faults || copied <= written,
            "a resync copied {copied} bytes (full: {full}) with {written} written (seed {seed})"
        );
    }
}
