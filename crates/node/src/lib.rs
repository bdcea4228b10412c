//! The storage daemon: one process per node, serving that node's replicas to volume clients.
//!
//! [`Node`] implements the transport [`Handler`]: it decodes nothing itself (the transport
//! hands it checked frames), applies the fencing rule from the replication core to every I/O
//! request, and runs store calls inline for in-memory stores or on the blocking pool for
//! device-backed ones, so the async threads never wait on a disk.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use bytes::{Bytes, BytesMut};
use trireme_proto::{
    decode_peer, encode_extents, DirtyPeer, Header, Op, Status, FLAG_FUA, FLAG_MAY_TRIM,
    MAX_PAYLOAD,
};
use trireme_replication::{fence, FenceDecision};
use trireme_store::{Replica, Store, StoreError};
use trireme_transport::{Frame, Handler, Peer};

mod activity;
pub mod books;
mod dirty;

pub use activity::{ActivityLogs, ActivityView};
pub use dirty::{DirtyTracker, DirtyView, DEFAULT_GRAIN as DEFAULT_DIRTY_GRAIN};

/// Most tracking regions one `DirtyQuery` may cover (its answer stays under 12 MiB).
pub const MAX_DIRTY_QUERY_REGIONS: u64 = 1 << 20;

/// Largest range one `Checksum` request may cover.
pub const MAX_CHECKSUM_RANGE: u64 = 1 << 30;

/// Largest range one `BlockStatus` request may cover: at most 65,536 extents of the stores'
/// 64 KiB grain (a 1 MiB answer). NBD's own requests are no larger.
pub const MAX_BLOCK_STATUS_RANGE: u64 = 1 << 32;

/// What a node answers a client's `UcxAddress` request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UcxOffer {
    /// Its UCX worker's address (the client connects an endpoint to it).
    Address(Vec<u8>),
    /// Why it offers none; the client reads the reason and stays on TCP.
    Unavailable(String),
}

/// A storage node serving the replicas of one store.
#[derive(Debug)]
pub struct Node {
    id: u32,
    store: Arc<dyn Store>,
    replicas: RwLock<HashMap<u64, Arc<dyn Replica>>>,
    /// Serialises epoch changes so two attaches cannot interleave their check and update.
    attach_lock: Mutex<()>,
    /// What peers of our replicas missed while they were out.
    dirty: DirtyTracker,
    /// Which extents may have writes in flight, per volume (see `activity.rs`).
    activity: ActivityLogs,
    /// Per volume: the client connection that attached it last. I/O from any other connection
    /// is refused, so late frames of an abandoned connection cannot land after a resync.
    owners: RwLock<HashMap<u64, u64>>,
    /// Held (shared) by every request being served; `close_all` takes it exclusively and sets
    /// it, so no request runs during or after the close (a write landing after the replicas
    /// recorded a clean shutdown would not match what they recorded).
    closed: RwLock<bool>,
    /// The UCX worker address this node offers clients, or why it offers none.
    ucx: RwLock<Result<Bytes, String>>,
    /// Which client identities may use each volume, by volume id (its access list; `*` is
    /// any client of the cluster). `None` until the node is told: clients get nothing then.
    access: RwLock<Option<HashMap<u64, Vec<String>>>>,
    /// Most bytes the replicas of this node may hold together (their sizes); CreateReplica
    /// past it is refused.
    capacity: std::sync::atomic::AtomicU64,
    /// The activity log and dirty records are kept on disk for replicas with a ledger
    /// ([`Node::keep_books`]).
    books: std::sync::atomic::AtomicBool,
}

/// What a node holds ([`Node::usage`]).
#[derive(Debug, Clone)]
pub struct NodeUsage {
    pub id: u32,
    pub store: &'static str,
    pub replicas: usize,
    /// The replicas' sizes, summed.
    pub provisioned: u64,
    /// Bytes in the replicas' allocated grains.
    pub allocated: u64,
    /// Most bytes the replicas may hold together (their sizes); 0: no limit set.
    pub capacity: u64,
    pub tiers: Option<trireme_store::StoreTiers>,
    /// Each tiered replica's extents and reads, by volume id.
    pub replica_tiers: Vec<(u64, trireme_store::ReplicaTiers)>,
}

/// Why serving a request failed: a status for the client and a message for the log.
struct Refusal(Status, String);

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        let s = match &e {
            StoreError::NoReplica { .. } => Status::NoReplica,
            StoreError::Exists { .. } => Status::Exists,
            StoreError::OutOfRange { .. } => Status::OutOfRange,
            StoreError::NoSpace { .. } => Status::NoSpace,
            StoreError::Invalid(_) => Status::Invalid,
            StoreError::BadBlock { .. } => Status::Corrupt,
            StoreError::Io { .. } | StoreError::Corrupt { .. } => Status::Io,
        };
        Refusal(s, e.to_string())
    }
}

impl Node {
    /// Opens every replica in `store`. Replicas that fail their checks are logged and not served.
    pub fn new(id: u32, store: Arc<dyn Store>) -> Node {
        Node::with_dirty_grain(id, store, dirty::DEFAULT_GRAIN)
    }

    /// Like [`Node::new`], tracking peers' dirty regions at `grain` bytes (a power of two,
    /// 4 KiB or more).
    pub fn with_dirty_grain(id: u32, store: Arc<dyn Store>, grain: u64) -> Node {
        let mut replicas = HashMap::new();
        for r in store.open_all() {
            match r {
                Ok(r) => {
                    replicas.insert(r.volume(), r);
                }
                Err(e) => tracing::error!(node = id, "not serving a replica: {e}"),
            }
        }
        Node {
            id,
            store,
            replicas: RwLock::new(replicas),
            attach_lock: Mutex::new(()),
            dirty: DirtyTracker::new(grain),
            activity: ActivityLogs::default(),
            owners: RwLock::default(),
            closed: RwLock::new(false),
            ucx: RwLock::new(Err("the node runs without UCX".into())),
            access: RwLock::new(None),
            capacity: std::sync::atomic::AtomicU64::new(u64::MAX),
            books: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Keeps the activity log and the peers' dirty records on disk from now on, for every
    /// replica whose store offers a ledger (`activity.rs`, `dirty.rs`), and loads what the last
    /// process left there. Called once, before serving.
    pub fn keep_books(&self) {
        self.books.store(true, std::sync::atomic::Ordering::Release);
        let reps = self.all_replicas();
        for r in reps {
            let Some(ledger) = r.ledger() else { continue };
            let volume = r.volume();
            let written = match self.activity.load(volume, r.size(), ledger.clone()) {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(node = self.id, volume, "activity log not used: {e}");
                    None
                }
            };
            if let Some(w) = &written {
                // Writes since the last clean state all lie in these extents: block seals
                // from before an unclean stop still hold everywhere else.
                r.recover_seals(w);
            }
            match self
                .dirty
                .load(volume, r.size(), &*ledger, written.as_deref())
            {
                Ok(n) => tracing::info!(
                    node = self.id,
                    volume,
                    records = n,
                    log_extents = written.as_ref().map(Vec::len),
                    "bookkeeping loaded"
                ),
                Err(e) => tracing::warn!(node = self.id, volume, "dirty records not used: {e}"),
            }
        }
    }

    /// Every replica this node serves, at this moment.
    fn all_replicas(&self) -> Vec<Arc<dyn Replica>> {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn ledger_of(&self, r: &dyn Replica) -> Option<Arc<dyn trireme_store::Ledger>> {
        self.books
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| r.ledger())
            .flatten()
    }

    /// Brings the bookkeeping on disk up to date (every second, from [`run`]): saves changed
    /// dirty records, and lets the activity log drop on disk the extents the writer cleared,
    /// after the replica's data and the records are durable. Errors are logged; the next round
    /// tries again.
    pub fn sync_books(&self) {
        let closed = self.closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return;
        }
        let reps = self.all_replicas();
        for r in reps {
            let Some(ledger) = self.ledger_of(&*r) else {
                continue;
            };
            let (volume, size) = (r.volume(), r.size());
            let changed = self.dirty.is_changed(volume);
            let done = self.activity.sync(volume, || {
                r.flush()?;
                self.dirty.save(volume, size, &*ledger)
            });
            let result = match done {
                Ok(false) if changed => self.dirty.save(volume, size, &*ledger),
                other => other.map(|_| ()),
            };
            if let Err(e) = result {
                tracing::warn!(node = self.id, volume, "saving bookkeeping: {e}");
            }
        }
    }

    /// Extents the activity log of `volume` shows on disk (tests and status).
    pub fn log_extents_on_disk(&self, volume: u64) -> Option<usize> {
        self.activity.marked_on_disk(volume)
    }

    /// Sets the most bytes this node's replicas may hold together (their sizes summed).
    pub fn set_capacity(&self, bytes: u64) {
        self.capacity
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets which client identities may use each volume (by id), replacing what was known.
    pub fn set_access(&self, access: HashMap<u64, Vec<String>>) {
        *self.access.write().unwrap_or_else(|e| e.into_inner()) = Some(access);
    }

    /// Refuses a request its sender's identity may not make: clients only reach volumes whose
    /// access list names them (or `*`), and never create or delete replicas. Nodes, operators
    /// and trusted links may do everything.
    fn authorize(&self, req: &Frame) -> Result<(), Refusal> {
        let role = match &req.peer {
            Peer::Trusted => return Ok(()),
            Peer::Cert(r) if r.is_cluster() => return Ok(()),
            Peer::Cert(r) => r,
        };
        let h = &req.header;
        if matches!(h.op, Op::Ping | Op::UcxAddress) {
            return Ok(());
        }
        let allowed = match &**role {
            trireme_tls::Role::Client(name)
                if !matches!(h.op, Op::CreateReplica | Op::DeleteReplica | Op::TierSet) =>
            {
                let access = self.access.read().unwrap_or_else(|e| e.into_inner());
                access
                    .as_ref()
                    .and_then(|a| a.get(&h.volume))
                    .is_some_and(|l| l.iter().any(|c| c == "*" || c == name))
            }
            _ => false,
        };
        if allowed {
            return Ok(());
        }
        let msg = format!(
            "{role} may not {:?} volume {}: {}",
            h.op,
            h.volume,
            if matches!(h.op, Op::CreateReplica | Op::DeleteReplica | Op::TierSet) {
                "only nodes and operators create, delete or place replicas"
            } else {
                "not on the volume's access list"
            }
        );
        tracing::warn!(node = self.id, "refused: {msg}");
        Err(Refusal(Status::Denied, msg))
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    fn no_tiers(&self) -> Refusal {
        Refusal(
            Status::Unsupported,
            format!(
                "node {}'s store has no tiers (start it with --store tiered)",
                self.id
            ),
        )
    }

    /// What the node holds, for its metrics: read at a scrape, from the replicas' counters.
    pub fn usage(&self) -> NodeUsage {
        let replicas: Vec<Arc<dyn Replica>> = self
            .replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        NodeUsage {
            id: self.id,
            store: self.store.kind().as_str(),
            replicas: replicas.len(),
            provisioned: replicas.iter().map(|r| r.size()).sum(),
            allocated: replicas.iter().map(|r| r.allocated_bytes()).sum(),
            capacity: self.capacity.load(std::sync::atomic::Ordering::Relaxed),
            tiers: self.store.tiers(),
            replica_tiers: replicas
                .iter()
                .filter_map(|r| r.tiers().map(|t| (r.volume(), t)))
                .collect(),
        }
    }

    pub fn replica_count(&self) -> usize {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    fn replica(&self, volume: u64) -> Result<Arc<dyn Replica>, Refusal> {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
            .ok_or_else(|| Refusal(Status::NoReplica, format!("no replica of volume {volume}")))
    }

    /// Sets what the node answers `UcxAddress` with: its worker address, or why there is none.
    pub fn set_ucx(&self, offer: UcxOffer) {
        *self.ucx.write().unwrap_or_else(|e| e.into_inner()) = match offer {
            UcxOffer::Address(a) => Ok(Bytes::from(a)),
            UcxOffer::Unavailable(why) => Err(why),
        };
    }

    /// The dirty-region tracker (for tests and status).
    pub fn dirty(&self) -> &DirtyTracker {
        &self.dirty
    }

    /// Waits for the requests being served, refuses every later one, then flushes every
    /// replica and records a clean shutdown; used when the process exits.
    pub fn close_all(&self) {
        let mut closed = self.closed.write().unwrap_or_else(|e| e.into_inner());
        *closed = true;
        let reps = self.all_replicas();
        for r in reps {
            if let Some(ledger) = self.ledger_of(&*r) {
                if let Err(e) = self.dirty.save(r.volume(), r.size(), &*ledger) {
                    tracing::error!(node = self.id, "saving dirty records on shutdown: {e}");
                }
            }
            if let Err(e) = r.close() {
                tracing::error!(node = self.id, "close on shutdown: {e}");
            }
        }
    }

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
    fn io_replica(&self, req: &Frame) -> Result<Arc<dyn Replica>, Refusal> {
        let h = &req.header;
        let r = self.replica(h.volume)?;
        Self::check_epoch(&*r, h)?;
        let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
        match owners.get(&h.volume) {
            Some(&o) if o != req.origin => Err(Refusal(
                Status::Superseded,
                format!(
                    "connection {:#x} was superseded by {o:#x} for volume {}",
                    req.origin, h.volume
                ),
            )),
            _ => Ok(r),
        }
    }

    /// Serves one request synchronously (the caller picks the thread).
    fn serve(&self, req: &Frame) -> Result<(Header, Bytes), Refusal> {
        let closed = self.closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return Err(Refusal(Status::Io, "the node is shutting down".into()));
        }
        self.authorize(req)?;
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
                resp.length = self.capacity.load(std::sync::atomic::Ordering::Relaxed);
                Bytes::from(self.id.to_string())
            }
            Op::UcxAddress => match &*self.ucx.read().unwrap_or_else(|e| e.into_inner()) {
                Ok(a) => a.clone(),
                Err(why) => return Err(Refusal(Status::Unsupported, why.clone())),
            },
            Op::Attach => {
                let r = self.replica(h.volume)?;
                let _g = self.attach_lock.lock().unwrap_or_else(|e| e.into_inner());
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
                self.owners
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(h.volume, req.origin);
                resp.length = r.incarnation();
                Bytes::new()
            }
            Op::Hello => return Err(Refusal(Status::Invalid, "hello is not a request".into())),
            Op::Read => {
                let r = self.io_replica(req)?;
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
                let r = self.io_replica(req)?;
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
                let r = self.io_replica(req)?;
                r.flush()?;
                Bytes::new()
            }
            Op::WriteZeroes => {
                let r = self.io_replica(req)?;
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
                let r = self.io_replica(req)?;
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
                let cap = self.capacity.load(std::sync::atomic::Ordering::Relaxed);
                if used.checked_add(h.length).is_none_or(|t| t > cap) {
                    return Err(Refusal(
                        Status::NoSpace,
                        format!(
                            "a {}-byte replica does not fit: {used} of the node's {cap} bytes are taken",
                            h.length
                        ),
                    ));
                }
                let r = self.store.create(h.volume, h.length)?;
                reps.insert(h.volume, r);
                drop(reps);
                self.activity.forget(h.volume);
                tracing::info!(
                    node = self.id,
                    volume = h.volume,
                    size = h.length,
                    "created replica"
                );
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
                let r = self.io_replica(req)?;
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
                let r = self.io_replica(req)?;
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
                let r = self.io_replica(req)?;
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

/// The largest step an attach may move a replica's epoch forward (see `Op::Attach`).
const MAX_EPOCH_LEAP: u64 = 1 << 32;

impl Handler for Node {
    fn inline(&self, req: &Frame) -> bool {
        !self.store.blocking()
            || matches!(
                req.header.op,
                Op::Ping | Op::ReplicaInfo | Op::UcxAddress | Op::TierInfo | Op::TierHeat
            )
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

/// Binds the data-path listeners — TCP on `listen`, and a unix socket at `socket` for clients
/// on this host — reports the bound TCP address and whether the unix socket is up through
/// `on_bound`, and serves until a listener fails.
pub async fn run(
    node: Arc<Node>,
    listen: SocketAddr,
    socket: Option<&std::path::Path>,
    on_bound: impl FnOnce(SocketAddr, bool),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let unix = socket.and_then(|p| {
        trireme_tls::local::bind_private(p)
            .map_err(|e| tracing::warn!(path = %p.display(), "no same-host socket, TCP only: {e}"))
            .ok()
    });
    on_bound(listener.local_addr()?, unix.is_some());
    let books = tokio::spawn(keep_books(node.clone()));
    let _books = AbortOnDrop(books);
    let tcp = trireme_transport::tcp::serve(listener, node.clone());
    match unix {
        Some(u) => {
            tokio::select! {
                r = tcp => r,
                r = trireme_transport::tcp::serve_unix(u, node) => r,
            }
        }
        None => tcp.await,
    }
}

/// How often the bookkeeping on disk catches up ([`Node::sync_books`]).
pub const BOOKS_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

async fn keep_books(node: Arc<Node>) {
    loop {
        tokio::time::sleep(BOOKS_PERIOD).await;
        let n = node.clone();
        let _ = tokio::task::spawn_blocking(move || n.sync_books()).await;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
