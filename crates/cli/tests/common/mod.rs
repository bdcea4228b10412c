//! A real cluster for tests: `trireme up` in a temporary directory, stopped on drop; the CLI
//! and process helpers around it (HTTP and TLS clients in `http`, image files and NBD exports
//! in `images`, network namespaces in `netns`, a TLS cluster on etcd in `secure`).

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod csi;
pub mod guest;
mod http;
mod images;
pub mod netns;
pub mod secure;
#[allow(unused_imports)]
pub use http::*;
#[allow(unused_imports)]
pub use images::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_trireme");

#[derive(Debug)]
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub unix: String,
    pub tcp: String,
}

/// Fails the test with a clear message if a required client tool is missing.
pub fn need(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{tool} is not installed: run scripts/setup.sh (make test does)"
    );
}

impl Cluster {
    pub fn start(args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, args)
    }

    pub fn start_in(dir: tempfile::TempDir, args: &[&str]) -> Cluster {
        Self::start_env(dir, args, &[])
    }

    /// Like [`Cluster::start_in`], with environment variables for `up` and its nodes.
    pub fn start_env(dir: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> Cluster {
        let log = std::fs::File::create(dir.path().join("up.log")).unwrap();
        let child = Command::new(BIN)
            .envs(env.iter().copied())
            .arg("--data-dir")
            .arg(dir.path())
            .arg("up")
            .args(["--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let exports = dir.path().join("exports");
        let t0 = Instant::now();
        let mut c = Cluster {
            dir,
            child: Some(child),
            unix: String::new(),
            tcp: String::new(),
        };
        while !exports.exists() {
            if let Some(st) = c.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "trireme up exited early ({st}):\n{}{}",
                    c.log(),
                    c.node_log_tails()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "cluster did not start:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&exports).unwrap();
        let mut lines = text.lines();
        c.unix = lines.next().unwrap().to_string();
        c.tcp = lines.next().unwrap().to_string();
        c
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `host:port` of the TCP export (`nbds://` unless started with `--insecure`).
    pub fn tcp_addr(&self) -> String {
        let rest = self.tcp.split_once("://").unwrap().1;
        rest.split('/').next().unwrap().to_string()
    }

    /// qemu's arguments for the TCP export over TLS, with the client credentials `up` wrote:
    /// `--object tls-creds-x509,... --image-opts`, then the image spec.
    pub fn qemu_tls(&self, volume: &str) -> Vec<String> {
        let (host, port) = self
            .tcp_addr()
            .rsplit_once(':')
            .map(|(h, p)| (h.to_string(), p.to_string()))
            .unwrap();
        vec![
            "--object".into(),
            format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=client",
                self.path().join("tls/client").display()
            ),
            "--image-opts".into(),
            format!("driver=nbd,host={host},port={port},export={volume},tls-creds=tls0"),
        ]
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("up.log")).unwrap_or_default()
    }

    /// The last lines of every node's log: why a node did not start, once the test's
    /// directory is gone.
    pub fn node_log_tails(&self) -> String {
        let mut logs: Vec<_> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("node-") && n.ends_with(".log"))
            })
            .collect();
        logs.sort();
        let mut out = String::new();
        for p in logs {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            out += &format!(
                "\n--- {} (last {} lines)\n{}\n",
                p.display(),
                tail.len(),
                tail.join("\n")
            );
        }
        out
    }

    /// Runs `trireme --data-dir DIR ARGS...`; one that has not ended in two minutes fails the
    /// test with `up`'s log.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_env(args, &[])
    }

    /// As [`Cluster::cli`], with `env` set for the command.
    pub fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.envs(env.iter().copied());
        cmd.arg("--data-dir").arg(self.dir.path()).args(args);
        output_within(&mut cmd, CLI_LIMIT, &|| self.evidence())
    }

    /// The threads' stacks of `up` and of its nodes, and `up`'s log: what a test that found
    /// something hung prints.
    pub fn evidence(&self) -> String {
        let mut out = self
            .child
            .as_ref()
            .map_or(String::new(), |c| stacks(c.id()));
        let pids = std::fs::read_to_string(self.path().join("pids")).unwrap_or_default();
        for pid in pids
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        {
            out += &stacks(pid);
        }
        format!("{out}\n{}", self.log())
    }

    /// Stops the cluster with SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) -> tempfile::TempDir {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the pid of a child we spawned.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            loop {
                if let Some(st) = child.try_wait().unwrap() {
                    assert!(st.success(), "trireme up exited with {st}:\n{}", self.log());
                    break;
                }
                if t0.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    panic!("trireme up did not stop on SIGTERM:\n{}", self.log());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    /// Kills `up` and every node at once (SIGKILL), as a crash of the whole cluster would, and
    /// waits until none of them runs. Returns the data directory, ready for `start_in` (the
    /// stale `exports` file is removed).
    pub fn crash(&mut self) -> tempfile::TempDir {
        // Frozen first, `up` with its nodes, every process started on the cluster's directory:
        // none flushes on its way out, and `up` starts no node again (it restarts one that
        // dies). Killed one after another, `up` could restart a node in between, and that node,
        // sent SIGTERM by its parent's death, could still hold its directory when the cluster
        // started again (a suspect for "node 1 failed to start" in CI on 2026-12-06).
        let mut all: Vec<i32> = Vec::new();
        let mut new: Vec<i32> = self.child.iter().map(|c| c.id() as i32).collect();
        while !new.is_empty() {
            for &p in &new {
                // SAFETY: kill(2) on pids of processes this cluster spawned.
                unsafe { libc::kill(p, libc::SIGSTOP) };
            }
            all.append(&mut new);
            new = processes_naming(self.path())
                .into_iter()
                .filter(|p| !all.contains(p))
                .collect();
        }
        for &p in &all {
            // SAFETY: as above.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        let t0 = Instant::now();
        // Gone, or a zombie waiting for init to reap it: either way it holds no file.
        let alive = |p: i32| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
            })
        };
        while all.iter().any(|&p| alive(p)) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "processes {all:?} outlived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(self.path().join("exports"));
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the pid of a child we spawned.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(15) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How long a CLI command may take in a test before it counts as hung.
pub const CLI_LIMIT: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion, at most `limit`: see [`wait_within`].
pub fn output_within(cmd: &mut Command, limit: Duration, log: &dyn Fn() -> String) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    wait_within(child, limit, log)
}

/// Waits at most `limit` for `child` (its stdout and stderr piped) and returns its output. A
/// child still running then is killed, and the test fails with what it printed and `log()`: a
/// hang is a failure with its evidence, never a test run that ends on CI's overall timeout.
pub fn wait_within(mut child: Child, limit: Duration, log: &dyn Fn() -> String) -> Output {
    use std::io::Read;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let stacks = stacks(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let (o, e) = (out.join().unwrap(), err.join().unwrap());
            panic!(
                "pid {} still running after {limit:?}, killed:\nstdout: {}\nstderr: {}\n{stacks}\n{}",
                child.id(),
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e),
                log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The stacks of every thread of process `pid`, through gdb (installed by the setup script),
/// for a test that found it hung; empty without gdb.
pub fn stacks(pid: u32) -> String {
    let out = Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "thread apply all bt 40"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let keep: String = text.chars().take(60_000).collect();
            format!("threads of pid {pid}:\n{keep}")
        }
        _ => String::new(),
    }
}

/// Runs a command and asserts it succeeded, returning stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = output_within(cmd, Duration::from_secs(300), &String::new);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `status` reaches every node and shows it up.
pub fn assert_all_nodes_up(c: &Cluster) {
    let st: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "status"]).stdout).unwrap();
    assert!(
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["up"] == true),
        "{st}"
    );
}

/// Asserts `trireme volume verify` finds the replicas identical.
pub fn assert_replicas_identical(c: &Cluster, volume: &str) {
    let out = c.cli(&["--output", "json", "volume", "verify", volume]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verify failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0, "{text}");
    assert!(v["bytes_compared"].as_u64().unwrap() > 0);
}

/// The nodes holding a copy of `volume`, in order.
pub fn replica_nodes(c: &Cluster, volume: &str) -> Vec<u64> {
    let info: serde_json::Value =
        serde_json::from_str(&ok(c, &["--output", "json", "volume", "info", volume])).unwrap();
    let mut n: Vec<u64> = info["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_u64().unwrap())
        .collect();
    n.sort_unstable();
    n
}

pub fn node_pid(c: &Cluster, id: u32) -> i32 {
    try_node_pid(c, id).unwrap_or_else(|| panic!("node {id} is not running:\n{}", c.log()))
}

/// The node's pid, if it runs (a node waiting to be restarted is not in `pids`).
pub fn try_node_pid(c: &Cluster, id: u32) -> Option<i32> {
    let pids = std::fs::read_to_string(c.path().join("pids")).unwrap();
    pids.lines()
        .find_map(|l| l.strip_prefix(&format!("node-{id} ")))
        .map(|p| p.trim().parse().unwrap())
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid of a process this test's cluster spawned.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Waits until the node has been restarted under a new pid.
pub fn wait_restarted(c: &Cluster, id: u32, old: i32) -> i32 {
    let t0 = Instant::now();
    loop {
        match try_node_pid(c, id) {
            Some(pid) if pid != old => return pid,
            _ => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "node {id} was not restarted:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that a writer link `l` (of `status` output `ctx`) to a node on another host runs on
/// trireme's TCP for want of RDMA here: UCX would have had only its tcp lanes, which carry no
/// TLS (`ucx::DEFAULT_TLS`). On a host with RDMA, only that it is not on UCX's tcp lanes.
pub fn assert_tcp_for_want_of_rdma(l: &serde_json::Value, ctx: &serde_json::Value) {
    if trireme_transport::ucx::rdma_here() {
        assert!(!l["lanes"].as_str().unwrap_or("").contains("tcp/"), "{ctx}");
        return;
    }
    assert_eq!(l["transport"], "tcp", "{ctx}");
    assert!(
        l["fallback"]
            .as_str()
            .is_some_and(|w| w == trireme_transport::ucx::NO_RDMA),
        "{ctx}"
    );
}

/// `(full, copied_bytes)` of every finished resync in the cluster log.
pub fn resyncs(c: &Cluster) -> Vec<(bool, u64)> {
    c.log()
        .lines()
        .filter(|l| l.contains("resync done"))
        .map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .unwrap_or_else(|| panic!("no {k} in {l}"))
                    .to_string()
            };
            (
                field("full") == "true",
                field("copied_bytes").parse().unwrap(),
            )
        })
        .collect()
}

/// `trireme ARGS` against `c`, which must succeed; its output.
pub fn cli_ok(c: &Cluster, args: &[&str]) -> String {
    let out = c.cli(args);
    assert!(
        out.status.success(),
        "trireme {args:?} failed: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        c.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn status(c: &Cluster) -> serde_json::Value {
    let out = c.cli(&["--output", "json", "status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until every replica of every volume is in sync (the writer's live view).
pub fn wait_all_in_sync(c: &Cluster) {
    let t0 = Instant::now();
    loop {
        let s = status(c);
        let states: Vec<String> = s["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|v| v["replicas"].as_array().unwrap().clone())
            .map(|r| r["state"].as_str().unwrap().to_string())
            .collect();
        if states.iter().all(|s| s == "in-sync") {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "replicas not back in sync: {states:?}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The state of `node`'s replica of the first volume, as `status` shows it.
pub fn replica_state(c: &Cluster, node: u32) -> String {
    let s = status(c);
    s["volumes"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == node)
        .map(|r| r["state"].as_str().unwrap().to_string())
        .unwrap()
}

/// Waits (30 s at most) until `node`'s replica of the first volume is in state `want`.
pub fn wait_state(c: &Cluster, node: u32, want: &str) {
    let t0 = Instant::now();
    while replica_state(c, node) != want {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "node {node} never became {want}:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn start_bench(c: &Cluster, secs: u32) -> Child {
    Command::new(BIN)
        .arg("--data-dir")
        .arg(c.path())
        .args([
            "--output", "json", "bench", "--verify", "-b4K", "-w30", "-r", "-t2", "-o4",
        ])
        .arg(format!("-d{secs}"))
        .arg("-W0")
        .arg(&c.unix)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the bench and checks it saw no error and the oracle found nothing.
pub fn finish_bench(c: &Cluster, b: Child) -> serde_json::Value {
    // That it ran and was checked, not how fast: faults stall it, and CI's host is shared.
    check_workload(b, 200, &|| c.evidence())
}

/// Waits for a `bench --verify --output json` workload: it must succeed, its oracle must find
/// no lost, stale or corrupt block, and it must have checked more than `min_blocks`. `log`
/// says what the cluster logged, for a failure's message.
pub fn check_workload(b: Child, min_blocks: u64, log: &dyn Fn() -> String) -> serde_json::Value {
    // The tests' workloads run for under a minute; two more drain what is in flight.
    let out = wait_within(b, Duration::from_secs(180), log);
    assert!(
        out.status.success(),
        "workload failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verify = &v["verify"];
    for k in ["lost", "stale", "corrupt"] {
        assert_eq!(verify[k].as_u64(), Some(0), "{k}: {verify}\n{}", log());
    }
    assert!(
        verify["blocks_checked"].as_u64().unwrap() > min_blocks,
        "{verify}"
    );
    v
}

/// Runs a command to completion; its stderr on failure.
pub fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A TCP port on 127.0.0.1 for a server that takes a port number, as etcd: claimed for this
/// process, so a test binary running beside this one cannot take it first
/// (`trireme_testkit::port`).
pub fn free_port() -> u16 {
    trireme_testkit::port()
}

/// Waits until `child`, a server told to listen on `port` of 127.0.0.1, accepts a connection.
/// Panics with its log if it exits first (a port taken from under it, say) or takes over
/// 60 s, so that a test fails instead of waiting on a server that is not there.
pub fn wait_listening(child: &mut std::process::Child, port: u16, log: &std::path::Path) {
    let said = || std::fs::read_to_string(log).unwrap_or_default();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "{} exited ({st}) before listening on {port}:\n{}",
                log.display(),
                said()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "nothing listens on {port} after 60 s:\n{}",
            said()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `what` in `path`.
pub fn wait_logged(path: &std::path::Path, what: &str) {
    let t0 = Instant::now();
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains(what) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{} does not say {what:?}:\n{log}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The address in a file a process wrote (`<data-dir>/http`, `node-N/http`).
pub fn addr_in(path: &Path) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_string();
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{} not written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server process a test started, killed when dropped.
#[derive(Debug)]
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A command's stdout and stderr together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `trireme ARGS` against `c`, which must succeed: what it printed.
pub fn ok(c: &Cluster, args: &[&str]) -> String {
    let o = c.cli(args);
    assert!(o.status.success(), "{args:?}: {}\n{}", text(&o), c.log());
    text(&o)
}

/// `trireme ARGS` against `c`, which must fail saying `says`.
pub fn refused(c: &Cluster, args: &[&str], says: &str) {
    let o = c.cli(args);
    assert!(!o.status.success(), "{args:?} succeeded: {}", text(&o));
    assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
}

/// The processes whose command line names `dir` or a path in it (`up --data-dir DIR`, its
/// nodes' `--dir DIR/node-N`).
fn processes_naming(dir: &std::path::Path) -> Vec<i32> {
    let dir = dir.as_os_str().as_encoded_bytes();
    let names = |c: &[u8]| {
        c.windows(dir.len() + 1)
            .any(|w| w.starts_with(dir) && matches!(w[dir.len()], b'/' | 0))
    };
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me)
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| names(&c)))
        .collect()
}
