//! The pool's growth. A redirect takes the lowest free block; when none is left, the pool
//! grows: the physical replica is resized (`Replica::resize`, under the gate held exclusive,
//! since the layers below keep writes out of a resize) and the table gets the new blocks.

use std::sync::atomic::Ordering;

use super::table::BLOCK;
use super::VersionedReplica;
use crate::StoreError;

impl VersionedReplica {
    /// Grows the pool (or reuses freed blocks) so a redirect finds a free block.
    pub(super) fn grow(&self) -> Result<(), StoreError> {
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
        let phys = self.inner.size();
        let add = self.grow_min.max(self.size.load(Ordering::Acquire) / 16) / BLOCK * BLOCK;
        self.inner.resize(phys + add)?;
        self.table().grow((phys + add) / BLOCK);
        tracing::debug!(volume = self.vol(), pool = phys + add, "snapshot pool grew");
        Ok(())
    }
}
