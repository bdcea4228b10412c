//! A volume as a ublk device (`trireme map`, where the kernel has `ublk_drv`).
//!
//! The process is the device's server: `trireme_kernel::ublk` runs the queue on a thread of
//! its own and hands each request here, where it runs on the runtime against the volume's
//! device (`trireme_blockdev`), the one every frontend uses.
//!
//! What ends what:
//! - The process killed: the kernel keeps the device, quiesced, and re-issues the requests
//!   that were in flight to the next server; the next `map` of the volume finds its record
//!   and recovers the same device (user recovery).
//! - `unmap`: removes the record and stops the device; the queue ends and, finding no
//!   record, the process detaches; `unmap` then deletes the device.

use std::sync::Arc;

use trireme_blockdev::{BlockDevice, DevError, ErrorKind};
use trireme_kernel::mapped::{self, Mapped};
use trireme_kernel::ublk::{self, Answer, Done, Op};

use crate::kernel_nbd::{kernel, record, KernelOptions};
use crate::DaemonError;

/// The errno a device's error is to the kernel.
fn errno(e: &DevError) -> i32 {
    -match e.kind {
        ErrorKind::Io => libc::EIO,
        ErrorKind::Invalid => libc::EINVAL,
        ErrorKind::NoSpace => libc::ENOSPC,
        ErrorKind::ReadOnly => libc::EROFS,
        ErrorKind::Unsupported => libc::EOPNOTSUPP,
    }
}

/// The queue's requests, run on the runtime against `dev`.
struct Bridge<D> {
    dev: Arc<D>,
    rt: tokio::runtime::Handle,
}

impl<D: BlockDevice> ublk::Server for Bridge<D> {
    fn submit(&self, op: Op, done: Done) {
        let dev = self.dev.clone();
        self.rt.spawn(async move {
            let a = run(&*dev, op).await;
            if let Err(e) = &a {
                tracing::warn!(
                    "ublk request failed: {}",
                    std::io::Error::from_raw_os_error(-e)
                );
            }
            done.finish(a);
        });
    }
}

/// Does `op` on `dev`; a range past the device's end is refused, never sent.
async fn run<D: BlockDevice>(dev: &D, op: Op) -> Answer {
    let within = |offset: u64, len: u32| {
        offset
            .checked_add(len as u64)
            .is_some_and(|e| e <= dev.size())
    };
    let r = match op {
        Op::Read { offset, len } if within(offset, len) => dev.read(offset, len).await.map(Some),
        Op::Write { offset, data, fua } if within(offset, data.len() as u32) => {
            dev.write(offset, data, fua).await.map(|()| None)
        }
        Op::Flush => dev.flush().await.map(|()| None),
        Op::Discard { offset, len } if within(offset, len) => {
            dev.trim(offset, len, false).await.map(|()| None)
        }
        Op::WriteZeroes {
            offset,
            len,
            may_trim,
        } if within(offset, len) => dev
            .write_zeroes(offset, len, may_trim, false)
            .await
            .map(|()| None),
        _ => return Err(-libc::EINVAL),
    };
    r.map_err(|e| errno(&e))
}

/// Serves `dev` (volume `volume`, or a snapshot `VOLUME@NAME`, at epoch `epoch`) as a ublk
/// device: the one its record names if that device's server died (recovered: the same
/// device, its queued requests re-issued), else a new one (read-only if `dev` is). The caller
/// has checked that no process serves it. Returns the record once the device serves, and the
/// task that ends when the device is stopped (`unmap`).
pub async fn map<D: BlockDevice>(
    dev: Arc<D>,
    volume: &str,
    epoch: u64,
    opts: &KernelOptions,
) -> Result<(Mapped, tokio::task::JoinHandle<()>), DaemonError> {
    let recover = mapped::get(&opts.dir, volume)
        .map_err(kernel)?
        .filter(|m| m.kind == "ublk" && ublk::exists(m.index))
        .map(|m| m.index);
    let caps = dev.caps();
    let cfg = ublk::Config {
        size: dev.size(),
        read_only: caps.read_only,
        trim: caps.trim,
    };
    let server = Arc::new(Bridge {
        dev,
        rt: tokio::runtime::Handle::current(),
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let serving = std::thread::Builder::new()
        .name("ublk".into())
        .spawn(move || {
            ublk::serve(recover, &cfg, server, move |i| {
                let _ = tx.send(i);
            })
        })?;
    let index = match rx.await {
        Ok(i) => i,
        Err(_) => {
            let r = tokio::task::spawn_blocking(move || serving.join())
                .await
                .map_err(|e| DaemonError::Runtime(e.to_string()))?;
            return Err(match r {
                Ok(Err(e)) => kernel(e),
                _ => DaemonError::Runtime("the ublk device did not start".into()),
            });
        }
    };
    let m = record(volume, "ublk", index, epoch, opts, 1)?;
    if recover.is_some() {
        tracing::warn!(device = %m.path().display(), "recovered the device a dead server left: its queued requests go on");
    }
    // A plain thread waits for the queues: the runtime would wait for a blocking task at
    // exit, and a process stopped by a signal must end while the device stays.
    let path = m.path();
    let (ended, end) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        match serving.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(device = %path.display(), "serving the ublk device: {e}"),
            Err(_) => tracing::error!(device = %path.display(), "the ublk queue panicked"),
        }
        let _ = ended.send(());
    });
    let keep = tokio::spawn(async move {
        let _ = end.await;
    });
    Ok((m, keep))
}
