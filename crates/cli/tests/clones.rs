//! Clones with real processes: made from a snapshot at once, read back byte for byte over NBD
//! while the parent goes on, written without touching the parent; kept through a node's kill
//! -9, a whole-cluster kill -9 and a drain of a node holding parent and clone; the snapshot
//! and the parent kept from deletion while a clone reads them; flattened, then independent.

mod common;
use common::*;
use std::process::Command;

const SIZE: usize = 32 << 20;

/// Writes `bytes` at `at` of the image file `img` and of the volume behind `uri`.
fn write_both(img: &std::path::Path, uri: &str, at: u64, bytes: &[u8], dir: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .unwrap()
        .write_all_at(bytes, at)
        .unwrap();
    let piece = dir.join("piece");
    std::fs::write(&piece, bytes).unwrap();
    // Through python libnbd (Debian's python3 has it), flushed.
    let py = format!(
        "import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\nh.pwrite(open({:?}, 'rb').read(), {at})\nh.flush()\nh.shutdown()\n",
        piece.display().to_string()
    );
    run(Command::new("/usr/bin/python3").args(["-c", &py]));
}

/// Stops a `trireme nbd` cleanly (it detaches: the volume may be moved or deleted after).
fn stop(mut child: std::process::Child) {
    signal(child.id() as i32, libc::SIGTERM);
    let _ = child.wait();
}

#[test]
fn clones_share_a_snapshot_survive_kills_and_a_drain_and_flatten_to_stand_alone() {
    for t in ["qemu-img", "/usr/bin/python3"] {
        need(t);
    }
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let args = ["--store", "file", "--size", "32M", "--nodes", "4"];
    let mut c = Cluster::start(&args);
    // A golden image, snapshotted; the parent goes on after it.
    let gold = w.join("gold.img");
    random_file(&gold, SIZE, 1);
    write_image(&gold, &c.unix);
    ok(&c, &["volume", "snapshot", "create", "vol0", "gold"]);
    let parent = w.join("parent.img");
    std::fs::copy(&gold, &parent).unwrap();
    write_both(&parent, &c.unix, 4096 * 7 + 100, &[0xaa; 20000], w);

    let t0 = std::time::Instant::now();
    for i in 0..3 {
        let s = ok(&c, &["volume", "clone", "vol0@gold", &format!("web{i}")]);
        assert!(s.contains("a clone of vol0@gold"), "{s}");
    }
    eprintln!("3 clones of a 32 MiB volume in {:?}", t0.elapsed());
    assert_eq!(replica_nodes(&c, "web0"), replica_nodes(&c, "vol0"));
    let info: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "info", "web0"])).unwrap();
    assert_eq!(info["parent"]["snapshot"], "gold", "{info}");

    // A clone reads the snapshot, not the parent now; its writes stay its own.
    let (web0, uri) = spawn_nbd(&c, "web0", &w.join("web0.sock"));
    compare_image(&gold, &uri);
    let model = w.join("web0.img");
    std::fs::copy(&gold, &model).unwrap();
    write_both(&model, &uri, 4096 * 3 + 1000, &[0x5a; 9000], w);
    write_both(&model, &uri, (SIZE - 4096) as u64, &[0x11; 4096], w);
    compare_image(&model, &uri);
    compare_image(&parent, &c.unix);
    let (web1, uri1) = spawn_nbd(&c, "web1", &w.join("web1.sock"));
    compare_image(&gold, &uri1);
    stop(web1);

    // What clones read cannot go; a bad clone request changes nothing.
    refused(
        &c,
        &["volume", "snapshot", "delete", "vol0", "gold"],
        "has clones that read from it: web0, web1, web2",
    );
    refused(
        &c,
        &["volume", "delete", "vol0"],
        "has clones that read from it",
    );
    refused(
        &c,
        &["volume", "clone", "vol0@gold", "web1"],
        "already exists",
    );
    refused(&c, &["volume", "clone", "vol0@none", "web9"], "no snapshot");
    refused(&c, &["volume", "clone", "vol0", "web9"], "VOLUME@SNAPSHOT");
    refused(&c, &["volume", "flatten", "vol0"], "no clone");

    // A node holding copies of both is killed (-9) and comes back: the clone there is tied
    // to its parent again.
    let n = replica_nodes(&c, "web0")[0] as u32;
    let pid = node_pid(&c, n);
    signal(pid, libc::SIGKILL);
    wait_restarted(&c, n, pid);
    wait_all_in_sync(&c);
    compare_image(&model, &uri);
    stop(web0);
    let out = ok(&c, &["volume", "verify", "web0"]);
    assert!(out.contains(" 0 mismatching"), "{out}");

    // The whole cluster is killed (-9).
    let dir = c.crash();
    let c = Cluster::start_in(dir, &args);
    wait_all_in_sync(&c);
    let (web0, uri) = spawn_nbd(&c, "web0", &w.join("vm0b.sock"));
    compare_image(&model, &uri);
    stop(web0);

    // Drain a node holding copies of the parent and of the clones: the clones' copies there
    // take their blocks before the parent's copy goes.
    let drained = replica_nodes(&c, "web0")[0];
    let out = ok(&c, &["node", "drain", &drained.to_string()]);
    assert!(out.contains("done"), "{out}");
    for v in ["vol0", "web0", "web2"] {
        assert!(!replica_nodes(&c, v).contains(&drained), "{v}");
    }
    // The parent's volume sorts first, so its copy moved while the clones' copies still
    // read from it there.
    assert!(c.log().contains("a clone's copy flattened"), "{}", c.log());
    assert!(!c.log().contains("old replica not deleted"), "{}", c.log());
    wait_all_in_sync(&c);
    let (web0, uri) = spawn_nbd(&c, "web0", &w.join("vm0c.sock"));
    compare_image(&model, &uri);
    stop(web0);
    let out = ok(&c, &["volume", "verify", "web0"]);
    assert!(out.contains(" 0 mismatching"), "{out}");

    // Flattened, web0 stands alone; the others still keep the snapshot.
    let out = ok(&c, &["volume", "flatten", "web0"]);
    assert!(out.contains("flattened"), "{out}");
    refused(
        &c,
        &["volume", "snapshot", "delete", "vol0", "gold"],
        "web1, web2",
    );
    ok(&c, &["volume", "delete", "web1", "--keep", "1d"]);
    refused(
        &c,
        &["volume", "snapshot", "delete", "vol0", "gold"],
        "web1 (in the trash",
    );
    ok(&c, &["volume", "trash", "purge", "web1"]);
    ok(&c, &["volume", "flatten", "web2"]);
    ok(&c, &["volume", "snapshot", "delete", "vol0", "gold"]);
    let (web0, uri) = spawn_nbd(&c, "web0", &w.join("vm0d.sock"));
    compare_image(&model, &uri);
    stop(web0);
    let (web2, uri2) = spawn_nbd(&c, "web2", &w.join("web2.sock"));
    compare_image(&gold, &uri2);
    stop(web2);
    compare_image(&parent, &c.unix);
}

/// Writes `image` onto volume `volume` through `trireme nbd`, which is its writer only
/// meanwhile (a volume nobody writes may shrink and roll back).
fn write_through_nbd(c: &Cluster, volume: &str, image: &std::path::Path, dir: &std::path::Path) {
    let (nbd, uri) = spawn_nbd(c, volume, &dir.join("writer.sock"));
    write_image(image, &uri);
    stop_nbd(nbd);
}

/// A volume written after a snapshot grows, and is written past its old end, and shrinks
/// below the size of its first snapshot; each snapshot keeps the size the volume had when it
/// was taken (exported, cloned and listed at it, its bytes intact); a rollback across sizes is
/// refused with what to do, and changes nothing; sizes and bytes survive a whole-cluster kill
/// -9; then, grown back to the snapshot's size, the volume rolls back to it.
#[test]
fn a_volume_with_snapshots_resizes_and_each_snapshot_keeps_its_size() {
    need("qemu-img");
    let w = tempfile::tempdir().unwrap();
    let args = ["--store", "file", "--size", "1M"];
    let mut c = Cluster::start(&args);
    ok(&c, &["volume", "create", "v", "--size", "16M"]);
    let (small, old, grown) = (
        w.path().join("small.img"),
        w.path().join("old.img"),
        w.path().join("grown.img"),
    );
    random_file(&small, 16 << 20, 5);
    write_through_nbd(&c, "v", &small, w.path());
    ok(&c, &["volume", "snapshot", "create", "v", "before"]);
    // Every block moved: the pool past the old end holds the head now.
    random_file(&old, 16 << 20, 6);
    write_through_nbd(&c, "v", &old, w.path());
    let out = ok(&c, &["volume", "resize", "v", "32M"]);
    assert!(out.contains("to 32.0 MiB"), "{out}");
    let mut bytes = std::fs::read(&old).unwrap();
    bytes.resize(32 << 20, 0);
    std::fs::write(&grown, &bytes).unwrap();
    export_is(&c, "v", &grown, w.path());
    // Rewritten, and written past the old end up to 24 MiB.
    random_file(&grown, 24 << 20, 7);
    let mut bytes = std::fs::read(&grown).unwrap();
    bytes.resize(32 << 20, 0);
    std::fs::write(&grown, &bytes).unwrap();
    write_through_nbd(&c, "v", &grown, w.path());
    ok(&c, &["volume", "snapshot", "create", "v", "after"]);
    let list = ok(&c, &["volume", "snapshot", "list", "v"]);
    assert!(
        list.contains("16.0 MiB") && list.contains("32.0 MiB"),
        "{list}"
    );
    // A refusal that says what to do, and changes nothing.
    refused(
        &c,
        &["volume", "rollback", "v", "before"],
        "resize the volume to the snapshot's size first",
    );
    export_is(&c, "v", &grown, w.path());
    // Below the size `before` was taken at: the snapshots keep every byte.
    ok(&c, &["volume", "resize", "v", "8M", "--allow-shrink"]);
    let head = w.path().join("head.img");
    std::fs::write(&head, &std::fs::read(&grown).unwrap()[..8 << 20]).unwrap();
    export_is(&c, "v", &head, w.path());
    export_is(&c, "v@before", &small, w.path());
    export_is(&c, "v@after", &grown, w.path());
    ok(&c, &["volume", "clone", "v@before", "copy"]);
    export_is(&c, "copy", &small, w.path());
    // The whole cluster killed -9: sizes, snapshots and bytes come back.
    let dir = c.crash();
    let mut c = Cluster::start_in(dir, &args);
    wait_all_in_sync(&c);
    export_is(&c, "v", &head, w.path());
    export_is(&c, "v@before", &small, w.path());
    export_is(&c, "v@after", &grown, w.path());
    let v = ok(&c, &["volume", "verify", "v"]);
    assert!(v.contains(" 0 mismatching"), "{v}");
    // Back to the first snapshot's size, then to its bytes.
    ok(&c, &["volume", "resize", "v", "16M"]);
    let mut bytes = std::fs::read(&head).unwrap();
    bytes.resize(16 << 20, 0);
    std::fs::write(&head, &bytes).unwrap();
    export_is(&c, "v", &head, w.path());
    ok(&c, &["volume", "rollback", "v", "before"]);
    export_is(&c, "v", &small, w.path());
    export_is(&c, "v@after", &grown, w.path());
    let v = ok(&c, &["volume", "verify", "v"]);
    assert!(v.contains(" 0 mismatching"), "{v}");
    c.stop();
}
