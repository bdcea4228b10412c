//! The writer's side of `volume scrub` on a cluster on etcd: the manager cannot scrub a volume
//! another host writes (a writer of its own would fence that one), so it asks the writer
//! through the volume's scrub request (`scrubs/<name>`, [`ScrubRequest`]), and the writer runs
//! the scrub itself — its progress shows in its report — and writes the outcome back. A
//! resize (`resizes/<name>`) is asked for the same way.

use std::sync::Arc;

use trireme_client::Volume;
use trireme_meta::{ClusterMeta, ResizeRequest, ScrubRequest, ScrubState};

use crate::attach::until_reachable;

/// Serves `volume`'s scrub requests for as long as the writer lives.
pub async fn serve_scrubs(meta: ClusterMeta, volume: Arc<Volume>) {
    let name = volume.info().name.clone();
    let epoch = volume.info().epoch;
    let key = ClusterMeta::scrub_key(&name);
    loop {
        let (now, rev) = crate::keys::read(&meta, &key).await;
        if let Some(kv) = &now {
            match serde_json::from_slice::<ScrubRequest>(&kv.value) {
                Ok(mut req) if req.epoch == epoch && req.state == ScrubState::Asked => {
                    let at = kv.mod_revision;
                    req.state = ScrubState::Running;
                    let Some(at) = answer(&meta, &name, &req, at).await else {
                        crate::keys::changed(&meta, &key, rev).await;
                        continue;
                    };
                    tracing::info!(volume = %name, "scrubbing at the manager's request");
                    match volume.scrub_at(req.region, req.rate).await {
                        Ok(r) => {
                            req.state = ScrubState::Done;
                            req.report = serde_json::to_value(&r).ok();
                        }
                        Err(e) => {
                            req.state = ScrubState::Failed;
                            req.error = Some(e.to_string());
                        }
                    }
                    answer(&meta, &name, &req, at).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(volume = %name, "ignoring a scrub request that does not decode: {e}")
                }
            }
        }
        crate::keys::changed(&meta, &key, rev).await;
    }
}

/// Writes the writer's answer to the scrub request read at revision `at`; its new revision,
/// or `None` if the request changed or went meanwhile (the manager gave up waiting).
async fn answer(meta: &ClusterMeta, name: &str, r: &ScrubRequest, at: i64) -> Option<i64> {
    match until_reachable("answering a scrub request", || meta.put_scrub(name, r, at)).await {
        Ok(Some(rev)) => Some(rev),
        Ok(None) => {
            tracing::warn!(volume = %name, "the scrub request changed before it was answered");
            None
        }
        Err(e) => {
            tracing::warn!(volume = %name, "answering a scrub request: {e}");
            None
        }
    }
}

/// Serves `volume`'s resize requests (`resizes/<name>`, [`ResizeRequest`]) for as long as the
/// writer lives: the writer grows every copy, records the size and serves it
/// (`trireme_client`'s `resize.rs`), then answers.
pub async fn serve_resizes(meta: ClusterMeta, volume: Arc<Volume>) {
    let name = volume.info().name.clone();
    let epoch = volume.info().epoch;
    let key = ClusterMeta::resize_key(&name);
    loop {
        let (now, rev) = crate::keys::read(&meta, &key).await;
        if let Some(kv) = &now {
            match serde_json::from_slice::<ResizeRequest>(&kv.value) {
                Ok(mut req) if req.epoch == epoch && req.state == ScrubState::Asked => {
                    let at = kv.mod_revision;
                    req.state = ScrubState::Running;
                    let put = |req: ResizeRequest, at: i64| {
                        let meta = meta.clone();
                        let name = name.clone();
                        async move {
                            match until_reachable("answering a resize request", || {
                                meta.put_resize(&name, &req, at)
                            })
                            .await
                            {
                                Ok(rev) => rev,
                                Err(e) => {
                                    tracing::warn!(volume = %name, "answering a resize request: {e}");
                                    None
                                }
                            }
                        }
                    };
                    let Some(at) = put(req.clone(), at).await else {
                        crate::keys::changed(&meta, &key, rev).await;
                        continue;
                    };
                    tracing::info!(volume = %name, size = req.size, "resizing at the manager's request");
                    match volume.resize(req.size).await {
                        Ok(()) => req.state = ScrubState::Done,
                        Err(e) => {
                            req.state = ScrubState::Failed;
                            req.error = Some(e.to_string());
                        }
                    }
                    put(req, at).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(volume = %name, "ignoring a resize request that does not decode: {e}")
                }
            }
        }
        crate::keys::changed(&meta, &key, rev).await;
    }
}
