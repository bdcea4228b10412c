//! Keeping the metadata store within its quota: the manager compacts etcd's history, and says
//! when etcd is full.
//!
//! etcd keeps every revision of every key until it is compacted. A writer's report rewritten
//! each few seconds, or a client that writes its report key in a loop, grows that history
//! until etcd reaches its quota and refuses every write (a NOSPACE alarm): creates fail, and a
//! writer waiting to record a take-out waits for good. So the manager compacts: every
//! [`COMPACT_EVERY`] it drops the history older than the revision it saw one period before
//! (watchers that fall that far behind read afresh). etcd's own `--auto-compaction-*` (the
//! README's line) does the same from the other side; either alone keeps it bounded.

use std::sync::Arc;
use std::time::Duration;

use super::Manager;

/// How often the manager compacts, and how much history it keeps (one period's).
pub const COMPACT_EVERY: Duration = Duration::from_secs(300);

impl Manager {
    /// Compacts the store's history every [`COMPACT_EVERY`], keeping the last period's.
    pub fn start_compaction(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut seen: Option<i64> = None;
            loop {
                let Some(m) = me.upgrade() else { return };
                let store = m.meta.store().clone();
                drop(m);
                if let Some(rev) = seen {
                    match store.compact(rev).await {
                        Ok(()) => tracing::debug!(revision = rev, "compacted the metadata store"),
                        Err(e) => tracing::warn!("compacting the metadata store: {e}"),
                    }
                }
                seen = store
                    .range("/trireme-compaction-probe")
                    .await
                    .ok()
                    .map(|(_, r)| r);
                tokio::time::sleep(COMPACT_EVERY).await;
            }
        });
    }

    /// The store's alarms, as health reasons ("etcd is full ...").
    pub(crate) async fn store_alarms(&self) -> Vec<String> {
        match self.meta.store().alarms().await {
            Ok(a) => a
                .into_iter()
                .map(|a| {
                    if a.starts_with(trireme_meta::kv::ALARM_NOSPACE) {
                        format!("the metadata store is full ({a}): writes are refused until it is compacted and defragmented and the alarm disarmed (`etcdctl alarm disarm`)")
                    } else {
                        format!("the metadata store raises an alarm: {a}")
                    }
                })
                .collect(),
            Err(e) => {
                tracing::debug!("reading the metadata store's alarms: {e}");
                Vec::new()
            }
        }
    }
}
