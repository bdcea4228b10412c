//! Planned node restarts (`trireme node restart N`, `maintenance rolling`).
//!
//! Whoever writes to a replica on the node takes it out first, cleanly (recorded outdated, the
//! survivors start their record of what it misses), so no write fails on it and none waits for
//! a timeout; the node then stops (flushing, recording a clean shutdown) and starts again, and
//! each writer resyncs its replica incrementally. In `trireme up` the manager holds the writers
//! and the node processes itself. On etcd the writers run on client hosts and the daemons on
//! their servers, so the manager asks through keys, as for moves: `takeouts/<volume>` to each
//! writer (asked, out, then return, back) and `restarts/<node>` to the daemon, which re-executes
//! itself (picking up an upgraded binary) under a new lease.

use crate::error::{refused, ManagerError};
use std::sync::Arc;
use std::time::Duration;
// tokio's clock: the real one in production, virtual in the simulator (heartbeats and
// liveness then follow simulated time).
use tokio::time::Instant;

use trireme_client::Volume;
use trireme_meta::{RestartOrder, TakeOutRequest, TakeOutState};
use trireme_replication::ReplicaState;

use crate::api::NodeRestartReport;
use crate::manager::{Manager, Result};

/// Longest a planned restart waits for its replicas to be back in sync.
const RESTART_LIMIT: Duration = Duration::from_secs(3600);
/// Longest a writer on another host may take to answer a take-out, and a daemon to stop and
/// register again.
pub(crate) const ANSWER_LIMIT: Duration = Duration::from_secs(30);
/// How long a replica taken out stays out unless released: long enough for a daemon's restart;
/// after it the writer's resync task tries it again, as for any replica that went away.
pub const HOLD: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

impl Manager {
    /// A planned restart of node `id` (see [`crate::Request::NodeRestart`]): in `trireme up`,
    /// of its process; on etcd, of its daemon, wherever it runs.
    pub async fn restart_node(&self, id: u32) -> Result<NodeRestartReport> {
        // One at a time: two nodes away at once is what a rolling restart avoids.
        let _one = self.restart_lock.lock().await;
        if self.leases_on() {
            self.restart_member(id).await
        } else {
            self.restart_supervised(id).await
        }
    }

    fn local_writers(&self) -> Vec<Arc<Volume>> {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `trireme up`: the writers are in this process, and so is the nodes' supervisor.
    async fn restart_supervised(&self, id: u32) -> Result<NodeRestartReport> {
        let t0 = Instant::now();
        let mut out = Vec::new();
        for w in self.local_writers() {
            match w.take_out_node(id, HOLD).await {
                Ok(true) => out.push(w),
                Ok(false) => {}
                Err(e) => {
                    release(&out, id);
                    return Err(e.into());
                }
            }
        }
        let names: Vec<String> = out.iter().map(|w| w.info().name.clone()).collect();
        tracing::info!(node = id, volumes = ?names, "planned restart: replicas taken out, stopping");
        let stopped = async {
            self.node_control(false, id).await?;
            while self.node_running(id).await? {
                if t0.elapsed() > ANSWER_LIMIT {
                    return Err(refused(format!("node {id} did not exit after SIGTERM")));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.node_control(true, id).await
        }
        .await;
        release(&out, id);
        stopped?;
        let down = t0.elapsed();
        wait_in_sync(&out, id, t0).await?;
        let mut report = NodeRestartReport {
            node: id,
            volumes: names,
            down_ms: down.as_millis() as u64,
            total_ms: t0.elapsed().as_millis() as u64,
            resynced_bytes: 0,
            full: false,
        };
        add_resyncs(&mut report, &out);
        log_done(&report);
        Ok(report)
    }

    /// A cluster on etcd: writers on any host, the daemon on its own server.
    async fn restart_member(&self, id: u32) -> Result<NodeRestartReport> {
        let t0 = Instant::now();
        let meta = &self.meta;
        let err = ManagerError::from;
        if id == self.own_node() {
            // Its own node: another daemon must run the restart. Answered by `serve_conn`
            // before it gets here; this is for callers in the process.
            return Err(refused(format!("node {id} holds the manager role")));
        }
        let lease = meta.alive_lease(id).await.map_err(err)?.ok_or_else(|| {
            refused(format!(
                "node {id} is not running (no daemon is registered)"
            ))
        })?;
        // Each volume with an in-sync copy there, and its writer: in this process (a move's),
        // on another host (its attach record), or none (nothing is written, nothing to do).
        let local = self.local_writers();
        let mut mine = Vec::new();
        let mut remote = Vec::new();
        for v in meta.volumes().await.map_err(err)? {
            if !v
                .replicas
                .iter()
                .any(|r| r.node == id && r.state == ReplicaState::InSync)
            {
                continue;
            }
            if let Some(w) = local.iter().find(|w| w.info().name == v.name) {
                mine.push(w.clone());
            } else if let Some((a, _)) = meta.attachment(&v.name).await.map_err(err)? {
                remote.push((v.name.clone(), a.epoch, a.host));
            }
        }

        // Nobody else asks these writers anything meanwhile (`asks.rs`).
        let what = format!("the planned restart of node {id}");
        let mut claims = Vec::new();
        for (name, _, _) in &remote {
            match self.asks.try_claim(name, &what) {
                Ok(c) => claims.push(c),
                Err(holder) => {
                    return Err(refused(format!(
                        "volume {name}: its writer is busy with {holder}; run the restart once that ends (nothing was restarted)"
                    )))
                }
            }
        }

        // 1. Every writer takes its replica there out.
        let mut out = Vec::new();
        let mut asked = Vec::new();
        let taken: Result<()> = async {
            for w in &mine {
                if w.take_out_node(id, HOLD).await? {
                    out.push(w.clone());
                }
            }
            for (name, epoch, host) in &remote {
                let req = TakeOutRequest {
                    node: id,
                    epoch: *epoch,
                    state: TakeOutState::Asked,
                    error: None,
                    resynced_bytes: 0,
                    full: false,
                };
                // A request found there is a previous manager's, left when it died: restarts
                // run one at a time, under the manager role. It is replaced.
                let rev = meta.takeout(name).await.map_err(err)?.map_or(0, |(_, r)| r);
                if meta
                    .put_takeout(name, &req, rev)
                    .await
                    .map_err(err)?
                    .is_none()
                {
                    return Err(refused(format!(
                        "volume {name}: its take-out request changed while it was being made"
                    )));
                }
                asked.push((name.clone(), host.clone()));
            }
            for (name, host) in &asked {
                let r = self
                    .takeout_reaches(name, |s| s != TakeOutState::Asked, ANSWER_LIMIT)
                    .await
                    .map_err(|e| refused(format!("volume {name}: its writer on {host}: {e}")))?;
                if r.state == TakeOutState::Refused {
                    return Err(refused(format!(
                        "volume {name}: its writer on {host} refused: {}",
                        r.error.unwrap_or_default()
                    )));
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = taken {
            // Nothing restarted: every writer brings its replica back at once.
            release(&out, id);
            for (name, _) in &asked {
                let _ = meta.delete_takeout(name).await;
            }
            return Err(e);
        }
        let mut names: Vec<String> = out.iter().map(|w| w.info().name.clone()).collect();
        names.extend(asked.iter().map(|(n, _)| n.clone()));
        tracing::info!(node = id, volumes = ?names, "planned restart: replicas taken out, restarting the daemon");

        // 2. The daemon restarts: its lease goes, and a new one comes.
        let restarted = async {
            meta.put_restart_order(&RestartOrder { node: id, lease })
                .await
                .map_err(err)?;
            let deadline = Instant::now() + ANSWER_LIMIT;
            loop {
                match meta.alive_lease(id).await {
                    Ok(Some(l)) if l != lease => return Ok(()),
                    Ok(_) | Err(trireme_meta::MetaError::Unavailable(_)) => {}
                    Err(e) => return Err(e.into()),
                }
                if Instant::now() > deadline {
                    return Err(refused(format!(
                        "node {id}'s daemon did not restart within {ANSWER_LIMIT:?}"
                    )));
                }
                tokio::time::sleep(POLL).await;
            }
        }
        .await;
        let _ = meta.delete_restart_order(id).await;
        let down = t0.elapsed();

        // 3. Every writer brings its replica back (also when the restart failed: the node
        // may answer again, and the writers must not wait for the hold to end).
        release(&out, id);
        for (name, _) in &asked {
            let back = async {
                let (mut req, rev) = meta
                    .takeout(name)
                    .await
                    .map_err(err)?
                    .ok_or_else(|| refused("the request is gone"))?;
                req.state = TakeOutState::Return;
                meta.put_takeout(name, &req, rev)
                    .await
                    .map_err(err)?
                    .ok_or_else(|| refused("the request changed meanwhile"))?;
                Ok::<(), ManagerError>(())
            };
            if let Err(e) = back.await {
                tracing::warn!(volume = %name, "asking the writer to bring its replica back: {e}");
            }
        }
        if let Err(e) = restarted {
            for (name, _) in &asked {
                let _ = meta.delete_takeout(name).await;
            }
            return Err(e);
        }
        let mut report = NodeRestartReport {
            node: id,
            volumes: names,
            down_ms: down.as_millis() as u64,
            total_ms: 0,
            resynced_bytes: 0,
            full: false,
        };
        let resynced = async {
            wait_in_sync(&out, id, t0).await?;
            for (name, host) in &asked {
                let left = RESTART_LIMIT.saturating_sub(t0.elapsed());
                let r = self
                    .takeout_reaches(name, |s| s == TakeOutState::Back, left)
                    .await
                    .map_err(|e| refused(format!("volume {name}: its writer on {host}: {e}")))?;
                report.resynced_bytes += r.resynced_bytes;
                report.full |= r.full;
            }
            Ok::<(), ManagerError>(())
        };
        // A daemon that died after it registered again (its restart failed) brings nothing
        // back: the restart fails once it has been gone a while, not after an hour.
        let synced = tokio::select! {
            r = resynced => r,
            e = gone_for(meta, id, ANSWER_LIMIT) => Err(e),
        };
        for (name, _) in &asked {
            let _ = meta.delete_takeout(name).await;
        }
        synced?;
        report.total_ms = t0.elapsed().as_millis() as u64;
        add_resyncs(&mut report, &out);
        log_done(&report);
        Ok(report)
    }

    /// Waits until the take-out request of `name` is in a state `done` accepts.
    pub(crate) async fn takeout_reaches(
        &self,
        name: &str,
        done: impl Fn(TakeOutState) -> bool,
        limit: Duration,
    ) -> Result<TakeOutRequest> {
        let deadline = Instant::now() + limit;
        loop {
            match self.meta.takeout(name).await {
                Ok(Some((r, _))) if done(r.state) => return Ok(r),
                Ok(Some(_)) | Err(trireme_meta::MetaError::Unavailable(_)) => {}
                Ok(None) => return Err(refused("the request is gone")),
                Err(e) => return Err(e.into()),
            }
            if Instant::now() > deadline {
                return Err(refused(format!("no answer within {limit:?}")));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Returns, as the error to give, once node `id`'s daemon has held no registration for
/// `limit` without a break.
async fn gone_for(meta: &trireme_meta::ClusterMeta, id: u32, limit: Duration) -> ManagerError {
    let mut since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        match meta.alive_lease(id).await {
            Ok(None) => {
                let s = *since.get_or_insert_with(Instant::now);
                if s.elapsed() > limit {
                    return refused(format!(
                        "node {id}'s daemon restarted, then went away: it has been down for {limit:?}"
                    ));
                }
            }
            Ok(Some(_)) => since = None,
            Err(_) => {}
        }
    }
}

fn release(writers: &[Arc<Volume>], node: u32) {
    for w in writers {
        w.release_node(node);
    }
}

async fn wait_in_sync(writers: &[Arc<Volume>], node: u32, t0: Instant) -> Result<()> {
    while !writers.iter().all(|w| w.in_sync_on(node)) {
        if t0.elapsed() > RESTART_LIMIT {
            return Err(refused(format!(
                "node {node} restarted, but its replicas were not back in sync within {RESTART_LIMIT:?}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

fn add_resyncs(report: &mut NodeRestartReport, writers: &[Arc<Volume>]) {
    for r in writers.iter().filter_map(|w| w.last_resync(report.node)) {
        report.resynced_bytes += r.copied_bytes;
        report.full |= r.full;
    }
}

fn log_done(r: &NodeRestartReport) {
    tracing::info!(
        node = r.node,
        down_ms = r.down_ms,
        total_ms = r.total_ms,
        resynced_bytes = r.resynced_bytes,
        full = r.full,
        "planned restart done; replicas in sync"
    );
}
