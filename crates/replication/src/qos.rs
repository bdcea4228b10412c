//! A volume's I/O limits and the rule that keeps requests within them.
//!
//! Each limit is a rate: IOPS (counted in 8 KiB units, as S2D's Storage QoS: a 64 KiB request
//! is 8, a 4 KiB one is 1) or bytes a second, for reads and writes together or for one of
//! them. [`Limiter`] schedules requests by the generic cell rate algorithm (a token bucket
//! written as one time per limit): each limit keeps the time its next unit is due; a request
//! may start at the latest of the times its limits give, and moves each of them on by what it
//! costs. An idle volume saves up at most `burst` of each limit. The limiter reads no clock:
//! the caller passes the time in nanoseconds since any fixed moment.

use serde::{Deserialize, Serialize};

/// What one IOPS unit is: 8 KiB, as S2D's policies normalise.
pub const IOPS_UNIT: u64 = 8192;
/// How early a request may start before its time, whatever the burst: what a sleeping
/// request can be woken to (tokio's timers tick each millisecond). Without it, at 50,000 IOPS
/// (one request each 20 us) every request that waited woke up to a millisecond late, and a
/// volume limited to 50,000 did 20,000. Over any longer window the rate is still the limit.
pub const EARLY_NS: u64 = 1_000_000;

/// The most weight a volume may have.
pub const MAX_WEIGHT: u32 = 1000;

/// The longest burst a limit may save up.
pub const MAX_BURST_MS: u32 = 3_600_000;

const NS: u128 = 1_000_000_000;

/// A volume's limits. `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Limits {
    /// Reads and writes together, in 8 KiB units a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    /// Reads and writes together, in bytes a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps: Option<u64>,
    /// How long an idle volume may run above its limits, in milliseconds: it saves up at
    /// most this much of each limit (0: never above them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub burst_ms: u32,
    /// What the volume gets of its nodes when they are busy, in 8 KiB units a second (the
    /// nodes keep it: their I/O threads' schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_reserve: Option<u64>,
    /// Its part of a busy node against the other volumes' (1 to [`MAX_WEIGHT`]; 1 when not
    /// set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One of [`Limits`]' rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Iops,
    ReadIops,
    WriteIops,
    Bps,
    ReadBps,
    WriteBps,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Iops,
        Kind::ReadIops,
        Kind::WriteIops,
        Kind::Bps,
        Kind::ReadBps,
        Kind::WriteBps,
    ];

    /// Its name on the command line, in the API and in the metrics' `limit` label.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Iops => "iops",
            Kind::ReadIops => "read-iops",
            Kind::WriteIops => "write-iops",
            Kind::Bps => "bps",
            Kind::ReadBps => "read-bps",
            Kind::WriteBps => "write-bps",
        }
    }

    fn counts(self, dir: Dir) -> bool {
        !matches!(
            (self, dir),
            (Kind::ReadIops | Kind::ReadBps, Dir::Write)
                | (Kind::WriteIops | Kind::WriteBps, Dir::Read)
        )
    }

    fn in_bytes(self) -> bool {
        matches!(self, Kind::Bps | Kind::ReadBps | Kind::WriteBps)
    }
}

/// Why limits were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("a {0} limit of 0: give a rate of at least 1, or `none` to remove the limit")]
    Zero(&'static str),
    #[error("a burst of {0} ms is longer than the longest, {MAX_BURST_MS} ms (an hour)")]
    Burst(u32),
    #[error("a weight of {0}: give 1 to {MAX_WEIGHT}")]
    Weight(u32),
    #[error("a reserve of {reserve} IOPS above the volume's iops limit of {limit}: the volume could never use it")]
    ReserveAboveLimit { reserve: u64, limit: u64 },
}

impl Limits {
    pub fn get(&self, k: Kind) -> Option<u64> {
        match k {
            Kind::Iops => self.iops,
            Kind::ReadIops => self.read_iops,
            Kind::WriteIops => self.write_iops,
            Kind::Bps => self.bps,
            Kind::ReadBps => self.read_bps,
            Kind::WriteBps => self.write_bps,
        }
    }

    pub fn set(&mut self, k: Kind, v: Option<u64>) {
        let slot = match k {
            Kind::Iops => &mut self.iops,
            Kind::ReadIops => &mut self.read_iops,
            Kind::WriteIops => &mut self.write_iops,
            Kind::Bps => &mut self.bps,
            Kind::ReadBps => &mut self.read_bps,
            Kind::WriteBps => &mut self.write_bps,
        };
        *slot = v;
    }

    /// Nothing set: no limit, no reserve, no weight (what a record need not store).
    pub fn is_default(&self) -> bool {
        *self == Limits::default()
    }

    /// No limit at all (the burst alone limits nothing; a reserve and a weight are no limits).
    pub fn is_unlimited(&self) -> bool {
        Kind::ALL.iter().all(|&k| self.get(k).is_none())
    }

    /// Refuses a limit of 0 (say `none`) and a burst longer than an hour.
    pub fn check(&self) -> Result<(), LimitError> {
        for k in Kind::ALL {
            if self.get(k) == Some(0) {
                return Err(LimitError::Zero(k.name()));
            }
        }
        if self.burst_ms > MAX_BURST_MS {
            return Err(LimitError::Burst(self.burst_ms));
        }
        if self.iops_reserve == Some(0) {
            return Err(LimitError::Zero("iops-reserve"));
        }
        if let Some(w) = self.weight.filter(|w| !(1..=MAX_WEIGHT).contains(w)) {
            return Err(LimitError::Weight(w));
        }
        match (self.iops_reserve, self.iops) {
            (Some(reserve), Some(limit)) if reserve > limit => {
                Err(LimitError::ReserveAboveLimit { reserve, limit })
            }
            _ => Ok(()),
        }
    }

    /// What a volume with these limits of its own keeps under a QoS policy's `policy`
    /// (for an aggregated policy: its share of it): every rate of either holds (the lower
    /// where both set one); its own burst, reserve and weight, where set, take the place of
    /// the policy's.
    pub fn under(&self, policy: &Limits) -> Limits {
        let mut out = *policy;
        for k in Kind::ALL {
            let rate = match (self.get(k), policy.get(k)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            out.set(k, rate);
        }
        if self.burst_ms != 0 {
            out.burst_ms = self.burst_ms;
        }
        out.iops_reserve = self.iops_reserve.or(policy.iops_reserve);
        out.weight = self.weight.or(policy.weight);
        if let (Some(r), Some(l)) = (out.iops_reserve, out.iops) {
            // The policy's share may have narrowed the limit below the volume's reserve.
            out.iops_reserve = Some(r.min(l));
        }
        out
    }

    /// `fraction` (0 to 1) of every rate and of the reserve, at least 1 of each set: one
    /// volume's share of an aggregated policy. Burst and weight stay.
    pub fn scaled(&self, fraction: f64) -> Limits {
        let f = fraction.clamp(0.0, 1.0);
        let part = |v: Option<u64>| v.map(|v| ((v as f64 * f).round() as u64).clamp(1, v));
        let mut out = *self;
        for k in Kind::ALL {
            out.set(k, part(self.get(k)));
        }
        out.iops_reserve = part(self.iops_reserve);
        out
    }

    /// Its claim on a busy node: the reserve (0: none) and the weight (1 unless set).
    pub fn claim(&self) -> (u64, u32) {
        (self.iops_reserve.unwrap_or(0), self.weight.unwrap_or(1))
    }
}

impl std::fmt::Display for Limits {
    /// `iops 1000, write-bps 104857600/s, burst 2s`; `none` without limits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for k in Kind::ALL {
            if let Some(v) = self.get(k) {
                parts.push(match k.in_bytes() {
                    true => format!("{} {v} B/s", k.name()),
                    false => format!("{} {v}", k.name()),
                });
            }
        }
        if self.burst_ms != 0 && !parts.is_empty() {
            parts.push(format!("burst {} ms", self.burst_ms));
        }
        if let Some(r) = self.iops_reserve {
            parts.push(format!("iops-reserve {r}"));
        }
        if let Some(w) = self.weight {
            parts.push(format!("weight {w}"));
        }
        if parts.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&parts.join(", "))
    }
}

/// Which way a request moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Read,
    /// Writes, and zeroes and trims (which count one IOPS unit and no bytes).
    Write,
}

/// What one request costs: its direction and the bytes it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub dir: Dir,
    /// 8 KiB units, at least 1.
    pub units: u64,
    pub bytes: u64,
}

impl Cost {
    /// A read or write of `len` bytes.
    pub fn io(dir: Dir, len: u64) -> Cost {
        Cost {
            dir,
            units: len.div_ceil(IOPS_UNIT).max(1),
            bytes: len,
        }
    }

    /// A request that moves no data (zeroes, trim): one unit, no bytes.
    pub fn no_data() -> Cost {
        Cost {
            dir: Dir::Write,
            units: 1,
            bytes: 0,
        }
    }

    fn of(&self, k: Kind) -> u64 {
        match k.in_bytes() {
            true => self.bytes,
            false => self.units,
        }
    }
}

/// The schedule of one volume's requests under its [`Limits`].
#[derive(Debug, Clone, Default)]
pub struct Limiter {
    limits: Limits,
    /// Per [`Kind::ALL`]: when the limit's next unit is due (ns; 0 before the first request).
    due: [u64; 6],
}

impl Limiter {
    pub fn new(limits: Limits) -> Limiter {
        Limiter {
            limits,
            due: [0; 6],
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes new limits at `now`: every limit forgets what it had saved up and what requests
    /// owed it (requests waiting are admitted again under the new ones); true if anything
    /// changed.
    pub fn set(&mut self, limits: Limits, now: u64) -> bool {
        if limits == self.limits {
            return false;
        }
        self.due = [now; 6];
        self.limits = limits;
        true
    }

    /// When a request of `cost` arriving at `now` may start (`now` or later), with each of
    /// its limits moved on by its cost. The caller waits until then.
    pub fn admit(&mut self, now: u64, cost: Cost) -> u64 {
        let burst = u64::from(self.limits.burst_ms) * 1_000_000 + EARLY_NS;
        let applies = |k: Kind| {
            let rate = self.limits.get(k)?;
            (k.counts(cost.dir) && cost.of(k) > 0).then_some(rate)
        };
        // The latest of the times its limits let it start: a limit lets a request go up to
        // `burst` (and `EARLY_NS`) before its next unit is due.
        let mut start = now;
        for (i, k) in Kind::ALL.into_iter().enumerate() {
            if applies(k).is_some() {
                start = start.max(self.due[i].saturating_sub(burst));
            }
        }
        for (i, k) in Kind::ALL.into_iter().enumerate() {
            if let Some(rate) = applies(k) {
                let took = (u128::from(cost.of(k)) * NS / u128::from(rate)) as u64;
                self.due[i] = self.due[i].max(start).saturating_add(took);
            }
        }
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn iops(n: u64) -> Limits {
        Limits {
            iops: Some(n),
            ..Limits::default()
        }
    }

    #[test]
    fn a_volume_under_a_policy_keeps_the_lower_of_each_rate() {
        let policy = Limits {
            iops: Some(1000),
            write_bps: Some(1 << 20),
            burst_ms: 500,
            iops_reserve: Some(200),
            weight: Some(4),
            ..Limits::default()
        };
        let own = Limits {
            iops: Some(5000),
            read_iops: Some(300),
            iops_reserve: Some(100),
            ..Limits::default()
        };
        let l = own.under(&policy);
        assert_eq!(l.iops, Some(1000), "the policy's lower limit holds");
        assert_eq!(l.read_iops, Some(300), "the volume's own holds too");
        assert_eq!(l.write_bps, Some(1 << 20));
        assert_eq!(
            (l.burst_ms, l.iops_reserve, l.weight),
            (500, Some(100), Some(4))
        );
        assert_eq!(Limits::default().under(&policy), policy);
        assert_eq!(own.under(&Limits::default()), own);
        // A share narrower than the volume's own reserve caps the reserve.
        let tight = Limits {
            iops_reserve: Some(900),
            ..Limits::default()
        };
        assert_eq!(tight.under(&iops(500)).iops_reserve, Some(500));
        assert!(tight.under(&iops(500)).check().is_ok());
    }

    #[test]
    fn a_share_scales_every_rate_and_keeps_at_least_one() {
        let policy = Limits {
            iops: Some(1000),
            bps: Some(100 << 20),
            iops_reserve: Some(10),
            weight: Some(2),
            ..Limits::default()
        };
        let half = policy.scaled(0.5);
        assert_eq!((half.iops, half.bps), (Some(500), Some(50 << 20)));
        assert_eq!((half.iops_reserve, half.weight), (Some(5), Some(2)));
        let none = policy.scaled(0.0);
        assert_eq!((none.iops, none.iops_reserve), (Some(1), Some(1)));
        assert_eq!(policy.scaled(3.0), policy);
        assert!(policy.scaled(0.01).check().is_ok());
    }

    #[test]
    fn a_saturating_client_gets_the_limit_exactly() {
        let mut l = Limiter::new(iops(1000));
        // 32 requests in flight: each arrives as soon as one is admitted.
        let mut starts = Vec::new();
        let mut now = 0;
        for _ in 0..10_000 {
            let s = l.admit(now, Cost::io(Dir::Write, 4096));
            starts.push(s);
            if starts.len() > 32 {
                now = starts[starts.len() - 32];
            }
        }
        let last = *starts.last().unwrap();
        // 10,000 requests at 1000 a second: 9.999 s from the first to the last, less the
        // millisecond a request may go early.
        assert_eq!(last, 9_999_000_000 - EARLY_NS);
    }

    #[test]
    fn units_are_8k_and_bytes_count_bytes() {
        assert_eq!(Cost::io(Dir::Read, 4096).units, 1);
        assert_eq!(Cost::io(Dir::Read, 8192).units, 1);
        assert_eq!(Cost::io(Dir::Read, 65536).units, 8);
        assert_eq!(Cost::io(Dir::Read, 65537).units, 9);
        let mut l = Limiter::new(Limits {
            bps: Some(1 << 20),
            ..Limits::default()
        });
        assert_eq!(l.admit(0, Cost::io(Dir::Write, 1 << 20)), 0);
        assert_eq!(
            l.admit(0, Cost::io(Dir::Write, 1 << 20)),
            1_000_000_000 - EARLY_NS
        );
        // Zeroes move no bytes: a bytes limit does not hold them.
        assert_eq!(l.admit(0, Cost::no_data()), 0);
    }

    #[test]
    fn a_read_limit_leaves_writes_alone() {
        let mut l = Limiter::new(Limits {
            read_iops: Some(10),
            ..Limits::default()
        });
        assert_eq!(l.admit(0, Cost::io(Dir::Read, 4096)), 0);
        assert_eq!(
            l.admit(0, Cost::io(Dir::Read, 4096)),
            100_000_000 - EARLY_NS
        );
        for _ in 0..100 {
            assert_eq!(l.admit(0, Cost::io(Dir::Write, 4096)), 0);
        }
    }

    #[test]
    fn an_idle_volume_saves_up_its_burst_and_no_more() {
        let mut l = Limiter::new(Limits {
            iops: Some(100),
            burst_ms: 1000,
            ..Limits::default()
        });
        // Idle for 10 s: one second's worth goes at once (and the one due now), then one each
        // 10 ms (a millisecond early).
        let now = 10_000_000_000;
        for _ in 0..101 {
            assert_eq!(l.admit(now, Cost::io(Dir::Read, 4096)), now);
        }
        assert_eq!(
            l.admit(now, Cost::io(Dir::Read, 4096)),
            now + 10_000_000 - EARLY_NS
        );
    }

    #[test]
    fn a_change_forgets_the_debt_of_the_old_limit() {
        let mut l = Limiter::new(iops(1));
        for _ in 0..10 {
            l.admit(0, Cost::io(Dir::Read, 4096));
        }
        assert_eq!(
            l.admit(0, Cost::io(Dir::Read, 4096)),
            10_000_000_000 - EARLY_NS
        );
        assert!(l.set(iops(1000), 500_000_000));
        assert_eq!(l.admit(500_000_000, Cost::io(Dir::Read, 4096)), 500_000_000);
        assert!(!l.set(iops(1000), 600_000_000));
        assert!(l.set(Limits::default(), 600_000_000));
        assert_eq!(l.admit(0, Cost::io(Dir::Read, 4096)), 0);
    }

    #[test]
    fn bad_limits_are_refused() {
        assert_eq!(iops(0).check(), Err(LimitError::Zero("iops")));
        let l = Limits {
            burst_ms: MAX_BURST_MS + 1,
            ..iops(5)
        };
        assert!(matches!(l.check(), Err(LimitError::Burst(_))));
        assert_eq!(iops(1).check(), Ok(()));
        assert_eq!(Limits::default().to_string(), "none");
        let l = Limits {
            write_bps: Some(1 << 20),
            burst_ms: 500,
            ..iops(10)
        };
        assert_eq!(
            l.to_string(),
            "iops 10, write-bps 1048576 B/s, burst 500 ms"
        );
    }

    proptest! {
        /// Over any window, what starts is at most the rate times the window, plus the burst
        /// (and the millisecond early), plus one request (which may start at the window's
        /// edge).
        #[test]
        fn never_above_the_rate(
            rate in 1u64..100_000,
            burst_ms in 0u32..2000,
            gaps in proptest::collection::vec((0u64..50_000_000, 1u64..200_000, any::<bool>()), 1..300),
        ) {
            let mut l = Limiter::new(Limits { iops: Some(rate), burst_ms, ..Limits::default() });
            let mut now = 0u64;
            let mut starts: Vec<(u64, u64)> = Vec::new();
            for (gap, len, write) in gaps {
                now += gap;
                let dir = if write { Dir::Write } else { Dir::Read };
                let c = Cost::io(dir, len);
                let s = l.admit(now, c);
                prop_assert!(s >= now);
                starts.push((s, c.units));
            }
            starts.sort();
            let burst_units = u128::from(rate) * (u128::from(burst_ms) * 1_000_000 + u128::from(EARLY_NS)) / NS;
            for i in 0..starts.len() {
                let mut units = 0u128;
                for j in i..starts.len() {
                    units += u128::from(starts[j].1);
                    let window = u128::from(starts[j].0 - starts[i].0);
                    let allowed = window * u128::from(rate) / NS + burst_units + u128::from(starts[j].1) + 1;
                    prop_assert!(units <= allowed, "{units} units in {window} ns at {rate}/s, burst {burst_units}");
                }
            }
        }

        /// A client that always has requests waiting loses nothing to the rule: the last one
        /// starts when the work before it takes at the rate, less the burst and the
        /// millisecond early.
        #[test]
        fn never_below_the_rate(
            rate in 1u64..100_000,
            burst_ms in 0u32..2000,
            lens in proptest::collection::vec(1u64..200_000, 1..300),
        ) {
            let mut l = Limiter::new(Limits { iops: Some(rate), burst_ms, ..Limits::default() });
            let mut before = 0u128;
            for len in lens {
                let c = Cost::io(Dir::Write, len);
                let last = l.admit(0, c);
                let exact = (before * NS / u128::from(rate))
                    .saturating_sub(u128::from(burst_ms) * 1_000_000 + u128::from(EARLY_NS));
                prop_assert!(u128::from(last) <= exact && exact - u128::from(last) <= 300, "{last} against {exact}");
                before += u128::from(c.units);
            }
        }
    }
}
