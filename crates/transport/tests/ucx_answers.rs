//! A UCX answer counts only if it comes from the node its call went to and carries the secret
//! that node gave the call's link. A server of this process serves a handler that holds every
//! read for a while; meanwhile a foreign worker (another UCX context, as another process
//! would have) answers the very request ids the server saw, with and without a guessed
//! secret, eagerly and by a 32 MiB rendezvous. The call gets the server's answer and nothing
//! else, and the foreign rendezvous are never fetched. UCX runs over shared memory and its tcp
//! lanes on loopback here ([`TLS`]: what `TRIREME_UCX_TLS=^cma` asks for; trireme's default
//! leaves tcp out); there is no RDMA device.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use trireme_proto::{Header, Op, Status};
use trireme_transport::ucx::{Hub, AM_RESPONSE, SECRET_LEN};
use trireme_transport::{Connection, Frame, Handler};

/// Shared memory and tcp lanes, both ends: the answers' checks must hold on either.
const TLS: &str = "^cma";

/// Answers reads with 4 KiB of 0x11 after a pause, recording each read's request id first.
struct Slow {
    seen: Mutex<Vec<u64>>,
}

impl Handler for Slow {
    async fn handle(self: Arc<Self>, f: Frame) -> Frame {
        let h = f.header;
        match h.op {
            Op::UcxAddress => Frame::new(
                h.response(Status::Ok),
                Bytes::copy_from_slice(Hub::get().unwrap().address()),
            ),
            Op::Read => {
                self.seen.lock().unwrap().push(h.request_id);
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Frame::new(h.response(Status::Ok), Bytes::from(vec![0x11; 4096]))
            }
            _ => Frame::new(h.response(Status::Ok), Bytes::new()),
        }
    }
}

/// Sends forged answers to `target` for each id in `ids` until `stop`: per id an eager one
/// without a secret, one with a guessed secret, and a 32 MiB rendezvous with a guessed one.
fn forger(target: Vec<u8>, ids: Arc<Mutex<Vec<u64>>>, stop: Arc<AtomicBool>) -> u64 {
    let ctx = trireme_ucx::Context::new(&trireme_ucx::Config {
        tls: Some(TLS.into()),
        net_devices: Some("lo".into()),
        ..Default::default()
    })
    .unwrap();
    let w = trireme_ucx::Worker::new(&ctx).unwrap();
    let ep = w.connect(&target).unwrap();
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        let now: Vec<u64> = ids.lock().unwrap().clone();
        for id in now {
            let h = Header {
                length: 4096,
                ..Header::request(Op::Read, id)
            };
            for (secret, payload) in [
                (None, vec![0xee; 4096]),
                (Some([0x5a; SECRET_LEN]), vec![0xee; 4096]),
                (Some([0x5a; SECRET_LEN]), vec![0xdd; 32 << 20]),
            ] {
                let mut hdr = h.response(Status::Ok).encode(&payload).to_vec();
                if let Some(s) = secret {
                    hdr.extend_from_slice(&s);
                }
                ep.am_send(
                    AM_RESPONSE,
                    hdr,
                    trireme_ucx::Payload::Vec(payload),
                    true,
                    Box::new(|_| {}),
                );
                sent += 1;
            }
        }
        for _ in 0..100 {
            w.progress();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    ep.close(true);
    for _ in 0..1000 {
        w.progress();
    }
    sent
}

#[test]
fn answers_from_another_worker_are_dropped_and_the_real_one_is_taken() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        trireme_transport::ucx::configure(trireme_transport::ucx::Config {
            tls: Some(TLS.into()),
            net_devices: Some("lo".into()),
            ..Default::default()
        });
        let hub = Hub::get().unwrap();
        let slow = Arc::new(Slow {
            seen: Mutex::default(),
        });
        hub.serve(slow.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(trireme_transport::tcp::serve(listener, slow.clone()));
        let tcp = trireme_transport::tcp::TcpConnection::connect(&addr, 1)
            .await
            .unwrap();
        let conn =
            trireme_transport::ucx::negotiate(tcp, trireme_transport::ucx::Fallback::Refused)
                .await
                .unwrap();
        assert_eq!(conn.info().transport, "ucx");

        let ids = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (i, s, target) = (ids.clone(), stop.clone(), hub.address().to_vec());
        let forging = std::thread::spawn(move || forger(target, i, s));
        // Four reads at once; the forger answers each id the server has seen, all the while
        // the server holds them.
        let feed = {
            let (slow, ids) = (slow.clone(), ids.clone());
            tokio::spawn(async move {
                loop {
                    *ids.lock().unwrap() = slow.seen.lock().unwrap().clone();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        let read = || conn.call(Header::request(Op::Read, 0), Bytes::new());
        let (a, b, c, d) = tokio::join!(read(), read(), read(), read());
        let answers = [a, b, c, d];
        feed.abort();
        stop.store(true, Ordering::Relaxed);
        let sent = tokio::task::spawn_blocking(move || forging.join().unwrap())
            .await
            .unwrap();
        assert!(sent >= 4 * 3, "the forger sent {sent}");
        for a in answers {
            let f = a.expect("the read is answered");
            assert_eq!(f.header.status, Status::Ok);
            assert!(
                f.payload.len() == 4096 && f.payload.iter().all(|&b| b == 0x11),
                "a forged answer was taken: {} bytes starting {:?}",
                f.payload.len(),
                &f.payload[..f.payload.len().min(8)]
            );
        }
        // The link is still on UCX: the forgeries did not make it fall back.
        assert_eq!(conn.info().transport, "ucx", "{:?}", conn.info());
    });
}
