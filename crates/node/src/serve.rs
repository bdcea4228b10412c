//! Serving one request: who may send it, the fencing rule, then its op's handler (`ops/`).

use std::sync::Arc;

use bytes::Bytes;
use trireme_proto::{Header, Op, Status, FLAG_RECOVERY};
use trireme_replication::qos::IOPS_UNIT;
use trireme_replication::{fence, FenceDecision};
use trireme_store::Replica;
use trireme_transport::{Frame, Handler};

use crate::schedule::Class;
use crate::{Node, Refusal};

/// An I/O request's turn on the node's writers (see [`Node::io_replica`]).
pub(crate) type IoTurn<'a> = std::sync::RwLockReadGuard<'a, std::collections::HashMap<u64, u64>>;

impl Node {
    pub(crate) fn check_epoch(r: &dyn Replica, h: &Header) -> Result<(), Refusal> {
        match fence(h.epoch, r.epoch(), false) {
            FenceDecision::Accept => Ok(()),
            FenceDecision::Fenced { current } | FenceDecision::NotAttached { current } => {
                Err(Refusal(
                    Status::Fenced,
                    format!("epoch {} refused, replica is at {current}", h.epoch),
                ))
            }
            FenceDecision::Advance { .. } => unreachable!("I/O never advances an epoch"),
        }
    }

    /// The replica an I/O request addresses, once it passed the epoch check and came on the
    /// connection that attached the replica (I/O from any other connection of the same epoch is
    /// refused: late frames of an abandoned connection). One lookup per request.
    ///
    /// The returned turn is held while the request runs. An attach takes the same lock
    /// exclusively, so it answers only once every request admitted before it has finished:
    /// a write the writer gave up on (it timed out, or its link broke) can never land after
    /// the writer attached again and wrote something newer in its place, nor one of a fenced
    /// writer after the next writer's attach.
    pub(crate) fn io_replica(
        &self,
        req: &Frame,
    ) -> Result<(Arc<dyn Replica>, IoTurn<'_>), Refusal> {
        let h = &req.header;
        let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
        let r = self.replica(h.volume)?;
        Self::check_epoch(&*r, h)?;
        match owners.get(&h.volume) {
            Some(&o) if o != req.origin => Err(Refusal(
                Status::Superseded,
                format!(
                    "connection {:#x} was superseded by {o:#x} for volume {}",
                    req.origin, h.volume
                ),
            )),
            _ => Ok((r, owners)),
        }
    }

    /// Serves one request synchronously (the caller picks the thread): authorized on its
    /// header, then its op's handler (`ops/`).
    pub(crate) fn serve(&self, req: &Frame) -> Result<(Header, Bytes), Refusal> {
        let closed = self.closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return Err(Refusal(Status::Io, "the node is shutting down".into()));
        }
        self.authorize(&req.header, &req.peer)?;
        let h = &req.header;
        let mut resp = h.response(Status::Ok);
        let r = &mut resp;
        let payload = match h.op {
            Op::Ping => {
                // The most its replicas may hold, for `status`.
                let a = trireme_proto::PingAnswer {
                    node: self.id.to_string(),
                    capacity: Some(self.room.capacity()).filter(|&c| c > 0),
                };
                Ok(Bytes::from(a.put(r)))
            }
            Op::Space => Ok(Bytes::from(self.space().encode())),
            Op::UcxAddress => match &*self.ucx.read().unwrap_or_else(|e| e.into_inner()) {
                Ok(a) => Ok(a.clone()),
                Err(why) => Err(Refusal(Status::Unsupported, why.clone())),
            },
            Op::Hello => Err(Refusal(Status::Invalid, "hello is not a request".into())),
            Op::Attach => self.on_attach(req, r),
            Op::CreateReplica => self.on_create_replica(h),
            Op::ResizeReplica => self.on_resize_replica(h),
            Op::DeleteReplica => self.on_delete_replica(h),
            Op::ReplicaInfo => self.on_replica_info(h, r),
            Op::Read => self.on_read(req, r),
            Op::Write => self.on_write(req),
            Op::Flush => self.on_flush(req),
            Op::WriteZeroes => self.on_write_zeroes(req),
            Op::BlockStatus => self.on_block_status(req),
            Op::Checksum => self.on_checksum(req, r),
            Op::TierHeat => self.on_tier_heat(req),
            Op::TierSet => self.on_tier_set(h),
            Op::TierInfo => self.on_tier_info(h),
            Op::ActivityStart => self.on_activity_start(req),
            Op::ActivityClear => self.on_activity_clear(req),
            Op::ActivityQuery => self.on_activity_query(h, r),
            Op::DirtyMark | Op::DirtyTrack | Op::DirtyClear | Op::DirtyQuery => {
                self.on_dirty(req, r)
            }
            Op::Snapshot => self.on_snapshot(req),
            Op::SnapshotDelete => self.on_snapshot_delete(h),
            Op::SnapshotList => self.on_snapshot_list(h, r),
            Op::SnapshotRead => self.on_snapshot_read(req),
            Op::Rollback => self.on_rollback(req),
            Op::SnapshotStatus => self.on_snapshot_status(req),
            Op::SnapshotChanged => self.on_snapshot_changed(req),
            Op::CreateClone => self.on_create_clone(req),
            Op::Flatten => self.on_flatten(h),
            Op::Verified => self.on_verified(h),
            Op::SnapshotHold => self.on_snapshot_hold(req),
            Op::SnapshotHolders => self.on_snapshot_holders(h),
            Op::Held => self.on_held(h),
            Op::Qos => self.on_qos(h),
        }?;
        Ok((resp, payload))
    }
}

/// The requests served on the node's I/O threads when the store blocks: reads and writes,
/// bounded by the frame size and waiting on nothing but requests already running
/// (`io_threads.rs`). The rest go to tokio's blocking pool: an attach waits for the I/O
/// before it, a checksum may read a gigabyte, and a flush or a zeroing of a large range would
/// hold a thread the reads behind it wait for.
fn is_data(op: Op) -> bool {
    matches!(op, Op::Read | Op::Write | Op::SnapshotRead)
}

/// Who a data request is for, and what it costs, for the I/O threads' schedule: recovery if
/// flagged so, else its volume's client I/O; its length in 8 KiB units.
fn schedule_class(h: &Header) -> (Class, u64) {
    let class = match h.has_flag(FLAG_RECOVERY) {
        true => Class::Recovery,
        false => Class::Client(h.volume),
    };
    (class, h.length.div_ceil(IOPS_UNIT).max(1))
}

impl Handler for Node {
    fn inline(&self, req: &Frame) -> bool {
        !self.store.blocking()
            || matches!(
                req.header.op,
                Op::Ping
                    | Op::ReplicaInfo
                    | Op::UcxAddress
                    | Op::TierInfo
                    | Op::TierHeat
                    | Op::Space
                    | Op::Qos
            )
    }

    fn refuse(&self, header: &Header, peer: &trireme_transport::Peer) -> Option<Frame> {
        let Refusal(status, msg) = self.authorize(header, peer).err()?;
        Some(Frame::new(header.response(status), Bytes::from(msg)))
    }

    async fn handle(self: Arc<Self>, req: Frame) -> Frame {
        let h = req.header;
        let result = if self.inline(&req) {
            self.serve(&req)
        } else {
            let me = self.clone();
            let job = move || me.serve(&req);
            let ran = match is_data(h.op) {
                true => {
                    let (class, cost) = schedule_class(&h);
                    self.io.run(class, cost, job).await.map_err(|lost| lost.0)
                }
                false => tokio::task::spawn_blocking(job)
                    .await
                    .map_err(|e| e.to_string()),
            };
            ran.unwrap_or_else(|why| Err(Refusal(Status::Io, format!("store task failed: {why}"))))
        };
        match result {
            Ok((header, payload)) => Frame::new(header, payload),
            Err(Refusal(status, msg)) => {
                if status == Status::Io {
                    tracing::error!(node = self.id, op = ?h.op, volume = h.volume, "{msg}");
                } else {
                    tracing::debug!(node = self.id, op = ?h.op, volume = h.volume, "{msg}");
                }
                let mut header = h.response(status);
                if status == Status::Fenced {
                    header.epoch = self.replica(h.volume).map(|r| r.epoch()).unwrap_or(0);
                }
                Frame::new(header, Bytes::from(msg))
            }
        }
    }
}
