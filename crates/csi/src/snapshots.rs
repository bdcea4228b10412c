//! The controller's snapshots: CreateSnapshot, DeleteSnapshot, ListSnapshots. A snapshot's
//! id is `VOLUME@SNAPSHOT`; CSI's names are global, so a name taken on another volume is
//! ALREADY_EXISTS. The snapshots a clone of a volume is made from (see `controller.rs`) are
//! not the CO's and are not listed.

use tonic::Status;
use trireme_control::{Request as Ctl, SnapshotInfo};
use trireme_meta::VolumeRecord;

use crate::args::page;
use crate::errors::{invalid, not_found, status};
use crate::{ids, pb, ControllerService};

fn message(volume: &str, s: &SnapshotInfo) -> pb::Snapshot {
    pb::Snapshot {
        size_bytes: s.size as i64,
        snapshot_id: ids::snapshot_id(volume, &s.name),
        source_volume_id: volume.to_string(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created as i64,
            nanos: 0,
        }),
        ready_to_use: s.state == "ready",
        group_snapshot_id: String::new(),
    }
}

impl ControllerService {
    /// `volume`'s snapshots (none if it does not exist).
    async fn snapshots_of(&self, volume: &str) -> Result<Vec<SnapshotInfo>, Status> {
        match self
            .call::<Vec<SnapshotInfo>>(&Ctl::SnapshotList {
                name: volume.to_string(),
            })
            .await
        {
            Ok(l) => Ok(l),
            Err(e) if not_found(&e) => Ok(Vec::new()),
            Err(e) => Err(status(e)),
        }
    }

    /// Every CO snapshot of the volumes given (`None`: all), as (volume, snapshot).
    async fn all_snapshots(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<(String, SnapshotInfo)>, Status> {
        let vols: Vec<VolumeRecord> = self.call(&Ctl::VolumeList).await.map_err(status)?;
        let mut out = Vec::new();
        for v in vols.iter().filter(|v| only.is_none_or(|o| o == v.name)) {
            for s in self.snapshots_of(&v.name).await? {
                if !s.name.starts_with(ids::CLONE_SOURCE) {
                    out.push((v.name.clone(), s));
                }
            }
        }
        out.sort_by(|a, b| (&a.0, a.1.id).cmp(&(&b.0, b.1.id)));
        Ok(out)
    }

    pub(crate) async fn snapshot_create(
        &self,
        r: pb::CreateSnapshotRequest,
    ) -> Result<pb::CreateSnapshotResponse, Status> {
        if r.source_volume_id.is_empty() {
            return Err(invalid("source_volume_id is required"));
        }
        let volume = ids::volume_id(&r.source_volume_id)?;
        let snap = ids::trireme_name(&r.name)?;
        if !r.parameters.is_empty() {
            let mut keys: Vec<&String> = r.parameters.keys().collect();
            keys.sort();
            return Err(invalid(format!(
                "unknown snapshot parameters {keys:?}: a VolumeSnapshotClass for trireme takes none"
            )));
        }
        let _h = self.hold(&format!("{volume}@{snap}"))?;
        for (v, s) in self.all_snapshots(None).await? {
            if s.name == snap {
                if v != volume {
                    return Err(Status::already_exists(format!(
                        "snapshot name {} is taken on volume {v}",
                        r.name
                    )));
                }
                return Ok(pb::CreateSnapshotResponse {
                    snapshot: Some(message(&v, &s)),
                });
            }
        }
        let s: SnapshotInfo = self
            .call(&Ctl::SnapshotCreate {
                name: volume.to_string(),
                snapshot: snap.clone(),
            })
            .await
            .map_err(status)?;
        tracing::info!(
            volume,
            snapshot = snap,
            csi_name = r.name,
            "CSI snapshot taken"
        );
        Ok(pb::CreateSnapshotResponse {
            snapshot: Some(message(volume, &s)),
        })
    }

    pub(crate) async fn snapshot_delete(
        &self,
        r: pb::DeleteSnapshotRequest,
    ) -> Result<pb::DeleteSnapshotResponse, Status> {
        let (volume, snap) = match ids::parse_snapshot_id(&r.snapshot_id) {
            Ok(x) => x,
            Err(e) if e.code() == tonic::Code::NotFound => {
                return Ok(pb::DeleteSnapshotResponse {})
            }
            Err(e) => return Err(e),
        };
        let _h = self.hold(&r.snapshot_id)?;
        let done: Result<serde_json::Value, _> = self
            .call(&Ctl::SnapshotDelete {
                name: volume.to_string(),
                snapshot: snap.to_string(),
                force: false,
            })
            .await;
        match done {
            Ok(_) => {}
            // Deleted before, or its volume is gone: deleted, as far as the CO is concerned.
            Err(e) if not_found(&e) => {}
            // A clone reads it, or an export holds it.
            Err(e) => return Err(status(e)),
        }
        Ok(pb::DeleteSnapshotResponse {})
    }

    pub(crate) async fn snapshot_list(
        &self,
        r: pb::ListSnapshotsRequest,
    ) -> Result<pb::ListSnapshotsResponse, Status> {
        let empty = pb::ListSnapshotsResponse::default();
        let wanted = match r.snapshot_id.as_str() {
            "" => None,
            id => match ids::parse_snapshot_id(id) {
                Ok((v, s)) => Some((v.to_string(), s.to_string())),
                Err(_) => return Ok(empty),
            },
        };
        let only = match (&wanted, r.source_volume_id.as_str()) {
            (Some((v, _)), src) if !src.is_empty() && src != v => return Ok(empty),
            (Some((v, _)), _) => Some(v.clone()),
            (None, "") => None,
            (None, src) => Some(src.to_string()),
        };
        let mut all = self.all_snapshots(only.as_deref()).await?;
        if let Some((_, s)) = &wanted {
            all.retain(|(_, x)| &x.name == s);
        }
        let (page, next_token) = page(&all, r.max_entries, &r.starting_token)?;
        Ok(pb::ListSnapshotsResponse {
            entries: page
                .iter()
                .map(|(v, s)| pb::list_snapshots_response::Entry {
                    snapshot: Some(message(v, s)),
                })
                .collect(),
            next_token,
        })
    }
}
