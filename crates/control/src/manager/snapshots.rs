//! `volume snapshot create|list|delete`: the record (`snapshots/<volume>/<name>`, with an id
//! from the metadata's counter) comes first, then the volume's writer takes the snapshot on
//! every copy in sync (`trireme_client`'s `snapshots.rs`): the one in the cluster's process,
//! the one on a client host (asked through the volume's snapshot request,
//! `snapshot-asks/<name>`, as a resize is), or, for a volume nobody writes, one the manager
//! attaches for itself. Deleting asks every
//! node of the volume to drop it (the manager speaks for nodes: a client host may not), then
//! the record goes.

use std::sync::Arc;

use std::time::Duration;

use trireme_meta::{ScrubState, SnapshotAsk, SnapshotRecord, SnapshotState, VolumeRecord};
use trireme_proto::{Header, Op, SnapshotRequest, Status};

use super::{Manager, Result};
use crate::error::{busy, in_use, refused};

/// How long a writer on another host may take to answer a snapshot request.
const REMOTE_SNAPSHOT: Duration = Duration::from_secs(60);

/// A snapshot as `volume snapshot list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotInfo {
    pub name: String,
    pub id: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// `creating`, `ready` or `deleting`.
    pub state: String,
    pub nodes: Vec<u32>,
    /// Its size in bytes: the volume's when it was taken.
    #[serde(default)]
    pub size: u64,
    /// Bytes only it holds (what deleting it frees), on the copy that said most; `None` if no
    /// node holding it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
    /// Nodes it was taken on that hold it no more: their copy of the volume went away with no
    /// copy of it made elsewhere (a removal of a dead node that held its last copy), or lacks
    /// it (a copy resynced before snapshots moved with copies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<u32>,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Manager {
    /// Takes snapshot `snap` of volume `name`.
    pub async fn snapshot_create(self: &Arc<Self>, name: &str, snap: &str) -> Result<SnapshotInfo> {
        let v = self.meta.volume(name).await?;
        let created = now_secs();
        let mut rec = self.meta.create_snapshot_record(&v, snap, created).await?;
        match self.take_snapshot(&v, rec.id, created).await {
            Ok((nodes, size)) => {
                rec.state = SnapshotState::Ready;
                rec.nodes = nodes;
                rec.size = size;
                self.meta.put_snapshot_record(name, &rec).await?;
                tracing::info!(volume = name, snapshot = snap, id = rec.id, nodes = ?rec.nodes, size, "snapshot taken");
                let list: Vec<String> = rec.nodes.iter().map(u32::to_string).collect();
                self.event(
                    "snapshot",
                    format!(
                        "{name}@{snap} taken ({}, on node {})",
                        crate::human(size),
                        list.join(", ")
                    ),
                )
                .await;
                Ok(SnapshotInfo::from_record(&rec, &v, None))
            }
            Err(e) => {
                // Copies that took it before another failed drop it again (the writer tried
                // too; a client host's writer may not).
                self.drop_on_nodes(&v, rec.id, true).await;
                if let Err(d) = self.meta.delete_snapshot_record(name, snap).await {
                    tracing::warn!(
                        volume = name,
                        snapshot = snap,
                        "removing the record of a failed snapshot: {d}"
                    );
                }
                Err(e)
            }
        }
    }

    /// Takes snapshot `id` through the volume's writer; the nodes that hold it, and its size
    /// (0 if a writer from before snapshots had sizes did not say).
    async fn take_snapshot(
        self: &Arc<Self>,
        v: &VolumeRecord,
        id: u64,
        created: u64,
    ) -> Result<(Vec<u32>, u64)> {
        if let Some(w) = self.writer(&v.name).filter(|w| w.info().epoch == v.epoch) {
            return Ok(w.snapshot_sized(id, created).await?);
        }
        if let Some((a, _)) = self.meta.attachment(&v.name).await? {
            if a.epoch == v.epoch {
                return self.snapshot_remote(v, id, created).await;
            }
        }
        if let Some(who) = self.holder(v).await? {
            return Err(in_use(format!(
                "volume {} is attached by {who}: a snapshot goes through its writer, and that writer takes no requests (a `trireme nbd` beside `up`); detach it first",
                v.name
            )));
        }
        let own = self.attach_own(v).await?;
        let r = own.writer.snapshot_sized(id, created).await;
        self.release_own(own).await;
        Ok(r?)
    }

    /// Asks the writer on another host (`trireme attach`, `daemon/src/scrubs.rs`) to take
    /// snapshot `id` and waits for its answer: the nodes that took it.
    async fn snapshot_remote(
        &self,
        v: &VolumeRecord,
        id: u64,
        created: u64,
    ) -> Result<(Vec<u32>, u64)> {
        let name = &v.name;
        if let Some((old, _)) = self.meta.snapshot_ask(name).await? {
            if old.epoch == v.epoch && matches!(old.state, ScrubState::Asked | ScrubState::Running)
            {
                return Err(busy(format!(
                    "a snapshot of volume {name} is already being taken"
                )));
            }
            self.meta.delete_snapshot_ask(name).await?;
        }
        let ask = SnapshotAsk {
            epoch: v.epoch,
            id,
            created,
            state: ScrubState::Asked,
            nodes: Vec::new(),
            size: 0,
            error: None,
        };
        if self.meta.put_snapshot_ask(name, &ask, 0).await?.is_none() {
            return Err(busy(format!(
                "a snapshot of volume {name} was asked at the same moment by another operator"
            )));
        }
        let t0 = std::time::Instant::now();
        let outcome = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let r = match self.meta.snapshot_ask(name).await {
                Ok(Some((r, _))) => r,
                Ok(None) => break Err(refused("the snapshot request was removed")),
                Err(trireme_meta::MetaError::Unavailable(_)) => continue,
                Err(e) => break Err(e.into()),
            };
            match r.state {
                ScrubState::Done => break Ok((r.nodes, r.size)),
                ScrubState::Failed => {
                    break Err(refused(format!(
                        "the writer's snapshot failed: {}",
                        r.error.unwrap_or_default()
                    )))
                }
                _ if t0.elapsed() > REMOTE_SNAPSHOT => {
                    break Err(refused(format!(
                        "volume {name}'s writer did not answer the snapshot within {} s (a writer from before snapshots?)",
                        REMOTE_SNAPSHOT.as_secs()
                    )))
                }
                _ => {
                    let writer = self.meta.attachment(name).await;
                    if matches!(&writer, Ok(Some((a, _))) if a.epoch != v.epoch)
                        || matches!(&writer, Ok(None))
                    {
                        break Err(refused(format!(
                            "volume {name}'s writer changed or left while taking the snapshot"
                        )));
                    }
                }
            }
        };
        if let Err(e) = self.meta.delete_snapshot_ask(name).await {
            tracing::warn!(volume = %name, "removing the snapshot request: {e}");
        }
        outcome
    }

    /// Makes volume `name` hold what its snapshot `snap` holds, through a writer of the
    /// manager's own. Refused while a writer holds the volume (what it wrote would vanish under
    /// it), unless `force`, which fences that writer first.
    pub async fn snapshot_rollback(
        self: &Arc<Self>,
        name: &str,
        snap: &str,
        force: bool,
    ) -> Result<()> {
        let v = self.meta.volume(name).await?;
        let rec = self.meta.snapshot(&v, snap).await?;
        if rec.state != SnapshotState::Ready {
            return Err(refused(format!(
                "snapshot {snap} of volume {name} is {}, not ready",
                rec.state.as_str()
            )));
        }
        // A rollback keeps the volume's size: the snapshot must have it. Refused before any
        // writer is fenced.
        let size = rec.size_of(&v);
        if size != v.size {
            let flag = if size < v.size { " --allow-shrink" } else { "" };
            return Err(refused(format!(
                "snapshot {snap} of volume {name} is {size} bytes and the volume {} bytes: \
                 resize the volume to the snapshot's size first (`trireme volume resize \
                 {name} {size}{flag}`), then roll back",
                v.size
            )));
        }
        let v = match self.holder(&v).await? {
            None => v,
            Some(who) if !force => {
                return Err(in_use(format!(
                    "volume {name} is in use: attached by {who}. A rollback replaces what it reads \
                     under it: detach it first, or `trireme volume rollback {name} {snap} --force` \
                     fences that writer (its I/O fails from then on)"
                )))
            }
            Some(who) => {
                tracing::warn!(
                    volume = name,
                    holder = who,
                    "rollback --force: fencing the writer"
                );
                self.fence_writer(&v).await?
            }
        };
        let own = self.attach_own(&v).await?;
        let r = own.writer.rollback(rec.id).await;
        self.release_own(own).await;
        r?;
        tracing::warn!(volume = name, snapshot = snap, "volume rolled back");
        self.event(
            "rollback",
            format!("volume {name} rolled back to {name}@{snap}"),
        )
        .await;
        Ok(())
    }

    /// The snapshots of volume `name`, oldest first.
    pub async fn snapshot_list(&self, name: &str) -> Result<Vec<SnapshotInfo>> {
        let v = self.meta.volume(name).await?;
        let recs = self.meta.snapshots(&v).await?;
        // What each node says its copy's snapshots hold alone, and which nodes answered.
        let mut exclusive: std::collections::HashMap<u64, u64> = Default::default();
        let mut listed: std::collections::HashMap<u32, Vec<u64>> = Default::default();
        let size_of: std::collections::HashMap<u64, u64> =
            recs.iter().map(|r| (r.id, r.size_of(&v))).collect();
        for r in &v.replicas {
            let Ok(node) = self.node(r.node).await else {
                continue;
            };
            let Ok(list) = self.snapshots_at(&v, &node).await else {
                continue;
            };
            for s in &list {
                let e = exclusive.entry(s.id).or_default();
                *e = (*e).max(s.exclusive_bytes);
            }
            // A copy that holds one at another size than it was taken at does not hold it
            // (a node from before sizes says none: 0).
            let held = list
                .iter()
                .filter(|s| s.size == 0 || size_of.get(&s.id).is_none_or(|&z| z == s.size))
                .map(|s| s.id);
            listed.insert(r.node, held.collect());
        }
        Ok(recs
            .iter()
            .map(|r| {
                let mut i = SnapshotInfo::from_record(r, &v, exclusive.get(&r.id).copied());
                if r.state == SnapshotState::Ready {
                    // A node that holds no copy now, or said its copy lacks it, lost it; one
                    // that did not answer is taken at its record's word.
                    let (mut kept, lost): (Vec<u32>, Vec<u32>) = r.nodes.iter().partition(|n| {
                        v.replicas.iter().any(|x| x.node == **n)
                            && listed.get(n).is_none_or(|ids| ids.contains(&r.id))
                    });
                    // A copy that was out when it was taken and got it at its resync
                    // (`trireme_client`'s `catch_up.rs`) holds it too.
                    for (n, ids) in &listed {
                        if ids.contains(&r.id) && !kept.contains(n) {
                            kept.push(*n);
                        }
                    }
                    kept.sort_unstable();
                    i.nodes = kept;
                    i.lost = lost;
                }
                i
            })
            .collect())
    }

    /// The snapshots `node`'s copy of `v` holds, as it lists them.
    pub(crate) async fn snapshots_at(
        &self,
        v: &VolumeRecord,
        node: &trireme_meta::NodeRecord,
    ) -> Result<Vec<trireme_proto::ListedSnapshot>> {
        let h = Header {
            volume: v.id,
            length: trireme_proto::LIST_SIZED,
            ..Header::request(Op::SnapshotList, 0)
        };
        let f = self.node_call(node, h).await?;
        if f.header.status != Status::Ok {
            return Err(refused(format!(
                "node {} lists no snapshots of {}: {:?}",
                node.id, v.name, f.header.status
            )));
        }
        trireme_proto::decode_snapshot_list(&f.payload, f.header.length)
            .map_err(|e| refused(format!("node {}'s snapshot list: {e}", node.id)))
    }

    /// Deletes snapshot `snap` of volume `name` from every copy, then its record. Refused,
    /// naming them, while exports hold it (`holds.rs` on the nodes), unless `force`. A node
    /// that does not answer leaves the record `deleting`; asking again finishes it, as the
    /// manager does by itself ([`Manager::start_finishing_deletes`]).
    pub async fn snapshot_delete(&self, name: &str, snap: &str, force: bool) -> Result<()> {
        let v = self.meta.volume(name).await?;
        let mut rec = self.meta.snapshot(&v, snap).await?;
        self.check_no_clones(&v, Some((snap, rec.id))).await?;
        // A delete already under way (its record `deleting`) was decided before.
        let force = force || rec.state == SnapshotState::Deleting;
        let holders = self.snapshot_holders(&v, rec.id).await;
        if !holders.is_empty() {
            if !force {
                return Err(in_use(format!(
                    "snapshot {name}@{snap} is exported read-only by {}: stop that export first, or delete it with --force (its reads then fail)",
                    holders.join("; ")
                )));
            }
            tracing::warn!(volume = name, snapshot = snap, holders = %holders.join("; "), "deleting a snapshot an export holds (--force): its reads fail from now on");
        }
        rec.state = SnapshotState::Deleting;
        self.meta.put_snapshot_record(name, &rec).await?;
        let missed = self.drop_on_nodes(&v, rec.id, force).await;
        if !missed.is_empty() {
            self.missed_deletes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((name.to_string(), snap.to_string()));
            return Err(refused(format!(
                "snapshot {snap} of volume {name} is still on nodes {missed:?}, which did not answer; it stays `deleting`, and the manager finishes the delete once they answer"
            )));
        }
        self.meta.delete_snapshot_record(name, snap).await?;
        // Only once the record is gone: a record left `deleting` is still to finish.
        self.forget_missed(name, snap);
        tracing::info!(
            volume = name,
            snapshot = snap,
            id = rec.id,
            "snapshot deleted"
        );
        self.event(
            "snapshot",
            format!(
                "{name}@{snap} deleted{}",
                if holders.is_empty() {
                    String::new()
                } else {
                    format!(" though {} held it (--force)", holders.join("; "))
                }
            ),
        )
        .await;
        Ok(())
    }

    /// Who holds snapshot `id` of `v` on the nodes that answer, each named with its nodes.
    async fn snapshot_holders(&self, v: &VolumeRecord, id: u64) -> Vec<String> {
        let mut by: Vec<(String, Vec<u32>)> = Vec::new();
        for r in &v.replicas {
            let Ok(node) = self.node(r.node).await else {
                continue;
            };
            let h = Header {
                volume: v.id,
                offset: id,
                ..Header::request(Op::SnapshotHolders, 0)
            };
            if let Ok(f) = self.node_call(&node, h).await {
                if f.header.status == Status::Ok {
                    for who in String::from_utf8_lossy(&f.payload).lines() {
                        match by.iter_mut().find(|(w, _)| w == who) {
                            Some((_, nodes)) => nodes.push(r.node),
                            None => by.push((who.to_string(), vec![r.node])),
                        }
                    }
                }
            }
        }
        by.into_iter()
            .map(|(who, nodes)| {
                let nodes: Vec<String> = nodes.iter().map(u32::to_string).collect();
                format!("{who} (held on node {})", nodes.join(", "))
            })
            .collect()
    }

    /// Asks every node of `v` to drop snapshot `id`, all at once; the nodes that did not. A
    /// node answers once it has given the snapshot's space back, at most
    /// [`trireme_proto::GIVE_BACK_RATE`] a second: each is waited for the time the volume's
    /// whole size takes at half that rate (the 3 s of other calls failed the delete of a
    /// snapshot holding more than about 1.5 GiB of its own).
    async fn drop_on_nodes(&self, v: &VolumeRecord, id: u64, force: bool) -> Vec<u32> {
        let limit = NODE_DELETE_WAIT
            + std::time::Duration::from_secs_f64(
                v.size as f64 / (trireme_proto::GIVE_BACK_RATE / 2) as f64,
            );
        let calls = v
            .replicas
            .iter()
            .map(|r| {
                let mut h = Header {
                    volume: v.id,
                    flags: if force { trireme_proto::FLAG_FORCE } else { 0 },
                    ..Header::request(Op::SnapshotDelete, 0)
                };
                SnapshotRequest { id, created: 0 }.put(&mut h);
                Box::pin(async move {
                    let answer = match self.node(r.node).await {
                        Ok(node) => self
                            .node_call_within(&node, h, limit)
                            .await
                            .map(|f| f.header.status),
                        Err(e) => Err(e),
                    };
                    (r.node, answer)
                }) as trireme_client::BoxFut<'_, _>
            })
            .collect();
        let mut missed = Vec::new();
        for (node, answer) in trireme_client::join_all(calls).await {
            match answer {
                Ok(Status::Ok | Status::NoSnapshot | Status::NoReplica) => {}
                other => {
                    tracing::warn!(volume = %v.name, node, id, "deleting a snapshot: {other:?}");
                    missed.push(node);
                }
            }
        }
        missed
    }
}

/// How often the manager finishes the deletes that a node did not answer.
const FINISH_DELETES_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Manager {
    /// Finishes, every [`FINISH_DELETES_EVERY`] while the manager lives, each snapshot delete
    /// a node did not answer (its record stays `deleting`): asked again of every node, the
    /// record goes once all have answered. Without it, a node down during a delete kept the
    /// snapshot's blocks until someone asked again. The deletes this manager saw missed are
    /// remembered; those a manager before it left are found by one look over the records,
    /// at its first pass.
    pub fn start_finishing_deletes(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut looked = false;
            loop {
                tokio::time::sleep(FINISH_DELETES_EVERY).await;
                let Some(m) = me.upgrade() else { return };
                if !looked {
                    looked = m.find_missed_deletes().await;
                }
                m.finish_deletes().await;
            }
        });
    }

    /// Adds every `deleting` snapshot record to the deletes to finish; false if the records
    /// could not be read.
    async fn find_missed_deletes(&self) -> bool {
        let Ok(volumes) = self.meta.volumes().await else {
            return false;
        };
        let mut found = Vec::new();
        for v in volumes {
            let Ok(recs) = self.meta.snapshots(&v).await else {
                return false;
            };
            found.extend(
                recs.into_iter()
                    .filter(|r| r.state == SnapshotState::Deleting)
                    .map(|r| (v.name.clone(), r.name)),
            );
        }
        self.missed_deletes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(found);
        true
    }

    /// One pass of [`Manager::start_finishing_deletes`].
    async fn finish_deletes(&self) {
        let todo: Vec<(String, String)> = self
            .missed_deletes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for (volume, snap) in todo {
            match self.snapshot_delete(&volume, &snap, true).await {
                Ok(()) => tracing::info!(
                    volume = %volume,
                    snapshot = %snap,
                    "a snapshot delete that a node had missed is finished"
                ),
                Err(e) => {
                    tracing::debug!(volume = %volume, snapshot = %snap, "finishing a snapshot delete: {e}");
                    // Gone meanwhile (the volume, or the record): nothing left to finish.
                    if self.record_gone(&volume, &snap).await {
                        self.forget_missed(&volume, &snap);
                    }
                }
            }
        }
    }

    /// True if the metadata says snapshot `snap` of `volume` has no record (nor the volume);
    /// false if it has one, or if the metadata cannot be read.
    async fn record_gone(&self, volume: &str, snap: &str) -> bool {
        match self.meta.volume(volume).await {
            Ok(v) => self
                .meta
                .snapshots(&v)
                .await
                .is_ok_and(|recs| !recs.iter().any(|r| r.name == snap)),
            Err(e) => matches!(e, trireme_meta::MetaError::NoVolume(_)),
        }
    }

    fn forget_missed(&self, volume: &str, snap: &str) {
        self.missed_deletes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(volume.to_string(), snap.to_string()));
    }
}

/// The least a node is waited for to delete a snapshot, before the time its space takes.
const NODE_DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl SnapshotInfo {
    /// Volume `v`'s snapshot record as the list shows it, with what only it holds if a node
    /// said.
    pub fn from_record(
        r: &SnapshotRecord,
        v: &VolumeRecord,
        exclusive_bytes: Option<u64>,
    ) -> SnapshotInfo {
        SnapshotInfo {
            name: r.name.clone(),
            id: r.id,
            created: r.created,
            state: r.state.as_str().to_string(),
            nodes: r.nodes.clone(),
            size: r.size_of(v),
            exclusive_bytes,
            lost: Vec::new(),
        }
    }
}
