//! The writer restarting: what was in flight lands or not, the new writer checks the copies'
//! histories, reconciles the mirrors and rebuilds its overlay from the held maps.

use super::*;

impl Run {
    /// The writer dies and a new one attaches: what was in flight may have landed on some
    /// targets; the encode in flight is forgotten (its switch, if recorded, stays). The new
    /// writer reads the regions from the record, makes the mirrors agree on what they hold,
    /// and rebuilds its overlay from it.
    pub(super) fn restart(&mut self) -> Result<(), String> {
        self.counts.restarts += 1;
        trace!(self, "the writer restarts");
        self.land_in_flight();
        self.restart_writer()
    }

    /// The writes in flight when the writer died land on some of their targets.
    pub(super) fn land_in_flight(&mut self) {
        for w in std::mem::take(&mut self.writes) {
            for (i, _) in w.targets {
                if self.nodes[i].up && self.rng.chance(0.5) {
                    for b in w.blocks.0..w.blocks.1 {
                        match self.trims.contains(&w.seq) {
                            true => self.nodes[i].trim(b),
                            false => self.land(i, b, w.seq),
                        }
                    }
                }
            }
        }
    }

    /// A new writer attaches (see [`Run::restart`]).
    pub(super) fn restart_writer(&mut self) -> Result<(), String> {
        self.gate.clear();
        self.encoder = None;
        self.copies.clear();
        // A new writer's resyncs compare every block: the marks are the old writer's.
        let all = self.hot_blocks();
        for node in &mut self.nodes {
            node.to_copy.clear();
            node.rebuilds.clear();
            node.missed = all.clone();
        }
        let old = std::mem::replace(&mut self.core, VolumeCore::new(&[], 0, true, 1));
        // The new writer's slots are the record's replicas, in its order: the stripe's places.
        let mut order = self.members.clone();
        if self.sabotage == Sabotage::NodesById {
            order.sort_unstable();
        }
        let mut up: Vec<bool> = order
            .iter()
            .map(|&i| self.nodes[i].up && old.set().state(i) == ReplicaState::InSync)
            .collect();
        let mut nodes: Vec<Option<Node>> = std::mem::take(&mut self.nodes)
            .into_iter()
            .map(Some)
            .collect();
        self.nodes = order.iter().map(|&i| nodes[i].take().unwrap()).collect();
        self.members = (0..self.nodes.len()).collect();
        self.core = self.new_core(|i| match up[i] {
            true => ReplicaState::InSync,
            false => ReplicaState::Outdated,
        })?;
        self.core
            .restore_regions(&self.recorded, [])
            .expect("the record has the volume's regions");
        let kept = self.check_incarnations(&mut up)?;
        self.reconcile(&up, &kept);
        // Reconciled, the copies kept have their new history recorded.
        for &i in &kept {
            self.nodes[i].recorded = self.nodes[i].incarnation;
        }
        let held: BTreeSet<u64> = (0..self.nodes.len())
            .filter(|&i| up[i])
            .flat_map(|i| self.nodes[i].held.iter().copied())
            .collect();
        self.core
            .restore_regions(&self.recorded, held)
            .expect("the record has the volume's regions");
        Ok(())
    }

    /// Every block of the regions' mirrored parts is copied from its region's first mirror up
    /// to the others, with what that one holds, and a block it does not hold is trimmed on it
    /// too (the writer's `reconcile_parity`): after a power loss a node may have bytes of a
    /// block whose held bit is clear (a write never flushed, a punch undone), which a read of
    /// a mirrored region would return from that copy alone.
    pub(super) fn reconcile(&mut self, up: &[bool], lost: &[usize]) {
        let Some(map) = self.core.region_map() else {
            return;
        };
        let stripes = map.stripes().clone();
        for b in self.hot_blocks() {
            let mut mirrors: Vec<usize> = stripes
                .mirrors_of(stripes.region_of(b))
                .into_iter()
                .map(|n| n as usize - 1)
                .filter(|&i| up[i])
                .collect();
            // A copy that kept its history is the source where one can be.
            if self.sabotage != Sabotage::LostAsSource {
                mirrors.sort_by_key(|i| lost.contains(i));
            }
            if let Some((&src, rest)) = mirrors.split_first() {
                if !self.nodes[src].held.contains(&b) && self.sabotage != Sabotage::SourceGapsKept {
                    self.nodes[src].trim(b);
                }
                for &t in rest {
                    self.copy_held(src, t, b);
                }
            }
        }
    }

    /// Block `b` copied from node `src` to node `dst` as the writer's `copy_held` does:
    /// written if `src` holds it, trimmed if not.
    pub(super) fn copy_held(&mut self, src: usize, dst: usize, b: u64) {
        match self.nodes[src].held.contains(&b) {
            true => {
                let v = self.nodes[src].mirror.get(&b).copied().unwrap_or(0);
                self.land(dst, b, v);
            }
            false => self.nodes[dst].trim(b),
        }
    }
}
