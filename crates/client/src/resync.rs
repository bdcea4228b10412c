//! Bringing a replica back: incremental resync.
//!
//! **Bringing back** (`resync`), from a background task while I/O goes on:
//! 1. with every write paused for a moment (the whole range held), R is attached with the
//!    writer's epoch, the survivors' dirty regions are collected, and R joins the write set as
//!    *resyncing*: it takes every new write and serves no reads. The survivors keep marking
//!    every write for R (more than needed while R takes them too, but a resync that stops
//!    halfway then leaves a record that still covers everything);
//! 2. each dirty region is copied from an in-sync replica under the region's write lock (so a
//!    copy never overwrites a newer write) and then cleared on the survivors — unless R failed
//!    a write meanwhile, whose mark must stay;
//! 3. with writes paused again, R is recorded in sync, joins the read set, and the survivors drop
//!    their record.
//!
//! Incremental only when it is provably enough: R must come back with the incarnation it had when
//! it went out, and some survivor must have tracked it since then under this writer's epoch.
//! Otherwise (R re-created or wiped, survivors restarted, or the writer changed meanwhile) the
//! resync compares every region by checksum and copies those that differ — full, never a guess.
//! If R fails again midway, it goes back to outdated with its remaining regions still recorded.
//!
//! **Snapshots taken meanwhile.** A snapshot's barrier goes to the copies in sync, not to R: at
//! step 3, R lacking one goes out again with its history known, and its next resync gives it
//! the snapshot first (`catch_up.rs`). That next resync is shorter (what was written since R
//! went out, and what changed since that snapshot), and usually done before another snapshot.
//! If it too ends lacking one, the next runs with new snapshots held off
//! (`Volume::snapshot_hold`): a snapshot asked meanwhile waits for it to end, at most the time
//! to copy what changed since the last resync began. Without that, snapshots taken more often
//! than a resync lasts would keep R out for ever; holding them off from the first retry would
//! make hourly snapshots wait on a resync they would not have disturbed.

use std::sync::Arc;
use tokio::time::Instant;

use bytes::Bytes;
use trireme_proto::{data_ranges, encode_peer, Op, FLAG_MAY_TRIM};
use trireme_replication::{
    all_chunks, union_chunks, ReplicaState, ResyncPlan, ResyncProgress, ResyncStart, ResyncStep,
};
use trireme_transport::Connection;

use crate::membership::BoxFut;
use crate::{connect_replica, join_all, Volume, VolumeError};

/// A returning replica, attached.
pub(crate) struct Reattached {
    pub(crate) conn: Arc<dyn Connection>,
    pub(crate) incarnation: u64,
    /// The size the copy has: the volume's when it was attached.
    pub(crate) size: u64,
}

/// Range covered by one dirty-region query (at 4 KiB granularity: 1 Mi regions, the node's cap).
const QUERY_WINDOW: u64 = 4 << 30;

impl Volume {
    /// Attaches a returning replica: its connection, its incarnation and the size it has.
    pub(crate) async fn reattach(&self, i: usize) -> Result<Reattached, VolumeError> {
        let m = self.membership()?;
        let node = self.node(i);
        let info = m
            .locate(&self.info.name)
            .await
            .map_err(|e| self.degrade(node, e))?;
        if info.epoch != self.info.epoch {
            return Err(VolumeError::Fenced {
                volume: self.info.name.clone(),
                ours: self.info.epoch,
                newer: info.epoch,
            });
        }
        let target = info
            .replicas
            .iter()
            .find(|r| r.node == node)
            .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))?;
        // The replica timeout bounds the connection, not the UCX negotiation after it, which
        // bounds itself and ends on TCP: cut short, it never let a copy whose UCX path is slow
        // (a loaded host) or blocked (a firewall) come back.
        let conn = connect_replica(target, &self.opts, Some(self.opts.replica_timeout)).await?;
        let f = self
            .call_on(i, &*conn, self.header(Op::Attach, 0, 0))
            .await?;
        // Its attach answer carries its size: a copy that missed a resize is given the size
        // before a resync fills it.
        let a = trireme_proto::AttachAnswer::read(&f.header);
        // Read once: a resize of the copies in sync may change the volume's size meanwhile
        // and does not reach this copy (simulator seed 1493452).
        let size = self.size();
        if let Some(had) = a.size.filter(|&s| s != self.replica_size(size)) {
            // A parity copy's size is fixed by its geometry: one of another size is not its.
            if self.parity.is_some() {
                return Err(VolumeError::Replica {
                    node,
                    status: trireme_proto::Status::Invalid,
                    message: format!(
                        "a copy of {had} bytes; this parity volume's copies have {}",
                        self.replica_size(size)
                    ),
                });
            }
            self.match_size(i, &*conn, had, size).await?;
        }
        // Its node may have restarted, forgetting the volume's claim.
        if let Some(h) = self.claim_request() {
            if let Err(e) = self.call_on(i, &*conn, h).await {
                tracing::debug!(volume = %self.info.name, node, "sending the volume's claim: {e}");
            }
        }
        Ok(Reattached {
            conn,
            incarnation: a.incarnation,
            size,
        })
    }

    /// Sends `h` to replica `i` on `conn`, a connection not (yet) in its slot: its answer,
    /// checked, within the replica timeout.
    pub(crate) async fn call_on(
        &self,
        i: usize,
        conn: &dyn Connection,
        h: trireme_proto::Header,
    ) -> Result<trireme_transport::Frame, VolumeError> {
        self.send_on(i, conn, h, Bytes::new()).await
    }

    /// The union of the survivors' dirty regions for replica `i`, or `None` if no survivor
    /// has a record that provably covers everything it missed.
    pub(crate) async fn dirty_regions(
        &self,
        i: usize,
        survivors: &[usize],
    ) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let mut ranges = Vec::new();
        let mut usable = 0;
        for &s in survivors {
            if let Some(mine) = self.survivor_record(s, i, self.size()).await? {
                usable += 1;
                ranges.extend(mine);
            }
        }
        Ok((usable > 0).then(|| union_chunks(ranges)))
    }

    /// What survivor `s` marked for replica `i` in `[0, span)` of its copy, or `None` if its
    /// record is not one this writer can trust (another epoch, or kept for another
    /// incarnation of `i`).
    pub(crate) async fn survivor_record(
        &self,
        s: usize,
        i: usize,
        span: u64,
    ) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let incarnation = self.core().incarnation(i);
        let mut mine = Vec::new();
        let mut off = 0;
        while off < span {
            let len = QUERY_WINDOW.min(span - off);
            let h = self.header(Op::DirtyQuery, off, len);
            let f = self
                .call(s, h, Bytes::from(encode_peer(self.node(i))))
                .await?;
            let f = self.expect_ok(s, f)?;
            let a = trireme_proto::DirtyAnswer::read(&f.header, &f.payload, len)
                .map_err(self.malformed(s))?;
            if a.epoch != self.info.epoch || a.incarnation != incarnation {
                return Ok(None);
            }
            mine.extend(data_ranges(&a.extents, off));
            off += len;
        }
        Ok(Some(mine))
    }

    /// How many resyncs of replica `i` in a row ended lacking a snapshot taken while they ran.
    pub(crate) fn lacked_snapshot(&self, i: usize) -> u8 {
        self.lacked_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())[i]
    }

    fn set_lacked_snapshot(&self, i: usize, n: u8) {
        self.lacked_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())[i] = n;
    }

    pub(crate) fn set_progress(&self, i: usize, p: Option<ResyncProgress>) {
        self.core().resync_progress(i, p);
    }

    /// Brings replica `i` back (see the module docs).
    pub(crate) async fn resync(&self, i: usize) -> Result<(), VolumeError> {
        if self.parity.is_some() {
            return self.resync_parity(i).await;
        }
        let Reattached {
            conn,
            incarnation,
            size,
        } = self.reattach(i).await?;
        let node = self.node(i);
        let lacked = self.lacked_snapshot(i);
        self.set_lacked_snapshot(i, 0);
        let _hold = match lacked >= 2 {
            true => {
                tracing::info!(volume = %self.info.name, node, lacked, "its last resyncs ended lacking snapshots taken meanwhile: new snapshots wait until this one ends");
                Some(self.snapshot_hold.write().await)
            }
            false => None,
        };
        // 0. The snapshots it missed while out, before it takes any write (`catch_up.rs`).
        // A copy that refuses them (a store without versions) resyncs without them; a copy or
        // source that failed to answer is tried again later, as a failed resync is: a copy in
        // sync without them would keep the old copy of a move from being retired.
        let caught_up = match self.catch_up_snapshots(i, &*conn, incarnation, size).await {
            Ok(()) => true,
            Err(e @ VolumeError::Replica { .. }) => {
                tracing::warn!(volume = %self.info.name, node, "giving a copy the snapshots it lacks: {e}; it resyncs without them");
                false
            }
            Err(e) => return Err(e),
        };
        let started = Instant::now();
        // 1. Pause writes, collect the survivors' regions, and let the replica take new writes.
        let (mut plan, survivors) = {
            let _all = self.core.acquire(0, self.size()).await;
            let _g = self.membership_lock.lock().await;
            let start = self.core().resync_start(i, incarnation);
            let (survivors, incremental) = match start.map_err(|r| self.degrade(node, r))? {
                ResyncStart::NotNeeded => return Ok(()),
                ResyncStart::From {
                    survivors,
                    incremental,
                } => (survivors, incremental),
            };
            let regions = if incremental {
                self.dirty_regions(i, &survivors).await?
            } else {
                None
            };
            // The volume's size, under the locks a resize takes: one that ran while the copy
            // was attached and given its snapshots did not reach it (it took no writes then).
            // The node answers at once if it has the size.
            self.call_on(i, &*conn, self.resize_header(self.size()))
                .await?;
            self.set_conn(i, Some(conn));
            // Its log starts now, before it takes any write of this writer.
            if let Err(e) = self.start_activity(&[i]).await {
                self.set_conn(i, None);
                return Err(e);
            }
            let (full, chunks) = match regions {
                Some(r) => (false, r),
                None => (true, all_chunks(self.size())),
            };
            let plan = ResyncPlan::new(chunks, full);
            self.core().resync_begun(i, plan.progress().clone());
            (plan, survivors)
        };
        let (full, total) = (plan.progress().full, plan.progress().total_bytes);
        self.resyncs_begun
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(volume = %self.info.name, node, full, bytes = total, "resync started");
        let result = self.copy_chunks(i, &mut plan, &survivors, started).await;
        let mut progress = plan.progress().clone();
        self.set_progress(i, None);
        if let Err(e) = result {
            // A failure of the replica itself already took it out again (regions kept).
            if self.core().resyncing(i) {
                if let Err(e2) = self.take_out_with(&[i], None, false).await {
                    tracing::warn!(volume = %self.info.name, node, "taking out a replica whose resync stopped: {e2}");
                }
            }
            self.core().resync_failed(i);
            return Err(e);
        }
        // 3. Pause writes again and make it in sync: on record first, then for reads.
        let _all = self.core.acquire(0, self.size()).await;
        let _g = self.membership_lock.lock().await;
        if !self.core().resyncing(i) {
            return Err(VolumeError::NoReplicas(self.info.name.clone()));
        }
        // A snapshot taken while it resynced is not on it: it goes out again with its history
        // known (the survivors still track every write it took), and its next resync gives
        // it the snapshot first (`catch_up.rs`). Without this, a copy in sync without a
        // snapshot could outlive the copies that hold it (simulator seed 156).
        // (Not if its catch-up was refused: it would be again.)
        let lacking = match caught_up {
            true => self.lacks_snapshots(i).await,
            false => Ok(false),
        };
        if !matches!(lacking, Ok(false)) {
            drop(_g);
            let out = self.take_out_with(&[i], None, false).await;
            self.core().resync_failed(i);
            out?;
            if lacking.is_ok() {
                self.set_lacked_snapshot(i, lacked.saturating_add(1));
            }
            return Err(match lacking {
                Err(e) => e,
                Ok(_) => VolumeError::Replica {
                    node,
                    status: trireme_proto::Status::NoSnapshot,
                    message: "a snapshot was taken while it resynced: it resyncs again, given the snapshot first".into(),
                },
            });
        }
        progress.elapsed_ms = started.elapsed().as_millis() as u64;
        self.resynced(i, incarnation, &progress).await?;
        tracing::info!(
            volume = %self.info.name,
            node,
            full,
            copied_bytes = progress.copied_bytes,
            scanned_bytes = progress.done_bytes,
            ms = progress.elapsed_ms,
            "resync done; replica in sync"
        );
        Ok(())
    }

    /// Replica `i`, resynced, is in sync: on record first, then for reads and writes; the
    /// survivors drop their records of what it missed. The caller holds the whole volume and
    /// the membership lock.
    pub(crate) async fn resynced(
        &self,
        i: usize,
        incarnation: u64,
        progress: &ResyncProgress,
    ) -> Result<(), VolumeError> {
        let node = self.node(i);
        let m = self.membership()?;
        // A follower is recorded when it takes its place (`Volume::promote_replica`).
        if self.core().follower() == Some(i) {
            self.core().resync_done(i, incarnation, progress.clone());
            self.drop_records(i).await;
            tracing::info!(volume = %self.info.name, node, "the new copy is whole; it takes the place next");
            return Ok(());
        }
        m.set_state(
            &self.info.name,
            self.info.epoch,
            node,
            ReplicaState::InSync,
            incarnation,
        )
        .await
        .map_err(|e| self.degrade(node, e))?;
        self.core().resync_done(i, incarnation, progress.clone());
        self.copies.wake();
        self.drop_records(i).await;
        Ok(())
    }

    /// Carries out `plan` for replica `i`: copies (or, for a full resync, compares then copies)
    /// its regions a few at a time, clears copied regions on the survivors in batches (a clear
    /// that is lost only means a region is copied again after an interruption), and keeps to
    /// the resync rate.
    pub(crate) async fn copy_chunks(
        &self,
        i: usize,
        plan: &mut ResyncPlan,
        survivors: &[usize],
        started: Instant,
    ) -> Result<(), VolumeError> {
        let peer = Bytes::from(encode_peer(self.node(i)));
        let full = plan.progress().full;
        // Bytes copied since the replica last flushed: they are made durable before the
        // survivors forget the regions and before the replica counts as in sync, or a power
        // loss on it after a drain retires the old copy would lose acknowledged flushes.
        let mut unflushed = false;
        loop {
            let rate = self.core().rate(i).or(self.opts.resync_rate);
            match plan.next(started.elapsed(), rate) {
                ResyncStep::Copy(group) => {
                    if !self.core().resyncing(i) {
                        return Err(VolumeError::NoReplicas(self.info.name.clone()));
                    }
                    let copies = join_all(
                        group
                            .iter()
                            .map(|&(off, len)| {
                                Box::pin(async move {
                                    let _r = self.core.acquire(off, off + len).await;
                                    self.activity.touch(off, len);
                                    self.copy_one(i, off, len, full).await
                                })
                                    as BoxFut<'_, Result<u64, VolumeError>>
                            })
                            .collect(),
                    )
                    .await;
                    let mut copied = 0;
                    for c in copies {
                        copied += c?;
                    }
                    unflushed |= copied > 0;
                    plan.copied(copied);
                    let mut shown = plan.progress().clone();
                    shown.elapsed_ms = started.elapsed().as_millis() as u64;
                    self.set_progress(i, Some(shown));
                }
                ResyncStep::Clear(regions) => {
                    if std::mem::take(&mut unflushed) {
                        self.flush_resynced(i).await?;
                    }
                    // Under the membership lock, and only while the replica is still being
                    // resynced: a write it failed meanwhile has marked its range again, and
                    // that mark must not be cleared.
                    let _g = self.membership_lock.lock().await;
                    if !self.core().resyncing(i) {
                        return Err(VolumeError::NoReplicas(self.info.name.clone()));
                    }
                    let live: Vec<usize> = survivors
                        .iter()
                        .copied()
                        .filter(|&s| self.state(s) == ReplicaState::InSync)
                        .collect();
                    let clears = live
                        .iter()
                        .flat_map(|&s| regions.iter().map(move |&(o, l)| (s, o, l)))
                        .map(|(s, o, l)| {
                            self.call(s, self.header(Op::DirtyClear, o, l), peer.clone())
                        })
                        .collect();
                    let _ = join_all(clears).await;
                }
                ResyncStep::WaitUntil(t) => {
                    tokio::time::sleep(t.saturating_sub(started.elapsed())).await;
                }
                ResyncStep::Done => {
                    if unflushed {
                        self.flush_resynced(i).await?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Flushes resync target `i`. If it fails, what the replica holds of the copies is unknown:
    /// it is taken out for a full resync.
    pub(crate) async fn flush_resynced(&self, i: usize) -> Result<(), VolumeError> {
        let r = self
            .call(i, self.header(Op::Flush, 0, 0), Bytes::new())
            .await
            .and_then(|f| self.expect_ok(i, f));
        let Err(e) = r else { return Ok(()) };
        if e.stops_writer() {
            return Err(e);
        }
        tracing::warn!(volume = %self.info.name, node = self.node(i), "resync target failed a flush: {e}");
        if self.core().resyncing(i) {
            if let Err(e2) = self.take_out_with(&[i], None, true).await {
                tracing::warn!(volume = %self.info.name, "taking out a resync target that failed a flush: {e2}");
            }
        }
        Err(e)
    }

    /// Copies one range from an in-sync replica to replica `i`, the caller holding the range.
    /// With `compare`, skips it when the checksums already match. Returns the bytes copied.
    pub(crate) async fn copy_one(
        &self,
        i: usize,
        off: u64,
        len: u64,
        compare: bool,
    ) -> Result<u64, VolumeError> {
        // A source whose copy fails its block checksums is passed over for the next in-sync
        // replica, and repaired from the one that serves.
        let mut plan = self.core().read_plan();
        let mut last = VolumeError::NoReplicas(self.info.name.clone());
        let mut copy = None;
        loop {
            let next = plan.next(self.core().set());
            let Some(src) = next else { break };
            if compare {
                let mut sums = self.checksums(&[src, i], off, len).await.into_iter();
                let (a, b) = (sums.next().expect("two"), sums.next().expect("two"));
                let a = match a {
                    Ok(c) => c,
                    Err(e) if e.is_bad_copy() => {
                        plan.failed(src, true);
                        last = e;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                // The target's own copy may be bad too: then it differs, and is overwritten.
                let b = match b {
                    Ok(c) => Some(c),
                    Err(e) if e.is_bad_copy() => None,
                    Err(e) => return Err(self.replica_failed(i, off, len, e).await),
                };
                if b == Some(a) {
                    copy = Some((src, None));
                    break;
                }
            }
            match self.read_from(src, off, len).await {
                Ok(d) => {
                    copy = Some((src, Some(d)));
                    break;
                }
                Err(e) if e.is_bad_copy() => {
                    plan.failed(src, true);
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        let Some((good, data)) = copy else {
            return Err(last);
        };
        if !plan.to_repair().is_empty() {
            self.repair_held(plan.to_repair(), good, off, len).await;
        }
        let Some(data) = data else { return Ok(0) };
        let h = if data.iter().all(|&b| b == 0) {
            let mut h = self.recovery_header(Op::WriteZeroes, off, len);
            h.flags |= FLAG_MAY_TRIM;
            (h, Bytes::new())
        } else {
            (self.recovery_header(Op::Write, off, len), data)
        };
        match self
            .call(i, h.0, h.1)
            .await
            .and_then(|f| self.expect_ok(i, f))
        {
            Ok(_) => Ok(len),
            Err(e) => Err(self.replica_failed(i, off, len, e).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_ranges_follow_the_extent_list() {
        use trireme_proto::Extent;
        let ext = [
            Extent {
                length: 10,
                flags: Extent::HOLE | Extent::ZERO,
            },
            Extent {
                length: 5,
                flags: 0,
            },
            Extent {
                length: 7,
                flags: Extent::HOLE,
            },
            Extent {
                length: 1,
                flags: 0,
            },
        ];
        assert_eq!(data_ranges(&ext, 100), vec![(110, 5), (122, 1)]);
    }
}
