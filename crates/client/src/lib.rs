//! The volume client: what every frontend (NBD today) and the benchmark use to do I/O on a
//! mirrored volume.
//!
//! [`Volume::attach`] takes the epoch the metadata store handed out, connects to every replica
//! and attaches them with it (a replica that has seen a newer epoch refuses: fencing). Then:
//!
//! * a write (or write-zeroes, or flush) goes to every in-sync replica in parallel and is
//!   acknowledged only when all hold it, as the replication core's `decide` says;
//! * a read goes to one in-sync replica, as the core's `ReadPlan` says, and falls over to the
//!   next one if that replica fails.
//!
//! With a [`Membership`] (the control plane), a replica that fails or stops answering within
//! [`VolumeOptions::replica_timeout`] is taken out instead of failing the write: it is recorded
//! as outdated in the metadata, the surviving replicas start tracking what it misses, and only
//! then is the write acknowledged (see `failover.rs`). A background task brings it back with an
//! incremental resync.
//!
//! The decisions live in `trireme-replication`: each volume keeps a `VolumeCore` (its replica
//! states and histories, write order, minimum of copies, resyncs) behind one lock (`core.rs`),
//! and this crate only moves frames, waits, and logs. The I/O path itself is in `io.rs`.

mod activity;
mod attach_checks;
mod catch_up;
mod copies;
mod core;
mod encode;
mod encoder;
mod error;
mod extent_cache;
mod failover;
mod fine_timer;
mod follow;
mod given;
mod io;
mod membership;
mod overlay;
mod parity;
mod parity_reconcile;
mod parity_resync;
mod parity_scrub;
mod qos;
mod reconcile;
mod relink;
mod repair;
mod resize;
mod resync;
mod scrub;
mod snapshot_reader;
mod snapshots;
mod space;
mod tiers;
mod verify;

pub use encode::EncodeError;
pub use encoder::{ENCODE_HEADROOM, ENCODE_RATE};
pub use error::{VolumeError, WaitReason};
pub use follow::Following;
pub use given::{AttachInfo, Connector, ReplicaTarget, VolumeOptions};
pub use membership::{BoxFut, DegradeRefusal, Membership, MembershipError, ReplicaView};
pub use reconcile::ReconcileReport;
pub use scrub::ScrubReport;
pub use snapshot_reader::SnapshotReader;
pub use trireme_replication::ResyncProgress;
pub use verify::{
    verify_replicas, verify_replicas_with, verify_snapshot, Mismatch, SnapshotVerify, VerifyReport,
};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use trireme_proto::{Header, Op, Status, MAX_PAYLOAD};
use trireme_replication::ReplicaState;
use trireme_transport::{Connection, ConnectionInfo, Frame, TransportKind};

/// Largest read or write the client sends in one frame.
pub const MAX_IO: u64 = MAX_PAYLOAD as u64;

/// How many replica timeouts a recovery request may take. Nodes serve recovery within their
/// recovery share: behind a busy node's clients, a copy waits its turn, and taken for a dead
/// node at one replica timeout, a resync beside a saturating client never finished (it failed
/// and started over every 30 s).
pub const RECOVERY_PATIENCE: u32 = 10;

/// One replica slot: its node and current connection. What the writer knows about the
/// replica's history and state is in the volume's core.
#[derive(Debug)]
struct Slot {
    /// Written once, before the slot is used (a slot is never reused): the core's node for
    /// this index, readable without its lock.
    node: AtomicU32,
    conn: RwLock<Option<Arc<dyn Connection>>>,
    /// One relink of this copy at a time (`relink.rs`): the requests waiting share it. It
    /// holds when the copy was last linked again.
    relink: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Slot {
    fn new(node: u32, conn: Option<Arc<dyn Connection>>) -> Slot {
        Slot {
            node: AtomicU32::new(node),
            conn: RwLock::new(conn),
            relink: tokio::sync::Mutex::new(None),
        }
    }
}

/// Replica slots per attached volume: the replicas at attach plus those added by moves (a slot
/// is never reused, so an index always names the same replica).
const MAX_SLOTS: usize = 32;

/// An attached (or merely connected) volume.
#[derive(Debug)]
pub struct Volume {
    info: AttachInfo,
    /// The size I/O is checked against: `info.size` until a resize.
    size: std::sync::atomic::AtomicU64,
    /// `MAX_SLOTS` slots; the first `replica_count()` are in use.
    slots: Vec<Slot>,
    /// The replication state: replica states and histories, the write order, the minimum of
    /// copies, resyncs (see `trireme_replication::VolumeCore`).
    core: core::Core,
    /// When the volume was opened: the core's clock reads time since then.
    opened: tokio::time::Instant,
    opts: VolumeOptions,
    /// Where requests are counted, if `opts.metrics`.
    metrics: Option<Arc<trireme_metrics::VolumeMetrics>>,
    /// Foreground reads in flight: whether the next one overlaps another (`read_one`).
    reads: AtomicUsize,
    /// Foreground reads and writes, begun and in flight: the encoder waits for a pause
    /// (`encoder.rs`).
    foreground: io::Foreground,
    /// Resyncs begun (past the attach of the replica), for the resync task's backoff.
    resyncs_begun: AtomicUsize,
    /// A copy refused a write for want of space, and no probe since found room on every copy:
    /// writes fail at once (`space.rs`).
    full: std::sync::atomic::AtomicBool,
    /// The largest write refused since the volume became full: the size the probe asks for.
    full_len: std::sync::atomic::AtomicU64,
    /// The progress of the scrub running now, if one is (`scrub.rs`).
    scrubbing: Mutex<Option<trireme_replication::ResyncProgress>>,
    /// The last first-extents answer, for the block-status queries that follow it
    /// (`extent_cache.rs`).
    extents: extent_cache::ExtentCache,
    membership: Option<Arc<dyn Membership>>,
    /// Serialises taking replicas out and bringing them back.
    membership_lock: tokio::sync::Mutex<()>,
    /// Taken shared by a snapshot's barrier; held exclusive through a copy's resync when its
    /// last two ended lacking a snapshot taken meanwhile (`resync.rs`), so that snapshots
    /// taken more often than a resync lasts cannot keep a copy out for ever.
    snapshot_hold: tokio::sync::RwLock<()>,
    /// Per slot: how many resyncs in a row ended lacking a snapshot taken while they ran.
    lacked_snapshot: Mutex<[u8; MAX_SLOTS]>,
    /// The volume's I/O limits and the requests they held back (`qos.rs`).
    qos: qos::Qos,
    /// Which extents this writer may have writes in flight in (see `activity.rs`).
    activity: activity::Activity,
    /// What the reconciliation at attach did, if there was one.
    reconciled: Mutex<Option<ReconcileReport>>,
    /// In-sync copies that came back at attach with another history than recorded and were
    /// kept in sync all the same (`check_incarnations`): never a reconcile's source while
    /// another copy of the region kept its history.
    kept_lost: Mutex<Vec<usize>>,
    /// Writes waiting for enough copies (`copies.rs`).
    copies: copies::Copies,
    /// Writes pass it one at a time, in arrival order, on their way into the write order.
    copies_gate: tokio::sync::Mutex<()>,
    /// Requests wait for an in-sync copy to answer again, and the log said so (`relink.rs`).
    waiting_said: std::sync::atomic::AtomicBool,
    /// Which copies hold which extents on their slow tier, and heat owed to each (`tiers.rs`).
    tiers: tiers::TierView,
    /// A parity volume's geometry and codec (`parity.rs`); None for a mirror.
    parity: Option<parity::ParityIo>,
    /// A parity volume's reads hold it shared from their plan to their answer; the encoder
    /// takes it alone, briefly, before it writes a place reads planned earlier may name
    /// (`encode.rs`).
    read_gate: tokio::sync::RwLock<()>,
    /// Held through a whole encode and through a scrub's look at one region: chunks change
    /// only by encodes, so what a scrub reads and repairs is the stripe reads are sent to
    /// (`parity_scrub.rs`).
    stripe_work: tokio::sync::Mutex<()>,
}

/// Joins futures without spawning them: the writer's fan-out stays on its own task.
pub async fn join_all<T>(mut futs: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future completed"))
        .collect()
}

/// Connects to a replica's node: through its same-host socket when that socket exists here,
/// else over the network address. With a `limit`, the connection itself (TCP and TLS) gets at
/// most that long; the UCX negotiation after it bounds itself and falls back to TCP (see
/// [`trireme_transport::connect_within`]).
async fn connect_replica(
    r: &ReplicaTarget,
    opts: &VolumeOptions,
    limit: Option<Duration>,
) -> Result<Arc<dyn Connection>, VolumeError> {
    if let Some(c) = &opts.connector {
        return match limit {
            Some(limit) => tokio::time::timeout(limit, c.connect(r))
                .await
                .map_err(|_| VolumeError::Timeout {
                    node: r.node,
                    timeout: limit,
                })?,
            None => c.connect(r).await,
        };
    }
    let (kind, streams) = (opts.kind, opts.streams);
    let mut socket_failed = None;
    if let Some(local) = r.local_addr.as_ref().filter(|_| opts.same_host_socket) {
        let path = local.strip_prefix("unix:").unwrap_or(local);
        if std::path::Path::new(path).exists() {
            match trireme_transport::connect_within(kind, local, streams, limit).await {
                Ok(c) => return Ok(c),
                Err(e) => socket_failed = Some(e),
            }
        }
    }
    let c = trireme_transport::connect_within(kind, &r.addr, streams, limit)
        .await
        .map_err(|source| VolumeError::Transport {
            node: r.node,
            source,
        })?;
    // Said only when the network address answers: a node that is down refuses both, and
    // its writer tries again every moment.
    if let Some(e) = socket_failed {
        tracing::warn!(
            node = r.node,
            "same-host socket failed, using {}: {e}",
            r.addr
        );
    }
    Ok(c)
}

impl Volume {
    /// Connects to every in-sync replica without attaching (for verification and status).
    pub async fn connect(
        info: AttachInfo,
        kind: TransportKind,
        streams: usize,
    ) -> Result<Volume, VolumeError> {
        let opts = VolumeOptions::over(kind, streams);
        Volume::open(info, opts, None, true).await
    }

    async fn open(
        info: AttachInfo,
        opts: VolumeOptions,
        membership: Option<Arc<dyn Membership>>,
        all_in_sync_needed: bool,
    ) -> Result<Volume, VolumeError> {
        let info = follow::resolve_followers(info);
        let n = info.replicas.len();
        if n > MAX_SLOTS {
            return Err(VolumeError::Protocol {
                node: 0,
                what: format!("{n} replicas, more than the {MAX_SLOTS} a volume may have"),
            });
        }
        // The core first: a layout it does not serve is refused before any replica is reached.
        let states: Vec<(u32, ReplicaState)> =
            info.replicas.iter().map(|r| (r.node, r.state)).collect();
        let (core, parity) = parity::core_of(&info, &states, membership.is_some(), MAX_SLOTS)?;
        let mut slots = Vec::with_capacity(MAX_SLOTS);
        for r in &info.replicas {
            let conn = if r.state == ReplicaState::InSync {
                match connect_replica(r, &opts, None).await {
                    Ok(c) => Some(c),
                    Err(e) if all_in_sync_needed => return Err(e),
                    Err(e) => {
                        // Its attach fails below and it is taken out before any write.
                        tracing::warn!(volume = %info.name, node = r.node, "replica unreachable at attach: {e}");
                        None
                    }
                }
            } else {
                None
            };
            slots.push(Slot::new(r.node, conn));
        }
        slots.resize_with(MAX_SLOTS, || Slot::new(0, None));
        // A parity volume's table is at its blocks' places on the nodes (`activity.rs`).
        let activity = match &parity {
            Some(p) => p.activity(info.size, opts.activity_extent),
            None => activity::Activity::new(info.size, opts.activity_extent, None),
        };
        let metrics = opts.metrics.then(|| trireme_metrics::volume(&info.name));
        let qos = qos::Qos::new(info.limits);
        Ok(Volume {
            activity,
            reconciled: Mutex::new(None),
            kept_lost: Mutex::new(Vec::new()),
            copies: copies::Copies::default(),
            copies_gate: tokio::sync::Mutex::new(()),
            waiting_said: std::sync::atomic::AtomicBool::new(false),
            tiers: tiers::TierView::default(),
            core: core::Core::new(core),
            parity,
            read_gate: tokio::sync::RwLock::new(()),
            stripe_work: tokio::sync::Mutex::new(()),
            opened: tokio::time::Instant::now(),
            size: std::sync::atomic::AtomicU64::new(info.size),
            info,
            slots,
            metrics,
            reads: AtomicUsize::new(0),
            foreground: io::Foreground::default(),
            resyncs_begun: AtomicUsize::new(0),
            full: std::sync::atomic::AtomicBool::new(false),
            full_len: std::sync::atomic::AtomicU64::new(0),
            scrubbing: Mutex::new(None),
            extents: Default::default(),
            opts,
            membership,
            membership_lock: tokio::sync::Mutex::new(()),
            snapshot_hold: tokio::sync::RwLock::new(()),
            lacked_snapshot: Mutex::new([0; MAX_SLOTS]),
            qos,
        })
    }

    /// Connects and attaches every in-sync replica with this writer's epoch. Any replica
    /// failure fails I/O (no control plane to record it as out).
    pub async fn attach(
        info: AttachInfo,
        kind: TransportKind,
        streams: usize,
    ) -> Result<Volume, VolumeError> {
        let opts = VolumeOptions::over(kind, streams);
        let v = Volume::open(info, opts, None, true).await?;
        v.attach_all().await?;
        v.restore_overlay().await?;
        let in_sync = v.in_sync();
        v.start_activity(&in_sync).await?;
        Ok(v)
    }

    /// Attaches with a control plane: replicas that fail are taken out (recorded through
    /// `membership`) and brought back by a background resync task, which runs until the
    /// returned volume is dropped by everyone else.
    pub async fn attach_managed(
        info: AttachInfo,
        opts: VolumeOptions,
        membership: Arc<dyn Membership>,
    ) -> Result<Arc<Volume>, VolumeError> {
        let v = Arc::new(Volume::open(info, opts, Some(membership), false).await?);
        v.attach_all().await?;
        failover::start(&v).await?;
        Ok(v)
    }

    pub fn info(&self) -> &AttachInfo {
        &self.info
    }
    /// The volume's size now (it grows online: `resize.rs`).
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    /// Each replica's node and current data-path link (none while it is out).
    pub fn connections(&self) -> Vec<(u32, Option<ConnectionInfo>)> {
        (0..self.replica_count())
            .map(|i| (self.node(i), self.conn(&self.slots[i]).map(|c| c.info())))
            .collect()
    }

    /// Stops the link to `node` using its negotiated fast path (UCX); see
    /// [`Connection::fall_back`]. For fault tests.
    pub fn drop_fast_path(&self, node: u32, why: &str) -> bool {
        let set_len = self.replica_count();
        (0..set_len)
            .filter(|&i| self.node(i) == node)
            .filter_map(|i| self.conn(&self.slots[i]))
            .any(|c| c.fall_back(why))
    }

    fn conn(&self, s: &Slot) -> Option<Arc<dyn Connection>> {
        s.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_conn(&self, i: usize, c: Option<Arc<dyn Connection>>) {
        *self.slots[i]
            .conn
            .write()
            .unwrap_or_else(|e| e.into_inner()) = c;
    }

    /// The core, locked: within one statement, never across an `.await`, and never while
    /// another call here takes it again (the lock is not re-entrant).
    fn core(&self) -> core::Locked<'_> {
        self.core.lock()
    }

    fn in_sync(&self) -> Vec<usize> {
        self.core().set().in_sync()
    }

    /// Its request counters now, if it counts them (`VolumeOptions::metrics`).
    pub fn metrics_snapshot(&self) -> Option<trireme_metrics::VolumeSnapshot> {
        self.metrics.as_ref().map(|m| m.snapshot())
    }

    /// The options it was attached with.
    pub fn options(&self) -> &VolumeOptions {
        &self.opts
    }

    /// True when no copy in sync has a live link: every one was lost at once (the whole
    /// cluster restarted, or this host lost its network), so no request can succeed and no
    /// copy can be taken out. The process serving the volume attaches again.
    pub fn lost_every_copy(&self) -> bool {
        let in_sync = self.in_sync();
        !in_sync.is_empty()
            && in_sync
                .iter()
                .all(|&i| self.conn(&self.slots[i]).is_none_or(|c| c.is_closed()))
    }

    fn write_targets(&self) -> Vec<usize> {
        self.core().write_targets()
    }

    fn state(&self, i: usize) -> ReplicaState {
        self.core().set().state(i)
    }

    fn replica_count(&self) -> usize {
        self.core().set().len()
    }

    /// Time since the volume was opened: the core's clock.
    fn now(&self) -> Duration {
        self.opened.elapsed()
    }

    fn header(&self, op: Op, offset: u64, length: u64) -> Header {
        Header {
            volume: self.info.id,
            epoch: self.info.epoch,
            offset,
            length,
            ..Header::request(op, 0)
        }
    }

    /// As [`Volume::header`], for a request that copies or checks data for recovery (a
    /// resync, a repair, a scrub, the encoder): nodes serve it within their recovery share,
    /// and it may take [`RECOVERY_PATIENCE`] times the replica timeout.
    fn recovery_header(&self, op: Op, offset: u64, length: u64) -> Header {
        let mut h = self.header(op, offset, length);
        h.flags |= trireme_proto::FLAG_RECOVERY;
        h
    }

    /// The error for a replica on `node` that cannot be taken out, and why.
    fn degrade(&self, node: u32, why: impl Into<DegradeRefusal>) -> VolumeError {
        VolumeError::Degrade {
            volume: self.info.name.clone(),
            node,
            why: why.into(),
        }
    }

    fn node(&self, i: usize) -> u32 {
        self.slots[i].node.load(Ordering::Relaxed)
    }

    fn call(
        &self,
        i: usize,
        h: Header,
        payload: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<Frame, VolumeError>> + Send + '_>> {
        self.call_crc(i, h, payload, None)
    }

    /// [`Volume::call`] with the payload's checksum computed already (`crc`), for a payload
    /// sent to several replicas.
    fn call_crc(
        &self,
        i: usize,
        h: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Pin<Box<dyn Future<Output = Result<Frame, VolumeError>> + Send + '_>> {
        let node = self.node(i);
        Box::pin(async move {
            let c = self
                .conn(&self.slots[i])
                .ok_or_else(|| VolumeError::NoReplicas(self.info.name.clone()))?;
            let timeout = match h.has_flag(trireme_proto::FLAG_RECOVERY) {
                true => self.opts.replica_timeout * RECOVERY_PATIENCE,
                false => self.opts.replica_timeout,
            };
            match tokio::time::timeout(timeout, c.call_crc(h, payload, crc)).await {
                Ok(r) => r.map_err(|source| VolumeError::Transport { node, source }),
                Err(_) => Err(VolumeError::Timeout { node, timeout }),
            }
        })
    }

    /// What an answer of replica `i` that does not decode is.
    pub(crate) fn malformed(&self, i: usize) -> impl Fn(trireme_proto::DecodeError) -> VolumeError {
        let node = self.node(i);
        move |e| VolumeError::Protocol {
            node,
            what: e.to_string(),
        }
    }

    fn expect_ok(&self, i: usize, f: Frame) -> Result<Frame, VolumeError> {
        match f.header.status {
            Status::Ok => Ok(f),
            // A replica behind this writer's epoch was not fenced by a newer writer: it was
            // re-created (a move's new copy made again) or never attached at this epoch. A
            // failure of that copy, not the end of this writer (taking it for a fence stopped
            // the writer, and a drain with it).
            Status::Fenced if f.header.epoch < self.info.epoch => Err(VolumeError::Replica {
                node: self.node(i),
                status: Status::Fenced,
                message: format!(
                    "the copy is at epoch {}, behind this writer's {}: re-created, or never attached by it",
                    f.header.epoch, self.info.epoch
                ),
            }),
            Status::Fenced => Err(VolumeError::Fenced {
                volume: self.info.name.clone(),
                ours: self.info.epoch,
                newer: f.header.epoch,
            }),
            Status::Denied => Err(VolumeError::Denied {
                node: self.node(i),
                why: String::from_utf8_lossy(&f.payload).into_owned(),
            }),
            s => Err(VolumeError::Replica {
                node: self.node(i),
                status: s,
                message: String::from_utf8_lossy(&f.payload).into_owned(),
            }),
        }
    }
}

/// How much of a range an extent query wants answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extents {
    /// Every extent of the range.
    All,
    /// The first ones, at most [`trireme_proto::FIRST_EXTENTS`], covering a prefix of it (what
    /// an NBD reply carries).
    First,
    /// The first one (NBD's `REQ_ONE`).
    One,
}

impl Extents {
    /// The request flags that ask for it.
    pub(crate) fn flags(self) -> u16 {
        match self {
            Extents::All => 0,
            Extents::First => trireme_proto::FLAG_FIRST,
            Extents::One => trireme_proto::FLAG_ONE,
        }
    }

    /// Node `node`'s answer for a `len`-byte range: all of it covering the range exactly, or
    /// the first ones covering a prefix (cut to as many as wanted: a node from before the
    /// flags answers the whole range).
    pub(crate) fn check(
        self,
        node: u32,
        payload: &[u8],
        len: u64,
    ) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
        if self == Extents::All {
            return extents_covering(node, payload, len);
        }
        let bad = |what: String| VolumeError::Protocol { node, what };
        let mut ext =
            trireme_proto::decode_extents_within(payload, len).map_err(|e| bad(e.to_string()))?;
        ext.retain(|e| e.length > 0);
        if ext.is_empty() {
            return Err(bad(format!("no extent answers a {len}-byte range")));
        }
        ext.truncate(match self {
            Extents::One => 1,
            _ => trireme_proto::FIRST_EXTENTS,
        });
        Ok(ext)
    }
}

/// Node `node`'s extent list answering for a `len`-byte range: decoded, and checked to cover
/// the range exactly.
pub(crate) fn extents_covering(
    node: u32,
    payload: &[u8],
    len: u64,
) -> Result<Vec<trireme_proto::Extent>, VolumeError> {
    let bad = |what: String| VolumeError::Protocol { node, what };
    let ext = trireme_proto::decode_extents_within(payload, len).map_err(|e| bad(e.to_string()))?;
    let total: u64 = ext.iter().map(|e| e.length).sum();
    if total != len {
        return Err(bad(format!("extents cover {total} of {len} bytes")));
    }
    Ok(ext)
}
