//! A latency histogram that the I/O path updates with three relaxed atomic adds: no lock, no
//! allocation. Bucket bounds are powers of two in nanoseconds, so finding the bucket is a
//! leading-zeros count, not a search.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The first bucket holds everything up to 2^FIRST_SHIFT ns (8.192 µs).
const FIRST_SHIFT: u32 = 13;
/// Finite buckets: up to 2^(FIRST_SHIFT + FINITE - 1) ns (8.6 s); the last one is +Inf.
const FINITE: usize = 21;
/// Buckets, the +Inf one included.
pub const BUCKETS: usize = FINITE + 1;

/// Upper bound of bucket `i` in seconds (`f64::INFINITY` for the last).
pub fn bound_seconds(i: usize) -> f64 {
    if i >= FINITE {
        f64::INFINITY
    } else {
        (1u64 << (FIRST_SHIFT + i as u32)) as f64 / 1e9
    }
}

/// The bucket a duration of `nanos` falls in: the first whose bound is at least `nanos`.
fn bucket(nanos: u64) -> usize {
    if nanos <= 1 << FIRST_SHIFT {
        return 0;
    }
    // ceil(log2(nanos)) - FIRST_SHIFT
    let ceil_log2 = 64 - (nanos - 1).leading_zeros();
    ((ceil_log2 - FIRST_SHIFT) as usize).min(FINITE)
}

/// The count is not kept apart: it is the buckets' sum, one atomic add fewer per sample.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    #[inline]
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[bucket(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// The counts as they are now. Each field is read on its own, so a snapshot taken while
    /// requests complete may count one in its bucket and not yet in the sum: the count is the
    /// buckets' sum, so it always matches the buckets.
    pub fn snapshot(&self) -> HistSnapshot {
        let buckets: [u64; BUCKETS] = std::array::from_fn(|i| self.buckets[i].load(Relaxed));
        HistSnapshot {
            count: buckets.iter().sum(),
            sum_ns: self.sum_ns.load(Relaxed),
            buckets,
        }
    }
}

/// A histogram's counts at one moment (per bucket, not cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistSnapshot {
    pub buckets: [u64; BUCKETS],
    pub count: u64,
    pub sum_ns: u64,
}

impl Default for HistSnapshot {
    fn default() -> Self {
        HistSnapshot {
            buckets: [0; BUCKETS],
            count: 0,
            sum_ns: 0,
        }
    }
}

impl HistSnapshot {
    /// Adds another histogram's counts (a shard's) to these.
    pub fn add(&mut self, o: &HistSnapshot) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
        self.count += o.count;
        self.sum_ns += o.sum_ns;
    }

    /// What happened between `earlier` and `self` (counts only grow; a restart that reset
    /// them gives everything since).
    pub fn since(&self, earlier: &HistSnapshot) -> HistSnapshot {
        if earlier.count > self.count {
            return *self;
        }
        HistSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].saturating_sub(earlier.buckets[i])),
            count: self.count - earlier.count,
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    /// The `q` quantile (0 < q ≤ 1) in seconds, interpolated geometrically inside its bucket
    /// (the buckets are powers of two); `None` with no samples. Its error is at most the
    /// bucket's width: a factor of 2.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (seen + n) as f64 >= rank {
                let hi = bound_seconds(i.min(FINITE - 1));
                let lo = if i == 0 {
                    hi / 2.0
                } else {
                    bound_seconds(i - 1)
                };
                let frac = (rank - seen as f64) / n as f64;
                return Some(lo * (hi / lo).powf(frac));
            }
            seen += n;
        }
        Some(bound_seconds(FINITE - 1))
    }

    /// Mean in seconds.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / 1e9 / self.count as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_what_their_bounds_say() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(8192), 0);
        assert_eq!(bucket(8193), 1);
        assert_eq!(bucket(16384), 1);
        assert_eq!(bucket(u64::MAX), FINITE);
        for ns in [
            1u64,
            5000,
            8191,
            8193,
            100_000,
            1_000_000,
            123_456_789,
            8_589_934_592,
        ] {
            let b = bucket(ns);
            assert!(ns as f64 / 1e9 <= bound_seconds(b), "{ns} in {b}");
            if b > 0 {
                assert!(ns as f64 / 1e9 > bound_seconds(b - 1), "{ns} in {b}");
            }
        }
        assert_eq!(bucket(8_589_934_593), FINITE);
    }

    #[test]
    fn quantiles_land_in_the_right_bucket() {
        let h = Histogram::default();
        for _ in 0..98 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_millis(5));
        h.record(Duration::from_millis(5));
        let s = h.snapshot();
        assert_eq!(s.count, 100);
        let p50 = s.quantile(0.5).unwrap();
        assert!((65e-6..=131.1e-6).contains(&p50), "{p50}");
        let p99 = s.quantile(0.99).unwrap();
        assert!((4.1e-3..=8.4e-3).contains(&p99), "{p99}");
        assert!((s.mean().unwrap() - 198e-6).abs() < 1e-6);
        let later = {
            h.record(Duration::from_secs(1));
            h.snapshot()
        };
        let d = later.since(&s);
        assert_eq!(d.count, 1);
        assert!(d.quantile(0.5).unwrap() > 0.5);
        assert_eq!(HistSnapshot::default().quantile(0.5), None);
    }
}
