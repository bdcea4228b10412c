//! Nodes of `trireme up` in network namespaces of their own, on veth pairs to this host: a
//! node there stands for another server (no shared memory, no same-host socket), and iptables
//! cuts what a test wants cut.

use super::*;

/// Network namespaces for nodes, one per node, each joined to this namespace by a veth pair
/// (`10.NET.N.1` here, `10.NET.N.2` inside), with iptables rules that cut one off. Everything
/// is undone on drop.
pub struct Netns {
    /// Second octet of this set's addresses (`10.NET.N.x`): distinct for every set alive on
    /// this host, in this binary or another (two alike would route to each other's namespaces:
    /// `ucx_fallback.rs` makes four, and its first and fourth once ran together with the same
    /// addresses). Held by a lock on a file of its own until the set is dropped.
    pub net: u32,
    pub names: Vec<String>,
    veths: Vec<String>,
    rules: Vec<Vec<String>>,
    /// The lock that holds `net` (released last, after the veths are gone).
    _claim: std::fs::File,
}

/// The second octets sets may take: 10.200.0.0 to 10.251.255.255.
const NETS: std::ops::RangeInclusive<u32> = 200..=251;

/// A second octet no other set on this host holds and no address here uses, with the lock
/// that holds it: `flock` on `trireme-net-NET` in the temporary directory, which the kernel
/// lets go when the holder exits, even by kill -9.
fn claim_net() -> (u32, std::fs::File) {
    let span = NETS.end() - NETS.start() + 1;
    let first = std::process::id() % span;
    for k in 0..span {
        let net = NETS.start() + (first + k) % span;
        let Some(f) = trireme_testkit::lock(&format!("net-{net}")) else {
            continue;
        };
        // A set a killed run left behind keeps its addresses without its lock.
        let used = Command::new("ip")
            .args(["-o", "addr", "show", "to", &format!("10.{net}.0.0/16")])
            .output()
            .map(|o| !o.stdout.is_empty())
            .unwrap_or(false);
        if !used {
            return (net, f);
        }
    }
    panic!("no free 10.NET.0.0/16 for network namespaces ({NETS:?}): all held or in use");
}

impl Netns {
    pub fn create(n: u32) -> Netns {
        static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{}{k}", pid % 10_000);
        let (net, claim) = claim_net();
        let mut ns = Netns {
            net,
            names: Vec::new(),
            veths: Vec::new(),
            rules: Vec::new(),
            _claim: claim,
        };
        for i in 1..=n {
            let name = format!("trireme-t{tag}-n{i}");
            let veth = format!("trt{tag}v{i}");
            let host = format!("10.{net}.{i}.1/24");
            let inner = format!("10.{net}.{i}.2/24");
            let steps: Vec<Vec<&str>> = vec![
                vec!["ip", "netns", "add", &name],
                vec![
                    "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
                    &name,
                ],
                vec!["ip", "addr", "add", &host, "dev", &veth],
                vec!["ip", "link", "set", &veth, "up"],
                vec!["ip", "-n", &name, "addr", "add", &inner, "dev", "eth0"],
                vec!["ip", "-n", &name, "link", "set", "eth0", "up"],
                vec!["ip", "-n", &name, "link", "set", "lo", "up"],
            ];
            for (k, s) in steps.iter().enumerate() {
                if let Err(e) = sh(s) {
                    panic!("creating network namespaces needs root and iproute2 (set TRIREME_SKIP_NETNS=1 to skip this test): {e}");
                }
                if k == 0 {
                    ns.names.push(name.clone());
                }
                if k == 1 {
                    ns.veths.push(veth.clone());
                }
            }
        }
        ns
    }

    pub fn addr(&self, i: u32) -> String {
        format!("10.{}.{i}.2", self.net)
    }

    /// `trireme up ARGS` with node N in namespace N.
    pub fn cluster(&self, args: &[&str]) -> Cluster {
        self.cluster_env(args, &[])
    }

    /// As [`Netns::cluster`], with `env` set for `trireme up` and its nodes.
    pub fn cluster_env(&self, args: &[&str], env: &[(&str, &str)]) -> Cluster {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        for (k, name) in self.names.iter().enumerate() {
            all.push("--node-netns".into());
            all.push(format!("{name}@{}", self.addr(k as u32 + 1)));
        }
        let argv: Vec<&str> = all.iter().map(String::as_str).collect();
        Cluster::start_env(tempfile::tempdir().unwrap(), &argv, env)
    }

    /// Drops every packet to and from node `i`'s namespace.
    pub fn partition(&mut self, i: u32) {
        let a = self.addr(i);
        for rule in [
            vec!["OUTPUT", "-d", &a, "-j", "DROP"],
            vec!["INPUT", "-s", &a, "-j", "DROP"],
        ] {
            let mut args = vec!["iptables", "-I"];
            args.extend(rule.iter().copied());
            sh(&args).unwrap_or_else(|e| panic!("iptables is needed: {e}"));
            self.rules
                .push(rule.iter().map(|s| s.to_string()).collect());
        }
    }

    /// Drops every TCP packet between this namespace and node `i` but those of its node port
    /// `port`: the node's UCX lanes stop carrying anything, its TCP link goes on.
    pub fn cut_all_but_port(&mut self, i: u32, port: u16) {
        let a = self.addr(i);
        let p = port.to_string();
        for rule in [
            vec![
                "OUTPUT", "-d", &a, "-p", "tcp", "!", "--dport", &p, "-j", "DROP",
            ],
            vec![
                "INPUT", "-s", &a, "-p", "tcp", "!", "--sport", &p, "-j", "DROP",
            ],
        ] {
            let mut args = vec!["iptables", "-I"];
            args.extend(rule.iter().copied());
            sh(&args).unwrap_or_else(|e| panic!("iptables is needed: {e}"));
            self.rules
                .push(rule.iter().map(|s| s.to_string()).collect());
        }
    }

    pub fn heal(&mut self) {
        for rule in self.rules.drain(..) {
            let mut args = vec!["iptables", "-D"];
            args.extend(rule.iter().map(String::as_str));
            let _ = sh(&args);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.heal();
        for v in &self.veths {
            let _ = sh(&["ip", "link", "del", v]);
        }
        for n in &self.names {
            let _ = sh(&["ip", "netns", "del", n]);
        }
    }
}

/// One host of the test: a network namespace and its address, or 127.0.0.1.
#[derive(Debug, Clone)]
pub struct Host {
    pub ns: Option<String>,
    pub ip: String,
}

impl Host {
    /// `prog` run on this host.
    pub fn cmd(&self, prog: &str) -> Command {
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
    pub fn cut(&self, on: bool) {
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

/// The test's hosts. In namespaces `tr<pid><tag>-<name>`, joined by bridge `br0` in
/// namespace `tr<pid><tag>-sw` (one network of their own: its addresses exist nowhere else);
/// all are deleted on drop (with whatever still runs in them).
pub struct Net {
    pub prefix: String,
    pub names: Vec<String>,
    pub on: bool,
}

impl Net {
    pub fn new() -> Net {
        Net::tagged("")
    }

    /// A network of its own for each `tag` a test binary uses (tests run at once).
    pub fn tagged(tag: &str) -> Net {
        let prefix = format!("tr{}{tag}", std::process::id() % 100_000);
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
    pub fn host(&mut self, name: &str, k: u8) -> Host {
        if !self.on {
            return Host {
                ns: None,
                ip: "127.0.0.1".into(),
            };
        }
        self.host_at(name, &format!("10.78.0.{k}"), 24)
    }

    /// A new host `name` at `ip`, on a network of `prefix_len` bits.
    pub fn host_at(&mut self, name: &str, ip: &str, prefix_len: u8) -> Host {
        assert!(self.on, "no network namespaces here");
        let ns = format!("{}-{name}", self.prefix);
        let sw = format!("{}-sw", self.prefix);
        let veth = format!("v{name}");
        let ip = ip.to_string();
        let cidr = format!("{ip}/{prefix_len}");
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
