//! Copies of a parity volume that lost their history (a power loss, a failed flush), more
//! than the layout can take out: kept in sync and reconciled, at an attach and under a
//! running writer.

use super::*;

/// More than M copies of a parity volume come back with another history than recorded (a
/// power loss; here a flush that failed) while no writer runs. Taken out, they could never be
/// rebuilt, as a chunk is rebuilt from K in sync. The next writer keeps them in sync, reads
/// every byte (their chunks, their mirrored parts reconciled), and records their new
/// histories, so the writer after it finds them as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_that_lost_their_history_past_the_layouts_tolerance_are_kept() {
    use trireme_transport::Connection;
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "lost").await;
    let size = c.info.size;
    let (v, records, opts, model) = written_with_a_stripe(&c, 2).await;
    v.flush().await.unwrap();
    drop(v);
    let recorded = |n: u32| {
        let info = records.0.lock().unwrap();
        let r = info.replicas.iter().find(|r| r.node == n).unwrap();
        (r.state, r.incarnation)
    };
    let before: Vec<u64> = (1..=3).map(|n| recorded(n).1).collect();
    assert!(
        before.iter().all(|&i| i != 0),
        "incarnations recorded: {before:?}"
    );

    // Nodes 1 and 2 lose their history: a flush fails on each.
    for n in [1u32, 2] {
        std::fs::write(&specs[n as usize - 1].0, "flush=1").unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        let raw = raw_to(&c, n).await;
        let h = trireme_proto::Header {
            volume: VOLUME,
            epoch: 2,
            ..trireme_proto::Header::request(trireme_proto::Op::Flush, 0)
        };
        let f = raw.call(h, Bytes::new()).await.unwrap();
        assert_ne!(
            f.header.status,
            trireme_proto::Status::Ok,
            "an injected flush failure"
        );
        std::fs::write(&specs[n as usize - 1].0, "").unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;

    let mut info = records.0.lock().unwrap().clone();
    info.epoch = 3;
    info.reconcile = true;
    records.0.lock().unwrap().epoch = 3;
    let v = Volume::attach_managed(info, opts.clone(), records.clone())
        .await
        .unwrap();
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "kept copies read"
    );
    for n in 1..=3u32 {
        let (state, inc) = recorded(n);
        assert_eq!(state, ReplicaState::InSync, "node {n}");
        match n {
            3 => assert_eq!(inc, before[2], "node 3 kept its history"),
            _ => assert_ne!(
                inc,
                before[n as usize - 1],
                "node {n}'s new history recorded"
            ),
        }
    }
    let after: Vec<u64> = (1..=3).map(|n| recorded(n).1).collect();
    drop(v);

    // The next writer finds every copy as recorded: none lost, none taken out.
    let mut info = records.0.lock().unwrap().clone();
    info.epoch = 4;
    records.0.lock().unwrap().epoch = 4;
    let v = Volume::attach_managed(info, opts, records.clone())
        .await
        .unwrap();
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "the next writer reads"
    );
    for n in 1..=3u32 {
        assert_eq!(
            recorded(n),
            (ReplicaState::InSync, after[n as usize - 1]),
            "node {n}"
        );
    }
}

/// A running writer's flush fails in the stores of two of a 2+1's three copies, one more than
/// it tolerates. Taken out, they could never be rebuilt (a chunk needs two in sync): the
/// flush fails, and they stay in sync, their new histories recorded and every region's
/// mirrors made to agree with a copy that kept its history: here node 1 "lost" a write to a
/// region it mirrors with node 3 (its block overwritten behind the writer), and node 3's
/// copy wins. I/O goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_writer_keeps_copies_that_fail_a_flush_past_the_tolerance() {
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "past").await;
    let size = c.info.size;
    let (v, records, _opts, mut model) = written_with_a_stripe(&c, 2).await;
    v.flush().await.unwrap();
    let recorded = |n: u32| {
        let info = records.0.lock().unwrap();
        let r = info.replicas.iter().find(|r| r.node == n).unwrap();
        (r.state, r.incarnation)
    };
    let before: Vec<u64> = (1..=3).map(|n| recorded(n).1).collect();
    // A block of a region nodes 1 and 3 mirror, written, then lost on node 1.
    let r = (0..3u64)
        .find(|&r| c.stripes.mirrors(r, 1) && c.stripes.mirrors(r, 3) && r != 1)
        .expect("a region on nodes 1 and 3");
    let at = r * c.stripes.region_blocks() * 4096 + 8 * 4096;
    let d = pattern(at, 4096, 9);
    v.write(at, d.clone(), false).await.unwrap();
    model[at as usize..at as usize + 4096].copy_from_slice(&d);
    let place = c.stripes.node_block(at / 4096) * 4096;
    c.replicas[0]
        .write(place, &pattern(at, 4096, 1), false)
        .unwrap();

    for n in [0, 1] {
        std::fs::write(&specs[n].0, "flush=1").unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let e = v
        .flush()
        .await
        .expect_err("the flush fails on two of three");
    assert!(matches!(e, VolumeError::WaitForCopies { .. }), "{e}");
    // Their stores fail syncs still, so the trims of the reconcile fail: it is tried again
    // every tick, and gets through once they work.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        recorded(1).1,
        before[0],
        "not reconciled while node 1 fails syncs"
    );
    for spec in &specs {
        std::fs::write(&spec.0, "").unwrap();
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while recorded(1).1 == before[0] || recorded(2).1 == before[1] {
        assert!(tokio::time::Instant::now() < deadline, "never reconciled");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for n in 1..=3u32 {
        let (state, inc) = recorded(n);
        assert_eq!(state, ReplicaState::InSync, "node {n} stays in sync");
        match n {
            3 => assert_eq!(inc, before[2], "node 3 kept its history"),
            _ => assert_ne!(inc, before[n as usize - 1], "node {n}'s new history"),
        }
    }
    // Node 1's copy of the block is node 3's again.
    let mut got = vec![0u8; 4096];
    c.replicas[0].read(place, &mut got).unwrap();
    assert!(got[..] == d[..], "node 1 reconciled from node 3");
    // I/O goes on.
    let d = pattern(0, 8192, 7);
    v.write(0, d.clone(), false).await.unwrap();
    model[..8192].copy_from_slice(&d);
    v.flush().await.unwrap();
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
}
