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
    let bob = c.path().join("bob");
    ok(
        &c,
        &[
            "ca",
            "issue",
            "client",
            "bob",
            "--out",
            bob.to_str().unwrap(),
        ],
    );
    let addr = c.tcp_addr();
    let as_bob = format!("nbds://{addr}/vol0?tls-certificates={}", bob.display());
    // A new volume is open to every client of the cluster.
    assert!(nbdinfo_ok(&as_bob));

    // Only `local` (the credentials `up` wrote) from now on.
    let v: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &[
            "--output", "json", "volume", "access", "vol0", "--deny", "*", "--allow", "local",
        ],
    ))
    .unwrap();
    assert_eq!(v["access"], serde_json::json!(["local"]));
    let t0 = Instant::now();
    while nbdinfo_ok(&as_bob) {
        assert!(t0.elapsed() < Duration::from_secs(5), "bob still gets in");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    wait_logged(
        &c.path().join("node-1.log"),
        "client bob may not DeleteReplica",
    );
    wait_logged(&c.path().join("node-1.log"), "client bob may not Checksum");

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
    assert!(!out.status.success(), "a 1 GiB volume fit in 256 MiB nodes");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no space"),
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
    let cut = offer.len() - trireme_transport::ucx::SECRET_LEN;
    let (address, secret) = offer.split_at(cut);
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
