//! Scrub of a parity volume (issue 67): region by region, while I/O goes on.
//!
//! | part of the region | compared | repaired from |
//! |---|---|---|
//! | mirrored blocks, on its M+1 mirrors in sync | crc32c on each node; in parity, which blocks each holds against the overlay | blocks held outside the overlay trimmed; a copy that differs, or lacks a block of the overlay, rewritten from the copy a majority holds (`copy_held`) |
//! | its stripe (in parity), on the K+M nodes in sync | parity against data, in the writer | the rest of the stripe ([`trireme_erasure::check_stripe`]) |
//!
//! - **Holds.** Each region is looked at under a place in the write order over it (no write
//!   lands meanwhile) and `stripe_work` (no encode switches its stripe meanwhile).
//! - **Held blocks.** In a region in parity a mirror's held block reads over the stripe,
//!   and the writer's overlay says which blocks those are. A block held outside it is
//!   garbage no read is sent to (an encode's trim after its switch that failed on that copy,
//!   or that the copy missed while out: its node marked nothing for it), and a restarted
//!   writer would trim it (`overlay.rs`): the scrub trims it now, so copies compare equal.
//!   A copy that lacks a block of the overlay lost a write: known bad, it gets no vote.
//! - **Nothing guessed.** No majority among the mirrors, or no single chunk that explains
//!   a stripe's mismatch (2+1, or two wrong chunks): the region is reported unresolved and
//!   left alone, as a mirror scrub does.
//! - **Verified.** A copy in sync through every region is told so at the end
//!   (`Verified`), when nothing is left unresolved.

use bytes::Bytes;
use trireme_erasure::{check_stripe, Chunk, StripeCheck};
use trireme_proto::Op;
use trireme_replication::{majority, ChunkAt, Refusal, Region, Stripes, Sum, Verdict};

use crate::scrub::ScrubReport;
use crate::{join_all, Volume, VolumeError};

const BLOCK: u64 = 4096;

/// One region of the volume: `[off, off + len)`, its blocks from `first`.
#[derive(Debug, Clone, Copy)]
struct Span {
    region: u64,
    first: u64,
    off: u64,
    len: u64,
}

impl Volume {
    /// Scrubs every region of a parity volume (see the module docs), at most `rate` bytes a
    /// second.
    pub(crate) async fn scrub_parity(
        &self,
        rate: Option<u64>,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<ScrubReport, VolumeError> {
        let s = &self.stripes();
        let started = tokio::time::Instant::now();
        let blocks = self.size().div_ceil(BLOCK);
        let mut report = ScrubReport {
            volume: self.info.name.clone(),
            region_bytes: s.region_blocks() * BLOCK,
            replicas: self.in_sync().iter().map(|&i| self.node(i)).collect(),
            ..ScrubReport::default()
        };
        let mut always = self.integrity_tokens(&self.in_sync()).await;
        for region in 0..blocks.div_ceil(s.region_blocks()) {
            let range = s.blocks_of(region);
            let (first, end) = (range.start, range.end.min(blocks));
            let span = Span {
                region,
                first,
                off: first * BLOCK,
                len: (end - first) * BLOCK,
            };
            {
                let _work = self.stripe_work.lock().await;
                let _hold = self.core.acquire(span.off, span.off + span.len).await;
                // A move's new copy takes what its place takes, but a repair is sent to the
                // copies in sync alone: it would miss it.
                let moving = self.core().follower().map(|f| self.node(f));
                if let Some(to) = moving {
                    return Err(self.degrade(to, Refusal::ScrubWhileMoving(to)));
                }
                let targets = self.in_sync();
                always.retain(|(i, _)| targets.contains(i));
                let mirrored = self.scrub_mirrored(s, span, &targets, &mut report).await?;
                let stripe = self.scrub_stripe(s, span, &targets, &mut report).await?;
                if mirrored || stripe {
                    report.mismatched_regions += 1;
                }
            }
            report.bytes_compared += span.len;
            let done = span.off + span.len;
            progress(done, report.repaired.len() as u64 * report.region_bytes);
            if let Some(rate) = rate.filter(|&r| r > 0) {
                let due = std::time::Duration::from_secs_f64(done as f64 / rate as f64);
                tokio::time::sleep_until(started + due).await;
            }
        }
        report.unresolved.dedup();
        if report.unresolved.is_empty() {
            report.verified = self.mark_verified(&always).await;
        }
        Ok(report)
    }

    /// Compares the region's mirrored blocks across its mirrors in sync and rewrites the
    /// copies that differ; whether any did. In parity, the overlay says which blocks every
    /// mirror must hold: one held outside it is garbage (a trim after an encode's switch
    /// that failed on that copy; reads go to the stripe) and is trimmed, and a copy that
    /// lacks one of it lost a write: it gets no vote and is rewritten.
    async fn scrub_mirrored(
        &self,
        s: &Stripes,
        span: Span,
        targets: &[usize],
        report: &mut ScrubReport,
    ) -> Result<bool, VolumeError> {
        let mirrors: Vec<usize> = targets
            .iter()
            .copied()
            .filter(|&i| s.mirrors(span.region, self.node(i)))
            .collect();
        let at = s.node_block(span.first) * BLOCK;
        let overlay = self.core().region_map().and_then(|m| {
            matches!(m.regions()[span.region as usize], Region::Parity { .. })
                .then(|| m.overlay_in(span.region))
        });
        let mut tidied = false;
        let mut lacking = vec![false; mirrors.len()];
        if let Some(want) = &overlay {
            for (k, &i) in mirrors.iter().enumerate() {
                let held = self.held_blocks(s, i, at, span.len).await?;
                let extra: Vec<u64> = held
                    .iter()
                    .copied()
                    .filter(|b| want.binary_search(b).is_err())
                    .collect();
                lacking[k] = want.iter().any(|b| held.binary_search(b).is_err());
                if !extra.is_empty() {
                    self.trim_blocks(i, s, &extra).await?;
                    report.repaired.push((span.off, self.node(i)));
                    tidied = true;
                    tracing::info!(volume = %self.info.name, node = self.node(i), region = span.region, blocks = extra.len(), "scrub trimmed blocks a mirror held outside the overlay");
                }
            }
        }
        let mut sums = Vec::with_capacity(mirrors.len());
        for ((&i, r), lacks) in mirrors
            .iter()
            .zip(self.checksums(&mirrors, at, span.len).await)
            .zip(&lacking)
        {
            match r {
                Ok(_) if *lacks => sums.push((i, Sum::Bad)),
                Ok(c) => sums.push((i, Sum::Good(c))),
                Err(e) if e.is_bad_copy() => sums.push((i, Sum::Bad)),
                Err(e) => return Err(e),
            }
        }
        let verdict = majority(&sums);
        if verdict != Verdict::Agree {
            report.bad_copies += sums.iter().filter(|s| s.1 == Sum::Bad).count() as u64;
        }
        match verdict {
            Verdict::Agree => Ok(tidied),
            Verdict::Unresolved => {
                report.unresolved.push(span.off);
                Ok(true)
            }
            Verdict::Repair { source, rewrite } => {
                for i in rewrite {
                    self.copy_held(source, i, span.off, span.len).await?;
                    report.repaired.push((span.off, self.node(i)));
                    tracing::warn!(volume = %self.info.name, node = self.node(i), offset = span.off, "scrub rewrote a region's mirrored blocks from the majority copy");
                }
                Ok(true)
            }
        }
    }

    /// The volume blocks slot `i`'s copy holds of the node's `[at, at + len)` (one region's
    /// mirrored part).
    async fn held_blocks(
        &self,
        s: &Stripes,
        i: usize,
        at: u64,
        len: u64,
    ) -> Result<Vec<u64>, VolumeError> {
        let held = self.ask_held(i, at, len).await?;
        Ok(held
            .iter()
            .flat_map(|&(start, n)| start / BLOCK..(start + n) / BLOCK)
            .filter_map(|b| s.volume_block(b))
            .collect())
    }

    /// Checks the region's stripe, if it is in parity, and rewrites the chunks found wrong;
    /// whether any were.
    async fn scrub_stripe(
        &self,
        s: &Stripes,
        span: Span,
        targets: &[usize],
        report: &mut ScrubReport,
    ) -> Result<bool, VolumeError> {
        let kind = self
            .core()
            .region_map()
            .map(|m| m.regions()[span.region as usize]);
        let Some(Region::Parity { slot }) = kind else {
            return Ok(false);
        };
        let at = |chunk| ChunkAt {
            node: s.node_of(span.region, chunk),
            region: span.region,
            slot,
            chunk,
            block: 0,
        };
        let chunks = self.read_chunks(s, targets, (0..s.width()).map(at)).await?;
        let p = self.parity.as_ref().expect("a parity volume");
        let check = check_stripe(&p.codec, &chunks).map_err(|e| VolumeError::Protocol {
            node: at(0).node,
            what: format!("checking the stripe of region {}: {e}", span.region),
        })?;
        if check != StripeCheck::Unchecked {
            report.stripes_checked += 1;
        }
        let repairs = match check {
            StripeCheck::Agree | StripeCheck::Unchecked => return Ok(false),
            StripeCheck::Unresolved => {
                tracing::warn!(volume = %self.info.name, region = span.region, "scrub: the stripe's parity does not match its data, and no single chunk explains it: left alone");
                report.unresolved.push(span.off);
                return Ok(true);
            }
            StripeCheck::Repair(r) => r,
        };
        report.bad_copies += chunks.iter().filter(|c| **c == Chunk::Bad).count() as u64;
        for (chunk, bytes) in repairs {
            let c = at(chunk);
            let i = self.slot_on(c.node)?;
            let h = self.recovery_header(Op::Write, s.chunk_block(&c) * BLOCK, bytes.len() as u64);
            self.expect_ok(i, self.call(i, h, Bytes::from(bytes)).await?)?;
            // Durable before anything counts on it: a copy that later comes back from a power
            // loss is trusted for its switched stripes' chunks (`check_incarnations`).
            let f = self.header(Op::Flush, 0, 0);
            self.expect_ok(i, self.call(i, f, Bytes::new()).await?)?;
            report.repaired.push((span.off, c.node));
            tracing::warn!(volume = %self.info.name, node = c.node, region = span.region, chunk, "scrub rebuilt a wrong chunk from the rest of its stripe");
        }
        Ok(true)
    }

    /// Every chunk of a stripe: read from its node when in sync (`targets`), known bad when
    /// its node says its blocks fail their checksums, absent otherwise.
    async fn read_chunks(
        &self,
        s: &Stripes,
        targets: &[usize],
        chunks: impl Iterator<Item = ChunkAt>,
    ) -> Result<Vec<Chunk>, VolumeError> {
        type Read<'a> = std::pin::Pin<
            Box<dyn std::future::Future<Output = Option<Result<Bytes, VolumeError>>> + Send + 'a>,
        >;
        let len = s.chunk_blocks * BLOCK;
        let reads: Vec<Read<'_>> = chunks
            .map(|c| {
                let in_sync = self
                    .core()
                    .slot_of(c.node)
                    .is_some_and(|i| targets.contains(&i));
                let h = self.recovery_header(Op::Read, s.chunk_block(&c) * BLOCK, len);
                Box::pin(async move {
                    match in_sync {
                        true => Some(self.read_node(c.node, h).await.map_err(|(_, e)| e)),
                        false => None,
                    }
                }) as Read<'_>
            })
            .collect();
        join_all(reads)
            .await
            .into_iter()
            .map(|r| match r {
                None => Ok(Chunk::Absent),
                Some(Ok(b)) => Ok(Chunk::Good(b.to_vec())),
                Some(Err(e)) if e.is_bad_copy() => Ok(Chunk::Bad),
                Some(Err(e)) => Err(e),
            })
            .collect()
    }

    /// The slot of `node`'s copy.
    fn slot_on(&self, node: u32) -> Result<usize, VolumeError> {
        self.core()
            .slot_of(node)
            .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))
    }
}
