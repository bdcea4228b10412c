//! The UCX transport through the whole stack: `trireme up` with no transport setting, fio's
//! verify workload and `trireme bench --verify` through the NBD export on a 3-way volume, and
//! what `trireme status` says about each writer link. There is no RDMA device on the machines these
//! run on: UCX runs over shared memory (sysv/posix with CMA) or over its own tcp lanes.

mod common;

use std::time::Duration;

use common::{
    assert_replicas_identical, finish_bench, need, run, start_bench, status, wait_all_in_sync,
    Cluster,
};

/// fio's verify workload through the NBD export: random 4K writes from two jobs, each block
/// checked when read back.
fn fio_verify(c: &Cluster) {
    need("fio");
    let out = run(std::process::Command::new("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", c.unix),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=8",
        "--numjobs=2",
        "--size=8M",
        "--offset_increment=16M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--do_verify=1",
        "--group_reporting",
    ]));
    assert!(out.contains("err= 0"), "{out}");
}

/// `(node, transport, lanes, fallback)` of each writer link of vol0.
fn links(c: &Cluster) -> Vec<(u64, String, String, String)> {
    let s = status(c);
    let mut out: Vec<_> = s["volumes"][0]["client_links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let f = |k: &str| l[k].as_str().unwrap_or("").to_string();
            (
                l["node"].as_u64().unwrap(),
                f("transport"),
                f("lanes"),
                f("fallback"),
            )
        })
        .collect();
    out.sort();
    out
}

/// No transport setting: every link uses UCX over shared memory; a node started with
/// `--transport tcp` gets TCP and status says why; the verify workload is clean.
#[test]
fn ucx_over_shared_memory_with_one_node_on_tcp() {
    let c = Cluster::start(&[
        "--store",
        "memory",
        "--size",
        "128M",
        "--node-transport",
        "2=tcp",
    ]);
    let l = links(&c);
    assert_eq!(l.len(), 3, "{l:?}");
    for (node, transport, lanes, fallback) in &l {
        if *node == 2 {
            assert_eq!(transport, "unix", "{l:?}");
            assert!(fallback.contains("--transport tcp"), "{l:?}");
        } else {
            assert_eq!(transport, "ucx", "{l:?}");
            assert!(
                lanes.starts_with("sysv/memory") || lanes.starts_with("posix/memory"),
                "{l:?}"
            );
        }
    }
    fio_verify(&c);
    let b = start_bench(&c, 4);
    finish_bench(&c, b);
    assert_replicas_identical(&c, "vol0");
}

/// UCX restricted to its tcp transport (as between hosts without RDMA), and its path to one
/// node torn down mid-run: the calls in flight go on over TCP and the workload sees nothing.
#[test]
fn ucx_over_its_tcp_lanes_and_a_teardown_mid_run() {
    let c = Cluster::start_env(
        tempfile::tempdir().unwrap(),
        &["--store", "memory", "--size", "128M"],
        &[("TRIREME_UCX_TLS", "tcp")],
    );
    for (_, transport, lanes, _) in &links(&c) {
        assert_eq!((transport.as_str(), lanes.as_str()), ("ucx", "tcp/lo"));
    }
    fio_verify(&c);
    let b = start_bench(&c, 6);
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(c.path().join("ucx-teardown"), "3").unwrap();
    let pid = c.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on the `trireme up` this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
    finish_bench(&c, b);
    let l = links(&c);
    let n3 = l.iter().find(|x| x.0 == 3).unwrap();
    assert_eq!(n3.1, "unix", "{l:?}");
    assert!(n3.3.contains("SIGUSR2"), "{l:?}");
    assert!(l.iter().filter(|x| x.1 == "ucx").count() == 2, "{l:?}");
    wait_all_in_sync(&c);
    assert_replicas_identical(&c, "vol0");
    assert!(c.log().contains("UCX path stopped"), "{}", c.log());
    // The comparison runs each round on a runtime of its own in one process: the second UCX
    // round must start its own UCX driver, the first one having ended with its runtime. It
    // asks for the tcp lanes too: by default a process leaves them out, and the nodes have
    // nothing else.
    let out = c.cli_env(
        &[
            "--log",
            "info",
            "--output",
            "json",
            "bench",
            "--compare",
            "transport=tcp,ucx",
            "--rounds",
            "2",
            "-b4K",
            "-w50",
            "-t2",
            "-o2",
            "-d1",
            "volume:vol0",
        ],
        &[("TRIREME_UCX_TLS", "tcp")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    for r in runs {
        assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
    }
    let links = |value: &str| -> Vec<String> {
        runs.iter().find(|r| r["value"] == value).unwrap()["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect()
    };
    let ucx = links("ucx");
    assert!(
        ucx.len() == 3 && ucx.iter().all(|l| l.contains(": ucx over")),
        "{ucx:?}"
    );
    // The TCP baseline goes through the network stack, not the same-host sockets.
    let tcp = links("tcp");
    assert!(
        tcp.len() == 3 && tcp.iter().all(|l| l.ends_with(": tcp")),
        "{tcp:?}"
    );
    // `transport=ucx` refuses TCP: a round whose links could not use UCX would say so.
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !log.contains("not usable") && !log.contains("unreachable"),
        "{log}"
    );
}

/// `--transport ucx` fails loudly where UCX cannot be used.
#[test]
fn transport_ucx_refuses_to_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::BIN)
        .env("TRIREME_UCX_TLS", "no-such-transport")
        .arg("--data-dir")
        .arg(dir.path())
        .args([
            "--transport",
            "ucx",
            "node",
            "serve",
            "--id",
            "1",
            "--store",
            "memory",
            "--insecure",
        ])
        .arg("--dir")
        .arg(dir.path().join("n1"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--transport ucx, but UCX cannot start"),
        "{err}"
    );
}
