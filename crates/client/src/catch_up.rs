//! Before a resync: the snapshots a returning or new copy lacks. Which it is given, from
//! which base, which regions of each and at which size is the replication core's rule
//! ([`CatchUp`], `replication/src/catch_up.rs`: a copy whose history is known is given what
//! the survivors recorded for it and what changed since each snapshot, marked on their records
//! first; one whose history is unknown is rolled back to a base it shares with the source and
//! given the difference, or the whole snapshot). This file carries the plan's steps out.
//!
//! A snapshot is written as the source holds it: its data as data, its holes as trims, so a
//! hole stays a hole, and no faster than the resync's rate. A snapshot deleted while it is
//! used is reported to the plan, which skips it. A copy resyncing while a snapshot is taken
//! does not get it; at the end of its resync it goes out again with its history known, and
//! the next one gives it ([`Volume::lacks_snapshots`]; `resync.rs` says how snapshots taken
//! often cannot keep it out). A writer retiring the old copy of a move checks that the new one
//! holds every snapshot the old one did ([`Volume::snapshot_ids_on`]).

use std::time::Duration;

use bytes::Bytes;
use trireme_proto::{
    data_ranges, ListedSnapshot, Op, SnapshotRequest, DIRTY_AUTO, EXTENT_CHANGED, FLAG_MAY_TRIM,
};
use trireme_replication::{
    union_chunks, CatchUp, CatchUpReport as Report, CatchUpStep, ReplicaState, Snap, PARALLEL,
};
use trireme_transport::{Connection, Frame};

use crate::membership::BoxFut;
use crate::{join_all, Volume, VolumeError};

/// Range covered by one changed-blocks or allocation query (under the node's cap), and so
/// the most one trim of a catch-up covers.
const CHANGED_WINDOW: u64 = 1 << 30;

impl Volume {
    /// Gives replica `i` (attached on `conn` with `incarnation`, not taking writes yet, `size`
    /// bytes long) the snapshots it lacks: carries out the replication core's [`CatchUp`]
    /// (see the module docs), then gives the copy the volume's size back, even after a
    /// failure.
    pub(crate) async fn catch_up_snapshots(
        &self,
        i: usize,
        conn: &dyn Connection,
        incarnation: u64,
        size: u64,
    ) -> Result<(), VolumeError> {
        // Only for a copy the resync loop is about to bring back, before it takes any write.
        let (state, known) = (self.state(i), self.core().incarnation(i));
        if !matches!(state, ReplicaState::Outdated | ReplicaState::Failed) {
            return Ok(());
        }
        let survivors: Vec<usize> = self.in_sync().into_iter().filter(|&s| s != i).collect();
        let Some(&source) = survivors.first() else {
            return Ok(());
        };
        let theirs = self.list_on(source, None).await?;
        let mine = self.list_on(i, Some(conn)).await?;
        let snap = |s: &ListedSnapshot| Snap {
            id: s.id,
            size: s.size,
        };
        let mut plan = CatchUp::new(
            theirs.iter().map(snap).collect(),
            &mine.iter().map(snap).collect::<Vec<_>>(),
            trireme_replication::incremental(state, known, incarnation),
            size,
        );
        if plan.step(self.size()) == CatchUpStep::Done {
            // It lacks none.
            return Ok(());
        }
        let r = self
            .carry_out_catch_up(i, conn, &survivors, &theirs, &mut plan)
            .await;
        if r.is_err() && !plan.started() {
            // Failed asking what it missed: the copy is as it was.
            return r;
        }
        // The copy's size as the snapshots given needed it; the volume's again at the end.
        // Not the volume's size then: a resize may have run since the copy was attached.
        let mut now = plan.copy_size();
        let back = self.size_copy(i, conn, &mut now, self.size()).await;
        r.and(back)
    }

    /// Each step of `plan` for replica `i` on `conn`, reported, until it is done.
    async fn carry_out_catch_up(
        &self,
        i: usize,
        conn: &dyn Connection,
        survivors: &[usize],
        theirs: &[ListedSnapshot],
        plan: &mut CatchUp,
    ) -> Result<(), VolumeError> {
        let source = survivors[0];
        loop {
            let step = plan.step(self.size());
            let t0 = tokio::time::Instant::now();
            let r = match &step {
                CatchUpStep::Done => return Ok(()),
                CatchUpStep::Dirty => match self.dirty_regions(i, survivors).await? {
                    Some(dirty) => Ok(Report::Ranges(dirty)),
                    None => Ok(Report::Unknown),
                },
                &CatchUpStep::Changed { from, to, upto } => self
                    .changed_ranges(from, to, upto)
                    .await
                    .map(Report::Ranges),
                CatchUpStep::Mark(regions) => self
                    .mark_for(i, survivors, regions)
                    .await
                    .map(|()| Report::Ok),
                &CatchUpStep::Resize(to) => self
                    .call_on(i, conn, self.resize_header(to))
                    .await
                    .map(|_| Report::Ok),
                &CatchUpStep::Rollback(id) => {
                    let mut h = self.header(Op::Rollback, 0, 0);
                    SnapshotRequest { id, created: 0 }.put(&mut h);
                    self.send_on(i, conn, h, Bytes::new())
                        .await
                        .map(|_| Report::Ok)
                }
                CatchUpStep::Give { id, regions } => {
                    let Some(snap) = theirs.iter().find(|s| s.id == *id) else {
                        unreachable!("the plan gives only snapshots the source listed");
                    };
                    let r = self.give_snapshot(i, conn, source, snap, regions).await;
                    if r.is_ok() {
                        self.log_given(i, plan, *id, regions, t0.elapsed());
                    }
                    r.map(|()| Report::Ok)
                }
            };
            match r {
                Ok(report) => plan.report(report),
                Err(e) if deleted_meanwhile(&e) => plan.report(Report::Deleted),
                Err(e) => return Err(e),
            }
        }
    }

    /// Says that snapshot `id` was given to replica `i` (`regions` of it, in `took`): as the
    /// catch-up of a copy whose history is known, or as one rebuilt from a base.
    fn log_given(&self, i: usize, plan: &CatchUp, id: u64, regions: &[(u64, u64)], took: Duration) {
        let (node, ms) = (self.node(i), took.as_millis() as u64);
        let bytes = regions.iter().map(|r| r.1).sum::<u64>();
        let name = &self.info.name;
        if plan.known() {
            tracing::info!(volume = %name, node, id, bytes, ms, "a snapshot the copy missed while out, given to it before its resync");
        } else {
            let from = plan.base();
            tracing::info!(volume = %name, node, id, from = ?from, bytes, ms, "a snapshot the copy lacked, given to it before its full resync");
        }
    }

    /// Resizes replica `i` (on `conn`, `now` bytes long) to `size`, if it is not.
    async fn size_copy(
        &self,
        i: usize,
        conn: &dyn Connection,
        now: &mut u64,
        size: u64,
    ) -> Result<(), VolumeError> {
        if *now != size {
            self.call_on(i, conn, self.resize_header(size)).await?;
            *now = size;
        }
        Ok(())
    }

    /// Writes `regions` of snapshot `snap` as `source` holds it (data as data, holes as
    /// trims) to replica `i` on `conn`, flushes, and takes the snapshot there.
    async fn give_snapshot(
        &self,
        i: usize,
        conn: &dyn Connection,
        source: usize,
        snap: &ListedSnapshot,
        regions: &[(u64, u64)],
    ) -> Result<(), VolumeError> {
        let id = &Bytes::from(trireme_proto::snapshot_id_payload(snap.id));
        // Where the snapshot holds data and where holes, asked of the source a window at a
        // time, PARALLEL windows at once (a copy that missed many small writes has many);
        // then the holes trimmed and the data written, PARALLEL regions at once.
        let mut windows = Vec::new();
        for &(off, len) in regions {
            let mut at = off;
            while at < off + len {
                let n = CHANGED_WINDOW.min(off + len - at);
                windows.push((at, n));
                at += n;
            }
        }
        // The data under the resync's rate: a catch-up copies as much as a resync may (a new
        // copy of a move is given whole snapshots), and must not take the disks from the
        // volume's I/O.
        let rate = self
            .core()
            .rate(i)
            .or(self.opts.resync_rate)
            .filter(|&r| r > 0);
        let started = tokio::time::Instant::now();
        let mut sent = 0u64;
        // PARALLEL windows at a time (32 GiB at most), so that what is held of a whole
        // snapshot's extents stays small however large the volume.
        for windows in windows.chunks(PARALLEL) {
            let asked = join_all(
                windows
                    .iter()
                    .map(|&(at, n)| {
                        Box::pin(async move {
                            let h = self.header(Op::SnapshotStatus, at, n);
                            let f = self.call(source, h, id.clone()).await?;
                            let f = self.expect_ok(source, f)?;
                            let extents =
                                crate::extents_covering(self.node(source), &f.payload, n)?;
                            let data = data_ranges(&extents, at);
                            Ok((holes_between(at, n, &data), data))
                        })
                            as BoxFut<'_, Result<(Vec<(u64, u64)>, Vec<(u64, u64)>), VolumeError>>
                    })
                    .collect(),
            )
            .await;
            let (mut holes, mut data) = (Vec::new(), Vec::new());
            for a in asked {
                let (h, d) = a?;
                holes.extend(h);
                data.extend(d);
            }
            for group in holes.chunks(PARALLEL) {
                let trims = group
                    .iter()
                    .map(|&(o, l)| {
                        Box::pin(async move {
                            let mut h = self.header(Op::WriteZeroes, o, l);
                            h.flags |= FLAG_MAY_TRIM;
                            self.send_on(i, conn, h, Bytes::new()).await.map(|_| ())
                        }) as BoxFut<'_, Result<(), VolumeError>>
                    })
                    .collect();
                join_all(trims)
                    .await
                    .into_iter()
                    .collect::<Result<(), _>>()?;
            }
            for group in union_chunks(data).chunks(PARALLEL) {
                let copies = group
                    .iter()
                    .map(|&(o, l)| {
                        Box::pin(async move {
                            let h = self.header(Op::SnapshotRead, o, l);
                            let f = self.call(source, h, id.clone()).await?;
                            let bytes = self.expect_ok(source, f)?.payload;
                            self.send_on(i, conn, self.header(Op::Write, o, l), bytes)
                                .await
                                .map(|_| ())
                        }) as BoxFut<'_, Result<(), VolumeError>>
                    })
                    .collect();
                join_all(copies)
                    .await
                    .into_iter()
                    .collect::<Result<(), _>>()?;
                sent += group.iter().map(|c| c.1).sum::<u64>();
                if let Some(r) = rate {
                    let due = Duration::from_secs_f64(sent as f64 / r as f64);
                    tokio::time::sleep_until(started + due).await;
                }
            }
        }
        self.send_on(i, conn, self.header(Op::Flush, 0, 0), Bytes::new())
            .await?;
        let mut h = self.header(Op::Snapshot, 0, 0);
        SnapshotRequest {
            id: snap.id,
            created: snap.created,
        }
        .put(&mut h);
        self.send_on(i, conn, h, Bytes::new()).await?;
        Ok(())
    }

    /// The ids of the snapshots the copy on `node` holds, asked of it (one of this writer's
    /// copies, not moved off).
    pub async fn snapshot_ids_on(&self, node: u32) -> Result<Vec<u64>, VolumeError> {
        let i = self
            .slot_of(node)
            .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))?;
        Ok(self.list_on(i, None).await?.iter().map(|s| s.id).collect())
    }

    /// Whether an in-sync copy holds a snapshot replica `i` (at the end of its resync) lacks:
    /// one taken while it resynced (the barrier goes to copies in sync only). A copy that
    /// refuses to list them (a store without versions) lacks none.
    pub(crate) async fn lacks_snapshots(&self, i: usize) -> Result<bool, VolumeError> {
        let Some(source) = self.in_sync().into_iter().find(|&s| s != i) else {
            return Ok(false);
        };
        let listed = async {
            let theirs = self.list_on(source, None).await?;
            let mine = self.list_on(i, None).await?;
            Ok::<_, VolumeError>(theirs.iter().any(|t| !mine.iter().any(|m| m.id == t.id)))
        };
        match listed.await {
            Err(VolumeError::Replica { .. }) => Ok(false),
            r => r,
        }
    }

    /// The snapshots replica `i` holds (on `conn` if given, else on its slot).
    async fn list_on(
        &self,
        i: usize,
        conn: Option<&dyn Connection>,
    ) -> Result<Vec<trireme_proto::ListedSnapshot>, VolumeError> {
        let h = self.header(Op::SnapshotList, 0, trireme_proto::LIST_SIZED);
        let f = match conn {
            Some(c) => self.send_on(i, c, h, Bytes::new()).await?,
            None => {
                let f = self.call(i, h, Bytes::new()).await?;
                self.expect_ok(i, f)?
            }
        };
        let mut list = trireme_proto::decode_snapshot_list(&f.payload, f.header.length)
            .map_err(self.malformed(i))?;
        // A node from before snapshots had sizes: each has the volume's.
        for s in &mut list {
            if s.size == 0 {
                s.size = self.size();
            }
        }
        Ok(list)
    }

    /// The ranges the volume changed since snapshot `id` (up to snapshot `to` if given; asked
    /// of a copy in sync holding them), in the first `upto` bytes.
    async fn changed_ranges(
        &self,
        id: u64,
        to: Option<u64>,
        upto: u64,
    ) -> Result<Vec<(u64, u64)>, VolumeError> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < upto {
            let len = CHANGED_WINDOW.min(upto - off);
            let mut at = off;
            for e in self
                .changed_between(id, to, off, len, crate::Extents::All)
                .await?
            {
                if e.flags & EXTENT_CHANGED != 0 {
                    out.push((at, e.length));
                }
                at += e.length;
            }
            off += len;
        }
        Ok(out)
    }

    /// Marks `regions` (whole runs: one call each) on every survivor's record of what replica
    /// `i` misses.
    pub(crate) async fn mark_for(
        &self,
        i: usize,
        survivors: &[usize],
        regions: &[(u64, u64)],
    ) -> Result<(), VolumeError> {
        let payload = self.dirty_peer(i, DIRTY_AUTO);
        let marks = survivors
            .iter()
            .flat_map(|&s| regions.iter().map(move |&r| (s, r)))
            .map(|(s, (off, len))| {
                let h = self.header(Op::DirtyMark, off, len);
                let p = payload.clone();
                Box::pin(async move {
                    let f = self.call(s, h, p).await?;
                    self.expect_ok(s, f).map(|_| ())
                }) as BoxFut<'_, Result<(), VolumeError>>
            })
            .collect();
        join_all(marks).await.into_iter().collect()
    }

    /// Sends `h` with `payload` to replica `i` on `conn`, a connection not (yet) in its slot:
    /// its answer, checked, within the replica timeout.
    pub(crate) async fn send_on(
        &self,
        i: usize,
        conn: &dyn Connection,
        h: trireme_proto::Header,
        payload: Bytes,
    ) -> Result<Frame, VolumeError> {
        let node = self.node(i);
        let f = tokio::time::timeout(self.opts.replica_timeout, conn.call(h, payload))
            .await
            .map_err(|_| VolumeError::Timeout {
                node,
                timeout: self.opts.replica_timeout,
            })?
            .map_err(|source| VolumeError::Transport { node, source })?;
        self.expect_ok(i, f)
    }
}

/// Whether `e` says a snapshot is gone (deleted while a catch-up used it).
fn deleted_meanwhile(e: &VolumeError) -> bool {
    matches!(
        e,
        VolumeError::Replica {
            status: trireme_proto::Status::NoSnapshot,
            ..
        }
    )
}

/// The parts of `[at, at+len)` outside `data` (ranges in order, within it). The caller asks
/// one window of at most [`CHANGED_WINDOW`] at a time, so no piece is longer.
fn holes_between(at: u64, len: u64, data: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = at;
    let ends = data.iter().copied().chain(std::iter::once((at + len, 0)));
    for (o, l) in ends {
        if o > pos {
            out.push((pos, o - pos));
        }
        pos = pos.max(o + l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::holes_between;

    #[test]
    fn holes_are_what_data_leaves() {
        assert_eq!(holes_between(0, 100, &[]), vec![(0, 100)]);
        assert_eq!(holes_between(10, 90, &[(10, 90)]), vec![]);
        assert_eq!(
            holes_between(0, 100, &[(10, 10), (50, 20)]),
            vec![(0, 10), (20, 30), (70, 30)]
        );
        assert_eq!(holes_between(0, 100, &[(0, 10), (90, 10)]), vec![(10, 80)]);
    }
}
