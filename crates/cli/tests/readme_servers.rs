//! README's "Running on several servers", run as written: its block is read from README.md,
//! so a command changed there is the command tested here. Its hosts are network namespaces
//! on one bridge, at the README's own addresses (they exist only inside the namespaces):
//! three etcd members, four servers, the operator's machine and the client host. Once with
//! every link on TLS, as the block says, once without certificates, as the paragraph after
//! it says. Then what an operator meets next: a server killed under a verifying load and
//! started again with its command as written, but without `--zone`.
//!
//! What the test adds is what a person does between the lines: it starts etcd where the
//! block says to, runs a server's command on every server, copies what the comments call a
//! copy, and waits where a person waits (the servers up, the attach serving). Sizes are cut
//! by 100 (`100G` becomes `1G`) to fit a test machine's disk.

mod common;
mod readme_block;

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{Host, Net};
use common::{assert_tcp_for_want_of_rdma, output_within, BIN, CLI_LIMIT};
use readme_block::*;

const SERVERS: u32 = 4;
const ETCD_MEMBERS: u32 = 3;

#[test]
fn the_multi_server_recipe_works_as_written_with_tls() {
    run_readme(true);
}

#[test]
fn the_multi_server_recipe_works_as_written_without_certificates() {
    run_readme(false);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The processes the test started, killed before the namespaces go.
struct Procs(Vec<(String, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The hosts, what runs on them, and each role's environment (its `export`s).
struct World {
    procs: Procs,
    _net: Net,
    hosts: HashMap<String, Host>,
    root: tempfile::TempDir,
    tls: bool,
    env: HashMap<Role, Vec<(String, String)>>,
    /// Every server's command line, as run (for a restart).
    server_cmds: HashMap<u32, Vec<String>>,
    /// What each command of the block printed, in order.
    transcript: Vec<(String, String)>,
    logs: u32,
}

impl World {
    fn new(tls: bool) -> World {
        let mut net = Net::tagged(if tls { "t" } else { "p" });
        assert!(
            net.on,
            "this test needs network namespaces (root and iproute2); TRIREME_SKIP_NETNS=1 skips it"
        );
        let mut hosts = HashMap::new();
        let mut add = |name: String, ip: String| {
            let h = net.host_at(&name, &ip, 8);
            hosts.insert(name, h);
        };
        for i in 1..=ETCD_MEMBERS {
            add(format!("e{i}"), format!("10.0.0.{i}"));
        }
        for i in 1..=SERVERS {
            add(format!("s{i}"), format!("10.0.1.{}", 10 + i));
        }
        add("c".into(), "10.0.2.21".into());
        add("op".into(), "10.0.3.1".into());
        let root = tempfile::tempdir().unwrap();
        for h in hosts.keys() {
            std::fs::create_dir_all(root.path().join(h)).unwrap();
        }
        std::fs::create_dir_all(root.path().join("logs")).unwrap();
        World {
            procs: Procs(Vec::new()),
            _net: net,
            hosts,
            root,
            tls,
            env: HashMap::new(),
            server_cmds: HashMap::new(),
            transcript: Vec::new(),
            logs: 0,
        }
    }

    fn dir(&self, host: &str) -> PathBuf {
        self.root.path().join(host)
    }

    /// The last lines of every log, for a failure's message.
    fn log(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<PathBuf> = std::fs::read_dir(self.root.path().join("logs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        names.sort();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            out += &format!("--- {}\n", p.display());
            for l in tail.into_iter().rev() {
                out += l;
                out += "\n";
            }
        }
        out
    }

    fn new_log(&mut self, host: &str, what: &str) -> std::fs::File {
        self.logs += 1;
        let p = self
            .root
            .path()
            .join("logs")
            .join(format!("{:02}-{host}-{what}.log", self.logs));
        std::fs::File::create(p).unwrap()
    }

    /// `prog ARGS` on `host`, in its directory, with `role`'s environment and nothing of
    /// this process's trireme or UCX settings.
    fn command(&self, host: &str, role: Role, w: &[String]) -> Command {
        let prog = if w[0] == "trireme" { BIN } else { &w[0] };
        let mut c = self.hosts[host].cmd(prog);
        c.args(&w[1..]).current_dir(self.dir(host));
        for (k, _) in std::env::vars() {
            if k.starts_with("TRIREME_") || k.starts_with("UCX_") {
                c.env_remove(k);
            }
        }
        for (k, v) in self.env.get(&role).into_iter().flatten() {
            c.env(k, v);
        }
        c
    }

    /// A line of the block, run by `role` on `host`: paths mapped into the host's directory,
    /// sizes scaled, the plain variant's changes made, copies made.
    fn run_line(&mut self, line: &Line, host: &str, text: &str, comment: &str) {
        let d = self.dir(host).display().to_string();
        let text = text
            .replace("/etc/trireme", &format!("{d}/etc/trireme"))
            .replace("/srv/trireme", &format!("{d}/srv/trireme"))
            .replace("/run/trireme", &format!("{d}/run/trireme"));
        let mut w: Vec<String> = words(&text).into_iter().map(scaled).collect();
        if !self.tls {
            match without_certificates(w) {
                Some(x) => w = x,
                None => return,
            }
        }
        let background = w.last().is_some_and(|l| l == "&");
        if background {
            w.pop();
        }
        if self.tls {
            if let Some(src) = comment.trim().strip_prefix("a copy of ./") {
                let etc = format!("{d}/etc/");
                let dest = w
                    .iter()
                    .find_map(|a| a.find(&etc).map(|k| a[k..].split('?').next().unwrap()))
                    .unwrap_or_else(|| panic!("{text:?}: a copy of what, to where?"));
                copy_dir(&self.dir("op").join(src), Path::new(dest));
            }
        }
        match w[0].as_str() {
            "export" => {
                let (k, v) = w[1].split_once('=').expect("export NAME=VALUE");
                let roles: &[Role] = if line.every_host {
                    &[Role::Operator, Role::Server, Role::Client]
                } else {
                    std::slice::from_ref(&line.role)
                };
                for r in roles {
                    let e = self.env.entry(*r).or_default();
                    e.retain(|(name, _)| name != k);
                    e.push((k.to_string(), v.to_string()));
                }
            }
            "trireme" | "mkdir" | "qemu-img" | "nbdinfo" => {
                let daemon = w.len() > 2 && w[1] == "node" && w[2] == "run";
                if daemon || background {
                    self.spawn(host, line.role, &w);
                } else {
                    let out =
                        output_within(&mut self.command(host, line.role, &w), CLI_LIMIT, &|| {
                            self.log()
                        });
                    assert!(
                        out.status.success(),
                        "README command {w:?} on {host} failed ({}):\n{}\n{}\n{}",
                        out.status,
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr),
                        self.log()
                    );
                    eprintln!("ok on {host}: {}", w.join(" "));
                    self.transcript.push((
                        w.join(" "),
                        String::from_utf8_lossy(&out.stdout).into_owned(),
                    ));
                }
            }
            other => panic!("README block runs {other:?}, which this test does not know"),
        }
    }

    /// A daemon (`node run`) or a line that ends in `&` (an attach, which serves once it
    /// prints its URIs).
    fn spawn(&mut self, host: &str, role: Role, w: &[String]) {
        let log = self.new_log(host, &w[1]);
        let mut child = self
            .command(host, role, w)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        if w[1] == "attach" {
            let first = rx.recv_timeout(Duration::from_secs(60));
            assert!(
                first.is_ok(),
                "attach did not serve within 60 s:\n{}",
                self.log()
            );
            eprintln!("serving on {host}: {}", first.unwrap());
        }
        if w.len() > 2 && w[1] == "node" && w[2] == "run" {
            let id: u32 = w[w.iter().position(|a| a == "--id").unwrap() + 1]
                .parse()
                .unwrap();
            self.server_cmds.insert(id, w.to_vec());
        }
        self.procs.0.push((host.to_string(), child));
    }

    fn start_etcd(&mut self) {
        let scheme = if self.tls { "https" } else { "http" };
        let cluster: Vec<String> = (1..=ETCD_MEMBERS)
            .map(|i| format!("e{i}=http://10.0.0.{i}:2380"))
            .collect();
        for i in 1..=ETCD_MEMBERS {
            let ip = format!("10.0.0.{i}");
            let mut args = vec![
                format!("--name=e{i}"),
                format!(
                    "--data-dir={}",
                    self.dir(&format!("e{i}")).join("data").display()
                ),
                format!("--listen-client-urls={scheme}://{ip}:2379"),
                format!("--advertise-client-urls={scheme}://{ip}:2379"),
                format!("--listen-peer-urls=http://{ip}:2380"),
                format!("--initial-advertise-peer-urls=http://{ip}:2380"),
                format!("--initial-cluster={}", cluster.join(",")),
                "--initial-cluster-state=new".into(),
                "--heartbeat-interval=100".into(),
                "--election-timeout=1000".into(),
                "--log-level=warn".into(),
            ];
            if self.tls {
                // Its certificate is the operator's ./etcd-N (a copy, on a real member).
                let certs = self.dir("op").join(format!("etcd-{i}"));
                args.push(format!(
                    "--cert-file={}",
                    certs.join("server-cert.pem").display()
                ));
                args.push(format!(
                    "--key-file={}",
                    certs.join("server-key.pem").display()
                ));
                args.push(format!(
                    "--trusted-ca-file={}",
                    certs.join("ca-cert.pem").display()
                ));
                args.push("--client-cert-auth".into());
                // The CA's revocation list (a copy of the operator's ./ca/crl.pem).
                args.push(format!(
                    "--client-crl-file={}",
                    self.dir("op").join("ca").join("crl.pem").display()
                ));
            }
            // The README's bounded history.
            args.extend(
                [
                    "--auto-compaction-mode=periodic",
                    "--auto-compaction-retention=1h",
                    "--quota-backend-bytes=8589934592",
                ]
                .map(String::from),
            );
            let log = self.new_log(&format!("e{i}"), "etcd");
            let child = self.hosts[&format!("e{i}")]
                .cmd("etcd")
                .args(&args)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("etcd must be installed (apt-get install etcd-server)");
            self.procs.0.push((format!("e{i}"), child));
        }
        // A person waits for etcd to elect a leader before using it.
        let eps: Vec<String> = (1..=ETCD_MEMBERS)
            .map(|i| format!("{scheme}://10.0.0.{i}:2379"))
            .collect();
        let mut args = vec![format!("--endpoints={}", eps.join(","))];
        if self.tls {
            let a = self.dir("op").join("admin");
            args.push(format!("--cacert={}", a.join("ca-cert.pem").display()));
            args.push(format!("--cert={}", a.join("admin-cert.pem").display()));
            args.push(format!("--key={}", a.join("admin-key.pem").display()));
        }
        args.extend(["endpoint".into(), "health".into()]);
        self.wait(Duration::from_secs(30), "etcd healthy", |w| {
            w.hosts["op"]
                .cmd("etcdctl")
                .args(&args)
                .env("ETCDCTL_API", "3")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    }

    fn wait(&self, limit: Duration, what: &str, mut f: impl FnMut(&World) -> bool) {
        let t0 = Instant::now();
        while !f(self) {
            assert!(
                t0.elapsed() < limit,
                "{what}: not within {limit:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// `trireme --output json ARGS` as the operator (the test's own look, not a README line).
    fn admin_argv(&self, args: &[&str]) -> Vec<String> {
        let mut w: Vec<String> = vec!["trireme".into(), "--output".into(), "json".into()];
        if self.tls {
            w.push("--tls-identity".into());
            w.push(self.dir("op").join("admin").display().to_string());
        }
        w.extend(args.iter().map(|a| a.to_string()));
        w
    }

    fn admin_json(&self, args: &[&str]) -> serde_json::Value {
        let w = self.admin_argv(args);
        let out = output_within(
            &mut self.command("op", Role::Operator, &w),
            CLI_LIMIT,
            &|| self.log(),
        );
        assert!(
            out.status.success(),
            "{w:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn try_admin_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let w = self.admin_argv(args);
        let out = self.command("op", Role::Operator, &w).output().ok()?;
        match out.status.success() {
            true => serde_json::from_slice(&out.stdout).ok(),
            false => None,
        }
    }

    /// What `status` shows of volume db1.
    fn db1_status(&self) -> serde_json::Value {
        let s = self.admin_json(&["status"]);
        s["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "db1")
            .cloned()
            .unwrap_or_else(|| panic!("no db1 in status: {s}"))
    }

    fn nodes_up(&self) -> usize {
        self.try_admin_json(&["node", "list"])
            .and_then(|v| v.as_array().cloned())
            .map_or(0, |ns| ns.iter().filter(|n| n["up"] == true).count())
    }

    fn replicas(&self) -> Vec<serde_json::Value> {
        self.admin_json(&["volume", "info", "db1"])["replicas"]
            .as_array()
            .unwrap()
            .clone()
    }

    fn all_in_sync(&self) -> bool {
        self.try_admin_json(&["volume", "info", "db1"])
            .and_then(|v| v["replicas"].as_array().cloned())
            .is_some_and(|r| r.len() == 3 && r.iter().all(|r| r["state"] == "in-sync"))
    }

    fn sock(&self) -> String {
        format!("{}/run/trireme/db1.sock", self.dir("c").display())
    }
}

fn run_readme(tls: bool) {
    if std::env::var_os("TRIREME_SKIP_NETNS").is_some()
        || std::env::var_os("TRIREME_SKIP_ETCD").is_some()
    {
        eprintln!("TRIREME_SKIP_NETNS or TRIREME_SKIP_ETCD is set: skipping");
        return;
    }
    common::need("etcd");
    common::need("qemu-img");
    common::need("nbdinfo");
    let steps = readme_block();
    let mut w = World::new(tls);
    let mut saw = HashMap::new();
    for step in &steps {
        let line = match step {
            Step::StartEtcd => {
                w.start_etcd();
                continue;
            }
            Step::Cmd(l) => l,
        };
        *saw.entry(line.role).or_insert(0) += 1;
        match line.role {
            Role::Server => {
                for i in 1..=SERVERS {
                    let (t, c) = (for_server(&line.text, i), for_server(&line.comment, i));
                    w.run_line(line, &format!("s{i}"), &t, &c);
                }
                if line.text.contains("node run") {
                    // A person waits until every server is up.
                    w.wait(Duration::from_secs(60), "every server up", |w| {
                        w.nodes_up() == SERVERS as usize
                    });
                }
            }
            Role::Client => w.run_line(line, "c", &line.text, &line.comment),
            Role::Operator => {
                let copies: Vec<(String, String)> = if line.comment.contains("one per etcd member")
                {
                    (1..=ETCD_MEMBERS)
                        .map(|i| (for_etcd_member(&line.text, i), String::new()))
                        .collect()
                } else if line.comment.contains("one per server") {
                    (1..=SERVERS)
                        .map(|i| (for_server(&line.text, i), String::new()))
                        .collect()
                } else {
                    vec![(line.text.clone(), line.comment.clone())]
                };
                for (t, c) in copies {
                    w.run_line(line, "op", &t, &c);
                }
            }
        }
    }
    assert!(
        saw.len() == 3 && steps.iter().any(|s| matches!(s, Step::StartEtcd)),
        "the README block no longer has an operator's, a server's and a client host's part, \
         and a place for etcd: {steps:?}"
    );

    // What the block promised. Every server up, with the zone it was given.
    let nodes = w.admin_json(&["node", "list"]);
    for i in 1..=SERVERS {
        let n = nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == i)
            .unwrap_or_else(|| panic!("no node {i}: {nodes}"));
        assert_eq!(n["up"], true, "{nodes}");
        let zone = format!("rack-{}", (b'a' + (i - 1) as u8) as char);
        assert_eq!(n["zone"], zone.as_str(), "{nodes}");
    }
    // Node 3 held a copy, and the drain moved it; the resize went through the writer on the client host,
    // and a new NBD connection sees it.
    let info = &w
        .transcript
        .iter()
        .find(|(c, _)| c.ends_with("volume info db1"))
        .expect("the block shows the volume")
        .1;
    let before: serde_json::Value = serde_json::from_str(info).unwrap();
    assert!(
        before["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["node"] == 3),
        "node 3 held no copy to drain: {before}"
    );
    let reps = w.replicas();
    assert_eq!(reps.len(), 3, "{reps:?}");
    assert!(reps.iter().all(|r| r["node"] != 3), "{reps:?}");
    w.wait(Duration::from_secs(30), "every copy in sync", |w| {
        w.all_in_sync()
    });
    let size = w.admin_json(&["volume", "info", "db1"])["size"].clone();
    assert_eq!(size, 2u64 << 30, "resized to 200G / 100");
    // The snapshot was taken by the writer on the client host, on the three copies it had.
    let snaps = w.admin_json(&["volume", "snapshot", "list", "db1"]);
    assert_eq!(snaps[0]["name"], "nightly", "{snaps}");
    assert_eq!(snaps[0]["state"], "ready", "{snaps}");
    // Taken before the resize, it keeps the size the writer had then (which the writer on the
    // client host said through etcd).
    assert_eq!(snaps[0]["size"], 1u64 << 30, "100G / 100: {snaps}");
    // Taken on three copies; the drain then moved node 3's copy, and the snapshot with it
    // (the writer on the client host gave the new copy the snapshot before its resync):
    // three nodes hold it, none of them node 3, none lost.
    let kept = snaps[0]["nodes"].as_array().unwrap();
    assert_eq!(kept.len(), 3, "{snaps}");
    assert!(kept.iter().all(|n| n != 3), "{snaps}");
    assert!(snaps[0].get("lost").is_none(), "{snaps}");
    // The client host served it read-only beside the running writer.
    let info = &w
        .transcript
        .iter()
        .find(|(c, _)| c.starts_with("nbdinfo") && c.contains("db1@nightly"))
        .expect("the block reads the snapshot")
        .1;
    assert!(info.contains("is_read_only: true"), "{info}");
    // At its own size: taken before the resize to 200G / 100.
    assert!(info.contains("export-size: 1073741824"), "{info}");
    // The backup ran from the operator's machine, read the snapshot's blocks from the copies,
    // and its chain became a new volume; the client host read what changed since `nightly`.
    let said = |what: &str| {
        w.transcript
            .iter()
            .find(|(c, _)| c.contains(what))
            .unwrap_or_else(|| panic!("the block runs {what}"))
            .1
            .clone()
    };
    // Two backups, the second across the resize: incremental still, and the restore resized
    // the new volume between them (through the writer it attached on etcd).
    let backups: Vec<&String> = w
        .transcript
        .iter()
        .filter(|(c, _)| c.contains("volume backup db1"))
        .map(|(_, out)| out)
        .collect();
    assert_eq!(backups.len(), 2, "{backups:?}");
    assert!(backups[0].contains("(full"), "{}", backups[0]);
    assert!(backups[1].contains("(incremental since"), "{}", backups[1]);
    let r = said("volume restore");
    assert!(r.contains("restored db1-copy from 2 backup(s)"), "{r}");
    let copy = w.admin_json(&["volume", "info", "db1-copy"]);
    assert_eq!(
        copy["size"],
        2u64 << 30,
        "the backup was taken at 200G / 100: {copy}"
    );
    // The clone was made on the servers holding the snapshot, moved off node 3 with db1 (its
    // copy there took its blocks first), and reads what the snapshot holds.
    let clone = w.admin_json(&["volume", "info", "db1-test"]);
    assert_eq!(clone["parent"]["snapshot"], "nightly", "{clone}");
    assert_eq!(
        clone["size"],
        1u64 << 30,
        "as large as the snapshot: {clone}"
    );
    assert!(
        clone["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["node"] != 3),
        "{clone}"
    );
    let same = said("qemu-img compare");
    assert!(same.contains("Images are identical"), "{same}");
    let m = said("qemu:dirty-bitmap:nightly");
    assert!(m.contains("clean"), "{m}");
    let uri = format!("nbd+unix:///db1?socket={}", w.sock());
    let out = output_within(
        &mut w.command(
            "c",
            Role::Client,
            &["nbdinfo".into(), "--size".into(), uri.clone()],
        ),
        CLI_LIMIT,
        &|| w.log(),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2147483648");
    // The default transport: the writer on the client host reaches every copy over trireme's
    // TCP, nothing set: no RDMA here, and UCX's tcp lanes carry no TLS (`ucx::DEFAULT_TLS`).
    // (`status` shows what the writer last reported.)
    w.wait(
        Duration::from_secs(20),
        "the writer's report after the move",
        |w| {
            let links = w.db1_status()["client_links"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            links.len() == 3 && links.iter().all(|l| l["node"] != 3)
        },
    );
    let vol = w.db1_status();
    for l in vol["client_links"].as_array().unwrap() {
        assert_tcp_for_want_of_rdma(l, &vol);
    }

    // A server killed under a verifying load, and started again as it was, but without its
    // --zone: I/O goes on, the copy resyncs, the zone stays on record.
    let victim = reps[0]["node"].as_u64().unwrap() as u32;
    let bench = w
        .command(
            "c",
            Role::Client,
            &[
                "trireme".into(),
                "--output".into(),
                "json".into(),
                "bench".into(),
                "--verify".into(),
                "-b4K".into(),
                "-w40".into(),
                "-r".into(),
                "-t2".into(),
                "-o4".into(),
                "-d20".into(),
                "-W0".into(),
                uri,
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let host = format!("s{victim}");
    let k = w
        .procs
        .0
        .iter()
        .rposition(|(h, _)| *h == host)
        .expect("the server's daemon");
    let (_, mut dead) = w.procs.0.remove(k);
    let _ = dead.kill();
    let _ = dead.wait();
    std::thread::sleep(Duration::from_secs(3));
    let mut again = w.server_cmds[&victim].clone();
    let z = again.iter().position(|a| a == "--zone").unwrap();
    again.drain(z..z + 2);
    w.spawn(&host, Role::Server, &again);
    let v = common::check_workload(bench, 500, &|| w.log());
    assert_eq!(v["errors"].as_u64().unwrap_or(0), 0, "{v}");
    w.wait(Duration::from_secs(60), "the copy back in sync", |w| {
        w.nodes_up() == SERVERS as usize && w.all_in_sync()
    });
    let nodes = w.admin_json(&["node", "list"]);
    let n = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == victim)
        .unwrap();
    let zone = format!("rack-{}", (b'a' + (victim - 1) as u8) as char);
    assert_eq!(
        n["zone"],
        zone.as_str(),
        "a restart without --zone keeps it: {nodes}"
    );
}
