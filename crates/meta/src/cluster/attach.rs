//! Attach records: who writes each volume, at which epoch, under which lease.

use super::*;
use crate::kv::{Compare, KeyValue, LeaseId, Op, Txn};
use crate::{MetaError, VolumeRecord};

impl ClusterMeta {
    /// Every attach record, by volume name. One that does not decode is skipped, named in a
    /// warning: one bad record must not hide every writer.
    pub async fn attachments(
        &self,
    ) -> Result<std::collections::BTreeMap<String, AttachRecord>, MetaError> {
        let dir = key("attach/");
        let (kvs, _) = self.store.range(&dir).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| match decode(kv) {
                Ok(a) => Some((kv.key[dir.len()..].to_string(), a)),
                Err(e) => {
                    tracing::warn!("skipping an attach record: {e}");
                    None
                }
            })
            .collect())
    }

    /// Where the attach records live (for watches).
    pub fn attach_prefix() -> String {
        key("attach/")
    }

    /// Who writes `name` now (its lease-bound attach record) and the record's revision.
    pub async fn attachment(
        &self,
        name: &str,
    ) -> Result<Option<(AttachRecord, KeyValue)>, MetaError> {
        self.get(&key(&format!("attach/{name}"))).await
    }

    /// Changes `name`'s layout while no writer holds it, as [`ClusterMeta::update_volume`]
    /// does, comparing the attach record's absence in the same transaction and bumping the
    /// epoch: a writer whose lease lapsed cannot come back ([`ClusterMeta::reattach`]) and
    /// write its older view over the change. Refused ([`MetaError::Attached`]) while one
    /// holds it.
    pub async fn update_unattached(
        &self,
        name: &str,
        f: &mut (dyn FnMut(&mut VolumeRecord) -> Result<(), MetaError> + Send),
    ) -> Result<VolumeRecord, MetaError> {
        self.update_layout(name, f, true).await
    }

    /// Becomes the writer of `name`: in one transaction, bumps the epoch, marks the writer
    /// open and puts `rec` (its epoch filled in) under `lease`, comparing the revisions of the
    /// layout and of the attach record it read — refused if an attach record exists, unless
    /// `force` (which fences the holder: its epoch is now stale). Returns the
    /// volume and whether the previous writer left without detaching.
    pub async fn attach(
        &self,
        name: &str,
        rec: &AttachRecord,
        lease: LeaseId,
        force: bool,
    ) -> Result<(VolumeRecord, bool), MetaError> {
        let (ak, lk) = (
            key(&format!("attach/{name}")),
            key(&format!("layouts/{name}")),
        );
        for _ in 0..MAX_TRIES {
            let held = self.attachment(name).await?;
            if let (Some((a, _)), false) = (&held, force) {
                return Err(attached(name, a, true));
            }
            let (mut v, rev) = self.read_volume(name).await?;
            let unclean = v.writer_open;
            v.epoch += 1;
            v.writer_open = true;
            let mine = AttachRecord {
                epoch: v.epoch,
                ..rec.clone()
            };
            // Both or neither: the new epoch and the record that says who holds it.
            let done = self
                .write(
                    vec![
                        Compare::mod_revision(lk.clone(), rev),
                        Compare::mod_revision(
                            ak.clone(),
                            held.as_ref().map_or(0, |(_, kv)| kv.mod_revision),
                        ),
                    ],
                    vec![
                        Op::put(lk.clone(), encode(&layout_of(&v))),
                        Op::put_leased(ak.clone(), encode(&mine), lease),
                    ],
                )
                .await?;
            if done.is_some() {
                return Ok((v, unclean));
            }
        }
        Err(MetaError::Contended {
            what: format!("attaching volume {name:?}"),
            tries: MAX_TRIES,
        })
    }

    /// Puts the attach record `rec` of the writer of epoch `rec.epoch` back, under `lease`,
    /// after its lease was lost (etcd unreachable for longer than the TTL): re-bound if it is
    /// still there, re-created if it expired — but only while no other writer attached since
    /// (the layout's epoch is still `rec.epoch`). Refused when one did: this writer is fenced.
    pub async fn reattach(
        &self,
        name: &str,
        rec: &AttachRecord,
        lease: LeaseId,
    ) -> Result<(), MetaError> {
        let (ak, lk) = (
            key(&format!("attach/{name}")),
            key(&format!("layouts/{name}")),
        );
        for _ in 0..MAX_TRIES {
            let compare = match self.attachment(name).await? {
                Some((a, kv)) if a.epoch == rec.epoch => {
                    vec![Compare::mod_revision(ak.clone(), kv.mod_revision)]
                }
                Some((a, _)) => {
                    return Err(MetaError::Attached {
                        volume: name.to_string(),
                        pid: a.pid,
                        host: a.host,
                        epoch: a.epoch,
                        force_fences: false,
                    })
                }
                None => {
                    let (v, rev) = self.read_volume(name).await?;
                    if v.epoch != rec.epoch {
                        return Err(MetaError::Refused(format!(
                            "volume {name:?} has a newer writer (epoch {})",
                            v.epoch
                        )));
                    }
                    vec![
                        Compare::mod_revision(lk.clone(), rev),
                        Compare::mod_revision(ak.clone(), 0),
                    ]
                }
            };
            let done = self
                .write(
                    compare,
                    vec![Op::put_leased(ak.clone(), encode(rec), lease)],
                )
                .await?;
            if done.is_some() {
                return Ok(());
            }
        }
        Err(MetaError::Contended {
            what: format!("putting back the attach record of {name:?}"),
            tries: MAX_TRIES,
        })
    }

    /// Drops the attach record of `name` if it is still the one of `epoch`.
    pub async fn release_attachment(&self, name: &str, epoch: u64) -> Result<(), MetaError> {
        if let Some((a, kv)) = self.attachment(name).await? {
            if a.epoch == epoch {
                let ak = key(&format!("attach/{name}"));
                self.store
                    .txn(
                        Txn::when(vec![Compare::mod_revision(ak.clone(), kv.mod_revision)])
                            .then(vec![Op::delete(ak)]),
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

/// The refusal of a change `a`'s writer stands in the way of (`force_fences`: whether
/// `--force` would take the volume over).
pub(super) fn attached(name: &str, a: &AttachRecord, force_fences: bool) -> MetaError {
    MetaError::Attached {
        volume: name.to_string(),
        pid: a.pid,
        host: a.host.clone(),
        epoch: a.epoch,
        force_fences,
    }
}
