//! A region's encode as a plan (issue 67): a mirrored region into a stripe, or a parity
//! region with its overlay into a new stripe (the fold-back). The executor asks
//! [`RegionMap::step`] what to do, does it, and says so ([`RegionMap::answered`]); the map
//! keeps the order that loses nothing (see the parent module's docs): read, write the
//! chunks into the slot the map does not name, flush them on all K+M nodes, switch the
//! region, trim the mirrors.

use std::collections::BTreeSet;

use super::{ChunkAt, Region, RegionMap};

/// Why an encode is not begun.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeRefusal {
    #[error("region {0} is past the volume's end")]
    NoSuchRegion(u64),
    #[error("region {0} is being encoded already")]
    Busy(u64),
    #[error("region {0} is parity with nothing over it: nothing to fold back")]
    Nothing(u64),
    #[error("node {0} of the stripe is down: a stripe is made on all K+M nodes or not at all")]
    NodeDown(u32),
    #[error("the volume is a mirror: it has no regions to encode")]
    NotParity,
}

/// The next thing an encode needs done; [`RegionMap::answered`] says it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeStep {
    /// Read the region's blocks as they read now ([`RegionMap::read`]) and code them.
    Read { region: u64 },
    /// Write the coded chunks into `slot` of their nodes (the slot the map does not name).
    Write {
        region: u64,
        slot: u8,
        chunks: Vec<ChunkAt>,
    },
    /// Make them durable on every one of these nodes.
    Flush { nodes: Vec<u32> },
    /// Record the region as `to` (the one step that changes what reads see).
    Switch { region: u64, to: Region },
    /// Trim these blocks from the mirrored copies: they read from the stripe now. And
    /// trim the `stale` chunks, the stripe a fold-back replaced (no reader names their slot
    /// any more; a trim that fails there is only space).
    Free {
        blocks: Vec<u64>,
        nodes: Vec<u32>,
        stale: Vec<ChunkAt>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Read,
    Write,
    Flush,
    Switch,
    Free,
}

#[derive(Debug, Clone)]
pub(super) struct Encode {
    pub(super) phase: Phase,
    pub(super) slot: u8,
    /// A fold-back: the slot of the stripe it replaces, trimmed with the mirrors.
    pub(super) replaces: Option<u8>,
    /// Blocks written (or discarded) since the read began: never trimmed by this encode.
    pub(super) written: BTreeSet<u64>,
    /// The blocks to trim, fixed once handed out ([`RegionMap::fix_free`]): a write sent
    /// after that waits for the trim, and its block, trimmed, reads from the stripe until a
    /// copy holds the write.
    pub(super) freeing: Option<Vec<u64>>,
}

/// What an encode's answer ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeEnd {
    /// More steps to go.
    Going,
    /// The region is parity in its new stripe and the mirrors are trimmed.
    Done,
    /// A step failed before the switch: the region reads as before; the written slot is
    /// garbage no reader names.
    Abandoned,
}

impl RegionMap {
    /// Begins encoding `region`: a mirrored one into a stripe, a parity one with overlay
    /// into a new stripe. Every node of the stripe must be up.
    pub fn begin(&mut self, region: u64, up: impl Fn(u32) -> bool) -> Result<(), EncodeRefusal> {
        let r = *self
            .regions
            .get(region as usize)
            .ok_or(EncodeRefusal::NoSuchRegion(region))?;
        if self.encodes.contains_key(&region) {
            return Err(EncodeRefusal::Busy(region));
        }
        let (slot, replaces) = match r {
            Region::Mirror => (0, None),
            Region::Parity { slot } => {
                let mut blocks = self.stripes.blocks_of(region);
                if !blocks.any(|b| self.overlay.contains(&b)) {
                    return Err(EncodeRefusal::Nothing(region));
                }
                (1 - slot, Some(slot))
            }
        };
        if let Some(&n) = self.stripes.nodes.iter().find(|&&n| !up(n)) {
            return Err(EncodeRefusal::NodeDown(n));
        }
        let encode = Encode {
            phase: Phase::Read,
            slot,
            replaces,
            written: BTreeSet::new(),
            freeing: None,
        };
        self.encodes.insert(region, encode);
        Ok(())
    }

    /// The regions being encoded.
    pub fn encoding(&self) -> impl Iterator<Item = u64> + '_ {
        self.encodes.keys().copied()
    }

    /// What `region`'s encode needs done now (the same until it is answered).
    pub fn step(&self, region: u64) -> Option<EncodeStep> {
        let e = self.encodes.get(&region)?;
        let s = &self.stripes;
        Some(match e.phase {
            Phase::Read => EncodeStep::Read { region },
            Phase::Write => EncodeStep::Write {
                region,
                slot: e.slot,
                chunks: self.chunks_at(region, e.slot),
            },
            Phase::Flush => EncodeStep::Flush {
                nodes: s.nodes.clone(),
            },
            Phase::Switch => EncodeStep::Switch {
                region,
                to: Region::Parity { slot: e.slot },
            },
            Phase::Free => EncodeStep::Free {
                blocks: match &e.freeing {
                    Some(blocks) => blocks.clone(),
                    None => self.to_free(region, e),
                },
                nodes: s.mirrors_of(region),
                stale: e
                    .replaces
                    .map_or_else(Vec::new, |old| self.chunks_at(region, old)),
            },
        })
    }

    /// The K+M chunks of `region`'s stripe in `slot`, each on its node.
    fn chunks_at(&self, region: u64, slot: u8) -> Vec<ChunkAt> {
        let s = &self.stripes;
        (0..s.width())
            .map(|c| ChunkAt {
                node: s.node_of(region, c),
                region,
                slot,
                chunk: c,
                block: 0,
            })
            .collect()
    }

    fn to_free(&self, region: u64, e: &Encode) -> Vec<u64> {
        self.stripes
            .blocks_of(region)
            .filter(|b| self.overlay.contains(b) && !e.written.contains(b))
            .collect()
    }

    /// Fixes the blocks `region`'s trim frees, as they are now (an executor that holds the
    /// region calls this as it sends the trim; see `Encode::freeing`).
    pub fn fix_free(&mut self, region: u64) {
        let Some(e) = self.encodes.get(&region) else {
            return;
        };
        if e.phase == Phase::Free && e.freeing.is_none() {
            let blocks = self.to_free(region, e);
            if let Some(e) = self.encodes.get_mut(&region) {
                e.freeing = Some(blocks);
            }
        }
    }

    /// The order of the phases: the switch only once the stripe is durable everywhere, the
    /// trim only after the switch.
    fn next(&self, phase: Phase) -> Option<Phase> {
        #[cfg(test)]
        if self.unsafe_order {
            return match phase {
                Phase::Read => Some(Phase::Write),
                Phase::Write => Some(Phase::Switch),
                Phase::Switch => Some(Phase::Free),
                Phase::Free => Some(Phase::Flush),
                Phase::Flush => None,
            };
        }
        match phase {
            Phase::Read => Some(Phase::Write),
            Phase::Write => Some(Phase::Flush),
            Phase::Flush => Some(Phase::Switch),
            Phase::Switch => Some(Phase::Free),
            Phase::Free => None,
        }
    }

    /// The step of `region`'s encode was carried out (`ok`) or failed.
    pub fn answered(&mut self, region: u64, ok: bool) -> EncodeEnd {
        let Some(e) = self.encodes.get(&region) else {
            return EncodeEnd::Abandoned;
        };
        let phase = e.phase;
        let switched = self.regions.get(region as usize) == Some(&Region::Parity { slot: e.slot });
        if !ok && !switched {
            self.encodes.remove(&region);
            return EncodeEnd::Abandoned;
        }
        match phase {
            Phase::Switch if ok => self.switched(region),
            // Failed or not, a trim may have reached some copies: its blocks read from the
            // stripe, which holds them, never from a copy that may have lost them.
            Phase::Free => self.freed(region),
            _ => {}
        }
        // After the switch a failed trim (or flush) is only space: a copy the trim missed
        // holds what the stripe holds.
        match self.next(phase).filter(|_| ok) {
            Some(p) => {
                if let Some(e) = self.encodes.get_mut(&region) {
                    e.phase = p;
                }
                EncodeEnd::Going
            }
            None => {
                self.encodes.remove(&region);
                EncodeEnd::Done
            }
        }
    }

    /// The record says parity now. A region that was mirrored is overlay in every block until
    /// trimmed (the mirrors may hold any of them, and what they hold is at least as new; a
    /// block they do not hold is zeroes in the stripe too). A fold-back's overlay is as it was.
    fn switched(&mut self, region: u64) {
        let Some(e) = self.encodes.get(&region) else {
            return;
        };
        let was = std::mem::replace(
            &mut self.regions[region as usize],
            Region::Parity { slot: e.slot },
        );
        if was == Region::Mirror {
            let blocks = self.stripes.blocks_of(region);
            self.overlay.extend(blocks);
        }
    }

    fn freed(&mut self, region: u64) {
        let Some(EncodeStep::Free { blocks, .. }) = self.step(region) else {
            return;
        };
        for b in blocks {
            self.overlay.remove(&b);
        }
    }

    /// Whether an encode's switch is handed out and not answered: the record may be changing.
    pub fn switching(&self) -> bool {
        self.encodes.values().any(|e| e.phase == Phase::Switch)
    }

    /// Whether an encode is at its switch or past it: its trims name the mirrors as the
    /// stripes are now.
    pub fn past_flush(&self) -> bool {
        self.encodes
            .values()
            .any(|e| matches!(e.phase, Phase::Switch | Phase::Free))
    }

    /// Abandons the encodes not yet at their switch (a node of their stripe is being brought
    /// back: its chunk of them may be missing). Their slots are garbage no reader names.
    pub fn abandon_unswitched(&mut self) {
        self.encodes
            .retain(|_, e| matches!(e.phase, Phase::Switch | Phase::Free));
    }

    /// Forgets the encodes in flight (the executor stopped; a restart reads the record).
    pub fn abandon_all(&mut self) {
        self.encodes.clear();
    }
}
