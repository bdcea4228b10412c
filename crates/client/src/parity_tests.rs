//! A parity volume's writer against real nodes over memory stores, served over TCP on
//! 127.0.0.1.

use std::sync::Arc;

use bytes::Bytes;
use trireme_replication::{Layout, Parity, ReplicaState, Stripes};
use trireme_store::{MemoryStore, Replica, Store};
use trireme_transport::TransportKind;

use crate::{AttachInfo, ReplicaTarget, Volume, VolumeError};

const VOLUME: u64 = 9;

/// A 2+1 volume of three regions (512 KiB each).
fn geometry() -> (Parity, Stripes, u64) {
    let p = Parity::parse("2+1", None).unwrap();
    let s = Stripes::new(&p, vec![1, 2, 3]).unwrap();
    let size = 3 * s.region_blocks() * 4096;
    (p, s, size)
}

/// A node over a memory store holding the volume's replica, and that replica.
async fn node(id: u32, replica_size: u64) -> (ReplicaTarget, Arc<dyn Replica>) {
    let store = Arc::new(MemoryStore::default());
    let replica = store.create(VOLUME, replica_size).expect("create replica");
    let node = Arc::new(trireme_node::Node::new(id, store));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(trireme_transport::tcp::serve(listener, node));
    let target = ReplicaTarget {
        node: id,
        addr,
        local_addr: None,
        state: ReplicaState::InSync,
        incarnation: 0,
    };
    (target, replica)
}

struct Cluster {
    info: AttachInfo,
    replicas: Vec<Arc<dyn Replica>>,
    stripes: Stripes,
}

async fn cluster() -> Cluster {
    let (p, stripes, size) = geometry();
    let replica_size = stripes.replica_blocks(size / 4096) * 4096;
    let (mut targets, mut replicas) = (Vec::new(), Vec::new());
    for id in 1..=3 {
        let (t, r) = node(id, replica_size).await;
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
    // Regions in parity: their overlay cannot be found again yet.
    let mut encoded = c.info.clone();
    encoded.regions = vec![
        trireme_replication::Region::Mirror,
        trireme_replication::Region::Parity { slot: 0 },
        trireme_replication::Region::Mirror,
    ];
    let e = Volume::attach(encoded, TransportKind::Tcp, 1)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not built yet"), "{e}");
}
