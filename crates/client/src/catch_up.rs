//! Before a resync: the snapshots a returning copy missed. A copy out of sync when a snapshot is
//! taken does not get it (the barrier goes to copies in sync). When it comes back with its
//! history known (a survivor's record covers every write it missed), it gets each snapshot an
//! in-sync copy holds and it lacks, oldest first, before it takes any write:
//!
//! 1. the regions where it may differ from snapshot X are those the survivors recorded for it
//!    (`D`: outside them its head is the source's head) and those the source changed since X
//!    (`C_X`, from the source's maps), and for a later snapshot also every region written for
//!    an earlier one;
//! 2. those regions are first marked on every survivor's record for it (so a catch-up cut
//!    short leaves them to the resync: its head no longer matches the source's there), then
//!    written from the source's snapshot X, flushed, and the copy takes X with its id and time;
//! 3. the resync that follows copies the survivors' regions, which include all of these.
//!
//! Without a trusted record (a full resync follows), nothing is done: the snapshot stays on the
//! copies that hold it, as before.

use bytes::Bytes;
use trireme_proto::{Op, SnapshotRequest, DIRTY_AUTO, EXTENT_CHANGED};
use trireme_replication::{union_chunks, union_ranges};
use trireme_transport::{Connection, Frame};

use crate::membership::BoxFut;
use crate::{join_all, Volume, VolumeError};

/// Range covered by one changed-blocks query (under the node's cap).
const CHANGED_WINDOW: u64 = 1 << 30;

impl Volume {
    /// Gives replica `i` (attached on `conn` with `incarnation`, not taking writes yet) the
    /// snapshots it missed (see the module docs).
    pub(crate) async fn catch_up_snapshots(
        &self,
        i: usize,
        conn: &dyn Connection,
        incarnation: u64,
    ) -> Result<(), VolumeError> {
        // Only for a copy whose resync would be incremental (out with its history known):
        // the one resync loop of the writer runs it, before the copy takes any write.
        let (state, known) = (self.state(i), self.core().incarnation(i));
        if !trireme_replication::incremental(state, known, incarnation) {
            return Ok(());
        }
        let survivors: Vec<usize> = self.in_sync().into_iter().filter(|&s| s != i).collect();
        let Some(&source) = survivors.first() else {
            return Ok(());
        };
        let theirs = self.list_on(source, None).await?;
        let mine = self.list_on(i, Some(conn)).await?;
        let missed: Vec<_> = theirs
            .into_iter()
            .filter(|s| !mine.iter().any(|m| m.id == s.id))
            .collect();
        if missed.is_empty() {
            return Ok(());
        }
        let Some(dirty) = self.dirty_regions(i, &survivors).await? else {
            return Ok(());
        };
        let mut regions = dirty;
        for snap in missed {
            regions.extend(self.changed_ranges(snap.id).await?);
            regions = union_ranges(regions);
            self.mark_for(i, &survivors, &regions).await?;
            for (off, len) in union_chunks(regions.clone()) {
                let h = self.header(Op::SnapshotRead, off, len);
                let f = self
                    .call(
                        source,
                        h,
                        Bytes::from(trireme_proto::snapshot_id_payload(snap.id)),
                    )
                    .await?;
                let data = self.expect_ok(source, f)?.payload;
                self.send_on(i, conn, self.header(Op::Write, off, len), data)
                    .await?;
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
            tracing::info!(volume = %self.info.name, node = self.node(i), id = snap.id, bytes = regions.iter().map(|r| r.1).sum::<u64>(), "a snapshot the copy missed while out, given to it before its resync");
        }
        Ok(())
    }

    /// The snapshots replica `i` holds (on `conn` if given, else on its slot).
    async fn list_on(
        &self,
        i: usize,
        conn: Option<&dyn Connection>,
    ) -> Result<Vec<trireme_proto::ListedSnapshot>, VolumeError> {
        let h = self.header(Op::SnapshotList, 0, 0);
        let f = match conn {
            Some(c) => self.send_on(i, c, h, Bytes::new()).await?,
            None => {
                let f = self.call(i, h, Bytes::new()).await?;
                self.expect_ok(i, f)?
            }
        };
        trireme_proto::decode_snapshot_list(&f.payload).map_err(self.malformed(i))
    }

    /// The ranges the volume changed since snapshot `id` (asked of a copy in sync holding it).
    async fn changed_ranges(&self, id: u64) -> Result<Vec<(u64, u64)>, VolumeError> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < self.size() {
            let len = CHANGED_WINDOW.min(self.size() - off);
            let mut at = off;
            for e in self.changed_since(id, off, len).await? {
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
    async fn mark_for(
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
