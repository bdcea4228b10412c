//! The encoder's executor (issue 67): carries out, one step at a time, what the core hands
//! out for an encode of a parity volume's region (`VolumeCore::encode_next`).
//!
//! | step | done here |
//! |---|---|
//! | hold | a place in the write order over the region, kept through the step that asked |
//! | read | the region as it reads now (`parity.rs`), cut into K chunks and coded |
//! | write | each of the K+M chunks to its node, in the slot the record does not name |
//! | flush | every node of the stripe, so the chunks are durable before the switch |
//! | switch | the region's new kind through the caller's recorder: the one step that changes what reads see |
//! | free | the blocks the core fixed, trimmed from the region's mirrors |
//!
//! A step that fails before the switch abandons the encode (the written slot is garbage no
//! reader names); after it, a failed trim is only space.

use std::future::Future;

use bytes::Bytes;
use trireme_erasure::Codec;
use trireme_proto::{Header, Op, FLAG_MAY_TRIM};
use trireme_replication::{ChunkAt, EncodeAction, EncodeEnd, EncodeRefusal, EncodeStep, Region};

use crate::core::Place;
use crate::{join_all, Volume, VolumeError};

/// Bytes per block.
const BLOCK: u64 = 4096;

/// Why an encode did not end with its region in parity.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("volume {volume}: region {region} not encoded: {source}")]
    Refused {
        volume: String,
        region: u64,
        source: EncodeRefusal,
    },
    /// A step before the switch failed: the region reads as before.
    #[error("volume {volume}: encoding region {region} abandoned at its {step} step{}", why.as_ref().map(|w| format!(": {w}")).unwrap_or_default())]
    Abandoned {
        volume: String,
        region: u64,
        step: &'static str,
        why: Option<String>,
    },
}

impl Volume {
    /// Encodes `region` of a parity volume into a stripe (a mirrored region), or folds its
    /// overlay back into a new stripe (a parity one). `record` makes the switch durable: it
    /// is called once, with the region and its new kind, after the stripe is durable on
    /// every node, and must not return before the record holds it.
    pub async fn encode<R, F>(&self, region: u64, record: R) -> Result<Region, EncodeError>
    where
        R: Fn(u64, Region) -> F + Sync,
        F: Future<Output = Result<(), String>> + Send,
    {
        let mut ends = self.encode_batch(&[region], record).await;
        ends.pop().expect("an end for each region")
    }

    /// Encodes `regions` together, as [`Volume::encode`] does one, with one flush of the
    /// stripe's nodes for all of them: each region's read and chunk writes in turn, the
    /// flush, each switch in turn, then every region's trims at once (a node makes trims
    /// that come together durable in one flush of its held map). A flush is the costly
    /// part of an encode beside client I/O: one per region stalled the writes around it
    /// (see ARCHITECTURE.md, "Parity"). The end of each region, in the order given.
    pub async fn encode_batch<R, F>(
        &self,
        regions: &[u64],
        record: R,
    ) -> Vec<Result<Region, EncodeError>>
    where
        R: Fn(u64, Region) -> F + Sync,
        F: Future<Output = Result<(), String>> + Send,
    {
        // A scrub of a region reads and repairs the chunks reads are sent to; not while an
        // encode switches them.
        let _work = self.stripe_work.lock().await;
        let mut ends: Vec<Option<Result<Region, EncodeError>>> = regions
            .iter()
            .map(|&region| {
                let begun = self.core().encode_begin(region);
                begun.err().map(|source| {
                    Err(EncodeError::Refused {
                        volume: self.info.name.clone(),
                        region,
                        source,
                    })
                })
            })
            .collect();
        // Each region's read and chunk writes, up to its flush.
        let at_flush = |a: &EncodeAction| matches!(a, EncodeAction::Do(EncodeStep::Flush { .. }));
        self.each_until(regions, &mut ends, &record, at_flush).await;
        self.batch_flush(regions, &mut ends).await;
        // Each switch in turn (a record each), then the trims of all at once.
        let past_switch = |a: &EncodeAction| {
            matches!(
                a,
                EncodeAction::Hold { .. } | EncodeAction::Do(EncodeStep::Free { .. })
            )
        };
        self.each_until(regions, &mut ends, &record, past_switch)
            .await;
        let frees: Vec<_> = (0..regions.len())
            .filter(|&i| ends[i].is_none())
            .map(|i| {
                let record = &record;
                Box::pin(async move { (i, self.encode_until(regions[i], record, |_| false).await) })
                    as std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>>
            })
            .collect();
        for (i, end) in join_all::<(usize, Result<Option<Region>, EncodeError>)>(frees).await {
            ends[i] = end.transpose();
        }
        ends.into_iter()
            .map(|end| end.expect("an encode goes on until it ends"))
            .collect()
    }

    /// Carries out each region's steps in turn, those still going, up to the next `stop`
    /// names.
    async fn each_until<R, F>(
        &self,
        regions: &[u64],
        ends: &mut [Option<Result<Region, EncodeError>>],
        record: &R,
        stop: impl Fn(&EncodeAction) -> bool + Copy,
    ) where
        R: Fn(u64, Region) -> F + Sync,
        F: Future<Output = Result<(), String>> + Send,
    {
        for (i, &region) in regions.iter().enumerate() {
            if ends[i].is_none() {
                ends[i] = self.encode_until(region, record, stop).await.transpose();
            }
        }
    }

    /// The one flush of a batch: every node of the stripe, answered for each region that
    /// waits for it.
    async fn batch_flush(&self, regions: &[u64], ends: &mut [Option<Result<Region, EncodeError>>]) {
        let waiting: Vec<usize> = (0..regions.len()).filter(|&i| ends[i].is_none()).collect();
        if waiting.is_empty() {
            return;
        }
        // The same nodes for every region: the stripe's.
        let step = self
            .core()
            .region_map()
            .and_then(|m| waiting.iter().find_map(|&i| m.step(regions[i])));
        let done = match step {
            Some(EncodeStep::Flush { nodes }) => {
                let flushes = nodes
                    .iter()
                    .map(|&n| (n, self.header(Op::Flush, 0, 0), Bytes::new()))
                    .collect();
                self.to_nodes(flushes).await
            }
            other => Err(format!("the encode was at {other:?}, not its flush")),
        };
        if let Err(why) = &done {
            tracing::warn!(volume = %self.info.name, "an encode's flush failed: {why}");
        }
        for i in waiting {
            let end = self.core().encode_answered(regions[i], done.is_ok());
            ends[i] = self.ended(regions[i], end, "flush", done.clone());
        }
    }

    /// Carries out `region`'s steps as the core hands them out, until the next is one
    /// `stop` names (left undone: `None`) or the encode ends (its end).
    async fn encode_until<R, F>(
        &self,
        region: u64,
        record: &R,
        stop: impl Fn(&EncodeAction) -> bool,
    ) -> Result<Option<Region>, EncodeError>
    where
        R: Fn(u64, Region) -> F + Sync,
        F: Future<Output = Result<(), String>> + Send,
    {
        // None from the core: it dropped the encode (a resync of one of its nodes began)
        // while it waited for the rest of its batch.
        let dropped = || EncodeError::Abandoned {
            volume: self.info.name.clone(),
            region,
            step: "batch",
            why: Some("the writer's core dropped it".into()),
        };
        let mut place: Option<Place<'_>> = None;
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        loop {
            let ticket = place.as_ref().and_then(Place::ticket);
            let Some(next) = self.core().encode_peek(region, ticket) else {
                return Err(dropped());
            };
            if stop(&next) {
                return Ok(None);
            }
            let next = self.core().encode_next(region, ticket);
            let step = match next {
                Some(EncodeAction::Hold { start, end }) => {
                    place = Some(self.core.acquire(start, end).await);
                    continue;
                }
                Some(EncodeAction::Do(step)) => step,
                None => return Err(dropped()),
            };
            if matches!(step, EncodeStep::Write { .. } | EncodeStep::Free { .. }) {
                // Reads planned before this step may name what it overwrites or trims.
                drop(self.read_gate.write().await);
            }
            let (name, done) = self.encode_step(&step, &mut chunks, record).await;
            if let Err(why) = &done {
                tracing::warn!(volume = %self.info.name, region, step = name, "encode step failed: {why}");
            }
            let end = self.core().encode_answered(region, done.is_ok());
            // The hold served the read or the trim that asked for it.
            place = None;
            if let Some(end) = self.ended(region, end, name, done) {
                return end.map(Some);
            }
        }
    }

    /// What an answered step ended in: `None` while the encode goes on.
    fn ended(
        &self,
        region: u64,
        end: EncodeEnd,
        step: &'static str,
        done: Result<(), String>,
    ) -> Option<Result<Region, EncodeError>> {
        match end {
            EncodeEnd::Going => None,
            EncodeEnd::Done => Some(Ok(self.region_kind(region))),
            EncodeEnd::Abandoned => Some(Err(EncodeError::Abandoned {
                volume: self.info.name.clone(),
                region,
                step,
                why: done.err(),
            })),
        }
    }

    /// `region`'s kind as the core records it now.
    fn region_kind(&self, region: u64) -> Region {
        let kind = self
            .core()
            .region_map()
            .map(|m| m.regions()[region as usize]);
        kind.unwrap_or(Region::Mirror)
    }

    /// Carries out one step; its name, and why it failed.
    async fn encode_step<R, F>(
        &self,
        step: &EncodeStep,
        chunks: &mut Vec<Vec<u8>>,
        record: &R,
    ) -> (&'static str, Result<(), String>)
    where
        R: Fn(u64, Region) -> F + Sync,
        F: Future<Output = Result<(), String>> + Send,
    {
        match step {
            EncodeStep::Read { region } => ("read", self.encode_read(*region, chunks).await),
            EncodeStep::Write { chunks: at, .. } => {
                let p = self.parity.as_ref().expect("a parity volume");
                let writes = at.iter().map(|c| {
                    let offset = p.stripes.chunk_block(c) * BLOCK;
                    let data = Bytes::from(std::mem::take(&mut chunks[c.chunk]));
                    let h = self.recovery_header(Op::Write, offset, data.len() as u64);
                    (c.node, h, data)
                });
                ("write", self.to_nodes(writes.collect()).await)
            }
            EncodeStep::Flush { nodes } => {
                let flushes = nodes
                    .iter()
                    .map(|&n| (n, self.header(Op::Flush, 0, 0), Bytes::new()))
                    .collect();
                ("flush", self.to_nodes(flushes).await)
            }
            EncodeStep::Switch { region, to } => ("switch", record(*region, *to).await),
            EncodeStep::Free {
                blocks,
                nodes,
                stale,
            } => {
                let freed = self.free(blocks, nodes).await;
                self.discard_stale(stale).await;
                ("free", freed)
            }
        }
    }

    /// Trims `blocks` (one region's) from each of `nodes`, the region's mirrors. A mirror in
    /// sync whose trim failed holds blocks the overlay no longer names, with bytes older than
    /// the stripe's: were its region's other mirrors lost, a restarted writer would take
    /// them for overlay and read them. So it is taken out with the region marked, as a
    /// failed write's copy is, and its resync trims them. One already out is marked again:
    /// the others' trims may have come before their record of it began. One that cannot go
    /// out (fewer than K would stay in sync: more than M nodes went silent) stays, and its
    /// trims are sent again once it answers, still under the region's hold.
    async fn free(&self, blocks: &[u64], nodes: &[u32]) -> Result<(), String> {
        let Some(&first) = blocks.first() else {
            return Ok(());
        };
        let runs = runs(blocks);
        let mut failed = self.trim_runs(&runs, nodes).await;
        let mut waiting: Option<tokio::time::Instant> = None;
        loop {
            let Some((_, why)) = failed.first().cloned() else {
                return Ok(());
            };
            let p = self.parity.as_ref().expect("a parity volume");
            let region = p.stripes.blocks_of(p.stripes.region_of(first));
            let range = (region.start * BLOCK, (region.end - region.start) * BLOCK);
            let out: Vec<usize> = failed
                .iter()
                .filter_map(|&(n, _)| self.core().slot_of(n))
                .collect();
            if out.is_empty() {
                return Err(why);
            }
            let sent_at = tokio::time::Instant::now();
            match self.take_out_with(&out, Some(range), false).await {
                // Too few would stay in sync without them (more than M nodes went silent):
                // they stay, so their trims are sent again once one answers, still under the
                // region's hold, before any write there.
                Err(e @ VolumeError::WaitForCopies { .. }) => {
                    let since = *waiting.get_or_insert_with(tokio::time::Instant::now);
                    let again = self.copy_answers_again(since, sent_at, &out).await;
                    if !again.map_err(|e| e.to_string())? {
                        return Err(format!("{why}; its mirror stays in sync untrimmed: {e}"));
                    }
                    let left: Vec<u32> = failed.iter().map(|&(n, _)| n).collect();
                    failed = self.trim_runs(&runs, &left).await;
                }
                Err(e) => return Err(format!("{why}; taking its mirror out: {e}")),
                Ok(()) => return Err(why),
            }
        }
    }

    /// Trims the chunks of the stripe a fold-back replaced: no reader names their slot any
    /// more (reads planned before the switch are done: the read gate). One that fails is
    /// only space, until the region's next fold-back writes that slot again.
    async fn discard_stale(&self, stale: &[ChunkAt]) {
        if stale.is_empty() {
            return;
        }
        let p = self.parity.as_ref().expect("a parity volume");
        let len = p.stripes.chunk_blocks * BLOCK;
        let trims = stale.iter().map(|c| {
            let mut h =
                self.recovery_header(Op::WriteZeroes, p.stripes.chunk_block(c) * BLOCK, len);
            h.flags |= FLAG_MAY_TRIM;
            // At the chunk's place on its node already (as the chunks' writes are).
            (c.node, h, Bytes::new())
        });
        if let Err(e) = self.to_nodes(trims.collect()).await {
            tracing::debug!(volume = %self.info.name, region = stale[0].region, "the replaced stripe stays where a trim failed (only space): {e}");
        }
    }

    /// Trims block `runs` from each of `nodes`, every run at once (disjoint, under the
    /// region's hold: a node that takes them together makes their clears durable in one
    /// flush of its held map): the nodes that failed, with why.
    async fn trim_runs(&self, runs: &[(u64, u64)], nodes: &[u32]) -> Vec<(u32, String)> {
        let trims = nodes.iter().map(|&node| {
            let sends = runs.iter().map(|&(start, len)| {
                let mut h = self.recovery_header(Op::WriteZeroes, start * BLOCK, len * BLOCK);
                h.flags |= FLAG_MAY_TRIM;
                (node, self.on_node(h), Bytes::new())
            });
            Box::pin(self.to_nodes(sends.collect()))
                as std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>
        });
        let results = join_all(trims.collect()).await;
        nodes
            .iter()
            .zip(results)
            .filter_map(|(&n, r)| r.err().map(|e| (n, e)))
            .collect()
    }

    /// Reads `region` as it reads now and codes it into its K+M chunks.
    async fn encode_read(&self, region: u64, chunks: &mut Vec<Vec<u8>>) -> Result<(), String> {
        let p = self.parity.as_ref().expect("a parity volume");
        let blocks = p.stripes.blocks_of(region);
        let start = blocks.start * BLOCK;
        // The volume's last region may be short: the rest of its stripe is zeroes.
        let len = (blocks.end * BLOCK).min(self.size()).saturating_sub(start);
        let mut data = self
            .parity_read(start, len)
            .await
            .map_err(|e| e.to_string())?
            .to_vec();
        data.resize(((blocks.end - blocks.start) * BLOCK) as usize, 0);
        let chunk = (p.stripes.chunk_blocks * BLOCK) as usize;
        let data: Vec<&[u8]> = data.chunks(chunk).collect();
        let parity = p.codec.encode(&data).map_err(|e| e.to_string())?;
        *chunks = data.into_iter().map(<[u8]>::to_vec).chain(parity).collect();
        Ok(())
    }

    /// Sends each request to its node at once; the first failure, if any.
    async fn to_nodes(&self, sends: Vec<(u32, Header, Bytes)>) -> Result<(), String> {
        let calls = sends
            .into_iter()
            .map(|(node, h, data)| {
                Box::pin(async move {
                    let i = self
                        .core()
                        .slot_of(node)
                        .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))?;
                    let f = self.call(i, h, data).await?;
                    self.expect_ok(i, f).map(|_| ())
                }) as _
            })
            .collect();
        let results: Vec<Result<(), VolumeError>> = join_all(calls).await;
        results
            .into_iter()
            .collect::<Result<(), _>>()
            .map_err(|e| e.to_string())
    }
}

/// Sorted blocks as runs of (first block, count).
fn runs(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((s, n)) if *s + *n == b => *n += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}
