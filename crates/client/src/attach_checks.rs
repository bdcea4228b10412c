//! What an attach checks of the in-sync copies before any request: that they answer, at the
//! size on record, with the history on record (incarnations), and when to wait for those
//! that did not answer rather than take them out.

use super::*;

impl Volume {
    /// Attaches every in-sync replica; with a control plane, one that refuses or fails is
    /// taken out instead of failing the attach (as long as one stays in sync).
    pub(crate) async fn attach_all(&self) -> Result<(), VolumeError> {
        let targets = self.in_sync();
        let h = self.header(Op::Attach, 0, 0);
        let replies = self.call_each(&targets, h, Bytes::new()).await;
        let mut failed = Vec::new();
        // In sync on record but with another incarnation than recorded: its history is lost.
        let mut lost = Vec::new();
        // In sync, with no incarnation on record yet.
        let mut unrecorded = Vec::new();
        // In sync, of another size than recorded.
        let mut sized = Vec::new();
        for (k, r) in replies.into_iter().enumerate() {
            let i = targets[k];
            match r.and_then(|f| self.expect_ok(i, f)) {
                Ok(f) => {
                    let a = trireme_proto::AttachAnswer::read(&f.header);
                    let now = a.incarnation;
                    if let Some(s) = a.size.filter(|&s| s != self.replica_size(self.size())) {
                        sized.push((i, s));
                    }
                    self.core().attached(i, now);
                    match self.info.replicas[i].incarnation {
                        0 => unrecorded.push((i, now)),
                        was if was != now => lost.push(i),
                        _ => {}
                    }
                }
                Err(e) if e.stops_writer() => return Err(e),
                Err(e) if self.membership.is_none() => return Err(e),
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "attach failed: {e}");
                    failed.push(i);
                }
            }
        }
        // A writer that died between resizing the copies and recording the size left them
        // of another size than the record, which is the volume's: before any write, each is
        // given it (otherwise a snapshot taken there would have the copy's size, not the
        // volume's, and differ between copies).
        for (i, was) in sized {
            let h = self.resize_header(self.size());
            match self
                .call(i, h, Bytes::new())
                .await
                .and_then(|f| self.expect_ok(i, f))
            {
                Ok(_) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), was, size = self.size(), "a copy of another size than recorded (a writer died resizing it): given the volume's");
                }
                Err(e) if e.stops_writer() => return Err(e),
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "resizing a copy of another size than recorded: {e}");
                    failed.push(i);
                }
            }
        }
        self.wait_for_copies(&targets, &failed, &lost)?;
        if !failed.is_empty() {
            // After an unclean writer change, a replica that cannot be reached may hold a write
            // the dead writer had in flight that the others never got: what it missed is not
            // just what comes after now, so it gets a full (compare) resync.
            self.take_out_with(&failed, None, self.info.reconcile)
                .await?;
        }
        self.check_incarnations(&lost, &unrecorded).await?;
        self.send_claims().await;
        tracing::info!(volume = %self.info.name, epoch = self.info.epoch, replicas = self.in_sync().len(), "attached");
        Ok(())
    }

    /// Refuses the attach, changing nothing, when in-sync copies did not answer and taking
    /// them out would lose what the others cannot give: every copy that answered lost its
    /// history (a node that lost power came back before the ones that merely crashed), or
    /// those that answered cannot serve every region of a parity volume (more than M nodes
    /// still down after a crash of the whole cluster). The attach is tried again once they
    /// are back, as one that reached no copy.
    fn wait_for_copies(
        &self,
        targets: &[usize],
        failed: &[usize],
        lost: &[usize],
    ) -> Result<(), VolumeError> {
        let answered: Vec<&usize> = targets.iter().filter(|i| !failed.contains(i)).collect();
        if failed.is_empty() || answered.is_empty() || self.membership.is_none() {
            return Ok(());
        }
        let why = if answered.iter().all(|i| lost.contains(i)) || self.region_lost(failed, lost) {
            WaitReason::LostHistory
        } else if !self.core().serves_without(failed) {
            WaitReason::CannotServe
        } else {
            return Ok(());
        };
        let waiting: Vec<u32> = failed.iter().map(|&i| self.node(i)).collect();
        tracing::warn!(volume = %self.info.name, ?waiting, "attach waits for copies that did not answer: {why}");
        Err(VolumeError::WaitForCopies {
            volume: self.info.name.clone(),
            waiting,
            why,
        })
    }

    /// Whether some region of a parity volume has mirrors in sync that did not answer
    /// (`failed`) while every one that answered lost its history (`lost`): the ones that
    /// did not may hold that region's writes the others lost (a node that lost power came
    /// back before one of the region's that merely crashed; simulator seed 17312).
    fn region_lost(&self, failed: &[usize], lost: &[usize]) -> bool {
        if self.parity.is_none() || lost.is_empty() {
            return false;
        }
        let s = self.stripes();
        let in_sync = self.in_sync();
        let regions = self.size().div_ceil(s.region_blocks() * 4096);
        // The mirrors' places rotate with the region: one turn of the stripe's width covers
        // every pattern.
        (0..regions.min(s.width() as u64)).any(|r| {
            let mirrors: Vec<usize> = in_sync
                .iter()
                .copied()
                .filter(|&i| s.mirrors(r, self.node(i)))
                .collect();
            let (silent, answering): (Vec<usize>, Vec<usize>) =
                mirrors.iter().partition(|i| failed.contains(i));
            !silent.is_empty()
                && !answering.is_empty()
                && answering.iter().all(|i| lost.contains(i))
        })
    }

    /// A replica in sync on record that comes back with another incarnation than the one
    /// recorded lost what it held since (a power loss, a wiped or re-created store) — say, while
    /// its take-out could not be recorded and the writer then died. It must neither serve
    /// reads nor be a reconciliation's source: it is taken out with its history lost (a full
    /// compare resync), unless no in-sync replica kept its history, when none can be preferred
    /// and all stay. In-sync replicas with no incarnation on record get theirs recorded.
    ///
    /// A parity volume's copies also all stay when the others cannot serve every region
    /// without them (more than M lost power at once): out, they could never be rebuilt, as a
    /// chunk is rebuilt from K in sync. Their chunks hold: a stripe is flushed on every node
    /// before its region is switched to it, and only an unswitched slot is written after. Their
    /// mirrored parts may have lost unflushed writes: the reconcile that follows copies each
    /// region's from a mirror that kept its history, where one did ([`Volume::kept_lost`]).
    async fn check_incarnations(
        &self,
        lost: &[usize],
        unrecorded: &[(usize, u64)],
    ) -> Result<(), VolumeError> {
        let Some(m) = self.membership.clone() else {
            return Ok(());
        };
        let in_sync = self.in_sync();
        let lost: Vec<usize> = lost
            .iter()
            .copied()
            .filter(|i| in_sync.contains(i))
            .collect();
        if !lost.is_empty() {
            if lost.len() == in_sync.len() {
                tracing::error!(volume = %self.info.name, "every in-sync replica has another incarnation than recorded: none kept its history, so none is preferred");
                *self.kept_lost.lock().unwrap_or_else(|e| e.into_inner()) = lost;
            } else if !self.core().serves_without(&lost) {
                let nodes: Vec<u32> = lost.iter().map(|&i| self.node(i)).collect();
                tracing::error!(volume = %self.info.name, ?nodes, "in-sync copies came back with another history than recorded (a power loss), more than the parity layout can rebuild: they stay in sync, their stripes' chunks serve, and their mirrored parts are reconciled from the copies that kept theirs");
                *self.kept_lost.lock().unwrap_or_else(|e| e.into_inner()) = lost;
            } else {
                for &i in &lost {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "replica lost its history since it was last in sync (another incarnation): it gets a full resync");
                }
                self.take_out_with(&lost, None, true).await?;
            }
        }
        self.record_incarnations(&m, unrecorded).await;
        Ok(())
    }

    /// Records each copy's incarnation beside its state in sync (those in sync still).
    async fn record_incarnations(&self, m: &Arc<dyn Membership>, copies: &[(usize, u64)]) {
        for &(i, inc) in copies {
            if self.state(i) != ReplicaState::InSync {
                continue;
            }
            if let Err(e) = m
                .set_state(
                    &self.info.name,
                    self.info.epoch,
                    self.node(i),
                    ReplicaState::InSync,
                    inc,
                )
                .await
            {
                tracing::warn!(volume = %self.info.name, node = self.node(i), "recording the replica's incarnation: {e}");
            }
        }
    }

    /// The in-sync copies kept at attach with their history lost (see `check_incarnations`).
    pub(crate) fn kept_lost(&self) -> Vec<usize> {
        self.kept_lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Once reconciled, the copies kept with their history lost have the new one recorded:
    /// the next writer then finds them as they are, not lost again.
    pub(crate) async fn record_kept_lost(&self) {
        self.record_kept(&self.kept_lost()).await;
    }

    /// [`Volume::record_kept_lost`] for `kept` alone (others may have been kept since).
    pub(crate) async fn record_kept(&self, kept: &[usize]) {
        self.kept_lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|i| !kept.contains(i));
        let Some(m) = self.membership.clone() else {
            return;
        };
        let kept: Vec<(usize, u64)> = kept
            .iter()
            .map(|&i| (i, self.core().incarnation(i)))
            .collect();
        self.record_incarnations(&m, &kept).await;
    }
}
