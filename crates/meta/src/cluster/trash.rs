//! The trash: a deleted volume's records wait here, its replicas untouched on their nodes,
//! until it is restored or its time is up and the manager purges it.
//!
//! A volume in the trash is under `trash/<id>` (ids are never reused, so a name deleted twice
//! leaves two entries); its `volumes/`, `layouts/`, `attach/`, `moves/` and `takeouts/` keys
//! are gone, so no writer can attach it and the nodes' access rules (which follow the
//! layouts) refuse its clients. Restoring puts the spec and layout back as they were, epoch
//! and replica states included: a writer that was open when it was deleted (`--force`) left
//! it open, and the next writer reconciles.

use serde::{Deserialize, Serialize};

use super::volumes::{layout_of, spec_of};
use super::*;
use crate::kv::{Compare, Op};
use crate::{MetaError, VolumeRecord};

/// A deleted volume, as the trash keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrashRecord {
    /// The volume as it was when deleted.
    pub volume: VolumeRecord,
    /// When it was deleted, in seconds since the Unix epoch.
    pub deleted_at: u64,
    /// When the manager may purge it (free its replicas), in seconds since the Unix epoch.
    pub purge_at: u64,
    /// Who deleted it (the identity of the request), for the record.
    #[serde(default)]
    pub deleted_by: String,
}

impl ClusterMeta {
    fn trash_key(id: u64) -> String {
        key(&format!("trash/{id:020}"))
    }

    /// Moves volume `name` to the trash in one transaction: its records leave the live keys
    /// (with its attach record, move and take-out requests), the trash keeps them. Refused if
    /// the layout changed since `expect` was read (a writer attached or recorded a state
    /// meanwhile: the caller looks again).
    pub async fn trash_volume(
        &self,
        expect: &VolumeRecord,
        deleted_at: u64,
        purge_at: u64,
        deleted_by: &str,
    ) -> Result<TrashRecord, MetaError> {
        let name = expect.name.as_str();
        let (v, rev) = self.read_volume(name).await?;
        if v != *expect {
            return Err(MetaError::Refused(format!(
                "volume {name:?} changed while it was being deleted; try again"
            )));
        }
        let rec = TrashRecord {
            volume: v,
            deleted_at,
            purge_at,
            deleted_by: deleted_by.to_string(),
        };
        let tk = Self::trash_key(rec.volume.id);
        let done = self
            .write(
                vec![
                    Compare::mod_revision(key(&format!("layouts/{name}")), rev),
                    Compare::absent(tk.clone()),
                ],
                vec![
                    Op::put(tk, encode(&rec)),
                    Op::delete(key(&format!("volumes/{name}"))),
                    Op::delete(key(&format!("layouts/{name}"))),
                    Op::delete(key(&format!("attach/{name}"))),
                    Op::delete(key(&format!("moves/{name}"))),
                    Op::delete(key(&format!("takeouts/{name}"))),
                    Op::delete(key(&format!("scrubs/{name}"))),
                    Op::delete(key(&format!("scrubbed/{name}"))),
                ],
            )
            .await?;
        match done {
            Some(_) => Ok(rec),
            None => Err(MetaError::Refused(format!(
                "volume {name:?} changed while it was being deleted; try again"
            ))),
        }
    }

    /// Every volume in the trash, oldest deletion first.
    pub async fn trashed(&self) -> Result<Vec<TrashRecord>, MetaError> {
        let mut out: Vec<TrashRecord> = self.list("trash/").await?;
        out.sort_by_key(|t| (t.deleted_at, t.volume.id));
        Ok(out)
    }

    /// Puts a trashed volume back under its name, as it was. Refused if a live volume has
    /// taken the name meanwhile (delete or rename that one first).
    pub async fn restore_volume(&self, id: u64) -> Result<VolumeRecord, MetaError> {
        let tk = Self::trash_key(id);
        let Some((rec, kv)) = self.get::<TrashRecord>(&tk).await? else {
            return Err(MetaError::Refused(format!(
                "no volume with id {id} in the trash"
            )));
        };
        let v = rec.volume;
        let name = v.name.as_str();
        let spec_key = key(&format!("volumes/{name}"));
        let done = self
            .write(
                vec![
                    Compare::mod_revision(tk.clone(), kv.mod_revision),
                    Compare::absent(spec_key.clone()),
                    Compare::absent(key(&format!("layouts/{name}"))),
                ],
                vec![
                    Op::delete(tk),
                    Op::put(spec_key.clone(), encode(&spec_of(&v))),
                    Op::put(key(&format!("layouts/{name}")), encode(&layout_of(&v))),
                ],
            )
            .await?;
        if done.is_some() {
            return Ok(v);
        }
        if self.store.get(&spec_key).await?.is_some() {
            return Err(MetaError::VolumeExists(name.to_string()));
        }
        Err(MetaError::Refused(format!(
            "the trash entry of volume {name:?} changed meanwhile; try again"
        )))
    }

    /// Forgets a trashed volume once its replicas are gone (the purge's last step).
    pub async fn forget_trashed(&self, id: u64) -> Result<(), MetaError> {
        self.forget_regions(id).await?;
        self.write(vec![], vec![Op::delete(Self::trash_key(id))])
            .await?
            .ok_or_else(|| MetaError::Refused("trash: conflicting write".into()))?;
        Ok(())
    }
}
