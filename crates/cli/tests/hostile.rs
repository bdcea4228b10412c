//! Hostile peers with real processes: clients the access list does not name, and peers that
//! try to pin memory (stalled payloads, unread NBD replies, replicas past capacity, huge
//! write-zeroes). Each is refused or bounded with a clear log line, other clients carry on,
//! and nothing is lost.

mod common;
use common::*;
use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

fn ok(c: &Cluster, args: &[&str]) -> String {
    let out = c.cli(args);
    assert!(
        out.status.success(),
        "trireme {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A client certificate for `name`, issued by `up`'s CA: its directory.
fn issue_client(c: &Cluster, name: &str) -> std::path::PathBuf {
    let dir = c.path().join(name);
    ok(
        c,
        &[
            "ca",
            "issue",
            "client",
            name,
            "--out",
            dir.to_str().unwrap(),
        ],
    );
    dir
}

fn nbdinfo_ok(uri: &str) -> bool {
    Command::new("nbdinfo")
        .arg(uri)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn the_access_list_decides_which_clients_reach_a_volume() {
    need("nbdinfo");
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    let bob = issue_client(&c, "bob");
    let addr = c.tcp_addr();
    let as_bob = format!("nbds://{addr}/vol0?tls-certificates={}", bob.display());
    // A new volume is open to its creator only: here `local`, the credentials `up` wrote.
    assert!(
        !nbdinfo_ok(&as_bob),
        "bob reached a volume nobody opened to him"
    );
    assert!(nbdinfo_ok(&c.tcp), "the creator's client is refused");
    assert_eq!(
        status(&c)["volumes"][0]["access"],
        serde_json::json!(["local"])
    );
    // Opened to bob, he gets in; closed again, he is out: at once, the change applied to
    // `up`'s NBD server before the command returned (it took about a second: issue 63).
    ok(&c, &["volume", "access", "vol0", "--allow", "bob"]);
    assert!(nbdinfo_ok(&as_bob), "bob is still refused");
    let v: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &[
            "--output", "json", "volume", "access", "vol0", "--deny", "bob",
        ],
    ))
    .unwrap();
    assert_eq!(v["access"], serde_json::json!(["local"]));
    assert!(!nbdinfo_ok(&as_bob), "bob still gets in");
    wait_logged(&c.path().join("up.log"), "not on the volume's access list");
    assert!(nbdinfo_ok(&c.tcp), "the allowed client is refused");
    assert_eq!(
        status(&c)["volumes"][0]["access"],
        serde_json::json!(["local"])
    );
    assert!(ok(&c, &["status"]).contains("access: local"));
    let info = ok(&c, &["volume", "info", "vol0"]);
    assert!(
        info.contains("attached by this cluster's process"),
        "{info}"
    );

    // Bob's certificate at a node's TCP port: a client may not delete a replica, nor read one
    // it is not allowed (nodes of `up` know no client: only the cluster's own identities).
    need("openssl");
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    let node = nl[0]["addr"].as_str().unwrap().to_string();
    let vid = status(&c)["volumes"][0]["id"].as_u64().unwrap();
    let frame = |op: trireme_proto::Op, id: u64| {
        trireme_proto::Header {
            volume: vid,
            length: 4096,
            ..trireme_proto::Header::request(op, id)
        }
        .encode(&[])
    };
    let mut frames = frame(trireme_proto::Op::DeleteReplica, 1).to_vec();
    frames.extend_from_slice(&frame(trireme_proto::Op::Checksum, 2));
    let answers = common::tls_exchange(&node, &bob, &frames);
    let mut statuses = Vec::new();
    let mut rest = &answers[..];
    while let Ok(h) = trireme_proto::decode_header(rest.get(..64).unwrap_or_default()) {
        statuses.push(h.status as u32);
        rest = rest.get(64 + h.payload_len as usize..).unwrap_or_default();
    }
    let denied = trireme_proto::Status::Denied as u32;
    assert!(
        statuses.iter().filter(|&&s| s == denied).count() == 2,
        "answers {statuses:?}"
    );
    // Both are refused (the statuses above); the log says so once a second at most, so only
    // the first of two refusals in a row is there.
    wait_logged(
        &c.path().join("node-1.log"),
        "client bob may not DeleteReplica",
    );

    // A node certificate of `up`'s CA for an id `up` does not run (node 9) is no member: the
    // nodes refuse it everything.
    let n9 = c.path().join("n9");
    ok(
        &c,
        &["ca", "issue", "node", "9", "--out", n9.to_str().unwrap()],
    );
    for (from, to) in [
        ("node-cert.pem", "client-cert.pem"),
        ("node-key.pem", "client-key.pem"),
    ] {
        std::fs::copy(n9.join(from), n9.join(to)).unwrap();
    }
    let answers = common::tls_exchange(&node, &n9, &frames);
    let mut rest = &answers[..];
    let mut n9_statuses = Vec::new();
    while let Ok(h) = trireme_proto::decode_header(rest.get(..64).unwrap_or_default()) {
        n9_statuses.push(h.status as u32);
        rest = rest.get(64 + h.payload_len as usize..).unwrap_or_default();
    }
    assert_eq!(n9_statuses, vec![denied, denied], "node 9's answers");
    wait_logged(
        &c.path().join("node-1.log"),
        "node 9 is not a member of the cluster",
    );

    // The manager's heartbeats reuse their links: no connection piles up at a node (each
    // ping used to leave a TLS connection open on both ends).
    let port: u16 = node.rsplit(':').next().unwrap().parse().unwrap();
    let before = established_at(port);
    std::thread::sleep(Duration::from_secs(3));
    let after = established_at(port);
    assert!(
        after <= before + 1,
        "node 1's connections grew from {before} to {after}"
    );

    // Nothing of that touched the volume.
    assert_all_nodes_up(&c);
    assert_replicas_identical(&c, "vol0");
}

/// Established TCP connections whose local port is `port` (the server ends at a listener).
fn established_at(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    tcp.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[3] == "01"
                && f[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        })
        .count()
}

/// Resident memory of a process, in bytes.
fn rss(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// An NBD client on the unix socket, past the handshake (fixed newstyle, no zeroes).
fn nbd_session(c: &Cluster) -> std::os::unix::net::UnixStream {
    let mut s = std::os::unix::net::UnixStream::connect(c.path().join("nbd.sock")).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&4u32.to_be_bytes());
    opt.extend_from_slice(b"vol0");
    s.write_all(&opt).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    s
}

#[test]
fn hostile_peers_stay_within_bounds() {
    need("nbdinfo");
    need("nbdcopy");
    let mb = 1u64 << 20;
    let c = Cluster::start(&[
        "--store",
        "memory",
        "--size",
        "64M",
        "--node-capacity",
        "256M",
        "--insecure",
    ]);
    let src = c.path().join("src.img");
    random_file(&src, 8 << 20, 5);
    run(Command::new("nbdcopy").arg(&src).arg(&c.unix));
    let up = c.child.as_ref().unwrap().id() as i32;
    let n1 = node_pid(&c, 1);
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    let n1_addr = nl[0]["addr"].as_str().unwrap().to_string();
    let (up0, n10) = (rss(up), rss(n1));

    // 100 connections announce a 32 MiB write to node 1, send 4 KiB of it, and stall.
    let header = {
        let payload = vec![0u8; trireme_proto::MAX_PAYLOAD as usize];
        let h = trireme_proto::Header {
            volume: 1,
            epoch: 1,
            ..trireme_proto::Header::request(trireme_proto::Op::Write, 1)
        };
        h.encode(&payload)
    };
    let stalled: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&n1_addr).unwrap();
            s.write_all(&header).unwrap();
            s.write_all(&[0u8; 4096]).unwrap();
            s
        })
        .collect();
    // 100 reads of 32 MiB on one NBD connection whose replies are never read.
    let mut greedy = nbd_session(&c);
    for i in 0..100u64 {
        let mut r = Vec::with_capacity(28);
        r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
        r.extend_from_slice(&i.to_be_bytes());
        r.extend_from_slice(&0u64.to_be_bytes());
        r.extend_from_slice(&(32u32 << 20).to_be_bytes());
        greedy.write_all(&r).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    let (up1, n11) = (rss(up), rss(n1));
    println!(
        "RSS: up {} -> {} MiB, node 1 {} -> {} MiB",
        up0 / mb,
        up1 / mb,
        n10 / mb,
        n11 / mb
    );
    // Unbounded, these would pin 3.2 GiB each.
    assert!(n11 < n10 + 256 * mb, "node 1 grew to {} MiB", n11 / mb);
    assert!(up1 < up0 + 512 * mb, "up grew to {} MiB", up1 / mb);
    // Other clients are served meanwhile.
    assert!(nbdinfo_ok(&c.unix));
    assert_all_nodes_up(&c);

    // The stalled payloads are dropped once their deadline passes.
    wait_logged(&c.path().join("node-1.log"), "did not arrive within");
    for mut s in stalled {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut b = [0u8; 64];
        assert_eq!(
            s.read(&mut b).unwrap_or(0),
            0,
            "a stalled peer got an answer"
        );
    }
    drop(greedy);

    // A volume past the nodes' capacity is refused, and leaves nothing behind.
    let out = c.cli(&["volume", "create", "big", "--size", "1G"]);
    // Not the request's fault but the cluster's state: exit 1, with the numbers.
    assert_eq!(
        out.status.code(),
        Some(1),
        "a 1 GiB volume fit in 256 MiB nodes"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no space: a replica of 1.0 GiB does not fit")
            && err.contains("of its capacity of 256.0 MiB"),
        "{err}"
    );
    // A name taken: exit 1 as well.
    let out = c.cli(&["volume", "create", "vol0", "--size", "1M"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ok(&c, &["volume", "list"]).contains("big"));

    // Write-zeroes over the whole volume: the memory store frees, it does not allocate.
    let zero = format!(
        "import nbd; h = nbd.NBD(); h.connect_uri({:?}); h.zero({}, 16 << 20); h.flush(); h.shutdown()",
        c.unix,
        48 << 20
    );
    run(Command::new("/usr/bin/python3").args(["-c", &zero]));
    assert!(rss(n1) < n10 + 256 * mb);

    // Nothing was lost: the first 8 MiB read back, the replicas agree.
    let back = c.path().join("back.img");
    run(Command::new("nbdcopy").arg(&c.unix).arg(&back));
    assert!(std::fs::read(&back).unwrap()[..8 << 20] == std::fs::read(&src).unwrap()[..]);
    assert_replicas_identical(&c, "vol0");
}

mod hostile_ucx;

/// Open descriptors of process `pid`.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// `n` connections to `to` that say nothing, kept open (as many as the peer keeps: a
/// listener may close those it has no place for).
enum Idle {
    Tcp(#[allow(dead_code)] Vec<std::net::TcpStream>),
    Unix(#[allow(dead_code)] Vec<std::os::unix::net::UnixStream>),
}

fn idle(to: &str, n: usize) -> Idle {
    if let Some(path) = to.strip_prefix("unix:") {
        Idle::Unix(
            (0..n)
                .filter_map(|_| std::os::unix::net::UnixStream::connect(path).ok())
                .collect(),
        )
    } else {
        // From 8 threads: one TCP handshake after another would take seconds.
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let to = to.to_string();
                std::thread::spawn(move || {
                    (0..n / 8)
                        .filter_map(|_| std::net::TcpStream::connect(&to).ok())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        Idle::Tcp(
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect(),
        )
    }
}

/// Every port of `up` — NBD on its unix socket and over TLS, a node's TCP (mutual TLS) and
/// same-host ports, the control socket, the HTTP endpoint — takes 2,000 connections that say
/// nothing. Each listener holds (its caps and deadlines, a newcomer evicting the longest
/// idle), memory stays flat, and a real client of that port is served meanwhile. Then the
/// process runs out of descriptors for real (its limit lowered under it): accepts fail with
/// EMFILE, are retried, and once the flood is gone every listener serves again.
#[test]
fn idle_connections_and_descriptor_exhaustion_never_stop_a_listener() {
    need("nbdinfo");
    need("prlimit");
    // This process opens thousands of sockets too.
    let _ = trireme_net::limits::raise_nofile();
    let mb = 1u64 << 20;
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    let up = c.child.as_ref().unwrap().id() as i32;
    let n1 = node_pid(&c, 1);
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    let node_tcp = nl[0]["addr"].as_str().unwrap().to_string();
    let http = addr_in(&c.path().join("http"));
    let token = std::fs::read_to_string(c.path().join("http-token")).unwrap();
    let token = token.trim().to_string();
    let sock = |name: &str| format!("unix:{}", c.path().join(name).display());
    let (up0, n10) = (rss(up), rss(n1));

    let served = |port: &str| -> bool {
        match port {
            "nbd-unix" => nbdinfo_ok(&c.unix),
            "nbd-tls" => nbdinfo_ok(&c.tcp),
            "node-tcp" | "node-unix" => c.cli(&["volume", "verify", "vol0"]).status.success(),
            "control" => {
                let o = c.cli(&["status"]);
                if !o.status.success() {
                    eprintln!("status: {}", String::from_utf8_lossy(&o.stderr));
                }
                o.status.success()
            }
            "http" => {
                let auth = format!("Bearer {token}");
                http_with(&http, "GET", "/metrics", &[("Authorization", &auth)]).0 == 200
            }
            _ => unreachable!(),
        }
    };
    let ports = [
        ("nbd-unix", sock("nbd.sock")),
        ("nbd-tls", c.tcp_addr()),
        ("node-tcp", node_tcp.clone()),
        ("node-unix", sock("node-1.sock")),
        ("control", sock("control.sock")),
        ("http", http.clone()),
    ];
    for (port, addr) in &ports {
        let t = Instant::now();
        let flood = idle(addr, 2000);
        println!("{port}: 2000 connections in {:?}", t.elapsed());
        // The listener works through the 2,000 in its backlog first: a real client is served
        // within seconds, or the listener stopped. (One try after a fixed second failed once
        // for the node's unix socket on a host shared with another test binary.)
        let t0 = Instant::now();
        while !served(port) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{port}: a real client was refused for 20 s under 2,000 idle ones"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let took = t0.elapsed();
        let (u, n) = (rss(up), rss(n1));
        println!(
            "{port}: served in {took:?}; up {} MiB, {} fds; node 1 {} MiB, {} fds",
            u / mb,
            open_fds(up),
            n / mb,
            open_fds(n1)
        );
        assert!(u < up0 + 128 * mb, "{port}: up grew to {} MiB", u / mb);
        assert!(n < n10 + 128 * mb, "{port}: node 1 grew to {} MiB", n / mb);
        drop(flood);
    }

    // Out of descriptors: up's limit lowered to a few more than it holds, then 64
    // connections at each of its NBD and HTTP ports. Its accepts fail with EMFILE and back off.
    // Counted at rest: the floods' descriptors close over a moment after they are dropped,
    // and a limit counted from them left room for all 128 (CI met it once).
    let mut held = open_fds(up);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = open_fds(up);
        if now == held {
            break;
        }
        held = now;
    }
    let limit = held + 16;
    println!("up holds {held} descriptors at rest: limit {limit}");
    run(Command::new("prlimit").args([
        "--pid",
        &up.to_string(),
        &format!("--nofile={limit}:{limit}"),
    ]));
    let flood = (idle(&sock("nbd.sock"), 64), idle(&http, 64));
    wait_logged(&c.path().join("up.log"), "accept failed, retrying in");
    println!("EMFILE seen");
    drop(flood);
    // The flood gone, every listener of up serves again without a restart.
    let t0 = Instant::now();
    while !(served("nbd-unix") && served("nbd-tls") && served("control") && served("http")) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "a listener did not come back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_all_nodes_up(&c);
    assert_replicas_identical(&c, "vol0");
}

/// A snapshot's export over TLS (`nbd VOLUME@SNAPSHOT --listen`) admits the clients its
/// volume's access list names, and only them: it once looked `vol0@s1` up as a volume and
/// refused everybody, allowed clients too.
#[test]
fn a_snapshot_export_over_tls_admits_its_volumes_clients_only() {
    need("nbdinfo");
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    let bob = issue_client(&c, "bob");
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    let mut nbd = Command::new(BIN)
        .arg("--data-dir")
        .arg(c.path())
        .args(["nbd", "vol0@s1", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It prints its URIs once it serves: the TCP one is nbds://, with up's client credentials.
    let mut out = nbd.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let uri = String::from_utf8(line).unwrap();
    let served = std::panic::catch_unwind(|| {
        assert!(
            uri.starts_with("nbds://") && uri.contains("/vol0@s1"),
            "{uri}"
        );
        let addr = uri["nbds://".len()..]
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let local = c.tcp.split_once("tls-certificates=").unwrap().1.to_string();
        let as_ = |creds: &str| format!("nbds://{addr}/vol0@s1?tls-certificates={creds}");
        assert!(
            nbdinfo_ok(&as_(&local)),
            "the volume's own client is refused"
        );
        assert!(
            !nbdinfo_ok(&as_(bob.to_str().unwrap())),
            "bob reached a snapshot of a volume not open to him"
        );
        ok(&c, &["volume", "access", "vol0", "--allow", "bob"]);
        let t0 = Instant::now();
        while !nbdinfo_ok(&as_(bob.to_str().unwrap())) {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "bob, now on the list, is still refused"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let _ = nbd.kill();
    let _ = nbd.wait();
    if let Err(e) = served {
        std::panic::resume_unwind(e);
    }
}

/// Another local user's redial loop against `up`'s NBD TLS port, connections that never
/// speak, dialled again as soon as the port ends them, does not cost a client that speaks its
/// session: on one host every peer is 127.0.0.1, so the gate shares its handshakes per local
/// user too (the audit saw 9 of 20 TLS sessions fail; keyed by address alone, 18 of 20 did
/// here).
#[test]
fn another_users_redial_loop_costs_no_tls_session() {
    use std::os::unix::process::CommandExt;
    need("nbdinfo");
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    let (host, port) = c
        .tcp_addr()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap();
    // Sixteen threads of user nobody, each holding one silent connection until the port ends
    // it, then dialling again: far over the port's 8 handshakes per source.
    let script = r#"
import socket, sys, threading, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.time() + secs
n = [0]
def loop():
    while time.time() < end:
        try:
            s = socket.create_connection((host, port))
        except OSError:
            continue
        n[0] += 1
        s.settimeout(0.5)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()
ts = [threading.Thread(target=loop) for _ in range(16)]
for t in ts: t.start()
for t in ts: t.join()
print(n[0])
"#;
    let dialler = Command::new("python3")
        .args(["-c", script, &host, &port, "6"])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let failed = (0..20).filter(|_| !nbdinfo_ok(&c.tcp)).count();
    let out = dialler.wait_with_output().unwrap();
    let n: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    eprintln!("{failed} of 20 sessions failed beside {n} silent dials of another user");
    assert!(n > 1000, "the loop dialled only {n} connections");
    assert_eq!(
        failed, 0,
        "{failed} of 20 TLS sessions failed beside {n} silent dials"
    );
}
