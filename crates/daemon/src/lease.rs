//! Holding a lease: refresh it, notice when it is gone, and say so to whoever depends on it.

use std::time::Duration;

use tokio::time::Instant;
use trireme_meta::kv::LeaseId;
use trireme_meta::{MetaError, MetaStore};

/// Shortest TTL accepted (etcd rounds shorter ones up anyway).
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// Grants a lease, retrying while the metadata store is unreachable (the data path goes on
/// meanwhile). Fails only on an error that retrying cannot fix.
pub async fn grant(store: &dyn MetaStore, ttl: Duration) -> Result<LeaseId, MetaError> {
    let mut warned = false;
    loop {
        match store.grant(ttl).await {
            Ok(l) => return Ok(l),
            Err(MetaError::Unavailable(m)) => {
                if !warned {
                    tracing::warn!("metadata store unreachable, retrying: {m}");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Refreshes `lease` every third of `ttl` until it is lost, then returns. While the store is
/// unreachable it keeps trying; once a whole `ttl` has passed since the last refresh that was
/// confirmed (counted from when it was sent), the lease is taken as lost and this returns
/// before etcd can expire it, so dependants stop before anyone else can take over.
pub async fn keep(store: &dyn MetaStore, lease: LeaseId, ttl: Duration) {
    let mut confirmed = Instant::now();
    let mut warned = false;
    loop {
        tokio::time::sleep(ttl / 3).await;
        let sent = Instant::now();
        match tokio::time::timeout(ttl / 2, store.keep_alive(lease)).await {
            Ok(Ok(true)) => {
                confirmed = sent;
                if warned {
                    tracing::info!(lease, "metadata store reachable again; lease kept");
                    warned = false;
                }
            }
            Ok(Ok(false)) => {
                tracing::warn!(lease, "lease expired");
                return;
            }
            Ok(Err(e)) => {
                if !warned {
                    tracing::warn!(lease, "cannot refresh lease: {e}");
                    warned = true;
                }
            }
            Err(_) => {
                if !warned {
                    tracing::warn!(lease, "lease refresh timed out");
                    warned = true;
                }
            }
        }
        if Instant::now() >= confirmed + ttl {
            tracing::warn!(
                lease,
                "no lease refresh confirmed for {ttl:?}: taken as lost"
            );
            return;
        }
    }
}
