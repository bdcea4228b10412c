//! The control plane as the writer needs it: who records replica states and locates replicas.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use trireme_replication::{ReplicaState, ResyncProgress};

use crate::AttachInfo;

/// A boxed future borrowing its arguments.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the control plane did not record or answer what the writer asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// The owner of the metadata said no: a stale epoch, the last in-sync replica, no such
    /// volume or node. Asking again does not help.
    #[error("refused: {0}")]
    Refused(String),
    /// The volume's layout lists no replica on that node: the manager dropped it (the old
    /// copy of a move, finished after a writer change). The writer lets go of it.
    #[error("refused: node {0} holds no replica of this volume on record")]
    NotOnRecord(u32),
    /// It could not be reached or gave up (the metadata store or the manager is down).
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
}

/// Why a replica could not be taken out: the replication core's rule said no, or the control
/// plane did not record it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DegradeRefusal {
    #[error(transparent)]
    Core(#[from] trireme_replication::Refusal),
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
    /// Records the volume's new size, once every copy taking writes has it. Refused unless
    /// `epoch` is the volume's current epoch.
    fn record_size<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        size: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>>;
    /// Records that a parity volume's `region` is `to` now (an encode's switch): durable
    /// when it returns. Refused unless `epoch` is the current epoch of the volume of id `id`.
    fn record_region<'a>(
        &'a self,
        volume: &'a str,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    ) -> BoxFut<'a, Result<(), MembershipError>>;
}

/// One replica as the writer sees it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub node: u32,
    pub state: ReplicaState,
    pub resync: Option<ResyncProgress>,
}
