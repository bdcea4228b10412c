//! Taking a snapshot of the volume: a barrier in the write order, not a drain of the queue.
//!
//! 1. Hold the whole volume in the write order, then the membership lock (the order a resize
//!    and a resync take them in): every write answered before is on every copy in sync, no
//!    write is in flight, none starts, no copy goes out or comes back.
//! 2. `Snapshot` to every copy in sync at once, with `FLAG_UNSYNCED`: each records it (a
//!    redirect-on-write map: nothing is copied) in its redirect log, after the records of
//!    every write before it, without a sync.
//! 3. Release: writes go on. The pause is one round trip and each copy's log append.
//! 4. Flush every copy: the data the snapshot holds and its record become durable (a copy
//!    that restarts before that drops the snapshot, and its resync gives it back). The
//!    command returns after it, naming the copies still in sync.
//!
//! A copy that fails the barrier (it does not answer, or its store fails) is taken out as
//! for any failed write, before the barrier is released, so no write reaches it while it
//! lacks the snapshot; its resync gives it the snapshot (`catch_up.rs`). The decision is the
//! core's ([`trireme_replication::Mirrored::Snapshot`]). If a copy refuses the request (for
//! space, or as invalid), the writer is fenced, or no copy in sync took it, the copies that
//! took it delete it again and the snapshot fails (the volume goes on as before; asking again
//! takes it). Copies out of sync or resyncing at the time do not get it; a snapshot is read
//! only from a copy that has it (a node answers `NoSnapshot` otherwise).

use bytes::Bytes;
use trireme_proto::{Op, SnapshotRequest, Status};
use trireme_replication::{Answers, Decision, Mirrored, ReplicaOutcome};

use crate::core::Answered;
use crate::error::outcome_of;
use crate::{Volume, VolumeError};

impl Volume {
    /// Takes snapshot `id` (never 0) of the volume, `created` seconds since the Unix epoch;
    /// the nodes that hold it. See the module docs.
    pub async fn snapshot(&self, id: u64, created: u64) -> Result<Vec<u32>, VolumeError> {
        self.snapshot_sized(id, created)
            .await
            .map(|(nodes, _)| nodes)
    }

    /// As [`Volume::snapshot`]; with the nodes, the snapshot's size: the volume's under the
    /// barrier (a resize holds the whole volume too, so none runs across it).
    pub async fn snapshot_sized(
        &self,
        id: u64,
        created: u64,
    ) -> Result<(Vec<u32>, u64), VolumeError> {
        self.mirror_only("snapshots")?;
        let t0 = tokio::time::Instant::now();
        let (took, held, paused, size) = {
            // A copy finishing a resync that lacked a snapshot holds new ones off (`resync.rs`).
            let _hold = self.snapshot_hold.read().await;
            // The whole volume: a resize that ran while this waited may have grown it past
            // the range asked for, so it is asked again until it covers the size it holds.
            let (_all, size) = loop {
                let size = self.size();
                let all = self.core.acquire(0, size).await;
                if self.size() == size {
                    break (all, size);
                }
            };
            let g = self.membership_lock.lock().await;
            let held = t0.elapsed();
            let targets = self.in_sync();
            let mut h = self.header(Op::Snapshot, 0, 0);
            h.flags |= trireme_proto::FLAG_UNSYNCED;
            SnapshotRequest { id, created }.put(&mut h);
            let (took, _, first, outcomes) = self.on_each(&targets, h, "snapshot").await;
            let answers = Answers {
                place: None,
                request: Mirrored::Snapshot,
                targets: &targets,
                outcomes: &outcomes,
                from_reserve: false,
            };
            let decision = match self.core.answered(None, answers) {
                Answered::Ack { .. } => Decision::Ack,
                Answered::Carry(d) => d,
            };
            match decision {
                Decision::Ack => {}
                Decision::TakeOut {
                    replicas,
                    lost_history,
                    ..
                } => {
                    // Still under the barrier: no write reaches them before they are out.
                    drop(g);
                    if let Err(e) = self.take_out_with(&replicas, None, lost_history).await {
                        self.undo_snapshot(&took, id).await;
                        return Err(e);
                    }
                }
                Decision::Fail(_) | Decision::UseReserve { .. } => {
                    self.undo_snapshot(&took, id).await;
                    return Err(
                        first.unwrap_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))
                    );
                }
            }
            (took, held, t0.elapsed(), size)
        };
        // Writes go on; the flush makes the snapshot durable on every copy. One that fails it
        // is taken out, as for any failed write, and is not named as holding the snapshot:
        // a copy that restarts before its flush drops an unsynced snapshot, and its resync
        // gives it the snapshot again.
        if let Err(e) = self.flush().await {
            self.undo_snapshot(&took, id).await;
            return Err(e);
        }
        let in_sync = self.in_sync();
        let nodes: Vec<u32> = took
            .iter()
            .filter(|i| in_sync.contains(i))
            .map(|&i| self.node(i))
            .collect();
        if nodes.is_empty() {
            self.undo_snapshot(&took, id).await;
            return Err(VolumeError::NoReplicas(self.info.name.clone()));
        }
        tracing::info!(
            volume = %self.info.name,
            id,
            nodes = ?nodes,
            waited_ms = held.as_millis() as u64,
            paused_ms = paused.as_millis() as u64,
            took_ms = t0.elapsed().as_millis() as u64,
            "snapshot taken"
        );
        Ok((nodes, size))
    }

    /// Makes the volume hold what snapshot `id` holds, on every copy at once (the snapshot
    /// stays). Refused unless every copy is in sync: a copy out of sync would be brought back
    /// from its peers' records of what it missed, which a rollback does not write. A copy that
    /// fails it is taken out for a full resync (from the rolled-back ones); if none takes it,
    /// the volume is as it was.
    pub async fn rollback(&self, id: u64) -> Result<(), VolumeError> {
        self.mirror_only("snapshots")?;
        let r = self.rollback_held(id).await;
        self.extents.changed();
        r
    }

    async fn rollback_held(&self, id: u64) -> Result<(), VolumeError> {
        let _all = self.core.acquire(0, self.size()).await;
        let (took, failed, first) = {
            let _g = self.membership_lock.lock().await;
            let targets = self.in_sync();
            if !self.core().every_copy_in_sync() {
                return Err(VolumeError::Rollback {
                    volume: self.info.name.clone(),
                    why: "not every copy is in sync: wait for the resync".into(),
                });
            }
            // Each node marks the whole volume in its activity log (as a write of it all);
            // the log's clearing leaves those marks for a full tick at least.
            self.activity.touch(0, self.size());
            let mut h = self.header(Op::Rollback, 0, 0);
            SnapshotRequest { id, created: 0 }.put(&mut h);
            let (took, failed, first, _) = self.on_each(&targets, h, "rollback").await;
            (took, failed, first)
        };
        if took.is_empty() {
            return Err(first.unwrap_or_else(|| VolumeError::NoReplicas(self.info.name.clone())));
        }
        if !failed.is_empty() {
            self.take_out_with(&failed, None, true).await?;
        }
        tracing::warn!(volume = %self.info.name, id, copies = took.len(), "rolled back to a snapshot");
        Ok(())
    }

    /// Which of `[offset, offset+len)` (up to 4 GiB) the volume has changed since snapshot
    /// `from`: extents covering it, flag [`trireme_proto::EXTENT_CHANGED`] where blocks were
    /// written or trimmed since (4 KiB granularity). Asked of a copy in sync that holds the
    /// snapshot: every write answered before the call is on it.
    pub async fn changed_since(
        &self,
        from: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
        self.mirror_only("snapshots")?;
        self.changed_between(from, None, offset, len, crate::Extents::All)
            .await
    }

    /// [`Volume::changed_since`], all of it or the first extents (`want`: a dirty bitmap's
    /// NBD reply).
    pub async fn changed_since_of(
        &self,
        from: u64,
        offset: u64,
        len: u64,
        want: crate::Extents,
    ) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
        self.mirror_only("snapshots")?;
        let kind = crate::extent_cache::Kind::ChangedSince(from);
        self.extents
            .answer(kind, offset, len, want, |ask| {
                self.changed_between(from, None, offset, len, ask)
            })
            .await
    }

    /// As [`Volume::changed_since`], up to snapshot `to` if given (between two versions),
    /// asked of a copy in sync that holds both.
    pub(crate) async fn changed_between(
        &self,
        from: u64,
        to: Option<u64>,
        offset: u64,
        len: u64,
        want: crate::Extents,
    ) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
        // Versions have sizes of their own (a catch-up asks past the volume's end about a
        // snapshot taken before a shrink): the copy checks the range against theirs.
        trireme_replication::check_io(offset, len, u64::MAX, 1 << 32)?;
        let mut h = self.header(Op::SnapshotChanged, offset, len);
        h.flags |= want.flags();
        let q = Bytes::from(trireme_proto::ChangedRequest { from, to }.payload());
        let mut last = VolumeError::NoReplicas(self.info.name.clone());
        for i in self.in_sync() {
            match self
                .call(i, h, q.clone())
                .await
                .and_then(|f| self.expect_ok(i, f))
            {
                Ok(f) => return want.check(self.node(i), &f.payload, len),
                Err(e) if e.stops_writer() => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Sends `h` to every replica of `targets` at once: those that took it, those that did not,
    /// the first failure, and each target's outcome (in the order of `targets`). `what` names
    /// it in the log.
    async fn on_each(
        &self,
        targets: &[usize],
        h: trireme_proto::Header,
        what: &str,
    ) -> (
        Vec<usize>,
        Vec<usize>,
        Option<VolumeError>,
        Vec<ReplicaOutcome>,
    ) {
        let replies = self.call_each(targets, h, Bytes::new()).await;
        let (mut took, mut failed, mut first) = (Vec::new(), Vec::new(), None);
        let mut outcomes = Vec::with_capacity(targets.len());
        for (k, r) in replies.into_iter().enumerate() {
            let i = targets[k];
            match r.and_then(|f| self.expect_ok(i, f)) {
                Ok(_) => {
                    took.push(i);
                    outcomes.push(ReplicaOutcome::Done);
                }
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "{what} failed on a copy: {e}");
                    failed.push(i);
                    outcomes.push(outcome_of(&e));
                    first.get_or_insert(e);
                }
            }
        }
        (took, failed, first, outcomes)
    }

    /// Deletes snapshot `id` from the copies that took it before another failed.
    async fn undo_snapshot(&self, took: &[usize], id: u64) {
        let mut h = self.header(Op::SnapshotDelete, 0, 0);
        SnapshotRequest { id, created: 0 }.put(&mut h);
        for &i in took {
            let r = self.call(i, h, Bytes::new()).await;
            match r {
                Ok(f) if matches!(f.header.status, Status::Ok | Status::NoSnapshot) => {}
                Ok(f) => tracing::warn!(
                    volume = %self.info.name,
                    node = self.node(i),
                    id,
                    "removing a snapshot that failed on another copy: {}",
                    String::from_utf8_lossy(&f.payload)
                ),
                Err(e) => tracing::warn!(
                    volume = %self.info.name,
                    node = self.node(i),
                    id,
                    "removing a snapshot that failed on another copy: {e}"
                ),
            }
        }
    }
}
