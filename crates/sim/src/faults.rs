//! The fault schedule: kills, power losses, freezes, partitions, stalls, writer and manager
//! crashes, store outages, and drains asked of the manager, with the checks a drain must pass.

use super::*;

impl World {
    /// Every node's process dies at once, with its data (kill -9 of the whole cluster; the
    /// caller ends the writer's), each started again `ms` milliseconds later. Where a
    /// write's bits live before a flush (a parity replica's held map) is what this tests.
    fn crash_cluster(self: &Arc<Self>, ms: u64) {
        self.note("the whole cluster crashes (every node, data kept)".into());
        for n in &self.nodes {
            if self.take_down(n, false).is_none() {
                continue;
            }
            self.restart_after(n.id, Duration::from_millis(ms));
        }
    }

    /// `count` nodes' processes die at once while the writer runs, one more than a parity
    /// volume tolerates, up to `count - 1` of them losing power (the others keep their data). Requests that cannot do without them wait (a stripe needs K
    /// chunks; the writer keeps K copies in sync rather than take one out that could never be
    /// rebuilt), and go on once one is back, within the writer's wait. Only from a volume
    /// whole and calm, so the copies left are exactly the ones not taken.
    fn crash_past_tolerance(self: &Arc<Self>, v: &Volume, count: usize, ms: u64) {
        let now = Instant::now();
        let in_sync = self.healthy_in_sync(v);
        let calm = self.nodes.iter().all(|n| {
            let s = n.st();
            !s.down && s.calm_after.is_none_or(|t| t <= now)
        });
        if in_sync.len() < self.cfg.replicas || !calm || now < self.meta_calm_after() {
            return;
        }
        let mut picked = in_sync;
        while picked.len() > count {
            let k = rand(&self.rng).below(picked.len() as u64) as usize;
            picked.remove(k);
        }
        // Up to M of them lose power: every region keeps a mirror (of M+1) that kept its
        // history, so no acknowledged write may be lost.
        let powers = rand(&self.rng).below(count as u64) as usize;
        self.note(format!(
            "nodes {picked:?} crash at once ({powers} losing power), more than the layout tolerates"
        ));
        for (k, id) in picked.into_iter().enumerate() {
            let n = self.node(id).clone();
            let Some(disk) = self.take_down(&n, false) else {
                continue;
            };
            if k < powers {
                let rng = self.rng.clone();
                let lost =
                    disk.lose_power(&mut |n| rand(&rng).below(n), self.cfg.sabotage_power_loss);
                self.note(format!(
                    "node {id} loses power ({lost} sectors lose their last write)"
                ));
            }
            self.restart_after(id, Duration::from_millis(ms.min(3_000)));
        }
    }

    /// Node `id` restarts after `dur`.
    fn restart_after(self: &Arc<Self>, id: u32, dur: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(dur).await;
            me.restart(id);
        });
    }

    /// Node `n`'s process dies (`lose`: its disk with it, at the restart); its disk, or
    /// `None` if it was down already.
    fn take_down(&self, n: &SimNode, lose: bool) -> Option<Arc<SimDisk>> {
        let disk = {
            let mut s = n.st();
            if s.down {
                return None;
            }
            s.down = true;
            s.lose_on_restart = Some(lose);
            s.store.clone()
        };
        disk.died(self.cfg.sabotage_live_held);
        Some(disk)
    }

    /// The manager drains a node that holds a replica, as `trireme node drain` asks it to:
    /// it creates a copy on the node with room (the spare, or a node an earlier drain
    /// emptied), the writer adds and resyncs it while I/O goes on, then retires the old one,
    /// and the manager drops it from the record and deletes it. One drain at a time; a node
    /// an earlier drain emptied is put back in service first (`node undrain`), after a check
    /// that the drain left it nothing.
    pub(crate) async fn drain(&self, v: &Volume, pick: usize) {
        if Instant::now() < self.meta_calm_after() {
            return;
        }
        let Some(m) = self.current_manager() else {
            return;
        };
        let (Ok(jobs), Ok(rec), Ok(nodes)) = (
            self.meta.jobs::<MoveStatus>().await,
            self.meta.volume(VOLUME).await,
            self.meta.nodes().await,
        ) else {
            return;
        };
        if jobs.iter().any(|j| j.state == MoveState::Running) {
            return;
        }
        // A drain that failed (its writer was replaced, its target went down) is run again,
        // as its error tells an operator to: it resumes the copy it left.
        if let Some(id) = unfinished_drain(&jobs, &nodes, &rec) {
            self.start_drain(&m, id, true).await;
            return;
        }
        self.check_drains(&jobs, &nodes, &rec);
        for n in nodes
            .iter()
            .filter(|n| n.state == trireme_meta::NodeState::Draining)
        {
            match m.undrain(n.id).await {
                Ok(_) => self.note(format!("node {} takes replicas again", n.id)),
                Err(e) => {
                    self.note(format!("undrain of node {} refused: {e}", n.id));
                    return;
                }
            }
        }
        let id = rec.replicas[pick % rec.replicas.len()].node;
        if !self.healthy_in_sync(v).iter().any(|&n| n != id) {
            return;
        }
        self.start_drain(&m, id, false).await;
    }

    /// Asks manager `m` to drain node `id` (`again`: a drain that failed), and logs it.
    pub(crate) async fn start_drain(&self, m: &Arc<Manager>, id: u32, again: bool) {
        match m.start_move(id, false, None).await {
            Ok(_) => self.note(format!(
                "manager drains node {id}{}",
                if again { " again" } else { "" }
            )),
            Err(e) => self.note(format!("drain of node {id} refused: {e}")),
        }
    }

    /// Every drain reported done whose node is still out of service (not undrained since):
    /// the volume keeps its copies, none of them there.
    pub(crate) fn check_drains(
        &self,
        jobs: &[MoveStatus],
        nodes: &[NodeRecord],
        rec: &VolumeRecord,
    ) {
        for j in jobs.iter().filter(|j| j.state == MoveState::Done) {
            let out = nodes
                .iter()
                .any(|n| n.id == j.node && n.state == trireme_meta::NodeState::Draining);
            if out {
                self.check_drained(j.node, rec);
            }
        }
    }

    pub(crate) fn check_drained(&self, node: u32, rec: &VolumeRecord) {
        if rec.replicas.iter().any(|r| r.node == node) {
            self.violate(format!(
                "the drain of node {node} is done, but the volume keeps a replica there: {:?}",
                rec.replicas
            ));
        }
        if rec.replicas.len() != self.cfg.replicas {
            self.violate(format!(
                "after the drain of node {node} the volume has {} replicas, not {}",
                rec.replicas.len(),
                self.cfg.replicas
            ));
        }
    }

    /// Injects faults until `until`, never taking more copies than the layout tolerates
    /// ([`Config::tolerance`]): the last healthy in-sync copy of a mirror, the K-th of a
    /// parity volume's.
    pub(crate) async fn faults(
        self: Arc<Self>,
        vol: Arc<Mutex<Arc<Volume>>>,
        until: Instant,
    ) -> FaultsEnd {
        while Instant::now() < until {
            let pause = rand(&self.rng).below(740) + 180;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if Instant::now() >= until {
                break;
            }
            let v = vol.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let (kind, pick, dur) = {
                let mut r = rand(&self.rng);
                (
                    r.below(10),
                    r.below(self.nodes.len() as u64) as usize,
                    r.below(3_000) + 200,
                )
            };
            if kind == 5 || self.cfg.only_writer_crashes {
                // The writer's process dies with writes in flight; a new one attaches. Now
                // and then every node's process dies with it (kill -9 of the whole cluster).
                if !self.cfg.only_writer_crashes && rand(&self.rng).chance(0.3) {
                    self.crash_cluster(dur);
                }
                self.note("writer crashes".into());
                let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(p) = writer {
                    p.kill();
                }
                return FaultsEnd::WriterCrashed;
            }
            let dur = Duration::from_millis(dur);
            match kind {
                6 => {
                    // The metadata store is unreachable from every process, sometimes for
                    // longer than a lease TTL: take-outs wait, leases lapse, the attach
                    // record and the manager role are taken again.
                    self.note(format!("metadata store unreachable for {dur:?}"));
                    self.net.set_out(true);
                    let end = Instant::now() + dur;
                    {
                        let mut c = self
                            .meta_calm_after
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        *c = (*c).max(end + LEASE_TTL + TAKEOVER_SLACK);
                    }
                    // A node troubled now, or down, is taken out only once the store answers.
                    let now = Instant::now();
                    for n in &self.nodes {
                        let troubled = {
                            let s = n.st();
                            s.down || s.calm_after.is_some_and(|t| t > now)
                        };
                        if troubled {
                            n.troubled_until(self.meta_settled(now));
                        }
                    }
                    let net = self.net.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(end).await;
                        net.set_out(false);
                    });
                    continue;
                }
                7 => {
                    // Another host attaches without --force while the writer holds its
                    // record: refused, and the writer is untouched.
                    if Instant::now() < self.meta_calm_after() {
                        continue;
                    }
                    let p = Arc::new(Proc::default());
                    let cfg = AttachConfig {
                        volume: VOLUME.into(),
                        force: false,
                        lease_ttl: LEASE_TTL,
                        opts: VolumeOptions::default(),
                    };
                    let r = trireme_daemon::attach::attach(self.meta_for(&p), &cfg, vec![]).await;
                    p.kill();
                    match r {
                        Err(DaemonError::Meta(MetaError::Attached { .. })) => {
                            self.note("a second host's attach is refused".into());
                        }
                        Err(e) => self.violate(format!("a second attach failed oddly: {e}")),
                        Ok(_) => self.violate(
                            "a second writer attached while the first held its record".into(),
                        ),
                    }
                    continue;
                }
                8 => {
                    // The process holding the manager role dies (while another can take
                    // over); a new candidate starts later.
                    let holder = {
                        let m = self.managers();
                        let live = m.candidates.iter().filter(|c| !c.proc_.dead()).count();
                        m.candidates
                            .iter()
                            .find(|c| !c.proc_.dead() && c.current.borrow().is_some())
                            .filter(|_| live > 1)
                            .map(|c| (c.id, c.proc_.clone()))
                    };
                    let Some((cid, p)) = holder else { continue };
                    self.note(format!("manager (candidate {cid}) crashes"));
                    p.kill();
                    self.role_changed();
                    let me = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(dur).await;
                        me.spawn_candidate();
                    });
                    continue;
                }
                9 => {
                    match self.cfg.parity {
                        Some(p) if rand(&self.rng).chance(0.5) => {
                            let ms = dur.as_millis() as u64;
                            self.crash_past_tolerance(&v, usize::from(p.parity) + 1, ms)
                        }
                        _ => self.drain(&v, pick).await,
                    }
                    continue;
                }
                _ => {}
            }
            let id = self.nodes[pick].id;
            let others = self
                .healthy_in_sync(&v)
                .into_iter()
                .filter(|&n| n != id)
                .count();
            // Those left must be enough: one copy of a mirror, K of a parity volume's.
            if others < self.cfg.replicas - self.cfg.tolerance() {
                continue;
            }
            let n = self.node(id).clone();
            match kind {
                0 | 1 => {
                    let lose = kind == 1;
                    let power = !lose && rand(&self.rng).chance(0.5);
                    let Some(disk) = self.take_down(&n, lose) else {
                        continue;
                    };
                    if power {
                        // Nothing is applied after `down`, so the cache is final now.
                        let rng = self.rng.clone();
                        let lost = disk
                            .lose_power(&mut |n| rand(&rng).below(n), self.cfg.sabotage_power_loss);
                        self.note(format!(
                            "node {id} loses power ({lost} sectors lose their last write)"
                        ));
                    } else {
                        self.note(format!(
                            "node {id} crashes ({})",
                            if lose { "data lost" } else { "data kept" }
                        ));
                    }
                    self.restart_after(id, dur);
                    // Long enough down for the manager's heartbeats to have missed it.
                    let look = DOWN_AFTER + HEARTBEAT_EVERY * 2;
                    if dur > look + Duration::from_millis(300) {
                        let (me, at, generation) =
                            (self.clone(), Instant::now(), n.st().generation);
                        tokio::spawn(async move {
                            tokio::time::sleep(look).await;
                            me.check_seen_down(id, at, generation).await;
                        });
                    }
                }
                2 => {
                    self.note(format!("node {id} freezes for {dur:?}"));
                    n.st().frozen_until = Some(Instant::now() + dur);
                    n.troubled_until(self.meta_settled(Instant::now() + dur));
                }
                3 => {
                    self.note(format!("node {id} partitioned for {dur:?}"));
                    n.st().partitioned = true;
                    n.troubled_until(self.meta_settled(Instant::now() + dur));
                    tokio::spawn(async move {
                        tokio::time::sleep(dur).await;
                        n.st().partitioned = false;
                    });
                }
                _ => {
                    // A short blip: freeze for less than the replica timeout.
                    let d = Duration::from_millis(dur.as_millis() as u64 % 900);
                    self.note(format!("node {id} stalls for {d:?}"));
                    n.st().frozen_until = Some(Instant::now() + d);
                    n.troubled_until(self.meta_settled(Instant::now() + d));
                }
            }
            let violation = self.model().violation.clone();
            if let Some(v) = violation {
                return FaultsEnd::Violated(v);
            }
        }
        FaultsEnd::Done
    }
}
