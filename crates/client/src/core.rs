//! The volume's [`VolumeCore`] behind one plain mutex, and the waiting the write order needs.
//!
//! Every decision about replicas lives in the core (`trireme-replication`); this file only
//! keeps it behind a lock that is never held across an `.await`, and parks tasks whose range
//! an earlier overlapping write holds. A write, resync step or pause registers its range; if
//! it may not hold it yet, its task parks until a release names its ticket. Each release
//! wakes exactly the tickets it freed, not every waiter.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;
use trireme_replication::{Ticket, VolumeCore};

#[derive(Debug)]
struct Inner {
    core: VolumeCore,
    /// Parked waiters, by ticket.
    parked: HashMap<Ticket, oneshot::Sender<()>>,
}

/// One volume's core, shared by its request tasks and background tasks.
#[derive(Debug)]
pub(crate) struct Core {
    inner: Mutex<Inner>,
}

/// The core, locked. Used within one statement or a short block, never across an `.await`.
pub(crate) struct Locked<'a>(MutexGuard<'a, Inner>);

impl Deref for Locked<'_> {
    type Target = VolumeCore;
    fn deref(&self) -> &VolumeCore {
        &self.0.core
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut VolumeCore {
        &mut self.0.core
    }
}

/// A place in the write order, then (after [`RangeGuard::wait`]) the range itself, until
/// dropped.
#[derive(Debug)]
pub(crate) struct RangeGuard<'a> {
    core: &'a Core,
    ticket: Ticket,
}

impl Core {
    pub(crate) fn new(core: VolumeCore) -> Core {
        Core {
            inner: Mutex::new(Inner {
                core,
                parked: HashMap::new(),
            }),
        }
    }

    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked(self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until no earlier overlapping write is in flight, then holds `[start, end)`.
    pub(crate) async fn acquire(&self, start: u64, end: u64) -> RangeGuard<'_> {
        self.register(start, end).wait().await
    }

    /// Takes a place in the order for `[start, end)` now, without waiting: writes registered
    /// in some order get their ranges in that order.
    pub(crate) fn register(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let (ticket, _) = self.lock().register(start, end);
        self.guard(ticket)
    }

    /// Like [`Core::register`], but only if writes may go on now (enough copies in sync), in
    /// the same lock: the write path's one visit to the core before sending.
    pub(crate) fn register_if_enough(&self, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        let mut c = self.lock();
        if !c.enough() {
            return None;
        }
        let (ticket, _) = c.register(start, end);
        drop(c);
        Some(self.guard(ticket))
    }

    fn guard(&self, ticket: Ticket) -> RangeGuard<'_> {
        // The guard exists from here on, so a cancelled wait still releases its place.
        RangeGuard { core: self, ticket }
    }
}

impl<'a> RangeGuard<'a> {
    /// Waits until no earlier overlapping write is in flight; the range is held from then on.
    pub(crate) async fn wait(self) -> RangeGuard<'a> {
        let rx = {
            let mut inner = self.core.inner.lock().unwrap_or_else(|e| e.into_inner());
            if inner.core.may_hold(self.ticket) {
                return self;
            }
            let (tx, rx) = oneshot::channel();
            inner.parked.insert(self.ticket, tx);
            rx
        };
        // Sent by the release that frees this ticket. Never dropped unsent while this guard
        // lives: only this guard's own drop removes its ticket.
        let _ = rx.await;
        self
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.core.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.parked.remove(&self.ticket);
        for t in inner.core.release(self.ticket) {
            if let Some(tx) = inner.parked.remove(&t) {
                let _ = tx.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use trireme_replication::ReplicaState;

    #[tokio::test]
    async fn overlapping_writes_wait_in_order_and_others_do_not() {
        let o = Arc::new(Core::new(VolumeCore::new(
            &[(1, ReplicaState::InSync)],
            0,
            false,
            4,
        )));
        let a = o.acquire(0, 8192).await;
        // Disjoint: no wait.
        let b = tokio::time::timeout(Duration::from_millis(100), o.acquire(8192, 4096 * 3))
            .await
            .expect("disjoint write waited");
        // Overlapping: waits for `a`.
        let o2 = o.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let t = tokio::spawn(async move {
            let _g = o2.acquire(4096, 8192).await;
            tx.send(()).unwrap();
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            rx.try_recv().is_err(),
            "overlapping write went ahead of an earlier one"
        );
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap();
        t.await.unwrap();
        drop(b);
        let inner = o.inner.lock().unwrap();
        assert!(inner.core.places() == 0 && inner.parked.is_empty());
    }
}
