//! Who may use which volume: the access lists in the metadata, kept current in the processes
//! that enforce them (node daemons for their replicas, NBD exports for their clients).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use trireme_meta::{ClusterMeta, VolumeRecord, ANY_CLIENT};

/// Every volume's access list by name, as last read. Until the first read, it allows no one.
#[derive(Debug, Clone, Default)]
pub struct AccessView(Arc<RwLock<Option<Lists>>>);

/// Volume name → its access list.
type Lists = HashMap<String, Vec<String>>;

impl AccessView {
    pub fn set(&self, vs: &[VolumeRecord]) {
        let m = vs
            .iter()
            .map(|v| (v.name.clone(), v.access.clone()))
            .collect();
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(m);
    }

    /// True if `client` may use `volume`.
    pub fn allows(&self, volume: &str, client: &str) -> bool {
        let g = self.0.read().unwrap_or_else(|e| e.into_inner());
        g.as_ref()
            .and_then(|m| m.get(volume))
            .is_some_and(|l| l.iter().any(|c| c == ANY_CLIENT || c == client))
    }

    /// The check an NBD listener makes when a TLS client opens an export.
    pub fn nbd_gate(&self) -> trireme_nbd::Allow {
        let me = self.clone();
        Arc::new(move |export: &str, client: &str| me.allows(export, client))
    }
}

/// Calls `apply` with every volume, afresh on each change of a layout (a watch) and every few
/// seconds in case a watch missed one. Runs until dropped.
pub async fn follow(meta: ClusterMeta, apply: impl Fn(Vec<VolumeRecord>)) {
    const REREAD: Duration = Duration::from_secs(5);
    let prefix = ClusterMeta::layouts_prefix();
    loop {
        let mut watch = meta.store().watch(&prefix, 0).await.ok();
        match meta.volumes().await {
            Ok(vs) => apply(vs),
            Err(e) => tracing::debug!("reading access lists: {e}"),
        }
        let changed = async {
            match watch.as_mut() {
                Some(w) => w.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep(REREAD) => {}
        }
        // A burst of changes (an attach writes several) is read once.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Like [`follow`], through the control API of `trireme up` (a process beside it that has
/// no metadata of its own): every second.
pub async fn follow_control(control: std::path::PathBuf, view: AccessView) {
    loop {
        let vs: Result<Vec<VolumeRecord>, _> = async {
            trireme_control::ControlClient::connect(&control)
                .await?
                .call(&trireme_control::Request::VolumeList)
                .await
        }
        .await;
        match vs {
            Ok(vs) => view.set(&vs),
            Err(e) => tracing::debug!("reading access lists: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What a node daemon's access rules need (see `trireme_node`'s `access.rs`): every volume's
/// access list, newest epoch and writer (its attach record's identity), by volume id, and the
/// cluster's members (nodes not removed).
pub async fn node_policies(
    meta: &ClusterMeta,
) -> Result<
    (
        HashMap<u64, trireme_node::VolumePolicy>,
        std::collections::HashSet<u32>,
    ),
    trireme_meta::MetaError,
> {
    let volumes = meta.volumes().await?;
    let attached = meta.attachments().await?;
    let members = meta
        .nodes()
        .await?
        .into_iter()
        .filter(|n| n.state != trireme_meta::NodeState::Removed)
        .map(|n| n.id)
        .collect();
    let policies = volumes
        .into_iter()
        .map(|v| {
            // A record of an older epoch (a writer replaced meanwhile) names nobody current.
            let writer = attached
                .get(&v.name)
                .filter(|a| a.epoch == v.epoch)
                .and_then(|a| a.identity.clone());
            (
                v.id,
                trireme_node::VolumePolicy {
                    access: v.access,
                    epoch: v.epoch,
                    writer,
                },
            )
        })
        .collect();
    Ok((policies, members))
}

/// Keeps `node`'s access rules current ([`node_policies`]): afresh on each change of a
/// layout, an attach record or a node record (watches), and every few seconds in case a watch
/// missed one. Until the first read, clients reach nothing (nodes and operators do). Runs
/// until dropped.
pub async fn follow_node(meta: ClusterMeta, node: std::sync::Arc<trireme_node::Node>) {
    const REREAD: Duration = Duration::from_secs(5);
    let prefixes = [
        ClusterMeta::layouts_prefix(),
        ClusterMeta::attach_prefix(),
        ClusterMeta::nodes_prefix(),
    ];
    loop {
        let mut watches = Vec::new();
        for p in &prefixes {
            watches.push(meta.store().watch(p, 0).await.ok());
        }
        match node_policies(&meta).await {
            Ok((policies, members)) => {
                node.set_policies(policies);
                node.set_members(Some(members));
            }
            Err(e) => tracing::debug!("reading the access rules: {e}"),
        }
        let [a, b, c] = &mut watches[..] else {
            unreachable!("three prefixes")
        };
        tokio::select! {
            _ = changed(a) => {}
            _ = changed(b) => {}
            _ = changed(c) => {}
            _ = tokio::time::sleep(REREAD) => {}
        }
        // A burst of changes (an attach writes several keys) is read once.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Resolves when `w` sees a change (or ends); never, without a watch.
async fn changed(w: &mut Option<trireme_meta::kv::Watch>) -> bool {
    match w.as_mut() {
        Some(w) => w.recv().await.is_some(),
        None => std::future::pending().await,
    }
}
