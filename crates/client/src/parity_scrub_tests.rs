//! Scrubs of parity volumes against real nodes (`parity_scrub.rs`).

use super::*;
use trireme_replication::ChunkAt;

/// Flips one byte at `offset` of `replica`, under its node (no held bit, no checksum
/// of the node's changes): the silent error a scrub is for.
fn rot(replica: &Arc<dyn Replica>, offset: u64) {
    let mut b = [0u8; 1];
    replica.read(offset, &mut b).unwrap();
    b[0] ^= 0x5a;
    replica.write(offset, &b, false).unwrap();
}

fn byte(replica: &Arc<dyn Replica>, offset: u64) -> u8 {
    let mut b = [0u8; 1];
    replica.read(offset, &mut b).unwrap();
    b[0]
}

async fn no_record(_: u64, _: Region) -> Result<(), String> {
    Ok(())
}

/// A scrub of a 2+2 volume: a data chunk gone wrong on its node is found (two spare chunks
/// say which) and rebuilt from the rest of its stripe; a mirror's copy that differs is
/// rewritten from the majority; a mirror that holds a block of a parity region outside the
/// overlay (it reads the same today, but a restarted writer would take it for overlay) is
/// made to match. Reads see the volume as written, and a second scrub finds nothing.
#[tokio::test]
async fn a_scrub_rebuilds_a_wrong_chunk_and_rewrites_differing_mirrors() {
    let c = cluster_of("2+2").await;
    let s = c.stripes.clone();
    let size = c.info.size;
    let region = s.region_blocks() * 4096;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let mut model = pattern(0, size as usize, 1).to_vec();
    v.write(0, Bytes::from(model.clone()), false).await.unwrap();
    assert_eq!(
        v.encode(1, no_record).await.unwrap(),
        Region::Parity { slot: 0 }
    );
    // One block of region 1 written again: the overlay.
    let over = region + 2 * 4096;
    let d = pattern(over, 4096, 7);
    v.write(over, d.clone(), false).await.unwrap();
    model[over as usize..over as usize + 4096].copy_from_slice(&d);

    let clean = v.scrub(1 << 20).await.unwrap();
    assert_eq!(clean.mismatched_regions, 0, "{clean:?}");
    assert_eq!(clean.stripes_checked, 1);
    assert_eq!(clean.bytes_compared, size);
    assert_eq!(clean.region_bytes, region);

    // A data chunk of region 1 rots on its node.
    let chunk = ChunkAt {
        node: s.node_of(1, 1),
        region: 1,
        slot: 0,
        chunk: 1,
        block: 0,
    };
    let place = s.chunk_block(&chunk) * 4096 + 100;
    let replica = |node: u32| &c.replicas[node as usize - 1];
    let good = byte(replica(chunk.node), place);
    rot(replica(chunk.node), place);
    // One of region 0's three mirrors differs in a block.
    let m0 = s.mirrors_of(0)[2];
    rot(replica(m0), s.node_block(3) * 4096);
    // One of region 1's mirrors holds a block outside the overlay: zeroes, as its trimmed
    // place reads, so only the held maps tell.
    let m1 = s.mirrors_of(1)[1];
    let i = v.core().slot_of(m1).unwrap();
    let stray = s.node_block(s.region_blocks() + 20) * 4096;
    let h = v.header(trireme_proto::Op::WriteZeroes, stray, 4096);
    v.expect_ok(i, v.call(i, h, Bytes::new()).await.unwrap())
        .unwrap();

    let r = v.scrub(1 << 20).await.unwrap();
    assert_eq!(r.mismatched_regions, 2, "{r:?}");
    assert!(r.unresolved.is_empty(), "{r:?}");
    let mut repaired = r.repaired.clone();
    repaired.sort_unstable();
    let mut want = vec![(0, m0), (region, chunk.node), (region, m1)];
    want.sort_unstable();
    assert_eq!(repaired, want);
    assert_eq!(byte(replica(chunk.node), place), good, "the chunk rebuilt");
    let at = s.node_block(s.region_blocks()) * 4096;
    assert_eq!(
        v.ask_held(i, at, region).await.unwrap(),
        vec![(s.node_block(over / 4096) * 4096, 4096)],
        "the stray block trimmed, the overlay kept"
    );
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
    let again = v.scrub(1 << 20).await.unwrap();
    assert_eq!(again.mismatched_regions, 0, "{again:?}");
}

/// 2+1, where a region has two mirrors and a stripe one spare chunk. A stripe with one
/// wrong chunk: any two of its three chunks agree, so nothing says which is wrong; the scrub
/// reports the region and writes nothing there. But the overlay settles what two mirrors
/// cannot: a mirror that lacks a block of it lost a write and is rewritten from the other,
/// and a block a mirror holds outside it (an encode's trim it missed) is trimmed, old bytes
/// and all.
#[tokio::test]
async fn a_scrub_guesses_nothing_when_no_single_chunk_explains_a_stripe() {
    let c = cluster().await;
    let s = c.stripes.clone();
    let size = c.info.size;
    let region = s.region_blocks() * 4096;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let mut model = pattern(0, size as usize, 3).to_vec();
    v.write(0, Bytes::from(model.clone()), false).await.unwrap();
    v.encode(1, no_record).await.unwrap();
    v.encode(2, no_record).await.unwrap();
    let over = region + 4 * 4096;
    let d = pattern(over, 4096, 9);
    v.write(over, d.clone(), false).await.unwrap();
    model[over as usize..over as usize + 4096].copy_from_slice(&d);

    let parity = ChunkAt {
        node: s.node_of(2, 2),
        region: 2,
        slot: 0,
        chunk: 2,
        block: 0,
    };
    let place = s.chunk_block(&parity) * 4096 + 4096;
    let replica = &c.replicas[parity.node as usize - 1];
    rot(replica, place);
    let rotten = byte(replica, place);
    // Region 1's first mirror loses the overlay's block; its second holds a block outside
    // the overlay, with bytes in it.
    let (a, b) = (s.mirrors_of(1)[0], s.mirrors_of(1)[1]);
    let vol = &v;
    let send = |node: u32, op, flags, block: u64, data: Bytes| {
        let v = vol;
        let i = v.core().slot_of(node).unwrap();
        let mut h = v.header(op, s.node_block(block) * 4096, 4096);
        h.flags |= flags;
        async move { v.expect_ok(i, v.call(i, h, data).await.unwrap()).unwrap() }
    };
    send(
        a,
        trireme_proto::Op::WriteZeroes,
        trireme_proto::FLAG_MAY_TRIM,
        over / 4096,
        Bytes::new(),
    )
    .await;
    let stray = s.region_blocks() + 30;
    send(
        b,
        trireme_proto::Op::Write,
        0,
        stray,
        pattern(stray * 4096, 4096, 1),
    )
    .await;

    let r = v.scrub(1 << 20).await.unwrap();
    assert_eq!(r.mismatched_regions, 2, "{r:?}");
    assert_eq!(r.unresolved, vec![2 * region]);
    let mut repaired = r.repaired.clone();
    repaired.sort_unstable();
    let mut want = vec![(region, a), (region, b)];
    want.sort_unstable();
    assert_eq!(repaired, want, "{r:?}");
    assert_eq!(byte(replica, place), rotten, "left alone");
    assert!(
        r.verified.is_empty(),
        "nothing verified while a region is unresolved"
    );
    assert!(v.read(0, size).await.unwrap()[..] == model[..]);
    let at = s.node_block(s.region_blocks()) * 4096;
    for node in [a, b] {
        let i = v.core().slot_of(node).unwrap();
        assert_eq!(
            v.ask_held(i, at, region).await.unwrap(),
            vec![(s.node_block(over / 4096) * 4096, 4096)],
            "node {node} holds the overlay and only it"
        );
    }
}
