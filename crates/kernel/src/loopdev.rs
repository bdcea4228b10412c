//! A loop device over a FUSE file: the block device of a host whose kernel has neither ublk
//! nor the NBD client, but FUSE and loop devices (a container, a CI runner). `nbdfuse` (from
//! libnbd) shows an NBD export as a file; `losetup` (util-linux) makes the file a block
//! device. Both programs are run, not reimplemented: they are on every Debian host that has
//! `libnbd-bin` and `mount`.
//!
//! What it cannot do: survive its server. The file's reads and writes fail once the process
//! that serves the export is gone, and a new server means a new file, so a new device.

use std::path::Path;
use std::process::Command;

use crate::KernelError;

/// The programs it needs.
pub const NBDFUSE: &str = "nbdfuse";
pub const LOSETUP: &str = "losetup";

/// Whether this host can make one: `/dev/fuse`, `/dev/loop-control`, and both programs.
/// Otherwise what is missing and how to get it.
pub fn available() -> Result<(), KernelError> {
    let mut missing = Vec::new();
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse (`modprobe fuse`; in a container, pass the device through)");
    }
    if !Path::new("/dev/loop-control").exists() {
        missing.push("/dev/loop-control (`modprobe loop`)");
    }
    if !on_path(NBDFUSE) {
        missing.push("nbdfuse (`apt install libnbd-bin`)");
    }
    if !on_path(LOSETUP) {
        missing.push("losetup (`apt install mount`)");
    }
    match missing.is_empty() {
        true => Ok(()),
        false => Err(KernelError::NoDriver(format!(
            "a loop device over FUSE needs {}",
            missing.join(", ")
        ))),
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(d.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Runs `losetup ARGS`: its output, or its error output as the failure.
fn losetup(args: &[&str]) -> Result<String, KernelError> {
    let o = Command::new(LOSETUP)
        .args(args)
        .output()
        .map_err(KernelError::io(format!("running {LOSETUP}")))?;
    match o.status.success() {
        true => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        false => Err(KernelError::Record(format!(
            "{LOSETUP} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
    }
}

/// The index of a loop device's path (`/dev/loop7` is 7).
pub fn index_of(path: &str) -> Option<u32> {
    path.trim().strip_prefix("/dev/loop")?.parse().ok()
}

/// A new loop device over `file` (read-only if asked): its index.
pub fn attach(file: &Path, read_only: bool) -> Result<u32, KernelError> {
    let f = file.to_string_lossy();
    let mut args = vec!["--find", "--show"];
    if read_only {
        args.push("--read-only");
    }
    args.push(&f);
    let out = losetup(&args)?;
    index_of(&out)
        .ok_or_else(|| KernelError::Record(format!("{LOSETUP} printed {out:?}, not a loop device")))
}

/// The file loop device `index` reads, if it is set up.
pub fn backing_file(index: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/sys/block/loop{index}/loop/backing_file")).ok()?;
    Some(s.trim().to_string())
}

/// Detaches loop device `index` if it still reads a file under `under` (another device
/// the kernel has since given that index is left alone). A device in use (mounted) goes when
/// its last user lets go.
pub fn detach(index: u32, under: &Path) -> Result<(), KernelError> {
    match backing_file(index) {
        Some(f) if Path::new(&f).starts_with(under) => {
            losetup(&["--detach", &format!("/dev/loop{index}")]).map(|_| ())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_device_path_gives_its_index_and_nothing_else_does() {
        assert_eq!(index_of("/dev/loop0\n"), Some(0));
        assert_eq!(index_of("/dev/loop12"), Some(12));
        for bad in [
            "",
            "/dev/loop",
            "/dev/loopx",
            "/dev/nbd0",
            "loop3",
            "/dev/loop-1",
        ] {
            assert_eq!(index_of(bad), None, "{bad}");
        }
    }
}
