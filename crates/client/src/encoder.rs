//! A parity volume's encoder as a task of its writer with a control plane (issue 67).
//!
//! - **What.** Each look, the core names the next regions ([`VolumeCore::regions_to_encode`]):
//!   once the mirrored regions and the overlay are over the layout's share of the volume,
//!   the coldest of them (a mirrored region is encoded, a parity one's overlay folded back),
//!   up to [`BATCH`] and to a sixteenth under the share; within it, nothing, so a hot set
//!   over parity stays overlay and is overwritten in place.
//!   Heat is the writer's own record of writes (the activity table's last tick per extent,
//!   its highest in the region): a region written since the last tick or two is hot; one
//!   the cleaner cleared is cold.
//! - **When.** Only with every copy in sync (an encode writes a chunk on each of the K+M
//!   nodes) and none kept with its history lost awaiting its reconcile, one batch at a
//!   time, at most `encode_rate` bytes of volume data a second ([`ENCODE_RATE`] by default).
//! - **Flushes.** A batch's regions share one flush of the stripe's nodes and their trims'
//!   flushes ([`Volume::encode_batch`]): a flush stalls the writes around it.
//! - **Yielding.** An encode reads a region and writes and flushes a chunk on every node:
//!   beside foreground I/O it tripled hot writes' p99 and halved their IOPS (`bench/parity.sh`,
//!   2026-12-04). So each batch waits for a pause in the volume's reads and writes: none
//!   in flight or begun for [`QUIET`] (a stall, every request waiting on a disk that
//!   flushes, is not a pause). Under writes without a pause
//!   the mirrored part grows past the share as S2D's mirror tier fills: the encoder goes on
//!   beside them only once it is past the share by the headroom
//!   ([`VolumeOptions::encode_headroom`](crate::VolumeOptions), [`ENCODE_HEADROOM`] by
//!   default), then at 1/16 of its rate ([`BUSY_SLOWDOWN`]), so it cannot grow for ever. Below
//!   that it did little but cost: at 1/16 of the rate a fold-back frees a few blocks a region
//!   while writes spread over parity add thousands a second (4+2's hot writes: 0.69x a 3-way
//!   volume with it, 0.79x without, `bench/results/parity-2026-12-07-headroom.txt`).
//! - **The switch** is recorded through the writer's control plane
//!   ([`Membership::record_region`](crate::Membership::record_region)), fenced by its epoch.
//!
//! [`VolumeCore::regions_to_encode`]: trireme_replication::VolumeCore::regions_to_encode

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
/// The most regions encoded together, sharing their flushes ([`Volume::encode_batch`]).
/// Each flush stalled the writes around it (on this project's test machine, every I/O of
/// the disk for 30-130 ms): one per region cost a 2+1 volume's hot writes a quarter of
/// their IOPS. Eight regions of 4+2 are 8 MiB of volume data.
pub(crate) const BATCH: usize = 8;
/// A pause in foreground I/O this long lets the encoder go on at once.
const QUIET: Duration = Duration::from_millis(20);
/// While foreground I/O goes on without such a pause and the mirrored part is past the
/// headroom, the encoder waits at most this many times its usual gap between batches (so it
/// runs at 1/16 of its rate at the least).
const BUSY_SLOWDOWN: u32 = 16;
/// How far past its share (in percent of the volume) writes without a pause may take a
/// parity volume's mirrored part before the encoder goes on beside them: with the default
/// share of 20%, up to 40% of the volume on M+1 copies.
pub const ENCODE_HEADROOM: u8 = 20;

/// Runs the encoder of a parity volume's writer until the volume is dropped.
pub(crate) fn spawn(v: &Arc<Volume>) {
    if v.parity.is_none() || v.membership.is_none() || v.opts.encode_rate == 0 {
        return;
    }
    let weak: Weak<Volume> = Arc::downgrade(v);
    tokio::spawn(async move {
        // Not while the writer attaches and its first requests come.
        tokio::time::sleep(LOOK).await;
        let mut turn = Turn::default();
        loop {
            // A pause in foreground I/O, or past the headroom the end of the slowed gap.
            match weak.upgrade().map(|v| turn.now(&v)) {
                None => return,
                Some(false) => {
                    tokio::time::sleep(QUIET).await;
                    continue;
                }
                Some(true) => {}
            }
            let began = tokio::time::Instant::now();
            let due = match weak.upgrade() {
                Some(v) => match v.encode_next().await {
                    Ok(Some(due)) => due,
                    Ok(None) => {
                        tokio::time::sleep(LOOK).await;
                        continue;
                    }
                    Err(()) => return,
                },
                None => return,
            };
            turn.busy_after = Some(began + due * BUSY_SLOWDOWN);
            tokio::time::sleep_until(began + due).await;
        }
    });
}

/// When the encoder may take its next batch.
#[derive(Default)]
struct Turn {
    /// The foreground requests begun as of the last look, if none was in flight then.
    idle_at: Option<u64>,
    /// Under foreground I/O without a pause, the earliest a batch may begin.
    busy_after: Option<tokio::time::Instant>,
}

impl Turn {
    /// Whether a batch of `v`'s may begin now ([`Turn::may_begin`]).
    fn now(&mut self, v: &Volume) -> bool {
        let idle_at = v.foreground.idle_at();
        let now = tokio::time::Instant::now();
        self.may_begin(idle_at, now, || {
            v.core().mirrored_past(v.opts.encode_headroom)
        })
    }

    /// Whether a batch may begin at `now`, `idle_at` being the foreground requests begun so
    /// far if none is in flight: if none was in flight at this look and the last (a
    /// [`QUIET`] ago, or longer) and none began between, or if the mirrored part is
    /// `past_headroom` and the slowed gap after the last batch is over. Requests that all
    /// wait (on a disk that flushes) are a stall, not a pause.
    fn may_begin(
        &mut self,
        idle_at: Option<u64>,
        now: tokio::time::Instant,
        past_headroom: impl FnOnce() -> bool,
    ) -> bool {
        let last = std::mem::replace(&mut self.idle_at, idle_at);
        if idle_at.is_some() && last == idle_at {
            return true;
        }
        self.busy_after.is_none_or(|t| now >= t) && past_headroom()
    }
}

impl Volume {
    /// One encode if one is due: the time it may take at the rate, counted from its start;
    /// `None` if there was nothing to do, `Err` when this writer must stop (fenced).
    async fn encode_next(&self) -> Result<Option<Duration>, ()> {
        // Nor while copies kept with their history lost wait for their reconcile
        // (`Volume::keep_lost`): an encode would read a region from what they hold.
        if !self.core().every_copy_in_sync()
            || self.core().stopped()
            || !self.kept_lost().is_empty()
        {
            return Ok(None);
        }
        let Some(p) = &self.parity else {
            return Err(());
        };
        let region_blocks = p.stripes.region_blocks();
        let heat = self.activity.heat_by(region_blocks * 4096);
        let batch = self.core().regions_to_encode(heat, BATCH);
        if batch.is_empty() {
            return Ok(None);
        }
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
        let ends = self.encode_batch(&batch, record).await;
        let ms = started.elapsed().as_millis() as u64;
        let mut encoded = 0;
        for (region, end) in batch.iter().zip(ends) {
            match end {
                Ok(kind) => {
                    encoded += 1;
                    tracing::debug!(volume = %self.info.name, region, ?kind, ms, regions = batch.len(), "region encoded");
                }
                Err(EncodeError::Refused { source, .. }) => {
                    tracing::debug!(volume = %self.info.name, region, "encode refused: {source}");
                }
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, region, "{e}");
                    if self.core().stopped() {
                        return Err(());
                    }
                }
            }
        }
        if encoded == 0 {
            // Refused or failed, all of them: look again later.
            return Ok(None);
        }
        let rate = self.opts.encode_rate.max(1);
        Ok(Some(Duration::from_secs_f64(
            (batch.len() as u64 * region_blocks * 4096) as f64 / rate as f64,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_waits_for_a_pause_until_past_the_headroom_then_for_its_slowed_gap() {
        let t0 = tokio::time::Instant::now();
        let mut turn = Turn::default();
        // Requests began since the last look: not within the headroom...
        assert!(!turn.may_begin(Some(5), t0, || false));
        assert!(!turn.may_begin(Some(6), t0, || false));
        // ...nor while one is in flight, even if none began since (a stall)...
        assert!(!turn.may_begin(None, t0, || false));
        assert!(!turn.may_begin(None, t0, || false));
        // ...but at a pause, wherever the mirrored part is.
        assert!(!turn.may_begin(Some(6), t0, || false));
        assert!(turn.may_begin(Some(6), t0, || false));
        // Past the headroom, under load: at once after no batch, then once its gap is over.
        assert!(turn.may_begin(None, t0, || true));
        turn.busy_after = Some(t0 + Duration::from_secs(2));
        assert!(!turn.may_begin(Some(8), t0 + Duration::from_secs(1), || true));
        assert!(turn.may_begin(Some(9), t0 + Duration::from_secs(2), || true));
        assert!(!turn.may_begin(Some(10), t0 + Duration::from_secs(3), || false));
        // A pause lets it go before the gap is over.
        assert!(turn.may_begin(Some(10), t0 + Duration::from_secs(1), || false));
    }
}
