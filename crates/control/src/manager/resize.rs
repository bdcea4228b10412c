//! `volume resize`: the volume's writer resizes it (`trireme_client`'s `resize.rs`): the one in
//! the cluster's process, the one on a client host (asked through the volume's resize
//! request, `resizes/<name>`, as a scrub is), or, for a volume nobody writes, one the manager
//! attaches for itself. Growing works online; shrinking only on a volume nobody writes, and
//! only when asked for by name (`--allow-shrink`): bytes past the new end are gone.

use std::sync::Arc;
use std::time::Duration;

use trireme_meta::{ResizeRequest, ScrubState, VolumeRecord};

use super::{Manager, Result, MAX_VOLUME};
use crate::error::{busy, in_use, refused};

/// How long a writer on another host may take to answer a resize request.
const REMOTE_RESIZE: Duration = Duration::from_secs(120);
/// How long a resize waits for a writer of the manager's own to start or to let go.
const OWN_WRITER_WAIT: Duration = Duration::from_secs(60);

impl Manager {
    /// Resizes volume `name` to `size` bytes; the volume as recorded after it.
    pub async fn resize_volume(
        self: &Arc<Self>,
        name: &str,
        size: u64,
        allow_shrink: bool,
    ) -> Result<VolumeRecord> {
        if size == 0 || !size.is_multiple_of(4096) || size > MAX_VOLUME {
            return Err(refused(format!(
                "a volume's size must be a whole number of 4 KiB blocks, from 4 KiB to {} (asked: {size} bytes)",
                crate::human(MAX_VOLUME)
            )));
        }
        let v = self.meta.volume(name).await?;
        if size == v.size {
            return Ok(v);
        }
        let shrink = size < v.size;
        if shrink && !allow_shrink {
            return Err(refused(format!(
                "volume {name} is {} and shrinking it to {} drops the bytes past the new end: \
                 refused unless asked for with --allow-shrink (and nobody attached)",
                crate::human(v.size),
                crate::human(size)
            )));
        }
        let t0 = std::time::Instant::now();
        loop {
            let v = self.meta.volume(name).await?;
            match self.resize_through(&v, size, shrink).await? {
                Some(v) => return Ok(v),
                None if t0.elapsed() < OWN_WRITER_WAIT => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                None => {
                    return Err(busy(format!(
                        "volume {name} is held by a writer of the manager's own (a scrub, a move or a snapshot) for over {} s: try the resize again once it is done",
                        OWN_WRITER_WAIT.as_secs()
                    )))
                }
            }
        }
    }

    /// Resizes `v` through its writer, whoever it is; `None` while the manager's own writer
    /// of `v` is between its attach record and its start, or between its end and giving the
    /// record back: it takes no resize requests, and asking it would read as "the writer
    /// left" once it lets go.
    async fn resize_through(
        self: &Arc<Self>,
        v: &VolumeRecord,
        size: u64,
        shrink: bool,
    ) -> Result<Option<VolumeRecord>> {
        let name = &v.name;
        if let Some(w) = self.writer(name).filter(|w| w.info().epoch == v.epoch) {
            if shrink {
                return Err(self.attached_refusal(v).await);
            }
            w.resize(size).await?;
            return Ok(Some(self.meta.volume(name).await?));
        }
        if let Some((a, _)) = self.meta.attachment(name).await? {
            if a.host == crate::hostname() && a.pid == std::process::id() {
                return Ok(None);
            }
            if a.epoch == v.epoch {
                if shrink {
                    return Err(self.attached_refusal(v).await);
                }
                self.resize_remote(v, size).await?;
                return Ok(Some(self.meta.volume(name).await?));
            }
        }
        if let Some(who) = self.holder(v).await? {
            return Err(in_use(format!(
                "volume {name} is attached by {who}: a resize goes through its writer, and that writer takes no requests (a `trireme nbd` beside `up`); detach it first"
            )));
        }
        let own = self.attach_own(v).await?;
        tracing::info!(
            volume = %name,
            epoch = own.writer.info().epoch,
            size,
            "resizing through a writer of the manager's own"
        );
        let r = own.writer.resize(size).await;
        self.release_own(own).await;
        r?;
        Ok(Some(self.meta.volume(name).await?))
    }

    async fn attached_refusal(&self, v: &VolumeRecord) -> crate::error::ManagerError {
        let who = self
            .holder(v)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| "a writer".into());
        in_use(format!(
            "volume {} is attached by {who}: a volume shrinks only while nobody writes it (a \
             file system on it would lose what lies past the new end); detach it first",
            v.name
        ))
    }

    /// Asks the writer on another host to resize `v` (`daemon/src/resizes.rs`) and waits for
    /// its answer.
    async fn resize_remote(&self, v: &VolumeRecord, size: u64) -> Result<()> {
        let name = &v.name;
        if let Some((old, _)) = self.meta.resize_request(name).await? {
            if old.epoch == v.epoch && matches!(old.state, ScrubState::Asked | ScrubState::Running)
            {
                return Err(busy(format!(
                    "a resize of volume {name} is already running"
                )));
            }
            self.meta.delete_resize(name).await?;
        }
        let req = ResizeRequest {
            epoch: v.epoch,
            size,
            state: ScrubState::Asked,
            error: None,
        };
        if self.meta.put_resize(name, &req, 0).await?.is_none() {
            return Err(busy(format!(
                "a resize of volume {name} was asked at the same moment by another operator"
            )));
        }
        tracing::info!(volume = %name, epoch = v.epoch, size, "asked the volume's writer to resize it");
        let t0 = std::time::Instant::now();
        let outcome = loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let r = match self.meta.resize_request(name).await {
                Ok(Some((r, _))) => r,
                Ok(None) => break Err(refused("the resize request was removed")),
                Err(trireme_meta::MetaError::Unavailable(_)) => continue,
                Err(e) => break Err(e.into()),
            };
            match r.state {
                ScrubState::Done => break Ok(()),
                ScrubState::Failed => {
                    let why = format!("the writer's resize failed: {}", r.error.unwrap_or_default());
                    // A node without room is the cluster's state, not a bad request.
                    break Err(match why.contains("no space:") {
                        true => crate::error::ManagerError::NoSpace(why),
                        false => refused(why),
                    });
                }
                ScrubState::Asked | ScrubState::Running if t0.elapsed() > REMOTE_RESIZE => {
                    break Err(refused(format!(
                        "volume {name}'s writer did not answer the resize within {} s (a writer from before resizes?)",
                        REMOTE_RESIZE.as_secs()
                    )))
                }
                ScrubState::Asked | ScrubState::Running => {
                    let writer = self.meta.attachment(name).await;
                    if matches!(&writer, Ok(Some((a, _))) if a.epoch != v.epoch)
                        || matches!(&writer, Ok(None))
                    {
                        break Err(refused(format!(
                            "volume {name}'s writer changed or left during the resize; `volume info` says whether it took"
                        )));
                    }
                }
            }
        };
        if let Err(e) = self.meta.delete_resize(name).await {
            tracing::warn!(volume = %name, "removing the resize request: {e}");
        }
        outcome
    }

    /// The writer of `epoch` on volume `id` records a parity region it switched.
    pub async fn set_region(
        &self,
        name: &str,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    ) -> Result<()> {
        Ok(self.meta.record_region(name, id, epoch, region, to).await?)
    }

    /// The writer of `epoch` records the size it resized `name` to.
    pub async fn set_volume_size(&self, name: &str, epoch: u64, size: u64) -> Result<VolumeRecord> {
        Ok(super::records::record_size(&self.meta, name, epoch, size).await?)
    }
}
