//! `trireme bench` against every kind of target, its JSON schema, and its refusals.

mod common;
use common::*;
use std::process::Command;

fn bench_json(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(dir)
        .args(["--output", "json", "bench"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The keys the issue promises to scripts and dashboards.
fn assert_schema(v: &serde_json::Value) {
    for k in ["iops", "mib_per_s", "iops_per_kernel_pct"] {
        assert!(v[k].is_number(), "{k} in {v}");
    }
    for k in ["user_pct", "kernel_pct"] {
        assert!(v["cpu"][k].is_number(), "cpu.{k} in {v}");
    }
    assert!(v["cpu_us_per_io"]["generator"].is_number(), "{v}");
    assert!(v["cpu_us_per_io"].get("storage").is_some(), "{v}");
    for op in ["read", "write"] {
        assert!(v[op]["iops"].is_number(), "{op}.iops in {v}");
    }
}

#[test]
fn null_and_file_targets() {
    let d = tempfile::tempdir().unwrap();
    let v = bench_json(
        d.path(),
        &["-b4K", "-r", "-w30", "-t1", "-o8", "-d1", "null"],
    );
    assert_schema(&v);
    assert!(v["iops"].as_f64().unwrap() > 10_000.0, "{v}");
    for k in ["p50", "p90", "p99", "p999", "max"] {
        assert!(
            v["read"]["latency_us"][k].is_number(),
            "read.latency_us.{k}"
        );
        assert!(
            v["write"]["latency_us"][k].is_number(),
            "write.latency_us.{k}"
        );
    }
    assert!(
        v["cpu_us_per_io"]["storage"].is_null(),
        "no storage processes for null"
    );

    let f = d.path().join("target.img");
    let f = f.to_str().unwrap();
    let v = bench_json(
        d.path(),
        &["-b4K", "-r", "-w50", "-t2", "-o2", "-d1", "-c8M", "-Zr", f],
    );
    assert_schema(&v);
    assert!(
        v["write"]["ios"].as_u64().unwrap() > 0 && v["read"]["ios"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(v["target"].as_str().unwrap().contains("O_DIRECT"), "{v}");
    assert_eq!(std::fs::metadata(f).unwrap().len(), 8 << 20);
}

#[test]
fn volume_and_nbd_targets_of_a_cluster() {
    let c = Cluster::start(&["--store", "memory", "--size", "64M"]);
    let v = bench_json(c.path(), &["--profile", "s2d", "-d1", "-W0", &c.unix]);
    assert_schema(&v);
    assert!(
        v["cpu_us_per_io"]["storage"].as_f64().unwrap() > 0.0,
        "storage pids come from <data-dir>/pids: {v}"
    );
    assert_eq!(v["profile"]["threads"], 10);
    assert_eq!(v["profile"]["write_pct"], 30);
    let v = bench_json(
        c.path(),
        &["-b64K", "-s", "-w100", "-t2", "-o4", "-d1", "volume:vol0"],
    );
    assert_schema(&v);
    assert!(
        v["target"].as_str().unwrap().contains("native client"),
        "{v}"
    );
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    // The bench attached with a new epoch, so it was the only writer; the copies still agree.
    assert_replicas_identical(&c, "vol0");
}

#[test]
fn refusals_are_one_line_with_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let small = d.path().join("small.img");
    std::fs::write(&small, vec![0u8; 4096]).unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec!["-w150".into(), "null".into()],
        vec!["-t0".into(), "null".into()],
        vec!["-b4K".into(), "-Zx".into(), "null".into()],
        vec!["-b64K".into(), small.display().to_string()],
        vec![d.path().join("missing.img").display().to_string()],
        vec!["nbd+unix:///x?socket=/nonexistent.sock".into()],
        vec!["volume:nope".into()],
        vec!["nbd://".into()],
    ];
    for args in cases {
        let out = Command::new(BIN)
            .arg("--data-dir")
            .arg(d.path())
            .arg("bench")
            .args(&args)
            .args(["-d1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
