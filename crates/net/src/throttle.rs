//! Log lines that a peer can provoke, limited to one a second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A warning that goes to the log at most once per period; the calls in between are counted
/// and the next line says how many were held back. Lock-free; meant for a `static`.
#[derive(Debug)]
pub struct Throttle {
    period_ms: u64,
    /// Milliseconds since the process's first throttle use when the last line went out, plus
    /// one (0: never).
    last: AtomicU64,
    held: AtomicU64,
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Throttle {
    /// One line a second.
    pub const fn per_second() -> Throttle {
        Throttle::every(Duration::from_secs(1))
    }

    pub const fn every(period: Duration) -> Throttle {
        Throttle {
            period_ms: period.as_millis() as u64,
            last: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when this occurrence should be logged, `n` being how many were held back
    /// since the last line; `None` when it is held back.
    pub fn check(&self) -> Option<u64> {
        let now = now_ms() + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now < last + self.period_ms {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // One caller wins the period; the others count as held back.
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.held.swap(0, Ordering::Relaxed))
    }
}

/// Logs a warning through a [`Throttle`] (a `static` of the caller's), adding `held_back = n`
/// when lines were held back: `warn_throttled!(REFUSED, %peer, "refused a connection: {why}")`.
#[macro_export]
macro_rules! warn_throttled {
    ($throttle:expr, $($arg:tt)+) => {
        if let Some(held) = $throttle.check() {
            if held == 0 {
                ::tracing::warn!($($arg)+);
            } else {
                ::tracing::warn!(held_back = held, $($arg)+);
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_period_with_a_count_of_the_rest() {
        let t = Throttle::every(Duration::from_millis(200));
        assert_eq!(t.check(), Some(0));
        for _ in 0..50 {
            assert_eq!(t.check(), None);
        }
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(t.check(), Some(50));
        assert_eq!(t.check(), None);
    }
}
