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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use trireme_proto::{
    data_ranges, decode_extents, encode_peer, DirtyPeer, Header, Op, DIRTY_AUTO, DIRTY_DROP,
    DIRTY_START, FLAG_MAY_TRIM,
};
pub use trireme_replication::ResyncProgress;
use trireme_replication::{
    all_chunks, union_chunks, ReplicaState, ResyncPlan, ResyncStep, TakeOut, TakeOutStep,
};
use trireme_transport::{Connection, Frame};

use crate::{connect_replica, join_all, AttachInfo, Volume, VolumeError};

pub(crate) use trireme_replication::CHUNK;
/// Range covered by one dirty-region query (at 4 KiB granularity: 1 Mi regions, the node's cap).
const QUERY_WINDOW: u64 = 4 << 30;
/// Range covered by one activity-log query (at the smallest extent, 64 KiB: the node's cap).
const ACTIVITY_WINDOW: u64 = 64 << 30;

/// A boxed future borrowing its arguments.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the control plane did not record or answer what the writer asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// The owner of the metadata said no: a stale epoch, the last in-sync replica, no such
    /// volume or node. Asking again does not help.
    #[error("refused: {0}")]
    Refused(String),
    /// It could not be reached or gave up (the metadata store or the manager is down).
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
}

/// Why a replica could not be taken out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DegradeRefusal {
    #[error("it is the last in-sync replica")]
    LastInSync,
    #[error("no in-sync replica left")]
    NoneLeft,
    #[error("{left} in-sync copies would remain, fewer than the minimum of {min} (wait for resyncs, or lower it with `volume set --min-copies`)")]
    BelowMinimum { left: usize, min: u32 },
    #[error("this writer has had {0} replicas; attach the volume again before moving more")]
    NoSlotLeft(usize),
    #[error(transparent)]
    Membership(#[from] MembershipError),
}

/// The control plane as the writer needs it: the owner of the metadata.
pub trait Membership: Send + Sync + std::fmt::Debug {
    /// Records a replica's state durably. Refused unless `epoch` is the volume's current epoch,
    /// and refused for taking out the last in-sync replica. With `InSync`, a nonzero
    /// `incarnation` is recorded too: the copy's identity while its history is known.
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>>;
    /// Where the volume's replicas are now (nodes may have restarted on new addresses).
    fn locate<'a>(&'a self, volume: &'a str) -> BoxFut<'a, Result<AttachInfo, MembershipError>>;
    /// The writer of `epoch` detached cleanly: nothing of it is in flight.
    fn detach<'a>(&'a self, volume: &'a str, epoch: u64)
        -> BoxFut<'a, Result<(), MembershipError>>;
}

/// One replica as the writer sees it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub node: u32,
    pub state: ReplicaState,
    pub resync: Option<ResyncProgress>,
}

/// Starts failure handling for a freshly attached volume: reconciles the replicas if the previous
/// writer died with writes in flight, then spawns the resync task.
pub(crate) async fn start(v: &Arc<Volume>) -> Result<(), VolumeError> {
    if v.info.reconcile {
        v.reconcile().await?;
    }
    // The replicas agree now: each starts this writer's activity log (one that cannot is taken
    // out, like one that fails its attach).
    let in_sync = v.set().in_sync();
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
    let weak = Arc::downgrade(v);
    tokio::spawn(async move {
        let mut last_error: Vec<Option<String>> = Vec::new();
        loop {
            let Some(interval) = weak.upgrade().map(|v| v.opts.resync_interval) else {
                return;
            };
            tokio::time::sleep(interval).await;
            let Some(v) = weak.upgrade() else { return };
            // A node that died while the volume was idle: its link is closed. Take it out now
            // rather than at the next write, so it is resynced (and shown) without delay.
            let dead: Vec<usize> = v
                .set()
                .in_sync()
                .into_iter()
                .filter(|&i| v.conn(&v.slots[i]).is_none_or(|c| c.is_closed()))
                .collect();
            if !dead.is_empty() && v.set().in_sync().len() > dead.len() {
                if let Err(e) = v.take_out_with(&dead, None, false).await {
                    tracing::warn!(volume = %v.info.name, "taking out replicas with closed links: {e}");
                }
            }
            last_error.resize(v.set().len(), None);
            for (i, last) in last_error.iter_mut().enumerate() {
                if !matches!(
                    v.set().state(i),
                    ReplicaState::Outdated | ReplicaState::Failed
                ) || v.is_held(v.node(i))
                {
                    continue;
                }
                match v.resync(i).await {
                    Ok(()) => *last = None,
                    Err(e) if e.stops_writer() => {
                        tracing::info!(volume = %v.info.name, "resync stops: {e}");
                        v.copies.stop();
                        return;
                    }
                    Err(e) => {
                        // The node is usually just not back yet: say so once, not every tick.
                        let msg = e.to_string();
                        if last.as_deref() != Some(&msg) {
                            tracing::info!(volume = %v.info.name, node = v.node(i), "replica not resynced yet: {msg}");
                            *last = Some(msg);
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

impl Volume {
    fn membership(&self) -> Result<&Arc<dyn Membership>, VolumeError> {
        self.membership
            .as_ref()
            .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))
    }

    /// Every replica with its current state and resync progress.
    /// Replicas moved off are left out.
    pub fn replica_views(&self) -> Vec<ReplicaView> {
        let progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let set = self.set();
        (0..set.len())
            .filter(|&i| set.state(i) != ReplicaState::Removed)
            .map(|i| ReplicaView {
                node: self.node(i),
                state: set.state(i),
                resync: progress.get(i).cloned().flatten(),
            })
            .collect()
    }

    /// The slot of the replica on `node`, unless it was moved off.
    fn slot_of(&self, node: u32) -> Option<usize> {
        let set = self.set();
        (0..set.len()).find(|&i| self.node(i) == node && set.state(i) != ReplicaState::Removed)
    }

    /// Adds a replica on `node` (the new copy of a move, already created there and recorded as
    /// failed in the metadata). It starts failed: the resync task copies the volume to it with
    /// a full compare, at most `rate` bytes per second, and records it in sync when done.
    pub async fn add_replica(&self, node: u32, rate: Option<u64>) -> Result<(), VolumeError> {
        let _g = self.membership_lock.lock().await;
        if let Some(i) = self.slot_of(node) {
            self.slots[i]
                .rate
                .store(rate.unwrap_or(0), Ordering::Relaxed);
            return Ok(());
        }
        // Lock order as in `replica_views`: progress, then the set.
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        let i = set.len();
        if i == self.slots.len() {
            return Err(VolumeError::Degrade {
                volume: self.info.name.clone(),
                node,
                why: DegradeRefusal::NoSlotLeft(i),
            });
        }
        let slot = &self.slots[i];
        slot.node.store(node, Ordering::Relaxed);
        slot.incarnation.store(0, Ordering::Release);
        slot.rate.store(rate.unwrap_or(0), Ordering::Relaxed);
        *slot.conn.write().unwrap_or_else(|e| e.into_inner()) = None;
        progress.resize(i + 1, None);
        set.push(ReplicaState::Failed);
        tracing::info!(volume = %self.info.name, node, "replica added; a full resync follows");
        Ok(())
    }

    /// Stops using the replica on `node` (the old copy of a move): with writes paused, it is
    /// recorded outdated (from now on it misses writes) and leaves the set for good. Refused
    /// for the last in-sync replica.
    pub async fn retire_replica(&self, node: u32) -> Result<(), VolumeError> {
        let m = self.membership()?;
        let _all = self.write_order.acquire(0, self.info.size).await;
        let _g = self.membership_lock.lock().await;
        let Some(i) = self.slot_of(node) else {
            return Ok(());
        };
        let degrade = |why: DegradeRefusal| VolumeError::Degrade {
            volume: self.info.name.clone(),
            node,
            why,
        };
        if self.set().state(i) == ReplicaState::InSync {
            if self.set().in_sync().len() < 2 {
                return Err(degrade(DegradeRefusal::LastInSync));
            }
            m.set_state(
                &self.info.name,
                self.info.epoch,
                node,
                ReplicaState::Outdated,
                0,
            )
            .await
            .map_err(|e| degrade(e.into()))?;
        }
        self.set
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .set_state(i, ReplicaState::Removed);
        self.set_conn(i, None);
        self.set_progress(i, None);
        // Survivors that track it for a resync can forget it.
        self.drop_records(i).await;
        tracing::info!(volume = %self.info.name, node, "replica retired");
        Ok(())
    }

    /// Planned take-out of the replica on `node` (its node is about to restart): with writes
    /// paused for a moment, it is recorded outdated and the survivors start their record of
    /// what it misses, so no write fails on it while it is away. The resync task leaves it
    /// alone for `hold` (or until [`Volume::release_node`]), so no resync starts on a node
    /// about to stop, then brings it back when it answers. `Ok(false)`: no in-sync replica
    /// there. Refused when fewer in-sync copies than the volume's minimum would remain.
    pub async fn take_out_node(&self, node: u32, hold: Duration) -> Result<bool, VolumeError> {
        self.membership()?;
        let _all = self.write_order.acquire(0, self.info.size).await;
        let Some(i) = self.slot_of(node) else {
            return Ok(false);
        };
        if self.set().state(i) != ReplicaState::InSync {
            return Ok(false);
        }
        let left = self.set().in_sync().len() - 1;
        if left < self.min_copies() as usize {
            return Err(VolumeError::Degrade {
                volume: self.info.name.clone(),
                node,
                why: DegradeRefusal::BelowMinimum {
                    left,
                    min: self.min_copies(),
                },
            });
        }
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node, Instant::now() + hold);
        if let Err(e) = self.take_out_with(&[i], None, false).await {
            self.release_node(node);
            return Err(e);
        }
        tracing::info!(volume = %self.info.name, node, "replica taken out for a planned restart");
        Ok(true)
    }

    /// Lets the resync task bring the replica on `node` back (its planned restart is over).
    pub fn release_node(&self, node: u32) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&node);
    }

    fn is_held(&self, node: u32) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match held.get(&node) {
            Some(&until) if Instant::now() < until => true,
            Some(_) => {
                held.remove(&node);
                false
            }
            None => false,
        }
    }

    /// Whether the replica on `node` is in sync in this writer's view.
    pub fn in_sync_on(&self, node: u32) -> bool {
        self.slot_of(node)
            .is_some_and(|i| self.set().state(i) == ReplicaState::InSync)
    }

    /// The last finished resync of the replica on `node`, if any.
    pub fn last_resync(&self, node: u32) -> Option<ResyncProgress> {
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&node)
            .cloned()
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

    fn dirty_peer(&self, i: usize, mode: u8) -> Bytes {
        Bytes::from(
            DirtyPeer {
                peer: self.node(i),
                incarnation: self.slots[i].incarnation.load(Ordering::Acquire),
                mode,
            }
            .encode(),
        )
    }

    /// The in-sync replicas other than `i` drop their dirty record for it (it is back in sync,
    /// or gone). A record left behind only costs memory until the next take-out replaces it.
    async fn drop_records(&self, i: usize) {
        let h = self.header(Op::DirtyTrack, 0, 0);
        let drop_record = self.dirty_peer(i, DIRTY_DROP);
        let survivors = self.set().in_sync();
        for s in survivors.into_iter().filter(|&s| s != i) {
            if let Err(e) = self.to_all(&[s], h, drop_record.clone()).await {
                tracing::warn!(volume = %self.info.name, node = self.node(s), peer = self.node(i), "could not drop a dirty record: {e}");
            }
        }
    }

    /// Sends one request to each of `targets`; fails if any fails.
    pub(crate) async fn to_all(
        &self,
        targets: &[usize],
        h: Header,
        payload: Bytes,
    ) -> Result<(), VolumeError> {
        let replies = join_all(
            targets
                .iter()
                .map(|&i| self.call(i, h, payload.clone()))
                .collect(),
        )
        .await;
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
        let degrade = |node: u32, why: DegradeRefusal| VolumeError::Degrade {
            volume: self.info.name.clone(),
            node,
            why,
        };
        // The procedure is `replication::TakeOut`; this carries its steps out.
        let states = self.set().states().to_vec();
        let mut plan = TakeOut::new(&states, failed, lost_history);
        let (offset, length) = range.unwrap_or((0, 0));
        let out = loop {
            match plan.step() {
                TakeOutStep::Record(records) => {
                    for (i, to) in records {
                        m.set_state(&self.info.name, self.info.epoch, self.node(i), to, 0)
                            .await
                            .map_err(|e| degrade(self.node(i), e.into()))?;
                        tracing::warn!(volume = %self.info.name, node = self.node(i), state = %to, "replica taken out; writes continue on the others");
                        plan.recorded(i);
                    }
                }
                TakeOutStep::Mark(marks) => {
                    let h = self.header(Op::DirtyMark, offset, length);
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
                TakeOutStep::NoneLeft => {
                    return Err(degrade(self.node(failed[0]), DegradeRefusal::NoneLeft));
                }
                TakeOutStep::Apply(out) => break out,
            }
        };
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        for &(i, to) in &out {
            set.set_state(i, to);
            if to == ReplicaState::Failed {
                self.slots[i].incarnation.store(0, Ordering::Release);
            }
        }
        drop(set);
        for &(i, _) in &out {
            self.set_conn(i, None);
        }
        Ok(())
    }

    /// Attaches a returning replica: its connection and incarnation.
    async fn reattach(&self, i: usize) -> Result<(Arc<dyn Connection>, u64), VolumeError> {
        let m = self.membership()?;
        let node = self.node(i);
        let info = m
            .locate(&self.info.name)
            .await
            .map_err(|e| VolumeError::Degrade {
                volume: self.info.name.clone(),
                node,
                why: e.into(),
            })?;
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
        let conn = tokio::time::timeout(
            self.opts.replica_timeout,
            connect_replica(target, &self.opts),
        )
        .await
        .map_err(|_| VolumeError::Timeout {
            node,
            timeout: self.opts.replica_timeout,
        })??;
        let h = self.header(Op::Attach, 0, 0);
        let f = tokio::time::timeout(self.opts.replica_timeout, conn.call(h, Bytes::new()))
            .await
            .map_err(|_| VolumeError::Timeout {
                node,
                timeout: self.opts.replica_timeout,
            })?
            .map_err(|source| VolumeError::Transport { node, source })?;
        let f = self.expect_ok(i, f)?;
        Ok((conn, f.header.length))
    }

    /// The union of the survivors' dirty regions for replica `i`, or `None` if no survivor
    /// has a record that provably covers everything it missed.
    async fn dirty_regions(
        &self,
        i: usize,
        survivors: &[usize],
    ) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let incarnation = self.slots[i].incarnation.load(Ordering::Acquire);
        let mut ranges = Vec::new();
        let mut usable = 0;
        for &s in survivors {
            let mut trusted = true;
            let mut mine = Vec::new();
            let mut off = 0;
            while off < self.info.size && trusted {
                let len = QUERY_WINDOW.min(self.info.size - off);
                let h = self.header(Op::DirtyQuery, off, len);
                let f = self
                    .call(s, h, Bytes::from(encode_peer(self.node(i))))
                    .await?;
                let f = self.expect_ok(s, f)?;
                if f.header.epoch != self.info.epoch || f.header.length != incarnation {
                    trusted = false;
                    break;
                }
                let ext = decode_extents(&f.payload).map_err(|e| VolumeError::Protocol {
                    node: self.node(s),
                    what: e.to_string(),
                })?;
                mine.extend(data_ranges(&ext, off));
                off += len;
            }
            if trusted {
                usable += 1;
                ranges.extend(mine);
            }
        }
        Ok((usable > 0).then(|| union_chunks(ranges)))
    }

    fn set_progress(&self, i: usize, p: Option<ResyncProgress>) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if progress.len() <= i {
            progress.resize(i + 1, None);
        }
        progress[i] = p;
    }

    /// Brings replica `i` back (see the module docs).
    pub(crate) async fn resync(&self, i: usize) -> Result<(), VolumeError> {
        let (conn, incarnation) = self.reattach(i).await?;
        let node = self.node(i);
        let started = Instant::now();
        // 1. Pause writes, collect the survivors' regions, and let the replica take new writes.
        let (full, chunks, survivors) = {
            let _all = self.write_order.acquire(0, self.info.size).await;
            let _g = self.membership_lock.lock().await;
            let state = self.set().state(i);
            if !matches!(state, ReplicaState::Outdated | ReplicaState::Failed) {
                return Ok(());
            }
            let survivors = self.set().in_sync();
            if survivors.is_empty() {
                return Err(VolumeError::NoReplicas(self.info.name.clone()));
            }
            let known = self.slots[i].incarnation.load(Ordering::Acquire);
            let regions = if trireme_replication::incremental(state, known, incarnation) {
                self.dirty_regions(i, &survivors).await?
            } else {
                None
            };
            self.set_conn(i, Some(conn));
            // Its log starts now, before it takes any write of this writer.
            if let Err(e) = self.start_activity(&[i]).await {
                self.set_conn(i, None);
                return Err(e);
            }
            self.set
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .set_state(i, ReplicaState::Resyncing);
            match regions {
                Some(r) => (false, r, survivors),
                None => (true, all_chunks(self.info.size), survivors),
            }
        };
        let mut plan = ResyncPlan::new(chunks, full);
        let total = plan.progress().total_bytes;
        tracing::info!(volume = %self.info.name, node, full, bytes = total, "resync started");
        self.set_progress(i, Some(plan.progress().clone()));
        let result = self.copy_chunks(i, &mut plan, &survivors, started).await;
        let mut progress = plan.progress().clone();
        self.set_progress(i, None);
        if let Err(e) = result {
            // A failure of the replica itself already took it out again (regions kept).
            if self.set().state(i) == ReplicaState::Resyncing {
                let _ = self.take_out_with(&[i], None, false).await;
            }
            return Err(e);
        }
        // 3. Pause writes again and make it in sync: on record first, then for reads.
        let _all = self.write_order.acquire(0, self.info.size).await;
        let _g = self.membership_lock.lock().await;
        if self.set().state(i) != ReplicaState::Resyncing {
            return Err(VolumeError::NoReplicas(self.info.name.clone()));
        }
        let m = self.membership()?;
        m.set_state(
            &self.info.name,
            self.info.epoch,
            node,
            ReplicaState::InSync,
            incarnation,
        )
        .await
        .map_err(|e| VolumeError::Degrade {
            volume: self.info.name.clone(),
            node,
            why: e.into(),
        })?;
        self.slots[i]
            .incarnation
            .store(incarnation, Ordering::Release);
        progress.elapsed_ms = started.elapsed().as_millis() as u64;
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node, progress.clone());
        self.set
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .set_state(i, ReplicaState::InSync);
        self.copies.wake();
        self.drop_records(i).await;
        tracing::info!(
            volume = %self.info.name,
            node,
            full,
            copied_bytes = progress.copied_bytes,
            scanned_bytes = progress.done_bytes,
            ms = started.elapsed().as_millis() as u64,
            "resync done; replica in sync"
        );
        Ok(())
    }

    /// Carries out `plan` for replica `i`: copies (or, for a full resync, compares then copies)
    /// its regions a few at a time, clears copied regions on the survivors in batches (a clear
    /// that is lost only means a region is copied again after an interruption), and keeps to
    /// the resync rate.
    async fn copy_chunks(
        &self,
        i: usize,
        plan: &mut ResyncPlan,
        survivors: &[usize],
        started: Instant,
    ) -> Result<(), VolumeError> {
        let peer = Bytes::from(encode_peer(self.node(i)));
        let full = plan.progress().full;
        loop {
            let slot_rate = self.slots[i].rate.load(Ordering::Relaxed);
            let rate = (slot_rate > 0)
                .then_some(slot_rate)
                .or(self.opts.resync_rate);
            match plan.next(started.elapsed(), rate) {
                ResyncStep::Copy(group) => {
                    if self.set().state(i) != ReplicaState::Resyncing {
                        return Err(VolumeError::NoReplicas(self.info.name.clone()));
                    }
                    let copies = join_all(
                        group
                            .iter()
                            .map(|&(off, len)| {
                                Box::pin(async move {
                                    let _r = self.write_order.acquire(off, off + len).await;
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
                    plan.copied(copied);
                    let mut shown = plan.progress().clone();
                    shown.elapsed_ms = started.elapsed().as_millis() as u64;
                    self.set_progress(i, Some(shown));
                }
                ResyncStep::Clear(regions) => {
                    // Under the membership lock, and only while the replica is still being
                    // resynced: a write it failed meanwhile has marked its range again, and
                    // that mark must not be cleared.
                    let _g = self.membership_lock.lock().await;
                    if self.set().state(i) != ReplicaState::Resyncing {
                        return Err(VolumeError::NoReplicas(self.info.name.clone()));
                    }
                    let live: Vec<usize> = survivors
                        .iter()
                        .copied()
                        .filter(|&s| self.set().state(s) == ReplicaState::InSync)
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
                ResyncStep::Done => return Ok(()),
            }
        }
    }

    /// Copies one range from an in-sync replica to replica `i`, the caller holding the range.
    /// With `compare`, skips it when the checksums already match. Returns the bytes copied.
    async fn copy_one(
        &self,
        i: usize,
        off: u64,
        len: u64,
        compare: bool,
    ) -> Result<u64, VolumeError> {
        // A source whose copy fails its block checksums is passed over for the next in-sync
        // replica, and repaired from the one that serves.
        let sources = self
            .set()
            .read_order(self.spread.fetch_add(1, Ordering::Relaxed));
        let mut bad = Vec::new();
        let mut last = VolumeError::NoReplicas(self.info.name.clone());
        let mut copy = None;
        for src in sources {
            if compare {
                let mut sums = self.checksums(&[src, i], off, len).await.into_iter();
                let (a, b) = (sums.next().expect("two"), sums.next().expect("two"));
                let a = match a {
                    Ok(c) => c,
                    Err(e) if e.is_bad_copy() => {
                        bad.push(src);
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
                    bad.push(src);
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        let Some((good, data)) = copy else {
            return Err(last);
        };
        if !bad.is_empty() {
            self.repair_held(&bad, good, off, len).await;
        }
        let Some(data) = data else { return Ok(0) };
        let h = if data.iter().all(|&b| b == 0) {
            let mut h = self.header(Op::WriteZeroes, off, len);
            h.flags |= FLAG_MAY_TRIM;
            (h, Bytes::new())
        } else {
            (self.header(Op::Write, off, len), data)
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

    /// Rewrites the blocks around `[off, off+len)` on the `bad` replicas (their copy failed its
    /// block checksums) from replica `good`, under the range's write lock so no write is
    /// undone. A replica the rewrite fails on is taken out.
    pub(crate) async fn repair(&self, bad: &[usize], good: usize, off: u64, len: u64) {
        let (a, e) = self.block_span(off, len);
        let _r = self.write_order.acquire(a, e).await;
        self.repair_held(bad, good, off, len).await
    }

    /// Whole 4 KiB blocks around `[off, off+len)`.
    fn block_span(&self, off: u64, len: u64) -> (u64, u64) {
        let a = off / 4096 * 4096;
        let e = (off + len).div_ceil(4096) * 4096;
        (a, e.min(self.info.size))
    }

    /// [`Volume::repair`] for a caller that holds the blocks' range already.
    async fn repair_held(&self, bad: &[usize], good: usize, off: u64, len: u64) {
        let (a, e) = self.block_span(off, len);
        self.activity.touch(a, e - a);
        let data = match self.read_from(good, a, e - a).await {
            Ok(d) => d,
            Err(err) => {
                tracing::warn!(volume = %self.info.name, "cannot repair a bad copy: {err}");
                return;
            }
        };
        for &b in bad {
            if self.set().state(b) != ReplicaState::InSync {
                continue;
            }
            let h = self.header(Op::Write, a, e - a);
            match self
                .call(b, h, data.clone())
                .await
                .and_then(|f| self.expect_ok(b, f))
            {
                Ok(_) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(b), offset = a, bytes = e - a, from = self.node(good), "repaired a bad copy from a good one")
                }
                Err(err) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(b), "repairing a bad copy failed: {err}");
                    if self.membership.is_some() {
                        if let Err(e2) = self.take_out_with(&[b], Some((a, e - a)), false).await {
                            tracing::warn!(volume = %self.info.name, "{e2}");
                        }
                    }
                }
            }
        }
    }

    /// `[off, off+len)` as replica `src` holds it.
    pub(crate) async fn read_from(
        &self,
        src: usize,
        off: u64,
        len: u64,
    ) -> Result<Bytes, VolumeError> {
        let h = self.header(Op::Read, off, len);
        Ok(self
            .expect_ok(src, self.call(src, h, Bytes::new()).await?)?
            .payload)
    }

    /// The resyncing replica failed: back to outdated, with the range kept dirty.
    async fn replica_failed(&self, i: usize, off: u64, len: u64, e: VolumeError) -> VolumeError {
        if e.stops_writer() {
            return e;
        }
        if let Err(e2) = self.take_out_with(&[i], Some((off, len)), false).await {
            tracing::warn!(volume = %self.info.name, "taking a failed resync target out: {e2}");
        }
        e
    }

    /// The union of the in-sync replicas' activity-log extents, or `None` if one of them has no
    /// log from before this attach (its node restarted): then nothing bounds where the dead
    /// writer's writes went. A replica that cannot answer is taken out for a full resync.
    async fn activity_ranges(&self) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let mut ranges = Vec::new();
        let in_sync = self.set().in_sync();
        for t in in_sync {
            let mut off = 0;
            while off < self.info.size {
                let len = ACTIVITY_WINDOW.min(self.info.size - off);
                let h = self.header(Op::ActivityQuery, off, len);
                let f = match self
                    .call(t, h, Bytes::new())
                    .await
                    .and_then(|f| self.expect_ok(t, f))
                {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                        self.take_out_with(&[t], None, true).await?;
                        break;
                    }
                };
                if f.header.epoch == 0 {
                    tracing::info!(volume = %self.info.name, node = self.node(t), "replica has no activity log (its node restarted): reconciling the whole volume");
                    return Ok(None);
                }
                let ext = decode_extents(&f.payload).map_err(|e| VolumeError::Protocol {
                    node: self.node(t),
                    what: e.to_string(),
                })?;
                ranges.extend(data_ranges(&ext, off));
                off += len;
            }
        }
        Ok(Some(union_chunks(ranges)))
    }

    /// After a writer died with writes in flight, replicas may differ where those writes went:
    /// before any new I/O, every extent the replicas' activity logs show (the whole volume if a
    /// log is missing) is compared across the in-sync replicas and copied from one of them where
    /// they differ. Only checksums cross the network for ranges that agree.
    async fn reconcile(&self) -> Result<(), VolumeError> {
        if self.set().in_sync().len() < 2 {
            return Ok(());
        }
        let started = Instant::now();
        let (whole, chunks) = match self.activity_ranges().await? {
            Some(r) => (false, r),
            None => (true, all_chunks(self.info.size)),
        };
        if self.set().in_sync().len() < 2 {
            return Ok(());
        }
        let mut copied = 0;
        let mut compared = 0;
        let mut unreadable = Vec::new();
        for &(off, len) in &chunks {
            let targets = self.set().in_sync();
            let sums = self.checksums(&targets, off, len).await;
            // The source is the first copy (in the set's order) whose region passes its block
            // checksums; one that fails them is rewritten from it, never copied from.
            let mut good = Vec::new();
            let mut bad = Vec::new();
            for (k, r) in sums.into_iter().enumerate() {
                let t = targets[k];
                match r {
                    Ok(c) => good.push((t, c)),
                    Err(e) if e.is_bad_copy() => {
                        tracing::warn!(volume = %self.info.name, node = self.node(t), off, len, "reconcile: this copy fails its block checksums; rewriting it from a good one");
                        bad.push(t);
                    }
                    Err(e) if e.stops_writer() => return Err(e),
                    Err(e) => {
                        tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                        self.take_out_with(&[t], None, true).await?;
                    }
                }
            }
            let Some(&(src, want)) = good.first() else {
                if !bad.is_empty() {
                    tracing::error!(volume = %self.info.name, off, len, "reconcile: no copy of this region passes its block checksums; nothing copied (scrub or restore it)");
                    unreadable.push((off, len));
                }
                continue;
            };
            let to_copy: Vec<usize> = good
                .iter()
                .filter(|(_, c)| *c != want)
                .map(|(t, _)| *t)
                .chain(bad)
                .collect();
            if !to_copy.is_empty() {
                let data = self.read_from(src, off, len).await?;
                let h = self.header(Op::Write, off, len);
                for t in to_copy {
                    if let Err(e) = self.to_all(&[t], h, data.clone()).await {
                        self.take_out_with(&[t], None, true).await?;
                        tracing::warn!(volume = %self.info.name, node = self.node(t), "reconcile: {e}");
                    }
                    copied += len;
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
