//! Destructive commands ask for proof of intent, with real processes: a volume in use is not
//! deleted by mistake, `--force` fences its writer first, and the trash gives a deleted volume
//! back byte for byte until it is purged.

mod common;
use common::*;
use std::process::Command;

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Volume `name` as `status --output json` shows it.
fn volume_status(c: &Cluster, name: &str) -> serde_json::Value {
    let s = status(c);
    s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name} in {s}"))
        .clone()
}

/// Creates volume `data` of `size` and serves it with `trireme nbd`: the writer and its URI.
fn data_with_a_writer(c: &Cluster, size: &str) -> (std::process::Child, String) {
    let out = c.cli(&["volume", "create", "data", "--size", size]);
    assert!(out.status.success(), "{}", text(&out));
    spawn_nbd(c, "data", &c.path().join("data.sock"))
}

/// The files of volume `id`'s replicas under the nodes' directories (the file store's names).
/// Changes a block of node `node`'s copy of volume `id` at `offset` in its data file, behind
/// the system's back.
fn corrupt(c: &Cluster, node: u64, id: u64, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(
            c.path()
                .join(format!("node-{node}"))
                .join(format!("replica-{id:016x}.data")),
        )
        .unwrap();
    f.write_all_at(&[0xff; 4096], offset).unwrap();
    f.sync_all().unwrap();
}

fn replica_files(c: &Cluster, id: u64) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![c.path().to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("replica-{id:016x}.")))
            {
                out.push(p);
            }
        }
    }
    out
}

/// The `code` of each answer to `requests` (JSON lines) on `c`'s control socket.
fn control_codes(c: &Cluster, requests: &[&str]) -> Vec<String> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(c.path().join("control.sock")).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    requests
        .iter()
        .map(|q| {
            writeln!(s, "{q}").unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let e = v.get("error").or(v.get("failed"));
            e.and_then(|e| e["code"].as_str())
                .unwrap_or_else(|| panic!("{q}: {line}"))
                .to_string()
        })
        .collect()
}

#[test]
fn a_volume_in_use_is_not_deleted_by_mistake_and_the_trash_gives_it_back() {
    need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);

    // The volume `up` serves itself: refused, naming the holder.
    let out = c.cli(&["volume", "delete", "vol0"]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("in use") && t.contains("own process"), "{t}");
    // Programs (a CSI driver) decide on the control API's stable codes, never the text.
    assert_eq!(
        control_codes(
            &c,
            &[
                r#"{"cmd":"volume_delete","name":"vol0"}"#,
                r#"{"cmd":"volume_info","name":"nope"}"#,
                r#"{"cmd":"volume_create","name":"vol0","size":4096}"#,
                r#"{"cmd":"volume_create","name":"odd","size":1000}"#,
                r#"{"cmd":"volume_create","name":"huge","size":1099511627776}"#,
                r#"{"cmd":"snapshot_delete","name":"vol0","snapshot":"nope"}"#,
                r#"{"cmd":"no_such_command"}"#,
            ]
        ),
        [
            "in_use",
            "not_found",
            "already_exists",
            "invalid",
            "no_space",
            "not_found",
            "invalid"
        ]
    );

    // A volume written through `trireme nbd`.
    let (mut nbd, uri) = data_with_a_writer(&c, "8M");
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 0 1M",
        "-c",
        "write -P 0x3c 4M 512K",
        &uri,
    ]));
    let out = c.cli(&["volume", "delete", "data"]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("in use") && t.contains("epoch") && t.contains("--force"),
        "{t}"
    );
    assert!(c.cli(&["volume", "info", "data"]).status.success());

    // --force fences the writer first: its I/O fails from then on.
    let out = c.cli(&["volume", "delete", "data", "--force", "--keep", "1h"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("in the trash until"), "{}", text(&out));
    let read = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x5a 0 4K", &uri])
        .output()
        .unwrap();
    let t = text(&read);
    assert!(
        !read.status.success() || t.contains("failed"),
        "a fenced writer still served a read: {t}"
    );
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    let _ = nbd.wait();
    assert_eq!(c.cli(&["volume", "info", "data"]).status.code(), Some(2));

    let out = c.cli(&["--output", "json", "volume", "trash", "list"]);
    assert!(out.status.success(), "{}", text(&out));
    let l: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(l.as_array().unwrap().len(), 1, "{l}");
    assert_eq!(l[0]["volume"]["name"], "data");
    let id = l[0]["volume"]["id"].as_u64().unwrap();
    assert_eq!(
        l[0]["purge_at"].as_u64().unwrap() - l[0]["deleted_at"].as_u64().unwrap(),
        3600
    );
    assert!(
        text(&c.cli(&["volume", "trash", "list"])).contains("data"),
        "the table names it"
    );
    assert!(
        !replica_files(&c, id).is_empty(),
        "the trash keeps the replicas"
    );

    // Restored byte for byte, and writable again through a new writer.
    let out = c.cli(&["volume", "trash", "restore", "data"]);
    assert!(out.status.success(), "{}", text(&out));
    let (mut nbd, uri) = spawn_nbd(&c, "data", &c.path().join("data.sock"));
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x5a 0 1M",
        "-c",
        "read -P 0x3c 4M 512K",
        "-c",
        "read -P 0 1M 3M",
        "-c",
        "write -P 0x11 2M 4K",
        &uri,
    ]));
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());
    assert_replicas_identical(&c, "data");

    // Detached, it deletes without --force; a purge frees the replicas for good.
    let out = c.cli(&["volume", "delete", "data"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = c.cli(&["volume", "trash", "purge", "data"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("purged data"), "{}", text(&out));
    assert!(
        replica_files(&c, id).is_empty(),
        "{:?}",
        replica_files(&c, id)
    );
    assert!(text(&c.cli(&["volume", "trash", "list"])).contains("empty"));
    assert!(!c
        .cli(&["volume", "trash", "restore", "data"])
        .status
        .success());
    // A typo is an error, not a no-op.
    let out = c.cli(&["volume", "delete", "dta"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = c.cli(&["volume", "delete", "vol0", "--keep", "2y"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// The README's `trireme bench volume:vol0` beside `up`: another writer of `up`'s own volume
/// fences the export while it holds the volume, `status` says so, and once it detaches the
/// export takes the volume back and serves the same bytes.
#[test]
fn another_writer_of_ups_volume_fences_the_export_only_while_it_holds_it() {
    need("qemu-io");
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    let qemu = |cmds: &[&str]| {
        let mut cmd = Command::new("qemu-io");
        cmd.args(["-f", "raw"]);
        for x in cmds {
            cmd.args(["-c", x]);
        }
        cmd.arg(&c.unix).output().unwrap()
    };
    let w = qemu(&["write -P 0x21 0 64K"]);
    assert!(w.status.success(), "{}", text(&w));

    let sock = c.path().join("other.sock");
    let (mut nbd, _) = spawn_nbd(&c, "vol0", &sock);
    let r = qemu(&["read -P 0x21 0 4K"]);
    assert!(
        !r.status.success() || text(&r).contains("failed"),
        "the fenced export still served: {}",
        text(&r)
    );
    let s = status(&c);
    let writer = &s["volumes"][0]["writer"];
    assert!(writer["fenced"].as_str().is_some(), "{s}");
    assert!(
        writer["text"].as_str().unwrap().starts_with("fenced: "),
        "{s}"
    );
    assert_eq!(s["volumes"][0]["health"]["verdict"], "writer-fenced", "{s}");
    assert_eq!(s["health"]["verdict"], "writer-fenced", "{s}");
    let text_status = text(&c.cli(&["status"]));
    assert!(
        text_status.starts_with("health: WRITER-FENCED"),
        "{text_status}"
    );
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());

    // The export serves the same bytes again once it has taken the volume back.
    let served_again = |after: &str| {
        let t0 = std::time::Instant::now();
        loop {
            let r = qemu(&["read -P 0x21 0 64K"]);
            if r.status.success() && !text(&r).contains("failed") {
                return;
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(15),
                "the export never took the volume back after {after}:\n{}",
                c.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    served_again("trireme nbd detached");
    // The README's benchmark: the same.
    let b = c.cli(&[
        "bench",
        "-b4K",
        "-r",
        "-w0",
        "-t1",
        "-o1",
        "-d1",
        "volume:vol0",
    ]);
    assert!(b.status.success(), "{}", text(&b));
    served_again("the bench");
    assert!(c.log().contains("took the volume back"));
    let s = status(&c);
    assert!(s["volumes"][0]["writer"].is_null(), "{s}");
    assert_eq!(s["health"]["verdict"], "healthy", "{s}");
}

/// A `trireme nbd` writer outlives a full restart of `up` (every node with it): its requests
/// wait while the cluster is away and succeed once it is back, on the same bytes, without a
/// restart of the writer; the copies stay identical.
#[test]
fn a_writer_survives_a_restart_of_the_whole_cluster() {
    need("qemu-io");
    let args = ["--store", "file", "--size", "16M"];
    let mut c = Cluster::start(&args);
    let (mut nbd, uri) = data_with_a_writer(&c, "8M");
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x44 0 1M", &uri]));
    let dir = c.stop();
    let c = Cluster::start_in(dir, &args);
    let out = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0x44 0 1M",
            "-c",
            "write -P 0x45 1M 64K",
            "-c",
            "read -P 0x45 1M 64K",
            &uri,
        ])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(
        out.status.success() && !t.contains("failed"),
        "the writer did not come back: {t}\n{}",
        c.log()
    );
    // A write may meet a node's link from before the restart, closed, before the writer
    // links it again: that copy is taken out and its resync brings it back.
    let t0 = std::time::Instant::now();
    while volume_status(&c, "data")["health"]["verdict"] != "healthy" {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "{}\n{}",
            volume_status(&c, "data"),
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());
    assert_replicas_identical(&c, "data");
    let v = volume_status(&c, "data");
    assert_eq!(v["health"]["verdict"], "healthy", "{v}");
}

/// `volume scrub` of a volume nobody writes: the manager attaches a writer of its own for the
/// scrub, repairs the corrupted copy from the majority and lets go; while a writer elsewhere
/// holds the volume, the scrub is refused, naming it.
#[test]
fn a_volume_nobody_writes_is_scrubbed_too() {
    need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "16M"]);
    let (mut nbd, uri) = data_with_a_writer(&c, "4M");
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x5a 0 1M", &uri]));
    let out = c.cli(&["volume", "scrub", "data"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("has not detached"), "{}", text(&out));
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());

    let info: serde_json::Value = serde_json::from_slice(
        &c.cli(&["--output", "json", "volume", "info", "data"])
            .stdout,
    )
    .unwrap();
    let id = info["id"].as_u64().expect("volume id");
    let node = info["replicas"][2]["node"].as_u64().unwrap();
    corrupt(&c, node, id, 65536);
    assert_eq!(c.cli(&["volume", "verify", "data"]).status.code(), Some(1));

    let out = c.cli(&["--output", "json", "volume", "scrub", "data"]);
    assert!(out.status.success(), "{}", text(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["mismatched_regions"], 1, "{r}");
    assert_eq!(r["repaired"][0][1], node, "{r}");
    assert_replicas_identical(&c, "data");
    // The manager let go of it: nobody holds it, and it is healthy.
    let v = volume_status(&c, "data");
    assert!(v["writer"].is_null(), "{v}");
    assert_eq!(v["health"]["verdict"], "healthy", "{v}");
    assert!(c.cli(&["volume", "delete", "data"]).status.success());
}

/// The manager scrubs every volume by itself (`--scrub-interval`): a copy corrupted behind the
/// system's back is repaired without anyone asking, and the outcome shows in `volume info`,
/// the events and the metrics.
#[test]
fn scheduled_scrubs_repair_a_corrupted_copy_and_say_so() {
    need("qemu-io");
    let c = Cluster::start(&[
        "--store",
        "file",
        "--size",
        "16M",
        "--scrub-interval",
        "3s",
        "--scrub-rate",
        "64M",
    ]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x5a 0 2M", &c.unix]));
    let info = |c: &Cluster| -> serde_json::Value {
        serde_json::from_slice(
            &c.cli(&["--output", "json", "volume", "info", "vol0"])
                .stdout,
        )
        .unwrap()
    };
    let v = info(&c);
    assert!(v["next_scrub"].as_u64().is_some(), "{v}");
    let id = v["id"].as_u64().unwrap();
    let node = v["replicas"][1]["node"].as_u64().unwrap();
    corrupt(&c, node, id, 1 << 20);
    let want = format!(
        "vol0: scrubbed 16.0 MiB (3 copies): 1 region differed, 1 rewritten on node {node}"
    );
    let t0 = std::time::Instant::now();
    loop {
        let out = c.cli(&["--output", "json", "events"]);
        let evs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        if evs
            .iter()
            .any(|e| e["kind"] == "scrub" && e["text"] == want.as_str())
        {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(40),
            "no scheduled scrub repaired the copy: {evs:#?}\n{}",
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert_replicas_identical(&c, "vol0");
    let v = info(&c);
    let last = &v["scrub"]["last"];
    assert_eq!(last["by"], "schedule", "{v}");
    assert_eq!(last["bytes_compared"], 16 << 20, "{v}");
    let text = String::from_utf8_lossy(&c.cli(&["volume", "info", "vol0"]).stdout).into_owned();
    assert!(
        text.contains("last scrub: ") && text.contains("(schedule, "),
        "{text}"
    );
    assert!(text.contains("next scheduled scrub: "), "{text}");
    // The metrics say when and how it went.
    let http = addr_in(&c.path().join("http"));
    let token = std::fs::read_to_string(c.path().join("http-token")).unwrap();
    let auth = format!("Bearer {}", token.trim());
    let (code, body) = http_with(&http, "GET", "/metrics", &[("Authorization", &auth)]);
    assert_eq!(code, 200);
    let body = String::from_utf8_lossy(&body);
    for m in [
        "trireme_volume_last_scrub_timestamp_seconds{volume=\"vol0\"}",
        "trireme_volume_last_scrub_ok{volume=\"vol0\"} 1",
    ] {
        assert!(body.contains(m), "{m} not in the metrics:\n{body}");
    }
}

/// `node remove` of a node that is down and holds a volume's only copy in sync is refused at
/// once, naming the volume, instead of starting a job that can only fail; the node stays.
#[test]
fn removing_a_dead_node_with_the_last_copy_is_refused() {
    let c = Cluster::start(&["--store", "memory", "--size", "8M"]);
    assert!(c
        .cli(&[
            "volume",
            "create",
            "solo",
            "--size",
            "4M",
            "--replicas",
            "1"
        ])
        .status
        .success());
    let info: serde_json::Value = serde_json::from_slice(
        &c.cli(&["--output", "json", "volume", "info", "solo"])
            .stdout,
    )
    .unwrap();
    let id = info["replicas"][0]["node"].as_u64().unwrap();
    let node = id.to_string();
    let out = c.cli(&["node", "stop", &node]);
    assert!(out.status.success(), "{}", text(&out));
    let out = c.cli(&["node", "remove", &node]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("holds the only copy in sync of solo") && t.contains("Bring the node back"),
        "{t}"
    );
    let s = status(&c);
    let n = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .unwrap()
        .clone();
    assert_eq!(n["state"], "active", "the node is left as it was: {n}");
    // Back up, its copy can be moved off.
    assert!(c.cli(&["node", "start", &node]).status.success());
}

/// An export whose socket cannot be made is refused before the attach: the volume keeps its
/// epoch and stays closed. A path that names an existing file is refused too, and the file is
/// left alone (a mistyped `--socket` must not delete anything).
#[test]
fn a_bad_socket_path_changes_nothing() {
    let c = Cluster::start(&["--store", "memory", "--size", "4M"]);
    let out = c.cli(&["volume", "create", "data", "--size", "1M"]);
    assert!(out.status.success(), "{}", text(&out));
    let before = volume_status(&c, "data");
    let precious = c.path().join("precious.img");
    std::fs::write(&precious, b"keep me").unwrap();
    let missing = c.path().join("no-such-dir").join("data.sock");
    for (path, says) in [(&missing, "no-such-dir"), (&precious, "is not a socket")] {
        let out = c.cli(&["nbd", "data", "--socket", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(says), "{}", text(&out));
    }
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    let after = volume_status(&c, "data");
    assert_eq!(after["epoch"], before["epoch"], "{after}");
    assert!(after["writer"].is_null(), "{after}");
}

/// An attach that reaches no copy (every node stopped) fails and leaves every replica's state
/// as it found it: nothing is taken out by a writer that could not reach anything. Once the
/// nodes are back, the volume attaches, every copy in sync.
#[test]
fn an_attach_that_reaches_no_copy_changes_no_replica() {
    let c = Cluster::start(&["--store", "file", "--size", "4M"]);
    let out = c.cli(&["volume", "create", "data", "--size", "1M"]);
    assert!(out.status.success(), "{}", text(&out));
    for n in ["1", "2", "3"] {
        let out = c.cli(&["node", "stop", n]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let sock = c.path().join("data.sock");
    let out = c.cli(&["nbd", "data", "--socket", sock.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    let info: serde_json::Value = serde_json::from_slice(
        &c.cli(&["--output", "json", "volume", "info", "data"])
            .stdout,
    )
    .unwrap();
    for r in info["replicas"].as_array().unwrap() {
        assert_eq!(r["state"], "in-sync", "{info}\n{}", text(&out));
    }
    for n in ["1", "2", "3"] {
        let out = c.cli(&["node", "start", n]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let (mut nbd, _) = spawn_nbd(&c, "data", &sock);
    let v = volume_status(&c, "data");
    for r in v["replicas"].as_array().unwrap() {
        assert_eq!(r["state"], "in-sync", "{v}");
    }
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());
}

/// Issue 63, defence in depth: a read that meets a block failing its checksum is repaired from
/// a good copy, and never silently: the volume turns `degraded` naming the node, the node
/// counts it in its metrics, the events say so, and the manager scrubs the volume by itself
/// (no schedule here), after which the copy is verified and the volume healthy again.
#[test]
fn a_bad_block_read_is_never_silent_and_brings_a_scrub() {
    need("qemu-io");
    let c = Cluster::start(&["--store", "file", "--size", "16M", "--scrub-interval", "0"]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x5a 0 4M", &c.unix]));
    let id = volume_status(&c, "vol0")["id"].as_u64().unwrap();
    // The events see the volume healthy first (they come from a look each second).
    let events = |c: &Cluster| -> Vec<serde_json::Value> {
        serde_json::from_slice(&c.cli(&["--output", "json", "events"]).stdout).unwrap()
    };
    let said = |evs: &[serde_json::Value], kind: &str, part: &str| {
        evs.iter()
            .any(|e| e["kind"] == kind && e["text"].as_str().unwrap().contains(part))
    };
    while !said(&events(&c), "volume", "volume vol0 created") {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    corrupt(&c, 3, id, 1 << 20);
    // Reads in flight together rotate over the copies: read the block until node 3 has
    // served it.
    let t0 = std::time::Instant::now();
    let health = loop {
        let mut q = Command::new("qemu-io");
        q.args(["-f", "raw"]);
        for _ in 0..8 {
            q.args(["-c", "aio_read -P 0x5a 1M 4K"]);
        }
        run(q.args(["-c", "aio_flush", &c.unix]));
        let h = volume_status(&c, "vol0")["health"].clone();
        if h["verdict"] != "healthy" {
            break h;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "no read met the bad block, or it stayed silent: {h}\n{}",
            c.log()
        );
    };
    assert_eq!(health["verdict"], "degraded", "{health}");
    let why = health["reasons"].to_string();
    assert!(
        why.contains("node 3: ")
            && why.contains("met blocks failing their checksums")
            && why.contains("offset 1048576"),
        "{why}"
    );
    // The node's metrics count it.
    let http = addr_in(&c.path().join("http"));
    let token = std::fs::read_to_string(c.path().join("http-token")).unwrap();
    let auth = format!("Bearer {}", token.trim());
    let (_, targets) = http_with(&http, "GET", "/targets", &[("Authorization", &auth)]);
    let groups: serde_json::Value = serde_json::from_slice(&targets).unwrap();
    let counted = groups
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["labels"]["trireme_role"] == "node")
        .flat_map(|g| g["targets"].as_array().unwrap().clone())
        .any(|t| {
            let (_, m) = http_with(
                t.as_str().unwrap(),
                "GET",
                "/metrics",
                &[("Authorization", &auth)],
            );
            String::from_utf8_lossy(&m)
                .lines()
                .filter_map(|l| l.strip_prefix("trireme_store_bad_block_reads_total{node=\"3\"} "))
                .any(|n| n.parse::<f64>().is_ok_and(|n| n >= 1.0))
        });
    assert!(counted, "no node's metrics count the bad block");
    // A scrub comes by itself, repairs nothing more, verifies the copy: healthy again, and
    // the events tell the story.
    let t0 = std::time::Instant::now();
    loop {
        let h = volume_status(&c, "vol0")["health"].clone();
        if h["verdict"] == "healthy" {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(40),
            "no scrub cleared the note: {h}\n{}",
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let t0 = std::time::Instant::now();
    loop {
        let evs = events(&c);
        if said(&evs, "health", "vol0: healthy → degraded: node 3: ")
            && said(&evs, "scrub", "node 1, 2, 3 verified")
            && said(&evs, "health", "vol0: degraded → healthy")
        {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{evs:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert_replicas_identical(&c, "vol0");
}
