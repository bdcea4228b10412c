//! Clones in the simulator: now and then the snapshot task makes a clone of a snapshot on the
//! copies the writer named as holding it (as the manager makes one on the nodes of the
//! snapshot's record), lets the faults run on (a node may crash, lose power or its disk, the
//! volume may be rolled back or the snapshot's delete asked for), flattens it on some of them,
//! and then reads it on every node still holding it: each must read exactly what the snapshot
//! holds ([`SnapshotOracle`]), byte-identical on all of them. Then the clone is deleted; a
//! node down at that moment keeps it until the end, where every clone goes before the checks
//! (a clone on a node keeps its parent's copy and snapshot there: a drain off that node waits
//! for it, as in production).

use super::*;

/// Clones' volume ids start here (the volume's is small).
const CLONE_IDS: u64 = 1 << 32;

impl World {
    /// Makes a clone of snapshot `o` on the nodes up among those holding it, and checks it
    /// after a while of faults, flattened on some of them; then deletes it.
    pub(crate) async fn clone_and_check(&self, o: &SnapshotOracle) {
        let (id, wait, flatten, later) = {
            let mut m = self.model();
            let id = CLONE_IDS + m.clones.len() as u64;
            m.clones.push(id);
            drop(m);
            let mut r = rand(&self.rng);
            (id, r.below(1_500), r.below(1 << 16), r.below(1_000))
        };
        let mut snapshot = o.id;
        if self.cfg.sabotage_clone {
            let m = self.model();
            if let Some(other) = m.snapshots.iter().rev().find(|s| s.id != o.id) {
                snapshot = other.id;
            }
        }
        let ask = trireme_proto::CloneRequest {
            parent: self.volume_id,
            snapshot,
        };
        let mut made = Vec::new();
        for &n in &o.nodes {
            let h = Header {
                volume: id,
                length: self.size,
                ..Header::request(trireme_proto::Op::CreateClone, 0)
            };
            if let Some(s) = self.node_op(n, &h, Bytes::from(ask.encode())).await {
                match s {
                    trireme_proto::Status::Ok => made.push(n),
                    s => self.note(format!(
                        "clone {id} of snapshot {} refused on node {n}: {}",
                        o.id,
                        s.as_str()
                    )),
                }
            }
        }
        self.note(format!(
            "clone {id} of snapshot {} made on nodes {made:?}",
            o.id
        ));
        if made.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(wait)).await;
        // Some copies flattened (each with its own chance), the others still reading through.
        let mut flat = Vec::new();
        for (k, &n) in made.iter().enumerate() {
            if flatten >> k & 1 == 0 {
                continue;
            }
            let h = Header {
                volume: id,
                ..Header::request(trireme_proto::Op::Flatten, 0)
            };
            if self.node_op(n, &h, Bytes::new()).await == Some(trireme_proto::Status::Ok) {
                flat.push(n);
            }
        }
        if !flat.is_empty() {
            self.note(format!("clone {id} flattened on nodes {flat:?}"));
        }
        tokio::time::sleep(Duration::from_millis(later)).await;
        self.check_clone(id, o, &made);
        self.delete_clone(id).await;
    }

    /// Clone `id` of snapshot `o`, on each node of `made` up and still holding it, reads as
    /// `o` must, and the same on all of them. A node whose disk was lost has none.
    fn check_clone(&self, id: u64, o: &SnapshotOracle, made: &[u32]) {
        let mut first: Option<(u32, Vec<u8>)> = None;
        let mut read = Vec::new();
        for &n in made {
            let node = {
                let s = self.node(n).st();
                (!s.down).then(|| s.node.clone())
            };
            let Some(r) = node.and_then(|node| node.served(id)) else {
                continue;
            };
            let mut buf = vec![0u8; self.size as usize];
            if let Err(e) = r.read(0, &mut buf) {
                self.violate(format!("node {n}: reading clone {id}: {e}"));
                return;
            }
            self.check_holds(
                &format!("clone {id} of snapshot {} on node {n}", o.id),
                &buf,
                o,
            );
            read.push(n);
            match &first {
                None => first = Some((n, buf)),
                Some((n0, b0)) if *b0 != buf => self.violate(format!(
                    "clone {id} of snapshot {} differs between nodes {n0} and {n}",
                    o.id
                )),
                Some(_) => {}
            }
        }
        if !read.is_empty() {
            self.note(format!("clone {id} checked on nodes {read:?}"));
        }
    }

    /// Deletes clone `id` on every node up (one that has none answers so).
    pub(crate) async fn delete_clone(&self, id: u64) {
        let h = Header {
            volume: id,
            ..Header::request(trireme_proto::Op::DeleteReplica, 0)
        };
        let mut on = Vec::new();
        for n in &self.nodes {
            if self.node_op(n.id, &h, Bytes::new()).await == Some(trireme_proto::Status::Ok) {
                on.push(n.id);
            }
        }
        self.note(format!("clone {id} gone from nodes {on:?}"));
    }

    /// Every clone made, deleted on every node (all up: the end of the run, after the heal).
    pub(crate) async fn delete_clones(&self) {
        let ids = self.model().clones.clone();
        for id in ids {
            self.delete_clone(id).await;
        }
    }

    /// Sends `h` with `payload` straight to node `n`'s process (as the manager's calls land
    /// there); its status, or `None` if the node is down.
    async fn node_op(&self, n: u32, h: &Header, payload: Bytes) -> Option<trireme_proto::Status> {
        let node = {
            let s = self.node(n).st();
            (!s.down).then(|| s.node.clone())
        }?;
        let f = over_the_wire(h, payload, None).ok()?;
        Some(node.handle(f).await.header.status)
    }
}
