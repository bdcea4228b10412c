//! Incremental backup with the clients people already use, against real processes: the
//! `qemu:dirty-bitmap:SNAP` context read by nbdinfo, qemu-img and python libnbd; `volume
//! diff` / `import-diff` in Ceph's rbd diff format; `volume backup` / `restore` chains; and
//! damaged input refused with nothing changed.

mod common;
use common::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const SIZE: usize = 32 << 20;
const BLOCK: usize = 4096;

/// Writes `pattern` over `[at, at+len)` of the volume through qemu-io (0: a discard), and
/// into the model; the 4 KiB blocks it touched.
fn put(c: &Cluster, model: &mut [u8], at: usize, len: usize, pattern: u8) -> BTreeSet<usize> {
    let cmd = if pattern == 0 {
        format!("discard {at} {len}")
    } else {
        format!("write -P {pattern} {at} {len}")
    };
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", &cmd])
        .arg(&c.unix));
    model[at..at + len].fill(pattern);
    (at / BLOCK..(at + len).div_ceil(BLOCK)).collect()
}

/// A few scattered writes (one unaligned, one across blocks) and a discard: the blocks
/// touched.
fn round(c: &Cluster, model: &mut [u8], seed: usize) -> BTreeSet<usize> {
    let p = (seed * 37 % 200 + 20) as u8;
    let mut touched = put(c, model, seed * 65536, 3 * BLOCK, p);
    touched.extend(put(c, model, (seed + 100) * 65536 + 512, 6000, p + 1));
    touched.extend(put(c, model, (seed + 200) * 65536, BLOCK, p + 2));
    touched.extend(put(c, model, (seed + 300) * 65536, 2 * BLOCK, 0));
    touched
}

/// The 4 KiB blocks a `nbdinfo --map` of a dirty bitmap marks dirty.
fn nbdinfo_dirty(uri: &str, snap: &str) -> BTreeSet<usize> {
    let out = run(Command::new("nbdinfo")
        .arg(format!("--map=qemu:dirty-bitmap:{snap}"))
        .arg(uri));
    let mut dirty = BTreeSet::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (at, len, flags): (usize, usize, u32) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
        );
        assert_eq!((at % BLOCK, len % BLOCK), (0, 0), "{out}");
        if flags & 1 != 0 {
            dirty.extend(at / BLOCK..(at + len) / BLOCK);
        }
    }
    dirty
}

/// The same through qemu-img's `x-dirty-bitmap` (dirty blocks show as `"data": false`).
fn qemu_dirty(sock: &Path, export: &str, snap: &str) -> BTreeSet<usize> {
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={},export={export},x-dirty-bitmap=qemu:dirty-bitmap:{snap}",
        sock.display()
    );
    let out = run(Command::new("qemu-img").args(["map", "--output=json", "--image-opts", &opts]));
    let map: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut dirty = BTreeSet::new();
    for e in map.as_array().unwrap() {
        if e["data"] == false {
            let (at, len) = (
                e["start"].as_u64().unwrap() as usize,
                e["length"].as_u64().unwrap() as usize,
            );
            dirty.extend(at / BLOCK..(at + len) / BLOCK);
        }
    }
    dirty
}

/// The same through python libnbd, asking for the context by name.
fn libnbd_dirty(uri: &str, snap: &str) -> BTreeSet<usize> {
    let py = format!(
        r#"
import nbd
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.add_meta_context("qemu:dirty-bitmap:{snap}")
h.connect_uri({uri:?})
assert h.can_meta_context("qemu:dirty-bitmap:{snap}")
assert h.can_meta_context("base:allocation")
size, pos, out, seen = h.get_size(), 0, [], set()
def got(ctx, off, ents, err):
    global pos
    seen.add(ctx)
    if ctx != "qemu:dirty-bitmap:{snap}":
        return 0
    for i in range(0, len(ents), 2):
        if ents[i + 1] & 1:
            out.append((off, ents[i]))
        off += ents[i]
    pos = off
    return 0
while pos < size:
    h.block_status(min(size - pos, 8 << 20), pos, got)
# Both contexts answered each request (a chunk each).
assert seen == {{"base:allocation", "qemu:dirty-bitmap:{snap}"}}, seen
for a, n in out:
    print(a, n)
"#
    );
    let out = run(Command::new("/usr/bin/python3").args(["-c", &py]));
    let mut dirty = BTreeSet::new();
    for l in out.lines() {
        let mut f = l.split_whitespace().map(|x| x.parse::<usize>().unwrap());
        let (at, len) = (f.next().unwrap(), f.next().unwrap());
        dirty.extend(at / BLOCK..(at + len) / BLOCK);
    }
    dirty
}

fn stop(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn dirty_bitmaps_diffs_and_backup_chains_are_exact() {
    for t in ["qemu-img", "qemu-io", "nbdinfo", "/usr/bin/python3"] {
        need(t);
    }
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let c = Cluster::start(&["--store", "file", "--size", "32M"]);
    let mut model = vec![0u8; SIZE];
    round(&c, &mut model, 1);
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    std::fs::write(w.join("s1.img"), &model).unwrap();
    let b = round(&c, &mut model, 2);
    ok(&c, &["volume", "snapshot", "create", "vol0", "s2"]);
    std::fs::write(w.join("s2.img"), &model).unwrap();
    let head = round(&c, &mut model, 3);

    // What changed from s1 to s2, on s2's export, by three clients; what changed since s2,
    // on the volume's own export (its writer asks a copy in sync).
    let sock = w.join("s2.sock");
    let (s2, uri) = spawn_nbd(&c, "vol0@s2", &sock);
    assert_eq!(nbdinfo_dirty(&uri, "s1"), b);
    assert_eq!(qemu_dirty(&sock, "vol0@s2", "s1"), b);
    assert_eq!(libnbd_dirty(&uri, "s1"), b);
    assert_eq!(nbdinfo_dirty(&c.unix, "s2"), head);
    let all: BTreeSet<usize> = b.union(&head).copied().collect();
    assert_eq!(libnbd_dirty(&c.unix, "s1"), all);
    // A snapshot's export offers only older snapshots; an unknown context is not set.
    let list = run(Command::new("nbdinfo")
        .args(["--list", "--content"])
        .arg(&uri));
    assert!(
        list.contains("qemu:dirty-bitmap:s1") && !list.contains("qemu:dirty-bitmap:s2"),
        "{list}"
    );
    let o = Command::new("nbdinfo")
        .arg("--map=qemu:dirty-bitmap:nosuch")
        .arg(&uri)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    stop(s2);

    // `volume diff` in rbd's format; applied to a new volume it gives s1, then s2.
    let full1 = w.join("s1.rbdiff");
    let d12 = w.join("s1-s2.rbdiff");
    ok(
        &c,
        &["volume", "diff", "vol0@s1", "-o", full1.to_str().unwrap()],
    );
    let said = ok(
        &c,
        &[
            "volume",
            "diff",
            "vol0@s1",
            "vol0@s2",
            "-o",
            d12.to_str().unwrap(),
        ],
    );
    assert!(said.contains("wrote"), "{said}");
    let head_bytes = std::fs::read(&d12).unwrap();
    // Version 1: the only one `rbd import-diff` reads.
    assert!(head_bytes.starts_with(b"rbd diff v1\n"));
    // Only the changed blocks are in it (with record headers and the names).
    assert!(
        (head_bytes.len() as usize) < b.len() * BLOCK + 4096,
        "{} bytes for {} changed blocks",
        head_bytes.len(),
        b.len()
    );
    ok(&c, &["volume", "create", "copy", "--size", "32M"]);
    refused(
        &c,
        &["volume", "import-diff", d12.to_str().unwrap(), "copy"],
        "starts from snapshot \"s1\"",
    );
    // A cut or damaged file changes nothing.
    let cut = w.join("cut.rbdiff");
    let whole = std::fs::read(&full1).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    refused(
        &c,
        &["volume", "import-diff", cut.to_str().unwrap(), "copy"],
        "nothing was applied",
    );
    // Read once, from one descriptor: a FIFO (read twice, it would differ) and a file other
    // users may write (it could change between the check and the apply) are refused.
    let fifo = w.join("fifo.rbdiff");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    refused(
        &c,
        &["volume", "import-diff", fifo.to_str().unwrap(), "copy"],
        "not a regular file",
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let shared = w.join("shared.rbdiff");
        std::fs::copy(&full1, &shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).unwrap();
        refused(
            &c,
            &["volume", "import-diff", shared.to_str().unwrap(), "copy"],
            "other users may write it",
        );
    }
    let said = ok(
        &c,
        &["volume", "import-diff", full1.to_str().unwrap(), "copy"],
    );
    assert!(said.contains("took snapshot copy@s1"), "{said}");
    ok(
        &c,
        &["volume", "import-diff", d12.to_str().unwrap(), "copy"],
    );
    refused(
        &c,
        &["volume", "import-diff", d12.to_str().unwrap(), "copy"],
        "already has snapshot \"s2\"",
    );
    let (cp, uri) = spawn_nbd(&c, "copy", &w.join("copy.sock"));
    compare_image(&w.join("s2.img"), &uri);
    stop(cp);
    // Ceph's own code reads what `volume diff` writes: `rbd merge-diff` (it needs no cluster)
    // merges the two into one diff to s2, which, applied to a new volume, gives s2.
    let merged = w.join("merged.rbdiff");
    let o = Command::new("rbd")
        .args(["merge-diff", "--no-progress"])
        .args([&full1, &d12, &merged])
        .output()
        .expect("rbd (ceph-common) runs");
    assert!(o.status.success(), "rbd merge-diff: {}", text(&o));
    ok(&c, &["volume", "create", "viaceph", "--size", "32M"]);
    ok(
        &c,
        &["volume", "import-diff", merged.to_str().unwrap(), "viaceph"],
    );
    let (cp, uri) = spawn_nbd(&c, "viaceph", &w.join("viaceph.sock"));
    compare_image(&w.join("s2.img"), &uri);
    stop(cp);
    // Version 2 on request.
    let v2 = w.join("v2.rbdiff");
    ok(
        &c,
        &[
            "volume",
            "diff",
            "vol0@s1",
            "vol0@s2",
            "--export-format",
            "2",
            "-o",
            v2.to_str().unwrap(),
        ],
    );
    assert!(std::fs::read(&v2).unwrap().starts_with(b"rbd diff v2\n"));
    refused(
        &c,
        &[
            "volume",
            "diff",
            "vol0@s2",
            "--export-format",
            "3",
            "-o",
            "/dev/null",
        ],
        "3",
    );
    refused(
        &c,
        &["volume", "diff", "vol0@s2", "vol0@s1", "-o", "/dev/null"],
        "not older",
    );
    refused(
        &c,
        &["volume", "diff", "vol0@s1", "copy@s2", "-o", "/dev/null"],
        "different volumes",
    );
    // A diff holds the volume's data: written 0600, never into a directory others may write,
    // never through a link planted at its name.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&full1).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let open = w.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let o = open.join("x.diff");
        refused(
            &c,
            &["volume", "diff", "vol0@s2", "-o", o.to_str().unwrap()],
            "may be written by other users",
        );
        let victim = w.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, w.join("planted.part")).unwrap();
        let o = w.join("planted.diff");
        let out = c.cli(&["volume", "diff", "vol0@s2", "-o", o.to_str().unwrap()]);
        assert!(!out.status.success(), "a diff wrote through a planted link");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    // Backups: a full one, then incrementals that read only what changed.
    let dir = w.join("backups");
    let d = dir.to_str().unwrap();
    let full: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "backup", "vol0", "--to", d],
    ))
    .unwrap();
    assert!(full["from"].is_null(), "{full}");
    std::fs::write(w.join("b1.img"), &model).unwrap();
    // A second apart at least: backups are named by the second.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let changed = round(&c, &mut model, 4);
    let inc: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["--output", "json", "volume", "backup", "vol0", "--to", d],
    ))
    .unwrap();
    std::fs::write(w.join("b2.img"), &model).unwrap();
    assert_eq!(inc["from"], full["snapshot"], "{inc}");
    let read = inc["stats"]["read_bytes"].as_u64().unwrap();
    let ch = inc["stats"]["changed_bytes"].as_u64().unwrap();
    assert_eq!(ch, (changed.len() * BLOCK) as u64, "{inc}");
    assert!(read <= ch, "{inc}");
    eprintln!("incremental backup: {read} bytes read for {ch} changed");
    // The first backup's snapshot gave way to the second's.
    let snaps = ok(&c, &["volume", "snapshot", "list", "vol0"]);
    assert!(
        !snaps.contains(full["snapshot"].as_str().unwrap()),
        "{snaps}"
    );
    assert!(snaps.contains(inc["snapshot"].as_str().unwrap()), "{snaps}");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    round(&c, &mut model, 5);
    ok(&c, &["volume", "backup", "vol0", "--to", d]);
    std::fs::write(w.join("b3.img"), &model).unwrap();

    // The newest restored, and one from the middle of the chain.
    ok(&c, &["volume", "restore", d, "r3"]);
    let (r, uri) = spawn_nbd(&c, "r3", &w.join("r3.sock"));
    compare_image(&w.join("b3.img"), &uri);
    stop(r);
    ok(
        &c,
        &[
            "volume",
            "restore",
            d,
            "r2",
            "--at",
            inc["snapshot"].as_str().unwrap(),
        ],
    );
    let (r, uri) = spawn_nbd(&c, "r2", &w.join("r2.sock"));
    compare_image(&w.join("b2.img"), &uri);
    stop(r);
    // A damaged file is found before anything is created.
    let f = dir.join(inc["file"].as_str().unwrap());
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&f, &bytes).unwrap();
    refused(&c, &["volume", "restore", d, "r4"], "is damaged");
    refused(&c, &["volume", "info", "r4"], "no volume named");
    refused(
        &c,
        &["volume", "backup", "copy", "--to", d],
        "holds backups of volume vol0",
    );
    refused(
        &c,
        &["volume", "restore", d, "r5", "--at", "nosuch"],
        "no backup of snapshot",
    );

    // `volume verify` compares every snapshot's copies too; a block damaged on one copy's disk
    // (under the volume and its snapshots alike) is found in both.
    let v: serde_json::Value =
        serde_json::from_str(&ok(&c, &["--output", "json", "volume", "verify", "vol0"])).unwrap();
    let checked = v["snapshots"].as_array().unwrap();
    assert!(checked.len() >= 3, "{v}");
    for s in checked {
        assert_eq!(s["nodes"].as_array().unwrap().len(), 3, "{v}");
        assert_eq!(s["mismatches"].as_array().unwrap().len(), 0, "{v}");
        assert_eq!(s["bytes_compared"], SIZE as u64, "{v}");
    }
    let id = serde_json::from_str::<serde_json::Value>(&ok(
        &c,
        &["--output", "json", "volume", "info", "vol0"],
    ))
    .unwrap()["id"]
        .as_u64()
        .unwrap();
    let data = c
        .path()
        .join("node-1")
        .join(format!("replica-{id:016x}.data"));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
        f.write_all_at(b"damage", 65536 + 100).unwrap();
        f.sync_all().unwrap();
    }
    let o = c.cli(&["--output", "json", "volume", "verify", "vol0"]);
    assert!(!o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s1 = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "s1")
        .unwrap_or_else(|| panic!("{v}"));
    let m = &s1["mismatches"][0];
    assert_eq!(m["offset"], 0, "{v}");
    assert_eq!(m["bad_copies"], serde_json::json!([1]), "{v}");
    assert!(text(&o).contains("between snapshot copies"), "{}", text(&o));
}

/// A backup after a resize is still incremental (a diff between snapshots of two sizes), and
/// a restore resizes the new volume to each backup's size in turn: the newest comes back at
/// the grown size, one from before the resize at the old. `import-diff` of the same files
/// resizes the volume it applies them to, grown or shrunk.
#[test]
fn a_backup_chain_and_its_diffs_span_a_resize() {
    need("qemu-img");
    need("qemu-io");
    let w = tempfile::tempdir().unwrap();
    let c = Cluster::start(&["--store", "file", "--size", "32M"]);
    let mut model = vec![0u8; SIZE];
    round(&c, &mut model, 1);
    let dir = w.path().join("backups");
    let d = dir.to_str().unwrap();
    let backup = || -> serde_json::Value {
        serde_json::from_str(&ok(
            &c,
            &["--output", "json", "volume", "backup", "vol0", "--to", d],
        ))
        .unwrap()
    };
    let full = backup();
    std::fs::write(w.path().join("b1.img"), &model).unwrap();
    // Grown online by half, then written in the old part and past the old end.
    ok(&c, &["volume", "resize", "vol0", "48M"]);
    model.resize(SIZE + SIZE / 2, 0);
    let mut changed = round(&c, &mut model, 2);
    changed.extend(put(&c, &mut model, SIZE + 4 * BLOCK, 3 * BLOCK, 77));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let inc = backup();
    std::fs::write(w.path().join("b2.img"), &model).unwrap();
    assert_eq!(inc["from"], full["snapshot"], "incremental: {inc}");
    assert_eq!(
        inc["stats"]["changed_bytes"],
        (changed.len() * BLOCK) as u64,
        "{inc}"
    );
    for (name, at, image) in [
        ("now", None, "b2.img"),
        ("then", full["snapshot"].as_str(), "b1.img"),
    ] {
        let mut args = vec!["volume", "restore", d, name];
        if let Some(s) = at {
            args.extend(["--at", s]);
        }
        ok(&c, &args);
        let (r, uri) = spawn_nbd(&c, name, &w.path().join(format!("{name}.sock")));
        let want = std::fs::metadata(w.path().join(image)).unwrap().len();
        assert_eq!(nbd_size(&uri), want, "{name}'s size");
        compare_image(&w.path().join(image), &uri);
        stop(r);
    }
    // `import-diff` gives a volume the size of the image each diff ends at, as `rbd
    // import-diff` does. The backups' files are rbd diffs: applied in turn to a smaller
    // volume they grow it (16M, then 32M, then 48M); the full one shrinks a larger volume.
    let file = |e: &serde_json::Value| dir.join(e["file"].as_str().unwrap());
    ok(&c, &["volume", "create", "grown", "--size", "16M"]);
    ok(&c, &["volume", "create", "shrunk", "--size", "64M"]);
    for (vol, diffs, image) in [
        ("grown", vec![&full, &inc], "b2.img"),
        ("shrunk", vec![&full], "b1.img"),
    ] {
        for e in diffs {
            ok(
                &c,
                &["volume", "import-diff", file(e).to_str().unwrap(), vol],
            );
        }
        let (r, uri) = spawn_nbd(&c, vol, &w.path().join(format!("{vol}.sock")));
        let want = std::fs::metadata(w.path().join(image)).unwrap().len();
        assert_eq!(nbd_size(&uri), want, "{vol}'s size");
        compare_image(&w.path().join(image), &uri);
        stop(r);
    }
}
