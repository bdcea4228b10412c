//! A parity volume's encoder as a task of its writer with a control plane (issue 67).
//!
//! - **What.** Each look, the core names the next region ([`VolumeCore::region_to_encode`]):
//!   the coldest mirrored region while more than the layout's share is mirrored, else the
//!   region with the most overlay to fold back. Heat is the writer's own record of writes
//!   (the activity table's last tick per 64 KiB, its highest in the region): a region written
//!   since the last tick or two is hot; one the cleaner cleared is cold.
//! - **When.** Only with every copy in sync (an encode writes a chunk on each of the K+M
//!   nodes), one region at a time, at most `encode_rate` bytes of volume data a second
//!   ([`ENCODE_RATE`] by default).
//! - **The switch** is recorded through the writer's control plane
//!   ([`Membership::record_region`](crate::Membership::record_region)), fenced by its epoch.
//!
//! [`VolumeCore::region_to_encode`]: trireme_replication::VolumeCore::region_to_encode

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::encode::EncodeError;
use crate::Volume;

/// How often the encoder looks for a region when it has none.
const LOOK: Duration = Duration::from_secs(1);
/// The most volume data the encoder turns into stripes a second by default
/// ([`VolumeOptions::encode_rate`](crate::VolumeOptions)): a share of a disk, never all of
/// it, so that foreground I/O keeps its latency.
pub const ENCODE_RATE: u64 = 64 << 20;

/// Runs the encoder of a parity volume's writer until the volume is dropped.
pub(crate) fn spawn(v: &Arc<Volume>) {
    if v.parity.is_none() || v.membership.is_none() || v.opts.encode_rate == 0 {
        return;
    }
    let weak: Weak<Volume> = Arc::downgrade(v);
    tokio::spawn(async move {
        // Not while the writer attaches and its first requests come.
        tokio::time::sleep(LOOK).await;
        loop {
            let pause = match weak.upgrade() {
                Some(v) => match v.encode_next().await {
                    Ok(Some(pause)) => pause,
                    Ok(None) => LOOK,
                    Err(()) => return,
                },
                None => return,
            };
            tokio::time::sleep(pause).await;
        }
    });
}

impl Volume {
    /// One encode if one is due: how long to wait before the next (the rate), `None` if
    /// there was nothing to do, `Err` when this writer must stop (fenced).
    async fn encode_next(&self) -> Result<Option<Duration>, ()> {
        if self.in_sync().len() < self.replica_count() || self.core().stopped() {
            return Ok(None);
        }
        let Some(p) = &self.parity else {
            return Err(());
        };
        let region_blocks = p.stripes.region_blocks();
        let heat = self.activity.heat_by(region_blocks * 4096);
        let next = self.core().region_to_encode(heat);
        let Some(region) = next else { return Ok(None) };
        let started = tokio::time::Instant::now();
        let Some(m) = self.membership.clone() else {
            return Err(());
        };
        let (name, id, epoch) = (self.info.name.clone(), self.info.id, self.info.epoch);
        let record = move |r: u64, kind| {
            let (m, name) = (m.clone(), name.clone());
            async move {
                m.record_region(&name, id, epoch, r, kind)
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        match self.encode(region, record).await {
            Ok(kind) => {
                tracing::debug!(volume = %self.info.name, region, ?kind, ms = started.elapsed().as_millis() as u64, "region encoded");
            }
            Err(EncodeError::Refused { source, .. }) => {
                tracing::debug!(volume = %self.info.name, region, "encode refused: {source}");
                return Ok(None);
            }
            Err(e) => {
                tracing::warn!(volume = %self.info.name, region, "{e}");
                if self.core().stopped() {
                    return Err(());
                }
                return Ok(None);
            }
        }
        let rate = self.opts.encode_rate.max(1);
        let due = Duration::from_secs_f64((region_blocks * 4096) as f64 / rate as f64);
        Ok(Some(due.saturating_sub(started.elapsed())))
    }
}
