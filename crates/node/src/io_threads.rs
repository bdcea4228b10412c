//! The node's I/O threads: the data requests of a store that blocks (reads, writes, snapshot
//! reads; flushes and the rest go to tokio's pool) run on a few threads of the node's own,
//! each taking the next request from one queue when it finishes one. The queue's order is
//! `schedule.rs`'s: reserves, then recovery against clients, then the volumes by weight.
//!
//! Why not tokio's blocking pool: it keeps up to 512 threads and wakes an idle one for every
//! task it is given. A wakeup is a futex call, a context switch and, across CPUs, an
//! interrupt (a VM exit on a virtual machine); for a 4 KiB read that is most of its cost. Here
//! a thread is woken only when every thread sleeps, so under load the requests go from the
//! queue to a thread that is already running. The count bounds the requests a node has on
//! its disk at once; `node serve --io-threads` sets it.
//!
//! Jobs must never wait for a job queued behind them (they would wait forever once every
//! thread waits): requests that wait on others' completion (an attach, a snapshot, a delete)
//! run on tokio's pool, and a data request only waits for requests already running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::schedule::{Class, Scheduler, Share};

/// Threads of a node whose flag does not say.
pub const DEFAULT_IO_THREADS: usize = 4;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug)]
pub(crate) struct IoThreads {
    shared: Arc<Shared>,
    /// The most threads started.
    limit: AtomicUsize,
    name: String,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// The scheduler's clock counts from here.
    started: Instant,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            queue: Mutex::default(),
            ready: Condvar::new(),
            started: Instant::now(),
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.lock();
        f.debug_struct("Shared")
            .field("queued", &q.jobs.len())
            .field("threads", &q.threads)
            .field("idle", &q.idle)
            .finish()
    }
}

#[derive(Default)]
struct Queue {
    jobs: Scheduler<Job>,
    /// Threads started and not exited.
    threads: usize,
    /// Threads waiting for a job.
    idle: usize,
    /// Set when the node is dropped: threads exit once the queue is empty.
    closed: bool,
}

/// The job was lost: its thread could not start, or it panicked.
#[derive(Debug)]
pub(crate) struct Lost(pub String);

impl Shared {
    fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn work(self: Arc<Self>) {
        let mut q = self.lock();
        loop {
            if let Some((job, _)) = q.jobs.pop(self.now()) {
                drop(q);
                // A panic is answered as a lost job (its sender is dropped) and leaves the
                // thread serving.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                q = self.lock();
                continue;
            }
            if q.closed {
                q.threads -= 1;
                return;
            }
            q.idle += 1;
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            q.idle -= 1;
        }
    }
}

impl IoThreads {
    /// Up to `limit` threads (at least one), started as the queue needs them, named `name`.
    pub(crate) fn new(limit: usize, name: impl Into<String>) -> IoThreads {
        IoThreads {
            shared: Arc::default(),
            limit: AtomicUsize::new(limit.max(1)),
            name: name.into(),
        }
    }

    /// At most `limit` threads from now on (at least one); threads past it, if any, stay.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit.max(1), Ordering::Relaxed);
    }

    /// Recovery's share of the threads while clients wait too, in percent.
    pub(crate) fn set_recovery_share(&self, percent: u32) {
        self.shared.lock().jobs.set_recovery_share(percent);
    }

    /// `volume`'s reserve and weight from now on.
    pub(crate) fn set_share(&self, volume: u64, share: Share) {
        self.shared.lock().jobs.set_share(volume, share);
    }

    /// Every volume's reserve and weight (the rest get the default).
    pub(crate) fn set_shares(&self, shares: std::collections::HashMap<u64, Share>) {
        self.shared.lock().jobs.set_shares(shares);
    }

    pub(crate) fn share(&self, volume: u64) -> Share {
        self.shared.lock().jobs.share(volume)
    }

    /// Forgets a deleted replica's volume.
    pub(crate) fn forget(&self, volume: u64) {
        self.shared.lock().jobs.forget(volume);
    }

    /// Runs `f`, which costs `cost` 8 KiB units, for `class` on a thread of the pool, in the
    /// scheduler's turn; its result, or why it was lost.
    pub(crate) async fn run<R: Send + 'static>(
        &self,
        class: Class,
        cost: u64,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, Lost> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.push(class, cost, job)?;
        rx.await
            .map_err(|_| Lost("the I/O thread serving it panicked".into()))
    }

    fn push(&self, class: Class, cost: u64, job: Job) -> Result<(), Lost> {
        let now = self.shared.now();
        let mut q = self.shared.lock();
        q.jobs.push(class, cost, job, now);
        if q.idle > 0 {
            // Woken after the lock is let go: woken under it, the thread ran straight into
            // the lock still held and slept on it again (under s2d, most of the nodes'
            // futex calls were that second sleep and its wake-up).
            drop(q);
            self.shared.ready.notify_one();
            return Ok(());
        }
        if q.threads >= self.limit.load(Ordering::Relaxed) {
            // A running thread takes it when it finishes its own.
            return Ok(());
        }
        q.threads += 1;
        let shared = self.shared.clone();
        let started = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || shared.work());
        if let Err(e) = started {
            q.threads -= 1;
            if q.threads == 0 {
                // Nothing would ever take it (nor anything queued before it: none is).
                let _ = q.jobs.pop(now);
                return Err(Lost(format!("starting an I/O thread: {e}")));
            }
            tracing::warn!("starting an I/O thread: {e}; {} serve", q.threads);
        }
        Ok(())
    }

    /// Threads started and not exited (tests).
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.shared.lock().threads
    }
}

impl Drop for IoThreads {
    fn drop(&mut self) {
        // Not joined: the last reference to the node may be dropped on one of these threads.
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn jobs_past_the_limit_wait_for_a_running_thread_and_all_complete() {
        let pool = Arc::new(IoThreads::new(3, "io-test"));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let results = rt().block_on(async {
            let jobs = (0..40u64).map(|i| {
                let (running, most, pool) = (running.clone(), most.clone(), pool.clone());
                async move {
                    pool.run(Class::Client(1), 1, move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        running.fetch_sub(1, Ordering::SeqCst);
                        i * 2
                    })
                    .await
                    .unwrap()
                }
            });
            spawn_all(jobs).await
        });
        assert_eq!(results, (0..40u64).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(pool.threads(), 3, "never more threads than the limit");
        assert!(
            most.load(Ordering::SeqCst) >= 2,
            "jobs ran side by side on more than one thread"
        );
        assert!(most.load(Ordering::SeqCst) <= 3);
    }

    #[test]
    fn a_panicking_job_is_reported_lost_and_its_thread_goes_on_serving() {
        let pool = IoThreads::new(1, "io-test");
        rt().block_on(async {
            let lost = pool
                .run(Class::Client(1), 1, || -> u32 { panic!("a store bug") })
                .await;
            assert!(matches!(lost, Err(Lost(m)) if m.contains("panicked")));
            assert_eq!(pool.run(Class::Client(1), 1, || 7).await.unwrap(), 7);
        });
        assert_eq!(pool.threads(), 1);
    }

    #[test]
    fn threads_exit_once_the_pool_is_dropped() {
        let pool = IoThreads::new(2, "io-test");
        rt().block_on(async { pool.run(Class::Client(1), 1, || ()).await.unwrap() });
        let shared = pool.shared.clone();
        drop(pool);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while shared.lock().threads > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "threads still running"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Spawns every future as a task, then awaits their outputs in order.
    async fn spawn_all<F: std::future::Future<Output = u64> + Send + 'static>(
        jobs: impl Iterator<Item = F>,
    ) -> Vec<u64> {
        let handles: Vec<_> = jobs.map(tokio::spawn).collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    }
}
