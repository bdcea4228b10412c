//! A replica's snapshots: take one or roll back to one (the writer, under its epoch, with no
//! write in flight),
//! list them, read one (any client on the volume's access list: reading a snapshot never
//! fences the writer), delete one (nodes and operators).

use bytes::{Bytes, BytesMut};
use trireme_proto::{Header, SnapshotRequest, Status, MAX_PAYLOAD};
use trireme_transport::Frame;

use crate::{Node, Refusal};

fn malformed(e: trireme_proto::DecodeError) -> Refusal {
    Refusal(Status::Invalid, e.to_string())
}

impl Node {
    pub(crate) fn on_snapshot(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let t0 = std::time::Instant::now();
        let (r, _turn) = self.io_replica(req)?;
        let s = SnapshotRequest::read(&req.header).map_err(malformed)?;
        if req.header.has_flag(trireme_proto::FLAG_UNSYNCED) {
            r.snapshot_unsynced(s.id, s.created)?;
        } else {
            r.snapshot(s.id, s.created)?;
        }
        tracing::info!(
            node = self.id,
            volume = r.volume(),
            id = s.id,
            took_us = t0.elapsed().as_micros() as u64,
            "snapshot taken"
        );
        Ok(Bytes::new())
    }

    pub(crate) fn on_rollback(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let (r, _turn) = self.io_replica(req)?;
        let s = SnapshotRequest::read(&req.header).map_err(malformed)?;
        if self.held.keeps(req.header.volume) {
            // Its held map would have to follow every block the rollback changes.
            return Err(Refusal(
                Status::Unsupported,
                format!(
                    "volume {}: a parity volume's copy is not rolled back",
                    req.header.volume
                ),
            ));
        }
        // Every block may change, as by a write of the whole volume: its activity log and its
        // records for copies that are out say so first. A writer that dies with a rollback
        // under way leaves some copies rolled back and others not, and its successor's
        // reconcile compares only what the log marks (simulator seed 45943).
        let size = r.size();
        self.dirty.on_write(req.header.volume, 0, size);
        self.activity.on_write(req.header.volume, 0, size)?;
        r.rollback(s.id)?;
        tracing::warn!(
            node = self.id,
            volume = r.volume(),
            id = s.id,
            "rolled back to a snapshot"
        );
        Ok(Bytes::new())
    }

    pub(crate) fn on_snapshot_delete(&self, h: &Header) -> Result<Bytes, Refusal> {
        let r = self.replica(h.volume)?;
        let s = SnapshotRequest::read(h).map_err(malformed)?;
        self.check_no_clone_reads(h.volume, Some(s.id))?;
        let holders = self.holds.holders(h.volume, s.id);
        let forced = h.has_flag(trireme_proto::FLAG_FORCE);
        if !holders.is_empty() && !forced {
            return Err(Refusal(
                Status::InUse,
                format!(
                    "snapshot {} of volume {} is held by {}",
                    s.id,
                    h.volume,
                    holders.join(", ")
                ),
            ));
        }
        r.delete_snapshot(s.id)?;
        self.holds.forget(h.volume, Some(s.id));
        if !holders.is_empty() {
            tracing::warn!(node = self.id, volume = h.volume, id = s.id, holders = %holders.join(", "), "snapshot deleted though held (forced): its readers fail from now on");
        }
        tracing::info!(
            node = self.id,
            volume = h.volume,
            id = s.id,
            "snapshot deleted"
        );
        Ok(Bytes::new())
    }

    /// A reader holds a snapshot for a while (`holds.rs`).
    pub(crate) fn on_snapshot_hold(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let r = self.replica(h.volume)?;
        if req.payload.is_empty() || req.payload.len() > trireme_proto::MAX_HOLDER {
            return Err(Refusal(
                Status::Invalid,
                format!(
                    "a holder's name is 1 to {} bytes, not {}",
                    trireme_proto::MAX_HOLDER,
                    req.payload.len()
                ),
            ));
        }
        let who = std::str::from_utf8(&req.payload)
            .map_err(|_| Refusal(Status::Invalid, "a holder's name is UTF-8".into()))?;
        if h.length == trireme_proto::RELEASE {
            self.holds.release(h.volume, h.offset, who);
            return Ok(Bytes::new());
        }
        // Asked of the snapshot's map (a list would count every snapshot's own bytes).
        r.snapshot_status(h.offset, 0, 4096)?;
        self.holds.hold(h.volume, h.offset, who);
        Ok(Bytes::new())
    }

    /// Who holds a snapshot now, one a line.
    pub(crate) fn on_snapshot_holders(&self, h: &Header) -> Result<Bytes, Refusal> {
        self.replica(h.volume)?;
        Ok(Bytes::from(
            self.holds.holders(h.volume, h.offset).join("\n"),
        ))
    }

    /// With sizes if the request's `length` asks ([`trireme_proto::LIST_SIZED`]), and the
    /// answer's says so.
    pub(crate) fn on_snapshot_list(&self, h: &Header, resp: &mut Header) -> Result<Bytes, Refusal> {
        let r = self.replica(h.volume)?;
        let list: Vec<trireme_proto::ListedSnapshot> = r
            .snapshots()?
            .into_iter()
            .map(|s| trireme_proto::ListedSnapshot {
                id: s.id,
                created: s.created,
                exclusive_bytes: s.exclusive_bytes,
                size: s.size,
            })
            .collect();
        let sized = h.length == trireme_proto::LIST_SIZED;
        if sized {
            resp.length = trireme_proto::LIST_SIZED;
        }
        Ok(Bytes::from(trireme_proto::encode_snapshot_list(
            &list, sized,
        )))
    }

    pub(crate) fn on_snapshot_status(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let r = self.replica(h.volume)?;
        let id = trireme_proto::read_snapshot_id(&req.payload).map_err(malformed)?;
        if h.length > crate::MAX_BLOCK_STATUS_RANGE {
            return Err(Refusal(
                Status::Invalid,
                format!("block status over {} bytes is too large", h.length),
            ));
        }
        Ok(Bytes::from(trireme_proto::encode_extents(
            &super::io::extents_answer(h, |o, l| r.snapshot_status(id, o, l))?,
        )))
    }

    pub(crate) fn on_snapshot_changed(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let r = self.replica(h.volume)?;
        let c = trireme_proto::ChangedRequest::read(&req.payload).map_err(malformed)?;
        if h.length > crate::MAX_BLOCK_STATUS_RANGE {
            return Err(Refusal(
                Status::Invalid,
                format!(
                    "a changed-blocks query over {} bytes is too large",
                    h.length
                ),
            ));
        }
        let ext = super::io::extents_answer(h, |o, l| {
            let changed = r.changed(c.from, c.to, o, l)?;
            Ok(trireme_proto::changed_extents(o, l, &changed))
        })?;
        Ok(Bytes::from(trireme_proto::encode_extents(&ext)))
    }

    pub(crate) fn on_snapshot_read(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let r = self.replica(h.volume)?;
        let id = trireme_proto::read_snapshot_id(&req.payload).map_err(malformed)?;
        // A snapshot has its own size, which the store checks the range against.
        trireme_store::check_range(h.offset, h.length, u64::MAX)?;
        if h.length > u64::from(MAX_PAYLOAD) {
            return Err(Refusal(
                Status::Invalid,
                format!("length {} over the frame limit", h.length),
            ));
        }
        let mut buf = BytesMut::zeroed(h.length as usize);
        r.read_snapshot(id, h.offset, &mut buf)?;
        Ok(buf.freeze())
    }
}
