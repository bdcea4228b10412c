//! Ordering of overlapping writes.
//!
//! NBD lets a client have two overlapping writes in flight at once and promises nothing about
//! which lands last. A mirror must still make every replica pick the *same* one, or the copies
//! diverge (DESIGN.md guarantee 2). So, as DRBD does with conflicting requests, a write waits
//! while an earlier write overlapping it is in flight: overlapping writes reach every replica one
//! after the other, in arrival order (first come, first served, so none starves). Writes that do
//! not overlap never wait.

use std::sync::Mutex;

use tokio::sync::Notify;

#[derive(Debug)]
struct Entry {
    start: u64,
    end: u64,
    ticket: u64,
}

/// The byte ranges of writes in flight (or waiting) on one volume.
#[derive(Debug, Default)]
pub struct WriteOrder {
    entries: Mutex<(u64, Vec<Entry>)>,
    changed: Notify,
}

/// A place in the order, then (after [`RangeGuard::wait`]) the range itself, until dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    order: &'a WriteOrder,
    ticket: u64,
    start: u64,
    end: u64,
}

impl WriteOrder {
    /// Waits until no earlier overlapping write is in flight, then holds `[start, end)`.
    pub async fn acquire(&self, start: u64, end: u64) -> RangeGuard<'_> {
        self.register(start, end).wait().await
    }

    /// Takes a place in the order for `[start, end)` now, without waiting: writes registered
    /// in some order get their ranges in that order.
    pub fn register(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let ticket = {
            let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            g.0 += 1;
            let ticket = g.0;
            g.1.push(Entry { start, end, ticket });
            ticket
        };
        // The guard exists from here on, so a cancelled wait still releases its place.
        RangeGuard {
            order: self,
            ticket,
            start,
            end,
        }
    }
}

impl<'a> RangeGuard<'a> {
    /// Waits until no earlier overlapping write is in flight; the range is held from then on.
    pub async fn wait(self) -> RangeGuard<'a> {
        let order = self.order;
        loop {
            let notified = order.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let blocked = {
                let g = order.entries.lock().unwrap_or_else(|e| e.into_inner());
                g.1.iter()
                    .any(|e| e.ticket < self.ticket && e.start < self.end && self.start < e.end)
            };
            if !blocked {
                return self;
            }
            notified.await;
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut g = self.order.entries.lock().unwrap_or_else(|e| e.into_inner());
        g.1.retain(|e| e.ticket != self.ticket);
        let waiting = !g.1.is_empty();
        drop(g);
        if waiting {
            self.order.changed.notify_waiters();
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
        assert!(o.entries.lock().unwrap().1.is_empty());
    }
}
