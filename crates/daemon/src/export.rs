//! The NBD exports of a volume and of its snapshots: the block devices of
//! `trireme-blockdev`, with a dirty bitmap per snapshot on top (a filter).

use std::sync::Arc;

use bytes::Bytes;
use trireme_blockdev::volume::{dev_error, extents};
use trireme_blockdev::{
    BlockDevice, Caps, DevError, ErrorKind, Filter, Filtered, ReadOnly, VolumeDevice, Want,
};
use trireme_nbd::Extent;

pub use crate::writer_slot::{reattach_when_lost, take_back, WriterSlot};

/// A volume served over NBD: its device, with a dirty bitmap per snapshot.
pub type VolumeExport = Filtered<DirtyBitmaps<VolumeDevice>>;

/// The volume of `slot`'s writer as an export, its snapshots listed at `snapshots`.
pub fn volume_export(slot: &WriterSlot, snapshots: SnapshotSource) -> VolumeExport {
    Filtered(DirtyBitmaps {
        next: VolumeDevice::new(slot.slot.clone()),
        volume: slot.current().info().name.clone(),
        snapshots,
        bitmaps: std::sync::Mutex::new(Vec::new()),
    })
}

/// A filter that offers the blocks changed since each ready snapshot of the volume below as
/// an NBD metadata context (`qemu:dirty-bitmap:NAME`), as qemu names its dirty bitmaps.
#[derive(Debug)]
pub struct DirtyBitmaps<D> {
    next: D,
    volume: String,
    /// Where its snapshots are listed.
    snapshots: SnapshotSource,
    /// The snapshot ids behind the bitmaps last offered, by name.
    bitmaps: std::sync::Mutex<Vec<(String, u64)>>,
}

/// The NBD metadata context of the blocks changed since snapshot `name`, as qemu names its
/// dirty bitmaps.
pub const DIRTY_BITMAP: &str = "qemu:dirty-bitmap:";

/// Where a volume's snapshots are listed.
#[derive(Debug, Clone)]
pub enum SnapshotSource {
    /// `up`'s control socket.
    Control(std::path::PathBuf),
    /// The cluster's metadata on etcd.
    Etcd(trireme_meta::ClusterMeta),
}

impl SnapshotSource {
    /// The snapshots of `volume` that are ready, by name and id.
    pub async fn ready(&self, volume: &str) -> Result<Vec<(String, u64)>, String> {
        let list = match self {
            SnapshotSource::Control(p) => snapshots_via_control(p, volume).await?.1,
            SnapshotSource::Etcd(m) => snapshots_on_etcd(m, volume).await?.1,
        };
        Ok(list
            .into_iter()
            .filter(|s| s.state == "ready")
            .map(|s| (s.name, s.id))
            .collect())
    }
}

/// The dirty bitmaps offered for `snaps` (name, id).
fn bitmap_names(snaps: &[(String, u64)]) -> Vec<String> {
    snaps
        .iter()
        .map(|(n, _)| format!("{DIRTY_BITMAP}{n}"))
        .collect()
}

/// The snapshot id behind context `context`, among `snaps`.
fn bitmap_id(snaps: &[(String, u64)], context: &str) -> Result<u64, DevError> {
    context
        .strip_prefix(DIRTY_BITMAP)
        .and_then(|n| snaps.iter().find(|(name, _)| name == n))
        .map(|(_, id)| *id)
        .ok_or_else(|| {
            DevError::new(
                ErrorKind::Invalid,
                format!("no metadata context {context:?} on this export"),
            )
        })
}

/// A changed-blocks answer as NBD dirty-bitmap extents (flag 1: dirty).
fn dirty_extents(ext: Vec<Extent>) -> Vec<Extent> {
    ext.into_iter()
        .map(|e| Extent {
            length: e.length,
            flags: u32::from(e.flags & trireme_proto::EXTENT_CHANGED != 0),
        })
        .collect()
}

impl<D: BlockDevice> Filter for DirtyBitmaps<D> {
    type Next = D;
    fn next(&self) -> &D {
        &self.next
    }
    /// A dirty bitmap per snapshot ready now: the blocks written or trimmed since it.
    async fn contexts(&self) -> Vec<String> {
        match self.snapshots.ready(&self.volume).await {
            Ok(snaps) => {
                let names = bitmap_names(&snaps);
                *self.bitmaps.lock().unwrap_or_else(|e| e.into_inner()) = snaps;
                names
            }
            Err(e) => {
                tracing::warn!(volume = %self.volume, "listing snapshots for the export's dirty bitmaps: {e}");
                Vec::new()
            }
        }
    }
    async fn context_status(
        &self,
        context: &str,
        offset: u64,
        len: u32,
        want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        let id = bitmap_id(
            &self.bitmaps.lock().unwrap_or_else(|e| e.into_inner()),
            context,
        )?;
        let ext = self.next.changed_since(id, offset, len, want).await?;
        Ok(dirty_extents(ext))
    }
}

/// A snapshot served over NBD: read-only (a filter), with a dirty bitmap per older snapshot.
pub type SnapshotExport = Filtered<ReadOnly<SnapshotDevice>>;

/// A snapshot as a block device (writes never reach it: [`SnapshotExport`] is read-only).
#[derive(Debug)]
pub struct SnapshotDevice {
    pub reader: Arc<trireme_client::SnapshotReader>,
    /// The older snapshots that were ready when the export started (name, id): each a dirty
    /// bitmap of what changed from it to this one.
    pub older: Vec<(String, u64)>,
    /// Set once the export has said that its snapshot is gone (said once, not per read).
    pub gone: std::sync::atomic::AtomicBool,
}

impl SnapshotDevice {
    /// A failed request's error for the client; the first that finds the snapshot gone from
    /// every copy says so in the log (it was deleted with `--force`, or behind the export's
    /// back: its reads fail from now on).
    fn failed(&self, e: trireme_client::VolumeError) -> DevError {
        let gone = matches!(
            &e,
            trireme_client::VolumeError::Replica {
                status: trireme_proto::Status::NoSnapshot,
                ..
            }
        );
        if gone && !self.gone.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(
                snapshot = self.reader.id(),
                "the snapshot this export serves is gone from every copy that held it (deleted with --force?): its reads fail from now on; stop the export"
            );
        }
        dev_error(e)
    }
}

impl BlockDevice for SnapshotDevice {
    fn size(&self) -> u64 {
        self.reader.size()
    }
    fn caps(&self) -> Caps {
        Caps {
            read_only: true,
            shared_flush: true,
            trim: false,
        }
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DevError> {
        self.reader
            .read(offset, u64::from(len))
            .await
            .map_err(|e| self.failed(e))
    }
    async fn write(&self, _: u64, _: Bytes, _: bool) -> Result<(), DevError> {
        Err(read_only())
    }
    async fn flush(&self) -> Result<(), DevError> {
        Ok(())
    }
    async fn write_zeroes(&self, _: u64, _: u32, _: bool, _: bool) -> Result<(), DevError> {
        Err(read_only())
    }
    /// Holes where the snapshot has them, so a copy of it skips them.
    async fn block_status(
        &self,
        offset: u64,
        len: u32,
        want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        self.reader
            .block_status(offset, u64::from(len), extents(want))
            .await
            .map_err(|e| self.failed(e))
    }
    async fn contexts(&self) -> Vec<String> {
        bitmap_names(&self.older)
    }
    /// What changed from an older snapshot to this one.
    async fn context_status(
        &self,
        context: &str,
        offset: u64,
        len: u32,
        want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        let id = bitmap_id(&self.older, context)?;
        let ext = self
            .reader
            .changed(id, offset, u64::from(len), extents(want))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(dirty_extents(ext))
    }
}

fn read_only() -> DevError {
    DevError::new(ErrorKind::ReadOnly, "a snapshot is read-only")
}

/// Where `volume` lives and its snapshots, through `up`'s control socket.
pub async fn snapshots_via_control(
    control: &std::path::Path,
    volume: &str,
) -> Result<
    (
        trireme_client::AttachInfo,
        Vec<trireme_control::SnapshotInfo>,
    ),
    String,
> {
    let mut cc = trireme_control::ControlClient::connect(control)
        .await
        .map_err(|e| e.to_string())?;
    let name = volume.to_string();
    let info = cc
        .call(&trireme_control::Request::Locate { name: name.clone() })
        .await
        .map_err(|e| e.to_string())?;
    let list = cc
        .call(&trireme_control::Request::SnapshotList { name })
        .await
        .map_err(|e| e.to_string())?;
    Ok((info, list))
}

/// Where `volume` lives and its snapshots, from the metadata of a cluster on etcd (a
/// client's identity may read them).
pub async fn snapshots_on_etcd(
    meta: &trireme_meta::ClusterMeta,
    volume: &str,
) -> Result<
    (
        trireme_client::AttachInfo,
        Vec<trireme_control::SnapshotInfo>,
    ),
    String,
> {
    let v = meta.volume(volume).await.map_err(|e| e.to_string())?;
    let info = trireme_control::attach_info(meta, &v)
        .await
        .map_err(|e| e.to_string())?;
    let list = meta
        .snapshots(&v)
        .await
        .map_err(|e| e.to_string())?
        .iter()
        .map(|r| trireme_control::SnapshotInfo::from_record(r, &v, None))
        .collect();
    Ok((info, list))
}

/// Serves snapshot `snap` of the volume `info` describes (its snapshots: `list`) read-only
/// over NBD, as export `VOLUME@SNAP`, from the copies that hold it: the volume's writer is not
/// touched, and the snapshot held on its copies (a delete of it is refused while this serves).
/// Returns once the listeners are bound, with the tasks serving them and the reader (whose
/// hold the caller lets go when it stops: [`export_holder`] names it).
pub async fn serve_snapshot(
    info: &trireme_client::AttachInfo,
    list: &[trireme_control::SnapshotInfo],
    snap: &str,
    socket: Option<&std::path::Path>,
    tcp: Option<tokio::net::TcpListener>,
    tls: Option<&ExportTls>,
    opts: trireme_client::VolumeOptions,
) -> Result<
    (
        Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
        Arc<trireme_client::SnapshotReader>,
    ),
    String,
> {
    let (dev, reader) = snapshot_export(info, list, snap, opts)
        .await
        .map_err(|e| e.to_string())?;
    let label = format!("{}@{snap}", info.name);
    let mut ex = trireme_nbd::Exports::new();
    ex.add(
        &label,
        &format!("trireme snapshot {label} (read-only)"),
        dev,
    );
    Ok((listen(Arc::new(ex), socket, tcp, tls)?, reader))
}

/// Snapshot `snap` of the volume `info` describes (its snapshots: `list`) as a read-only
/// device, held on its copies while it serves (a delete of it is refused, naming this
/// process: [`export_holder`]); and its reader, whose hold the caller lets go when it stops.
pub async fn snapshot_export(
    info: &trireme_client::AttachInfo,
    list: &[trireme_control::SnapshotInfo],
    snap: &str,
    opts: trireme_client::VolumeOptions,
) -> Result<(Arc<SnapshotExport>, Arc<trireme_client::SnapshotReader>), crate::DaemonError> {
    // Every refusal of `snapshot_reader` names what the caller asked for: no such snapshot,
    // not ready, on no copy now.
    let reader =
        Arc::new(snapshot_reader(info, list, snap, opts).map_err(crate::DaemonError::Usage)?);
    reader
        .hold(export_holder(&format!("{}@{snap}", info.name)))
        .await;
    let older = list
        .iter()
        .filter(|s| s.state == "ready" && s.id < reader.id())
        .map(|s| (s.name.clone(), s.id))
        .collect();
    let dev = Arc::new(Filtered(ReadOnly(SnapshotDevice {
        reader: reader.clone(),
        older,
        gone: Default::default(),
    })));
    Ok((dev, reader))
}

/// The name an export of snapshot `label` holds it in.
pub fn export_holder(label: &str) -> String {
    format!(
        "export {label} (pid {} on {})",
        std::process::id(),
        crate::hostname()
    )
}

/// A reader of snapshot `snap`, given where the volume lives and its snapshots: the copies
/// that hold it first.
pub fn snapshot_reader(
    info: &trireme_client::AttachInfo,
    list: &[trireme_control::SnapshotInfo],
    snap: &str,
    opts: trireme_client::VolumeOptions,
) -> Result<trireme_client::SnapshotReader, String> {
    let volume = &info.name;
    let s = list.iter().find(|s| s.name == snap).ok_or_else(|| {
        format!(
            "volume {volume} has no snapshot named {snap:?} (`trireme volume snapshot list {volume}`)"
        )
    })?;
    if s.state != "ready" {
        return Err(format!(
            "snapshot {volume}@{snap} is {}, not ready",
            s.state
        ));
    }
    let mut copies: Vec<trireme_client::ReplicaTarget> = info
        .replicas
        .iter()
        .filter(|r| s.nodes.contains(&r.node))
        .cloned()
        .collect();
    if copies.is_empty() {
        return Err(format!(
            "no node that holds snapshot {volume}@{snap} (nodes {:?}) holds a copy of the volume now",
            s.nodes
        ));
    }
    copies.sort_by_key(|r| r.node);
    Ok(trireme_client::SnapshotReader::new(
        &format!("{volume}@{snap}"),
        info.id,
        s.id,
        s.size,
        copies,
        opts,
    ))
}

/// TLS for an NBD TCP listener.
#[derive(Debug, Clone)]
pub struct ExportTls {
    pub nbd: trireme_nbd::NbdTls,
    /// Where a client's credentials are (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`),
    /// if known here: named in the URI, as libnbd's `tls-certificates=DIR` reads it.
    pub client_dir: Option<std::path::PathBuf>,
}

impl ExportTls {
    /// The server identity in `dir` (`server-cert.pem`, `server-key.pem`, `ca-cert.pem`).
    pub fn load(
        dir: &std::path::Path,
        client_dir: Option<std::path::PathBuf>,
    ) -> Result<ExportTls, String> {
        let id = trireme_tls::Identity::load(dir, "server").map_err(|e| e.to_string())?;
        let cfg = id.server_config().map_err(|e| e.to_string())?;
        Ok(ExportTls {
            nbd: trireme_nbd::NbdTls {
                acceptor: trireme_tls::tokio_rustls::TlsAcceptor::from(cfg),
                allow: None,
            },
            client_dir,
        })
    }

    /// Opens each export only to the clients on its volume's access list in `view`.
    pub fn gated(mut self, view: &crate::access::AccessView) -> ExportTls {
        self.nbd.allow = Some(view.nbd_gate());
        self
    }
}

/// NBD URIs for an export on a unix socket and on TCP (`nbds://` with TLS).
pub fn uris(
    volume: &str,
    socket: Option<&std::path::Path>,
    tcp: Option<std::net::SocketAddr>,
    tls: Option<&ExportTls>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = socket {
        out.push(format!("nbd+unix:///{volume}?socket={}", p.display()));
    }
    match (tcp, tls) {
        (Some(a), None) => out.push(format!("nbd://{a}/{volume}")),
        (Some(a), Some(t)) => out.push(match &t.client_dir {
            Some(d) => format!("nbds://{a}/{volume}?tls-certificates={}", d.display()),
            None => format!("nbds://{a}/{volume}"),
        }),
        (None, _) => {}
    }
    out
}

/// Serves an attached volume over NBD on the given listeners. Returns the tasks serving them.
pub fn serve(
    slot: &Arc<WriterSlot>,
    snapshots: SnapshotSource,
    socket: Option<&std::path::Path>,
    tcp: Option<tokio::net::TcpListener>,
    tls: Option<&ExportTls>,
) -> Result<Vec<tokio::task::JoinHandle<std::io::Result<()>>>, String> {
    let name = slot.current().info().name.clone();
    let mut ex = trireme_nbd::Exports::new();
    ex.add(
        &name,
        &format!("trireme volume {name}"),
        Arc::new(volume_export(slot, snapshots)),
    );
    listen(Arc::new(ex), socket, tcp, tls)
}

/// Serves `ex` on the given listeners; the tasks serving them.
fn listen<B: BlockDevice>(
    ex: Arc<trireme_nbd::Exports<B>>,
    socket: Option<&std::path::Path>,
    tcp: Option<tokio::net::TcpListener>,
    tls: Option<&ExportTls>,
) -> Result<Vec<tokio::task::JoinHandle<std::io::Result<()>>>, String> {
    let mut tasks = Vec::new();
    if let Some(p) = socket {
        let listener = trireme_tls::local::bind_private(p)
            .map_err(|e| format!("bind {}: {e}", p.display()))?;
        let ex = ex.clone();
        tasks.push(tokio::spawn(async move {
            trireme_nbd::serve_unix(listener, ex).await
        }));
    }
    if let Some(l) = tcp {
        let ex = ex.clone();
        let tls = tls.map(|t| t.nbd.clone());
        tasks.push(tokio::spawn(async move {
            trireme_nbd::serve_tcp(l, ex, tls).await
        }));
    }
    Ok(tasks)
}

/// Attaches `volume` through the control socket of `trireme up` and serves it over NBD.
/// Returns once the listeners are bound, with the tasks serving them.
pub async fn export_local(
    control: &std::path::Path,
    volume: &str,
    socket: Option<&std::path::Path>,
    tcp: Option<tokio::net::TcpListener>,
    tls: Option<&ExportTls>,
    opts: trireme_client::VolumeOptions,
) -> Result<
    (
        Arc<WriterSlot>,
        Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    ),
    String,
> {
    let served = uris(
        volume,
        socket,
        tcp.as_ref().and_then(|l| l.local_addr().ok()),
        tls,
    );
    let hello = trireme_control::WriterHello::me(served.clone());
    let vol = crate::writer_slot::attach(control, volume, opts, Some(hello)).await?;
    let slot = WriterSlot::serving(vol, served);
    let source = SnapshotSource::Control(control.to_path_buf());
    let tasks = serve(&slot, source, socket, tcp, tls)?;
    Ok((slot, tasks))
}
