//! Resizing a volume online: grow it while I/O goes on (a pause while every copy takes the
//! new size), or shrink it (the manager does that only through a writer of its own, with
//! nobody attached).
//!
//! 1. Hold the whole volume in the write order, then the membership lock (the order a resync
//!    takes them in): no request is in flight, none starts, no copy goes out or comes back.
//! 2. `ResizeReplica` to every copy taking writes (in sync or resyncing). If one refuses (no
//!    room, say) or does not answer, those that took the new size get the old one back and
//!    the resize fails: the volume is as it was.
//! 3. The control plane records the size (compared with this writer's epoch). Only then do
//!    requests past the old end pass: a crash before this leaves copies larger than the
//!    record, whose tail nobody wrote, and the next resize covers it.
//! 4. The writer takes the new size: new NBD connections see it (NBD has no way to tell a
//!    connected client; it reconnects).
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
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(VolumeError::BadSize(size));
        }
        let old = self.size();
        if size == old {
            return Ok(());
        }
        let _all = self.core.acquire(0, old).await;
        let _g = self.membership_lock.lock().await;
        let targets = self.write_targets();
        if let Err(e) = self
            .to_all(&targets, self.resize_header(size), Bytes::new())
            .await
        {
            self.undo_resize(&targets, old).await;
            return Err(e);
        }
        if let Some(m) = &self.membership {
            if let Err(e) = m.record_size(&self.info.name, self.info.epoch, size).await {
                self.undo_resize(&targets, old).await;
                return Err(VolumeError::Membership {
                    volume: self.info.name.clone(),
                    source: e,
                });
            }
        }
        self.activity.grow(size);
        self.size.store(size, std::sync::atomic::Ordering::Release);
        tracing::info!(
            volume = %self.info.name,
            old,
            size,
            copies = targets.len(),
            "resized"
        );
        Ok(())
    }

    pub(crate) fn resize_header(&self, size: u64) -> trireme_proto::Header {
        let mut h = self.header(Op::ResizeReplica, 0, size);
        if self.info.preallocate {
            h.flags |= FLAG_PREALLOCATE;
        }
        h
    }

    /// Gives the copies the old size back after a failed resize (those that did not take the
    /// new one answer at once). A copy that fails this too is larger than the volume; nothing
    /// was written past the old end, and the next resize covers it.
    async fn undo_resize(&self, targets: &[usize], old: u64) {
        if let Err(e) = self
            .to_all(targets, self.resize_header(old), Bytes::new())
            .await
        {
            tracing::warn!(volume = %self.info.name, "giving a copy its size back after a failed resize: {e}");
        }
    }

    /// Replica `i` (reached on `conn`, attached, `now` bytes long) at the volume's size: a
    /// copy that was out while the volume was resized gets the size before a resync fills it.
    pub(crate) async fn match_size(
        &self,
        i: usize,
        conn: &dyn Connection,
        now: u64,
    ) -> Result<(), VolumeError> {
        let size = self.size();
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
