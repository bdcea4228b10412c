//! The write path of a replica with versions: each block of a write is looked up once, written
//! in place if the head alone holds it, else redirected to a fresh block of the pool (the rest
//! of a block the write covers in part copied from where it was), and the head's changes logged
//! before the write is answered.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::table::{Entry, Place, BLOCK, ZERO};
use super::{Records, VersionedReplica, RESERVE_AHEAD};
use crate::StoreError;

impl VersionedReplica {
    /// Writes `data` at `offset` into the head, redirecting blocks snapshots hold. `Ok(false)`
    /// if a redirect found no free block (the caller grows the pool and writes it all again:
    /// a write is idempotent).
    pub(super) fn write_head(&self, offset: u64, data: &[u8]) -> Result<bool, StoreError> {
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        // Where each block is written in place, looked up at once; `None` to redirect. Kept
        // on the stack for writes of up to 32 KiB, as the log records of their redirects.
        let places: SmallVec<[Option<u64>; 8]> = {
            let t = self.table();
            let newest = t.newest_gen();
            (first..=last).map(|l| t.in_place(l, newest)).collect()
        };
        // The head's changes, logged at once before the write is answered.
        let mut changed = SmallVec::new();
        let r = self.write_places(offset, data, &places, &mut changed);
        self.log(&changed)?;
        r
    }

    /// [`VersionedReplica::write_head`]'s writes, `places` looked up; each block redirected
    /// adds its log record to `changed`.
    fn write_places(
        &self,
        offset: u64,
        data: &[u8],
        places: &[Option<u64>],
        changed: &mut Records,
    ) -> Result<bool, StoreError> {
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let mut l = first;
        while l <= last {
            let at = |l: u64| (l * BLOCK).max(offset);
            let piece_end = |l: u64| ((l + 1) * BLOCK).min(end);
            match places[(l - first) as usize] {
                Some(p) => {
                    // A run of blocks written in place, physically contiguous.
                    let mut k = l + 1;
                    while k <= last && places[(k - first) as usize] == Some(p + (k - l)) {
                        k += 1;
                    }
                    let (a, b) = (at(l), piece_end(k - 1));
                    let bytes = &data[(a - offset) as usize..(b - offset) as usize];
                    self.inner
                        .write(p * BLOCK + (a - l * BLOCK), bytes, false)?;
                    l = k;
                }
                None => {
                    let (a, b) = (at(l), piece_end(l));
                    let piece = &data[(a - offset) as usize..(b - offset) as usize];
                    if !self.redirect(l, a - l * BLOCK, piece, changed)? {
                        return Ok(false);
                    }
                    l += 1;
                }
            }
        }
        Ok(true)
    }

    /// Writes `piece` at `within` of logical block `l`, to a fresh block if it is shared.
    fn redirect(
        &self,
        l: u64,
        within: u64,
        piece: &[u8],
        changed: &mut Records,
    ) -> Result<bool, StoreError> {
        let _s = self.stripe(l);
        let place = self.table().place(l);
        match place {
            Place::Full => Ok(false),
            Place::InPlace(p) => self
                .inner
                .write(p * BLOCK + within, piece, false)
                .map(|()| true),
            Place::Redirect { to, from } => {
                self.reserve_ahead(to);
                let r = self.write_fresh(to, from, within, piece);
                let mut t = self.table();
                let new = t.redirected(l, to, from, r.is_ok());
                if self.runs_low(t.free_blocks()) {
                    self.low.store(true, Ordering::Release);
                }
                self.dirty.store(true, Ordering::Release);
                r?;
                if let Some(e) = new {
                    changed.push(self.record_entry(l, e));
                }
                Ok(true)
            }
        }
    }

    /// Writes block `to` whole: `piece` at `within`, the rest from `from` (an entry's block, or
    /// zeros). A piece that is the whole block is written as it came.
    ///
    /// As a stream for a tiered store below: a redirect places a block, it is not an access
    /// to the extent it lands in. The pool hands out blocks lowest first, so its newest extent
    /// takes every first overwrite at once; counted as heat, it was promoted and then demoted
    /// as the next one took over, a move per MiB of redirects (with the extent held against
    /// I/O for each copy). Later writes to the block, in place, heat as any.
    fn write_fresh(
        &self,
        to: u64,
        from: Entry,
        within: u64,
        piece: &[u8],
    ) -> Result<(), StoreError> {
        crate::tiered::heat::as_stream(|| self.write_fresh_block(to, from, within, piece))
    }

    fn write_fresh_block(
        &self,
        to: u64,
        from: Entry,
        within: u64,
        piece: &[u8],
    ) -> Result<(), StoreError> {
        if piece.len() == BLOCK as usize {
            return self.inner.write(to * BLOCK, piece, false);
        }
        let mut block = vec![0u8; BLOCK as usize];
        if from.phys != ZERO {
            self.inner.read(from.phys * BLOCK, &mut block)?;
        }
        block[within as usize..within as usize + piece.len()].copy_from_slice(piece);
        self.inner.write(to * BLOCK, &block, false)
    }

    /// Before a redirect writes block `to`: if it lies outside the range last reserved, the
    /// [`RESERVE_AHEAD`] bytes from it are reserved ([`Replica::reserve`]). The pool is a
    /// sparse region and takes free blocks lowest first, so without this each redirect's
    /// O_DIRECT write allocated, under the data file's exclusive lock; now one call in 512
    /// does. The window, not the whole pool: reserved space stays taken until written, and a
    /// full node must get back what a snapshot's delete frees (`full.rs`).
    fn reserve_ahead(&self, to: u64) {
        let at = to * BLOCK;
        let mut window = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        if window.contains(&at) {
            return;
        }
        let upto = (at + RESERVE_AHEAD).min(self.inner.size());
        if upto > at {
            self.inner.reserve(at, upto - at);
        }
        *window = at..upto;
    }
}
