//! `volume clone VOL@SNAP NEW` and `volume flatten NEW`. A clone is a volume whose copies sit
//! on the nodes that hold the snapshot, each reading the snapshot's blocks from its parent's
//! copy there until it writes them (`trireme_store::backing`): made in the time it takes to
//! write a record and a small file per node, whatever the size. Its record names the parent
//! snapshot until a flatten has copied every block on every node. While a clone reads it, the
//! snapshot cannot be deleted, nor the parent volume.

use bytes::Bytes;
use std::time::Duration;

use trireme_meta::{CloneOf, SnapshotState, VolumeRecord};
use trireme_proto::{CloneRequest, Header, Op, Status};

use super::{Manager, Result};
use crate::error::{in_use, refused};

/// The least a node is waited for to flatten, before the time its copy takes.
const FLATTEN_WAIT: Duration = Duration::from_secs(10);
/// The slowest copy rate a flatten is waited for at (a node's disk, read and written).
const FLATTEN_RATE: f64 = (64 << 20) as f64;

impl Manager {
    /// Makes volume `name`, a clone of snapshot `snap` of volume `source`: as large as the
    /// snapshot, with the same access list, one copy on each node whose copy of `source` holds the snapshot.
    pub async fn clone_volume(&self, source: &str, snap: &str, name: &str) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let v = self.meta.volume(source).await?;
        let rec = self.meta.snapshot(&v, snap).await?;
        if rec.state != SnapshotState::Ready {
            return Err(refused(format!(
                "snapshot {source}@{snap} is {}, not ready",
                rec.state.as_str()
            )));
        }
        let nodes: Vec<u32> = rec
            .nodes
            .iter()
            .copied()
            .filter(|n| v.replicas.iter().any(|r| r.node == *n))
            .collect();
        if nodes.is_empty() {
            return Err(refused(format!(
                "no copy of {source} holds snapshot {snap} any more (its copies moved)"
            )));
        }
        let parent = CloneOf {
            volume: v.name.clone(),
            volume_id: v.id,
            snapshot: snap.to_string(),
            snapshot_id: rec.id,
        };
        let c = self
            .meta
            .create_volume_from(
                name,
                rec.size_of(&v),
                &nodes,
                &v.access,
                false,
                Some(parent),
                trireme_replication::Layout::Mirror,
            )
            .await?;
        let ask = CloneRequest {
            parent: v.id,
            snapshot: rec.id,
        };
        // Every node at once: a clone is made in one round trip whatever its copies.
        let calls = nodes
            .iter()
            .map(|&id| {
                let h = Header {
                    volume: c.id,
                    length: c.size,
                    ..Header::request(Op::CreateClone, 0)
                };
                let payload = Bytes::from(ask.encode());
                Box::pin(async move {
                    let node = match self.node(id).await {
                        Ok(n) => n,
                        Err(e) => return (id, None, e.to_string()),
                    };
                    match self
                        .node_send_within(&node, h, payload, super::NODE_TIMEOUT)
                        .await
                    {
                        Ok(f) if f.header.status == Status::Ok => (id, Some(node), String::new()),
                        Ok(f) => (
                            id,
                            Some(node),
                            format!(
                                "{}: {}",
                                f.header.status.as_str(),
                                String::from_utf8_lossy(&f.payload)
                            ),
                        ),
                        // It may have made it before the answer was lost: deleted too.
                        Err(e) => (id, Some(node), e.to_string()),
                    }
                }) as trireme_client::BoxFut<'_, _>
            })
            .collect();
        let answers: Vec<(u32, Option<trireme_meta::NodeRecord>, String)> =
            trireme_client::join_all(calls).await;
        if let Some((id, _, why)) = answers.iter().find(|(_, _, why)| !why.is_empty()) {
            // All or nothing, as a volume's creation.
            for (_, node, _) in &answers {
                if let Some(n) = node {
                    let _ = self.replica_op(n, Op::DeleteReplica, &c).await;
                }
            }
            let _ = self.meta.delete_volume(name).await;
            return Err(refused(format!(
                "creating the clone {name} on node {id} failed: {why}"
            )));
        }
        tracing::info!(volume = name, parent = source, snapshot = snap, nodes = ?nodes, "clone created");
        self.event(
            "volume",
            format!("volume {name} created as a clone of {source}@{snap}"),
        )
        .await;
        Ok(c)
    }

    /// Copies every block clone `name` still reads from its parent, on every copy at once
    /// (with I/O going on), then forgets the parent: its snapshot may be deleted after.
    pub async fn flatten_volume(&self, name: &str) -> Result<VolumeRecord> {
        let v = self.meta.volume(name).await?;
        let Some(parent) = &v.parent else {
            return Err(refused(format!(
                "volume {name} is no clone (or was flattened already)"
            )));
        };
        let calls = v
            .replicas
            .iter()
            .map(|r| {
                let v = &v;
                Box::pin(async move {
                    let done = match self.node(r.node).await {
                        Ok(node) => self.flatten_copy(v, &node).await,
                        Err(e) => Err(e),
                    };
                    match done {
                        Ok(Status::Ok) => Ok(()),
                        Ok(s) => Err(format!("node {}: {}", r.node, s.as_str())),
                        Err(e) => Err(e.to_string()),
                    }
                }) as trireme_client::BoxFut<'_, _>
            })
            .collect();
        let failed: Vec<String> = trireme_client::join_all(calls)
            .await
            .into_iter()
            .filter_map(|r: std::result::Result<(), String>| r.err())
            .collect();
        if !failed.is_empty() {
            return Err(refused(format!(
                "flattening {name} failed on {}; it still reads from {}@{} (ask again)",
                failed.join("; "),
                parent.volume,
                parent.snapshot
            )));
        }
        let v = self
            .meta
            .update_volume(name, &mut |rec| {
                rec.parent = None;
                Ok(())
            })
            .await?;
        tracing::info!(volume = name, "clone flattened");
        self.event("volume", format!("clone {name} flattened: it stands alone"))
            .await;
        Ok(v)
    }

    /// Flattens the copies on `node` of every clone of `v` (so `v`'s copy there may go); the
    /// clones' other copies still read from their parent.
    pub(crate) async fn flatten_clones_on(
        &self,
        v: &VolumeRecord,
        node: &trireme_meta::NodeRecord,
    ) -> Result<()> {
        for c in self.meta.volumes().await? {
            let reads_v = c.parent.as_ref().is_some_and(|p| p.volume_id == v.id);
            if !reads_v || !c.replicas.iter().any(|r| r.node == node.id) {
                continue;
            }
            self.flatten_copy(&c, node)
                .await
                .map_err(|e| refused(format!("{}'s copy: {e}", c.name)))?;
            // (`NoReplica`: no copy there to flatten.)
            tracing::info!(clone = %c.name, parent = %v.name, node = node.id, "a clone's copy flattened: its parent's copy moves away");
        }
        Ok(())
    }

    /// Flattens clone `c`'s copy on `node`, waited for as long as copying its size takes:
    /// `Ok` or `NoReplica` (no copy there), or why not.
    async fn flatten_copy(
        &self,
        c: &VolumeRecord,
        node: &trireme_meta::NodeRecord,
    ) -> Result<Status> {
        let limit = FLATTEN_WAIT + Duration::from_secs_f64(c.size as f64 / FLATTEN_RATE);
        let h = Header {
            volume: c.id,
            ..Header::request(Op::Flatten, 0)
        };
        let f = self.node_call_within(node, h, limit).await?;
        match f.header.status {
            s @ (Status::Ok | Status::NoReplica) => Ok(s),
            s => Err(refused(format!(
                "flattening on node {}: {}: {}",
                node.id,
                s.as_str(),
                String::from_utf8_lossy(&f.payload)
            ))),
        }
    }

    /// The clones that read from volume `v` (from its snapshot `snapshot_id` only, if given).
    pub(super) async fn clones_of(
        &self,
        v: &VolumeRecord,
        snapshot_id: Option<u64>,
    ) -> Result<Vec<String>> {
        let reads = |c: &VolumeRecord| {
            c.parent.as_ref().is_some_and(|p| {
                p.volume_id == v.id && snapshot_id.is_none_or(|s| s == p.snapshot_id)
            })
        };
        let mut out: Vec<String> = self
            .meta
            .volumes()
            .await?
            .into_iter()
            .filter(|c| reads(c))
            .map(|c| c.name)
            .collect();
        // A clone in the trash keeps its copies, which still read from the parent.
        out.extend(
            self.meta
                .trashed()
                .await?
                .into_iter()
                .filter(|t| reads(&t.volume))
                .map(|t| {
                    format!(
                        "{} (in the trash: `trireme volume trash purge {}` frees it now)",
                        t.volume.name, t.volume.name
                    )
                }),
        );
        Ok(out)
    }

    /// Refuses to take away what clones read: snapshot `snapshot` of `v`, or `v` itself.
    pub(super) async fn check_no_clones(
        &self,
        v: &VolumeRecord,
        snapshot: Option<(&str, u64)>,
    ) -> Result<()> {
        let clones = self.clones_of(v, snapshot.map(|s| s.1)).await?;
        if clones.is_empty() {
            return Ok(());
        }
        let what = match snapshot {
            Some((name, _)) => format!("snapshot {}@{name}", v.name),
            None => format!("volume {}", v.name),
        };
        Err(in_use(format!(
            "{what} has clones that read from it: {}. Flatten them first (`trireme volume flatten NAME`) or delete them",
            clones.join(", ")
        )))
    }
}
