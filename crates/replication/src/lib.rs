//! The replication core: the decisions of the volume write/read path, with no I/O in it.
//!
//! Nothing here touches a socket, a disk, a clock or a random number generator; callers pass in
//! what happened (a reply, a node list) and get back what to do. The volume client drives it
//! today; the seeded simulator of the failure work drives the very same code.
//!
//! * [`place`] — which nodes hold a new volume's replicas.
//! * [`Layout`] — how a volume's bytes are kept (a mirror; parity described, not served yet):
//!   what it spans, survives and costs.
//! * [`place_stripe`], [`RegionMap`] — a parity volume's nodes over zones, which regions are
//!   mirrored or parity, where a write goes, how a block reads back (rebuilt from K chunks
//!   when its own is down), and the encoder and fold-back as a plan of steps.
//! * [`qos`] — a volume's I/O limits, and when each request may start under them.
//! * [`fence`] — what a replica does with a request's epoch (DESIGN.md guarantee 4).
//! * [`RangeOrder`] — overlapping writes reach every replica in one order (guarantee 2).
//! * [`WriteQuorum`] — when a mirrored write may be acknowledged (guarantee 1).
//! * [`ResyncPlan`] — which regions a returning replica gets, in what order, at what pace.
//! * [`TakeOut`] — taking failed replicas out while the survivors track what they miss.
//! * [`CatchUp`] — the snapshots a returning or new copy lacks: which, from which base, which
//!   regions, at which size.
//! * [`ResizePlan`] — an online resize: who takes the new size in which order, what a failure
//!   undoes.
//! * [`ReplicaSet`] — which replicas take writes and which may serve reads (guarantee 3).
//! * [`ReadPlan`] — which replica serves a read, falling over, and which copies to repair.
//! * [`settle`] and [`majority`] — what to do with a region replicas hold differently, after a
//!   writer died (reconcile) and during a scrub.
//! * [`VolumeCore`] — one attached volume's state, owning all of the above: the writer's runtime
//!   keeps one behind a mutex and only moves bytes. Its request path is a step machine
//!   ([`VolumeCore::step`]: an [`Input`] in, [`Action`]s out).

mod catch_up;
mod compare;
mod follow;
mod layout;
mod order;
pub mod qos;
mod quorum;
mod read;
mod rebuild;
mod resize;
mod resync;
mod routes;
mod set;
mod step;
mod stripes;
mod takeout;
mod volume;

pub use catch_up::{within, CatchUp, CatchUpStep, Report as CatchUpReport, Snap};
pub use compare::{majority, settle, Sum, Verdict};
pub use layout::{Layout, LayoutError, Parity, DEFAULT_MIRROR_SHARE};
pub use order::{RangeOrder, Ticket};
pub use quorum::{decide, Decision, Mirrored, ReplicaOutcome, WriteFailure, WriteQuorum};
pub use read::ReadPlan;
pub use rebuild::{ChunkRebuild, MirrorCopy};
pub use resize::{ResizeEnd, ResizePlan, ResizeStep};
pub use resync::{
    all_chunks, incremental, union_chunks, union_ranges, ResyncPlan, ResyncStep, CHUNK,
    CLEAR_BATCH, PARALLEL,
};
pub use routes::EncodeAction;
pub use set::{default_min_copies, removal, transition, ReplicaSet, ReplicaState, TransitionError};
pub use step::{Action, Answers, Input};
pub use stripes::{
    place_stripe, ChunkAt, Discard, EncodeEnd, EncodeRefusal, EncodeStep, ReadFrom, Region,
    RegionMap, Stripes, Unreadable, CHUNK_BLOCKS, CHUNK_SLOTS,
};
pub use takeout::{Mark, Step as TakeOutStep, TakeOut};
pub use volume::{Copies, CopiesChange, Refusal, ResyncStart, VolumeCore};

use serde::{Deserialize, Serialize};

/// A resync in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// True when every region is compared (the replica's history was not known).
    pub full: bool,
    /// Bytes to go through.
    pub total_bytes: u64,
    /// Bytes gone through so far.
    pub done_bytes: u64,
    /// Bytes actually copied (a full resync skips regions that already match).
    pub copied_bytes: u64,
    pub elapsed_ms: u64,
}

impl ResyncProgress {
    /// A whole resync with nothing done yet (tests).
    #[cfg(test)]
    pub(crate) fn begun() -> ResyncProgress {
        ResyncProgress {
            full: true,
            total_bytes: 0,
            done_bytes: 0,
            copied_bytes: 0,
            elapsed_ms: 0,
        }
    }

    /// Bytes per second so far.
    pub fn rate(&self) -> u64 {
        self.done_bytes * 1000 / self.elapsed_ms.max(1)
    }
    /// Seconds left at the current rate.
    pub fn eta_secs(&self) -> Option<u64> {
        let r = self.rate();
        (r > 0).then(|| (self.total_bytes - self.done_bytes.min(self.total_bytes)) / r)
    }
}

/// Why placement failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("{replicas} replicas need {replicas} nodes, but only {nodes} are available")]
    NotEnoughNodes { replicas: usize, nodes: usize },
    #[error("replica count must be 1..=3, got {0}")]
    BadReplicaCount(usize),
    #[error(
        "parity {data}+{parity} keeps at most {parity} chunks of a stripe in one zone, so that \
         a lost zone loses nothing: it needs {need} zones with nodes enough, the nodes are in {zones}"
    )]
    TooFewZones {
        data: usize,
        parity: usize,
        need: usize,
        zones: usize,
    },
}

/// A candidate node: its id and how many replicas it already holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoad {
    pub node: u32,
    pub replicas: usize,
    /// Failure domain; `None` is a zone of its own.
    pub zone: Option<String>,
}

/// Chooses `replicas` distinct nodes, least loaded first (ties by lowest id), so volumes spread
/// evenly, and in distinct zones while there are zones left (then the least loaded of the
/// rest). Deterministic for the same input.
pub fn place(nodes: &[NodeLoad], replicas: usize) -> Result<Vec<u32>, PlacementError> {
    if !(1..=3).contains(&replicas) {
        return Err(PlacementError::BadReplicaCount(replicas));
    }
    let c = candidates(nodes);
    if c.len() < replicas {
        return Err(PlacementError::NotEnoughNodes {
            replicas,
            nodes: c.len(),
        });
    }
    let mut out: Vec<u32> = Vec::with_capacity(replicas);
    let mut zones: Vec<&str> = Vec::new();
    for n in &c {
        if out.len() == replicas {
            break;
        }
        match n.zone.as_deref() {
            Some(z) if zones.contains(&z) => continue,
            Some(z) => zones.push(z),
            None => {}
        }
        out.push(n.node);
    }
    for n in &c {
        if out.len() == replicas {
            break;
        }
        if !out.contains(&n.node) {
            out.push(n.node);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The nodes to place on, least loaded first (ties by lowest id). A node listed twice is one
/// node, at its highest load.
fn candidates(nodes: &[NodeLoad]) -> Vec<NodeLoad> {
    let mut c: Vec<NodeLoad> = nodes.to_vec();
    c.sort_by_key(|n| (n.node, std::cmp::Reverse(n.replicas)));
    c.dedup_by_key(|n| n.node);
    c.sort_by_key(|n| (n.replicas, n.node));
    c
}

/// What a replica decides about a request's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceDecision {
    /// Serve the request.
    Accept,
    /// An attach with a newer epoch: record `new_epoch` durably, then serve.
    Advance { new_epoch: u64 },
    /// A newer writer holds the replica: refuse.
    Fenced { current: u64 },
    /// An I/O request from an epoch that never attached: refuse.
    NotAttached { current: u64 },
}

/// The fencing rule. `attach` is true for an attach request, false for I/O.
///
/// Attach with a newer epoch advances the replica; with the current epoch it is accepted (a
/// writer re-connecting); with an older one it is fenced. I/O must carry exactly the current
/// epoch: older is fenced, newer means the writer skipped attaching this replica.
pub fn fence(request_epoch: u64, replica_epoch: u64, attach: bool) -> FenceDecision {
    use std::cmp::Ordering::*;
    match (request_epoch.cmp(&replica_epoch), attach) {
        (Less, _) => FenceDecision::Fenced {
            current: replica_epoch,
        },
        (Equal, _) => FenceDecision::Accept,
        (Greater, true) => FenceDecision::Advance {
            new_epoch: request_epoch,
        },
        (Greater, false) => FenceDecision::NotAttached {
            current: replica_epoch,
        },
    }
}

/// Why an I/O range is refused before it is sent anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("range {offset}+{len} is beyond the end of the {size}-byte volume")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("request of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: u64, max: u64 },
}

/// Checks an I/O range against the volume size and the per-request limit, without overflow.
pub fn check_io(offset: u64, len: u64, size: u64, max: u64) -> Result<(), RangeError> {
    if len > max {
        return Err(RangeError::TooLarge { len, max });
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(RangeError::OutOfRange { offset, len, size }),
    }
}

#[cfg(test)]
mod tests;
