//! One connection: one queue of one controller. The connection handshake (ICReq), then
//! command capsules in, data and responses out. Admin commands run in order on the reader;
//! I/O commands run concurrently and complete out of order through the queue's writer.
//!
//! Bounds: a PDU's length is checked before anything is read into memory (in-capsule data up
//! to what the queue takes, H2CData up to MAXH2CDATA); commands outstanding up to the queue's
//! size; data the host owes after an R2T must come within [`TRANSFER_TIMEOUT`]. A host that
//! breaks the protocol gets a termination request and its queue is closed; every other queue
//! goes on.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use trireme_blockdev::BlockDevice;

use crate::admin::Answer;
use crate::cmd::{fctype, sgl, status, Cqe, Direction, Sqe, FABRICS};
use crate::ctrl::{lock, Ctrl, Out};
use crate::ident::{self, ADMIN_INLINE_DATA, INLINE_DATA, MDTS};
use crate::pdu::{self, flag, kind, Common, DataHeader, IcReq, IcResp, PduError, CH_LEN};
use crate::subsystem::Subsystem;
use crate::target::Port;

/// How long a new connection may take to send its ICReq and its Connect.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the host may take to send data it owes after an R2T.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(30);
/// The most data one H2CData PDU carries (ICResp's MAXH2CDATA).
pub const MAXH2CDATA: u32 = 128 * 1024;
/// The most data one command moves (MDTS).
pub const MAX_TRANSFER: u32 = 4096 << MDTS;

/// Why a queue ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed PDU: {0}")]
    Pdu(#[from] PduError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Timeout(&'static str),
}

/// Serves one connection of `port` until it closes, the host breaks the protocol, or its
/// controller ends.
pub async fn serve<D, S>(port: Arc<Port<D>>, stream: S, peer: SocketAddr) -> Result<(), QueueError>
where
    D: BlockDevice,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let (tx, rx) = tokio::sync::mpsc::channel(2 * ident::QUEUE_ENTRIES as usize + 8);
    let writer = tokio::spawn(write_all(wr, rx));
    let mut q = Queue {
        port,
        peer,
        out: tx,
        conn: None,
        sqhd: 0,
        entries: 32,
        sqflow: true,
        inflight: Arc::new(AtomicUsize::new(0)),
        transfers: HashMap::new(),
        next_ttag: 0,
    };
    let r = match q.handshake(&mut rd).await {
        Ok(()) => q.run(&mut rd).await,
        Err(e) => Err(e),
    };
    if let Err(QueueError::Pdu(e)) = &r {
        let (fes, fei) = e.fes();
        let _ = q
            .out
            .send(vec![pdu::term_req(kind::C2H_TERM, fes, fei, &[])])
            .await;
    }
    q.close();
    drop(q);
    // The writer ends once every request of this queue has answered (or its socket failed).
    let _ = writer.await;
    r
}

/// Sends what the queue's requests queue up, in order; batches what is ready into one flush.
async fn write_all<W: AsyncWrite + Send>(wr: W, mut rx: tokio::sync::mpsc::Receiver<Vec<Bytes>>) {
    let wr = tokio::io::BufWriter::with_capacity(64 * 1024, wr);
    tokio::pin!(wr);
    while let Some(first) = rx.recv().await {
        let mut batch = Some(first);
        while let Some(pieces) = batch.take().or_else(|| rx.try_recv().ok()) {
            for p in pieces {
                if wr.write_all(&p).await.is_err() {
                    return;
                }
            }
        }
        if wr.flush().await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// A queue once connected: its controller and id.
struct Conn<D> {
    ctrl: Arc<Ctrl>,
    qid: u16,
    sub: Option<Arc<Subsystem<D>>>,
}

/// Data the host owes for a command, after an R2T.
struct Transfer {
    sqe: Sqe,
    sqhd: u16,
    buf: BytesMut,
    want: usize,
}

struct Queue<D> {
    port: Arc<Port<D>>,
    peer: SocketAddr,
    out: Out,
    conn: Option<Conn<D>>,
    /// Submission queue head: commands taken, modulo the queue's entries.
    sqhd: u16,
    entries: u32,
    /// SQ flow control (SQHD reported): on unless the host's Connect turned it off.
    sqflow: bool,
    /// Commands taken and not yet answered (data transfers included).
    inflight: Arc<AtomicUsize>,
    transfers: HashMap<u16, Transfer>,
    next_ttag: u16,
}

fn protocol(why: impl Into<String>) -> QueueError {
    QueueError::Protocol(why.into())
}

impl<D: BlockDevice> Queue<D> {
    async fn handshake(&mut self, rd: &mut (impl AsyncRead + Unpin)) -> Result<(), QueueError> {
        let read = async {
            let mut ch = [0u8; CH_LEN];
            rd.read_exact(&mut ch).await?;
            let c = Common::decode(&ch);
            if c.kind != kind::IC_REQ {
                return Err(protocol(format!(
                    "the first PDU is of type {:#04x}, not an ICReq",
                    c.kind
                )));
            }
            c.check_from_host(0)?;
            let mut rest = [0u8; pdu::IC_LEN - CH_LEN];
            rd.read_exact(&mut rest).await?;
            Ok(IcReq::decode(&rest)?)
        };
        let req = tokio::time::timeout(HANDSHAKE_TIMEOUT, read)
            .await
            .map_err(|_| QueueError::Timeout("no ICReq within 10 s"))??;
        if req.pfv != 0 {
            return Err(PduError::Field("PDU format version other than 1.0").into());
        }
        if req.digest != 0 {
            return Err(PduError::Digest(req.digest).into());
        }
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            digest: 0,
            maxh2cdata: MAXH2CDATA,
        };
        self.send(vec![resp.encode()]).await;
        Ok(())
    }

    async fn send(&self, pieces: Vec<Bytes>) {
        let _ = self.out.send(pieces).await;
    }

    /// The in-capsule data this queue takes.
    fn inline_max(&self) -> usize {
        match &self.conn {
            Some(c) if c.qid > 0 => INLINE_DATA,
            Some(_) => ADMIN_INLINE_DATA,
            None => INLINE_DATA.max(ADMIN_INLINE_DATA),
        }
    }

    async fn run(&mut self, rd: &mut (impl AsyncRead + Unpin)) -> Result<(), QueueError> {
        loop {
            let mut dead = self.conn.as_ref().map(|c| c.ctrl.dead_rx());
            let limit = match (&self.conn, self.transfers.is_empty()) {
                (None, _) => Some((HANDSHAKE_TIMEOUT, "no Connect within 10 s")),
                (_, false) => Some((
                    self.port.transfer_timeout,
                    "data owed after an R2T did not come in time",
                )),
                (Some(_), true) => None,
            };
            let mut ch = [0u8; CH_LEN];
            let header = async {
                match limit {
                    None => rd.read_exact(&mut ch).await.map_err(QueueError::from),
                    Some((d, why)) => tokio::time::timeout(d, rd.read_exact(&mut ch))
                        .await
                        .map_err(|_| QueueError::Timeout(why))?
                        .map_err(QueueError::from),
                }
            };
            let ended = async {
                match dead.as_mut() {
                    Some(rx) => {
                        let _ = rx.wait_for(|d| *d).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = header => match r {
                    Ok(_) => {}
                    Err(QueueError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                },
                _ = ended => return Ok(()),
            }
            let c = Common::decode(&ch);
            let max = match c.kind {
                kind::H2C_DATA => MAXH2CDATA as usize,
                _ => self.inline_max(),
            };
            c.check_from_host(max)?;
            // Checked above: a header is at most an ICReq's 128 bytes; no allocation per PDU.
            let mut hdr_buf = [0u8; pdu::IC_LEN - CH_LEN];
            let hdr = &mut hdr_buf[..c.hlen as usize - CH_LEN];
            rd.read_exact(hdr).await?;
            match c.kind {
                kind::CAPSULE_CMD => self.capsule(rd, &c, hdr).await?,
                kind::H2C_DATA => self.h2c_data(rd, &c, hdr).await?,
                kind::H2C_TERM => {
                    return Err(protocol("the host terminated the connection"));
                }
                k => return Err(PduError::UnknownType(k).into()),
            }
        }
    }

    /// Reads the data of a PDU whose header was read (skipping a pad before it).
    async fn read_data(
        rd: &mut (impl AsyncRead + Unpin),
        c: &Common,
        into: &mut BytesMut,
    ) -> Result<(), QueueError> {
        let len = c.data_len();
        if len == 0 {
            return Ok(());
        }
        let pad = c.pdo as usize - c.hlen as usize;
        if pad > 0 {
            let mut skip = vec![0u8; pad];
            rd.read_exact(&mut skip).await?;
        }
        let start = into.len();
        into.resize(start + len, 0);
        rd.read_exact(&mut into[start..]).await?;
        Ok(())
    }

    async fn capsule(
        &mut self,
        rd: &mut (impl AsyncRead + Unpin),
        c: &Common,
        hdr: &[u8],
    ) -> Result<(), QueueError> {
        let raw: &[u8; 64] = hdr[..64].try_into().expect("checked header length");
        let sqe = Sqe::decode(raw);
        let mut data = BytesMut::new();
        Self::read_data(rd, c, &mut data).await?;
        self.sqhd = ((u32::from(self.sqhd) + 1) % self.entries) as u16;
        let sqhd = self.sqhd;
        if let Some(conn) = &self.conn {
            conn.ctrl.seen();
        }
        let taken = self.inflight.fetch_add(1, Ordering::AcqRel);
        if taken >= self.entries as usize {
            return Err(protocol(format!(
                "a command beyond the queue's {} entries",
                self.entries
            )));
        }
        let is_connect = sqe.opcode == FABRICS && sqe.fctype() == fctype::CONNECT;
        if self.conn.is_none() && !is_connect {
            // Nothing but a Connect on a new queue, and no R2T for anything else.
            self.reply(sqe.cid, sqhd, 0, status::SEQUENCE_ERROR | status::DNR, None)
                .await;
            return Ok(());
        }
        match self.data_for(&sqe, data) {
            Ok(Some(data)) => self.dispatch(sqe, sqhd, data.freeze()).await,
            Ok(None) => {
                self.r2t(sqe, sqhd).await;
                Ok(())
            }
            Err(st) => {
                self.reply(sqe.cid, sqhd, 0, st, None).await;
                Ok(())
            }
        }
    }

    /// The command's data when it has all it needs (`None`: the host must be asked for it
    /// with an R2T), or the status that refuses it.
    fn data_for(&self, sqe: &Sqe, data: BytesMut) -> Result<Option<BytesMut>, u16> {
        let dir = sqe.direction();
        let len = sqe.sgl_len;
        if len > MAX_TRANSFER && dir != Direction::None {
            return Err(status::INVALID_FIELD | status::DNR);
        }
        match (dir, sqe.sgl_type) {
            (Direction::ToController, sgl::INCAPSULE) => {
                if sqe.sgl_addr != 0 || data.len() != len as usize {
                    return Err(status::SGL_INVALID_DATA_LENGTH | status::DNR);
                }
                Ok(Some(data))
            }
            (Direction::ToController, sgl::TRANSPORT) if data.is_empty() => match len {
                0 => Ok(Some(data)),
                _ => Ok(None),
            },
            (Direction::ToHost, sgl::TRANSPORT) if data.is_empty() => Ok(Some(data)),
            (Direction::None, _) if data.is_empty() => Ok(Some(data)),
            (Direction::None, _) => Err(status::INVALID_FIELD | status::DNR),
            _ => Err(status::SGL_INVALID_TYPE | status::DNR),
        }
    }

    async fn r2t(&mut self, sqe: Sqe, sqhd: u16) {
        let ttag = loop {
            self.next_ttag = self.next_ttag.wrapping_add(1);
            if !self.transfers.contains_key(&self.next_ttag) {
                break self.next_ttag;
            }
        };
        let want = sqe.sgl_len as usize;
        let r2t = DataHeader {
            cccid: sqe.cid,
            ttag,
            offset: 0,
            len: sqe.sgl_len,
        };
        self.transfers.insert(
            ttag,
            Transfer {
                sqe,
                sqhd,
                buf: BytesMut::with_capacity(want),
                want,
            },
        );
        self.send(vec![r2t.encode(kind::R2T, 0)]).await;
    }

    async fn h2c_data(
        &mut self,
        rd: &mut (impl AsyncRead + Unpin),
        c: &Common,
        hdr: &[u8],
    ) -> Result<(), QueueError> {
        let h = DataHeader::decode(hdr)?;
        let Some(t) = self.transfers.get_mut(&h.ttag) else {
            return Err(
                PduError::Field("H2CData for a transfer tag with no R2T outstanding").into(),
            );
        };
        // An empty one would move nothing and could keep a transfer open for ever.
        let in_order = h.cccid == t.sqe.cid
            && h.len > 0
            && h.offset as usize == t.buf.len()
            && h.len as usize == c.data_len()
            && t.buf.len() + h.len as usize <= t.want;
        if !in_order {
            tracing::debug!(peer = %self.peer, "H2CData of {} bytes at {} for command {} does not follow what came ({} of {})", h.len, h.offset, h.cccid, t.buf.len(), t.want);
            // A header field error: the host is told (a termination request).
            return Err(PduError::Field("H2CData empty, or not following what came").into());
        }
        Self::read_data(rd, c, &mut t.buf).await?;
        if t.buf.len() < t.want {
            return Ok(());
        }
        let t = self.transfers.remove(&h.ttag).expect("present");
        self.dispatch(t.sqe, t.sqhd, t.buf.freeze()).await
    }

    /// Runs a command whose data is all here.
    async fn dispatch(&mut self, sqe: Sqe, sqhd: u16, data: Bytes) -> Result<(), QueueError> {
        let Some(conn) = &self.conn else {
            return self.connect(&sqe, sqhd, &data).await;
        };
        if conn.qid == 0 {
            let ctrl = conn.ctrl.clone();
            let r = crate::admin::run(&self.port, &ctrl, &sqe, &self.out).await;
            match r {
                Ok(Answer::Held) => {
                    // Outstanding until an event: it leaves the count of commands in flight.
                    self.inflight.fetch_sub(1, Ordering::AcqRel);
                }
                Ok(Answer::Done(result, page)) => {
                    self.reply(
                        sqe.cid,
                        sqhd,
                        result,
                        status::SUCCESS,
                        page.map(Bytes::from),
                    )
                    .await
                }
                Err(st) => self.reply(sqe.cid, sqhd, 0, st, None).await,
            }
            return Ok(());
        }
        if sqe.opcode == FABRICS {
            let st = match sqe.fctype() {
                fctype::CONNECT => status::SEQUENCE_ERROR,
                _ => status::INVALID_OPCODE,
            };
            self.reply(sqe.cid, sqhd, 0, st | status::DNR, None).await;
            return Ok(());
        }
        let sub = conn.sub.clone().expect("I/O queues belong to a subsystem");
        let reply = self.replier();
        tokio::spawn(async move {
            let r = crate::io::run(&sub, &sqe, data).await;
            match r {
                Ok(d) => reply.send(sqe.cid, sqhd, 0, status::SUCCESS, d).await,
                Err(st) => reply.send(sqe.cid, sqhd, 0, st, None).await,
            }
        });
        Ok(())
    }

    fn replier(&self) -> Replier {
        Replier {
            out: self.out.clone(),
            qid: self.conn.as_ref().map_or(0, |c| c.qid),
            sqflow: self.sqflow,
            inflight: self.inflight.clone(),
        }
    }

    async fn reply(&self, cid: u16, sqhd: u16, result: u64, st: u16, data: Option<Bytes>) {
        self.replier().send(cid, sqhd, result, st, data).await
    }

    /// A Connect: the admin queue makes a controller, an I/O queue joins one.
    async fn connect(&mut self, sqe: &Sqe, sqhd: u16, data: &[u8]) -> Result<(), QueueError> {
        match crate::connect::accept(&self.port, sqe, data, self.peer) {
            Ok(c) => {
                self.entries = c.entries;
                self.sqflow = !c.sqflow_disabled;
                // The Connect itself is the first entry.
                self.sqhd = 1 % self.entries as u16;
                let result = u64::from(c.ctrl.cntlid);
                let sub = c.ctrl.subsys.map(|i| self.port.subsystems[i].clone());
                self.conn = Some(Conn {
                    ctrl: c.ctrl,
                    qid: c.qid,
                    sub,
                });
                let sqhd = self.sqhd;
                self.reply(sqe.cid, sqhd, result, status::SUCCESS, None)
                    .await;
            }
            Err((st, result)) => {
                self.reply(sqe.cid, sqhd, result, st | status::DNR, None)
                    .await
            }
        }
        Ok(())
    }

    /// The queue is going: an admin queue's controller ends with it (and its I/O queues),
    /// an I/O queue leaves its controller.
    fn close(&mut self) {
        let Some(c) = self.conn.take() else {
            return;
        };
        if c.qid == 0 {
            self.port.registry.remove(c.ctrl.cntlid);
        } else {
            lock(&c.ctrl.queues).1.remove(&c.qid);
        }
    }
}

/// Answers commands of one queue: data (C2HData), then the response capsule unless the
/// data's last PDU said success (only with SQ flow control off, as Linux's target does).
#[derive(Clone)]
struct Replier {
    out: Out,
    qid: u16,
    sqflow: bool,
    inflight: Arc<AtomicUsize>,
}

impl Replier {
    async fn send(&self, cid: u16, sqhd: u16, result: u64, st: u16, data: Option<Bytes>) {
        let mut pieces = Vec::with_capacity(3);
        let ok = st == status::SUCCESS;
        let mut need_resp = true;
        if let (true, Some(d)) = (ok, data) {
            if !d.is_empty() {
                let mut flags = flag::DATA_LAST;
                if !self.sqflow {
                    flags |= flag::DATA_SUCCESS;
                    need_resp = false;
                }
                let h = DataHeader {
                    cccid: cid,
                    ttag: 0,
                    offset: 0,
                    len: d.len() as u32,
                };
                pieces.push(h.encode(kind::C2H_DATA, flags));
                pieces.push(d);
            }
        }
        if need_resp {
            let cqe = Cqe {
                result,
                sq_head: if self.sqflow { sqhd } else { 0 },
                sq_id: self.qid,
                cid,
                status: st,
            };
            pieces.push(pdu::capsule_resp(&cqe.encode()));
        }
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        let _ = self.out.send(pieces).await;
    }
}
