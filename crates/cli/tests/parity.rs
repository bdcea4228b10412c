//! Parity volumes with real processes (issue 67): `trireme up --parity 2+1` on three node
//! processes and `--parity 4+2` on six, `bench --verify` through the NBD export while the
//! writer's encoder turns regions into stripes and folds overlays back, and nodes killed
//! (SIGKILL; two at once for 4+2, and for 2+1 one more than it tolerates) or frozen
//! (SIGSTOP) meanwhile. Afterwards: no I/O error,
//! the oracle found no lost, stale or corrupt block, every copy back in sync, regions in
//! parity, and the cluster healthy (a copy rebuilt whole is verified by its resync).

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
    // Two of three killed at once, one more than 2+1 tolerates: no copy is taken out that
    // could never be rebuilt (a chunk needs two in sync); I/O waits for them and goes on.
    let bench = start_bench(&c, 8);
    std::thread::sleep(Duration::from_secs(2));
    kill_at_once(&c, &[1, 3]);
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    encoded_and_healthy(&c, 128);
    let text = cli_ok(&c, &["volume", "info", "vol0"]);
    assert!(text.contains("regions in parity"), "{text}");
    // The overlay `up`'s writer keeps counts in the mirrored share: shown beside it.
    assert!(
        text.contains("of the volume mirrored over parity"),
        "{text}"
    );
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
    // A `trireme nbd` of vol0 fences `up`'s own writer, which goes on telling the manager
    // its usage: status shows the live writer's overlay at every look.
    let sock = c.path().join("vol0-nbd.sock");
    let (nbd, _) = common::spawn_nbd(&c, "vol0", &sock);
    std::thread::sleep(Duration::from_millis(2500));
    for _ in 0..8 {
        let r = &status(&c)["volumes"][0]["resiliency"]["regions"];
        assert!(r["overlay_blocks"].as_u64().is_some(), "{r}");
        std::thread::sleep(Duration::from_millis(300));
    }
    common::stop_nbd(nbd);
    // The minimum of copies counts a region's mirrored copies: 2 of 2+1's two.
    cli_ok(&c, &["volume", "set", "vol0", "--min-copies", "2"]);
    let bad = c.cli(&["volume", "set", "vol0", "--min-copies", "3"]);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && said.contains("from 1 to its 2"),
        "{said}"
    );
    // At creation too; a minimum refused leaves no volume behind.
    let create = |min: &str| {
        c.cli(&[
            "volume",
            "create",
            "p2",
            "--size",
            "8M",
            "--parity",
            "2+1",
            "--min-copies",
            min,
        ])
    };
    let bad = create("3");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && said.contains("from 1 to its 2"),
        "{said}"
    );
    assert!(!cli_ok(&c, &["volume", "list"]).contains("p2"));
    assert!(create("2").status.success());
    let info = cli_ok(&c, &["--output", "json", "volume", "info", "p2"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["min_copies"], 2, "{info}");
}

/// 4+2 on six node processes: two killed at once mid-encoding (as many as M) lose nothing;
/// then the whole cluster is killed right after unflushed writes over its stripes, and
/// loses none of them either.
#[test]
fn a_4_2_volume_loses_nothing_when_two_nodes_die_at_once() {
    const ARGS: [&str; 8] = [
        "--store", "file", "--size", "64M", "--nodes", "6", "--parity", "4+2",
    ];
    let c = Cluster::start(&ARGS);
    let bench = start_bench(&c, 10);
    std::thread::sleep(Duration::from_secs(3));
    kill_at_once(&c, &[2, 5]);
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    encoded_and_healthy(&c, 64);
    scrub_finds_rotten_chunks(&c, 4, 4);
    unflushed_writes_survive_a_whole_cluster_crash(c, &ARGS);
}

/// Kills `nodes`' processes at once (SIGKILL) and waits until `up` has restarted each.
fn kill_at_once(c: &Cluster, nodes: &[u32]) {
    let pids: Vec<i32> = nodes.iter().map(|&n| node_pid(c, n)).collect();
    for &p in &pids {
        signal(p, libc::SIGKILL);
    }
    for (&n, &p) in nodes.iter().zip(&pids) {
        wait_restarted(c, n, p);
    }
}

/// Writes a block in every 256 KiB of the volume through python libnbd, acknowledged and
/// never flushed (those over stripes go to the overlay, whose held bits no flush made
/// durable), kills `up` and every node at once (SIGKILL), starts the cluster again on its
/// directory, and reads every block back.
fn unflushed_writes_survive_a_whole_cluster_crash(mut c: Cluster, args: &[&str]) {
    common::need("/usr/bin/python3");
    let script = |c: &Cluster, what: &str| {
        format!(
            "import nbd\nh = nbd.NBD()\nh.connect_uri({:?})\nsize = h.get_size()\n\
             for i, off in enumerate(range(8192, size, 256 * 1024)):\n\
             \x20   want = off.to_bytes(8, 'little') + bytes([i % 251]) * 4088\n\
             \x20   {what}\n",
            c.unix
        )
    };
    let write = script(&c, "h.pwrite(want, off)");
    common::run(std::process::Command::new("/usr/bin/python3").args(["-c", &write]));
    let dir = c.crash();
    let c = Cluster::start_in(dir, args);
    wait_all_in_sync(&c);
    let check = script(
        &c,
        "assert h.pread(4096, off) == want, f'block at {off} lost its unflushed write'",
    );
    common::run(std::process::Command::new("/usr/bin/python3").args(["-c", &check]));
    // The nodes say whether the crash came before their maps' next flush (the case the
    // live copies are for) or after one (the bookkeeping flushes within a second or two).
    let taken: usize = (1..=6)
        .map(|n| {
            std::fs::read_to_string(c.path().join(format!("node-{n}.log"))).unwrap_or_default()
        })
        .map(|log| log.matches("held map taken from its live copy").count())
        .sum();
    eprintln!("{taken} of 6 held maps taken from their live copies after the crash");
}

/// `node drain` of a node holding a 2+1 copy, under `bench --verify`: the spare node takes
/// the copy's place in the stripes (the record's order), rebuilt whole while the old copy
/// stays in sync and serves, so a third node frozen meanwhile stops nothing; nothing is lost
/// and the drained node keeps nothing. A typo'd drain of a node that does not exist changes
/// nothing.
#[test]
fn a_drain_gives_a_parity_copys_place_to_another_node() {
    let c = Cluster::start(&[
        "--store", "file", "--size", "64M", "--nodes", "4", "--parity", "2+1",
    ]);
    let order = || -> Vec<u64> {
        let info = cli_ok(&c, &["--output", "json", "volume", "info", "vol0"]);
        let info: serde_json::Value = serde_json::from_str(&info).unwrap();
        info["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["node"].as_u64().unwrap())
            .collect()
    };
    let before = order();
    assert_eq!(before.len(), 3, "{before:?}");
    let spare = (1..=4).find(|n| !before.contains(n)).unwrap();
    let bad = c.cli(&["node", "drain", "9"]);
    assert!(!bad.status.success());
    // The old copy serves until the new one is whole: with a third node frozen meanwhile,
    // the volume (2+1) still has two in sync, and reads and writes go on.
    let bench = start_bench(&c, 12);
    std::thread::sleep(Duration::from_secs(2));
    let drained = before[1];
    let d = drained.to_string();
    cli_ok(&c, &["node", "drain", &d, "--rate", "4M", "--no-wait"]);
    let t0 = std::time::Instant::now();
    while !status(&c)["moves"][0]["progress"].is_object() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", c.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = cli_ok(&c, &["--output", "json", "volume", "info", "vol0"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let old = info["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == drained)
        .unwrap()
        .clone();
    assert_eq!(
        old["state"], "in-sync",
        "the old copy stays in sync: {info}"
    );
    let frozen = node_pid(&c, before[2] as u32);
    signal(frozen, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(4));
    signal(frozen, libc::SIGCONT);
    let t0 = std::time::Instant::now();
    while status(&c)["moves"][0]["state"] != "done" {
        assert!(t0.elapsed() < Duration::from_secs(90), "{}", c.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = order();
    assert_eq!(after, vec![before[0], spare, before[2]], "in its place");
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    encoded_and_healthy(&c, 128);
    let held = c
        .path()
        .join(format!("node-{drained}"))
        .join("replica-0000000000000001.data");
    assert!(!held.exists(), "the drained node deleted its copy");
    let r = cli_ok(&c, &["--output", "json", "volume", "scrub", "vol0"]);
    let r: serde_json::Value = serde_json::from_str(&r).unwrap();
    assert_eq!(r["mismatched_regions"], 0, "{r}");
    assert_eq!(r["unresolved"].as_array().map(Vec::len), Some(0), "{r}");
    // A node that stopped answering (frozen) is removed: the drained node, back in service,
    // takes its place, rebuilt from the other two while writes go on.
    cli_ok(&c, &["node", "undrain", &drained.to_string()]);
    let lost = after[2];
    let bench = start_bench(&c, 6);
    std::thread::sleep(Duration::from_secs(2));
    signal(node_pid(&c, lost as u32), libc::SIGSTOP);
    let out = cli_ok(&c, &["node", "remove", &lost.to_string()]);
    assert!(out.contains("done"), "{out}\n{}", c.log());
    assert_eq!(order(), vec![after[0], spare, drained], "in its place");
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    // With a copy out, a drain of another would leave fewer than K copies in sync: refused,
    // nothing changes.
    let bench = start_bench(&c, 4);
    std::thread::sleep(Duration::from_secs(1));
    let frozen = node_pid(&c, after[0] as u32);
    signal(frozen, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    let bad = c.cli(&["node", "drain", &spare.to_string()]);
    signal(frozen, libc::SIGCONT);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && said.contains("could not make the new copies of vol0"),
        "{said}"
    );
    finish_bench(&c, bench);
    wait_all_in_sync(&c);
    assert_eq!(order(), vec![after[0], spare, drained]);
    encoded_and_healthy(&c, 128);
}

/// Rots one block of node `node`'s chunk of every region (both chunk slots, behind the
/// node's back: bit rot) of a `k`+2 volume; `volume scrub` finds and rebuilds the chunk of
/// each region in parity (the slot not in use is never read), and a second scrub finds
/// nothing.
fn scrub_finds_rotten_chunks(c: &Cluster, node: u32, k: u64) {
    use std::os::unix::fs::FileExt;
    let data = c
        .path()
        .join(format!("node-{node}"))
        .join("replica-0000000000000001.data");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    let (chunk, region) = (64 * 4096, k * 64 * 4096);
    let stride = region + 2 * chunk;
    let regions = status(c)["volumes"][0]["resiliency"]["regions"]["regions"]
        .as_u64()
        .unwrap();
    for r in 0..regions {
        for slot in 0..2 {
            f.write_all_at(&[0xee; 4096], r * stride + region + slot * chunk + 8192)
                .unwrap();
        }
    }
    f.sync_all().unwrap();
    let scrub = || {
        let out = cli_ok(c, &["--output", "json", "volume", "scrub", "vol0"]);
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let r = scrub();
    let in_parity = status(c)["volumes"][0]["resiliency"]["regions"]["parity"]
        .as_u64()
        .unwrap();
    let repaired = r["repaired"].as_array().unwrap();
    assert!(!repaired.is_empty(), "{r}");
    assert!(repaired.len() as u64 <= in_parity, "{r}");
    assert!(repaired.iter().all(|p| p[1] == node), "{r}");
    assert_eq!(r["unresolved"].as_array().map(Vec::len), Some(0), "{r}");
    assert!(r["stripes_checked"].as_u64().unwrap() > 0, "{r}");
    let again = scrub();
    assert_eq!(again["mismatched_regions"], 0, "{again}");
}

/// The encoder ran (some of the volume's `regions` are stripes), and the cluster is healthy
/// once every copy is back: a rebuilt copy is verified, not left unverified.
fn encoded_and_healthy(c: &Cluster, regions: u64) {
    let s = status(c);
    let r = &s["volumes"][0]["resiliency"]["regions"];
    assert!(
        r["parity"].as_u64().unwrap() > 0,
        "the encoder ran: {r}\n{}",
        c.log()
    );
    assert_eq!(r["regions"].as_u64(), Some(regions), "{r}");
    let t0 = std::time::Instant::now();
    loop {
        let s = status(c);
        if s["health"]["verdict"] == "healthy" {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not healthy: {}\n{}\n{}",
            s["health"],
            cli_ok(c, &["--output", "json", "volume", "info", "vol0"]),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
