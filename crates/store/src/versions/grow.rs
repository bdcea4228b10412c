//! The pool's growth. A redirect takes the lowest free block. When a redirect leaves fewer
//! than a quarter of a step free, its write grows the pool by a step before it is answered,
//! under the gate held shared: other I/O goes on meanwhile, and other redirects take the
//! blocks still free (`Replica::resize` lets I/O below the old end run while it grows). A
//! redirect that finds no free block at all (the first after a snapshot, or the pool grew
//! too slowly) waits for a growth, under the gate held shared too unless freed blocks can be
//! reused: that takes the gate exclusive (no read may still be on its way to one).
//!
//! Ahead in a write, not in a thread of its own: the simulator's seeds stay deterministic,
//! and nothing outlives the replica. One write per step waits for the growth (the physical
//! replica's size, its map and its seals made durable: milliseconds), where every I/O of the
//! replica waited before.

use std::sync::atomic::Ordering;

use super::table::BLOCK;
use super::VersionedReplica;
use crate::StoreError;

impl VersionedReplica {
    /// The blocks the pool grows by: at least the store's minimum, and a sixteenth of the
    /// replica beyond it.
    pub(super) fn grow_step(&self) -> u64 {
        self.grow_min.max(self.size.load(Ordering::Acquire) / 16) / BLOCK
    }

    /// True if `free` blocks are fewer than a quarter of a step: the pool grows ahead.
    pub(super) fn runs_low(&self, free: usize) -> bool {
        (free as u64) < self.grow_step() / 4
    }

    /// With the gate held shared, after a write that left free blocks low: grows the pool by
    /// a step. One write at a time grows it; the others go on. Its errors are not the
    /// write's: the growth a redirect makes when no block is free reports them.
    pub(super) fn grow_ahead(&self) {
        let Ok(_g) = self.growing.try_lock() else {
            return;
        };
        if !self.low.swap(false, Ordering::AcqRel) || self.ahead_failed.load(Ordering::Acquire) {
            return;
        }
        if !self.runs_low(self.table().free_blocks()) {
            return;
        }
        if let Err(e) = self.add_step() {
            self.ahead_failed.store(true, Ordering::Release);
            tracing::warn!(volume = self.vol(), "growing the snapshot pool ahead: {e}");
        }
    }

    /// Adds a step of blocks to the pool: the physical replica first, durable, then the table.
    fn add_step(&self) -> Result<(), StoreError> {
        let to = self.inner.size() + self.grow_step() * BLOCK;
        self.inner.resize(to)?;
        self.table().grow(to / BLOCK);
        self.ahead_failed.store(false, Ordering::Release);
        tracing::debug!(volume = self.vol(), pool = to, "snapshot pool grew");
        Ok(())
    }

    /// Grows the pool (or reuses freed blocks) so a redirect finds a free block: under the
    /// gate held shared if there are no freed blocks to reuse (reads and writes in place go
    /// on), else exclusive.
    pub(super) fn grow(&self) -> Result<(), StoreError> {
        {
            let _s = self.shared();
            if self.table().reusable() == 0 {
                let _g = self.growing.lock().unwrap_or_else(|e| e.into_inner());
                if self.table().free_blocks() > 0 {
                    return Ok(());
                }
                return self.add_step();
            }
        }
        let _g = self.exclusive();
        if self.table().free_blocks() > 0 {
            return Ok(());
        }
        // The blocks whose space was to go back are overwritten now instead: no punch.
        let _overwritten = self.settle_locked(false)?;
        self.table().unhold_all();
        if self.table().free_blocks() > 0 {
            return Ok(());
        }
        self.add_step()
    }
}
