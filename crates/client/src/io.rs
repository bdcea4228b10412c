//! The I/O path: mirrored writes, write-zeroes and flushes to every write target, reads from
//! one in-sync replica with fall-over, extents and checksums.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::time::Instant;
use trireme_proto::{Extent, Header, Op, FLAG_FUA, FLAG_MAY_TRIM};
use trireme_replication::qos::{Cost, Dir};
use trireme_replication::{
    check_io, Answers, Decision, Mirrored, ReplicaOutcome, ReplicaState, WriteFailure,
};
use trireme_transport::Frame;

use crate::core::{Answered, Place, Submitted};
use crate::error::outcome_of;
use crate::{join_all, tiers, Volume, VolumeError, MAX_IO};

/// How many times a flush is sent again because the copies changed under it (each time takes
/// a change of membership; the bound only keeps a pathological churn from holding it forever).
const FLUSH_ROUNDS: usize = 8;

impl Volume {
    /// The error of request `h` that failed with `failure`.
    fn refused(&self, h: &Header, failure: WriteFailure) -> VolumeError {
        VolumeError::Write {
            volume: self.info.name.clone(),
            op: match h.op {
                Op::Write => "write",
                Op::Flush => "flush",
                Op::WriteZeroes if h.flags & FLAG_MAY_TRIM != 0 => "trim",
                Op::WriteZeroes => "write zeroes",
                _ => "request",
            },
            node: match failure {
                WriteFailure::ReplicaFailed { replica }
                | WriteFailure::Refused { replica }
                | WriteFailure::NoSpace { replica } => Some(self.node(replica)),
                _ => None,
            },
            failure,
        }
    }

    /// [`Volume::mirror`] for each piece of `h` within a region (a parity volume's data
    /// request may span several; a mirror's is one piece), at once.
    async fn mirror_pieces(&self, h: Header, payload: Bytes) -> Result<(), VolumeError> {
        let pieces = match h.op {
            Op::Flush => vec![(h.offset, h.length)],
            _ => self.pieces(h.offset, h.length),
        };
        if pieces.len() == 1 {
            return self.mirror(h, payload).await;
        }
        let sends = pieces
            .into_iter()
            .map(|(offset, length)| {
                let at = (offset - h.offset) as usize;
                let data = match payload.is_empty() {
                    true => Bytes::new(),
                    false => payload.slice(at..at + length as usize),
                };
                Box::pin(self.mirror(
                    Header {
                        offset,
                        length,
                        ..h
                    },
                    data,
                )) as _
            })
            .collect();
        join_all(sends).await.into_iter().collect()
    }

    /// Sends `h` to every write target and acknowledges when every one holds it — or, with a
    /// control plane, when the ones that failed have been durably taken out and the survivors
    /// track what they missed. `h`'s range is held against overlapping writes until then.
    async fn mirror(&self, h: Header, payload: Bytes) -> Result<(), VolumeError> {
        self.check_space(&h)?;
        let request = mirrored(&h);
        let trim = self.parity.is_some() && h.op == Op::WriteZeroes && h.flags & FLAG_MAY_TRIM != 0;
        let mut h = h;
        // A discard over a stripe is sent as zeroes: a trimmed block would read the stripe's
        // older bytes (`Volume::parity_read`).
        let mut submit = |request| {
            let (submitted, zeroes) = self.core.submit(request, trim);
            if zeroes {
                h.flags &= !FLAG_MAY_TRIM;
            }
            submitted
        };
        let wait_copies = {
            // Too few copies in sync: new writes wait before they are sent (`copies.rs`), in
            // the order they came (the gate is a fair lock), and take their places in the
            // write order in that order too. Nearly always nothing waits, and the submit
            // checks the copies, takes the place and names the targets in one visit to the
            // core.
            let quick = match self.copies.at_gate.load(Ordering::Acquire) {
                0 => match submit(request) {
                    Submitted::Go(place) => Some(place),
                    Submitted::Short => None,
                    Submitted::Refused(f) => return Err(self.refused(&h, f)),
                },
                _ => None,
            };
            let place = match quick {
                Some(place) => place,
                None => {
                    // Counted until it has passed, even if the request is dropped while it waits.
                    let _at = self.copies.at_gate();
                    let _gate = self.copies_gate.lock().await;
                    loop {
                        self.enough_copies(request).await?;
                        match submit(request) {
                            Submitted::Go(place) => break place,
                            Submitted::Short => {}
                            Submitted::Refused(f) => return Err(self.refused(&h, f)),
                        }
                    }
                }
            };
            let (mut place, targets) = place.wait().await;
            if let Mirrored::Data { .. } = request {
                self.activity.touch(h.offset, h.length);
            }
            self.mirror_held(h, payload, &mut place, targets).await?
        };
        // One whose failure took a copy out below the minimum is acknowledged only once
        // enough copies hold it again; it waits without its range, which the resync copies.
        if !wait_copies {
            return Ok(());
        }
        self.enough_copies(request).await
    }

    /// [`Volume::mirror`] once the request holds its `place`, first sent to `targets`. True
    /// if its acknowledgement waits for enough copies in sync.
    ///
    /// A flush holds no range, so the copies can change while it is out: one it went to may
    /// be retired (a drain moving it) and one it never reached may come in sync (its resync
    /// flushed what it copied, `resync.rs`). If it fails for want of a copy in sync that holds
    /// it, and the copies that take writes are not those it went to, it goes to them again.
    async fn mirror_held(
        &self,
        h: Header,
        payload: Bytes,
        place: &mut Place<'_>,
        targets: Vec<usize>,
    ) -> Result<bool, VolumeError> {
        let mut rounds = 0;
        let mut waiting: Option<Instant> = None;
        let mut targets = targets;
        loop {
            let sent_at = Instant::now();
            let (e, unanswered) = match self.mirror_to(h, payload.clone(), &targets, place).await {
                Ok(wait_copies) => return Ok(wait_copies),
                Err(f) => f,
            };
            match e {
                VolumeError::Write {
                    failure: WriteFailure::ReplicaFailed { .. } | WriteFailure::NoReplicas,
                    ..
                } if h.op == Op::Flush
                    && rounds < FLUSH_ROUNDS
                    && self.write_targets() != targets =>
                {
                    rounds += 1;
                    tracing::info!(volume = %self.info.name, "the copies changed while a flush was out: sending it to them again");
                }
                // No in-sync copy answered: it waits for one to answer again (`relink.rs`).
                // The request still holds its range, so its retry cannot overtake a newer
                // write, and the relink keeps the old one from landing late.
                // Too few would stay in sync without the ones that went silent: it waits
                // for one of those.
                e if unanswered => {
                    let since = *waiting.get_or_insert_with(Instant::now);
                    let need = self.slots_of(&e);
                    if !self.copy_answers_again(since, sent_at, &need).await? {
                        return Err(e);
                    }
                }
                e => return Err(e),
            }
            targets = self.write_targets();
        }
    }

    /// Sends `h` to `targets` and hands their answers to the replication core, which says
    /// what they make of it; true if its acknowledgement waits for enough copies in sync. A
    /// failure comes with whether it went unanswered: no in-sync target held the request and
    /// each of them timed out or lost its link (none refused it or failed it in its store).
    async fn mirror_to(
        &self,
        h: Header,
        payload: Bytes,
        targets: &[usize],
        place: &mut Place<'_>,
    ) -> Result<bool, (VolumeError, bool)> {
        // The payload's checksum, once for every replica (a TLS link needs none).
        let crc = (!payload.is_empty()
            && targets.iter().any(|&i| {
                self.conn(&self.slots[i])
                    .is_some_and(|c| c.checks_payloads())
            }))
        .then(|| trireme_proto::payload_crc(&payload));
        let sent = self.on_node(h);
        let replies = join_all(
            targets
                .iter()
                .map(|&i| self.call_crc(i, sent, payload.clone(), crc))
                .collect(),
        )
        .await;
        // Targets (by position, fewer than 64: `MAX_SLOTS`) that answered: held it, or
        // refused or failed it themselves. Only a failed request looks at which were in sync.
        let mut answered = 0u64;
        let mut outcomes = vec![ReplicaOutcome::Failed; targets.len()];
        self.note_answers(
            &h,
            targets,
            targets,
            replies,
            &mut outcomes,
            &mut answered,
            false,
        );
        let request = mirrored(&h);
        let mut answers = Answers {
            place: None,
            request,
            targets,
            outcomes: &outcomes,
            from_reserve: false,
        };
        let full: Vec<u32> = targets
            .iter()
            .zip(&outcomes)
            .filter(|(_, &o)| o == ReplicaOutcome::NoSpace)
            .map(|(&i, _)| self.node(i))
            .collect();
        if !full.is_empty() {
            self.space_refused(&full, h.length);
        }
        let mut decision = match self.core.answered(Some(place), answers) {
            Answered::Ack { wait_copies } => return Ok(wait_copies),
            Answered::Carry(d) => d,
        };
        let mut retried_outcomes = outcomes.clone();
        if let Decision::UseReserve { replicas } = &decision {
            // Written on one copy, refused for space on others: they get it again with leave
            // to use their reserve, so the copies never differ over it.
            tracing::warn!(volume = %self.info.name, nodes = ?replicas.iter().map(|&i| self.node(i)).collect::<Vec<_>>(), "copies refused a write for want of space while another wrote it: sending it to them again, from their reserve");
            let mut again = sent;
            again.flags |= trireme_proto::FLAG_SPACE_RESERVE;
            let retried = join_all(
                replicas
                    .iter()
                    .map(|&i| self.call_crc(i, again, payload.clone(), crc))
                    .collect(),
            )
            .await;
            self.note_answers(
                &h,
                targets,
                replicas,
                retried,
                &mut retried_outcomes,
                &mut answered,
                true,
            );
            answers.outcomes = &retried_outcomes;
            answers.from_reserve = true;
            decision = match self.core.answered(Some(place), answers) {
                Answered::Ack { wait_copies } => return Ok(wait_copies),
                Answered::Carry(d) => d,
            };
        }
        match decision {
            // Not after a send from the reserve: the core fails a second refusal.
            Decision::UseReserve { replicas } => Err((
                VolumeError::Write {
                    volume: self.info.name.clone(),
                    op: "write",
                    node: replicas.first().map(|&i| self.node(i)),
                    failure: WriteFailure::NoSpace {
                        replica: replicas.first().copied().unwrap_or(0),
                    },
                },
                false,
            )),
            Decision::Ack => Ok(!self.core().enough_for(mirrored(&h))),
            Decision::Fail(failure) => Err((
                self.refused(&h, failure),
                matches!(failure, WriteFailure::ReplicaFailed { .. }) && {
                    let core = self.core();
                    targets.iter().enumerate().all(|(k, &i)| {
                        answered & (1 << k) == 0 || core.set().state(i) != ReplicaState::InSync
                    })
                },
            )),
            Decision::TakeOut {
                replicas,
                range,
                lost_history,
            } => match self.take_out_with(&replicas, range, lost_history).await {
                Ok(()) => Ok(!self.core().enough_for(mirrored(&h))),
                // Too few would stay in sync without the failed ones (a parity volume's K):
                // it waits for them, if they only went silent.
                Err(e @ VolumeError::WaitForCopies { .. }) => {
                    let silent = targets
                        .iter()
                        .zip(&retried_outcomes)
                        .all(|(i, &o)| !replicas.contains(i) || o == ReplicaOutcome::Failed);
                    // Failed in their stores instead: kept, and made to agree (`keep_lost_copies`).
                    let lost: Vec<usize> = targets
                        .iter()
                        .zip(&retried_outcomes)
                        .filter(|&(_, &o)| o == ReplicaOutcome::StoreFailed)
                        .map(|(&i, _)| i)
                        .collect();
                    if lost_history && !lost.is_empty() {
                        self.keep_failed_syncs(&lost).await;
                    }
                    Err((e, silent))
                }
                // The copies that held it went silent too (`Stranded`): it waits for them.
                Err(e) => {
                    let unanswered = e.unanswered();
                    Err((e, unanswered))
                }
            },
        }
    }

    /// Records the answers of `asked` (replicas among `targets`, in the order of `replies`)
    /// in `outcomes` and `answered` (by position in `targets`). `from_reserve`: a second send
    /// with leave to use the reserve, after which a refusal for space is a store's failure
    /// (what the copy holds is unknown).
    #[allow(clippy::too_many_arguments)]
    fn note_answers(
        &self,
        h: &Header,
        targets: &[usize],
        asked: &[usize],
        replies: Vec<Result<Frame, VolumeError>>,
        outcomes: &mut [ReplicaOutcome],
        answered: &mut u64,
        from_reserve: bool,
    ) {
        for (r, &i) in replies.into_iter().zip(asked) {
            let Some(k) = targets.iter().position(|&t| t == i) else {
                continue;
            };
            outcomes[k] = match r.and_then(|f| self.expect_ok(i, f)) {
                Ok(_) => {
                    *answered |= 1 << k;
                    ReplicaOutcome::Done
                }
                Err(e) => {
                    let how = if from_reserve {
                        " from its reserve"
                    } else {
                        ""
                    };
                    tracing::warn!(volume = %self.info.name, node = self.node(i), op = ?h.op, "replica failed{how}: {e}");
                    if !e.unanswered() {
                        *answered |= 1 << k;
                    }
                    match outcome_of(&e) {
                        ReplicaOutcome::NoSpace if from_reserve => ReplicaOutcome::StoreFailed,
                        o => o,
                    }
                }
            };
        }
    }

    /// Sends a read-like request to one in-sync replica, falling over to the next on failure.
    async fn read_one(&self, h: Header) -> Result<Frame, VolumeError> {
        let overlapping = self.reads.fetch_add(1, Ordering::Relaxed) > 0;
        let _turn = ReadTurn(&self.reads);
        let mut plan = self.core().read_begin(overlapping);
        let mut moved = false;
        let mut last = VolumeError::NoReplicas(self.info.name.clone());
        // Every copy tried went unanswered (`relink.rs`): the read waits for one to answer.
        let mut unanswered = true;
        let mut waiting: Option<Instant> = None;
        let mut sent_at = Instant::now();
        // The in-sync set may change while a read waits on a replica that stopped answering
        // (another may finish its resync meanwhile), so the plan looks at it again each time.
        // On tiered nodes: prefer a copy that holds the extent on flash, and tell the copies
        // which reads belong to a scan (they see only the pieces they serve).
        let tiered = h.op == Op::Read && self.tiers.active();
        let extent = h.offset >> tiers::EXTENT_SHIFT;
        let mut h = h;
        if tiered && self.tiers.streams(h.offset, h.length) {
            h.flags |= trireme_proto::FLAG_STREAM;
        }
        loop {
            let next = if tiered {
                let nodes: Vec<u32> = (0..self.replica_count()).map(|i| self.node(i)).collect();
                plan.next_preferring(self.core().set(), |i| {
                    nodes.get(i).is_some_and(|&n| self.tiers.avoid(n, extent))
                })
            } else {
                plan.next(self.core().set())
            };
            let Some(i) = next else {
                if !(unanswered && last.unanswered()) {
                    return Err(last);
                }
                let since = *waiting.get_or_insert_with(Instant::now);
                if !self.copy_answers_again(since, sent_at, &[]).await? {
                    return Err(last);
                }
                plan = self.core().read_begin(true);
                sent_at = Instant::now();
                continue;
            };
            match self
                .call(i, h, Bytes::new())
                .await
                .and_then(|f| self.expect_ok(i, f))
            {
                Ok(f) => {
                    if h.op == Op::Read {
                        self.learn_tiers(i, extent, f.header.flags);
                    }
                    if !plan.to_repair().is_empty() && h.op == Op::Read {
                        self.repair(plan.to_repair(), i, h.offset, h.length).await;
                    }
                    return Ok(f);
                }
                Err(e) if e.stops_writer() => return Err(e),
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "read failed, trying another replica: {e}");
                    if !std::mem::replace(&mut moved, true) {
                        self.core().read_moved();
                    }
                    plan.failed(i, e.is_bad_copy());
                    unanswered &= e.unanswered();
                    last = e;
                }
            }
        }
    }

    /// Learns from replica `i`'s read reply whether it is tiered and where it served the read
    /// from, and sends the other in-sync copies the heat they are owed (without waiting).
    fn learn_tiers(&self, i: usize, extent: u64, flags: u16) {
        if flags & trireme_proto::FLAG_TIERED == 0 {
            return;
        }
        let others: Vec<u32> = self.in_sync().into_iter().map(|j| self.node(j)).collect();
        for (node, batch) in self.tiers.learned(self.node(i), extent, flags, &others) {
            let Some(j) = self.slot_of(node) else {
                continue;
            };
            let Some(c) = self.conn(&self.slots[j]) else {
                continue;
            };
            let h = self.header(Op::TierHeat, 0, 0);
            let payload = Bytes::from(trireme_proto::encode_heat(&batch));
            // Advisory: a copy that misses a batch is only a little colder.
            tokio::spawn(async move {
                let _ = c.call(h, payload).await;
            });
        }
    }

    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, VolumeError> {
        let _fg = self.foreground.begin();
        let t = self
            .metrics
            .as_ref()
            .map(|m| (m, tokio::time::Instant::now()));
        let r = self.read_uncounted(offset, len).await;
        if let Some((m, t0)) = t {
            m.record(trireme_metrics::Op::Read, len, t0.elapsed(), r.is_ok());
        }
        r
    }

    async fn read_uncounted(&self, offset: u64, len: u64) -> Result<Bytes, VolumeError> {
        check_io(offset, len, self.size(), MAX_IO)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        self.throttle(Cost::io(Dir::Read, len)).await;
        if self.parity.is_some() {
            return self.parity_read(offset, len).await;
        }
        let f = self.read_one(self.header(Op::Read, offset, len)).await?;
        if f.payload.len() as u64 != len {
            return Err(VolumeError::Protocol {
                node: 0,
                what: format!("read returned {} of {len} bytes", f.payload.len()),
            });
        }
        Ok(f.payload)
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), VolumeError> {
        check_io(offset, data.len() as u64, self.size(), MAX_IO)?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_blocks("write", offset, data.len() as u64)?;
        let _fg = self.foreground.begin();
        let mut h = self.header(Op::Write, offset, data.len() as u64);
        if fua {
            h.flags |= FLAG_FUA;
        }
        let cost = Cost::io(Dir::Write, data.len() as u64);
        let r = self
            .mirror_counted(trireme_metrics::Op::Write, h, data, Some(cost))
            .await;
        self.extents.changed();
        r
    }

    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), VolumeError> {
        check_io(offset, len, self.size(), u64::MAX)?;
        if len == 0 {
            return Ok(());
        }
        self.check_blocks(if may_trim { "trim" } else { "write zeroes" }, offset, len)?;
        let _fg = self.foreground.begin();
        let mut h = self.header(Op::WriteZeroes, offset, len);
        if may_trim {
            h.flags |= FLAG_MAY_TRIM;
        }
        if fua {
            h.flags |= FLAG_FUA;
        }
        let op = if may_trim {
            trireme_metrics::Op::Trim
        } else {
            trireme_metrics::Op::Zero
        };
        let r = self
            .mirror_counted(op, h, Bytes::new(), Some(Cost::no_data()))
            .await;
        self.extents.changed();
        r
    }

    pub async fn flush(&self) -> Result<(), VolumeError> {
        self.mirror_counted(
            trireme_metrics::Op::Flush,
            self.header(Op::Flush, 0, 0),
            Bytes::new(),
            None,
        )
        .await
    }

    /// A mirrored request on behalf of a client: held until the volume's limits let a
    /// request of `cost` start (none: a flush), and counted in the metrics from its arrival.
    async fn mirror_counted(
        &self,
        op: trireme_metrics::Op,
        h: Header,
        data: Bytes,
        cost: Option<Cost>,
    ) -> Result<(), VolumeError> {
        let t0 = tokio::time::Instant::now();
        if let Some(c) = cost {
            self.throttle(c).await;
        }
        let Some(m) = &self.metrics else {
            return self.mirror_pieces(h, data).await;
        };
        let len = h.length;
        let r = self.mirror_pieces(h, data).await;
        m.record(op, len, t0.elapsed(), r.is_ok());
        r
    }

    /// Allocation extents of `[offset, offset+len)`, from one in-sync replica.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError> {
        self.block_status_of(offset, len, crate::Extents::All).await
    }

    /// [`Volume::block_status`], all of it or the first extents (`want`).
    pub async fn block_status_of(
        &self,
        offset: u64,
        len: u64,
        want: crate::Extents,
    ) -> Result<Vec<Extent>, VolumeError> {
        check_io(offset, len, self.size(), u64::MAX)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if self.parity.is_some() {
            // No one copy holds the range: all of it is data, which is always true.
            return Ok(vec![Extent {
                length: len,
                flags: 0,
            }]);
        }
        // A first-extents query asks a node for as many as it gives at once, and the next
        // queries are answered from them (`extent_cache.rs`).
        let kind = crate::extent_cache::Kind::Allocation;
        self.extents
            .answer(kind, offset, len, want, |ask| async move {
                let mut h = self.header(Op::BlockStatus, offset, len);
                h.flags |= ask.flags();
                let f = self.read_one(h).await?;
                ask.check(0, &f.payload, len)
            })
            .await
    }

    /// The replicas (indexes) this writer has a connection to now.
    pub(crate) fn connected(&self) -> Vec<usize> {
        (0..self.replica_count())
            .filter(|&i| self.conn(&self.slots[i]).is_some())
            .collect()
    }

    /// crc32c of a range on each of `targets`, computed on the nodes, in `targets` order.
    pub(crate) async fn checksums(
        &self,
        targets: &[usize],
        offset: u64,
        len: u64,
    ) -> Vec<Result<u64, VolumeError>> {
        self.checksums_of(None, targets, offset, len).await
    }

    /// [`Volume::checksums`] of snapshot `snapshot`'s bytes (the replica's now for `None`).
    pub(crate) async fn checksums_of(
        &self,
        snapshot: Option<u64>,
        targets: &[usize],
        offset: u64,
        len: u64,
    ) -> Vec<Result<u64, VolumeError>> {
        let h = self.header(Op::Checksum, offset, len);
        let payload = snapshot.map_or_else(Bytes::new, |id| {
            Bytes::from(trireme_proto::snapshot_id_payload(id))
        });
        let replies = join_all(
            targets
                .iter()
                .map(|&i| self.call(i, h, payload.clone()))
                .collect(),
        )
        .await;
        replies
            .into_iter()
            .zip(targets)
            .map(|(r, &i)| {
                let f = r.and_then(|f| self.expect_ok(i, f))?;
                trireme_proto::ChecksumAnswer::read(&f.header)
                    .map(|a| u64::from(a.crc))
                    .map_err(self.malformed(i))
            })
            .collect()
    }
}

/// What the replication core knows a mirrored request as.
fn mirrored(h: &Header) -> Mirrored {
    match h.op {
        Op::Write | Op::WriteZeroes => Mirrored::Data {
            offset: h.offset,
            len: h.length,
        },
        op => {
            debug_assert_eq!(op, Op::Flush, "only data and flushes are mirrored");
            Mirrored::Flush
        }
    }
}

/// A volume's foreground reads and writes: how many began, how many ended. A pause is none
/// in flight and none begun for a while; a stall (every request waiting on a disk that
/// flushes) is not one.
#[derive(Debug, Default)]
pub(crate) struct Foreground {
    begun: AtomicU64,
    ended: AtomicU64,
}

impl Foreground {
    /// A request begins; it is in flight until the turn is dropped (a dropped future too).
    fn begin(&self) -> ForegroundTurn<'_> {
        self.begun.fetch_add(1, Ordering::Relaxed);
        ForegroundTurn(&self.ended)
    }

    /// The requests begun so far, or None while one is in flight. (`ended` is read first:
    /// equal to `begun` read after it, every request begun by then had ended.)
    pub(crate) fn idle_at(&self) -> Option<u64> {
        let ended = self.ended.load(Ordering::Relaxed);
        let begun = self.begun.load(Ordering::Relaxed);
        (begun == ended).then_some(begun)
    }
}

/// A foreground request in flight ([`Foreground::begin`]).
struct ForegroundTurn<'a>(&'a AtomicU64);

impl Drop for ForegroundTurn<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts a foreground read out however `read_one` returns (a dropped future too).
struct ReadTurn<'a>(&'a AtomicUsize);

impl Drop for ReadTurn<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
