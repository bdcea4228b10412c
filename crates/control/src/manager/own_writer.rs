//! Writers the manager attaches itself: to move the replica of a volume nobody writes, or to
//! scrub one. On etcd under an attach record of its own (so a client's attach meanwhile is
//! refused rather than fenced); beside `up`, with a new epoch like any writer.

use std::sync::{Arc, Weak};

use trireme_client::{AttachInfo, BoxFut, Membership, MembershipError, Volume, VolumeOptions};
use trireme_meta::{AttachRecord, VolumeRecord};
use trireme_replication::ReplicaState;

use super::{Manager, Result};
use crate::error::ManagerError;

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
        let w = match Volume::attach_managed(info, opts, membership).await {
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
        self.register_client(w.clone());
        Ok(OwnWriter { writer: w, record })
    }

    /// `volume scrub`: through the writer in this process if there is one; for a volume
    /// nobody writes, through a writer attached for the scrub (then released). A volume held
    /// by a writer elsewhere is refused, naming it: the scrub must go through that writer, and
    /// another would fence it.
    pub async fn scrub(
        self: &Arc<Self>,
        name: &str,
        region: u64,
    ) -> Result<trireme_client::ScrubReport> {
        let v = self.meta.volume(name).await?;
        if let Some(w) = self.writer(name).filter(|w| w.info().epoch == v.epoch) {
            return Ok(w.scrub(region).await?);
        }
        // A writer on another host (its attach record names it): it scrubs at our request.
        if let Some((a, _)) = self.meta.attachment(name).await? {
            if a.epoch == v.epoch {
                return self.scrub_remote(&v, region).await;
            }
        }
        if let Some(who) = self.holder(&v).await? {
            return Err(crate::error::refused(format!(
                "volume {name} is attached by {who}: a scrub repairs through its writer, and that writer takes no requests (a `trireme nbd` beside `up`); detach it first"
            )));
        }
        let own = self.attach_own(&v).await?;
        tracing::info!(
            volume = name,
            epoch = own.writer.info().epoch,
            "scrubbing through a writer of the manager's own"
        );
        let r = own.writer.scrub(region).await;
        self.release_own(own).await;
        Ok(r?)
    }

    /// `volume scrub` of a volume written on another host: asks its writer through the scrub
    /// request (`daemon/src/scrubs.rs`) and waits for its report; its progress shows in
    /// `status` meanwhile (the writer's report). One scrub per volume at a time.
    async fn scrub_remote(
        &self,
        v: &trireme_meta::VolumeRecord,
        region: u64,
    ) -> Result<trireme_client::ScrubReport> {
        use trireme_meta::{ScrubRequest, ScrubState};
        let name = &v.name;
        if let Some((old, _)) = self.meta.scrub_request(name).await? {
            let live = old.epoch == v.epoch
                && matches!(old.state, ScrubState::Asked | ScrubState::Running);
            if live {
                return Err(crate::error::refused(format!(
                    "a scrub of volume {name} is already running (`trireme status` shows its progress)"
                )));
            }
            // Left by a manager that stopped waiting (it crashed, or the role moved).
            self.meta.delete_scrub(name).await?;
        }
        let req = ScrubRequest {
            epoch: v.epoch,
            region,
            state: ScrubState::Asked,
            report: None,
            error: None,
        };
        if self.meta.put_scrub(name, &req, 0).await?.is_none() {
            return Err(crate::error::refused(format!(
                "a scrub of volume {name} was asked at the same moment by another operator"
            )));
        }
        tracing::info!(volume = %name, epoch = v.epoch, "asked the volume's writer to scrub it");
        let outcome = loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let r = match self.meta.scrub_request(name).await {
                Ok(Some((r, _))) => r,
                Ok(None) => break Err(crate::error::refused("the scrub request was removed")),
                // etcd away a moment: the writer goes on, and so does the wait.
                Err(trireme_meta::MetaError::Unavailable(_)) => continue,
                Err(e) => break Err(e.into()),
            };
            match r.state {
                ScrubState::Done => {
                    break r
                        .report
                        .and_then(|j| serde_json::from_value(j).ok())
                        .ok_or_else(|| {
                            crate::error::refused("the writer's scrub report does not decode")
                        });
                }
                ScrubState::Failed => {
                    break Err(crate::error::refused(format!(
                        "the writer's scrub failed: {}",
                        r.error.unwrap_or_default()
                    )))
                }
                ScrubState::Asked | ScrubState::Running => {
                    let writer = self.meta.attachment(name).await;
                    if matches!(&writer, Ok(Some((a, _))) if a.epoch != v.epoch) {
                        break Err(crate::error::refused(format!(
                            "volume {name}'s writer changed during the scrub; run it again"
                        )));
                    }
                    if matches!(&writer, Ok(None)) && !self.meta.volume(name).await?.writer_open {
                        break Err(crate::error::refused(format!(
                            "volume {name}'s writer detached during the scrub; run it again"
                        )));
                    }
                }
            }
        };
        if let Err(e) = self.meta.delete_scrub(name).await {
            tracing::warn!(volume = %name, "removing the scrub request: {e}");
        }
        outcome
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
