//! Where a writer on another host records what a writer records: its attach record, replica
//! states, its size, its answers to the manager's requests, its detach.
//!
//! A writer with a client certificate records through the manager's control API (mutual TLS),
//! which checks that it is the volume's writer of record (`trireme_control`'s `writers.rs`):
//! etcd lets a client write nothing but its own writer report (`trireme_meta::rbac`). A
//! writer of the cluster's own identity (an operator's, a node's) or of a cluster without TLS
//! writes the metadata store itself, as it always did.
//!
//! Through the manager, what cannot be recorded now (no manager holds the role, it lost its
//! lease, etcd does not answer it) is `MetaError::Unavailable`: the callers wait and ask
//! again ([`crate::attach::until_reachable`]), so a take-out is never acknowledged unrecorded.

use trireme_control::{ControlClient, ControlError, Request, WriterAttached};
use trireme_meta::{AttachRecord, ClusterMeta, MetaError, VolumeRecord, WriterAnswer};
use trireme_replication::{ReplicaState, TransitionError};

/// How a writer records (see the module's docs).
#[derive(Debug, Clone)]
pub enum Recorder {
    /// Straight in the metadata store.
    Direct(ClusterMeta),
    /// Through the manager, as client `client`; `meta` only read (to find the manager).
    Manager { meta: ClusterMeta, client: String },
}

/// A control error as a metadata error: the manager's refusal stays a refusal; a manager that
/// cannot be reached, or hands its role on, is an outage to wait out.
fn meta_error(e: ControlError) -> MetaError {
    match e {
        ControlError::Remote(m) | ControlError::Failed(m) => MetaError::Refused(m.message),
        ControlError::NotOnRecord { node, .. } => {
            MetaError::Transition(TransitionError::NoSuchReplica(node))
        }
        e => MetaError::Unavailable(format!("the manager: {e}")),
    }
}

impl Recorder {
    /// The recorder for this process's identity.
    pub fn for_process(meta: ClusterMeta) -> Recorder {
        match crate::tls_role() {
            Some(trireme_tls::Role::Client(c)) => Recorder::Manager {
                meta,
                client: c.clone(),
            },
            _ => Recorder::Direct(meta),
        }
    }

    /// The metadata store, to read.
    pub fn meta(&self) -> &ClusterMeta {
        match self {
            Recorder::Direct(m) | Recorder::Manager { meta: m, .. } => m,
        }
    }

    /// The client name the writer's report goes under, if it is a client.
    pub fn client(&self) -> Option<&str> {
        match self {
            Recorder::Direct(_) => None,
            Recorder::Manager { client, .. } => Some(client),
        }
    }

    /// One request to the manager of the moment.
    async fn call<T: serde::de::DeserializeOwned>(&self, req: &Request) -> Result<T, MetaError> {
        let (m, _) =
            self.meta().manager().await?.ok_or_else(|| {
                MetaError::Unavailable("no process holds the manager role".into())
            })?;
        let mut c = ControlClient::connect_tcp(&m.control)
            .await
            .map_err(meta_error)?;
        c.call(req).await.map_err(meta_error)
    }

    /// Becomes the writer of `name` (see `ClusterMeta::attach`).
    pub async fn attach(
        &self,
        name: &str,
        rec: &AttachRecord,
        lease: i64,
        force: bool,
    ) -> Result<(VolumeRecord, bool), MetaError> {
        let Recorder::Manager { .. } = self else {
            return self.meta().attach(name, rec, lease, force).await;
        };
        let req = Request::WriterAttach {
            name: name.to_string(),
            record: rec.clone(),
            lease,
            force,
        };
        match self.call(&req).await? {
            WriterAttached::Attached { volume, unclean } => Ok((*volume, unclean)),
            WriterAttached::Held { pid, host, epoch } => Err(MetaError::Attached {
                volume: name.to_string(),
                pid,
                host,
                epoch,
                force_fences: true,
            }),
        }
    }

    /// Puts the attach record back under a new lease (see `ClusterMeta::reattach`).
    pub async fn reattach(
        &self,
        name: &str,
        rec: &AttachRecord,
        lease: i64,
    ) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => m.reattach(name, rec, lease).await,
            Recorder::Manager { .. } => {
                self.call(&Request::WriterReattach {
                    name: name.to_string(),
                    record: rec.clone(),
                    lease,
                })
                .await
            }
        }
    }

    /// Drops the attach record of the writer of `epoch`.
    pub async fn release(&self, name: &str, epoch: u64) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => m.release_attachment(name, epoch).await,
            Recorder::Manager { .. } => {
                self.call(&Request::WriterRelease {
                    name: name.to_string(),
                    epoch,
                })
                .await
            }
        }
    }

    /// Records the writer's answer to a request read at revision `at`: its new revision, or
    /// `None` if it changed meanwhile.
    pub async fn answer(
        &self,
        name: &str,
        epoch: u64,
        at: i64,
        answer: WriterAnswer,
    ) -> Result<Option<i64>, MetaError> {
        match self {
            Recorder::Direct(m) => m.answer_request(name, epoch, at, &answer).await,
            Recorder::Manager { .. } => {
                self.call(&Request::WriterAnswer {
                    name: name.to_string(),
                    epoch,
                    at,
                    answer,
                })
                .await
            }
        }
    }

    /// Records a replica's state for the writer of `epoch`.
    pub async fn set_state(
        &self,
        name: &str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => {
                trireme_control::record_replica_state(m, name, epoch, node, state, incarnation)
                    .await?;
            }
            Recorder::Manager { .. } => {
                self.call::<serde_json::Value>(&Request::SetReplicaState {
                    name: name.to_string(),
                    epoch,
                    node,
                    state,
                    incarnation,
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Records the volume's new size for the writer of `epoch`.
    pub async fn record_size(&self, name: &str, epoch: u64, size: u64) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => {
                trireme_control::record_size(m, name, epoch, size).await?;
            }
            Recorder::Manager { .. } => {
                self.call::<serde_json::Value>(&Request::SetVolumeSize {
                    name: name.to_string(),
                    epoch,
                    size,
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Records a parity region the writer of `epoch` on volume `id` switched.
    pub async fn record_region(
        &self,
        name: &str,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    ) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => m.record_region(name, id, epoch, region, to).await,
            Recorder::Manager { .. } => {
                self.call::<serde_json::Value>(&Request::SetRegion {
                    name: name.to_string(),
                    id,
                    epoch,
                    region,
                    to,
                })
                .await?;
                Ok(())
            }
        }
    }

    /// The writer's report of `name` (`lease`: the writer's attach lease, for a report
    /// written straight in the store; through the manager, the attach record's).
    pub async fn report(
        &self,
        name: &str,
        report: &trireme_meta::WriterReport,
        lease: i64,
    ) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => m.put_report(name, None, report, lease).await,
            Recorder::Manager { .. } => {
                self.call::<serde_json::Value>(&Request::WriterReport {
                    name: name.to_string(),
                    epoch: report.epoch,
                    report: report.clone(),
                })
                .await?;
                Ok(())
            }
        }
    }

    /// Records this process's NVMe/TCP export under `lease` (see
    /// `ClusterMeta::put_nvmf_export`): the holder's record if another process holds its
    /// port id.
    pub async fn nvmf_export(
        &self,
        record: &trireme_meta::NvmfExportRecord,
        lease: i64,
    ) -> Result<Option<trireme_meta::NvmfExportRecord>, MetaError> {
        match self {
            Recorder::Direct(m) => m.put_nvmf_export(record, lease).await,
            Recorder::Manager { .. } => {
                self.call(&Request::NvmfExport {
                    record: record.clone(),
                    lease,
                })
                .await
            }
        }
    }

    /// The writer of `epoch` left cleanly.
    pub async fn detach(&self, name: &str, epoch: u64) -> Result<(), MetaError> {
        match self {
            Recorder::Direct(m) => {
                trireme_control::record_detach(m, name, epoch).await?;
            }
            Recorder::Manager { .. } => {
                self.call::<serde_json::Value>(&Request::Detach {
                    name: name.to_string(),
                    epoch,
                })
                .await?;
            }
        }
        Ok(())
    }
}
