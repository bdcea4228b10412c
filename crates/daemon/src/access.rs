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
