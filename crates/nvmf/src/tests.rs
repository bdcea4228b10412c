//! The target against our host over real TCP on 127.0.0.1: every command the Linux host
//! uses, checked against the specification's fields, data verified at QD1 and QD128, the
//! refusals, and multipath failover.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trireme_blockdev::mem::MemDevice;

use crate::cmd::{admin, io, status, Sqe};
use crate::ident::{self, ana, log};
use crate::initiator::{connect_command, get_log, property, HostQueue};
use crate::pdu::{self, kind, IcReq};
use crate::*;

const NQN: &str = "nqn.2026-12.io.trireme:test:vol";
const SIZE: usize = 16 << 20;

fn host() -> HostId {
    HostId::new("nqn.2014-08.org.nvmexpress:uuid:host-a")
}

struct Served {
    port: Arc<Port<MemDevice>>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
        self.port.shut();
    }
}

async fn serve_dev(
    dev: Arc<MemDevice>,
    port_id: u16,
    state: u8,
    transfer: Duration,
) -> (Served, Ana) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let a = Ana::new(state);
    let (nguid, serial) = volume_ids("test:vol");
    let sub = Arc::new(Subsystem {
        nqn: NQN.into(),
        serial,
        nguid,
        dev,
        ana: a.clone(),
        allow: Arc::new(|h: &str| h.ends_with("host-a")),
    });
    let mut port = Port::new(port_id, addr, vec![sub]);
    port.transfer_timeout = transfer;
    let port = Arc::new(port);
    let task = tokio::spawn(port.clone().serve(listener));
    (Served { port, addr, task }, a)
}

async fn serve(state: u8) -> (Served, Ana) {
    serve_dev(
        Arc::new(MemDevice::new(SIZE)),
        1,
        state,
        Duration::from_secs(30),
    )
    .await
}

fn opts() -> ConnectOptions {
    ConnectOptions {
        io_queues: 2,
        queue_entries: 128,
        kato: Duration::from_secs(5),
    }
}

fn pattern(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    Bytes::from(v)
}

#[tokio::test]
async fn identify_and_properties_say_what_the_spec_asks() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    assert!(
        c.cntlid > 0x1000 && c.cntlid < 0x2000,
        "port 1's range: {:#x}",
        c.cntlid
    );
    let id = c.identify(1, 0).await.unwrap();
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), c.cntlid);
    assert_eq!(&id[24..31], b"trireme");
    assert_eq!(id[76], 0b1011, "CMIC: multi-port, multi-controller, ANA");
    assert_eq!(id[525], 1, "volatile write cache");
    assert_eq!(&id[768..768 + NQN.len()], NQN.as_bytes());
    let ns = c.identify(0, 1).await.unwrap();
    assert_eq!(
        u64::from_le_bytes(ns[..8].try_into().unwrap()),
        (SIZE >> 12) as u64
    );
    assert_eq!(ns[30], 1, "NMIC: shared");
    assert_eq!(ns[130], 12, "4 KiB blocks");
    let (nguid, _) = volume_ids("test:vol");
    assert_eq!(&ns[104..120], &nguid);
    let desc = c.identify(3, 1).await.unwrap();
    assert_eq!((desc[0], desc[1]), (2, 16));
    assert_eq!(&desc[4..20], &nguid);
    let list = c.identify(2, 0).await.unwrap();
    assert_eq!(u32::from_le_bytes(list[..4].try_into().unwrap()), 1);
    assert!(c.identify(2, 1).await.unwrap().iter().all(|&b| b == 0));
    assert_eq!(
        c.identify(0, 7).await.unwrap().len(),
        4096,
        "inactive: zeroes"
    );
    let (cap, _) = c.admin(property(true, 0, 0, true), None, 0).await.unwrap();
    assert_eq!(cap.result & 0xffff, 127);
    let (vs, _) = c.admin(property(true, 8, 0, false), None, 0).await.unwrap();
    assert_eq!(vs.result, 0x10300);
    let e = c
        .admin(property(false, 0x1c, 1, false), None, 0)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HostError::Status(status::INVALID_FIELD | status::DNR),
        "CSTS is read-only"
    );
    for (lid, len) in [
        (log::SMART, 512u32),
        (log::CMD_EFFECTS, 4096),
        (log::ERROR, 64),
        (log::FIRMWARE, 512),
        (log::CHANGED_NS, 4096),
    ] {
        let (_, page) = c.admin(get_log(lid, 0, len, 0), None, len).await.unwrap();
        assert_eq!(page.len(), len as usize, "log {lid:#x}");
    }
    let e = c
        .admin(get_log(0x42, 0, 512, 0), None, 512)
        .await
        .unwrap_err();
    assert_eq!(e, HostError::Status(status::INVALID_LOG_PAGE | status::DNR));
    let mut gf = Sqe::new(admin::GET_FEATURES, 0, 0);
    gf.cdw10 = 0x07;
    let (q, _) = c.admin(gf, None, 0).await.unwrap();
    assert_eq!(q.result, 1 | 1 << 16, "two I/O queues granted");
    let e = c.admin(Sqe::new(0x80, 0, 0), None, 0).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::INVALID_OPCODE | status::DNR));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_sets_shst() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    c.admin(property(false, 0x14, 1 | 1 << 14, false), None, 0)
        .await
        .unwrap();
    let (csts, _) = c
        .admin(property(true, 0x1c, 0, false), None, 0)
        .await
        .unwrap();
    assert_eq!((csts.result >> 2) & 3, 2, "shutdown complete");
}

/// Writes of every size (in the capsule up to 16 KiB, on R2T beyond, up to MDTS) at `depth`
/// at once, then reads each back.
async fn verify_at_depth(depth: usize) {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let c = Arc::new(
        Controller::connect(s.addr, NQN, &host(), &opts())
            .await
            .unwrap(),
    );
    let sizes = [4096u32, 8192, 16384, 65536, 262144];
    let mut tasks = Vec::new();
    for i in 0..depth {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let len = sizes[i % sizes.len()];
            let off = (i as u64 * 262144) % (SIZE as u64 - 262144);
            let off = off & !4095;
            let data = pattern(i as u64, len as usize);
            c.write(off, data.clone(), i % 7 == 0).await.unwrap();
            (off, data)
        }));
    }
    let mut written = Vec::new();
    for t in tasks {
        written.push(t.await.unwrap());
    }
    c.flush().await.unwrap();
    // Ranges may overlap across tasks: the last writer of each byte is not known, so each
    // is checked against a model applied in completion order only where none overlap.
    let mut model = vec![None::<u8>; SIZE];
    let mut clash = vec![false; SIZE];
    for (off, d) in &written {
        for (k, b) in d.iter().enumerate() {
            let at = *off as usize + k;
            if model[at].is_some() {
                clash[at] = true;
            }
            model[at] = Some(*b);
        }
    }
    for (off, d) in &written {
        let got = c.read(*off, d.len() as u32).await.unwrap();
        for (k, b) in got.iter().enumerate() {
            let at = *off as usize + k;
            if !clash[at] {
                assert_eq!(Some(*b), model[at], "byte {at}");
            }
        }
    }
}

#[tokio::test]
async fn data_verifies_at_qd1() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    for (i, len) in [4096u32, 16384, 20480, 131072, 262144]
        .into_iter()
        .enumerate()
    {
        let off = i as u64 * (1 << 20);
        let data = pattern(i as u64 + 100, len as usize);
        c.write(off, data.clone(), false).await.unwrap();
        assert_eq!(c.read(off, len).await.unwrap(), data, "{len} bytes");
    }
}

#[tokio::test]
async fn data_verifies_at_qd128() {
    verify_at_depth(128).await;
}

#[tokio::test]
async fn zeroes_trim_and_ranges() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    c.write(0, pattern(1, 65536), false).await.unwrap();
    c.write_zeroes(4096, 8192, false).await.unwrap();
    c.trim(32768, 16384).await.unwrap();
    let got = c.read(0, 65536).await.unwrap();
    assert!(got[4096..12288].iter().all(|&b| b == 0));
    assert!(got[32768..49152].iter().all(|&b| b == 0));
    assert_eq!(got[..4096], pattern(1, 65536)[..4096]);
    let end = SIZE as u64;
    let e = c.read(end - 4096, 8192).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::LBA_RANGE | status::DNR));
    let e = c.write_zeroes(end, 4096, false).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::LBA_RANGE | status::DNR));
    let e = c.trim(end - 4096, 8192).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::INVALID_FIELD | status::DNR));
    let mut wrong_ns = Sqe::new(io::READ, 0, 2);
    wrong_ns.cdw12 = 0;
    let e = c.io(wrong_ns, None, 4096).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::INVALID_NS | status::DNR));
    // A read whose transfer length disagrees with its block count.
    let e = c
        .io(Sqe::new(io::READ, 0, 1), None, 8192)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HostError::Status(status::SGL_INVALID_DATA_LENGTH | status::DNR)
    );
    let e = c.io(Sqe::new(0x7e, 0, 1), None, 0).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::INVALID_OPCODE | status::DNR));
    // Still serving after every refusal.
    assert_eq!(
        c.read(0, 4096).await.unwrap(),
        pattern(1, 65536).slice(..4096)
    );
}

#[tokio::test]
async fn connect_refusals() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let other = HostId::new("nqn.2014-08.org.nvmexpress:uuid:mallory");
    let e = Controller::connect(s.addr, NQN, &other, &opts())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HostError::Status(status::CONNECT_INVALID_HOST | status::DNR)
    );
    let e = Controller::connect(s.addr, "nqn.2026-12.io.trireme:test:nope", &host(), &opts())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HostError::Status(status::CONNECT_INVALID_PARAMETERS | status::DNR)
    );
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    // An I/O queue beyond what was granted, and one already connected.
    for qid in [3u16, 1] {
        let q = HostQueue::open(s.addr, qid, 8, 8192).await.unwrap();
        let (sqe, d) = connect_command(qid, 8, Duration::from_secs(5), c.cntlid, NQN, &host());
        let e = q.submit(sqe, Some(d), 0).await.unwrap_err();
        assert_eq!(
            e,
            HostError::Status(status::CONNECT_INVALID_PARAMETERS | status::DNR),
            "qid {qid}"
        );
    }
    // Another host cannot join this controller's queues.
    let q = HostQueue::open(s.addr, 2, 8, 8192).await.unwrap();
    let (sqe, d) = connect_command(2, 8, Duration::from_secs(5), c.cntlid, NQN, &other);
    assert!(q.submit(sqe, Some(d), 0).await.is_err());
    // A command before Connect.
    let q = HostQueue::open(s.addr, 0, 8, 8192).await.unwrap();
    let e = q
        .submit(Sqe::new(admin::IDENTIFY, 0, 0), None, 4096)
        .await
        .unwrap_err();
    assert_eq!(e, HostError::Status(status::SEQUENCE_ERROR | status::DNR));
    // A queue size of 0 or over the limit.
    let q = HostQueue::open(s.addr, 0, 8, 8192).await.unwrap();
    let (mut sqe, d) = connect_command(0, 8, Duration::ZERO, 0xffff, NQN, &host());
    sqe.cdw11 = 200;
    let e = q.submit(sqe, Some(d), 0).await.unwrap_err();
    assert_eq!(
        e,
        HostError::Status(status::CONNECT_INVALID_PARAMETERS | status::DNR)
    );
    assert_eq!(c.read(0, 4096).await.unwrap().len(), 4096);
}

/// Raw bytes to a port: what comes back before it closes.
async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out)).await;
    out
}

#[tokio::test]
async fn malformed_pdus_close_only_their_queue() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        digest: 0,
        maxr2t: 0,
    }
    .encode();
    // A capsule whose PDU length claims 1 GiB of in-capsule data.
    let mut bad = ic.to_vec();
    bad.extend_from_slice(&[kind::CAPSULE_CMD, 0, 72, 72]);
    bad.extend_from_slice(&(1u32 << 30).to_le_bytes());
    bad.resize(bad.len() + 64, 0);
    let got = raw_exchange(s.addr, &bad).await;
    assert_eq!(got.len(), 128 + 24, "ICResp, then a termination request");
    assert_eq!(got[128], kind::C2H_TERM);
    // An unknown PDU type; a header length that lies; a digest asked for.
    let mut unknown = ic.to_vec();
    unknown.extend_from_slice(&[0x42, 0, 8, 0, 8, 0, 0, 0]);
    assert_eq!(raw_exchange(s.addr, &unknown).await[128], kind::C2H_TERM);
    let mut lying = ic.to_vec();
    lying.extend_from_slice(&[kind::CAPSULE_CMD, 0, 9, 0, 72, 0, 0, 0]);
    assert_eq!(raw_exchange(s.addr, &lying).await[128], kind::C2H_TERM);
    let digest = IcReq {
        pfv: 0,
        hpda: 0,
        digest: 1,
        maxr2t: 0,
    }
    .encode();
    assert_eq!(raw_exchange(s.addr, &digest).await[0], kind::C2H_TERM);
    // Garbage instead of an ICReq; a silent connection is closed after the handshake's limit.
    assert!(raw_exchange(s.addr, b"GET / HTTP/1.1\r\n\r\n").await.len() <= 24);
    // The good controller never noticed.
    c.write(0, pattern(9, 8192), false).await.unwrap();
    assert_eq!(c.read(0, 8192).await.unwrap(), pattern(9, 8192));
}

/// A controller enabled with two I/O queues granted and none connected: its admin queue and
/// id.
async fn bare_controller(addr: SocketAddr) -> (HostQueue, u16) {
    let admin = HostQueue::open(addr, 0, 8, 8192).await.unwrap();
    let (sqe, d) = connect_command(0, 8, Duration::ZERO, 0xffff, NQN, &host());
    let (cqe, _) = admin.submit(sqe, Some(d), 0).await.unwrap();
    admin
        .submit(property(false, 0x14, 1, false), None, 0)
        .await
        .unwrap();
    let mut nq = Sqe::new(admin::SET_FEATURES, 0, 0);
    nq.cdw10 = 0x07;
    nq.cdw11 = 1 | 1 << 16;
    admin.submit(nq, None, 0).await.unwrap();
    (admin, cqe.result as u16)
}

#[tokio::test]
async fn data_that_never_comes_closes_the_queue() {
    let dev = Arc::new(MemDevice::new(SIZE));
    let (s, _) = serve_dev(dev, 1, ana::OPTIMIZED, Duration::from_millis(500)).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    let (_admin, cntlid) = bare_controller(s.addr).await;
    // A queue that never connected gets no R2T: its write is refused at once.
    let q = HostQueue::open(s.addr, 0, 8, 0).await.unwrap();
    let mut w = Sqe::new(io::WRITE, 0, 1);
    w.cdw12 = 15;
    let e = q.submit(w, Some(pattern(1, 65536)), 0).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::SEQUENCE_ERROR | status::DNR));
    // An I/O queue by hand: a write of 64 KiB on R2T, whose data is never sent.
    let (mut raw, _) = awaiting_data(s.addr, cntlid).await;
    let t0 = std::time::Instant::now();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "closed after the transfer timeout"
    );
    // Empty H2CData PDUs, which would keep the transfer open: a termination request at once.
    let (mut raw, ttag) = awaiting_data(s.addr, cntlid).await;
    let empty = pdu::DataHeader {
        cccid: 5,
        ttag,
        offset: 0,
        len: 0,
    };
    raw.write_all(&empty.encode(kind::H2C_DATA, 0))
        .await
        .unwrap();
    let mut term = [0u8; 1];
    raw.read_exact(&mut term).await.unwrap();
    assert_eq!(term[0], kind::C2H_TERM);
    c.write(0, pattern(3, 4096), false).await.unwrap();
}

/// A raw I/O queue of controller `cntlid` with a 64 KiB write (command id 5) sent and its R2T
/// read: the queue and the R2T's transfer tag.
async fn awaiting_data(addr: SocketAddr, cntlid: u16) -> (tokio::net::TcpStream, u16) {
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(
        &IcReq {
            pfv: 0,
            hpda: 0,
            digest: 0,
            maxr2t: 0,
        }
        .encode(),
    )
    .await
    .unwrap();
    let mut icresp = [0u8; 128];
    raw.read_exact(&mut icresp).await.unwrap();
    let (mut sqe, d) = connect_command(1, 8, Duration::ZERO, cntlid, NQN, &host());
    sqe.sgl_type = crate::cmd::sgl::INCAPSULE;
    sqe.sgl_len = 1024;
    raw.write_all(&pdu::capsule_cmd(&sqe.encode(), 1024))
        .await
        .unwrap();
    raw.write_all(&d).await.unwrap();
    let mut resp = [0u8; 24];
    raw.read_exact(&mut resp).await.unwrap();
    assert_eq!(resp[0], kind::CAPSULE_RESP);
    let mut w = Sqe::new(io::WRITE, 5, 1);
    w.cdw12 = 15;
    w.sgl_len = 65536;
    raw.write_all(&pdu::capsule_cmd(&w.encode(), 0))
        .await
        .unwrap();
    let mut r2t = [0u8; 24];
    raw.read_exact(&mut r2t).await.unwrap();
    assert_eq!(r2t[0], kind::R2T);
    (raw, u16::from_le_bytes([r2t[10], r2t[11]]))
}

#[tokio::test]
async fn a_silent_host_loses_its_controller() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let q = HostQueue::open(s.addr, 0, 8, 8192).await.unwrap();
    let (sqe, d) = connect_command(0, 8, Duration::from_millis(1000), 0xffff, NQN, &host());
    q.submit(sqe, Some(d), 0).await.unwrap();
    assert_eq!(s.port.registry.all().len(), 1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(s.port.registry.all().is_empty(), "keep-alive timeout");
    let e = q
        .submit(Sqe::new(admin::KEEP_ALIVE, 0, 0), None, 0)
        .await
        .unwrap_err();
    assert!(e.is_path_error(), "{e}");
}

#[tokio::test]
async fn ana_inaccessible_fails_io_with_a_path_error_and_a_change_is_announced() {
    let (s, a) = serve(ana::INACCESSIBLE).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    assert_eq!(c.ana_state().await.unwrap(), ana::INACCESSIBLE);
    let e = c.read(0, 4096).await.unwrap_err();
    assert_eq!(e, HostError::Status(status::ANA_INACCESSIBLE));
    assert!(e.is_path_error());
    let (_, groups) = c
        .admin(get_log(log::ANA, 1, 48, 0), None, 48)
        .await
        .unwrap();
    assert_eq!(
        u32::from_le_bytes(groups[20..24].try_into().unwrap()),
        0,
        "groups only: no nsids"
    );
    a.set(ana::OPTIMIZED);
    let ev = tokio::time::timeout(Duration::from_secs(5), c.next_event())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev, 0x2 | 0x03 << 8 | 0x0c << 16, "ANA change notice");
    assert_eq!(c.ana_state().await.unwrap(), ana::OPTIMIZED);
    c.write(0, pattern(4, 4096), false).await.unwrap();
    assert_eq!(s.port.connected().len(), 1);
    assert_eq!(s.port.connected()[0].io_queues, 2);
}

#[tokio::test]
async fn a_grown_namespace_is_announced() {
    let dev = Arc::new(MemDevice::new(SIZE));
    let (s, _) = serve_dev(dev.clone(), 1, ana::OPTIMIZED, Duration::from_secs(30)).await;
    let c = Controller::connect(s.addr, NQN, &host(), &opts())
        .await
        .unwrap();
    dev.0.lock().unwrap().resize(2 * SIZE, 0);
    let ev = tokio::time::timeout(Duration::from_secs(5), c.next_event())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev, 0x2 | 0x04 << 16, "namespace attribute changed");
    assert_eq!(c.refresh_size().await.unwrap(), 2 * SIZE as u64);
    c.write(SIZE as u64, pattern(5, 4096), false).await.unwrap();
}

#[tokio::test]
async fn discovery_lists_what_the_host_may_see() {
    let (s, _) = serve(ana::OPTIMIZED).await;
    let d = Controller::connect(s.addr, ident::DISCOVERY_NQN, &host(), &opts())
        .await
        .unwrap();
    let id = d.identify(1, 0).await.unwrap();
    assert_eq!(id[111], 2, "a discovery controller");
    let (_, page) = d
        .admin(get_log(log::DISCOVERY, 0, 2048, 0), None, 2048)
        .await
        .unwrap();
    assert_eq!(u64::from_le_bytes(page[8..16].try_into().unwrap()), 1);
    let e = &page[1024..2048];
    assert_eq!((e[0], e[2]), (3, 2), "TCP, an NVMe subsystem");
    assert_eq!(&e[256..256 + NQN.len()], NQN.as_bytes());
    let port = s.addr.port().to_string();
    assert_eq!(&e[32..32 + port.len()], port.as_bytes());
    let other = HostId::new("nqn.2014-08.org.nvmexpress:uuid:mallory");
    let d = Controller::connect(s.addr, ident::DISCOVERY_NQN, &other, &opts())
        .await
        .unwrap();
    let (_, page) = d
        .admin(get_log(log::DISCOVERY, 0, 1024, 0), None, 1024)
        .await
        .unwrap();
    assert_eq!(
        u64::from_le_bytes(page[8..16].try_into().unwrap()),
        0,
        "nothing for a stranger"
    );
}

#[tokio::test]
async fn multipath_moves_to_the_standby_without_an_error() {
    let dev = Arc::new(MemDevice::new(SIZE));
    let (a, ana_a) = serve_dev(dev.clone(), 1, ana::OPTIMIZED, Duration::from_secs(30)).await;
    let (b, ana_b) = serve_dev(dev.clone(), 2, ana::INACCESSIBLE, Duration::from_secs(30)).await;
    let mp = Arc::new(
        Multipath::connect(&[a.addr, b.addr], NQN, host(), opts())
            .await
            .unwrap(),
    );
    let ids: Vec<u16> = a
        .port
        .connected()
        .iter()
        .chain(b.port.connected().iter())
        .map(|c| c.cntlid)
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(
        ids[0] >> 12,
        ids[1] >> 12,
        "each port its own range of controller ids"
    );
    let writer = {
        let mp = mp.clone();
        tokio::spawn(async move {
            for i in 0..400u64 {
                let off = (i % 256) * 65536;
                mp.write(off, pattern(i, 16384), false).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Path A's server dies: nothing is optimized for a while, then B takes the volume.
    ana_a.set(ana::INACCESSIBLE);
    let a_port = a.port.clone();
    drop(a);
    assert!(a_port.registry.all().is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    ana_b.set(ana::OPTIMIZED);
    writer.await.unwrap();
    for i in 144..400u64 {
        let off = (i % 256) * 65536;
        assert_eq!(
            mp.read(off, 16384).await.unwrap(),
            pattern(i, 16384),
            "write {i}"
        );
    }
    assert_eq!(b.port.connected().len(), 1);
}
