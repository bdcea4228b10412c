//! What a returning node of a parity volume gets back, as the core says it.
//!
//! - Its mirrored copies: a block of a region it mirrors comes from another copy of that region
//!   in sync (holding the block or not: one that does not hold it says the block is trimmed).
//!   Incrementally, only the blocks the survivors marked while it was out; otherwise every
//!   block of every region it mirrors. Each copy holds the block's range in the write order,
//!   as a mirror's resync does.
//! - Its chunks: unchanged while it was out (an encode needs every node in sync), so an
//!   incremental resync has none to rebuild. A node that lost its data (another incarnation)
//!   gets each of its chunks of a parity region rebuilt from K chunks in sync.

use crate::{ChunkAt, ReplicaState, Unreadable, VolumeCore};

/// Where a parity volume's resync of one replica gets one block's mirrored copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorCopy {
    /// The replica does not mirror the block's region: nothing to copy.
    NotMirrored,
    /// From this replica, a copy of the region in sync.
    From(usize),
    /// No copy of the region is in sync.
    NoSource,
}

/// One chunk of a returning node to rebuild, and the K chunks in sync it is rebuilt from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRebuild {
    pub to: ChunkAt,
    pub from: Vec<ChunkAt>,
}

impl VolumeCore {
    pub(crate) fn in_sync_node(&self, node: u32) -> bool {
        self.slot_of(node)
            .is_some_and(|i| self.set.state(i) == ReplicaState::InSync)
    }

    /// Where replica `target`'s resync gets `block` (None: a mirror volume, which copies from
    /// any copy in sync).
    pub fn parity_copy_source(&self, block: u64, target: usize) -> Option<MirrorCopy> {
        let map = self.regions.as_ref()?;
        let s = map.stripes();
        let mirrors = s.mirrors_of(s.region_of(block));
        let place = self.place_node(target);
        if !mirrors.contains(&place) {
            return Some(MirrorCopy::NotMirrored);
        }
        // A follower's place node is a source like any other mirror in sync; a returning
        // copy's is itself.
        Some(
            mirrors
                .iter()
                .filter(|&&n| n != self.node(target) && self.in_sync_node(n))
                .find_map(|&n| self.slot_of(n))
                .map_or(MirrorCopy::NoSource, MirrorCopy::From),
        )
    }

    /// Whether the copies in sync other than `out` serve every region of a parity volume
    /// (always, for a mirror volume: any copy in sync serves all of it), and are K at least,
    /// the take-out's floor: fewer could rebuild no chunk, so a copy out could never come
    /// back (with every region still mirrored, a mirror of each may be enough to serve).
    pub fn serves_without(&self, out: &[usize]) -> bool {
        let Some(map) = self.regions.as_ref() else {
            return true;
        };
        let left = (0..self.set.len())
            .filter(|i| !out.contains(i) && self.set.state(*i) == ReplicaState::InSync)
            .count();
        left >= map.stripes().data
            && map.servable(|n| {
                self.slot_of(n)
                    .is_some_and(|i| !out.contains(&i) && self.set.state(i) == ReplicaState::InSync)
            })
    }

    /// The chunks of replica `target` that a full resync rebuilds: its chunk of every parity
    /// region, each from K chunks in sync (empty: a mirror volume).
    pub fn parity_rebuilds(&self, target: usize) -> Result<Vec<ChunkRebuild>, Unreadable> {
        let Some(map) = self.regions.as_ref() else {
            return Ok(Vec::new());
        };
        map.chunks_of(self.place_node(target), |n| self.in_sync_node(n))
    }
}
