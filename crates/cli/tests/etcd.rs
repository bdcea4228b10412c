//! A cluster of several servers on a real 3-member etcd cluster, started and stopped by the
//! test. Every host is a network namespace of its own (three etcd members, four servers, two
//! client hosts), joined by a bridge in one more namespace, so nothing changes in the host's
//! namespace; without root it all runs on 127.0.0.1 instead, and the partition is skipped.
//!
//! `trireme node run` x4, `trireme --etcd ... volume create`, `trireme attach` on client 1, and
//! a verifying workload through NBD while, one at a time: a node daemon is killed; a node is
//! cut off (iptables DROP in its namespace); the daemon holding the manager role is killed;
//! an etcd member is killed; all of etcd is frozen for 10 s. Then a node is drained while the
//! manager is killed (its successor finishes the job), a node dies for good and its replica is
//! re-created elsewhere after `--down-out-interval`, and the writer is killed and the volume
//! attached from client 2, and last every daemon is restarted in turn (`maintenance
//! rolling`). After each: no I/O error, no lost, stale or corrupt block, every replica in sync
//! and identical, and the metadata's epoch is the one every replica holds.
//!
//! Needs `etcd` (Debian's etcd-server); `TRIREME_SKIP_ETCD=1` skips it.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, sh, signal, BIN};

/// Down-out grace of the test's daemons: longer than any outage before the down-out step.
const DOWN_OUT: &str = "12s";

/// One host of the test: a network namespace and its address, or 127.0.0.1.
#[derive(Debug, Clone)]
struct Host {
    ns: Option<String>,
    ip: String,
}

impl Host {
    /// `prog` run on this host.
    fn cmd(&self, prog: &str) -> Command {
        match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, prog]);
                c
            }
            None => Command::new(prog),
        }
    }

    /// Drops every packet in and out of the host (`on == false` lets them through again).
    fn cut(&self, on: bool) {
        let ns = self.ns.as_deref().expect("only a namespace can be cut off");
        let flag = if on { "-I" } else { "-D" };
        for rule in [["INPUT", "-i"], ["OUTPUT", "-o"]] {
            sh(&[
                "ip", "netns", "exec", ns, "iptables", flag, rule[0], rule[1], "eth0", "-j", "DROP",
            ])
            .unwrap_or_else(|e| panic!("iptables is needed (scripts/setup.sh installs it): {e}"));
        }
    }
}

/// The test's hosts. In namespaces `tr<pid>-<name>` on 10.78.0.0/24, joined by bridge `br0`
/// in namespace `tr<pid>-sw`; all are deleted on drop (with whatever still runs in them).
struct Net {
    prefix: String,
    names: Vec<String>,
    on: bool,
}

impl Net {
    fn new() -> Net {
        let prefix = format!("tr{}", std::process::id() % 100_000);
        let mut net = Net {
            prefix: prefix.clone(),
            names: Vec::new(),
            on: false,
        };
        let sw = format!("{prefix}-sw");
        let steps: [&[&str]; 3] = [
            &["ip", "netns", "add", &sw],
            &["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"],
            &["ip", "-n", &sw, "link", "set", "br0", "up"],
        ];
        for (i, s) in steps.iter().enumerate() {
            if let Err(e) = sh(s) {
                eprintln!("no network namespaces ({e}): every host runs on 127.0.0.1 and the partition step is skipped");
                return net;
            }
            if i == 0 {
                net.names.push(sw.clone());
            }
        }
        net.on = true;
        net
    }

    /// A new host `name` at 10.78.0.`k` (or 127.0.0.1).
    fn host(&mut self, name: &str, k: u8) -> Host {
        if !self.on {
            return Host {
                ns: None,
                ip: "127.0.0.1".into(),
            };
        }
        let ns = format!("{}-{name}", self.prefix);
        let sw = format!("{}-sw", self.prefix);
        let veth = format!("v{name}");
        let ip = format!("10.78.0.{k}");
        let cidr = format!("{ip}/24");
        sh(&["ip", "netns", "add", &ns]).unwrap();
        self.names.push(ns.clone());
        let steps: [&[&str]; 5] = [
            &[
                "ip", "link", "add", &veth, "netns", &sw, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ],
            &["ip", "-n", &sw, "link", "set", &veth, "master", "br0", "up"],
            &["ip", "-n", &ns, "addr", "add", &cidr, "dev", "eth0"],
            &["ip", "-n", &ns, "link", "set", "eth0", "up"],
            &["ip", "-n", &ns, "link", "set", "lo", "up"],
        ];
        for s in steps {
            sh(s).unwrap();
        }
        Host { ns: Some(ns), ip }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.names.iter().rev() {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(p) = pid.parse::<i32>() {
                        signal(p, libc::SIGKILL);
                    }
                }
            }
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

/// One qemu-io command on volume `name` served at `sock`.
fn qemu_io(sock: &std::path::Path, name: &str, cmd: &str) {
    let uri = format!("nbd+unix:///{name}?socket={}", sock.display());
    common::run(Command::new("qemu-io").args(["-f", "raw", "-c", cmd, &uri]));
}

/// An etcd cluster, one member per host.
struct Etcd {
    dir: PathBuf,
    members: Vec<(String, Host, u16, u16)>,
    procs: Vec<Option<Child>>,
}

impl Etcd {
    fn start(dir: &std::path::Path, hosts: Vec<Host>) -> Etcd {
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

    fn spawn(&mut self, i: usize) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|(n, h, _, p)| format!("{n}=http://{}:{p}", h.ip))
            .collect();
        let (name, h, c, p) = &self.members[i];
        let log = std::fs::File::create(self.dir.join(format!("etcd-{name}.log"))).unwrap();
        let child = h
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
        self.procs[i] = Some(child);
    }

    fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|(_, h, c, _)| format!("{}:{c}", h.ip))
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

/// The test's processes and where they log. Dropped in field order: processes, then the
/// namespaces.
struct World {
    nodes: Vec<Option<Child>>,
    attach: Option<Child>,
    etcd: Etcd,
    servers: Vec<Host>,
    clients: Vec<Host>,
    net: Net,
    dir: tempfile::TempDir,
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
    /// `trireme` on `host`, pointed at the cluster's etcd.
    fn cmd_on(&self, host: &Host) -> Command {
        let mut c = host.cmd(BIN);
        // The default data directory (`trireme-data`, where a writer keeps its HTTP address)
        // is this world's, never the source tree's.
        c.current_dir(self.dir.path())
            .env("TRIREME_ETCD", self.etcd.endpoints())
            .env("TRIREME_LOG", "info");
        c
    }

    /// `trireme` on client host 1 (admin commands).
    fn cmd(&self) -> Command {
        self.cmd_on(&self.clients[0])
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

    /// Starts node `id`'s daemon: the first time with `--zone rack-ID`, later without (a
    /// restart keeps the zone on record).
    fn start_node(&mut self, id: u32) {
        let path = self.dir.path().join(format!("node-{id}.log"));
        let first = !path.exists();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let zone = format!("rack-{id}");
        let zone_args: Vec<&str> = match first {
            true => vec!["--zone", &zone],
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

    /// Attaches the volume from a new process on client host `client` and waits until it
    /// serves.
    fn attach(&mut self, client: usize, tag: &str) {
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
    fn bench(&self, secs: u32) -> Child {
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

    /// The nodes holding a replica of the volume, in the layout's order.
    fn replica_nodes(&self) -> Vec<u32> {
        self.status()["volumes"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["node"].as_u64().unwrap() as u32)
            .collect()
    }

    /// Waits until `cond` holds of `status`, failing after `limit`.
    fn wait_for(&self, what: &str, limit: Duration, cond: &dyn Fn(&serde_json::Value) -> bool) {
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
    fn wait_converged(&self) {
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
    fn wait_job_done(&self, node: u32, limit: Duration) {
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
    fn kill_manager(&mut self) -> u32 {
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
    fn wait_for_events(&self, texts: &[&str]) {
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
    fn corrupt(&self, node: u32, id: u64) {
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

    fn verify(&self) {
        let out = self.cli_ok(&["volume", "verify", "vol"]);
        assert!(out.contains("0 mismatching"), "{out}");
    }
}

#[test]
fn a_cluster_on_etcd_survives_node_manager_etcd_and_writer_failures() {
    if std::env::var_os("TRIREME_SKIP_ETCD").is_some() {
        eprintln!("TRIREME_SKIP_ETCD is set: skipping the etcd cluster test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut net = Net::new();
    let etcd_hosts: Vec<Host> = (1..=3)
        .map(|i| net.host(&format!("e{i}"), 10 + i))
        .collect();
    let servers: Vec<Host> = (1..=4).map(|i| net.host(&format!("s{i}"), i)).collect();
    let clients: Vec<Host> = (1..=2)
        .map(|i| net.host(&format!("c{i}"), 20 + i))
        .collect();
    let etcd = Etcd::start(dir.path(), etcd_hosts);
    let mut w = World {
        nodes: (0..4).map(|_| None).collect(),
        attach: None,
        etcd,
        servers,
        clients,
        net,
        dir,
    };
    for id in 1..=4 {
        w.start_node(id);
    }
    // Registered, and a manager elected.
    let t0 = Instant::now();
    while w.cli(&["status"]).status.code() != Some(0)
        || w.status()["nodes"].as_array().map_or(0, |n| n.len()) < 4
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "cluster did not form:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A second daemon with a taken id refuses to start, saying who holds it.
    let host = w.servers[1].clone();
    let dup = w
        .cmd_on(&host)
        .args(["node", "run", "--id", "2", "--insecure", "--listen"])
        .arg(format!("{}:0", host.ip))
        .arg("--dir")
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
    w.attach(0, "first");
    // A second attach, from the other client host, is refused while the first holds its record.
    let second = w
        .cmd_on(&w.clients[1])
        .args(["attach", "vol", "--socket"])
        .arg(w.dir.path().join("other.sock"))
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2), "{second:?}");
    assert!(String::from_utf8_lossy(&second.stderr).contains("is attached by"));

    // Faults, one at a time, under a verifying workload.
    let b = w.bench(if w.net.on { 42 } else { 36 });
    std::thread::sleep(Duration::from_secs(3));
    // The writer runs on a client host, the manager on a server: `status` shows the writer's
    // I/O from the report it writes to etcd (`reports/vol`).
    let t0 = Instant::now();
    loop {
        let io = w.status()["volumes"][0]["io"].clone();
        if io["write_iops"].as_f64().is_some_and(|x| x > 0.0) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "status never showed the writer's I/O: {io}\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let reps = w.replica_nodes();
    let m = w.manager_node();
    let victim = *reps.iter().find(|&&n| n != m).unwrap();
    w.kill_node(victim);
    std::thread::sleep(Duration::from_secs(3));
    w.start_node(victim);
    std::thread::sleep(Duration::from_secs(3));
    if w.net.on {
        // Cut off longer than the replica timeout and the lease: taken out, shown down, then
        // back with a resync.
        let cut = *reps.iter().rev().find(|&&n| n != m).unwrap();
        w.servers[cut as usize - 1].cut(true);
        std::thread::sleep(Duration::from_secs(4));
        w.servers[cut as usize - 1].cut(false);
        std::thread::sleep(Duration::from_secs(3));
    }
    let m = w.kill_manager();
    let m2 = w.manager_node();
    assert_ne!(m2, m, "another daemon takes the manager role");
    // The events are kept in etcd: the new manager shows those its predecessor recorded (the
    // victim's death) and goes on from them.
    w.wait_for_events(&[
        &format!("node {victim} is down"),
        &format!("node {victim} is up"),
        &format!("node {m2} took the manager role"),
    ]);
    std::thread::sleep(Duration::from_secs(2));
    w.etcd.kill(0);
    std::thread::sleep(Duration::from_secs(3));
    w.etcd.spawn(0);
    std::thread::sleep(Duration::from_secs(3));
    w.etcd.signal_all(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(10));
    w.etcd.signal_all(libc::SIGCONT);
    w.finish_bench(b);
    w.wait_converged();

    // A drain whose manager dies half-way: the writer on the client host copies the replica
    // at the manager's request, and the next manager finishes the job.
    let spare = (1..=4).find(|n| !w.replica_nodes().contains(n)).unwrap();
    if w.manager_node() == spare {
        // The copy goes to the spare: keep the manager elsewhere so killing it stops no copy.
        w.kill_manager();
    }
    let b = w.bench(12);
    let m = w.manager_node();
    let drained = *w.replica_nodes().iter().find(|&&n| n != m).unwrap();
    w.cli_ok(&[
        "node",
        "drain",
        &drained.to_string(),
        "--rate",
        "12M",
        "--no-wait",
    ]);
    // The copy's progress shows in `status`, from the writer's report on etcd (the writer
    // runs on a client host, the manager on a server).
    w.wait_for("the copy's progress", Duration::from_secs(10), &|s| {
        s["volumes"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["state"] == "resyncing" && r["resync"]["done_bytes"].as_u64() > Some(0))
    });
    w.kill_manager();
    w.wait_job_done(drained, Duration::from_secs(40));
    w.finish_bench(b);
    w.wait_converged();
    assert!(!w.replica_nodes().contains(&drained));
    assert!(w.replica_nodes().contains(&spare));
    let writer_log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    // `status` shows the remote writer's links: UCX, over the network (not shared memory).
    let s = w.status();
    let links = s["volumes"][0]["client_links"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(links.len(), 3, "{s}");
    if w.net.on {
        for l in &links {
            assert_eq!(l["transport"], "ucx", "{s}");
            assert!(
                l["lanes"].as_str().is_some_and(|x| x.starts_with("tcp/")),
                "{s}"
            );
        }
    }
    // The default transport between hosts: UCX over its network lanes, with no link falling
    // back to TCP after a stall while TCP answered (shared memory does not reach across
    // network namespaces). A node killed takes its UCX path down with its TCP connection.
    assert!(
        !writer_log.contains("while TCP answered") && !writer_log.contains("UCX not used"),
        "{writer_log}"
    );
    assert!(
        writer_log.contains("moving a replica at the manager's request"),
        "the writer on the client host made the copy:\n{}",
        w.log()
    );
    let nodes_log: String = (1..=4)
        .map(|i| std::fs::read_to_string(w.dir.path().join(format!("node-{i}.log"))).unwrap())
        .collect();
    assert!(
        nodes_log.contains("resuming the job of the previous manager"),
        "{}",
        w.log()
    );
    w.verify();

    // A scrub of a volume written on a client host runs in that writer, at the manager's
    // request, reports back through etcd, and repairs a copy corrupted behind its back.
    qemu_io(&w.sock(), "vol", "write -P 0x33 0 1M");
    let bad = w.replica_nodes()[1];
    w.corrupt(bad, w.status()["volumes"][0]["id"].as_u64().unwrap());
    let out = w.cli_ok(&["--output", "json", "volume", "scrub", "vol"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["bytes_compared"].as_u64(), Some(64 << 20), "{r}");
    assert_eq!(r["replicas"].as_array().map(Vec::len), Some(3), "{r}");
    assert_eq!(r["repaired"], serde_json::json!([[0, bad]]), "{r}");
    let writer_log = std::fs::read_to_string(w.dir.path().join("attach-first.log")).unwrap();
    assert!(
        writer_log.contains("scrubbing at the manager's request"),
        "{writer_log}"
    );
    w.verify();
    // A volume nobody writes is scrubbed through a writer the manager attaches for it.
    w.cli_ok(&[
        "volume",
        "create",
        "cold",
        "--size",
        "8M",
        "--replicas",
        "3",
    ]);
    let cold_sock = w.dir.path().join("cold.sock");
    let mut cold = w
        .cmd_on(&w.clients[1])
        .args(["attach", "cold", "--socket"])
        .arg(&cold_sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Read;
        let mut first = [0u8; 1];
        let _ = cold.stdout.as_mut().unwrap().read(&mut first);
    }
    qemu_io(&cold_sock, "cold", "write -P 0x44 0 1M");
    signal(cold.id() as i32, libc::SIGTERM);
    assert!(cold.wait().unwrap().success());
    let s = w.status();
    let cold_v = s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cold")
        .unwrap()
        .clone();
    let bad = cold_v["replicas"][2]["node"].as_u64().unwrap() as u32;
    w.corrupt(bad, cold_v["id"].as_u64().unwrap());
    let out = w.cli_ok(&["--output", "json", "volume", "scrub", "cold"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["repaired"], serde_json::json!([[0, bad]]), "{r}");
    let out = w.cli_ok(&["volume", "verify", "cold"]);
    assert!(out.contains("0 mismatching"), "{out}");
    let info = w.cli_ok(&["volume", "info", "cold"]);
    assert!(
        info.contains("last scrub: ") && info.contains("(operator, "),
        "{info}"
    );
    w.cli_ok(&["volume", "delete", "cold", "--keep", "0"]);

    // Every daemon restarted so far was started without --zone: each kept its zone.
    let s = w.status();
    for n in s["nodes"].as_array().unwrap() {
        assert_eq!(n["zone"], format!("rack-{}", n["id"]), "{s}");
    }

    // A node dies for good: after the down-out grace its replica is re-created elsewhere.
    w.cli_ok(&["node", "undrain", &drained.to_string()]);
    let b = w.bench(8);
    std::thread::sleep(Duration::from_secs(1));
    let m = w.manager_node();
    let dead = *w.replica_nodes().iter().find(|&&n| n != m).unwrap();
    w.kill_node(dead);
    w.finish_bench(b);
    w.wait_job_done(dead, Duration::from_secs(60));
    assert!(!w.replica_nodes().contains(&dead));
    // It comes back empty and drained; undrained, it may take replicas again.
    w.start_node(dead);
    w.wait_converged();
    w.cli_ok(&["node", "undrain", &dead.to_string()]);

    // The writer dies; client host 2 attaches (after its lease expires) and reconciles.
    if let Some(mut a) = w.attach.take() {
        let _ = a.kill();
        let _ = a.wait();
    }
    let t0 = Instant::now();
    w.attach(1, "second");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(15), "re-attach took {took:?}");
    let log = std::fs::read_to_string(w.dir.path().join("attach-second.log")).unwrap();
    assert!(log.contains("reconcil"), "{log}");
    let b = w.bench(5);
    w.finish_bench(b);
    w.wait_converged();
    w.verify();
    let s = w.status();
    assert!(
        s["volumes"][0]["writer"]
            .as_str()
            .unwrap_or("")
            .contains("nbd+unix"),
        "{s}"
    );

    // Every server dies at once (the rack loses power; each disk keeps what it was given)
    // and comes back: the writer on the client host holds its requests, links to each copy
    // again under its new address, and goes on, with no I/O error and no new epoch.
    let epoch = w.status()["volumes"][0]["epoch"].as_u64();
    let b = w.bench(14);
    std::thread::sleep(Duration::from_secs(2));
    for id in 1..=4 {
        w.kill_node(id);
    }
    std::thread::sleep(Duration::from_secs(2));
    for id in 1..=4 {
        w.start_node(id);
    }
    w.finish_bench(b);
    w.wait_converged();
    assert_eq!(w.status()["volumes"][0]["epoch"].as_u64(), epoch);
    w.verify();
    let log = std::fs::read_to_string(w.dir.path().join("attach-second.log")).unwrap();
    assert!(log.contains("linked the in-sync copy again"), "{log}");

    // Patch Tuesday on etcd (issue 17): every daemon restarted in turn — the manager's own
    // too, after it hands its role over — under the verifying workload. Each writer takes its
    // replica out before the daemon stops, so no write fails or waits for a timeout; each
    // daemon starts its binary again in place (same process) and resyncs incrementally.
    let pids: Vec<u32> = w.nodes.iter().flatten().map(|c| c.id()).collect();
    let b = w.bench(20);
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let out = w.cli_ok(&["--output", "json", "maintenance", "rolling"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    eprintln!("rolling restart on etcd in {:?}: {r}", t0.elapsed());
    let v = w.finish_bench(b);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    let restarted = r["nodes"].as_array().unwrap();
    assert_eq!(restarted.len(), 4, "{r}");
    let holders = w.replica_nodes();
    for n in restarted {
        let id = n["node"].as_u64().unwrap() as u32;
        let expect = if holders.contains(&id) {
            serde_json::json!(["vol"])
        } else {
            serde_json::json!([])
        };
        assert_eq!(n["volumes"], expect, "{r}");
        assert_eq!(n["full"], false, "incremental resyncs: {r}\n{}", w.log());
    }
    for (c, pid) in w.nodes.iter_mut().flatten().zip(pids) {
        assert!(c.try_wait().unwrap().is_none(), "{}", w.log());
        assert_eq!(c.id(), pid);
    }
    let nodes_log: String = (1..=4)
        .map(|i| std::fs::read_to_string(w.dir.path().join(format!("node-{i}.log"))).unwrap())
        .collect();
    assert!(
        nodes_log.contains("handed the manager role over"),
        "{}",
        w.log()
    );
    w.wait_converged();
    w.verify();
    // Below the minimum of copies the writer refuses, and nothing restarts.
    w.cli_ok(&["volume", "set", "vol", "--min-copies", "3"]);
    let bad = w.cli(&["node", "restart", &holders[0].to_string()]);
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(why.contains("minimum"), "{why}");
}
