//! A node whose file system fills up, for real: node 1's directory is a 320 MiB ext4 file
//! system of its own (a loop device), under a volume with a snapshot holding the old blocks.
//! Writes fail with ENOSPC, with no copy taken out and nothing lost: the volume reads what
//! the writes that succeeded wrote, the snapshot reads what it held, the copies are identical;
//! and writes resume by themselves once deleting the snapshot gave the space back.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: usize = 1 << 20;
const SIZE: usize = 256 * MIB;
const FILLED: usize = 192 * MIB;
const CHUNK: usize = 4 * MIB;

/// A file system of its own mounted on a directory, unmounted and removed on drop.
struct Mounted {
    at: PathBuf,
    image: PathBuf,
}

impl Mounted {
    fn new(at: &Path, image: &Path, size: &str) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("truncate").args(["-s", size]).arg(image));
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image));
        if let Err(e) = sh(&[
            "mount",
            "-o",
            "loop",
            image.to_str().unwrap(),
            at.to_str().unwrap(),
        ]) {
            panic!("mounting a loop file system needs root and a loop device (set TRIREME_SKIP_MOUNT=1 to skip this test): {e}");
        }
        Mounted {
            at: at.to_path_buf(),
            image: image.to_path_buf(),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Lazily: a node that has not exited yet must not keep the loop device for good.
        let _ = sh(&["umount", "-l", self.at.to_str().unwrap()]);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Writes `pattern` over `[at, at+len)` through qemu-io, a chunk at a time: whether it
/// succeeded, and its output.
fn write(c: &Cluster, at: usize, len: usize, pattern: u8) -> (bool, String) {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for k in (at..at + len).step_by(CHUNK) {
        let n = CHUNK.min(at + len - k);
        cmd.args(["-c", &format!("write -P {pattern} {k} {n}")]);
    }
    let o = cmd.arg(&c.unix).output().unwrap();
    let t = text(&o);
    (o.status.success() && !t.contains("failed"), t)
}

#[test]
fn a_full_node_fails_writes_with_enospc_and_loses_nothing() {
    if std::env::var_os("TRIREME_SKIP_MOUNT").is_some() {
        eprintln!("TRIREME_SKIP_MOUNT is set: skipping the loop-mount test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = std::env::temp_dir().join(format!("trireme-full-{}.img", std::process::id()));
    let small = Mounted::new(&dir.path().join("node-1"), &image, "320M");
    // Node 1 alone on its small file system; the volume's size is promised beyond its room.
    let c = Cluster::start_in(
        dir,
        &["--store", "file", "--size", "256M", "--overcommit", "4"],
    );
    let mut model = vec![0u8; SIZE];
    let (written, t) = write(&c, 0, FILLED, 1);
    assert!(written, "{t}\n{}", c.log());
    model[..FILLED].fill(1);
    let held = model.clone();
    ok(&c, &["volume", "snapshot", "create", "vol0", "s1"]);
    // Overwriting moves every block to fresh space while the snapshot holds the old ones:
    // node 1's file system fills, and from then on every write fails with ENOSPC.
    let mut first_refused = None;
    for k in 0..FILLED / CHUNK {
        let (written, t) = write(&c, k * CHUNK, CHUNK, 2);
        if written {
            assert!(
                first_refused.is_none(),
                "chunk {k} written after chunk {first_refused:?} was refused:\n{}",
                c.log()
            );
            model[k * CHUNK..(k + 1) * CHUNK].fill(2);
        } else {
            assert!(
                t.contains("No space left on device"),
                "chunk {k}: {t}\n{}",
                c.log()
            );
            first_refused.get_or_insert(k);
        }
    }
    let first_refused =
        first_refused.unwrap_or_else(|| panic!("no write was refused:\n{}", c.log()));
    assert!(
        first_refused > 0,
        "the first write was refused:\n{}",
        c.log()
    );
    eprintln!(
        "writes first_refused from chunk {first_refused} of {}",
        FILLED / CHUNK
    );
    let log = c.log();
    assert!(!log.contains("taken out"), "{log}");
    // The reserve held: the node's own files never found the file system full.
    let node_log = std::fs::read_to_string(c.path().join("node-1.log")).unwrap();
    assert!(!node_log.contains("os error 28"), "{node_log}");
    assert!(log.contains("writes fail with ENOSPC"), "{log}");
    for r in status(&c)["volumes"][0]["replicas"].as_array().unwrap() {
        assert_eq!(r["state"], "in-sync", "{}", c.log());
    }
    // Nothing lost: the volume, the snapshot, and every copy alike (verify covers snapshots).
    let scratch = tempfile::tempdir().unwrap();
    let image_now = scratch.path().join("now.raw");
    std::fs::write(&image_now, &model).unwrap();
    compare_image(&image_now, &c.unix);
    let snap = scratch.path().join("s1.raw");
    std::fs::write(&snap, &held).unwrap();
    let (nbd, uri) = spawn_nbd(&c, "vol0@s1", &scratch.path().join("s1.sock"));
    compare_image(&snap, &uri);
    // Stopped as an operator would: it lets its snapshot go (a killed one holds it 15 s).
    stop_nbd(nbd);
    let v = ok(&c, &["volume", "verify", "vol0"]);
    assert!(v.contains("0 mismatching"), "{v}");
    // The snapshot deleted gives the space back: writes resume by themselves.
    ok(&c, &["volume", "snapshot", "delete", "vol0", "s1"]);
    let t0 = std::time::Instant::now();
    loop {
        let (written, t) = write(&c, first_refused * CHUNK, CHUNK, 3);
        if written {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "writes did not resume: {t}\n{}",
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    model[first_refused * CHUNK..(first_refused + 1) * CHUNK].fill(3);
    std::fs::write(&image_now, &model).unwrap();
    compare_image(&image_now, &c.unix);
    assert!(c.log().contains("writes resume"), "{}", c.log());
    drop(c);
    drop(small);
}
