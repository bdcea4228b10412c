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

    /// The check an NBD listener makes when a TLS client opens an export: a snapshot's export
    /// (`VOLUME@SNAPSHOT`) by its volume's access list.
    pub fn nbd_gate(&self) -> trireme_nbd::Allow {
        let me = self.clone();
        Arc::new(move |export: &str, client: &str| {
            let volume = export.split_once('@').map_or(export, |(v, _)| v);
            me.allows(volume, client)
        })
    }
}

/// Calls `apply` with every volume, afresh on each change of a layout (a watch) and every few
/// seconds in case a watch missed one; keeps the process's deny list of certificates
/// ([`follow_revoked`]) the same way. Runs until dropped.
pub async fn follow(meta: ClusterMeta, apply: impl Fn(Vec<VolumeRecord>)) {
    let prefixes = [ClusterMeta::layouts_prefix(), ClusterMeta::revoked_prefix()];
    loop {
        let mut changes = Changes::watch(&meta, &prefixes).await;
        match meta.volumes().await {
            Ok(vs) => apply(vs),
            Err(e) => tracing::debug!("reading access lists: {e}"),
        }
        refresh_revoked(&meta).await;
        changes.next().await;
    }
}

/// An access view kept current by [`follow`] on a task of its own (abort it to stop).
pub fn followed(meta: ClusterMeta) -> (AccessView, tokio::task::JoinHandle<()>) {
    let view = AccessView::default();
    let v = view.clone();
    let task = tokio::spawn(follow(meta, move |vs| v.set(&vs)));
    (view, task)
}

/// Reads the cluster's deny list of certificates into this process's TLS (every handshake
/// checks it: `trireme_tls::revoke`).
pub async fn refresh_revoked(meta: &ClusterMeta) {
    match meta.revoked().await {
        Ok(r) => trireme_tls::revoke::set_revoked(r.into_iter().map(|r| r.fingerprint)),
        Err(e) => tracing::debug!("reading the revoked certificates: {e}"),
    }
}

/// How often the followers read again when no watch said anything (a watch may miss a change
/// while the store is away).
const REREAD: Duration = Duration::from_secs(5);

/// Changes under some prefixes of the metadata: a watch on each, forwarded to one channel.
struct Changes {
    rx: tokio::sync::mpsc::UnboundedReceiver<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Changes {
    async fn watch(meta: &ClusterMeta, prefixes: &[String]) -> Changes {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for p in prefixes {
            if let Ok(mut w) = meta.store().watch(p, 0).await {
                let tx = tx.clone();
                tasks.push(tokio::spawn(async move {
                    while w.recv().await.is_some() {
                        if tx.send(()).is_err() {
                            return;
                        }
                    }
                }));
            }
        }
        Changes { rx, tasks }
    }

    /// Resolves on the next change, or after [`REREAD`]; then lets a burst of changes (an
    /// attach writes several keys) settle, to be read once.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.rx.recv() => {}
            _ = tokio::time::sleep(REREAD) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
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
        let revoked: Result<Vec<trireme_meta::RevokedCert>, _> = async {
            trireme_control::ControlClient::connect(&control)
                .await?
                .call(&trireme_control::Request::CaRevoked)
                .await
        }
        .await;
        match revoked {
            Ok(r) => trireme_tls::revoke::set_revoked(r.into_iter().map(|r| r.fingerprint)),
            Err(e) => tracing::debug!("reading the revoked certificates: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What a node daemon's access rules need (see `trireme_node`'s `access.rs`): every volume's
/// access list, newest epoch and writer (its attach record's identity), by volume id, the
/// cluster's members (nodes not removed), and every volume's claim on busy nodes (its reserve
/// and weight: the node's I/O threads serve by them).
pub async fn node_policies(
    meta: &ClusterMeta,
) -> Result<
    (
        HashMap<u64, trireme_node::VolumePolicy>,
        std::collections::HashSet<u32>,
        HashMap<u64, trireme_node::Share>,
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
    let shares = volumes
        .iter()
        .map(|v| (v.id, trireme_node::Share::of(&v.limits_in_force())))
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
    Ok((policies, members, shares))
}

/// Keeps `node`'s access rules current ([`node_policies`]) and the process's deny list of
/// certificates: afresh on each change of a layout, an attach record, a node record or the
/// deny list (watches), and every few seconds in case a watch missed one. Until the first
/// read, clients reach nothing (nodes and operators do). Runs until dropped.
/// Reads the access rules into `node` once, before it serves: a writer that reached a node
/// whose rules were not read yet would be refused for nothing. Tries for up to 10 s (etcd has
/// just answered the node's registration); past that the node serves, refusing clients until
/// [`follow_node`] reads them.
pub async fn first_node_policies(meta: &ClusterMeta, node: &trireme_node::Node) {
    let t0 = std::time::Instant::now();
    loop {
        match node_policies(meta).await {
            Ok((policies, members, shares)) => {
                node.set_policies(policies);
                node.set_members(Some(members));
                node.set_shares(shares);
                return;
            }
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                tracing::debug!("reading the access rules: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                tracing::warn!(
                    "the access rules could not be read ({e}): clients are refused until they are"
                );
                return;
            }
        }
    }
}

pub async fn follow_node(meta: ClusterMeta, node: std::sync::Arc<trireme_node::Node>) {
    let prefixes = [
        ClusterMeta::layouts_prefix(),
        ClusterMeta::attach_prefix(),
        ClusterMeta::nodes_prefix(),
        ClusterMeta::revoked_prefix(),
    ];
    loop {
        let mut changes = Changes::watch(&meta, &prefixes).await;
        match node_policies(&meta).await {
            Ok((policies, members, shares)) => {
                node.set_policies(policies);
                node.set_members(Some(members));
                node.set_shares(shares);
            }
            Err(e) => tracing::debug!("reading the access rules: {e}"),
        }
        refresh_revoked(&meta).await;
        changes.next().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_export_is_gated_by_its_volume_s_list() {
        let view = AccessView::default();
        let mut v: VolumeRecord = serde_json::from_value(serde_json::json!({
            "id": 1, "name": "v", "size": 4096, "replicas": [], "epoch": 0, "writer_open": false
        }))
        .unwrap();
        v.access = vec!["alice".into()];
        view.set(&[v]);
        let gate = view.nbd_gate();
        assert!(gate("v", "alice"));
        assert!(gate("v@nightly", "alice"));
        assert!(!gate("v@nightly", "bob"));
        assert!(!gate("w@nightly", "alice"));
    }
}
