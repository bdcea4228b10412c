//! A parity volume with real processes (issue 67): `trireme up --parity 2+1` on three node
//! processes, `bench --verify` through its NBD export while the writer's encoder turns
//! regions into stripes and folds overlays back, a node killed (SIGKILL) and another frozen
//! (SIGSTOP) meanwhile. Afterwards: no I/O error, the oracle found no lost, stale or corrupt
//! block, every copy back in sync, regions in parity, and the cluster healthy (a copy rebuilt
//! whole is verified by its resync).

mod common;

use std::time::Duration;

use common::{
    cli_ok, finish_bench, node_pid, signal, start_bench, status, wait_all_in_sync, wait_restarted,
    Cluster,
};

#[test]
fn a_parity_volume_loses_nothing_when_nodes_die_while_it_encodes() {
    let c = Cluster::start(&[
        "--store", "file", "--size", "64M", "--nodes", "3", "--parity", "2+1",
    ]);
    let info = cli_ok(&c, &["volume", "info", "vol0"]);
    assert!(info.contains("parity 2+1 on 3 nodes"), "{info}");
    let bench = start_bench(&c, 12);
    std::thread::sleep(Duration::from_secs(3));
    // A crash mid-encoding: restarted by `up`, rebuilt whole by the writer.
    let p2 = node_pid(&c, 2);
    signal(p2, libc::SIGKILL);
    wait_restarted(&c, 2, p2);
    wait_all_in_sync(&c);
    // A freeze past the replica timeout: taken out, reads rebuilt around it, then back.
    let p3 = node_pid(&c, 3);
    signal(p3, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    signal(p3, libc::SIGCONT);
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    let s = status(&c);
    let v = &s["volumes"][0];
    let regions = &v["resiliency"]["regions"];
    assert!(
        regions["parity"].as_u64().unwrap() > 0,
        "the encoder ran: {regions}\n{}",
        c.log()
    );
    assert_eq!(regions["regions"].as_u64(), Some(128), "{regions}");
    // Healthy once every copy is back: a rebuilt copy is verified, not left unverified.
    let t0 = std::time::Instant::now();
    loop {
        let s = status(&c);
        if s["health"]["verdict"] == "healthy" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not healthy: {}\n{}",
            s["health"],
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = cli_ok(&c, &["volume", "info", "vol0"]);
    assert!(text.contains("regions in parity"), "{text}");
    // The export says 4 KiB is its smallest block, so a client merges a part block itself
    // (the writer refuses part blocks): qemu writes 512 bytes and reads them back.
    common::need("nbdinfo");
    common::need("qemu-io");
    let info = common::run(std::process::Command::new("nbdinfo").args(["--json", &c.unix]));
    assert!(info.contains("\"block_size_minimum\": 4096"), "{info}");
    let out = common::run(std::process::Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x11 512 512",
        "-c",
        "read -P 0x11 512 512",
        &c.unix,
    ]));
    // qemu-io exits 0 whatever its commands did: its report says.
    assert!(
        out.contains("wrote 512/512 bytes") && out.contains("read 512/512 bytes"),
        "{out}"
    );
    assert!(!out.contains("failed"), "{out}");
}
