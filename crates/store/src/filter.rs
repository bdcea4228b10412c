//! Pass-through for the stores and replicas that wrap others: the seal checker, the fault
//! injector, the disk model, the simulator's volatile cache and the tests' stalling store.
//! As an nbdkit filter calls `next`, a wrapper implements only what it changes, and every
//! other method goes to the one it wraps: a method added to [`Replica`] (a snapshot's, say)
//! reaches the store at the bottom through every wrapper without touching them.
//!
//! A wrapper implements [`ReplicaFilter`] (or [`StoreFilter`]) and is then a [`Replica`] (or a
//! [`Store`]). They are not re-exported at the crate's root, so that a glob import of it does
//! not put two methods of one name in scope; inside a filter's impl, both are (call the
//! wrapped replica's own, `self.inner.size()`, or name the trait). The stores at the bottom (file, memory, null, tiered) implement the traits
//! themselves, every method that has no default, so none is forgotten there.

use std::sync::Arc;

use crate::{BackingInfo, SnapshotInfo, StoreTiers, TierHint};
use crate::{Extent, Ledger, Pin, Replica, ReplicaTiers, Store, StoreError, StoreKind};

/// A replica that wraps [`ReplicaFilter::next`]. Each method's default passes the call on.
pub trait ReplicaFilter: Send + Sync + std::fmt::Debug {
    /// The replica this one wraps.
    fn next(&self) -> &dyn Replica;

    // Identity and bookkeeping.
    fn volume(&self) -> u64 {
        self.next().volume()
    }
    fn size(&self) -> u64 {
        self.next().size()
    }
    fn epoch(&self) -> u64 {
        self.next().epoch()
    }
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        self.next().set_epoch(epoch)
    }
    fn allocated_bytes(&self) -> u64 {
        self.next().allocated_bytes()
    }
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        self.next().resize(size)
    }
    fn reserve(&self, offset: u64, len: u64) {
        self.next().reserve(offset, len)
    }
    /// Not passed on: a wrapper that keeps bytes of its own (a cache, a clone's backing, a
    /// redirect) reads other than zeros where the store below has a hole. One whose reads are
    /// the store's below says so itself.
    fn hole(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    fn incarnation(&self) -> u64 {
        self.next().incarnation()
    }
    fn close(&self) -> Result<(), StoreError> {
        self.next().close()
    }
    fn ledger(&self) -> Option<Arc<dyn Ledger>> {
        self.next().ledger()
    }
    fn recover_seals(&self, suspect: &[(u64, u64)]) {
        self.next().recover_seals(suspect)
    }
    fn unclean_stop(&self) -> bool {
        self.next().unclean_stop()
    }
    fn bad_blocks(&self) -> crate::BadBlocks {
        self.next().bad_blocks()
    }

    // Block I/O.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.next().read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        self.next().write(offset, data, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        self.next().write_zeroes(offset, len, may_trim, fua)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.next().flush()
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        self.next().block_status(offset, len)
    }

    // Tiers.
    fn tiers(&self) -> Option<ReplicaTiers> {
        self.next().tiers()
    }
    fn tier_of(&self, offset: u64, len: u64) -> Option<TierHint> {
        self.next().tier_of(offset, len)
    }
    fn add_heat(&self, offset: u64, count: u32) {
        self.next().add_heat(offset, count)
    }
    fn set_pin(&self, pin: Pin) -> Result<(), StoreError> {
        self.next().set_pin(pin)
    }

    // Versions.
    fn snapshot(&self, id: u64, created: u64) -> Result<(), StoreError> {
        self.next().snapshot(id, created)
    }
    fn snapshot_unsynced(&self, id: u64, created: u64) -> Result<(), StoreError> {
        self.next().snapshot_unsynced(id, created)
    }
    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        self.next().snapshots()
    }
    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        self.next().delete_snapshot(id)
    }
    fn rollback(&self, id: u64) -> Result<(), StoreError> {
        self.next().rollback(id)
    }
    fn read_snapshot(&self, id: u64, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.next().read_snapshot(id, offset, buf)
    }
    fn snapshot_status(&self, id: u64, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        self.next().snapshot_status(id, offset, len)
    }
    fn changed(
        &self,
        from: u64,
        to: Option<u64>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        self.next().changed(from, to, offset, len)
    }

    // Clones.
    fn backing(&self) -> Option<BackingInfo> {
        self.next().backing()
    }
    fn set_backing(&self, parent: Arc<dyn Replica>, snapshot: u64) -> Result<(), StoreError> {
        self.next().set_backing(parent, snapshot)
    }
    fn link_backing(&self, parent: Arc<dyn Replica>) -> Result<(), StoreError> {
        self.next().link_backing(parent)
    }
    fn flatten(&self) -> Result<(), StoreError> {
        self.next().flatten()
    }
}

impl<F: ReplicaFilter> Replica for F {
    fn volume(&self) -> u64 {
        ReplicaFilter::volume(self)
    }
    fn size(&self) -> u64 {
        ReplicaFilter::size(self)
    }
    fn epoch(&self) -> u64 {
        ReplicaFilter::epoch(self)
    }
    fn set_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        ReplicaFilter::set_epoch(self, epoch)
    }
    fn allocated_bytes(&self) -> u64 {
        ReplicaFilter::allocated_bytes(self)
    }
    fn resize(&self, size: u64) -> Result<(), StoreError> {
        ReplicaFilter::resize(self, size)
    }
    fn reserve(&self, offset: u64, len: u64) {
        ReplicaFilter::reserve(self, offset, len)
    }
    fn hole(&self, offset: u64, len: u64) -> bool {
        ReplicaFilter::hole(self, offset, len)
    }
    fn incarnation(&self) -> u64 {
        ReplicaFilter::incarnation(self)
    }
    fn close(&self) -> Result<(), StoreError> {
        ReplicaFilter::close(self)
    }
    fn ledger(&self) -> Option<Arc<dyn Ledger>> {
        ReplicaFilter::ledger(self)
    }
    fn recover_seals(&self, suspect: &[(u64, u64)]) {
        ReplicaFilter::recover_seals(self, suspect)
    }
    fn unclean_stop(&self) -> bool {
        ReplicaFilter::unclean_stop(self)
    }
    fn bad_blocks(&self) -> crate::BadBlocks {
        ReplicaFilter::bad_blocks(self)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        ReplicaFilter::read(self, offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        ReplicaFilter::write(self, offset, data, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        ReplicaFilter::write_zeroes(self, offset, len, may_trim, fua)
    }
    fn flush(&self) -> Result<(), StoreError> {
        ReplicaFilter::flush(self)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        ReplicaFilter::block_status(self, offset, len)
    }
    fn tiers(&self) -> Option<ReplicaTiers> {
        ReplicaFilter::tiers(self)
    }
    fn tier_of(&self, offset: u64, len: u64) -> Option<TierHint> {
        ReplicaFilter::tier_of(self, offset, len)
    }
    fn add_heat(&self, offset: u64, count: u32) {
        ReplicaFilter::add_heat(self, offset, count)
    }
    fn set_pin(&self, pin: Pin) -> Result<(), StoreError> {
        ReplicaFilter::set_pin(self, pin)
    }
    fn snapshot(&self, id: u64, created: u64) -> Result<(), StoreError> {
        ReplicaFilter::snapshot(self, id, created)
    }
    fn snapshot_unsynced(&self, id: u64, created: u64) -> Result<(), StoreError> {
        ReplicaFilter::snapshot_unsynced(self, id, created)
    }
    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        ReplicaFilter::snapshots(self)
    }
    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        ReplicaFilter::delete_snapshot(self, id)
    }
    fn rollback(&self, id: u64) -> Result<(), StoreError> {
        ReplicaFilter::rollback(self, id)
    }
    fn read_snapshot(&self, id: u64, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        ReplicaFilter::read_snapshot(self, id, offset, buf)
    }
    fn snapshot_status(&self, id: u64, offset: u64, len: u64) -> Result<Vec<Extent>, StoreError> {
        ReplicaFilter::snapshot_status(self, id, offset, len)
    }
    fn changed(
        &self,
        from: u64,
        to: Option<u64>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        ReplicaFilter::changed(self, from, to, offset, len)
    }
    fn backing(&self) -> Option<BackingInfo> {
        ReplicaFilter::backing(self)
    }
    fn set_backing(&self, parent: Arc<dyn Replica>, snapshot: u64) -> Result<(), StoreError> {
        ReplicaFilter::set_backing(self, parent, snapshot)
    }
    fn link_backing(&self, parent: Arc<dyn Replica>) -> Result<(), StoreError> {
        ReplicaFilter::link_backing(self, parent)
    }
    fn flatten(&self) -> Result<(), StoreError> {
        ReplicaFilter::flatten(self)
    }
}

/// A store that wraps [`StoreFilter::next`]. `create` and `open_all` have no default: a
/// wrapper that forgot them would hand out the replicas it exists to wrap, unwrapped.
pub trait StoreFilter: Send + Sync + std::fmt::Debug {
    /// The store this one wraps.
    fn next(&self) -> &dyn Store;
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError>;
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>>;

    fn kind(&self) -> StoreKind {
        self.next().kind()
    }
    fn blocking(&self) -> bool {
        self.next().blocking()
    }
    fn preallocate(&self, volume: u64) -> Result<(), StoreError> {
        self.next().preallocate(volume)
    }
    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        self.next().delete(volume)
    }
    fn tiers(&self) -> Option<StoreTiers> {
        self.next().tiers()
    }
}

impl<F: StoreFilter> Store for F {
    fn kind(&self) -> StoreKind {
        StoreFilter::kind(self)
    }
    fn blocking(&self) -> bool {
        StoreFilter::blocking(self)
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        StoreFilter::create(self, volume, size)
    }
    fn preallocate(&self, volume: u64) -> Result<(), StoreError> {
        StoreFilter::preallocate(self, volume)
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        StoreFilter::open_all(self)
    }
    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        StoreFilter::delete(self, volume)
    }
    fn tiers(&self) -> Option<StoreTiers> {
        StoreFilter::tiers(self)
    }
}
