//! Encodes in batches (`Volume::encode_batch`): what they share, and what each region keeps.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// A memory store whose replicas count their flushes.
#[derive(Debug)]
struct CountingStore {
    inner: MemoryStore,
    flushes: Arc<AtomicU64>,
}

#[derive(Debug)]
struct CountingReplica {
    inner: Arc<dyn Replica>,
    flushes: Arc<AtomicU64>,
}

impl trireme_store::filter::StoreFilter for CountingStore {
    fn next(&self) -> &dyn Store {
        &self.inner
    }
    fn create(
        &self,
        volume: u64,
        size: u64,
    ) -> Result<Arc<dyn Replica>, trireme_store::StoreError> {
        let inner = self.inner.create(volume, size)?;
        let flushes = self.flushes.clone();
        Ok(Arc::new(CountingReplica { inner, flushes }))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, trireme_store::StoreError>> {
        Vec::new()
    }
}

impl trireme_store::filter::ReplicaFilter for CountingReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn flush(&self) -> Result<(), trireme_store::StoreError> {
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.flush()
    }
}

/// Regions encoded together share one flush of the stripe's nodes, and their trims come to
/// each mirror together. A flush stalls the writes around it: one per region cost a 2+1
/// volume's hot writes a quarter of their IOPS beside the encoder. Each region still ends
/// on its own (one past the volume's end is refused, the others encoded), and everything
/// reads back.
#[tokio::test]
async fn regions_encoded_together_share_their_flushes() {
    let flushes = Arc::new(AtomicU64::new(0));
    let counted = |f: &Arc<AtomicU64>| {
        let f = f.clone();
        move |_| {
            Arc::new(CountingStore {
                inner: MemoryStore::default(),
                flushes: f.clone(),
            }) as Arc<dyn Store>
        }
    };
    let record = |_, _| async { Ok::<(), String>(()) };
    // One at a time, for the count to compare with: per region a flush of each of the three
    // nodes and one of each of its two mirrors (their held maps, before the trims).
    let one_by_one = Arc::new(AtomicU64::new(0));
    let c = cluster_over("2+1", counted(&one_by_one)).await;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    let size = c.info.size;
    v.write(0, pattern(0, size as usize, 3), false)
        .await
        .unwrap();
    let before = one_by_one.load(Ordering::SeqCst);
    for region in 0..3 {
        v.encode(region, &record).await.unwrap();
    }
    let alone = one_by_one.load(Ordering::SeqCst) - before;
    assert_eq!(alone, 3 * (3 + 2), "one region at a time");

    let c = cluster_over("2+1", counted(&flushes)).await;
    let v = Volume::attach(c.info.clone(), TransportKind::Tcp, 1)
        .await
        .unwrap();
    v.write(0, pattern(0, size as usize, 3), false)
        .await
        .unwrap();
    let before = flushes.load(Ordering::SeqCst);
    let ends = v.encode_batch(&[2, 0, 9, 1], &record).await;
    let together = flushes.load(Ordering::SeqCst) - before;
    assert!(
        together <= 3 + 3 * 2 && together < alone,
        "{together} flushes for three regions together, {alone} one at a time"
    );
    let kinds: Vec<String> = ends
        .iter()
        .map(|e| match e {
            Ok(kind) => format!("{kind:?}"),
            Err(e) => e.to_string(),
        })
        .collect();
    assert!(
        kinds[0] == "Parity { slot: 0 }"
            && kinds[1] == kinds[0]
            && kinds[3] == kinds[0]
            && kinds[2].contains("region 9 is past the volume's end"),
        "{kinds:?}"
    );
    assert_eq!(v.read(0, size).await.unwrap(), pattern(0, size as usize, 3));
}
