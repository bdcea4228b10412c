//! A cluster of several servers with every link on TLS: etcd with client-certificate
//! authentication, node daemons on mutual TLS, the manager's control port on mutual TLS, and
//! clients that reach only what their role and the volume's access list allow.

mod common;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, BIN};

/// The processes of the test, killed when it ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct World {
    dir: tempfile::TempDir,
    etcd: String,
    procs: Procs,
}

impl World {
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `trireme --etcd https://... [--tls-identity DIR] ARGS`.
    fn cli(&self, identity: Option<&str>, args: &[&str]) -> std::process::Output {
        let mut c = Command::new(BIN);
        c.arg("--etcd").arg(&self.etcd);
        if let Some(id) = identity {
            c.arg("--tls-identity").arg(self.p(id));
        }
        c.args(args).output().unwrap()
    }

    fn ok(&self, identity: Option<&str>, args: &[&str]) -> String {
        let out = self.cli(identity, args);
        assert!(
            out.status.success(),
            "trireme {args:?} as {identity:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn refused(&self, identity: Option<&str>, args: &[&str], why: &str) {
        let out = self.cli(identity, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "trireme {args:?} as {identity:?} was let through"
        );
        assert!(err.contains(why), "trireme {args:?} as {identity:?}: {err}");
    }
}

fn trireme(args: &[&str]) {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "trireme {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn log_says(path: &Path, what: &str) -> bool {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(what)
}

fn start() -> World {
    start_with(&[])
}

/// [`start`], etcd given `etcd_args` besides.
fn start_with(etcd_args: &[&str]) -> World {
    let dir = tempfile::tempdir().unwrap();
    let d = |rel: &str| dir.path().join(rel).display().to_string();
    let ca = d("ca");
    trireme(&["ca", "init", "--dir", &ca]);
    let issue = |what: &[&str], out: &str| {
        let mut a = vec!["ca", "issue"];
        a.extend_from_slice(what);
        let o = d(out);
        a.extend_from_slice(&["--ca", &ca, "--out", &o]);
        trireme(&a);
    };
    issue(&["server", "--san", "127.0.0.1"], "etcd");
    std::fs::copy(d("ca/crl.pem"), d("etcd/crl.pem")).unwrap();
    issue(&["node", "1", "--san", "127.0.0.1"], "node-1");
    issue(&["node", "2", "--san", "127.0.0.1"], "node-2");
    issue(&["admin"], "admin");
    issue(&["client", "alice"], "alice");
    issue(&["client", "bob"], "bob");
    issue(&["client", "carol"], "carol");

    let (cport, pport) = (free_port(), free_port());
    let etcd = Command::new("etcd")
        .args([
            "--name=m0",
            &format!("--data-dir={}", d("etcd-data")),
            &format!("--listen-client-urls=https://127.0.0.1:{cport}"),
            &format!("--advertise-client-urls=https://127.0.0.1:{cport}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{pport}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{pport}"),
            &format!("--initial-cluster=m0=http://127.0.0.1:{pport}"),
            &format!("--cert-file={}", d("etcd/server-cert.pem")),
            &format!("--key-file={}", d("etcd/server-key.pem")),
            &format!("--trusted-ca-file={}", d("etcd/ca-cert.pem")),
            "--client-cert-auth",
            // The operator's copy of the CA's revocation list.
            &format!("--client-crl-file={}", d("etcd/crl.pem")),
            "--log-level=warn",
        ])
        .args(etcd_args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
        .spawn()
        .expect("etcd must be installed (apt-get install etcd-server)");
    let mut w = World {
        etcd: format!("https://127.0.0.1:{cport}"),
        procs: Procs(vec![etcd]),
        dir,
    };
    // As documented, etcd lets any certificate of its CA write every key: a node refuses to
    // start on it, and says what to do.
    let out = node_cmd(&w, 1).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("etcd rbac"), "{err}");
    // The operator sets etcd's users and roles up and turns its access control on.
    let out = w.ok(
        Some("admin"),
        &["etcd", "rbac", "--client", "bob", "--node", "1,2"],
    );
    assert!(out.contains("access control is on now"), "{out}");
    assert!(out.contains("trireme node 1, trireme node 2"), "{out}");
    assert!(!out.contains("shared"), "{out}");
    for id in 1..=2 {
        let log = std::fs::File::create(w.p(&format!("node-{id}.log"))).unwrap();
        let child = node_cmd(&w, id)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        w.procs.0.push(child);
    }
    wait_for("both nodes up", || {
        let out = w.cli(Some("admin"), &["--output", "json", "status"]);
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .map(|s| {
                    s["nodes"]
                        .as_array()
                        .is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["up"] == true))
                })
                .unwrap_or(false)
    });
    w
}

/// Reads volume `v` whole through the export at `sock`: its first 4 MiB are `src`.
fn assert_reads_back(w: &World, sock: &Path, src: &Path) {
    let back = w.p("back.img");
    common::run(
        Command::new("nbdcopy")
            .arg(format!("nbd+unix:///v?socket={}", sock.display()))
            .arg(&back),
    );
    assert!(std::fs::read(&back).unwrap()[..4 << 20] == std::fs::read(src).unwrap()[..]);
}

/// Volume `v`, 16 MiB, two copies, open to alice and carol.
fn create_v(w: &World) {
    w.ok(
        Some("admin"),
        &[
            "volume",
            "create",
            "v",
            "--size",
            "16M",
            "--replicas",
            "2",
            "--allow",
            "alice",
            "--allow",
            "carol",
        ],
    );
}

/// `trireme node run` for node `id` of the test's cluster.
fn node_cmd(w: &World, id: u32) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--etcd")
        .arg(&w.etcd)
        .args(["node", "run", "--id", &id.to_string()])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory",
            "--lease-ttl",
            "2s",
        ])
        .arg("--dir")
        .arg(w.p(&format!("n{id}")))
        .arg("--tls-dir")
        .arg(w.p(&format!("node-{id}")));
    c
}

/// `etcdctl put KEY VALUE` as the client in `dir`: whether etcd took it.
fn etcd_put_as(w: &World, dir: &str, key: &str) -> bool {
    etcdctl(w, dir, "client", &["put", key, "{}"])
        .status
        .success()
}

/// `etcdctl ARGS` with the identity in `dir` (certificate `STEM-cert.pem`).
fn etcdctl(w: &World, dir: &str, stem: &str, args: &[&str]) -> std::process::Output {
    let d = w.p(dir);
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", w.etcd))
        .arg(format!("--cacert={}", d.join("ca-cert.pem").display()))
        .arg(format!(
            "--cert={}",
            d.join(format!("{stem}-cert.pem")).display()
        ))
        .arg(format!(
            "--key={}",
            d.join(format!("{stem}-key.pem")).display()
        ))
        .args(args)
        .output()
        .unwrap()
}

/// The statuses of the answers in `bytes` (frames back to back).
fn statuses(bytes: &[u8]) -> Vec<trireme_proto::Status> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Ok(h) = trireme_proto::decode_header(rest.get(..64).unwrap_or_default()) {
        out.push(h.status);
        rest = rest.get(64 + h.payload_len as usize..).unwrap_or_default();
    }
    out
}

/// Attaches `vol` as `identity`; the child once it serves its socket, or its stderr.
fn attach(w: &mut World, identity: &str, vol: &str) -> Result<PathBuf, String> {
    let sock = w.p(&format!("{vol}-{identity}.sock"));
    let log = w.p(&format!("attach-{identity}.log"));
    let mut child = Command::new(BIN)
        .arg("--etcd")
        .arg(&w.etcd)
        .arg("--tls-identity")
        .arg(w.p(identity))
        // Its own directory (the HTTP endpoint's address and token), not the test's cwd.
        .arg("--data-dir")
        .arg(w.p(&format!("attach-{identity}")))
        .args(["attach", vol, "--lease-ttl", "2s", "--socket"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // It prints its URI once it serves; it exits (closing stdout) if it cannot.
    let mut out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {}
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(Duration::from_secs(30));
    if sock.exists() {
        w.procs.0.push(child);
        return Ok(sock);
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(std::fs::read_to_string(&log).unwrap_or_default())
}

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

    // `node` commands reach the manager's port with the operator's identity too.
    let nodes = w.ok(Some("admin"), &["node", "list"]);
    assert!(nodes.contains("127.0.0.1"), "{nodes}");

    // The control port itself: no certificate, or one of another CA, is refused before a
    // request is read.
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
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
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
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
    let info: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "volume", "info", "v"]))
            .unwrap();
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
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
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

/// One control exchange with the manager as the client in `dir`: the reply lines.
fn control_as(w: &World, dir: &str, requests: &[serde_json::Value]) -> Vec<String> {
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
    let control = s["manager"]["control"].as_str().unwrap().to_string();
    let mut lines = String::new();
    for r in requests {
        lines.push_str(&format!("{r}\n"));
    }
    let got = common::tls_exchange(&control, &w.p(dir), lines.as_bytes());
    String::from_utf8_lossy(&got)
        .lines()
        .map(String::from)
        .collect()
}

/// The volume's epoch and its replicas' nodes and states, as the metadata says.
fn layout(w: &World, vol: &str) -> (u64, Vec<(u64, String)>) {
    let info: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "volume", "info", vol]))
            .unwrap();
    let v = &info["volume"];
    let v = if v.is_null() { &info } else { v };
    let replicas = v["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("no replicas in {info}"))
        .iter()
        .map(|r| {
            (
                r["node"].as_u64().unwrap(),
                r["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    (v["epoch"].as_u64().unwrap(), replicas)
}

#[test]
fn a_client_on_the_access_list_that_is_not_the_writer_changes_nothing() {
    common::need("etcd");
    common::need("etcdctl");
    common::need("nbdcopy");
    let mut w = start();
    create_v(&w);
    // Alice writes; every write nbdcopy saw acknowledged is in `src`.
    let sock = attach(&mut w, "alice", "v").expect("alice attaches");
    let src = w.p("src.img");
    common::random_file(&src, 4 << 20, 7);
    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
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
            serde_json::json!({"cmd": "detach", "name": "v", "epoch": epoch}),
            serde_json::json!({"cmd": "writer_release", "name": "v", "epoch": epoch}),
            serde_json::json!({"cmd": "writer_report", "name": "v", "epoch": epoch,
                "report": {"epoch": epoch, "replicas": [], "writes_suspended": true}}),
            serde_json::json!({"cmd": "writer_attach", "name": "v", "lease": 1, "force": true,
                "record": {"epoch": 0, "host": "x", "pid": 1, "exports": []}}),
        ],
    );
    assert_eq!(got.len(), 7, "{got:?}");
    for line in &got[..6] {
        assert!(
            line.contains("client carol is not volume v's writer") && line.contains("client alice"),
            "{line}"
        );
    }
    assert!(
        got[6].contains("may not fence") && got[6].contains("client alice"),
        "{}",
        got[6]
    );
    // Nor may alice shrink her own volume through a size record.
    let got = control_as(
        &w,
        "alice",
        &[
            serde_json::json!({"cmd": "set_volume_size", "name": "v", "epoch": epoch,
            "size": 1u64 << 20}),
        ],
    );
    assert!(got[0].contains("does not shrink"), "{got:?}");
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
    let list: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "volume", "list"]))
            .unwrap();
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
    let info: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "volume", "info", "v"]))
            .unwrap();
    assert_eq!(info["size"], 16u64 << 20, "{info}");
}

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
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
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
    create_v(&w);
    let sock = attach(&mut w, "alice", "v").expect("alice attaches");
    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    let src = w.p("src.img");
    common::random_file(&src, 4 << 20, 11);
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
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
    create_v(&w);
    let sock = attach(&mut w, "alice", "v").expect("alice attaches");
    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    let src = w.p("src.img");
    common::random_file(&src, 4 << 20, 21);
    common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
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
    let s: serde_json::Value =
        serde_json::from_str(&w.ok(Some("admin"), &["--output", "json", "status"])).unwrap();
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
