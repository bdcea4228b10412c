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
//! | `restarts/<node>` | [`RestartOrder`]: the manager asks node `node`'s daemon to restart | no |
//! | `jobs/<node>` | a drain/remove job of the manager, so its successor resumes it | no |
//! | `settings/<key>` | cluster settings | no |
//! | `next-volume-id` | the next volume id (ids are never reused) | no |
//!
//! Values are JSON. Every read-modify-write compares the `mod_revision` it read and retries on
//! a conflict, so two writers on two hosts never lose each other's update. A [`ClusterMeta`]
//! made with [`ClusterMeta::fenced`] adds one more compare to every write: the manager key
//! still carries this process's lease. A manager that lost its lease (a partition, a pause)
//! then gets [`MetaError::Deposed`] and writes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use trireme_replication::ReplicaState;

use crate::kv::{Compare, KeyValue, LeaseId, MetaStore, Op, Txn, TxnResult};
use crate::{check_name, MetaError, NodeRecord, ReplicaRecord, VolumeRecord};

/// Where every trireme key lives; the version changes if the layout ever does.
pub const PREFIX: &str = "/trireme/v1/";

/// How often a read-modify-write retries on conflicting writers before it gives up.
const MAX_TRIES: u32 = 64;

/// The running daemon of a node (lease-bound: it disappears when the daemon dies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AliveRecord {
    pub id: u32,
    pub addr: String,
    pub host: String,
    pub pid: u32,
}

/// The holder of the manager role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerRecord {
    /// The node daemon that holds it (0: a process that is no node, e.g. `trireme up`).
    pub node: u32,
    /// Where its control API listens (TCP `host:port`).
    pub control: String,
    pub host: String,
    pub pid: u32,
    /// Where it serves metrics and the dashboard over HTTP (`host:port`), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
}

/// The writer of a volume (lease-bound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachRecord {
    pub epoch: u64,
    pub host: String,
    pub pid: u32,
    /// Where it serves the volume (NBD URIs).
    pub exports: Vec<String>,
    /// The identity it reaches the nodes with (its certificate's role), if it uses TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// A request of the manager to the writer of a volume attached on another host (`moves/<name>`):
/// add the replica on `to` (already created, recorded failed), copy the volume to it, then
/// retire the one on `from`. The writer reports its progress and outcome in the same key; the
/// manager then drops `from` from the layout, deletes its copy and the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    pub from: u32,
    pub to: u32,
    /// Copy rate limit, bytes per second.
    pub rate: Option<u64>,
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    pub state: MoveRequestState,
    pub progress: Option<trireme_replication::ResyncProgress>,
    pub error: Option<String>,
}

/// Where a [`MoveRequest`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveRequestState {
    /// Written by the manager, not yet taken by the writer.
    Asked,
    /// The writer is copying the volume to the new replica.
    Copying,
    /// The new replica is in sync and the old one retired from the write set.
    Done,
    Failed,
}

/// A planned restart's request to the writer of a volume attached on another host
/// (`takeouts/<name>`): take the replica on `node` out cleanly before its node restarts, then
/// bring it back. The manager and the writer take turns on the key; see [`TakeOutState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeOutRequest {
    pub node: u32,
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    pub state: TakeOutState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the resync copied back (state `back`).
    #[serde(default)]
    pub resynced_bytes: u64,
    /// The resync had to compare everything (the replica's history was lost).
    #[serde(default)]
    pub full: bool,
}

/// Where a [`TakeOutRequest`] is. The manager writes `asked` and `return`, the writer the
/// others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TakeOutState {
    /// Written by the manager: take the replica out.
    Asked,
    /// The replica is out (recorded outdated, the survivors record what it misses); the
    /// writer does not try to bring it back until `return` (or for a while at most).
    Out,
    /// The writer refused (fewer in-sync copies than the volume's minimum would remain).
    Refused,
    /// Written by the manager once the node is back: resync it.
    Return,
    /// The replica is in sync again.
    Back,
}

/// The manager's order to a node daemon to restart itself (`restarts/<node>`): flush, record a
/// clean shutdown, give its lease back and start again. Only the daemon registered under
/// `lease` obeys, so the one it starts (a new lease) does not restart again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartOrder {
    pub node: u32,
    pub lease: LeaseId,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    id: u64,
    name: String,
    size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Layout {
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
}

fn record(spec: Spec, layout: Layout) -> VolumeRecord {
    VolumeRecord {
        id: spec.id,
        name: spec.name,
        size: spec.size,
        replicas: layout.replicas,
        epoch: layout.epoch,
        writer_open: layout.writer_open,
        access: layout.access,
        min_copies: layout.min_copies,
        tier: layout.tier,
    }
}

fn layout_of(v: &VolumeRecord) -> Layout {
    Layout {
        replicas: v.replicas.clone(),
        epoch: v.epoch,
        writer_open: v.writer_open,
        access: v.access.clone(),
        min_copies: v.min_copies,
        tier: v.tier,
    }
}

fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, MetaError> {
    serde_json::from_slice(&kv.value).map_err(|e| MetaError::Corrupt {
        key: kv.key.clone(),
        what: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
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
    async fn write(
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

    async fn get<T: DeserializeOwned>(&self, k: &str) -> Result<Option<(T, KeyValue)>, MetaError> {
        match self.store.get(k).await? {
            Some(kv) => Ok(Some((decode(&kv)?, kv))),
            None => Ok(None),
        }
    }

    async fn list<T: DeserializeOwned>(&self, dir: &str) -> Result<Vec<T>, MetaError> {
        let (kvs, _) = self.store.range(&key(dir)).await?;
        kvs.iter().map(decode).collect()
    }

    pub async fn put_node(&self, node: &NodeRecord) -> Result<(), MetaError> {
        let k = key(&format!("nodes/{}", node.id));
        self.write(vec![], vec![Op::put(k, encode(node))])
            .await?
            .ok_or_else(|| MetaError::Refused("node record: conflicting write".into()))?;
        Ok(())
    }

    /// Every registered node, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MetaError> {
        let mut v: Vec<NodeRecord> = self.list("nodes/").await?;
        v.sort_by_key(|n| n.id);
        Ok(v)
    }

    /// The daemons running now, by node id.
    pub async fn alive(&self) -> Result<BTreeMap<u32, AliveRecord>, MetaError> {
        let v: Vec<AliveRecord> = self.list("alive/").await?;
        Ok(v.into_iter().map(|a| (a.id, a)).collect())
    }

    /// Registers the daemon of node `rec.id` under `lease`, and its node record, in one step,
    /// only if no other daemon holds the id. On refusal, says who holds it.
    pub async fn register_alive(
        &self,
        rec: &AliveRecord,
        node: &NodeRecord,
        lease: LeaseId,
    ) -> Result<(), MetaError> {
        let k = key(&format!("alive/{}", rec.id));
        let r = self
            .store
            .txn(
                Txn::when(vec![Compare::absent(k.clone())])
                    .then(vec![
                        Op::put_leased(k.clone(), encode(rec), lease),
                        Op::put(key(&format!("nodes/{}", node.id)), encode(node)),
                    ])
                    .otherwise(vec![Op::get(k)]),
            )
            .await?;
        if r.succeeded {
            return Ok(());
        }
        let holder = match r.gets.first().and_then(|g| g.as_ref()) {
            Some(kv) => match decode::<AliveRecord>(kv) {
                Ok(a) => format!("pid {} on {} at {}", a.pid, a.host, a.addr),
                Err(_) => "another process".into(),
            },
            None => "another process (it has just gone; try again)".into(),
        };
        Err(MetaError::Refused(format!(
            "node id {} is already held by a running daemon: {holder}",
            rec.id
        )))
    }

    /// Takes the manager role under `lease` if nobody holds it. `Ok(false)`: someone does.
    pub async fn campaign(&self, rec: &ManagerRecord, lease: LeaseId) -> Result<bool, MetaError> {
        let k = key("manager");
        let r = self
            .store
            .txn(
                Txn::when(vec![Compare::absent(k.clone())]).then(vec![Op::put_leased(
                    k,
                    encode(rec),
                    lease,
                )]),
            )
            .await?;
        Ok(r.succeeded)
    }

    /// Who holds the manager role, and the revision of its record.
    pub async fn manager(&self) -> Result<Option<(ManagerRecord, KeyValue)>, MetaError> {
        self.get(&key("manager")).await
    }

    /// The prefix of the volumes' layouts (replica states, epochs, access lists), for watches.
    pub fn layouts_prefix() -> String {
        key("layouts/")
    }

    /// The manager key (for watches).
    pub fn manager_key() -> String {
        key("manager")
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

    /// Creates a volume whose replicas go on `nodes`, which the clients in `access` may use.
    pub async fn create_volume_for(
        &self,
        name: &str,
        size: u64,
        nodes: &[u32],
        access: &[String],
    ) -> Result<VolumeRecord, MetaError> {
        check_name(name)?;
        for a in access {
            crate::check_access_entry(a)?;
        }
        let spec_key = key(&format!("volumes/{name}"));
        let counter = key("next-volume-id");
        for _ in 0..MAX_TRIES {
            let c = self.store.get(&counter).await?;
            let id = match &c {
                Some(kv) => std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| MetaError::Corrupt {
                        key: counter.clone(),
                        what: "not a number".into(),
                    })?,
                None => 1,
            };
            let spec = Spec {
                id,
                name: name.to_string(),
                size,
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
    async fn read_volume(&self, name: &str) -> Result<(VolumeRecord, i64), MetaError> {
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

    /// Every volume, by name.
    pub async fn volumes(&self) -> Result<Vec<VolumeRecord>, MetaError> {
        let (specs, _) = self.store.range(&key("volumes/")).await?;
        let (layouts, _) = self.store.range(&key("layouts/")).await?;
        let layouts: BTreeMap<&str, &KeyValue> = layouts
            .iter()
            .map(|kv| (&kv.key[key("layouts/").len()..], kv))
            .collect();
        let mut out = Vec::with_capacity(specs.len());
        for s in &specs {
            let spec: Spec = decode(s)?;
            // A volume created between the two reads has no layout yet: not shown.
            if let Some(l) = layouts.get(spec.name.as_str()) {
                out.push(record(spec, decode(l)?));
            }
        }
        Ok(out)
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
            Some(_) => Ok(v),
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
        let lk = key(&format!("layouts/{name}"));
        for _ in 0..MAX_TRIES {
            let (mut v, rev) = self.read_volume(name).await?;
            let (id, size) = (v.id, v.size);
            f(&mut v)?;
            if (v.id, v.size, v.name.as_str()) != (id, size, name) {
                return Err(MetaError::Refused(
                    "a volume's id, name and size never change".into(),
                ));
            }
            let done = self
                .write(
                    vec![Compare::mod_revision(lk.clone(), rev)],
                    vec![Op::put(lk.clone(), encode(&layout_of(&v)))],
                )
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

    /// Who writes `name` now (its lease-bound attach record) and the record's revision.
    pub async fn attachment(
        &self,
        name: &str,
    ) -> Result<Option<(AttachRecord, KeyValue)>, MetaError> {
        self.get(&key(&format!("attach/{name}"))).await
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
                return Err(MetaError::Attached {
                    volume: name.to_string(),
                    pid: a.pid,
                    host: a.host.clone(),
                    epoch: a.epoch,
                    force_fences: true,
                });
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

    /// The move request for `name`'s writer, if any, and its revision.
    pub async fn move_request(&self, name: &str) -> Result<Option<(MoveRequest, i64)>, MetaError> {
        Ok(self
            .get::<MoveRequest>(&Self::move_request_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    /// The key of `name`'s move request (for watches).
    pub fn move_request_key(name: &str) -> String {
        key(&format!("moves/{name}"))
    }

    /// Puts a move request for `name`: a new one (`rev` 0: only if there is none) or an update
    /// of the one at revision `rev`. Its new revision, or `None`: it changed meanwhile (or is
    /// gone).
    pub async fn put_move_request(
        &self,
        name: &str,
        req: &MoveRequest,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::move_request_key(name), encode(req), rev)
            .await
    }

    /// Puts `value` at `k` if the key's mod revision is still `rev` (0: the key is absent).
    /// Its new revision, or `None` when it changed meanwhile.
    async fn put_at_revision(
        &self,
        k: String,
        value: Vec<u8>,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        Ok(self
            .write(
                vec![Compare::mod_revision(k.clone(), rev)],
                vec![Op::put(k, value)],
            )
            .await?
            .map(|r| r.revision))
    }

    pub async fn delete_move_request(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::move_request_key(name))])
            .await?;
        Ok(())
    }

    /// The key of `name`'s take-out request (for watches).
    pub fn takeout_key(name: &str) -> String {
        key(&format!("takeouts/{name}"))
    }

    /// Puts a take-out request for `name`: a new one (`rev` 0: only if there is none) or an
    /// update of the one at revision `rev`. Its new revision, or `None`: it changed meanwhile.
    pub async fn put_takeout(
        &self,
        name: &str,
        req: &TakeOutRequest,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::takeout_key(name), encode(req), rev)
            .await
    }

    pub async fn takeout(&self, name: &str) -> Result<Option<(TakeOutRequest, i64)>, MetaError> {
        Ok(self
            .get::<TakeOutRequest>(&Self::takeout_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    pub async fn delete_takeout(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::takeout_key(name))])
            .await?;
        Ok(())
    }

    /// The key of node `id`'s restart order (for watches).
    pub fn restart_key(id: u32) -> String {
        key(&format!("restarts/{id}"))
    }

    pub async fn put_restart_order(&self, order: &RestartOrder) -> Result<(), MetaError> {
        self.write(
            vec![],
            vec![Op::put(Self::restart_key(order.node), encode(order))],
        )
        .await?
        .ok_or_else(|| MetaError::Refused("restart order: conflicting write".into()))?;
        Ok(())
    }

    pub async fn restart_order(&self, id: u32) -> Result<Option<RestartOrder>, MetaError> {
        Ok(self.get(&Self::restart_key(id)).await?.map(|(r, _)| r))
    }

    pub async fn delete_restart_order(&self, id: u32) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::restart_key(id))])
            .await?;
        Ok(())
    }

    /// The lease the running daemon of node `id` registered under, if one runs.
    pub async fn alive_lease(&self, id: u32) -> Result<Option<LeaseId>, MetaError> {
        Ok(self
            .store
            .get(&key(&format!("alive/{id}")))
            .await?
            .map(|kv| kv.lease))
    }

    /// Gives the manager role up: deletes the `manager` key if `lease` still holds it.
    pub async fn resign(&self, lease: LeaseId) -> Result<(), MetaError> {
        let k = key("manager");
        self.store
            .txn(Txn::when(vec![Compare::lease(k.clone(), lease)]).then(vec![Op::delete(k)]))
            .await?;
        Ok(())
    }

    /// The manager's persisted jobs (`jobs/<node>`), for its successor.
    pub async fn jobs<T: DeserializeOwned>(&self) -> Result<Vec<T>, MetaError> {
        self.list("jobs/").await
    }

    pub async fn put_job<T: Serialize>(&self, node: u32, job: &T) -> Result<(), MetaError> {
        self.write(
            vec![],
            vec![Op::put(key(&format!("jobs/{node}")), encode(job))],
        )
        .await?
        .ok_or_else(|| MetaError::Refused("job record: conflicting write".into()))?;
        Ok(())
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

/// The full key of `rel`.
pub fn key(rel: &str) -> String {
    format!("{PREFIX}{rel}")
}
