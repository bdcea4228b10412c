//! The pool's growth. A redirect takes the lowest free block; when none is left, the pool
//! grows: the physical replica is resized (`Replica::resize`, under the gate held exclusive,
//! since the layers below keep writes out of a resize) and the table gets the new blocks.
//!
//! **Zeroed ahead.** On a file store the space a resize adds is a hole. The first O_DIRECT
//! write to each block of it makes the file system allocate the block, then mark the extent
//! written when the write completes: a journal transaction in a kernel worker that the write
//! waits for. `examples/redirect_cost.rs` puts that at about half of what a redirect costs
//! the machine beyond a write in place (with the pool zeroed beforehand, a redirected write
//! took 1.21-1.38x the machine's CPU of a write in place, against 1.52-1.71x). So a replica
//! whose versions persist grows its pool ahead of need, in a thread of its own:
//!
//! 1. It starts when fewer than half a step's blocks are free: seen by a redirect, or by a
//!    snapshot taken (the first snapshot's writes all redirect).
//! 2. Under the gate held exclusive, it resizes the physical replica by a step (as a grow in
//!    the foreground did).
//! 3. It allocates the new space in one call (`Replica::reserve`: `fallocate` on a file
//!    store; an O_DIRECT write into a hole holds the file's lock exclusive through its I/O,
//!    stalling every read of the replica, where one into allocated space shares it). Then
//!    it writes zeros over it a megabyte at a time, each under the gate held shared, as any
//!    write. Only then are that megabyte's blocks given to the free list. No
//!    write can take a block being zeroed, and a redirect lands on space already written, as
//!    a write in place does.
//!
//! A write that finds no free block meanwhile waits for the next megabyte. With no thread
//! running (it failed, say for want of space), the pool grows at once, as a hole.
//!
//! The zeros take real space ahead of need: at most a step (64 MiB, or a sixteenth of the
//! volume, and never more than the volume). Free blocks' space goes back to the file system only when a crash left it taken
//! (`VersionedReplica::hold_free` at open). A volatile store has no such cost to avoid and
//! grows in the foreground; so do the simulator's nodes
//! ([`super::VersionedStore::with_foreground_growth`]), whose seeds a thread would make
//! non-deterministic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use super::table::BLOCK;
use super::{VersionedReplica, ZERO_CHUNK};
use crate::StoreError;

/// How long a write that found no free block waits for the growing thread before it looks
/// again (it is woken sooner as each megabyte joins the free list).
const WAIT: Duration = Duration::from_millis(50);

/// A store's threads growing pools ahead.
#[derive(Debug, Default)]
pub(super) struct Growers {
    /// Set when the store goes: each thread stops before its next megabyte.
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Growers {
    fn add(&self, t: JoinHandle<()>) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.retain(|t| !t.is_finished());
        threads.push(t);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Stops every thread and waits for it.
    pub(super) fn stop_all(&self) {
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl VersionedReplica {
    /// Bytes the pool grows by at once: [`super::GROW_MIN`] (or the store's own least), or a
    /// sixteenth of the replica if that is more.
    fn grow_step(&self) -> u64 {
        self.grow_min.max(self.size.load(Ordering::Acquire) / 16) / BLOCK * BLOCK
    }

    /// Bytes the pool grows ahead by at once: a step, but no more than the replica (the
    /// space stays taken, and a small volume's writes need less).
    fn zero_step(&self) -> u64 {
        let size = self.size.load(Ordering::Acquire) / BLOCK * BLOCK;
        self.grow_step().min(size.max(BLOCK))
    }

    /// True if the pool should start growing ahead, with `free` blocks free: fewer than half
    /// a step's.
    pub(super) fn runs_low(&self, free: usize) -> bool {
        self.zero_ahead
            && (free as u64) < self.zero_step() / BLOCK / 2
            && !self.growing.load(Ordering::Acquire)
    }

    /// Wakes the writes waiting in [`VersionedReplica::grow`] once they can see what changed:
    /// the lock is taken between the change and the wake-up, so a write that found no block
    /// either looks after the change or is already waiting.
    fn wake_waiters(&self) {
        drop(self.growth.lock().unwrap_or_else(|e| e.into_inner()));
        self.grown.notify_all();
    }

    /// A write found no free block: waits while a thread grows the pool ahead, or grows it now
    /// (space left as a hole), reusing freed blocks first.
    pub(super) fn grow(&self) -> Result<(), StoreError> {
        {
            let mut waiting = self.growth.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if self.table().free_blocks() > 0 {
                    return Ok(());
                }
                let owned =
                    self.growing
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire);
                if owned.is_ok() {
                    break;
                }
                waiting = self
                    .grown
                    .wait_timeout(waiting, WAIT)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let r = self.grow_now();
        self.growing.store(false, Ordering::Release);
        self.wake_waiters();
        r
    }

    /// [`VersionedReplica::grow`] in the foreground, the growth owned.
    fn grow_now(&self) -> Result<(), StoreError> {
        let _g = self.exclusive();
        if self.table().free_blocks() > 0 {
            return Ok(());
        }
        // The blocks whose space was to go back are overwritten now instead: no punch.
        let _overwritten = self.settle_locked(false)?;
        self.table().unhold_all();
        if self.table().free_blocks() > 0 {
            return Ok(());
        }
        // Past the table's end there may be space a zeroing cut short left unlisted: it
        // joins too.
        let phys = self.inner.size();
        let end = phys + self.grow_step();
        self.inner.resize(end)?;
        self.table().grow(end / BLOCK);
        tracing::debug!(volume = self.vol(), pool = end, "snapshot pool grew");
        Ok(())
    }

    /// After a snapshot: the writes that follow redirect, so the pool grows ahead now if low.
    pub(super) fn grow_ahead_if_low(&self) {
        let free = self.table().free_blocks();
        if self.runs_low(free) {
            self.grow_ahead();
        }
    }

    /// Starts a thread growing the pool ahead, zeroed (see the module docs), unless one runs.
    pub(super) fn grow_ahead(&self) {
        if !self.zero_ahead
            || self
                .growing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let spawned = self.me.upgrade().and_then(|me| {
            if self.growers.stopped() {
                return None;
            }
            std::thread::Builder::new()
                .name("trireme-pool".into())
                .spawn(move || {
                    if let Err(e) = me.grow_zeroed() {
                        // The next write to find no block grows the pool in the foreground,
                        // where the error reaches it.
                        tracing::debug!(volume = me.vol(), "growing the pool ahead: {e}");
                    }
                    me.growing.store(false, Ordering::Release);
                    me.wake_waiters();
                })
                .ok()
        });
        if let Some(t) = spawned {
            self.growers.add(t);
        } else {
            self.growing.store(false, Ordering::Release);
            self.wake_waiters();
        }
    }

    /// The growing thread's work: a step past the table's end, zeroed a megabyte at a time,
    /// each megabyte's blocks free once its zeros are written.
    fn grow_zeroed(&self) -> Result<(), StoreError> {
        let (start, end) = {
            let _g = self.exclusive();
            let stop = self.closed.load(Ordering::Acquire) || self.growers.stopped();
            if stop || self.plain.load(Ordering::Acquire) {
                return Ok(());
            }
            let start = self.table().phys_blocks * BLOCK;
            let end = start + self.zero_step();
            if self.inner.size() < end {
                self.inner.resize(end)?;
            }
            (start, end)
        };
        // Allocated first, in one call (the file's lock held exclusive once): a write into a
        // hole would hold it through its I/O, stalling every read of the replica meanwhile,
        // where a write into allocated space shares it.
        self.inner.reserve(start, end - start);
        let zeros = vec![0u8; ZERO_CHUNK];
        let mut pos = start;
        while pos < end {
            let _g = self.shared();
            // Closed, or the pool dropped (a fold back to plain, which may grow again from
            // another end): what is left is not this thread's any more.
            let moved = self.table().phys_blocks * BLOCK != pos || self.inner.size() < end;
            let stop = self.closed.load(Ordering::Acquire) || self.growers.stopped();
            if stop || self.plain.load(Ordering::Acquire) || moved {
                return Ok(());
            }
            let n = (end - pos).min(ZERO_CHUNK as u64);
            self.inner.write(pos, &zeros[..n as usize], false)?;
            self.table().grow((pos + n) / BLOCK);
            pos += n;
            self.wake_waiters();
        }
        tracing::debug!(
            volume = self.vol(),
            pool = end,
            "snapshot pool grew, zeroed"
        );
        Ok(())
    }
}
