//! After a parity volume's writer died with writes in flight: its mirrors made to agree
//! before any I/O, a region at a time.
//!
//! - The nodes' activity logs are over their copies: a marked extent is at its node place
//!   (the writer clears them there, `activity.rs`). Each marked range is cut into the
//!   regions' mirrored parts; the chunk slots in it need nothing (a slot an unfinished
//!   encode wrote is named by no record, and a switched one was durable on every node first).
//! - Each region's part is copied from the first in-sync copy of its mirrors (one that kept
//!   its history, and whose node stopped cleanly, where there is one) to the others
//!   with what it holds (`Volume::copy_held`): data and held maps agree after it, so the
//!   overlay restored next is the same on every mirror. What the source does not hold is
//!   trimmed on it too (`Volume::trim_unheld`): after every node lost power it may keep
//!   bytes whose held bit is clear (a write never flushed, a punch undone), which a mirrored
//!   region would otherwise read from it alone (the simulator's `parity_steps` found it).
//! - A copy is always made, with no checksums compared first: the logs bound the ranges to
//!   the writes that were in flight. With a log missing (a node restarted), every region is.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::reconcile::ReconcileReport;
use crate::{Volume, VolumeError};

const BLOCK: u64 = 4096;

impl Volume {
    /// Reconciles a parity volume's mirrors (see the module docs).
    pub(crate) async fn reconcile_parity(&self) -> Result<(), VolumeError> {
        let ranges = self.activity_ranges().await?;
        self.reconcile_parity_over(ranges).await
    }

    /// In-sync copies came back with another history than recorded (their store failed a
    /// sync, or their node lost power), and taking them out would leave fewer than K in sync
    /// (`TakeOut`'s floor): they stay, as at an attach that finds such copies
    /// (`check_incarnations`), each linked again as its `Reattached` says. Until the resync
    /// task makes their mirrors agree ([`Volume::keep_lost_copies`]), reads go around them
    /// where they can (`parity.rs`). Their records of what copies out of sync missed may
    /// have lost marks with the rest, so every copy out now comes back whole.
    /// Only those still in sync are kept (one a take-out's `Short` step put out stays out):
    /// how many.
    pub(crate) fn keep_lost(&self, mut lost: Vec<(usize, crate::resync::Reattached)>) -> usize {
        let in_sync = self.in_sync();
        lost.retain(|(i, _)| in_sync.contains(i));
        if lost.is_empty() {
            return 0;
        }
        let nodes: Vec<u32> = lost.iter().map(|(i, _)| self.node(*i)).collect();
        tracing::error!(volume = %self.info.name, ?nodes, "copies lost their history, more than the parity layout can take out: they stay in sync until every region's mirrors agree with a copy that kept its history");
        let mut core = self.core();
        core.forget_out_histories();
        for (i, r) in &lost {
            core.attached(*i, r.incarnation);
        }
        drop(core);
        let mut kept = self.kept_lost.lock().unwrap_or_else(|e| e.into_inner());
        for (i, r) in &lost {
            self.set_conn(*i, Some(r.conn.clone()));
            if !kept.contains(i) {
                kept.push(*i);
            }
        }
        lost.len()
    }

    /// In-sync copies `lost` failed a flush in their stores, and too few would stay in sync
    /// without them: each is linked again to learn its new incarnation and kept
    /// ([`Volume::keep_lost`]). One that does not answer now is met again at a relink.
    pub(crate) async fn keep_failed_syncs(&self, lost: &[usize]) {
        let mut kept = Vec::new();
        let in_sync = self.in_sync();
        for &i in lost.iter().filter(|i| in_sync.contains(i)) {
            match self.reattach(i).await {
                Ok(r) => kept.push((i, r)),
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "linking again a copy that failed a sync: {e}")
                }
            }
        }
        self.keep_lost(kept);
    }

    /// Makes the mirrors of copies kept with their history lost ([`Volume::keep_lost`])
    /// agree with copies that kept theirs: every region's mirrored part copied from a mirror
    /// that kept its history where one did, each under a hold of its range (the whole
    /// volume: the activity log clears extents before they are synced, so it does not bound
    /// what a failed sync lost); then their new incarnations are recorded. From the resync
    /// task, until it gets through (a store that keeps failing its syncs fails the trims
    /// here, which make its held map durable first).
    pub(crate) async fn keep_lost_copies(&self, lost: &[usize]) -> Result<(), VolumeError> {
        self.reconcile_parity_over(None).await?;
        self.record_kept(lost).await;
        tracing::info!(volume = %self.info.name, nodes = ?lost.iter().map(|&i| self.node(i)).collect::<Vec<_>>(), "copies kept with their history lost agree with the others again");
        Ok(())
    }

    /// [`Volume::reconcile_parity`] over node byte `ranges` (`None`: the whole volume), each
    /// part copied under a hold of its range (at attach, before any I/O, nothing waits for
    /// one; from the resync task, the writes there do).
    async fn reconcile_parity_over(
        &self,
        ranges: Option<Vec<(u64, u64)>>,
    ) -> Result<(), VolumeError> {
        let s = self.stripes();
        let started = Instant::now();
        let blocks = self.size().div_ceil(BLOCK);
        let (whole, parts) = match ranges {
            Some(ranges) => (false, mirrored_parts(&s, &ranges, blocks)),
            None => {
                let all = [(0, s.replica_blocks(blocks) * BLOCK)];
                (true, mirrored_parts(&s, &all, blocks))
            }
        };
        let lost = self.kept_lost();
        let unclean = self.unclean_copies(&self.in_sync()).await;
        let (mut compared, mut copied) = (0, 0);
        for (first, end) in parts {
            let (off, len) = (first * BLOCK, (end - first) * BLOCK);
            let _hold = self.core.acquire(off, off + len).await;
            let mut mirrors = self.in_sync_mirrors(&s, s.region_of(first));
            // A copy that kept its history is the source where one can be, and one whose
            // node stopped cleanly before one that did not: a process that dies keeps its
            // data but loses the held bits set since its last flush.
            mirrors.sort_by_key(|i| (lost.contains(i), unclean.contains(i)));
            let Some((&src, rest)) = mirrors.split_first() else {
                continue;
            };
            self.trim_unheld(src, off, len).await?;
            for &t in rest {
                match self.copy_held(src, t, off, len).await {
                    Ok(n) => copied += n,
                    Err(e) if e.stops_writer() => return Err(e),
                    // The target was taken out for a full resync; the source failing is
                    // the end of this attach, as for a mirror.
                    Err(e) if !self.in_sync().contains(&t) => {
                        tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                    }
                    Err(e) => return Err(e),
                }
            }
            compared += len;
        }
        let report = ReconcileReport {
            whole,
            compared_bytes: compared,
            copied_bytes: copied,
            ms: started.elapsed().as_millis() as u64,
            unreadable: Vec::new(),
        };
        tracing::info!(
            volume = %self.info.name,
            whole,
            regions_bytes = compared,
            copied_bytes = copied,
            ms = report.ms,
            "reconciled a parity volume's mirrors after an unclean writer change"
        );
        *self.reconciled.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
        Ok(())
    }
}

/// The volume block ranges `[first, end)` of regions' mirrored parts that node byte ranges
/// `ranges` touch, each within one region, in order, merged.
pub(crate) fn mirrored_parts(
    s: &trireme_replication::Stripes,
    ranges: &[(u64, u64)],
    blocks: u64,
) -> Vec<(u64, u64)> {
    let (stride, rb) = (s.stride_blocks(), s.region_blocks());
    let mut parts: BTreeMap<u64, u64> = BTreeMap::new();
    for &(off, len) in ranges {
        let (a, b) = (off / BLOCK, (off + len).div_ceil(BLOCK));
        for r in a / stride..b.div_ceil(stride) {
            let lo = a.max(r * stride) - r * stride;
            let hi = (b.min(r * stride + rb)).saturating_sub(r * stride);
            let (first, end) = (r * rb + lo, (r * rb + hi).min(blocks));
            if lo < hi && first < end {
                let e = parts.entry(first).or_insert(end);
                *e = (*e).max(end);
            }
        }
    }
    // Merge overlapping pieces of one region.
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (first, end) in parts {
        match out.last_mut() {
            Some((f, e)) if first <= *e && s.region_of(first) == s.region_of(*f) => {
                *e = (*e).max(end)
            }
            _ => out.push((first, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ranges_cut_into_regions_mirrored_parts() {
        let p = trireme_replication::Parity::parse("2+1", None).unwrap();
        let s = trireme_replication::Stripes::new(&p, vec![1, 2, 3]).unwrap();
        let (rb, stride) = (s.region_blocks(), s.stride_blocks());
        let blocks = 3 * rb - 10;
        let b = |n: u64| n * BLOCK;
        // A range in region 0's mirrored part, one over its chunk slots into region 1's,
        // and one in region 1's slots only.
        let ranges = [
            (b(4), b(8)),
            (b(rb - 2), b(stride - rb + 4)),
            (b(stride + rb), b(10)),
        ];
        assert_eq!(
            mirrored_parts(&s, &ranges, blocks),
            vec![(4, 12), (rb - 2, rb), (rb, rb + 2)]
        );
        // The whole replica: every region's part, the last one short.
        let all = [(0, b(s.replica_blocks(blocks)))];
        assert_eq!(
            mirrored_parts(&s, &all, blocks),
            vec![(0, rb), (rb, 2 * rb), (2 * rb, blocks)]
        );
    }
}
