//! Cluster metadata: which nodes exist, which volumes, where their replicas live, and each
//! volume's writer epoch.
//!
//! Two layers. [`MetaStore`] (`kv.rs`) is the seam: a key-value store with etcd's semantics
//! (revisions, compare-and-put transactions, leases, prefix watches) and three backends: the
//! embedded default ([`EmbeddedMeta::open`], one local redb file, so a whole cluster runs on one
//! host with no external service), the same engine in memory ([`EmbeddedMeta::in_memory`], for
//! the simulator and tests) and etcd ([`EtcdMeta`], for clusters of several servers). One
//! conformance suite (`tests.rs`) runs against all three.
//!
//! [`ClusterMeta`] (`cluster.rs`) keeps trireme's records in it: one small key per object under
//! a versioned prefix, every change a transaction that compares what it read (so concurrent
//! writers on different hosts never lose an update), and optionally fenced by a lease (a
//! deposed manager can never write). Epochs only ever grow: that is what makes fencing
//! (DESIGN.md guarantee 4) sound.

mod cluster;
mod etcd;
pub mod kv;
mod local;
pub mod rbac;
#[cfg(test)]
mod tests;

pub use cluster::{
    AliveRecord, AttachRecord, ClusterEvent, ClusterMeta, IoRates, ManagerRecord, MoveRequest,
    MoveRequestState, NvmfExportRecord, QosPolicy, ReportedLink, ReportedReplica, ResizeRequest,
    RestartOrder, RevokedCert, ScrubOutcome, ScrubRecord, ScrubRequest, ScrubState, SnapshotAsk,
    SnapshotRecord, SnapshotState, TakeOutRequest, TakeOutState, TrashRecord, WriterAnswer,
    WriterReport, EVENTS_KEPT, EVENTS_PER_CALL, MAX_EXPORT_HOSTS, MAX_REPORT, PREFIX,
};
pub use etcd::{parse_endpoints, EtcdMeta, EtcdTls};
pub use kv::MetaStore;
pub use local::EmbeddedMeta;

use serde::{Deserialize, Serialize};
use trireme_replication::ReplicaState;

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("no volume named {0:?}")]
    NoVolume(String),
    #[error("a volume named {0:?} already exists")]
    VolumeExists(String),
    #[error("invalid volume name {0:?}: use 1-64 characters from [A-Za-z0-9._-]")]
    BadName(String),
    #[error("volume {volume} has no snapshot named {name:?}")]
    NoSnapshot { volume: String, name: String },
    #[error("metadata file {path}: {what}")]
    Storage { path: String, what: String },
    #[error("{0}")]
    Refused(String),
    /// A replica state change the volume's rules refuse (a stale epoch, no replica on that
    /// node, the last in-sync copy).
    #[error(transparent)]
    Transition(#[from] trireme_replication::TransitionError),
    /// Another writer holds the volume's attach record.
    #[error("volume {volume:?} is attached by pid {pid} on {host} (epoch {epoch}){}", if *.force_fences { "; --force fences it" } else { "" })]
    Attached {
        volume: String,
        pid: u32,
        host: String,
        epoch: u64,
        /// Whether `--force` would take it over.
        force_fences: bool,
    },
    #[error("lease {0} has expired or never existed")]
    NoLease(i64),
    #[error("watch from revision {asked}: the store keeps history from revision {oldest} only")]
    Compacted { asked: i64, oldest: i64 },
    #[error("metadata store unreachable: {0}")]
    Unavailable(String),
    #[error("bad etcd endpoints: {0}")]
    BadEndpoints(String),
    #[error("this process no longer holds {0}: another has taken it over")]
    Deposed(String),
    #[error("{what}: gave up after {tries} conflicting updates")]
    Contended { what: String, tries: u32 },
    #[error("metadata record {key:?} is corrupt: {what}")]
    Corrupt { key: String, what: String },
    /// The metadata store refused this process's identity (etcd's own access control): not
    /// a fault to wait out.
    #[error("the metadata store refused this identity: {0}")]
    Denied(String),
}

/// A storage node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: u32,
    /// Where its data path listens (`host:port`).
    pub addr: String,
    /// Its same-host socket (`unix:/path`), for clients on its host; TCP is the fallback.
    #[serde(default)]
    pub local_addr: Option<String>,
    /// Store backend (`null`, `memory`, `file`).
    pub store: String,
    /// Whether new replicas may be placed on it.
    #[serde(default)]
    pub state: NodeState,
    /// Failure domain (rack, room): a volume's copies go to distinct zones when there are
    /// enough of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Where its process serves metrics over HTTP (`host:port`), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// What it serves flat out, in 8 KiB units a second (`--iops-capacity`, `node set`): the
    /// manager checks the reserves of the volumes on it against this. `None`: not declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_capacity: Option<u64>,
}

/// A node's place in the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// Takes new replicas.
    #[default]
    Active,
    /// Its replicas are being (or have been) moved off (`node drain`); takes no new ones.
    Draining,
    /// Gone from the cluster (`node remove`): holds nothing, is not started, not pinged.
    Removed,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Removed => "removed",
        })
    }
}

/// One replica of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub node: u32,
    pub state: ReplicaState,
    /// The incarnation of the copy when it was last recorded in sync (0: not known yet). A
    /// replica that answers with another one has lost its history since (a power loss, a
    /// wiped store): the next writer does not count it in sync.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incarnation: u64,
    /// Set on the new copy of a move off node N (`node drain` / `node remove`) until the
    /// move is done: a move run again after one that failed midway resumes this copy rather
    /// than leave it behind and add another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_from: Option<u32>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Stable id used on the wire and in replica file names.
    pub id: u64,
    pub name: String,
    pub size: u64,
    /// Thick: every replica reserves its whole size on its node at creation (`--preallocate`);
    /// otherwise replicas take space as they are written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preallocate: bool,
    pub replicas: Vec<ReplicaRecord>,
    /// The epoch of the newest attach; 0 if never attached.
    pub epoch: u64,
    /// True while the writer of `epoch` is attached: set by attach, cleared by a clean detach.
    /// Found set by the next attach, it means the old writer died with writes in flight.
    #[serde(default)]
    pub writer_open: bool,
    /// The client identities (certificate names) that may attach the volume and reach its
    /// replicas; `*` stands for every client of the cluster. Nodes and operators always may.
    #[serde(default = "any_client")]
    pub access: Vec<String>,
    /// Fewest in-sync copies the writer goes on writing with (0: the default rule,
    /// [`trireme_replication::default_min_copies`]); below it, writes wait for a copy to
    /// return.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub min_copies: u32,
    /// Which tier the volume's extents live on, on nodes with tiered stores.
    #[serde(default, skip_serializing_if = "TierPolicy::is_auto")]
    pub tier: TierPolicy,
    /// For a clone not yet flattened: the snapshot its blocks not yet written read from, on
    /// each of its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<CloneOf>,
    /// How its bytes are kept: a mirror of its replicas unless said (set at creation).
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::Layout::is_mirror"
    )]
    pub layout: trireme_replication::Layout,
    /// The I/O limits its writer keeps (none unless set).
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::qos::Limits::is_default"
    )]
    pub limits: trireme_replication::qos::Limits,
    /// The QoS policy it is under, with what the policy gives it (see [`PolicyShare`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<PolicyShare>,
}

/// A volume's place under a QoS policy (`trireme qos policy`): the policy's name and what the
/// manager gives the volume of it — the policy's limits for a dedicated policy, a share of
/// them for an aggregated one. Kept in the volume's layout, whose key its writer watches, so
/// a writer needs nothing but its own record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyShare {
    pub policy: String,
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::qos::Limits::is_default"
    )]
    pub limits: trireme_replication::qos::Limits,
}

/// The snapshot a clone was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneOf {
    /// The parent volume's name and id (a volume of that name created later is not it).
    pub volume: String,
    pub volume_id: u64,
    /// The snapshot's name and id.
    pub snapshot: String,
    pub snapshot_id: u64,
}

/// Where a volume's extents live on tiered nodes: by heat (`auto`), or pinned to a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum TierPolicy {
    #[default]
    Auto,
    Fast,
    Slow,
}

impl TierPolicy {
    pub fn is_auto(&self) -> bool {
        *self == TierPolicy::Auto
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TierPolicy::Auto => "auto",
            TierPolicy::Fast => "fast",
            TierPolicy::Slow => "slow",
        }
    }
    /// The code of `Op::TierSet`'s `offset`.
    pub fn code(self) -> u64 {
        match self {
            TierPolicy::Auto => 0,
            TierPolicy::Fast => 1,
            TierPolicy::Slow => 2,
        }
    }
}

pub(crate) fn is_zero32(n: &u32) -> bool {
    *n == 0
}

impl VolumeRecord {
    /// The name of the QoS policy it is under, if any.
    pub fn qos_policy(&self) -> Option<&str> {
        self.qos.as_ref().map(|q| q.policy.as_str())
    }

    /// The limits its writer keeps: its own, under its QoS policy's share if it has one.
    pub fn limits_in_force(&self) -> trireme_replication::qos::Limits {
        match &self.qos {
            Some(q) => self.limits.under(&q.limits),
            None => self.limits,
        }
    }

    /// The minimum of in-sync copies in force. Unset: one fewer than its copies for a mirror;
    /// for parity, M of a region's M+1 mirrored copies (as the writer's core defaults).
    pub fn min_copies(&self) -> u32 {
        match (self.min_copies, self.layout) {
            (0, trireme_replication::Layout::Parity(p)) => u32::from(p.parity),
            (0, _) => trireme_replication::default_min_copies(self.replicas.len()),
            (n, _) => n,
        }
    }
}

/// The access list of a volume made without one: every client of the cluster.
pub fn any_client() -> Vec<String> {
    vec![ANY_CLIENT.to_string()]
}

/// The access-list entry that stands for every client of the cluster.
pub const ANY_CLIENT: &str = "*";

/// True for an access-list entry that names an NVMe host (its NQN) rather than a client
/// certificate: NVMe/TCP exports check it at Connect; etcd gives it no user.
pub fn is_host_nqn(entry: &str) -> bool {
    entry.starts_with("nqn.")
}

/// Checks an access-list entry: a client name, an NVMe host NQN (`nqn.` and up to 223
/// bytes of letters, digits, '.', '_', '-' and ':'), or `*`.
pub fn check_access_entry(name: &str) -> Result<(), MetaError> {
    if is_host_nqn(name) {
        let ok = name.len() <= 223
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
        return match ok {
            true => Ok(()),
            false => Err(MetaError::Refused(format!(
                "access entry {name:?}: an NVMe host NQN has at most 223 bytes of letters, digits, '.', '_', '-' and ':'"
            ))),
        };
    }
    let ok = name == ANY_CLIENT
        || ((1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')));
    if ok {
        Ok(())
    } else {
        Err(MetaError::Refused(format!(
            "access entry {name:?}: a client name (1 to 64 letters, digits, '.', '_' or '-') or '*'"
        )))
    }
}

/// Checks a volume name: what NBD export names and file names can both carry.
pub fn check_name(name: &str) -> Result<(), MetaError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(MetaError::BadName(name.to_string()))
    }
}

#[cfg(test)]
mod access_entry_tests {
    use super::*;

    #[test]
    fn access_entries_take_client_names_and_host_nqns() {
        for ok in [
            "*",
            "db-host",
            "nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0042-3510-8030-b4c04f4b4d32",
        ] {
            assert!(check_access_entry(ok).is_ok(), "{ok}");
        }
        let long = format!("nqn.{}", "a".repeat(220));
        for bad in [
            "",
            "a b",
            "nqn.x y",
            "nqn.x/y",
            long.as_str(),
            "host:with:colons",
        ] {
            assert!(check_access_entry(bad).is_err(), "{bad}");
        }
        assert!(is_host_nqn("nqn.2014-08.org.nvmexpress:uuid:x"));
        assert!(!is_host_nqn("db-host"));
    }
}
