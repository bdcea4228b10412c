//! Nodes coming back and their resyncs: blocks copied from a copy of the same region under
//! a hold, chunks of a node that lost its data rebuilt from K others.

use super::*;

impl Run {
    /// A node that is down comes back, sometimes without its data; the resyncs due begin.
    pub(super) fn come_back(&mut self) -> Result<(), String> {
        if let Some(&i) = self.members.iter().find(|&&i| !self.nodes[i].up) {
            let wiped = self.rng.chance(0.3);
            self.back(i, wiped)?;
        }
        self.start_resyncs()
    }

    /// Node `i` is up again, wiped or not.
    pub(super) fn back(&mut self, i: usize, wiped: bool) -> Result<(), String> {
        trace!(self, "node {i} back (wiped: {wiped})");
        let node = &mut self.nodes[i];
        node.up = true;
        if wiped {
            node.incarnation += 1;
            node.mirror.clear();
            node.held.clear();
            node.slots.clear();
            node.flush();
        }
        // Back as another incarnation (wiped, or after a power loss): the writer takes it
        // out at once, before any request reaches what it no longer holds.
        let node = &self.nodes[i];
        if node.incarnation != node.recorded && self.core.set().state(i) == ReplicaState::InSync {
            self.take_out(&[i])?;
        }
        // Its restart broke the links of a resync into it: that resync fails.
        if self.core.resyncing(i) {
            self.take_out(&[i])?;
        }
        Ok(())
    }

    /// A copy out of sync (not being resynced) gives its place to a new node's, empty
    /// (`node remove` of a lost node): the core retires it and the new one is rebuilt whole.
    /// At most the writer's slots (a restart compacts them).
    pub(super) fn replace(&mut self) -> Result<(), String> {
        let out: Vec<usize> = self
            .members
            .iter()
            .copied()
            .filter(|&i| {
                matches!(
                    self.core.set().state(i),
                    ReplicaState::Outdated | ReplicaState::Failed
                )
            })
            .collect();
        let Some(&i) = out.get(self.rng.below(out.len().max(1) as u64) as usize) else {
            return Ok(());
        };
        let j = self.nodes.len();
        if j == SLOTS {
            return Ok(());
        }
        match self.core.replace(i as u32 + 1, j as u32 + 1, 0) {
            Ok((s, true)) if s == j => {}
            Err(Refusal::Switching) => return Ok(()),
            other => return Err(format!("replacing node {i} by {j}: {other:?}")),
        }
        trace!(self, "node {i} replaced by node {j}");
        self.nodes.push(Node {
            up: true,
            incarnation: 1,
            ..Node::default()
        });
        let at = self.members.iter().position(|&m| m == i).expect("a member");
        self.members[at] = j;
        self.counts.replaced += 1;
        self.start_resyncs()
    }

    pub(super) fn start_resyncs(&mut self) -> Result<(), String> {
        for i in self.core.to_resync(std::time::Duration::ZERO) {
            if !self.nodes[i].up {
                continue;
            }
            let incremental = match self.core.resync_start(i, self.nodes[i].incarnation) {
                Ok(ResyncStart::From { incremental, .. }) => incremental,
                Ok(ResyncStart::NotNeeded) | Err(Refusal::Switching) => continue,
                Err(e) => return Err(format!("resync of {i}: {e}")),
            };
            let rebuilds = match incremental {
                true => Vec::new(),
                false => match self.core.parity_rebuilds(i) {
                    Ok(r) => r,
                    Err(_) => continue,
                },
            };
            let all = self.hot_blocks();
            let node = &mut self.nodes[i];
            node.to_copy = match incremental {
                true => std::mem::take(&mut node.missed),
                false => all,
            };
            node.missed.clear();
            node.rebuilds = rebuilds;
            trace!(self, "resync of {i} begins (incremental: {incremental})");
            self.core.resync_begun(i, progress());
            self.counts.resyncs += 1;
            self.maybe_done(i)?;
        }
        Ok(())
    }

    pub(super) fn hot_blocks(&self) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        for region in 0..self.regions {
            for c in 0..u64::from(self.parity.data) {
                let first = region * self.region_blocks() + c * CHUNK_BLOCKS;
                out.extend(first..first + HOT);
            }
        }
        out
    }

    /// One step of a resync: a copy holding its block lands; or a chunk is rebuilt; or a copy
    /// takes its block's place in the write order.
    pub(super) fn resync_step(&mut self) -> Result<(), String> {
        if let Some(k) = self.copies.iter().position(|c| self.core.may_hold(c.place)) {
            let c = self.copies.remove(k);
            self.copy(c.replica, c.block)?;
            self.release(c.place);
            return self.maybe_done(c.replica);
        }
        let busy: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.core.resyncing(i))
            .filter(|&i| !self.nodes[i].to_copy.is_empty() || !self.nodes[i].rebuilds.is_empty())
            .collect();
        let Some(&i) = busy.get(self.rng.below(busy.len() as u64) as usize) else {
            return Ok(());
        };
        if !self.nodes[i].rebuilds.is_empty() && self.rng.chance(0.5) {
            return self.rebuild(i);
        }
        let pending: BTreeSet<u64> = self
            .copies
            .iter()
            .filter(|c| c.replica == i)
            .map(|c| c.block)
            .collect();
        let Some(&b) = self.nodes[i].to_copy.iter().find(|b| !pending.contains(b)) else {
            return Ok(());
        };
        let place = match self
            .core
            .step(Input::Hold {
                start: b * BLOCK,
                end: (b + 1) * BLOCK,
            })
            .pop()
        {
            Some(Action::Proceed { place: Some(p), .. } | Action::Wait { place: p }) => p,
            other => return Err(format!("a resync's hold: {other:?}")),
        };
        self.copies.push(Copy {
            place,
            replica: i,
            block: b,
        });
        Ok(())
    }

    /// Replica `i`'s resync copies block `b` from a copy of its region in sync.
    pub(super) fn copy(&mut self, i: usize, b: u64) -> Result<(), String> {
        if !self.core.resyncing(i) {
            return Ok(());
        }
        if !self.nodes[i].up {
            return self.take_out(&[i]);
        }
        let source = match self.sabotage {
            Sabotage::CopyFromAnyNode => {
                let s = self.core.set().in_sync().into_iter().find(|&s| s != i);
                s.map_or(MirrorCopy::NoSource, MirrorCopy::From)
            }
            _ => match self.core.parity_copy_source(b, i) {
                Some(c) => c,
                None => return Err("a parity core without regions".into()),
            },
        };
        match source {
            MirrorCopy::NotMirrored => {}
            MirrorCopy::NoSource => return Ok(()),
            MirrorCopy::From(s) if !self.nodes[s].up => return self.take_out(&[s]),
            MirrorCopy::From(s) => {
                trace!(self, "resync of {i}: block {b} from {s}");
                self.copy_held(s, i, b);
            }
        }
        self.nodes[i].to_copy.remove(&b);
        Ok(())
    }

    /// Replica `i`'s resync rebuilds one of its chunks from K others in sync (no hold: chunks
    /// change only by encodes, which wait for every node in sync). The sources are asked of
    /// the core as the rebuild runs: one in sync when the resync began may be out now.
    pub(super) fn rebuild(&mut self, i: usize) -> Result<(), String> {
        let to = self.nodes[i].rebuilds.last().expect("a rebuild").to;
        let now = match self.core.parity_rebuilds(i) {
            Ok(now) => now,
            Err(_) => return Ok(()),
        };
        let Some(r) = now.into_iter().find(|r| r.to == to) else {
            return Err(format!("chunk {to:?} is no longer to rebuild"));
        };
        if let Some(down) = r
            .from
            .iter()
            .map(|c| c.node as usize - 1)
            .find(|&n| !self.nodes[n].up)
        {
            return self.take_out(&[down]);
        }
        if !self.nodes[i].up {
            return self.take_out(&[i]);
        }
        for at in 0..HOT {
            let cells: Vec<Option<Cell>> = r
                .from
                .iter()
                .map(|c| {
                    self.nodes[c.node as usize - 1]
                        .slots
                        .get(&(c.region, c.slot, c.chunk, at))
                        .cloned()
                })
                .collect();
            let Some(first) = cells[0].clone() else {
                continue;
            };
            if cells.iter().any(|c| c.as_ref() != Some(&first)) {
                return Err(format!(
                    "chunk {:?} rebuilt from different encodes: {cells:?} (from {:?})",
                    r.to, r.from
                ));
            }
            let to = &r.to;
            self.nodes[i]
                .slots
                .insert((to.region, to.slot, to.chunk, at), first);
        }
        trace!(self, "resync of {i}: chunk {:?} rebuilt", r.to);
        self.nodes[i].rebuilds.pop();
        self.counts.chunks_rebuilt += 1;
        self.maybe_done(i)
    }

    /// Replica `i`'s resync is done once nothing is left to copy or rebuild, and a flush made
    /// what it copied durable (a node down fails the flush, and is taken out).
    pub(super) fn maybe_done(&mut self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        let pending = self.copies.iter().any(|c| c.replica == i);
        if !self.core.resyncing(i)
            || !node.to_copy.is_empty()
            || !node.rebuilds.is_empty()
            || pending
        {
            return Ok(());
        }
        if !node.up {
            return self.take_out(&[i]);
        }
        trace!(self, "resync of {i} done");
        let node = &mut self.nodes[i];
        node.flush();
        self.core.resync_done(i, node.incarnation, progress());
        node.recorded = node.incarnation;
        node.missed.clear();
        Ok(())
    }
}
