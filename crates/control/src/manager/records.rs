//! What a writer records on the metadata store, wherever it runs: where a volume's replicas
//! are, replica states, a clean detach.

use crate::error::refused;

use trireme_client::{AttachInfo, ReplicaTarget};
use trireme_meta::{ClusterMeta, VolumeRecord};

use super::Result;

/// Where a volume's replicas are, for a writer (`reconcile` false: the caller decides).
/// A volume kept in a layout this build does not serve is refused here, before any writer.
pub async fn attach_info(meta: &ClusterMeta, v: &VolumeRecord) -> Result<AttachInfo> {
    v.layout
        .served()
        .map_err(|e| refused(format!("volume {}: {e}", v.name)))?;
    let nodes = meta.nodes().await?;
    let mut replicas = Vec::new();
    for r in &v.replicas {
        let n = nodes
            .iter()
            .find(|n| n.id == r.node)
            .ok_or_else(|| refused(format!("node {} is not registered", r.node)))?;
        replicas.push(ReplicaTarget {
            node: n.id,
            addr: n.addr.clone(),
            local_addr: n.local_addr.clone(),
            state: r.state,
            incarnation: r.incarnation,
            // A parity copy's move keeps the old copy in its place until the new one
            // takes it (a mirror's new copy is one more beside the others).
            follows: r
                .moving_from
                .filter(|x| !v.layout.is_mirror() && v.replicas.iter().any(|o| o.node == *x)),
        });
    }
    // A parity volume's regions as its encodes switched them (the overlay is the nodes').
    let regions = match v.layout.is_mirror() {
        true => Vec::new(),
        false => meta.regions(v.id).await?,
    };
    Ok(AttachInfo {
        name: v.name.clone(),
        id: v.id,
        size: v.size,
        epoch: v.epoch,
        replicas,
        reconcile: false,
        min_copies: v.min_copies(),
        preallocate: v.preallocate,
        layout: v.layout,
        regions,
        limits: v.limits_in_force(),
    })
}

/// Records a replica state for the writer of `epoch` (see `replication::transition`): what
/// the manager does for a writer in its process, and a writer on another host does itself.
pub async fn record_replica_state(
    meta: &ClusterMeta,
    name: &str,
    epoch: u64,
    node: u32,
    state: trireme_replication::ReplicaState,
    incarnation: u64,
) -> std::result::Result<VolumeRecord, trireme_meta::MetaError> {
    let v = meta
        .update_volume(name, &mut |v| {
            let states: Vec<(u32, trireme_replication::ReplicaState)> =
                v.replicas.iter().map(|r| (r.node, r.state)).collect();
            let i = trireme_replication::transition(&states, v.epoch, epoch, node, state)?;
            v.replicas[i].state = state;
            if state == trireme_replication::ReplicaState::InSync && incarnation != 0 {
                v.replicas[i].incarnation = incarnation;
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = name, node, %state, epoch, "replica state recorded");
    Ok(v)
}

/// The writer of `epoch` resized `name`: its new size, once every copy taking writes has it.
/// A stale epoch is refused.
pub async fn record_size(
    meta: &ClusterMeta,
    name: &str,
    epoch: u64,
    size: u64,
) -> std::result::Result<VolumeRecord, trireme_meta::MetaError> {
    let v = meta
        .update_volume(name, &mut |v| {
            if v.epoch != epoch {
                return Err(trireme_meta::MetaError::Refused(format!(
                    "the writer of epoch {epoch} is no longer volume {name}'s (epoch {})",
                    v.epoch
                )));
            }
            v.size = size;
            Ok(())
        })
        .await?;
    tracing::info!(volume = name, size, epoch, "volume size recorded");
    Ok(v)
}

/// The writer of `epoch` left cleanly: the next one need not reconcile. A stale epoch changes
/// nothing.
pub async fn record_detach(
    meta: &ClusterMeta,
    name: &str,
    epoch: u64,
) -> std::result::Result<VolumeRecord, trireme_meta::MetaError> {
    meta.update_volume(name, &mut |v| {
        if v.epoch == epoch {
            v.writer_open = false;
        }
        Ok(())
    })
    .await
}

/// True if a node's store keeps nothing across a restart (the node's record names its kind;
/// the names are `trireme_store::StoreKind`'s).
pub(super) fn trireme_store_kind_is_volatile(store: &str) -> bool {
    !matches!(store, "file" | "tiered")
}
