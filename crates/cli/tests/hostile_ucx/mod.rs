//! UCX from a hostile peer: requests without the link's secret or over the payload limit,
//! and answers forged by another local user, are dropped unread; the writer's data stays its
//! own.

use super::*;

/// Sends one UCX request to `address` with `secret` after the frame header and `payload`
/// (rendezvous when large), from a worker of this process; the header declares the payload
/// if `declared`, else none. Returns once the send completed (a receiver that declines a
/// rendezvous completes it too).
fn ucx_send(address: &[u8], secret: &[u8], payload: Vec<u8>, declared: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ctx = trireme_ucx::Context::new(&trireme_ucx::Config {
        tls: Some(trireme_transport::ucx::DEFAULT_TLS.into()),
        net_devices: Some("lo".into()),
        ..Default::default()
    })
    .unwrap();
    let w = trireme_ucx::Worker::new(&ctx).unwrap();
    let ep = w.connect(address).unwrap();
    let mut hdr = trireme_proto::Header {
        volume: 1,
        epoch: 1,
        ..trireme_proto::Header::request(trireme_proto::Op::Write, 7)
    }
    .encode(if declared { &payload[..] } else { &[] })
    .to_vec();
    hdr.extend_from_slice(secret);
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let d = done.clone();
    ep.am_send(
        trireme_transport::ucx::AM_REQUEST,
        hdr,
        trireme_ucx::Payload::Vec(payload),
        true,
        Box::new(move |_| d.store(true, Ordering::SeqCst)),
    );
    let t0 = Instant::now();
    while !done.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
        w.progress();
    }
    ep.close(true);
    for _ in 0..100 {
        w.progress();
    }
}

/// A UCX peer that knows a node's worker address but not a secret the node handed out is
/// dropped unread; one with the secret whose rendezvous (past the frame limit) is not what
/// its header declares is dropped unread too. The node allocates nothing for either and serves on.
#[test]
fn ucx_requests_without_a_secret_or_over_the_limit_are_dropped_unread() {
    need("nbdcopy");
    let mb = 1u64 << 20;
    let c = Cluster::start(&["--store", "memory", "--size", "16M", "--insecure"]);
    let src = c.path().join("src.img");
    random_file(&src, 4 << 20, 11);
    run(Command::new("nbdcopy").arg(&src).arg(&c.unix));
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    let addr = nl[0]["addr"].as_str().unwrap().to_string();
    // The offer, as a client gets it over the node's TCP link: address, then secret. The
    // secret is good while that link is open: it stays open until the end.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (link, offer) = rt.block_on(async {
        use trireme_transport::Connection;
        let c = trireme_transport::tcp::TcpConnection::connect(&addr, 1)
            .await
            .unwrap();
        let f = c
            .call(
                trireme_proto::Header::request(trireme_proto::Op::UcxAddress, 0),
                bytes::Bytes::new(),
            )
            .await
            .unwrap();
        assert_eq!(f.header.status, trireme_proto::Status::Ok);
        (c, f.payload.to_vec())
    });
    let o = trireme_transport::ucx::decode_offer(&offer).unwrap();
    let (address, secret) = (o.address, &o.secret[..]);
    let n1 = node_pid(&c, 1);
    let before = rss(n1);

    // A guessed secret, with a well-formed 24 MiB write behind it (a rendezvous).
    let guessed = vec![0x5a; trireme_transport::ucx::SECRET_LEN];
    ucx_send(address, &guessed, vec![7u8; 24 << 20], true);
    wait_logged(
        &c.path().join("node-1.log"),
        "UCX request without a valid secret dropped unread",
    );
    // The right secret, but a 40 MiB rendezvous (past the 32 MiB frame limit) that its
    // header does not declare.
    ucx_send(address, secret, vec![7u8; 40 << 20], false);
    wait_logged(
        &c.path().join("node-1.log"),
        "UCX request announcing 0 payload bytes with 41943040 dropped unread",
    );
    let after = rss(n1);
    drop(link);
    println!("node 1 RSS: {} -> {} MiB", before / mb, after / mb);
    assert!(
        after < before + 32 * mb,
        "node 1 grew to {} MiB",
        after / mb
    );

    // The node serves on; nothing was written.
    assert_all_nodes_up(&c);
    let back = c.path().join("back.img");
    run(Command::new("nbdcopy").arg(&c.unix).arg(&back));
    assert!(std::fs::read(&back).unwrap()[..4 << 20] == std::fs::read(&src).unwrap()[..]);
    assert_replicas_identical(&c, "vol0");
}

/// The UCX worker address a process logged at start (`TRIREME_LOG` with the hub at debug).
fn logged_worker_address(log: &std::path::Path) -> String {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("UCX worker started")) {
            let hex = line.split("address=").nth(1).unwrap();
            return hex.split_whitespace().next().unwrap().to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no worker address in {log:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The addresses that process `pid` listens on over TCP.
fn listening(pid: i32) -> Vec<std::net::SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let s = l.to_string_lossy().into_owned();
            Some(
                s.strip_prefix("socket:[")?
                    .trim_end_matches(']')
                    .to_string(),
            )
        })
        .collect();
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        for l in std::fs::read_to_string(file).unwrap().lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.iter().any(|i| i == f[9]) {
                continue;
            }
            let (ip, port) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let ip: std::net::IpAddr = if v6 {
                let b: Vec<u8> = (0..16)
                    .map(|i| u8::from_str_radix(&ip[2 * i..2 * i + 2], 16).unwrap())
                    .collect();
                let mut a = [0u8; 16];
                for w in 0..4 {
                    for k in 0..4 {
                        a[4 * w + k] = b[4 * w + 3 - k];
                    }
                }
                std::net::Ipv6Addr::from(a).into()
            } else {
                std::net::Ipv4Addr::from(u32::from_str_radix(ip, 16).unwrap().swap_bytes()).into()
            };
            out.push(std::net::SocketAddr::new(ip, port));
        }
    }
    out
}

/// Not a test of its own: the forger that `forged_ucx_answers_are_dropped_unread` runs as
/// another user (the test binary started again, with `--ignored --exact`). It answers, over
/// its own UCX worker, every request id in turn at the worker address in `TRIREME_FORGE_ADDR`
/// for `TRIREME_FORGE_SECS` seconds: reads with its own bytes, others with `Fenced` or `Io`,
/// a 32 MiB rendezvous now and then; a guessed secret or none.
#[test]
#[ignore]
fn ucx_forger() {
    let Ok(hex) = std::env::var("TRIREME_FORGE_ADDR") else {
        return;
    };
    let secs: u64 = std::env::var("TRIREME_FORGE_SECS")
        .unwrap()
        .parse()
        .unwrap();
    let tls = std::env::var("TRIREME_FORGE_TLS").unwrap();
    let target: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let ctx = trireme_ucx::Context::new(&trireme_ucx::Config {
        tls: Some(tls),
        net_devices: Some("lo".into()),
        ..Default::default()
    })
    .unwrap();
    let w = trireme_ucx::Worker::new(&ctx).unwrap();
    let ep = w.connect(&target).unwrap();
    let (mut sent, mut id) = (0u64, 1u64);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        let req = trireme_proto::Header {
            volume: 1,
            length: 4096,
            ..trireme_proto::Header::request(trireme_proto::Op::Read, id)
        };
        let (status, payload) = match id % 3 {
            0 => (trireme_proto::Status::Fenced, vec![]),
            1 => (trireme_proto::Status::Ok, vec![0xee; 4096]),
            _ if id % 3000 == 2 => (trireme_proto::Status::Ok, vec![0xdd; 32 << 20]),
            _ => (trireme_proto::Status::Io, vec![]),
        };
        let mut hdr = req.response(status).encode(&payload).to_vec();
        if id % 2 == 0 {
            hdr.extend_from_slice(&[0x5a; trireme_transport::ucx::SECRET_LEN]);
        }
        let pending = ep.am_send(
            trireme_transport::ucx::AM_RESPONSE,
            hdr,
            trireme_ucx::Payload::Vec(payload),
            true,
            Box::new(|_| {}),
        );
        sent += 1;
        id = if id >= 400_000 { 1 } else { id + 1 };
        // Never more than a few sends left waiting: the forger's own memory stays bounded.
        let t = Instant::now();
        while (pending || w.sends_pending()) && t.elapsed() < Duration::from_millis(100) {
            w.progress();
        }
        while w.progress() {}
    }
    ep.close(true);
    for _ in 0..1000 {
        w.progress();
    }
    println!("forged {sent}");
}

/// Starts the forger (above) against `address` as user nobody, with UCX transports `tls`.
fn start_forger(address: &str, secs: u64, tls: &str) -> std::process::Child {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "hostile_ucx::ucx_forger",
            "--nocapture",
        ])
        .env("TRIREME_FORGE_ADDR", address)
        .env("TRIREME_FORGE_SECS", secs.to_string())
        .env("TRIREME_FORGE_TLS", tls)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the volume through NBD for `secs` seconds, four 1 MiB reads at once and a copy of
/// the first 16 MiB, which must be `src`'s bytes. Returns the rounds made.
fn read_back_for(c: &Cluster, src: &std::path::Path, secs: u64) -> usize {
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < Duration::from_secs(secs) || rounds == 0 {
        let out = run(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "aio_read -q 0 1M",
            "-c",
            "aio_read -q 1M 1M",
            "-c",
            "aio_read -q 2M 1M",
            "-c",
            "aio_read -q 3M 1M",
            "-c",
            "aio_flush",
            &c.unix,
        ]));
        assert!(!out.contains("error") && !out.contains("failed"), "{out}");
        let back = c.path().join("back.img");
        let o = Command::new("nbdcopy")
            .arg(&c.unix)
            .arg(&back)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "nbdcopy: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            c.log()
                .lines()
                .filter(|l| !l.contains("DEBUG"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            std::fs::read(&back).unwrap()[..16 << 20] == std::fs::read(src).unwrap()[..],
            "a read returned other bytes than were written"
        );
        rounds += 1;
    }
    rounds
}

/// By default no UCX path leads to the writer from another user: its worker has no tcp lane
/// (`ucx::DEFAULT_TLS`) and its shared memory is the cluster user's. A process of another user
/// that holds the worker's address cannot so much as connect, over UCX's tcp lanes or over
/// shared memory; and `up` listens on loopback only, on no port of UCX's.
#[test]
fn another_user_cannot_reach_the_writers_ucx_worker() {
    need("setpriv");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the forger as another user");
        return;
    }
    let c = Cluster::start_env(
        tempfile::tempdir().unwrap(),
        &["--store", "memory", "--size", "16M", "--insecure"],
        &[("TRIREME_LOG", "info,trireme_transport::ucx::hub=debug")],
    );
    let writer = logged_worker_address(&c.path().join("up.log"));
    let up = c.child.as_ref().unwrap().id() as i32;
    let ports = listening(up);
    for a in &ports {
        assert!(a.ip().is_loopback(), "up listens on {a}");
    }
    // Over tcp the worker offers no lane; its shared memory refuses another user.
    for (tls, why) in [
        ("tcp", "Destination is unreachable"),
        ("^cma", "Shared memory error"),
    ] {
        let out = start_forger(&writer, 1, tls).wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "the forger ({tls}) connected:\n{err}"
        );
        assert!(
            err.contains(why),
            "the forger ({tls}) failed otherwise:\n{err}"
        );
    }
    // The cluster serves on, its links on shared memory.
    for l in status(&c)["volumes"][0]["client_links"].as_array().unwrap() {
        assert_eq!(l["transport"], "ucx", "{l}");
        assert!(!l["lanes"].as_str().unwrap().contains("tcp"), "{l}");
    }
}

/// The writer's UCX worker listens on the loopback device only (the device that reaches its
/// nodes), not on every interface of the host. A process of another user that knows the
/// worker's address (which an attacker can build from the host's address and that port)
/// answers calls it never received: reads with its own bytes, writes with `Fenced`, every
/// request id in turn, and 32 MiB rendezvous answers. Before answers were checked, such
/// forgeries were taken for the node's; now each is dropped unread: reads return the real
/// bytes, no replica is taken out, the writer's memory stays flat. Then a process of the
/// cluster's own user, which may write into the writer's shared-memory queue, jams it: the
/// writer's links stop getting UCX answers, go over to TCP by themselves, and I/O goes on.
/// By default a process leaves UCX's tcp lanes out (`ucx::DEFAULT_TLS`) and another user
/// cannot reach the writer's worker at all; this cluster asks for them (`^cma`, as an
/// operator may), so the forgeries arrive and their checks are what holds.
#[test]
fn forged_ucx_answers_are_dropped_unread() {
    need("qemu-io");
    need("setpriv");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the forger as another user");
        return;
    }
    let mb = 1u64 << 20;
    let c = Cluster::start_env(
        tempfile::tempdir().unwrap(),
        &["--store", "memory", "--size", "64M", "--insecure"],
        &[
            ("TRIREME_LOG", "info,trireme_transport::ucx::hub=debug"),
            ("TRIREME_UCX_TLS", "^cma"),
        ],
    );
    let transports = |c: &Cluster| -> Vec<String> {
        status(c)["volumes"][0]["client_links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["transport"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(transports(&c), ["ucx"; 3]);
    let up = c.child.as_ref().unwrap().id() as i32;
    for a in listening(up) {
        assert!(a.ip().is_loopback(), "up listens on {a}");
    }
    let src = c.path().join("src.img");
    random_file(&src, 16 << 20, 21);
    run(Command::new("nbdcopy").arg(&src).arg(&c.unix));
    let writer = logged_worker_address(&c.path().join("up.log"));
    let rss0 = rss(up);

    // Another user: UCX's shared memory is the cluster user's, so it comes over UCX's tcp
    // lane on loopback.
    let forger = start_forger(&writer, 15, "tcp");
    let rounds = read_back_for(&c, &src, 15);
    let out = forger.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("forged "),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rss1 = rss(up);
    println!(
        "{} in {rounds} rounds; up RSS {} -> {} MiB",
        said.lines().find(|l| l.starts_with("forged")).unwrap_or(""),
        rss0 / mb,
        rss1 / mb
    );
    let log = c.log();
    assert!(
        log.contains("UCX response dropped unread"),
        "{}",
        log.lines()
            .filter(|l| l.contains("UCX"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(rss1 < rss0 + 64 * mb, "up grew to {} MiB", rss1 / mb);
    assert_eq!(
        transports(&c),
        ["ucx"; 3],
        "the forgeries moved a link off UCX"
    );

    // The cluster's own user, through shared memory, with a queue size of its own: the
    // writer's queue jams, its links go over to TCP, and reads go on.
    let hex = writer.clone();
    std::thread::spawn(move || {
        let ctx = trireme_ucx::Context::new(&trireme_ucx::Config {
            tls: Some("sm".into()),
            mm_fifo_size: Some(64),
            ..Default::default()
        })
        .unwrap();
        let w = trireme_ucx::Worker::new(&ctx).unwrap();
        let target: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let ep = w.connect(&target).unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if !w.sends_pending() {
                ep.am_send(
                    trireme_transport::ucx::AM_RESPONSE,
                    vec![0; 64],
                    trireme_ucx::Payload::Vec(vec![0; 512]),
                    false,
                    Box::new(|_| {}),
                );
            }
            w.progress();
        }
        ep.close(true);
    });
    read_back_for(&c, &src, 6);
    let t = transports(&c);
    println!("after the jam: {t:?}");
    wait_logged(
        &c.path().join("up.log"),
        "UCX path stopped, going on over TCP",
    );

    // No replica was taken out, the copies agree.
    let s = status(&c);
    for r in s["volumes"][0]["replicas"].as_array().unwrap() {
        assert_eq!(r["state"], "in-sync", "{s}");
    }
    assert_all_nodes_up(&c);
    assert_replicas_identical(&c, "vol0");
}
