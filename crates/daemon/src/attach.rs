//! The writer of a volume on a client host (`trireme attach`).
//!
//! Attaching is one metadata transaction (compare the layout's and the attach record's
//! revisions, bump the epoch, mark the writer open) followed by the attach record put under
//! this process's lease ([`ClusterMeta::attach`]). A second attach is refused while that
//! record lives; `--force` fences the holder (its epoch is stale at every replica from the
//! moment the new writer attaches them). When the holder dies its lease expires, the record
//! goes, and the next attach finds the writer-open flag set: it reconciles the replicas first.
//!
//! The writer records replica states itself ([`MetaMembership`]): taking a replica out is a
//! metadata write that must be durable before the write that caused it is acknowledged, so
//! while the store is unreachable that write waits — it is never acknowledged without the
//! record — and goes on when the store is back. I/O to in-sync replicas never waits on it.

use std::sync::Arc;
use std::time::Duration;

use trireme_client::{AttachInfo, BoxFut, Membership, Volume, VolumeOptions};
use trireme_meta::kv::LeaseId;
use trireme_meta::{AttachRecord, ClusterMeta, MetaError};
use trireme_replication::ReplicaState;

use crate::DaemonError;

/// How long a stopping writer tries to flush and detach.
pub const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// How to attach.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    pub volume: String,
    /// Fence the current writer instead of refusing.
    pub force: bool,
    /// TTL of the attach record's lease: how long after this process dies another host may
    /// attach without `--force`.
    pub lease_ttl: Duration,
    pub opts: VolumeOptions,
}

/// Replica states recorded straight in the cluster metadata by the writer.
#[derive(Debug, Clone)]
pub struct MetaMembership {
    pub meta: ClusterMeta,
}

/// Retries `f` while the metadata store is unreachable.
async fn until_reachable<T, F, Fut>(what: &str, mut f: F) -> Result<T, MetaError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, MetaError>>,
{
    let mut warned = false;
    loop {
        match f().await {
            Err(MetaError::Unavailable(m)) => {
                if !warned {
                    tracing::warn!("{what}: metadata store unreachable, waiting for it: {m}");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            r => {
                if warned {
                    tracing::info!("{what}: metadata store reachable again");
                }
                return r;
            }
        }
    }
}

impl Membership for MetaMembership {
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
    ) -> BoxFut<'a, Result<(), String>> {
        Box::pin(async move {
            until_reachable("recording a replica state", || {
                trireme_control::record_replica_state(&self.meta, volume, epoch, node, state)
            })
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
    }

    fn locate<'a>(&'a self, volume: &'a str) -> BoxFut<'a, Result<AttachInfo, String>> {
        Box::pin(async move {
            let v = until_reachable("locating replicas", || self.meta.volume(volume))
                .await
                .map_err(|e| e.to_string())?;
            trireme_control::attach_info(&self.meta, &v).await
        })
    }

    fn detach<'a>(&'a self, volume: &'a str, epoch: u64) -> BoxFut<'a, Result<(), String>> {
        Box::pin(async move {
            trireme_control::record_detach(&self.meta, volume, epoch)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

/// An attached volume: the writer, its lease, and what keeps the lease.
#[derive(Debug)]
pub struct Attached {
    pub volume: Arc<Volume>,
    pub meta: ClusterMeta,
    pub lease: LeaseId,
    keeper: tokio::task::JoinHandle<()>,
}

/// Attaches `cfg.volume` as its writer. `exports` (the NBD URIs it will be served at) go in
/// the attach record, for `status`.
pub async fn attach(
    meta: ClusterMeta,
    cfg: &AttachConfig,
    exports: Vec<String>,
) -> Result<Attached, DaemonError> {
    trireme_meta::check_name(&cfg.volume).map_err(|e| DaemonError::Usage(e.to_string()))?;
    let ttl = cfg.lease_ttl.max(crate::lease::MIN_TTL);
    let lease = crate::lease::grant(&**meta.store(), ttl).await?;
    let rec = AttachRecord {
        epoch: 0,
        host: crate::hostname(),
        pid: std::process::id(),
        exports,
    };
    let attached = loop {
        let r = until_reachable("attaching", || {
            meta.attach(&cfg.volume, &rec, lease, cfg.force)
        })
        .await;
        // A writer of this host that died (kill -9, then a restart) holds the record until
        // its lease expires: wait for that rather than refuse.
        if let Err(MetaError::Refused(_)) = &r {
            if let Ok(Some((h, _))) = meta.attachment(&cfg.volume).await {
                if h.host == rec.host && !crate::node::pid_alive(h.pid) {
                    tracing::info!(
                        pid = h.pid,
                        "the previous writer on this host died; waiting for its lease to expire"
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            }
        }
        break r;
    };
    let (v, unclean) = match attached {
        Ok(r) => r,
        Err(e) => {
            let _ = meta.store().revoke(lease).await;
            return Err(match e {
                MetaError::NoVolume(_) | MetaError::Refused(_) => DaemonError::Usage(e.to_string()),
                e => e.into(),
            });
        }
    };
    let keeper = {
        let store = meta.store().clone();
        tokio::spawn(async move {
            crate::lease::keep(&*store, lease, ttl).await;
            tracing::error!(
                "the attach lease is lost: another host may attach now and fence this writer"
            );
        })
    };
    let mut info = match trireme_control::attach_info(&meta, &v).await {
        Ok(i) => i,
        Err(e) => {
            keeper.abort();
            let _ = meta.store().revoke(lease).await;
            return Err(DaemonError::Runtime(e));
        }
    };
    info.reconcile = unclean;
    if unclean {
        tracing::warn!(volume = %cfg.volume, epoch = v.epoch, "the previous writer did not detach: reconciling the replicas first");
    }
    let membership = Arc::new(MetaMembership { meta: meta.clone() });
    let volume = match Volume::attach_managed(info, cfg.opts.clone(), membership).await {
        Ok(v) => v,
        Err(e) => {
            keeper.abort();
            let _ = meta.store().revoke(lease).await;
            return Err(DaemonError::Runtime(e.to_string()));
        }
    };
    tracing::info!(volume = %cfg.volume, epoch = v.epoch, "attached");
    Ok(Attached {
        volume,
        meta,
        lease,
        keeper,
    })
}

impl Attached {
    /// Flushes, detaches cleanly (the next writer need not reconcile) and gives the lease back.
    /// A flush that cannot finish (no replica answers) is given up after [`DETACH_TIMEOUT`]:
    /// the writer-open flag then stays set, so the next writer reconciles.
    pub async fn detach(self) -> Result<(), DaemonError> {
        let epoch = self.volume.info().epoch;
        let name = self.volume.info().name.clone();
        let r = match tokio::time::timeout(DETACH_TIMEOUT, self.volume.detach()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no replica answered within {DETACH_TIMEOUT:?}")),
        };
        let _ = self.meta.release_attachment(&name, epoch).await;
        self.keeper.abort();
        let _ = self.meta.store().revoke(self.lease).await;
        r.map_err(|e| DaemonError::Runtime(format!("final flush and detach: {e}")))
    }
}
