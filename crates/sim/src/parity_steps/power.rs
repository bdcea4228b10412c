//! Power: what a node keeps when it goes out, the flushes that decide it, and a power loss of
//! one node or of all at once.
//!
//! A node's writes (mirrored blocks, chunks, held bits) land in memory; a flush makes them
//! durable, the held bits after the data they describe (`trireme-node`'s `held.rs`). A trim
//! clears its held bits durably at once, before the bytes are punched, but the punch itself
//! may be undone by a power loss. A power loss keeps, for every block and chunk cell touched
//! since the last flush, either the version on disk or the newest (a torn write, block by
//! block), and the held bits on disk; the node comes back as another incarnation.
//!
//! What the checker then allows: a client's flush makes every write acknowledged before it
//! durable (`Run::floor`); after every mirror of a block lost power, the block reads that
//! write or one sent after it. After one node's power loss nothing is lost: it comes back with
//! its history lost and is resynced whole from the others. After more than M (and the writer
//! with them), the copies that lost their history are kept in sync where taking them out
//! would leave a region unreadable: their chunks were durable before each switch, and their
//! mirrored parts are reconciled from a copy that kept its history where one did.

use super::*;

/// Where a chunk block lives: (region, slot, chunk, block of the chunk).
pub(super) type CellAt = (u64, u8, usize, u64);

/// What a node keeps through a power loss (see the module docs).
#[derive(Debug, Default, Clone)]
pub(super) struct Durable {
    mirror: BTreeMap<u64, u64>,
    held: BTreeSet<u64>,
    slots: BTreeMap<CellAt, Cell>,
}

impl Node {
    /// A write (data, or zeroes) of `b` lands: the block is held.
    pub(super) fn land(&mut self, b: u64, v: u64) {
        self.mirror.insert(b, v);
        self.held.insert(b);
    }

    /// A trim of `b` lands: its held bit is cleared durably, then the block is punched.
    pub(super) fn trim(&mut self, b: u64) {
        self.held.remove(&b);
        self.durable.held.remove(&b);
        self.mirror.remove(&b);
    }

    /// Everything it was sent is durable.
    pub(super) fn flush(&mut self) {
        self.durable = Durable {
            mirror: self.mirror.clone(),
            held: self.held.clone(),
            slots: self.slots.clone(),
        };
    }

    /// The power goes: each block and cell keeps its durable version or its newest; the held
    /// bits are those on disk. It comes back as another incarnation.
    fn lose_power(&mut self, rng: &mut Rng) {
        self.mirror = torn(&self.mirror, &self.durable.mirror, rng);
        self.slots = torn(&self.slots, &self.durable.slots, rng);
        self.held = self.durable.held.clone();
        self.flush();
        self.incarnation += 1;
    }
}

/// Per key, the newest version or the durable one, where they differ.
fn torn<K: Ord + Clone, V: Clone + PartialEq>(
    now: &BTreeMap<K, V>,
    durable: &BTreeMap<K, V>,
    rng: &mut Rng,
) -> BTreeMap<K, V> {
    let keys: BTreeSet<&K> = now.keys().chain(durable.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (n, d) = (now.get(k), durable.get(k));
            let kept = if n == d || rng.chance(0.5) { n } else { d };
            kept.map(|v| (k.clone(), v.clone()))
        })
        .collect()
}

impl Run {
    /// Node `i` is sent write `v` of block `b` (a sabotaged node makes its held bit durable
    /// before the data).
    pub(super) fn land(&mut self, i: usize, b: u64, v: u64) {
        let node = &mut self.nodes[i];
        node.land(b, v);
        if self.sabotage == Sabotage::HeldBeforeData {
            node.durable.held.insert(b);
        }
    }

    /// A client's flush: an in-sync node that is down fails it and is taken out (as a write
    /// it fails); every node up makes what it holds durable. Every write acknowledged so far
    /// then survives the loss of every node's power.
    pub(super) fn client_flush(&mut self) -> Result<(), String> {
        let down: Vec<usize> = self
            .members
            .iter()
            .copied()
            .filter(|&i| !self.nodes[i].up && self.core.set().state(i) == ReplicaState::InSync)
            .collect();
        if !down.is_empty() {
            self.take_out(&down)?;
        }
        for &i in &self.members {
            if self.nodes[i].up {
                self.nodes[i].flush();
            }
        }
        trace!(self, "flushed");
        self.floor = self.acked.clone();
        self.counts.flushes += 1;
        Ok(())
    }

    /// Node `i`, going down, loses its power too.
    pub(super) fn power_loss(&mut self, i: usize) {
        trace!(self, "node {i} loses power");
        self.nodes[i].lose_power(&mut self.rng);
        self.counts.power_losses += 1;
    }

    /// Nodes lose power, all or more than M of them, and the writer with them (its host is
    /// one of them). A block whose every mirror in sync lost power may read any write after
    /// the last one flushed; the restarted writer checks the copies' histories
    /// ([`Run::check_incarnations`]) and reconciles them.
    pub(super) fn power_loss_many(&mut self) -> Result<(), String> {
        let all = self.rng.chance(0.5);
        let out: Vec<usize> = (0..self.nodes.len())
            .filter(|_| all || self.rng.chance(0.7))
            .collect();
        trace!(self, "nodes {out:?} lose power");
        self.counts.restarts += 1;
        self.land_in_flight();
        if let Some(map) = self.core.region_map() {
            let stripes = map.stripes().clone();
            for b in self.hot_blocks() {
                let mirrors: Vec<usize> = stripes
                    .mirrors_of(stripes.region_of(b))
                    .into_iter()
                    .map(|n| n as usize - 1)
                    .filter(|&i| {
                        self.nodes[i].up && self.core.set().state(i) == ReplicaState::InSync
                    })
                    .collect();
                if mirrors.iter().all(|i| out.contains(i)) {
                    match self.floor.get(&b) {
                        Some(&v) => self.acked.insert(b, v),
                        None => self.acked.remove(&b),
                    };
                }
            }
        }
        for &i in &out {
            self.power_loss(i);
        }
        self.restart_writer()
    }

    /// What the writer's `check_incarnations` does with the copies in sync (`up`) that came
    /// back as another incarnation than recorded: all lost, or too many for the others to
    /// serve every region, they are kept (the ones kept, returned); otherwise taken out for
    /// a whole resync.
    pub(super) fn check_incarnations(&mut self, up: &mut [bool]) -> Result<Vec<usize>, String> {
        let lost: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| up[i] && self.nodes[i].incarnation != self.nodes[i].recorded)
            .collect();
        if lost.is_empty() {
            return Ok(lost);
        }
        let all = lost.len() == up.iter().filter(|&&u| u).count();
        let serves = self.sabotage == Sabotage::LostTakenOut || self.core.serves_without(&lost);
        if all || !serves {
            trace!(self, "kept in sync with their history lost: {lost:?}");
            for &i in &lost {
                self.core.attached(i, self.nodes[i].incarnation);
            }
            return Ok(lost);
        }
        trace!(self, "taken out with their history lost: {lost:?}");
        self.take_out(&lost)?;
        for &i in &lost {
            up[i] = false;
        }
        Ok(Vec::new())
    }
}
