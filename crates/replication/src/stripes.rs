//! Where a parity volume's bytes are (issue 67): which nodes hold a stripe, which regions are
//! mirrored and which are parity, where a write goes and how a block reads back, and the
//! encoder as a plan the executor carries out one step at a time.
//!
//! - **Geometry** ([`Stripes`]): K+M nodes; a region is one stripe of K data chunks of
//!   [`CHUNK_BLOCKS`] blocks. Chunk `c` of region `r` is on node `(r + c) mod (K+M)` of the
//!   list, so parity is spread over every node. A region's mirrored copies are on the nodes
//!   of its first M+1 chunks, so they rotate too.
//! - **Writes** always land on the mirrored copies, whatever the region: a hot write costs
//!   a mirror's write, never a read-modify-write of parity. A block of a parity region that
//!   the mirrors hold is *overlay*: newer than the stripe, read from the mirrors.
//! - **Overlay needs no record**: the mirrors' copies of a parity region are trimmed once its
//!   stripe is in place, so whatever they still hold is overlay. After a crash the overlay
//!   is what they hold ([`RegionMap::restore`]); the record names only each region's kind.
//!   That needs the nodes to say exactly which blocks they hold, which no store does yet
//!   (ARCHITECTURE.md, "The overlay after a crash").
//! - **Encoding** (a mirrored region into a stripe, or a parity region with its overlay into
//!   a new stripe, the fold-back): read, write the K+M chunks into the slot the map does not
//!   name, make them durable on all K+M nodes, switch the region in the record, trim the
//!   mirrors (and a fold-back's old stripe). Until the switch the old place serves every
//!   read; after it the new stripe does, and every block written meanwhile stays overlay. A
//!   crash anywhere loses nothing: before the switch the written slot is garbage no reader
//!   names, after it the untrimmed blocks are overlay that holds what the stripe holds, and
//!   an untrimmed old stripe is garbage again (only space, until the next fold-back
//!   overwrites it).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{candidates, NodeLoad, Parity, PlacementError};

// The encode plan: its steps, phases and answers.
#[path = "stripes_encode.rs"]
mod encode;
use encode::Encode;
pub use encode::{EncodeEnd, EncodeRefusal, EncodeStep};

/// Blocks of 4 KiB per chunk: 256 KiB, so a 4+2 stripe holds 1 MiB of data, the size the
/// codec benchmark measured (18 GB/s a core). A degraded read rebuilds only the blocks it
/// reads (Reed-Solomon codes each byte position alone), so the chunk size does not make
/// small reads dearer; it sets how much an encode moves at once.
pub const CHUNK_BLOCKS: u64 = 64;

/// Chooses the K+M nodes of a parity volume, least loaded first. When nodes name zones, no
/// zone gets more than M chunks of a stripe, so a lost zone loses nothing; if that cannot
/// be done the volume is refused, not placed weaker than it says. Deterministic.
pub fn place_stripe(
    nodes: &[NodeLoad],
    data: usize,
    parity: usize,
) -> Result<Vec<u32>, PlacementError> {
    let width = data + parity;
    let c = candidates(nodes);
    if c.len() < width {
        return Err(PlacementError::NotEnoughNodes {
            replicas: width,
            nodes: c.len(),
        });
    }
    let zoned = c.iter().any(|n| n.zone.is_some());
    let cap = if zoned { parity.max(1) } else { width };
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(width);
    for n in &c {
        if out.len() == width {
            break;
        }
        if let Some(z) = n.zone.as_deref() {
            let used = per_zone.entry(z).or_default();
            if *used == cap {
                continue;
            }
            *used += 1;
        }
        out.push(n.node);
    }
    if out.len() < width {
        let zones = c.iter().filter(|n| n.zone.is_none()).count()
            + c.iter()
                .filter_map(|n| n.zone.as_deref())
                .collect::<BTreeSet<_>>()
                .len();
        return Err(PlacementError::TooFewZones {
            data,
            parity,
            need: width.div_ceil(cap),
            zones,
        });
    }
    out.sort_unstable();
    Ok(out)
}

/// A parity volume's geometry (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stripes {
    pub data: usize,
    pub parity: usize,
    /// 4 KiB blocks per chunk.
    pub chunk_blocks: u64,
    /// The K+M nodes, in chunk order for region 0.
    pub nodes: Vec<u32>,
}

impl Stripes {
    /// The geometry of `parity` over `nodes` (K+M distinct ones), in chunk order: as the
    /// volume's record lists them. [`place_stripe`] gives them sorted; a replaced copy's new
    /// node takes the old one's place in the list ([`RegionMap::replace_node`]), so no
    /// other node's chunks move.
    pub fn new(parity: &Parity, nodes: Vec<u32>) -> Result<Stripes, PlacementError> {
        let (k, m) = (usize::from(parity.data), usize::from(parity.parity));
        let mut distinct = nodes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != k + m || nodes.len() != k + m {
            return Err(PlacementError::NotEnoughNodes {
                replicas: k + m,
                nodes: distinct.len(),
            });
        }
        Ok(Stripes {
            data: k,
            parity: m,
            chunk_blocks: CHUNK_BLOCKS,
            nodes,
        })
    }

    pub fn width(&self) -> usize {
        self.data + self.parity
    }

    /// Blocks of data in a region (one stripe).
    pub fn region_blocks(&self) -> u64 {
        self.chunk_blocks * self.data as u64
    }

    pub fn region_of(&self, block: u64) -> u64 {
        block / self.region_blocks()
    }

    /// The region's blocks.
    pub fn blocks_of(&self, region: u64) -> std::ops::Range<u64> {
        let rb = self.region_blocks();
        region * rb..(region + 1) * rb
    }

    /// The data chunk a block is in, and its block within the chunk.
    pub fn chunk_of(&self, block: u64) -> (usize, u64) {
        let i = block % self.region_blocks();
        ((i / self.chunk_blocks) as usize, i % self.chunk_blocks)
    }

    /// The node that holds chunk `chunk` (data `0..K`, parity `K..K+M`) of `region`.
    pub fn node_of(&self, region: u64, chunk: usize) -> u32 {
        let w = self.width();
        self.nodes[((region % w as u64) as usize + chunk) % w]
    }

    /// The M+1 nodes that keep `region`'s mirrored copies: those of its first M+1 chunks, so
    /// they rotate with the chunks and hot writes spread over every node.
    pub fn mirrors_of(&self, region: u64) -> Vec<u32> {
        (0..=self.parity).map(|c| self.node_of(region, c)).collect()
    }

    /// Whether `node` keeps one of `region`'s mirrored copies ([`Stripes::mirrors_of`],
    /// without building the list).
    pub fn mirrors(&self, region: u64, node: u32) -> bool {
        (0..=self.parity).any(|c| self.node_of(region, c) == node)
    }

    /// Blocks a region takes on each node's replica (see [`Stripes::node_block`]).
    pub fn stride_blocks(&self) -> u64 {
        self.region_blocks() + CHUNK_SLOTS * self.chunk_blocks
    }

    /// Where a volume block is on a replica of the volume: every node's replica keeps, per
    /// region, room for its mirrored blocks and then for its two chunk slots. Only the
    /// region's M+1 mirrors write the first part and only one slot holds a chunk, so the
    /// rest are holes in a sparse file; in exchange a block is at the same place on every
    /// node, one request header serves all its targets, and a resync copies a range to the
    /// same range.
    pub fn node_block(&self, block: u64) -> u64 {
        let (r, i) = (self.region_of(block), block % self.region_blocks());
        r * self.stride_blocks() + i
    }

    /// The volume block at block `b` of a node's replica, if `b` is in a region's mirrored
    /// part (not a chunk slot): the inverse of [`Stripes::node_block`].
    pub fn volume_block(&self, b: u64) -> Option<u64> {
        let (r, i) = (b / self.stride_blocks(), b % self.stride_blocks());
        (i < self.region_blocks()).then(|| r * self.region_blocks() + i)
    }

    /// Where block `at.block` of chunk `at` is on its node's replica.
    pub fn chunk_block(&self, at: &ChunkAt) -> u64 {
        at.region * self.stride_blocks()
            + self.region_blocks()
            + u64::from(at.slot) * self.chunk_blocks
            + at.block
    }

    /// The size of each node's replica for a volume of `blocks` blocks, in blocks.
    pub fn replica_blocks(&self, blocks: u64) -> u64 {
        blocks.div_ceil(self.region_blocks()) * self.stride_blocks()
    }
}

/// Chunk slots per region on a node: the stripe that serves reads and the one an encode
/// writes before its switch.
pub const CHUNK_SLOTS: u64 = 2;

/// What a region is, as the record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Region {
    /// Every block on the mirrored copies.
    Mirror,
    /// A stripe in chunk slot `slot` (0 or 1) of its nodes, under the overlay.
    Parity { slot: u8 },
}

/// One chunk's blocks on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkAt {
    pub node: u32,
    pub region: u64,
    pub slot: u8,
    /// `0..K` data, `K..K+M` parity.
    pub chunk: usize,
    /// The block within the chunk.
    pub block: u64,
}

/// Where a block reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadFrom {
    /// Any of these mirrored copies (the ones up, in order).
    Mirror(Vec<u32>),
    /// Its data chunk.
    Chunk(ChunkAt),
    /// Rebuilt from these K chunks at the same block (data chunk `lost` is down).
    Rebuild { lost: usize, from: Vec<ChunkAt> },
}

/// Why a block cannot be read: more nodes are down than the layout survives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("none of the mirrored copies is up")]
    NoMirror,
    #[error("{up} chunks of the stripe are up, fewer than the {need} it takes")]
    TooFewChunks { up: usize, need: usize },
}

/// Where a discard goes: a trim where nothing is beneath the mirrors, zeroes where a stripe
/// (or one being made) is: a trimmed block of a parity region would read the stripe's
/// older data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discard {
    Trim(Vec<u32>),
    Zero(Vec<u32>),
}

/// A parity volume's regions and the encodes in flight (see the module docs).
#[derive(Debug, Clone)]
pub struct RegionMap {
    stripes: Stripes,
    /// As the record says.
    regions: Vec<Region>,
    /// Blocks of parity regions the mirrors hold (rebuilt from them after a restart).
    overlay: BTreeSet<u64>,
    encodes: BTreeMap<u64, Encode>,
    /// A self-test's broken encoder: switches and trims before the stripe is durable.
    #[cfg(test)]
    pub(crate) unsafe_order: bool,
}

impl RegionMap {
    /// A new volume of `blocks` blocks: every region mirrored.
    pub fn new(stripes: Stripes, blocks: u64) -> RegionMap {
        let n = blocks.div_ceil(stripes.region_blocks()) as usize;
        Self::restore(stripes, vec![Region::Mirror; n], [])
    }

    /// The map after a restart: the regions as recorded, and the blocks the mirrored copies
    /// hold (those in parity regions are the overlay).
    pub fn restore(
        stripes: Stripes,
        regions: Vec<Region>,
        held: impl IntoIterator<Item = u64>,
    ) -> RegionMap {
        let mut map = RegionMap {
            stripes,
            regions,
            overlay: BTreeSet::new(),
            encodes: BTreeMap::new(),
            #[cfg(test)]
            unsafe_order: false,
        };
        map.overlay = held
            .into_iter()
            .filter(|&b| matches!(map.region(b), Some(Region::Parity { .. })))
            .collect();
        map
    }

    pub fn stripes(&self) -> &Stripes {
        &self.stripes
    }

    /// The regions, as the record keeps them.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    fn region(&self, block: u64) -> Option<Region> {
        let r = self.stripes.region_of(block);
        self.regions.get(r as usize).copied()
    }

    /// The overlay's blocks in `region` (volume blocks, ascending): what its mirrors must
    /// hold while it is in parity.
    pub fn overlay_in(&self, region: u64) -> Vec<u64> {
        self.overlay
            .range(self.stripes.blocks_of(region))
            .copied()
            .collect()
    }

    /// Blocks in the overlay: kept on M+1 mirrors over a stripe, within the mirrored share.
    pub fn overlay_len(&self) -> u64 {
        self.overlay.len() as u64
    }

    /// Whether the nodes `up` says are up serve every region: a mirror of each (its
    /// mirrored part or its overlay), and K chunks of each region in parity.
    pub fn servable(&self, up: impl Fn(u32) -> bool) -> bool {
        let s = &self.stripes;
        self.regions.iter().enumerate().all(|(r, region)| {
            let r = r as u64;
            let chunks = (0..s.width()).filter(|&c| up(s.node_of(r, c))).count();
            s.mirrors_of(r).into_iter().any(&up) && (*region == Region::Mirror || chunks >= s.data)
        })
    }

    /// The region the encoder should take next, by `heat` (a region's recent writes, as the
    /// writer counts them). The mirrored share is a budget of blocks: the mirrored regions'
    /// and the overlay's (both are M+1 copies). While they are over `share` percent of the
    /// volume, the coldest of the mirrored regions and of the parity regions with overlay:
    /// a mirrored one is encoded, a parity one folded back; among equals, the one that
    /// frees the most, then the lower. None: within the budget, nothing to do.
    ///
    /// An overlay within the budget stays: a hot set over data in parity (`-rdpct` over a
    /// volume filled in order) is overwritten in place at a mirror's speed, where folding it
    /// back would trim it and the next write would allocate its blocks again. Regions being
    /// encoded are not offered again.
    pub fn to_encode(&self, share: u8, heat: impl Fn(u64) -> u64) -> Option<u64> {
        self.to_encode_batch(share, heat, 1).pop()
    }

    /// Up to `most` regions to encode together, in the order [`RegionMap::to_encode`] would
    /// take them one at a time, each counted as freed before the next is chosen. Begun only
    /// over the budget, a batch goes on to a sixteenth under it (when that is a region or
    /// more): at the budget's edge, where writes push the share over a few blocks at a
    /// time, it would otherwise be one region at a time, each with a flush of its own.
    pub fn to_encode_batch(&self, share: u8, heat: impl Fn(u64) -> u64, most: usize) -> Vec<u64> {
        let rb = self.stripes.region_blocks();
        let mirrored = self.mirrored_by_region();
        let budget = self.percent_of_volume(share);
        let mut over = mirrored.values().sum::<u64>();
        if over <= budget {
            return Vec::new();
        }
        let mut order: Vec<(u64, u64)> = mirrored
            .into_iter()
            .filter(|(r, _)| !self.encodes.contains_key(r))
            .collect();
        order.sort_by_cached_key(|&(r, n)| (heat(r), std::cmp::Reverse(n), r));
        let mut batch = Vec::new();
        // Not in a volume too small for a sixteenth to be a region: it would take one more.
        let low = if budget / 16 >= rb {
            budget - budget / 16
        } else {
            budget
        };
        for (r, n) in order {
            if over <= low || batch.len() >= most {
                break;
            }
            batch.push(r);
            over -= n;
        }
        batch
    }

    /// Blocks on M+1 mirrored copies, by region: a mirrored region's all, a parity region's
    /// overlay.
    fn mirrored_by_region(&self) -> BTreeMap<u64, u64> {
        let rb = self.stripes.region_blocks();
        let mut mirrored: BTreeMap<u64, u64> = BTreeMap::new();
        for (r, kind) in self.regions.iter().enumerate() {
            if *kind == Region::Mirror {
                mirrored.insert(r as u64, rb);
            }
        }
        for &b in &self.overlay {
            *mirrored.entry(self.stripes.region_of(b)).or_default() += 1;
        }
        mirrored
    }

    /// `percent` of the volume, in blocks.
    fn percent_of_volume(&self, percent: u8) -> u64 {
        let total = self.stripes.region_blocks() * self.regions.len() as u64;
        total * u64::from(percent.min(100)) / 100
    }

    /// Whether the mirrored part (mirrored regions and overlay, as
    /// [`RegionMap::to_encode_batch`] counts it) is over `percent` of the volume.
    pub fn mirrored_over(&self, percent: u8) -> bool {
        let mirrored = self
            .regions
            .iter()
            .filter(|k| **k == Region::Mirror)
            .count() as u64
            * self.stripes.region_blocks()
            + self.overlay_len();
        mirrored > self.percent_of_volume(percent)
    }

    /// A write of `block`: to its region's mirrored copies, always.
    pub fn write(&mut self, block: u64) -> Vec<u32> {
        self.held(block);
        self.stripes.mirrors_of(self.stripes.region_of(block))
    }

    /// A copy holds a write of `block`: of a parity region, it is overlay now.
    pub fn held(&mut self, block: u64) {
        self.wrote(block);
        if let Some(Region::Parity { .. }) = self.region(block) {
            self.overlay.insert(block);
        }
    }

    /// A write of `block` is on its way: an encode of its region must not free it. (Its
    /// overlay bit waits for [`RegionMap::held`], once a copy holds it.)
    pub fn writing(&mut self, block: u64) {
        self.wrote(block);
    }

    fn wrote(&mut self, block: u64) {
        let r = self.stripes.region_of(block);
        if let Some(e) = self.encodes.get_mut(&r) {
            e.written.insert(block);
        }
    }

    /// Whether a stripe is beneath `block`, or one is being made: a discard of it writes
    /// zeroes (see [`Discard`]).
    pub fn beneath(&self, block: u64) -> bool {
        let r = self.stripes.region_of(block);
        self.encodes.contains_key(&r) || matches!(self.region(block), Some(Region::Parity { .. }))
    }

    /// A discard of `block` (see [`Discard`]).
    pub fn discard(&mut self, block: u64) -> Discard {
        let beneath = self.beneath(block);
        let nodes = self.write(block);
        match beneath {
            true => Discard::Zero(nodes),
            false => {
                self.overlay.remove(&block);
                Discard::Trim(nodes)
            }
        }
    }

    /// Where `block` reads from, with the nodes `up` says are up.
    pub fn read(&self, block: u64, up: impl Fn(u32) -> bool) -> Result<ReadFrom, Unreadable> {
        let s = &self.stripes;
        let region = s.region_of(block);
        let slot = match self.region(block) {
            Some(Region::Parity { slot })
                if !self.overlay.contains(&block) || self.being_freed(block) =>
            {
                slot
            }
            _ => {
                let mut nodes = s.mirrors_of(region);
                nodes.retain(|&n| up(n));
                return match nodes.is_empty() {
                    true => Err(Unreadable::NoMirror),
                    false => Ok(ReadFrom::Mirror(nodes)),
                };
            }
        };
        let (chunk, at) = s.chunk_of(block);
        let chunk_at = |c: usize| ChunkAt {
            node: s.node_of(region, c),
            region,
            slot,
            chunk: c,
            block: at,
        };
        let own = chunk_at(chunk);
        if up(own.node) {
            return Ok(ReadFrom::Chunk(own));
        }
        let from = self.others(chunk, chunk_at, up)?;
        Ok(ReadFrom::Rebuild { lost: chunk, from })
    }

    /// Whether `block` is in a trim handed out: it reads from the stripe, which holds it, so
    /// that a read planned from now on never reaches a copy the trim may have emptied. (An
    /// executor lets the reads planned before the trim end before it sends it.)
    fn being_freed(&self, block: u64) -> bool {
        let r = self.stripes.region_of(block);
        self.encodes
            .get(&r)
            .and_then(|e| e.freeing.as_ref())
            .is_some_and(|f| f.binary_search(&block).is_ok())
    }

    /// K chunks of a stripe besides chunk `own`, on nodes `up` says are up, as `at` places them.
    fn others(
        &self,
        own: usize,
        at: impl Fn(usize) -> ChunkAt,
        up: impl Fn(u32) -> bool,
    ) -> Result<Vec<ChunkAt>, Unreadable> {
        let s = &self.stripes;
        let from: Vec<ChunkAt> = (0..s.width())
            .filter(|&c| c != own)
            .map(at)
            .filter(|c| up(c.node))
            .take(s.data)
            .collect();
        match from.len() < s.data {
            true => Err(Unreadable::TooFewChunks {
                up: from.len(),
                need: s.data,
            }),
            false => Ok(from),
        }
    }

    /// Node `node`'s chunk of every parity region, each with K chunks on nodes `up` says are
    /// up to rebuild it from.
    pub fn chunks_of(
        &self,
        node: u32,
        up: impl Fn(u32) -> bool,
    ) -> Result<Vec<crate::ChunkRebuild>, Unreadable> {
        let s = &self.stripes;
        let Some(pos) = s.nodes.iter().position(|&n| n == node) else {
            return Ok(Vec::new());
        };
        let width = s.width();
        let mut out = Vec::new();
        for (r, region) in self.regions.iter().enumerate() {
            let Region::Parity { slot } = *region else {
                continue;
            };
            let region = r as u64;
            let at = |c: usize| ChunkAt {
                node: s.node_of(region, c),
                region,
                slot,
                chunk: c,
                block: 0,
            };
            let own = (pos + width - (r % width)) % width;
            let from = self.others(own, at, &up)?;
            out.push(crate::ChunkRebuild { to: at(own), from });
        }
        Ok(out)
    }

    /// The copy on `from` gives its place to one on `to`: the chunks and mirrored parts
    /// `from` kept are `to`'s from now on (its resync rebuilds them), and no other node's
    /// place changes. Encodes not at their switch are abandoned (their chunks were to go to
    /// `from`). False if `from` has no place.
    pub fn replace_node(&mut self, from: u32, to: u32) -> bool {
        let Some(at) = self.stripes.nodes.iter().position(|&n| n == from) else {
            return false;
        };
        self.abandon_unswitched();
        self.stripes.nodes[at] = to;
        true
    }
}

#[cfg(test)]
#[path = "stripes_tests.rs"]
mod tests;
