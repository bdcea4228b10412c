//! Serving one request: the fencing rule, then the operation on the replica.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use trireme_proto::{
    decode_peer, encode_extents, DirtyPeer, Header, Op, Status, FLAG_FUA, FLAG_MAY_TRIM,
    MAX_PAYLOAD,
};
use trireme_replication::{fence, FenceDecision};
use trireme_store::{Replica, StoreError};
use trireme_transport::{Frame, Handler};

use crate::{
    activity, Node, Refusal, MAX_BLOCK_STATUS_RANGE, MAX_CHECKSUM_RANGE, MAX_DIRTY_QUERY_REGIONS,
};

/// An I/O request's turn on the node's writers (see [`Node::io_replica`]).
type IoTurn<'a> = std::sync::RwLockReadGuard<'a, std::collections::HashMap<u64, u64>>;

impl Node {
    fn check_epoch(r: &dyn Replica, h: &Header) -> Result<(), Refusal> {
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
    fn io_replica(&self, req: &Frame) -> Result<(Arc<dyn Replica>, IoTurn<'_>), Refusal> {
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

    /// Serves one request synchronously (the caller picks the thread).
    pub(crate) fn serve(&self, req: &Frame) -> Result<(Header, Bytes), Refusal> {
        let closed = self.closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return Err(Refusal(Status::Io, "the node is shutting down".into()));
        }
        self.authorize(&req.header, &req.peer)?;
        let h = &req.header;
        let mut resp = h.response(Status::Ok);
        let len_usize = || -> Result<usize, Refusal> {
            if h.length > u64::from(MAX_PAYLOAD) {
                return Err(Refusal(
                    Status::Invalid,
                    format!("length {} over the frame limit", h.length),
                ));
            }
            Ok(h.length as usize)
        };
        let payload = match h.op {
            Op::Ping => {
                // The most its replicas may hold, for `status` (0: no limit set).
                resp.length = self.room.capacity();
                Bytes::from(self.id.to_string())
            }
            Op::Space => Bytes::from(self.space().encode()),
            Op::UcxAddress => match &*self.ucx.read().unwrap_or_else(|e| e.into_inner()) {
                Ok(a) => a.clone(),
                Err(why) => return Err(Refusal(Status::Unsupported, why.clone())),
            },
            Op::Attach => {
                let r = self.replica(h.volume)?;
                let _g = self.attach_lock.lock().unwrap_or_else(|e| e.into_inner());
                // Taken before anything changes: every I/O request admitted so far finishes
                // first, and none starts until this attach is done (`io_replica`).
                let mut owners = self.owners.write().unwrap_or_else(|e| e.into_inner());
                match fence(h.epoch, r.epoch(), true) {
                    FenceDecision::Accept => {}
                    // Epochs grow by one per attach the metadata records; a leap past any
                    // number of those is not one of them, and would fence every real writer
                    // for good (the epoch is persisted).
                    FenceDecision::Advance { new_epoch }
                        if new_epoch - r.epoch() > MAX_EPOCH_LEAP =>
                    {
                        return Err(Refusal(
                            Status::Invalid,
                            format!(
                                "attach with epoch {new_epoch} refused: {} past the replica's {}",
                                new_epoch - r.epoch(),
                                r.epoch()
                            ),
                        ));
                    }
                    FenceDecision::Advance { new_epoch } => r.set_epoch(new_epoch)?,
                    FenceDecision::Fenced { current } | FenceDecision::NotAttached { current } => {
                        return Err(Refusal(
                            Status::Fenced,
                            format!(
                                "attach with epoch {} refused, replica is at {current}",
                                h.epoch
                            ),
                        ));
                    }
                }
                // Same epoch, new connection: the writer reconnected; the old one is abandoned.
                owners.insert(h.volume, req.origin);
                drop(owners);
                resp.length = r.incarnation();
                // And its size, so a writer sees a copy that missed a resize (0 from a node
                // from before resizes).
                resp.offset = r.size();
                Bytes::new()
            }
            Op::Hello => return Err(Refusal(Status::Invalid, "hello is not a request".into())),
            Op::Read => {
                let (r, _turn) = self.io_replica(req)?;
                trireme_store::check_range(h.offset, h.length, r.size())?;
                let mut buf = BytesMut::zeroed(len_usize()?);
                // Asked before the read heats anything: where it is served from, and whether
                // the other copies should hear of it (the writer's read preference and heat
                // sharing, `client/src/tiers.rs`).
                let mut read = || {
                    let hint = r.tier_of(h.offset, h.length);
                    r.read(h.offset, &mut buf).map(|()| hint)
                };
                let hint = if h.has_flag(trireme_proto::FLAG_STREAM) {
                    trireme_store::tiered::heat::as_stream(read)
                } else {
                    read()
                }?;
                if let Some(t) = hint {
                    resp.flags |= trireme_proto::FLAG_TIERED;
                    if t.slow {
                        resp.flags |= trireme_proto::FLAG_SLOW;
                    }
                    if t.heated {
                        resp.flags |= trireme_proto::FLAG_HEATED;
                    }
                }
                buf.freeze()
            }
            Op::TierHeat => {
                let r = self.replica(h.volume)?;
                let entries = trireme_proto::decode_heat(&req.payload)
                    .map_err(|e| Refusal(Status::Invalid, e.to_string()))?;
                for (offset, count) in entries {
                    r.add_heat(offset, count);
                }
                Bytes::new()
            }
            Op::Write => {
                let (r, _turn) = self.io_replica(req)?;
                let len = req.payload.len() as u64;
                // Checked before anything is marked: a bad range marks nothing.
                trireme_store::check_range(h.offset, len, r.size())?;
                // Marked before it is applied: in the dirty records, and in the activity log
                // (on disk first if its extent is not marked there: `activity.rs`).
                self.dirty.on_write(h.volume, h.offset, len);
                self.activity.on_write(h.volume, h.offset, len)?;
                r.write(h.offset, &req.payload, h.has_flag(FLAG_FUA))?;
                Bytes::new()
            }
            Op::Flush => {
                let (r, _turn) = self.io_replica(req)?;
                r.flush()?;
                Bytes::new()
            }
            Op::WriteZeroes => {
                let (r, _turn) = self.io_replica(req)?;
                trireme_store::check_range(h.offset, h.length, r.size())?;
                self.dirty.on_write(h.volume, h.offset, h.length);
                self.activity.on_write(h.volume, h.offset, h.length)?;
                r.write_zeroes(
                    h.offset,
                    h.length,
                    h.has_flag(FLAG_MAY_TRIM),
                    h.has_flag(FLAG_FUA),
                )?;
                Bytes::new()
            }
            Op::BlockStatus => {
                let (r, _turn) = self.io_replica(req)?;
                if h.length > MAX_BLOCK_STATUS_RANGE {
                    return Err(Refusal(
                        Status::Invalid,
                        format!("block status over {} bytes is too large", h.length),
                    ));
                }
                Bytes::from(encode_extents(&r.block_status(h.offset, h.length)?))
            }
            Op::Checksum => {
                // A checksum of a short range reveals the bytes in it: the epoch fence holds
                // here too. Not tied to the attaching connection: `volume verify` asks from
                // its own, at the current epoch.
                let r = self.replica(h.volume)?;
                Self::check_epoch(&*r, h)?;
                if h.length > MAX_CHECKSUM_RANGE {
                    return Err(Refusal(
                        Status::Invalid,
                        format!("checksum range {} too large", h.length),
                    ));
                }
                resp.length = u64::from(checksum(&*r, h.offset, h.length)?);
                Bytes::new()
            }
            Op::CreateReplica => {
                // Under the map's lock: two creates cannot both fit in the room for one.
                let mut reps = self.replicas.write().unwrap_or_else(|e| e.into_inner());
                let used: u64 = reps.values().map(|r| r.size()).sum();
                let room = self.room.space(used, 0, reps.len() as u64);
                if used.checked_add(h.length).is_none_or(|t| t > room.limit()) {
                    return Err(Refusal(
                        Status::NoSpace,
                        crate::room::refusal(&room, "a replica of", h.length),
                    ));
                }
                let r = self.store.create(h.volume, h.length)?;
                if h.has_flag(trireme_proto::FLAG_PREALLOCATE) {
                    if let Err(e) = self.store.preallocate(h.volume) {
                        // All or nothing: a thick volume never gets a thin copy.
                        let _ = self.store.delete(h.volume);
                        return Err(e.into());
                    }
                }
                reps.insert(h.volume, r);
                drop(reps);
                self.activity.forget(h.volume);
                tracing::info!(
                    node = self.id,
                    volume = h.volume,
                    size = h.length,
                    preallocated = h.has_flag(trireme_proto::FLAG_PREALLOCATE),
                    "created replica"
                );
                Bytes::new()
            }
            Op::ResizeReplica => {
                self.resize_replica(h)?;
                Bytes::new()
            }
            Op::DeleteReplica => {
                self.replicas
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&h.volume);
                self.dirty.forget_volume(h.volume);
                self.activity.forget(h.volume);
                self.owners
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&h.volume);
                self.store.delete(h.volume)?;
                tracing::info!(node = self.id, volume = h.volume, "deleted replica");
                Bytes::new()
            }
            Op::TierSet => {
                let pin = u8::try_from(h.offset)
                    .ok()
                    .and_then(trireme_store::Pin::from_code)
                    .ok_or_else(|| {
                        Refusal(Status::Invalid, format!("unknown tier pin {}", h.offset))
                    })?;
                let r = self.replica(h.volume)?;
                if self.store.tiers().is_none() {
                    return Err(self.no_tiers());
                }
                r.set_pin(pin)?;
                tracing::info!(
                    node = self.id,
                    volume = h.volume,
                    pin = pin.as_str(),
                    "tier pin set"
                );
                Bytes::new()
            }
            Op::TierInfo => {
                let t = self.store.tiers().ok_or_else(|| self.no_tiers())?;
                let replica = self.replica(h.volume).ok().and_then(|r| r.tiers());
                let report = trireme_proto::TierReport {
                    node: t,
                    replica: replica.map(|r| trireme_proto::ReplicaTierInfo {
                        pin: r.pin.code(),
                        fast_extents: r.fast_extents,
                        slow_extents: r.slow_extents,
                        reads_fast: r.reads_fast,
                        reads_slow: r.reads_slow,
                        promotions: r.promotions,
                        demotions: r.demotions,
                    }),
                };
                Bytes::from(report.encode())
            }
            Op::ReplicaInfo => {
                let r = self.replica(h.volume)?;
                resp.length = r.size();
                resp.offset = r.allocated_bytes();
                resp.epoch = r.epoch();
                Bytes::copy_from_slice(&r.incarnation().to_le_bytes())
            }
            Op::ActivityStart => {
                let (r, _turn) = self.io_replica(req)?;
                let ledger = self.ledger_of(&*r);
                if let Some(l) = &ledger {
                    // The new log starts empty on disk: what the old one covered must be
                    // durable first (data, and the dirty marks of writes it covered).
                    r.flush()?;
                    self.dirty.save(h.volume, r.size(), &**l)?;
                }
                self.activity
                    .start(h.volume, h.epoch, h.length, r.size(), ledger)
                    .map_err(|e| Refusal(Status::Invalid, e))?;
                Bytes::new()
            }
            Op::ActivityClear => {
                let (r, _turn) = self.io_replica(req)?;
                trireme_store::check_range(h.offset, h.length, r.size())?;
                self.activity.clear(h.volume, h.offset, h.length);
                Bytes::new()
            }
            Op::ActivityQuery => {
                let r = self.replica(h.volume)?;
                trireme_store::check_range(h.offset, h.length, r.size())?;
                let span = h.length / activity::MIN_EXTENT;
                if span > MAX_DIRTY_QUERY_REGIONS {
                    return Err(Refusal(
                        Status::Invalid,
                        format!("activity query over {} bytes is too large", h.length),
                    ));
                }
                let v = self.activity.query(h.volume, h.offset, h.length);
                resp.epoch = v.epoch;
                resp.length = v.extent;
                Bytes::from(encode_extents(&v.extents))
            }
            Op::DirtyMark | Op::DirtyTrack | Op::DirtyClear | Op::DirtyQuery => {
                let (r, _turn) = self.io_replica(req)?;
                trireme_store::check_range(h.offset, h.length, r.size())?;
                let bad = |e: trireme_proto::DecodeError| Refusal(Status::Invalid, e.to_string());
                match h.op {
                    Op::DirtyMark => {
                        let p = DirtyPeer::decode(&req.payload).map_err(bad)?;
                        self.dirty.mark(h.volume, h.epoch, &p, h.offset, h.length);
                        Bytes::new()
                    }
                    Op::DirtyTrack => {
                        let p = DirtyPeer::decode(&req.payload).map_err(bad)?;
                        self.dirty.track(h.volume, h.epoch, &p);
                        // A dropped record is saved at once: the peer is back in sync, and a
                        // crash must not bring its old record back (a superset, so never
                        // wrong, but it would make the next resync copy it all again).
                        if p.mode == trireme_proto::DIRTY_DROP {
                            if let Some(l) = self.ledger_of(&*r) {
                                self.dirty.save(h.volume, r.size(), &*l)?;
                            }
                        }
                        Bytes::new()
                    }
                    Op::DirtyClear => {
                        let peer = decode_peer(&req.payload).map_err(bad)?;
                        self.dirty.clear(h.volume, peer, h.offset, h.length);
                        Bytes::new()
                    }
                    _ => {
                        let peer = decode_peer(&req.payload).map_err(bad)?;
                        // Bounded answer: at most one extent per region, and the range is capped.
                        if h.length / self.dirty.grain() > MAX_DIRTY_QUERY_REGIONS {
                            return Err(Refusal(
                                Status::Invalid,
                                format!("dirty query over {} bytes is too large", h.length),
                            ));
                        }
                        let v = self.dirty.query(h.volume, peer, h.offset, h.length);
                        resp.epoch = v.epoch;
                        resp.length = v.incarnation;
                        Bytes::from(encode_extents(&v.extents))
                    }
                }
            }
        };
        Ok((resp, payload))
    }
}

/// crc32c of `[offset, offset+len)`, read in 1 MiB pieces.
fn checksum(r: &dyn Replica, offset: u64, len: u64) -> Result<u32, StoreError> {
    trireme_store::check_range(offset, len, r.size())?;
    let mut buf = vec![0u8; (1 << 20).min(len as usize)];
    let mut crc = 0u32;
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(buf.len() as u64) as usize;
        r.read(pos, &mut buf[..n])?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        pos += n as u64;
    }
    Ok(crc)
}

impl Node {
    /// `ResizeReplica`: with every request admitted so far finished and none let in until it
    /// is done (as an attach), under the replica's epoch, within the node's room; the
    /// replica's activity log follows its size.
    fn resize_replica(&self, h: &Header) -> Result<(), Refusal> {
        trireme_store::check_size(h.length)?;
        {
            // Already that size (a resync's check): nothing to pause I/O for.
            let r = self.replica(h.volume)?;
            Self::check_epoch(&*r, h)?;
            if r.size() == h.length {
                return Ok(());
            }
        }
        let _a = self.attach_lock.lock().unwrap_or_else(|e| e.into_inner());
        let _turn = self.owners.write().unwrap_or_else(|e| e.into_inner());
        let r = self.replica(h.volume)?;
        Self::check_epoch(&*r, h)?;
        let (old, size) = (r.size(), h.length);
        if size > old {
            let reps = self.replicas.read().unwrap_or_else(|e| e.into_inner());
            let used: u64 = reps.values().map(|r| r.size()).sum();
            let room = self.room.space(used, 0, reps.len() as u64);
            if used.saturating_add(size - old) > room.limit() {
                return Err(Refusal(
                    Status::NoSpace,
                    crate::room::refusal(&room, "growing a replica by", size - old),
                ));
            }
        }
        r.resize(size)?;
        if size > old && h.has_flag(trireme_proto::FLAG_PREALLOCATE) {
            self.store.preallocate(h.volume)?;
        }
        self.activity
            .resize(h.volume, size)
            .map_err(|e| Refusal(Status::Io, e))?;
        tracing::info!(
            node = self.id,
            volume = h.volume,
            old,
            size,
            "resized replica"
        );
        Ok(())
    }
}

/// The largest step an attach may move a replica's epoch forward (see `Op::Attach`).
const MAX_EPOCH_LEAP: u64 = 1 << 32;

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
            )
    }

    fn refuse(&self, header: &Header, peer: &trireme_transport::Peer) -> Option<Frame> {
        let Refusal(status, msg) = self.authorize(header, peer).err()?;
        Some(Frame::new(header.response(status), Bytes::from(msg)))
    }

    async fn handle(self: Arc<Self>, req: Frame) -> Frame {
        let blocking = !self.inline(&req);
        let h = req.header;
        let result = if blocking {
            let me = self.clone();
            match tokio::task::spawn_blocking(move || me.serve(&req)).await {
                Ok(r) => r,
                Err(e) => Err(Refusal(Status::Io, format!("store task failed: {e}"))),
            }
        } else {
            self.serve(&req)
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
