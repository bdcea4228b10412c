//! A cluster of several servers with every link on TLS: etcd with client-certificate
//! authentication, node daemons on mutual TLS, the manager's control port on mutual TLS, and
//! clients that reach only what their role and the volume's access list allow (the cluster:
//! `common/secure.rs`; etcd's own trust, members and outages: `etcd_boundary.rs`).

mod common;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::secure::*;

#[test]
fn every_link_of_a_cluster_on_etcd_can_be_tls() {
    common::need("etcd");
    common::need("nbdcopy");
    let mut w = start();

    // etcd over https needs an identity; the control port refuses what a role may not do.
    w.refused(None, &["status"], "needs a TLS identity");
    create_v(&w);
    w.ok(
        Some("admin"),
        &[
            "volume",
            "create",
            "w",
            "--size",
            "16M",
            "--replicas",
            "2",
            "--allow",
            "bob",
        ],
    );
    // Inside etcd each client writes only the records of the volumes it may attach: alice
    // cannot put herself on bob's volume's access list, nor order a node to restart.
    common::need("etcdctl");
    assert!(!etcd_put_as(&w, "alice", "/trireme/v1/layouts/w"));
    assert!(!etcd_put_as(&w, "alice", "/trireme/v1/restarts/1"));
    assert!(!etcd_put_as(&w, "alice", "/trireme/v1/volumes/v"));
    assert!(!etcd_put_as(&w, "bob", "/trireme/v1/attach/v"));
    let s = w.ok(Some("bob"), &["--output", "json", "volume", "info", "v"]);
    assert!(s.contains("\"alice\""), "{s}");
    // A volume created without --allow is the operators' alone.
    w.ok(
        Some("admin"),
        &[
            "volume",
            "create",
            "ops",
            "--size",
            "16M",
            "--replicas",
            "2",
        ],
    );
    let s = w.ok(Some("admin"), &["volume", "info", "ops"]);
    assert!(s.contains("nodes and operators only"), "{s}");
    w.refused(
        Some("bob"),
        &["volume", "create", "x", "--size", "16M"],
        "may not volume_create",
    );
    w.refused(
        Some("bob"),
        &["volume", "delete", "v"],
        "may not volume_delete",
    );
    w.refused(
        Some("alice"),
        &["volume", "access", "v", "--allow", "bob"],
        "may not volume_access",
    );
    // Declaring a node lost gives up copies: an operator's alone.
    w.refused(
        Some("bob"),
        &["node", "lost", "2", "--force"],
        "may not node_lost",
    );

    // `node` commands reach the manager's port with the operator's identity too.
    let nodes = w.ok(Some("admin"), &["node", "list"]);
    assert!(nodes.contains("127.0.0.1"), "{nodes}");

    // The control port itself: no certificate, or one of another CA, is refused before a
    // request is read.
    let s = w.admin_json(&["status"]);
    let (m, control) = (
        s["manager"]["node"].as_u64().unwrap(),
        s["manager"]["control"].as_str().unwrap().to_string(),
    );
    trireme(&["ca", "init", "--dir", w.p("other/ca").to_str().unwrap()]);
    trireme(&[
        "ca",
        "issue",
        "client",
        "mallory",
        "--ca",
        w.p("other/ca").to_str().unwrap(),
        "--out",
        w.p("mallory").to_str().unwrap(),
    ]);
    let status = format!("{}\n", serde_json::json!({"cmd": "status"}));
    let got = common::tls_exchange(&control, &w.p("mallory"), status.as_bytes());
    assert!(
        !String::from_utf8_lossy(&got).contains("nodes"),
        "mallory read the status"
    );
    let out = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &control])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("nodes"));
    let mlog = w.p(&format!("node-{m}.log"));
    wait_for("the manager logs both refusals", || {
        log_says(&mlog, "refused a control connection: TLS handshake failed")
            && std::fs::read_to_string(&mlog)
                .unwrap_or_default()
                .matches("refused a control connection")
                .count()
                >= 2
    });

    // Alice is on the access list: she attaches and writes through the nodes' TLS links.
    let sock = attach(&mut w, "alice", "v").expect("alice attaches");
    let src = w.p("src.img");
    common::random_file(&src, 4 << 20, 3);
    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
    let status = w.ok(Some("admin"), &["status"]);
    assert!(status.contains("as alice"), "{status}");
    assert!(status.contains("access: alice, carol"), "{status}");

    // Carol is on the list too, but alice writes: straight at a node, with her certificate,
    // she can neither take the replica over at alice's epoch nor write, read or query it
    // (before, a same-epoch attach and one write left the copies different while the writer
    // recorded them in sync). Nor can alice herself move the epoch past the metadata's (a
    // 2^32 leap fenced a volume for good).
    let s = w.admin_json(&["status"]);
    let vol = s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "v")
        .unwrap()
        .clone();
    let (vid, epoch) = (vol["id"].as_u64().unwrap(), vol["epoch"].as_u64().unwrap());
    let node = s["nodes"][0]["addr"].as_str().unwrap().to_string();
    let req = |op, epoch, id, payload: &[u8]| {
        let mut f = trireme_proto::Header {
            volume: vid,
            epoch,
            length: payload.len().max(4096) as u64,
            ..trireme_proto::Header::request(op, id)
        }
        .encode(payload)
        .to_vec();
        f.extend_from_slice(payload);
        f
    };
    let mut frames = req(trireme_proto::Op::Attach, epoch, 1, &[]);
    frames.extend(req(trireme_proto::Op::Write, epoch, 2, &[0xee; 4096]));
    frames.extend(req(trireme_proto::Op::ReplicaInfo, epoch, 3, &[]));
    frames.extend(req(trireme_proto::Op::DirtyQuery, epoch, 4, &[]));
    let got = statuses(&common::tls_exchange(&node, &w.p("carol"), &frames));
    assert_eq!(
        got,
        vec![trireme_proto::Status::Denied; 4],
        "carol: {got:?}"
    );
    let leap = req(trireme_proto::Op::Attach, epoch + (1 << 32), 5, &[]);
    let got = statuses(&common::tls_exchange(&node, &w.p("alice"), &leap));
    assert_eq!(
        got,
        vec![trireme_proto::Status::Denied],
        "alice's leap: {got:?}"
    );
    // Alice's writes go on; the copies agree.
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
    w.ok(Some("admin"), &["volume", "verify", "v"]);
    let info = w.admin_json(&["volume", "info", "v"]);
    assert_eq!(info["writer"]["client"], "alice", "{info}");
    assert!(
        info["writer"]["text"]
            .as_str()
            .unwrap_or("")
            .contains("as alice"),
        "{info}"
    );
    assert_eq!(info["access"], serde_json::json!(["alice", "carol"]));
    // Detach (SIGTERM: a clean detach releases the record).
    let a = w.procs.0.pop().unwrap();
    common::signal(a.id() as i32, libc::SIGTERM);
    let mut a = a;
    let _ = a.wait();

    // Bob is not: his attach is refused before it takes an epoch.
    let err = attach(&mut w, "bob", "v").expect_err("bob attached");
    assert!(err.contains("not on volume v's access list"), "{err}");
    // The nodes refuse his certificate themselves, whatever a client does first: here, the
    // frames an attach would send, over TLS with bob's certificate.
    let s = w.admin_json(&["status"]);
    let node = s["nodes"][0]["addr"].as_str().unwrap().to_string();
    let id = s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "v")
        .unwrap()["id"]
        .as_u64()
        .unwrap();
    let frame = |op, epoch| {
        trireme_proto::Header {
            volume: id,
            epoch,
            length: 4096,
            ..trireme_proto::Header::request(op, 1)
        }
        .encode(&[])
    };
    let mut frames = frame(trireme_proto::Op::Attach, 1 << 20).to_vec();
    frames.extend_from_slice(&frame(trireme_proto::Op::Read, 1));
    common::tls_exchange(&node, &w.p("bob"), &frames);
    wait_for("node 1 logs the refusal", || {
        log_says(&w.p("node-1.log"), "client bob may not Attach")
            && log_says(&w.p("node-1.log"), "client bob may not Read")
    });

    // Nothing of that touched the data: the replicas agree, and alice reads her bytes back.
    w.ok(Some("admin"), &["volume", "verify", "v"]);

    // Alice's certificate leaks: the operator revokes it. Her attach is refused before it
    // takes an epoch, and a node refuses the certificate at the handshake.
    let alice_cert = w.p("alice/client-cert.pem");
    let alice_reads_etcd = |w: &World| {
        etcdctl(
            w,
            "alice",
            "client",
            &["get", "--prefix", "/trireme/v1/nodes/"],
        )
        .status
        .success()
    };
    assert!(alice_reads_etcd(&w));
    let out = w.ok(
        Some("admin"),
        &[
            "ca",
            "revoke",
            alice_cert.to_str().unwrap(),
            "--ca",
            w.p("ca").to_str().unwrap(),
        ],
    );
    assert!(
        out.contains("revoked the certificate of client alice"),
        "{out}"
    );
    assert!(out.contains("on the CA's revocation list too"), "{out}");
    let listed = w.ok(Some("admin"), &["ca", "revoked"]);
    assert!(listed.contains("client alice"), "{listed}");
    // Until the operator copies the new list to etcd, trireme's own deny list refuses her.
    assert!(alice_reads_etcd(&w));
    let err = attach(&mut w, "alice", "v").expect_err("a revoked certificate attached");
    assert!(err.contains("is revoked"), "{err}");
    // The copy made, etcd reads it at its next connection: the certificate is refused there
    // too, and only that one.
    std::fs::copy(w.p("ca/crl.pem"), w.p("etcd/crl.pem")).unwrap();
    assert!(
        !alice_reads_etcd(&w),
        "etcd still takes a revoked certificate"
    );
    let bob = etcdctl(
        &w,
        "bob",
        "client",
        &["get", "--prefix", "/trireme/v1/nodes/"],
    );
    assert!(
        bob.status.success(),
        "etcd refuses a certificate nobody revoked"
    );
    let ping = trireme_proto::Header::request(trireme_proto::Op::Ping, 9).encode(&[]);
    wait_for("the node refuses the revoked certificate", || {
        statuses(&common::tls_exchange(&node, &w.p("alice"), &ping)).is_empty()
            && log_says(&w.p("node-1.log"), "invalid peer certificate: Revoked")
    });
    // A new certificate for her, issued in place: she is back.
    trireme(&[
        "ca",
        "issue",
        "client",
        "alice",
        "--ca",
        w.p("ca").to_str().unwrap(),
        "--out",
        w.p("alice").to_str().unwrap(),
    ]);
    let sock = attach(&mut w, "alice", "v").expect("alice attaches again");
    assert_reads_back(&w, &sock, &src);

    // A volume in use on etcd is not deleted by mistake: the refusal names its writer.
    w.refused(
        Some("admin"),
        &["volume", "delete", "v"],
        "in use: attached by pid",
    );
    w.refused(Some("admin"), &["volume", "delete", "v"], "as client alice");
    // --force fences alice's writer first; the trash gives the volume back as it was.
    w.ok(Some("admin"), &["volume", "delete", "v", "--force"]);
    let fenced = Command::new("nbdcopy")
        .arg(format!("nbd+unix:///v?socket={}", sock.display()))
        .arg("null:")
        .output()
        .unwrap();
    assert!(
        !fenced.status.success(),
        "a fenced writer still served reads"
    );
    let list = w.ok(Some("admin"), &["volume", "trash", "list"]);
    assert!(list.contains("v ") && list.contains("admin"), "{list}");
    w.ok(Some("admin"), &["volume", "trash", "restore", "v"]);
    w.ok(Some("admin"), &["volume", "verify", "v"]);
}

#[test]
fn a_client_on_the_access_list_that_is_not_the_writer_changes_nothing() {
    common::need("etcd");
    common::need("etcdctl");
    common::need("nbdcopy");
    let mut w = start();
    // Alice writes; every write nbdcopy saw acknowledged is in `src`.
    let (_, _, src) = alice_writes_v(&mut w, 7);
    // Her writer went through the manager, and keeps its attach record past the lease's TTL.
    std::thread::sleep(Duration::from_secs(5));
    let (epoch, replicas) = layout(&w, "v");
    assert!(replicas.iter().all(|(_, s)| s == "in-sync"), "{replicas:?}");
    let status = w.ok(Some("admin"), &["status"]);
    assert!(status.contains("as alice"), "{status}");
    // Her report (her links to the nodes) reached status through the manager.
    assert!(status.contains("writer link to node"), "{status}");

    // Carol is on the list but does not write: etcd refuses her every record of the volume,
    // the cluster's membership and its deny list, her own report key too.
    for k in [
        "attach/v",
        "layouts/v",
        "volumes/v",
        "moves/v",
        "takeouts/v",
        "scrubs/v",
        "resizes/v",
        "snapshot-asks/v",
        "reports/v",
        "reports/v/alice",
        "reports/v/carol",
        "nodes/9",
        "revoked/00",
        "restarts/1",
        "next-snapshot-id",
        "nvmf/v/1",
    ] {
        assert!(
            !etcd_put_as(&w, "carol", &format!("/trireme/v1/{k}")),
            "etcd let carol write {k}"
        );
    }
    // Alice herself writes no record straight either, her report included: the manager does
    // it for her.
    assert!(!etcd_put_as(&w, "alice", "/trireme/v1/layouts/v"));
    assert!(!etcd_put_as(&w, "alice", "/trireme/v1/attach/v"));
    assert!(!etcd_put_as(&w, "alice", "/trireme/v1/reports/v/alice"));

    // The take-out-then-mark-in-sync attack through the manager: refused, naming the writer.
    let node = replicas[1].0;
    let ask = |state: &str| {
        serde_json::json!({"cmd": "set_replica_state", "name": "v", "epoch": epoch,
            "node": node, "state": state})
    };
    let got = control_as(
        &w,
        "carol",
        &[
            ask("failed"),
            ask("in-sync"),
            serde_json::json!({"cmd": "set_volume_size", "name": "v", "epoch": epoch,
                "size": 1u64 << 20}),
            serde_json::json!({"cmd": "set_region", "name": "v", "id": 1, "epoch": epoch,
                "region": 0, "to": {"kind": "parity", "slot": 0}}),
            serde_json::json!({"cmd": "detach", "name": "v", "epoch": epoch}),
            serde_json::json!({"cmd": "writer_release", "name": "v", "epoch": epoch}),
            serde_json::json!({"cmd": "writer_report", "name": "v", "epoch": epoch,
                "report": {"epoch": epoch, "replicas": [], "writes_suspended": true}}),
            serde_json::json!({"cmd": "writer_attach", "name": "v", "lease": 1, "force": true,
                "record": {"epoch": 0, "host": "x", "pid": 1, "exports": []}}),
        ],
    );
    assert_eq!(got.len(), 8, "{got:?}");
    for line in &got[..7] {
        assert!(
            line.contains("client carol is not volume v's writer") && line.contains("client alice"),
            "{line}"
        );
    }
    assert!(
        got[7].contains("may not fence") && got[7].contains("client alice"),
        "{}",
        got[7]
    );
    // Nor may alice shrink her own volume through a size record.
    let got = control_as(
        &w,
        "alice",
        &[
            serde_json::json!({"cmd": "set_volume_size", "name": "v", "epoch": epoch,
            "size": 1u64 << 20}),
            // Her region records reach the metadata, which refuses them for a mirror.
            serde_json::json!({"cmd": "set_region", "name": "v", "id": 1, "epoch": epoch,
                "region": 0, "to": {"kind": "parity", "slot": 0}}),
        ],
    );
    assert!(got[0].contains("does not shrink"), "{got:?}");
    assert!(got[1].contains("not a parity volume"), "{got:?}");
    // An NVMe/TCP export record goes through the manager too: only for a client on the access
    // list, only within bounds.
    let export = |ana: &str| {
        serde_json::json!({"cmd": "nvmf_export", "lease": 1, "record": {"volume": "v",
            "port_id": 1, "addr": "10.0.0.1:4420", "nqn": "nqn.2026-12.io.trireme:trireme:v",
            "host": "x", "pid": 1, "ana": ana, "hosts": []}})
    };
    let got = control_as(&w, "bob", &[export("optimized")]);
    assert!(got[0].contains("not on volume v's access list"), "{got:?}");
    let got = control_as(&w, "carol", &[export("fast")]);
    assert!(got[0].contains("ANA state"), "{got:?}");
    // Her reports are bounded: one each 500 ms at most per volume, 64 KiB at most.
    let report = |http: String| {
        serde_json::json!({"cmd": "writer_report", "name": "v", "epoch": epoch,
            "report": {"epoch": epoch, "replicas": [], "writes_suspended": false, "http": http}})
    };
    let got = control_as(
        &w,
        "alice",
        &[
            report("x".repeat(70_000)),
            report("a".into()),
            report("b".into()),
        ],
    );
    assert!(got[0].contains("at most 65536"), "{got:?}");
    assert!(got[2].contains("reported less than"), "{got:?}");
    // Nothing moved: the epoch, the states, the writer.
    assert_eq!(layout(&w, "v"), (epoch, replicas.clone()));
    let status = w.ok(Some("admin"), &["status"]);
    assert!(status.contains("as alice"), "{status}");

    // One record that does not decode (a second volume's layout, here an operator's typo)
    // takes nothing else down: listings go on without it, status names it, and the attach
    // below, of another volume, goes through.
    w.ok(Some("admin"), &["volume", "create", "w2", "--size", "1M"]);
    let put = etcdctl(
        &w,
        "admin",
        "admin",
        &["put", "/trireme/v1/layouts/w2", "not json"],
    );
    assert!(put.status.success(), "{put:?}");
    let list = w.admin_json(&["volume", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(names, vec!["v"], "{list}");
    let status = w.ok(Some("admin"), &["status"]);
    assert!(
        status.contains("a record is unreadable") && status.contains("w2"),
        "{status}"
    );

    // A writer change (alice's writer killed -9, then a new one once its lease is gone):
    // every acknowledged write reads back.
    let mut a = w.procs.0.pop().unwrap();
    let _ = a.kill();
    let _ = a.wait();
    let t0 = Instant::now();
    let sock = loop {
        match attach(&mut w, "alice", "v") {
            Ok(s) => break s,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(30), "{e}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    };
    assert_reads_back(&w, &sock, &src);
    w.ok(Some("admin"), &["volume", "verify", "v"]);
    let (later, _) = layout(&w, "v");
    assert_eq!(later, epoch + 1);

    // A writer never shrinks its volume because a request says so, even one an operator
    // wrote in etcd by hand: it answers with a refusal.
    let ask = serde_json::json!({"epoch": later, "size": 1u64 << 20, "state": "asked"});
    let put = etcdctl(
        &w,
        "admin",
        "admin",
        &["put", "/trireme/v1/resizes/v", &ask.to_string()],
    );
    assert!(put.status.success(), "{put:?}");
    wait_for("the writer refuses to shrink", || {
        let got = etcdctl(&w, "admin", "admin", &["get", "/trireme/v1/resizes/v"]);
        String::from_utf8_lossy(&got.stdout).contains("does not shrink")
    });
    let info = w.admin_json(&["volume", "info", "v"]);
    assert_eq!(info["size"], 16u64 << 20, "{info}");
}
