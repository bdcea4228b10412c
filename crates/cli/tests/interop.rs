//! Real NBD clients against a real 3-way cluster: fio, qemu-img, qemu-io, nbdinfo, nbdcopy.

mod common;
use common::*;
use std::process::Command;

#[test]
fn fio_verify_with_several_jobs_on_a_3_way_volume() {
    need("fio");
    // Plain TCP: fio's nbd engine cannot name TLS credentials (libnbd refuses local files in
    // URIs unless the program allows them, and fio does not); TLS is covered in `tls.rs`.
    let c = Cluster::start(&["--store", "file", "--size", "256M", "--insecure"]);
    for uri in [&c.unix, &c.tcp] {
        let out = run(Command::new("fio").args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--numjobs=4",
            "--size=16M",
            "--offset_increment=32M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--do_verify=1",
            "--group_reporting",
        ]));
        assert!(out.contains("err= 0"), "{out}");
    }
    // A separate verify-only pass re-reads what the writers left.
    let out = run(Command::new("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", c.unix),
        "--rw=randread",
        "--bs=4k",
        "--numjobs=4",
        "--size=16M",
        "--offset_increment=32M",
        "--verify=crc32c",
        "--verify_only",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]));
    assert!(out.contains("err= 0"), "{out}");
    assert_replicas_identical(&c, "vol0");
}

#[test]
fn qemu_and_libnbd_tools_round_trip() {
    for t in ["qemu-img", "qemu-io", "nbdinfo", "nbdcopy"] {
        need(t);
    }
    let c = Cluster::start(&["--store", "memory", "--size", "256M"]);
    let src = c.path().join("src.img");
    let back = c.path().join("back.img");
    random_file(&src, 64 << 20, 42);

    // qemu-img convert in and out, then compare.
    write_image(&src, &c.unix);
    // Back out over TCP: TLS, with the credentials `up` wrote.
    let tls = c.qemu_tls("vol0");
    run(Command::new("qemu-img")
        .args(["convert"])
        .args(&tls)
        .args(["-O", "raw"])
        .arg(&back));
    run(Command::new("truncate").args(["-s", "64M"]).arg(&back));
    let out = run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&back));
    assert!(out.contains("identical"), "{out}");

    // qemu-io: patterns, write-zeroes, discard, flush, FUA.
    let out = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0xab 100M 1M",
        "-c",
        "read -P 0xab 100M 1M",
        "-c",
        "write -z 100M 64k",
        "-c",
        "read -P 0 100M 64k",
        "-c",
        "read -P 0xab 104923136 64k",
        "-c",
        "write -P 0x5a 200M 2M",
        "-c",
        "discard 200M 1M",
        "-c",
        "read -P 0 200M 1M",
        "-c",
        "read -P 0x5a 201M 1M",
        "-c",
        "flush",
        "-c",
        "write -f -P 0xcd 210M 4k",
        "-c",
        "read -P 0xcd 210M 4k",
        "-c",
        "write -P 0x11 250M 512",
        "-c",
        "read -P 0x11 250M 512",
        &c.unix,
    ]));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.to_lowercase().contains("error"), "{out}");

    // nbdinfo --map shows holes where nothing was written (and where we discarded).
    let map = run(Command::new("nbdinfo").arg("--map").arg(&c.unix));
    let rows: Vec<(u64, u64, u32)> = map
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    let state_at = |off: u64| {
        rows.iter()
            .find(|r| r.0 <= off && off < r.0 + r.1)
            .map(|r| r.2)
            .unwrap()
    };
    assert_eq!(state_at(0), 0, "written data is allocated:\n{map}");
    assert_eq!(state_at(80 << 20), 3, "never written is a hole:\n{map}");
    assert_eq!(state_at(200 << 20), 3, "discarded is a hole:\n{map}");
    assert_eq!(state_at(201 << 20), 0, "{map}");

    // nbdcopy round trip.
    let copy = c.path().join("copy.img");
    run(Command::new("nbdcopy").arg(&c.tcp).arg(&copy));
    let a = std::fs::read(&copy).unwrap();
    let b = std::fs::read(&src).unwrap();
    assert_eq!(a.len(), 256 << 20);
    assert!(a[..b.len()] == b[..], "nbdcopy read back different bytes");
    run(Command::new("nbdcopy")
        .arg(&src)
        .arg(&c.unix)
        .arg("--destination-is-zero"));

    assert_replicas_identical(&c, "vol0");
}
