//! The task that progresses the worker (see [`drive`]).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::hub::Hub;
use super::*;

/// The worker's event fd, as tokio's reactor watches it (the worker owns and closes it).
struct EventFd(RawFd);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Clears the driver's flags when its task ends.
struct Alive(&'static Hub, Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.1.store(false, Ordering::Release);
        // A driver started meanwhile sets it again on the next call's slow path.
        self.0.driven.store(false, Ordering::Release);
    }
}

/// The task that progresses the worker: until idle (a batch at a time, so other tasks of a
/// single-threaded runtime get their turn), then the answers handlers produced, then asleep
/// on the worker's event fd (armed) or a kick. No busy loop and no thread of its own: an
/// answer wakes the runtime that waits for it, as a TCP socket would.
pub(super) async fn drive(hub: &'static Hub, alive: Arc<AtomicBool>) {
    let _alive = Alive(hub, alive);
    let efd = EventFd(hub.worker.event_fd());
    // SAFETY: the event fd is the worker's, open for as long as the worker, which lives as
    // long as the process (the hub is never dropped); `EventFd` always returns the same fd.
    let fd = match unsafe { AsyncFd::register_with_interest(efd, Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("UCX worker's event fd cannot be watched: {e}");
            return;
        }
    };
    let (mut yields, mut busy) = (0, None);
    let mut worked = std::time::Instant::now();
    loop {
        let mut n = 0;
        while n < PROGRESS_BATCH && hub.worker.progress() {
            n += 1;
        }
        if n > 0 {
            busy = None;
            worked = std::time::Instant::now();
        }
        let out = std::mem::take(&mut *lock(&hub.outbox));
        for (ep, resp, secret) in out {
            hub.send_answer(ep, resp, secret);
        }
        if n == PROGRESS_BATCH {
            tokio::task::yield_now().await;
            continue;
        }
        // Sends UCX left pending: with a shared-memory FIFO full, only progress after the
        // receiver drains it completes them, and nothing will wake us for that. Give the CPU
        // to the receiver a few times, then sleep with a short timeout rather than for good.
        let sending = hub.worker.sends_pending();
        if sending && yields < SEND_YIELDS {
            yields += 1;
            std::thread::yield_now();
            continue;
        }
        yields = 0;
        // Work came in lately: look again soon, the next message is likely on its way (see
        // SPIN). Each look gives the CPU to whoever can run first.
        if !sending && worked.elapsed() < SPIN {
            std::thread::yield_now();
            tokio::task::yield_now().await;
            continue;
        }
        // Nothing came in this round: before arming (which costs the peers a signal and us a
        // wake-up for their next message), give the CPU to a runnable process a couple of
        // times and look again. On a busy host a peer that is about to send usually is one;
        // on an idle one the yields return at once. Bounded: this is not a poll loop.
        if n == 0 && !sending && idle_yields(hub) {
            worked = std::time::Instant::now();
            continue;
        }
        match hub.worker.arm() {
            Ok(true) => busy = None,
            // Events came in meanwhile: progress again. UCX also says busy while a send waits
            // for room in a peer's FIFO, which a dead peer never makes: never loop without
            // letting the runtime run, and once busy has lasted both BUSY_ROUNDS rounds and
            // BUSY_SPIN with nothing done, wait for an event or a short timeout between tries.
            Ok(false) => {
                let (since, rounds) = busy.get_or_insert_with(|| (std::time::Instant::now(), 0));
                *rounds += 1;
                if *rounds > BUSY_ROUNDS && since.elapsed() > BUSY_SPIN {
                    tokio::select! {
                        r = fd.readable() => { if let Ok(mut g) = r { g.clear_ready(); } }
                        _ = hub.kick.notified() => {}
                        _ = tokio::time::sleep(SEND_RETRY) => {}
                    }
                } else {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            Err(e) => {
                tracing::error!("UCX worker: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let retry = async {
            if sending {
                tokio::time::sleep(SEND_RETRY).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            r = fd.readable() => {
                if let Ok(mut g) = r {
                    g.clear_ready();
                }
            }
            _ = hub.kick.notified() => {}
            _ = retry => {}
        }
    }
}

/// Yields the CPU up to [`IDLE_YIELDS`] times, progressing the worker after each; true as
/// soon as that finds work.
fn idle_yields(hub: &Hub) -> bool {
    (0..IDLE_YIELDS).any(|_| {
        std::thread::yield_now();
        hub.worker.progress()
    })
}
