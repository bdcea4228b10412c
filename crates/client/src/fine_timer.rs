//! Waits shorter than tokio's timers keep (issue 68's limits).
//!
//! - **Why.** Tokio's timers tick each millisecond, and a sleep wakes on a tick after its
//!   deadline. A request its limit holds for 50 us slept 1-2 ms. With 40 requests in flight
//!   and a limit of 50,000 IOPS, a request may wait at most 40/50,000 s less its own latency
//!   (under 0.1 ms here) before the volume falls below its limit. With the millisecond timer,
//!   a volume limited to 50,000 did 30,000 (`bench/qos.sh`, 2026-12-04).
//! - **How.** One thread per process sleeps until the earliest deadline on a condition
//!   variable: a futex wait with the kernel's high-resolution timers, give or take the
//!   thread's timer slack (50 us by default). It then wakes every waiter that is due.
//! - **Cancelled waits.** A waiter dropped before its deadline leaves its entry behind. The
//!   entry is dropped at the deadline, and the thread's send goes nowhere.
//! - **Clocks.** The thread keeps real time: a caller's deadline is turned into a real one by
//!   the wait left on tokio's clock. A runtime whose clock is paused (the simulator's) must
//!   not come here, since its time moves on without the thread: the simulator sets no limits,
//!   and a volume without limits never waits.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, MutexGuard, Once, OnceLock};
use std::time::Instant;

use tokio::sync::oneshot;

/// Waits longer than this go to tokio's timer: a tick late is little beside them.
pub(crate) const FINE_NS: u64 = 2_000_000;

struct Waiter {
    at: Instant,
    /// Arrival order, so that equal deadlines still compare as distinct.
    seq: u64,
    tx: oneshot::Sender<()>,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Queue {
    waiters: BinaryHeap<Reverse<Waiter>>,
    seq: u64,
}

#[derive(Default)]
struct Timer {
    queue: Mutex<Queue>,
    /// Signalled when a waiter comes with a deadline earlier than any before it.
    earlier: Condvar,
}

impl Timer {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The thread: wakes the waiters due, then sleeps until the next deadline or an
    /// earlier waiter.
    #[allow(clippy::disallowed_methods)] // real time: see the module docs
    fn run(&self) {
        let mut q = self.lock();
        loop {
            let now = Instant::now();
            while q.waiters.peek().is_some_and(|Reverse(w)| w.at <= now) {
                if let Some(Reverse(w)) = q.waiters.pop() {
                    let _ = w.tx.send(());
                }
            }
            q = match q.waiters.peek() {
                Some(Reverse(w)) => {
                    let wait = w.at.saturating_duration_since(now);
                    let woken = self.earlier.wait_timeout(q, wait);
                    woken.unwrap_or_else(|e| e.into_inner()).0
                }
                None => self.earlier.wait(q).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<Timer> = OnceLock::new();
    static THREAD: Once = Once::new();
    let t = TIMER.get_or_init(Timer::default);
    THREAD.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("trireme-fine-timer".into())
            .spawn(move || t.run());
        if let Err(e) = spawned {
            // Without its thread no waiter would wake: say so where it shows first.
            panic!("cannot start the fine timer's thread: {e}");
        }
    });
    t
}

/// Sleeps until `at`, to within the kernel's timer slack rather than a millisecond.
#[allow(clippy::disallowed_methods)] // real time: see the module docs
pub(crate) async fn sleep_until(at: tokio::time::Instant) {
    let wait = at.saturating_duration_since(tokio::time::Instant::now());
    if wait.is_zero() {
        return;
    }
    let at = Instant::now() + wait;
    let (tx, rx) = oneshot::channel();
    let t = timer();
    let first = {
        let mut q = t.lock();
        q.seq += 1;
        let seq = q.seq;
        let first = q.waiters.peek().is_none_or(|Reverse(w)| at < w.at);
        q.waiters.push(Reverse(Waiter { at, seq, tx }));
        first
    };
    if first {
        t.earlier.notify_one();
    }
    let _ = rx.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiter_never_wakes_before_its_deadline_and_each_wakes() {
        let start = tokio::time::Instant::now();
        // Out of order, some equal, some past: each wakes at or after its own deadline.
        let offsets_us = [900u64, 100, 500, 500, 0, 1500, 50, 300];
        let waits = offsets_us.map(|us| async move {
            let at = start + Duration::from_micros(us);
            sleep_until(at).await;
            assert!(
                tokio::time::Instant::now() >= at,
                "woke before its deadline"
            );
        });
        tokio::time::timeout(Duration::from_secs(10), futures_join(waits))
            .await
            .expect("every waiter wakes");
    }

    #[tokio::test]
    async fn a_dropped_waiter_does_not_stop_the_others() {
        let start = tokio::time::Instant::now();
        let dropped = sleep_until(start + Duration::from_millis(1));
        drop(dropped);
        let cancelled = tokio::time::timeout(
            Duration::from_micros(10),
            sleep_until(start + Duration::from_millis(5)),
        );
        let _ = cancelled.await;
        let next = start + Duration::from_millis(20);
        tokio::time::timeout(Duration::from_secs(10), sleep_until(next))
            .await
            .expect("the next waiter still wakes");
        assert!(
            tokio::time::Instant::now() >= next,
            "woke before its deadline"
        );
    }

    async fn futures_join<F: std::future::Future<Output = ()> + Send>(fs: [F; 8]) {
        let boxed: Vec<crate::BoxFut<'_, ()>> = fs
            .into_iter()
            .map(|f| Box::pin(f) as crate::BoxFut<'_, ()>)
            .collect();
        crate::join_all(boxed).await;
    }
}
