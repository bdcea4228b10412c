//! `trireme map`, `unmap` and `device list`: a volume as a kernel block device on this host
//! (`trireme_daemon::kernel_ublk`, `trireme_daemon::kernel_nbd`).

use std::path::Path;

use super::*;
use crate::{DeviceKind, MapArgs, UnmapArgs};
use trireme_blockdev::{Filtered, Handover, Shared};
use trireme_kernel::mapped::{self, Mapped};

/// The kernel device `map` gives: its kind (`nbd`, `ublk` or `loop`), and why (said in
/// `device list`). ublk first where the kernel has it: no socket between the kernel and this
/// process, and its requests wait for the next server without a timeout. A loop device only
/// when asked: it does not survive this process.
fn pick(asked: DeviceKind) -> Result<(&'static str, String), CliError> {
    let nbd = trireme_kernel::nbd::available();
    let ublk = trireme_kernel::ublk::available();
    match asked {
        DeviceKind::Nbd if nbd => Ok(("nbd", "asked for (--device nbd)".into())),
        DeviceKind::Nbd => Err(CliError::Usage(
            "the kernel's NBD client is not loaded: `modprobe nbd` (kernel option \
             CONFIG_BLK_DEV_NBD), or map with --device ublk"
                .into(),
        )),
        DeviceKind::Ublk if ublk => Ok(("ublk", "asked for (--device ublk)".into())),
        DeviceKind::Ublk => Err(CliError::Usage(
            "this kernel has no ublk loaded: `modprobe ublk_drv` (Linux 6.1+, \
             CONFIG_BLK_DEV_UBLK), or map with --device nbd"
                .into(),
        )),
        DeviceKind::Loop => match trireme_kernel::loopdev::available() {
            Ok(()) => Ok(("loop", "asked for (--device loop)".into())),
            Err(e) => Err(CliError::Usage(e.to_string())),
        },
        DeviceKind::Auto if ublk => Ok(("ublk", "the kernel has ublk_drv".into())),
        DeviceKind::Auto if nbd => Ok((
            "nbd",
            "the kernel has the NBD client and no ublk_drv".into(),
        )),
        DeviceKind::Auto => Err(CliError::Usage(
            "this kernel has neither block device driver loaded: `modprobe ublk_drv` for ublk \
             (Linux 6.1+, CONFIG_BLK_DEV_UBLK), or `modprobe nbd` for the kernel's NBD \
             client (CONFIG_BLK_DEV_NBD); `--device loop` gives a loop device over FUSE \
             instead, which does not survive its `map` process"
                .into(),
        )),
    }
}

/// Serves `dev` as a device of `kind` (`pick`).
async fn map_device<D: trireme_blockdev::BlockDevice>(
    kind: &str,
    dev: std::sync::Arc<D>,
    volume: &str,
    epoch: u64,
    kopts: &trireme_daemon::kernel_nbd::KernelOptions,
) -> Result<(Mapped, tokio::task::JoinHandle<()>), trireme_daemon::DaemonError> {
    match kind {
        "ublk" => trireme_daemon::kernel_ublk::map(dev, volume, epoch, kopts).await,
        "loop" => trireme_daemon::kernel_loop::map(dev, volume, epoch, kopts).await,
        _ => trireme_daemon::kernel_nbd::map(dev, volume, epoch, kopts).await,
    }
}

/// The writer of `a.volume`: attached on the cluster on etcd, or through `up`'s control
/// socket; and how to let it go.
enum Writer {
    Etcd(trireme_daemon::attach::Attached),
    Local(tokio::task::JoinHandle<()>),
}

pub(crate) async fn map(cli: &Cli, a: &MapArgs) -> Result<(), CliError> {
    let stop = Stop::catch()?;
    let (volume, snap) = match a.volume.split_once('@') {
        Some((v, s)) => (v, Some(s)),
        None => (a.volume.as_str(), None),
    };
    trireme_meta::check_name(volume).map_err(|e| CliError::Usage(e.to_string()))?;
    let (kind, why) = pick(a.device)?;
    let kopts = trireme_daemon::kernel_nbd::KernelOptions {
        dir: mapped::DIR.into(),
        io_timeout: a.io_timeout,
        dead_timeout: a.dead_timeout,
        why,
    };
    trireme_daemon::kernel_nbd::check_not_served(&a.volume, &kopts).map_err(daemon_err)?;
    match snap {
        Some(snap) => map_snapshot(cli, a, (volume, snap), kind, &kopts, stop).await,
        None => map_volume(cli, a, kind, &kopts, stop).await,
    }
}

/// Waits for `unmap` (`keep` ends) or a stop; whether it was `unmap`.
async fn serve_until(m: &Mapped, mut keep: tokio::task::JoinHandle<()>, stop: Stop) -> bool {
    println!("{}", m.path().display());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let unmapped = tokio::select! {
        _ = stop.wait() => {
            keep.abort();
            false
        }
        _ = &mut keep => true,
    };
    if !unmapped {
        tracing::warn!(
            volume = %m.volume,
            "stopping: the device stays, its requests queued, until `trireme map` serves it again (or `unmap`)"
        );
    }
    unmapped
}

/// `map VOLUME@SNAP`: the snapshot, read-only (the kernel is told); no writer, no epoch.
async fn map_snapshot(
    cli: &Cli,
    a: &MapArgs,
    (volume, snap): (&str, &str),
    kind: &str,
    kopts: &trireme_daemon::kernel_nbd::KernelOptions,
    stop: Stop,
) -> Result<(), CliError> {
    let found = match cli.etcd {
        Some(_) => {
            let meta = etcd_meta(cli).await?;
            trireme_daemon::export::snapshots_on_etcd(&meta, volume).await
        }
        None => {
            trireme_daemon::export::snapshots_via_control(&control_path(&cli.data_dir), volume)
                .await
        }
    }
    .map_err(CliError::Usage)?;
    let opts = a.failure.volume_options(a.streams, cli.transport.kind());
    let (dev, reader) = trireme_daemon::export::snapshot_export(&found.0, &found.1, snap, opts)
        .await
        .map_err(daemon_err)?;
    let dev = std::sync::Arc::new(Filtered(Handover::new(Filtered(Shared(dev)))));
    let served = map_device(kind, dev.clone(), &a.volume, 0, kopts).await;
    let r = match served {
        Ok((m, keep)) => {
            if !serve_until(&m, keep, stop).await {
                dev.0.close().await;
            }
            Ok(())
        }
        Err(e) => Err(daemon_err(e)),
    };
    // A delete right after this stops is not refused for it.
    reader
        .release(trireme_daemon::export::export_holder(&a.volume))
        .await;
    r
}

/// `map VOLUME`: its writer, and the device.
async fn map_volume(
    cli: &Cli,
    a: &MapArgs,
    kind: &str,
    kopts: &trireme_daemon::kernel_nbd::KernelOptions,
    stop: Stop,
) -> Result<(), CliError> {
    let opts = a.failure.volume_options(a.streams, cli.transport.kind());
    let here = vec![format!("kernel {kind} device of {}", a.volume)];
    let (slot, mut writer) = match cli.etcd {
        Some(_) => {
            let meta = etcd_meta(cli).await?;
            let cfg = trireme_daemon::attach::AttachConfig {
                volume: a.volume.clone(),
                force: a.force,
                lease_ttl: a.lease_ttl,
                opts,
            };
            let att = trireme_daemon::attach::attach(meta, &cfg, here)
                .await
                .map_err(daemon_err)?;
            let slot = trireme_daemon::export::WriterSlot::new(att.volume.clone());
            (slot, Writer::Etcd(att))
        }
        None => {
            let control = control_path(&cli.data_dir);
            let hello = trireme_control::WriterHello::me(here.clone());
            let v =
                trireme_daemon::writer_slot::attach(&control, &a.volume, opts.clone(), Some(hello))
                    .await
                    .map_err(CliError::Runtime)?;
            let slot = trireme_daemon::export::WriterSlot::serving(v, here);
            let reattach = tokio::spawn(trireme_daemon::export::reattach_when_lost(
                slot.clone(),
                control,
                opts,
                None,
            ));
            (slot, Writer::Local(reattach))
        }
    };
    let dev = std::sync::Arc::new(Filtered(Handover::new(
        trireme_blockdev::VolumeDevice::new(slot.slot.clone()),
    )));
    let epoch = slot.current().info().epoch;
    match map_device(kind, dev.clone(), &a.volume, epoch, kopts).await {
        Ok((m, keep)) => {
            if let Writer::Etcd(att) = &mut writer {
                att.report(None);
            }
            trireme_daemon::kernel_size::follow(dev.clone(), m.clone(), kopts.dir.clone());
            if !serve_until(&m, keep, stop).await {
                // What the kernel asks from now on waits for the next `map`, not for a
                // writer that is letting go.
                dev.0.close().await;
            }
        }
        Err(e) => {
            let _ = release(&slot, writer).await;
            return Err(daemon_err(e));
        }
    }
    release(&slot, writer).await
}

/// Flushes and detaches the writer.
async fn release(
    slot: &trireme_daemon::export::WriterSlot,
    writer: Writer,
) -> Result<(), CliError> {
    match writer {
        Writer::Etcd(att) => att.detach().await.map_err(daemon_err),
        Writer::Local(reattach) => {
            reattach.abort();
            slot.current()
                .detach()
                .await
                .map_err(|e| CliError::Runtime(format!("final flush and detach: {e}")))
        }
    }
}

fn kernel_err(e: trireme_kernel::KernelError) -> CliError {
    CliError::Runtime(e.to_string())
}

/// The record `target` (a volume or a device path) names.
fn find(target: &str) -> Result<Mapped, CliError> {
    let dir = Path::new(mapped::DIR);
    let found = if target.starts_with("/dev/") {
        mapped::list(dir)
            .into_iter()
            .filter_map(Result::ok)
            .find(|m| m.path() == Path::new(target))
    } else {
        mapped::get(dir, target).map_err(kernel_err)?
    };
    found.ok_or_else(|| {
        CliError::Usage(format!(
            "no device of {target} is mapped on this host (`trireme device list`)"
        ))
    })
}

pub(crate) fn unmap(a: &UnmapArgs) -> Result<(), CliError> {
    let m = find(&a.target)?;
    let path = m.path();
    // An exclusive open fails while a file system (or anything else) holds the device.
    let open = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
            .open(&path)
    };
    match open {
        Ok(f) if m.serving() => f
            .sync_all()
            .map_err(|e| CliError::Runtime(format!("flushing {}: {e}", path.display())))?,
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !a.force => {
            return Err(CliError::Usage(format!(
                "{} (volume {}) is in use, a file system mounted on it?: unmount it first, \
                 or --force (what uses it then gets I/O errors)",
                path.display(),
                m.volume
            )))
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CliError::Runtime(format!("{}: {e}", path.display()))),
    }
    // The record goes first: the server, disconnected, then finds none and detaches.
    mapped::remove(Path::new(mapped::DIR), &m.volume);
    let gone = |e: &trireme_kernel::KernelError| {
        matches!(e, trireme_kernel::KernelError::Refused { errno, .. }
            if *errno == libc::ENOENT || *errno == libc::EINVAL || *errno == libc::ENODEV)
    };
    let r = match m.kind.as_str() {
        "ublk" => trireme_kernel::ublk::stop(m.index),
        "loop" => trireme_kernel::loopdev::detach(
            m.index,
            &trireme_daemon::kernel_loop::work_dir(Path::new(mapped::DIR), &m.volume),
        ),
        _ => trireme_kernel::nbd::disconnect(m.index),
    };
    match r {
        Err(e) if !gone(&e) => return Err(kernel_err(e)),
        _ => {}
    }
    let t0 = std::time::Instant::now();
    while m.serving() && t0.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if m.serving() {
        return Err(CliError::Runtime(format!(
            "{} is disconnected, but pid {} that served it has not ended within 30 s",
            path.display(),
            m.pid
        )));
    }
    // A ublk device stays until deleted, once its server has gone; a loop device's FUSE
    // file, if its server died.
    match m.kind.as_str() {
        "ublk" => match trireme_kernel::ublk::delete(m.index) {
            Err(e) if !gone(&e) => return Err(kernel_err(e)),
            _ => {}
        },
        "loop" => trireme_daemon::kernel_loop::tidy(Path::new(mapped::DIR), &m.volume),
        _ => {}
    }
    println!("unmapped {} (volume {})", path.display(), m.volume);
    Ok(())
}

#[derive(Serialize)]
struct DeviceRow {
    volume: String,
    device: String,
    kind: String,
    pid: u32,
    serving: bool,
    epoch: u64,
    why: String,
}

pub(crate) fn device_list(cli: &Cli) -> Result<(), CliError> {
    let mut rows = Vec::new();
    for r in mapped::list(Path::new(mapped::DIR)) {
        match r {
            Ok(m) => rows.push(DeviceRow {
                device: m.path().display().to_string(),
                serving: m.serving(),
                volume: m.volume,
                kind: m.kind,
                pid: m.pid,
                epoch: m.epoch,
                why: m.why,
            }),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    print(cli.output, &rows, |rows| {
        if rows.is_empty() {
            return "no device is mapped on this host\n".into();
        }
        let mut s = String::from("VOLUME  DEVICE  KIND  PID  SERVED  EPOCH  WHY\n");
        for r in rows {
            s += &format!(
                "{}  {}  {}  {}  {}  {}  {}\n",
                r.volume,
                r.device,
                r.kind,
                r.pid,
                if r.serving {
                    "yes"
                } else {
                    "no: `trireme map` it again"
                },
                r.epoch,
                r.why
            );
        }
        s
    });
    Ok(())
}
