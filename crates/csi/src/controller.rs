//! The controller service: volumes (create, delete, expand, modify, list, capacity) and
//! publishing (the attach record and its fence). Snapshots are in `snapshots.rs`. Every call
//! is idempotent: asked twice, it does once and answers the same; a second call while the
//! first runs on the same object is ABORTED, as the spec asks.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};
use trireme_control::{ControlError, FenceWhere, Fenced, Request as Ctl, VolumeInfo, Warned};
use trireme_meta::VolumeRecord;

use crate::args::{check_caps, page, size_of, unsupported, BLOCK};
use crate::busy::{Busy, Hold};
use crate::errors::{invalid, not_found, ok, status, Answer};
use crate::params::{Changes, CreateParams};
use crate::pb::{self, controller_server::Controller, volume_capability, volume_content_source};
use crate::{ids, AccessChanged, Connect};

/// The controller service (cheap to clone: one per connection is fine).
#[derive(Clone)]
pub struct ControllerService {
    connect: Connect,
    busy: Busy,
    /// How long a deleted volume waits in the trash (none: the cluster's default, a day).
    trash_keep: Option<u64>,
    access_changed: Option<AccessChanged>,
}

impl std::fmt::Debug for ControllerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerService")
            .field("trash_keep", &self.trash_keep)
            .finish_non_exhaustive()
    }
}

impl ControllerService {
    pub fn new(connect: Connect, trash_keep: Option<u64>) -> ControllerService {
        ControllerService {
            connect,
            busy: Busy::default(),
            trash_keep,
            access_changed: None,
        }
    }

    /// Runs `f` after each volume it creates whose access list names clients
    /// ([`AccessChanged`]).
    pub fn on_access_change(mut self, f: AccessChanged) -> ControllerService {
        self.access_changed = Some(f);
        self
    }

    /// One control request.
    pub(crate) async fn call<T: DeserializeOwned>(&self, req: &Ctl) -> Result<T, ControlError> {
        let mut c = (self.connect)().await?;
        c.call(req).await
    }

    /// Whether the manager answers (the identity service's probe).
    pub(crate) async fn reachable(&self) -> Result<(), Status> {
        (self.connect)().await.map(drop).map_err(status)
    }

    /// Marks `key` busy, or ABORTED if a call works on it now.
    pub(crate) fn hold(&self, key: &str) -> Result<Hold, Status> {
        self.busy.hold(key)
    }

    /// The volume, if it exists.
    pub(crate) async fn info(&self, name: &str) -> Result<Option<VolumeInfo>, Status> {
        match self
            .call::<VolumeInfo>(&Ctl::VolumeInfo {
                name: name.to_string(),
            })
            .await
        {
            Ok(v) => Ok(Some(v)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(status(e)),
        }
    }

    async fn must_exist(&self, name: &str) -> Result<VolumeInfo, Status> {
        self.info(name)
            .await?
            .ok_or_else(|| Status::not_found(format!("volume {name} does not exist")))
    }
}

/// What a new volume starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Empty,
    Snapshot { volume: String, snapshot: String },
    Volume(String),
}

impl Source {
    fn from_request(s: Option<&pb::VolumeContentSource>) -> Result<Source, Status> {
        use volume_content_source::Type;
        Ok(match s.and_then(|s| s.r#type.as_ref()) {
            None => Source::Empty,
            Some(Type::Snapshot(s)) => {
                let (v, s) = ids::parse_snapshot_id(&s.snapshot_id)?;
                Source::Snapshot {
                    volume: v.into(),
                    snapshot: s.into(),
                }
            }
            Some(Type::Volume(v)) => Source::Volume(ids::volume_id(&v.volume_id)?.into()),
        })
    }

    /// The source a volume on record was made from: its parent snapshot, or the volume
    /// whose snapshot was taken for it (see [`ids::clone_source_snapshot`]).
    fn of(v: &VolumeRecord) -> Source {
        match &v.parent {
            None => Source::Empty,
            Some(p) if p.snapshot.starts_with(ids::CLONE_SOURCE) => {
                Source::Volume(p.volume.clone())
            }
            Some(p) => Source::Snapshot {
                volume: p.volume.clone(),
                snapshot: p.snapshot.clone(),
            },
        }
    }

    fn message(&self) -> Option<pb::VolumeContentSource> {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        let t = match self {
            Source::Empty => return None,
            Source::Snapshot { volume, snapshot } => Type::Snapshot(SnapshotSource {
                snapshot_id: ids::snapshot_id(volume, snapshot),
            }),
            Source::Volume(v) => Type::Volume(VolumeSource {
                volume_id: v.clone(),
            }),
        };
        Some(pb::VolumeContentSource { r#type: Some(t) })
    }
}

/// The CSI volume for a volume on record.
pub(crate) fn volume_message(v: &VolumeRecord) -> pb::Volume {
    pb::Volume {
        capacity_bytes: v.size as i64,
        volume_id: v.name.clone(),
        volume_context: HashMap::new(),
        content_source: Source::of(v).message(),
        accessible_topology: Vec::new(),
    }
}

impl ControllerService {
    /// A CreateVolume for a name that exists: the same volume if it fits the request.
    fn same(v: &VolumeRecord, size: u64, limit: i64, source: &Source) -> Result<(), Status> {
        let fits = v.size >= size && (limit == 0 || v.size <= limit as u64);
        if !fits || Source::of(v) != *source {
            return Err(Status::already_exists(format!(
                "volume {} exists with another size ({} bytes) or source",
                v.name, v.size
            )));
        }
        Ok(())
    }

    async fn create(
        &self,
        name: &str,
        size: u64,
        p: &CreateParams,
        source: &Source,
    ) -> Result<VolumeRecord, Status> {
        let v = match source {
            Source::Empty => {
                let v: Warned<VolumeRecord> = self
                    .call(&Ctl::VolumeCreate {
                        name: name.into(),
                        size,
                        replicas: p.replicas,
                        access: Some(p.access.clone()),
                        min_copies: p.changes.min_copies,
                        tier: p.changes.tier,
                        preallocate: p.preallocate,
                        layout: None,
                        limits: p.changes.limits,
                        qos_policy: p.changes.qos_policy.clone(),
                    })
                    .await
                    .map_err(status)?;
                return Ok(warn_of(v));
            }
            Source::Snapshot { volume, snapshot } => {
                self.clone_from(volume, snapshot, name, size).await?
            }
            Source::Volume(src) => {
                let snap = ids::clone_source_snapshot(name);
                let made: Result<serde_json::Value, _> = self
                    .call(&Ctl::SnapshotCreate {
                        name: src.clone(),
                        snapshot: snap.clone(),
                    })
                    .await;
                match made {
                    Ok(_) => {}
                    Err(e) if e.code() == trireme_control::ErrorCode::AlreadyExists => {}
                    Err(e) => return Err(status(e)),
                }
                self.clone_from(src, &snap, name, size).await?
            }
        };
        self.apply(name, &p.changes).await?;
        Ok(v)
    }

    /// A clone of `volume@snapshot` named `name`, grown to `size`.
    async fn clone_from(
        &self,
        volume: &str,
        snapshot: &str,
        name: &str,
        size: u64,
    ) -> Result<VolumeRecord, Status> {
        let mut v: VolumeRecord = self
            .call(&Ctl::VolumeClone {
                source: volume.into(),
                snapshot: snapshot.into(),
                name: name.into(),
            })
            .await
            .map_err(status)?;
        if v.size > size {
            // Made, but smaller than asked is not possible: say so; the CO deletes it.
            return Err(Status::out_of_range(format!(
                "the source is {} bytes, more than the {size} asked",
                v.size
            )));
        }
        if v.size < size {
            v = self.resize(name, size).await?;
        }
        Ok(v)
    }

    async fn resize(&self, name: &str, size: u64) -> Result<VolumeRecord, Status> {
        self.call(&Ctl::VolumeResize {
            name: name.into(),
            size,
            allow_shrink: false,
        })
        .await
        .map_err(status)
    }

    /// Applies mutable settings, if any.
    async fn apply(&self, name: &str, c: &Changes) -> Result<(), Status> {
        if c.is_empty() {
            return Ok(());
        }
        let v: Warned<VolumeRecord> = self
            .call(&Ctl::VolumeSet {
                name: name.into(),
                min_copies: c.min_copies,
                tier: c.tier,
                limits: c.limits,
                qos_policy: c.qos_policy.clone(),
            })
            .await
            .map_err(status)?;
        warn_of(v);
        Ok(())
    }

    /// Before `name` is deleted: the snapshots its clones were made from go if no clone reads
    /// them any more; any other snapshot refuses the delete. A VolumeSnapshot outlives its
    /// PVC, but trireme's snapshots live in their volume.
    async fn drop_clone_sources(&self, name: &str, v: &VolumeInfo) -> Result<(), Status> {
        let mut kept = Vec::new();
        for s in &v.snapshots {
            if !s.name.starts_with(ids::CLONE_SOURCE) {
                kept.push(s.name.clone());
                continue;
            }
            let done: Result<serde_json::Value, _> = self
                .call(&Ctl::SnapshotDelete {
                    name: name.into(),
                    snapshot: s.name.clone(),
                    force: false,
                })
                .await;
            if let Err(e) = done.map_err(status) {
                if e.code() != tonic::Code::NotFound {
                    return Err(Status::failed_precondition(format!(
                        "volume {name} is the source of a clone: {}",
                        e.message()
                    )));
                }
            }
        }
        if !kept.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {name} has snapshots ({}): delete its VolumeSnapshots first",
                kept.join(", ")
            )));
        }
        Ok(())
    }

    /// Fences the volume's writer where `at` says.
    async fn fence(&self, name: &str, at: FenceWhere) -> Result<Fenced, ControlError> {
        self.call(&Ctl::VolumeFence {
            name: name.into(),
            at,
        })
        .await
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        r: Request<pb::CreateVolumeRequest>,
    ) -> Answer<pb::CreateVolumeResponse> {
        let r = r.into_inner();
        let name = ids::trireme_name(&r.name)?;
        check_caps(&r.volume_capabilities)?;
        let size = size_of(r.capacity_range.as_ref())?;
        let limit = r.capacity_range.as_ref().map_or(0, |c| c.limit_bytes);
        let p = CreateParams::parse(&r.parameters, &r.mutable_parameters)?;
        let source = Source::from_request(r.volume_content_source.as_ref())?;
        let _h = self.hold(&name)?;
        let v = match self.info(&name).await? {
            Some(v) => {
                Self::same(&v.record, size, limit, &source)?;
                v.record
            }
            None => {
                let v = self.create(&name, size, &p, &source).await?;
                let names_clients = p.access.iter().any(|a| a != "*");
                if let (Some(f), true) = (&self.access_changed, names_clients) {
                    f().await;
                }
                v
            }
        };
        tracing::info!(
            volume = name,
            csi_name = r.name,
            size = v.size,
            "CSI volume created"
        );
        ok(pb::CreateVolumeResponse {
            volume: Some(volume_message(&v)),
        })
    }

    async fn delete_volume(
        &self,
        r: Request<pb::DeleteVolumeRequest>,
    ) -> Answer<pb::DeleteVolumeResponse> {
        let r = r.into_inner();
        let name = match ids::volume_id(&r.volume_id) {
            Ok(n) => n,
            Err(e) if e.code() == tonic::Code::NotFound => return ok(pb::DeleteVolumeResponse {}),
            Err(e) => return Err(e),
        };
        let _h = self.hold(name)?;
        let Some(v) = self.info(name).await? else {
            return ok(pb::DeleteVolumeResponse {});
        };
        self.drop_clone_sources(name, &v).await?;
        let done: Result<serde_json::Value, _> = self
            .call(&Ctl::VolumeDelete {
                name: name.into(),
                force: false,
                keep_secs: self.trash_keep,
            })
            .await;
        match done {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(status(e)),
        }
        // A clone of a volume: the snapshot of it this clone read goes once the clone is out
        // of the trash (the source's own DeleteVolume tries again).
        if let Some(p) = v
            .record
            .parent
            .as_ref()
            .filter(|p| p.snapshot.starts_with(ids::CLONE_SOURCE))
        {
            let _: Result<serde_json::Value, _> = self
                .call(&Ctl::SnapshotDelete {
                    name: p.volume.clone(),
                    snapshot: p.snapshot.clone(),
                    force: false,
                })
                .await;
        }
        tracing::info!(volume = name, "CSI volume deleted (to the trash)");
        ok(pb::DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        r: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Answer<pb::ControllerPublishVolumeResponse> {
        let r = r.into_inner();
        let name = ids::volume_id(&r.volume_id)?;
        if r.node_id.is_empty() {
            return Err(invalid("node_id is required"));
        }
        let cap = r
            .volume_capability
            .ok_or_else(|| invalid("volume_capability is required"))?;
        check_caps(std::slice::from_ref(&cap))?;
        let _h = self.hold(name)?;
        // A writer on another node is fenced now: its node may be dead, and its I/O is
        // refused from the new epoch on, so the volume moves at once.
        let f = self
            .fence(
                name,
                FenceWhere {
                    host: None,
                    except: Some(r.node_id.clone()),
                },
            )
            .await
            .map_err(status)?;
        if let Some(w) = &f.writer {
            tracing::warn!(
                volume = name,
                node = r.node_id,
                fenced = w,
                "published to a new node: the old writer is fenced"
            );
        }
        ok(pb::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("epoch".to_string(), f.epoch.to_string())]),
        })
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Answer<pb::ControllerUnpublishVolumeResponse> {
        let r = r.into_inner();
        let name = match ids::volume_id(&r.volume_id) {
            Ok(n) => n,
            Err(e) if e.code() == tonic::Code::NotFound => {
                return ok(pb::ControllerUnpublishVolumeResponse {})
            }
            Err(e) => return Err(e),
        };
        let _h = self.hold(name)?;
        let at = FenceWhere {
            host: Some(r.node_id.clone()).filter(|n| !n.is_empty()),
            except: None,
        };
        match self.fence(name, at).await {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(status(e)),
        }
        ok(pb::ControllerUnpublishVolumeResponse {})
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Answer<pb::ValidateVolumeCapabilitiesResponse> {
        let r = r.into_inner();
        let name = ids::volume_id(&r.volume_id)?;
        if r.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities is required"));
        }
        self.must_exist(name).await?;
        if let Some(why) = r.volume_capabilities.iter().find_map(unsupported) {
            return ok(pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            });
        }
        if let Err(e) = CreateParams::parse(&r.parameters, &HashMap::new()) {
            return ok(pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.message().to_string(),
            });
        }
        ok(pb::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
            }),
            message: String::new(),
        })
    }

    async fn list_volumes(
        &self,
        r: Request<pb::ListVolumesRequest>,
    ) -> Answer<pb::ListVolumesResponse> {
        let r = r.into_inner();
        let mut all: Vec<VolumeRecord> = self.call(&Ctl::VolumeList).await.map_err(status)?;
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let (page, next_token) = page(&all, r.max_entries, &r.starting_token)?;
        ok(pb::ListVolumesResponse {
            entries: page
                .iter()
                .map(|v| pb::list_volumes_response::Entry {
                    volume: Some(volume_message(v)),
                    status: None,
                })
                .collect(),
            next_token,
        })
    }

    async fn get_capacity(
        &self,
        r: Request<pb::GetCapacityRequest>,
    ) -> Answer<pb::GetCapacityResponse> {
        let r = r.into_inner();
        let p = CreateParams::parse(&r.parameters, &HashMap::new())?;
        let s: trireme_control::StatusReport = self.call(&Ctl::Status).await.map_err(status)?;
        let active = s
            .nodes
            .iter()
            .filter(|n| n.state == trireme_meta::NodeState::Active)
            .count();
        let copies = match p.replicas {
            0 => active.clamp(1, 3),
            n => n,
        };
        let pool = trireme_control::pool::PoolReport::from_status(&s);
        let room = pool.largest_new_volume[copies - 1].min(i64::MAX as u64) as i64;
        ok(pb::GetCapacityResponse {
            available_capacity: room,
            maximum_volume_size: Some(room),
            minimum_volume_size: Some(BLOCK as i64),
        })
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Answer<pb::ControllerGetCapabilitiesResponse> {
        use pb::controller_service_capability::{rpc::Type as T, Rpc, Type};
        let capabilities = [
            T::CreateDeleteVolume,
            T::PublishUnpublishVolume,
            T::ListVolumes,
            T::GetCapacity,
            T::CreateDeleteSnapshot,
            T::ListSnapshots,
            T::CloneVolume,
            T::ExpandVolume,
            T::GetVolume,
            T::VolumeCondition,
            T::ModifyVolume,
        ]
        .into_iter()
        .map(|t| pb::ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        ok(pb::ControllerGetCapabilitiesResponse { capabilities })
    }

    async fn create_snapshot(
        &self,
        r: Request<pb::CreateSnapshotRequest>,
    ) -> Answer<pb::CreateSnapshotResponse> {
        self.snapshot_create(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_snapshot(
        &self,
        r: Request<pb::DeleteSnapshotRequest>,
    ) -> Answer<pb::DeleteSnapshotResponse> {
        self.snapshot_delete(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_snapshots(
        &self,
        r: Request<pb::ListSnapshotsRequest>,
    ) -> Answer<pb::ListSnapshotsResponse> {
        self.snapshot_list(r.into_inner()).await.map(Response::new)
    }

    async fn controller_expand_volume(
        &self,
        r: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Answer<pb::ControllerExpandVolumeResponse> {
        let r = r.into_inner();
        let name = ids::volume_id(&r.volume_id)?;
        let size = match r.capacity_range.as_ref() {
            Some(c) if c.required_bytes > 0 || c.limit_bytes > 0 => size_of(Some(c))?,
            _ => return Err(invalid("capacity_range is required")),
        };
        let _h = self.hold(name)?;
        let v = self.must_exist(name).await?.record;
        let v = match v.size >= size {
            true => v,
            false => self.resize(name, size).await?,
        };
        // A filesystem on it is grown by the node (NodeExpandVolume); a raw device is not.
        let block = matches!(
            r.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(volume_capability::AccessType::Block(_))
        );
        ok(pb::ControllerExpandVolumeResponse {
            capacity_bytes: v.size as i64,
            node_expansion_required: !block,
        })
    }

    async fn controller_get_volume(
        &self,
        r: Request<pb::ControllerGetVolumeRequest>,
    ) -> Answer<pb::ControllerGetVolumeResponse> {
        let name = ids::volume_id(&r.get_ref().volume_id)?.to_string();
        let v = self.must_exist(&name).await?;
        let out: Vec<String> = v
            .record
            .replicas
            .iter()
            .filter(|r| r.state != trireme_replication::ReplicaState::InSync)
            .map(|r| format!("node {}: {}", r.node, r.state))
            .collect();
        let condition = pb::VolumeCondition {
            abnormal: !out.is_empty(),
            message: match out.is_empty() {
                true => "every copy in sync".into(),
                false => format!("copies not in sync: {}", out.join(", ")),
            },
        };
        ok(pb::ControllerGetVolumeResponse {
            volume: Some(volume_message(&v.record)),
            status: Some(pb::controller_get_volume_response::VolumeStatus {
                published_node_ids: v.writer.and_then(|w| w.host).into_iter().collect(),
                volume_condition: Some(condition),
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        r: Request<pb::ControllerModifyVolumeRequest>,
    ) -> Answer<pb::ControllerModifyVolumeResponse> {
        let r = r.into_inner();
        let name = ids::volume_id(&r.volume_id)?;
        let c = Changes::parse(&r.mutable_parameters)?;
        let _h = self.hold(name)?;
        self.must_exist(name).await?;
        self.apply(name, &c).await?;
        ok(pb::ControllerModifyVolumeResponse {})
    }
}

/// The volume, its warnings logged (a CO has nowhere to show them: reserves past what its
/// nodes serve are also in `trireme status`).
fn warn_of(v: Warned<VolumeRecord>) -> VolumeRecord {
    for w in &v.warnings {
        tracing::warn!(volume = %v.value.name, "{w}");
    }
    v.value
}
