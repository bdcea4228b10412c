//! The node's bookkeeping for a replica's writer: its activity log (what a crash may have
//! left half written) and the dirty records of what other copies missed.

use bytes::Bytes;
use trireme_proto::{decode_peer, DirtyPeer, Header, Op, Status};
use trireme_transport::Frame;

use crate::{activity, Node, Refusal, MAX_DIRTY_QUERY_REGIONS};

impl Node {
    pub(crate) fn on_activity_start(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        let ledger = self.ledger_of(&*r);
        if let Some(l) = &ledger {
            // The new log starts empty on disk: what the old one covered must be durable
            // first (data, and the dirty marks of writes it covered).
            r.flush()?;
            self.dirty.save(h.volume, r.size(), &**l)?;
        }
        self.activity
            .start(h.volume, h.epoch, h.length, r.size(), ledger)
            .map_err(|e| Refusal(Status::Invalid, e))?;
        Ok(Bytes::new())
    }

    pub(crate) fn on_activity_clear(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        trireme_store::check_range(h.offset, h.length, r.size())?;
        self.activity.clear(h.volume, h.offset, h.length);
        Ok(Bytes::new())
    }

    pub(crate) fn on_activity_query(
        &self,
        h: &Header,
        resp: &mut Header,
    ) -> Result<Bytes, Refusal> {
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
        let a = trireme_proto::ActivityAnswer {
            epoch: v.epoch,
            extent: v.extent,
            extents: v.extents,
        };
        Ok(Bytes::from(a.put(resp)))
    }

    /// `DirtyMark`, `DirtyTrack`, `DirtyClear` and `DirtyQuery`: on an attached replica, in
    /// its range.
    pub(crate) fn on_dirty(&self, req: &Frame, resp: &mut Header) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        trireme_store::check_range(h.offset, h.length, r.size())?;
        let bad = |e: trireme_proto::DecodeError| Refusal(Status::Invalid, e.to_string());
        match h.op {
            Op::DirtyMark => {
                let p = DirtyPeer::decode(&req.payload).map_err(bad)?;
                self.dirty.mark(h.volume, h.epoch, &p, h.offset, h.length);
                Ok(Bytes::new())
            }
            Op::DirtyTrack => {
                let p = DirtyPeer::decode(&req.payload).map_err(bad)?;
                self.dirty.track(h.volume, h.epoch, &p);
                // A dropped record is saved at once: the peer is back in sync, and a crash
                // must not bring its old record back (a superset, so never wrong, but it
                // would make the next resync copy it all again).
                if p.mode == trireme_proto::DIRTY_DROP {
                    if let Some(l) = self.ledger_of(&*r) {
                        self.dirty.save(h.volume, r.size(), &*l)?;
                    }
                }
                Ok(Bytes::new())
            }
            Op::DirtyClear => {
                let peer = decode_peer(&req.payload).map_err(bad)?;
                self.dirty.clear(h.volume, peer, h.offset, h.length);
                Ok(Bytes::new())
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
                let a = trireme_proto::DirtyAnswer {
                    epoch: v.epoch,
                    incarnation: v.incarnation,
                    extents: v.extents,
                };
                Ok(Bytes::from(a.put(resp)))
            }
        }
    }
}
