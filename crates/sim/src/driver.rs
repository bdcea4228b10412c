//! One run: the cluster set up, the writer and the workload started, the fault schedule
//! played, then the checks at the end (`run` in the crate root drives it in virtual time).

use super::*;

pub(crate) async fn run_async(
    cfg: Config,
    log: Arc<Mutex<Vec<String>>>,
) -> Result<Outcome, SimFailure> {
    let meta = ClusterMeta::new(Arc::new(EmbeddedMeta::in_memory()));
    let size = cfg.blocks * BLOCK;
    // One node more than the volume has replicas: a spare a drain can move a replica to.
    let ids: Vec<u32> = (1..=cfg.replicas as u32 + 1).collect();
    for &id in &ids {
        meta.put_node(&NodeRecord {
            id,
            addr: format!("sim:{id}"),
            local_addr: None,
            store: "memory".into(),
            state: Default::default(),
            zone: None,
            http: None,
            iops_capacity: None,
        })
        .await?;
    }
    let rec = meta
        .create_volume_from(
            VOLUME,
            size,
            &ids[..cfg.replicas],
            &trireme_meta::any_client(),
            false,
            None,
            cfg.layout(),
        )
        .await?;
    // Versions persist in real files, on tmpfs where there is one (no disk I/O per seed).
    let versions = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::Builder::new()
            .prefix("trireme-sim")
            .tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .map_err(SimFailure::Runtime)?;
    let nodes: Vec<Arc<SimNode>> = ids
        .iter()
        .map(|&id| {
            let store = Arc::new(SimDisk::default());
            let dir = versions.path().join(id.to_string());
            std::fs::create_dir_all(&dir).expect("versions directory");
            let node = Node::with_dirty_grain(id, sealed(&store, &dir), BLOCK);
            if rec.replicas.iter().any(|r| r.node == id) {
                create_replica(&cfg, &node, rec.id, size).expect("create replica");
            }
            node.keep_books();
            Arc::new(SimNode {
                id,
                state: Mutex::new(NodeState {
                    node: Arc::new(node),
                    store,
                    generation: 0,
                    down: false,
                    lose_on_restart: None,
                    frozen_until: None,
                    partitioned: false,
                    calm_after: None,
                }),
                versions: dir,
            })
        })
        .collect();
    let rng: SharedRng = Arc::new(Mutex::new(Rng(cfg
        .seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        | 1)));
    let w = Arc::new(World {
        tokens: Arc::new(AtomicU64::new(1)),
        meta: meta.clone(),
        net: Arc::new(MetaNet::new()),
        meta_calm_after: Mutex::new(Instant::now()),
        managers: Mutex::default(),
        writer: Mutex::default(),
        cfg: cfg.clone(),
        rng,
        nodes,
        model: Arc::default(),
        io_gate: Default::default(),
        log,
        volume_id: rec.id,
        size,
        start: Instant::now(),
    });
    let fail = |w: &World, what: String| -> SimFailure {
        SimFailure::Guarantee {
            seed: cfg.seed,
            what,
            events: w.log.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    };
    let end = Instant::now() + Duration::from_secs(cfg.secs);
    let mut outcome = Outcome::default();
    // Two processes campaign for the manager role.
    w.spawn_candidate();
    w.spawn_candidate();
    tokio::spawn(w.clone().watch_managers());
    // Each node's bookkeeping catches up on its disk every period, as `trireme_node::run` does.
    for n in &w.nodes {
        let n = n.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(trireme_node::BOOKS_PERIOD).await;
                if let Some(node) = n.up() {
                    node.sync_books();
                }
            }
        });
    }
    let vol = Arc::new(Mutex::new(w.attach(None).await.map_err(|e| fail(&w, e))?));
    loop {
        let v = vol.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut tasks: Vec<_> = (0..cfg.tasks)
            .map(|_| tokio::spawn(w.clone().io_task(v.clone(), end)))
            .collect();
        if cfg.snapshots {
            tasks.push(tokio::spawn(w.clone().snapshot_task(v.clone(), end)));
        }
        let faults = if cfg.faults {
            w.clone().faults(vol.clone(), end).await
        } else {
            tokio::time::sleep_until(end).await;
            FaultsEnd::Done
        };
        match faults {
            FaultsEnd::WriterCrashed => {
                outcome.faults.push("writer-crash".into());
                for t in &tasks {
                    t.abort();
                }
                for t in tasks {
                    let _ = t.await;
                }
                drop(v);
                let new = w
                    .attach(Some(Instant::now()))
                    .await
                    .map_err(|e| fail(&w, e))?;
                *vol.lock().unwrap_or_else(|e| e.into_inner()) = new;
                if Instant::now() >= end {
                    break;
                }
            }
            FaultsEnd::Violated(e) => return Err(fail(&w, e)),
            FaultsEnd::Done => {
                for t in tasks {
                    let _ = t.await;
                }
                break;
            }
        }
    }
    let violation = w.model().violation.clone();
    if let Some(v) = violation {
        return Err(fail(&w, v));
    }
    // Heal everything and let the writer converge.
    w.net.set_out(false);
    for n in &w.nodes {
        {
            let mut s = n.st();
            s.frozen_until = None;
            s.partitioned = false;
        }
        w.restart(n.id);
    }
    // Clones left on nodes that were down at their delete go: each keeps its parent's copy
    // on its node, which a drain off that node must delete.
    w.delete_clones().await;
    let vol = vol.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // A drain under way ends (its manager may have died: its successor resumes it), and one
    // that failed is run again until it is done.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let jobs: Vec<MoveStatus> = w.meta.jobs().await?;
        let (rec, nodes) = (w.meta.volume(VOLUME).await?, w.meta.nodes().await?);
        let running: Vec<u32> = jobs
            .iter()
            .filter(|j| j.state == MoveState::Running)
            .map(|j| j.node)
            .collect();
        let failed = unfinished_drain(&jobs, &nodes, &rec);
        if running.is_empty() && failed.is_none() {
            w.check_drains(&jobs, &nodes, &rec);
            break;
        }
        if Instant::now() > deadline {
            return Err(fail(
                &w,
                format!("drains never end: running {running:?}, failed {failed:?}"),
            ));
        }
        if let (true, Some(id), Some(m)) = (running.is_empty(), failed, w.current_manager()) {
            w.start_drain(&m, id, true).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The writer notices a node that crashed while it was idle at its next check.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while vol
        .replica_views()
        .iter()
        .any(|r| r.state != ReplicaState::InSync)
    {
        if Instant::now() > deadline {
            return Err(fail(
                &w,
                format!("replicas not back in sync: {:?}", vol.replica_views()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and, idle and in sync, a parity volume's encoder brings it within its share: one
    // that stopped encoding (a drained copy's old slot once stopped it for good) would leave
    // the volume's mirrored part growing with nothing said.
    let deadline = Instant::now() + Duration::from_secs(60);
    while vol.over_share() {
        if Instant::now() > deadline {
            w.violate(format!(
                "idle and in sync, the encoder left the volume over its mirrored share: {} overlay blocks, encoding {:?}",
                vol.overlay_blocks().unwrap_or(0),
                vol.encoding()
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outcome.resyncs = w
        .nodes
        .iter()
        .filter_map(|n| vol.last_resync(n.id))
        .collect();
    // Every block at or past its last acknowledged write, through the client...
    for b in 0..cfg.blocks {
        let floor = w.model().acked.get(&b).copied().unwrap_or(0);
        match vol.read(b * BLOCK, BLOCK).await {
            Ok(d) => w.check(b, floor, &d),
            Err(e) => w.violate(format!("final read of block {b}: {e}")),
        }
    }
    let rec = w.meta.volume(VOLUME).await?;
    outcome.parity_regions = w
        .meta
        .regions(rec.id)
        .await?
        .iter()
        .filter(|r| matches!(r, trireme_replication::Region::Parity { .. }))
        .count() as u64;
    outcome.overlay_blocks = vol.overlay_blocks().unwrap_or(0);
    if cfg.parity.is_some() {
        // A parity volume's copies differ by node: its scrub compares the mirrored blocks
        // of each region on its mirrors and each stripe's parity against its data.
        w.check_scrub(&vol).await;
    } else {
        w.check_copies_equal(&rec).await.map_err(|e| fail(&w, e))?;
    }
    if rec.replicas.iter().any(|r| r.state != ReplicaState::InSync) {
        w.violate(format!("metadata not all in sync: {:?}", rec.replicas));
    }
    // The writer holds its attach record (put back after any lapse), at its epoch...
    match w.meta.attachment(VOLUME).await {
        Ok(Some((a, _))) if a.epoch == vol.info().epoch && rec.epoch == a.epoch => {}
        other => w.violate(format!(
            "the writer (epoch {}, layout epoch {}) does not hold its attach record: {other:?}",
            vol.info().epoch,
            rec.epoch
        )),
    }
    // ...and exactly one live process holds the manager role, the one the store names.
    let deadline = Instant::now() + LEASE_TTL + TAKEOVER_SLACK;
    loop {
        let holders = w.holders();
        let key = w.meta.manager().await?;
        match (&holders[..], key) {
            ([one], Some((r, _))) if r.node == *one => break,
            (h, k) if Instant::now() > deadline => {
                w.violate(format!(
                    "manager role: live holders {h:?}, the store names {:?}",
                    k.map(|(r, _)| r.node)
                ));
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // ...whose heartbeats see every node again, over the simulated network.
    let deadline = Instant::now() + DOWN_AFTER + TAKEOVER_SLACK;
    loop {
        let problem = match w.current_manager() {
            None => Some("no manager".to_string()),
            Some(m) => match m.status().await {
                Err(e) => Some(format!("status: {e}")),
                Ok(st) => {
                    let unseen: Vec<_> = st
                        .nodes
                        .iter()
                        .filter(|n| {
                            !n.up
                                || n.last_seen_ms
                                    .is_none_or(|ms| ms > DOWN_AFTER.as_millis() as u64)
                        })
                        .map(|n| (n.id, n.up, n.last_seen_ms))
                        .collect();
                    (!unseen.is_empty())
                        .then(|| format!("(node, up, last seen ms ago): {unseen:?}"))
                }
            },
        };
        let Some(problem) = problem else { break };
        if Instant::now() > deadline {
            w.violate(format!(
                "after the faults healed, the manager does not see every node: {problem}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let violation = w.model().violation.clone();
    if let Some(v) = violation {
        return Err(fail(&w, v));
    }
    let m = w.model();
    outcome.writes = m.writes;
    outcome.reads = m.reads;
    outcome.reconciles = m.reconciles.clone();
    outcome.attach_waits = m.attach_waits.clone();
    outcome.takeovers = m.takeovers.clone();
    outcome.faults.extend(
        w.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned(),
    );
    Ok(outcome)
}

impl World {
    /// Every mirror's replica, read through its node's store stack (its versions map blocks
    /// that moved), is the same byte for byte; the snapshots on them hold what they must.
    async fn check_copies_equal(&self, rec: &VolumeRecord) -> Result<(), String> {
        let mut copies = Vec::new();
        let mut replicas = Vec::new();
        for n in self
            .nodes
            .iter()
            .filter(|n| rec.replicas.iter().any(|r| r.node == n.id))
        {
            let node = n.st().node.clone();
            let r = node
                .served(self.volume_id)
                .ok_or_else(|| format!("node {} lost its replica", n.id))?;
            let mut buf = vec![0u8; self.size as usize];
            r.read(0, &mut buf)
                .map_err(|e| format!("node {}: {e}", n.id))?;
            copies.push((n.id, buf));
            replicas.push((n.id, r));
        }
        self.check_snapshots(&replicas);
        for (id, c) in &copies[1..] {
            if *c != copies[0].1 {
                let b = (0..self.cfg.blocks)
                    .find(|&b| {
                        let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                        c[r.clone()] != copies[0].1[r]
                    })
                    .unwrap_or(0);
                self.violate(format!(
                    "replica on node {id} differs from node {} at block {b}",
                    copies[0].0
                ));
            }
        }
        Ok(())
    }

    /// A parity volume's scrub, with every copy in sync, finds nothing to repair: each
    /// region's mirrors hold the same blocks with the same bytes, and each stripe's parity
    /// matches its data.
    async fn check_scrub(&self, vol: &Volume) {
        match vol.scrub(0).await {
            Err(e) => self.violate(format!("the final scrub failed: {e}")),
            Ok(r) if r.mismatched_regions > 0 || !r.unresolved.is_empty() => {
                self.violate(format!(
                    "the final scrub found copies that disagree after every copy was back in sync: {r:?}"
                ))
            }
            Ok(r) => self.note(format!(
                "final scrub: {} bytes compared on nodes {:?}, all agree",
                r.bytes_compared, r.replicas
            )),
        }
    }
}
