//! The writer a process serves a volume through, and the two ways the process puts a new one
//! in its place without a restart: attaching again after every copy was lost at once
//! ([`reattach_when_lost`]: a whole-cluster restart under `trireme nbd`), and `up` taking its
//! own volume back once a writer that fenced it has detached ([`take_back`]).

use std::sync::Arc;
use std::time::Duration;

use trireme_client::{Volume, VolumeOptions};

/// The writer a process's exports serve through (`trireme_blockdev::Slot`: every request
/// goes to the one there when it starts), and where they serve it.
#[derive(Debug)]
pub struct WriterSlot {
    pub slot: Arc<trireme_blockdev::Slot>,
    /// Where the export serves the volume, said to the manager at each attach (`status`).
    uris: Vec<String>,
}

impl WriterSlot {
    pub fn new(v: Arc<Volume>) -> Arc<WriterSlot> {
        WriterSlot::serving(v, Vec::new())
    }

    /// A slot whose export serves the volume at `uris`.
    pub fn serving(v: Arc<Volume>, uris: Vec<String>) -> Arc<WriterSlot> {
        Arc::new(WriterSlot {
            slot: Arc::new(trireme_blockdev::Slot::new(v)),
            uris,
        })
    }

    /// Who this process is, for the manager.
    fn hello(&self) -> trireme_control::WriterHello {
        trireme_control::WriterHello::me(self.uris.clone())
    }

    /// The writer requests go to now.
    pub fn current(&self) -> Arc<Volume> {
        self.slot.current()
    }

    /// Puts `v` in place of the current writer; `manager` (the cluster's own, in `up`) reports
    /// the new one in `status` instead of the old.
    pub fn replace(&self, v: Arc<Volume>, manager: Option<&trireme_control::Manager>) {
        let old = self.slot.replace(v.clone());
        if let Some(m) = manager {
            m.unregister_client(&old);
            m.register_client(v);
        }
    }
}

/// How often the tasks below look at the writer.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Attaches `slot`'s volume again through the control socket at `control` whenever its writer
/// has lost the link to every copy (`trireme up` restarted, every node with it): no request
/// can succeed and no copy can be taken out, so the old writer can only fail. The new one
/// takes a new epoch and, the old having been left open, reconciles the copies first (the
/// regions its activity log names) before it serves; requests that failed meanwhile wait for
/// it (`VolumeOptions::reattach_wait`). Tried every second until the cluster answers.
/// `manager`: the cluster's own (`up`), told of the new writer for `status`.
pub async fn reattach_when_lost(
    slot: Arc<WriterSlot>,
    control: std::path::PathBuf,
    opts: VolumeOptions,
    manager: Option<Arc<trireme_control::Manager>>,
) {
    let mut said = false;
    // A writer attached again that loses every copy at once too waits longer before the
    // next attach (up to a minute): the cluster answers its control socket but not its data.
    let mut pause = LOOK_EVERY;
    let mut last_attach: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let old = slot.current();
        if !old.lost_every_copy() {
            said = false;
            if last_attach.is_some_and(|t| t.elapsed() > Duration::from_secs(60)) {
                pause = LOOK_EVERY;
            }
            continue;
        }
        if last_attach.is_some_and(|t| t.elapsed() < pause) {
            continue;
        }
        let name = old.info().name.clone();
        if !said {
            tracing::warn!(
                volume = %name,
                epoch = old.info().epoch,
                "lost the link to every copy: attaching again as soon as the cluster answers"
            );
            said = true;
        }
        match attach(&control, &name, opts.clone(), Some(slot.hello())).await {
            Ok(v) => {
                if last_attach.is_some() {
                    pause = (pause * 2).min(Duration::from_secs(60));
                }
                last_attach = Some(tokio::time::Instant::now());
                let epoch = v.info().epoch;
                slot.replace(v, manager.as_deref());
                said = false;
                tracing::warn!(volume = %name, epoch, "attached again: serving");
            }
            Err(e) => tracing::debug!(volume = %name, "attaching again: {e}"),
        }
    }
}

/// A writer of `name`, attached through the control socket of `trireme up` at `control`.
pub async fn attach(
    control: &std::path::Path,
    name: &str,
    opts: VolumeOptions,
    hello: Option<trireme_control::WriterHello>,
) -> Result<Arc<Volume>, String> {
    let mut cc = trireme_control::ControlClient::connect(control)
        .await
        .map_err(|e| e.to_string())?;
    let info: trireme_client::AttachInfo = cc
        .call(&trireme_control::Request::Attach {
            name: name.to_string(),
            writer: hello,
        })
        .await
        .map_err(|e| e.to_string())?;
    start(control, info, opts).await
}

/// Starts the writer `info` describes, recording its replica states through `up`'s control
/// socket at `control`.
async fn start(
    control: &std::path::Path,
    info: trireme_client::AttachInfo,
    opts: VolumeOptions,
) -> Result<Arc<Volume>, String> {
    let membership = Arc::new(trireme_control::ControlMembership {
        path: control.to_path_buf(),
    });
    let v = Volume::attach_managed(info, opts, membership.clone())
        .await
        .map_err(|e| e.to_string())?;
    follow_settings(membership, &v);
    Ok(v)
}

/// How often a writer attached through `up`'s control socket asks for its volume's settings.
const SETTINGS_EVERY: Duration = Duration::from_millis(400);

/// Keeps a writer attached through `up`'s control socket at its volume's settings (`volume
/// set`: the limits, the minimum of copies). The socket has no watch, so it asks every
/// [`SETTINGS_EVERY`], for as long as the writer is in use; and tells the manager what the
/// writer did each second (a volume under an aggregated QoS policy gets its share by it).
fn follow_settings(membership: Arc<trireme_control::ControlMembership>, v: &Arc<Volume>) {
    use trireme_client::Membership;
    let weak = Arc::downgrade(v);
    let name = v.info().name.clone();
    tokio::spawn(async move {
        let mut told = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(SETTINGS_EVERY).await;
            let Some(v) = weak.upgrade() else { return };
            if v.is_stopped() {
                return;
            }
            if told.elapsed() >= Duration::from_secs(1) {
                told = tokio::time::Instant::now();
                let usage = trireme_control::WriterUsage {
                    units: v.io_units(),
                    throttled_seconds: v.throttled().as_secs_f64(),
                    overlay_blocks: v.overlay_blocks(),
                };
                let epoch = v.info().epoch;
                if let Err(e) = membership.report_usage(&name, epoch, usage).await {
                    tracing::debug!(volume = %name, "telling the manager the writer's usage: {e}");
                }
            }
            match membership.locate(&name).await {
                Ok(info) => {
                    v.set_limits(info.limits).await;
                    if info.min_copies > 0 {
                        v.set_min_copies(info.min_copies);
                    }
                }
                Err(e) => tracing::debug!(volume = %name, "reading the volume's settings: {e}"),
            }
        }
    });
}

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
    opts: VolumeOptions,
) {
    let mut fenced_by = None;
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
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
        match start(&control, info, opts.clone()).await {
            Ok(v) => {
                let epoch = v.info().epoch;
                slot.replace(v, Some(&manager));
                tracing::warn!(volume = %name, epoch, "took the volume back: the export serves again");
            }
            Err(e) => tracing::warn!(volume = %name, "taking the volume back: {e}"),
        }
    }
}
