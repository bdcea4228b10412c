//! Which replicas a request goes to and where a block reads back from, by layout.
//!
//! - A mirror: every copy that takes writes, for every request; reads follow
//!   [`ReadPlan`](crate::ReadPlan).
//! - Parity: the core keeps the volume's [`RegionMap`]. A data request goes to its region's
//!   mirrored copies (M+1 of the K+M nodes, rotating by region), a flush or a snapshot to every
//!   node. A data request stays within one region (the writer splits at
//!   [`VolumeCore::region_end`]); one that crosses is refused, never sent half-routed.
//! - A write marks its blocks as overlay only once a copy holds it (an ack, or a take-out
//!   whose survivors hold it): until then a read of a parity block reads the stripe, which
//!   holds the bytes from before the write, never the mirrors' empty space.
//!
//! No writer executes parity yet (`Layout::served` refuses it, and so does
//! [`VolumeCore::with_layout`]): the core's tests build one with [`VolumeCore::with_stripes`].

use crate::{
    Decision, EncodeEnd, EncodeRefusal, EncodeStep, Layout, Mirrored, Parity, PlacementError,
    ReadFrom, Region, RegionMap, ReplicaState, Stripes, Ticket, Unreadable, VolumeCore,
};

/// Bytes per block of the region map.
const BLOCK: u64 = 4096;

impl VolumeCore {
    /// The core of a parity volume of `size` bytes (whole blocks) whose replicas are its K+M
    /// nodes: every region mirrored, as a new volume is. Writes go on while K nodes are in
    /// sync: below that its stripes cannot be read.
    pub fn with_stripes(mut self, parity: Parity, size: u64) -> Result<VolumeCore, PlacementError> {
        let nodes = (0..self.set.len()).map(|i| self.node(i)).collect();
        let stripes = Stripes::new(&parity, nodes)?;
        self.regions = Some(RegionMap::new(stripes, size.div_ceil(BLOCK)));
        self.layout = Layout::Parity(parity);
        // Of a region's M+1 mirrors, by default M must hold each write (as a mirror's
        // default is one fewer than its copies).
        let mirrors = u32::from(parity.parity) + 1;
        self.min_copies = match self.min_asked {
            0 => mirrors - 1,
            n => n.min(mirrors),
        };
        Ok(self)
    }

    /// A parity volume attached again: its regions as recorded (those past the record are
    /// mirrored) and the overlay, the blocks of parity regions every in-sync copy of their
    /// mirrors holds (the writer asks the nodes' held maps; `client/src/overlay.rs`). Before
    /// any request; refused for a record with more regions than the volume has.
    pub fn restore_regions(
        &mut self,
        recorded: &[Region],
        overlay: impl IntoIterator<Item = u64>,
    ) -> Result<(), crate::LayoutError> {
        let map = self
            .regions
            .as_mut()
            .ok_or(crate::LayoutError::NotBuilt("regions of a mirror"))?;
        let count = map.regions().len();
        if recorded.len() > count {
            return Err(crate::LayoutError::Regions {
                recorded: recorded.len(),
                regions: count,
            });
        }
        let mut regions = recorded.to_vec();
        regions.resize(count, Region::Mirror);
        *map = RegionMap::restore(map.stripes().clone(), regions, overlay);
        Ok(())
    }

    /// A parity volume's region map (None: a mirror).
    pub fn region_map(&self) -> Option<&RegionMap> {
        self.regions.as_ref()
    }

    /// Where a data request starting at byte `offset` must end at the latest: its region's
    /// end (a mirror: never).
    pub fn region_end(&self, offset: u64) -> u64 {
        match &self.regions {
            Some(map) => {
                let s = map.stripes();
                (s.region_of(offset / BLOCK) + 1) * s.region_blocks() * BLOCK
            }
            None => u64::MAX,
        }
    }

    /// The replicas a request over `range` (bytes; None: a flush or a snapshot, which go to
    /// every copy) goes to.
    pub fn targets_of(&self, range: Option<(u64, u64)>) -> Vec<usize> {
        let all = self.set.write_targets();
        let (Some(map), Some((start, _))) = (&self.regions, range) else {
            return all;
        };
        let s = map.stripes();
        let mirrors = s.mirrors_of(s.region_of(start / BLOCK));
        all.into_iter()
            .filter(|&i| mirrors.contains(&self.place_node(i)))
            .collect()
    }

    /// Why a data request is refused before it takes a place: it crosses its region's end.
    pub(crate) fn misrouted(&self, request: Mirrored) -> Option<Decision> {
        let Mirrored::Data { offset, len } = request else {
            return None;
        };
        let end = self.region_end(offset);
        (offset + len > end).then_some(Decision::Fail(crate::WriteFailure::CrossesRegion {
            at: end,
        }))
    }

    /// Whether a trim of `[offset, offset + len)` must be sent as zeroes: a stripe is beneath
    /// a block of it, or being made (a trimmed copy would uncover the stripe's older data). The
    /// writer asks in the same visit to the core as it submits the trim, so no encode begins
    /// in between.
    pub fn trim_needs_zeroes(&self, offset: u64, len: u64) -> bool {
        self.regions
            .as_ref()
            .is_some_and(|map| blocks(offset, len).any(|b| map.beneath(b)))
    }

    /// A data request was submitted: an encode of its region must not free its blocks.
    pub(crate) fn writing(&mut self, request: Mirrored) {
        if let (Some(map), Mirrored::Data { offset, len }) = (&mut self.regions, request) {
            for b in blocks(offset, len) {
                map.writing(b);
            }
        }
    }

    /// A copy holds a data request: its blocks of parity regions read from the mirrors now.
    pub(crate) fn held(&mut self, request: Mirrored) {
        if let (Some(map), Mirrored::Data { offset, len }) = (&mut self.regions, request) {
            for b in blocks(offset, len) {
                map.held(b);
            }
        }
    }

    /// Where `block` of a parity volume reads from, with the nodes whose copies are in sync
    /// (None: a mirror, which reads by [`ReadPlan`](crate::ReadPlan)).
    pub fn parity_read(&self, block: u64) -> Option<Result<ReadFrom, Unreadable>> {
        self.parity_read_avoiding(block, &[])
    }

    /// [`VolumeCore::parity_read`] without the nodes in `avoid` (a read from them just failed).
    pub fn parity_read_avoiding(
        &self,
        block: u64,
        avoid: &[u32],
    ) -> Option<Result<ReadFrom, Unreadable>> {
        let map = self.regions.as_ref()?;
        let up = |node: u32| {
            !avoid.contains(&node)
                && self
                    .slot_of(node)
                    .is_some_and(|i| self.set.state(i) == ReplicaState::InSync)
        };
        Some(map.read(block, up))
    }
}

/// What an encode needs next, as the core hands it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeAction {
    /// Hold the region's bytes through the write order first ([`Input::Hold`](crate::Input))
    /// and ask again with the place: the region is read, and its mirrors trimmed, with no
    /// request to it in flight. Without the hold, a write sent before the trim could land
    /// before it and be trimmed; and a discard sent as a trim before the encode began (no
    /// stripe beneath then) could land after the read, leaving the stripe with the bytes
    /// it discarded and no overlay to say so once the writer restarts (the simulator's
    /// `parity_steps` finds both).
    Hold {
        start: u64,
        end: u64,
    },
    Do(EncodeStep),
}

impl VolumeCore {
    /// Begins encoding `region` (a mirrored one into a stripe, or folding a parity one's
    /// overlay back): every node of the stripe must be in sync.
    pub fn encode_begin(&mut self, region: u64) -> Result<(), EncodeRefusal> {
        // By its copy not moved off: a node drained and back again has an old slot too.
        let up: Vec<u32> = (0..self.set.len())
            .filter(|&i| self.set.state(i) == ReplicaState::InSync)
            .map(|i| self.node(i))
            .collect();
        let map = self.regions.as_mut().ok_or(EncodeRefusal::NotParity)?;
        map.begin(region, |n| up.contains(&n))
    }

    /// What `region`'s encode needs done now; `place`: the place the executor holds for it.
    /// A trim handed out is fixed: asked again, the same blocks.
    pub fn encode_next(&mut self, region: u64, place: Option<Ticket>) -> Option<EncodeAction> {
        let next = self.encode_peek(region, place);
        if let (Some(EncodeAction::Do(EncodeStep::Free { .. })), Some(map)) =
            (&next, &mut self.regions)
        {
            map.fix_free(region);
        }
        next
    }

    /// What [`VolumeCore::encode_next`] would hand out now, without fixing a trim's blocks.
    pub fn encode_peek(&self, region: u64, place: Option<Ticket>) -> Option<EncodeAction> {
        let map = self.regions.as_ref()?;
        let step = map.step(region)?;
        if matches!(step, EncodeStep::Read { .. } | EncodeStep::Free { .. }) {
            let blocks = map.stripes().blocks_of(region);
            let (start, end) = (blocks.start * BLOCK, blocks.end * BLOCK);
            let holds = place.is_some_and(|p| {
                self.order.may_hold(p)
                    && self
                        .order
                        .range(p)
                        .is_some_and(|(a, b)| a <= start && end <= b)
            });
            if !holds {
                return Some(EncodeAction::Hold { start, end });
            }
        }
        Some(EncodeAction::Do(step))
    }

    /// The step [`VolumeCore::encode_next`] gave was carried out (`ok`) or failed. Before the
    /// switch, a node of the stripe out of sync fails it: the node may have lost its chunk.
    pub fn encode_answered(&mut self, region: u64, ok: bool) -> EncodeEnd {
        let all_in_sync = self.every_copy_in_sync();
        let Some(map) = &mut self.regions else {
            return EncodeEnd::Abandoned;
        };
        let before_switch = matches!(
            map.step(region),
            Some(EncodeStep::Read { .. } | EncodeStep::Write { .. } | EncodeStep::Flush { .. })
        );
        map.answered(region, ok && (all_in_sync || !before_switch))
    }

    /// Up to `most` regions for the encoder to take together ([`RegionMap::to_encode_batch`]).
    pub fn regions_to_encode(&self, heat: impl Fn(u64) -> u64, most: usize) -> Vec<u64> {
        let (Layout::Parity(p), Some(map)) = (self.layout, self.regions.as_ref()) else {
            return Vec::new();
        };
        map.to_encode_batch(p.mirror_share, heat, most)
    }

    /// Whether a parity volume's mirrored part is over its share by more than `headroom`
    /// percent of the volume (false for a mirror): how far busy writes may take it before
    /// the encoder goes on beside them (`client/src/encoder.rs`).
    pub fn mirrored_past(&self, headroom: u8) -> bool {
        let (Layout::Parity(p), Some(map)) = (self.layout, self.regions.as_ref()) else {
            return false;
        };
        map.mirrored_over(p.mirror_share.saturating_add(headroom))
    }

    /// The regions being encoded.
    pub fn encoding(&self) -> Vec<u64> {
        self.regions
            .as_ref()
            .map(|m| m.encoding().collect())
            .unwrap_or_default()
    }
}

fn blocks(offset: u64, len: u64) -> std::ops::Range<u64> {
    offset / BLOCK..(offset + len).div_ceil(BLOCK)
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
