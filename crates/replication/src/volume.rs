//! One attached volume's replication state, as the writer holds it: a plain state machine.
//!
//! [`VolumeCore`] owns what the writer knows and decides about its replicas: their states and
//! histories (incarnations), the write order of overlapping ranges, the minimum of in-sync
//! copies writes go on with, the rotation of reads, resyncs in progress and finished, and the
//! replicas held out for a planned restart. The writer's runtime (the volume client) keeps one
//! behind a plain mutex, never held across an await: it asks the core what to do, does it over
//! the transports and the metadata store, and reports back. Procedures that span several
//! round trips have plans of their own, which the core hands out and takes the results of:
//! [`TakeOut`], [`ResyncPlan`], [`ReadPlan`](crate::ReadPlan); what to do with a region replicas
//! hold differently is [`settle`](crate::settle) and [`majority`](crate::majority).
//!
//! Nothing here awaits, locks, reads a clock or draws a random number: time comes in as an
//! argument (time since attach, from the runtime's clock, virtual in the simulator).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{
    default_min_copies, incremental, Layout, LayoutError, RangeOrder, ReadPlan, ReplicaSet,
    ReplicaState, ResizePlan, ResyncProgress, TakeOut, Ticket,
};

/// Why the core refuses a change of membership.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it is the last in-sync replica")]
    LastInSync,
    #[error("no in-sync replica left")]
    NoneLeft,
    #[error("{left} in-sync copies would remain, fewer than the minimum of {min} (wait for resyncs, or lower it with `volume set --min-copies`)")]
    BelowMinimum { left: usize, min: u32 },
    #[error("this writer has had {0} replicas; attach the volume again before moving more")]
    NoSlotLeft(usize),
    #[error("no other in-sync copy answers with its history; it is kept")]
    NoOtherAnswers,
    #[error("a parity region's switch is being recorded; the resync begins once it is")]
    Switching,
    #[error("replacing a copy in its place is for parity volumes; a mirror's copy is added beside the others")]
    NotParity,
    #[error("node {0} holds a copy of this volume already")]
    HoldsACopy(u32),
    #[error("node {0} holds no place in this volume's stripes")]
    NoPlace(u32),
    #[error("the copy on node {0} takes writes: take it out first")]
    TakesWrites(u32),
    #[error("the copy on node {0} is being moved in already: one parity copy moves at a time")]
    Following(u32),
    #[error("the copy on node {0} follows no copy's place")]
    NotFollowing(u32),
    #[error("the copy on node {0} is not whole yet")]
    NotCaughtUp(u32),
    #[error("a copy is being moved onto node {0}: a parity scrub's repairs would miss it, so it waits until the copy has taken its place")]
    ScrubWhileMoving(u32),
}

/// Whether writes may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copies {
    /// At least the minimum of copies is in sync.
    Enough,
    /// Too few: writes wait (the first check that finds this suspends them).
    Short { have: usize, need: u32 },
    /// The writer may not go on (fenced or refused): waiting writes fail.
    Stopped,
}

/// A change of the suspended state, reported once so the runtime can say so once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopiesChange {
    Suspended,
    Resumed,
}

/// What a returning replica's resync starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResyncStart {
    /// It is not out (another task brought it back, or it was moved off): nothing to do.
    NotNeeded,
    /// Bring it back from `survivors`: ask them what it missed if `incremental`, else
    /// compare every region.
    From {
        survivors: Vec<usize>,
        incremental: bool,
    },
}

/// What the writer knows about one replica besides its state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Record {
    pub(crate) node: u32,
    /// The incarnation of the copy that was last in sync (0: unknown). Survivors track what
    /// this copy misses; a replica that comes back as another incarnation needs a full resync.
    pub(crate) incarnation: u64,
    /// This replica's resync copy rate in bytes per second (a move sets it); 0: the volume's.
    pub(crate) rate: u64,
    pub(crate) resync: Option<ResyncProgress>,
    /// A parity copy's follower: the node whose place it follows (`follow.rs`). It takes
    /// every write that place takes and serves nothing until it takes the place.
    pub(crate) follows: Option<u32>,
    /// A follower whose whole resync is done, as the incarnation it had then: it stays
    /// resyncing (taking writes, counted nowhere) until it takes the place.
    pub(crate) caught_up: Option<u64>,
}

/// The replication state of one attached volume (see the module docs).
#[derive(Debug, Clone)]
pub struct VolumeCore {
    pub(crate) managed: bool,
    max_replicas: usize,
    pub(crate) set: ReplicaSet,
    pub(crate) records: Vec<Record>,
    pub(crate) order: RangeOrder,
    /// A mirror's: in-sync copies. A parity volume's: in-sync mirrors of the region a write
    /// lands in (its nodes in sync must be K besides; see [`VolumeCore::enough_for`]).
    pub(crate) min_copies: u32,
    /// The minimum asked at attach (0: the layout's default), for a parity core's geometry.
    pub(crate) min_asked: u32,
    suspended: bool,
    stopped: bool,
    spread: usize,
    pub(crate) finished: BTreeMap<u32, ResyncProgress>,
    /// Nodes taken out for a planned restart, until when (time since attach).
    held: BTreeMap<u32, Duration>,
    /// How the volume's bytes are kept: which copies a request goes to follows from it.
    pub(crate) layout: Layout,
    /// A parity volume's regions (`routes.rs`).
    pub(crate) regions: Option<crate::RegionMap>,
}

impl VolumeCore {
    /// A core over `replicas` (node, state at attach). `managed`: a control plane records
    /// take-outs (without one a failure fails the request). `min_copies` 0 is the default rule.
    /// At most `max_replicas` replicas ever (indices are never reused).
    pub fn new(
        replicas: &[(u32, ReplicaState)],
        min_copies: u32,
        managed: bool,
        max_replicas: usize,
    ) -> VolumeCore {
        let min_copies_arg = min_copies;
        let min_copies = match min_copies {
            0 => default_min_copies(replicas.len()),
            n => n,
        };
        VolumeCore {
            managed,
            max_replicas,
            set: ReplicaSet::new(replicas.iter().map(|r| r.1).collect(), None),
            records: replicas
                .iter()
                .map(|r| Record {
                    node: r.0,
                    ..Record::default()
                })
                .collect(),
            order: RangeOrder::new(),
            min_asked: min_copies_arg,
            min_copies,
            suspended: false,
            stopped: false,
            spread: 0,
            finished: BTreeMap::new(),
            held: BTreeMap::new(),
            layout: Layout::Mirror,
            regions: None,
        }
    }

    /// The core of a volume kept as `layout`, if this build serves it (a mirror; a layout of
    /// a newer trireme is refused, never written as a mirror). A parity volume's core is
    /// made with its geometry ([`VolumeCore::with_stripes`]), never here.
    pub fn with_layout(mut self, layout: Layout) -> Result<VolumeCore, LayoutError> {
        layout.served()?;
        if let Layout::Parity(_) = layout {
            return Err(LayoutError::NotBuilt("a parity core without its geometry"));
        }
        self.layout = layout;
        Ok(self)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn set(&self) -> &ReplicaSet {
        &self.set
    }

    pub fn node(&self, i: usize) -> u32 {
        self.records[i].node
    }

    /// The node whose place in the stripes replica `i` fills: its own, or for a follower the
    /// node it follows. Requests to a place go to both.
    pub fn place_node(&self, i: usize) -> u32 {
        self.records[i].follows.unwrap_or(self.records[i].node)
    }

    /// The replica on `node`, unless it was moved off.
    pub fn slot_of(&self, node: u32) -> Option<usize> {
        (0..self.set.len())
            .find(|&i| self.records[i].node == node && self.set.state(i) != ReplicaState::Removed)
    }

    /// Whether every copy is in sync. Copies moved off (a drained mirror's, a replaced parity
    /// copy's old slot) stay in the set as removed and take no part: counted, they kept a
    /// writer from encoding and rolling back until it attached again.
    pub fn every_copy_in_sync(&self) -> bool {
        self.set
            .states()
            .iter()
            .all(|s| matches!(s, ReplicaState::InSync | ReplicaState::Removed))
    }

    pub fn incarnation(&self, i: usize) -> u64 {
        self.records[i].incarnation
    }

    /// Every replica out of sync now comes back whole: the in-sync copies' records of what
    /// it missed are no longer trusted (one of them lost its history and stays in sync, so
    /// its record may have lost marks with the rest).
    pub fn forget_out_histories(&mut self) {
        for i in 0..self.set.len() {
            if !matches!(
                self.set.state(i),
                ReplicaState::InSync | ReplicaState::Removed
            ) {
                self.records[i].incarnation = 0;
            }
        }
    }

    /// Replica `i` answered an attach as incarnation `incarnation`.
    pub fn attached(&mut self, i: usize, incarnation: u64) {
        self.records[i].incarnation = incarnation;
    }

    /// Replica `i`'s resync rate in bytes per second, if one was set for it.
    pub fn rate(&self, i: usize) -> Option<u64> {
        Some(self.records[i].rate).filter(|&r| r > 0)
    }

    // ---- the minimum of copies --------------------------------------------------------------

    pub fn min_copies(&self) -> u32 {
        self.min_copies
    }

    /// Sets the minimum (at least 1; for parity, at most a region's M+1 mirrors); true if it
    /// changed.
    pub fn set_min_copies(&mut self, n: u32) -> bool {
        let most = match &self.regions {
            Some(map) => map.stripes().parity as u32 + 1,
            None => u32::MAX,
        };
        let n = n.clamp(1, most);
        std::mem::replace(&mut self.min_copies, n) != n
    }

    pub fn suspended(&self) -> bool {
        self.suspended
    }

    /// True if writes may go on now (the write path's quick check). Without a control plane
    /// no copy is ever taken out, so always. A parity volume: K nodes in sync (below that
    /// its stripes cannot be read); each write asks [`VolumeCore::enough_for`] besides.
    pub fn enough(&self) -> bool {
        !self.managed || self.set.in_sync_count() >= self.least_in_sync()
    }

    /// True if `request` may go on now: [`VolumeCore::enough`], and for a parity volume's
    /// data, its region's in-sync mirrors at least the minimum.
    pub fn enough_for(&self, request: crate::Mirrored) -> bool {
        let (have, need) = self.copies_for(request);
        !self.managed || have >= need
    }

    /// The in-sync copies that count for `request`, and the least it needs.
    fn copies_for(&self, request: crate::Mirrored) -> (usize, usize) {
        let nodes = (self.set.in_sync_count(), self.least_in_sync());
        let (Some(map), crate::Mirrored::Data { offset, .. }) = (&self.regions, request) else {
            return nodes;
        };
        if nodes.0 < nodes.1 {
            return nodes;
        }
        // Per write: counted over the set, with no list built.
        let s = map.stripes();
        let region = s.region_of(offset / 4096);
        let have = (0..self.set.len())
            .filter(|&i| {
                self.set.state(i) == ReplicaState::InSync && s.mirrors(region, self.node(i))
            })
            .count();
        (have, self.min_copies as usize)
    }

    /// The least in-sync copies any write needs: the minimum for a mirror; K for parity.
    fn least_in_sync(&self) -> usize {
        match &self.regions {
            Some(map) => map.stripes().data,
            None => self.min_copies as usize,
        }
    }

    /// Whether writes may go on, and whether that changed since the last check (`request`:
    /// the write that asks, for a parity volume's rule per region; `None`: any).
    pub fn check_copies(&mut self) -> (Copies, Option<CopiesChange>) {
        self.check_copies_for(crate::Mirrored::Flush)
    }

    /// [`VolumeCore::check_copies`] for `request`.
    pub fn check_copies_for(&mut self, request: crate::Mirrored) -> (Copies, Option<CopiesChange>) {
        if self.stopped {
            return (Copies::Stopped, None);
        }
        let (have, need) = self.copies_for(request);
        if !self.managed || have >= need {
            let change =
                std::mem::replace(&mut self.suspended, false).then_some(CopiesChange::Resumed);
            return (Copies::Enough, change);
        }
        let change =
            (!std::mem::replace(&mut self.suspended, true)).then_some(CopiesChange::Suspended);
        (
            Copies::Short {
                have,
                need: need as u32,
            },
            change,
        )
    }

    /// The writer may not go on (fenced, or refused by a node).
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// The writer was stopped (fenced or refused).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    // ---- the write order (taken and given up through `step`) --------------------------------

    /// Whether `place` may hold its range now (a waiter that parks after the release that
    /// granted it finds out here).
    pub fn may_hold(&self, place: Ticket) -> bool {
        self.order.may_hold(place)
    }

    /// Places in the write order, held or waiting.
    pub fn places(&self) -> usize {
        self.order.len()
    }

    // ---- requests ---------------------------------------------------------------------------

    /// Replicas a mirrored request goes to.
    pub fn write_targets(&self) -> Vec<usize> {
        self.set.write_targets()
    }

    /// The replicas the request holding `place` goes to.
    pub fn place_targets(&self, place: Ticket) -> Vec<usize> {
        self.targets_of(self.order.range(place))
    }

    /// The plan of one resync copy's choice of source: each starts at the next copy, so
    /// copies spread over every source.
    pub fn read_plan(&mut self) -> ReadPlan {
        self.spread = self.spread.wrapping_add(1);
        ReadPlan::new(self.spread)
    }

    /// The plan of one foreground read. `overlapping`: another read is in flight. Reads
    /// that come one at a time stay on the copy that served the last one; reads that overlap
    /// rotate over the in-sync copies, so a queue of them uses every copy. A copy that keeps
    /// getting requests finds each by a memory read while it looks for work, where one that
    /// gets every third has often gone to sleep and needs waking (4K reads at queue depth 1
    /// through NBD: p50 0.87-0.94x; `bench/results/2026-11-24-issue18-reads.txt`).
    pub fn read_begin(&mut self, overlapping: bool) -> ReadPlan {
        if overlapping {
            self.spread = self.spread.wrapping_add(1);
        }
        ReadPlan::new(self.spread)
    }

    /// A read's first choice failed: the reads after it start at another copy rather than
    /// waiting on that one again.
    pub fn read_moved(&mut self) {
        self.spread = self.spread.wrapping_add(1);
    }

    // ---- taking out and bringing back -------------------------------------------------------

    /// The take-out of `failed`; see [`TakeOut`]. Its `Apply` goes to [`VolumeCore::apply`].
    /// A parity volume keeps K in sync: fewer could rebuild no chunk, so no copy taken out
    /// could ever come back.
    pub fn take_out(&self, failed: &[usize], lost_history: bool) -> TakeOut {
        // A replica retired meanwhile is out for good already.
        let failed: Vec<usize> = failed
            .iter()
            .copied()
            .filter(|&i| self.set.state(i) != ReplicaState::Removed)
            .collect();
        let floor = self.regions.as_ref().map_or(1, |m| m.stripes().data);
        TakeOut::new(self.set.states(), &failed, lost_history).with_floor(floor)
    }

    /// The end of a take-out: the replicas take their new states; one whose history is lost
    /// forgets its incarnation (it comes back through a full resync).
    pub fn apply(&mut self, out: &[(usize, ReplicaState)]) {
        for &(i, to) in out {
            if self.set.state(i) == ReplicaState::Removed {
                continue;
            }
            self.set.set_state(i, to);
            if to == ReplicaState::Failed {
                self.records[i].incarnation = 0;
            }
        }
    }

    /// Replicas with their links found closed that can be taken out now (not the last
    /// in-sync ones): an idle volume notices a dead node without waiting for a write.
    pub fn closed_to_take_out(&self, closed: &[usize]) -> Vec<usize> {
        let in_sync = self.set.in_sync();
        let dead: Vec<usize> = closed
            .iter()
            .copied()
            .filter(|i| in_sync.contains(i))
            .collect();
        if in_sync.len() > dead.len() {
            dead
        } else {
            Vec::new()
        }
    }

    /// May the in-sync replica on `node` be taken out for a planned restart? `Ok(None)`: there
    /// is no in-sync replica there.
    pub fn planned_take_out(&self, node: u32) -> Result<Option<usize>, Refusal> {
        let Some(i) = self
            .slot_of(node)
            .filter(|&i| self.set.state(i) == ReplicaState::InSync)
        else {
            return Ok(None);
        };
        let left = self.set.in_sync_count() - 1;
        if left < self.least_in_sync() {
            return Err(Refusal::BelowMinimum {
                left,
                min: self.least_in_sync() as u32,
            });
        }
        // A parity volume: each region the node mirrors keeps its minimum of mirrors.
        if let Some(map) = &self.regions {
            let s = map.stripes();
            let in_sync = |n: u32| n != node && self.in_sync_node(n);
            let regions = map.regions().len() as u64;
            let short = (0..regions.min(s.width() as u64))
                .filter(|&r| s.mirrors(r, node))
                .map(|r| s.mirrors_of(r).into_iter().filter(|&n| in_sync(n)).count())
                .find(|&left| left < self.min_copies as usize);
            if let Some(left) = short {
                return Err(Refusal::BelowMinimum {
                    left,
                    min: self.min_copies,
                });
            }
        }
        Ok(Some(i))
    }

    /// Holds the replica on `node` out of resyncs until `until` (time since attach).
    pub fn hold(&mut self, node: u32, until: Duration) {
        self.held.insert(node, until);
    }

    pub fn release_hold(&mut self, node: u32) {
        self.held.remove(&node);
    }

    /// Whether the replica on `node` is held out of resyncs at `now`.
    pub fn is_held(&mut self, node: u32, now: Duration) -> bool {
        match self.held.get(&node) {
            Some(&until) if now < until => true,
            Some(_) => {
                self.held.remove(&node);
                false
            }
            None => false,
        }
    }

    /// Replicas the resync task should try to bring back at `now`: out, and not held.
    pub fn to_resync(&mut self, now: Duration) -> Vec<usize> {
        let out: Vec<usize> = (0..self.set.len())
            .filter(|&i| {
                matches!(
                    self.set.state(i),
                    ReplicaState::Outdated | ReplicaState::Failed
                )
            })
            .collect();
        out.into_iter()
            .filter(|&i| !self.is_held(self.records[i].node, now))
            .collect()
    }

    /// Replica `i` answered again as incarnation `returned`: how its resync starts.
    pub fn resync_start(&self, i: usize, returned: u64) -> Result<ResyncStart, Refusal> {
        let state = self.set.state(i);
        if !matches!(state, ReplicaState::Outdated | ReplicaState::Failed) {
            return Ok(ResyncStart::NotNeeded);
        }
        let survivors = self.set.in_sync();
        if survivors.is_empty() {
            return Err(Refusal::NoneLeft);
        }
        // Which chunks a full resync rebuilds follows from the regions: not while one changes.
        if self.regions.as_ref().is_some_and(|m| m.switching()) {
            return Err(Refusal::Switching);
        }
        Ok(ResyncStart::From {
            survivors,
            incremental: incremental(state, self.records[i].incarnation, returned),
        })
    }

    /// Replica `i` takes every new write from now on, and serves no reads until it is done.
    pub fn resync_begun(&mut self, i: usize, progress: ResyncProgress) {
        if self.set.state(i) == ReplicaState::Removed {
            return;
        }
        self.set.set_state(i, ReplicaState::Resyncing);
        self.records[i].resync = Some(progress);
        // A follower filling again (it went out after it was whole) is whole only once
        // this resync is done.
        self.records[i].caught_up = None;
        if let Some(map) = &mut self.regions {
            map.abandon_unswitched();
        }
    }

    pub fn resync_progress(&mut self, i: usize, progress: Option<ResyncProgress>) {
        self.records[i].resync = progress;
    }

    /// Whether replica `i` is still being resynced (a failure takes it out again midway).
    pub fn resyncing(&self, i: usize) -> bool {
        self.set.state(i) == ReplicaState::Resyncing
    }

    /// Replica `i`'s resync stopped midway. Normally the driver has taken it out again already
    /// (a take-out marks the range it failed); if that could not be done (no survivor could
    /// be asked), it still leaves the write set: it is outdated on record throughout a resync
    /// (resyncing is never recorded), and the survivors' records still cover every region not
    /// copied yet, so the resync task tries again later. Left resyncing, it would take writes
    /// with no resync running to finish it.
    pub fn resync_failed(&mut self, i: usize) {
        if self.set.state(i) == ReplicaState::Resyncing {
            self.set.set_state(i, ReplicaState::Outdated);
        }
        self.records[i].resync = None;
    }

    /// Replica `i`'s resync is done and recorded in sync: it serves reads again, as
    /// `incarnation`.
    /// A replica retired while its resync ran stays out: the end of a resync, or of a
    /// take-out, that was under way when it left the set never brings it back.
    pub fn resync_done(&mut self, i: usize, incarnation: u64, progress: ResyncProgress) {
        if self.set.state(i) == ReplicaState::Removed {
            return;
        }
        if self.records[i].follows.is_some() {
            self.caught_up(i, incarnation, progress);
            return;
        }
        self.set.set_state(i, ReplicaState::InSync);
        self.records[i].incarnation = incarnation;
        self.records[i].resync = None;
        self.finished.insert(self.records[i].node, progress);
    }

    /// The last finished resync of the replica on `node`.
    pub fn last_resync(&self, node: u32) -> Option<&ResyncProgress> {
        self.finished.get(&node)
    }

    /// Every replica not moved off: node, state, resync progress.
    pub fn views(&self) -> Vec<(u32, ReplicaState, Option<ResyncProgress>)> {
        (0..self.set.len())
            .filter(|&i| self.set.state(i) != ReplicaState::Removed)
            .map(|i| {
                let r = &self.records[i];
                (r.node, self.set.state(i), r.resync.clone())
            })
            .collect()
    }

    /// The plan of a resize from `from` to `to` bytes (different), over the copies that take
    /// writes now; see [`ResizePlan`]. The writer holds the whole volume and its membership.
    pub fn resize(&self, from: u64, to: u64) -> ResizePlan {
        ResizePlan::new(from, to, self.write_targets())
    }

    // ---- moves ------------------------------------------------------------------------------

    /// Adds a replica on `node` (a move's new copy): it starts failed, for a full resync at
    /// `rate` bytes per second (0: the volume's rate). `Ok(false)` if it is here already (its
    /// rate is updated).
    pub fn add(&mut self, node: u32, rate: u64) -> Result<(usize, bool), Refusal> {
        if let Some(i) = self.slot_of(node) {
            self.records[i].rate = rate;
            return Ok((i, false));
        }
        let i = self.set.len();
        if i == self.max_replicas {
            return Err(Refusal::NoSlotLeft(i));
        }
        self.records.push(Record {
            node,
            rate,
            ..Record::default()
        });
        self.set.push(ReplicaState::Failed);
        Ok((i, true))
    }

    /// A parity volume's copy on `from`, out of sync, is replaced by a new one on `to` in its
    /// place (a move or a lost server's replacement: a parity copy's place is its chunks, so
    /// the new one takes the old one's place rather than joining beside it). The old one is
    /// retired; the new one starts failed, for a whole resync at `rate` bytes per second
    /// (0: the volume's). `Ok((i, false))` if `to` holds the place already.
    pub fn replace(&mut self, from: u32, to: u32, rate: u64) -> Result<(usize, bool), Refusal> {
        let Some(map) = &self.regions else {
            return Err(Refusal::NotParity);
        };
        let placed = |n: u32| map.stripes().nodes.contains(&n);
        match (placed(from), self.slot_of(to)) {
            // Done already (asked again by a manager that took over).
            (false, Some(i)) if placed(to) => {
                self.records[i].rate = rate;
                return Ok((i, false));
            }
            (_, Some(_)) => return Err(Refusal::HoldsACopy(to)),
            (false, None) => return Err(Refusal::NoPlace(from)),
            (true, None) => {}
        }
        let old = self.slot_of(from);
        if let Some(i) = old {
            if matches!(
                self.set.state(i),
                ReplicaState::InSync | ReplicaState::Resyncing
            ) {
                return Err(Refusal::TakesWrites(from));
            }
        }
        if map.switching() {
            return Err(Refusal::Switching);
        }
        if let Some(f) = self.follower() {
            return Err(Refusal::Following(self.records[f].node));
        }
        let (i, _) = self.add(to, rate)?;
        if let Some(o) = old {
            self.retire(o);
        }
        let map = self.regions.as_mut().expect("checked above");
        map.replace_node(from, to);
        Ok((i, true))
    }

    /// May replica `i` be retired (moved off)? `Ok(true)`: it is in sync, so it must be
    /// recorded outdated first.
    pub fn may_retire(&self, i: usize) -> Result<bool, Refusal> {
        if self.set.state(i) != ReplicaState::InSync {
            return Ok(false);
        }
        if self.set.in_sync_count() < 2 {
            return Err(Refusal::LastInSync);
        }
        Ok(true)
    }

    /// Replica `i` is moved off for good: it takes nothing and is never resynced.
    pub fn retire(&mut self, i: usize) {
        self.set.set_state(i, ReplicaState::Removed);
        self.records[i].resync = None;
    }
}

#[cfg(test)]
#[path = "volume_tests.rs"]
mod tests;
