//! A volume as a kernel block device through the kernel's NBD client (`trireme map`).
//!
//! The process is the device's server: the NBD frontend's transmission phase on one end of a
//! socket pair (`trireme_nbd::serve_kernel`), the kernel's NBD client on the other, set up
//! over netlink (`trireme_kernel::nbd`). The volume's device below it is the one every
//! frontend uses (`trireme_blockdev::VolumeDevice`).
//!
//! What ends what:
//! - The server's socket lost while the process lives (the kernel timed a request out and
//!   dropped the socket): a new socket pair, handed to the same device.
//! - The process killed: the device waits (`dead_conn_timeout`) with its requests queued; the
//!   next `map` of the volume finds its record and hands the same device a new server
//!   (reconfigure). The requests in flight are sent again at their timeout: safe, one fenced
//!   writer at a time, and every request idempotent.
//! - `unmap`: removes the record, then asks the kernel to disconnect; the kernel sends
//!   `NBD_CMD_DISC`, the server returns and, finding no record, the process detaches.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use trireme_blockdev::BlockDevice;
use trireme_kernel::mapped::{self, Mapped};
use trireme_kernel::{nbd, KernelError};

use crate::DaemonError;

/// How a device is set up.
#[derive(Debug, Clone)]
pub struct KernelOptions {
    /// Where the records of mapped devices live.
    pub dir: PathBuf,
    /// A request unanswered this long is sent again (to this server's next socket, or to the
    /// next server after this process died).
    pub io_timeout: Duration,
    /// How long a device without a server keeps its requests before they fail.
    pub dead_timeout: Duration,
    /// Why this kind of device, for `device list`.
    pub why: String,
}

pub(crate) fn kernel(e: KernelError) -> DaemonError {
    match e {
        KernelError::NoDriver(m) => DaemonError::Usage(m),
        e => DaemonError::Runtime(e.to_string()),
    }
}

/// A new socket pair: the kernel's end, and this process's end served for `dev`.
fn serve_pair<D: BlockDevice>(
    dev: &Arc<D>,
) -> Result<(std::os::unix::net::UnixStream, tokio::task::JoinHandle<()>), DaemonError> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    let dev = dev.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = trireme_nbd::serve_kernel(ours, dev).await {
            tracing::warn!("the kernel's NBD connection: {e}");
        }
    });
    Ok((theirs, task))
}

/// Refuses a map of `volume` while a process of this host serves its device: checked before
/// the writer attaches, so that `--force` does not fence the process that serves it.
pub fn check_not_served(volume: &str, opts: &KernelOptions) -> Result<(), DaemonError> {
    match mapped::get(&opts.dir, volume).map_err(kernel)? {
        Some(m) if m.serving() => Err(DaemonError::Usage(format!(
            "{volume} is mapped at {} already, served by pid {} on this host",
            m.path().display(),
            m.pid
        ))),
        _ => Ok(()),
    }
}

/// Runs netlink call `f` off the runtime: it blocks until the kernel answers.
async fn netlink<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KernelError> + Send + 'static,
) -> Result<T, DaemonError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DaemonError::Runtime(e.to_string()))?
        .map_err(kernel)
}

/// Serves `dev` (volume `volume`, or a snapshot `VOLUME@NAME`, at epoch `epoch`) as a kernel
/// NBD device: the one its record names if that device's server died (the same device,
/// handed a new server), else a new one (read-only if `dev` is). The caller has checked that
/// no process serves it ([`check_not_served`]). Returns the record once the device serves,
/// and the task that keeps serving it until `unmap`.
pub async fn map<D: BlockDevice>(
    dev: Arc<D>,
    volume: &str,
    epoch: u64,
    opts: &KernelOptions,
) -> Result<(Mapped, tokio::task::JoinHandle<()>), DaemonError> {
    let ident = Mapped::identifier(volume);
    let revive = mapped::get(&opts.dir, volume)
        .map_err(kernel)?
        .filter(|m| m.kind == "nbd" && nbd::backend(m.index).as_deref() == Some(&ident));
    // One socket per CPU (at most 4; the kernel gives each a queue); a device revived keeps
    // the number it was made with. Served before the kernel is told: it reads the partition
    // table at once.
    let conns = match &revive {
        Some(m) => m.conns.max(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get().min(4) as u32),
    };
    let mut theirs = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let (t, task) = serve_pair(&dev)?;
        theirs.push(t);
        tasks.spawn(async move {
            let _ = task.await;
        });
    }
    let fds: Vec<i32> = theirs.iter().map(|t| t.as_raw_fd()).collect();
    let index = match &revive {
        Some(m) => {
            let (i, id) = (m.index, ident.clone());
            netlink(move || nbd::reconfigure(i, &id, &fds).map(|()| i)).await
        }
        None => {
            let cfg = nbd::Config {
                size: dev.size(),
                block_size: 4096,
                server_flags: trireme_nbd::kernel_flags(&*dev),
                timeout_s: opts.io_timeout.as_secs().max(1),
                dead_conn_timeout_s: opts.dead_timeout.as_secs().max(1),
                identifier: ident.clone(),
            };
            netlink(move || nbd::connect(&cfg, &fds)).await
        }
    };
    drop(theirs);
    let index = index?;
    let m = record(volume, "nbd", index, epoch, opts, conns)?;
    if revive.is_some() {
        tracing::warn!(device = %m.path().display(), "took over the device a dead server left: its queued requests go on");
    }
    let keep = tokio::spawn(keep_serving(tasks, dev, m.clone(), opts.dir.clone()));
    Ok((m, keep))
}

/// Records device `kind` `index` of `volume` as served by this process.
pub(crate) fn record(
    volume: &str,
    kind: &str,
    index: u32,
    epoch: u64,
    opts: &KernelOptions,
    conns: u32,
) -> Result<Mapped, DaemonError> {
    let m = Mapped {
        volume: volume.to_string(),
        kind: kind.into(),
        index,
        pid: std::process::id(),
        epoch,
        why: opts.why.clone(),
        conns,
    };
    mapped::put(&opts.dir, &m).map_err(kernel)?;
    Ok(m)
}

/// Serves the device until `unmap` removed its record (then returns), handing the kernel a
/// new socket whenever it dropped one. Aborted, it stops serving (the sockets close).
async fn keep_serving<D: BlockDevice>(
    mut tasks: tokio::task::JoinSet<()>,
    dev: Arc<D>,
    m: Mapped,
    dir: PathBuf,
) {
    while tasks.join_next().await.is_some() {
        if !still_ours(&dir, &m) {
            return;
        }
        tracing::warn!(device = %m.path().display(), "the kernel dropped one of the device's connections: handing it a new one");
        // Never faster than this, should a connection end that the kernel had not dropped.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (theirs, t) = match serve_pair(&dev) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("a new socket for {}: {e}", m.path().display());
                return;
            }
        };
        tasks.spawn(async move {
            let _ = t.await;
        });
        let (i, id, fd) = (m.index, Mapped::identifier(&m.volume), theirs.as_raw_fd());
        let r = netlink(move || nbd::reconfigure(i, &id, &[fd])).await;
        drop(theirs);
        if let Err(e) = r {
            tracing::error!(device = %m.path().display(), "handing the device a new connection: {e}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Whether `m`'s record is still there and names this process (`unmap` removes it first).
pub(crate) fn still_ours(dir: &Path, m: &Mapped) -> bool {
    matches!(mapped::get(dir, &m.volume), Ok(Some(r)) if r.pid == m.pid && r.index == m.index)
}
