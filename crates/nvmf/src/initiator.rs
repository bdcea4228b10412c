//! An NVMe/TCP host of our own (the tests' and the benchmark's): a controller with an admin
//! queue and I/O queues over TCP, commands at any depth with in-capsule or R2T-driven writes,
//! keep-alive, asynchronous events; and [`crate::multipath::Multipath`] over several of them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::cmd::{admin, fctype, io, sgl, status, Cqe, Sqe, FABRICS};
use crate::ctrl::lock;
use crate::ident::{self, LBA_SHIFT, NSID};
use crate::pdu::{self, flag, kind, Common, DataHeader, IcReq, IcResp, PduError, CH_LEN};

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("connection: {0}")]
    Io(String),
    #[error("malformed PDU from the controller: {0}")]
    Pdu(#[from] PduError),
    #[error("the controller answered status {0:#05x}")]
    Status(u16),
    #[error("the queue is closed")]
    Closed,
    #[error("{0}")]
    Refused(String),
}

impl HostError {
    /// A path error or a lost connection: the command may succeed on another path.
    pub fn is_path_error(&self) -> bool {
        match self {
            HostError::Status(s) => s & 0x700 == 0x300,
            HostError::Io(_) | HostError::Closed => true,
            _ => false,
        }
    }
}

impl From<std::io::Error> for HostError {
    fn from(e: std::io::Error) -> HostError {
        HostError::Io(e.to_string())
    }
}

/// Who the host is.
#[derive(Debug, Clone)]
pub struct HostId {
    pub nqn: String,
    pub id: [u8; 16],
}

impl HostId {
    pub fn new(nqn: &str) -> HostId {
        let (id, _) = crate::subsystem::volume_ids(nqn);
        HostId {
            nqn: nqn.to_string(),
            id,
        }
    }
}

type Done = oneshot::Sender<Result<(Cqe, Bytes), HostError>>;

struct Pending {
    done: Done,
    /// Data to send on an R2T.
    to_send: Option<Bytes>,
    /// Data received (C2HData).
    got: BytesMut,
}

/// One queue: a TCP connection, its reader task and its writer task.
#[derive(Debug)]
pub struct HostQueue {
    qid: u16,
    out: mpsc::Sender<Vec<Bytes>>,
    pending: Arc<Mutex<HashMap<u16, PendingSlot>>>,
    cids: Arc<Mutex<Vec<u16>>>,
    depth: Arc<Semaphore>,
    inline: usize,
    /// Set by the reader when it ends, before it fails what is pending.
    ended: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct PendingSlot(Pending);

impl std::fmt::Debug for PendingSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

impl Drop for HostQueue {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl HostQueue {
    /// Connects TCP and exchanges ICReq/ICResp; `entries` commands may be outstanding.
    pub async fn open(
        addr: SocketAddr,
        qid: u16,
        entries: u16,
        inline: usize,
    ) -> Result<HostQueue, HostError> {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| HostError::Io(format!("connecting to {addr} timed out")))??;
        stream.set_nodelay(true)?;
        let (rd, mut wr) = stream.into_split();
        let mut rd = BufReader::with_capacity(256 * 1024, rd);
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digest: 0,
            maxr2t: 0,
        };
        wr.write_all(&req.encode()).await?;
        let mut ch = [0u8; CH_LEN];
        tokio::time::timeout(Duration::from_secs(10), rd.read_exact(&mut ch))
            .await
            .map_err(|_| HostError::Io("no ICResp".into()))??;
        let c = Common::decode(&ch);
        if c.kind != kind::IC_RESP {
            return Err(HostError::Refused(format!(
                "PDU {:#04x} instead of ICResp",
                c.kind
            )));
        }
        c.check_from_controller(0)?;
        let mut rest = [0u8; pdu::IC_LEN - CH_LEN];
        rd.read_exact(&mut rest).await?;
        let resp = IcResp::decode(&rest)?;
        let (tx, rx) = mpsc::channel(4 * entries as usize + 8);
        let pending = Arc::new(Mutex::new(HashMap::new()));
        let writer = tokio::spawn(write_pdus(wr, rx));
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = tokio::spawn(read_pdus(
            rd,
            pending.clone(),
            tx.clone(),
            resp.maxh2cdata,
            ended.clone(),
        ));
        Ok(HostQueue {
            qid,
            out: tx,
            pending,
            cids: Arc::new(Mutex::new((0..entries).rev().collect())),
            depth: Arc::new(Semaphore::new(entries as usize)),
            inline,
            ended,
            tasks: vec![writer, reader],
        })
    }

    /// Submits `sqe` (its cid is set here) with `data` for the controller (in the capsule if
    /// it fits, else on R2T) or `receive` bytes expected back.
    pub async fn submit(
        &self,
        mut sqe: Sqe,
        data: Option<Bytes>,
        receive: u32,
    ) -> Result<(Cqe, Bytes), HostError> {
        let _permit = self.depth.acquire().await.map_err(|_| HostError::Closed)?;
        let cid = lock(&self.cids).pop().ok_or(HostError::Closed)?;
        let guard = CidGuard {
            cids: &self.cids,
            pending: &self.pending,
            cid,
        };
        sqe.cid = cid;
        let (done, rx) = oneshot::channel();
        let mut pieces = Vec::with_capacity(2);
        let mut to_send = None;
        match data {
            Some(d) if d.len() <= self.inline => {
                sqe.sgl_type = sgl::INCAPSULE;
                sqe.sgl_addr = 0;
                sqe.sgl_len = d.len() as u32;
                pieces.push(pdu::capsule_cmd(&sqe.encode(), d.len()));
                pieces.push(d);
            }
            Some(d) => {
                sqe.sgl_type = sgl::TRANSPORT;
                sqe.sgl_len = d.len() as u32;
                pieces.push(pdu::capsule_cmd(&sqe.encode(), 0));
                to_send = Some(d);
            }
            None => {
                sqe.sgl_type = sgl::TRANSPORT;
                sqe.sgl_len = receive;
                pieces.push(pdu::capsule_cmd(&sqe.encode(), 0));
            }
        }
        lock(&self.pending).insert(
            cid,
            PendingSlot(Pending {
                done,
                to_send,
                got: BytesMut::new(),
            }),
        );
        // A reader that ended before the insert failed what it found; this one is ours to fail.
        if self.ended.load(Ordering::Acquire) {
            return Err(HostError::Closed);
        }
        self.out.send(pieces).await.map_err(|_| HostError::Closed)?;
        let r = rx.await.map_err(|_| HostError::Closed)?;
        drop(guard);
        let (cqe, got) = r?;
        match cqe.code() {
            status::SUCCESS => Ok((cqe, got)),
            _ => Err(HostError::Status(cqe.status)),
        }
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.ended.load(Ordering::Acquire)
            || self.out.is_closed()
            || self.tasks.iter().any(|t| t.is_finished())
    }
}

/// Gives a command id back when its command is over (answered, failed or dropped).
struct CidGuard<'a> {
    cids: &'a Mutex<Vec<u16>>,
    pending: &'a Mutex<HashMap<u16, PendingSlot>>,
    cid: u16,
}

impl Drop for CidGuard<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.cid);
        lock(self.cids).push(self.cid);
    }
}

async fn write_pdus(mut wr: tokio::net::tcp::OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<Bytes>>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(pieces) = next.take().or_else(|| rx.try_recv().ok()) {
            for p in pieces {
                if p.len() > 16 * 1024 {
                    if wr.write_all(&buf).await.is_err() || wr.write_all(&p).await.is_err() {
                        return;
                    }
                    buf.clear();
                } else {
                    buf.extend_from_slice(&p);
                }
            }
        }
        if wr.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
    }
}

async fn read_pdus(
    mut rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    pending: Arc<Mutex<HashMap<u16, PendingSlot>>>,
    out: mpsc::Sender<Vec<Bytes>>,
    maxh2c: u32,
    ended: Arc<std::sync::atomic::AtomicBool>,
) {
    let r = read_loop(&mut rd, &pending, &out, maxh2c).await;
    ended.store(true, Ordering::Release);
    let why = match r {
        Ok(()) => HostError::Closed,
        Err(e) => e,
    };
    for (_, PendingSlot(p)) in lock(&pending).drain() {
        let _ = p.done.send(Err(why.clone()));
    }
}

async fn read_loop(
    rd: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    pending: &Mutex<HashMap<u16, PendingSlot>>,
    out: &mpsc::Sender<Vec<Bytes>>,
    maxh2c: u32,
) -> Result<(), HostError> {
    loop {
        let mut ch = [0u8; CH_LEN];
        if let Err(e) = rd.read_exact(&mut ch).await {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Ok(()),
                _ => Err(e.into()),
            };
        }
        let c = Common::decode(&ch);
        c.check_from_controller(crate::queue::MAX_TRANSFER as usize)?;
        // Checked above: a header is at most an ICReq's 128 bytes; no allocation per PDU.
        let mut hdr_buf = [0u8; pdu::IC_LEN - CH_LEN];
        let hdr = &mut hdr_buf[..c.hlen as usize - CH_LEN];
        rd.read_exact(hdr).await?;
        let pad = (c.pdo as usize).saturating_sub(c.hlen as usize);
        let mut skip = vec![0u8; pad];
        rd.read_exact(&mut skip).await?;
        match c.kind {
            kind::CAPSULE_RESP => {
                let cqe = Cqe::decode(hdr[..16].try_into().expect("16"));
                let p = lock(pending).remove(&cqe.cid);
                if let Some(PendingSlot(p)) = p {
                    let _ = p.done.send(Ok((cqe, p.got.freeze())));
                }
            }
            kind::C2H_DATA => {
                let h = DataHeader::decode(hdr)?;
                let mut data = vec![0u8; c.data_len()];
                rd.read_exact(&mut data).await?;
                let mut map = lock(pending);
                let Some(PendingSlot(p)) = map.get_mut(&h.cccid) else {
                    return Err(HostError::Refused(format!(
                        "C2HData for unknown command {}",
                        h.cccid
                    )));
                };
                if h.offset as usize != p.got.len() {
                    return Err(HostError::Refused("C2HData out of order".into()));
                }
                p.got.extend_from_slice(&data);
                if c.flags & flag::DATA_SUCCESS != 0 && c.flags & flag::DATA_LAST != 0 {
                    let PendingSlot(p) = map.remove(&h.cccid).expect("present");
                    let cqe = Cqe {
                        cid: h.cccid,
                        ..Cqe::default()
                    };
                    let _ = p.done.send(Ok((cqe, p.got.freeze())));
                }
            }
            kind::R2T => {
                let h = DataHeader::decode(hdr)?;
                let pieces = {
                    let map = lock(pending);
                    let Some(PendingSlot(p)) = map.get(&h.cccid) else {
                        return Err(HostError::Refused(format!(
                            "R2T for unknown command {}",
                            h.cccid
                        )));
                    };
                    let Some(d) = &p.to_send else {
                        return Err(HostError::Refused("R2T for a command with no data".into()));
                    };
                    h2c_pieces(d, &h, maxh2c)?
                };
                out.send(pieces).await.map_err(|_| HostError::Closed)?;
            }
            kind::C2H_TERM => {
                return Err(HostError::Refused(format!(
                    "the controller terminated the connection (status {:#x})",
                    u16::from_le_bytes([hdr[0], hdr[1]])
                )))
            }
            k => return Err(PduError::UnknownType(k).into()),
        }
    }
}

/// The H2CData PDUs that answer an R2T.
fn h2c_pieces(d: &Bytes, h: &DataHeader, maxh2c: u32) -> Result<Vec<Bytes>, HostError> {
    let start = h.offset as usize;
    let end = start + h.len as usize;
    if end > d.len() || maxh2c == 0 {
        return Err(HostError::Refused("R2T past the command's data".into()));
    }
    let mut pieces = Vec::new();
    let mut at = start;
    while at < end {
        let n = (end - at).min(maxh2c as usize);
        let last = at + n == end;
        let dh = DataHeader {
            cccid: h.cccid,
            ttag: h.ttag,
            offset: at as u32,
            len: n as u32,
        };
        pieces.push(dh.encode(kind::H2C_DATA, if last { flag::DATA_LAST } else { 0 }));
        pieces.push(d.slice(at..at + n));
        at += n;
    }
    Ok(pieces)
}

/// How to connect a controller.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub io_queues: u16,
    pub queue_entries: u16,
    /// Keep-alive timeout asked for (0: none); keep-alives are sent every half of it.
    pub kato: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            io_queues: 2,
            queue_entries: 128,
            kato: Duration::from_secs(5),
        }
    }
}

/// A controller: the admin queue and the I/O queues of one association.
#[derive(Debug)]
pub struct Controller {
    pub addr: SocketAddr,
    pub cntlid: u16,
    pub subnqn: String,
    admin: Arc<HostQueue>,
    io: Vec<HostQueue>,
    next: AtomicUsize,
    size: AtomicU64,
    keepalive: Option<tokio::task::JoinHandle<()>>,
    events: Option<tokio::sync::Mutex<mpsc::Receiver<u32>>>,
    event_task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.keepalive
            .iter()
            .chain(self.event_task.iter())
            .for_each(|t| t.abort());
    }
}

/// A Connect command and its 1 KiB of data.
pub fn connect_command(
    qid: u16,
    entries: u16,
    kato: Duration,
    cntlid: u16,
    subnqn: &str,
    host: &HostId,
) -> (Sqe, Bytes) {
    let mut sqe = Sqe::new(FABRICS, 0, 0);
    sqe.raw[4] = fctype::CONNECT;
    sqe.cdw10 = u32::from(qid) << 16;
    sqe.cdw11 = u32::from(entries - 1);
    sqe.cdw12 = kato.as_millis() as u32;
    let mut d = vec![0u8; 1024];
    d[..16].copy_from_slice(&host.id);
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    let put = |d: &mut Vec<u8>, at: usize, s: &str| {
        let n = s.len().min(255);
        d[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
    };
    put(&mut d, 256, subnqn);
    put(&mut d, 512, &host.nqn);
    (sqe, Bytes::from(d))
}

/// A Property Get (`size8`: 8 bytes) or Set of the property at `offset`.
pub fn property(get: bool, offset: u32, value: u64, size8: bool) -> Sqe {
    let mut sqe = Sqe::new(FABRICS, 0, 0);
    sqe.raw[4] = if get {
        fctype::PROPERTY_GET
    } else {
        fctype::PROPERTY_SET
    };
    sqe.cdw10 = u32::from(size8);
    sqe.cdw11 = offset;
    sqe.cdw12 = value as u32;
    sqe.cdw13 = (value >> 32) as u32;
    sqe
}

/// A Get Log Page of `len` bytes (a multiple of 4) of log `lid` from `offset`.
pub fn get_log(lid: u8, lsp: u8, len: u32, offset: u64) -> Sqe {
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 0, u32::MAX);
    let numd = len / 4 - 1;
    sqe.cdw10 = u32::from(lid) | u32::from(lsp) << 8 | (numd & 0xffff) << 16;
    sqe.cdw11 = numd >> 16;
    sqe.cdw12 = offset as u32;
    sqe.cdw13 = (offset >> 32) as u32;
    sqe
}

impl Controller {
    /// Connects the admin queue (a new controller), enables it, learns the namespace, and
    /// connects `opts.io_queues` I/O queues (none for a discovery controller).
    pub async fn connect(
        addr: SocketAddr,
        subnqn: &str,
        host: &HostId,
        opts: &ConnectOptions,
    ) -> Result<Controller, HostError> {
        let admin = Arc::new(HostQueue::open(addr, 0, 32, ident::ADMIN_INLINE_DATA).await?);
        let (sqe, data) = connect_command(0, 32, opts.kato, 0xffff, subnqn, host);
        let (cqe, _) = admin.submit(sqe, Some(data), 0).await?;
        let cntlid = cqe.result as u16;
        admin
            .submit(property(false, 0x14, 1 | 6 << 16 | 4 << 20, false), None, 0)
            .await?;
        let (csts, _) = admin
            .submit(property(true, 0x1c, 0, false), None, 0)
            .await?;
        if csts.result & 1 == 0 {
            return Err(HostError::Refused("CSTS.RDY not set after enabling".into()));
        }
        let discovery = subnqn == ident::DISCOVERY_NQN;
        let mut c = Controller {
            addr,
            cntlid,
            subnqn: subnqn.to_string(),
            admin,
            io: Vec::new(),
            next: AtomicUsize::new(0),
            size: AtomicU64::new(0),
            keepalive: None,
            events: None,
            event_task: None,
        };
        if !opts.kato.is_zero() {
            c.keepalive = Some(tokio::spawn(keep_alive(c.admin.clone(), opts.kato / 2)));
        }
        if discovery {
            return Ok(c);
        }
        let id = c.identify(1, 0).await?;
        let ioccsz = u32::from_le_bytes([id[1792], id[1793], id[1794], id[1795]]) as usize;
        let inline = (ioccsz * 16).saturating_sub(64);
        let mut nq = Sqe::new(admin::SET_FEATURES, 0, 0);
        nq.cdw10 = 0x07;
        let want = u32::from(opts.io_queues.max(1) - 1);
        nq.cdw11 = want | want << 16;
        let (r, _) = c.admin.submit(nq, None, 0).await?;
        let granted = ((r.result & 0xffff) as u16 + 1).min(opts.io_queues.max(1));
        let mut aen = Sqe::new(admin::SET_FEATURES, 0, 0);
        aen.cdw10 = 0x0b;
        aen.cdw11 = 1 << 8 | 1 << 11;
        c.admin.submit(aen, None, 0).await?;
        c.refresh_size().await?;
        for qid in 1..=granted {
            let q = HostQueue::open(addr, qid, opts.queue_entries, inline).await?;
            let (sqe, data) =
                connect_command(qid, opts.queue_entries, opts.kato, cntlid, subnqn, host);
            q.submit(sqe, Some(data), 0).await?;
            c.io.push(q);
        }
        let (tx, rx) = mpsc::channel(16);
        c.event_task = Some(tokio::spawn(events(c.admin.clone(), tx)));
        c.events = Some(tokio::sync::Mutex::new(rx));
        Ok(c)
    }

    /// The namespace's size in bytes, as last identified.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Identifies the namespace again and returns its size.
    pub async fn refresh_size(&self) -> Result<u64, HostError> {
        let ns = self.identify(0, NSID).await?;
        let blocks = u64::from_le_bytes(ns[..8].try_into().expect("8"));
        let size = blocks << LBA_SHIFT;
        self.size.store(size, Ordering::Relaxed);
        Ok(size)
    }

    pub async fn identify(&self, cns: u8, nsid: u32) -> Result<Bytes, HostError> {
        let mut sqe = Sqe::new(admin::IDENTIFY, 0, nsid);
        sqe.cdw10 = u32::from(cns);
        Ok(self.admin.submit(sqe, None, 4096).await?.1)
    }

    /// Any admin command.
    pub async fn admin(
        &self,
        sqe: Sqe,
        data: Option<Bytes>,
        receive: u32,
    ) -> Result<(Cqe, Bytes), HostError> {
        self.admin.submit(sqe, data, receive).await
    }

    /// This path's ANA state for namespace 1.
    pub async fn ana_state(&self) -> Result<u8, HostError> {
        let (_, log) = self
            .admin
            .submit(get_log(ident::log::ANA, 0, 52, 0), None, 52)
            .await?;
        Ok(log[32])
    }

    /// The next asynchronous event's result (dword 0), when one comes.
    pub async fn next_event(&self) -> Option<u32> {
        self.events.as_ref()?.lock().await.recv().await
    }

    fn queue(&self) -> Result<&HostQueue, HostError> {
        if self.io.is_empty() {
            return Err(HostError::Refused("no I/O queue".into()));
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.io.len();
        Ok(&self.io[i])
    }

    /// Submits an I/O command on the next queue.
    pub async fn io(
        &self,
        sqe: Sqe,
        data: Option<Bytes>,
        receive: u32,
    ) -> Result<(Cqe, Bytes), HostError> {
        self.queue()?.submit(sqe, data, receive).await
    }

    fn rw(op: u8, offset: u64, len: u32) -> Sqe {
        let mut sqe = Sqe::new(op, 0, NSID);
        let slba = offset >> LBA_SHIFT;
        sqe.cdw10 = slba as u32;
        sqe.cdw11 = (slba >> 32) as u32;
        sqe.cdw12 = (len >> LBA_SHIFT).saturating_sub(1);
        sqe
    }

    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, HostError> {
        Ok(self.io(Self::rw(io::READ, offset, len), None, len).await?.1)
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), HostError> {
        let mut sqe = Self::rw(io::WRITE, offset, data.len() as u32);
        if fua {
            sqe.cdw12 |= 1 << 30;
        }
        self.io(sqe, Some(data), 0).await.map(|_| ())
    }

    pub async fn flush(&self) -> Result<(), HostError> {
        self.io(Sqe::new(io::FLUSH, 0, NSID), None, 0)
            .await
            .map(|_| ())
    }

    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        deallocate: bool,
    ) -> Result<(), HostError> {
        let mut sqe = Self::rw(io::WRITE_ZEROES, offset, len);
        if deallocate {
            sqe.cdw12 |= 1 << 25;
        }
        self.io(sqe, None, 0).await.map(|_| ())
    }

    /// Deallocates one range (Dataset Management with AD).
    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), HostError> {
        let mut sqe = Sqe::new(io::DSM, 0, NSID);
        sqe.cdw11 = 1 << 2;
        let mut r = vec![0u8; 16];
        r[4..8].copy_from_slice(&((len >> LBA_SHIFT) as u32).to_le_bytes());
        r[8..16].copy_from_slice(&(offset >> LBA_SHIFT).to_le_bytes());
        self.io(sqe, Some(Bytes::from(r)), 0).await.map(|_| ())
    }

    /// A clean goodbye: CC shutdown (the target flushes), then the queues close.
    pub async fn shutdown(self) -> Result<(), HostError> {
        self.admin
            .submit(property(false, 0x14, 1 | 1 << 14, false), None, 0)
            .await?;
        Ok(())
    }

    /// True once any of its queues has lost its connection.
    pub fn is_broken(&self) -> bool {
        self.admin.is_closed() || self.io.iter().any(|q| q.is_closed())
    }
}

async fn keep_alive(admin: Arc<HostQueue>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if admin
            .submit(Sqe::new(admin::KEEP_ALIVE, 0, 0), None, 0)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Keeps one asynchronous event request outstanding and forwards each event.
async fn events(admin: Arc<HostQueue>, tx: mpsc::Sender<u32>) {
    while let Ok((cqe, _)) = admin
        .submit(Sqe::new(admin::ASYNC_EVENT, 0, 0), None, 0)
        .await
    {
        let ev = cqe.result as u32;
        // Reading the log page the event names re-arms it (and clears it).
        let log = ((ev >> 16) & 0xff) as u8;
        let _ = admin.submit(get_log(log, 0, 512, 0), None, 512).await;
        if tx.send(ev).await.is_err() {
            return;
        }
    }
}
