//! A parity volume's writer against real nodes over memory stores, served over TCP on
//! 127.0.0.1.

use std::sync::Arc;

use bytes::Bytes;
use trireme_replication::{Layout, Parity, Region, ReplicaState, Stripes};
use trireme_store::{MemoryStore, Replica, Store};
use trireme_transport::TransportKind;

use crate::{AttachInfo, ReplicaTarget, Volume, VolumeError};

const VOLUME: u64 = 9;

/// A `spec` (K+M) volume of three regions over K+M nodes: 1, 2, ...
fn geometry(spec: &str) -> (Parity, Stripes, u64) {
    let p = Parity::parse(spec, None).unwrap();
    let nodes = (1..=u32::from(p.data + p.parity)).collect();
    let s = Stripes::new(&p, nodes).unwrap();
    let size = 3 * s.region_blocks() * 4096;
    (p, s, size)
}

/// A node over a memory store holding the volume's replica, and that replica.
async fn node(id: u32, replica_size: u64) -> (ReplicaTarget, Arc<dyn Replica>) {
    serve(id, Arc::new(MemoryStore::default()), replica_size).await
}

/// A node over `store`, served over TCP on 127.0.0.1, holding the volume's replica, which
/// keeps a held map as a parity volume's must.
async fn serve(
    id: u32,
    store: Arc<dyn Store>,
    replica_size: u64,
) -> (ReplicaTarget, Arc<dyn Replica>) {
    serve_with(id, store, replica_size, true).await
}

/// As [`serve`]; `held`: the replica is created as a parity volume's (`FLAG_HELD`).
async fn serve_with(
    id: u32,
    store: Arc<dyn Store>,
    replica_size: u64,
    held: bool,
) -> (ReplicaTarget, Arc<dyn Replica>) {
    let node = Arc::new(trireme_node::Node::new(id, store));
    let mut h = trireme_proto::Header {
        volume: VOLUME,
        length: replica_size,
        ..trireme_proto::Header::request(trireme_proto::Op::CreateReplica, 0)
    };
    if held {
        h.flags |= trireme_proto::FLAG_HELD;
    }
    use trireme_transport::Handler;
    let created = node
        .clone()
        .handle(trireme_transport::Frame::new(h, Bytes::new()))
        .await;
    assert_eq!(created.header.status, trireme_proto::Status::Ok, "create");
    let replica = node.served(VOLUME).expect("created");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(trireme_transport::tcp::serve(listener, node));
    let target = ReplicaTarget {
        node: id,
        addr,
        local_addr: None,
        state: ReplicaState::InSync,
        incarnation: 0,
        follows: None,
    };
    (target, replica)
}

struct Cluster {
    info: AttachInfo,
    replicas: Vec<Arc<dyn Replica>>,
    stripes: Stripes,
}

/// A 2+1 volume of three regions (512 KiB each) on nodes 1, 2 and 3.
async fn cluster() -> Cluster {
    cluster_of("2+1").await
}

/// A `spec` volume of three regions ([`geometry`]).
async fn cluster_of(spec: &str) -> Cluster {
    cluster_over(spec, |_| Arc::new(MemoryStore::default())).await
}

/// A `spec` volume of three regions over node `id`'s store `store(id)`.
async fn cluster_over(spec: &str, store: impl Fn(u32) -> Arc<dyn Store>) -> Cluster {
    let (p, stripes, size) = geometry(spec);
    let replica_size = stripes.replica_blocks(size / 4096) * 4096;
    let (mut targets, mut replicas) = (Vec::new(), Vec::new());
    for id in 1..=stripes.width() as u32 {
        let (t, r) = serve(id, store(id), replica_size).await;
        targets.push(t);
        replicas.push(r);
    }
    let info = AttachInfo {
        name: "p".into(),
        id: VOLUME,
        size,
        epoch: 1,
        replicas: targets,
        reconcile: false,
        min_copies: 0,
        preallocate: false,
        layout: Layout::Parity(p),
        regions: Vec::new(),
        limits: Default::default(),
    };
    Cluster {
        info,
        replicas,
        stripes,
    }
}

/// Bytes that say where they were written and by which write.
fn pattern(offset: u64, len: usize, tag: u8) -> Bytes {
    (0..len)
        .map(|i| ((offset as usize + i) / 4096) as u8 ^ tag ^ (i as u8))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn writes_land_on_their_regions_mirrors_only_and_read_back() {
    let c = cluster().await;
    let size = c.info.size;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let mut model = vec![0u8; size as usize];
    let region = c.stripes.region_blocks() * 4096;
    // Within a region, across the first region's end, and across all three.
    for (offset, len, tag) in [
        (8192, 16384, 1u8),
        (region - 8192, 24576, 2),
        (4096, (3 * region - 8192) as usize, 3),
        (region + 4096, 4096, 4),
    ] {
        let data = pattern(offset, len, tag);
        v.write(offset, data.clone(), false)
            .await
            .unwrap_or_else(|e| panic!("write at {offset} of {len}: {e}"));
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    // Zeroes and a discard, across a region's end: nothing is beneath, so a trim.
    v.write_zeroes(region - 4096, 8192, false, false)
        .await
        .unwrap();
    v.write_zeroes(2 * region - 4096, 12288, true, false)
        .await
        .unwrap();
    for r in [
        region - 4096..region + 4096,
        2 * region - 4096..2 * region + 8192,
    ] {
        model[r.start as usize..r.end as usize].fill(0);
    }
    v.flush().await.unwrap();
    let got = v.read(0, size).await.unwrap();
    assert!(
        got[..] == model[..],
        "the volume reads back what was written"
    );
    // Part blocks are refused, and say why.
    for e in [
        v.write(100, Bytes::from(vec![1; 4096]), false)
            .await
            .unwrap_err(),
        v.write(0, Bytes::from(vec![1; 512]), false)
            .await
            .unwrap_err(),
        v.write_zeroes(0, 1000, true, false).await.unwrap_err(),
    ] {
        assert!(matches!(e, VolumeError::Unaligned { .. }), "{e}");
        assert!(e.to_string().contains("whole 4096-byte blocks"), "{e}");
    }
    // Each region is on its M+1 mirrors, at its place in their replicas; elsewhere a hole.
    for r in 0..3u64 {
        let mirrors = c.stripes.mirrors_of(r);
        let start = r * c.stripes.region_blocks();
        let at = c.stripes.node_block(start) * 4096;
        let want = &model[(start * 4096) as usize..((start * 4096) + region) as usize];
        for (k, replica) in c.replicas.iter().enumerate() {
            let mut buf = vec![0u8; region as usize];
            replica.read(at, &mut buf).unwrap();
            let node = k as u32 + 1;
            match mirrors.contains(&node) {
                true => assert!(buf == want, "region {r} on its mirror node {node}"),
                false => assert!(buf.iter().all(|&b| b == 0), "region {r} on node {node}"),
            }
        }
    }
}

/// A fold-back gives back the space it no longer needs: the overlay's blocks on the
/// region's mirrors and the stripe it replaced. Before, both stayed allocated (the
/// overlay's 4 KiB trims were written as zeroes, the old slot was left as garbage), and a
/// parity volume under random writes grew past a 3-way mirror's raw space. Over file
/// stores: sparse files written with O_DIRECT, as nodes keep them.
#[tokio::test]
async fn a_fold_back_frees_the_overlay_and_the_stripe_it_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = |id: u32| dir.path().join(format!("node-{id}"));
    let c = cluster_over("2+1", |id| {
        std::fs::create_dir(store_dir(id)).unwrap();
        Arc::new(trireme_store::FileStore::open(&store_dir(id)).unwrap())
    })
    .await;
    // What the replicas' data files take on disk, all three nodes.
    let on_disk = || -> u64 {
        use std::os::unix::fs::MetadataExt;
        (1..=3)
            .flat_map(|id| std::fs::read_dir(store_dir(id)).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "data"))
            .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
            .sum()
    };
    let (size, rb) = (c.info.size, c.stripes.region_blocks());
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let mut model = pattern(0, size as usize, 7).to_vec();
    v.write(0, Bytes::from(model.clone()), false).await.unwrap();
    let record = |_, _| async { Ok::<(), String>(()) };
    for region in 0..3 {
        v.encode(region, &record).await.unwrap();
    }
    v.flush().await.unwrap();
    let encoded = on_disk();
    let stripes = size / 2 * 3;
    assert!(
        encoded <= stripes + (64 << 10),
        "encoded: {encoded} bytes on disk for {stripes} of stripes"
    );
    // A quarter of region 1's blocks written over its stripe: overlay, on both mirrors.
    let start = rb * 4096;
    for b in (0..rb).step_by(4) {
        let at = start + b * 4096;
        let data = pattern(at, 4096, 9);
        model[at as usize..at as usize + 4096].copy_from_slice(&data);
        v.write(at, data, false).await.unwrap();
    }
    v.flush().await.unwrap();
    // Each block's grain is reserved whole on the mirrors before the write (the node's
    // `reserve_grains`): a block in four written, the region's whole mirrored place taken.
    let reserved = rb * 4096 * 2;
    assert!(
        on_disk() >= encoded + reserved,
        "the overlay's grains are reserved: {} bytes for {reserved}",
        on_disk() - encoded
    );
    // Folded back: the new stripe in the other slot, the old one and the overlay gone, its
    // grains punched whole by the trims that left them with nothing held.
    assert_eq!(
        v.encode(1, &record).await.unwrap(),
        Region::Parity { slot: 1 }
    );
    v.flush().await.unwrap();
    let folded = on_disk();
    assert!(
        folded <= encoded + (64 << 10),
        "after the fold-back: {folded} bytes on disk, {encoded} before the overlay"
    );
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
}

#[tokio::test]
async fn a_parity_volume_is_refused_where_it_cannot_be_served() {
    let c = cluster().await;
    // Two copies for a 2+1 stripe.
    let mut short = c.info.clone();
    short.replicas.pop();
    let e = Volume::attach(short, TransportKind::Tcp, 1)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("needs 3 copies"), "{e}");
    // A region record longer than the volume.
    let mut longer = c.info.clone();
    longer.regions = vec![Region::Mirror; 4];
    let e = Volume::attach(longer, TransportKind::Tcp, 1)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("names 4 regions"), "{e}");
    // A copy made as a mirror's cannot say which blocks it holds: with regions in parity,
    // its overlay could not be found again.
    let replica_size = c.stripes.replica_blocks(c.info.size / 4096) * 4096;
    let (target, _) = serve_with(4, Arc::new(MemoryStore::default()), replica_size, false).await;
    let mut plain = c.info.clone();
    plain.replicas[2] = ReplicaTarget { node: 3, ..target };
    plain.regions = vec![Region::Mirror, Region::Parity { slot: 0 }];
    let e = Volume::attach(plain.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("cannot say which blocks it holds"),
        "{e}"
    );
    // With every region mirrored, there is nothing to ask.
    plain.regions = Vec::new();
    Volume::attach(plain, TransportKind::Tcp, 1).await.unwrap();
}

/// A node whose store fails what `faults` says (`FaultyStore`), e.g. `read=1`.
async fn faulty_node(
    id: u32,
    replica_size: u64,
    faults: &std::path::Path,
) -> (ReplicaTarget, Arc<dyn Replica>) {
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::default());
    serve(
        id,
        Arc::new(trireme_store::FaultyStore::new(inner, faults)),
        replica_size,
    )
    .await
}

/// Removes the fault spec however the test ends.
struct Spec(std::path::PathBuf);

impl Drop for Spec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn an_encoded_region_reads_from_its_chunks_and_around_a_failed_node() {
    let mut c = cluster().await;
    // Node 3's store fails reads when told to.
    let spec = Spec(std::env::temp_dir().join(format!("trireme-parity-{}", std::process::id())));
    let replica_size = c.stripes.replica_blocks(c.info.size / 4096) * 4096;
    let (t, r) = faulty_node(3, replica_size, &spec.0).await;
    c.info.replicas[2] = t;
    c.replicas[2] = r;
    let size = c.info.size;
    let region = c.stripes.region_blocks() * 4096;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let data = pattern(0, size as usize, 7);
    v.write(0, data.clone(), false).await.unwrap();
    let mut model = data.to_vec();
    let records = std::sync::Mutex::new(Vec::new());
    let record = |region, kind| {
        records.lock().unwrap().push((region, kind));
        async { Ok::<(), String>(()) }
    };
    // Region 1 into a stripe in slot 0: recorded, and its mirrors trimmed.
    let kind = v.encode(1, &record).await.unwrap();
    assert_eq!(kind, Region::Parity { slot: 0 });
    assert_eq!(
        *records.lock().unwrap(),
        vec![(1, Region::Parity { slot: 0 })]
    );
    let at = c.stripes.node_block(c.stripes.region_blocks()) * 4096;
    for (k, replica) in c.replicas.iter().enumerate() {
        let mut buf = vec![0u8; region as usize];
        replica.read(at, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "region 1's mirror on node {}",
            k + 1
        );
    }
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "read from the stripe"
    );
    // Each chunk is where the geometry says, and the parity matches.
    let chunk = (c.stripes.chunk_blocks * 4096) as usize;
    let mut stripe = Vec::new();
    for ch in 0..3 {
        let node = c.stripes.node_of(1, ch);
        let at = trireme_replication::ChunkAt {
            node,
            region: 1,
            slot: 0,
            chunk: ch,
            block: 0,
        };
        let mut buf = vec![0u8; chunk];
        c.replicas[node as usize - 1]
            .read(c.stripes.chunk_block(&at) * 4096, &mut buf)
            .unwrap();
        stripe.push(buf);
    }
    let start = region as usize;
    assert!(stripe[0] == model[start..start + chunk]);
    assert!(stripe[1] == model[start + chunk..start + 2 * chunk]);
    let codec = trireme_erasure::ReedSolomon::new(2, 1).unwrap();
    use trireme_erasure::Codec;
    let refs: Vec<&[u8]> = stripe.iter().map(|c| &c[..]).collect();
    assert!(codec.verify(&refs).unwrap(), "the stripe's parity holds");
    // A write over the stripe lands in the overlay and reads back over it.
    let over = pattern(region + 8192, 8192, 9);
    v.write(region + 8192, over.clone(), false).await.unwrap();
    model[start + 8192..start + 16384].copy_from_slice(&over);
    // A discard over the stripe goes as zeroes: a trim would uncover the stripe's bytes.
    v.write_zeroes(region + 65536, 4096, true, false)
        .await
        .unwrap();
    model[start + 65536..start + 69632].fill(0);
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "overlay over stripe"
    );
    // Node 3 fails every read: its chunks are rebuilt from the other two, its mirrored
    // blocks read from their other copy.
    std::fs::write(&spec.0, "read=1").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let mut buf = vec![0u8; 4096];
    assert!(
        c.replicas[2].read(0, &mut buf).is_err(),
        "node 3 fails reads"
    );
    assert_eq!(
        c.stripes.node_of(1, 1),
        3,
        "and holds data chunk 1 of region 1"
    );
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "degraded read"
    );
    std::fs::remove_file(&spec.0).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    // Folding the overlay back writes the other slot, and frees the overlay.
    let kind = v.encode(1, &record).await.unwrap();
    assert_eq!(kind, Region::Parity { slot: 1 });
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "after the fold-back"
    );
    for (k, replica) in c.replicas.iter().enumerate() {
        let mut buf = vec![0u8; region as usize];
        replica.read(at, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "overlay freed on node {}",
            k + 1
        );
    }
    // Nothing to fold back now, and no such region.
    let e = v.encode(1, &record).await.unwrap_err();
    assert!(e.to_string().contains("nothing to fold back"), "{e}");
    let e = v.encode(3, &record).await.unwrap_err();
    assert!(e.to_string().contains("past the volume's end"), "{e}");
}

#[tokio::test]
async fn an_encode_whose_switch_is_not_recorded_changes_nothing() {
    let c = cluster().await;
    let size = c.info.size;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let data = pattern(0, size as usize, 3);
    v.write(0, data.clone(), false).await.unwrap();
    let refuse = |_, _| async { Err::<(), String>("the record is fenced".into()) };
    let e = v.encode(0, refuse).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("abandoned at its switch step: the record is fenced"),
        "{e}"
    );
    assert!(
        v.read(0, size).await.unwrap() == data,
        "still read from the mirrors"
    );
    // The mirrors keep every block; the next encode may go again.
    let ok = |_, _| async { Ok::<(), String>(()) };
    assert_eq!(v.encode(0, ok).await.unwrap(), Region::Parity { slot: 0 });
    assert!(v.read(0, size).await.unwrap() == data);
}

/// Writes, discards and reads go on while regions are encoded and folded back over and
/// over: every read returns the last write (one task writes, so the model is exact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_during_encodes_reads_the_last_write() {
    let c = cluster().await;
    let size = c.info.size;
    let blocks = size / 4096;
    // Several streams per node: a read and a trim sent after it may land in either order.
    let v = Arc::new(
        Volume::attach(c.info.clone(), TransportKind::Tcp, 4)
            .await
            .unwrap(),
    );
    let io = {
        let v = v.clone();
        tokio::spawn(async move {
            let mut model = vec![0u8; size as usize];
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for n in 0..600u64 {
                let b = next() % (blocks * 2 / 3);
                let len = (1 + next() % 4).min(blocks * 2 / 3 - b);
                let (at, bytes) = (b * 4096, (len * 4096) as usize);
                let range = at as usize..at as usize + bytes;
                match n % 10 {
                    0 => {
                        v.write_zeroes(at, bytes as u64, true, false).await.unwrap();
                        model[range].fill(0);
                    }
                    1..=3 => {
                        let got = v.read(at, bytes as u64).await.unwrap();
                        if got[..] != model[range.clone()] {
                            let tags = |d: &[u8]| -> Vec<u8> {
                                d.chunks(4096)
                                    .enumerate()
                                    .map(|(k, c)| c[0] ^ (b + k as u64) as u8)
                                    .collect()
                            };
                            panic!(
                                "read {n} at block {b}: got tags {:?}, want {:?}",
                                tags(&got),
                                tags(&model[range])
                            );
                        }
                    }
                    _ => {
                        let data = pattern(at, bytes, n as u8);
                        v.write(at, data.clone(), false).await.unwrap();
                        model[range].copy_from_slice(&data);
                    }
                }
            }
            model
        })
    };
    // Region 2 holds the same bytes throughout (rewritten with them, so it has overlay to
    // fold back): reads of it, concurrent with everything, always see them.
    let region = c.stripes.region_blocks() * 4096;
    let fixed = pattern(2 * region, region as usize, 0xa5);
    v.write(2 * region, fixed.clone(), false).await.unwrap();
    let same = {
        let (v, fixed) = (v.clone(), fixed.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            for n in 0..3000u64 {
                let b = (n * 37) % (region / 4096 - 3);
                let (at, len) = (b * 4096, 3 * 4096);
                match n % 3 {
                    0 => {
                        let data = fixed.slice(at as usize..(at + len) as usize);
                        v.write(2 * region + at, data, false).await.unwrap();
                    }
                    _ => {
                        let got = v.read(2 * region + at, len).await.unwrap();
                        assert!(
                            got[..] == fixed[at as usize..(at + len) as usize],
                            "read {n}"
                        );
                        reads += 1;
                    }
                }
            }
            reads
        })
    };
    let ok = |_, _| async { Ok::<(), String>(()) };
    let mut encoded = 0;
    while !io.is_finished() || !same.is_finished() {
        for r in 0..3 {
            // Nothing to fold back is the only refusal expected.
            match v.encode(r, ok).await {
                Ok(_) => encoded += 1,
                Err(e) => assert!(e.to_string().contains("nothing to fold back"), "{e}"),
            }
        }
    }
    assert!(same.await.unwrap() > 0);
    let mut model = io.await.unwrap();
    model[2 * region as usize..].copy_from_slice(&fixed);
    assert!(encoded >= 3, "{encoded} encodes");
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
}

/// A node that fails the chunk writes abandons the encode: nothing recorded, the region
/// reads from its mirrors as before. With two of three nodes failing reads, a stripe's block
/// cannot be read and says so; nothing wrong is returned.
#[tokio::test]
async fn failures_abandon_an_encode_and_too_many_fail_a_read_cleanly() {
    let mut c = cluster().await;
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let specs: Vec<Spec> = (2..=3)
        .map(|n| Spec(dir.join(format!("trireme-parity-f{n}-{pid}"))))
        .collect();
    let replica_size = c.stripes.replica_blocks(c.info.size / 4096) * 4096;
    for (k, n) in (2..=3u32).enumerate() {
        let (t, r) = faulty_node(n, replica_size, &specs[k].0).await;
        c.info.replicas[n as usize - 1] = t;
        c.replicas[n as usize - 1] = r;
    }
    let size = c.info.size;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let data = pattern(0, size as usize, 5);
    v.write(0, data.clone(), false).await.unwrap();
    let recorded = std::sync::Mutex::new(0);
    let record = |_, _| {
        *recorded.lock().unwrap() += 1;
        async { Ok::<(), String>(()) }
    };
    let wait = || tokio::time::sleep(std::time::Duration::from_millis(150));
    std::fs::write(&specs[1].0, "write=1").unwrap();
    wait().await;
    let e = v.encode(0, &record).await.unwrap_err();
    assert!(e.to_string().contains("abandoned at its write step"), "{e}");
    assert_eq!(*recorded.lock().unwrap(), 0, "nothing recorded");
    std::fs::remove_file(&specs[1].0).unwrap();
    wait().await;
    assert!(v.read(0, size).await.unwrap() == data, "read as before");
    // Encoded, then two nodes fail every read: region 0's stripe cannot be read.
    assert_eq!(
        v.encode(0, &record).await.unwrap(),
        Region::Parity { slot: 0 }
    );
    for s in &specs {
        std::fs::write(&s.0, "read=1").unwrap();
    }
    wait().await;
    // Block 0 is in chunk 0, on node 1: read as it is. Chunk 1 is on node 2.
    assert!(v.read(0, 4096).await.unwrap()[..] == data[..4096]);
    assert_eq!(c.stripes.node_of(0, 1), 2);
    let at = c.stripes.chunk_blocks * 4096;
    let Err(e) = v.read(at, 4096).await else {
        panic!("a block with its chunk's node and one other out read back");
    };
    assert!(matches!(e, VolumeError::Unreadable { .. }), "{e}");
    assert!(e.to_string().contains("fewer than the 2 it takes"), "{e}");
    for s in &specs {
        std::fs::remove_file(&s.0).unwrap();
    }
    wait().await;
    assert!(v.read(0, size).await.unwrap() == data, "whole again");
}

/// A writer that goes away with regions in parity: the next one rebuilds the overlay from
/// the nodes' held maps, so the blocks written over the stripe read back; a block only one
/// mirror holds (a write no copy set finished) is trimmed there and reads the stripe.
#[tokio::test]
async fn a_new_writer_finds_the_overlay_in_the_nodes_held_maps() {
    let mut c = cluster().await;
    let size = c.info.size;
    let rb = c.stripes.region_blocks();
    let region = rb * 4096;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let data = pattern(0, size as usize, 1);
    v.write(0, data.clone(), false).await.unwrap();
    let mut model = data.to_vec();
    let record = |_, _| async { Ok::<(), String>(()) };
    assert_eq!(
        v.encode(1, &record).await.unwrap(),
        Region::Parity { slot: 0 }
    );
    // Over the stripe: two blocks written and one discarded (sent as zeroes).
    let over = pattern(region + 2 * 4096, 8192, 2);
    v.write(region + 2 * 4096, over.clone(), false)
        .await
        .unwrap();
    model[(region + 2 * 4096) as usize..(region + 4 * 4096) as usize].copy_from_slice(&over);
    v.write_zeroes(region + 9 * 4096, 4096, true, false)
        .await
        .unwrap();
    model[(region + 9 * 4096) as usize..(region + 10 * 4096) as usize].fill(0);
    v.flush().await.unwrap();
    drop(v);

    // A write that reached one of region 1's mirrors only, from a writer that then died.
    let mirror = c.stripes.mirrors_of(1)[0];
    let addr = &c.info.replicas[mirror as usize - 1].addr;
    let raw = trireme_transport::tcp::TcpConnection::connect(addr, 1)
        .await
        .unwrap();
    use trireme_transport::Connection;
    let req = |op, offset, length| trireme_proto::Header {
        volume: VOLUME,
        epoch: 2,
        offset,
        length,
        ..trireme_proto::Header::request(op, 0)
    };
    let lone = c.stripes.node_block(rb + 5) * 4096;
    for (h, payload) in [
        (req(trireme_proto::Op::Attach, 0, 0), Bytes::new()),
        (req(trireme_proto::Op::Write, lone, 0), pattern(0, 4096, 3)),
        (req(trireme_proto::Op::Flush, 0, 0), Bytes::new()),
    ] {
        let f = raw.call(h, payload).await.unwrap();
        assert_eq!(f.header.status, trireme_proto::Status::Ok, "{:?}", h.op);
    }

    c.info.epoch = 3;
    c.info.regions = vec![Region::Mirror, Region::Parity { slot: 0 }];
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "the overlay over the stripe, and the stripe under the lone write"
    );
    let mut buf = vec![0u8; 4096];
    c.replicas[mirror as usize - 1]
        .read(lone, &mut buf)
        .unwrap();
    assert!(buf.iter().all(|&b| b == 0), "the lone write was trimmed");
    // The overlay folds back into the other slot and reads the same.
    assert_eq!(
        v.encode(1, &record).await.unwrap(),
        Region::Parity { slot: 1 }
    );
    assert!(
        v.read(0, size).await.unwrap()[..] == model[..],
        "after the fold-back"
    );
}

/// What copies or compares a mirror's ranges between copies is refused on a parity volume
/// with a typed error, and a block status says all of it is data (no one copy holds it).
#[tokio::test]
async fn mirror_only_operations_are_refused_on_a_parity_volume() {
    let c = cluster().await;
    let size = c.info.size;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let not_built = |r: Result<(), VolumeError>, what: &str| match r {
        Err(VolumeError::Layout {
            source: trireme_replication::LayoutError::NotBuilt(w),
            ..
        }) => assert_eq!(w, what),
        other => panic!("{what}: {other:?}"),
    };
    not_built(v.snapshot(1, 0).await.map(drop), "snapshots");
    not_built(v.rollback(1).await, "snapshots");
    not_built(v.changed_since(1, 0, 4096).await.map(drop), "snapshots");
    not_built(v.resize(2 * size).await, "resizing");
    not_built(v.add_replica(4, None).await, "moving a copy");
    not_built(v.retire_replica(3).await, "moving a copy");
    not_built(
        crate::verify::verify_replicas(&v, 1 << 20).await.map(drop),
        "verifying copies against each other",
    );
    let all = v.block_status(4096, size - 4096).await.unwrap();
    assert_eq!(
        all,
        vec![trireme_proto::Extent {
            length: size - 4096,
            flags: 0
        }]
    );
}

#[path = "parity_managed_tests.rs"]
mod managed;

#[path = "parity_scrub_tests.rs"]
mod scrub;

#[path = "parity_batch_tests.rs"]
mod batch;
