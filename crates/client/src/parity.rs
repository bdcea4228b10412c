//! A parity volume's data path (issue 67): the core says where each request and block goes
//! (`trireme_replication::routes`); this file sends them.
//!
//! - **Places on the nodes.** Every node's replica keeps, per region, its mirrored blocks
//!   and two chunk slots ([`Stripes::node_block`]): a request's offset is the volume's,
//!   translated once for all its targets ([`Volume::on_node`]).
//! - **Writes** are split at region ends (the core refuses one that crosses) and go to the
//!   region's mirrors as a mirror's do. Only whole 4 KiB blocks: a partial block of a parity
//!   region would land beside the mirrors' empty space, not the stripe's bytes, and merging
//!   them in the writer would race with the block's other writes. (An export of a parity
//!   volume must say 4 KiB is its smallest block; none serves one yet.)
//! - **Reads** ask the core, in one visit, where each block is: its mirrors, its chunk, or K
//!   other chunks to rebuild it from (Reed-Solomon codes each byte position alone, so a
//!   rebuild reads only the bytes asked for, at the same place in K chunks). A node that
//!   fails a read is avoided and the run planned again: a mirror falls over to the next
//!   copy, a chunk to a rebuild.
//! - **Reads and the encoder.** A read holds the read gate from its plan to its answer. The
//!   encoder writes a chunk slot no reader is sent to now, and trims mirrored blocks that
//!   read from the new stripe once the trim is handed out; but a read planned before may
//!   still be on its way there, so the encoder waits for the gate before either. Without
//!   the wait, `io_during_encodes_reads_the_last_write` (4 streams a node) read zeroes
//!   from a mirror trimmed under the read in every run.

use bytes::{Bytes, BytesMut};
use trireme_erasure::{Codec, ReedSolomon};
use trireme_proto::{Header, Op};
use trireme_replication::{ChunkAt, ReadFrom, Stripes};

use crate::{Volume, VolumeError};

/// Bytes per block.
const BLOCK: u64 = 4096;

/// What a parity volume's writer keeps beside its core: the geometry, fixed at attach, and
/// the codec.
#[derive(Debug)]
pub(crate) struct ParityIo {
    /// Sizes and places on a node's copy only: which node keeps a chunk or a region's
    /// mirrors is the core's ([`Volume::stripes`]), since a copy may be replaced.
    pub(crate) stripes: Stripes,
    pub(crate) codec: ReedSolomon,
}

impl ParityIo {
    pub(crate) fn new(stripes: Stripes) -> Result<ParityIo, trireme_erasure::CodecError> {
        let codec = ReedSolomon::new(stripes.data, stripes.parity)?;
        Ok(ParityIo { stripes, codec })
    }

    /// The activity table of a volume of `size` bytes: at its blocks' places on the nodes,
    /// where the nodes' logs are (`activity.rs`).
    pub(crate) fn activity(&self, size: u64, extent: u64) -> crate::activity::Activity {
        let s = &self.stripes;
        let places = crate::activity::Places {
            region: s.region_blocks() * BLOCK,
            stride: s.stride_blocks() * BLOCK,
        };
        let copy = s.replica_blocks(size.div_ceil(BLOCK)) * BLOCK;
        crate::activity::Activity::new(copy, extent, Some(places))
    }
}

/// A run of blocks that read from one place: `[start, start + len)` of the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    from: ReadFrom,
    start: u64,
    len: u64,
}

impl Run {
    /// Whether block `b`'s place `from` continues this run.
    fn continues(&self, from: &ReadFrom) -> bool {
        let next = |a: &ChunkAt, b: &ChunkAt| {
            a.node == b.node
                && a.region == b.region
                && a.slot == b.slot
                && a.chunk == b.chunk
                && b.block == a.block + self.blocks()
        };
        match (&self.from, from) {
            (ReadFrom::Mirror(a), ReadFrom::Mirror(b)) => a == b,
            (ReadFrom::Chunk(a), ReadFrom::Chunk(b)) => next(a, b),
            (ReadFrom::Rebuild { lost: l, from: a }, ReadFrom::Rebuild { lost: m, from: b }) => {
                l == m
                    && a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| x.chunk == y.chunk && next(x, y))
            }
            _ => false,
        }
    }

    /// Blocks the run has begun in so far (its first block and the whole ones after it).
    fn blocks(&self) -> u64 {
        (self.start % BLOCK + self.len).div_ceil(BLOCK)
    }
}

impl Volume {
    /// A parity volume's data request `h` as its targets see it: at its place in their
    /// replicas. Anything else is sent as it is.
    pub(crate) fn on_node(&self, h: Header) -> Header {
        match h.op {
            Op::Write | Op::WriteZeroes | Op::Read => self.node_range(h),
            _ => h,
        }
    }

    /// The stripes' geometry and which node keeps what, as the core holds them now (a
    /// moved copy's new node takes the old one's place: [`Volume::promote_replica`]). Ask
    /// this, not [`ParityIo`]'s geometry, for nodes.
    pub(crate) fn stripes(&self) -> Stripes {
        self.core()
            .region_map()
            .expect("a parity volume")
            .stripes()
            .clone()
    }

    /// A parity volume's overlay, in blocks (`RegionMap::overlay_len`); None for a mirror.
    pub fn overlay_blocks(&self) -> Option<u64> {
        self.core().region_map().map(|m| m.overlay_len())
    }

    /// Whether a parity volume's mirrored part (regions and overlay) is over its share, with
    /// regions for the encoder to take (false for a mirror). Idle and in sync, its encoder
    /// brings it under within a batch or two.
    pub fn over_share(&self) -> bool {
        !self.core().regions_to_encode(|_| 0, 1).is_empty()
    }

    /// The regions being encoded now.
    pub fn encoding(&self) -> Vec<u64> {
        self.core().encoding()
    }

    /// As [`Volume::on_node`] for any request over a range within one region.
    pub(crate) fn node_range(&self, mut h: Header) -> Header {
        if let Some(p) = &self.parity {
            h.offset = p.stripes.node_block(h.offset / BLOCK) * BLOCK + h.offset % BLOCK;
        }
        h
    }

    /// The smallest request it takes whole: 4096 bytes for a parity volume (part blocks are
    /// refused, `Volume::check_blocks`), 1 for a mirror.
    pub fn min_block(&self) -> u32 {
        match self.parity {
            Some(_) => BLOCK as u32,
            None => 1,
        }
    }

    /// Refuses `what` on a parity volume: it copies or compares a mirror's ranges between
    /// copies, and a parity volume's copies differ by node (its chunks, the regions it
    /// mirrors).
    pub(crate) fn mirror_only(&self, what: &'static str) -> Result<(), VolumeError> {
        match self.parity {
            Some(_) => Err(VolumeError::Layout {
                volume: self.info.name.clone(),
                source: trireme_replication::LayoutError::NotBuilt(what),
            }),
            None => Ok(()),
        }
    }

    /// The size of each copy of a volume of `size` bytes: the same for a mirror; for parity,
    /// every region's stride ([`Stripes::replica_blocks`]).
    pub(crate) fn replica_size(&self, size: u64) -> u64 {
        match &self.parity {
            Some(p) => p.stripes.replica_blocks(size.div_ceil(BLOCK)) * BLOCK,
            None => size,
        }
    }

    /// Where a data request over `[offset, offset + len)` must be cut: at region ends.
    pub(crate) fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let Some(p) = &self.parity else {
            return vec![(offset, len)];
        };
        let region = p.stripes.region_blocks() * BLOCK;
        let (mut at, end) = (offset, offset + len);
        let mut out = Vec::new();
        while at < end {
            let cut = ((at / region + 1) * region).min(end);
            out.push((at, cut - at));
            at = cut;
        }
        out
    }

    /// Refuses a data request of a parity volume that is not in whole blocks.
    pub(crate) fn check_blocks(
        &self,
        op: &'static str,
        offset: u64,
        len: u64,
    ) -> Result<(), VolumeError> {
        match self.parity.is_some() && (!offset.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK))
        {
            true => Err(VolumeError::Unaligned {
                volume: self.info.name.clone(),
                op,
                offset,
                len,
            }),
            false => Ok(()),
        }
    }

    /// Reads `[offset, offset + len)` of a parity volume (see the module docs).
    pub(crate) async fn parity_read(&self, offset: u64, len: u64) -> Result<Bytes, VolumeError> {
        let mut out = BytesMut::with_capacity(len as usize);
        for (start, len) in self.pieces(offset, len) {
            self.read_piece(start, len, &mut out).await?;
        }
        Ok(out.freeze())
    }

    /// Reads `[start, start + len)`, within one region, into `out`. A node that fails is
    /// avoided and the rest planned again; when what is left cannot serve it (more than M
    /// nodes went silent), the read waits for one of them to answer again, as a mirror's
    /// read waits for a copy (`relink.rs`).
    async fn read_piece(
        &self,
        start: u64,
        len: u64,
        out: &mut BytesMut,
    ) -> Result<(), VolumeError> {
        // Copies kept with their history lost, not reconciled yet (`Volume::keep_lost`): read
        // around them while the others can serve.
        let mut shunned: Vec<u32> = self.kept_lost().iter().map(|&i| self.node(i)).collect();
        let mut avoid: Vec<u32> = shunned.clone();
        let mut silent = true;
        let mut waiting: Option<tokio::time::Instant> = None;
        let mut sent_at = tokio::time::Instant::now();
        let mut at = start;
        while at < start + len {
            // From its plan to its answer: the encoder does not reuse what it names.
            let gate = self.read_gate.read().await;
            let run = match self.plan_run(at, start + len, &avoid) {
                Ok(run) => run,
                Err(_) if !shunned.is_empty() => {
                    avoid.retain(|n| !shunned.contains(n));
                    shunned.clear();
                    continue;
                }
                Err(e) if !silent || avoid.is_empty() => return Err(e),
                Err(e) => {
                    drop(gate);
                    let since = *waiting.get_or_insert_with(tokio::time::Instant::now);
                    let need: Vec<usize> = avoid
                        .iter()
                        .filter_map(|&n| self.core().slot_of(n))
                        .collect();
                    if !self.copy_answers_again(since, sent_at, &need).await? {
                        return Err(e);
                    }
                    avoid.clear();
                    sent_at = tokio::time::Instant::now();
                    continue;
                }
            };
            match self.read_run(&run).await {
                Ok(bytes) => {
                    out.extend_from_slice(&bytes);
                    at += run.len;
                }
                Err((node, e)) if e.stops_writer() || avoid.contains(&node) => return Err(e),
                Err((node, e)) => {
                    tracing::warn!(volume = %self.info.name, node, "parity read failed, reading around the node: {e}");
                    silent &= e.unanswered();
                    avoid.push(node);
                }
            }
        }
        Ok(())
    }

    /// The run of blocks from byte `at` (before `end`) that read from one place, asked of the
    /// core in one visit.
    fn plan_run(&self, at: u64, end: u64, avoid: &[u32]) -> Result<Run, VolumeError> {
        let core = self.core();
        let unreadable = |source| VolumeError::Unreadable {
            volume: self.info.name.clone(),
            offset: at,
            source,
        };
        let route = |b: u64| match core.parity_read_avoiding(b, avoid) {
            Some(r) => r.map_err(unreadable),
            None => unreachable!("only a parity volume plans runs"),
        };
        let mut run = Run {
            from: route(at / BLOCK)?,
            start: at,
            len: (BLOCK - at % BLOCK).min(end - at),
        };
        while run.start + run.len < end {
            let b = (run.start + run.len) / BLOCK;
            match route(b) {
                Ok(from) if run.continues(&from) => {
                    run.len += BLOCK.min(end - run.start - run.len);
                }
                _ => break,
            }
        }
        Ok(run)
    }

    /// Reads one run; a failure names the node that failed it.
    async fn read_run(&self, run: &Run) -> Result<Bytes, (u32, VolumeError)> {
        let p = self.parity.as_ref().expect("a parity volume");
        let within = run.start % BLOCK;
        match &run.from {
            ReadFrom::Mirror(nodes) => {
                let h = self.on_node(self.header(Op::Read, run.start, run.len));
                self.read_node(nodes[0], h).await
            }
            ReadFrom::Chunk(at) => {
                let offset = p.stripes.chunk_block(at) * BLOCK + within;
                let h = self.header(Op::Read, offset, run.len);
                self.read_node(at.node, h).await
            }
            ReadFrom::Rebuild { lost, from } => {
                type Read<'a> = std::pin::Pin<
                    Box<
                        dyn std::future::Future<Output = Result<Bytes, (u32, VolumeError)>>
                            + Send
                            + 'a,
                    >,
                >;
                let reads: Vec<Read<'_>> = from
                    .iter()
                    .map(|c| {
                        let offset = p.stripes.chunk_block(c) * BLOCK + within;
                        let h = self.header(Op::Read, offset, run.len);
                        Box::pin(self.read_node(c.node, h)) as Read<'_>
                    })
                    .collect();
                let mut chunks: Vec<Option<Vec<u8>>> = vec![None; p.stripes.width()];
                for (c, r) in from.iter().zip(crate::join_all(reads).await) {
                    chunks[c.chunk] = Some(r?.to_vec());
                }
                let node = from[0].node;
                p.codec.reconstruct(&mut chunks).map_err(|e| {
                    (
                        node,
                        VolumeError::Protocol {
                            node,
                            what: format!("rebuilding chunk {lost}: {e}"),
                        },
                    )
                })?;
                Ok(Bytes::from(chunks[*lost].take().unwrap_or_default()))
            }
        }
    }

    /// Reads `h` (on-node place and length) from `node`'s replica.
    pub(crate) async fn read_node(
        &self,
        node: u32,
        h: Header,
    ) -> Result<Bytes, (u32, VolumeError)> {
        let Some(i) = self.core().slot_of(node) else {
            return Err((node, VolumeError::NoReplicas(self.info.name.clone())));
        };
        let f = self
            .call(i, h, Bytes::new())
            .await
            .and_then(|f| self.expect_ok(i, f))
            .map_err(|e| (node, e))?;
        if f.payload.len() as u64 != h.length {
            let what = format!("read returned {} of {} bytes", f.payload.len(), h.length);
            return Err((node, VolumeError::Protocol { node, what }));
        }
        Ok(f.payload)
    }
}

/// The core of the volume `info` describes, with its replicas in `states`, and a parity
/// volume's geometry. A layout this writer does not serve is refused before any replica is
/// reached.
pub(crate) fn core_of(
    info: &crate::AttachInfo,
    states: &[(u32, trireme_replication::ReplicaState)],
    managed: bool,
    slots: usize,
) -> Result<(trireme_replication::VolumeCore, Option<ParityIo>), VolumeError> {
    use trireme_replication::{Layout, VolumeCore};
    let refused = |source| VolumeError::Layout {
        volume: info.name.clone(),
        source,
    };
    let core = VolumeCore::new(states, info.min_copies, managed, slots);
    let Layout::Parity(p) = info.layout else {
        return Ok((core.with_layout(info.layout).map_err(refused)?, None));
    };
    // With a control plane, take-outs and resyncs are parity's own (`parity_resync.rs`);
    // what copies a mirror's ranges between copies refuses it (`Volume::mirror_only`).
    let nodes = StripeNodes {
        data: p.data,
        parity: p.parity,
        got: states.len(),
    };
    let core = core
        .with_stripes(p, info.size)
        .map_err(|_| refused(nodes.error()))?;
    let mut core = core;
    // The overlay is the nodes' to say (`overlay.rs`); the record's length is checked now.
    core.restore_regions(&info.regions, []).map_err(refused)?;
    let stripes = core.region_map().map(|m| m.stripes().clone());
    let io = stripes
        .map(ParityIo::new)
        .transpose()
        .map_err(|_| refused(nodes.error()))?;
    Ok((core, io))
}

/// The shape a parity volume's copies must have.
struct StripeNodes {
    data: u8,
    parity: u8,
    got: usize,
}

impl StripeNodes {
    fn error(&self) -> trireme_replication::LayoutError {
        trireme_replication::LayoutError::StripeNodes {
            data: self.data,
            parity: self.parity,
            got: self.got,
        }
    }
}

#[cfg(test)]
#[path = "parity_tests.rs"]
mod tests;
