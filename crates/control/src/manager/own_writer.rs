//! Writers the manager attaches itself: to move the replica of a volume nobody writes, or to
//! scrub one (`scrubs.rs`). On etcd under an attach record of its own (so a client's attach meanwhile is
//! refused rather than fenced); beside `up`, with a new epoch like any writer.

use std::sync::{Arc, Weak};

use trireme_client::{AttachInfo, BoxFut, Membership, MembershipError, Volume, VolumeOptions};
use trireme_meta::{AttachRecord, VolumeRecord};
use trireme_replication::ReplicaState;

use super::{Manager, Result};
use crate::error::ManagerError;

/// How long nodes may take to learn a new epoch from the metadata.
const EPOCH_PROPAGATION: std::time::Duration = std::time::Duration::from_secs(10);

/// The metadata, as a writer attached by the manager itself needs it.
#[derive(Debug)]
struct ManagerMembership(Weak<Manager>);

impl ManagerMembership {
    fn get(&self) -> std::result::Result<Arc<Manager>, MembershipError> {
        self.0.upgrade().ok_or_else(|| ManagerError::Stopped.into())
    }
}

impl Membership for ManagerMembership {
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> BoxFut<'a, std::result::Result<(), MembershipError>> {
        Box::pin(async move {
            self.get()?
                .set_replica_state(volume, epoch, node, state, incarnation)
                .await
                .map(|_| ())
                .map_err(MembershipError::from)
        })
    }
    fn locate<'a>(
        &'a self,
        volume: &'a str,
    ) -> BoxFut<'a, std::result::Result<AttachInfo, MembershipError>> {
        Box::pin(async move { Ok(self.get()?.locate(volume).await?) })
    }
    fn detach<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
    ) -> BoxFut<'a, std::result::Result<(), MembershipError>> {
        Box::pin(async move {
            self.get()?.detach(volume, epoch).await?;
            Ok(())
        })
    }
    fn record_size<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        size: u64,
    ) -> BoxFut<'a, std::result::Result<(), MembershipError>> {
        Box::pin(async move {
            self.get()?.set_volume_size(volume, epoch, size).await?;
            Ok(())
        })
    }
    fn record_region<'a>(
        &'a self,
        volume: &'a str,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    ) -> BoxFut<'a, std::result::Result<(), MembershipError>> {
        Box::pin(async move {
            self.get()?
                .set_region(volume, id, epoch, region, to)
                .await?;
            Ok(())
        })
    }
}

/// A writer the manager attached for itself; give it back with [`Manager::release_own`].
#[derive(Debug)]
pub(crate) struct OwnWriter {
    pub(crate) writer: Arc<Volume>,
    /// The epoch of the attach record it holds on etcd.
    record: Option<u64>,
}

impl Manager {
    /// Attaches `v` for the manager's own use (the caller has checked nobody holds it).
    pub(crate) async fn attach_own(self: &Arc<Self>, v: &VolumeRecord) -> Result<OwnWriter> {
        let (info, record) = match self.meta().fence_lease() {
            Some(lease) => {
                let rec = AttachRecord {
                    epoch: 0,
                    host: crate::hostname(),
                    pid: std::process::id(),
                    exports: vec![],
                    identity: None,
                };
                let (v, unclean) = self.meta().attach(&v.name, &rec, lease, false).await?;
                match crate::attach_info(self.meta(), &v).await {
                    Ok(mut info) => {
                        info.reconcile = unclean;
                        (info, Some(v.epoch))
                    }
                    Err(e) => {
                        self.undo_own_attach(&v.name, v.epoch, unclean, true).await;
                        return Err(e);
                    }
                }
            }
            None => (self.attach(&v.name).await?, None),
        };
        let (epoch, unclean) = (info.epoch, info.reconcile);
        let membership: Arc<dyn Membership> = Arc::new(ManagerMembership(Arc::downgrade(self)));
        let opts = VolumeOptions {
            connector: self.connector(),
            ..VolumeOptions::default()
        };
        // Nodes learn the new epoch within a moment (a watch of the metadata): until then
        // they refuse an attach past the newest epoch they know. Tried again for a while, as
        // a client's attach does.
        let t0 = tokio::time::Instant::now();
        let attached = loop {
            match Volume::attach_managed(info.clone(), opts.clone(), membership.clone()).await {
                Err(trireme_client::VolumeError::Denied { .. })
                    if t0.elapsed() < EPOCH_PROPAGATION =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                r => break r,
            }
        };
        let w = match attached {
            Ok(w) => w,
            Err(e) => {
                // Without this, what the attach above took would outlive the attempt: a record
                // no writer holds (every later attach refused or fencing nobody) and a volume
                // marked open by a writer that never wrote.
                self.undo_own_attach(&v.name, epoch, unclean, record.is_some())
                    .await;
                return Err(e.into());
            }
        };
        self.register_client(w.clone());
        Ok(OwnWriter { writer: w, record })
    }

    /// Detaches a writer of the manager's own and gives its attach record back.
    pub(crate) async fn release_own(&self, own: OwnWriter) {
        let name = own.writer.info().name.clone();
        self.unregister_client(&own.writer);
        if let Err(e) = own.writer.detach().await {
            tracing::warn!(volume = %name, "detaching the manager's own writer: {e}");
        }
        if let Some(epoch) = own.record {
            self.release_own_record(&name, epoch).await;
        }
    }

    /// Gives back the attach record taken for a writer of the manager's own.
    async fn release_own_record(&self, name: &str, epoch: u64) {
        if let Err(e) = self.meta().release_attachment(name, epoch).await {
            tracing::warn!(volume = %name, epoch, "releasing the manager's attach record: {e}");
        }
    }

    /// Undoes an attach for a writer of the manager's own that never started: the volume is recorded closed
    /// again unless a dead writer had left it open (`unclean`: the next writer must still
    /// reconcile), and the attach record is given back.
    async fn undo_own_attach(&self, name: &str, epoch: u64, unclean: bool, record: bool) {
        if !unclean {
            if let Err(e) = self.detach(name, epoch).await {
                tracing::warn!(volume = %name, epoch, "closing the manager's attach: {e}");
            }
        }
        if record {
            self.release_own_record(name, epoch).await;
        }
    }
}
