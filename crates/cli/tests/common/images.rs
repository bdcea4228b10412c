//! Disk images and NBD exports in tests: random image files, `trireme nbd` exports, and
//! `qemu-img` writing, comparing and sizing them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{run, signal, text, Cluster, BIN};

pub fn random_file(path: &PathBuf, len: usize, seed: u64) {
    // xorshift: deterministic, seeded, no dependency.
    let mut x = seed | 1;
    let mut b = Vec::with_capacity(len);
    while b.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.extend_from_slice(&x.to_le_bytes());
    }
    b.truncate(len);
    std::fs::write(path, b).unwrap();
}

/// Starts `trireme nbd VOLUME --socket SOCK` against `c` and returns it with the URI it prints.
pub fn spawn_nbd(c: &Cluster, volume: &str, sock: &Path) -> (Child, String) {
    spawn_nbd_env(c, volume, sock, &[])
}

/// As [`spawn_nbd`], with `env` set for the writer.
pub fn spawn_nbd_env(
    c: &Cluster,
    volume: &str,
    sock: &Path,
    env: &[(&str, &str)],
) -> (Child, String) {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(BIN);
    cmd.envs(env.iter().copied());
    cmd.arg("--data-dir")
        .arg(c.path())
        .args(["nbd", volume, "--socket"])
        .arg(sock)
        .stdout(Stdio::piped());
    // A test that fails before it stops the writer takes it down with its thread.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut nbd = cmd.spawn().unwrap();
    let mut out = nbd.stdout.take().unwrap();
    let (mut line, mut b) = (String::new(), [0u8; 1]);
    while !line.ends_with('\n') {
        assert_eq!(out.read(&mut b).unwrap(), 1, "trireme nbd exited");
        line.push(b[0] as char);
    }
    (nbd, line.trim().to_string())
}

/// `qemu-img convert` of a raw image file onto an NBD URI, in place (`-n`): the volume then
/// holds the image's bytes from offset 0.
pub fn write_image(image: &Path, uri: &str) {
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(image)
        .arg(uri));
}

/// `qemu-img compare` of a raw image file and an NBD URI: they must hold the same bytes.
pub fn compare_image(image: &Path, uri: &str) {
    let o = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(image)
        .arg(uri)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} differs from {uri}: {}",
        image.display(),
        text(&o)
    );
}

/// The virtual size `qemu-img info` finds behind an NBD URI.
pub fn nbd_size(uri: &str) -> u64 {
    let o = run(Command::new("qemu-img").args(["info", "--output=json", uri]));
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    v["virtual-size"].as_u64().unwrap()
}

/// Exports `export` (a volume or `VOLUME@SNAP`) with `trireme nbd` and checks that it is
/// `image` exactly: as large, the same bytes.
pub fn export_is(c: &Cluster, export: &str, image: &std::path::Path, dir: &std::path::Path) {
    let sock = dir.join(format!("{}.sock", export.replace('@', "-")));
    let (nbd, uri) = spawn_nbd(c, export, &sock);
    let want = std::fs::metadata(image).unwrap().len();
    assert_eq!(nbd_size(&uri), want, "{export}'s size");
    compare_image(image, &uri);
    stop_nbd(nbd);
}

/// Stops a `trireme nbd` as an operator would (SIGTERM): a volume's writer detaches.
pub fn stop_nbd(mut nbd: std::process::Child) {
    signal(nbd.id() as i32, libc::SIGTERM);
    let st = nbd.wait().unwrap();
    assert!(st.success(), "trireme nbd exited with {st}");
}
