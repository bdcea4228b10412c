//! The NBD export of a volume: adapts the volume client to the NBD server's `Backend`.

use std::sync::Arc;

use bytes::Bytes;
use trireme_client::{Volume, VolumeError};
use trireme_nbd::consts::{EINVAL, EIO, ENOSPC};
use trireme_nbd::{Backend, BackendError, Extent};

/// The writer an export serves through. The process may put another in its place
/// (`trireme up` takes its volume back once a writer that fenced it has detached); every
/// request goes to the one there when it starts.
#[derive(Debug)]
pub struct WriterSlot(std::sync::RwLock<Arc<Volume>>);

impl WriterSlot {
    pub fn new(v: Arc<Volume>) -> Arc<WriterSlot> {
        Arc::new(WriterSlot(std::sync::RwLock::new(v)))
    }

    /// The writer requests go to now.
    pub fn current(&self) -> Arc<Volume> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `v` in place of the current writer, which it returns.
    pub fn replace(&self, v: Arc<Volume>) -> Arc<Volume> {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|e| e.into_inner()), v)
    }
}

/// A volume served over NBD.
#[derive(Debug)]
pub struct VolumeExport(pub Arc<WriterSlot>);

fn to_nbd(e: VolumeError) -> BackendError {
    let errno = match &e {
        VolumeError::Range(trireme_replication::RangeError::OutOfRange { .. }) => ENOSPC,
        e if e.is_invalid_request() => EINVAL,
        _ => EIO,
    };
    BackendError {
        errno,
        message: e.to_string(),
    }
}

impl Backend for VolumeExport {
    fn size(&self) -> u64 {
        self.0.current().size()
    }
    /// Every connection of this process shares one volume client, and a flush reaches every
    /// replica and syncs the whole replica there, so a flush covers all connections' writes.
    fn can_multi_conn(&self) -> bool {
        true
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, BackendError> {
        self.0
            .current()
            .read(offset, u64::from(len))
            .await
            .map_err(to_nbd)
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), BackendError> {
        self.0
            .current()
            .write(offset, data, fua)
            .await
            .map_err(to_nbd)
    }
    async fn flush(&self) -> Result<(), BackendError> {
        self.0.current().flush().await.map_err(to_nbd)
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), BackendError> {
        self.0
            .current()
            .write_zeroes(offset, u64::from(len), may_trim, fua)
            .await
            .map_err(to_nbd)
    }
    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, BackendError> {
        self.0
            .current()
            .block_status(offset, u64::from(len))
            .await
            .map_err(to_nbd)
    }
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
    socket: Option<&std::path::Path>,
    tcp: Option<tokio::net::TcpListener>,
    tls: Option<&ExportTls>,
) -> Result<Vec<tokio::task::JoinHandle<std::io::Result<()>>>, String> {
    let name = slot.current().info().name.clone();
    let mut ex = trireme_nbd::Exports::new();
    ex.add(
        &name,
        &format!("trireme volume {name}"),
        Arc::new(VolumeExport(slot.clone())),
    );
    let ex = Arc::new(ex);
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
    let mut cc = trireme_control::ControlClient::connect(control)
        .await
        .map_err(|e| e.to_string())?;
    let info: trireme_client::AttachInfo = cc
        .call(&trireme_control::Request::Attach {
            name: volume.to_string(),
        })
        .await
        .map_err(|e| e.to_string())?;
    let membership = Arc::new(trireme_control::ControlMembership {
        path: control.to_path_buf(),
    });
    let vol = Volume::attach_managed(info, opts, membership)
        .await
        .map_err(|e| e.to_string())?;
    let slot = WriterSlot::new(vol);
    let tasks = serve(&slot, socket, tcp, tls)?;
    Ok((slot, tasks))
}

/// How often `up` looks whether another writer has fenced its export's.
const TAKE_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `trireme up`'s own volume, when another writer attaches it (`trireme bench volume:vol0`, a
/// `trireme nbd vol0`): that writer fences the export's, whose I/O fails while it holds the
/// volume. Once it has detached, this task attaches again ([`Manager::take_back`]: only if no
/// writer holds the volume) and the export serves through the new writer. A writer that died
/// without detaching leaves the volume open, and the export waits: attach it once more and
/// detach (or restart `up`, which attaches anew).
///
/// [`Manager::take_back`]: trireme_control::Manager::take_back
pub async fn take_back(
    slot: Arc<WriterSlot>,
    manager: Arc<trireme_control::Manager>,
    control: std::path::PathBuf,
    opts: trireme_client::VolumeOptions,
) {
    let mut fenced_by = None;
    loop {
        tokio::time::sleep(TAKE_BACK_EVERY).await;
        let ours = slot.current();
        let name = ours.info().name.clone();
        let Ok(rec) = manager.meta().volume(&name).await else {
            continue;
        };
        if rec.epoch <= ours.info().epoch {
            fenced_by = None;
            continue;
        }
        if fenced_by != Some(rec.epoch) {
            tracing::warn!(
                volume = %name,
                ours = ours.info().epoch,
                theirs = rec.epoch,
                "another writer attached the volume and fenced this export's: its I/O fails until that writer detaches, then the export takes the volume back"
            );
            fenced_by = Some(rec.epoch);
        }
        if rec.writer_open {
            continue;
        }
        let info = match manager.take_back(&name, rec.epoch).await {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(volume = %name, "take back: {e}");
                continue;
            }
        };
        let membership = Arc::new(trireme_control::ControlMembership {
            path: control.clone(),
        });
        match Volume::attach_managed(info, opts.clone(), membership).await {
            Ok(v) => {
                let old = slot.replace(v.clone());
                manager.unregister_client(&old);
                manager.register_client(v.clone());
                tracing::warn!(volume = %name, epoch = v.info().epoch, "took the volume back: the export serves again");
            }
            Err(e) => tracing::warn!(volume = %name, "taking the volume back: {e}"),
        }
    }
}
