//! Clones in the simulator: now and then the snapshot task makes a clone of a snapshot on the
//! copies the writer named as holding it (as the manager makes one on the nodes of the
//! snapshot's record), lets the faults run on (a node may crash, lose power or its disk, the
//! volume may be rolled back or the snapshot's delete asked for), writes to it (partial
//! blocks too: the rest is read from the parent), flattens it on some of them and writes
//! again, and then reads it on every node still holding it. On each, the snapshot read when
//! the clone was made must hold what the snapshot holds ([`SnapshotOracle`]), and the clone
//! must read exactly those bytes with its writes laid over them. Then the clone is deleted; a
//! node down at that moment keeps it until the end, where every clone goes before the checks
//! (a clone on a node keeps its parent's copy and snapshot there: a drain off that node waits
//! for it, as in production).

use super::*;

/// Clones' volume ids start here (the volume's is small).
const CLONE_IDS: u64 = 1 << 32;

/// A clone's copy on one node, and the bytes it must read: its snapshot's there when it was
/// made, with each write laid over them.
struct CloneCopy {
    node: u32,
    expect: Vec<u8>,
}

impl World {
    /// Makes a clone of snapshot `o` on the nodes up among those holding it, writes to it,
    /// flattens it on some of them, writes again, and checks it after a while of faults;
    /// then deletes it.
    pub(crate) async fn clone_and_check(&self, o: &SnapshotOracle) {
        let (id, wait, flatten, later) = {
            let mut m = self.model();
            let id = CLONE_IDS + m.clones;
            m.clones += 1;
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
        let mut copies = Vec::new();
        for &n in &o.nodes {
            let h = Header {
                volume: id,
                length: self.size,
                ..Header::request(trireme_proto::Op::CreateClone, 0)
            };
            match self.node_op(n, &h, Bytes::from(ask.encode())).await {
                Some(trireme_proto::Status::Ok) => {}
                Some(s) => {
                    self.note(format!(
                        "clone {id} of snapshot {} refused on node {n}: {}",
                        o.id,
                        s.as_str()
                    ));
                    continue;
                }
                None => continue,
            }
            // What the clone must read: the snapshot on that node, now.
            let Some(parent) = self.served(n, self.volume_id) else {
                continue;
            };
            let mut expect = vec![0u8; self.size as usize];
            if let Err(e) = parent.read_snapshot(o.id, 0, &mut expect) {
                self.violate(format!(
                    "node {n}: reading snapshot {} a clone was just made of: {e}",
                    o.id
                ));
                return;
            }
            self.check_holds(
                &format!("snapshot {} on node {n} when cloned", o.id),
                &expect,
                o,
            );
            copies.push(CloneCopy { node: n, expect });
        }
        let made: Vec<u32> = copies.iter().map(|c| c.node).collect();
        self.note(format!(
            "clone {id} of snapshot {} made on nodes {made:?}",
            o.id
        ));
        if made.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(wait)).await;
        self.write_clone(id, &mut copies);
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
        self.write_clone(id, &mut copies);
        tokio::time::sleep(Duration::from_millis(later)).await;
        self.check_clone(id, &copies);
        self.delete_clone(id).await;
    }

    /// One to three writes of random bytes at random sectors of clone `id` (parts of blocks
    /// as often as not), each on every copy up, flushed there; laid over what each must read.
    fn write_clone(&self, id: u64, copies: &mut [CloneCopy]) {
        let writes: Vec<(u64, Vec<u8>)> = {
            let mut r = rand(&self.rng);
            let sectors = self.size / 512;
            (0..r.below(3) + 1)
                .map(|_| {
                    let at = r.below(sectors);
                    let len = (r.below(16) + 1).min(sectors - at) * 512;
                    let data = (0..len).map(|_| r.next() as u8).collect();
                    (at * 512, data)
                })
                .collect()
        };
        for c in copies.iter_mut() {
            let Some(r) = self.served(c.node, id) else {
                continue;
            };
            for (at, data) in &writes {
                if let Err(e) = r.write(*at, data, false).and_then(|()| r.flush()) {
                    self.violate(format!("node {}: writing clone {id}: {e}", c.node));
                    return;
                }
                c.expect[*at as usize..*at as usize + data.len()].copy_from_slice(data);
            }
            self.note(format!(
                "clone {id} written on node {}: {:?}",
                c.node,
                writes
                    .iter()
                    .map(|(at, d)| (*at, d.len()))
                    .collect::<Vec<_>>()
            ));
        }
    }

    /// Clone `id`, on each node up and still holding it, reads exactly what that copy must.
    /// A node whose disk was lost has none.
    fn check_clone(&self, id: u64, copies: &[CloneCopy]) {
        let mut read = Vec::new();
        for c in copies {
            let Some(r) = self.served(c.node, id) else {
                continue;
            };
            let mut buf = vec![0u8; self.size as usize];
            if let Err(e) = r.read(0, &mut buf) {
                self.violate(format!("node {}: reading clone {id}: {e}", c.node));
                return;
            }
            if buf != c.expect {
                let b = (0..self.cfg.blocks)
                    .find(|&b| {
                        let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                        buf[r.clone()] != c.expect[r]
                    })
                    .unwrap_or(0);
                self.violate(format!(
                    "clone {id} on node {} reads other bytes at block {b} than its snapshot's with its writes over them",
                    c.node
                ));
                return;
            }
            read.push(c.node);
        }
        if !read.is_empty() {
            self.note(format!("clone {id} checked on nodes {read:?}"));
        }
    }

    /// Node `n`'s replica of `volume`, if the node is up and serves one.
    fn served(&self, n: u32, volume: u64) -> Option<Arc<dyn trireme_store::Replica>> {
        self.node(n).up()?.served(volume)
    }

    /// Deletes clone `id` on every node up (one that has none answers so).
    pub(crate) async fn delete_clone(&self, id: u64) {
        let h = Header {
            volume: id,
            ..Header::request(trireme_proto::Op::DeleteReplica, 0)
        };
        let on = self.on_every_node_up(&h).await;
        self.note(format!("clone {id} gone from nodes {on:?}"));
    }

    /// Every clone made, deleted on every node (all up: the end of the run, after the heal).
    pub(crate) async fn delete_clones(&self) {
        let made = self.model().clones;
        for k in 0..made {
            self.delete_clone(CLONE_IDS + k).await;
        }
    }

    /// Sends `h` (no payload) to every node up, as the manager's calls land there; the nodes
    /// that answered `Ok`.
    pub(crate) async fn on_every_node_up(&self, h: &Header) -> Vec<u32> {
        let mut on = Vec::new();
        for n in &self.nodes {
            if self.node_op(n.id, h, Bytes::new()).await == Some(trireme_proto::Status::Ok) {
                on.push(n.id);
            }
        }
        on
    }

    /// Sends `h` with `payload` straight to node `n`'s process (as the manager's calls land
    /// there); its status, or `None` if the node is down.
    async fn node_op(&self, n: u32, h: &Header, payload: Bytes) -> Option<trireme_proto::Status> {
        let node = self.node(n).up()?;
        let f = over_the_wire(h, payload, None).ok()?;
        Some(node.handle(f).await.header.status)
    }
}
