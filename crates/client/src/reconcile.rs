//! After a writer died with writes in flight: settling the in-sync replicas before any I/O.

use tokio::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use trireme_proto::{data_ranges, Op};
use trireme_replication::{all_chunks, settle, union_chunks, Sum, Verdict};

use crate::{Volume, VolumeError};

/// Range covered by one activity-log query (at the smallest extent, 64 KiB: the node's cap).
const ACTIVITY_WINDOW: u64 = 64 << 30;

impl Volume {
    /// The union of the in-sync replicas' activity-log extents, or `None` if one of them has no
    /// log from before this attach (its node restarted): then nothing bounds where the dead
    /// writer's writes went. A replica that cannot answer is taken out for a full resync.
    pub(crate) async fn activity_ranges(&self) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let mut ranges = Vec::new();
        for t in self.in_sync() {
            match self.activity_of(t).await {
                Ok(Some(marked)) => ranges.extend(marked),
                Ok(None) => {
                    tracing::info!(volume = %self.info.name, node = self.node(t), "replica has no activity log (its node restarted): reconciling the whole volume");
                    return Ok(None);
                }
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                    self.take_out_with(&[t], None, true).await?;
                }
            }
        }
        Ok(Some(union_chunks(ranges)))
    }

    /// The byte ranges replica `t`'s activity log marks, over its copy (a parity volume's
    /// is larger than the volume); None if its node keeps no log for it (restarted without
    /// one, or never started).
    pub(crate) async fn activity_of(
        &self,
        t: usize,
    ) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let span = self.replica_size(self.size());
        let (mut ranges, mut off) = (Vec::new(), 0);
        while off < span {
            let len = ACTIVITY_WINDOW.min(span - off);
            let h = self.header(Op::ActivityQuery, off, len);
            let f = self.call(t, h, Bytes::new()).await?;
            let f = self.expect_ok(t, f)?;
            let a = trireme_proto::ActivityAnswer::read(&f.header, &f.payload, len)
                .map_err(self.malformed(t))?;
            if a.epoch == 0 {
                return Ok(None);
            }
            ranges.extend(data_ranges(&a.extents, off));
            off += len;
        }
        Ok(Some(ranges))
    }

    /// After a writer died with writes in flight, replicas may differ where those writes went:
    /// before any new I/O, every extent the replicas' activity logs show (the whole volume if a
    /// log is missing) is compared across the in-sync replicas and copied from one of them where
    /// they differ. Only checksums cross the network for ranges that agree.
    pub(crate) async fn reconcile(&self) -> Result<(), VolumeError> {
        if self.in_sync().len() < 2 {
            return Ok(());
        }
        let started = Instant::now();
        let (whole, chunks) = match self.activity_ranges().await? {
            Some(r) => (false, r),
            None => (true, all_chunks(self.size())),
        };
        if self.in_sync().len() < 2 {
            return Ok(());
        }
        let mut copied = 0;
        let mut compared = 0;
        let mut unreadable = Vec::new();
        for &(off, len) in &chunks {
            let targets = self.in_sync();
            let replies = self.checksums(&targets, off, len).await;
            let mut sums = Vec::with_capacity(targets.len());
            for (&t, r) in targets.iter().zip(replies) {
                match r {
                    Ok(c) => sums.push((t, Sum::Good(c))),
                    Err(e) if e.is_bad_copy() => {
                        tracing::warn!(volume = %self.info.name, node = self.node(t), off, len, "reconcile: this copy fails its block checksums; rewriting it from a good one");
                        sums.push((t, Sum::Bad));
                    }
                    Err(e) if e.stops_writer() => return Err(e),
                    Err(e) => {
                        tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                        self.take_out_with(&[t], None, true).await?;
                    }
                }
            }
            // The rule (`replication::settle`): the first copy in the set's order that passes
            // its block checksums is the source; one that fails them is never copied from.
            match settle(&sums) {
                Verdict::Agree => {}
                Verdict::Unresolved => {
                    tracing::error!(volume = %self.info.name, off, len, "reconcile: no copy of this region passes its block checksums; nothing copied (scrub or restore it)");
                    unreadable.push((off, len));
                }
                Verdict::Repair { source, rewrite } => {
                    // Client requests, not recovery's: the volume serves nothing until this
                    // is done.
                    let read = self.header(Op::Read, off, len);
                    let data = self
                        .expect_ok(source, self.call(source, read, Bytes::new()).await?)?
                        .payload;
                    let h = self.header(Op::Write, off, len);
                    for t in rewrite {
                        if let Err(e) = self.to_all(&[t], h, data.clone()).await {
                            self.take_out_with(&[t], None, true).await?;
                            tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                        }
                        copied += len;
                    }
                }
            }
            compared += len;
        }
        let report = ReconcileReport {
            whole,
            compared_bytes: compared,
            copied_bytes: copied,
            ms: started.elapsed().as_millis() as u64,
            unreadable,
        };
        tracing::info!(
            volume = %self.info.name,
            whole,
            compared_bytes = compared,
            copied_bytes = copied,
            unreadable_regions = report.unreadable.len(),
            ms = report.ms,
            "reconciled replicas after an unclean writer change"
        );
        *self.reconciled.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
        Ok(())
    }

    /// What the reconciliation at attach did (none after a clean detach).
    pub fn last_reconcile(&self) -> Option<ReconcileReport> {
        self.reconciled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What reconciling the replicas after an unclean writer change did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// The whole volume was compared (some replica had no activity log).
    pub whole: bool,
    pub compared_bytes: u64,
    pub copied_bytes: u64,
    pub ms: u64,
    /// Regions where no copy passed its block checksums: left as they are, never spread.
    #[serde(default)]
    pub unreadable: Vec<(u64, u64)>,
}
