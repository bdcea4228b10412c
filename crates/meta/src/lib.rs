//! Cluster metadata: which nodes exist, which volumes, where their replicas live, and each
//! volume's writer epoch.
//!
//! [`MetaStore`] is the seam. The embedded default, [`EmbeddedMeta`], keeps everything in one
//! local redb file (crash-safe, checksummed) so a whole cluster runs on one host with no external
//! service. A multi-host cluster will put the same records in etcd behind the same trait.
//!
//! Every method is atomic and durable when it returns. Epochs only ever grow: [`MetaStore::next_epoch`]
//! is what makes fencing (DESIGN.md guarantee 4) sound.

mod embedded;

pub use embedded::EmbeddedMeta;

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
    #[error("metadata file {path}: {what}")]
    Storage { path: String, what: String },
    #[error("{0}")]
    Refused(String),
    #[error("metadata record {key:?} is corrupt: {what}")]
    Corrupt { key: String, what: String },
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
}

/// A volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Stable id used on the wire and in replica file names.
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub replicas: Vec<ReplicaRecord>,
    /// The epoch of the newest attach; 0 if never attached.
    pub epoch: u64,
    /// True while the writer of `epoch` is attached: set by attach, cleared by a clean detach.
    /// Found set by the next attach, it means the old writer died with writes in flight.
    #[serde(default)]
    pub writer_open: bool,
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

/// The metadata seam. Implementations must make each call atomic and durable.
pub trait MetaStore: Send + Sync + std::fmt::Debug {
    fn put_node(&self, node: &NodeRecord) -> Result<(), MetaError>;
    fn nodes(&self) -> Result<Vec<NodeRecord>, MetaError>;
    /// Creates a volume with a fresh id; fails if the name is taken.
    fn create_volume(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
    ) -> Result<VolumeRecord, MetaError>;
    fn volume(&self, name: &str) -> Result<VolumeRecord, MetaError>;
    fn volumes(&self) -> Result<Vec<VolumeRecord>, MetaError>;
    fn delete_volume(&self, name: &str) -> Result<VolumeRecord, MetaError>;
    /// Atomically increments and returns the volume's epoch: the attach of a new writer.
    fn next_epoch(&self, name: &str) -> Result<VolumeRecord, MetaError>;
    /// Atomically reads, changes and writes back one volume. `f` may refuse the change with a
    /// message (returned as [`MetaError::Refused`]), and then nothing is written.
    fn update_volume(
        &self,
        name: &str,
        f: &mut dyn FnMut(&mut VolumeRecord) -> Result<(), String>,
    ) -> Result<VolumeRecord, MetaError>;
    /// A cluster-wide setting (e.g. the store backend the cluster was created with).
    fn setting(&self, key: &str) -> Result<Option<String>, MetaError>;
    fn set_setting(&self, key: &str, value: &str) -> Result<(), MetaError>;
}
