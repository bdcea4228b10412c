//! Identity on the NBD TCP export: TLS only (NBD STARTTLS, FORCEDTLS), client certificates of
//! this cluster's CA only, refused peers logged, nothing lost.

mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn trireme(c: &Cluster, args: &[&str]) {
    let out = c.cli(args);
    assert!(
        out.status.success(),
        "trireme {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for `what` in the cluster's log.
fn logged(c: &Cluster, what: &str) {
    let t0 = Instant::now();
    while !c.log().contains(what) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not logged: {what:?}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Client credentials from a CA of its own (not this cluster's): their directory.
fn foreign_client(c: &Cluster) -> String {
    let o = c.path().join("other").display().to_string();
    trireme(c, &["ca", "init", "--dir", &format!("{o}/ca")]);
    let (ca, out) = (format!("{o}/ca"), format!("{o}/client"));
    trireme(
        c,
        &[
            "ca", "issue", "client", "mallory", "--ca", &ca, "--out", &out,
        ],
    );
    out
}

fn refused(uri: &str) {
    let out = Command::new("nbdinfo").arg(uri).output().unwrap();
    assert!(
        !out.status.success(),
        "{uri} was let in:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_tcp_export_serves_only_this_clusters_clients_over_tls() {
    need("nbdinfo");
    need("nbdcopy");
    let mut c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    assert!(c.tcp.starts_with("nbds://"), "{}", c.tcp);
    let tls = c.path().join("tls");
    for key in [
        "ca/ca-key.pem",
        "client/client-key.pem",
        "server/server-key.pem",
    ] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tls.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }

    // The credentials `up` wrote get a client in: bytes written over TLS read back over the
    // unix socket.
    let src = c.path().join("src.img");
    random_file(&src, 4 << 20, 9);
    run(Command::new("nbdcopy").arg(&src).arg(&c.tcp));
    let back = c.path().join("back.img");
    run(Command::new("nbdcopy").arg(&c.unix).arg(&back));
    assert!(
        std::fs::read(&back).unwrap()[..4 << 20] == std::fs::read(&src).unwrap()[..],
        "bytes differ"
    );

    // A plaintext client.
    let addr = c.tcp_addr();
    refused(&format!("nbd://{addr}/vol0"));
    logged(&c, "this listener requires TLS");

    // A client of another CA.
    let o = foreign_client(&c);
    refused(&format!("nbds://{addr}/vol0?tls-certificates={o}"));
    logged(&c, "TLS handshake failed");

    // A certificate of this CA that names a node, not a client.
    let n7 = c.path().join("n7");
    trireme(
        &c,
        &["ca", "issue", "node", "7", "--out", n7.to_str().unwrap()],
    );
    std::fs::rename(n7.join("node-cert.pem"), n7.join("client-cert.pem")).unwrap();
    std::fs::rename(n7.join("node-key.pem"), n7.join("client-key.pem")).unwrap();
    refused(&format!(
        "nbds://{addr}/vol0?tls-certificates={}",
        n7.display()
    ));
    logged(&c, "names node 7, not a client");

    // Nothing of that touched the volume, and it still serves.
    run(Command::new("nbdcopy").arg(&c.unix).arg(&back));
    assert!(std::fs::read(&back).unwrap()[..4 << 20] == std::fs::read(&src).unwrap()[..]);
    assert_replicas_identical(&c, "vol0");
    c.stop();

    // `--insecure` is the explicit way to plain text.
    let c = Cluster::start(&["--store", "memory", "--size", "4M", "--insecure"]);
    assert!(c.tcp.starts_with("nbd://"), "{}", c.tcp);
    run(Command::new("nbdinfo").arg(&c.tcp));
}

/// Waits for `what` in node `id`'s log.
fn node_logged(c: &Cluster, id: u32, what: &str) {
    wait_logged(&c.path().join(format!("node-{id}.log")), what);
}

/// `openssl s_client` to `addr` with `args`: a TLS peer that is not ours (stdin closed at once,
/// so it sends nothing after the handshake).
fn s_client(addr: &str, args: &[&str]) {
    Command::new("openssl")
        .args(["s_client", "-connect", addr, "-brief"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
}

#[test]
fn nodes_take_only_peers_with_a_certificate_of_the_cluster_ca() {
    need("openssl");
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    let addr = nl[0]["addr"].as_str().unwrap().to_string();

    // Plain TCP: a trireme frame header is not a TLS hello.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut h = vec![0u8; 64];
        h[0..4].copy_from_slice(b"TRIR");
        s.write_all(&h).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(
            !got.starts_with(b"TRIR"),
            "a plaintext peer got a frame back"
        );
    }
    node_logged(&c, 1, "refused a connection: TLS handshake failed");

    // TLS with no client certificate; with one from another CA.
    let ca = c.path().join("tls/ca/ca-cert.pem");
    let ca = ca.to_str().unwrap();
    // With TLS 1.3 the client may finish its side before the node's alert arrives, so what
    // s_client prints depends on timing: the node's own log line is the proof of refusal.
    s_client(&addr, &["-CAfile", ca]);
    let o = foreign_client(&c);
    s_client(
        &addr,
        &[
            "-CAfile",
            ca,
            "-cert",
            &format!("{o}/client-cert.pem"),
            "-key",
            &format!("{o}/client-key.pem"),
        ],
    );
    node_logged(&c, 1, "peer sent no certificates");
    node_logged(&c, 1, "invalid peer certificate");

    // The cluster's own links carry on: status reaches every node, the replicas agree.
    assert_all_nodes_up(&c);
    run(Command::new("nbdinfo").arg(&c.unix));
    assert_replicas_identical(&c, "vol0");
}

/// Runs `cmd` as user nobody; whether it succeeded.
fn as_nobody(args: &[&str]) -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn same_host_sockets_take_only_their_owner() {
    need("nbdinfo");
    need("setpriv");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let c = Cluster::start(&["--store", "memory", "--size", "4M"]);
    use std::os::unix::fs::PermissionsExt;
    let socks = ["nbd.sock", "control.sock", "node-1.sock"];
    for s in socks {
        let mode = std::fs::metadata(c.path().join(s))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{s}");
    }
    // Another user cannot even open them...
    assert!(!as_nobody(&["nbdinfo", &c.unix]));
    // ...and when the modes are opened up by mistake, the peer check still refuses it.
    std::fs::set_permissions(c.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for s in socks {
        std::fs::set_permissions(c.path().join(s), std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    assert!(!as_nobody(&["nbdinfo", &c.unix]));
    logged(&c, "refused an NBD client on the unix socket: uid 65534");
    let bin = env!("CARGO_BIN_EXE_trireme");
    assert!(!as_nobody(&[
        bin,
        "--data-dir",
        c.path().to_str().unwrap(),
        "volume",
        "delete",
        "vol0"
    ]));
    logged(&c, "refused a control connection: uid 65534");
    // The owner still gets in, and the volume is still there.
    run(Command::new("nbdinfo").arg(&c.unix));
    let out = c.cli(&["volume", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("vol0"));
}

/// A replica read straight off the disk is the volume: every file and directory of a data
/// directory is its owner's alone, another user's reads fail with EACCES, and a data
/// directory that others could enter is closed (0700) at start with a warning.
#[test]
fn replica_files_are_their_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    need("setpriv");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to read as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = Cluster::start_in(dir, &["--store", "file", "--size", "16M"]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 9 0 1M", &c.unix]));
    logged(
        &c,
        "the data directory was open to other users (mode 755); it is 0700 now",
    );
    // Every directory 0700, every file 0600 (sockets included), down the whole tree.
    let mut files = 0;
    let mut stack = vec![c.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o777;
            if m.is_dir() {
                assert_eq!(mode, 0o700, "{}", p.display());
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "up.log") {
                // (up.log is this test's: it holds what `up` prints.)
                assert_eq!(mode & 0o077, 0, "{} is {mode:o}", p.display());
                files += 1;
            }
        }
    }
    assert!(files > 20, "only {files} files");
    // Another user reaches none of them, even by a full path.
    let node1 = c.path().join("node-1");
    let replica = std::fs::read_dir(&node1)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() >= 1 << 20))
        .expect("a replica's data file");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "cat",
        ])
        .arg(&replica)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
