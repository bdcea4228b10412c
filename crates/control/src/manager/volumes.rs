//! Volumes' lifecycle on the manager: create, tier, access, copies, delete, attach and detach
//! for a writer in this process, replica states, and the replicas every volume should have.

use crate::error::{refused, ManagerError};

use trireme_client::AttachInfo;
use trireme_meta::{NodeState, TierPolicy, VolumeRecord};
use trireme_proto::{Header, Op, Status};
use trireme_replication::{place, NodeLoad};

use super::records::trireme_store_kind_is_volatile;
use super::{attach_info, record_detach, record_replica_state, Manager, Result, MAX_VOLUME};

impl Manager {
    /// Puts a volume's extents on a tier (`fast`, `slow`) or lets heat place them (`auto`),
    /// on every node holding a replica. A pin that one node refuses (its fast tier cannot hold
    /// the volume) is undone on the others and the record keeps the old setting.
    pub async fn set_tier(&self, name: &str, tier: TierPolicy) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let old = self.meta.volume(name).await?;
        let mut v = old.clone();
        v.tier = tier;
        let mut done = Vec::new();
        for r in &v.replicas {
            let node = self.node(r.node).await?;
            if let Err(why) = self.apply_tier(&node, &v).await {
                for n in &done {
                    if let Err(e) = self.apply_tier(n, &old).await {
                        tracing::warn!(volume = name, node = n.id, "undoing a tier pin: {e}");
                    }
                }
                return Err(refused(format!(
                    "volume {name:?} cannot be put on the {} tier: {why}",
                    tier.as_str()
                )));
            }
            done.push(node);
        }
        let v = self
            .meta
            .update_volume(name, &mut |rec| {
                rec.tier = tier;
                Ok(())
            })
            .await?;
        tracing::info!(volume = name, tier = tier.as_str(), "tier set");
        Ok(v)
    }

    pub async fn create_volume(
        &self,
        name: &str,
        size: u64,
        replicas: usize,
        access: Option<Vec<String>>,
        preallocate: bool,
    ) -> Result<VolumeRecord> {
        let mirror = trireme_replication::Layout::Mirror;
        self.create_volume_as(name, size, replicas, access, preallocate, mirror)
            .await
    }

    /// [`Manager::create_volume`] kept as `layout`: a parity volume is placed on its
    /// stripe's K+M nodes (`replicas` must be 0 then: the layout says how many), thin, and
    /// each copy keeps a held map (`FLAG_HELD`).
    pub async fn create_volume_as(
        &self,
        name: &str,
        size: u64,
        replicas: usize,
        access: Option<Vec<String>>,
        preallocate: bool,
        layout: trireme_replication::Layout,
    ) -> Result<VolumeRecord> {
        if let trireme_replication::Layout::Parity(p) = layout {
            if replicas != 0 || preallocate {
                return Err(refused(format!(
                    "a parity {}+{} volume is on its {} nodes and thin: give no replica count and no preallocation",
                    p.data,
                    p.parity,
                    p.data + p.parity
                )));
            }
        }
        let access = access.unwrap_or_else(|| {
            self.default_access
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        });
        if size == 0 || !size.is_multiple_of(4096) || size > MAX_VOLUME {
            return Err(refused(format!(
                "a volume's size must be a whole number of 4 KiB blocks, from 4 KiB to {} (asked: {size} bytes)",
                crate::human(MAX_VOLUME)
            )));
        }
        let _g = self.volume_lock.lock().await;
        let nodes = self.meta.nodes().await?;
        let vols = self.meta.volumes().await?;
        // On etcd, only nodes whose daemon runs now (holds its lease) take new replicas.
        let alive = self.registered().await;
        let loads: Vec<NodeLoad> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Active)
            .filter(|n| alive.as_ref().is_none_or(|a| a.contains_key(&n.id)))
            .map(|n| NodeLoad {
                node: n.id,
                replicas: vols
                    .iter()
                    .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                    .count(),
                zone: n.zone.clone(),
            })
            .collect();
        // Unsaid: three copies, or one per node that takes replicas on a smaller cluster.
        let replicas = match replicas {
            0 => loads.len().clamp(1, 3),
            n => n,
        };
        let chosen = match layout {
            trireme_replication::Layout::Parity(p) => trireme_replication::place_stripe(
                &loads,
                usize::from(p.data),
                usize::from(p.parity),
            )?,
            _ => place(&loads, replicas)?,
        };
        let v = self
            .meta
            .create_volume_from(name, size, &chosen, &access, preallocate, None, layout)
            .await?;
        let mut created = Vec::new();
        for &id in &chosen {
            let node = self.node(id).await?;
            match self.replica_call(&node, Op::CreateReplica, &v).await {
                Ok(f) if f.header.status == Status::Ok => created.push(node),
                outcome => {
                    // Undo: a volume exists with all its replicas or not at all.
                    for n in &created {
                        let _ = self.replica_op(n, Op::DeleteReplica, &v).await;
                    }
                    let _ = self.meta.delete_volume(name).await;
                    let (status, why) = match outcome {
                        // The node says why (a refusal's message is its payload).
                        Ok(f) if !f.payload.is_empty() => (
                            Some(f.header.status),
                            String::from_utf8_lossy(&f.payload).into_owned(),
                        ),
                        Ok(f) => (Some(f.header.status), f.header.status.as_str().to_string()),
                        Err(e) => (None, e.to_string()),
                    };
                    let msg =
                        format!("creating the replica of {name:?} on node {id} failed: {why}");
                    return Err(match status {
                        Some(Status::NoSpace) => ManagerError::NoSpace(msg),
                        _ => refused(msg),
                    });
                }
            }
        }
        tracing::info!(volume = name, size, nodes = ?chosen, preallocate, %layout, "volume created");
        let list: Vec<String> = chosen.iter().map(u32::to_string).collect();
        self.event(
            "volume",
            format!(
                "volume {name} created ({}, {}, {layout}, on node {})",
                crate::human(size),
                if preallocate { "thick" } else { "thin" },
                list.join(", ")
            ),
        )
        .await;
        Ok(v)
    }

    /// Adds `allow` to a volume's access list and takes `deny` off it. Nodes on etcd apply it
    /// within a second; links a denied client already has stay up until they close.
    pub async fn set_access(
        &self,
        name: &str,
        allow: &[String],
        deny: &[String],
    ) -> Result<VolumeRecord> {
        for a in allow.iter().chain(deny) {
            trireme_meta::check_access_entry(a)?;
        }
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                v.access.retain(|a| !deny.contains(a));
                for a in allow {
                    if !v.access.contains(a) {
                        v.access.push(a.clone());
                    }
                }
                Ok(())
            })
            .await?;
        tracing::info!(volume = name, access = ?v.access, "access list changed");
        self.access_changed().await;
        Ok(v)
    }

    /// Sets the fewest in-sync copies the volume's writer goes on writing with. A writer in
    /// this process hears at once; one elsewhere when it next reads the layout (at least once
    /// a second while its writes wait).
    pub async fn set_min_copies(&self, name: &str, n: u32) -> Result<VolumeRecord> {
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                if let trireme_replication::Layout::Parity(p) = v.layout {
                    let mirrors = u32::from(p.parity) + 1;
                    if n == 0 || n > mirrors {
                        return Err(trireme_meta::MetaError::Refused(format!(
                            "min copies {n} of a parity {}+{} volume counts a region's mirrored copies: from 1 to its {mirrors} (besides, {} of its nodes must be in sync for its stripes)",
                            p.data, p.parity, p.data
                        )));
                    }
                    v.min_copies = n;
                    return Ok(());
                }
                if n == 0 || n as usize > v.replicas.len() {
                    return Err(trireme_meta::MetaError::Refused(format!(
                        "min copies {n} must be from 1 to the volume's {} replicas",
                        v.replicas.len()
                    )));
                }
                v.min_copies = n;
                Ok(())
            })
            .await?;
        if let Some(w) = self.writer(name) {
            w.set_min_copies(n);
        }
        tracing::info!(volume = name, min_copies = n, "min copies changed");
        Ok(v)
    }

    pub async fn delete_volume(&self, name: &str) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let v = self.meta.volume(name).await?;
        self.check_no_clones(&v, None).await?;
        self.delete_replicas(&v).await?;
        let v = self
            .meta
            .delete_volume(name)
            .await
            .map_err(ManagerError::from)?;
        self.event(
            "volume",
            format!("volume {name} deleted (its replicas freed)"),
        )
        .await;
        Ok(v)
    }

    /// Deletes every replica of `v` on its node; a node no longer a member (removed, or
    /// gone from the records) holds nothing to free.
    pub(super) async fn delete_replicas(&self, v: &VolumeRecord) -> Result<()> {
        for r in &v.replicas {
            let node = match self.node(r.node).await {
                Ok(n) if n.state == trireme_meta::NodeState::Removed => continue,
                Ok(n) => n,
                Err(_) => continue,
            };
            match self.replica_op(&node, Op::DeleteReplica, v).await {
                Ok(Status::Ok | Status::NoReplica) => {}
                Ok(s) => {
                    return Err(refused(format!(
                        "node {} refused to delete its replica: {}",
                        r.node,
                        s.as_str()
                    )))
                }
                Err(e) => return Err(refused(format!("node {}: {e}", r.node))),
            }
        }
        Ok(())
    }

    async fn attach_info(&self, v: &VolumeRecord) -> Result<AttachInfo> {
        attach_info(&self.meta, v).await
    }

    /// A new writer: bumps the epoch durably, then says where the replicas are, and whether the
    /// previous writer left without detaching (then the new one reconciles the replicas).
    pub async fn attach(&self, name: &str) -> Result<AttachInfo> {
        let mut unclean = false;
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                unclean = v.writer_open;
                v.epoch += 1;
                v.writer_open = true;
                Ok(())
            })
            .await?;
        let mut info = self.attach_info(&v).await?;
        info.reconcile = unclean;
        Ok(info)
    }

    /// A new writer for the process that wrote `name` at epoch `ours` before another writer
    /// fenced it: taken only if that writer has detached (the volume is not open) and no
    /// other attached since (the epoch is still `theirs`), in the same transaction, so a
    /// writer that attaches meanwhile is never fenced by the take-back.
    pub async fn take_back(&self, name: &str, theirs: u64) -> Result<AttachInfo> {
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                if v.epoch != theirs || v.writer_open {
                    return Err(trireme_meta::MetaError::Refused(format!(
                        "volume {name} is held by the writer of epoch {}",
                        v.epoch
                    )));
                }
                v.epoch += 1;
                v.writer_open = true;
                Ok(())
            })
            .await?;
        self.attach_info(&v).await
    }

    /// Records a replica state for the writer of `epoch` (see `replication::transition`).
    pub async fn set_replica_state(
        &self,
        name: &str,
        epoch: u64,
        node: u32,
        state: trireme_replication::ReplicaState,
        incarnation: u64,
    ) -> Result<VolumeRecord> {
        record_replica_state(&self.meta, name, epoch, node, state, incarnation)
            .await
            .map_err(ManagerError::from)
    }

    /// The writer of `epoch` left cleanly. A stale epoch changes nothing.
    pub async fn detach(&self, name: &str, epoch: u64) -> Result<VolumeRecord> {
        record_detach(&self.meta, name, epoch)
            .await
            .map_err(ManagerError::from)
    }

    pub async fn locate(&self, name: &str) -> Result<AttachInfo> {
        let v = self.meta.volume(name).await?;
        self.attach_info(&v).await
    }

    /// After a restart: replicas on volatile stores come back empty, so they are re-created.
    /// A re-created replica whose volume still has data elsewhere is recorded as failed (it
    /// needs a full resync and must never serve a read before); if every replica came back
    /// empty, the volume simply starts empty, as a volatile store promises.
    /// A replica missing from a persistent store is reported, never silently re-created empty.
    /// Nodes that do not answer are skipped (they are handled when they come back).
    pub async fn ensure_replicas(&self) -> Result<()> {
        let nodes = self.member_nodes().await?;
        for v in self.meta.volumes().await? {
            let mut missing = Vec::new();
            let mut present = 0;
            for r in &v.replicas {
                let Some(n) = nodes.iter().find(|n| n.id == r.node) else {
                    continue;
                };
                let h = Header {
                    volume: v.id,
                    ..Header::request(Op::ReplicaInfo, 0)
                };
                match self.node_call(n, h).await {
                    Ok(f) if f.header.status == Status::NoReplica => missing.push(n.clone()),
                    Ok(_) => present += 1,
                    Err(e) => {
                        tracing::warn!(volume = %v.name, node = n.id, "cannot check replica: {e}")
                    }
                }
            }
            for n in missing {
                if !trireme_store_kind_is_volatile(&n.store) {
                    tracing::error!(volume = %v.name, node = n.id, "replica is missing from a persistent store; not re-creating it empty");
                    continue;
                }
                if present > 0 {
                    // Record first: a crash between the two leaves it failed, never falsely in sync.
                    self.meta
                        .update_volume(&v.name, &mut |rec| {
                            if let Some(r) = rec.replicas.iter_mut().find(|r| r.node == n.id) {
                                r.state = trireme_replication::ReplicaState::Failed;
                            }
                            Ok(())
                        })
                        .await?;
                    tracing::warn!(volume = %v.name, node = n.id, "replica lost with its volatile store; re-created empty and marked failed until resynced");
                }
                self.replica_op(&n, Op::CreateReplica, &v).await?;
                self.pin_new_replica(&n, &v).await;
            }
        }
        Ok(())
    }
}
