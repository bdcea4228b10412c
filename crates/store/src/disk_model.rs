//! A spinning-disk model over any store, for a host that has no spinning disk: every read and
//! write waits for one of the disk's few heads and then for the time a disk would take — a
//! seek and rotation for a random request, none for one that continues where an earlier one
//! ended — plus the transfer at the disk's streaming rate. The bytes themselves go to the
//! wrapped store unchanged.
//!
//! Defaults ([`DiskParams::HDD`]): 8 ms per random request, 150 MB/s streaming, 2 requests in
//! flight (a 7200 rpm SATA disk with a short command queue). A request that starts up to
//! 256 KiB after a recent one ended pays for passing over the gap instead of a seek. Flushes, trims and allocation
//! queries cost nothing: the model has no write cache to drain, and trims only change
//! metadata.
//!
//! Background I/O (tier migration) runs inside [`as_background`]: it takes a head only while
//! no foreground request waits for one, and never the last free head, so foreground requests
//! are delayed by at most the background request already on the platter.
//!
//! Every report that shows numbers measured over this model says so (`trireme status`,
//! `bench`): they are a model's numbers, not a disk's.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::{Replica, Store, StoreError};

/// What the model charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskParams {
    /// Seek plus rotational delay of a request that does not continue the previous one.
    pub seek: Duration,
    /// Streaming rate in bytes per second.
    pub bandwidth: u64,
    /// Requests the disk serves at once.
    pub heads: usize,
}

impl DiskParams {
    /// A 7200 rpm SATA disk.
    pub const HDD: DiskParams = DiskParams {
        seek: Duration::from_millis(8),
        bandwidth: 150_000_000,
        heads: 2,
    };

    /// What one request of `len` bytes costs, sequential or not.
    pub fn cost(&self, len: u64, sequential: bool) -> Duration {
        let seek = if sequential {
            Duration::ZERO
        } else {
            self.seek
        };
        seek + Duration::from_nanos(len.saturating_mul(1_000_000_000) / self.bandwidth.max(1))
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!(
            "disk model: {} ms per random I/O, {} MB/s streaming, {} in flight",
            self.seek.as_secs_f64() * 1e3,
            self.bandwidth / 1_000_000,
            self.heads
        )
    }
}

thread_local! {
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with its disk I/O marked as background (it yields to foreground requests).
pub fn as_background<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            BACKGROUND.with(|b| b.set(self.0));
        }
    }
    let _reset = Reset(BACKGROUND.with(|b| b.replace(true)));
    f()
}

/// Where the recent requests ended: one that starts at any of them streams on.
const STREAMS: usize = 4;
/// A request this far past a recent end costs the gap's transfer, not a seek.
const SKIP: u64 = 256 * 1024;

#[derive(Debug, Default)]
struct Heads {
    busy: usize,
    foreground_waiting: usize,
    /// (volume, end offset) of recent requests, most recent first.
    ends: [(u64, u64); STREAMS],
}

/// Counters of a modeled disk.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub requests: AtomicU64,
    pub sequential: AtomicU64,
    /// Modeled service time, nanoseconds.
    pub busy_ns: AtomicU64,
}

/// One modeled disk, shared by every replica on it.
#[derive(Debug)]
pub struct DiskModel {
    params: DiskParams,
    heads: Mutex<Heads>,
    freed: Condvar,
    pub stats: DiskStats,
}

impl DiskModel {
    pub fn new(params: DiskParams) -> DiskModel {
        DiskModel {
            params: DiskParams {
                heads: params.heads.max(1),
                ..params
            },
            heads: Mutex::default(),
            freed: Condvar::new(),
            stats: DiskStats::default(),
        }
    }

    pub fn params(&self) -> DiskParams {
        self.params
    }

    /// Waits for a head, spends the modeled time, runs `io` on the head and frees it.
    pub fn serve<R>(&self, volume: u64, offset: u64, len: u64, io: impl FnOnce() -> R) -> R {
        let background = BACKGROUND.with(Cell::get);
        let mut h = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        if !background {
            h.foreground_waiting += 1;
        }
        loop {
            let free = self.params.heads - h.busy;
            let may = if background {
                h.foreground_waiting == 0 && (free > 1 || (free == 1 && self.params.heads == 1))
            } else {
                free > 0
            };
            if may {
                break;
            }
            h = self.freed.wait(h).unwrap_or_else(|e| e.into_inner());
        }
        if !background {
            h.foreground_waiting -= 1;
        }
        h.busy += 1;
        // A request at or a little after a recent end streams on: the head passes over the
        // gap instead of seeking (a copy that serves every second or third piece of a scan).
        let near = h.ends.iter().position(|&(v, e)| {
            v == volume && offset.checked_sub(e).is_some_and(|gap| gap <= SKIP)
        });
        let (sequential, gap) = match near {
            Some(i) => {
                let gap = offset - h.ends[i].1;
                h.ends[..=i].rotate_right(1);
                (true, gap)
            }
            None => {
                h.ends.rotate_right(1);
                (false, 0)
            }
        };
        h.ends[0] = (volume, offset + len);
        drop(h);
        let cost = self.params.cost(len + gap, sequential);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        self.stats
            .sequential
            .fetch_add(u64::from(sequential), Ordering::Relaxed);
        self.stats
            .busy_ns
            .fetch_add(cost.as_nanos() as u64, Ordering::Relaxed);
        std::thread::sleep(cost);
        let out = io();
        let mut h = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        h.busy -= 1;
        drop(h);
        self.freed.notify_all();
        out
    }
}

/// A store whose replicas' reads and writes go through one [`DiskModel`].
#[derive(Debug)]
pub struct ModeledStore {
    inner: Arc<dyn Store>,
    disk: Arc<DiskModel>,
}

impl ModeledStore {
    pub fn new(inner: Arc<dyn Store>, disk: Arc<DiskModel>) -> ModeledStore {
        ModeledStore { inner, disk }
    }
    pub fn disk(&self) -> &Arc<DiskModel> {
        &self.disk
    }
    fn wrap(&self, r: Arc<dyn Replica>) -> Arc<dyn Replica> {
        Arc::new(ModeledReplica {
            inner: r,
            disk: self.disk.clone(),
        })
    }
}

impl crate::filter::StoreFilter for ModeledStore {
    fn next(&self) -> &dyn Store {
        &*self.inner
    }
    fn blocking(&self) -> bool {
        // The model sleeps: never on an executor thread.
        true
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        self.inner.create(volume, size).map(|r| self.wrap(r))
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.inner
            .open_all()
            .into_iter()
            .map(|r| r.map(|r| self.wrap(r)))
            .collect()
    }
}

#[derive(Debug)]
struct ModeledReplica {
    inner: Arc<dyn Replica>,
    disk: Arc<DiskModel>,
}

impl crate::filter::ReplicaFilter for ModeledReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len() as u64;
        self.disk.serve(self.inner.volume(), offset, len, || {
            self.inner.read(offset, buf)
        })
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        self.disk
            .serve(self.inner.volume(), offset, data.len() as u64, || {
                self.inner.write(offset, data, fua)
            })
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        if may_trim {
            // Whole grains become holes: metadata, no platter time. Partial edges are written.
            return self.inner.write_zeroes(offset, len, may_trim, fua);
        }
        self.disk.serve(self.inner.volume(), offset, len, || {
            self.inner.write_zeroes(offset, len, may_trim, fua)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn fast_params() -> DiskParams {
        DiskParams {
            seek: Duration::from_millis(4),
            bandwidth: 100_000_000,
            heads: 1,
        }
    }

    #[test]
    fn random_requests_pay_a_seek_and_streams_do_not() {
        let disk = DiskModel::new(fast_params());
        let t = Instant::now();
        for i in 0..10u64 {
            // Each request lands far from every earlier one's end: all ten pay a seek.
            disk.serve(1, i * 1_000_000, 4096, || ());
        }
        let random = t.elapsed();
        let t = Instant::now();
        for i in 0..10u64 {
            disk.serve(1, 50_000_000 + i * 4096, 4096, || ());
        }
        let stream = t.elapsed();
        assert!(random >= Duration::from_millis(40), "{random:?}");
        // The first request of the stream seeks; the other nine do not.
        assert_eq!(disk.stats.sequential.load(Ordering::Relaxed), 9);
        assert!(stream < random, "stream {stream:?} random {random:?}");
    }

    #[test]
    fn interleaved_streams_are_each_recognized() {
        let disk = DiskModel::new(fast_params());
        for i in 0..5u64 {
            disk.serve(1, i * 4096, 4096, || ());
            disk.serve(2, 1_000_000 + i * 4096, 4096, || ());
        }
        assert_eq!(disk.stats.sequential.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn background_io_leaves_a_head_for_the_foreground() {
        let disk = Arc::new(DiskModel::new(DiskParams {
            seek: Duration::from_millis(30),
            bandwidth: 1_000_000_000,
            heads: 2,
        }));
        // Two background requests at once: the second waits for the first, since taking the
        // last free head is not allowed.
        let t = Instant::now();
        let d = disk.clone();
        let bg = std::thread::spawn(move || as_background(|| d.serve(1, 0, 4096, || ())));
        std::thread::sleep(Duration::from_millis(5));
        // A foreground request meanwhile gets the second head at once.
        let fg = Instant::now();
        disk.serve(1, 9_000_000, 4096, || ());
        let fg = fg.elapsed();
        bg.join().unwrap();
        assert!(fg < Duration::from_millis(55), "foreground waited {fg:?}");
        let d = disk.clone();
        let a = std::thread::spawn(move || as_background(|| d.serve(1, 100 << 20, 4096, || ())));
        let d = disk.clone();
        let b = std::thread::spawn(move || as_background(|| d.serve(1, 200 << 20, 4096, || ())));
        a.join().unwrap();
        b.join().unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(90),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn the_background_flag_is_restored() {
        assert!(!BACKGROUND.with(Cell::get));
        as_background(|| assert!(BACKGROUND.with(Cell::get)));
        assert!(!BACKGROUND.with(Cell::get));
    }
}
