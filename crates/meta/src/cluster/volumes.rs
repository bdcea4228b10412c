//! Volumes: a spec (never changes) and a layout (replicas, states, epoch, access, and the
//! size once the volume was resized: the spec keeps the size it was created with).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trireme_replication::ReplicaState;

use super::*;
use crate::kv::{Compare, KeyValue, Op, Txn};
use crate::{check_name, MetaError, ReplicaRecord, VolumeRecord};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Spec {
    id: u64,
    name: String,
    size: u64,
    /// Thick: every replica reserves its whole size at creation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    preallocate: bool,
    /// How its bytes are kept; a mirror unless said. Part of the spec: written once.
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::Layout::is_mirror"
    )]
    layout: trireme_replication::Layout,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Layout {
    replicas: Vec<ReplicaRecord>,
    epoch: u64,
    #[serde(default)]
    writer_open: bool,
    #[serde(default = "crate::any_client")]
    access: Vec<String>,
    #[serde(default, skip_serializing_if = "crate::is_zero32")]
    min_copies: u32,
    #[serde(default, skip_serializing_if = "crate::TierPolicy::is_auto")]
    tier: crate::TierPolicy,
    /// The size now, if the volume was resized (a writer records it: the layout is what a
    /// writer may write, and it is compared with every change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    /// A clone's parent snapshot, until it is flattened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<crate::CloneOf>,
    /// Its I/O limits: in the layout, whose key its writer watches.
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::qos::Limits::is_default"
    )]
    limits: trireme_replication::qos::Limits,
    /// Its QoS policy and what it gives the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    qos: Option<crate::PolicyShare>,
}

pub(crate) fn record(spec: Spec, layout: Layout) -> VolumeRecord {
    VolumeRecord {
        id: spec.id,
        name: spec.name,
        size: layout.size.unwrap_or(spec.size),
        preallocate: spec.preallocate,
        replicas: layout.replicas,
        epoch: layout.epoch,
        writer_open: layout.writer_open,
        access: layout.access,
        min_copies: layout.min_copies,
        tier: layout.tier,
        parent: layout.parent,
        layout: spec.layout,
        limits: layout.limits,
        qos: layout.qos,
    }
}

pub(crate) fn spec_of(v: &VolumeRecord) -> Spec {
    Spec {
        id: v.id,
        name: v.name.clone(),
        size: v.size,
        preallocate: v.preallocate,
        layout: v.layout,
    }
}

pub(crate) fn layout_of(v: &VolumeRecord) -> Layout {
    Layout {
        replicas: v.replicas.clone(),
        epoch: v.epoch,
        writer_open: v.writer_open,
        access: v.access.clone(),
        min_copies: v.min_copies,
        tier: v.tier,
        size: Some(v.size),
        parent: v.parent.clone(),
        limits: v.limits,
        qos: v.qos.clone(),
    }
}

impl ClusterMeta {
    /// The prefix of the volumes' layouts (replica states, epochs, access lists), for watches.
    pub fn layouts_prefix() -> String {
        key("layouts/")
    }

    /// Creates a volume open to every client of the cluster (see [`Self::create_volume_for`]).
    pub async fn create_volume(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
    ) -> Result<VolumeRecord, MetaError> {
        self.create_volume_for(name, size, nodes, &crate::any_client())
            .await
    }

    /// Creates a thin volume whose replicas go on `nodes`, which the clients in `access` may
    /// use.
    pub async fn create_volume_for(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
        access: &[String],
    ) -> Result<VolumeRecord, MetaError> {
        self.create_volume_with(name, size, nodes, access, false)
            .await
    }

    /// [`Self::create_volume_for`], thick when `preallocate`.
    pub async fn create_volume_with(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
        access: &[String],
        preallocate: bool,
    ) -> Result<VolumeRecord, MetaError> {
        let mirror = trireme_replication::Layout::Mirror;
        self.create_volume_from(name, size, nodes, access, preallocate, None, mirror)
            .await
    }

    /// [`Self::create_volume_with`], a clone of `parent` if given, kept as `layout` (a
    /// parity volume's `nodes` are its stripe's K+M).
    #[allow(clippy::too_many_arguments)]
    pub async fn create_volume_from(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
        access: &[String],
        preallocate: bool,
        parent: Option<crate::CloneOf>,
        layout: trireme_replication::Layout,
    ) -> Result<VolumeRecord, MetaError> {
        layout
            .served()
            .map_err(|e| MetaError::Refused(e.to_string()))?;
        check_name(name)?;
        for a in access {
            crate::check_access_entry(a)?;
        }
        let spec_key = key(&format!("volumes/{name}"));
        let counter = key("next-volume-id");
        for _ in 0..MAX_TRIES {
            let c = self.store.get(&counter).await?;
            let id = counter_value(&counter, c.as_ref())?;
            let spec = Spec {
                id,
                name: name.to_string(),
                size,
                preallocate,
                layout,
            };
            let layout = Layout {
                replicas: nodes
                    .iter()
                    .map(|&node| ReplicaRecord {
                        incarnation: 0,
                        moving_from: None,
                        node,
                        state: ReplicaState::InSync,
                    })
                    .collect(),
                access: access.to_vec(),
                epoch: 0,
                writer_open: false,
                min_copies: 0,
                tier: crate::TierPolicy::Auto,
                size: None,
                limits: Default::default(),
                qos: None,
                parent: parent.clone(),
            };
            let done = self
                .write(
                    vec![
                        Compare::absent(spec_key.clone()),
                        Compare::mod_revision(
                            counter.clone(),
                            c.as_ref().map_or(0, |k| k.mod_revision),
                        ),
                    ],
                    vec![
                        Op::put(spec_key.clone(), encode(&spec)),
                        Op::put(key(&format!("layouts/{name}")), encode(&layout)),
                        Op::put(counter.clone(), (id + 1).to_string()),
                    ],
                )
                .await?;
            if done.is_some() {
                return Ok(record(spec, layout));
            }
            if self.store.get(&spec_key).await?.is_some() {
                return Err(MetaError::VolumeExists(name.to_string()));
            }
        }
        Err(MetaError::Contended {
            what: format!("creating volume {name:?}"),
            tries: MAX_TRIES,
        })
    }

    /// The volume and the `mod_revision` of its layout key.
    pub(crate) async fn read_volume(&self, name: &str) -> Result<(VolumeRecord, i64), MetaError> {
        let r = self
            .store
            .txn(Txn::when(vec![]).then(vec![
                Op::get(key(&format!("volumes/{name}"))),
                Op::get(key(&format!("layouts/{name}"))),
            ]))
            .await?;
        match (&r.gets[0], &r.gets[1]) {
            (Some(s), Some(l)) => Ok((record(decode(s)?, decode(l)?), l.mod_revision)),
            (Some(s), None) => Err(MetaError::Corrupt {
                key: s.key.clone(),
                what: "the volume has no layout record".into(),
            }),
            _ => Err(MetaError::NoVolume(name.to_string())),
        }
    }

    pub async fn volume(&self, name: &str) -> Result<VolumeRecord, MetaError> {
        Ok(self.read_volume(name).await?.0)
    }

    /// Every volume, by name. A volume whose records do not decode is left out, named in a
    /// warning: one bad record must not take every listing, placement and attach down with
    /// it ([`ClusterMeta::volumes_checked`] says which).
    pub async fn volumes(&self) -> Result<Vec<VolumeRecord>, MetaError> {
        let (vs, bad) = self.volumes_checked().await?;
        for e in bad {
            tracing::warn!("skipping a volume: {e}");
        }
        Ok(vs)
    }

    /// Every volume whose records decode, and what is wrong with those that do not.
    pub async fn volumes_checked(&self) -> Result<(Vec<VolumeRecord>, Vec<MetaError>), MetaError> {
        let (specs, _) = self.store.range(&key("volumes/")).await?;
        let (layouts, _) = self.store.range(&key("layouts/")).await?;
        let layouts: BTreeMap<&str, &KeyValue> = layouts
            .iter()
            .map(|kv| (&kv.key[key("layouts/").len()..], kv))
            .collect();
        let mut out = Vec::with_capacity(specs.len());
        let mut bad = Vec::new();
        for s in &specs {
            let spec: Spec = match decode(s) {
                Ok(spec) => spec,
                Err(e) => {
                    bad.push(e);
                    continue;
                }
            };
            // A volume created between the two reads has no layout yet: not shown.
            if let Some(l) = layouts.get(spec.name.as_str()) {
                match decode(l) {
                    Ok(l) => out.push(record(spec, l)),
                    Err(e) => bad.push(e),
                }
            }
        }
        Ok((out, bad))
    }

    pub async fn delete_volume(&self, name: &str) -> Result<VolumeRecord, MetaError> {
        let (v, rev) = self.read_volume(name).await?;
        let done = self
            .write(
                vec![Compare::mod_revision(key(&format!("layouts/{name}")), rev)],
                vec![
                    Op::delete(key(&format!("volumes/{name}"))),
                    Op::delete(key(&format!("layouts/{name}"))),
                ],
            )
            .await?;
        match done {
            Some(_) => {
                // Keyed by an id never reused: left behind, they would be only garbage.
                self.forget_regions(v.id).await?;
                Ok(v)
            }
            None => Err(MetaError::Refused(format!(
                "volume {name:?} changed while it was being deleted; try again"
            ))),
        }
    }

    /// Atomically reads, changes and writes back one volume's layout (compare-and-put on its
    /// revision, retried on conflicts). `f` may refuse with a message ([`MetaError::Refused`]),
    /// and then nothing is written. The spec (id, name, size) cannot change.
    pub async fn update_volume(
        &self,
        name: &str,
        f: &mut (dyn FnMut(&mut VolumeRecord) -> Result<(), MetaError> + Send),
    ) -> Result<VolumeRecord, MetaError> {
        self.update_layout(name, f, false).await
    }

    /// [`ClusterMeta::update_volume`]'s loop; `unattached` as
    /// [`ClusterMeta::update_unattached`] asks (no attach record, in the same transaction,
    /// and a new epoch).
    pub(super) async fn update_layout(
        &self,
        name: &str,
        f: &mut (dyn FnMut(&mut VolumeRecord) -> Result<(), MetaError> + Send),
        unattached: bool,
    ) -> Result<VolumeRecord, MetaError> {
        let (ak, lk) = (
            key(&format!("attach/{name}")),
            key(&format!("layouts/{name}")),
        );
        for _ in 0..MAX_TRIES {
            if unattached {
                if let Some((a, _)) = self.attachment(name).await? {
                    return Err(super::attach::attached(name, &a, false));
                }
            }
            let (mut v, rev) = self.read_volume(name).await?;
            let (id, preallocate) = (v.id, v.preallocate);
            f(&mut v)?;
            if (v.id, v.preallocate, v.name.as_str()) != (id, preallocate, name) {
                return Err(MetaError::Refused(
                    "a volume's id, name and provisioning never change".into(),
                ));
            }
            let mut when = vec![Compare::mod_revision(lk.clone(), rev)];
            if unattached {
                v.epoch += 1;
                when.push(Compare::mod_revision(ak.clone(), 0));
            }
            let done = self
                .write(when, vec![Op::put(lk.clone(), encode(&layout_of(&v)))])
                .await?;
            if done.is_some() {
                return Ok(v);
            }
        }
        Err(MetaError::Contended {
            what: format!("updating volume {name:?}"),
            tries: MAX_TRIES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec from before layouts is a mirror; a mirror's spec is written as before (a
    /// reader from before layouts reads it); a parity spec reads back as parity; one of a
    /// newer trireme reads back as unknown, never as a mirror.
    #[test]
    fn a_volume_spec_carries_its_layout() {
        let layout = |spec: &str| {
            let s: Spec = serde_json::from_str(spec).unwrap();
            let l: Layout = serde_json::from_str(r#"{"replicas":[],"epoch":0}"#).unwrap();
            record(s, l).layout
        };
        let old = r#"{"id":1,"name":"v","size":4096}"#;
        assert_eq!(layout(old), trireme_replication::Layout::Mirror);
        let again = serde_json::to_string(&spec_of(&record(
            serde_json::from_str(old).unwrap(),
            serde_json::from_str(r#"{"replicas":[],"epoch":0}"#).unwrap(),
        )))
        .unwrap();
        assert_eq!(again, old);
        let parity = r#"{"id":1,"name":"v","size":4096,"layout":{"kind":"parity","data":4,"parity":2,"mirror_share":20}}"#;
        assert_eq!(
            layout(parity),
            trireme_replication::Layout::Parity(
                trireme_replication::Parity::parse("4+2", Some(20)).unwrap()
            )
        );
        let newer = r#"{"id":1,"name":"v","size":4096,"layout":{"kind":"striped"}}"#;
        assert_eq!(layout(newer), trireme_replication::Layout::Unknown);
        // A parity layout out of bounds is a corrupt key with a reason, not a volume.
        let kv = KeyValue {
            key: "/trireme/v1/volumes/v".into(),
            value: br#"{"id":1,"name":"v","size":4096,"layout":{"kind":"parity","data":0,"parity":2,"mirror_share":20}}"#.to_vec(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        };
        match super::super::decode::<Spec>(&kv) {
            Err(MetaError::Corrupt { key, what }) => {
                assert_eq!(key, kv.key);
                assert!(what.contains("K (data chunks) must be 2..=16"), "{what}");
            }
            other => panic!("decoded a parity 0+2 record: {other:?}"),
        }
    }
}
