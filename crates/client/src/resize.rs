//! Resizing a volume online: grow it while I/O goes on (a pause while every copy takes the
//! new size), or shrink it (the manager does that only through a writer of its own, with
//! nobody attached).
//!
//! The writer holds the whole volume in the write order, then the membership lock (the order
//! a resync takes them in): no request is in flight, none starts, no copy goes out or comes
//! back. Then it carries out the replication core's [`ResizePlan`](trireme_replication::ResizePlan),
//! which says in which order the copies (every copy taking writes, in sync or resyncing) and
//! the record take the size, and what a failure undoes: a grow goes to the copies, then the
//! record (compared with this writer's epoch), then the writer, whose requests past the old
//! end pass only then; a failed grow gives every copy the old size back and takes out those
//! that do not take it. A shrink goes the other way: the record, the writer, then the copies,
//! and one that fails to shrink is taken out. New NBD connections see the new size (NBD has no
//! way to tell a connected client; it reconnects).
//!
//! A copy out of sync meanwhile is given the volume's size when its resync begins: its node
//! tells its size in its answer to the attach ([`Volume::match_size`]).

use trireme_proto::{Op, FLAG_PREALLOCATE};
use trireme_replication::{ResizeEnd, ResizeStep};
use trireme_transport::Connection;

use crate::{Volume, VolumeError};

impl Volume {
    /// Resizes the volume to `size` bytes (a non-zero multiple of 4 KiB; see the module docs).
    pub async fn resize(&self, size: u64) -> Result<(), VolumeError> {
        let r = self.resize_to(size).await;
        self.extents.changed();
        r
    }

    /// Carries out the core's [`ResizePlan`] (see the module docs for its order).
    async fn resize_to(&self, size: u64) -> Result<(), VolumeError> {
        self.mirror_only("resizing")?;
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(VolumeError::BadSize(size));
        }
        let old = self.size();
        if size == old {
            return Ok(());
        }
        let _all = self.core.acquire(0, old).await;
        let mut g = Some(self.membership_lock.lock().await);
        let mut plan = self.core().resize(old, size);
        // The resize's failure, the first one.
        let mut failure: Option<VolumeError> = None;
        let mut copies = 0;
        loop {
            match plan.step() {
                ResizeStep::Send { targets, size: to } => {
                    copies = targets.len();
                    let failed = self.to_each(&targets, self.resize_header(to)).await;
                    let why = match (to == size, size > old) {
                        (true, true) => "a copy did not grow",
                        (true, false) => {
                            "a copy did not shrink; taken out, its resync gives it the size"
                        }
                        (false, _) => "giving a copy its size back after a failed resize",
                    };
                    let failed = self.logged(failed, why, &mut failure);
                    plan.answered(&failed);
                }
                ResizeStep::Record(to) => {
                    let r = self.record_size(to).await;
                    plan.recorded(r.is_ok());
                    if let Err(e) = r {
                        failure.get_or_insert(e);
                    }
                }
                ResizeStep::Take(to) => self.took_size(old, to, copies),
                ResizeStep::TakeOut(out) => {
                    // Taking out takes the membership lock itself.
                    drop(g.take());
                    let r = self.take_out_with(&out, None, false).await;
                    plan.taken_out(r.is_ok());
                    match r {
                        Err(e) if size > old => {
                            tracing::warn!(volume = %self.info.name, "taking out copies of unknown size after a failed resize: {e}")
                        }
                        Err(e) => failure = Some(e),
                        Ok(()) => {}
                    }
                }
                ResizeStep::Done(ResizeEnd::Resized) => return Ok(()),
                ResizeStep::Done(ResizeEnd::Failed | ResizeEnd::TakeOutFailed) => {
                    return Err(
                        failure.unwrap_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))
                    )
                }
            }
        }
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

    /// The header that gives a copy the size of a volume of `size` bytes.
    pub(crate) fn resize_header(&self, size: u64) -> trireme_proto::Header {
        let mut h = self.header(Op::ResizeReplica, 0, self.replica_size(size));
        if self.info.preallocate {
            h.flags |= FLAG_PREALLOCATE;
        }
        h
    }

    /// The copies that failed (each logged with why: `what`), the first failure kept in
    /// `first`.
    fn logged(
        &self,
        failed: Vec<(usize, VolumeError)>,
        what: &str,
        first: &mut Option<VolumeError>,
    ) -> Vec<usize> {
        let mut out = Vec::with_capacity(failed.len());
        for (i, e) in failed {
            tracing::warn!(volume = %self.info.name, node = self.node(i), "{what}: {e}");
            out.push(i);
            first.get_or_insert(e);
        }
        out
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
