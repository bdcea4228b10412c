//! The minimum of in-sync copies: below it, writes wait rather than go on with too few.
//!
//! Taking a failed replica out keeps the volume writable (`failover.rs`), but each take-out
//! leaves fewer copies holding the next writes: after a one-second hiccup on two nodes of a
//! 3-way volume, a single disk would hold everything written from then on. So a volume has a
//! minimum (`--min-copies`; default one fewer than its replicas: 2 of 3, 1 of 2). When fewer
//! in-sync copies remain, every write, write-zeroes and flush *waits*: a new one before it is
//! sent, and the one whose failure took the copy out after its survivors hold it — not failed,
//! not acknowledged — until a copy is back in sync (the resync runs meanwhile: waiting writes
//! hold no range) or an operator lowers the minimum (`trireme volume set VOL --min-copies N`).
//! Reads go on. `status` shows the volume's writes as suspended; the log says so once when
//! they stop and once when they resume. This is DRBD's `on-no-quorum suspend-io`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use trireme_replication::{Copies as Check, CopiesChange};

use crate::{Volume, VolumeError};

/// How often a waiting write looks again (a resync's end also wakes it at once).
const RECHECK: Duration = Duration::from_millis(100);
/// How often waiting writes re-read the minimum from the metadata (it may have been lowered
/// by an operator through another process).
const REREAD: Duration = Duration::from_secs(1);

/// The waiting side of the rule (the rule itself, the minimum and whether writes are
/// suspended, is the core's).
#[derive(Debug, Default)]
pub(crate) struct Copies {
    changed: tokio::sync::Notify,
    /// Writes at the gate (waiting, or passing it): while there are any, a new write queues
    /// behind them rather than overtake them.
    pub(crate) at_gate: AtomicUsize,
}

impl Copies {
    /// Wakes waiting writes to look again (a copy came back, the minimum changed).
    pub(crate) fn wake(&self) {
        self.changed.notify_waiters();
    }

    /// Counts a write at the gate until the guard is dropped.
    pub(crate) fn at_gate(&self) -> AtGate<'_> {
        self.at_gate.fetch_add(1, Ordering::AcqRel);
        AtGate(&self.at_gate)
    }
}

pub(crate) struct AtGate<'a>(&'a AtomicUsize);

impl Drop for AtGate<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Volume {
    /// The minimum of in-sync copies in force.
    pub fn min_copies(&self) -> u32 {
        self.core().min_copies()
    }

    /// Sets the minimum of in-sync copies (from the manager, or re-read from the metadata).
    pub fn set_min_copies(&self, n: u32) {
        let changed = self.core().set_min_copies(n);
        if changed {
            tracing::info!(volume = %self.info.name, min_copies = n.max(1), "min copies changed");
            self.copies.wake();
        }
    }

    /// True while writes wait for copies (for `status`).
    pub fn writes_suspended(&self) -> bool {
        self.core().suspended()
    }

    /// True once the writer may not go on (fenced or refused).
    pub fn is_stopped(&self) -> bool {
        self.core().stopped()
    }

    /// The writer may not go on (fenced or refused): writes waiting for copies fail.
    pub(crate) fn stop_writes(&self) {
        self.core().stop();
        self.copies.wake();
    }

    /// Returns once at least the minimum of copies `request` needs is in sync (at once,
    /// nearly always; a parity volume's data counts its region's mirrors).
    pub(crate) async fn enough_copies(
        &self,
        request: trireme_replication::Mirrored,
    ) -> Result<(), VolumeError> {
        let mut reread = Instant::now();
        loop {
            let changed = self.copies.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (check, change) = self.core().check_copies_for(request);
            match (check, change) {
                (Check::Stopped, _) => return Err(VolumeError::Stopped(self.info.name.clone())),
                (Check::Enough, change) => {
                    if change == Some(CopiesChange::Resumed) {
                        tracing::warn!(volume = %self.info.name, min_copies = self.min_copies(), "writes resumed");
                    }
                    return Ok(());
                }
                (Check::Short { have, need }, change) => {
                    if change == Some(CopiesChange::Suspended) {
                        tracing::warn!(
                            volume = %self.info.name,
                            in_sync = have,
                            min_copies = need,
                            "writes suspended: fewer in-sync copies than the minimum; they wait for a copy to come back (or `trireme volume set {} --min-copies N`)",
                            self.info.name
                        );
                    }
                }
            }
            if reread.elapsed() >= REREAD {
                reread = Instant::now();
                if let Some(m) = &self.membership {
                    if let Ok(info) = m.locate(&self.info.name).await {
                        if info.min_copies > 0 {
                            self.set_min_copies(info.min_copies);
                        }
                    }
                    continue;
                }
            }
            let _ = tokio::time::timeout(RECHECK, changed).await;
        }
    }
}
