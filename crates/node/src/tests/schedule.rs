//! The order a busy node serves its waiting requests (`schedule.rs`), end to end over TCP
//! against a modeled disk that serves one request at a time: the checks are ratios of what
//! each volume got in the same window, never rates.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use trireme_store::disk_model::{DiskModel, DiskParams, ModeledStore};

const SIZE: u64 = 64 << 20;

/// One stream of reads: its volume, how many it keeps in flight, and whether they are
/// recovery's.
#[derive(Clone, Copy)]
struct Load {
    volume: u64,
    depth: usize,
    recovery: bool,
}

/// Runs every load against the node for `window`: the reads each completed within it.
async fn busy(conn: &Arc<TcpConnection>, loads: &[Load], window: Duration) -> Vec<u64> {
    let end = Instant::now() + window;
    let counts: Vec<_> = loads.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut tasks = Vec::new();
    for (l, count) in loads.iter().zip(&counts) {
        for k in 0..l.depth {
            let (c, count, l) = (conn.clone(), count.clone(), *l);
            tasks.push(tokio::spawn(async move {
                // Far apart: every read is a random one for the model (it pays a seek).
                let mut off = (k as u64) << 20;
                while Instant::now() < end {
                    let mut h = req(Op::Read, l.volume, 1, off % SIZE, 4096);
                    if l.recovery {
                        h.flags |= trireme_proto::FLAG_RECOVERY;
                    }
                    let f = c.call(h, Bytes::new()).await.unwrap();
                    assert_eq!(f.header.status, Status::Ok);
                    if Instant::now() < end {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    off += 7 << 20;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
}

fn part(got: &[u64], i: usize) -> f64 {
    got[i] as f64 / got.iter().sum::<u64>() as f64
}

/// One thread on a disk of one head: every request past the one on the platter waits in the
/// node's queue, in the scheduler's order. A volume with 16 reads in flight against one with
/// 2 gets half of the node (first come, first served gave it 16 in 18); with weight 9
/// against 1 it gets about 0.9, and the other's reserve of 60% of the disk takes that back;
/// recovery beside a busy volume gets about its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_serves_by_reserve_recovery_share_and_weight() {
    let disk = DiskModel::new(DiskParams {
        seek: Duration::from_micros(500),
        bandwidth: 1 << 30,
        heads: 1,
    });
    let store = ModeledStore::new(
        Arc::new(trireme_store::MemoryStore::default()),
        Arc::new(disk),
    );
    let (node, conn) = start(Arc::new(store)).await;
    node.set_io_threads(1);
    node.set_recovery_share(20);
    let conn = Arc::new(conn);
    for v in [1, 2] {
        for h in [
            req(Op::CreateReplica, v, 0, 0, SIZE),
            req(Op::Attach, v, 1, 0, 0),
        ] {
            let f = conn.call(h, Bytes::new()).await.unwrap();
            assert_eq!(f.header.status, Status::Ok);
        }
    }
    let loud = Load {
        volume: 1,
        depth: 16,
        recovery: false,
    };
    let quiet = Load {
        volume: 2,
        depth: 2,
        recovery: false,
    };
    let window = Duration::from_millis(1500);

    let fair = busy(&conn, &[loud, quiet], window).await;
    println!("equal weights, depth 16 against 2: {fair:?}");
    assert!((0.4..0.6).contains(&part(&fair, 1)), "{fair:?}");

    node.set_shares(HashMap::from([(
        1,
        Share {
            reserve: 0,
            weight: 9,
        },
    )]));
    let weighted = busy(&conn, &[loud, quiet], window).await;
    println!("weight 9 against 1: {weighted:?}");
    assert!(part(&weighted, 0) > 0.8, "{weighted:?}");

    // The disk does about 2,000 reads a second: a reserve of 1,200 is 60% of it.
    let f = conn
        .call(req(Op::Qos, 2, 0, 1_200, 1), Bytes::new())
        .await
        .unwrap();
    assert_eq!(f.header.status, Status::Ok);
    let reserved = busy(&conn, &[loud, quiet], window).await;
    println!("weight 9 against a reserve of 1,200: {reserved:?}");
    assert!(part(&reserved, 1) > 0.45, "{reserved:?}");

    let rebuild = Load {
        volume: 2,
        depth: 16,
        recovery: true,
    };
    let shared = busy(&conn, &[loud, rebuild], window).await;
    println!("recovery share 20%, both 16 deep: {shared:?}");
    assert!((0.1..0.3).contains(&part(&shared, 1)), "{shared:?}");
    // Alone, recovery takes the whole node.
    let alone = busy(&conn, &[rebuild], Duration::from_millis(500)).await;
    assert!(
        alone[0] as f64 > 0.5 * shared.iter().sum::<u64>() as f64 / 3.0,
        "{alone:?} {shared:?}"
    );
}
