//! Nodes of `trireme up` in network namespaces of their own, on veth pairs to this host: a
//! node there stands for another server (no shared memory, no same-host socket), and iptables
//! cuts what a test wants cut.

use super::*;

/// Network namespaces for nodes, one per node, each joined to this namespace by a veth pair
/// (`10.NET.N.1` here, `10.NET.N.2` inside), with iptables rules that cut one off. Everything
/// is undone on drop.
pub struct Netns {
    /// Second octet of this set's addresses (`10.NET.N.x`): distinct for each set a test
    /// binary creates, and likely distinct between binaries running at once.
    pub net: u32,
    pub names: Vec<String>,
    veths: Vec<String>,
    rules: Vec<Vec<String>>,
}

impl Netns {
    pub fn create(n: u32) -> Netns {
        static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{}{k}", pid % 10_000);
        let net = 200 + (pid % 25) * 2 + k % 2;
        let mut ns = Netns {
            net,
            names: Vec::new(),
            veths: Vec::new(),
            rules: Vec::new(),
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
