//! What the manager's operations fail with. The control API carries the message and a stable
//! [`ErrorCode`] ([`ManagerError::code`]): programs (the CLI's exit status, a CSI driver's
//! gRPC codes) decide on the code, never on the message.

use trireme_client::{MembershipError, VolumeError};
use trireme_meta::MetaError;
use trireme_replication::TransitionError;

pub use crate::api::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The metadata store failed or refused (a missing volume, a lost lease, unreachable).
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// A writer this manager runs failed.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// A node could not be reached or answered a manager's request with an error.
    #[error("node {node}: {what}")]
    Node { node: u32, what: String },
    /// No placement satisfies the request.
    #[error(transparent)]
    Placement(#[from] trireme_replication::PlacementError),
    /// The request breaks a rule (a bad argument, a node in the wrong state, not enough nodes):
    /// asking again unchanged does not help.
    #[error("{0}")]
    Refused(String),
    /// A node has no room for a replica (its message gives the numbers).
    #[error("{0}")]
    NoSpace(String),
    /// What the request names is not there (a snapshot, a volume in the trash).
    #[error("{0}")]
    NotFound(String),
    /// What the request names is in use (attached, exported, read by clones, being moved):
    /// it may succeed once that ends.
    #[error("{0}")]
    InUse(String),
    /// Another request on the same object runs now (a snapshot or resize already asked).
    #[error("{0}")]
    Busy(String),
    /// The caller's identity may not make this request.
    #[error("{0}")]
    Denied(String),
    /// The manager is stopping or its role has gone to another process.
    #[error("the manager stopped")]
    Stopped,
    /// The process supervisor of `up` (which runs the node processes) stopped.
    #[error("the supervisor stopped")]
    SupervisorStopped,
}

impl ManagerError {
    /// The stable code of this failure.
    pub fn code(&self) -> ErrorCode {
        use trireme_proto::Status;
        match self {
            ManagerError::Meta(e) => meta_code(e),
            ManagerError::Volume(VolumeError::Replica {
                status: Status::NoSpace,
                ..
            })
            | ManagerError::NoSpace(_)
            | ManagerError::Placement(_) => ErrorCode::NoSpace,
            ManagerError::Volume(e) if e.is_invalid_request() => ErrorCode::Invalid,
            ManagerError::Volume(_) | ManagerError::Node { .. } => ErrorCode::Unavailable,
            ManagerError::Refused(_) => ErrorCode::Invalid,
            ManagerError::NotFound(_) => ErrorCode::NotFound,
            ManagerError::InUse(_) => ErrorCode::InUse,
            ManagerError::Busy(_) => ErrorCode::Busy,
            ManagerError::Denied(_) => ErrorCode::Denied,
            ManagerError::Stopped | ManagerError::SupervisorStopped => ErrorCode::Unavailable,
        }
    }

    /// This failure as the control API carries it: its code and its message.
    pub fn refusal(&self) -> crate::Refusal {
        crate::Refusal::new(self.code(), self.to_string())
    }

    /// Whether the cluster's state is at fault rather than the request as given (the CLI
    /// exits 1 for these, 2 for a refused request).
    pub fn is_state(&self) -> bool {
        matches!(
            self,
            ManagerError::NoSpace(_)
                | ManagerError::Meta(MetaError::VolumeExists(_))
                | ManagerError::Volume(VolumeError::Replica {
                    status: trireme_proto::Status::NoSpace,
                    ..
                })
        )
    }
}

impl ManagerError {
    /// Whether asking again, of this manager or the next, may succeed: the metadata store did
    /// not answer, the manager lost its role or is stopping.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ManagerError::Meta(
                MetaError::Unavailable(_) | MetaError::Deposed(_) | MetaError::Contended { .. }
            ) | ManagerError::Stopped
        )
    }
}

/// The stable code of a metadata error.
fn meta_code(e: &MetaError) -> ErrorCode {
    match e {
        MetaError::NoVolume(_) | MetaError::NoSnapshot { .. } => ErrorCode::NotFound,
        MetaError::VolumeExists(_) => ErrorCode::AlreadyExists,
        MetaError::BadName(_) | MetaError::Refused(_) => ErrorCode::Invalid,
        MetaError::Attached { .. } => ErrorCode::InUse,
        // A stale epoch, a replica not on record: the volume changed under the request.
        MetaError::Transition(_) | MetaError::Contended { .. } => ErrorCode::Busy,
        MetaError::Denied(_) => ErrorCode::Denied,
        MetaError::Unavailable(_)
        | MetaError::Deposed(_)
        | MetaError::NoLease(_)
        | MetaError::Compacted { .. } => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    }
}

pub(crate) fn refused(what: impl Into<String>) -> ManagerError {
    ManagerError::Refused(what.into())
}

pub(crate) fn in_use(what: impl Into<String>) -> ManagerError {
    ManagerError::InUse(what.into())
}

pub(crate) fn busy(what: impl Into<String>) -> ManagerError {
    ManagerError::Busy(what.into())
}

impl From<ManagerError> for MembershipError {
    fn from(e: ManagerError) -> MembershipError {
        match e {
            ManagerError::Meta(
                MetaError::Unavailable(_) | MetaError::Deposed(_) | MetaError::Contended { .. },
            )
            | ManagerError::Stopped => MembershipError::Unreachable(e.to_string()),
            ManagerError::Meta(MetaError::Transition(TransitionError::NoSuchReplica(node))) => {
                MembershipError::NotOnRecord(node)
            }
            e => MembershipError::Refused(e.to_string()),
        }
    }
}

/// A metadata error as a writer on a client host sees it.
pub fn membership_error(e: MetaError) -> MembershipError {
    ManagerError::Meta(e).into()
}
