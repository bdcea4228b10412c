//! Block I/O on an attached replica: read, write, write zeroes, flush, block status, and
//! checksums of ranges (what `volume verify` and reconciliation compare).

use bytes::{Bytes, BytesMut};
use trireme_proto::{
    encode_extents, Header, Status, FIRST_EXTENTS, FLAG_FIRST, FLAG_FUA, FLAG_MAY_TRIM, FLAG_ONE,
    FLAG_SPACE_RESERVE, MAX_PAYLOAD,
};
use trireme_store::{Replica, StoreError, GRAIN};
use trireme_transport::Frame;

use crate::{Node, Refusal, MAX_BLOCK_STATUS_RANGE, MAX_CHECKSUM_RANGE};

impl Node {
    pub(crate) fn on_read(&self, req: &Frame, resp: &mut Header) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        trireme_store::check_range(h.offset, h.length, r.size())?;
        if h.length > u64::from(MAX_PAYLOAD) {
            return Err(Refusal(
                Status::Invalid,
                format!("length {} over the frame limit", h.length),
            ));
        }
        let mut buf = BytesMut::zeroed(h.length as usize);
        // Asked before the read heats anything: where it is served from, and whether the
        // other copies should hear of it (the writer's read preference and heat sharing,
        // `client/src/tiers.rs`).
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
        Ok(buf.freeze())
    }

    pub(crate) fn on_write(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        let len = req.payload.len() as u64;
        // Checked before anything is marked: a bad range marks nothing, nor a write refused
        // for want of space (`room.rs`).
        trireme_store::check_range(h.offset, len, r.size())?;
        if len == 0 {
            // No bytes: the writer asking whether a write of `h.length` bytes would be taken
            // now (`client/src/space.rs`).
            drop(self.admit(h, h.length)?);
            return Ok(Bytes::new());
        }
        // A parity replica's write holds its grains until its bits are set, and may fill a
        // hole's grain whole (`HeldMaps::write_turn`) or reserve its grains
        // (`reserve_grains`): admitted at their size.
        let turn = self.held.write_turn(h.volume, &*r, h.offset, len);
        let room = match turn {
            Some(_) => grains_len(h.offset, len),
            None => len,
        };
        let _room = self.admit(h, room)?;
        // Marked before it is applied: in the dirty records, and in the activity log (on
        // disk first if its extent is not marked there: `activity.rs`).
        self.dirty.on_write(h.volume, h.offset, len);
        self.activity.on_write(h.volume, h.offset, len)?;
        let fua = h.has_flag(FLAG_FUA);
        match turn.as_ref().map(|t| t.filled()) {
            Some(Some(grain)) => fill_grain(&*r, grain, h.offset, &req.payload, fua)?,
            Some(None) => {
                reserve_grains(&*r, h.offset, len);
                r.write(h.offset, &req.payload, fua)?;
            }
            None => r.write(h.offset, &req.payload, fua)?,
        }
        self.held_after(h, &*r, len)?;
        Ok(Bytes::new())
    }

    /// A parity replica holds what the store just took; durably now for a FUA write.
    fn held_after(&self, h: &Header, r: &dyn Replica, len: u64) -> Result<(), Refusal> {
        self.held.wrote(h.volume, h.offset, len)?;
        if h.has_flag(FLAG_FUA) && self.held.keeps(h.volume) {
            self.held.flush(h.volume, r)?;
        }
        Ok(())
    }

    /// Admits a write of `len` bytes unless it would eat into the node's reserve (`room.rs`).
    fn admit(&self, h: &Header, len: u64) -> Result<crate::room::Admitted<'_>, Refusal> {
        self.room
            .admit(h.has_flag(FLAG_SPACE_RESERVE), len)
            .map_err(|why| Refusal(Status::NoSpace, why))
    }

    pub(crate) fn on_flush(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let (r, _turn) = self.io_replica(req)?;
        self.held.flush(req.header.volume, &*r)?;
        Ok(Bytes::new())
    }

    pub(crate) fn on_write_zeroes(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        trireme_store::check_range(h.offset, h.length, r.size())?;
        // A trim gives space back; zeroes written take it.
        let _room = if h.has_flag(FLAG_MAY_TRIM) {
            None
        } else {
            Some(self.admit(h, h.length)?)
        };
        self.dirty.on_write(h.volume, h.offset, h.length);
        self.activity.on_write(h.volume, h.offset, h.length)?;
        let fua = h.has_flag(FLAG_FUA);
        if !h.has_flag(FLAG_MAY_TRIM) {
            let _turn = self.held.writing(h.volume, h.offset, h.length);
            r.write_zeroes(h.offset, h.length, false, fua)?;
            self.held_after(h, &*r, h.length)?;
            return Ok(Bytes::new());
        }
        // Not held, on disk, before a byte goes: a crash between reads the stripe. The
        // range may widen over blocks not held (`HeldMaps::trimming`); marked as the rest.
        let t = self.held.trimming(h.volume, &*r, h.offset, h.length)?;
        if (t.offset, t.len) != (h.offset, h.length) {
            self.dirty.on_write(h.volume, t.offset, t.len);
            self.activity.on_write(h.volume, t.offset, t.len)?;
        }
        r.write_zeroes(t.offset, t.len, true, fua)?;
        Ok(Bytes::new())
    }

    /// `Held`: which blocks of the range a parity replica holds (`held.rs`).
    pub(crate) fn on_held(&self, h: &Header) -> Result<Bytes, Refusal> {
        let r = self.replica(h.volume)?;
        Self::check_epoch(&*r, h)?;
        trireme_store::check_range(h.offset, h.length, r.size())?;
        Ok(Bytes::from(encode_extents(
            &self.held.query(h.volume, h.offset, h.length)?,
        )))
    }

    pub(crate) fn on_block_status(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let (r, _turn) = self.io_replica(req)?;
        if h.length > MAX_BLOCK_STATUS_RANGE {
            return Err(Refusal(
                Status::Invalid,
                format!("block status over {} bytes is too large", h.length),
            ));
        }
        Ok(Bytes::from(encode_extents(&extents_answer(h, |o, l| {
            r.block_status(o, l)
        })?)))
    }

    pub(crate) fn on_checksum(&self, req: &Frame, resp: &mut Header) -> Result<Bytes, Refusal> {
        // A checksum of a short range reveals the bytes in it: the epoch fence holds here
        // too. Not tied to the attaching connection: `volume verify` asks from its own, at
        // the current epoch.
        let h = &req.header;
        let r = self.replica(h.volume)?;
        Self::check_epoch(&*r, h)?;
        if h.length > MAX_CHECKSUM_RANGE {
            return Err(Refusal(
                Status::Invalid,
                format!("checksum range {} too large", h.length),
            ));
        }
        let snapshot = if req.payload.is_empty() {
            None
        } else {
            Some(
                trireme_proto::read_snapshot_id(&req.payload)
                    .map_err(|e| Refusal(Status::Invalid, e.to_string()))?,
            )
        };
        let crc = checksum(&*r, snapshot, h.offset, h.length)?;
        trireme_proto::ChecksumAnswer { crc }.put(resp);
        Ok(Bytes::new())
    }
}

/// The first window an extent query flagged `FLAG_FIRST` or `FLAG_ONE` asks of the store.
const FIRST_WINDOW: u64 = 1 << 20;
/// The largest window: each one asked is twice the one before, up to this.
const LAST_WINDOW: u64 = 1 << 30;

/// The extents of the request's range from `f` (which answers exactly the range it is given):
/// all of them, or for a query flagged `FLAG_FIRST` (`FLAG_ONE`) the first
/// [`FIRST_EXTENTS`] (one) covering a prefix of the range. Those are asked in windows from
/// 1 MiB, each twice the last, until one more extent has begun (so the last kept is whole) or
/// the range ends: the time grows with what is answered, not with the range (issue 63: one
/// `REQ_ONE` request over 1 GiB of 74,467 extents took 6.4 ms, and `qemu-img map` minutes).
pub(crate) fn extents_answer(
    h: &trireme_proto::Header,
    f: impl Fn(u64, u64) -> Result<Vec<trireme_proto::Extent>, StoreError>,
) -> Result<Vec<trireme_proto::Extent>, StoreError> {
    let max = if h.has_flag(FLAG_ONE) {
        1
    } else if h.has_flag(FLAG_FIRST) {
        FIRST_EXTENTS
    } else {
        return f(h.offset, h.length);
    };
    let end = h.offset.saturating_add(h.length);
    let mut out: Vec<trireme_proto::Extent> = Vec::new();
    let (mut pos, mut window) = (h.offset, FIRST_WINDOW);
    while pos < end && out.len() <= max {
        let n = window.min(end - pos);
        for e in f(pos, n)? {
            match out.last_mut() {
                Some(last) if last.flags == e.flags => last.length += e.length,
                _ => out.push(e),
            }
        }
        pos += n;
        window = (window * 2).min(LAST_WINDOW);
    }
    out.truncate(max);
    Ok(out)
}

/// crc32c of `[offset, offset+len)` of the replica, or of its snapshot `snapshot`, read in
/// 1 MiB pieces.
fn checksum(
    r: &dyn Replica,
    snapshot: Option<u64>,
    offset: u64,
    len: u64,
) -> Result<u32, StoreError> {
    // A snapshot has its own size, which the store checks each read against.
    let size = match snapshot {
        None => r.size(),
        Some(_) => u64::MAX,
    };
    trireme_store::check_range(offset, len, size)?;
    let mut buf = vec![0u8; (1 << 20).min(len as usize)];
    let mut crc = 0u32;
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(buf.len() as u64) as usize;
        match snapshot {
            Some(id) => r.read_snapshot(id, pos, &mut buf[..n])?,
            None => r.read(pos, &mut buf[..n])?,
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        pos += n as u64;
    }
    Ok(crc)
}

/// Reserves the store grains a parity replica's write touches in part, before it lands
/// ([`Replica::reserve`]; a grain it covers whole it allocates whole itself). An overlay
/// write goes where an encode or a fold-back punched whole grains; into such a hole each
/// 4 KiB `O_DIRECT` write allocated under the data file's exclusive lock (fio on this host,
/// 10 x QD4: 26k random writes a second into a sparse file, 90k into a written one, 93k into
/// one reserved with `fallocate`). Reserved, the grain's other blocks allocate nothing at
/// their first writes, but each is converted from an unwritten extent then; a write that may
/// fill its grain whole does that instead (`HeldMaps::write_turn`). A grain whose blocks are all
/// trimmed again is punched whole (`HeldMaps::trimming`), so what this reserves comes back
/// with the overlay.
fn reserve_grains(r: &dyn Replica, offset: u64, len: u64) {
    for g in crate::held::part_grains(offset, offset + len) {
        if (g + 1) * GRAIN <= r.size() {
            r.reserve(g * GRAIN, GRAIN);
        }
    }
}

/// Writes `data` at `offset` as the whole of store grain `grain`, a hole (every other byte
/// reads zeros either way), so that the grain's later writes are overwrites
/// (`HeldMaps::write_turn`). Only `data`'s blocks become held: the zeros around it are not.
fn fill_grain(
    r: &dyn Replica,
    grain: u64,
    offset: u64,
    data: &[u8],
    fua: bool,
) -> Result<(), StoreError> {
    let mut whole = vec![0u8; GRAIN as usize];
    let at = (offset - grain * GRAIN) as usize;
    whole[at..at + data.len()].copy_from_slice(data);
    r.write(grain * GRAIN, &whole, fua)
}

/// The bytes of the grains a write of `[offset, offset+len)` touches.
fn grains_len(offset: u64, len: u64) -> u64 {
    (offset + len).div_ceil(GRAIN) * GRAIN - offset / GRAIN * GRAIN
}
