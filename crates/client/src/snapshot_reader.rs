//! Reading a snapshot: from the copies that hold it, without attaching (no epoch is taken, so
//! the volume's writer goes on undisturbed, and any number of readers may run at once).
//!
//! Each read goes to one copy; a copy that fails it, or says it lacks the snapshot
//! (`NoSnapshot`: it was out of sync when the snapshot was taken), is left for the next, and
//! reads stay on the copy that last answered. Links are opened on first use and again after
//! they break, one at a time per copy: the requests in flight meanwhile wait for that one link
//! and share it (issue 63: each opened its own, 1,024 at once under a deep queue, until the
//! node's handshake gate cut them and reads failed with EIO). A link that failed to open is
//! not tried again for [`RETRY_LINK`]: the requests waiting on it go to the next copy at once.
//! At most [`IN_FLIGHT`] requests of one reader are on the nodes at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use trireme_proto::{Header, Op, Status};
use trireme_transport::Connection;

use crate::{connect_replica, ReplicaTarget, VolumeError, VolumeOptions, MAX_IO};

/// A copy whose link failed to open is not tried again for this long.
const RETRY_LINK: std::time::Duration = std::time::Duration::from_millis(500);
/// Most requests one reader has on the nodes at once (as many as one NBD connection keeps in
/// flight); the rest wait for a place.
pub const IN_FLIGHT: usize = 256;

/// One copy's link: open, or why it last failed to open and when.
#[derive(Debug, Default)]
struct Link {
    conn: Option<Arc<dyn Connection>>,
    failed: Option<(tokio::time::Instant, String)>,
}

/// A snapshot of a volume, read-only.
#[derive(Debug)]
pub struct SnapshotReader {
    volume: u64,
    label: String,
    /// The snapshot's id, and as every request carries it.
    id: u64,
    id_payload: Bytes,
    size: u64,
    copies: Vec<ReplicaTarget>,
    /// One per copy, each opened by one request while the others wait (see the module docs).
    links: Vec<tokio::sync::Mutex<Link>>,
    /// Places for requests on the nodes ([`IN_FLIGHT`]).
    places: tokio::sync::Semaphore,
    /// The last first-extents answer (`extent_cache.rs`): a snapshot never changes.
    extents: crate::extent_cache::ExtentCache,
    /// The copy that served the last read.
    current: AtomicUsize,
    opts: VolumeOptions,
}

impl SnapshotReader {
    /// Reads snapshot `snapshot` of volume `volume` (`size` bytes) from `copies` (the nodes
    /// that hold it first). `label` names it in errors (`VOLUME@NAME`).
    pub fn new(
        label: &str,
        volume: u64,
        snapshot: u64,
        size: u64,
        copies: Vec<ReplicaTarget>,
        opts: VolumeOptions,
    ) -> SnapshotReader {
        SnapshotReader {
            volume,
            label: label.to_string(),
            id: snapshot,
            id_payload: Bytes::from(trireme_proto::snapshot_id_payload(snapshot)),
            size,
            links: copies.iter().map(|_| Default::default()).collect(),
            places: tokio::sync::Semaphore::new(IN_FLIGHT),
            extents: Default::default(),
            copies,
            current: AtomicUsize::new(0),
            opts,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The snapshot's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Holds the snapshot on every copy in `who`'s name while this reader lives, so that a
    /// delete of it is refused naming `who` (`node/src/holds.rs`): asked at once, then every
    /// third of the hold's life. A copy that does not answer is asked again next time.
    /// Returns once every copy was asked a first time.
    pub async fn hold(self: &Arc<Self>, who: String) {
        let who = Bytes::from(who.into_bytes());
        self.hold_once(&who).await;
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(trireme_proto::HOLD_SECS / 3))
                    .await;
                let Some(r) = me.upgrade() else { return };
                r.hold_once(&who).await;
            }
        });
    }

    async fn hold_once(&self, who: &Bytes) {
        self.hold_all(who, 0).await
    }

    /// Lets go of the hold [`SnapshotReader::hold`] took in `who`'s name (the export stops:
    /// a delete right after is not refused for it).
    pub async fn release(&self, who: String) {
        self.hold_all(&Bytes::from(who.into_bytes()), trireme_proto::RELEASE)
            .await
    }

    async fn hold_all(&self, who: &Bytes, length: u64) {
        for k in 0..self.copies.len() {
            if let Err(e) = self.ask(k, Op::SnapshotHold, self.id, length, who, 0).await {
                tracing::debug!(snapshot = %self.label, node = self.copies[k].node, "holding the snapshot: {e}");
            }
        }
    }

    /// Copy `k`'s link, opened if it has none open (by one request at a time).
    async fn link(&self, k: usize) -> Result<Arc<dyn Connection>, VolumeError> {
        let mut l = self.links[k].lock().await;
        if let Some(c) = l.conn.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        if let Some((at, why)) = &l.failed {
            if at.elapsed() < RETRY_LINK {
                return Err(VolumeError::Protocol {
                    node: self.copies[k].node,
                    what: format!("its link failed to open a moment ago: {why}"),
                });
            }
        }
        match connect_replica(&self.copies[k], &self.opts, None).await {
            Ok(c) => {
                *l = Link {
                    conn: Some(c.clone()),
                    failed: None,
                };
                Ok(c)
            }
            Err(e) => {
                l.conn = None;
                l.failed = Some((tokio::time::Instant::now(), e.to_string()));
                Err(e)
            }
        }
    }

    /// One request about `[offset, offset+len)` of the snapshot (`SnapshotRead`,
    /// `SnapshotStatus` or `SnapshotChanged`, with its payload) to copy `k`: its answer's
    /// payload.
    async fn ask(
        &self,
        k: usize,
        op: Op,
        offset: u64,
        len: u64,
        payload: &Bytes,
        flags: u16,
    ) -> Result<Bytes, VolumeError> {
        let node = self.copies[k].node;
        let _place = self
            .places
            .acquire()
            .await
            .map_err(|_| VolumeError::NoReplicas(self.label.clone()))?;
        let c = self.link(k).await?;
        let h = Header {
            volume: self.volume,
            offset,
            length: len,
            flags,
            ..Header::request(op, 0)
        };
        let timeout = self.opts.replica_timeout;
        let f = tokio::time::timeout(timeout, c.call(h, payload.clone()))
            .await
            .map_err(|_| VolumeError::Timeout { node, timeout })?
            .map_err(|source| VolumeError::Transport { node, source })?;
        match f.header.status {
            Status::Ok if op != Op::SnapshotRead || f.payload.len() as u64 == len => Ok(f.payload),
            Status::Ok => Err(VolumeError::Protocol {
                node,
                what: format!("{} bytes read of {len}", f.payload.len()),
            }),
            status => Err(VolumeError::Replica {
                node,
                status,
                message: String::from_utf8_lossy(&f.payload).into_owned(),
            }),
        }
    }

    /// The allocation of `[offset, offset+len)` (up to 4 GiB) in the snapshot: all of it, or
    /// the first extents (`want`).
    pub async fn block_status(
        &self,
        offset: u64,
        len: u64,
        want: crate::Extents,
    ) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
        trireme_replication::check_io(offset, len, self.size, 1 << 32)?;
        let kind = crate::extent_cache::Kind::Allocation;
        self.extents
            .answer(kind, offset, len, want, |ask| async move {
                let (k, b) = self
                    .ask_any(
                        Op::SnapshotStatus,
                        offset,
                        len,
                        &self.id_payload,
                        ask.flags(),
                    )
                    .await?;
                ask.check(self.copies[k].node, &b, len)
            })
            .await
    }

    /// Which of `[offset, offset+len)` (up to 4 GiB) differs between snapshot `from` and this
    /// one: extents covering it, flag [`trireme_proto::EXTENT_CHANGED`] where blocks were
    /// written or trimmed in between (4 KiB granularity). Asked of a copy that holds both.
    pub async fn changed(
        &self,
        from: u64,
        offset: u64,
        len: u64,
        want: crate::Extents,
    ) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
        trireme_replication::check_io(offset, len, self.size, 1 << 32)?;
        let q = Bytes::from(
            trireme_proto::ChangedRequest {
                from,
                to: Some(self.id),
            }
            .payload(),
        );
        let kind = crate::extent_cache::Kind::ChangedSince(from);
        self.extents
            .answer(kind, offset, len, want, |ask| async move {
                let (k, b) = self
                    .ask_any(Op::SnapshotChanged, offset, len, &q, ask.flags())
                    .await?;
                ask.check(self.copies[k].node, &b, len)
            })
            .await
    }

    /// Reads `len` bytes at `offset` of the snapshot.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, VolumeError> {
        trireme_replication::check_io(offset, len, self.size, u64::MAX)?;
        let mut out = BytesMut::with_capacity(len as usize);
        let mut pos = offset;
        while pos < offset + len {
            let n = (offset + len - pos).min(MAX_IO);
            out.extend_from_slice(&self.read_any(pos, n).await?);
            pos += n;
        }
        Ok(out.freeze())
    }

    async fn read_any(&self, offset: u64, len: u64) -> Result<Bytes, VolumeError> {
        Ok(self
            .ask_any(Op::SnapshotRead, offset, len, &self.id_payload, 0)
            .await?
            .1)
    }

    /// [`SnapshotReader::ask`] of the copy that answered last, then of each next one: which
    /// copy answered, and its answer.
    async fn ask_any(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        payload: &Bytes,
        flags: u16,
    ) -> Result<(usize, Bytes), VolumeError> {
        let first = self.current.load(Ordering::Relaxed);
        let mut last = None;
        for step in 0..self.copies.len() {
            let k = (first + step) % self.copies.len();
            match self.ask(k, op, offset, len, payload, flags).await {
                Ok(b) => {
                    self.current.store(k, Ordering::Relaxed);
                    return Ok((k, b));
                }
                Err(e) => {
                    tracing::debug!(snapshot = %self.label, node = self.copies[k].node, "snapshot request failed, trying the next copy: {e}");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| VolumeError::NoReplicas(self.label.clone())))
    }
}
