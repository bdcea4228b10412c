//! Tiers: the heat another copy saw, a replica's pin, and the node's and a replica's tier
//! report.

use bytes::Bytes;
use trireme_proto::{Header, Status};
use trireme_transport::Frame;

use crate::{Node, Refusal};

impl Node {
    pub(crate) fn on_tier_heat(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let r = self.replica(req.header.volume)?;
        let entries = trireme_proto::decode_heat(&req.payload)
            .map_err(|e| Refusal(Status::Invalid, e.to_string()))?;
        for (offset, count) in entries {
            r.add_heat(offset, count);
        }
        Ok(Bytes::new())
    }

    pub(crate) fn on_tier_set(&self, h: &Header) -> Result<Bytes, Refusal> {
        let pin = u8::try_from(h.offset)
            .ok()
            .and_then(trireme_store::Pin::from_code)
            .ok_or_else(|| Refusal(Status::Invalid, format!("unknown tier pin {}", h.offset)))?;
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
        Ok(Bytes::new())
    }

    pub(crate) fn on_tier_info(&self, h: &Header) -> Result<Bytes, Refusal> {
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
        Ok(Bytes::from(report.encode()))
    }
}
