//! When no in-sync copy answers: the request waits for one to answer again, rather than fail.
//!
//! A request whose every in-sync copy went unanswered — each timed out or lost its link, none
//! refused it or failed it in its store — cannot be acknowledged, and no copy can be taken out
//! (that takes an in-sync copy that holds the request). Before, it failed with EIO at once: a
//! node that restarted under a 2-way volume whose other copy was out, or a copy slow for one
//! replica timeout while the others were out, cost the guest an I/O error. Now it waits, as
//! DRBD's `suspend-io` and dm-multipath's `queue_if_no_path` do, up to the volume's
//! `reattach_wait` (30 s by default), and tries again once a copy answers:
//!
//! * a copy whose link is closed is linked again: a new connection and an attach at this
//!   writer's epoch (refused if the writer was fenced meanwhile, which stops the wait);
//! * a copy whose link is open but did not answer in time is linked again once it answers a
//!   cheap question (`ReplicaInfo`) again.
//!
//! Linking again is what makes trying again safe. The node answers the attach only after
//! every request it admitted before has finished, and refuses any later one of the old
//! connection (`node/src/serve.rs`, `io_replica`), so a write given up on can never land after
//! its retry and a newer write in the same place. And the copy must answer with the
//! incarnation recorded for it: the same history. A node that restarted after a power loss,
//! or whose store failed a sync, has a new one; what it acknowledged may be gone, so it is
//! never used again as in sync, and the request fails as before.
//!
//! Every in-sync copy is looked at, at once, so the retry reaches all that answer; one relink
//! of a copy at a time, which the waiting requests share.
//!
//! The resync task links again, every tick, the in-sync copies whose link closed and that
//! could not be taken out (`relink_closed`): below the minimum of copies no request may reach
//! them, and the resyncs that would end the wait read the survivors' records through them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use trireme_proto::{Op, Status};

use crate::{Volume, VolumeError};

/// The first pause between two looks at the copies; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What one look at an in-sync copy found.
enum Look {
    /// It answers, with its history: try the request again.
    Answers,
    /// It does not answer yet.
    Silent,
    /// It answers with another history than recorded: what it acknowledged may be lost.
    /// Its new link and incarnation, in case it must stay in sync all the same.
    LostHistory(crate::resync::Reattached),
}

impl VolumeError {
    /// The copy never answered the request: it timed out, its link broke, or the link was
    /// replaced under it. It may answer a retry.
    pub(crate) fn unanswered(&self) -> bool {
        matches!(
            self,
            VolumeError::Timeout { .. }
                | VolumeError::Transport { .. }
                | VolumeError::Stranded { .. }
                | VolumeError::Replica {
                    status: Status::Superseded,
                    ..
                }
        )
    }
}

impl Volume {
    /// Waits, after a request found no in-sync copy answering, until one answers again with
    /// its history (see the module docs). `since`: when the request began to wait; `sent_at`:
    /// when it was last sent (a copy linked again after that, by any request, is tried at
    /// once: the request may have failed only because its link was replaced). `Ok(true)`: try
    /// the request again; `Ok(false)`: give up (the wait is over, or no copy can serve);
    /// `Err`: this writer was fenced meanwhile. `need`: the copies it waits for (those that
    /// went silent when the rest cannot serve it without them: a parity volume's K); empty,
    /// any copy in sync.
    pub(crate) async fn copy_answers_again(
        &self,
        since: Instant,
        sent_at: Instant,
        need: &[usize],
    ) -> Result<bool, VolumeError> {
        let limit = self.opts.reattach_wait;
        if self.membership.is_none() || limit.is_zero() {
            return Ok(false);
        }
        let mut pause = FIRST_PAUSE;
        loop {
            let mut in_sync = self.in_sync();
            if in_sync.is_empty() || self.core().stopped() {
                return Ok(false);
            }
            if !need.is_empty() {
                in_sync.retain(|i| need.contains(i));
                if in_sync.is_empty() {
                    // Taken out meanwhile (enough others came back): try again.
                    return Ok(true);
                }
            }
            if !self.waiting_said.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    volume = %self.info.name,
                    wait_s = limit.as_secs_f64(),
                    "no in-sync copy answers: requests wait for one to answer again"
                );
            }
            // Every copy in sync is looked at (at once), so a retry goes to all that answer:
            // one left out would be taken out by the retry and need a resync.
            let looks = crate::join_all(
                in_sync
                    .iter()
                    .map(|&i| {
                        Box::pin(async move { (i, self.look(i, sent_at).await) })
                            as crate::membership::BoxFut<'_, (usize, Result<Look, VolumeError>)>
                    })
                    .collect(),
            )
            .await;
            let mut lost = 0;
            let mut answered = None;
            for (i, look) in looks {
                match look? {
                    Look::Answers => answered = answered.or(Some(i)),
                    Look::LostHistory(r) => match self.lost_history(i, r).await? {
                        true => answered = answered.or(Some(i)),
                        false => lost += 1,
                    },
                    Look::Silent => {}
                }
            }
            if let Some(i) = answered {
                if self.waiting_said.swap(false, Ordering::Relaxed) {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "an in-sync copy answers again: requests go on");
                }
                return Ok(true);
            }
            if lost == in_sync.len() {
                // Every copy in sync lost its history: what they acknowledged may be gone.
                self.waiting_said.store(false, Ordering::Relaxed);
                return Ok(false);
            }
            let left = limit.saturating_sub(since.elapsed());
            if left.is_zero() {
                tracing::error!(
                    volume = %self.info.name,
                    waited_s = limit.as_secs_f64(),
                    "no in-sync copy answered in time: the request fails"
                );
                self.waiting_said.store(false, Ordering::Relaxed);
                return Ok(false);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// The copies a request's failure `e` says it waits for ([`Volume::copy_answers_again`]'s
    /// `need`): those named by [`VolumeError::WaitForCopies`]; none (any copy) otherwise.
    pub(crate) fn slots_of(&self, e: &VolumeError) -> Vec<usize> {
        match e {
            VolumeError::WaitForCopies { waiting, .. } => {
                let core = self.core();
                waiting.iter().filter_map(|&n| core.slot_of(n)).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Links again, from the resync task, each in-sync copy in `closed` (their links are
    /// closed) that could not be taken out: the last copies in sync. No request would: below
    /// the minimum of copies writes wait before they reach a copy, reads may all be waiting
    /// behind them, and a resync asks the survivors for their records over their links. A
    /// copy that restarted while the volume was in that state kept its old link, and every
    /// resync failed on it until the wait of some read ran out (an etcd test, once).
    pub(crate) async fn relink_closed(&self, closed: &[usize]) -> Result<(), VolumeError> {
        for &i in closed {
            if self.state(i) != trireme_replication::ReplicaState::InSync {
                continue;
            }
            match self.look(i, Instant::now()).await? {
                Look::LostHistory(r) => {
                    self.lost_history(i, r).await?;
                }
                Look::Answers | Look::Silent => {}
            }
        }
        Ok(())
    }

    /// In-sync copy `i` answered with another history than recorded: out for a full resync, if
    /// it can be taken out (another copy in sync tracks it); never used as in sync again
    /// either way — unless too few would stay in sync without it (a parity volume's K: more
    /// than M copies lost power): then it stays, linked again as `r` says, until its mirrors
    /// are made to agree with copies that kept their history ([`Volume::keep_lost`]). True if
    /// it stays.
    async fn lost_history(
        &self,
        i: usize,
        r: crate::resync::Reattached,
    ) -> Result<bool, VolumeError> {
        tracing::error!(volume = %self.info.name, node = self.node(i), "the in-sync copy came back with another history (a power loss, or a failed sync): what it acknowledged may be lost");
        match self.take_out_with(&[i], None, true).await {
            Err(VolumeError::WaitForCopies { .. }) => Ok(self.keep_lost(vec![(i, r)]) > 0),
            Err(e) if e.stops_writer() => Err(e),
            _ => Ok(false),
        }
    }

    /// One look at in-sync copy `i` for a request sent at `sent_at`: linked again if it
    /// answers, unless another request did so since.
    async fn look(&self, i: usize, sent_at: Instant) -> Result<Look, VolumeError> {
        if let Some(c) = self.conn(&self.slots[i]).filter(|c| !c.is_closed()) {
            // Open but silent: linked again only once it answers at all.
            let h = self.header(Op::ReplicaInfo, 0, 0);
            let f = match tokio::time::timeout(self.opts.replica_timeout, c.call(h, Bytes::new()))
                .await
            {
                Ok(Ok(f)) if f.header.status == Status::Ok => f,
                _ => return Ok(Look::Silent),
            };
            if f.header.epoch > self.info.epoch {
                return Err(VolumeError::Fenced {
                    volume: self.info.name.clone(),
                    ours: self.info.epoch,
                    newer: f.header.epoch,
                });
            }
        }
        let mut last = self.slots[i].relink.lock().await;
        if self.state(i) != trireme_replication::ReplicaState::InSync {
            // Taken out meanwhile: the resync brings it back.
            return Ok(Look::Silent);
        }
        if last.is_some_and(|t| t >= sent_at) {
            // Linked again after this request was sent: try the new link.
            return Ok(Look::Answers);
        }
        let (conn, incarnation) = match self.reattach(i).await {
            Ok(r) => (r.conn, r.incarnation),
            Err(e) if e.stops_writer() => return Err(e),
            Err(e) => {
                tracing::debug!(volume = %self.info.name, node = self.node(i), "linking the in-sync copy again: {e}");
                return Ok(Look::Silent);
            }
        };
        let recorded = self.core().incarnation(i);
        if recorded == 0 || incarnation != recorded {
            let size = self.size();
            return Ok(Look::LostHistory(crate::resync::Reattached {
                conn,
                incarnation,
                size,
            }));
        }
        self.set_conn(i, Some(conn));
        *last = Some(Instant::now());
        tracing::info!(volume = %self.info.name, node = self.node(i), "linked the in-sync copy again");
        Ok(Look::Answers)
    }
}
