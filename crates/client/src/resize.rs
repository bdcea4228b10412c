//! Resizing a volume online: grow it while I/O goes on (a pause while every copy takes the
//! new size), or shrink it (the manager does that only through a writer of its own, with
//! nobody attached).
//!
//! 1. Hold the whole volume in the write order, then the membership lock (the order a resync
//!    takes them in): no request is in flight, none starts, no copy goes out or comes back.
//! 2. `ResizeReplica` to every copy taking writes (in sync or resyncing). If one refuses (no
//!    room, say) or does not answer, those that took the new size get the old one back and
//!    the resize fails: the volume is as it was. A copy that does not answer that either is
//!    taken out, as for a failed write: its size is unknown, and a copy in sync at another
//!    size would take a snapshot at it.
//! 3. The control plane records the size (compared with this writer's epoch). Only then do
//!    requests past the old end pass: a crash before this leaves copies larger than the
//!    record, whose tail nobody wrote, and the next writer gives them the recorded size.
//! 4. The writer takes the new size: new NBD connections see it (NBD has no way to tell a
//!    connected client; it reconnects).
//!
//! A shrink goes the other way: the size on record first, then the copies, and a copy that
//! fails to shrink is taken out (what a shrink drops is meant to go; growing the others back
//! would leave them zeros where that copy kept its bytes).
//!
//! A copy out of sync meanwhile is given the volume's size when its resync begins: its node
//! tells its size in its answer to the attach ([`Volume::match_size`]).

use bytes::Bytes;
use trireme_proto::{Op, FLAG_PREALLOCATE};
use trireme_transport::Connection;

use crate::{Volume, VolumeError};

impl Volume {
    /// Resizes the volume to `size` bytes (a non-zero multiple of 4 KiB; see the module docs).
    pub async fn resize(&self, size: u64) -> Result<(), VolumeError> {
        let r = self.resize_to(size).await;
        self.extents.changed();
        r
    }

    async fn resize_to(&self, size: u64) -> Result<(), VolumeError> {
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(VolumeError::BadSize(size));
        }
        let old = self.size();
        if size == old {
            return Ok(());
        }
        let _all = self.core.acquire(0, old).await;
        let g = self.membership_lock.lock().await;
        let targets = self.write_targets();
        if size < old {
            return self.shrink(old, size, &targets, g).await;
        }
        let failed = match self
            .to_all(&targets, self.resize_header(size), Bytes::new())
            .await
        {
            Err(e) => Some(e),
            Ok(()) => self.record_size(size).await.err(),
        };
        if let Some(e) = failed {
            // Every copy at the old size again, or out: a copy left at the new size and kept
            // in sync would give a snapshot taken next its size, not the volume's (simulator
            // seed 530199).
            let unsure = self.undo_resize(&targets, old).await;
            drop(g);
            self.take_out_unsure(&unsure).await;
            return Err(e);
        }
        self.took_size(old, size, targets.len());
        Ok(())
    }

    /// With the whole volume held and the membership lock (`g`): the size on record first,
    /// then the copies. What a shrink drops is meant to go, so a copy that fails to shrink is
    /// taken out (its resync gives it the size first) rather than the others grown back:
    /// growing back would give them zeros where the copy that failed kept its bytes.
    async fn shrink(
        &self,
        old: u64,
        size: u64,
        targets: &[usize],
        g: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<(), VolumeError> {
        self.record_size(size).await?;
        self.took_size(old, size, targets.len());
        let h = self.resize_header(size);
        let failed = self.logged(
            self.to_each(targets, h).await,
            "a copy did not shrink; taken out, its resync gives it the size",
        );
        drop(g);
        if failed.is_empty() {
            return Ok(());
        }
        self.take_out_with(&failed, None, false).await
    }

    /// Records `size` as the volume's, compared with this writer's epoch (none to record
    /// without a control plane).
    async fn record_size(&self, size: u64) -> Result<(), VolumeError> {
        let Some(m) = &self.membership else {
            return Ok(());
        };
        m.record_size(&self.info.name, self.info.epoch, size)
            .await
            .map_err(|e| VolumeError::Membership {
                volume: self.info.name.clone(),
                source: e,
            })
    }

    /// The writer takes the new size: requests up to it pass from now on.
    fn took_size(&self, old: u64, size: u64, copies: usize) {
        self.activity.grow(size);
        self.size.store(size, std::sync::atomic::Ordering::Release);
        tracing::info!(volume = %self.info.name, old, size, copies, "resized");
    }

    pub(crate) fn resize_header(&self, size: u64) -> trireme_proto::Header {
        let mut h = self.header(Op::ResizeReplica, 0, size);
        if self.info.preallocate {
            h.flags |= FLAG_PREALLOCATE;
        }
        h
    }

    /// Gives the copies the old size back after a failed grow (those that did not take the
    /// new one answer at once). Returns those that did not answer so: their size is unknown.
    async fn undo_resize(&self, targets: &[usize], old: u64) -> Vec<usize> {
        self.logged(
            self.to_each(targets, self.resize_header(old)).await,
            "giving a copy its size back after a failed resize",
        )
    }

    /// The copies that failed `what`, each logged with why.
    fn logged(&self, failed: Vec<(usize, VolumeError)>, what: &str) -> Vec<usize> {
        for (i, e) in &failed {
            tracing::warn!(volume = %self.info.name, node = self.node(*i), "{what}: {e}");
        }
        failed.into_iter().map(|(i, _)| i).collect()
    }

    /// Takes out the copies whose size a failed grow left unknown: nothing was written past
    /// the old end, so their history holds, and their resync gives them the size first.
    async fn take_out_unsure(&self, unsure: &[usize]) {
        if unsure.is_empty() {
            return;
        }
        if let Err(e) = self.take_out_with(unsure, None, false).await {
            tracing::warn!(volume = %self.info.name, "taking out copies of unknown size after a failed resize: {e}");
        }
    }

    /// Replica `i` (reached on `conn`, attached, `now` bytes long) at `size`, the volume's: a
    /// copy that was out while the volume was resized gets the size before a resync fills it.
    pub(crate) async fn match_size(
        &self,
        i: usize,
        conn: &dyn Connection,
        now: u64,
        size: u64,
    ) -> Result<(), VolumeError> {
        tracing::info!(
            volume = %self.info.name,
            node = self.node(i),
            from = now,
            size,
            "a copy of another size: resized before its resync"
        );
        self.call_on(i, conn, self.resize_header(size)).await?;
        Ok(())
    }
}
