//! Rewriting a copy whose blocks failed their checksums from one that passes.

use bytes::Bytes;
use trireme_proto::Op;
use trireme_replication::ReplicaState;

use crate::{Volume, VolumeError};

impl Volume {
    /// Rewrites the blocks around `[off, off+len)` on the `bad` replicas (their copy failed its
    /// block checksums) from replica `good`, under the range's write lock so no write is
    /// undone. A replica the rewrite fails on is taken out.
    pub(crate) async fn repair(&self, bad: &[usize], good: usize, off: u64, len: u64) {
        let (a, e) = self.block_span(off, len);
        let _r = self.core.acquire(a, e).await;
        self.repair_held(bad, good, off, len).await
    }

    /// Whole 4 KiB blocks around `[off, off+len)`.
    pub(crate) fn block_span(&self, off: u64, len: u64) -> (u64, u64) {
        let a = off / 4096 * 4096;
        let e = (off + len).div_ceil(4096) * 4096;
        (a, e.min(self.size()))
    }

    /// [`Volume::repair`] for a caller that holds the blocks' range already.
    pub(crate) async fn repair_held(&self, bad: &[usize], good: usize, off: u64, len: u64) {
        let (a, e) = self.block_span(off, len);
        self.activity.touch(a, e - a);
        let data = match self.read_from(good, a, e - a).await {
            Ok(d) => d,
            Err(err) => {
                tracing::warn!(volume = %self.info.name, "cannot repair a bad copy: {err}");
                return;
            }
        };
        for &b in bad {
            if self.state(b) != ReplicaState::InSync {
                continue;
            }
            let h = self.recovery_header(Op::Write, a, e - a);
            match self
                .call(b, h, data.clone())
                .await
                .and_then(|f| self.expect_ok(b, f))
            {
                Ok(_) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(b), offset = a, bytes = e - a, from = self.node(good), "repaired a bad copy from a good one")
                }
                Err(err) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(b), "repairing a bad copy failed: {err}");
                    if self.membership.is_some() {
                        if let Err(e2) = self.take_out_with(&[b], Some((a, e - a)), false).await {
                            tracing::warn!(volume = %self.info.name, "{e2}");
                        }
                    }
                }
            }
        }
    }

    /// `[off, off+len)` as replica `src` holds it.
    pub(crate) async fn read_from(
        &self,
        src: usize,
        off: u64,
        len: u64,
    ) -> Result<Bytes, VolumeError> {
        let h = self.recovery_header(Op::Read, off, len);
        Ok(self
            .expect_ok(src, self.call(src, h, Bytes::new()).await?)?
            .payload)
    }

    /// The resyncing replica failed: back to outdated, with the range kept dirty.
    pub(crate) async fn replica_failed(
        &self,
        i: usize,
        off: u64,
        len: u64,
        e: VolumeError,
    ) -> VolumeError {
        if e.stops_writer() {
            return e;
        }
        if let Err(e2) = self.take_out_with(&[i], Some((off, len)), false).await {
            tracing::warn!(volume = %self.info.name, "taking a failed resync target out: {e2}");
        }
        e
    }
}
