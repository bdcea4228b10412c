//! A parity volume attached again (issue 67): its regions come from the record, and the
//! overlay of its parity regions from the nodes' held maps (`node/src/held.rs`).
//!
//! - A block of a parity region that **every** in-sync copy of its region's mirrors holds
//!   is overlay: it reads from the mirrors.
//! - One that only **some** hold was written (or trimmed) by a request no copy set finished:
//!   never acknowledged. It is trimmed on the copies that hold it, so all agree, and it reads
//!   the stripe (its bytes from before that request).
//! - A block no copy holds reads the stripe.
//!
//! The writer asks before it serves any request, with every copy attached at its epoch.

use std::collections::BTreeMap;

use bytes::Bytes;
use trireme_proto::{Op, Status, FLAG_MAY_TRIM, MAX_HELD_QUERY};
use trireme_replication::{Region, Stripes};

use crate::{Volume, VolumeError};

const BLOCK: u64 = 4096;

impl Volume {
    /// Restores the regions recorded and the overlay (see the module docs): once, at
    /// attach, before any request.
    pub(crate) async fn restore_overlay(&self) -> Result<(), VolumeError> {
        if self.parity.is_none() {
            return Ok(());
        }
        let recorded = self.info.regions.clone();
        // Its length was checked when the core was made (`parity::core_of`).
        let stripes = &self.stripes();
        // Per block of a parity region: the slots whose copies hold it.
        let mut holders: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for i in self.in_sync() {
            for block in self.held_on(i, stripes, &recorded).await? {
                holders.entry(block).or_default().push(i);
            }
        }
        let mut overlay = Vec::new();
        let mut trims: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let in_sync = self.in_sync();
        for (block, slots) in holders {
            let region = stripes.region_of(block);
            let mut mirrors = in_sync
                .iter()
                .filter(|&&i| stripes.mirrors(region, self.node(i)));
            if mirrors.all(|m| slots.contains(m)) {
                overlay.push(block);
            } else {
                for i in slots {
                    trims.entry(i).or_default().push(block);
                }
            }
        }
        for (i, blocks) in &trims {
            self.trim_blocks(*i, stripes, blocks).await?;
        }
        tracing::info!(
            volume = %self.info.name,
            parity_regions = recorded.iter().filter(|r| **r != Region::Mirror).count(),
            overlay = overlay.len(),
            trimmed = trims.values().map(Vec::len).sum::<usize>(),
            "parity overlay restored from the nodes' held maps"
        );
        self.core()
            .restore_regions(&recorded, overlay)
            .map_err(|source| VolumeError::Layout {
                volume: self.info.name.clone(),
                source,
            })
    }

    /// The slots of the in-sync copies among `region`'s mirrors.
    pub(crate) fn in_sync_mirrors(&self, stripes: &Stripes, region: u64) -> Vec<usize> {
        let mirrors = stripes.mirrors_of(region);
        self.in_sync()
            .into_iter()
            .filter(|&i| mirrors.contains(&self.node(i)))
            .collect()
    }

    /// The volume blocks of parity regions mirrored on slot `i`'s node that its copy holds.
    async fn held_on(
        &self,
        i: usize,
        stripes: &Stripes,
        recorded: &[Region],
    ) -> Result<Vec<u64>, VolumeError> {
        let node = self.node(i);
        let stride = stripes.stride_blocks() * BLOCK;
        let mut out = Vec::new();
        for (first, end) in parity_runs(recorded) {
            // The node's bytes of regions `first..end`, in queries it takes.
            let (mut at, stop) = (first * stride, end * stride);
            while at < stop {
                let len = (stop - at).min(MAX_HELD_QUERY / stride * stride);
                for (start, n) in self.ask_held(i, at, len).await? {
                    out.extend(
                        (start / BLOCK..(start + n) / BLOCK)
                            .filter_map(|b| stripes.volume_block(b))
                            .filter(|&b| stripes.mirrors(stripes.region_of(b), node)),
                    );
                }
                at += len;
            }
        }
        Ok(out)
    }

    /// One `Held` query to slot `i`: the held byte ranges of the node's `[at, at + len)`.
    pub(crate) async fn ask_held(
        &self,
        i: usize,
        at: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, VolumeError> {
        let h = self.header(Op::Held, at, len);
        let reply = self.call_each(&[i], h, Bytes::new()).await.remove(0)?;
        let f = match self.expect_ok(i, reply) {
            Err(VolumeError::Replica {
                status: Status::Unsupported,
                message,
                ..
            }) => {
                return Err(VolumeError::Protocol {
                    node: self.node(i),
                    what: format!("its copy cannot say which blocks it holds: {message}"),
                })
            }
            other => other?,
        };
        let extents = trireme_proto::decode_extents_within(&f.payload, len).map_err(|e| {
            VolumeError::Protocol {
                node: self.node(i),
                what: format!("held map answer: {e}"),
            }
        })?;
        Ok(trireme_proto::data_ranges(&extents, at))
    }

    /// Trims `blocks` (volume blocks, ascending) on slot `i`'s copy, in runs.
    pub(crate) async fn trim_blocks(
        &self,
        i: usize,
        stripes: &Stripes,
        blocks: &[u64],
    ) -> Result<(), VolumeError> {
        for (first, n) in runs_within_regions(stripes, blocks) {
            let mut h = self.header(
                Op::WriteZeroes,
                stripes.node_block(first) * BLOCK,
                n * BLOCK,
            );
            h.flags |= FLAG_MAY_TRIM;
            if let Some((_, e)) = self.to_each(&[i], h).await.pop() {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// The runs of consecutive parity regions in `recorded`, as `[first, end)`.
fn parity_runs(recorded: &[Region]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (r, kind) in recorded.iter().enumerate() {
        let r = r as u64;
        if *kind == Region::Mirror {
            continue;
        }
        match out.last_mut() {
            Some((_, end)) if *end == r => *end += 1,
            _ => out.push((r, r + 1)),
        }
    }
    out
}

/// `blocks` (ascending) as runs of consecutive blocks, none crossing a region's end (a run
/// is consecutive on the node too).
fn runs_within_regions(stripes: &Stripes, blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((s, n)) if *s + *n == b && stripes.region_of(b) == stripes.region_of(*s) => {
                *n += 1
            }
            _ => out.push((b, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_blocks_map_back_to_volume_blocks_and_runs_stop_at_region_ends() {
        let p = trireme_replication::Parity::parse("2+1", None).unwrap();
        let s = Stripes::new(&p, vec![1, 2, 3]).unwrap();
        let rb = s.region_blocks();
        for b in [0, 1, rb - 1, rb, 5 * rb + 7] {
            assert_eq!(s.volume_block(s.node_block(b)), Some(b));
        }
        assert_eq!(s.volume_block(rb), None, "region 0's first chunk slot");
        assert_eq!(s.volume_block(s.stride_blocks() - 1), None);
        assert_eq!(
            runs_within_regions(&s, &[1, 2, rb - 1, rb, rb + 1, rb + 5]),
            vec![(1, 2), (rb - 1, 1), (rb, 2), (rb + 5, 1)]
        );
        let m = Region::Mirror;
        let q = Region::Parity { slot: 0 };
        assert_eq!(parity_runs(&[m, q, q, m, q]), vec![(1, 3), (4, 5)]);
        assert!(parity_runs(&[]).is_empty());
    }
}
