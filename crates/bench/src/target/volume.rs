//! A trireme volume through the native client: no NBD hop. Attaching takes a new epoch, so any
//! other writer of the volume (an NBD export of it, say) is fenced for the rest of the run.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use trireme_client::{AttachInfo, Volume, VolumeOptions};
use trireme_control::{ControlClient, ControlMembership, Request};
use trireme_transport::TransportKind;

use super::TargetError;

/// A benchmark transport name: the transport kind, and whether nodes on this host are reached
/// through their same-host (unix) socket.
/// * `tcp`: TCP through the kernel's network stack, even to a node on this host (loopback), as
///   the seeds' tables measure it.
/// * `unix`: no UCX; unix sockets to nodes on this host, TCP to the others (what `--transport
///   tcp` does outside the benchmark).
/// * `ucx`: UCX or nothing. `auto`: UCX where a probe works, else as `unix`.
pub fn transport(name: &str) -> Option<(TransportKind, bool)> {
    match name {
        "tcp" => Some((TransportKind::Tcp, false)),
        "unix" => Some((TransportKind::Tcp, true)),
        "ucx" => Some((TransportKind::Ucx, true)),
        "auto" => Some((TransportKind::Auto, true)),
        _ => None,
    }
}

/// How a writer attached by someone else ends (on a cluster on etcd: detaching, which drops
/// its attach record and lease).
pub type Closer =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

pub struct VolumeTarget {
    pub(crate) vol: Arc<Volume>,
    closer: std::sync::Mutex<Option<Closer>>,
}

impl std::fmt::Debug for VolumeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeTarget")
            .field("vol", &self.vol.info().name)
            .finish()
    }
}

impl VolumeTarget {
    /// Attaches volume `name`; `NAME?transport=T` picks the transport (see [`transport`];
    /// default auto: UCX where it works), `NAME?metrics=off` leaves the writer's metrics out
    /// (to measure what they cost); options join with `&`.
    pub async fn attach(spec: &str, data_dir: &Path) -> Result<VolumeTarget, TargetError> {
        let e = |x: String| TargetError(format!("volume:{spec}: {x}"));
        let (name, query) = spec.split_once('?').unwrap_or((spec, ""));
        let (mut kind, mut same_host_socket) = (TransportKind::Auto, true);
        let mut metrics = true;
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("transport", t)) => {
                    (kind, same_host_socket) = transport(t).ok_or_else(|| {
                        e(format!(
                            "unknown transport {t:?}: use tcp, unix, ucx or auto"
                        ))
                    })?
                }
                Some(("metrics", "on")) => metrics = true,
                Some(("metrics", "off")) => metrics = false,
                _ => {
                    return Err(e(format!(
                        "unknown option {kv:?}: use transport=tcp|unix|ucx|auto, metrics=on|off"
                    )))
                }
            }
        }
        let mut cc = ControlClient::connect(&data_dir.join("control.sock"))
            .await
            .map_err(|x| e(x.to_string()))?;
        let info: AttachInfo = cc
            .call(&Request::Attach {
                name: name.to_string(),
                writer: Some(trireme_control::WriterHello::me(Vec::new())),
            })
            .await
            .map_err(|x| e(x.to_string()))?;
        let membership = Arc::new(ControlMembership {
            path: data_dir.join("control.sock"),
        });
        let opts = VolumeOptions {
            kind,
            same_host_socket,
            metrics,
            ..VolumeOptions::default()
        };
        let vol = Volume::attach_managed(info, opts, membership)
            .await
            .map_err(|x| e(x.to_string()))?;
        Ok(VolumeTarget::with_writer(vol, None))
    }

    /// A writer attached elsewhere (a cluster on etcd: the CLI attaches it), ended by `closer`
    /// (else by a detach).
    pub fn with_writer(vol: Arc<Volume>, closer: Option<Closer>) -> VolumeTarget {
        VolumeTarget {
            vol,
            closer: std::sync::Mutex::new(closer),
        }
    }

    /// Flushes and detaches, so the next writer need not reconcile.
    pub async fn close(&self) {
        let closer = self.closer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(c) = closer {
            return c().await;
        }
        if let Err(e) = self.vol.detach().await {
            eprintln!("volume: detach: {e}");
        }
    }

    pub fn epoch(&self) -> u64 {
        self.vol.info().epoch
    }

    pub fn size(&self) -> u64 {
        self.vol.size()
    }

    /// Each link to a node: `node N: TRANSPORT[ over LANES]`.
    pub fn links(&self) -> Vec<String> {
        self.vol
            .connections()
            .into_iter()
            .filter_map(|(n, c)| {
                c.map(|c| match c.lanes {
                    Some(l) => format!("node {n}: {} over {l}", c.transport),
                    None => format!("node {n}: {}", c.transport),
                })
            })
            .collect()
    }

    pub fn describe(&self) -> String {
        let i = self.vol.info();
        format!(
            "volume {} (native client, {} replicas, epoch {})",
            i.name,
            i.replicas.len(),
            i.epoch
        )
    }

    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        self.vol
            .read(offset, len)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }

    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), TargetError> {
        self.vol
            .write(offset, data, false)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }
}
