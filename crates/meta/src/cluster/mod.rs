//! trireme's records in a [`MetaStore`]: one small key per object under [`PREFIX`].
//!
//! | key (under `/trireme/v1/`) | holds | lease-bound |
//! |---|---|---|
//! | `nodes/<id>` | [`NodeRecord`]: address, store, state, zone | no |
//! | `alive/<id>` | [`AliveRecord`]: the running daemon of node `id` | yes: gone when it dies |
//! | `volumes/<name>` | the volume's spec: id, name, size (never changes) | no |
//! | `layouts/<name>` | replicas and their states, epoch, writer-open flag | no |
//! | `attach/<name>` | [`AttachRecord`]: who writes the volume now | yes |
//! | `manager` | [`ManagerRecord`]: who holds the manager role, where its API listens | yes |
//! | `moves/<name>` | [`MoveRequest`]: the manager asks the volume's writer to move a replica | no |
//! | `takeouts/<name>` | [`TakeOutRequest`]: a planned restart asks the volume's writer to take a replica out, then back | no |
//! | `scrubs/<name>` | [`ScrubRequest`]: the manager asks the volume's writer to scrub it | no |
//! | `resizes/<name>` | [`ResizeRequest`]: the manager asks the volume's writer to resize it | no |
//! | `scrubbed/<name>` | [`ScrubRecord`]: when the volume's next scheduled scrub counts from, how its last one went | no |
//! | `restarts/<node>` | [`RestartOrder`]: the manager asks node `node`'s daemon to restart | no |
//! | `jobs/<node>` | a drain/remove job of the manager, so its successor resumes it | no |
//! | `settings/<key>` | cluster settings | no |
//! | `revoked/<fingerprint>` | [`RevokedCert`]: a certificate refused at every handshake | no |
//! | `events/<seq>`, `events-seen` | [`ClusterEvent`]: what changed, in words, the newest 200; what the recorder last compared | no |
//! | `reports/<name>` | [`WriterReport`]: a writer's view of its volume, its I/O | yes |
//! | `nvmf/<name>/<port id>` | [`NvmfExportRecord`]: a server's NVMe/TCP export of the volume: address, NQN, ANA state, hosts | yes: the serving process's |
//! | `snapshots/<volume>/<name>` | [`SnapshotRecord`]: a snapshot's id on the copies, when it was taken, which nodes hold it | no |
//! | `snapshot-asks/<name>` | [`SnapshotAsk`]: the manager asks the volume's writer to take a snapshot | no |
//! | `next-snapshot-id` | the next snapshot id (never reused) | no |
//! | `trash/<id>` | [`TrashRecord`]: a deleted volume waiting for its purge | no |
//! | `next-volume-id` | the next volume id (ids are never reused) | no |
//! | `regions/<id>/<group>` | a parity volume's regions, 4096 a key, one character each (`regions.rs`) | no |
//!
//! Values are JSON. Every read-modify-write compares the `mod_revision` it read and retries on
//! a conflict, so two writers on two hosts never lose each other's update. A [`ClusterMeta`]
//! made with [`ClusterMeta::fenced`] adds one more compare to every write: the manager key
//! still carries this process's lease. A manager that lost its lease (a partition, a pause)
//! then gets [`MetaError::Deposed`] and writes nothing.

//!
//! Files: `records.rs` (the records' types), `members.rs` (nodes, their daemons, the
//! manager role and its jobs), `volumes.rs` (volumes and their layouts), `attach.rs` (attach
//! records and epochs), `requests.rs` (the manager's requests to writers and daemons).

mod answers;
mod attach;
mod events;
mod exports;
mod members;
mod policies;
mod records;
mod regions;
mod reports;
mod requests;
mod snapshots;
mod trash;
mod volumes;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::kv::{Compare, KeyValue, LeaseId, MetaStore, Op, Txn, TxnResult};
use crate::MetaError;

pub use answers::WriterAnswer;
pub use events::{ClusterEvent, EVENTS_KEPT, EVENTS_PER_CALL};
pub use exports::{NvmfExportRecord, MAX_EXPORT_HOSTS};
pub use policies::QosPolicy;
pub use records::*;

pub use reports::{IoRates, ReportedLink, ReportedReplica, WriterReport, MAX_REPORT};
pub use snapshots::{SnapshotAsk, SnapshotRecord, SnapshotState};
pub use trash::TrashRecord;
pub(crate) use volumes::layout_of;

/// Where every trireme key lives; the version changes if the layout ever does.
pub const PREFIX: &str = "/trireme/v1/";

/// How often a read-modify-write retries on conflicting writers before it gives up.
pub(crate) const MAX_TRIES: u32 = 64;

pub(crate) fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, MetaError> {
    serde_json::from_slice(&kv.value).map_err(|e| MetaError::Corrupt {
        key: kv.key.clone(),
        what: e.to_string(),
    })
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("metadata records always serialize")
}

/// trireme's metadata over any [`MetaStore`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ClusterMeta {
    store: Arc<dyn MetaStore>,
    /// Compared by every write (see the module doc).
    fence: Option<Compare>,
}

impl ClusterMeta {
    pub fn new(store: Arc<dyn MetaStore>) -> ClusterMeta {
        ClusterMeta { store, fence: None }
    }

    /// The same records, every write fenced by the manager lease `lease`.
    pub fn fenced(&self, lease: LeaseId) -> ClusterMeta {
        ClusterMeta {
            store: self.store.clone(),
            fence: Some(Compare::lease(key("manager"), lease)),
        }
    }

    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    /// Runs a write transaction with the fence added; `Ok(None)` when a compare of the caller
    /// failed (a conflict: read again and retry), `Deposed` when the fence did.
    pub(crate) async fn write(
        &self,
        mut compare: Vec<Compare>,
        ops: Vec<Op>,
    ) -> Result<Option<TxnResult>, MetaError> {
        let fence = self.fence.clone();
        let mut failure = Vec::new();
        if let Some(f) = &fence {
            compare.push(f.clone());
            failure.push(Op::get(f.key.clone()));
        }
        let r = self
            .store
            .txn(Txn::when(compare).then(ops).otherwise(failure))
            .await?;
        if r.succeeded {
            return Ok(Some(r));
        }
        if let Some(f) = fence {
            if !f.holds(r.gets.first().and_then(|g| g.as_ref())) {
                return Err(MetaError::Deposed("the manager role".into()));
            }
        }
        Ok(None)
    }

    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        k: &str,
    ) -> Result<Option<(T, KeyValue)>, MetaError> {
        match self.store.get(k).await? {
            Some(kv) => Ok(Some((decode(&kv)?, kv))),
            None => Ok(None),
        }
    }

    pub(crate) async fn list<T: DeserializeOwned>(&self, dir: &str) -> Result<Vec<T>, MetaError> {
        let (kvs, _) = self.store.range(&key(dir)).await?;
        kvs.iter().map(decode).collect()
    }

    /// The lease every write of this handle compares, if it is fenced (the manager's).
    pub fn fence_lease(&self) -> Option<LeaseId> {
        self.fence.as_ref().and_then(|c| match c.target {
            crate::kv::Target::Lease(l) => Some(l),
            _ => None,
        })
    }

    pub async fn setting(&self, k: &str) -> Result<Option<String>, MetaError> {
        Ok(self
            .store
            .get(&key(&format!("settings/{k}")))
            .await?
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    pub async fn set_setting(&self, k: &str, value: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::put(key(&format!("settings/{k}")), value)])
            .await?
            .ok_or_else(|| MetaError::Refused("setting: conflicting write".into()))?;
        Ok(())
    }
}

/// The next id a counter key (`next-volume-id`, `next-snapshot-id`) hands out: 1 while it is
/// absent.
pub(crate) fn counter_value(k: &str, kv: Option<&KeyValue>) -> Result<u64, MetaError> {
    match kv {
        Some(kv) => std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| MetaError::Corrupt {
                key: k.to_string(),
                what: "not a number".into(),
            }),
        None => Ok(1),
    }
}

/// The full key of `rel`.
pub fn key(rel: &str) -> String {
    format!("{PREFIX}{rel}")
}
