//! A cluster on etcd with every link on TLS, for the tests that attack it
//! (`secure_cluster.rs`, `etcd_boundary.rs`): etcd with client-certificate authentication and
//! its revocation list, two node daemons on mutual TLS, the operator's and three clients'
//! certificates (alice, bob, carol), and the helpers that act as each of them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, BIN};

/// The processes of the test, killed when it ends.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct World {
    pub dir: tempfile::TempDir,
    pub etcd: String,
    pub procs: Procs,
}

impl World {
    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `trireme --etcd https://... [--tls-identity DIR] ARGS`.
    pub fn cli(&self, identity: Option<&str>, args: &[&str]) -> std::process::Output {
        let mut c = Command::new(BIN);
        c.arg("--etcd").arg(&self.etcd);
        if let Some(id) = identity {
            c.arg("--tls-identity").arg(self.p(id));
        }
        c.args(args).output().unwrap()
    }

    pub fn ok(&self, identity: Option<&str>, args: &[&str]) -> String {
        let out = self.cli(identity, args);
        assert!(
            out.status.success(),
            "trireme {args:?} as {identity:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn refused(&self, identity: Option<&str>, args: &[&str], why: &str) {
        let out = self.cli(identity, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "trireme {args:?} as {identity:?} was let through"
        );
        assert!(err.contains(why), "trireme {args:?} as {identity:?}: {err}");
    }
}

pub fn trireme(args: &[&str]) {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "trireme {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn log_says(path: &Path, what: &str) -> bool {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(what)
}

pub fn start() -> World {
    start_with(&[])
}

/// [`start`], etcd given `etcd_args` besides.
pub fn start_with(etcd_args: &[&str]) -> World {
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
    let mut etcd = Command::new("etcd")
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
    super::wait_listening(&mut etcd, cport, &dir.path().join("etcd.log"));
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
pub fn assert_reads_back(w: &World, sock: &Path, src: &Path) {
    let back = w.p("back.img");
    super::run(
        Command::new("nbdcopy")
            .arg(format!("nbd+unix:///v?socket={}", sock.display()))
            .arg(&back),
    );
    assert!(std::fs::read(&back).unwrap()[..4 << 20] == std::fs::read(src).unwrap()[..]);
}

/// Volume `v`, 16 MiB, two copies, open to alice and carol.
pub fn create_v(w: &World) {
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
pub fn node_cmd(w: &World, id: u32) -> Command {
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
pub fn etcd_put_as(w: &World, dir: &str, key: &str) -> bool {
    etcdctl(w, dir, "client", &["put", key, "{}"])
        .status
        .success()
}

/// `etcdctl ARGS` with the identity in `dir` (certificate `STEM-cert.pem`).
pub fn etcdctl(w: &World, dir: &str, stem: &str, args: &[&str]) -> std::process::Output {
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
pub fn statuses(bytes: &[u8]) -> Vec<trireme_proto::Status> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Ok(h) = trireme_proto::decode_header(rest.get(..64).unwrap_or_default()) {
        out.push(h.status);
        rest = rest.get(64 + h.payload_len as usize..).unwrap_or_default();
    }
    out
}

/// Attaches `vol` as `identity`; the child once it serves its socket, or its stderr.
pub fn attach(w: &mut World, identity: &str, vol: &str) -> Result<PathBuf, String> {
    attach_env(w, identity, vol, &[])
}

/// [`attach`], with `env` set for the writer.
pub fn attach_env(
    w: &mut World,
    identity: &str,
    vol: &str,
    env: &[(&str, &str)],
) -> Result<PathBuf, String> {
    let sock = w.p(&format!("{vol}-{identity}.sock"));
    let log = w.p(&format!("attach-{identity}.log"));
    let mut child = Command::new(BIN)
        .envs(env.iter().copied())
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

/// One control exchange with the manager as the client in `dir`: the reply lines.
pub fn control_as(w: &World, dir: &str, requests: &[serde_json::Value]) -> Vec<String> {
    let s = w.admin_json(&["status"]);
    let control = s["manager"]["control"].as_str().unwrap().to_string();
    let mut lines = String::new();
    for r in requests {
        lines.push_str(&format!("{r}\n"));
    }
    let got = super::tls_exchange(&control, &w.p(dir), lines.as_bytes());
    String::from_utf8_lossy(&got)
        .lines()
        .map(String::from)
        .collect()
}

/// The volume's epoch and its replicas' nodes and states, as the metadata says.
pub fn layout(w: &World, vol: &str) -> (u64, Vec<(u64, String)>) {
    let info = w.admin_json(&["volume", "info", vol]);
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

impl World {
    /// `trireme --output json ARGS` as the operator, parsed.
    pub fn admin_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--output", "json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(Some("admin"), &a)).unwrap()
    }
}

/// Volume `v` created, alice attached as its writer, and 4 MiB of `seed`'s bytes written
/// through her export: the socket, its URI, and the file those bytes came from.
pub fn alice_writes_v(w: &mut World, seed: u64) -> (PathBuf, String, PathBuf) {
    create_v(w);
    let sock = attach(w, "alice", "v").expect("alice attaches");
    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    let src = w.p("src.img");
    super::random_file(&src, 4 << 20, seed);
    super::run(Command::new("nbdcopy").arg(&src).arg(&uri));
    (sock, uri, src)
}
