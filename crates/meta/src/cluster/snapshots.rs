//! Snapshot records (`snapshots/<volume>/<name>`): what a snapshot is called, its id on the
//! copies (ids come from one counter, `next-snapshot-id`, and are never reused), when it was
//! taken, which nodes hold it, and where its life is.

use serde::{Deserialize, Serialize};

use super::*;
use crate::kv::{Compare, Op};
use crate::{MetaError, VolumeRecord};

/// Where a snapshot's life is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotState {
    /// Recorded, and asked of the writer: not readable yet (a creation a crash cut short
    /// stays here until deleted).
    Creating,
    /// On every node of `nodes`.
    Ready,
    /// Being deleted from the nodes; gone when the record is.
    Deleting,
}

impl SnapshotState {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Creating => "creating",
            SnapshotState::Ready => "ready",
            SnapshotState::Deleting => "deleting",
        }
    }
}

/// One snapshot of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The volume's id: a record left by a deleted volume of the same name is not its.
    pub volume_id: u64,
    pub name: String,
    /// Its id on the copies.
    pub id: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub state: SnapshotState,
    /// The nodes whose copies hold it.
    #[serde(default)]
    pub nodes: Vec<u32>,
    /// Its size in bytes: the volume's when it was taken (0 in records from before volumes
    /// with snapshots could be resized, whose snapshots all have the volume's size;
    /// [`SnapshotRecord::size_of`]).
    #[serde(default)]
    pub size: u64,
}

impl SnapshotRecord {
    /// Its size in bytes, of volume `v`'s snapshot.
    pub fn size_of(&self, v: &crate::VolumeRecord) -> u64 {
        match self.size {
            0 => v.size,
            s => s,
        }
    }
}

impl ClusterMeta {
    fn snapshot_key(volume: &str, name: &str) -> String {
        key(&format!("snapshots/{volume}/{name}"))
    }

    /// Records a new snapshot `name` of `volume` (state `Creating`), with a new id. Refused
    /// if the volume has one of that name.
    pub async fn create_snapshot_record(
        &self,
        volume: &VolumeRecord,
        name: &str,
        created: u64,
    ) -> Result<SnapshotRecord, MetaError> {
        if crate::check_name(name).is_err() {
            return Err(MetaError::Refused(format!(
                "invalid snapshot name {name:?}: use 1-64 characters from [A-Za-z0-9._-], not starting with a dot"
            )));
        }
        let k = Self::snapshot_key(&volume.name, name);
        let counter = key("next-snapshot-id");
        for _ in 0..MAX_TRIES {
            if let Some((old, _)) = self.get::<SnapshotRecord>(&k).await? {
                if old.volume_id == volume.id {
                    return Err(MetaError::Refused(format!(
                        "volume {} already has a snapshot named {name:?} ({})",
                        volume.name,
                        old.state.as_str()
                    )));
                }
            }
            let c = self.store.get(&counter).await?;
            let id = counter_value(&counter, c.as_ref())?;
            let rec = SnapshotRecord {
                volume_id: volume.id,
                name: name.to_string(),
                id,
                created,
                state: SnapshotState::Creating,
                nodes: Vec::new(),
                size: 0,
            };
            let old_rev = self.store.get(&k).await?.map_or(0, |kv| kv.mod_revision);
            let done = self
                .write(
                    vec![
                        Compare::mod_revision(k.clone(), old_rev),
                        Compare::mod_revision(
                            counter.clone(),
                            c.as_ref().map_or(0, |kv| kv.mod_revision),
                        ),
                    ],
                    vec![
                        Op::put(k.clone(), encode(&rec)),
                        Op::put(counter.clone(), (id + 1).to_string()),
                    ],
                )
                .await?;
            if done.is_some() {
                return Ok(rec);
            }
        }
        Err(MetaError::Contended {
            what: format!("recording snapshot {name:?} of volume {}", volume.name),
            tries: MAX_TRIES,
        })
    }

    /// Replaces the record of a snapshot.
    pub async fn put_snapshot_record(
        &self,
        volume: &str,
        rec: &SnapshotRecord,
    ) -> Result<(), MetaError> {
        self.write(
            vec![],
            vec![Op::put(Self::snapshot_key(volume, &rec.name), encode(rec))],
        )
        .await?
        .ok_or_else(|| MetaError::Refused("snapshot record: conflicting write".into()))?;
        Ok(())
    }

    pub async fn delete_snapshot_record(&self, volume: &str, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::snapshot_key(volume, name))])
            .await?;
        Ok(())
    }

    /// The snapshots of `volume` (of this volume id: records a deleted volume of that name
    /// left are not listed), oldest first.
    pub async fn snapshots(&self, volume: &VolumeRecord) -> Result<Vec<SnapshotRecord>, MetaError> {
        let mut all: Vec<SnapshotRecord> = self
            .list::<SnapshotRecord>(&format!("snapshots/{}/", volume.name))
            .await?
            .into_iter()
            .filter(|s| s.volume_id == volume.id)
            .collect();
        all.sort_by_key(|s| (s.created, s.id));
        Ok(all)
    }

    /// Snapshot `name` of `volume`.
    pub async fn snapshot(
        &self,
        volume: &VolumeRecord,
        name: &str,
    ) -> Result<SnapshotRecord, MetaError> {
        match self
            .get::<SnapshotRecord>(&Self::snapshot_key(&volume.name, name))
            .await?
        {
            Some((s, _)) if s.volume_id == volume.id => Ok(s),
            _ => Err(MetaError::NoSnapshot {
                volume: volume.name.clone(),
                name: name.to_string(),
            }),
        }
    }
}

/// The manager asks a volume's writer on another host to take a snapshot
/// (`snapshot-asks/<volume>`), as it asks for a resize; the writer answers in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotAsk {
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    pub id: u64,
    pub created: u64,
    pub state: crate::ScrubState,
    /// With `Done`: the nodes that took it.
    #[serde(default)]
    pub nodes: Vec<u32>,
    /// With `Done`: its size (0 from a writer from before snapshots had sizes).
    #[serde(default)]
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ClusterMeta {
    /// The key of `name`'s snapshot request (for watches).
    pub fn snapshot_ask_key(name: &str) -> String {
        key(&format!("snapshot-asks/{name}"))
    }

    /// Puts a snapshot request for `name` (`rev` 0: only if there is none; else an update of
    /// the one at revision `rev`). Its new revision, or `None`: it changed meanwhile.
    pub async fn put_snapshot_ask(
        &self,
        name: &str,
        req: &SnapshotAsk,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::snapshot_ask_key(name), encode(req), rev)
            .await
    }

    pub async fn snapshot_ask(&self, name: &str) -> Result<Option<(SnapshotAsk, i64)>, MetaError> {
        Ok(self
            .get::<SnapshotAsk>(&Self::snapshot_ask_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    pub async fn delete_snapshot_ask(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::snapshot_ask_key(name))])
            .await?;
        Ok(())
    }
}
