//! A volume as a loop device over a FUSE file (`trireme map --device loop`), for a host whose
//! kernel has neither ublk nor the NBD client but has FUSE and loop devices: a container, a CI
//! runner, this project's test host (`trireme_kernel::loopdev`).
//!
//! This process serves the volume's device over NBD on a unix socket in a private directory
//! beside the device records (`VOLUME.loop/`, mode 0700); `nbdfuse` shows that export as the
//! file `VOLUME.loop/fuse/nbd`, and `losetup` makes the file `/dev/loopN`. A flush of the
//! device reaches the volume as an NBD flush (the loop driver's fsync of the file, FUSE's
//! fsync, nbdfuse's flush).
//!
//! What ends what:
//! - `unmap`: removes the record and detaches the loop device; this process finds no record,
//!   unmounts the FUSE file, and detaches the writer.
//! - The process killed: the file's I/O fails, and so does the device's; it does not survive
//!   its server as ublk and NBD devices do. The next `map` of the volume detaches what is left
//!   and makes a new device. It is never picked by `--device auto` for that reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use trireme_blockdev::BlockDevice;
use trireme_kernel::loopdev;
use trireme_kernel::mapped::{self, Mapped};

use crate::kernel_nbd::{record, still_ours, KernelOptions};
use crate::DaemonError;

/// How long `nbdfuse` may take to show the file.
const FUSE_WAIT: Duration = Duration::from_secs(20);

/// The private directory of `volume`'s loop device under the records' `dir`.
pub fn work_dir(dir: &Path, volume: &str) -> PathBuf {
    dir.join(format!("{volume}.loop"))
}

fn runtime(what: &str, e: impl std::fmt::Display) -> DaemonError {
    DaemonError::Runtime(format!("{what}: {e}"))
}

/// Unmounts the FUSE file system at `at`, lazily (a dead `nbdfuse` leaves it unreadable).
fn unmount(at: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(at.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: umount2(2) with a valid NUL-terminated path; failure is only reported.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// Detaches what a dead server of `volume` left: its loop device, the FUSE mount, the socket.
fn clear_left(dir: &Path, volume: &str) -> Result<(), DaemonError> {
    let work = work_dir(dir, volume);
    if let Some(m) = mapped::get(dir, volume).map_err(crate::kernel_nbd::kernel)? {
        if m.kind == "loop" {
            tracing::warn!(device = %m.path().display(), "a loop device does not survive its server: detaching the one a dead server left, and making a new one");
            loopdev::detach(m.index, &work).map_err(crate::kernel_nbd::kernel)?;
        }
    }
    stop_fuse(&work);
    unmount(&work.join("fuse"));
    let _ = std::fs::remove_file(work.join("nbd.sock"));
    let _ = std::fs::remove_file(work.join("nbdfuse.pid"));
    Ok(())
}

/// Stops the `nbdfuse` a dead server left (its pid file names it; checked to be nbdfuse):
/// its file only fails now, and a file system mounted on the old device would keep it.
fn stop_fuse(work: &Path) {
    let Some(pid) = std::fs::read_to_string(work.join("nbdfuse.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return;
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if pid > 1 && comm.trim() == loopdev::NBDFUSE {
        // SAFETY: kill(2) of the nbdfuse process named above.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

/// Takes down what is left of `volume`'s loop device once its server has gone (`unmap` of a
/// device whose `map` died): the FUSE mount and the private directory.
pub fn tidy(dir: &Path, volume: &str) {
    let work = work_dir(dir, volume);
    stop_fuse(&work);
    unmount(&work.join("fuse"));
    let _ = std::fs::remove_dir_all(&work);
}

/// The private directory, made anew where needed.
fn make_work(work: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(work.join("fuse"))
        .map_err(|e| runtime("the loop device's directory", e))?;
    // Made by an older process or by hand: private all the same.
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| runtime("the loop device's directory", e))
}

/// Starts `nbdfuse` on the export at `sock`; the child once the file is there.
async fn start_fuse(work: &Path, read_only: bool) -> Result<tokio::process::Child, DaemonError> {
    let pid = work.join("nbdfuse.pid");
    let mut cmd = tokio::process::Command::new(loopdev::NBDFUSE);
    if read_only {
        cmd.arg("--readonly");
    }
    cmd.arg("-P")
        .arg(&pid)
        .arg(work.join("fuse").join("nbd"))
        .arg("--unix")
        .arg(work.join("nbd.sock"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| runtime(&format!("starting {}", loopdev::NBDFUSE), e))?;
    let t0 = Instant::now();
    // nbdfuse writes its pid file once it serves the file.
    while !pid.exists() {
        if let Some(st) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = e.read_to_string(&mut err).await;
            }
            return Err(runtime(
                loopdev::NBDFUSE,
                format!("exited ({st}): {}", err.trim()),
            ));
        }
        if t0.elapsed() > FUSE_WAIT {
            return Err(runtime(
                loopdev::NBDFUSE,
                format!("showed no file within {FUSE_WAIT:?}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(child)
}

/// Serves `dev` (volume `volume`, or a snapshot `VOLUME@NAME`, at epoch `epoch`) as a new
/// loop device, after detaching what a dead server left. The caller has checked that no
/// process serves it (`kernel_nbd::check_not_served`). Returns the record once the device
/// is there, and the task that keeps it until `unmap`.
pub async fn map<D: BlockDevice>(
    dev: Arc<D>,
    volume: &str,
    epoch: u64,
    opts: &KernelOptions,
) -> Result<(Mapped, tokio::task::JoinHandle<()>), DaemonError> {
    clear_left(&opts.dir, volume)?;
    let work = work_dir(&opts.dir, volume);
    make_work(&work)?;
    let read_only = dev.caps().read_only;
    let listener = tokio::net::UnixListener::bind(work.join("nbd.sock"))
        .map_err(|e| runtime("the loop device's NBD socket", e))?;
    let mut exports = trireme_nbd::Exports::new();
    exports.add(volume, "a trireme volume's loop device", dev);
    let serving = tokio::spawn(trireme_nbd::serve_unix(listener, Arc::new(exports)));
    let attached = async {
        let fuse = start_fuse(&work, read_only).await?;
        let file = work.join("fuse").join("nbd");
        let index = tokio::task::spawn_blocking(move || loopdev::attach(&file, read_only))
            .await
            .map_err(|e| runtime("losetup", e))?
            .map_err(crate::kernel_nbd::kernel)?;
        Ok::<_, DaemonError>((index, fuse))
    }
    .await;
    let (index, fuse) = match attached {
        Ok(a) => a,
        Err(e) => {
            serving.abort();
            unmount(&work.join("fuse"));
            return Err(e);
        }
    };
    let m = record(volume, "loop", index, epoch, opts, 1)?;
    let keep = tokio::spawn(keep(m.clone(), fuse, serving, opts.dir.clone()));
    Ok((m, keep))
}

/// Keeps the device until `unmap` removed its record (or `nbdfuse` died: the device is
/// useless then, said in the log), then takes the FUSE file down. Aborted (a stop), the
/// file goes with this process.
async fn keep(
    m: Mapped,
    mut fuse: tokio::process::Child,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    dir: PathBuf,
) {
    loop {
        tokio::select! {
            st = fuse.wait() => {
                tracing::error!(device = %m.path().display(), "nbdfuse ended ({st:?}): the device fails its I/O until `unmap`");
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if !still_ours(&dir, &m) {
                    break;
                }
            }
        }
    }
    let work = work_dir(&dir, &m.volume);
    unmount(&work.join("fuse"));
    let _ = tokio::time::timeout(Duration::from_secs(5), fuse.wait()).await;
    serving.abort();
    if !still_ours(&dir, &m) {
        let _ = std::fs::remove_dir_all(&work);
    }
}
