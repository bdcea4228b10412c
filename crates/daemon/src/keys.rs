//! Following one key of the cluster metadata: the manager's requests to a writer
//! (`moves/<volume>`, `takeouts/<volume>`) and to a daemon (`restarts/<node>`) are each one key
//! that the asked process reads, acts on, and watches for its next change.

use std::time::Duration;

use trireme_meta::kv::KeyValue;
use trireme_meta::ClusterMeta;

/// The key's value now (if it exists) and the store's revision to watch from. Retries while
/// the store cannot be read.
pub(crate) async fn read(meta: &ClusterMeta, key: &str) -> (Option<KeyValue>, i64) {
    loop {
        match meta.store().range(key).await {
            Ok((kvs, rev)) => return (kvs.into_iter().find(|kv| kv.key == key), rev),
            Err(e) => {
                tracing::debug!(key, "reading: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Returns once `key` changed after revision `rev` (or the watch broke: read it again).
pub(crate) async fn changed(meta: &ClusterMeta, key: &str, rev: i64) {
    let Ok(mut w) = meta.store().watch(key, rev + 1).await else {
        tokio::time::sleep(Duration::from_secs(1)).await;
        return;
    };
    loop {
        match w.recv().await {
            Some(ev) if ev.kv.key != key => continue,
            _ => return,
        }
    }
}
