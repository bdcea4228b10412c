//! Wire frames spoken between volume clients and storage nodes.
//!
//! A frame is a fixed 64-byte header followed by `payload_len` payload bytes. The header carries
//! its own crc32c (over its first 60 bytes) and the payload's crc32c, so a torn or corrupted frame
//! is caught before anything acts on it. The decoder is a pure function of the bytes it is given:
//! it never allocates from a length field before that length has been checked against
//! [`MAX_PAYLOAD`], and it never panics on hostile input (see the property tests and `fuzz/`).
//!
//! Every request carries a `request_id`; the response echoes it, so one connection carries many
//! requests at once and responses may arrive in any order.
//!
//! Layout (all integers little-endian):
//!
//! | offset | size | field         |
//! |-------:|-----:|---------------|
//! | 0      | 4    | magic `TRIR`  |
//! | 4      | 1    | version       |
//! | 5      | 1    | op            |
//! | 6      | 2    | flags         |
//! | 8      | 8    | request_id    |
//! | 16     | 8    | volume        |
//! | 24     | 8    | epoch         |
//! | 32     | 8    | offset        |
//! | 40     | 8    | length        |
//! | 48     | 4    | status        |
//! | 52     | 4    | payload_len   |
//! | 56     | 4    | payload_crc   |
//! | 60     | 4    | header_crc    |

mod answers;
mod dirty;
mod extent;
mod op;
mod snapshots;
mod space;
mod tier;

pub use answers::{
    ActivityAnswer, AttachAnswer, ChecksumAnswer, DirtyAnswer, PingAnswer, ReplicaInfoAnswer,
    ReplicaIntegrity,
};
pub use dirty::{
    decode_peer, encode_peer, DirtyPeer, DIRTY_AUTO, DIRTY_DROP, DIRTY_MANUAL, DIRTY_PEER_LEN,
    DIRTY_START,
};
pub use extent::{
    data_ranges, decode_extents, decode_extents_within, encode_extents, Extent, EXTENT_LEN,
};
pub use op::{Op, Status};
pub use snapshots::{
    changed_extents, decode_snapshot_list, encode_snapshot_list, read_snapshot_id,
    snapshot_id_payload, ChangedRequest, CloneRequest, ListedSnapshot, SnapshotRequest,
    EXTENT_CHANGED, LIST_SIZED,
};
pub use space::{NodeSpace, NODE_SPACE_LEN};

/// Formats bytes with a binary unit, e.g. "1.0 GiB" (bytes below 1 KiB as such).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
pub use tier::{
    decode_heat, encode_heat, NodeTiers, ReplicaTierInfo, TierReport, HEAT_ENTRY_LEN,
    MAX_HEAT_ENTRIES,
};

/// `TRIR` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"TRIR");
/// Protocol version this build speaks. A peer with another version is refused at decode time.
pub const VERSION: u8 = 1;
/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 64;
/// Largest payload accepted on the wire (32 MiB of data plus room for nothing else).
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;

/// Header flag: this frame is a response to the request with the same `request_id`.
pub const FLAG_RESPONSE: u16 = 1 << 0;
/// The most bytes per second a node gives a deleted snapshot's freed space back to its file
/// system at: a `SnapshotDelete` may take the volume's size over this to answer.
pub const GIVE_BACK_RATE: u64 = 512 << 20;
/// Header flag on writes: the data must be durable before the response (NBD FUA).
pub const FLAG_FUA: u16 = 1 << 1;
/// Header flag on write-zeroes: the range may be deallocated rather than written.
pub const FLAG_MAY_TRIM: u16 = 1 << 2;
/// Response flag on reads from a tiered node: the replica has a fast and a slow tier.
pub const FLAG_TIERED: u16 = 1 << 3;
/// Response flag on reads with `FLAG_TIERED`: the slow tier served (part of) the read.
pub const FLAG_SLOW: u16 = 1 << 4;
/// Response flag on reads with `FLAG_TIERED`: the read heated its extents (it was small and
/// not part of a scan), so the other copies should hear of it (`Op::TierHeat`).
pub const FLAG_HEATED: u16 = 1 << 5;
/// Request flag on reads: the writer saw this read continue a stream (a scan); a tiered node
/// does not count it as heat.
pub const FLAG_STREAM: u16 = 1 << 6;
/// Request flag on `CreateReplica`: reserve the replica's whole space on the node's device now
/// (a thick volume); without it the replica takes space as it is written.
pub const FLAG_PREALLOCATE: u16 = 1 << 7;
/// Request flag on writes: the node may use the space it keeps in reserve. The writer sets it
/// when it sends a write again to copies that refused it for want of space while another copy
/// took it, so that the copies stay identical (see `node/src/room.rs`).
pub const FLAG_SPACE_RESERVE: u16 = 1 << 8;
/// Request flag on `Snapshot`: the snapshot need only be durable from the copy's next flush,
/// which the writer sends as soon as it lets writes go on again (the copy then does not flush
/// and sync while every write waits).
pub const FLAG_UNSYNCED: u16 = 1 << 9;
/// Request flag on extent queries (`BlockStatus`, `SnapshotStatus`, `SnapshotChanged`): answer
/// with the first extents only, at most [`FIRST_EXTENTS`], covering a prefix of the range (the
/// whole of it if it has no more), in time that grows with what is answered, not with the
/// range. A node from before answers the whole range.
pub const FLAG_FIRST: u16 = 1 << 10;
/// Request flag on extent queries: as [`FLAG_FIRST`], one extent at most (NBD's `REQ_ONE`).
pub const FLAG_ONE: u16 = 1 << 11;
/// Request flag on `SnapshotDelete`: delete it though a reader holds it (`SnapshotHold`).
pub const FLAG_FORCE: u16 = 1 << 12;
/// Request flag on `CreateReplica`: the replica is a parity volume's; the node keeps which of
/// its 4 KiB blocks are held ([`Op::Held`]), durably at each flush.
pub const FLAG_HELD: u16 = 1 << 13;
/// Request flag on reads and writes: the request copies or checks data for recovery (a
/// resync, a repair, a scrub, a drain), not for a client. A node serves such requests within
/// its recovery share while clients' requests wait too.
pub const FLAG_RECOVERY: u16 = 1 << 14;
/// The longest range one `Held` query may cover: 256 Ki blocks, an answer of at most 128 Ki
/// extents.
pub const MAX_HELD_QUERY: u64 = 1 << 30;
/// A reader's hold on a snapshot lasts this long unless asked again.
pub const HOLD_SECS: u64 = 15;
/// `SnapshotHold`'s `length` that lets the hold go (the export stops).
pub const RELEASE: u64 = 1;
/// The most bytes a holder's name takes.
pub const MAX_HOLDER: usize = 256;
/// The most extents an answer to a query flagged [`FLAG_FIRST`] carries.
pub const FIRST_EXTENTS: usize = 1024;
const KNOWN_FLAGS: u16 = FLAG_RESPONSE
    | FLAG_FUA
    | FLAG_MAY_TRIM
    | FLAG_TIERED
    | FLAG_SLOW
    | FLAG_HEATED
    | FLAG_STREAM
    | FLAG_PREALLOCATE
    | FLAG_SPACE_RESERVE
    | FLAG_UNSYNCED
    | FLAG_FIRST
    | FLAG_RECOVERY
    | FLAG_ONE
    | FLAG_FORCE
    | FLAG_HELD;

/// Why a frame was refused. Every variant means "drop the connection": after a bad header the
/// byte stream can no longer be trusted to be in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer is shorter than a frame header.
    #[error("short header: {got} of {HEADER_LEN} bytes")]
    ShortHeader { got: usize },
    /// The first four bytes are not `TRIR`.
    #[error("bad magic {found:#010x}")]
    BadMagic { found: u32 },
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {found} (this build speaks {VERSION})")]
    BadVersion { found: u8 },
    /// The header checksum does not match its contents.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// The op code is not one this version knows.
    #[error("unknown op {found}")]
    UnknownOp { found: u8 },
    /// Flags outside the known set.
    #[error("unknown flags {found:#06x}")]
    UnknownFlags { found: u16 },
    /// The payload length exceeds [`MAX_PAYLOAD`].
    #[error("payload of {len} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    PayloadTooLarge { len: u32 },
    /// The payload checksum does not match the payload.
    #[error("payload checksum mismatch")]
    PayloadChecksum,
    /// A payload's structure is wrong for its op (e.g. an extent list of odd length).
    #[error("malformed payload: {what}")]
    MalformedPayload { what: &'static str },
}

/// A decoded frame header. Field meanings per op are documented on [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub op: Op,
    pub flags: u16,
    pub request_id: u64,
    pub volume: u64,
    pub epoch: u64,
    pub offset: u64,
    pub length: u64,
    pub status: Status,
    pub payload_len: u32,
    pub payload_crc: u32,
}

impl Header {
    /// A request header for `op` with every other field zero.
    pub fn request(op: Op, request_id: u64) -> Self {
        Header {
            op,
            request_id,
            ..Header::default()
        }
    }

    /// The response header for this request: same op, id, volume and epoch.
    pub fn response(&self, status: Status) -> Self {
        Header {
            op: self.op,
            flags: FLAG_RESPONSE,
            request_id: self.request_id,
            volume: self.volume,
            epoch: self.epoch,
            offset: self.offset,
            length: 0,
            status,
            payload_len: 0,
            payload_crc: 0,
        }
    }

    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    pub fn has_flag(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Encodes this header for `payload`, filling in `payload_len`, `payload_crc` and the header
    /// checksum. Panics only on a caller bug: a payload over [`MAX_PAYLOAD`].
    pub fn encode(&self, payload: &[u8]) -> [u8; HEADER_LEN] {
        assert!(
            payload.len() <= MAX_PAYLOAD as usize,
            "payload of {} bytes exceeds MAX_PAYLOAD",
            payload.len()
        );
        let mut h = *self;
        h.payload_len = payload.len() as u32;
        h.payload_crc = crc32c::crc32c(payload);
        let out = h.encode_raw();
        // Paired check (STYLE habit 1): what we send must decode to what we meant.
        debug_assert_eq!(decode_header(&out), Ok(h));
        out
    }

    /// Like [`Header::encode`] with the payload's crc32c already computed (`crc`, from
    /// [`payload_crc`]): a write
    /// mirrored to several replicas computes it once, not once per link.
    pub fn encode_with_crc(&self, payload_len: usize, crc: u32) -> [u8; HEADER_LEN] {
        assert!(
            payload_len <= MAX_PAYLOAD as usize,
            "payload of {payload_len} bytes exceeds MAX_PAYLOAD"
        );
        let mut h = *self;
        h.payload_len = payload_len as u32;
        h.payload_crc = crc;
        h.encode_raw()
    }

    /// Like [`Header::encode`] for a link that authenticates every byte itself (a TLS record's
    /// AES-GCM tag covers the payload from the sender's buffer to the receiver's): the payload
    /// checksum is left 0 and not computed, as Ceph's msgr2 secure mode leaves out its CRCs.
    /// The header keeps its own checksum.
    pub fn encode_unchecked_payload(&self, payload_len: usize) -> [u8; HEADER_LEN] {
        assert!(
            payload_len <= MAX_PAYLOAD as usize,
            "payload of {payload_len} bytes exceeds MAX_PAYLOAD"
        );
        let mut h = *self;
        h.payload_len = payload_len as u32;
        h.payload_crc = 0;
        h.encode_raw()
    }

    fn encode_raw(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.volume.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.length.to_le_bytes());
        b[48..52].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[52..56].copy_from_slice(&self.payload_len.to_le_bytes());
        b[56..60].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The checksum a frame header carries for `payload`.
pub fn payload_crc(payload: &[u8]) -> u32 {
    crc32c::crc32c(payload)
}

/// Decodes and checks a frame header. On success the caller may allocate `payload_len` bytes:
/// that length has been checked against [`MAX_PAYLOAD`].
pub fn decode_header(b: &[u8]) -> Result<Header, DecodeError> {
    if b.len() < HEADER_LEN {
        return Err(DecodeError::ShortHeader { got: b.len() });
    }
    let magic = u32_at(b, 0);
    if magic != MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    if b[4] != VERSION {
        return Err(DecodeError::BadVersion { found: b[4] });
    }
    if crc32c::crc32c(&b[0..60]) != u32_at(b, 60) {
        return Err(DecodeError::HeaderChecksum);
    }
    let op = Op::from_u8(b[5]).ok_or(DecodeError::UnknownOp { found: b[5] })?;
    let flags = u16::from_le_bytes([b[6], b[7]]);
    if flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::UnknownFlags { found: flags });
    }
    let payload_len = u32_at(b, 52);
    if payload_len > MAX_PAYLOAD {
        return Err(DecodeError::PayloadTooLarge { len: payload_len });
    }
    Ok(Header {
        op,
        flags,
        request_id: u64_at(b, 8),
        volume: u64_at(b, 16),
        epoch: u64_at(b, 24),
        offset: u64_at(b, 32),
        length: u64_at(b, 40),
        // Unknown status codes from a newer peer decode as a generic error, not a failure.
        status: Status::from_u32(u32_at(b, 48)),
        payload_len,
        payload_crc: u32_at(b, 56),
    })
}

/// Checks a received payload against its header (length and checksum).
pub fn check_payload(h: &Header, payload: &[u8]) -> Result<(), DecodeError> {
    check_payload_len(h, payload)?;
    if crc32c::crc32c(payload) != h.payload_crc {
        return Err(DecodeError::PayloadChecksum);
    }
    Ok(())
}

/// Checks a received payload's length against its header only: for links that authenticate
/// the bytes themselves (see [`Header::encode_unchecked_payload`]).
pub fn check_payload_len(h: &Header, payload: &[u8]) -> Result<(), DecodeError> {
    if payload.len() != h.payload_len as usize {
        return Err(DecodeError::MalformedPayload {
            what: "payload length differs from header",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
