//! A cluster of node daemons on a real 3-member etcd cluster (all on 127.0.0.1, started and
//! stopped by the test): `trireme node run` x3, `trireme --etcd ... volume create`, `trireme
//! attach`, and a verifying workload through NBD while, one at a time, a node daemon is
//! killed, the daemon holding the manager role is killed, an etcd member is killed, and all of
//! etcd is frozen; then the writer is killed and the volume attached by a new process. After:
//! no I/O error, no lost, stale or corrupt block, every replica in sync and identical, and the
//! metadata's epoch is the one every replica holds.
//!
//! Needs `etcd` (Debian's etcd-server); `TRIREME_SKIP_ETCD=1` skips it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{signal, BIN};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd cluster of `n` members on 127.0.0.1.
struct Etcd {
    dir: PathBuf,
    members: Vec<(String, u16, u16)>,
    procs: Vec<Option<Child>>,
}

impl Etcd {
    fn start(dir: &Path, n: usize) -> Etcd {
        let members: Vec<(String, u16, u16)> = (0..n)
            .map(|i| (format!("m{i}"), free_port(), free_port()))
            .collect();
        let mut e = Etcd {
            dir: dir.to_path_buf(),
            members,
            procs: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            e.spawn(i);
        }
        e
    }

    fn spawn(&mut self, i: usize) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|(n, _, p)| format!("{n}=http://127.0.0.1:{p}"))
            .collect();
        let (name, c, p) = &self.members[i];
        let log = std::fs::File::create(self.dir.join(format!("etcd-{name}.log"))).unwrap();
        let child = Command::new("etcd")
            .args([
                &format!("--name={name}"),
                &format!(
                    "--data-dir={}",
                    self.dir.join(format!("etcd-{name}")).display()
                ),
                &format!("--listen-client-urls=http://127.0.0.1:{c}"),
                &format!("--advertise-client-urls=http://127.0.0.1:{c}"),
                &format!("--listen-peer-urls=http://127.0.0.1:{p}"),
                &format!("--initial-advertise-peer-urls=http://127.0.0.1:{p}"),
                &format!("--initial-cluster={}", cluster.join(",")),
                "--initial-cluster-state=new",
                "--heartbeat-interval=100",
                "--election-timeout=1000",
                "--log-level=warn",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (apt-get install etcd-server), or TRIREME_SKIP_ETCD=1");
        self.procs[i] = Some(child);
    }

    fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|(_, c, _)| format!("127.0.0.1:{c}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal_all(&self, sig: i32) {
        for c in self.procs.iter().flatten() {
            signal(c.id() as i32, sig);
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.signal_all(libc::SIGCONT);
        for i in 0..self.procs.len() {
            self.kill(i);
        }
    }
}

/// The test's processes and where they log.
struct World {
    dir: tempfile::TempDir,
    etcd: Etcd,
    nodes: Vec<Option<Child>>,
    attach: Option<Child>,
}

impl Drop for World {
    fn drop(&mut self) {
        for c in self.nodes.iter_mut().flatten().chain(self.attach.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl World {
    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("TRIREME_ETCD", self.etcd.endpoints())
            .env("TRIREME_LOG", "info");
        c
    }

    fn log(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        names.sort();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out += &format!("--- {} (last lines)\n", p.display());
            for l in tail.into_iter().rev() {
                out += l;
                out += "\n";
            }
        }
        out
    }

    fn start_node(&mut self, id: u32) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .unwrap();
        let child = self
            .cmd()
            .args([
                "node",
                "run",
                "--id",
                &id.to_string(),
                "--listen",
                "127.0.0.1:0",
            ])
            .args([
                "--lease-ttl",
                "3s",
                "--down-out-interval",
                "0",
                "--store",
                "file",
            ])
            .arg("--dir")
            .arg(self.dir.path().join(format!("node-{id}")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes[id as usize - 1] = Some(child);
    }

    fn kill_node(&mut self, id: u32) {
        if let Some(mut c) = self.nodes[id as usize - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cmd().args(args).output().unwrap()
    }

    fn cli_ok(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            o.status.success(),
            "trireme {args:?}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.cli_ok(&["--output", "json", "status"])).unwrap()
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("v.sock")
    }

    /// Attaches the volume from a new process and waits until it serves.
    fn attach(&mut self, tag: &str) {
        let _ = std::fs::remove_file(self.sock());
        let log = std::fs::File::create(self.dir.path().join(format!("attach-{tag}.log"))).unwrap();
        let mut child = self
            .cmd()
            .args(["attach", "vol", "--lease-ttl", "3s", "--socket"])
            .arg(self.sock())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        // It prints its URI once it serves.
        let mut out = child.stdout.take().unwrap();
        let mut line = [0u8; 1];
        let t0 = Instant::now();
        use std::io::Read;
        while out.read(&mut line).unwrap_or(0) == 1 && line[0] != b'\n' {
            assert!(t0.elapsed() < Duration::from_secs(30));
        }
        assert!(
            self.sock().exists(),
            "attach did not serve:\n{}",
            self.log()
        );
        self.attach = Some(child);
    }

    fn bench(&self, secs: u32) -> Child {
        Command::new(BIN)
            .args([
                "--output", "json", "bench", "--verify", "-b4K", "-w40", "-r", "-t2", "-o4",
            ])
            .arg(format!("-d{secs}"))
            .arg("-W0")
            .arg(format!("nbd+unix:///vol?socket={}", self.sock().display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn finish_bench(&self, b: Child) -> serde_json::Value {
        common::check_workload(b, 500, &|| self.log())
    }

    fn manager_node(&self) -> u32 {
        let t0 = Instant::now();
        loop {
            if let Some(n) = self.status()["manager"]["node"].as_u64() {
                return n as u32;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no manager:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until every replica is in sync at the volume's epoch on a node that is up.
    fn wait_converged(&self) {
        let t0 = Instant::now();
        loop {
            let s = self.status();
            let v = &s["volumes"][0];
            let epoch = v["epoch"].as_u64();
            let reps = v["replicas"].as_array().unwrap();
            let all_up = s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["up"] == true);
            if all_up
                && reps.len() == 3
                && reps
                    .iter()
                    .all(|r| r["state"] == "in-sync" && r["epoch"].as_u64() == epoch)
            {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "not converged: {s}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

#[test]
fn a_cluster_on_etcd_survives_node_manager_etcd_and_writer_failures() {
    if std::env::var_os("TRIREME_SKIP_ETCD").is_some() {
        eprintln!("TRIREME_SKIP_ETCD is set: skipping the etcd cluster test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), 3);
    let mut w = World {
        dir,
        etcd,
        nodes: (0..3).map(|_| None).collect(),
        attach: None,
    };
    for id in 1..=3 {
        w.start_node(id);
    }
    // Registered, and a manager elected.
    let t0 = Instant::now();
    while w.cli(&["status"]).status.code() != Some(0)
        || w.status()["nodes"].as_array().map_or(0, |n| n.len()) < 3
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "cluster did not form:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A second daemon with a taken id refuses to start, saying who holds it.
    let dup = w
        .cmd()
        .args([
            "node",
            "run",
            "--id",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--dir",
        ])
        .arg(w.dir.path().join("dup"))
        .output()
        .unwrap();
    assert_eq!(dup.status.code(), Some(2), "{dup:?}");
    let why = String::from_utf8_lossy(&dup.stderr);
    assert!(why.contains("node id 2 is already held"), "{why}");

    w.cli_ok(&[
        "volume",
        "create",
        "vol",
        "--size",
        "64M",
        "--replicas",
        "3",
    ]);
    w.attach("first");
    // A second attach is refused while the first holds its record.
    let second = w
        .cmd()
        .args(["attach", "vol", "--socket"])
        .arg(w.dir.path().join("other.sock"))
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2), "{second:?}");
    assert!(String::from_utf8_lossy(&second.stderr).contains("is attached by"));

    // Faults, one at a time, under a verifying workload.
    let b = w.bench(34);
    std::thread::sleep(Duration::from_secs(3));
    let victim = (1..=3).find(|&n| n != w.manager_node()).unwrap();
    w.kill_node(victim);
    std::thread::sleep(Duration::from_secs(3));
    w.start_node(victim);
    std::thread::sleep(Duration::from_secs(3));
    let m = w.manager_node();
    w.kill_node(m);
    std::thread::sleep(Duration::from_secs(2));
    let m2 = w.manager_node();
    assert_ne!(m2, m, "another daemon takes the manager role");
    w.start_node(m);
    std::thread::sleep(Duration::from_secs(2));
    w.etcd.kill(0);
    std::thread::sleep(Duration::from_secs(3));
    w.etcd.spawn(0);
    std::thread::sleep(Duration::from_secs(3));
    w.etcd.signal_all(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(8));
    w.etcd.signal_all(libc::SIGCONT);
    w.finish_bench(b);
    w.wait_converged();

    // The writer dies; a new process attaches (after its lease expires) and reconciles.
    if let Some(mut a) = w.attach.take() {
        let _ = a.kill();
        let _ = a.wait();
    }
    let t0 = Instant::now();
    w.attach("second");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(15), "re-attach took {took:?}");
    let log = std::fs::read_to_string(w.dir.path().join("attach-second.log")).unwrap();
    assert!(log.contains("reconcil"), "{log}");
    let b = w.bench(5);
    w.finish_bench(b);
    w.wait_converged();
    let out = w.cli_ok(&["volume", "verify", "vol"]);
    assert!(out.contains("0 mismatching"), "{out}");
    let s = w.status();
    assert!(
        s["volumes"][0]["writer"]
            .as_str()
            .unwrap_or("")
            .contains("nbd+unix"),
        "{s}"
    );
}
