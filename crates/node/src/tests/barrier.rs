//! The attach barrier (`serve.rs`, `io_replica`): a store whose writes stall until released
//! stands for a write stuck in a device.

use super::*;

/// A memory store whose writes of the payload `b"slow"` wait until released: a write stuck in
/// the device.
#[derive(Debug, Default)]
struct Stalling {
    inner: trireme_store::MemoryStore,
    /// (a slow write is in the store, it may finish)
    gate: Arc<(std::sync::Mutex<(bool, bool)>, std::sync::Condvar)>,
}

#[derive(Debug)]
struct StallingReplica {
    inner: Arc<dyn Replica>,
    gate: Arc<(std::sync::Mutex<(bool, bool)>, std::sync::Condvar)>,
}

impl trireme_store::filter::StoreFilter for Stalling {
    fn next(&self) -> &dyn Store {
        &self.inner
    }
    fn blocking(&self) -> bool {
        true
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        Ok(Arc::new(StallingReplica {
            inner: self.inner.create(volume, size)?,
            gate: self.gate.clone(),
        }))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        Vec::new()
    }
}

impl trireme_store::filter::ReplicaFilter for StallingReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        if data == b"slow" {
            let (m, cv) = &*self.gate;
            let mut g = m.lock().unwrap();
            g.0 = true;
            cv.notify_all();
            while !g.1 {
                g = cv.wait(g).unwrap();
            }
        }
        self.inner.write(offset, data, fua)
    }
}

/// A writer that gave up on a write (it timed out in the device) and attached again from a
/// new connection gets the attach's answer only once that write has finished: the retry it
/// sends next, and any newer write in the same place, cannot be overtaken by the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_waits_for_the_writes_admitted_before_it() {
    let store = Arc::new(Stalling::default());
    let gate = store.gate.clone();
    let (node, old) = start(store).await;
    let ok = |f: Frame| assert_eq!(f.header.status, Status::Ok, "{f:?}");
    ok(old
        .call(req(Op::CreateReplica, 1, 0, 0, 1 << 20), Bytes::new())
        .await
        .unwrap());
    ok(old
        .call(req(Op::Attach, 1, 4, 0, 0), Bytes::new())
        .await
        .unwrap());
    let old = Arc::new(old);
    let o = old.clone();
    let stuck = tokio::spawn(async move {
        o.call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"slow"))
            .await
    });
    // The old write is in the store, stuck.
    tokio::task::spawn_blocking({
        let gate = gate.clone();
        move || {
            let (m, cv) = &*gate;
            let mut g = m.lock().unwrap();
            while !g.0 {
                g = cv.wait(g).unwrap();
            }
        }
    })
    .await
    .unwrap();
    let addr = old.info().peer.to_string();
    let new = TcpConnection::connect(&addr, 1).await.unwrap();
    let attach = tokio::spawn(async move {
        let f = new.call(req(Op::Attach, 1, 4, 0, 0), Bytes::new()).await;
        (new, f)
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let early = attach.is_finished();
    {
        let (m, cv) = &*gate;
        m.lock().unwrap().1 = true;
        cv.notify_all();
    }
    assert!(
        !early,
        "the attach answered while a write admitted before it was still in the store"
    );
    let (new, f) = attach.await.unwrap();
    ok(f.unwrap());
    ok(stuck.await.unwrap().unwrap());
    ok(new
        .call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"new!"))
        .await
        .unwrap());
    let late = old
        .call(req(Op::Write, 1, 4, 0, 0), Bytes::from_static(b"late"))
        .await
        .unwrap();
    assert_eq!(late.header.status, Status::Superseded);
    let r = node.replica(1).unwrap_or_else(|_| panic!("replica"));
    let mut b = [0u8; 4];
    r.read(0, &mut b).unwrap();
    assert_eq!(&b, b"new!");
}
