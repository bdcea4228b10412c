//! Snapshots in the simulator: the writer takes one now and then, among the faults (a copy may
//! be out, frozen or crashing at the moment; later its resync or a drain's new copy is given
//! it, `trireme_client`'s `catch_up.rs`); now and then one is deleted on the nodes up, the
//! volume is rolled back to one, or the volume is resized online, between its first size and
//! twice that (the workload stays in the first, so the grown part reads zeros; snapshots then
//! have sizes of their own, which catch-ups and rollbacks must respect). Each one the writer said it took is remembered with
//! what it must hold ([`SnapshotOracle`]); at the end every copy that holds it is read and
//! checked against that, and the copies holding it must be byte-identical.

use super::*;

impl World {
    /// Every 0.3-1.5 virtual seconds until `until`: takes a snapshot, or now and then deletes
    /// one (on every node that answers, as the manager does) or rolls the volume back to one.
    pub(crate) async fn snapshot_task(self: Arc<Self>, vol: Arc<Volume>, until: Instant) {
        loop {
            let (pause, action, pick) = {
                let mut r = rand(&self.rng);
                (r.below(1_200) + 300, r.below(10), r.below(1 << 16))
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if Instant::now() >= until {
                break;
            }
            let known = self.model().snapshots.len() as u64;
            match action {
                0..=2 if known > 0 && !self.cfg.sabotage_barrier => {
                    let o = self.model().snapshots[(pick % known) as usize].clone();
                    match action {
                        0 => self.delete_snapshot(o.id).await,
                        1 => self.rollback(&vol, &o).await,
                        _ => self.clone_and_check(&o).await,
                    }
                }
                3 => self.resize(&vol, pick).await,
                _ => self.take_snapshot(&vol).await,
            }
        }
    }

    /// Resizes the volume online to between its first size and twice that, as the manager
    /// has its writer do: I/O goes on (it stays below the first size).
    async fn resize(&self, vol: &Volume, pick: u64) {
        let size = self.size + (pick % (self.cfg.blocks + 1)) * BLOCK;
        match vol.resize(size).await {
            Ok(()) => self.note(format!("volume resized to {size} bytes")),
            Err(e) => self.note(format!("resize to {size} bytes failed: {e}")),
        }
    }

    async fn take_snapshot(&self, vol: &Volume) {
        let (id, floor) = {
            let mut m = self.model();
            m.next_snapshot += 1;
            (m.next_snapshot, m.acked.clone())
        };
        let taken = if self.cfg.sabotage_barrier {
            self.snapshot_without_barrier(vol, id).await
        } else {
            vol.snapshot_sized(id, 0).await.map_err(|e| e.to_string())
        };
        match taken {
            Ok((nodes, size)) => {
                let mut m = self.model();
                let ceiling = m.next_seq;
                m.snapshots.push(SnapshotOracle {
                    id,
                    floor,
                    ceiling,
                    nodes: nodes.clone(),
                    size,
                });
                drop(m);
                self.note(format!("snapshot {id} taken on nodes {nodes:?}"));
            }
            Err(e) => self.note(format!("snapshot {id} failed: {e}")),
        }
    }

    /// Deletes snapshot `id` on every node up now, as the manager does; a node down keeps it
    /// (the manager's record would stay `deleting`). It is checked no more.
    async fn delete_snapshot(&self, id: u64) {
        self.model().snapshots.retain(|o| o.id != id);
        let mut h = Header {
            volume: self.volume_id,
            ..Header::request(trireme_proto::Op::SnapshotDelete, 0)
        };
        trireme_proto::SnapshotRequest { id, created: 0 }.put(&mut h);
        let on = self.on_every_node_up(&h).await;
        self.note(format!("snapshot {id} deleted on nodes {on:?}"));
    }

    /// Rolls the volume back to snapshot `o` with the workload held. Each block's floor is
    /// first the lower of its own and the snapshot's: a rollback cut short (the writer dies
    /// with it under way, or a copy it failed on cannot be taken out) may leave either, and
    /// the reconcile or resync after makes the copies agree on one. Done, it is the snapshot's
    /// (simulator seed 2793: a rollback under way when the writer crashed).
    async fn rollback(&self, vol: &Volume, o: &SnapshotOracle) {
        if o.size != vol.size() {
            // The manager refuses it before any writer hears of it.
            return;
        }
        let _all = self.io_gate.write().await;
        {
            let mut m = self.model();
            let blocks: Vec<u64> = m.acked.keys().copied().collect();
            for b in blocks {
                let lower = m.acked[&b].min(o.floor.get(&b).copied().unwrap_or(0));
                m.acked.insert(b, lower);
            }
        }
        match vol.rollback(o.id).await {
            Ok(()) => {
                self.model().acked = o.floor.clone();
                self.note(format!("rolled back to snapshot {}", o.id));
            }
            Err(e) => self.note(format!("rollback to snapshot {} refused: {e}", o.id)),
        }
    }

    /// The checker's own test: each copy in sync takes the snapshot straight in its store, one
    /// after another, while writes go on.
    async fn snapshot_without_barrier(
        &self,
        vol: &Volume,
        id: u64,
    ) -> Result<(Vec<u32>, u64), String> {
        let mut took = Vec::new();
        for r in vol.replica_views() {
            if r.state != ReplicaState::InSync {
                continue;
            }
            let node = self.node(r.node).st().node.clone();
            let replica = node
                .served(self.volume_id)
                .ok_or_else(|| format!("node {} serves no replica", r.node))?;
            replica.snapshot(id, 0).map_err(|e| e.to_string())?;
            took.push(r.node);
            // Writes land between the copies' snapshots.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        Ok((took, vol.size()))
    }

    /// Each block of `buf` (the bytes of `what`, which must read as snapshot `o`) holds a
    /// write acknowledged no earlier than the last one before `o` was asked for, and issued
    /// no later than its answer.
    pub(crate) fn check_holds(&self, what: &str, buf: &[u8], o: &SnapshotOracle) {
        for b in 0..self.cfg.blocks {
            let at = (b * BLOCK) as usize;
            let data = &buf[at..at + BLOCK as usize];
            let floor = o.floor.get(&b).copied().unwrap_or(0);
            match parse(b, data) {
                Err(e) => self.violate(format!("{what}: {e}")),
                Ok(seq) if seq < floor => self.violate(format!(
                    "{what}: block {b} holds seq {seq}, but seq {floor} was acknowledged before snapshot {} was asked for",
                    o.id
                )),
                Ok(seq) if seq > o.ceiling => self.violate(format!(
                    "{what}: block {b} holds seq {seq}, issued after snapshot {} was taken (last before: {})",
                    o.id, o.ceiling
                )),
                Ok(_) => {}
            }
        }
    }

    /// Every snapshot the writer took is on some copy of the final layout, reads back within
    /// its bounds on each copy holding it, and is byte-identical on all of them. `copies`: the
    /// final layout's replicas by node.
    pub(crate) fn check_snapshots(&self, copies: &[(u32, Arc<dyn trireme_store::Replica>)]) {
        let oracles = self.model().snapshots.clone();
        for o in &oracles {
            let mut first: Option<(u32, Vec<u8>)> = None;
            for (node, r) in copies {
                let listed = match r.snapshots() {
                    Ok(l) => l.into_iter().find(|s| s.id == o.id),
                    Err(e) => {
                        self.violate(format!("node {node}: listing snapshots: {e}"));
                        return;
                    }
                };
                let Some(listed) = listed else {
                    continue;
                };
                if listed.size != o.size {
                    self.violate(format!(
                        "snapshot {} on node {node} is {} bytes, taken at {}",
                        o.id, listed.size, o.size
                    ));
                }
                let mut buf = vec![0u8; self.size as usize];
                if let Err(e) = r.read_snapshot(o.id, 0, &mut buf) {
                    self.violate(format!("node {node}: reading snapshot {}: {e}", o.id));
                    return;
                }
                self.check_holds(&format!("snapshot {} on node {node}", o.id), &buf, o);
                match &first {
                    None => first = Some((*node, buf)),
                    Some((n0, b0)) if *b0 != buf => {
                        let b = (0..self.cfg.blocks)
                            .find(|&b| {
                                let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                                b0[r.clone()] != buf[r]
                            })
                            .unwrap_or(0);
                        let at = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                        let seq = |d: &[u8]| parse(b, d).map_or_else(|e| e, |s| s.to_string());
                        self.violate(format!(
                            "snapshot {} differs between nodes {n0} and {node} at block {b} (seq {} and {}; acknowledged before it was asked: {}, last issued before it was taken: {})",
                            o.id,
                            seq(&b0[at.clone()]),
                            seq(&buf[at]),
                            o.floor.get(&b).copied().unwrap_or(0),
                            o.ceiling
                        ));
                    }
                    Some(_) => {}
                }
            }
            if first.is_none() {
                self.violate(format!(
                    "snapshot {} is on no copy of the final layout",
                    o.id
                ));
            }
        }
    }
}
