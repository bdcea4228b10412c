//! Operation and status codes.

/// What a frame asks for. Unless stated, `volume` names the replica and `epoch` is the writer's
/// epoch, checked by the node (fencing, DESIGN.md guarantee 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Op {
    /// Liveness probe; no fields. Response payload: the node's id as ASCII.
    #[default]
    Ping = 1,
    /// Take ownership of a replica for `epoch`. Refused if the replica has seen a newer epoch.
    Attach = 2,
    /// Read `length` bytes at `offset`. Response payload: the data.
    Read = 3,
    /// Write the payload at `offset`. `FLAG_FUA`: durable before the response.
    Write = 4,
    /// Make every completed write durable.
    Flush = 5,
    /// Zero `length` bytes at `offset`; `FLAG_MAY_TRIM` lets the node deallocate them.
    WriteZeroes = 6,
    /// Allocation map of `[offset, offset+length)`. Response payload: an extent list.
    BlockStatus = 7,
    /// crc32c of `[offset, offset+length)` (zeros for holes) in the response's `length` field;
    /// of a snapshot's bytes if the payload names one
    /// ([`snapshot_id_payload`](crate::snapshot_id_payload)), else of the replica now.
    Checksum = 8,
    /// Create a replica of `length` bytes. No epoch check.
    CreateReplica = 9,
    /// Delete a replica. No epoch check.
    DeleteReplica = 10,
    /// Describe a replica: response `length` = size, `offset` = allocated bytes, `epoch` = epoch,
    /// payload = the replica's incarnation (u64 LE; it changes when the replica's history is lost),
    /// then what the node knows of its integrity ([`ReplicaIntegrity`](crate::ReplicaIntegrity);
    /// absent from a node from before it).
    ReplicaInfo = 11,
    /// Dirty-region tracking for a peer replica that is out of the in-sync set. Payload:
    /// [`DirtyPeer`](crate::DirtyPeer). Marks `[offset, offset+length)` dirty for the peer and,
    /// if the peer was not tracked, starts tracking it in auto mode (every later write is marked
    /// too). Epoch-checked like I/O.
    DirtyMark = 12,
    /// The peer's dirty regions inside `[offset, offset+length)`. Payload: the peer id (u32 LE).
    /// Response: `epoch` = the epoch tracking started in (0: not tracked), `length` = the peer
    /// incarnation it was started for, payload = extent list of the dirty ranges.
    DirtyQuery = 13,
    /// Clears the peer's dirty regions wholly inside `[offset, offset+length)` (they were copied).
    /// Payload: the peer id (u32 LE). Epoch-checked.
    DirtyClear = 14,
    /// Sets how the peer is tracked. Payload: [`DirtyPeer`](crate::DirtyPeer) whose `mode` is
    /// [`DIRTY_DROP`](crate::DIRTY_DROP), [`DIRTY_AUTO`](crate::DIRTY_AUTO) or
    /// [`DIRTY_MANUAL`](crate::DIRTY_MANUAL). Epoch-checked.
    DirtyTrack = 15,
    /// The first frame a client sends on each stream: `offset` names the client connection (all
    /// streams of one connection share it). No response. A replica attached through one
    /// connection refuses I/O arriving on another (`Status::Superseded`), so frames of an
    /// abandoned connection that arrive late can never land after a resync.
    Hello = 16,
    /// Starts the replica's activity log for the writer of `epoch`, empty, at `length` bytes per
    /// extent (a power of two, 64 KiB..1 GiB). From then on every write the node receives marks
    /// its extents before it is applied. Epoch-checked.
    ActivityStart = 17,
    /// Clears the activity-log extents wholly inside `[offset, offset+length)`: the writer has
    /// no write in flight there, so the replicas agree on it. Epoch-checked.
    ActivityClear = 18,
    /// The activity log's marked extents inside `[offset, offset+length)`. Response: `epoch` = the
    /// epoch the log was started in (0: no log, e.g. the node restarted since), `length` = the
    /// extent size, payload = extent list (marked extents as data, the rest as holes).
    ActivityQuery = 19,
    /// The node's UCX worker address (payload), for a client to move the connection's data path
    /// to UCX; `Unsupported` with the reason when the node does not offer UCX. No volume.
    UcxAddress = 20,
    /// Pins the replica's extents to a tier: `offset` 0 auto (by heat), 1 fast, 2 slow.
    /// `NoSpace` when the fast tier cannot hold a replica pinned there, `Unsupported` on a
    /// store without tiers. No epoch check (a control op, like `CreateReplica`).
    TierSet = 21,
    /// The node's tiers and, if it holds the replica `volume` names, the replica's: payload
    /// [`TierReport`](crate::TierReport). `Unsupported` on a store without tiers.
    TierInfo = 22,
    /// Heat the writer saw on other copies of the volume (reads they served): payload
    /// [`encode_heat`](crate::encode_heat) entries (byte offset u64, count u32), which the
    /// node adds to its extents' heat, so every copy keeps the same hot set. No epoch check
    /// (advisory); no response payload.
    TierHeat = 23,
    /// The node's room for replicas: response payload a [`NodeSpace`](crate::NodeSpace)
    /// (capacity, over-commit limit, what its replicas provision and hold, its file system).
    /// Any authenticated peer may ask.
    Space = 24,
    /// Resize the replica of `volume` to `length` bytes, under the replica's epoch as a write
    /// is (the writer sends it, with no request of its in flight): bytes past the old end read
    /// as zeros. `FLAG_PREALLOCATE` reserves a grown thick replica's new space. Refused with
    /// `NoSpace` when the larger size does not fit the node's room.
    ResizeReplica = 25,
    /// Take a snapshot of the replica ([`SnapshotRequest`](crate::SnapshotRequest): `offset` the
    /// id, `length` when): every write answered before it is in it, durably. Epoch-checked as
    /// a write is (the writer sends it with no write in flight). `Exists` for an id taken;
    /// `Invalid` on a store without versions.
    Snapshot = 26,
    /// Delete snapshot `offset` of the replica, freeing what only it held. No epoch check (a
    /// control op: nodes and operators only). `NoSnapshot` if the copy has none of that id.
    SnapshotDelete = 27,
    /// The replica's snapshots: payload [`encode_snapshot_list`](crate::encode_snapshot_list).
    /// No epoch check; a client on the volume's access list may ask.
    SnapshotList = 28,
    /// Read `[offset, offset+length)` of the snapshot named in the payload
    /// ([`snapshot_id_payload`](crate::snapshot_id_payload)). No epoch check, so reading a
    /// snapshot never fences the writer; a client on the volume's access list may ask.
    /// `NoSnapshot` if this copy lacks it.
    SnapshotRead = 29,
    /// Make the replica hold what snapshot `offset` holds ([`SnapshotRequest`](crate::SnapshotRequest));
    /// the snapshot stays. Epoch-checked as a write is (the writer sends it with no request in
    /// flight). `NoSnapshot` if the copy lacks it.
    Rollback = 30,
    /// Allocation of `[offset, offset+length)` in the snapshot named in the payload (as
    /// `SnapshotRead`): response payload an extent list. No epoch check.
    SnapshotStatus = 31,
    /// Which blocks of `[offset, offset+length)` differ between two versions
    /// ([`ChangedRequest`](crate::ChangedRequest) in the payload): response payload an extent
    /// list covering the range, flag [`EXTENT_CHANGED`](crate::EXTENT_CHANGED) where they
    /// do. No epoch check; a client on the volume's access list may ask.
    SnapshotChanged = 32,
    /// Create the replica of `volume`, `length` bytes, as a clone of a snapshot of another
    /// replica on this node ([`CloneRequest`](crate::CloneRequest) in the payload): its blocks
    /// read the snapshot's until written. A control op (nodes and operators only).
    /// `NoReplica` if the parent is not here, `NoSnapshot` if it lacks the snapshot.
    CreateClone = 33,
    /// Copy every block the clone of `volume` still reads from its parent into it, then
    /// forget the parent; answered when done. No epoch check: I/O may go on meanwhile. A
    /// control op. Nothing to do for a replica that is no clone.
    Flatten = 34,
    /// A scrub compared every region of this copy and repaired what differed: what the node
    /// noted of its integrity up to the state `offset` names (the
    /// [`ReplicaIntegrity::token`](crate::ReplicaIntegrity) the scrub read at its end) is
    /// cleared. Epoch-checked as a checksum is.
    Verified = 35,
    /// A reader (a `VOLUME@SNAP` export) holds snapshot `offset` of `volume` for
    /// [`HOLD_SECS`](crate::HOLD_SECS) from now, and again each time it asks, or lets it go
    /// with `length` [`RELEASE`](crate::RELEASE); payload: who it is, UTF-8, at most
    /// [`MAX_HOLDER`](crate::MAX_HOLDER) bytes. A delete of a held snapshot is refused
    /// (`InUse`) unless forced. No epoch check; a client on the volume's access list may ask.
    SnapshotHold = 36,
    /// Who holds snapshot `offset` of `volume` now: answer payload the holders, one a line.
    /// A control op (nodes and operators).
    SnapshotHolders = 37,
    /// Which 4 KiB blocks of `[offset, offset+length)` (whole blocks) a parity volume's
    /// replica holds: written since they were last trimmed, with what the node answered
    /// before its last crash only if a flush followed. Response payload: an extent list
    /// covering the range, held blocks as data, the rest as holes. `Unsupported` for a replica
    /// created without [`FLAG_HELD`](crate::FLAG_HELD), `Io` if its map read back corrupt.
    /// Epoch-checked; the writer asks (it rebuilds a parity region's overlay from it).
    Held = 38,
    /// `volume`'s claim on this node's disk when requests wait for it: a reserve of `offset`
    /// 8 KiB units a second (0: none) and a weight of `length` (1 to 1000) against the other
    /// volumes. Kept in memory; the writer sends it after each attach and when it changes.
    /// Trusted links, operators and nodes only: a client does not set its own claim (on a
    /// cluster on etcd, nodes take it from the volume's record). No epoch check.
    Qos = 39,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Ping,
            2 => Op::Attach,
            3 => Op::Read,
            4 => Op::Write,
            5 => Op::Flush,
            6 => Op::WriteZeroes,
            7 => Op::BlockStatus,
            8 => Op::Checksum,
            9 => Op::CreateReplica,
            10 => Op::DeleteReplica,
            11 => Op::ReplicaInfo,
            12 => Op::DirtyMark,
            13 => Op::DirtyQuery,
            14 => Op::DirtyClear,
            15 => Op::DirtyTrack,
            16 => Op::Hello,
            17 => Op::ActivityStart,
            18 => Op::ActivityClear,
            19 => Op::ActivityQuery,
            20 => Op::UcxAddress,
            21 => Op::TierSet,
            22 => Op::TierInfo,
            23 => Op::TierHeat,
            24 => Op::Space,
            25 => Op::ResizeReplica,
            26 => Op::Snapshot,
            27 => Op::SnapshotDelete,
            28 => Op::SnapshotList,
            29 => Op::SnapshotRead,
            30 => Op::Rollback,
            31 => Op::SnapshotStatus,
            32 => Op::SnapshotChanged,
            33 => Op::CreateClone,
            34 => Op::Flatten,
            35 => Op::Verified,
            36 => Op::SnapshotHold,
            37 => Op::SnapshotHolders,
            38 => Op::Held,
            39 => Op::Qos,
            _ => return None,
        })
    }
}

/// Outcome carried in a response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum Status {
    #[default]
    Ok = 0,
    /// The store failed the operation (EIO).
    Io = 1,
    /// The request's epoch is older than the replica's: another writer has attached.
    Fenced = 2,
    /// No such replica on this node.
    NoReplica = 3,
    /// The range falls outside the replica.
    OutOfRange = 4,
    /// The request is malformed for its op.
    Invalid = 5,
    /// The replica already exists.
    Exists = 6,
    /// The node has no room.
    NoSpace = 7,
    /// The node does not support the op.
    Unsupported = 8,
    /// The replica was attached again through another connection of the same writer; this
    /// connection is abandoned and its requests are refused.
    Superseded = 9,
    /// The replica's copy of the range is bad (a block failed its checksum); read another.
    Corrupt = 10,
    /// The peer's identity may not do this (a client not on the volume's access list, or a
    /// client asking to create or delete a replica).
    Denied = 11,
    /// The copy has no snapshot of that id.
    NoSnapshot = 12,
    /// Something on the node depends on what the request would remove (a clone reads the
    /// snapshot, or the replica, a delete names).
    InUse = 13,
    /// A status code this build does not know (sent by a newer peer).
    Unknown = 255,
}

impl Status {
    pub fn from_u32(v: u32) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::Io,
            2 => Status::Fenced,
            3 => Status::NoReplica,
            4 => Status::OutOfRange,
            5 => Status::Invalid,
            6 => Status::Exists,
            7 => Status::NoSpace,
            8 => Status::Unsupported,
            9 => Status::Superseded,
            10 => Status::Corrupt,
            11 => Status::Denied,
            12 => Status::NoSnapshot,
            13 => Status::InUse,
            _ => Status::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Io => "I/O error",
            Status::Fenced => "fenced by a newer epoch",
            Status::NoReplica => "no such replica",
            Status::OutOfRange => "range out of bounds",
            Status::Invalid => "invalid request",
            Status::Exists => "replica exists",
            Status::NoSpace => "no space",
            Status::Unsupported => "unsupported",
            Status::Superseded => "superseded by a newer connection of the writer",
            Status::Corrupt => "bad copy: a block failed its checksum",
            Status::Denied => "not allowed for this identity",
            Status::NoSnapshot => "no such snapshot on this copy",
            Status::InUse => "in use on this node (a clone reads it, or an export holds it)",
            Status::Unknown => "unknown status",
        }
    }
}
