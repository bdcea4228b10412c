//! A returning node of a parity volume, brought back by its writer, as the core says
//! (`replication/src/rebuild.rs`):
//!
//! | | incremental | whole |
//! |---|---|---|
//! | when | it comes back as the incarnation that went out, and every region it mirrors has another mirror in sync whose record of what it missed this writer trusts | otherwise (its data lost, a writer change, a record missing) |
//! | mirrored blocks | the ranges the survivors marked and its own activity log shows, at node places, cut into the regions it mirrors | every region it mirrors |
//! | chunks | none: an encode needs every node in sync, so its chunks did not change while it was out | its chunk of every parity region, rebuilt from K chunks in sync |
//! | what its node noted against it (an unclean stop) | left for a scrub | cleared (`Verified`): every block and chunk of it that is ever read was rewritten |
//!
//! - **Copies.** A range is copied from another copy of its region in sync, under a hold of
//!   the range in the write order (as a mirror's resync holds its ranges), with what the
//!   source holds: its held blocks written (zeroes as zeroes, so they stay held), the others
//!   trimmed. The held maps then agree, and so does a restarted writer's overlay
//!   (`overlay.rs`).
//! - **Chunks** need no hold: chunks change only by encodes, which wait for every node in
//!   sync.
//! - Then a flush of the node, and it is in sync: on record first, then for reads; the
//!   survivors drop their records.
//! - **Why a record per region.** A mirror's survivor sees every write, so one trusted
//!   record is enough; a parity volume's survivor sees only the writes of the regions it
//!   mirrors.

use bytes::Bytes;
use tokio::time::Instant;
use trireme_erasure::Codec;
use trireme_proto::{Op, FLAG_MAY_TRIM};
use trireme_replication::{ChunkRebuild, MirrorCopy, ResyncProgress, ResyncStart};

use crate::membership::BoxFut;
use crate::resync::Reattached;
use crate::{join_all, Volume, VolumeError};

const BLOCK: u64 = 4096;
/// Regions copied, or chunks rebuilt, at once: a rebuild is bound by round trips and the
/// nodes' disks, not by one stream.
const AT_ONCE: usize = 4;

impl Volume {
    /// Brings replica `i` of a parity volume back (see the module docs).
    pub(crate) async fn resync_parity(&self, i: usize) -> Result<(), VolumeError> {
        let Reattached {
            conn, incarnation, ..
        } = self.reattach(i).await?;
        let node = self.node(i);
        let started = Instant::now();
        let dirty = {
            let _all = self.core.acquire(0, self.size()).await;
            let _g = self.membership_lock.lock().await;
            let start = self.core().resync_start(i, incarnation);
            let (survivors, incremental) = match start.map_err(|r| self.degrade(node, r))? {
                ResyncStart::NotNeeded => return Ok(()),
                ResyncStart::From {
                    survivors,
                    incremental,
                } => (survivors, incremental),
            };
            // Its connection first: its own activity log is asked before it is started anew.
            self.set_conn(i, Some(conn));
            let dirty = async {
                let dirty = match incremental {
                    true => self.parity_dirty(i, &survivors).await?,
                    false => None,
                };
                self.start_activity(&[i]).await?;
                Ok(dirty)
            };
            let dirty = match dirty.await {
                Ok(d) => d,
                Err(e) => {
                    self.set_conn(i, None);
                    return Err(e);
                }
            };
            let progress = ResyncProgress {
                full: dirty.is_none(),
                total_bytes: dirty.as_ref().map_or(self.size(), |d| {
                    d.iter().map(|(first, end)| (end - first) * BLOCK).sum()
                }),
                done_bytes: 0,
                copied_bytes: 0,
                elapsed_ms: 0,
            };
            self.core().resync_begun(i, progress);
            dirty
        };
        let full = dirty.is_none();
        tracing::info!(volume = %self.info.name, node, full, "parity resync started");
        // What its node noted against the copy (an unclean stop) up to now: a whole resync
        // rewrites every block and chunk of it that is ever read, so it verifies that much.
        // An incremental one rewrites only what the node missed: a scrub verifies the rest.
        let tokens = match full {
            true => self.integrity_tokens(&[i]).await,
            false => Vec::new(),
        };
        let copied = match &dirty {
            Some(parts) => self.parity_dirty_copies(i, parts, started).await,
            None => self.parity_copies(i, started).await,
        };
        let mut progress = match copied {
            Ok(p) => p,
            Err(e) => {
                if self.core().resyncing(i) {
                    if let Err(e2) = self.take_out_with(&[i], None, false).await {
                        tracing::warn!(volume = %self.info.name, node, "taking out a replica whose resync stopped: {e2}");
                    }
                }
                self.core().resync_failed(i);
                return Err(e);
            }
        };
        self.set_progress(i, None);
        if full {
            self.mark_verified(&tokens).await;
        }
        let _all = self.core.acquire(0, self.size()).await;
        let _g = self.membership_lock.lock().await;
        if !self.core().resyncing(i) {
            return Err(VolumeError::NoReplicas(self.info.name.clone()));
        }
        progress.elapsed_ms = started.elapsed().as_millis() as u64;
        self.resynced(i, incarnation, &progress).await?;
        tracing::info!(
            volume = %self.info.name,
            node,
            full,
            copied_bytes = progress.copied_bytes,
            ms = progress.elapsed_ms,
            "parity resync done; replica in sync"
        );
        Ok(())
    }

    /// What replica `i` missed, if the survivors' records provably cover it: the volume block
    /// ranges `[first, end)` of the regions it mirrors that they marked, and that its own
    /// activity log marks, each within one region. A survivor sees only the writes of the regions it mirrors, so every region `i`
    /// mirrors needs a record this writer trusts from another of its mirrors; else `None`,
    /// and the resync is whole.
    async fn parity_dirty(
        &self,
        i: usize,
        survivors: &[usize],
    ) -> Result<Option<Vec<(u64, u64)>>, VolumeError> {
        let s = &self.stripes();
        let node = self.node(i);
        let span = self.replica_size(self.size());
        let (mut ranges, mut trusted) = (Vec::new(), Vec::new());
        for &sv in survivors {
            if let Some(marked) = self.survivor_record(sv, i, span).await? {
                trusted.push(self.node(sv));
                ranges.extend(marked);
            }
        }
        let blocks = self.size().div_ceil(BLOCK);
        let uncovered = (0..blocks.div_ceil(s.region_blocks()))
            .find(|&r| s.mirrors(r, node) && !trusted.iter().any(|&n| s.mirrors(r, n)));
        if let Some(r) = uncovered {
            tracing::info!(volume = %self.info.name, node, region = r, "no survivor's record covers a region the copy mirrors: a whole resync");
            return Ok(None);
        }
        // And what its own log marks. A node whose process died keeps its data but not the
        // held bits set since its last flush; its log on disk still shows their extents
        // (`node/src/held.rs`), so those are copied again from another mirror, which sets
        // the bits. Without a log, nothing bounds them: a whole resync.
        match self.activity_of(i).await? {
            Some(own) => ranges.extend(own),
            None => {
                tracing::info!(volume = %self.info.name, node, "the copy's node keeps no activity log for it: a whole resync");
                return Ok(None);
            }
        }
        // Marks in chunk slots are other nodes' chunks (a scrub's repair): this copy's chunks
        // did not change while it was out, since an encode needs every node in sync.
        let parts = crate::parity_reconcile::mirrored_parts(s, &ranges, blocks)
            .into_iter()
            .filter(|&(first, _)| s.mirrors(s.region_of(first), node))
            .collect();
        Ok(Some(parts))
    }

    /// Copies the parts `[first, end)` replica `i` missed (see [`Volume::parity_dirty`]),
    /// then flushes it.
    async fn parity_dirty_copies(
        &self,
        i: usize,
        parts: &[(u64, u64)],
        started: Instant,
    ) -> Result<ResyncProgress, VolumeError> {
        let mut progress = ResyncProgress {
            full: false,
            total_bytes: parts.iter().map(|(f, e)| (e - f) * BLOCK).sum(),
            done_bytes: 0,
            copied_bytes: 0,
            elapsed_ms: 0,
        };
        self.copy_parts(i, parts, &mut progress, started).await?;
        self.flush_resynced(i).await?;
        Ok(progress)
    }

    /// Copies every region replica `i` mirrors, rebuilds its chunks, flushes it.
    async fn parity_copies(
        &self,
        i: usize,
        started: Instant,
    ) -> Result<ResyncProgress, VolumeError> {
        let s = &self.stripes();
        let blocks = self.size().div_ceil(BLOCK);
        let mut progress = ResyncProgress {
            full: true,
            total_bytes: self.size(),
            done_bytes: 0,
            copied_bytes: 0,
            elapsed_ms: 0,
        };
        let regions: Vec<(u64, u64)> = (0..blocks.div_ceil(s.region_blocks()))
            .map(|r| {
                let range = s.blocks_of(r);
                (range.start, range.end.min(blocks))
            })
            .collect();
        self.copy_parts(i, &regions, &mut progress, started).await?;
        let rebuilds = self
            .core()
            .parity_rebuilds(i)
            .map_err(|e| VolumeError::Unreadable {
                volume: self.info.name.clone(),
                offset: 0,
                source: e,
            })?;
        for group in rebuilds.chunks(AT_ONCE) {
            let rebuilt = join_all(
                group
                    .iter()
                    .map(|rb| {
                        Box::pin(self.rebuild_chunk(i, rb)) as BoxFut<'_, Result<(), VolumeError>>
                    })
                    .collect(),
            )
            .await;
            for r in rebuilt {
                r?;
                progress.copied_bytes += s.chunk_blocks * BLOCK;
            }
        }
        self.flush_resynced(i).await?;
        Ok(progress)
    }

    /// Copies each part `[first, end)` (within one region) that replica `i` mirrors,
    /// [`AT_ONCE`] at a time, each under its own hold, at the resync's rate.
    async fn copy_parts(
        &self,
        i: usize,
        parts: &[(u64, u64)],
        progress: &mut ResyncProgress,
        started: Instant,
    ) -> Result<(), VolumeError> {
        for group in parts.chunks(AT_ONCE) {
            let copies = join_all(
                group
                    .iter()
                    .map(|&(first, end)| {
                        let (off, len) = (first * BLOCK, (end - first) * BLOCK);
                        Box::pin(self.copy_region(i, first, off, len))
                            as BoxFut<'_, Result<u64, VolumeError>>
                    })
                    .collect(),
            )
            .await;
            for (c, &(first, end)) in copies.into_iter().zip(group) {
                progress.copied_bytes += c?;
                progress.done_bytes += (end - first) * BLOCK;
            }
            progress.elapsed_ms = started.elapsed().as_millis() as u64;
            self.set_progress(i, Some(progress.clone()));
            self.keep_rate(i, progress, started).await;
        }
        Ok(())
    }

    /// Copies one region's mirrored blocks `[off, off + len)` to replica `i` if it mirrors
    /// the region, under a hold: the bytes copied.
    async fn copy_region(
        &self,
        i: usize,
        first: u64,
        off: u64,
        len: u64,
    ) -> Result<u64, VolumeError> {
        let _hold = self.core.acquire(off, off + len).await;
        if !self.core().resyncing(i) {
            return Err(VolumeError::NoReplicas(self.info.name.clone()));
        }
        let source = self.core().parity_copy_source(first, i);
        let src = match source {
            Some(MirrorCopy::NotMirrored) => return Ok(0),
            Some(MirrorCopy::From(src)) => src,
            Some(MirrorCopy::NoSource) | None => {
                return Err(VolumeError::NoReplicas(self.info.name.clone()))
            }
        };
        self.copy_held(src, i, off, len).await
    }

    /// Copies `[off, off + len)` of the volume (within one region's mirrored part) from
    /// replica `src` to replica `dst` with what `src` holds: its held runs written (zeroes as
    /// zeroes, so they stay held), the gaps trimmed. The bytes of held runs.
    pub(crate) async fn copy_held(
        &self,
        src: usize,
        dst: usize,
        off: u64,
        len: u64,
    ) -> Result<u64, VolumeError> {
        let h = self.node_range(self.recovery_header(Op::Read, off, len));
        let held = self.ask_held(src, h.offset, len).await?;
        // Nothing held (a region in parity with no overlay): nothing to read, one trim.
        let data = match held.is_empty() {
            true => Bytes::new(),
            false => self
                .read_node(self.node(src), h)
                .await
                .map_err(|(_, e)| e)?,
        };
        for (start, n) in gaps(&held, h.offset, len) {
            self.send_to(dst, Op::WriteZeroes, FLAG_MAY_TRIM, start, n, Bytes::new())
                .await?;
        }
        for &(start, n) in &held {
            let bytes = data.slice((start - h.offset) as usize..(start - h.offset + n) as usize);
            match bytes.iter().all(|&b| b == 0) {
                true => {
                    self.send_to(dst, Op::WriteZeroes, 0, start, n, Bytes::new())
                        .await?
                }
                false => self.send_to(dst, Op::Write, 0, start, n, bytes).await?,
            }
        }
        Ok(held.iter().map(|(_, n)| n).sum())
    }

    /// Trims, on replica `i`, the blocks of `[off, off + len)` (as [`Volume::copy_held`]) it
    /// does not hold. After a power loss a copy may keep bytes whose held bit is clear (a
    /// write never flushed, a punch undone): a region in parity reads the stripe there, but
    /// a mirrored region would read those bytes from this copy alone once `copy_held` from it
    /// trimmed them on the others.
    pub(crate) async fn trim_unheld(
        &self,
        i: usize,
        off: u64,
        len: u64,
    ) -> Result<(), VolumeError> {
        let h = self.node_range(self.recovery_header(Op::Read, off, len));
        let held = self.ask_held(i, h.offset, len).await?;
        for (start, n) in gaps(&held, h.offset, len) {
            self.send_to(i, Op::WriteZeroes, FLAG_MAY_TRIM, start, n, Bytes::new())
                .await?;
        }
        Ok(())
    }

    /// Rebuilds one of replica `i`'s chunks from the K chunks in sync the core names.
    async fn rebuild_chunk(&self, i: usize, rb: &ChunkRebuild) -> Result<(), VolumeError> {
        let p = self.parity.as_ref().expect("a parity volume");
        let s = &self.stripes();
        let len = s.chunk_blocks * BLOCK;
        let mut chunks: Vec<Option<Vec<u8>>> = vec![None; s.width()];
        for c in &rb.from {
            let h = self.recovery_header(Op::Read, s.chunk_block(c) * BLOCK, len);
            let bytes = self.read_node(c.node, h).await.map_err(|(_, e)| e)?;
            chunks[c.chunk] = Some(bytes.to_vec());
        }
        let node = self.node(i);
        p.codec
            .reconstruct(&mut chunks)
            .map_err(|e| VolumeError::Protocol {
                node,
                what: format!(
                    "rebuilding chunk {} of region {}: {e}",
                    rb.to.chunk, rb.to.region
                ),
            })?;
        let bytes = Bytes::from(chunks[rb.to.chunk].take().unwrap_or_default());
        self.send_to(i, Op::Write, 0, s.chunk_block(&rb.to) * BLOCK, len, bytes)
            .await
    }

    /// Sends one request at a node place to replica `i` (a resync or reconcile target); a
    /// failure takes it out.
    async fn send_to(
        &self,
        i: usize,
        op: Op,
        flags: u16,
        offset: u64,
        length: u64,
        payload: Bytes,
    ) -> Result<(), VolumeError> {
        let mut h = self.recovery_header(op, offset, length);
        h.flags |= flags;
        match self
            .call(i, h, payload)
            .await
            .and_then(|f| self.expect_ok(i, f))
        {
            Ok(_) => Ok(()),
            Err(e) if e.stops_writer() => Err(e),
            Err(e) => {
                if self.core().resyncing(i) {
                    if let Err(e2) = self.take_out_with(&[i], None, false).await {
                        tracing::warn!(volume = %self.info.name, "taking out a resync target that failed: {e2}");
                    }
                }
                Err(e)
            }
        }
    }

    /// Waits as long as the resync rate asks.
    async fn keep_rate(&self, i: usize, progress: &ResyncProgress, started: Instant) {
        let Some(rate) = self
            .core()
            .rate(i)
            .or(self.opts.resync_rate)
            .filter(|&r| r > 0)
        else {
            return;
        };
        let due = std::time::Duration::from_secs_f64(progress.done_bytes as f64 / rate as f64);
        tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
    }
}

/// The runs of `[start, start + len)` the sorted runs `held` do not cover.
fn gaps(held: &[(u64, u64)], start: u64, len: u64) -> Vec<(u64, u64)> {
    let mut at = start;
    let mut out = Vec::new();
    for &(s, n) in held.iter().chain([(start + len, 0)].iter()) {
        if s > at {
            out.push((at, s - at));
        }
        at = at.max(s + n);
    }
    out
}

#[cfg(test)]
#[test]
fn gaps_are_what_the_held_runs_leave() {
    assert_eq!(gaps(&[], 8, 4), vec![(8, 4)]);
    assert_eq!(gaps(&[(8, 4)], 8, 4), vec![]);
    assert_eq!(gaps(&[(9, 1), (11, 1)], 8, 4), vec![(8, 1), (10, 1)]);
    assert_eq!(gaps(&[(8, 2)], 8, 4), vec![(10, 2)]);
}
