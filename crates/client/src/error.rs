//! What the volume client fails with, and what each failure means to the write rule.

use std::time::Duration;

use trireme_proto::Status;
use trireme_replication::{RangeError, ReplicaOutcome, WriteFailure};
use trireme_transport::TransportError;

use crate::membership::{DegradeRefusal, MembershipError};

/// A write failure in an operator's words: the node, not the replica's index in the set.
fn failure_text(f: &WriteFailure, node: Option<u32>) -> String {
    match (f, node) {
        (WriteFailure::ReplicaFailed { .. }, Some(n)) => {
            format!("the replica on node {n} failed it")
        }
        (WriteFailure::Refused { .. }, Some(n)) => format!("the replica on node {n} refused it"),
        (WriteFailure::NoSpace { .. }, Some(n)) => {
            format!("no space left: node {n} keeps the rest of its device in reserve")
        }
        (f, _) => f.to_string(),
    }
}

/// Errors of the volume client.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error(
        "volume {volume}: fenced, another writer attached with epoch {newer} (ours is {ours})"
    )]
    Fenced {
        volume: String,
        ours: u64,
        newer: u64,
    },
    /// A mirrored request (`op`: write, flush, trim, zero) that cannot be acknowledged;
    /// `node` is the node of the replica the failure names, if it names one.
    #[error("volume {volume}: {op}: {}", failure_text(failure, *node))]
    Write {
        volume: String,
        op: &'static str,
        failure: WriteFailure,
        node: Option<u32>,
    },
    #[error("node {node}: {}", status_message(*status, message))]
    Replica {
        node: u32,
        status: Status,
        message: String,
    },
    #[error("node {node}: {source}")]
    Transport { node: u32, source: TransportError },
    #[error("node {node} did not answer within {timeout:?}")]
    Timeout { node: u32, timeout: Duration },
    #[error("volume {volume}: cannot take the replica on node {node} out: {why}")]
    Degrade {
        volume: String,
        node: u32,
        why: DegradeRefusal,
    },
    /// The control plane did not answer a request that is not a take-out (locate, detach).
    #[error("volume {volume}: {source}")]
    Membership {
        volume: String,
        source: MembershipError,
    },
    /// The node refused this writer's identity (not on the volume's access list): no replica
    /// is at fault, so none is taken out; the writer stops as if fenced.
    #[error("node {node} refused this identity: {why}")]
    Denied { node: u32, why: String },
    #[error("volume {volume}: rollback refused: {why}")]
    Rollback { volume: String, why: String },
    #[error("a volume's size must be a non-zero multiple of 4096 (asked: {0})")]
    BadSize(u64),
    /// The volume is kept in a layout this writer does not serve (parity, or one of a newer
    /// trireme): it is not attached rather than written as a mirror.
    #[error("volume {volume}: {source}")]
    Layout {
        volume: String,
        source: trireme_replication::LayoutError,
    },
    #[error("volume {0}: no in-sync replica can serve the request")]
    NoReplicas(String),
    /// In-sync copies did not answer at attach, or failed a request of a running writer, and
    /// taking them out would lose what the others cannot give (see [`WaitReason`]). Nothing
    /// changed; the attach, or the request, waits for them.
    #[error("volume {volume}: {why}; waiting for node(s) {waiting:?}")]
    WaitForCopies {
        volume: String,
        waiting: Vec<u32>,
        why: WaitReason,
    },
    /// A parity volume's data request in part blocks (see `parity.rs`).
    #[error("volume {volume}: {op} of {len} bytes at {offset}: a parity volume takes whole 4096-byte blocks")]
    Unaligned {
        volume: String,
        op: &'static str,
        offset: u64,
        len: u64,
    },
    /// More of a parity volume's nodes are out than it survives.
    #[error("volume {volume}: cannot read at {offset}: {source}")]
    Unreadable {
        volume: String,
        offset: u64,
        source: trireme_replication::Unreadable,
    },
    #[error("volume {0}: no space left on its copies' nodes (writes resume once there is)")]
    Full(String),
    #[error("volume {0}: the writer stopped (fenced or refused) while writes waited for copies")]
    Stopped(String),
    #[error("node {node} sent a malformed response: {what}")]
    Protocol { node: u32, what: String },
    /// The copies that held a request stopped answering before they could track the copies
    /// that failed it: those went out for a full resync, and these stay in sync. Nobody
    /// answered the request; it may be tried again once one of them answers.
    #[error("volume {volume}: the in-sync copies (nodes {nodes:?}) stopped answering before they could track the failed ones")]
    Stranded { volume: String, nodes: Vec<u32> },
}

/// A node's refusal with its status, which its message may already name ("no space: ...").
fn status_message(status: Status, message: &str) -> String {
    let s = status.as_str();
    match message.strip_prefix(s) {
        Some(rest) if rest.starts_with(':') => message.to_string(),
        _ => format!("{s}: {message}"),
    }
}

/// What a replica's failure of a mirrored request means to the write rule
/// ([`trireme_replication::decide`]).
pub(crate) fn outcome_of(e: &VolumeError) -> ReplicaOutcome {
    match e {
        VolumeError::Fenced { .. } | VolumeError::Denied { .. } => ReplicaOutcome::Fenced,
        VolumeError::Replica {
            status: Status::OutOfRange | Status::Invalid,
            ..
        } => ReplicaOutcome::Refused,
        VolumeError::Replica {
            status: Status::NoSpace,
            ..
        } => ReplicaOutcome::NoSpace,
        // The node's store answered with an error: what it holds is unknown. A superseded
        // connection's refusal says nothing about the store.
        VolumeError::Replica { status, .. } if *status != Status::Superseded => {
            ReplicaOutcome::StoreFailed
        }
        _ => ReplicaOutcome::Failed,
    }
}

impl VolumeError {
    /// True for errors caused by the request itself (an out-of-range offset, say), which the
    /// frontend reports as EINVAL rather than EIO.
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, VolumeError::Range(_))
    }
    /// A write refused for want of space on the copies, with nothing written (ENOSPC).
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            VolumeError::Full(_)
                | VolumeError::Write {
                    failure: WriteFailure::NoSpace { .. },
                    ..
                }
        )
    }
    /// The replica's copy failed its block checksums (the node keeps serving other ranges).
    pub fn is_bad_copy(&self) -> bool {
        matches!(
            self,
            VolumeError::Replica {
                status: Status::Corrupt,
                ..
            }
        )
    }
    /// True if a copy and this client disagree on the epoch either way: fenced by a newer
    /// writer, or a copy behind ours (re-created, or not yet attached by the writer of the
    /// epoch a reader located). A reader of the volume at the metadata's epoch (`volume
    /// verify`) locates it again and starts over.
    pub fn is_epoch_mismatch(&self) -> bool {
        self.is_fenced()
            || matches!(
                self,
                VolumeError::Replica {
                    status: Status::Fenced,
                    ..
                }
            )
    }

    /// True if the writer may not go on at all (fenced by a newer epoch, or refused by a node
    /// for its identity): no replica is taken out for it.
    pub fn stops_writer(&self) -> bool {
        self.is_fenced() || matches!(self, VolumeError::Denied { .. })
    }

    /// True if every in-sync copy failed to answer, so nothing could be taken out (an attach
    /// that reached no copy: it changed nothing).
    pub fn reached_no_copy(&self) -> bool {
        matches!(
            self,
            VolumeError::Degrade {
                why: DegradeRefusal::Core(trireme_replication::Refusal::NoneLeft),
                ..
            } | VolumeError::WaitForCopies { .. }
        )
    }

    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            VolumeError::Fenced { .. }
                | VolumeError::Write {
                    failure: WriteFailure::Fenced,
                    ..
                }
        )
    }
}

/// Why an attach or a request waits for in-sync copies, rather than take them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitReason {
    /// Every copy that answered lost its history (a power loss): one that did not may hold
    /// the writes they lost.
    #[error("the in-sync copies that answered lost their unflushed writes (another incarnation), which the silent ones may hold (if their node is gone for good, `trireme node lost ID` accepts the others as they are)")]
    LostHistory,
    /// Those that answered cannot serve every region of a parity volume (fewer than K
    /// chunks of a stripe, or no mirror of a region): out, the others could never be
    /// rebuilt, as a chunk is rebuilt from K in sync.
    #[error("the in-sync copies that answered cannot serve every region (a stripe needs K chunks, a mirrored region one copy)")]
    CannotServe,
}
