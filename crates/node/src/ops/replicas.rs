//! A replica's life on the node: attach (the fence), create, resize, delete, and what it is
//! (size, bytes allocated, epoch, incarnation).

use bytes::Bytes;
use trireme_proto::{Header, Status};
use trireme_replication::{fence, FenceDecision};
use trireme_transport::Frame;

use crate::{Node, Refusal};

/// The largest step an attach may move a replica's epoch forward (see [`Node::on_attach`]).
const MAX_EPOCH_LEAP: u64 = 1 << 32;

impl Node {
    pub(crate) fn on_attach(&self, req: &Frame, resp: &mut Header) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let r = self.replica(h.volume)?;
        let _g = self.attach_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Taken before anything changes: every I/O request admitted so far finishes first,
        // and none starts until this attach is done (`io_replica`).
        let mut owners = self.owners.write().unwrap_or_else(|e| e.into_inner());
        match fence(h.epoch, r.epoch(), true) {
            FenceDecision::Accept => {}
            // Epochs grow by one per attach the metadata records; a leap past any number of
            // those is not one of them, and would fence every real writer for good (the
            // epoch is persisted).
            FenceDecision::Advance { new_epoch } if new_epoch - r.epoch() > MAX_EPOCH_LEAP => {
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
        // Its size too, so a writer sees a copy that missed a resize.
        let a = trireme_proto::AttachAnswer {
            incarnation: r.incarnation(),
            size: Some(r.size()),
        };
        a.put(resp);
        Ok(Bytes::new())
    }

    pub(crate) fn on_create_replica(&self, h: &Header) -> Result<Bytes, Refusal> {
        // Under the map's lock: two creates cannot both fit in the room for one.
        let mut reps = self.replicas.write().unwrap_or_else(|e| e.into_inner());
        self.check_room(&reps, h.length)?;
        let r = self.store.create(h.volume, h.length)?;
        if h.has_flag(trireme_proto::FLAG_PREALLOCATE) {
            if let Err(e) = self.store.preallocate(h.volume) {
                // All or nothing: a thick volume never gets a thin copy.
                let _ = self.store.delete(h.volume);
                return Err(e.into());
            }
        }
        self.held.forget(h.volume);
        if h.has_flag(trireme_proto::FLAG_HELD) {
            if let Err(e) = self.held.start(h.volume, h.length, r.ledger()) {
                // All or nothing: a parity volume's copy never goes without its map.
                let _ = self.store.delete(h.volume);
                return Err(e.into());
            }
        }
        reps.insert(h.volume, r);
        drop(reps);
        self.activity.forget(h.volume);
        self.integrity.forget(h.volume);
        tracing::info!(
            node = self.id,
            volume = h.volume,
            size = h.length,
            preallocated = h.has_flag(trireme_proto::FLAG_PREALLOCATE),
            held_map = h.has_flag(trireme_proto::FLAG_HELD),
            "created replica"
        );
        Ok(Bytes::new())
    }

    /// Refuses a new replica of `len` bytes that does not fit the node's room beside `reps`.
    pub(crate) fn check_room(
        &self,
        reps: &std::collections::HashMap<u64, std::sync::Arc<dyn trireme_store::Replica>>,
        len: u64,
    ) -> Result<(), Refusal> {
        let used: u64 = reps.values().map(|r| r.size()).sum();
        let room = self.room.space(used, 0, reps.len() as u64);
        if used.checked_add(len).is_none_or(|t| t > room.limit()) {
            return Err(Refusal(
                Status::NoSpace,
                crate::room::refusal(&room, "a replica of", len),
            ));
        }
        Ok(())
    }

    /// `ResizeReplica`: with every request admitted so far finished and none let in until it
    /// is done (as an attach), under the replica's epoch, within the node's room; the
    /// replica's activity log follows its size.
    pub(crate) fn on_resize_replica(&self, h: &Header) -> Result<Bytes, Refusal> {
        trireme_store::check_size(h.length)?;
        {
            // Already that size (a resync's check): nothing to pause I/O for.
            let r = self.replica(h.volume)?;
            Self::check_epoch(&*r, h)?;
            if r.size() == h.length {
                return Ok(Bytes::new());
            }
        }
        if self.held.keeps(h.volume) {
            return Err(Refusal(
                Status::Unsupported,
                format!("volume {}: a parity volume's copy is not resized", h.volume),
            ));
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
        Ok(Bytes::new())
    }

    pub(crate) fn on_delete_replica(&self, h: &Header) -> Result<Bytes, Refusal> {
        self.check_no_clone_reads(h.volume, None)?;
        self.replicas
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&h.volume);
        self.dirty.forget_volume(h.volume);
        self.activity.forget(h.volume);
        self.integrity.forget(h.volume);
        self.holds.forget(h.volume, None);
        self.held.forget(h.volume);
        self.io.forget(h.volume);
        self.owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&h.volume);
        self.store.delete(h.volume)?;
        tracing::info!(node = self.id, volume = h.volume, "deleted replica");
        Ok(Bytes::new())
    }

    pub(crate) fn on_replica_info(&self, h: &Header, resp: &mut Header) -> Result<Bytes, Refusal> {
        let r = self.replica(h.volume)?;
        let a = trireme_proto::ReplicaInfoAnswer {
            size: r.size(),
            allocated_bytes: r.allocated_bytes(),
            epoch: r.epoch(),
            incarnation: r.incarnation(),
            integrity: Some(self.integrity.report(&*r)),
        };
        Ok(Bytes::from(a.put(resp)))
    }

    /// A scrub compared and repaired every region of the copy: what is noted of its
    /// integrity up to the token in `offset` is cleared (`integrity.rs`).
    pub(crate) fn on_verified(&self, h: &Header) -> Result<Bytes, Refusal> {
        let r = self.replica(h.volume)?;
        Self::check_epoch(&*r, h)?;
        self.integrity
            .verified(&*r, h.offset)
            .map_err(|why| Refusal(Status::Invalid, why))?;
        Ok(Bytes::new())
    }
}
