//! A volume over NVMe/TCP from any server (`trireme nvmf serve`), with ANA multipath: every
//! server that serves a volume presents the same subsystem, and the one that holds the
//! volume's writer is the optimized path. The others are standbys: ANA inaccessible, no
//! epoch. When the writer's process dies its lease expires and its attach record goes; the
//! first standby to see that attaches (a new epoch fences the old writer, the replicas are
//! reconciled), turns optimized, and its hosts are told by an ANA change event. A writer that
//! is stopped (SIGTERM, a drain) turns inaccessible and detaches, so a standby takes over at
//! once.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use trireme_blockdev::{BlockDevice, Caps, DevError, ErrorKind, Extent, VolumeDevice, Want};
use trireme_meta::ClusterMeta;
use trireme_nvmf::ident::ana;
use trireme_nvmf::{Ana, Port, Subsystem};

use crate::attach::{AttachConfig, Attached};
use crate::DaemonError;

mod announce;
pub use announce::{announce, Announced};

/// How often a standby reads the volume again (its size) while it watches the writer's
/// attach record.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// What `nvmf serve` was asked.
#[derive(Debug, Clone)]
pub struct NvmfConfig {
    pub attach: AttachConfig,
    pub listen: SocketAddr,
    /// 1 to 15, distinct among the servers of one volume (controller ids, discovery).
    pub port_id: u16,
    /// The cluster's name in the subsystem's NQN.
    pub cluster: String,
}

/// The volume as this process serves it: its writer's device once it holds the volume,
/// nothing while it is a standby (the target refuses I/O on an inaccessible path before it
/// gets here).
#[derive(Debug, Default)]
pub struct StandbyDevice {
    writer: RwLock<Option<VolumeDevice>>,
    /// The volume's size as the metadata says, while no writer is here.
    size: std::sync::atomic::AtomicU64,
}

impl StandbyDevice {
    fn writer(&self) -> Result<VolumeDevice, DevError> {
        self.writer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                DevError::new(
                    ErrorKind::Io,
                    "this server does not hold the volume's writer",
                )
            })
    }

    fn set(&self, w: Option<VolumeDevice>) {
        *self.writer.write().unwrap_or_else(|e| e.into_inner()) = w;
    }
}

impl BlockDevice for StandbyDevice {
    fn size(&self) -> u64 {
        match self.writer() {
            Ok(w) => w.size(),
            Err(_) => self.size.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
    fn caps(&self) -> Caps {
        Caps {
            read_only: false,
            shared_flush: true,
            trim: true,
        }
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DevError> {
        self.writer()?.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), DevError> {
        self.writer()?.write(offset, data, fua).await
    }
    async fn flush(&self) -> Result<(), DevError> {
        match self.writer() {
            Ok(w) => w.flush().await,
            // A host's shutdown on a standby: nothing of it was written here.
            Err(_) => Ok(()),
        }
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), DevError> {
        self.writer()?
            .write_zeroes(offset, len, may_trim, fua)
            .await
    }
    async fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        self.writer()?.block_status(offset, len, want).await
    }
}

/// The export of one volume on this server: its port and its ANA state.
#[derive(Debug, Clone)]
pub struct NvmfExport {
    pub port: Arc<Port<StandbyDevice>>,
    pub ana: Ana,
    pub dev: Arc<StandbyDevice>,
    pub nqn: String,
}

/// Binds the port and builds the subsystem of `cfg.attach.volume` (a standby until
/// [`run`] attaches).
pub async fn export(
    meta: &ClusterMeta,
    cfg: &NvmfConfig,
    access: crate::access::AccessView,
) -> Result<(NvmfExport, tokio::net::TcpListener), DaemonError> {
    let volume = &cfg.attach.volume;
    bind(meta, volume, cfg.listen, cfg.port_id, &cfg.cluster, access).await
}

/// The export of `slot`'s volume by the writer this process already is (`up --nvmf`): the
/// only path, always optimized.
pub async fn export_writer(
    meta: &ClusterMeta,
    slot: &Arc<trireme_blockdev::Slot>,
    listen: SocketAddr,
    cluster: &str,
    access: crate::access::AccessView,
) -> Result<(NvmfExport, tokio::net::TcpListener), DaemonError> {
    let volume = slot.current().info().name.clone();
    let (ex, l) = bind(meta, &volume, listen, 1, cluster, access).await?;
    ex.dev.set(Some(VolumeDevice::new(slot.clone())));
    ex.ana.set(ana::OPTIMIZED);
    Ok((ex, l))
}

async fn bind(
    meta: &ClusterMeta,
    volume: &String,
    listen: SocketAddr,
    port_id: u16,
    cluster: &str,
    access: crate::access::AccessView,
) -> Result<(NvmfExport, tokio::net::TcpListener), DaemonError> {
    let cfg = (listen, port_id, cluster);
    let (listen, port_id, cluster) = cfg;
    if !trireme_nvmf::PORT_IDS.contains(&port_id) {
        return Err(DaemonError::Usage(format!(
            "--port-id {port_id}: 1 to 15, distinct on each server that serves the volume"
        )));
    }
    let v = crate::attach::until_reachable("reading the volume", || meta.volume(volume)).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| DaemonError::Usage(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| DaemonError::Runtime(e.to_string()))?;
    let nqn = trireme_nvmf::volume_nqn(cluster, volume);
    let (nguid, serial) = trireme_nvmf::volume_ids(&format!("{cluster}:{volume}:{}", v.id));
    let dev = Arc::new(StandbyDevice::default());
    dev.size.store(v.size, std::sync::atomic::Ordering::Relaxed);
    let ana = Ana::new(ana::INACCESSIBLE);
    let name = volume.clone();
    let sub = Arc::new(Subsystem {
        nqn: nqn.clone(),
        serial,
        nguid,
        dev: dev.clone(),
        ana: ana.clone(),
        allow: Arc::new(move |host: &str| access.allows(&name, host)),
    });
    let port = Arc::new(Port::new(port_id, addr, vec![sub]));
    Ok((
        NvmfExport {
            port,
            ana,
            dev,
            nqn,
        },
        listener,
    ))
}

/// Waits until no writer holds the volume, then becomes it. Keeps the standby's size
/// current meanwhile.
async fn take_when_free(meta: &ClusterMeta, cfg: &NvmfConfig, ex: &NvmfExport) -> Attached {
    let volume = &cfg.attach.volume;
    let key = format!("{}{volume}", ClusterMeta::attach_prefix());
    let mut said = false;
    loop {
        // One read, watched from its revision: the record's end (its lease expired, or a
        // detach) wakes this at once.
        let (held, rev) = crate::keys::read(meta, &key).await;
        if let Some(kv) = held {
            if !said {
                // A record that does not decode still holds the volume.
                let holder = serde_json::from_slice::<trireme_meta::AttachRecord>(&kv.value)
                    .map_or_else(
                        |_| "an unreadable attach record".into(),
                        |h| format!("pid {} on {}", h.pid, h.host),
                    );
                tracing::info!(%volume, writer = %holder, "standby: another server holds the volume's writer; this path is ANA inaccessible");
                said = true;
            }
            if let Ok(v) = meta.volume(volume).await {
                ex.dev
                    .size
                    .store(v.size, std::sync::atomic::Ordering::Relaxed);
            }
            let _ = tokio::time::timeout(STANDBY_POLL, crate::keys::changed(meta, &key, rev)).await;
            continue;
        }
        let exports = vec![format!("nvme/tcp {} {}", ex.port.addr, ex.nqn)];
        match crate::attach::attach(meta.clone(), &cfg.attach, exports).await {
            Ok(a) => return a,
            Err(DaemonError::Meta(trireme_meta::MetaError::Attached { .. })) => {
                // Another standby was first.
                said = false;
            }
            Err(e) => {
                tracing::warn!(%volume, "taking the volume's writer failed, trying again: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Serves `ex` until `stop`: a standby first, the writer once the volume is free; on stop
/// the path turns inaccessible and the writer detaches, for a standby to take it at once. A
/// writer another one supersedes (a forced attach, or this process's lease lost to a
/// partition) turns inaccessible and is a standby again.
pub async fn run(
    meta: ClusterMeta,
    cfg: NvmfConfig,
    ex: NvmfExport,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    tokio::pin!(stop);
    loop {
        let att = tokio::select! {
            a = take_when_free(&meta, &cfg, &ex) => a,
            _ = &mut stop => {
                ex.port.shut();
                return Ok(());
            }
        };
        let epoch = att.volume.info().epoch;
        let slot = crate::export::WriterSlot::new(att.volume.clone());
        ex.dev.set(Some(VolumeDevice::new(slot.slot.clone())));
        ex.ana.set(ana::OPTIMIZED);
        tracing::info!(volume = %cfg.attach.volume, epoch, nqn = %ex.nqn, "this server holds the volume's writer: its path is ANA optimized");
        tokio::select! {
            _ = &mut stop => return hand_over(&ex, att).await,
            why = superseded(&meta, &cfg.attach.volume, epoch) => {
                // Hosts move to the new writer's path; I/O here could only fail.
                ex.ana.set(ana::INACCESSIBLE);
                ex.dev.set(None);
                att.abandon().await;
                tracing::warn!(volume = %cfg.attach.volume, epoch, "{why}: this path is ANA inaccessible, a standby again");
            }
        }
    }
}

/// The stop of a writer: hosts move their I/O off this path (queued while no path is
/// usable); what is in flight here ends before the writer detaches.
async fn hand_over(ex: &NvmfExport, att: Attached) -> Result<(), DaemonError> {
    ex.ana.set(ana::INACCESSIBLE);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = att.detach().await;
    ex.dev.set(None);
    ex.port.shut();
    r
}

/// Returns, saying why, once the volume's epoch is no longer `epoch`: another writer took
/// it, and this one is fenced.
async fn superseded(meta: &ClusterMeta, volume: &str, epoch: u64) -> String {
    let key = format!("{}{volume}", ClusterMeta::layouts_prefix());
    loop {
        let (_, rev) = crate::keys::read(meta, &key).await;
        match meta.volume(volume).await {
            Ok(v) if v.epoch != epoch => {
                return format!("a writer of epoch {} took the volume", v.epoch)
            }
            Ok(_) => {}
            Err(trireme_meta::MetaError::NoVolume(_)) => return "the volume is gone".into(),
            Err(e) => tracing::debug!(%volume, "reading the layout: {e}"),
        }
        crate::keys::changed(meta, &key, rev).await;
    }
}
