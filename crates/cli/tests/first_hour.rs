//! The edges a new operator met in the first hour (issue 63), each now said plainly: a
//! mistyped command, a drain with nowhere to go, a finished drain, what the events record,
//! who writes a volume `trireme nbd` serves, and where Prometheus finds that writer.

mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn events(c: &Cluster) -> Vec<serde_json::Value> {
    serde_json::from_slice(&c.cli(&["--output", "json", "events"]).stdout).unwrap()
}

/// Waits (10 s at most) until an event of `kind` says `part`.
fn wait_event(c: &Cluster, kind: &str, part: &str) {
    let t0 = Instant::now();
    loop {
        let evs = events(c);
        if evs
            .iter()
            .any(|e| e["kind"] == kind && e["text"].as_str().unwrap().contains(part))
        {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no {kind} event says {part:?}: {evs:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_mistyped_command_is_told_what_was_meant_and_help_keeps_global_flags_apart() {
    let o = Command::new(BIN).args(["voluem", "list"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("did you mean 'volume'?"), "{}", text(&o));
    let o = Command::new(BIN).args(["up", "--help"]).output().unwrap();
    let help = text(&o);
    let (own, global) = help.split_once("Global options:").expect(&help);
    assert!(
        own.contains("--nodes <NODES>") && !own.contains("--data-dir <DATA_DIR>"),
        "{help}"
    );
    assert!(global.contains("--data-dir"), "{help}");
}

/// A drain with nowhere to go is refused at once with the hint this cluster takes, and the
/// node stays as it was; a drain that ends leaves the node `drained`, and `undrain` clears its
/// job's line.
#[test]
fn drains_say_where_they_stand() {
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    refused(
        &c,
        &["node", "drain", "1"],
        "restart `trireme up` with `--nodes N+1`",
    );
    let s = status(&c);
    assert_eq!(s["nodes"][0]["state"], "active", "{s}");
    assert!(s["moves"].as_array().unwrap().is_empty(), "{s}");
    drop(c);

    let c = Cluster::start(&["--store", "memory", "--size", "16M", "--nodes", "4"]);
    ok(&c, &["node", "drain", "2"]);
    let list = ok(&c, &["node", "list"]);
    assert!(list.contains("up/drained"), "{list}");
    assert!(list.contains("ZONE"), "{list}");
    assert!(ok(&c, &["status"]).contains("node 2 drain: done"));
    ok(&c, &["node", "undrain", "2"]);
    let st = ok(&c, &["status"]);
    assert!(!st.contains("drain: done"), "{st}");
    assert!(!ok(&c, &["node", "list"]).contains("drain"));
}

/// Snapshots, rollbacks and the trash are events; a volume back from the trash says so.
#[test]
fn snapshots_rollbacks_and_the_trash_are_events() {
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);
    ok(&c, &["volume", "create", "data", "--size", "8M"]);
    wait_event(&c, "volume", "volume data created (8.0 MiB, thin");
    ok(&c, &["volume", "snapshot", "create", "data", "s1"]);
    wait_event(&c, "snapshot", "data@s1 taken");
    ok(&c, &["volume", "rollback", "data", "s1"]);
    wait_event(&c, "rollback", "volume data rolled back to data@s1");
    ok(&c, &["volume", "snapshot", "delete", "data", "s1"]);
    wait_event(&c, "snapshot", "data@s1 deleted");
    ok(&c, &["volume", "delete", "data"]);
    wait_event(&c, "trash", "volume data deleted by");
    ok(&c, &["volume", "trash", "restore", "data"]);
    wait_event(&c, "trash", "volume data restored from the trash");
    assert!(
        events(&c)
            .iter()
            .filter(|e| e["text"].as_str().unwrap().contains("data created"))
            .count()
            == 1,
        "a restore is not a creation: {:#?}",
        events(&c)
    );
}

/// A volume `trireme nbd` serves beside `up`: `status` names its writer with fields, and
/// `/targets` lists its endpoint until it is killed, when its endpoint file goes too.
#[test]
fn a_writer_beside_up_is_named_and_found() {
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    ok(&c, &["volume", "create", "data", "--size", "8M"]);
    let work = tempfile::tempdir().unwrap();
    let sock = work.path().join("data.sock");
    let mut nbd = Command::new(BIN)
        .arg("--data-dir")
        .arg(c.path())
        .args(["nbd", "data", "--socket"])
        .arg(&sock)
        .args(["--http", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let file = c.path().join("nbd-data.http");
    let t0 = Instant::now();
    while !file.exists() || !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no writer");
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = status(&c);
    let v = s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap()
        .clone();
    assert_eq!(v["writer"]["pid"], nbd.id(), "{v}");
    assert!(v["writer"]["uris"][0]
        .as_str()
        .unwrap()
        .starts_with("nbd+unix:///data?socket="));
    let addr = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let http = addr_in(&c.path().join("http"));
    let token = std::fs::read_to_string(c.path().join("http-token")).unwrap();
    let auth = format!("Bearer {}", token.trim());
    let targets = || {
        let (_, t) = http_with(&http, "GET", "/targets", &[("Authorization", &auth)]);
        String::from_utf8_lossy(&t).into_owned()
    };
    assert!(targets().contains(&addr), "{}", targets());
    let _ = nbd.kill();
    let _ = nbd.wait();
    assert!(!targets().contains(&addr), "{}", targets());
    assert!(!file.exists(), "a killed writer's endpoint file stays");
}
