//! Ordering of overlapping writes: the waiting for [`RangeOrder`] (the rule itself, I/O-free,
//! is in the replication crate). A write, resync step or pause registers its range; if an
//! earlier registered range overlaps it, its task parks until a release names its ticket.
//! Each release wakes exactly the tickets it freed, not every waiter.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;
use trireme_replication::{RangeOrder, Ticket};

#[derive(Debug, Default)]
struct Book {
    order: RangeOrder,
    /// Parked waiters, by ticket.
    parked: HashMap<Ticket, oneshot::Sender<()>>,
}

/// The byte ranges of writes in flight (or waiting) on one volume.
#[derive(Debug, Default)]
pub struct WriteOrder {
    book: Mutex<Book>,
}

/// A place in the order, then (after [`RangeGuard::wait`]) the range itself, until dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    order: &'a WriteOrder,
    ticket: Ticket,
}

impl WriteOrder {
    /// Waits until no earlier overlapping write is in flight, then holds `[start, end)`.
    pub async fn acquire(&self, start: u64, end: u64) -> RangeGuard<'_> {
        self.register(start, end).wait().await
    }

    /// Takes a place in the order for `[start, end)` now, without waiting: writes registered
    /// in some order get their ranges in that order.
    pub fn register(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let (ticket, _) = self.book().order.register(start, end);
        // The guard exists from here on, so a cancelled wait still releases its place.
        RangeGuard {
            order: self,
            ticket,
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<'a> RangeGuard<'a> {
    /// Waits until no earlier overlapping write is in flight; the range is held from then on.
    pub async fn wait(self) -> RangeGuard<'a> {
        let rx = {
            let mut book = self.order.book();
            if book.order.may_hold(self.ticket) {
                return self;
            }
            let (tx, rx) = oneshot::channel();
            book.parked.insert(self.ticket, tx);
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
        let mut book = self.order.book();
        book.parked.remove(&self.ticket);
        for t in book.order.release(self.ticket) {
            if let Some(tx) = book.parked.remove(&t) {
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

    #[tokio::test]
    async fn overlapping_writes_wait_in_order_and_others_do_not() {
        let o = Arc::new(WriteOrder::default());
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
        let book = o.book();
        assert!(book.order.is_empty() && book.parked.is_empty());
    }
}
