//! Protocol tests with a raw client over an in-process pipe. Interop with real clients (qemu,
//! nbdinfo, nbdcopy, fio) is tested against a running cluster in the CLI's integration tests.

use super::*;
use crate::codec::*;
use crate::consts::*;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use trireme_blockdev::{Caps, Filter, Filtered};

use crate::testing::{mem, MemBackend as Mem};

fn server() -> DuplexStream {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut ex = Exports::new();
    ex.add("vol0", "test volume", Arc::new(mem(1 << 20)));
    tokio::spawn(serve_connection(b, Arc::new(ex)));
    a
}

async fn send_opt(c: &mut DuplexStream, opt: u32, data: &[u8]) {
    c.write_u64(IHAVEOPT).await.unwrap();
    c.write_u32(opt).await.unwrap();
    c.write_u32(data.len() as u32).await.unwrap();
    c.write_all(data).await.unwrap();
}

/// Reads one option reply: (option, reply type, data).
async fn read_opt(c: &mut DuplexStream) -> (u32, u32, Vec<u8>) {
    assert_eq!(c.read_u64().await.unwrap(), REPLY_MAGIC);
    let opt = c.read_u32().await.unwrap();
    let kind = c.read_u32().await.unwrap();
    let len = c.read_u32().await.unwrap();
    let mut d = vec![0; len as usize];
    c.read_exact(&mut d).await.unwrap();
    (opt, kind, d)
}

async fn greet(c: &mut DuplexStream) {
    assert_eq!(c.read_u64().await.unwrap(), NBDMAGIC);
    assert_eq!(c.read_u64().await.unwrap(), IHAVEOPT);
    assert_eq!(
        c.read_u16().await.unwrap(),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    c.write_u32(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES)
        .await
        .unwrap();
}

fn go_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Handshake with structured replies and base:allocation, then GO. Returns the export flags.
async fn connect() -> (DuplexStream, u16) {
    let mut c = server();
    greet(&mut c).await;
    send_opt(&mut c, OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(read_opt(&mut c).await.1, REP_ACK);
    let mut m = go_payload("vol0", &[]);
    m.truncate(8); // name length + name
    m.extend_from_slice(&1u32.to_be_bytes());
    m.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
    m.extend_from_slice(BASE_ALLOCATION.as_bytes());
    send_opt(&mut c, OPT_SET_META_CONTEXT, &m).await;
    let (_, kind, d) = read_opt(&mut c).await;
    assert_eq!(kind, REP_META_CONTEXT);
    assert_eq!(&d[4..], BASE_ALLOCATION.as_bytes());
    assert_eq!(read_opt(&mut c).await.1, REP_ACK);
    send_opt(&mut c, OPT_GO, &go_payload("vol0", &[INFO_BLOCK_SIZE])).await;
    let (_, kind, d) = read_opt(&mut c).await;
    assert_eq!(kind, REP_INFO);
    let size = u64::from_be_bytes(d[2..10].try_into().unwrap());
    assert_eq!(size, 1 << 20);
    let flags = u16::from_be_bytes([d[10], d[11]]);
    let (_, kind, d) = read_opt(&mut c).await;
    assert_eq!(
        (kind, u16::from_be_bytes([d[0], d[1]])),
        (REP_INFO, INFO_BLOCK_SIZE)
    );
    assert_eq!(read_opt(&mut c).await.1, REP_ACK);
    (c, flags)
}

async fn request(
    c: &mut DuplexStream,
    command: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u32,
) {
    let r = Request {
        flags,
        command,
        cookie,
        offset,
        length,
    };
    c.write_all(&encode_request(&r)).await.unwrap();
}

/// Reads a simple reply: (error, cookie).
async fn simple(c: &mut DuplexStream) -> (u32, u64) {
    assert_eq!(c.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
    (c.read_u32().await.unwrap(), c.read_u64().await.unwrap())
}

/// Reads a structured chunk: (flags, type, cookie, payload).
async fn chunk(c: &mut DuplexStream) -> (u16, u16, u64, Vec<u8>) {
    assert_eq!(c.read_u32().await.unwrap(), STRUCTURED_REPLY_MAGIC);
    let flags = c.read_u16().await.unwrap();
    let kind = c.read_u16().await.unwrap();
    let cookie = c.read_u64().await.unwrap();
    let len = c.read_u32().await.unwrap();
    let mut d = vec![0; len as usize];
    c.read_exact(&mut d).await.unwrap();
    (flags, kind, cookie, d)
}

#[tokio::test]
async fn write_read_and_block_status() {
    let (mut c, flags) = connect().await;
    assert_ne!(flags & TF_CAN_MULTI_CONN, 0);
    assert_ne!(flags & TF_SEND_DF, 0);
    request(&mut c, CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 5).await;
    c.write_all(b"hello").await.unwrap();
    assert_eq!(simple(&mut c).await, (0, 1));
    request(&mut c, CMD_READ, 0, 2, 4096, 5).await;
    let (f, kind, cookie, d) = chunk(&mut c).await;
    assert_eq!(
        (f, kind, cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 2)
    );
    assert_eq!(&d[8..], b"hello");
    request(&mut c, CMD_BLOCK_STATUS, 0, 3, 0, 8192).await;
    let (_, kind, _, d) = chunk(&mut c).await;
    assert_eq!(kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()),
        BASE_ALLOCATION_ID
    );
    request(&mut c, CMD_DISC, 0, 4, 0, 0).await;
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "disconnect closes cleanly");
}

#[tokio::test]
async fn bad_requests_get_errors_and_the_connection_keeps_serving() {
    use std::sync::atomic::Ordering::Relaxed;
    let counts = || {
        let r = crate::refusals();
        (
            r.oversize.load(Relaxed),
            r.out_of_range.load(Relaxed),
            r.invalid.load(Relaxed),
        )
    };
    let before = counts();
    let (mut c, _) = connect().await;
    // Out of range read: structured error chunk with EINVAL.
    request(&mut c, CMD_READ, 0, 10, (1 << 20) - 2, 5).await;
    let (_, kind, cookie, d) = chunk(&mut c).await;
    assert_eq!((kind, cookie), (REPLY_TYPE_ERROR, 10));
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), EINVAL);
    // Offset overflow on a write: ENOSPC, payload consumed, stream stays in step.
    request(&mut c, CMD_WRITE, 0, 11, u64::MAX - 1, 3).await;
    c.write_all(b"abc").await.unwrap();
    assert_eq!(simple(&mut c).await, (ENOSPC, 11));
    // Unknown command and unknown flags: EINVAL.
    request(&mut c, 77, 0, 12, 0, 0).await;
    assert_eq!(simple(&mut c).await, (EINVAL, 12));
    request(&mut c, CMD_FLUSH, 0x8000, 13, 0, 0).await;
    assert_eq!(simple(&mut c).await, (EINVAL, 13));
    // Oversized read: EINVAL, no allocation.
    request(&mut c, CMD_READ, 0, 14, 0, u32::MAX).await;
    assert_eq!(chunk(&mut c).await.1, REPLY_TYPE_ERROR);
    // Each refusal is counted (other tests run beside this one: at least these). The
    // oversized read is past this 1 MiB export's end too, and counted so.
    let after = counts();
    assert!(after.1 >= before.1 + 3, "{before:?} {after:?}");
    assert!(after.2 >= before.2 + 2, "{before:?} {after:?}");
    // Still serving.
    request(&mut c, CMD_FLUSH, 0, 15, 0, 0).await;
    assert_eq!(simple(&mut c).await, (0, 15));
    // Bad magic: the server closes.
    c.write_all(&[0xAB; 28]).await.unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
}

#[tokio::test]
async fn options_unknown_export_list_and_garbage() {
    let mut c = server();
    greet(&mut c).await;
    send_opt(&mut c, 99, b"xyz").await;
    assert_eq!(read_opt(&mut c).await.1, REP_ERR_UNSUP);
    send_opt(&mut c, OPT_GO, &go_payload("nope", &[])).await;
    assert_eq!(read_opt(&mut c).await.1, REP_ERR_UNKNOWN);
    send_opt(&mut c, OPT_GO, &[0, 0, 0, 50, 1]).await;
    assert_eq!(read_opt(&mut c).await.1, REP_ERR_INVALID);
    send_opt(&mut c, OPT_SET_META_CONTEXT, &[]).await;
    assert_eq!(
        read_opt(&mut c).await.1,
        REP_ERR_INVALID,
        "meta context needs structured replies"
    );
    send_opt(&mut c, OPT_LIST, &[]).await;
    let (_, kind, d) = read_opt(&mut c).await;
    assert_eq!((kind, &d[4..]), (REP_SERVER, &b"vol0"[..]));
    assert_eq!(read_opt(&mut c).await.1, REP_ACK);
    send_opt(&mut c, OPT_STARTTLS, &[]).await;
    assert_eq!(read_opt(&mut c).await.1, REP_ERR_UNSUP);
    send_opt(&mut c, OPT_INFO, &go_payload("", &[INFO_NAME])).await;
    assert_eq!(read_opt(&mut c).await.1, REP_INFO);
    let (_, _, d) = read_opt(&mut c).await;
    assert_eq!(&d[2..], b"vol0", "the empty name is the default export");
    assert_eq!(read_opt(&mut c).await.1, REP_ACK);
    // A transmission request before the handshake ends: the server closes.
    request(&mut c, CMD_READ, 0, 1, 0, 512).await;
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn huge_option_is_refused_without_reading_it_all() {
    let mut c = server();
    greet(&mut c).await;
    c.write_u64(IHAVEOPT).await.unwrap();
    c.write_u32(OPT_GO).await.unwrap();
    c.write_u32(u32::MAX).await.unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "closed without a reply");
}

mod props {
    use super::*;
    use proptest::prelude::*;
    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_go(&b);
            let _ = decode_meta(&b);
            if b.len() >= REQUEST_LEN {
                let _ = decode_request(b[..REQUEST_LEN].try_into().unwrap());
            }
        }

        #[test]
        fn request_round_trips(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) {
            let r = Request { flags, command, cookie, offset, length };
            prop_assert_eq!(decode_request(&encode_request(&r)).unwrap(), r);
        }

        /// A whole session with arbitrary client bytes (after a valid greeting and GO, half
        /// the time, so transmission is reached too) ends once the client hangs up: no panic,
        /// no hang. `fuzz/fuzz_targets/nbd_session.rs` searches the same deeper.
        #[test]
        fn any_client_bytes_end_the_session(
            go: bool,
            b in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut input = Vec::new();
            if go {
                input.extend_from_slice(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes());
                let d = go_payload("vol0", &[]);
                input.extend_from_slice(&IHAVEOPT.to_be_bytes());
                input.extend_from_slice(&OPT_GO.to_be_bytes());
                input.extend_from_slice(&(d.len() as u32).to_be_bytes());
                input.extend_from_slice(&d);
            }
            input.extend_from_slice(&b);
            let ended = crate::testing::session_ends(input);
            prop_assert!(ended, "the session panicked or did not end after the client hung up");
        }

        /// The client against arbitrary server bytes — after a valid greeting and an export
        /// (size, then ACK) half the time, so its reply reader is reached too: it ends, with
        /// results or errors. `fuzz/fuzz_targets/nbd_client_replies.rs` searches deeper.
        #[test]
        fn any_server_bytes_end_the_client(
            greet: bool,
            b in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut input = Vec::new();
            if greet {
                input.extend_from_slice(&NBDMAGIC.to_be_bytes());
                input.extend_from_slice(&IHAVEOPT.to_be_bytes());
                input.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
                for (kind, d) in [
                    (REP_INFO, [&INFO_EXPORT.to_be_bytes()[..], &(1u64 << 20).to_be_bytes(), &1u16.to_be_bytes()].concat()),
                    (REP_ACK, vec![]),
                ] {
                    input.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
                    input.extend_from_slice(&OPT_GO.to_be_bytes());
                    input.extend_from_slice(&kind.to_be_bytes());
                    input.extend_from_slice(&(d.len() as u32).to_be_bytes());
                    input.extend_from_slice(&d);
                }
            }
            input.extend_from_slice(&b);
            prop_assert!(crate::testing::client_ends(input), "the client panicked or hung");
        }
    }
}

/// Zeros, counting the reads it served.
struct Zeros(std::sync::atomic::AtomicUsize);

impl BlockDevice for Zeros {
    fn size(&self) -> u64 {
        64 << 20
    }
    fn caps(&self) -> Caps {
        Caps {
            shared_flush: true,
            ..Caps::default()
        }
    }
    async fn read(&self, _offset: u64, len: u32) -> Result<Bytes, DevError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Bytes::from(vec![0u8; len as usize]))
    }
    async fn write(&self, _: u64, _: Bytes, _: bool) -> Result<(), DevError> {
        Ok(())
    }
    async fn flush(&self) -> Result<(), DevError> {
        Ok(())
    }
    async fn write_zeroes(&self, _: u64, _: u32, _: bool, _: bool) -> Result<(), DevError> {
        Ok(())
    }
    async fn block_status(&self, _: u64, len: u32, _: Want) -> Result<Vec<Extent>, DevError> {
        Ok(vec![Extent {
            length: u64::from(len),
            flags: 0,
        }])
    }
}

/// A client that sends 100 reads of 32 MiB and reads no reply stalls its own connection: the
/// server holds at most the in-flight budget (128 MiB) of replies, then reads no more requests
/// until replies are taken. Then every reply arrives.
#[tokio::test]
async fn a_client_that_stops_reading_replies_pins_only_the_budget() {
    let (mut c, b) = tokio::io::duplex(64 << 10);
    let zeros = Arc::new(Zeros(Default::default()));
    let mut ex = Exports::new();
    ex.add("vol0", "zeros", zeros.clone());
    tokio::spawn(serve_connection(b, Arc::new(ex)));
    greet(&mut c).await;
    send_opt(&mut c, OPT_GO, &go_payload("vol0", &[])).await;
    loop {
        if read_opt(&mut c).await.1 == REP_ACK {
            break;
        }
    }
    const N: u64 = 100;
    for i in 0..N {
        request(&mut c, CMD_READ, 0, i, 0, MAX_REQUEST).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let served = zeros.0.load(std::sync::atomic::Ordering::SeqCst);
    // 2048 units of 64 KiB; a 32 MiB read takes 513: three at a time.
    assert!(
        served <= 3,
        "{served} reads of 32 MiB served while none was read"
    );
    let mut buf = vec![0u8; MAX_REQUEST as usize];
    for i in 0..N {
        assert_eq!(simple(&mut c).await, (0, i));
        c.read_exact(&mut buf).await.unwrap();
    }
    assert_eq!(
        zeros.0.load(std::sync::atomic::Ordering::SeqCst),
        N as usize
    );
}

/// A backend whose flush panics: a bug in one request's handler.
struct PanicsOnFlush(Mem);

impl Filter for PanicsOnFlush {
    type Next = Mem;
    fn next(&self) -> &Mem {
        &self.0
    }
    async fn flush(&self) -> Result<(), DevError> {
        panic!("a bug in the flush");
    }
}

/// A request whose handler panics is answered EIO, and the connection keeps serving: the
/// client never waits for a reply that will not come.
#[tokio::test]
async fn a_handler_that_panics_answers_eio() {
    let (mut c, b) = tokio::io::duplex(1 << 20);
    let mut ex = Exports::new();
    ex.add(
        "vol0",
        "test volume",
        Arc::new(Filtered(PanicsOnFlush(mem(1 << 20)))),
    );
    tokio::spawn(serve_connection(b, Arc::new(ex)));
    greet(&mut c).await;
    send_opt(&mut c, OPT_GO, &go_payload("vol0", &[])).await;
    while read_opt(&mut c).await.1 != REP_ACK {}
    request(&mut c, CMD_FLUSH, 0, 1, 0, 0).await;
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), simple(&mut c)).await;
    assert_eq!(r.expect("a reply, not a hang"), (EIO, 1));
    request(&mut c, CMD_WRITE, 0, 2, 0, 3).await;
    c.write_all(b"abc").await.unwrap();
    assert_eq!(simple(&mut c).await, (0, 2));
}

#[test]
fn meta_contexts_are_set_by_exact_name_and_listed_by_namespace() {
    use crate::options::choose_contexts;
    let offered: Vec<String> = [
        "base:allocation",
        "qemu:dirty-bitmap:a",
        "qemu:dirty-bitmap:b",
    ]
    .map(String::from)
    .to_vec();
    let q = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(choose_contexts(&offered, &[], true), offered);
    assert!(choose_contexts(&offered, &[], false).is_empty());
    assert_eq!(
        choose_contexts(&offered, &q(&["qemu:dirty-bitmap:"]), true),
        offered[1..]
    );
    assert!(choose_contexts(&offered, &q(&["qemu:dirty-bitmap:"]), false).is_empty());
    assert_eq!(
        choose_contexts(&offered, &q(&["qemu:dirty-bitmap:b", "nope:x"]), false),
        offered[2..]
    );
    assert_eq!(
        choose_contexts(
            &offered,
            &q(&["base:allocation", "qemu:dirty-bitmap:a"]),
            false
        ),
        offered[..2]
    );
    assert!(choose_contexts(&offered, &q(&["qemu:dirty-bitmap:c"]), false).is_empty());
}

/// Two contexts set: a block status gets a chunk for each, with the ids the server gave, the
/// last one marked done; a context the export does not offer is not set.
#[tokio::test]
async fn block_status_answers_every_context_set() {
    let mut c = server();
    greet(&mut c).await;
    send_opt(&mut c, OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(read_opt(&mut c).await.1, REP_ACK);
    let mut m = go_payload("vol0", &[]);
    m.truncate(8);
    let queries = [
        BASE_ALLOCATION,
        "qemu:dirty-bitmap:a",
        "qemu:dirty-bitmap:zz",
    ];
    m.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        m.extend_from_slice(&(q.len() as u32).to_be_bytes());
        m.extend_from_slice(q.as_bytes());
    }
    send_opt(&mut c, OPT_SET_META_CONTEXT, &m).await;
    let mut ids = Vec::new();
    loop {
        let (_, kind, d) = read_opt(&mut c).await;
        if kind == REP_ACK {
            break;
        }
        assert_eq!(kind, REP_META_CONTEXT);
        let id = u32::from_be_bytes(d[..4].try_into().unwrap());
        ids.push((id, String::from_utf8(d[4..].to_vec()).unwrap()));
    }
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], (BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string()));
    assert_eq!(ids[1].1, "qemu:dirty-bitmap:a");
    assert_ne!(ids[1].0, BASE_ALLOCATION_ID);
    send_opt(&mut c, OPT_GO, &go_payload("vol0", &[])).await;
    while read_opt(&mut c).await.1 != REP_ACK {}
    request(&mut c, CMD_BLOCK_STATUS, 0, 9, 0, 8192).await;
    let (f1, k1, cookie, d1) = chunk(&mut c).await;
    assert_eq!(
        (f1 & REPLY_FLAG_DONE, k1, cookie),
        (0, REPLY_TYPE_BLOCK_STATUS, 9)
    );
    assert_eq!(u32::from_be_bytes(d1[..4].try_into().unwrap()), ids[0].0);
    let (f2, k2, _, d2) = chunk(&mut c).await;
    assert_eq!(
        (f2 & REPLY_FLAG_DONE, k2),
        (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS)
    );
    assert_eq!(u32::from_be_bytes(d2[..4].try_into().unwrap()), ids[1].0);
    let ext: Vec<(u32, u32)> = d2[4..]
        .chunks(8)
        .map(|e| {
            (
                u32::from_be_bytes(e[..4].try_into().unwrap()),
                u32::from_be_bytes(e[4..].try_into().unwrap()),
            )
        })
        .collect();
    assert_eq!(ext, vec![(4096, 1), (4096, 0)]);
    // With REQ_ONE: one extent per context, a prefix of the range.
    request(&mut c, CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 10, 0, 8192).await;
    let _ = chunk(&mut c).await;
    let (_, _, _, d) = chunk(&mut c).await;
    assert_eq!(&d[4..], &[0, 0, 16, 0, 0, 0, 0, 1][..], "4096 bytes, dirty");
}

/// A backend's extents as a reply carries them: empty ones dropped, one with `REQ_ONE`, none
/// past the request's length (a prefix is what a backend may answer: the length is a hint).
#[test]
fn replies_carry_a_prefix_of_the_range() {
    let e = |length: u64, flags: u32| crate::Extent { length, flags };
    let ext = vec![e(0, 1), e(4096, 0), e(8192, 3), e(1 << 20, 0)];
    assert_eq!(
        crate::transmission::prefix_of(ext.clone(), 1 << 20, true),
        vec![e(4096, 0)]
    );
    assert_eq!(
        crate::transmission::prefix_of(ext.clone(), 16384, false),
        vec![e(4096, 0), e(8192, 3), e(4096, 0)]
    );
    assert_eq!(
        crate::transmission::prefix_of(ext, u32::MAX, false).len(),
        3
    );
}
