//! A parity volume's writer with a control plane (a recording `Membership`) against real
//! nodes: take-outs and whole resyncs, reconciliation after a writer dies, the activity log
//! at the nodes' places, and the encoder as a task.

use super::*;

/// A control plane for tests: the record it keeps, as `locate` answers it.
#[derive(Debug)]
struct Records(std::sync::Mutex<AttachInfo>);

impl Records {
    fn state(&self, node: u32) -> ReplicaState {
        let info = self.0.lock().unwrap();
        info.replicas.iter().find(|r| r.node == node).unwrap().state
    }
}

impl crate::Membership for Records {
    fn set_state<'a>(
        &'a self,
        _volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> crate::BoxFut<'a, Result<(), crate::MembershipError>> {
        let mut info = self.0.lock().unwrap();
        let r = match info.epoch == epoch {
            false => Err(crate::MembershipError::Refused("stale epoch".into())),
            true => {
                let t = info.replicas.iter_mut().find(|r| r.node == node).unwrap();
                t.state = state;
                if state == ReplicaState::InSync && incarnation != 0 {
                    t.incarnation = incarnation;
                }
                Ok(())
            }
        };
        Box::pin(async move { r })
    }
    fn locate<'a>(
        &'a self,
        _volume: &'a str,
    ) -> crate::BoxFut<'a, Result<AttachInfo, crate::MembershipError>> {
        let info = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(info) })
    }
    fn detach<'a>(
        &'a self,
        _volume: &'a str,
        _epoch: u64,
    ) -> crate::BoxFut<'a, Result<(), crate::MembershipError>> {
        Box::pin(async { Ok(()) })
    }
    fn record_size<'a>(
        &'a self,
        _volume: &'a str,
        _epoch: u64,
        _size: u64,
    ) -> crate::BoxFut<'a, Result<(), crate::MembershipError>> {
        Box::pin(async { Err(crate::MembershipError::Refused("no resize".into())) })
    }
    fn record_region<'a>(
        &'a self,
        _volume: &'a str,
        _id: u64,
        _epoch: u64,
        region: u64,
        to: Region,
    ) -> crate::BoxFut<'a, Result<(), crate::MembershipError>> {
        let mut info = self.0.lock().unwrap();
        let r = region as usize;
        if info.regions.len() <= r {
            info.regions.resize(r + 1, Region::Mirror);
        }
        info.regions[r] = to;
        Box::pin(async { Ok(()) })
    }
}

/// With a control plane: a node that fails writes is taken out and I/O goes on; once it
/// works again the writer brings it back whole (its mirrored regions with what their other
/// copy holds, its chunk rebuilt from the others), and then it serves reads for the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_is_taken_out_and_rebuilt_by_a_managed_writer() {
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "managed").await;
    let fault = |n: usize, what: &str| {
        std::fs::write(&specs[n].0, what).unwrap();
    };
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(150));
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let (records, v) = managed_writer(&c.info).await;
    let data = pattern(0, size as usize, 1);
    v.write(0, data.clone(), false).await.unwrap();
    let mut model = data.to_vec();
    let record = |r, kind| record_via(records.clone(), r, kind);
    assert_eq!(
        v.encode(1, &record).await.unwrap(),
        Region::Parity { slot: 0 }
    );

    // Node 3 fails every write: taken out, and the writes go on.
    fault(2, "write=1");
    settle().await;
    for (offset, len, t) in [
        (0, region, 2u8),
        (2 * region, region, 2),
        (region + 4096, 8192, 3),
    ] {
        let d = pattern(offset, len as usize, t);
        v.write(offset, d.clone(), false).await.unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&d);
    }
    v.write_zeroes(region + 5 * 4096, 4096, true, false)
        .await
        .unwrap();
    model[(region + 5 * 4096) as usize..(region + 6 * 4096) as usize].fill(0);
    assert_ne!(
        records.state(3),
        ReplicaState::InSync,
        "taken out on record"
    );
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);

    // It works again: the resync task brings it back.
    fault(2, "");
    wait_in_sync(&records, 3, "node 3 never came back").await;
    // Incremental: what it missed of the regions it mirrors (1 and 2: region 2 whole, three
    // blocks of region 1), not region 0 and not its chunk.
    let done = v.last_resync(3).expect("a resync ran");
    assert!(!c.stripes.mirrors(0, 3) && c.stripes.mirrors(1, 3) && c.stripes.mirrors(2, 3));
    assert!(!done.full, "{done:?}");
    assert_eq!(done.copied_bytes, region + 3 * 4096, "{done:?}");
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);

    // It loses its chunk of region 1 (as a disk that lost it) and goes out with its history
    // lost: the whole resync rebuilds the chunk from the other two.
    let ch = (0..3).find(|&ch| c.stripes.node_of(1, ch) == 3).unwrap();
    let at = trireme_replication::ChunkAt {
        node: 3,
        region: 1,
        slot: 0,
        chunk: ch,
        block: 0,
    };
    let chunk_len = (c.stripes.chunk_blocks * 4096) as usize;
    c.replicas[2]
        .write(
            c.stripes.chunk_block(&at) * 4096,
            &vec![0xee; chunk_len],
            false,
        )
        .unwrap();
    let slot = v.core().slot_of(3).unwrap();
    v.take_out_with(&[slot], None, true).await.unwrap();
    let d = pattern(2 * region, 4096, 4);
    v.write(2 * region, d.clone(), false).await.unwrap();
    model[2 * region as usize..(2 * region + 4096) as usize].copy_from_slice(&d);
    wait_in_sync(&records, 3, "node 3 never came back again").await;
    let done = v.last_resync(3).expect("a resync ran");
    assert!(done.full && done.done_bytes == size, "{done:?}");
    // Each of the others fails every read in turn: node 3's copies and chunk serve.
    for n in [0, 1] {
        fault(n, "read=1");
        settle().await;
        assert!(
            v.read(0, size).await.unwrap()[..] == model[..],
            "reads with node {} failing",
            n + 1
        );
        fault(n, "");
        settle().await;
    }
    // And a writer after this one finds the same overlay on every mirror.
    drop(v);
    let mut info = records.0.lock().unwrap().clone();
    info.epoch = 2;
    let v = Volume::attach(info, TransportKind::Tcp, 1).await.unwrap();
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "after a restart"
    );
}

/// A managed writer that dies with its mirrors differing (writes that reached one copy
/// only, a trim that reached one, bytes a power loss left on the first copy without their
/// held bit): the next one, told to reconcile, makes every region's mirrors agree from one
/// copy before any I/O, data and held blocks alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_managed_writer_reconciles_the_mirrors_a_dead_one_left_differing() {
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "reconcile").await;
    let size = c.info.size;
    let rb = c.stripes.region_blocks();
    let (v, records, opts, mut model) = written_with_a_stripe(&c, 4).await;
    v.write_zeroes(6 * 4096, 4096, true, false).await.unwrap();
    model[6 * 4096..7 * 4096].fill(0);
    v.flush().await.unwrap();
    drop(v);

    // What the dead writer left: on the second mirror of regions 0 and 1 only, a write
    // (block 3; block rb + 7 over the stripe) and a trim of an overlay block (rb + 2).
    let raw_to = |node: u32| raw_to(&c, node);
    use trireme_proto::Op;
    let (second0, second1) = (c.stripes.mirrors_of(0)[1], c.stripes.mirrors_of(1)[1]);
    let raw = raw_to(second0).await;
    send_raw(&raw, &c.stripes, Op::Write, 0, 3, pattern(0, 4096, 5)).await;
    let raw = if second1 == second0 {
        raw
    } else {
        raw_to(second1).await
    };
    send_raw(&raw, &c.stripes, Op::Write, 0, rb + 7, pattern(0, 4096, 6)).await;
    send_raw(
        &raw,
        &c.stripes,
        Op::WriteZeroes,
        trireme_proto::FLAG_MAY_TRIM,
        rb + 2,
        Bytes::new(),
    )
    .await;
    send_raw(&raw, &c.stripes, Op::Flush, 0, 0, Bytes::new()).await;
    // On the first mirror of region 0, the trimmed block 6 has bytes again with its held bit
    // clear: a power loss that undid the punch (its store written under the node's map).
    let first0 = c.stripes.mirrors_of(0)[0] as usize - 1;
    let at6 = c.stripes.node_block(6) * 4096;
    c.replicas[first0]
        .write(at6, &pattern(6 * 4096, 4096, 7), false)
        .unwrap();

    let mut info = records.0.lock().unwrap().clone();
    info.epoch = 3;
    info.reconcile = true;
    records.0.lock().unwrap().epoch = 3;
    let v = Volume::attach_managed(info, opts, records.clone())
        .await
        .unwrap();
    let report = v.last_reconcile().expect("reconciled");
    assert!(!report.whole && report.copied_bytes > 0, "{report:?}");
    let mut on_first = vec![1; 4096];
    c.replicas[first0].read(at6, &mut on_first).unwrap();
    assert!(
        on_first.iter().all(|&b| b == 0),
        "the bytes without their held bit stayed on the reconcile's source"
    );
    // Every copy answers the same, the first mirror's: each node failing reads in turn.
    for (n, spec) in specs.iter().enumerate() {
        std::fs::write(&spec.0, "read=1").unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        assert!(
            v.read(0, size).await.unwrap()[..] == model[..],
            "node {} failing reads",
            n + 1
        );
        std::fs::write(&spec.0, "").unwrap();
    }
}

/// A managed writer (its encoder off) that wrote the whole volume, encoded region 1 and wrote
/// `overlay` blocks over its stripe; its control plane, its options, and what the volume holds.
async fn written_with_a_stripe(
    c: &Cluster,
    overlay: u64,
) -> (Arc<Volume>, Arc<Records>, crate::VolumeOptions, Vec<u8>) {
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let records = Arc::new(Records(std::sync::Mutex::new(c.info.clone())));
    let mut opts = crate::VolumeOptions::over(TransportKind::Tcp, 1);
    opts.encode_rate = 0;
    let v = Volume::attach_managed(c.info.clone(), opts.clone(), records.clone())
        .await
        .unwrap();
    let data = pattern(0, size as usize, 1);
    v.write(0, data.clone(), false).await.unwrap();
    let mut model = data.to_vec();
    let record = |r, kind| record_via(records.clone(), r, kind);
    assert_eq!(
        v.encode(1, &record).await.unwrap(),
        Region::Parity { slot: 0 }
    );
    let len = overlay * 4096;
    let over = pattern(region, len as usize, 2);
    v.write(region, over.clone(), false).await.unwrap();
    model[region as usize..(region + len) as usize].copy_from_slice(&over);
    (v, records, opts, model)
}

/// A connection to node `node`, attached at epoch 2 (a writer that died at it).
async fn raw_to(c: &Cluster, node: u32) -> trireme_transport::tcp::TcpConnection {
    use trireme_transport::Connection;
    let addr = &c.info.replicas[node as usize - 1].addr;
    let raw = trireme_transport::tcp::TcpConnection::connect(addr, 1)
        .await
        .unwrap();
    let h = trireme_proto::Header {
        volume: VOLUME,
        epoch: 2,
        ..trireme_proto::Header::request(trireme_proto::Op::Attach, 0)
    };
    assert_eq!(
        raw.call(h, Bytes::new()).await.unwrap().header.status,
        trireme_proto::Status::Ok
    );
    raw
}

#[path = "parity_lost_tests.rs"]
mod lost;

/// Sends one request of `op` over `raw` (attached at epoch 2) at volume block `block`'s
/// place on the node; it must succeed.
async fn send_raw(
    raw: &trireme_transport::tcp::TcpConnection,
    stripes: &Stripes,
    op: trireme_proto::Op,
    flags: u16,
    block: u64,
    payload: Bytes,
) {
    use trireme_transport::Connection;
    let h = trireme_proto::Header {
        volume: VOLUME,
        epoch: 2,
        flags,
        offset: stripes.node_block(block) * 4096,
        length: 4096,
        ..trireme_proto::Header::request(op, 0)
    };
    let f = raw.call(h, payload).await.unwrap();
    assert_eq!(f.header.status, trireme_proto::Status::Ok, "{op:?}");
}

/// The writer clears a parity volume's activity log where the nodes marked it, at each
/// write's place on the node: once the volume is quiet, no mirrored part stays marked (a
/// clear at the volume's own offsets would leave them, and clear other extents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_activity_log_is_cleared_at_the_nodes_places() {
    let c = cluster().await;
    let size = c.info.size;
    let records = Arc::new(Records(std::sync::Mutex::new(c.info.clone())));
    let mut opts = crate::VolumeOptions::over(TransportKind::Tcp, 1);
    opts.activity_period = std::time::Duration::from_millis(50);
    opts.encode_rate = 0;
    let v = Volume::attach_managed(c.info.clone(), opts, records)
        .await
        .unwrap();
    v.write(0, pattern(0, size as usize, 1), false)
        .await
        .unwrap();
    let replica_size = c.stripes.replica_blocks(size / 4096) * 4096;
    let marked = |node: u32| {
        let addr = c.info.replicas[node as usize - 1].addr.clone();
        async move {
            use trireme_transport::Connection;
            let raw = trireme_transport::tcp::TcpConnection::connect(&addr, 1)
                .await
                .unwrap();
            let h = trireme_proto::Header {
                volume: VOLUME,
                length: replica_size,
                ..trireme_proto::Header::request(trireme_proto::Op::ActivityQuery, 0)
            };
            let f = raw.call(h, Bytes::new()).await.unwrap();
            let a =
                trireme_proto::ActivityAnswer::read(&f.header, &f.payload, replica_size).unwrap();
            assert_eq!(a.epoch, 1, "the writer's log");
            trireme_proto::data_ranges(&a.extents, 0)
        }
    };
    assert!(!marked(1).await.is_empty(), "the writes were marked");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    for node in 1..=3 {
        loop {
            let left = marked(node).await;
            if left.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {node} still has {left:?} marked"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// With a control plane, the writer's encoder turns cold regions into stripes by itself,
/// records each switch, and folds back an overlay written over one once it is past the
/// mirrored share; the data never changes
/// under the reads, and a writer after it finds it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_encoder_task_encodes_cold_regions_and_folds_back_overlays() {
    let c = cluster().await;
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let records = Arc::new(Records(std::sync::Mutex::new(c.info.clone())));
    let mut opts = crate::VolumeOptions::over(TransportKind::Tcp, 1);
    opts.activity_period = std::time::Duration::from_millis(50);
    let v = Volume::attach_managed(c.info.clone(), opts, records.clone())
        .await
        .unwrap();
    let data = pattern(0, size as usize, 1);
    v.write(0, data.clone(), false).await.unwrap();
    let mut model = data.to_vec();
    // 2+1 with a fifth mirrored, three regions: every one goes to parity (a region
    // written while it was encoded is folded back once more: either slot).
    wait_regions(&records, "every region encoded", |r| {
        r.len() == 3 && r.iter().all(|k| *k != Region::Mirror)
    })
    .await;
    let settled = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    while tokio::time::Instant::now() < settled {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
    // A write over region 0's stripe is overlay. Within the mirrored share's budget (a
    // fifth of three regions: 76 blocks) it stays; past it, it is folded back into the
    // other slot.
    let was = records.0.lock().unwrap().regions[0];
    let over = pattern(4096, 8192, 2);
    v.write(4096, over.clone(), false).await.unwrap();
    model[4096..4096 + 8192].copy_from_slice(&over);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        records.0.lock().unwrap().regions[0],
        was,
        "within the budget"
    );
    let over = pattern(3 * 4096, 96 * 4096, 3);
    v.write(3 * 4096, over.clone(), false).await.unwrap();
    model[3 * 4096..99 * 4096].copy_from_slice(&over);
    wait_regions(&records, "the overlay folded back", |r| r[0] != was).await;
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
    assert!(
        v.read(region, region).await.unwrap()[..] == model[region as usize..2 * region as usize]
    );
    drop(v);
    let mut info = records.0.lock().unwrap().clone();
    info.epoch = 2;
    let v = Volume::attach(info, TransportKind::Tcp, 1).await.unwrap();
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "after a restart"
    );
}

/// Waits (30 s at most) until the recorded regions are `done`.
async fn wait_regions(records: &Records, what: &str, done: impl Fn(&[Region]) -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let regions = records.0.lock().unwrap().regions.clone();
        if done(&regions) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {regions:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// An encode's trim after its switch that fails on one of the region's mirrors: that mirror
/// is taken out with the region marked (it holds blocks the overlay no longer names, with
/// bytes older than the stripe's), and its incremental resync trims them, so its held
/// blocks match its region's other mirror again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_that_fails_an_encodes_trim_goes_out_and_comes_back_trimmed() {
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "trim").await;
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let (records, v) = managed_writer(&c.info).await;
    let data = pattern(0, size as usize, 5);
    v.write(0, data.clone(), false).await.unwrap();
    // The mirror's writes fail from the switch on: the trim is the first to meet it.
    let m = c.stripes.mirrors_of(1)[1];
    let spec = specs[m as usize - 1].0.clone();
    let record = |r, kind| {
        let (spec, records) = (spec.clone(), records.clone());
        async move {
            std::fs::write(&spec, "write=1").unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            record_via(records, r, kind).await
        }
    };
    assert_eq!(
        v.encode(1, record).await.unwrap(),
        Region::Parity { slot: 0 }
    );
    assert_ne!(records.state(m), ReplicaState::InSync, "taken out");
    std::fs::write(&spec, "").unwrap();
    wait_in_sync(&records, m, "never came back").await;
    let done = v.last_resync(m).expect("a resync ran");
    assert!(!done.full, "{done:?}");
    let i = v.core().slot_of(m).unwrap();
    let at = c.stripes.node_block(c.stripes.region_blocks()) * 4096;
    assert_eq!(v.ask_held(i, at, region).await.unwrap(), vec![], "trimmed");
    assert!(v.read(0, size).await.unwrap() == data);
}

/// With a minimum of two copies (both of a 2+1 region's mirrors), a node taken out holds up
/// only the writes of the regions it mirrors: the write that took it out waits, not failed
/// and not acknowledged, while a region it does not mirror takes writes; once the node is
/// back, the write is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_while_its_region_has_too_few_mirrors_and_others_go_on() {
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "min").await;
    c.info.min_copies = 2;
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let (records, v) = managed_writer(&c.info).await;
    let mut model = pattern(0, size as usize, 6).to_vec();
    v.write(0, Bytes::from(model.clone()), false).await.unwrap();
    assert!(c.stripes.mirrors(1, 3) && !c.stripes.mirrors(0, 3));
    std::fs::write(&specs[2].0, "write=1").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let d = pattern(region, 4096, 8);
    let waiting = tokio::spawn({
        let (v, d) = (v.clone(), d.clone());
        async move { v.write(region, d, false).await }
    });
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "region 1 has one mirror in sync");
    assert!(v.writes_suspended());
    let e = pattern(0, 4096, 9);
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        v.write(0, e.clone(), false),
    )
    .await
    .expect("region 0's mirrors are both in sync")
    .unwrap();
    model[..4096].copy_from_slice(&e);
    model[region as usize..region as usize + 4096].copy_from_slice(&d);
    std::fs::write(&specs[2].0, "").unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), waiting)
        .await
        .expect("acknowledged once node 3 is back")
        .unwrap()
        .unwrap();
    assert_eq!(records.state(3), ReplicaState::InSync);
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
}

/// A lost node's copy replaced by one on a new node, in its place: the new copy follows the
/// lost one's place while it is rebuilt whole (the regions the old one mirrored, its chunks),
/// then takes it; no other node's place changes, and reads that need the new copy's chunks
/// (another node failing), a scrub, and an encode after it find the volume's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_copy_is_replaced_in_its_place_on_a_new_node() {
    let mut c = cluster().await;
    let specs = faulty_nodes(&mut c, "replace").await;
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let (records, v) = managed_writer(&c.info).await;
    let mut model = pattern(0, size as usize, 11).to_vec();
    v.write(0, Bytes::from(model.clone()), false).await.unwrap();
    let record = |r, kind| record_via(records.clone(), r, kind);
    for r in [0, 2] {
        v.encode(r, &record).await.unwrap();
    }
    // Node 2 is lost: every request fails. A write in each region takes it out.
    std::fs::write(&specs[1].0, "write=1 read=1 flush=1").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    for r in 0..3 {
        let d = pattern(r * region + 8192, 8192, 12);
        v.write(r * region + 8192, d.clone(), false).await.unwrap();
        let at = (r * region + 8192) as usize;
        model[at..at + 8192].copy_from_slice(&d);
    }
    assert_ne!(records.state(2), ReplicaState::InSync);
    // Node 4's copy: created, then on record beside node 2's (following it), then the writer.
    let replica_size = c.stripes.replica_blocks(size / 4096) * 4096;
    let (mut t, _r4) = node(4, replica_size).await;
    t.state = ReplicaState::Failed;
    t.follows = Some(2);
    records.0.lock().unwrap().replicas.push(t);
    assert!(
        v.follow_replica(9, 4, None).await.is_err(),
        "node 9 holds no place"
    );
    // An earlier attempt's copy on node 5, whose node never answered (the record dropped
    // it): the next attempt's follow replaces it.
    v.follow_replica(2, 5, None).await.unwrap();
    assert_eq!(v.caught_up(5), Some(crate::Following::Filling));
    v.follow_replica(2, 4, None).await.unwrap();
    assert_eq!(v.caught_up(5), None);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while v.caught_up(4) != Some(crate::Following::CaughtUp) {
        assert!(tokio::time::Instant::now() < deadline, "never caught up");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        v.stripes().nodes,
        vec![1, 2, 3],
        "not in place before its promotion"
    );
    assert_ne!(
        records.state(4),
        ReplicaState::InSync,
        "recorded at its promotion"
    );
    v.promote_replica(2, 4).await.unwrap();
    assert_eq!(v.stripes().nodes, vec![1, 4, 3]);
    assert_eq!(records.state(4), ReplicaState::InSync);
    assert_eq!(v.caught_up(4), Some(crate::Following::InPlace));
    v.promote_replica(2, 4).await.unwrap();
    let done = v.last_resync(4).expect("a resync ran");
    assert!(done.full, "{done:?}");
    assert!(v.replica_views().iter().all(|r| r.node != 2));
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
    // The old copy's slot stays in the set, moved off: encodes go on over the new one
    // (every one was abandoned until the writer attached again).
    assert!(matches!(
        v.encode(1, &record).await,
        Ok(Region::Parity { .. })
    ));
    // Node 1 fails reads: region 0's blocks come from node 4's mirror, region 2's (parity)
    // are rebuilt from node 4's and node 3's chunks.
    std::fs::write(&specs[0].0, "read=1").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
    std::fs::write(&specs[0].0, "").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let report = v.scrub(0).await.unwrap();
    assert!(
        report.repaired.is_empty() && report.unresolved.is_empty(),
        "{report:?}"
    );
    assert!(report.stripes_checked >= 2, "{report:?}");
}

/// A managed writer of `info` over a recording control plane: resyncs tried every 100 ms,
/// no encoder task (the tests encode themselves).
async fn managed_writer(info: &AttachInfo) -> (Arc<Records>, Arc<Volume>) {
    let records = Arc::new(Records(std::sync::Mutex::new(info.clone())));
    let mut opts = crate::VolumeOptions::over(TransportKind::Tcp, 1);
    opts.resync_interval = std::time::Duration::from_millis(100);
    opts.encode_rate = 0;
    let v = Volume::attach_managed(info.clone(), opts, records.clone())
        .await
        .unwrap();
    (records, v)
}

/// Waits (at most 20 s) until `node` is in sync on record; `what` names a timeout.
async fn wait_in_sync(records: &Records, node: u32, what: &str) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while records.state(node) != ReplicaState::InSync {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {node}: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Puts each of `c`'s nodes over a store that fails what its spec file says (`FaultyStore`);
/// the specs, removed however the test ends.
async fn faulty_nodes(c: &mut Cluster, tag: &str) -> Vec<Spec> {
    let replica_size = c.stripes.replica_blocks(c.info.size / 4096) * 4096;
    let tag = format!("trireme-parity-{tag}-{}", std::process::id());
    let specs: Vec<Spec> = (1..=3)
        .map(|n| Spec(std::env::temp_dir().join(format!("{tag}-{n}"))))
        .collect();
    for (n, spec) in specs.iter().enumerate() {
        let (t, r) = faulty_node(n as u32 + 1, replica_size, &spec.0).await;
        c.info.replicas[n] = t;
        c.replicas[n] = r;
    }
    specs
}

/// Records an encode's switch in `records`, as a writer's control plane does.
async fn record_via(records: Arc<Records>, region: u64, kind: Region) -> Result<(), String> {
    use crate::Membership;
    records
        .record_region("p", VOLUME, 1, region, kind)
        .await
        .map_err(|e| e.to_string())
}
