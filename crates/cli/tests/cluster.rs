//! Cluster lifecycle, the CLI, restarts and bad input, with real processes.

mod common;
use common::*;
use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

#[test]
fn restart_on_the_same_data_dir_keeps_every_byte() {
    need("qemu-io");
    need("nbdcopy");
    let mut c = Cluster::start(&["--store", "file", "--size", "64M"]);
    let src = c.path().join("src.img");
    random_file(&src, 8 << 20, 7);
    run(Command::new("nbdcopy").arg(&src).arg(&c.unix));
    // Over TCP, TLS with the credentials `up` wrote.
    let tls = c.qemu_tls("vol0");
    run(Command::new("qemu-io")
        .args(&tls[..3])
        .args(["-c", "write -P 0x77 40M 3M", "-c", "write -P 0x33 63M 1M"])
        .arg(&tls[3]));
    let dir = c.stop();
    assert!(
        !dir.path().join("exports").exists(),
        "exports file removed on stop"
    );

    let c = Cluster::start_in(dir, &["--store", "file", "--size", "64M"]);
    let copy = c.path().join("copy.img");
    run(Command::new("nbdcopy").arg(&c.unix).arg(&copy));
    let a = std::fs::read(&copy).unwrap();
    assert!(
        a[..8 << 20] == std::fs::read(&src).unwrap()[..],
        "data changed across restart"
    );
    assert!(a[40 << 20..43 << 20].iter().all(|&x| x == 0x77));
    assert!(a[63 << 20..].iter().all(|&x| x == 0x33));
    assert!(a[43 << 20..63 << 20].iter().all(|&x| x == 0));
    // The restart attached with a new epoch.
    let s: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "status"]).stdout).unwrap();
    assert_eq!(s["volumes"][0]["epoch"], 2, "{s}");
    assert_replicas_identical(&c, "vol0");
}

#[test]
fn cli_manages_volumes_and_reports_status() {
    let c = Cluster::start(&[
        "--store",
        "memory",
        "--nodes",
        "4",
        "--replicas",
        "2",
        "--size",
        "16M",
    ]);
    let out = c.cli(&[
        "volume",
        "create",
        "data1",
        "--size",
        "32M",
        "--replicas",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(
        &c.cli(&["--output", "json", "volume", "info", "data1"])
            .stdout,
    )
    .unwrap();
    assert_eq!(v["size"], 32 << 20);
    let nodes: Vec<u64> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_u64().unwrap())
        .collect();
    assert_eq!(nodes.len(), 3);
    // How its bytes are kept, and what that costs and buys, in JSON and in text.
    assert_eq!(v["resiliency"]["layout"]["kind"], "mirror", "{v}");
    assert_eq!(v["resiliency"]["survives"], 2, "{v}");
    assert_eq!(v["resiliency"]["usable_to_raw"], 0.333, "{v}");
    let info = String::from_utf8(c.cli(&["volume", "info", "data1"]).stdout).unwrap();
    assert!(
        info.contains("layout: mirror, 3 copies, survives 2 lost nodes, 33% of raw usable"),
        "{info}"
    );
    let text = String::from_utf8(c.cli(&["status"]).stdout).unwrap();
    assert!(
        text.contains("layout: mirror, 2 copies, survives 1 lost node, 50% of raw usable"),
        "{text}"
    );
    let list = String::from_utf8(c.cli(&["volume", "list"]).stdout).unwrap();
    assert!(list.contains("vol0") && list.contains("data1"), "{list}");

    let s: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "status"]).stdout).unwrap();
    assert_eq!(s["nodes"].as_array().unwrap().len(), 4);
    assert!(
        s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["up"] == true),
        "{s}"
    );
    for v in s["volumes"].as_array().unwrap() {
        assert!(
            v["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["state"] == "in-sync"),
            "{s}"
        );
    }
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    assert_eq!(nl.as_array().unwrap().len(), 4);

    // The writer reaches nodes on this host through their unix sockets, and moves the data path
    // to UCX (shared memory here) after the probe: shared memory alone, no tcp lane (whose
    // failure when a peer died crashed live processes in UCX 1.13: `ucx::DEFAULT_TLS`).
    let links = s["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "vol0")
        .unwrap()["client_links"]
        .clone();
    assert_eq!(links.as_array().unwrap().len(), 2, "{links}");
    assert!(
        links
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["transport"] == "ucx"
                && l["peer"].as_str().unwrap().starts_with("unix:")
                && l["lanes"].as_str().unwrap().ends_with("/memory")
                && !l["lanes"].as_str().unwrap().contains("tcp")),
        "{links}"
    );

    // A second NBD export of the new volume, as a separate process. One node's same-host socket
    // is gone, so that replica must be reached over TCP instead.
    let v1: serde_json::Value = serde_json::from_slice(
        &c.cli(&["--output", "json", "volume", "info", "data1"])
            .stdout,
    )
    .unwrap();
    let first = v1["replicas"][0]["node"].as_u64().unwrap();
    std::fs::remove_file(c.path().join(format!("node-{first}.sock"))).unwrap();
    let sock = c.path().join("data1.sock");
    let (mut nbd, line) = spawn_nbd(&c, "data1", &sock);
    assert!(line.starts_with("nbd+unix:///data1"), "{line}");
    need("qemu-io");
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x42 1M 1M",
        "-c",
        "read -P 0x42 1M 1M",
        line.trim(),
    ]));
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());
    assert_replicas_identical(&c, "data1");

    let out = c.cli(&["volume", "delete", "data1"]);
    assert!(out.status.success());
    let out = c.cli(&["volume", "info", "data1"]);
    assert_eq!(out.status.code(), Some(2));
    // Too many replicas for the nodes, bad size, bad name: clear refusals.
    for args in [
        &["volume", "create", "x", "--size", "1M", "--replicas", "4"][..],
        &["volume", "create", "x", "--size", "1000"],
        &["volume", "create", "bad/name", "--size", "1M"],
    ] {
        let out = c.cli(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim().lines().count(),
            1,
            "{args:?}"
        );
    }
}

#[test]
fn bad_input_gets_an_error_and_the_servers_keep_serving() {
    need("nbdinfo");
    // Plain text, so the garbage reaches the decoders (TLS refusals: tests/tls.rs).
    let c = Cluster::start(&["--store", "memory", "--size", "16M", "--insecure"]);
    let tcp_addr = c.tcp_addr();

    // NBD: garbage instead of client flags / options.
    let mut s = std::net::TcpStream::connect(&tcp_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&[0u8; 4]).unwrap();
    s.write_all(b"this is not an NBD option at all").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "server closed without replying to garbage");

    // NBD: a transmission request before the handshake.
    let mut s = std::net::TcpStream::connect(&tcp_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&[0, 0, 0, 3]).unwrap();
    s.write_all(&[
        0x25, 0x60, 0x95, 0x13, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        2, 0,
    ])
    .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());

    // Node data path: garbage frames, and a header claiming a 4 GiB payload.
    let nl: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "node", "list"]).stdout).unwrap();
    let node_addr = nl[0]["addr"].as_str().unwrap().to_string();
    let mut s = std::net::TcpStream::connect(&node_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0xA5; 4096]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "node closed the connection");
    let h = trireme_proto_header_with_payload_len(u32::MAX);
    let mut s = std::net::TcpStream::connect(&node_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&h).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());

    // Control socket: not JSON, unknown command.
    let mut s = std::os::unix::net::UnixStream::connect(c.path().join("control.sock")).unwrap();
    s.write_all(b"{not json\n{\"cmd\":\"format_all_disks\"}\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = String::new();
    while got.lines().count() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got += &String::from_utf8_lossy(&buf[..n]);
    }
    assert!(got.lines().all(|l| l.starts_with("{\"error\"")), "{got}");

    // Everything still serves.
    run(Command::new("nbdinfo").arg(&c.unix));
    assert_all_nodes_up(&c);
}

/// A valid trireme frame header whose payload length field is `len`.
fn trireme_proto_header_with_payload_len(len: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(b"TRIR");
    b[4] = 1;
    b[5] = 4; // Write
    b[52..56].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c(&b[0..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn bad_flags_and_config_give_one_line_and_exit_2() {
    let cases: &[&[&str]] = &[
        &["up", "--nodes", "0"],
        &["up", "--nodes", "2", "--replicas", "3"],
        &["up", "--store", "tape"],
        &["up", "--size", "12X"],
        &["up", "--size", "1000"],
        &["up", "--volume", "no/slash"],
        &["up", "--http", "localhost"],
        &[
            "node", "serve", "--id", "1", "--dir", "x", "--http", "1.2.3.4",
        ],
        &["volume", "create"],
        &["frobnicate"],
        &["--output", "xml", "status"],
    ];
    let d = tempfile::tempdir().unwrap();
    for args in cases {
        let out = Command::new(BIN)
            .arg("--data-dir")
            .arg(d.path())
            .args(*args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
    }
    // A cluster on a data dir made with another store is refused, not reinterpreted.
    let mut c = Cluster::start(&["--store", "memory", "--size", "4M"]);
    let dir = c.stop();
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["up", "--store", "file", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No cluster running: a runtime error, exit 1.
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_new_attach_fences_the_old_writer() {
    need("qemu-io");
    let c = Cluster::start(&["--store", "memory", "--size", "16M"]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x01 0 64k", &c.unix]));

    // Another process attaches vol0: it takes epoch 2, and the replicas refuse epoch 1 from now on.
    let sock = c.path().join("new.sock");
    let (mut nbd, new_uri) = spawn_nbd(&c, "vol0", &sock);

    // The old writer (trireme up's export) can no longer write: its write fails, and changes nothing.
    let old = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x02 0 64k", &c.unix])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&old.stdout).to_string() + &String::from_utf8_lossy(&old.stderr);
    assert!(
        text.contains("error") || !old.status.success(),
        "a fenced writer's write must fail: {text}"
    );
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x01 0 64k", &new_uri]));
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x03 0 64k",
        "-c",
        "read -P 0x03 0 64k",
        &new_uri,
    ]));

    let s: serde_json::Value =
        serde_json::from_slice(&c.cli(&["--output", "json", "status"]).stdout).unwrap();
    assert_eq!(s["volumes"][0]["epoch"], 2, "{s}");
    assert!(
        s["volumes"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["epoch"] == 2),
        "{s}"
    );
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(nbd.id() as i32, libc::SIGTERM) };
    assert!(nbd.wait().unwrap().success());
}

/// Long commands show progress on a terminal (a pseudo-terminal from `script`) and nothing
/// through a pipe; `status --watch` redraws in place on a terminal and streams one JSON
/// document per line with `--output json`.
#[test]
fn progress_on_a_terminal_none_through_a_pipe_and_status_watch() {
    need("script");
    let c = Cluster::start(&["--store", "memory", "--size", "2G"]);
    let on_tty = |cmd: &str| {
        let out = Command::new("script")
            .args(["-qec", cmd, "/dev/null"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let bin = format!("{BIN} --data-dir {}", c.path().display());
    // `volume CMD vol0`: a progress line on a terminal, then `result`; through a pipe, no
    // progress at all.
    let shown_on_tty_only = |cmd: &str, result: &str| {
        let tty = on_tty(&format!("{bin} volume {cmd} vol0"));
        assert!(
            tty.contains(&format!("{cmd} vol0: ")) && tty.contains("% (") && tty.contains("ETA"),
            "{tty:?}"
        );
        assert!(tty.contains(result), "{tty:?}");
        let piped = c.cli(&["volume", cmd, "vol0"]);
        assert!(piped.status.success());
        let err = String::from_utf8_lossy(&piped.stderr);
        assert!(!err.contains('%') && !err.contains('\x1b'), "{err:?}");
    };
    shown_on_tty_only("verify", "0 mismatching region(s)");
    // A scrub runs in the cluster process: its progress comes through `status`.
    shown_on_tty_only("scrub", "0 region(s) differed");

    // status --watch: redrawn in place on a terminal.
    let tty = on_tty(&format!("timeout 2 {bin} status --watch 0.5"));
    assert!(tty.matches("\x1b[H").count() >= 2, "{tty:?}");
    assert!(tty.contains("nodes: 3 of 3 up"), "{tty:?}");
    // ...and a JSON document per line for a program.
    let mut w = std::process::Command::new(BIN)
        .arg("--data-dir")
        .arg(c.path())
        .args(["--output", "json", "status", "--watch", "0.2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(w.stdout.take().unwrap()));
    for _ in 0..3 {
        let l = lines.next().unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["nodes"].as_array().unwrap().len(), 3, "{l}");
    }
    w.kill().unwrap();
    w.wait().unwrap();
}

/// `up --io-threads N` gives each node N threads for its reads and writes: each node's command
/// line says so, and after a bench with eight I/Os outstanding each runs one I/O thread.
#[test]
fn up_sets_each_nodes_io_threads() {
    let c = Cluster::start(&["--store", "file", "--size", "32M", "--io-threads", "1"]);
    let b = start_bench(&c, 2);
    finish_bench(&c, b);
    for id in 1..=3 {
        let pid = node_pid(&c, id);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--io-threads" && w[1] == "1"),
            "{args:?}"
        );
        let name = format!("node{id}-io");
        let io = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|n| n.trim() == name)
            })
            .count();
        assert_eq!(io, 1, "node {id} runs {io} I/O threads");
    }
}

/// A node whose directory another process still holds (a node of the last `up`, killed, still
/// closing its replicas: its parent's death sent it SIGTERM) waits for it to let go, rather
/// than failing the new `up`'s start.
#[test]
fn a_node_waits_for_its_directory_while_another_still_holds_it() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::DirBuilderExt;
    let dir = tempfile::tempdir().unwrap();
    let node1 = dir.path().join("node-1");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&node1)
        .unwrap();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(node1.join("LOCK"))
        .unwrap();
    // SAFETY: flock on a descriptor this test owns.
    let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "the test could not take the lock");
    let t0 = std::time::Instant::now();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        drop(lock);
    });
    let c = Cluster::start_in(dir, &["--store", "file", "--size", "16M"]);
    release.join().unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(2), "started while held");
    let log = std::fs::read_to_string(c.path().join("node-1.log")).unwrap();
    assert!(
        log.contains("waiting for another process to let the store directory go"),
        "{log}"
    );
    let o = c.cli(&["volume", "list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
