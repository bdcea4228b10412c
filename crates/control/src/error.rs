//! What the manager's operations fail with. The control API carries the message to the CLI; code
//! in this process decides on the variant.

use trireme_client::{MembershipError, VolumeError};
use trireme_meta::MetaError;
use trireme_replication::TransitionError;

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

pub(crate) fn refused(what: impl Into<String>) -> ManagerError {
    ManagerError::Refused(what.into())
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
