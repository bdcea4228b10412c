//! The control plane: the cluster manager and the API the CLI talks to.
//!
//! The manager owns the metadata store ([`trireme_meta::MetaStore`]) and is the only component
//! that changes it: it registers nodes, places and creates volumes, hands out epochs on attach,
//! and reports status. It never sits on the data path: a volume client gets its epoch and the
//! replicas' addresses once, at attach, then talks to the nodes directly.
//!
//! The API is one JSON object per line over a unix socket (`<data-dir>/control.sock`): a
//! [`Request`] in, a `{"ok": ...}` or `{"error": "..."}` line out. Lines over 1 MiB and
//! malformed JSON get an error line; the connection stays usable.

mod api;
mod asks;
mod error;
pub mod events;
pub mod health;
mod manager;
mod membership;
mod moves;
pub mod pool;
pub mod reserves;
mod restart;

pub use api::{
    decode_reply, ControlClient, ControlError, ControlStream, ErrorCode, LayoutStatus,
    LimitsChange, LinkStatus, LostVolume, NoLimit, NodeLostReport, NodeRestartReport, NodeStatus,
    NodeTierStatus, Rate, Refusal, ReplicaIntegrityStatus, ReplicaStatus, ReplicaStatusState,
    ReplicaTierStatus, Request, StatusReport, VolumeInfo, VolumeStatus, Warned, WriterAttached,
    WriterHello, WriterStatus,
};
pub use error::{membership_error, ManagerError};
pub use manager::fence::{FenceWhere, Fenced};
pub use manager::{
    attach_info, control_gate, record_detach, record_replica_state, record_size, serve, serve_conn,
    Manager, NodeControl, PolicyInfo, PolicyMember, ScrubSchedule, SnapshotInfo, CONTROL_IDLE,
    CONTROL_LIMITS, REFUSED,
};
pub use membership::{ControlMembership, WriterUsage};
pub use moves::{move_as_writer, MoveKind, MoveState, MoveStatus};
pub use restart::HOLD as RESTART_HOLD;

/// This host's name, for the records that say who holds what.
pub fn hostname() -> String {
    // A CSI node plugin names its children's host as Kubernetes names the node.
    if let Some(h) = std::env::var("TRIREME_HOST").ok().filter(|h| !h.is_empty()) {
        return h;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

pub use trireme_proto::human;
