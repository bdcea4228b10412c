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

pub(crate) fn now_ms() -> u64 {
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

/// Throttles for log lines of several kinds at one place (refusals with different reasons):
/// each kind gets its line a period, so one flood does not hide another reason. At most
/// [`Throttles::KINDS`] kinds are told apart at once (a kind quiet for a period makes room);
/// the kinds past that share one line a period. So however many kinds a peer makes up, the
/// lines stay bounded.
#[derive(Debug)]
pub struct Throttles {
    period_ms: u64,
    /// Kind (hashed) → (when its last line went out, lines held back since).
    kinds: std::sync::Mutex<Option<std::collections::HashMap<u64, (u64, u64)>>>,
    overflow: Throttle,
}

impl Default for Throttles {
    fn default() -> Self {
        Self::per_second()
    }
}

impl Throttles {
    pub const KINDS: usize = 64;

    pub const fn per_second() -> Throttles {
        Throttles {
            period_ms: 1000,
            kinds: std::sync::Mutex::new(None),
            overflow: Throttle::per_second(),
        }
    }

    /// [`Throttle::check`] for lines of kind `kind`.
    pub fn check(&self, kind: &str) -> Option<u64> {
        // FNV-1a, 64 bits: distinct kinds collide with negligible odds.
        let h = kind.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let now = now_ms();
        let mut g = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let kinds = g.get_or_insert_with(std::collections::HashMap::new);
        if let Some((last, held)) = kinds.get_mut(&h) {
            if now < *last + self.period_ms {
                *held += 1;
                return None;
            }
            *last = now;
            return Some(std::mem::take(held));
        }
        if kinds.len() >= Self::KINDS {
            let period = self.period_ms;
            kinds.retain(|_, (last, held)| now < *last + period || *held > 0);
        }
        if kinds.len() >= Self::KINDS {
            drop(g);
            return self.overflow.check();
        }
        kinds.insert(h, (now, 0));
        Some(0)
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

/// Logs a warning through [`Throttles`] (a `static` of the caller's), one line a second per
/// `kind`: `warn_throttled_by!(REFUSED, why.as_str(), %peer, "refused: {why}")`.
#[macro_export]
macro_rules! warn_throttled_by {
    ($throttles:expr, $kind:expr, $($arg:tt)+) => {
        if let Some(held) = $throttles.check($kind) {
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

    #[test]
    fn each_kind_of_line_has_its_own_second() {
        let t = Throttles::per_second();
        assert_eq!(t.check("a"), Some(0));
        assert_eq!(t.check("a"), None);
        // Other kinds still get their lines.
        assert_eq!(t.check("b"), Some(0));
        assert_eq!(t.check("c"), Some(0));
        assert_eq!(t.check("b"), None);
        // However many kinds, at most one line each of the first ones and one for the rest.
        let lines = (0..10_000)
            .filter(|i| t.check(&format!("made up {i}")).is_some())
            .count();
        assert!(lines <= Throttles::KINDS + 1, "{lines}");
    }
}
