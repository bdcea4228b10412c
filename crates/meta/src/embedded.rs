//! The embedded metadata store: one redb file.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;

use crate::{check_name, MetaError, MetaStore, NodeRecord, ReplicaRecord, VolumeRecord};
use trireme_replication::ReplicaState;

const NODES: TableDefinition<'_, u32, &str> = TableDefinition::new("nodes");
const VOLUMES: TableDefinition<'_, &str, &str> = TableDefinition::new("volumes");
const SETTINGS: TableDefinition<'_, &str, &str> = TableDefinition::new("settings");
const NEXT_VOLUME_ID: &str = "next_volume_id";

/// Cluster metadata in a local redb file.
pub struct EmbeddedMeta {
    db: Database,
    path: String,
}

impl std::fmt::Debug for EmbeddedMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedMeta")
            .field("path", &self.path)
            .finish()
    }
}

impl EmbeddedMeta {
    /// Opens or creates the metadata file. Fails clearly if another process holds it.
    pub fn open(path: &Path) -> Result<EmbeddedMeta, MetaError> {
        let p = path.display().to_string();
        let db = Database::create(path).map_err(|e| MetaError::Storage {
            path: p.clone(),
            what: e.to_string(),
        })?;
        let m = EmbeddedMeta { db, path: p };
        // Create the tables so read transactions never see them missing.
        m.write(|tx| {
            tx.open_table(NODES)?;
            tx.open_table(VOLUMES)?;
            tx.open_table(SETTINGS)?;
            Ok(())
        })?;
        Ok(m)
    }

    fn err(&self, e: impl std::fmt::Display) -> MetaError {
        MetaError::Storage {
            path: self.path.clone(),
            what: e.to_string(),
        }
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, Failure>,
    ) -> Result<T, MetaError> {
        let tx = self.db.begin_write().map_err(|e| self.err(e))?;
        let out = match f(&tx) {
            Ok(v) => v,
            Err(Failure::Meta(e)) => return Err(e),
            Err(Failure::Db(e)) => return Err(self.err(e)),
        };
        tx.commit().map_err(|e| self.err(e))?;
        Ok(out)
    }

    fn read_volume(
        t: &impl ReadableTable<&'static str, &'static str>,
        name: &str,
    ) -> Result<VolumeRecord, Failure> {
        match t.get(name)? {
            Some(v) => Ok(decode(name, v.value())?),
            None => Err(Failure::Meta(MetaError::NoVolume(name.to_string()))),
        }
    }
}

/// Inside a transaction: a redb error or a metadata-level error.
enum Failure {
    Db(String),
    Meta(MetaError),
}

macro_rules! from_db {
    ($($t:ty),*) => {$(impl From<$t> for Failure { fn from(e: $t) -> Self { Failure::Db(e.to_string()) } })*};
}
from_db!(redb::TableError, redb::StorageError);

impl From<MetaError> for Failure {
    fn from(e: MetaError) -> Self {
        Failure::Meta(e)
    }
}

fn decode<T: DeserializeOwned>(key: &str, v: &str) -> Result<T, MetaError> {
    serde_json::from_str(v).map_err(|e| MetaError::Corrupt {
        key: key.to_string(),
        what: e.to_string(),
    })
}

fn encode<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("metadata records always serialize")
}

impl MetaStore for EmbeddedMeta {
    fn put_node(&self, node: &NodeRecord) -> Result<(), MetaError> {
        self.write(|tx| {
            tx.open_table(NODES)?
                .insert(node.id, encode(node).as_str())?;
            Ok(())
        })
    }

    fn nodes(&self) -> Result<Vec<NodeRecord>, MetaError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(NODES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in t.iter().map_err(|e| self.err(e))? {
            let (k, v) = r.map_err(|e| self.err(e))?;
            out.push(decode(&format!("node {}", k.value()), v.value())?);
        }
        Ok(out)
    }

    fn create_volume(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
    ) -> Result<VolumeRecord, MetaError> {
        check_name(name)?;
        self.write(|tx| {
            let mut vols = tx.open_table(VOLUMES)?;
            if vols.get(name)?.is_some() {
                return Err(MetaError::VolumeExists(name.to_string()).into());
            }
            let mut settings = tx.open_table(SETTINGS)?;
            let id = match settings.get(NEXT_VOLUME_ID)? {
                Some(v) => v.value().parse::<u64>().map_err(|e| MetaError::Corrupt {
                    key: NEXT_VOLUME_ID.into(),
                    what: e.to_string(),
                })?,
                None => 1,
            };
            settings.insert(NEXT_VOLUME_ID, (id + 1).to_string().as_str())?;
            let v = VolumeRecord {
                id,
                name: name.to_string(),
                size,
                replicas: nodes
                    .iter()
                    .map(|&node| ReplicaRecord {
                        node,
                        state: ReplicaState::InSync,
                    })
                    .collect(),
                epoch: 0,
                writer_open: false,
            };
            vols.insert(name, encode(&v).as_str())?;
            Ok(v)
        })
    }

    fn volume(&self, name: &str) -> Result<VolumeRecord, MetaError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(VOLUMES).map_err(|e| self.err(e))?;
        match Self::read_volume(&t, name) {
            Ok(v) => Ok(v),
            Err(Failure::Meta(e)) => Err(e),
            Err(Failure::Db(e)) => Err(self.err(e)),
        }
    }

    fn volumes(&self) -> Result<Vec<VolumeRecord>, MetaError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(VOLUMES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in t.iter().map_err(|e| self.err(e))? {
            let (k, v) = r.map_err(|e| self.err(e))?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn delete_volume(&self, name: &str) -> Result<VolumeRecord, MetaError> {
        self.write(|tx| {
            let mut t = tx.open_table(VOLUMES)?;
            let v = Self::read_volume(&t, name)?;
            t.remove(name)?;
            Ok(v)
        })
    }

    fn next_epoch(&self, name: &str) -> Result<VolumeRecord, MetaError> {
        self.write(|tx| {
            let mut t = tx.open_table(VOLUMES)?;
            let mut v = Self::read_volume(&t, name)?;
            v.epoch += 1;
            t.insert(name, encode(&v).as_str())?;
            Ok(v)
        })
    }

    fn update_volume(
        &self,
        name: &str,
        f: &mut dyn FnMut(&mut VolumeRecord) -> Result<(), String>,
    ) -> Result<VolumeRecord, MetaError> {
        self.write(|tx| {
            let mut t = tx.open_table(VOLUMES)?;
            let mut v = Self::read_volume(&t, name)?;
            f(&mut v).map_err(|e| Failure::Meta(MetaError::Refused(e)))?;
            t.insert(name, encode(&v).as_str())?;
            Ok(v)
        })
    }

    fn setting(&self, key: &str) -> Result<Option<String>, MetaError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(SETTINGS).map_err(|e| self.err(e))?;
        Ok(t.get(key)
            .map_err(|e| self.err(e))?
            .map(|v| v.value().to_string()))
    }

    fn set_setting(&self, key: &str, value: &str) -> Result<(), MetaError> {
        self.write(|tx| {
            tx.open_table(SETTINGS)?.insert(key, value)?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_epochs_and_nodes_persist() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("meta.redb");
        {
            let m = EmbeddedMeta::open(&p).unwrap();
            m.put_node(&NodeRecord {
                id: 1,
                addr: "127.0.0.1:1".into(),
                local_addr: None,
                store: "file".into(),
                state: Default::default(),
            })
            .unwrap();
            let v = m.create_volume("vol0", 1 << 20, &[1, 2, 3]).unwrap();
            assert_eq!(v.id, 1);
            assert!(matches!(
                m.create_volume("vol0", 1, &[1]),
                Err(MetaError::VolumeExists(_))
            ));
            assert_eq!(m.next_epoch("vol0").unwrap().epoch, 1);
            assert_eq!(m.next_epoch("vol0").unwrap().epoch, 2);
            assert!(matches!(m.next_epoch("nope"), Err(MetaError::NoVolume(_))));
            assert!(matches!(
                m.create_volume("bad name", 1, &[1]),
                Err(MetaError::BadName(_))
            ));
            m.set_setting("store", "file").unwrap();
        }
        let m = EmbeddedMeta::open(&p).unwrap();
        assert_eq!(m.volume("vol0").unwrap().epoch, 2);
        assert_eq!(m.nodes().unwrap().len(), 1);
        assert_eq!(m.setting("store").unwrap().as_deref(), Some("file"));
        let v = m
            .update_volume("vol0", &mut |v| {
                v.replicas[1].state = trireme_replication::ReplicaState::Outdated;
                Ok(())
            })
            .unwrap();
        assert_eq!(
            v.replicas[1].state,
            trireme_replication::ReplicaState::Outdated
        );
        let refused = m.update_volume("vol0", &mut |v| {
            v.epoch = 99;
            Err("no".into())
        });
        assert!(matches!(refused, Err(MetaError::Refused(_))));
        let v = m.volume("vol0").unwrap();
        assert_eq!(v.epoch, 2, "a refused update writes nothing");
        assert_eq!(
            v.replicas[1].state,
            trireme_replication::ReplicaState::Outdated
        );
        let v2 = m.create_volume("vol1", 4096, &[2]).unwrap();
        assert_eq!(v2.id, 2, "ids are never reused");
        m.delete_volume("vol0").unwrap();
        assert_eq!(m.volumes().unwrap().len(), 1);
    }
}
