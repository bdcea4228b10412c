//! etcd as a trust boundary, on the TLS cluster of `common/secure.rs`: each node its own etcd
//! user, gone when the node leaves; a full etcd; a take-out while the manager is dead.

mod common;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::secure::*;

/// Each node has an etcd user of its own: a certificate of a node that never joined writes
/// nothing, a node removed loses its user, a revoked node certificate too, and `etcd rbac
/// --node N` gives a node with a new certificate its user back.
#[test]
fn a_node_that_left_or_never_joined_writes_nothing_in_etcd() {
    common::need("etcd");
    common::need("etcdctl");
    let w = start();
    let ca = w.p("ca").display().to_string();
    let node_put = |dir: &str, key: &str| {
        etcdctl(&w, dir, "node", &["put", key, "{}"])
            .status
            .success()
    };
    let put_as_node = |id: u32| node_put(&format!("node-{id}"), &format!("/trireme/v1/nodes/{id}"));
    // Node 1 is a member: it writes trireme's keys (here, a probe of its own).
    assert!(node_put("node-1", "/trireme/v1/probe-node-1"));
    // A revocation naming the wrong CA changes nothing: refused before the deny list.
    let other = w.p("other-ca").display().to_string();
    trireme(&["ca", "init", "--dir", &other]);
    let n2 = w.p("node-2/node-cert.pem").display().to_string();
    w.refused(
        Some("admin"),
        &["ca", "revoke", &n2, "--ca", &other],
        "not by the CA",
    );
    let listed = w.ok(Some("admin"), &["ca", "revoked"]);
    assert!(listed.contains("no certificate is revoked"), "{listed}");
    // A certificate of the cluster's CA for node 9, which never joined: no etcd user.
    let n9 = w.p("node-9").display().to_string();
    trireme(&[
        "ca",
        "issue",
        "node",
        "9",
        "--san",
        "127.0.0.1",
        "--ca",
        &ca,
        "--out",
        &n9,
    ]);
    assert!(
        !put_as_node(9),
        "a node that never joined wrote its own record"
    );

    // The manager's node removed (it holds nothing): its user goes with it, its daemon
    // stops for good, and the other node takes the manager role over.
    let s = w.admin_json(&["status"]);
    let m = s["manager"]["node"].as_u64().unwrap() as u32;
    let o = 3 - m;
    let out = w.cli(Some("admin"), &["node", "remove", &m.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("etcd users deleted: trireme node {m}")),
        "{err}"
    );
    assert!(!put_as_node(m), "a removed node still writes etcd");
    let pid = w.procs.0[m as usize].id();
    wait_for("the removed node's daemon stops", || {
        // Gone, or a zombie the test has not reaped yet.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |st| st.split_whitespace().nth(2) == Some("Z"))
    });
    let log = w.p(&format!("node-{m}.log"));
    assert!(
        log_says(&log, "removed from the cluster")
            || log_says(&log, "refuses this node's identity"),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Running `etcd rbac` again does not give it back (its record says removed).
    let again = w.ok(Some("admin"), &["etcd", "rbac"]);
    assert!(!again.contains("users added"), "{again}");
    assert!(!put_as_node(m));
    assert!(node_put(&format!("node-{o}"), "/trireme/v1/probe"));

    // The other node's certificate revoked: its user goes, and the CRL names the
    // certificate. (The manager role passed to it within a lease: it answers.)
    let cert = w
        .p(&format!("node-{o}/node-cert.pem"))
        .display()
        .to_string();
    let mut out = w.cli(Some("admin"), &["ca", "revoke", &cert, "--ca", &ca]);
    let t0 = Instant::now();
    while !out.status.success() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(300));
        out = w.cli(Some("admin"), &["ca", "revoke", &cert, "--ca", &ca]);
    }
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("etcd users deleted: trireme node {o}")),
        "{err}"
    );
    assert!(
        !put_as_node(o),
        "a revoked node certificate still writes etcd"
    );
    // A new certificate for it, then `etcd rbac --node N`: its user is back, and only the
    // new certificate gets through (the CRL keeps the old one out).
    let old = format!("node-{o}-old");
    std::fs::rename(w.p(&format!("node-{o}")), w.p(&old)).unwrap();
    let dir = w.p(&format!("node-{o}")).display().to_string();
    trireme(&[
        "ca",
        "issue",
        "node",
        &o.to_string(),
        "--san",
        "127.0.0.1",
        "--ca",
        &ca,
        "--out",
        &dir,
    ]);
    let out = w.ok(Some("admin"), &["etcd", "rbac", "--node", &o.to_string()]);
    assert!(
        out.contains(&format!("etcd users added: trireme node {o}")),
        "{out}"
    );
    assert!(
        node_put(&format!("node-{o}"), "/trireme/v1/probe"),
        "node {o}'s new certificate cannot write"
    );
    std::fs::copy(w.p("ca/crl.pem"), w.p("etcd/crl.pem")).unwrap();
    assert!(
        !node_put(&old, &format!("/trireme/v1/nodes/{o}")),
        "the revoked certificate of node {o} got through etcd again"
    );
}

/// A full etcd (its quota reached: a NOSPACE alarm) is a health reason in `status`, and the
/// data path goes on: an attached volume takes and reads back writes, which need no etcd.
#[test]
fn a_full_etcd_is_a_health_reason_and_writes_go_on() {
    common::need("etcd");
    common::need("etcdctl");
    common::need("nbdcopy");
    // 32 MiB: filled in a few seconds.
    let mut w = start_with(&["--quota-backend-bytes=33554432"]);
    let (sock, uri, src) = alice_writes_v(&mut w, 11);
    // An operator's (or a bug's) writes fill etcd: 1 MiB values until it refuses.
    let value = vec![b'x'; 1 << 20];
    let mut full = false;
    for i in 0..200 {
        let a = w.p("admin");
        let mut put = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", w.etcd))
            .arg(format!("--cacert={}", a.join("ca-cert.pem").display()))
            .arg(format!("--cert={}", a.join("admin-cert.pem").display()))
            .arg(format!("--key={}", a.join("admin-key.pem").display()))
            .args(["put", &format!("/fill/{i}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        put.stdin.take().unwrap().write_all(&value).unwrap();
        let out = put.wait_with_output().unwrap();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("database space exceeded"), "{err}");
            full = true;
            break;
        }
    }
    assert!(full, "etcd never filled");
    wait_for("status names the full metadata store", || {
        let out = w.cli(Some("admin"), &["status"]);
        String::from_utf8_lossy(&out.stdout).contains("the metadata store is full")
    });
    // The data path needs no etcd: new writes are taken, and read back.
    common::random_file(&src, 4 << 20, 12);
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
    assert_reads_back(&w, &sock, &src);
}

/// The manager's node killed -9 under a client's writes: its copy must be taken out, and a
/// client records a take-out only through the manager, which died with it. The write waits,
/// never acknowledged unrecorded, until the other node takes the role over and records it;
/// then every acknowledged write reads back.
#[test]
fn a_take_out_waits_for_a_new_manager_when_the_old_one_dies_with_the_copy() {
    common::need("etcd");
    common::need("nbdcopy");
    let mut w = start();
    let (sock, uri, src) = alice_writes_v(&mut w, 21);
    let s = w.admin_json(&["status"]);
    let manager = s["manager"]["node"].as_u64().unwrap() as u32;
    let (epoch, before) = layout(&w, "v");
    assert!(before.iter().all(|(_, st)| st == "in-sync"), "{before:?}");
    // procs: etcd, node 1, node 2, alice's writer.
    let victim = &mut w.procs.0[manager as usize];
    common::signal(victim.id() as i32, libc::SIGKILL);
    let _ = victim.wait();
    // New writes: the first to the dead copy fails, and its take-out waits for a manager.
    let t0 = Instant::now();
    common::random_file(&src, 4 << 20, 22);
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
    let waited = t0.elapsed();
    eprintln!("writes after the kill took {waited:?}");
    assert_reads_back(&w, &sock, &src);
    // Recorded by the new manager (the other node), at the writer's epoch.
    let s = w.admin_json(&["status"]);
    let new = s["manager"]["node"].as_u64().unwrap() as u32;
    assert_ne!(new, manager, "{s}");
    let (after_epoch, after) = layout(&w, "v");
    assert_eq!(after_epoch, epoch);
    let dead: Vec<_> = after
        .iter()
        .filter(|(n, _)| *n == u64::from(manager))
        .collect();
    assert!(
        dead.iter().all(|(_, st)| st != "in-sync"),
        "the dead node's copy is still in sync: {after:?} (writes waited {waited:?})"
    );
}

/// `etcd rbac --managers`: a node that may not hold the manager role writes in etcd only its
/// own liveness key and record, etcd keeps it out of the election, a manager barred by a
/// later run gives the role up, and `--managers all` lets the barred nodes back in.
#[test]
fn a_node_that_may_not_manage_writes_only_its_own_records() {
    common::need("etcd");
    common::need("etcdctl");
    let mut w = start();
    let ca = w.p("ca").display().to_string();
    let n3 = w.p("node-3").display().to_string();
    trireme(&[
        "ca",
        "issue",
        "node",
        "3",
        "--san",
        "127.0.0.1",
        "--ca",
        &ca,
        "--out",
        &n3,
    ]);
    // A typo names no member: refused, and nothing changes.
    w.refused(
        Some("admin"),
        &["etcd", "rbac", "--node", "3", "--managers", "1,4"],
        "node 4 that is no member",
    );
    // Who holds the manager role (`None` while nobody does, or status fails without one).
    let manager = |w: &World| {
        let out = w.cli(Some("admin"), &["--output", "json", "status"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|s| s["manager"]["node"].as_u64())
    };
    let m = manager(&w).unwrap() as u32;
    let o = 3 - m;
    // The manager's node barred: it gives the role up to the other.
    let out = w.ok(
        Some("admin"),
        &["etcd", "rbac", "--node", "3", "--managers", &o.to_string()],
    );
    assert!(
        out.contains(&format!("nodes that may hold the manager role: {o}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("node {m} held the manager role")),
        "{out}"
    );
    wait_for("the other node takes the manager role", || {
        manager(&w) == Some(o as u64)
    });
    // Node 3 joins, barred from the start (later runs follow the recorded list).
    let again = w.ok(Some("admin"), &["etcd", "rbac"]);
    assert!(
        again.contains(&format!("may hold the manager role: {o}")),
        "{again}"
    );
    let log3 = w.p("node-3.log");
    let child = node_cmd(&w, 3)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log3).unwrap())
        .spawn()
        .unwrap();
    w.procs.0.push(child);
    wait_for("node 3 up", || {
        w.admin_json(&["status"])["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 3 && n.iter().all(|n| n["up"] == true))
    });
    let put = |w: &World, dir: &str, key: &str| {
        etcdctl(
            w,
            dir,
            "node",
            &["put", &format!("/trireme/v1/{key}"), "{}"],
        )
        .status
        .success()
    };
    for barred in [m, 3] {
        let dir = format!("node-{barred}");
        for key in [
            format!("nodes/{o}"),
            format!("nodes/{barred}0"),
            format!("alive/{o}"),
            format!("restarts/{o}"),
            "revoked/00".into(),
            "manager".into(),
            "settings/managers".into(),
            "layouts/v".into(),
            "attach/v".into(),
            "jobs/1".into(),
        ] {
            assert!(!put(&w, &dir, &key), "node {barred} wrote {key}");
        }
    }
    assert!(
        put(&w, &format!("node-{o}"), "probe"),
        "the manager's node is refused"
    );

    // etcd refuses node 3 the manager key even while it is taken (it checks both branches
    // of the campaign's transaction).
    wait_for("node 3 is refused the manager key", || {
        log_says(&log3, "may not hold the manager role")
    });
    // The only node that may manage dies: the barred ones stay out of the election.
    w.procs.0[o as usize].kill().unwrap();
    let _ = w.procs.0[o as usize].wait();
    std::thread::sleep(Duration::from_secs(4)); // the dead manager's lease (2 s) runs out
    assert_eq!(manager(&w), None, "a barred node took the manager role");
    // `--managers all` lets them back in: one of them takes the role.
    let out = w.ok(Some("admin"), &["etcd", "rbac", "--managers", "all"]);
    assert!(!out.contains("may hold the manager role"), "{out}");
    wait_for(
        "a node let back in takes the manager role",
        || matches!(manager(&w), Some(n) if n == m as u64 || n == 3),
    );
}
