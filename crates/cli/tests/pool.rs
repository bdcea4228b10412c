//! Space, with real processes: volumes on the file store are thin (two 10 GiB volumes take
//! what was written, not 60 GiB), `--preallocate` reserves it all, the over-commit limit
//! refuses what would promise too much and says so with the numbers, and `trireme pool` and
//! `status` show it.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Bytes the files under `dir` take on disk.
fn du(dir: &std::path::Path) -> u64 {
    let mut sum = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else {
                sum += m.blocks() * 512;
            }
        }
    }
    sum
}

fn pool(c: &Cluster) -> serde_json::Value {
    let out = c.cli(&["--output", "json", "pool"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn thin_volumes_take_what_is_written_and_over_commit_is_bounded() {
    need("qemu-io");
    // Each node may hold 15 GiB, and provision 1.5 times that: two 10 GiB volumes fit, a
    // third does not.
    let mut c = Cluster::start(&[
        "--size",
        "10G",
        "--store",
        "file",
        "--node-capacity",
        "15G",
        "--overcommit",
        "1.5",
    ]);
    let out = c.cli(&["volume", "create", "data", "--size", "10G"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("(10.0 GiB, thin)"), "{}", text(&out));
    let before = du(c.path());
    // 8 MiB into each volume.
    let sock = c.path().join("data.sock");
    let (mut nbd, uri) = spawn_nbd(&c, "data", &sock);
    for u in [c.unix.clone(), uri.clone()] {
        run(std::process::Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x5a 1G 8M"])
            .arg(&u));
    }
    let after = du(c.path());
    // Six copies of 8 MiB, and what the nodes keep beside them (block seals, logs): far
    // from the 60 GiB a thick store would have taken at creation.
    assert!(
        after - before >= 48 << 20 && after < 1 << 30,
        "60 GiB of volumes take {after} bytes ({before} before 48 MiB were written)"
    );
    let p = pool(&c);
    for n in p["nodes"].as_array().unwrap() {
        assert_eq!(n["capacity"], 15u64 << 30, "{p}");
        assert_eq!(n["provisioned"], 20u64 << 30, "{p}");
        assert_eq!(n["provision_limit"], (15u64 << 30) * 3 / 2, "{p}");
        assert_eq!(n["allocated"], 16u64 << 20, "{p}");
        assert!(n["fs_free"].as_u64().unwrap() > 0, "{p}");
    }
    assert_eq!(p["provisioned"], 60u64 << 30, "{p}");
    assert_eq!(p["largest_new_volume"][2], 5u64 << 29, "{p}");

    // Past the limit: refused, exit 1, with the numbers; nothing left behind.
    let out = c.cli(&["volume", "create", "big", "--size", "10G"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(
            "a replica of 10.0 GiB does not fit, the node's replicas provision 20.0 GiB of 22.5 GiB (its capacity of 15.0 GiB times its over-commit limit of 1.50) (2.5 GiB free to provision)"
        ),
        "{}",
        text(&out)
    );
    let list = text(&c.cli(&["volume", "list"]));
    assert!(!list.contains("big"), "{list}");

    // Thick: every copy reserves its whole size at once.
    let before = du(c.path());
    let out = c.cli(&[
        "volume",
        "create",
        "thick",
        "--size",
        "256M",
        "--preallocate",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("(256.0 MiB, thick)"), "{}", text(&out));
    let after = du(c.path());
    assert!(
        after - before >= 3 * (256 << 20),
        "a thick volume of 3 x 256 MiB took {} bytes",
        after - before
    );
    let p = pool(&c);
    let thick = p["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "thick")
        .unwrap();
    assert_eq!(thick["thick"], true, "{p}");
    let table = text(&c.cli(&["pool"]));
    assert!(
        table.contains("1.50x")
            && table.contains("thick")
            && table.contains("room for a new volume"),
        "{table}"
    );
    let st = text(&c.cli(&["status"]));
    assert!(
        st.contains("pool: 60.8 GiB provisioned of 67.5 GiB"),
        "{st}"
    );

    let _ = nbd.kill();
    let _ = nbd.wait();
    c.stop();
}

fn qemu_io(uri: &str, cmd: &str) -> String {
    run(std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", cmd])
        .arg(uri))
}

fn nbd_size(uri: &str) -> u64 {
    let out = run(std::process::Command::new("qemu-img")
        .args(["info", "--output", "json", "-f", "raw"])
        .arg(uri));
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    j["virtual-size"].as_u64().unwrap()
}

fn ok(c: &Cluster, args: &[&str]) -> String {
    let out = c.cli(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    text(&out)
}

/// `volume resize` on `up`: a volume grows under its writer while I/O goes on, new NBD
/// connections see the new size, a copy that was out gets it at its resync, a detached volume
/// grows and shrinks through a writer of the manager's own, and what would not fit or would
/// drop data is refused with the reason, changing nothing.
#[test]
fn a_volume_grows_online_and_its_copies_follow() {
    need("qemu-io");
    need("qemu-img");
    let mut c = Cluster::start(&["--size", "64M", "--store", "file", "--node-capacity", "1G"]);
    let uri = c.unix.clone();
    qemu_io(&uri, "write -P 0x11 63M 1M");
    let out = ok(&c, &["volume", "resize", "vol0", "128M"]);
    assert!(
        out.contains("resized vol0 from 64.0 MiB to 128.0 MiB"),
        "{out}"
    );
    assert_eq!(
        nbd_size(&uri),
        128 << 20,
        "a new connection sees the new size"
    );
    qemu_io(&uri, "write -P 0x22 100M 1M");
    let read = qemu_io(&uri, "read -P 0x11 63M 1M");
    assert!(!read.contains("Pattern verification failed"), "{read}");
    let read = qemu_io(&uri, "read -P 0x22 100M 1M");
    assert!(!read.contains("Pattern verification failed"), "{read}");
    let read = qemu_io(&uri, "read -P 0 64M 1M");
    assert!(
        !read.contains("Pattern verification failed"),
        "the grown part reads as zeros: {read}"
    );

    // A copy out during a resize gets the size at its resync.
    ok(&c, &["node", "stop", "3"]);
    qemu_io(&uri, "write -P 0x33 0 1M");
    ok(&c, &["volume", "resize", "vol0", "192M"]);
    qemu_io(&uri, "write -P 0x44 190M 1M");
    ok(&c, &["node", "start", "3"]);
    wait_all_in_sync(&c);
    let v = ok(&c, &["volume", "verify", "vol0"]);
    assert!(v.contains("0 mismatching"), "{v}");
    assert_eq!(nbd_size(&uri), 192 << 20);

    // Past the nodes' room: refused with the numbers, the size unchanged.
    let out = c.cli(&["volume", "resize", "vol0", "2G"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("growing a replica by") && text(&out).contains("1.0 GiB"),
        "{}",
        text(&out)
    );
    // Shrinking: only when asked for, and never under a writer.
    let out = c.cli(&["volume", "resize", "vol0", "32M"]);
    assert!(
        !out.status.success() && text(&out).contains("--allow-shrink"),
        "{}",
        text(&out)
    );
    let out = c.cli(&["volume", "resize", "vol0", "32M", "--allow-shrink"]);
    assert!(
        !out.status.success() && text(&out).contains("attached"),
        "{}",
        text(&out)
    );
    let info = ok(&c, &["--output", "json", "volume", "info", "vol0"]);
    let j: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(j["size"], 192u64 << 20, "{j}");

    // A volume nobody writes: grown and shrunk through a writer of the manager's own.
    ok(&c, &["volume", "create", "idle", "--size", "16M"]);
    ok(&c, &["volume", "resize", "idle", "48M"]);
    ok(&c, &["volume", "resize", "idle", "8M", "--allow-shrink"]);
    let info = ok(&c, &["--output", "json", "volume", "info", "idle"]);
    let j: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(j["size"], 8u64 << 20, "{j}");
    let v = ok(&c, &["volume", "verify", "idle"]);
    assert!(v.contains("0 mismatching"), "{v}");

    // After a restart, the sizes hold.
    let dir = c.stop();
    let c = Cluster::start_in(dir, &["--size", "64M", "--store", "file"]);
    assert_eq!(nbd_size(&c.unix), 192 << 20);
    let read = qemu_io(&c.unix, "read -P 0x44 190M 1M");
    assert!(!read.contains("Pattern verification failed"), "{read}");
    drop(c);
}

/// Issue 63: after a kill -9 a node counted each copy at its full size for ever. Now it asks
/// the files where they hold data: once the killed node is back, `pool` says of it what it
/// says of the others, what was written, and about what `du` finds in its directory.
#[test]
fn space_after_a_kill_is_what_the_files_hold() {
    need("qemu-io");
    let c = Cluster::start(&["--size", "1G", "--store", "file"]);
    run(std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 100M 8M", "-c", "flush"])
        .arg(&c.unix));
    let pid = node_pid(&c, 2);
    signal(pid, libc::SIGKILL);
    wait_restarted(&c, 2, pid);
    wait_all_in_sync(&c);
    // Written after the restart, unflushed, then killed again: still counted.
    run(std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5b 300M 4M"])
        .arg(&c.unix));
    let pid = node_pid(&c, 2);
    signal(pid, libc::SIGKILL);
    wait_restarted(&c, 2, pid);
    wait_all_in_sync(&c);
    let node_log = std::fs::read_to_string(c.path().join("node-2.log")).unwrap();
    assert!(
        node_log.contains("allocation map rebuilt from"),
        "{node_log}"
    );
    let p = pool(&c);
    for n in p["nodes"].as_array().unwrap() {
        assert_eq!(n["allocated"], 12u64 << 20, "node {}: {p}", n["id"]);
    }
    let on_disk = du(&c.path().join("node-2"));
    assert!(
        (12 << 20..32 << 20).contains(&on_disk),
        "node 2 holds {on_disk} bytes on disk; pool says 12 MiB: {p}"
    );
}
