//! The writer's side of the manager's requests on a cluster on etcd: the manager cannot scrub,
//! resize or snapshot a volume another host writes (a writer of its own would fence that one),
//! so it asks the writer through a request record — `scrubs/<name>` ([`ScrubRequest`]),
//! `resizes/<name>` ([`ResizeRequest`]), `snapshot-asks/<name>` ([`SnapshotAsk`]) — and the
//! writer carries it out itself (a scrub's progress shows in its report) and writes the
//! outcome back in place.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use trireme_client::Volume;
use trireme_meta::{
    ClusterMeta, ResizeRequest, ScrubRequest, ScrubState, SnapshotAsk, WriterAnswer,
};

use crate::recorder::Recorder;

use crate::attach::until_reachable;

type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A request of the manager's that the writer carries out and answers in place.
trait Ask: serde::de::DeserializeOwned + Clone + Send + Sync {
    /// What it is, for the log: "a scrub request".
    const WHAT: &'static str;
    fn key(name: &str) -> String;
    fn epoch(&self) -> u64;
    fn state(&self) -> ScrubState;
    fn set_state(&mut self, s: ScrubState);
    /// It as the writer's answer.
    fn as_answer(&self) -> WriterAnswer;
    /// Carries it out, recording the outcome in it.
    fn run<'a>(&'a mut self, v: &'a Volume) -> Fut<'a, ()>;
}

impl Ask for ScrubRequest {
    const WHAT: &'static str = "a scrub request";
    fn key(name: &str) -> String {
        ClusterMeta::scrub_key(name)
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn state(&self) -> ScrubState {
        self.state
    }
    fn set_state(&mut self, s: ScrubState) {
        self.state = s;
    }
    fn as_answer(&self) -> WriterAnswer {
        WriterAnswer::Scrub(self.clone())
    }
    fn run<'a>(&'a mut self, v: &'a Volume) -> Fut<'a, ()> {
        Box::pin(async move {
            tracing::info!(volume = %v.info().name, "scrubbing at the manager's request");
            match v.scrub_at(self.region, self.rate).await {
                Ok(r) => {
                    self.state = ScrubState::Done;
                    self.report = serde_json::to_value(&r).ok();
                }
                Err(e) => {
                    self.state = ScrubState::Failed;
                    self.error = Some(e.to_string());
                }
            }
        })
    }
}

impl Ask for ResizeRequest {
    const WHAT: &'static str = "a resize request";
    fn key(name: &str) -> String {
        ClusterMeta::resize_key(name)
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn state(&self) -> ScrubState {
        self.state
    }
    fn set_state(&mut self, s: ScrubState) {
        self.state = s;
    }
    fn as_answer(&self) -> WriterAnswer {
        WriterAnswer::Resize(self.clone())
    }
    /// Grows every copy, records the size and serves it (`trireme_client`'s `resize.rs`).
    fn run<'a>(&'a mut self, v: &'a Volume) -> Fut<'a, ()> {
        Box::pin(async move {
            // The manager shrinks a volume only while nobody writes it: a request to a writer
            // to shrink is never the manager's, whoever wrote it.
            if self.size < v.size() {
                tracing::warn!(volume = %v.info().name, size = self.size, now = v.size(), "refused a request to shrink the volume: a writer only grows it");
                self.state = ScrubState::Failed;
                self.error = Some(format!(
                    "a writer does not shrink its volume ({} to {} bytes)",
                    v.size(),
                    self.size
                ));
                return;
            }
            tracing::info!(volume = %v.info().name, size = self.size, "resizing at the manager's request");
            match v.resize(self.size).await {
                Ok(()) => self.state = ScrubState::Done,
                Err(e) => {
                    self.state = ScrubState::Failed;
                    self.error = Some(e.to_string());
                }
            }
        })
    }
}

impl Ask for SnapshotAsk {
    const WHAT: &'static str = "a snapshot request";
    fn key(name: &str) -> String {
        ClusterMeta::snapshot_ask_key(name)
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn state(&self) -> ScrubState {
        self.state
    }
    fn set_state(&mut self, s: ScrubState) {
        self.state = s;
    }
    fn as_answer(&self) -> WriterAnswer {
        WriterAnswer::Snapshot(self.clone())
    }
    /// The barrier on every copy in sync (`trireme_client`'s `snapshots.rs`).
    fn run<'a>(&'a mut self, v: &'a Volume) -> Fut<'a, ()> {
        Box::pin(async move {
            tracing::info!(volume = %v.info().name, id = self.id, "taking a snapshot at the manager's request");
            match v.snapshot_sized(self.id, self.created).await {
                Ok((nodes, size)) => {
                    self.state = ScrubState::Done;
                    self.nodes = nodes;
                    self.size = size;
                }
                Err(e) => {
                    self.state = ScrubState::Failed;
                    self.error = Some(e.to_string());
                }
            }
        })
    }
}

/// Serves `volume`'s requests of kind `A` for as long as the writer lives.
async fn serve<A: Ask>(rec: Recorder, volume: Arc<Volume>) {
    let meta = rec.meta().clone();
    let name = volume.info().name.clone();
    let epoch = volume.info().epoch;
    let key = A::key(&name);
    loop {
        let (now, rev) = crate::keys::read(&meta, &key).await;
        if let Some(kv) = &now {
            match serde_json::from_slice::<A>(&kv.value) {
                Ok(mut req) if req.epoch() == epoch && req.state() == ScrubState::Asked => {
                    req.set_state(ScrubState::Running);
                    let Some(at) = answer(&rec, &name, &req, kv.mod_revision).await else {
                        crate::keys::changed(&meta, &key, rev).await;
                        continue;
                    };
                    req.run(&volume).await;
                    answer(&rec, &name, &req, at).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(volume = %name, "ignoring {} that does not decode: {e}", A::WHAT)
                }
            }
        }
        crate::keys::changed(&meta, &key, rev).await;
    }
}

/// Writes the writer's answer to the request read at revision `at`; its new revision, or
/// `None` if the request changed or went meanwhile (the manager gave up waiting).
async fn answer<A: Ask>(rec: &Recorder, name: &str, r: &A, at: i64) -> Option<i64> {
    let what = format!("answering {}", A::WHAT);
    match until_reachable(&what, || rec.answer(name, r.epoch(), at, r.as_answer())).await {
        Ok(Some(rev)) => Some(rev),
        Ok(None) => {
            tracing::warn!(volume = %name, "{} changed before it was answered", A::WHAT);
            None
        }
        Err(e) => {
            tracing::warn!(volume = %name, "{what}: {e}");
            None
        }
    }
}

/// Serves `volume`'s scrub requests for as long as the writer lives.
pub async fn serve_scrubs(rec: Recorder, volume: Arc<Volume>) {
    serve::<ScrubRequest>(rec, volume).await
}

/// Serves `volume`'s resize requests for as long as the writer lives.
pub async fn serve_resizes(rec: Recorder, volume: Arc<Volume>) {
    serve::<ResizeRequest>(rec, volume).await
}

/// Serves `volume`'s snapshot requests for as long as the writer lives.
pub async fn serve_snapshots(rec: Recorder, volume: Arc<Volume>) {
    serve::<SnapshotAsk>(rec, volume).await
}
