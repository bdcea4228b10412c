//! The volume client: what every frontend (NBD today) and the benchmark use to do I/O on a
//! mirrored volume.
//!
//! [`Volume::attach`] takes the epoch the metadata store handed out, connects to every replica
//! and attaches them with it (a replica that has seen a newer epoch refuses: fencing). Then:
//!
//! * a write (or write-zeroes, or flush) goes to every in-sync replica in parallel and is
//!   acknowledged only when all hold it, as decided by the replication core's `WriteQuorum`;
//! * a read goes to one in-sync replica, chosen by `ReplicaSet::read_order`, and falls over to
//!   the next one if that replica fails.
//!
//! The decisions live in `trireme-replication`; this crate only moves frames.

mod conflict;
mod verify;

pub use verify::{verify_replicas, Mismatch, VerifyReport};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::task::Poll;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use trireme_proto::{
    decode_extents, Extent, Header, Op, Status, FLAG_FUA, FLAG_MAY_TRIM, MAX_PAYLOAD,
};
use trireme_replication::{
    check_io, RangeError, ReplicaOutcome, ReplicaSet, ReplicaState, WriteFailure, WriteQuorum,
};
use trireme_transport::{Connection, ConnectionInfo, Frame, TransportError, TransportKind};

/// Largest read or write the client sends in one frame.
pub const MAX_IO: u64 = MAX_PAYLOAD as u64;

/// Where a volume lives and which epoch this writer holds: the answer to an attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachInfo {
    pub name: String,
    pub id: u64,
    pub size: u64,
    pub epoch: u64,
    pub replicas: Vec<ReplicaTarget>,
}

/// One replica as the client reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaTarget {
    pub node: u32,
    pub addr: String,
    /// The node's same-host socket (`unix:/path`), tried first when it exists on this host.
    #[serde(default)]
    pub local_addr: Option<String>,
    pub state: ReplicaState,
}

/// Errors of the volume client.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error(
        "volume {volume}: fenced, another writer attached with epoch {newer} (ours is {ours})"
    )]
    Fenced {
        volume: String,
        ours: u64,
        newer: u64,
    },
    #[error("volume {volume}: {failure}")]
    Write {
        volume: String,
        failure: WriteFailure,
    },
    #[error("node {node}: {status}: {message}")]
    Replica {
        node: u32,
        status: &'static str,
        message: String,
    },
    #[error("node {node}: {source}")]
    Transport { node: u32, source: TransportError },
    #[error("volume {0}: no in-sync replica can serve the request")]
    NoReplicas(String),
    #[error("node {node} sent a malformed response: {what}")]
    Protocol { node: u32, what: String },
}

impl VolumeError {
    /// True for errors caused by the request itself (an out-of-range offset, say), which the
    /// frontend reports as EINVAL rather than EIO.
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, VolumeError::Range(_))
    }
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            VolumeError::Fenced { .. }
                | VolumeError::Write {
                    failure: WriteFailure::Fenced,
                    ..
                }
        )
    }
}

/// An attached (or merely connected) volume.
#[derive(Debug)]
pub struct Volume {
    info: AttachInfo,
    conns: Vec<Option<Arc<dyn Connection>>>,
    set: RwLock<ReplicaSet>,
    spread: AtomicUsize,
    /// Keeps overlapping writes in one order on every replica.
    write_order: conflict::WriteOrder,
}

/// Joins futures without spawning them: the writer's fan-out stays on its own task.
async fn join_all<T>(mut futs: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future completed"))
        .collect()
}

/// Connects to a replica's node: through its same-host socket when that socket exists here,
/// else over the network address.
async fn connect_replica(
    r: &ReplicaTarget,
    kind: TransportKind,
    streams: usize,
) -> Result<Arc<dyn Connection>, VolumeError> {
    if let Some(local) = &r.local_addr {
        let path = local.strip_prefix("unix:").unwrap_or(local);
        if std::path::Path::new(path).exists() {
            match trireme_transport::connect(kind, local, streams).await {
                Ok(c) => return Ok(c),
                Err(e) => tracing::warn!(
                    node = r.node,
                    "same-host socket failed, using {}: {e}",
                    r.addr
                ),
            }
        }
    }
    trireme_transport::connect(kind, &r.addr, streams)
        .await
        .map_err(|source| VolumeError::Transport {
            node: r.node,
            source,
        })
}

impl Volume {
    /// Connects to every in-sync replica without attaching (for verification and status).
    pub async fn connect(
        info: AttachInfo,
        kind: TransportKind,
        streams: usize,
    ) -> Result<Volume, VolumeError> {
        let mut conns = Vec::with_capacity(info.replicas.len());
        for r in &info.replicas {
            if r.state != ReplicaState::InSync {
                conns.push(None);
                continue;
            }
            conns.push(Some(connect_replica(r, kind, streams).await?));
        }
        let states = info.replicas.iter().map(|r| r.state).collect();
        Ok(Volume {
            set: RwLock::new(ReplicaSet::new(states, None)),
            info,
            conns,
            spread: AtomicUsize::new(0),
            write_order: conflict::WriteOrder::default(),
        })
    }

    /// Connects and attaches every in-sync replica with this writer's epoch.
    pub async fn attach(
        info: AttachInfo,
        kind: TransportKind,
        streams: usize,
    ) -> Result<Volume, VolumeError> {
        let v = Volume::connect(info, kind, streams).await?;
        let targets = v.set().write_targets();
        let h = v.header(Op::Attach, 0, 0);
        let replies = join_all(
            targets
                .iter()
                .map(|&i| v.call(i, h, Bytes::new()))
                .collect(),
        )
        .await;
        for (k, r) in replies.into_iter().enumerate() {
            v.expect_ok(targets[k], r?)?;
        }
        tracing::info!(volume = %v.info.name, epoch = v.info.epoch, replicas = targets.len(), "attached");
        Ok(v)
    }

    pub fn info(&self) -> &AttachInfo {
        &self.info
    }
    pub fn size(&self) -> u64 {
        self.info.size
    }
    pub fn connections(&self) -> Vec<Option<ConnectionInfo>> {
        self.conns
            .iter()
            .map(|c| c.as_ref().map(|c| c.info()))
            .collect()
    }

    /// The replica set, read-locked. Callers use it within one statement, never across an
    /// `.await`.
    fn set(&self) -> std::sync::RwLockReadGuard<'_, ReplicaSet> {
        self.set.read().unwrap_or_else(|e| e.into_inner())
    }

    fn header(&self, op: Op, offset: u64, length: u64) -> Header {
        Header {
            volume: self.info.id,
            epoch: self.info.epoch,
            offset,
            length,
            ..Header::request(op, 0)
        }
    }

    fn node(&self, i: usize) -> u32 {
        self.info.replicas[i].node
    }

    fn call(
        &self,
        i: usize,
        h: Header,
        payload: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<Frame, VolumeError>> + Send + '_>> {
        let node = self.node(i);
        Box::pin(async move {
            let c = self.conns[i]
                .as_ref()
                .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))?;
            c.call(h, payload)
                .await
                .map_err(|source| VolumeError::Transport { node, source })
        })
    }

    fn expect_ok(&self, i: usize, f: Frame) -> Result<Frame, VolumeError> {
        match f.header.status {
            Status::Ok => Ok(f),
            Status::Fenced => Err(VolumeError::Fenced {
                volume: self.info.name.clone(),
                ours: self.info.epoch,
                newer: f.header.epoch,
            }),
            s => Err(VolumeError::Replica {
                node: self.node(i),
                status: s.as_str(),
                message: String::from_utf8_lossy(&f.payload).into_owned(),
            }),
        }
    }

    /// Sends `h` to every write target; succeeds only if all succeed. `h`'s range is held
    /// against overlapping writes until every replica has answered.
    async fn mirror(&self, h: Header, payload: Bytes) -> Result<(), VolumeError> {
        let _range = match h.op {
            Op::Write | Op::WriteZeroes => Some(
                self.write_order
                    .acquire(h.offset, h.offset + h.length)
                    .await,
            ),
            _ => None,
        };
        let mut q = WriteQuorum::new(self.set().write_targets());
        if let Some(r) = q.finish_empty() {
            return r.map_err(|failure| VolumeError::Write {
                volume: self.info.name.clone(),
                failure,
            });
        }
        let replies = join_all(
            q.targets()
                .iter()
                .map(|&i| self.call(i, h, payload.clone()))
                .collect(),
        )
        .await;
        let mut result = None;
        for (k, r) in replies.into_iter().enumerate() {
            let i = q.targets()[k];
            let outcome = match r.and_then(|f| self.expect_ok(i, f)) {
                Ok(_) => ReplicaOutcome::Done,
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), op = ?h.op, "replica failed: {e}");
                    match e {
                        VolumeError::Fenced { .. } => ReplicaOutcome::Fenced,
                        VolumeError::Replica { status, .. }
                            if status == Status::OutOfRange.as_str()
                                || status == Status::Invalid.as_str() =>
                        {
                            ReplicaOutcome::Refused
                        }
                        _ => ReplicaOutcome::Failed,
                    }
                }
            };
            result = q.record(k, outcome);
        }
        match result.expect("every target replied") {
            Ok(()) => Ok(()),
            Err(failure) => Err(VolumeError::Write {
                volume: self.info.name.clone(),
                failure,
            }),
        }
    }

    /// Sends a read-like request to one in-sync replica, falling over to the next on failure.
    async fn read_one(&self, h: Header) -> Result<Frame, VolumeError> {
        let order = self
            .set()
            .read_order(self.spread.fetch_add(1, Ordering::Relaxed));
        let mut last = VolumeError::NoReplicas(self.info.name.clone());
        for i in order {
            match self
                .call(i, h, Bytes::new())
                .await
                .and_then(|f| self.expect_ok(i, f))
            {
                Ok(f) => return Ok(f),
                Err(e @ VolumeError::Fenced { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, node = self.node(i), "read failed, trying another replica: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, VolumeError> {
        check_io(offset, len, self.info.size, MAX_IO)?;
        if len == 0 {
            return Ok(Bytes::new());
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
        check_io(offset, data.len() as u64, self.info.size, MAX_IO)?;
        if data.is_empty() {
            return Ok(());
        }
        let mut h = self.header(Op::Write, offset, data.len() as u64);
        if fua {
            h.flags |= FLAG_FUA;
        }
        self.mirror(h, data).await
    }

    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), VolumeError> {
        check_io(offset, len, self.info.size, u64::MAX)?;
        if len == 0 {
            return Ok(());
        }
        let mut h = self.header(Op::WriteZeroes, offset, len);
        if may_trim {
            h.flags |= FLAG_MAY_TRIM;
        }
        if fua {
            h.flags |= FLAG_FUA;
        }
        self.mirror(h, Bytes::new()).await
    }

    pub async fn flush(&self) -> Result<(), VolumeError> {
        self.mirror(self.header(Op::Flush, 0, 0), Bytes::new())
            .await
    }

    /// Allocation extents of `[offset, offset+len)`, from one in-sync replica.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError> {
        check_io(offset, len, self.info.size, u64::MAX)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let f = self
            .read_one(self.header(Op::BlockStatus, offset, len))
            .await?;
        let ext = decode_extents(&f.payload).map_err(|e| VolumeError::Protocol {
            node: 0,
            what: e.to_string(),
        })?;
        let total: u64 = ext.iter().map(|e| e.length).sum();
        if total != len {
            return Err(VolumeError::Protocol {
                node: 0,
                what: format!("extents cover {total} of {len} bytes"),
            });
        }
        Ok(ext)
    }

    /// crc32c of a range on every connected replica (index order), for verification.
    pub async fn replica_checksums(
        &self,
        offset: u64,
        len: u64,
    ) -> Vec<Option<Result<u32, VolumeError>>> {
        let h = self.header(Op::Checksum, offset, len);
        let idx: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].is_some())
            .collect();
        let replies = join_all(idx.iter().map(|&i| self.call(i, h, Bytes::new())).collect()).await;
        let mut out: Vec<Option<Result<u32, VolumeError>>> =
            (0..self.conns.len()).map(|_| None).collect();
        for (k, r) in replies.into_iter().enumerate() {
            let i = idx[k];
            out[i] = Some(
                r.and_then(|f| self.expect_ok(i, f))
                    .map(|f| f.header.length as u32),
            );
        }
        out
    }
}
