//! Writes refused for want of space.
//!
//! A node keeps the last part of its file system in reserve and refuses a write that would eat
//! into it, before writing anything (`NoSpace`, see `node/src/room.rs`). The writer never takes
//! a copy out for that: the copy is well, its device full. What it does is the replication
//! core's decision (`trireme_replication::decide`): with no copy written the write fails,
//! ENOSPC to the guest; if another copy wrote it, the full ones get it again with leave to use
//! their reserve, so the copies never differ over it.
//!
//! From the first refusal on, the volume is *full*: new writes and write-zeroes fail at once
//! with ENOSPC, without being sent (trims, which give space back, flushes and reads go on).
//! Otherwise a copy on a full node next to copies with room would be sent every write twice,
//! the second time from its reserve, until the reserve too was gone. The failure task asks
//! the copies every tick whether they would take a write as large as the largest refused now
//! (a write of no bytes whose header gives that length: the node admits or refuses it as
//! such a write and then does nothing with it); once every one would, writes resume by
//! themselves: the operator deleted a snapshot or a volume, or added room.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use trireme_proto::{Header, Op, Status, FLAG_MAY_TRIM};

use crate::{Volume, VolumeError};

impl Volume {
    /// Whether `h` would take space: a write, or zeroes written rather than trimmed.
    pub(crate) fn takes_space(h: &Header) -> bool {
        h.op == Op::Write || (h.op == Op::WriteZeroes && h.flags & FLAG_MAY_TRIM == 0)
    }

    /// `Err` (ENOSPC) for a request that takes space while the volume is full.
    pub(crate) fn check_space(&self, h: &Header) -> Result<(), VolumeError> {
        if Self::takes_space(h) && self.full.load(Ordering::Acquire) {
            return Err(VolumeError::Full(self.info.name.clone()));
        }
        Ok(())
    }

    /// A copy refused a write of `len` bytes for want of space (on `nodes`): the volume is
    /// full until a write of that size would be taken again.
    pub(crate) fn space_refused(&self, nodes: &[u32], len: u64) {
        self.full_len.fetch_max(len, Ordering::AcqRel);
        if !self.full.swap(true, Ordering::AcqRel) {
            tracing::warn!(volume = %self.info.name, ?nodes, "writes fail with ENOSPC: no space left on the copies' nodes; they resume by themselves once there is (delete snapshots or volumes, or add room)");
        }
    }

    /// While the volume is full: asks every copy that takes writes whether it would take one
    /// now, and lets writes through again once every copy would.
    pub(crate) async fn check_space_again(&self) {
        if !self.full.load(Ordering::Acquire) {
            return;
        }
        let targets = self.write_targets();
        if targets.is_empty() {
            return;
        }
        // A write of no bytes: the node admits or refuses it as a write of the header's
        // length, the largest refused, and writes nothing.
        let h = self.header(Op::Write, 0, self.full_len.load(Ordering::Acquire));
        let answers = self.call_each(&targets, h, Bytes::new()).await;
        let room = answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|f| f.header.status == Status::Ok));
        if room && self.full.swap(false, Ordering::AcqRel) {
            self.full_len.store(0, Ordering::Release);
            tracing::info!(volume = %self.info.name, "every copy has room again: writes resume");
        }
    }
}
