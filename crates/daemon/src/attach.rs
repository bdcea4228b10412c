//! The writer of a volume on a client host (`trireme attach`).
//!
//! Attaching is one metadata transaction (compare the layout's and the attach record's
//! revisions, bump the epoch, mark the writer open) followed by the attach record put under
//! this process's lease ([`ClusterMeta::attach`]). A second attach is refused while that
//! record lives; `--force` fences the holder (its epoch is stale at every replica from the
//! moment the new writer attaches them). When the holder dies its lease expires, the record
//! goes, and the next attach finds the writer-open flag set: it reconciles the replicas first.
//!
//! The writer records replica states itself ([`MetaMembership`]): taking a replica out is a
//! metadata write that must be durable before the write that caused it is acknowledged, so
//! while the store is unreachable that write waits — it is never acknowledged without the
//! record — and goes on when the store is back. I/O to in-sync replicas never waits on it.
//!
//! The writer also carries out the manager's requests to move a replica of its volume (a
//! drain, a down node's re-creation): it watches `moves/<volume>` ([`serve_moves`]).

use std::sync::Arc;
use std::time::Duration;

use trireme_client::{AttachInfo, BoxFut, Membership, MembershipError, Volume, VolumeOptions};
use trireme_control::membership_error;
use trireme_meta::{
    AttachRecord, ClusterMeta, MetaError, MoveRequest, MoveRequestState, TakeOutRequest,
    TakeOutState, WriterAnswer,
};

use crate::recorder::Recorder;
use trireme_replication::ReplicaState;

use crate::DaemonError;

/// How long a stopping writer tries to flush and detach.
pub const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an attach refused by the nodes for its identity is tried again: nodes follow a
/// changed access list within a moment, and re-read it every 5 s whatever happens.
const ACCESS_PROPAGATION: Duration = Duration::from_secs(6);

/// How to attach.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    pub volume: String,
    /// Fence the current writer instead of refusing.
    pub force: bool,
    /// TTL of the attach record's lease: how long after this process dies another host may
    /// attach without `--force`.
    pub lease_ttl: Duration,
    pub opts: VolumeOptions,
}

/// Replica states recorded by the writer: in the cluster metadata, or through the manager
/// for a client ([`Recorder`]).
#[derive(Debug, Clone)]
pub struct MetaMembership {
    pub rec: Recorder,
}

/// Retries `f` while the metadata store is unreachable.
pub(crate) async fn until_reachable<T, F, Fut>(what: &str, mut f: F) -> Result<T, MetaError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, MetaError>>,
{
    let mut warned = false;
    loop {
        match f().await {
            Err(MetaError::Unavailable(m)) => {
                if !warned {
                    tracing::warn!(
                        "{what}: metadata store unreachable, waiting for it (etcd also closes the \
                         connections of a certificate its revocation list names): {m}"
                    );
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            r => {
                if warned {
                    tracing::info!("{what}: metadata store reachable again");
                }
                return r;
            }
        }
    }
}

impl Membership for MetaMembership {
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            until_reachable("recording a replica state", || {
                self.rec.set_state(volume, epoch, node, state, incarnation)
            })
            .await
            .map_err(membership_error)
        })
    }

    fn locate<'a>(&'a self, volume: &'a str) -> BoxFut<'a, Result<AttachInfo, MembershipError>> {
        Box::pin(async move {
            let meta = self.rec.meta();
            let v = until_reachable("locating replicas", || meta.volume(volume))
                .await
                .map_err(membership_error)?;
            Ok(trireme_control::attach_info(meta, &v).await?)
        })
    }

    fn detach<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            self.rec
                .detach(volume, epoch)
                .await
                .map_err(membership_error)
        })
    }

    fn record_size<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        size: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            until_reachable("recording a volume's size", || {
                self.rec.record_size(volume, epoch, size)
            })
            .await
            .map_err(membership_error)
        })
    }

    fn record_region<'a>(
        &'a self,
        volume: &'a str,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            until_reachable("recording a parity region", || {
                self.rec.record_region(volume, id, epoch, region, to)
            })
            .await
            .map_err(membership_error)
        })
    }
}

/// An attached volume: the writer, its lease, and what keeps the lease.
#[derive(Debug)]
pub struct Attached {
    pub volume: Arc<Volume>,
    pub meta: ClusterMeta,
    /// Where it records (the metadata store, or the manager for a client).
    rec: Recorder,
    /// The lease the attach record is bound to now (a new one after a loss).
    lease: Arc<std::sync::atomic::AtomicI64>,
    keeper: tokio::task::JoinHandle<()>,
    mover: tokio::task::JoinHandle<()>,
    reporter: Option<tokio::task::JoinHandle<()>>,
}

/// Attaches `cfg.volume` as its writer. `exports` (the NBD URIs it will be served at) go in
/// the attach record, for `status`.
pub async fn attach(
    meta: ClusterMeta,
    cfg: &AttachConfig,
    exports: Vec<String>,
) -> Result<Attached, DaemonError> {
    trireme_meta::check_name(&cfg.volume).map_err(|e| DaemonError::Usage(e.to_string()))?;
    // Said up front, before an epoch is taken: the nodes would refuse this identity anyway.
    if let Some(fp) = crate::tls_fingerprint() {
        let revoked = until_reachable("reading the deny list", || meta.revoked()).await?;
        if revoked.iter().any(|r| r.fingerprint == fp) {
            return Err(DaemonError::Usage(format!(
                "this process's certificate ({}) is revoked: the cluster refuses it at every \
                 handshake. An operator issues a new one with `trireme ca issue`",
                crate::tls_role().map_or_else(String::new, |r| r.to_string())
            )));
        }
    }
    if let Some(trireme_tls::Role::Client(me)) = crate::tls_role() {
        let v = until_reachable("reading the volume", || meta.volume(&cfg.volume)).await?;
        if !v
            .access
            .iter()
            .any(|a| a == trireme_meta::ANY_CLIENT || a == me)
        {
            return Err(DaemonError::Usage(format!(
                "client {me} is not on volume {}'s access list ({}): an operator can add it with `trireme volume access {} --allow {me}`",
                cfg.volume,
                v.access.join(", "),
                cfg.volume
            )));
        }
    }
    let ttl = cfg.lease_ttl.max(crate::lease::MIN_TTL);
    let recorder = Recorder::for_process(meta.clone());
    let lease = crate::lease::grant(&**meta.store(), ttl).await?;
    let rec = AttachRecord {
        epoch: 0,
        host: crate::hostname(),
        pid: std::process::id(),
        exports,
        identity: crate::tls_role().map(|r| r.to_string()),
    };
    let attached = loop {
        let r = until_reachable("attaching", || {
            recorder.attach(&cfg.volume, &rec, lease, cfg.force)
        })
        .await;
        // A writer of this host that died (kill -9, then a restart) holds the record until
        // its lease expires: wait for that rather than refuse.
        if let Err(MetaError::Attached { .. }) = &r {
            match meta.attachment(&cfg.volume).await {
                // Its lease expired between the attach and this look: the record is gone, so
                // the next attach takes the volume (refusing here refused a free volume).
                Ok(None) => continue,
                Ok(Some((h, _)))
                    if h.host == rec.host && !trireme_kernel::process::alive(h.pid) =>
                {
                    tracing::info!(
                        pid = h.pid,
                        "the previous writer on this host died; waiting for its lease to expire"
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    // Ours must outlive the wait.
                    let _ = meta.store().keep_alive(lease).await;
                    continue;
                }
                _ => {}
            }
        }
        break r;
    };
    let (v, unclean) = match attached {
        Ok(r) => r,
        Err(e) => {
            let _ = meta.store().revoke(lease).await;
            return Err(e.into());
        }
    };
    let lease_now = Arc::new(std::sync::atomic::AtomicI64::new(lease));
    let keeper = tokio::spawn(keep_attached(
        recorder.clone(),
        cfg.volume.clone(),
        AttachRecord {
            epoch: v.epoch,
            ..rec.clone()
        },
        lease_now.clone(),
        ttl,
    ));
    let mut info = match trireme_control::attach_info(&meta, &v).await {
        Ok(i) => i,
        Err(e) => {
            keeper.abort();
            let _ = meta.store().revoke(lease).await;
            return Err(e.into());
        }
    };
    info.reconcile = unclean;
    if unclean {
        tracing::warn!(volume = %cfg.volume, epoch = v.epoch, "the previous writer did not detach: reconciling the replicas first");
    }
    let membership = Arc::new(MetaMembership {
        rec: recorder.clone(),
    });
    // Nodes learn a changed access list within a moment (a watch): a refusal right after the
    // list changed is tried again for a few seconds.
    let t0 = std::time::Instant::now();
    let attached = loop {
        match Volume::attach_managed(info.clone(), cfg.opts.clone(), membership.clone()).await {
            Err(trireme_client::VolumeError::Denied { .. })
                if t0.elapsed() < ACCESS_PROPAGATION =>
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            r => break r,
        }
    };
    let volume = match attached {
        Ok(v) => v,
        Err(e) => {
            keeper.abort();
            let _ = meta.store().revoke(lease).await;
            return Err(match e.reached_no_copy() {
                true => DaemonError::NoCopy(e.to_string()),
                false => DaemonError::Runtime(e.to_string()),
            });
        }
    };
    tracing::info!(volume = %cfg.volume, epoch = v.epoch, "attached");
    let mover = {
        let (r, volume) = (recorder.clone(), volume.clone());
        // The manager's requests: moves of a replica, take-outs for planned restarts, scrubs,
        // resizes, snapshots.
        tokio::spawn(async move {
            tokio::join!(
                serve_moves(r.clone(), volume.clone()),
                serve_takeouts(r.clone(), volume.clone()),
                crate::scrubs::serve_scrubs(r.clone(), volume.clone()),
                crate::scrubs::serve_resizes(r.clone(), volume.clone()),
                crate::scrubs::serve_snapshots(r.clone(), volume.clone()),
                follow_layout(r.meta().clone(), volume)
            );
        })
    };
    Ok(Attached {
        volume,
        meta,
        rec: recorder,
        lease: lease_now,
        keeper,
        mover,
        reporter: None,
    })
}

impl Attached {
    /// Stops taking the manager's requests and reporting.
    fn stop_serving_requests(&self) {
        self.mover.abort();
        if let Some(r) = &self.reporter {
            r.abort();
        }
    }

    /// Flushes, detaches cleanly (the next writer need not reconcile) and gives the lease back.
    /// A flush that cannot finish (no replica answers) is given up after [`DETACH_TIMEOUT`]:
    /// the writer-open flag then stays set, so the next writer reconciles.
    pub async fn detach(self) -> Result<(), DaemonError> {
        let epoch = self.volume.info().epoch;
        let name = self.volume.info().name.clone();
        self.stop_serving_requests();
        let r = match tokio::time::timeout(DETACH_TIMEOUT, self.volume.detach()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no replica answered within {DETACH_TIMEOUT:?}")),
        };
        self.keeper.abort();
        let _ = self.rec.release(&name, epoch).await;
        let lease = self.lease.load(std::sync::atomic::Ordering::Relaxed);
        let _ = self.meta.store().revoke(lease).await;
        r.map_err(|e| DaemonError::Runtime(format!("final flush and detach: {e}")))
    }

    /// Lets go of a writer another one superseded: its tasks stop and its lease goes, and
    /// nothing is recorded (the attach record and the epoch are the new writer's now).
    pub async fn abandon(self) {
        self.stop_serving_requests();
        self.keeper.abort();
        let lease = self.lease.load(std::sync::atomic::Ordering::Relaxed);
        let _ = self.meta.store().revoke(lease).await;
    }
}

/// How often the writer looks at what it reports, and the longest it goes without writing
/// the report again (the rates age).
const REPORT_EVERY: Duration = Duration::from_secs(1);
const REPORT_AT_LEAST: Duration = Duration::from_secs(5);

impl Attached {
    /// Starts reporting the writer's view to the cluster (`trireme_meta::WriterReport`): its
    /// replica states with a resync's progress, whether writes wait for copies, a scrub's
    /// progress, its I/O rates, and `http`, where its metrics are served. Written when it
    /// changes and at least every few seconds, bound to the attach lease.
    pub fn report(&mut self, http: Option<String>) {
        let (rec, volume, lease) = (self.rec.clone(), self.volume.clone(), self.lease.clone());
        self.reporter = Some(tokio::spawn(report(rec, volume, lease, http)));
    }
}

async fn report(
    rec: Recorder,
    volume: Arc<Volume>,
    lease: Arc<std::sync::atomic::AtomicI64>,
    http: Option<String>,
) {
    let name = volume.info().name.clone();
    let mut last: Option<(trireme_meta::WriterReport, std::time::Instant)> = None;
    let mut counted = volume
        .metrics_snapshot()
        .map(|s| (s, std::time::Instant::now()));
    let mut units = (volume.io_units(), std::time::Instant::now());
    loop {
        tokio::time::sleep(REPORT_EVERY).await;
        let report = trireme_meta::WriterReport {
            epoch: volume.info().epoch,
            replicas: volume
                .replica_views()
                .into_iter()
                .map(|v| trireme_meta::ReportedReplica {
                    node: v.node,
                    state: v.state,
                    resync: v.resync,
                })
                .collect(),
            writes_suspended: volume.writes_suspended(),
            throttled_seconds: volume.throttled().as_secs_f64(),
            units_per_s: 0.0,
            overlay_blocks: volume.overlay_blocks(),
            scrub: volume.scrub_progress(),
            io: None,
            http: http.clone(),
            links: volume
                .connections()
                .into_iter()
                .filter_map(|(node, l)| {
                    l.map(|l| trireme_meta::ReportedLink {
                        node,
                        transport: l.transport,
                        peer: l.peer,
                        streams: l.streams,
                        lanes: l.lanes,
                        fallback: l.fallback,
                    })
                })
                .collect(),
        };
        let same = last.as_ref().is_some_and(|(l, at)| {
            l.replicas == report.replicas
                && l.links == report.links
                && l.writes_suspended == report.writes_suspended
                && l.scrub == report.scrub
                // Held back by its limits: the manager may give it more of a shared policy.
                && l.throttled_seconds == report.throttled_seconds
                && at.elapsed() < REPORT_AT_LEAST
        });
        if same {
            continue;
        }
        let mut report = report;
        let now = (volume.io_units(), std::time::Instant::now());
        report.units_per_s = (now.0 - units.0) as f64 / now.1.duration_since(units.1).as_secs_f64();
        units = now;
        if let (Some((prev, t)), Some(now)) = (&counted, volume.metrics_snapshot()) {
            report.io = Some(crate::http::board::rates(&now, prev, t.elapsed()));
            counted = Some((now, std::time::Instant::now()));
        }
        // A client's goes through the manager, which writes it under the attach record's
        // lease (etcd lets a client write nothing).
        let l = lease.load(std::sync::atomic::Ordering::Relaxed);
        match rec.report(&name, &report, l).await {
            Ok(()) => last = Some((report, std::time::Instant::now())),
            Err(e) => tracing::debug!(volume = %name, "writing the writer's report: {e}"),
        }
    }
}

/// Keeps the attach record alive. When its lease is lost (etcd unreachable for longer than the
/// TTL) the writer goes on serving, takes a new lease and puts the record back
/// ([`ClusterMeta::reattach`]) as soon as etcd answers, unless another writer attached
/// meanwhile: then this one is fenced at every replica, and says so.
async fn keep_attached(
    rec_at: Recorder,
    name: String,
    rec: AttachRecord,
    lease: Arc<std::sync::atomic::AtomicI64>,
    ttl: Duration,
) {
    use std::sync::atomic::Ordering;
    let store = rec_at.meta().store().clone();
    loop {
        let old = lease.load(Ordering::Relaxed);
        crate::lease::keep(&*store, old, ttl).await;
        tracing::warn!(
            volume = %name,
            "the attach lease is lost: taking a new one and putting the attach record back"
        );
        let new = match crate::lease::grant(&*store, ttl).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(volume = %name, "no new lease: {e}");
                return;
            }
        };
        match until_reachable("putting the attach record back", || {
            rec_at.reattach(&name, &rec, new)
        })
        .await
        {
            Ok(()) => {
                lease.store(new, Ordering::Relaxed);
                let _ = store.revoke(old).await;
                tracing::info!(volume = %name, epoch = rec.epoch, "attach record back");
            }
            Err(e) => {
                let _ = store.revoke(new).await;
                tracing::error!(volume = %name, "this writer is fenced: {e}");
                return;
            }
        }
    }
}

/// Carries out the manager's move requests for `volume` (see [`MoveRequest`]): waits on the
/// request key with a watch, takes a request made for this writer's epoch, and does the copy
/// and the retirement, writing progress (every second) and the outcome back into the key.
pub async fn serve_moves(rec: Recorder, volume: Arc<Volume>) {
    let meta = rec.meta().clone();
    let name = volume.info().name.clone();
    let epoch = volume.info().epoch;
    let key = ClusterMeta::move_request_key(&name);
    loop {
        let (now, rev) = crate::keys::read(&meta, &key).await;
        if let Some(kv) = &now {
            match serde_json::from_slice::<MoveRequest>(&kv.value) {
                Ok(req) if req.epoch == epoch && req.state == MoveRequestState::Asked => {
                    carry_out(&rec, &volume, req, kv.mod_revision).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("ignoring a move request that does not decode: {e}"),
            }
        }
        // Any change of the key (a delete too): read it again.
        crate::keys::changed(&meta, &key, rev).await;
    }
}

/// Keeps the writer's settings from the volume's layout current (`volume set --min-copies`,
/// `--iops-limit` and the other limits, made through the manager), with a watch on its key;
/// and lets go of a replica the layout
/// dropped while the writer still held it. That happens when a move's old copy was retired
/// by the previous writer, which died before the manager dropped it: the next writer attached
/// with the copy on record (outdated, and maybe resynced since), then the manager dropped it
/// and deleted it on its node. Writes to it would fail, and no resync could bring it back.
async fn follow_layout(meta: ClusterMeta, volume: Arc<Volume>) {
    let name = volume.info().name.clone();
    let key = format!("{}{name}", ClusterMeta::layouts_prefix());
    loop {
        let (_, rev) = crate::keys::read(&meta, &key).await;
        match meta.volume(&name).await {
            Ok(v) => {
                if v.min_copies > 0 {
                    volume.set_min_copies(v.min_copies);
                }
                volume.set_limits(v.limits_in_force()).await;
                retire_dropped(&volume, &v.replicas).await;
            }
            Err(e) => tracing::debug!(volume = %name, "reading the layout: {e}"),
        }
        crate::keys::changed(&meta, &key, rev).await;
    }
}

/// Lets go of the mirror's copies the layout no longer lists (`listed`). A parity copy
/// dropped from the layout gave its place to a new one: the writer lets it go when the new
/// one takes it (`move_as_writer`); a new one dropped (its move given up) stops following.
async fn retire_dropped(volume: &Volume, listed: &[trireme_meta::ReplicaRecord]) {
    let name = &volume.info().name;
    let mirror = volume.info().layout.is_mirror();
    let dropped = volume
        .replica_views()
        .into_iter()
        .filter(|r| !listed.iter().any(|x| x.node == r.node));
    for r in dropped {
        // Only a follower stops here (a parity copy in place goes when its successor
        // takes the place).
        if !mirror {
            volume.unfollow_replica(r.node).await;
            continue;
        }
        match volume.retire_replica(r.node).await {
            Ok(()) => {
                tracing::info!(volume = %name, node = r.node, "replica dropped from the layout: the writer lets go of it")
            }
            Err(e) => {
                tracing::warn!(volume = %name, node = r.node, "letting go of a replica the layout dropped: {e}")
            }
        }
    }
}

/// Carries out the manager's take-out requests for `volume` (a planned restart of a node,
/// see [`TakeOutRequest`]): on `asked`, takes the replica on that node out and answers `out`
/// (or `refused`, below the volume's minimum of copies); on `return`, lets the resync bring it
/// back and answers `back` with what it copied. A request deleted meanwhile (the restart was
/// given up) releases the replica too.
pub async fn serve_takeouts(rec: Recorder, volume: Arc<Volume>) {
    let meta = rec.meta().clone();
    let name = volume.info().name.clone();
    let epoch = volume.info().epoch;
    let key = ClusterMeta::takeout_key(&name);
    let mut held: Option<u32> = None;
    loop {
        let (now, rev) = crate::keys::read(&meta, &key).await;
        let req = match now
            .as_ref()
            .map(|kv| serde_json::from_slice::<TakeOutRequest>(&kv.value))
        {
            Some(Ok(r)) if r.epoch == epoch => {
                Some((r, now.as_ref().map_or(0, |kv| kv.mod_revision)))
            }
            Some(Err(e)) => {
                tracing::warn!("ignoring a take-out request that does not decode: {e}");
                None
            }
            _ => None,
        };
        match req {
            Some((mut r, at)) if r.state == TakeOutState::Asked => {
                // The minimum of copies as it is now (the layout follower may not have seen a
                // change made just before).
                if let Ok(v) = meta.volume(&name).await {
                    if v.min_copies > 0 {
                        volume.set_min_copies(v.min_copies);
                    }
                }
                match volume
                    .take_out_node(r.node, trireme_control::RESTART_HOLD)
                    .await
                {
                    Ok(_) => {
                        held = Some(r.node);
                        r.state = TakeOutState::Out;
                    }
                    Err(e) => {
                        r.state = TakeOutState::Refused;
                        r.error = Some(e.to_string());
                        tracing::warn!(volume = %name, node = r.node, "planned restart refused: {e}");
                    }
                }
                answer(&rec, &name, &r, at).await;
                continue;
            }
            Some((mut r, at)) if r.state == TakeOutState::Return => {
                volume.release_node(r.node);
                held = None;
                if wait_back(&meta, &volume, r.node, &key, at).await {
                    if let Some(p) = volume.last_resync(r.node) {
                        r.resynced_bytes = p.copied_bytes;
                        r.full = p.full;
                    }
                    r.state = TakeOutState::Back;
                    answer(&rec, &name, &r, at).await;
                }
                continue;
            }
            Some(_) => {}
            None => {
                if let Some(n) = held.take() {
                    volume.release_node(n);
                }
            }
        }
        crate::keys::changed(&meta, &key, rev).await;
    }
}

/// Writes the writer's answer to a take-out request read at revision `at`.
async fn answer(rec: &Recorder, name: &str, r: &TakeOutRequest, at: i64) {
    match until_reachable("answering a take-out request", || {
        rec.answer(name, r.epoch, at, WriterAnswer::TakeOut(r.clone()))
    })
    .await
    {
        Ok(Some(_)) => {}
        Ok(None) => {
            tracing::warn!(volume = %name, "the take-out request changed before it was answered")
        }
        Err(e) => tracing::warn!(volume = %name, "answering a take-out request: {e}"),
    }
}

/// Waits until the replica on `node` is in sync again; `false` if the request (at revision
/// `at`) changed or went meanwhile (the manager gave up waiting).
async fn wait_back(meta: &ClusterMeta, volume: &Volume, node: u32, key: &str, at: i64) -> bool {
    let mut checked = std::time::Instant::now();
    while !volume.in_sync_on(node) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if checked.elapsed() > Duration::from_secs(1) {
            checked = std::time::Instant::now();
            if crate::keys::read(meta, key)
                .await
                .0
                .map(|kv| kv.mod_revision)
                != Some(at)
            {
                return false;
            }
        }
    }
    true
}

async fn carry_out(rec: &Recorder, volume: &Volume, mut req: MoveRequest, mut rev: i64) {
    let name = volume.info().name.clone();
    let meta = rec.meta();
    let put = |req: &MoveRequest, rev: i64| {
        rec.answer(&name, req.epoch, rev, WriterAnswer::Move(req.clone()))
    };
    // Taken: no one else will do it.
    req.state = MoveRequestState::Copying;
    match until_reachable("taking a move request", || put(&req, rev)).await {
        Ok(Some(r)) => rev = r,
        Ok(None) => return, // changed meanwhile: read it again
        Err(e) => {
            tracing::warn!("taking a move request: {e}");
            return;
        }
    }
    tracing::info!(volume = %name, from = req.from, to = req.to, "moving a replica at the manager's request");
    let seen = std::sync::Mutex::new(None);
    let mut note = |p: Option<&trireme_replication::ResyncProgress>| {
        *seen.lock().unwrap_or_else(|e| e.into_inner()) = p.cloned();
    };
    let copy = trireme_control::move_as_writer(meta, volume, req.from, req.to, req.rate, &mut note);
    tokio::pin!(copy);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let outcome = loop {
        tokio::select! {
            biased;
            r = &mut copy => break r,
            _ = tick.tick() => {
                req.progress = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
                // Best effort: progress is for `status`; the outcome is written below.
                if let Ok(Some(r)) = put(&req, rev).await {
                    rev = r;
                }
            }
        }
    };
    req.progress = None;
    match &outcome {
        Ok(()) => {
            req.state = MoveRequestState::Done;
            tracing::info!(volume = %name, from = req.from, to = req.to, "replica moved");
        }
        Err(e) => {
            req.state = MoveRequestState::Failed;
            req.error = Some(e.to_string());
            tracing::error!(volume = %name, from = req.from, to = req.to, "moving a replica: {e}");
        }
    }
    match until_reachable("reporting a move", || put(&req, rev)).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            tracing::warn!(volume = %name, "the move request changed while it ran; outcome not reported")
        }
        Err(e) => tracing::warn!(volume = %name, "reporting a move: {e}"),
    }
}
