//! The etcd test's world: hosts as network namespaces on a bridge (or 127.0.0.1), a real etcd
//! cluster, the node daemons and the writer on a client host, and what the test asks of them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::common::netns::{Host, Net};
use crate::common::{self, free_port, signal, BIN};

/// Down-out grace of the test's daemons: longer than any outage before the down-out step.
pub const DOWN_OUT: &str = "12s";

/// One qemu-io command on volume `name` served at `sock`.
pub fn qemu_io(sock: &std::path::Path, name: &str, cmd: &str) {
    let uri = format!("nbd+unix:///{name}?socket={}", sock.display());
    common::run(Command::new("qemu-io").args(["-f", "raw", "-c", cmd, &uri]));
}

/// An etcd cluster, one member per host.
pub struct Etcd {
    pub dir: PathBuf,
    pub members: Vec<(String, Host, u16, u16)>,
    pub procs: Vec<Option<Child>>,
}

impl Etcd {
    pub fn start(dir: &std::path::Path, hosts: Vec<Host>) -> Etcd {
        let members: Vec<(String, Host, u16, u16)> = hosts
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                let (c, p) = if h.ns.is_some() {
                    (2379, 2380)
                } else {
                    (free_port(), free_port())
                };
                (format!("m{i}"), h, c, p)
            })
            .collect();
        let n = members.len();
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

    pub fn spawn(&mut self, i: usize) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|(n, h, _, p)| format!("{n}=http://{}:{p}", h.ip))
            .collect();
        let (name, h, c, p) = &self.members[i];
        let log = std::fs::File::create(self.dir.join(format!("etcd-{name}.log"))).unwrap();
        let mut child = h
            .cmd("etcd")
            .args([
                &format!("--name={name}"),
                &format!(
                    "--data-dir={}",
                    self.dir.join(format!("etcd-{name}")).display()
                ),
                &format!("--listen-client-urls=http://{}:{c}", h.ip),
                &format!("--advertise-client-urls=http://{}:{c}", h.ip),
                &format!("--listen-peer-urls=http://{}:{p}", h.ip),
                &format!("--initial-advertise-peer-urls=http://{}:{p}", h.ip),
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
        if h.ns.is_none() {
            // Its ports were claimed (`free_port`); a member that cannot bind fails the test.
            let log = self.dir.join(format!("etcd-{name}.log"));
            common::wait_listening(&mut child, *c, &log);
        }
        self.procs[i] = Some(child);
    }

    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|(_, h, c, _)| format!("{}:{c}", h.ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal_all(&self, sig: i32) {
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

/// The test's processes and where they log. Dropped in field order: processes, then the
/// namespaces.
pub struct World {
    pub nodes: Vec<Option<Child>>,
    pub attach: Option<Child>,
    pub etcd: Etcd,
    pub servers: Vec<Host>,
    pub clients: Vec<Host>,
    pub net: Net,
    pub dir: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        for c in self.nodes.iter_mut().flatten().chain(self.attach.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// True (and said) when `TRIREME_SKIP_ETCD` asks to skip the etcd tests.
pub fn skipped() -> bool {
    let skip = std::env::var_os("TRIREME_SKIP_ETCD").is_some();
    if skip {
        eprintln!("TRIREME_SKIP_ETCD is set: skipping the etcd cluster test");
    }
    skip
}

impl World {
    /// Creates `vol`, 64 MiB and 3-way, and attaches it from client host 1 (`attach-first.log`).
    pub fn create_and_attach(&mut self) {
        self.cli_ok(&[
            "volume",
            "create",
            "vol",
            "--size",
            "64M",
            "--replicas",
            "3",
        ]);
        self.attach(0, "first");
    }

    /// A world of `etcd_members` etcd hosts, `servers` server hosts each running a node daemon,
    /// and `clients` client hosts; returns once every node is registered and a manager is
    /// elected.
    pub fn start(etcd_members: u8, servers: u8, clients: u8) -> World {
        let dir = tempfile::tempdir().unwrap();
        let mut net = Net::new();
        let etcd_hosts: Vec<Host> = (1..=etcd_members)
            .map(|i| net.host(&format!("e{i}"), 10 + i))
            .collect();
        let server_hosts: Vec<Host> = (1..=servers)
            .map(|i| net.host(&format!("s{i}"), i))
            .collect();
        let client_hosts: Vec<Host> = (1..=clients)
            .map(|i| net.host(&format!("c{i}"), 20 + i))
            .collect();
        let etcd = Etcd::start(dir.path(), etcd_hosts);
        let mut w = World {
            nodes: (0..servers).map(|_| None).collect(),
            attach: None,
            etcd,
            servers: server_hosts,
            clients: client_hosts,
            net,
            dir,
        };
        for id in 1..=u32::from(servers) {
            w.start_node(id);
        }
        let t0 = Instant::now();
        while w.cli(&["status"]).status.code() != Some(0)
            || w.status()["nodes"].as_array().map_or(0, |n| n.len()) < usize::from(servers)
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "cluster did not form:\n{}",
                w.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        w
    }

    /// `trireme` on `host`, pointed at the cluster's etcd.
    pub fn cmd_on(&self, host: &Host) -> Command {
        let mut c = host.cmd(BIN);
        // The default data directory (`trireme-data`, where a writer keeps its HTTP address)
        // is this world's, never the source tree's.
        c.current_dir(self.dir.path())
            .env("TRIREME_ETCD", self.etcd.endpoints())
            .env("TRIREME_LOG", "info");
        c
    }

    /// `trireme` on client host 1 (admin commands).
    pub fn cmd(&self) -> Command {
        self.cmd_on(&self.clients[0])
    }

    pub fn log(&self) -> String {
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

    /// Starts node `id`'s daemon: the first time with `--zone rack-ID`, later without (a
    /// restart keeps the zone on record).
    pub fn start_node(&mut self, id: u32) {
        let path = self.dir.path().join(format!("node-{id}.log"));
        let first = !path.exists();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let zone = format!("rack-{id}");
        let capacity = format!("{id}0k");
        let zone_args: Vec<&str> = match first {
            true => vec!["--zone", &zone, "--iops-capacity", &capacity],
            false => vec![],
        };
        let host = self.servers[id as usize - 1].clone();
        let child = self
            .cmd_on(&host)
            .args(["node", "run", "--id", &id.to_string(), "--listen"])
            .arg(format!("{}:0", host.ip))
            .args([
                "--insecure",
                "--lease-ttl",
                "3s",
                "--down-out-interval",
                DOWN_OUT,
            ])
            .args(["--store", "file"])
            .args(&zone_args)
            .arg("--dir")
            .arg(self.dir.path().join(format!("node-{id}")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes[id as usize - 1] = Some(child);
    }

    pub fn kill_node(&mut self, id: u32) {
        if let Some(mut c) = self.nodes[id as usize - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cmd().args(args).output().unwrap()
    }

    pub fn cli_ok(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            o.status.success(),
            "trireme {args:?}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.cli_ok(&["--output", "json", "status"])).unwrap()
    }

    pub fn sock(&self) -> PathBuf {
        self.dir.path().join("v.sock")
    }

    /// Attaches the volume from a new process on client host `client` and waits until it
    /// serves.
    pub fn attach(&mut self, client: usize, tag: &str) {
        let _ = std::fs::remove_file(self.sock());
        let log = std::fs::File::create(self.dir.path().join(format!("attach-{tag}.log"))).unwrap();
        let host = self.clients[client].clone();
        let mut child = self
            .cmd_on(&host)
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

    /// A verifying workload through the NBD socket, on client host 1.
    pub fn bench(&self, secs: u32) -> Child {
        self.clients[0]
            .cmd(BIN)
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

    pub fn finish_bench(&self, b: Child) -> serde_json::Value {
        common::check_workload(b, 500, &|| self.log())
    }

    pub fn manager_node(&self) -> u32 {
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

    /// The nodes holding a replica of the volume, in the layout's order.
    pub fn replica_nodes(&self) -> Vec<u32> {
        self.status()["volumes"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["node"].as_u64().unwrap() as u32)
            .collect()
    }

    /// Waits until `cond` holds of `status`, failing after `limit`.
    pub fn wait_for(&self, what: &str, limit: Duration, cond: &dyn Fn(&serde_json::Value) -> bool) {
        let t0 = Instant::now();
        loop {
            let s = self.status();
            if cond(&s) {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "{what}: not within {limit:?}: {s}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Waits until every node is up and every replica in sync at the volume's epoch.
    pub fn wait_converged(&self) {
        self.wait_for("converged", Duration::from_secs(60), &|s| {
            let v = &s["volumes"][0];
            let epoch = v["epoch"].as_u64();
            let reps = v["replicas"].as_array().unwrap();
            let all_up = s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["up"] == true);
            all_up
                && reps.len() == 3
                && reps
                    .iter()
                    .all(|r| r["state"] == "in-sync" && r["epoch"].as_u64() == epoch)
        });
    }

    /// Waits until the job on `node` is done (failing at once if it failed).
    pub fn wait_job_done(&self, node: u32, limit: Duration) {
        self.wait_for(&format!("job on node {node}"), limit, &|s| {
            let job = s["moves"]
                .as_array()
                .and_then(|m| m.iter().find(|j| j["node"] == node).cloned());
            if let Some(j) = &job {
                assert_ne!(j["state"], "failed", "{s}\n{}", self.log());
            }
            job.is_some_and(|j| j["state"] == "done")
        });
    }

    /// Kills the manager's daemon and restarts it once another daemon holds the role.
    pub fn kill_manager(&mut self) -> u32 {
        let m = self.manager_node();
        self.kill_node(m);
        let t0 = Instant::now();
        while self.manager_node() == m {
            assert!(t0.elapsed() < Duration::from_secs(20), "{}", self.log());
            std::thread::sleep(Duration::from_millis(200));
        }
        self.start_node(m);
        m
    }

    /// Waits until `trireme events` lists each of `texts`, in that order.
    pub fn wait_for_events(&self, texts: &[&str]) {
        let t0 = Instant::now();
        loop {
            let out = self.cli_ok(&["--output", "json", "events"]);
            let evs: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
            let listed: Vec<&str> = evs.iter().filter_map(|e| e["text"].as_str()).collect();
            let mut at = 0;
            let in_order = texts
                .iter()
                .all(|t| match listed[at..].iter().position(|l| l == t) {
                    Some(i) => {
                        at += i + 1;
                        true
                    }
                    None => false,
                });
            if in_order {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "events {texts:?} not listed in order: {listed:#?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Changes a block of node `node`'s copy of volume `id` in its data file, behind the
    /// system's back (the first 1 MiB must have been written).
    pub fn corrupt(&self, node: u32, id: u64) {
        use std::os::unix::fs::FileExt;
        let path = self
            .dir
            .path()
            .join(format!("node-{node}"))
            .join(format!("replica-{id:016x}.data"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        f.write_all_at(&[0xee; 4096], 65536).unwrap();
        f.sync_all().unwrap();
    }

    pub fn verify(&self) {
        let out = self.cli_ok(&["volume", "verify", "vol"]);
        assert!(out.contains("0 mismatching"), "{out}");
    }
}
