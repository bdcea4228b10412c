//! Snapshots in the simulator: the writer takes one now and then, among the faults (a copy may
//! be out, frozen or crashing at the moment; later its resync or a drain's new copy is given
//! it, `trireme_client`'s `catch_up.rs`). Each one the writer said it took is remembered with
//! what it must hold ([`SnapshotOracle`]); at the end every copy that holds it is read and
//! checked against that, and the copies holding it must be byte-identical.

use super::*;

impl World {
    /// Takes a snapshot every 0.3-1.5 virtual seconds until `until`.
    pub(crate) async fn snapshot_task(self: Arc<Self>, vol: Arc<Volume>, until: Instant) {
        loop {
            let pause = rand(&self.rng).below(1_200) + 300;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if Instant::now() >= until {
                break;
            }
            let (id, floor) = {
                let mut m = self.model();
                m.next_snapshot += 1;
                (m.next_snapshot, m.acked.clone())
            };
            let taken = if self.cfg.sabotage_barrier {
                self.snapshot_without_barrier(&vol, id).await
            } else {
                vol.snapshot(id, 0).await.map_err(|e| e.to_string())
            };
            match taken {
                Ok(nodes) => {
                    let mut m = self.model();
                    let ceiling = m.next_seq;
                    m.snapshots.push(SnapshotOracle { id, floor, ceiling });
                    drop(m);
                    self.note(format!("snapshot {id} taken on nodes {nodes:?}"));
                }
                Err(e) => self.note(format!("snapshot {id} failed: {e}")),
            }
        }
    }

    /// The checker's own test: each copy in sync takes the snapshot straight in its store, one
    /// after another, while writes go on.
    async fn snapshot_without_barrier(&self, vol: &Volume, id: u64) -> Result<Vec<u32>, String> {
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
        Ok(took)
    }

    /// Every snapshot the writer took is on some copy of the final layout, reads back within
    /// its bounds on each copy holding it, and is byte-identical on all of them. `copies`: the
    /// final layout's replicas by node.
    pub(crate) fn check_snapshots(&self, copies: &[(u32, Arc<dyn trireme_store::Replica>)]) {
        let oracles = self.model().snapshots.clone();
        for o in &oracles {
            let mut first: Option<(u32, Vec<u8>)> = None;
            for (node, r) in copies {
                let holds = match r.snapshots() {
                    Ok(l) => l.iter().any(|s| s.id == o.id),
                    Err(e) => {
                        self.violate(format!("node {node}: listing snapshots: {e}"));
                        return;
                    }
                };
                if !holds {
                    continue;
                }
                let mut buf = vec![0u8; self.size as usize];
                if let Err(e) = r.read_snapshot(o.id, 0, &mut buf) {
                    self.violate(format!("node {node}: reading snapshot {}: {e}", o.id));
                    return;
                }
                for b in 0..self.cfg.blocks {
                    let at = (b * BLOCK) as usize;
                    let data = &buf[at..at + BLOCK as usize];
                    let floor = o.floor.get(&b).copied().unwrap_or(0);
                    match parse(b, data) {
                        Err(e) => self.violate(format!("snapshot {} on node {node}: {e}", o.id)),
                        Ok(seq) if seq < floor => self.violate(format!(
                            "snapshot {} on node {node}: block {b} holds seq {seq}, but seq {floor} was acknowledged before it was asked for",
                            o.id
                        )),
                        Ok(seq) if seq > o.ceiling => self.violate(format!(
                            "snapshot {} on node {node}: block {b} holds seq {seq}, issued after it was taken (last before: {})",
                            o.id, o.ceiling
                        )),
                        Ok(_) => {}
                    }
                }
                match &first {
                    None => first = Some((*node, buf)),
                    Some((n0, b0)) if *b0 != buf => {
                        let b = (0..self.cfg.blocks)
                            .find(|&b| {
                                let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                                b0[r.clone()] != buf[r]
                            })
                            .unwrap_or(0);
                        self.violate(format!(
                            "snapshot {} differs between nodes {n0} and {node} at block {b}",
                            o.id
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
