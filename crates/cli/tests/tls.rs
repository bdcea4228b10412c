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
    let other = c.path().join("other");
    let o = other.display().to_string();
    trireme(&c, &["ca", "init", "--dir", &format!("{o}/ca")]);
    trireme(
        &c,
        &[
            "ca",
            "issue",
            "client",
            "mallory",
            "--ca",
            &format!("{o}/ca"),
            "--out",
            &format!("{o}/client"),
        ],
    );
    refused(&format!("nbds://{addr}/vol0?tls-certificates={o}/client"));
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
