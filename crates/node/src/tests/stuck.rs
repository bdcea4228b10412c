//! A store whose writes stall until released: writes stuck in the device, for the tests of
//! what waits for what.

use super::*;

/// A blocking memory store whose writes of `b"slow"` wait until released: writes stuck in
/// the device. Counts the stuck writes, and names the threads writes ran on.
#[derive(Debug, Default)]
pub(super) struct Stuck {
    inner: trireme_store::MemoryStore,
    pub(super) state: Arc<(std::sync::Mutex<StuckState>, std::sync::Condvar)>,
}

#[derive(Debug, Default)]
pub(super) struct StuckState {
    pub(super) stuck: usize,
    pub(super) released: bool,
    /// The names of the threads writes ran on.
    pub(super) threads: HashSet<String>,
}

#[derive(Debug)]
struct StuckReplica {
    inner: Arc<dyn Replica>,
    state: Arc<(std::sync::Mutex<StuckState>, std::sync::Condvar)>,
}

impl trireme_store::filter::StoreFilter for Stuck {
    fn next(&self) -> &dyn Store {
        &self.inner
    }
    fn blocking(&self) -> bool {
        true
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        Ok(Arc::new(StuckReplica {
            inner: self.inner.create(volume, size)?,
            state: self.state.clone(),
        }))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        Vec::new()
    }
}

impl trireme_store::filter::ReplicaFilter for StuckReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        let (m, cv) = &*self.state;
        let mut g = m.lock().unwrap();
        let name = std::thread::current().name().unwrap_or("?").to_string();
        g.threads.insert(name);
        if data == b"slow" {
            g.stuck += 1;
            cv.notify_all();
            while !g.released {
                g = cv.wait(g).unwrap();
            }
            g.stuck -= 1;
        }
        drop(g);
        self.inner.write(offset, data, fua)
    }
}

/// Waits, on a blocking thread, until `n` writes are stuck.
pub(super) async fn wait_stuck(
    state: &Arc<(std::sync::Mutex<StuckState>, std::sync::Condvar)>,
    n: usize,
) {
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let (m, cv) = &*state;
        let mut g = m.lock().unwrap();
        while g.stuck < n {
            g = cv.wait(g).unwrap();
        }
    })
    .await
    .unwrap();
}

/// Lets every stuck write, and every later one, finish.
pub(super) fn release(state: &(std::sync::Mutex<StuckState>, std::sync::Condvar)) {
    let (m, cv) = state;
    m.lock().unwrap().released = true;
    cv.notify_all();
}
