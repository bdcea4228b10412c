//! Taking failed replicas out and bringing them back: degraded writes and incremental resync.
//!
//! **Taking out** (`take_out_with`), when a write fails on a replica R but reached an in-sync
//! one, in this order, before the write is acknowledged:
//! 1. R is recorded as outdated in the metadata (durable; refused for the last in-sync copy or
//!    for a writer whose epoch is no longer current);
//! 2. every surviving in-sync replica marks the write's range dirty for R and starts marking
//!    every later write it receives (auto mode) — before R leaves the write set, so no write
//!    can reach the survivors unmarked;
//! 3. R leaves the write set.
//!
//! Concurrent writes that also fail on R each mark their own range, so every write R missed is
//! either marked explicitly or arrives at a survivor already in auto mode.
//!
//! A survivor that cannot mark goes out too, unless no survivor would be left: then nobody
//! tracks what R misses, so R is recorded failed (a full resync brings it back) and the
//! silent survivors stay in sync; the request waits for one of them to answer again
//! (`relink.rs`). Before, R stayed in sync in the writer but outdated in the metadata, and
//! the next failure on the survivors found them "the last in-sync copy" there: a whole rack
//! restarted one server at a time failed the writer's requests with EIO.
//!
//! Bringing replicas back is `resync.rs`; settling replicas after a writer died, `reconcile.rs`;
//! rewriting a copy that failed its block checksums, `repair.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use trireme_proto::{DirtyPeer, Header, Op, DIRTY_AUTO, DIRTY_DROP, DIRTY_START};
pub use trireme_replication::ResyncProgress;
use trireme_replication::{ReplicaState, TakeOutStep};
use trireme_transport::Frame;

use crate::membership::{BoxFut, Membership, MembershipError, ReplicaView};
use crate::{join_all, Volume, VolumeError};

/// The longest a replica whose resyncs keep stopping waits before the next one.
const RESYNC_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// How often a resync that keeps failing the same way is said again.
const RESYNC_RETOLD: Duration = Duration::from_secs(30);

/// Starts failure handling for a freshly attached volume: reconciles the replicas if the previous
/// writer died with writes in flight, then spawns the resync task.
pub(crate) async fn start(v: &Arc<Volume>) -> Result<(), VolumeError> {
    // A parity volume's copies kept in sync with their history lost may have lost unflushed
    // writes to their mirrored parts: reconciled whatever the last writer did.
    let kept_lost = !v.kept_lost().is_empty();
    match v.parity.is_some() {
        true if v.info.reconcile || kept_lost => v.reconcile_parity().await?,
        false if v.info.reconcile => v.reconcile().await?,
        _ => {}
    }
    v.record_kept_lost().await;
    v.restore_overlay().await?;
    // The replicas agree now: each starts this writer's activity log (one that cannot is taken
    // out, like one that fails its attach).
    let in_sync = v.in_sync();
    for t in in_sync {
        if let Err(e) = v.start_activity(&[t]).await {
            if e.is_fenced() {
                return Err(e);
            }
            tracing::warn!(volume = %v.info.name, node = v.node(t), "cannot start the activity log: {e}");
            v.take_out_with(&[t], None, false).await?;
        }
    }
    crate::activity::spawn_cleaner(v);
    crate::encoder::spawn(v);
    let weak = Arc::downgrade(v);
    tokio::spawn(async move {
        let mut last_error: Vec<Option<(String, Duration, u32)>> = Vec::new();
        // Per replica: resyncs that began and stopped in a row, and when to try again.
        let mut backoff: Vec<(u32, std::time::Duration)> = Vec::new();
        loop {
            let Some(interval) = weak.upgrade().map(|v| v.opts.resync_interval) else {
                return;
            };
            tokio::time::sleep(interval).await;
            let Some(v) = weak.upgrade() else { return };
            // A node that died while the volume was idle: its link is closed. Take it out now
            // rather than at the next write, so it is resynced (and shown) without delay.
            let closed: Vec<usize> = (0..v.replica_count())
                .filter(|&i| v.conn(&v.slots[i]).is_none_or(|c| c.is_closed()))
                .collect();
            let dead = v.core().closed_to_take_out(&closed);
            if !dead.is_empty() {
                if let Err(e) = v.take_out_with(&dead, None, false).await {
                    tracing::warn!(volume = %v.info.name, "taking out replicas with closed links: {e}");
                }
            }
            // Those that could not be taken out (the last in sync, or a parity volume's K:
            // its floor refused) are linked again if they answer: the resyncs below read the
            // survivors' records through their links. `relink_closed` passes over the ones
            // taken out just now (simulator seed 128528: a 2+1 copy back from a crash was
            // never linked again, its take-out refused, and every resync failed on it).
            match v.relink_closed(&closed).await {
                Err(e) if e.is_fenced() => {
                    tracing::info!(volume = %v.info.name, "resync stops: {e}");
                    v.stop_writes();
                    return;
                }
                Err(e) => {
                    tracing::debug!(volume = %v.info.name, "linking the last in-sync copies again: {e}")
                }
                Ok(()) => {}
            }
            // Copies kept in sync with their history lost (`keep_lost`): their mirrors are
            // made to agree first, as no resync may copy from them before.
            let kept = v.kept_lost();
            if !kept.is_empty() {
                if let Err(e) = v.keep_lost_copies(&kept).await {
                    tracing::warn!(volume = %v.info.name, "copies that lost their history are not reconciled yet: {e}");
                    continue;
                }
            }
            v.check_space_again().await;
            last_error.resize(v.replica_count(), None);
            backoff.resize(v.replica_count(), (0, std::time::Duration::ZERO));
            let now = v.now();
            let due = v.core().to_resync(now);
            for (i, last) in last_error.iter_mut().enumerate() {
                if !due.contains(&i) || now < backoff[i].1 {
                    continue;
                }
                let begun = v.resyncs_begun.load(Ordering::Relaxed);
                let r = v.resync(i).await;
                // A resync that began and stopped (not a node that is simply not back yet)
                // waits longer each time it stops again: a copy that cannot finish must not
                // start over every tick, taking replicas out and logging each time.
                backoff[i] = match &r {
                    // Not a failure: it lacks a snapshot taken while it resynced, and its next
                    // resync, short, gives it (`resync.rs`).
                    Err(_) if v.lacked_snapshot(i) > 0 => (0, std::time::Duration::ZERO),
                    Err(e)
                        if !e.is_fenced() && v.resyncs_begun.load(Ordering::Relaxed) != begun =>
                    {
                        let n = backoff[i].0.saturating_add(1);
                        let wait = interval
                            .saturating_mul(1 << n.min(16))
                            .min(RESYNC_BACKOFF_MAX);
                        (n, v.now() + wait)
                    }
                    Err(_) => backoff[i],
                    Ok(()) => (0, std::time::Duration::ZERO),
                };
                match r {
                    Ok(()) => *last = None,
                    // Fenced: a newer writer holds the volume. A node that refused this
                    // identity is not that: it may not have read the volume's access list
                    // yet (it just started), and if the list dropped this client the writes
                    // are refused too, which stops the writer. Tried again next tick.
                    Err(e) if e.is_fenced() => {
                        tracing::info!(volume = %v.info.name, "resync stops: {e}");
                        v.stop_writes();
                        return;
                    }
                    Err(e) => {
                        // The node is usually just not back yet: say so once, not every tick,
                        // and again every RESYNC_RETOLD while it lasts, with the tries since:
                        // a copy that never comes back must not look like one tried once.
                        let msg = e.to_string();
                        match last {
                            Some((said, at, tries))
                                if *said == msg && now.saturating_sub(*at) < RESYNC_RETOLD =>
                            {
                                *tries += 1;
                            }
                            Some((said, at, tries)) if *said == msg => {
                                tracing::warn!(volume = %v.info.name, node = v.node(i), "replica still not resynced after {} more tries: {msg}", *tries + 1);
                                (*at, *tries) = (now, 0);
                            }
                            _ => {
                                tracing::info!(volume = %v.info.name, node = v.node(i), "replica not resynced yet: {msg}");
                                *last = Some((msg, now, 0));
                            }
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

impl Volume {
    pub(crate) fn membership(&self) -> Result<&Arc<dyn Membership>, VolumeError> {
        self.membership
            .as_ref()
            .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))
    }

    /// Every replica with its current state and resync progress.
    /// Replicas moved off are left out.
    pub fn replica_views(&self) -> Vec<ReplicaView> {
        let views = self.core().views();
        views
            .into_iter()
            .map(|(node, state, resync)| ReplicaView {
                node,
                state,
                resync,
            })
            .collect()
    }

    /// The slot of the replica on `node`, unless it was moved off.
    pub(crate) fn slot_of(&self, node: u32) -> Option<usize> {
        self.core().slot_of(node)
    }

    /// Adds a replica on `node` (the new copy of a move, already created there and recorded as
    /// failed in the metadata). It starts failed: the resync task copies the volume to it with
    /// a full compare, at most `rate` bytes per second, and records it in sync when done.
    pub async fn add_replica(&self, node: u32, rate: Option<u64>) -> Result<(), VolumeError> {
        self.mirror_only("moving a copy")?;
        let _g = self.membership_lock.lock().await;
        let mut core = self.core();
        self.name_next_slot(&core, node);
        let added = core.add(node, rate.unwrap_or(0));
        drop(core);
        match added {
            Ok((_, false)) => Ok(()),
            Ok((i, true)) => {
                self.set_conn(i, None);
                tracing::info!(volume = %self.info.name, node, "replica added; a full resync follows");
                Ok(())
            }
            Err(r) => Err(self.degrade(node, r)),
        }
    }

    /// Names `node` in the slot the core hands out next (a new replica's), before the core
    /// can hand its index out. Left unused if the core refuses or has the node already.
    pub(crate) fn name_next_slot(&self, core: &trireme_replication::VolumeCore, node: u32) {
        if let Some(slot) = self.slots.get(core.set().len()) {
            slot.node.store(node, Ordering::Relaxed);
        }
    }

    /// Stops using the replica on `node` (the old copy of a move): with writes paused, it is
    /// recorded outdated (from now on it misses writes) and leaves the set for good. Refused
    /// for the last in-sync replica.
    pub async fn retire_replica(&self, node: u32) -> Result<(), VolumeError> {
        self.mirror_only("moving a copy")?;
        let m = self.membership()?;
        let _all = self.core.acquire(0, self.size()).await;
        let _g = self.membership_lock.lock().await;
        let Some(i) = self.slot_of(node) else {
            return Ok(());
        };
        let must_record = self
            .core()
            .may_retire(i)
            .map_err(|r| self.degrade(node, r))?;
        if must_record && !self.another_copy_holds(i).await {
            // A copy in sync in this writer's view may have died a moment ago (its node lost
            // power after its resync): until a request fails on it, nothing says so. Retiring
            // the old copy then would leave none (simulator seed 40182).
            return Err(self.degrade(node, trireme_replication::Refusal::NoOtherAnswers));
        }
        if must_record {
            match m
                .set_state(
                    &self.info.name,
                    self.info.epoch,
                    node,
                    ReplicaState::Outdated,
                    0,
                )
                .await
            {
                // Not on record any more: nothing to record.
                Ok(()) | Err(MembershipError::NotOnRecord(_)) => {}
                Err(e) => return Err(self.degrade(node, e)),
            }
            // The record may have waited for the metadata store, and the copies that were to
            // hold the volume after this one may have died meanwhile (simulator seed 57077:
            // the new copy of a move lost power and the third crashed while the store was
            // away). Writes were held all along, so this copy missed none: if no other copy
            // holds now, it goes back on record in sync and stays.
            if !self.another_copy_holds(i).await {
                let incarnation = self.core().incarnation(i);
                m.set_state(
                    &self.info.name,
                    self.info.epoch,
                    node,
                    ReplicaState::InSync,
                    incarnation,
                )
                .await
                .map_err(|e| self.degrade(node, e))?;
                tracing::warn!(volume = %self.info.name, node, "not retiring the copy: no other copy holds the volume now");
                return Err(self.degrade(node, trireme_replication::Refusal::NoOtherAnswers));
            }
        }
        if self.state(i) == ReplicaState::InSync {
            self.hand_over_records(i).await?;
        }
        self.core().retire(i);
        self.set_conn(i, None);
        // Survivors that track it for a resync can forget it.
        self.drop_records(i).await;
        tracing::info!(volume = %self.info.name, node, "replica retired");
        Ok(())
    }

    /// Before copy `i` leaves: what it recorded of the writes each copy now out missed is
    /// marked on the copies in sync that stay. An incremental resync trusts the union of the
    /// survivors' records, and a survivor that was out for a while itself recorded nothing
    /// then: the copy that leaves may be the only one that saw a write. (Simulator seed
    /// 1164809: the new copy of a move and a third were out in turn while a write and a
    /// snapshot were taken on the old copy alone; once the old copy was retired, the fourth,
    /// back from a crash, was given the snapshot without that write.)
    async fn hand_over_records(&self, i: usize) -> Result<(), VolumeError> {
        let stay: Vec<usize> = self.in_sync().into_iter().filter(|&s| s != i).collect();
        let out = (0..self.replica_count()).filter(|&j| {
            j != i && matches!(self.state(j), ReplicaState::Outdated | ReplicaState::Failed)
        });
        for j in out.collect::<Vec<_>>() {
            if let Some(regions) = self.dirty_regions(j, &[i]).await? {
                if !regions.is_empty() {
                    self.mark_for(j, &stay, &regions).await?;
                    tracing::info!(volume = %self.info.name, leaving = self.node(i), peer = self.node(j), regions = regions.len(), "the leaving copy's record of what a copy out missed, handed to the copies that stay");
                }
            }
        }
        Ok(())
    }

    /// Whether an in-sync copy other than `i` answers with the history on record and has made
    /// what it holds durable (a flush): the copy that may go then has a successor.
    async fn another_copy_holds(&self, i: usize) -> bool {
        for j in self.in_sync().into_iter().filter(|&j| j != i) {
            let info = self
                .call(j, self.header(Op::ReplicaInfo, 0, 0), Bytes::new())
                .await
                .and_then(|f| self.expect_ok(j, f));
            let same = info.is_ok_and(|f| {
                trireme_proto::ReplicaInfoAnswer::read(&f.header, &f.payload)
                    .is_ok_and(|a| a.incarnation == self.core().incarnation(j))
            });
            if !same {
                continue;
            }
            let flushed = self
                .call(j, self.header(Op::Flush, 0, 0), Bytes::new())
                .await
                .and_then(|f| self.expect_ok(j, f));
            if flushed.is_ok() {
                return true;
            }
        }
        false
    }

    /// Planned take-out of the replica on `node` (its node is about to restart): with writes
    /// paused for a moment, it is recorded outdated and the survivors start their record of
    /// what it misses, so no write fails on it while it is away. The resync task leaves it
    /// alone for `hold` (or until [`Volume::release_node`]), so no resync starts on a node
    /// about to stop, then brings it back when it answers. `Ok(false)`: no in-sync replica
    /// there. Refused when fewer in-sync copies than the volume's minimum would remain.
    pub async fn take_out_node(&self, node: u32, hold: Duration) -> Result<bool, VolumeError> {
        self.membership()?;
        let _all = self.core.acquire(0, self.size()).await;
        let planned = self.core().planned_take_out(node);
        let Some(i) = planned.map_err(|r| self.degrade(node, r))? else {
            return Ok(false);
        };
        let until = self.now() + hold;
        self.core().hold(node, until);
        if let Err(e) = self.take_out_with(&[i], None, false).await {
            self.release_node(node);
            return Err(e);
        }
        tracing::info!(volume = %self.info.name, node, "replica taken out for a planned restart");
        Ok(true)
    }

    /// Lets the resync task bring the replica on `node` back (its planned restart is over).
    pub fn release_node(&self, node: u32) {
        self.core().release_hold(node);
    }

    /// Whether the replica on `node` is in sync in this writer's view.
    pub fn in_sync_on(&self, node: u32) -> bool {
        let core = self.core();
        core.slot_of(node)
            .is_some_and(|i| core.set().state(i) == ReplicaState::InSync)
    }

    /// The last finished resync of the replica on `node`, if any.
    pub fn last_resync(&self, node: u32) -> Option<ResyncProgress> {
        self.core().last_resync(node).cloned()
    }

    /// Flushes and tells the control plane this writer is gone cleanly, so the next attach
    /// need not reconcile.
    pub async fn detach(&self) -> Result<(), VolumeError> {
        self.flush().await?;
        if let Some(m) = &self.membership {
            m.detach(&self.info.name, self.info.epoch)
                .await
                .map_err(|source| VolumeError::Membership {
                    volume: self.info.name.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Leaves replica `i` out for good, without recording anything: the volume's layout no
    /// longer lists it (the manager dropped the old copy of a move its previous writer
    /// retired, after this writer had attached with it). Refused for the last in-sync copy.
    fn let_go(&self, i: usize) -> Result<(), VolumeError> {
        let node = self.node(i);
        let mut core = self.core();
        core.may_retire(i).map_err(|r| self.degrade(node, r))?;
        core.retire(i);
        drop(core);
        self.set_conn(i, None);
        tracing::warn!(volume = %self.info.name, node, "replica no longer on record: the writer lets go of it");
        Ok(())
    }

    pub(crate) fn dirty_peer(&self, i: usize, mode: u8) -> Bytes {
        Bytes::from(
            DirtyPeer {
                peer: self.node(i),
                incarnation: self.core().incarnation(i),
                mode,
            }
            .encode(),
        )
    }

    /// The in-sync replicas other than `i` drop their dirty record for it (it is back in sync,
    /// or gone). A record left behind only costs memory until the next take-out replaces it.
    pub(crate) async fn drop_records(&self, i: usize) {
        let h = self.header(Op::DirtyTrack, 0, 0);
        let drop_record = self.dirty_peer(i, DIRTY_DROP);
        let survivors = self.in_sync();
        for s in survivors.into_iter().filter(|&s| s != i) {
            if let Err(e) = self.to_all(&[s], h, drop_record.clone()).await {
                tracing::warn!(volume = %self.info.name, node = self.node(s), peer = self.node(i), "could not drop a dirty record: {e}");
            }
        }
    }

    /// Why a take-out of `failed` took nothing out: no in-sync copy would remain, or (a parity
    /// volume) fewer than K, which could rebuild no chunk: the request waits for `failed`.
    fn none_left(&self, failed: &[usize]) -> VolumeError {
        let left = self
            .in_sync()
            .iter()
            .filter(|i| !failed.contains(i))
            .count();
        if left == 0 {
            return self.degrade(self.node(failed[0]), trireme_replication::Refusal::NoneLeft);
        }
        let e = self.waiting_for(failed);
        tracing::warn!(volume = %self.info.name, left, "nothing is taken out: {e}");
        e
    }

    /// A request's wait for copies `slots`, which too few in sync can do without.
    fn waiting_for(&self, slots: &[usize]) -> VolumeError {
        VolumeError::WaitForCopies {
            volume: self.info.name.clone(),
            waiting: slots.iter().map(|&i| self.node(i)).collect(),
            why: crate::WaitReason::CannotServe,
        }
    }

    /// Sends `h` (and `payload`) to each of `targets` at once: each one's answer, in the order
    /// of `targets`, unchecked.
    pub(crate) async fn call_each(
        &self,
        targets: &[usize],
        h: Header,
        payload: Bytes,
    ) -> Vec<Result<Frame, VolumeError>> {
        join_all(
            targets
                .iter()
                .map(|&i| self.call(i, h, payload.clone()))
                .collect(),
        )
        .await
    }

    /// Sends `h` to each of `targets`, with no payload; the targets that failed it, with why.
    pub(crate) async fn to_each(&self, targets: &[usize], h: Header) -> Vec<(usize, VolumeError)> {
        let replies = self.call_each(targets, h, Bytes::new()).await;
        targets
            .iter()
            .zip(replies)
            .filter_map(|(&i, r)| r.and_then(|f| self.expect_ok(i, f)).err().map(|e| (i, e)))
            .collect()
    }

    /// Sends one request to each of `targets`; fails if any fails.
    pub(crate) async fn to_all(
        &self,
        targets: &[usize],
        h: Header,
        payload: Bytes,
    ) -> Result<(), VolumeError> {
        let replies = self.call_each(targets, h, payload).await;
        for (k, r) in replies.into_iter().enumerate() {
            self.expect_ok(targets[k], r?)?;
        }
        Ok(())
    }

    /// Takes `failed` replicas out (see the module docs). `range` is the write they missed;
    /// `lost_history` records them as failed, which forces a full resync.
    pub(crate) async fn take_out_with(
        &self,
        failed: &[usize],
        range: Option<(u64, u64)>,
        lost_history: bool,
    ) -> Result<(), VolumeError> {
        let m = self.membership()?;
        let _g = self.membership_lock.lock().await;
        let mut failed = failed.to_vec();
        // The procedure is `replication::TakeOut`; this carries its steps out. It starts over
        // without a replica the layout turns out not to list any more (let go of instead).
        let mut plan = self.core().take_out(&failed, lost_history);
        let (offset, length) = range.unwrap_or((0, 0));
        let out = 'plan: loop {
            match plan.step() {
                TakeOutStep::Record(records) => {
                    for (i, to) in records {
                        let node = self.node(i);
                        let t0 = tokio::time::Instant::now();
                        match m
                            .set_state(&self.info.name, self.info.epoch, node, to, 0)
                            .await
                        {
                            Ok(()) => {}
                            Err(MembershipError::NotOnRecord(_)) => {
                                self.let_go(i)?;
                                failed.retain(|&f| f != i);
                                plan = self.core().take_out(&failed, lost_history);
                                continue 'plan;
                            }
                            Err(e) => return Err(self.degrade(node, e)),
                        }
                        tracing::warn!(volume = %self.info.name, node, state = %to, recorded_ms = t0.elapsed().as_millis() as u64, "replica taken out; writes continue on the others");
                        plan.recorded(i);
                    }
                }
                TakeOutStep::Mark(marks) => {
                    // The write they missed, where it is on the nodes (a piece of a parity
                    // volume's write is within one region, so its place is one range).
                    let h = match length {
                        0 => self.header(Op::DirtyMark, 0, 0),
                        _ => self.node_range(self.header(Op::DirtyMark, offset, length)),
                    };
                    let replies = join_all(
                        marks
                            .iter()
                            .map(|mk| {
                                let mode = if mk.start { DIRTY_START } else { DIRTY_AUTO };
                                let payload = self.dirty_peer(mk.replica, mode);
                                let s = mk.survivor;
                                Box::pin(async move {
                                    self.call(s, h, payload)
                                        .await
                                        .and_then(|f| self.expect_ok(s, f))
                                })
                                    as BoxFut<'_, Result<Frame, VolumeError>>
                            })
                            .collect(),
                    )
                    .await;
                    for (mk, r) in marks.iter().zip(replies) {
                        match r {
                            Ok(_) => plan.marked(mk.survivor, true),
                            Err(e) if e.stops_writer() => return Err(e),
                            Err(e) => {
                                tracing::warn!(volume = %self.info.name, node = self.node(mk.survivor), "survivor cannot track a replica that is out: {e}");
                                plan.marked(mk.survivor, false);
                            }
                        }
                    }
                }
                TakeOutStep::NoneLeft => return Err(self.none_left(&failed)),
                TakeOutStep::Apply(out) => break out,
                TakeOutStep::Short { apply, waiting } => {
                    self.core().apply(&apply);
                    for &(i, _) in &apply {
                        self.set_conn(i, None);
                    }
                    let e = self.waiting_for(&waiting);
                    tracing::warn!(volume = %self.info.name, "too few copies in sync could track the failed ones, which stay in sync: {e}");
                    return Err(e);
                }
                TakeOutStep::Stranded(out) => {
                    self.core().apply(&out);
                    for &(i, _) in &out {
                        self.set_conn(i, None);
                    }
                    let nodes: Vec<u32> = self.in_sync().iter().map(|&i| self.node(i)).collect();
                    let gone: Vec<u32> = out.iter().map(|&(i, _)| self.node(i)).collect();
                    tracing::warn!(volume = %self.info.name, ?nodes, out = ?gone, "the copies left in sync stopped answering before they could track the failed ones: those go out for a full resync, and requests wait for these");
                    return Err(VolumeError::Stranded {
                        volume: self.info.name.clone(),
                        nodes,
                    });
                }
            }
        };
        self.core().apply(&out);
        for &(i, _) in &out {
            self.set_conn(i, None);
        }
        Ok(())
    }
}
