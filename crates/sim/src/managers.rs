//! Who holds the roles: the writer attaching (again) through the metadata, manager
//! candidates campaigning, and the watch that checks a role never has two holders.

use super::*;

impl World {
    /// A new writer process attaches the way `trireme attach` does (`trireme_daemon::attach`:
    /// the lease-bound attach record, the epoch taken in one transaction, replica states
    /// recorded by the writer itself). After a writer crash (`dead_since`), it is refused while
    /// the dead writer's record lives and retries until the record lapses with its lease; or,
    /// by the seed's choice, fences it with `--force`.
    pub(crate) async fn attach(&self, dead_since: Option<Instant>) -> Result<Arc<Volume>, String> {
        let p = Arc::new(Proc::default());
        // Small activity-log extents and a small cap, so the log is cleared all the time and a
        // clear racing a write would show as replicas that differ after a writer crash.
        let (cap, period, force) = {
            let mut r = rand(&self.rng);
            (r.below(3) as usize, 50 + r.below(500), r.chance(0.3))
        };
        let cfg = AttachConfig {
            volume: VOLUME.into(),
            force,
            lease_ttl: LEASE_TTL,
            opts: VolumeOptions {
                connector: Some(Arc::new(SimConnector {
                    nodes: self.nodes.clone(),
                    rng: self.rng.clone(),
                    tokens: self.tokens.clone(),
                    proc_: p.clone(),
                })),
                activity_extent: 64 << 10,
                activity_extents: cap,
                activity_period: Duration::from_millis(period),
                resync_rate: self.cfg.resync_rate,
                // The seeds' volumes are counted by nobody: no metrics to update.
                metrics: false,
                encode_headroom: self.cfg.encode_headroom,
                ..VolumeOptions::default()
            },
        };
        let meta = self.meta_for(&p);
        let began = Instant::now();
        let attached = loop {
            match trireme_daemon::attach::attach(meta.clone(), &cfg, vec![]).await {
                Ok(a) => break a,
                Err(e @ DaemonError::Meta(MetaError::Attached { .. })) => {
                    let since = dead_since.unwrap_or(self.start);
                    let limit = (since + LEASE_TTL + TAKEOVER_SLACK).max(self.meta_calm_after());
                    if Instant::now() > limit {
                        return Err(format!(
                            "the dead writer's attach record outlived its lease: {e}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                // Every in-sync copy is down or cut off right now (crashes and power losses
                // under a copy that is still resyncing): the attach changed nothing, and a
                // writer's host tries again, as `up`'s export and an operator do.
                Err(e @ DaemonError::NoCopy(_)) => {
                    if began.elapsed() > NO_COPY_LIMIT {
                        return Err(format!("no in-sync copy came back: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(format!("attach: {e}")),
            }
        };
        let v = attached.volume.clone();
        if let Some(t) = dead_since {
            self.model().attach_waits.push(Instant::now() - t);
        }
        *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        self.note(format!(
            "writer attaches{}, epoch {}",
            if force { " with --force" } else { "" },
            v.info().epoch
        ));
        if let Some(r) = v.last_reconcile() {
            self.note(format!(
                "reconciled {} bytes ({}), copied {}",
                r.compared_bytes,
                if r.whole {
                    "whole volume"
                } else {
                    "activity log"
                },
                r.copied_bytes
            ));
            self.model().reconciles.push(r);
        }
        Ok(v)
    }

    /// A process that campaigns for the manager role, as every node daemon does
    /// (`trireme_daemon::manager_role::campaign` over a lease it keeps and takes again when
    /// lost). Its heartbeats, node pings and status cross the simulated network from its own
    /// process (a dead candidate's links die with it); re-creations of replicas stay off.
    pub(crate) fn spawn_candidate(self: &Arc<Self>) {
        let p = Arc::new(Proc::default());
        let meta = self.meta_for(&p);
        let id = {
            let mut m = self.managers();
            m.next_id += 1;
            100 + m.next_id
        };
        let (lease_tx, lease_rx) = tokio::sync::watch::channel(None);
        let (current_tx, current) = tokio::sync::watch::channel(None);
        let store = meta.store().clone();
        tokio::spawn(async move {
            loop {
                let Ok(l) = trireme_daemon::lease::grant(&*store, LEASE_TTL).await else {
                    return;
                };
                if lease_tx.send(Some(l)).is_err() {
                    return;
                }
                trireme_daemon::lease::keep(&*store, l, LEASE_TTL).await;
                let _ = lease_tx.send(None);
                let _ = store.revoke(l).await;
            }
        });
        let opts = ManagerOptions {
            heartbeat_every: HEARTBEAT_EVERY,
            down_after: DOWN_AFTER,
            down_out: None,
            rate: None,
            // The event recorder and the scrub schedule are observers: they change no
            // replica and no writer, and their status calls would only slow the runs.
            events: false,
            scrub: Default::default(),
            connector: Some(Arc::new(SimConnector {
                nodes: self.nodes.clone(),
                rng: self.rng.clone(),
                tokens: self.tokens.clone(),
                proc_: p.clone(),
            })),
            node_leases: false,
        };
        let rec = ManagerRecord {
            node: id,
            control: format!("sim:{id}"),
            host: "sim".into(),
            pid: id,
            http: None,
        };
        tokio::spawn(trireme_daemon::manager_role::campaign(
            meta, lease_rx, rec, opts, current_tx,
        ));
        let mut changes = current.clone();
        let me = self.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                me.role_changed();
            }
        });
        self.managers().candidates.push(Candidate {
            id,
            proc_: p,
            current,
        });
    }

    /// The manager of the live process holding the role, if one does.
    pub(crate) fn current_manager(&self) -> Option<Arc<Manager>> {
        self.managers()
            .candidates
            .iter()
            .filter(|c| !c.proc_.dead())
            .find_map(|c| c.current.borrow().clone())
    }

    /// A node crashed at `at` and is still down (generation `generation`): the manager's
    /// status must show it down, and its heartbeats must not have seen it since the crash.
    /// Skipped while no manager holds the role or the metadata store cannot be read.
    pub(crate) async fn check_seen_down(&self, id: u32, at: Instant, generation: u64) {
        let still_down = || {
            let s = self.node(id).st();
            s.down && s.generation == generation
        };
        let Some(m) = self.current_manager().filter(|_| still_down()) else {
            return;
        };
        // Taken before the status, which takes a while (it pings every node in turn): its row
        // for this node is computed later, so a heartbeat from before the crash shows as at
        // least this long ago.
        let since = Instant::now() - at;
        let Ok(st) = m.status().await else { return };
        // The node may be back meanwhile.
        if !still_down() {
            return;
        }
        let Some(n) = st.nodes.iter().find(|n| n.id == id) else {
            self.violate(format!("manager status has no node {id}"));
            return;
        };
        if n.up
            || n.last_seen_ms
                .is_some_and(|ms| ms + 100 < since.as_millis() as u64)
        {
            self.violate(format!(
                "node {id}, down for {since:?}: the manager shows up={} last seen {:?} ms ago",
                n.up, n.last_seen_ms
            ));
        }
    }

    /// The live candidates that believe they hold the role.
    pub(crate) fn holders(&self) -> Vec<u32> {
        self.managers()
            .candidates
            .iter()
            .filter(|c| !c.proc_.dead() && c.current.borrow().is_some())
            .map(|c| c.id)
            .collect()
    }

    /// Called whenever a candidate gains or loses the role, or dies: keeps when the role
    /// fell vacant (and how long each takeover took) and since when two hold it.
    pub(crate) fn role_changed(&self) {
        let now = Instant::now();
        let holders = self.holders();
        let mut m = self.managers();
        if holders.is_empty() {
            if m.seen {
                m.vacant_since.get_or_insert(now);
            }
        } else {
            m.seen = true;
            if let Some(since) = m.vacant_since.take() {
                drop(m);
                self.model().takeovers.push(now - since);
                self.note(format!(
                    "candidate {} takes the manager role after {:?}",
                    holders[0],
                    now - since
                ));
                m = self.managers();
            }
        }
        if holders.len() > 1 {
            m.doubled_since.get_or_insert(now);
        } else {
            m.doubled_since = None;
        }
    }

    /// Checks the manager role: a vacancy is filled within a lease TTL (plus the time the
    /// store was unreachable), and no two live processes believe they hold the role for
    /// longer than it takes a deposed one to notice.
    pub(crate) async fn watch_managers(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = Instant::now();
            let calm = self.meta_calm_after();
            let (vacant, doubled) = {
                let m = self.managers();
                (m.vacant_since, m.doubled_since)
            };
            if let Some(since) = vacant {
                if now > (since + LEASE_TTL + TAKEOVER_SLACK).max(calm) {
                    self.violate(format!("no manager for {:?}", now - since));
                    return;
                }
            }
            if let Some(since) = doubled {
                if now - since > LEASE_TTL {
                    self.violate(format!(
                        "candidates {:?} all hold the manager role for {:?}",
                        self.holders(),
                        now - since
                    ));
                    return;
                }
            }
        }
    }
}
