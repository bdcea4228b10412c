//! Two workers of this process talking over real UCX transports: shared memory (posix/sysv
//! with CMA for rendezvous) and UCX's own tcp lanes on the loopback device. There is no RDMA
//! device on the machines these run on.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::{Duration, Instant};

use super::*;

const REQ: u32 = 1;
const RESP: u32 = 2;

fn pair(cfg: &Config) -> (Arc<Worker>, Arc<Worker>) {
    let ctx = Context::new(cfg).expect("context");
    (Worker::new(&ctx).unwrap(), Worker::new(&ctx).unwrap())
}

/// Progresses both workers until `done` or a deadline.
fn drive(a: &Worker, b: &Worker, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        a.progress();
        b.progress();
        assert!(t.elapsed() < Duration::from_secs(10), "no progress in 10s");
    }
}

/// B answers every request with its header reversed and the payload's length and sum; A sends
/// a small and a large (rendezvous) payload and checks both answers.
fn round_trips(cfg: Config) -> String {
    let (a, b) = pair(&cfg);
    b.set_am_handler(REQ, |w, hdr, data, reply| {
        let reply = reply.expect("the sender asked for a reply endpoint");
        let mut h = hdr.to_vec();
        h.reverse();
        let answer = move |w: &Worker, bytes: &[u8]| {
            let sum: u64 = bytes.iter().map(|&x| u64::from(x)).sum();
            let mut body = (bytes.len() as u64).to_le_bytes().to_vec();
            body.extend_from_slice(&sum.to_le_bytes());
            let _ = w.reply(reply, RESP, h, Payload::Vec(body), Box::new(|r| r.unwrap()));
        };
        match data {
            AmData::Eager(bytes) => {
                answer(w, bytes);
                Taken::Done
            }
            AmData::Rndv(r) => {
                // The payload is fetched into our buffer; answer once it is here. The worker
                // pointer stays valid: the callback runs inside this worker's progress.
                let wp = w as *const Worker as usize;
                w.recv_rndv(
                    r,
                    None,
                    Box::new(move |got| {
                        // SAFETY: completion callbacks run inside `progress` of the worker
                        // that started the receive, which is alive and on this thread.
                        let w = unsafe { &*(wp as *const Worker) };
                        answer(w, got.unwrap().as_ref())
                    }),
                );
                Taken::Done
            }
        }
    })
    .unwrap();
    // (header, payload length, payload byte sum) of each answer.
    type Answers = Arc<Mutex<Vec<(Vec<u8>, u64, u64)>>>;
    let answers: Answers = Arc::default();
    let ans = answers.clone();
    let from: Arc<Mutex<Vec<Option<usize>>>> = Arc::default();
    let f = from.clone();
    a.set_am_handler(RESP, move |_, hdr, data, reply| {
        f.lock().unwrap().push(reply.map(|r| r.id()));
        let AmData::Eager(b) = data else {
            panic!("a 16-byte answer came by rendezvous")
        };
        let len = u64::from_le_bytes(b[..8].try_into().unwrap());
        let sum = u64::from_le_bytes(b[8..16].try_into().unwrap());
        ans.lock().unwrap().push((hdr.to_vec(), len, sum));
        Taken::Done
    })
    .unwrap();
    let ep = a.connect(&b.address().unwrap()).unwrap();
    let big: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    let big_sum: u64 = big.iter().map(|&x| u64::from(x)).sum();
    let sent = Arc::new(AtomicUsize::new(0));
    for (hdr, payload) in [(vec![1u8, 2, 3], vec![7u8; 100]), (vec![9u8, 8], big)] {
        let s = sent.clone();
        ep.am_send(
            REQ,
            hdr,
            Payload::Vec(payload),
            true,
            Box::new(move |r| {
                r.unwrap();
                s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        );
    }
    drive(&a, &b, || {
        answers.lock().unwrap().len() == 2 && sent.load(std::sync::atomic::Ordering::SeqCst) == 2
    });
    let mut got = answers.lock().unwrap().clone();
    got.sort();
    assert_eq!(got[0], (vec![3, 2, 1], 100, 700), "small payload");
    assert_eq!(got[1], (vec![8, 9], 4 << 20, big_sum), "large payload");
    assert_eq!(
        *from.lock().unwrap(),
        vec![Some(ep.id()); 2],
        "answers name the endpoint their requests used"
    );
    let lanes = ep.lanes();
    ep.close(false);
    lane_summary(&lanes)
}

#[test]
fn active_messages_over_shared_memory() {
    let lanes = round_trips(Config {
        tls: Some("sm,self".into()),
        net_devices: None,
        ..Default::default()
    });
    assert!(
        lanes.starts_with("posix/memory") || lanes.starts_with("sysv/memory"),
        "{lanes}"
    );
}

#[test]
fn active_messages_over_ucx_tcp_on_loopback() {
    let lanes = round_trips(Config {
        tls: Some("tcp".into()),
        net_devices: Some("lo".into()),
        ..Default::default()
    });
    assert_eq!(lanes, "tcp/lo");
}

#[test]
fn bad_configuration_is_an_error_not_a_crash() {
    let e = Context::new(&Config {
        tls: Some("no-such-transport-at-all".into()),
        net_devices: None,
        ..Default::default()
    })
    .and_then(|c| {
        let (a, b) = (Worker::new(&c)?, Worker::new(&c)?);
        a.connect(&b.address()?).map(|_| ())
    });
    assert!(
        e.is_err(),
        "a context with no usable transport must fail somewhere"
    );
    let e = Context::new(&Config {
        tls: Some("sm\0".into()),
        net_devices: None,
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.message.contains("NUL"), "{e}");
}

#[test]
fn waiting_sleeps_until_a_message_arrives() {
    let (a, b) = pair(&Config {
        tls: Some("sm,self".into()),
        net_devices: None,
        ..Default::default()
    });
    let got = Arc::new(AtomicBool::new(false));
    let g = got.clone();
    b.set_am_handler(REQ, move |_, _, _, _| {
        g.store(true, std::sync::atomic::Ordering::SeqCst);
        Taken::Done
    })
    .unwrap();
    // Nothing to do: the wait returns after its timeout, having slept.
    let t = Instant::now();
    assert!(!b.wait(None, Duration::from_millis(100)).unwrap());
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "{:?}",
        t.elapsed()
    );
    let ep = a.connect(&b.address().unwrap()).unwrap();
    ep.am_send(
        REQ,
        vec![],
        Payload::Vec(vec![1]),
        false,
        Box::new(|r| r.unwrap()),
    );
    let t = Instant::now();
    while !got.load(std::sync::atomic::Ordering::SeqCst) {
        a.progress();
        b.wait(None, Duration::from_millis(20)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    ep.close(false);
}

/// A rendezvous payload that fits a chunk of the registered pool lands in it; one that does
/// not (or when no chunk is free) gets a buffer of its own; chunks go back when dropped.
#[test]
fn rendezvous_lands_in_the_registered_pool() {
    let ctx = Context::new(&Config {
        tls: Some("sm,self".into()),
        net_devices: None,
        ..Default::default()
    })
    .unwrap();
    let (a, b) = (Worker::new(&ctx).unwrap(), Worker::new(&ctx).unwrap());
    let pool = MemPool::new(&ctx, 1 << 20, 1).unwrap();
    // (came in the pool, length, byte sum) of each payload, kept alive until checked.
    type Got = Arc<Mutex<Vec<(bool, usize, u64, Received)>>>;
    let got: Got = Arc::default();
    let (g, p) = (got.clone(), pool.clone());
    b.set_am_handler(REQ, move |w, _, data, _| {
        let AmData::Rndv(r) = data else {
            panic!("a payload of 256 KiB or more came eagerly")
        };
        let g = g.clone();
        w.recv_rndv(
            r,
            Some(&p),
            Box::new(move |x| {
                let x = x.unwrap();
                let sum = x.as_ref().iter().map(|&v| u64::from(v)).sum();
                let pooled = matches!(x, Received::Pool(_));
                g.lock().unwrap().push((pooled, x.as_ref().len(), sum, x));
            }),
        );
        Taken::Done
    })
    .unwrap();
    let ep = a.connect(&b.address().unwrap()).unwrap();
    let payload = |n: usize| (0..n).map(|i| (i % 253) as u8).collect::<Vec<u8>>();
    let sum = |n: usize| payload(n).iter().map(|&v| u64::from(v)).sum::<u64>();
    // One that fits the chunk, one too large, then one that finds the only chunk taken.
    for n in [512 << 10, 3 << 20, 256 << 10] {
        let sent = Arc::new(AtomicBool::new(false));
        let s = sent.clone();
        ep.am_send(
            REQ,
            vec![],
            Payload::Vec(payload(n)),
            false,
            Box::new(move |r| {
                r.unwrap();
                s.store(true, std::sync::atomic::Ordering::SeqCst)
            }),
        );
        let want = got.lock().unwrap().len() + 1;
        drive(&a, &b, || {
            got.lock().unwrap().len() == want && sent.load(std::sync::atomic::Ordering::SeqCst)
        });
    }
    {
        let g = got.lock().unwrap();
        let seen: Vec<(bool, usize, u64)> = g.iter().map(|x| (x.0, x.1, x.2)).collect();
        assert_eq!(
            seen,
            vec![
                (true, 512 << 10, sum(512 << 10)),
                (false, 3 << 20, sum(3 << 20)),
                (false, 256 << 10, sum(256 << 10)),
            ]
        );
    }
    assert_eq!(pool.free_chunks(), 0);
    got.lock().unwrap().clear();
    assert_eq!(
        pool.free_chunks(),
        1,
        "a dropped chunk goes back to the pool"
    );
    ep.close(false);
}

#[test]
fn lane_summaries_name_transport_and_device() {
    let info =
        "#\n# UCP endpoint\n#                 lane[0]:  1:sysv/memory.0 md[1]  -> md[1]/sysv am\n\
                #                 lane[1]:  3:cma/memory.0 md[3]   -> md[3]/cma rma_bw#0\n\
                #                 am_send: 0..<egr/short>..93\n";
    assert_eq!(lane_summary(info), "sysv/memory+cma/memory");
    assert_eq!(
        lane_summary("#  lane[0]:  2:rc_mlx5/mlx5_0:1.0 md[2] -> am"),
        "rc_mlx5/mlx5_0:1"
    );
    assert_eq!(lane_summary("nothing here"), "?");
}

/// A receiver that does not progress fills its shared-memory FIFO: the sends past its size
/// stay pending and are counted; once it drains, they finish and the count is back to zero.
/// Sends that finish inside their call are never counted.
#[test]
fn sends_left_pending_by_a_full_fifo_are_counted() {
    let fifo = 16;
    let (a, b) = pair(&Config {
        tls: Some("sysv,posix,self".into()),
        mm_fifo_size: Some(fifo),
        ..Default::default()
    });
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    b.set_am_handler(REQ, move |_, _, _, _| {
        g.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Taken::Done
    })
    .unwrap();
    let ep = a.connect(&b.address().unwrap()).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    // Sends 64 bytes; true if UCX left the send pending.
    let send = || {
        let d = done.clone();
        ep.am_send(
            REQ,
            vec![],
            Payload::Vec(vec![0; 64]),
            false,
            Box::new(move |r| {
                r.unwrap();
                d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        )
    };
    // Let the connection's wire-up finish, so that every later send goes to the FIFO.
    send();
    drive(&a, &b, || {
        got.load(std::sync::atomic::Ordering::SeqCst) == 1
    });
    assert!(!a.sends_pending());
    let total = 4 * fifo as usize;
    let mut pending = 0;
    for _ in 0..total {
        if send() {
            pending += 1;
        }
    }
    // The FIFO took at most its size; the rest wait for room.
    let went = total - pending;
    assert!(
        went > 0 && went <= fifo as usize,
        "a FIFO of {fifo} took {went} of {total} sends"
    );
    assert!(a.sends_pending());
    drive(&a, &b, || {
        done.load(std::sync::atomic::Ordering::SeqCst) == total + 1
            && got.load(std::sync::atomic::Ordering::SeqCst) == total + 1
    });
    assert!(!a.sends_pending());
    ep.close(false);
}

/// A handler that panics neither aborts the process nor stops the worker: the next message is
/// handled. An endpoint dropped without a close is closed, and it keeps its worker alive.
#[test]
fn a_panicking_handler_is_contained_and_endpoints_hold_their_worker() {
    let (a, b) = pair(&Config {
        tls: Some("sm,self".into()),
        net_devices: None,
        ..Default::default()
    });
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    b.set_am_handler(REQ, move |_, _, _, _| {
        if s.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            panic!("the first message makes the handler panic");
        }
        Taken::Done
    })
    .unwrap();
    let ep = a.connect(&b.address().unwrap()).unwrap();
    // The worker is dropped by its last other owner; the endpoint still holds it.
    let a_weak = Arc::downgrade(&a);
    drop(a);
    let a = a_weak.upgrade().expect("the endpoint keeps its worker");
    for _ in 0..2 {
        ep.am_send(
            REQ,
            vec![1],
            Payload::Vec(vec![2; 64]),
            false,
            Box::new(|r| r.unwrap()),
        );
    }
    drive(&a, &b, || {
        seen.load(std::sync::atomic::Ordering::SeqCst) == 2
    });
    drop(ep);
    drive(&a, &b, || true);
}

/// An answer sent on a reply endpoint names the endpoint the request went out on; a rendezvous
/// kept by its handler is fetched later, from another thread; one refused fails its sender.
#[test]
fn replies_name_their_endpoint_and_rendezvous_can_wait_or_be_refused() {
    let (a, b) = pair(&Config {
        tls: Some("sm,self".into()),
        net_devices: None,
        ..Default::default()
    });
    // B keeps every rendezvous, refuses those whose header says so, and answers small ones.
    let kept: Arc<Mutex<Vec<(RndvData, ReplyEp)>>> = Arc::default();
    let k = kept.clone();
    b.set_am_handler(REQ, move |w, hdr, data, reply| {
        let reply = reply.expect("a reply endpoint");
        match data {
            AmData::Eager(_) => {
                let _ = w.reply(reply, RESP, vec![], Payload::Vec(vec![]), Box::new(|_| {}));
                Taken::Done
            }
            AmData::Rndv(_) if hdr == [0] => Taken::Refused,
            AmData::Rndv(r) => {
                k.lock().unwrap().push((r, reply));
                Taken::Kept
            }
        }
    })
    .unwrap();
    let from: Arc<Mutex<Vec<Option<usize>>>> = Arc::default();
    let f = from.clone();
    a.set_am_handler(RESP, move |_, _, _, reply| {
        f.lock().unwrap().push(reply.map(|r| r.id()));
        Taken::Done
    })
    .unwrap();
    let ep = a.connect(&b.address().unwrap()).unwrap();
    let other = a.connect(&b.address().unwrap()).unwrap();
    assert_ne!(ep.id(), other.id());
    let results: Arc<Mutex<Vec<Result<(), String>>>> = Arc::default();
    let send = |e: &Endpoint, hdr: Vec<u8>, n: usize| {
        let r = results.clone();
        e.am_send(
            REQ,
            hdr,
            Payload::Vec(vec![5; n]),
            true,
            Box::new(move |x| r.lock().unwrap().push(x.map_err(|e| e.to_string()))),
        );
    };
    send(&ep, vec![1], 8);
    send(&other, vec![1], 8);
    drive(&a, &b, || from.lock().unwrap().len() == 2);
    let mut seen = from.lock().unwrap().clone();
    seen.sort();
    let mut want = vec![Some(ep.id()), Some(other.id())];
    want.sort();
    assert_eq!(
        seen, want,
        "each answer names the endpoint its request used"
    );

    // Refused: the sender's send fails, nothing is received.
    send(&ep, vec![0], 2 << 20);
    drive(&a, &b, || results.lock().unwrap().len() == 3);
    assert!(
        results.lock().unwrap()[2].is_err(),
        "{:?}",
        results.lock().unwrap()
    );
    // Kept, then fetched from another thread while this one progresses.
    send(&ep, vec![1], 2 << 20);
    drive(&a, &b, || kept.lock().unwrap().len() == 1);
    assert_eq!(
        results.lock().unwrap().len(),
        3,
        "a kept rendezvous is not done"
    );
    let (r, _) = kept.lock().unwrap().pop().unwrap();
    let got: Arc<Mutex<Option<usize>>> = Arc::default();
    let g = got.clone();
    let b2 = b.clone();
    std::thread::spawn(move || {
        b2.recv_rndv(
            r,
            None,
            Box::new(move |x| *g.lock().unwrap() = Some(x.unwrap().as_ref().len())),
        )
    })
    .join()
    .unwrap();
    drive(&a, &b, || {
        got.lock().unwrap().is_some() && results.lock().unwrap().len() == 4
    });
    assert_eq!(*got.lock().unwrap(), Some(2 << 20));
    // Kept, then let go: the sender's send completes.
    send(&ep, vec![1], 2 << 20);
    drive(&a, &b, || kept.lock().unwrap().len() == 1);
    let (r, _) = kept.lock().unwrap().pop().unwrap();
    b.release_rndv(r);
    drive(&a, &b, || results.lock().unwrap().len() == 5);
    ep.close(false);
    other.close(false);
}
