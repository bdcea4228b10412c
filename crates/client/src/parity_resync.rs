//! A returning node of a parity volume, brought back by its writer, as the core says
//! (`replication/src/rebuild.rs`):
//!
//! - **Mirrored parts.** Every region the node mirrors is copied from a copy of that region in
//!   sync, under a hold of the region in the write order (as a mirror's resync holds its
//!   ranges), with what the source holds: its held blocks written (zeroes as zeroes, so they
//!   stay held), the others trimmed. The held maps then agree, and so does a restarted
//!   writer's overlay (`overlay.rs`).
//! - **Chunks.** The node's chunk of every parity region, rebuilt from K chunks in sync. No
//!   hold: chunks change only by encodes, which wait for every node in sync.
//! - Then a flush of the node, and it is in sync: on record first, then for reads. What its
//!   node noted against the copy before the resync began (an unclean stop) is cleared: every
//!   block and chunk of it that is ever read was rewritten (a scrub's `Verified`).
//!
//! Always whole for now: the survivors' records of what the node missed are kept (in node
//! places), but an incremental resync of a parity volume is not built. A copy rebuilt whole
//! is never wrong, only slower.

use bytes::Bytes;
use tokio::time::Instant;
use trireme_erasure::Codec;
use trireme_proto::{Op, FLAG_MAY_TRIM};
use trireme_replication::{ChunkRebuild, MirrorCopy, ResyncProgress, ResyncStart};

use crate::resync::Reattached;
use crate::{Volume, VolumeError};

const BLOCK: u64 = 4096;

impl Volume {
    /// Brings replica `i` of a parity volume back (see the module docs).
    pub(crate) async fn resync_parity(&self, i: usize) -> Result<(), VolumeError> {
        let Reattached {
            conn, incarnation, ..
        } = self.reattach(i).await?;
        let node = self.node(i);
        let started = Instant::now();
        {
            let _all = self.core.acquire(0, self.size()).await;
            let _g = self.membership_lock.lock().await;
            let start = self.core().resync_start(i, incarnation);
            if start.map_err(|r| self.degrade(node, r))? == ResyncStart::NotNeeded {
                return Ok(());
            }
            self.set_conn(i, Some(conn));
            if let Err(e) = self.start_activity(&[i]).await {
                self.set_conn(i, None);
                return Err(e);
            }
            let progress = ResyncProgress {
                full: true,
                total_bytes: self.size(),
                done_bytes: 0,
                copied_bytes: 0,
                elapsed_ms: 0,
            };
            self.core().resync_begun(i, progress);
        }
        tracing::info!(volume = %self.info.name, node, "parity resync started");
        // What its node noted against the copy (an unclean stop) up to now: the resync
        // rewrites every block and chunk of it that is ever read, so it verifies that much.
        let tokens = self.integrity_tokens(&[i]).await;
        let mut progress = match self.parity_copies(i, started).await {
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
        self.mark_verified(&tokens).await;
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
            copied_bytes = progress.copied_bytes,
            ms = progress.elapsed_ms,
            "parity resync done; replica in sync"
        );
        Ok(())
    }

    /// Copies every region replica `i` mirrors, rebuilds its chunks, flushes it.
    async fn parity_copies(
        &self,
        i: usize,
        started: Instant,
    ) -> Result<ResyncProgress, VolumeError> {
        let p = self.parity.as_ref().expect("a parity volume");
        let s = &p.stripes;
        let blocks = self.size().div_ceil(BLOCK);
        let mut progress = ResyncProgress {
            full: true,
            total_bytes: self.size(),
            done_bytes: 0,
            copied_bytes: 0,
            elapsed_ms: 0,
        };
        for r in 0..blocks.div_ceil(s.region_blocks()) {
            let range = s.blocks_of(r);
            let (first, end) = (range.start, range.end.min(blocks));
            let (off, len) = (first * BLOCK, (end - first) * BLOCK);
            let copied = self.copy_region(i, first, off, len).await?;
            progress.done_bytes += len;
            progress.copied_bytes += copied;
            progress.elapsed_ms = started.elapsed().as_millis() as u64;
            self.set_progress(i, Some(progress.clone()));
            self.keep_rate(i, &progress, started).await;
        }
        let rebuilds = self
            .core()
            .parity_rebuilds(i)
            .map_err(|e| VolumeError::Unreadable {
                volume: self.info.name.clone(),
                offset: 0,
                source: e,
            })?;
        for rb in &rebuilds {
            self.rebuild_chunk(i, rb).await?;
            progress.copied_bytes += s.chunk_blocks * BLOCK;
        }
        self.flush_resynced(i).await?;
        Ok(progress)
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
        let h = self.node_range(self.header(Op::Read, off, len));
        let held = self.ask_held(src, h.offset, len).await?;
        // Nothing held (a region in parity with no overlay): nothing to read, one trim.
        let data = match held.is_empty() {
            true => Bytes::new(),
            false => self
                .read_node(self.node(src), h)
                .await
                .map_err(|(_, e)| e)?,
        };
        let mut at = h.offset;
        for (start, n) in held.iter().copied().chain([(h.offset + len, 0)]) {
            if start > at {
                self.send_to(
                    dst,
                    Op::WriteZeroes,
                    FLAG_MAY_TRIM,
                    at,
                    start - at,
                    Bytes::new(),
                )
                .await?;
            }
            if n > 0 {
                let bytes =
                    data.slice((start - h.offset) as usize..(start - h.offset + n) as usize);
                match bytes.iter().all(|&b| b == 0) {
                    true => {
                        self.send_to(dst, Op::WriteZeroes, 0, start, n, Bytes::new())
                            .await?
                    }
                    false => self.send_to(dst, Op::Write, 0, start, n, bytes).await?,
                }
            }
            at = start + n;
        }
        Ok(held.iter().map(|(_, n)| n).sum())
    }

    /// Rebuilds one of replica `i`'s chunks from the K chunks in sync the core names.
    async fn rebuild_chunk(&self, i: usize, rb: &ChunkRebuild) -> Result<(), VolumeError> {
        let p = self.parity.as_ref().expect("a parity volume");
        let s = &p.stripes;
        let len = s.chunk_blocks * BLOCK;
        let mut chunks: Vec<Option<Vec<u8>>> = vec![None; s.width()];
        for c in &rb.from {
            let h = self.header(Op::Read, s.chunk_block(c) * BLOCK, len);
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
        let mut h = self.header(op, offset, length);
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
