//! The mover: one thread per tiered store. Every tick it earns migration budget at the
//! configured rate, halves the heat once a second, asks [`plan`](super::heat::plan) what to
//! move across every replica on the node, and runs the moves as background I/O (the disk model
//! serves foreground requests first).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::heat::{self, View};
use super::{Shared, TieredReplica};
use crate::disk_model::as_background;

const TICK: Duration = Duration::from_millis(100);
const DECAY_EVERY: Duration = Duration::from_secs(1);
/// A failing move is reported at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(10);

pub(super) fn run(shared: &Shared) {
    let extent = shared.cfg.extent as f64;
    let rate = shared.cfg.migrate_rate as f64;
    // Budget carried over is capped, so an idle spell does not turn into a burst.
    let cap = extent.max(rate / 2.0);
    let mut tokens = 0.0f64;
    let mut last = Instant::now();
    let mut last_decay = last;
    let mut moved_then = shared.migrated_bytes.load(Ordering::Relaxed);
    let mut last_report: Option<Instant> = None;
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        let now = Instant::now();
        tokens = (tokens + rate * (now - last).as_secs_f64()).min(cap);
        last = now;
        let mut reps: Vec<Arc<TieredReplica>> = shared
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        reps.sort_by_key(|r| r.volume);
        if now - last_decay >= DECAY_EVERY {
            for r in &reps {
                r.decay_heat();
            }
            let moved = shared.migrated_bytes.load(Ordering::Relaxed);
            let per_s = (moved - moved_then) as f64 / (now - last_decay).as_secs_f64();
            shared.migrating.store(per_s as u64, Ordering::Relaxed);
            moved_then = moved;
            last_decay = now;
        }
        if tokens < extent {
            continue;
        }
        let views: Vec<View> = reps.iter().flat_map(|r| r.views()).collect();
        let moves = heat::plan(&views, shared.fast_places(), (tokens / extent) as usize);
        for m in moves {
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            let Some(r) = reps.iter().find(|r| r.volume == m.volume) else {
                continue;
            };
            match as_background(|| r.move_extent(m.extent, m.to, None)) {
                Ok(true) => tokens -= extent,
                Ok(false) => {}
                Err(e) => {
                    if last_report.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
                        tracing::warn!(
                            volume = m.volume,
                            extent = m.extent,
                            to = m.to.as_str(),
                            "tiers: a move failed: {e}"
                        );
                        last_report = Some(Instant::now());
                    }
                }
            }
        }
    }
}
