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
        vec!["-rdpct60/10:50/10".into(), "null".into()],
        vec!["-rdpct90".into(), "null".into()],
        vec!["-rdpct90/10".into(), "-s".into(), "null".into()],
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

#[test]
fn verify_is_clean_on_a_healthy_volume_and_file() {
    let c = Cluster::start(&["--store", "file", "--size", "32M"]);
    for target in [c.unix.as_str(), "volume:vol0"] {
        let v = bench_json(
            c.path(),
            &[
                "-b8K", "-r4K", "-w50", "-t2", "-o4", "-d2", "--verify", target,
            ],
        );
        let ver = &v["verify"];
        assert!(
            ver["blocks_checked"].as_u64().unwrap() > 100,
            "{target}: {ver}"
        );
        assert_eq!(
            (
                ver["lost"].as_u64(),
                ver["stale"].as_u64(),
                ver["corrupt"].as_u64()
            ),
            (Some(0), Some(0), Some(0)),
            "{target}: {ver}"
        );
    }
    assert_replicas_identical(&c, "vol0");
}

#[test]
fn verify_catches_blocks_changed_behind_its_back() {
    use std::os::unix::fs::FileExt;
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("victim.img");
    let child = Command::new(BIN)
        .arg("--data-dir")
        .arg(d.path())
        .args([
            "--output", "json", "bench", "-b4K", "-r", "-w50", "-t1", "-o4", "-d2", "-c1M",
            "--verify",
        ])
        .arg(&f)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Scribble on the file until the bench is done: a disk returning wrong contents.
    while !f.exists() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    let pid = child.id();
    let mut k = 0u64;
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && k < 100_000 {
        let lba = (k * 7919) % 256;
        file.write_all_at(&[0xEEu8; 4096], lba * 4096).unwrap();
        let _ = file.sync_data();
        k += 1;
        std::thread::sleep(std::time::Duration::from_millis(2));
        if k.is_multiple_of(50) && child_exited(pid) {
            break;
        }
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "verification must fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["verify"]["corrupt"].as_u64().unwrap() > 0,
        "{}",
        v["verify"]
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("verification failed"));
}

fn child_exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

#[test]
fn compare_prints_medians_per_value() {
    let c = Cluster::start(&["--store", "memory", "--size", "32M"]);
    let out = c.cli(&[
        "--output",
        "json",
        "bench",
        "--compare",
        "replicas=1,2",
        "--rounds",
        "1",
        "-b4K",
        "-r",
        "-w30",
        "-t2",
        "-o2",
        "-d1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["axis"], "replicas");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (r, want) in runs.iter().zip(["1", "2"]) {
        assert_eq!(r["value"], want);
        assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["write"]["latency_us"]["p90"].is_number(), "{r}");
    }
    // The temporary volumes are gone again.
    let list: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "volume", "list"]).stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    // Text output is the seed's table.
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("f.img");
    let spec = format!("target=null,{}", f.display());
    let out = Command::new(BIN)
        .args([
            "bench",
            "--compare",
            &spec,
            "--rounds",
            "1",
            "-b4K",
            "-r",
            "-d1",
            "-c4M",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("IOPS per % kernel CPU") && text.contains("90th percentile read latency"),
        "{text}"
    );
    assert!(text.contains("IOPS with the same workload"), "{text}");
    // Comparing transports needs the native client (a transport is a property of its links).
    let out = Command::new(BIN)
        .args(["bench", "--compare", "transport=tcp,ucx", "null"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a native-client target"));
}

#[test]
fn sweep_draws_the_three_charts() {
    need("rsvg-convert");
    let d = tempfile::tempdir().unwrap();
    let charts = d.path().join("charts");
    let f = d.path().join("sweep.img");
    let out = Command::new(BIN)
        .args([
            "--output",
            "json",
            "bench",
            "--sweep",
            "qd=1,2",
            "bs=4K,8K",
            "-r",
            "-w30",
            "-d1",
            "-c4M",
            "--chart-dir",
        ])
        .arg(&charts)
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 4);
    for name in ["iops_vs_iodepth", "bandwidth_vs_blocksize", "latency_cdf"] {
        let svg = std::fs::read_to_string(charts.join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.contains("<polyline") && svg.contains("no RDMA device"),
            "{name}"
        );
        let png = std::fs::read(charts.join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}.png is a PNG");
    }
}
