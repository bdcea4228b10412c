//! Sizes as people write them ("1G", "512MiB", "4096") and as people read them.

use trireme_control::{NoLimit, Rate};

/// Parses a size with an optional binary suffix (K, M, G, T, with optional "i"/"iB"/"B").
/// A duration: a number with `ms` or `s` (e.g. `500ms`, `2s`); a bare number is seconds.
/// An over-commit limit: a number from 1 to 100 (`1.5`, `2`).
pub fn parse_overcommit(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (1.0..=100.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "invalid over-commit limit {s:?}: must be a number from 1 to 100 (1: never provision more than the capacity)"
        )),
    }
}

pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 2s or 10m"))?;
    let secs = v * scale;
    if !(0.001..=86400.0).contains(&secs) {
        return Err(format!("duration {s:?} must be between 1ms and 24h"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// A whole number from `lo` to `hi`, as a value parser (its error says so in words).
pub fn count(lo: u32, hi: u32) -> impl Fn(&str) -> Result<u32, String> + Clone + Send + Sync {
    move |s: &str| match s.trim().parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from {lo} to {hi}")),
    }
}

/// A duration, or `0` for "never".
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    if s.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    parse_duration(s)
}

/// How long a deleted volume stays in the trash: `0` (purged at the manager's next look),
/// or a whole number of seconds, minutes, hours or days (`90s`, `30m`, `12h`, `7d`; a bare
/// number is seconds), up to a year.
pub fn parse_keep(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = match t.char_indices().last() {
        Some((i, 'd')) => (&t[..i], 86400),
        Some((i, 'h')) => (&t[..i], 3600),
        Some((i, 'm')) => (&t[..i], 60),
        Some((i, 's')) => (&t[..i], 1),
        _ => (t, 1),
    };
    let v: u64 = num
        .parse()
        .map_err(|_| format!("invalid time {s:?}: expected e.g. 0, 30m, 12h or 7d"))?;
    match v.checked_mul(scale) {
        Some(secs) if secs <= 366 * 86400 => Ok(std::time::Duration::from_secs(secs)),
        _ => Err(format!("time {s:?} is over a year")),
    }
}

/// A dirty-tracking granularity: a size that is a power of two from 4 KiB to 64 MiB.
pub fn parse_dirty_grain(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v.is_power_of_two() && (4096..=64 << 20).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "invalid granularity {s:?}: a power of two from 4K to 64M"
        ))
    }
}

/// A size in bytes: a number with an optional suffix. `K`, `M`, `G`, `T`, `P` and `KiB`..`PiB`
/// are powers of 1024 (as qemu-img and rbd read them); `KB`..`PB` are powers of 1000, as
/// disks are sold. Case does not matter.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid size {s:?}: expected a number with an optional K/M/G/T suffix (powers of 1024; KB/MB/GB/TB: powers of 1000)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: number too large"))?;
    let upper = suffix.to_ascii_uppercase();
    let (unit, base): (&str, u64) = match upper.as_str() {
        "" | "B" => ("", 1024),
        u if u.ends_with("IB") => (&u[..u.len() - 2], 1024),
        u if u.len() == 2 && u.ends_with('B') => (&u[..1], 1000),
        u => (u, 1024),
    };
    let power = match unit {
        "" => 0,
        "K" => 1,
        "M" => 2,
        "G" => 3,
        "T" => 4,
        "P" => 5,
        _ => return Err(format!("invalid size {s:?}: unknown suffix {suffix:?}")),
    };
    base.checked_pow(power)
        .and_then(|m| n.checked_mul(m))
        .ok_or_else(|| format!("invalid size {s:?}: too large"))
}

pub use trireme_daemon::local::human;

/// `none`, or a positive number: the common part of the limits' parsers.
fn limit(s: &str, what: &str, parse: impl Fn(&str) -> Result<u64, String>) -> Result<Rate, String> {
    rate(s, &format!("{what} limit"), parse)
}

/// `none`, or a positive rate `parse` reads; `what` names it in errors ("an IOPS limit").
fn rate(s: &str, what: &str, parse: impl Fn(&str) -> Result<u64, String>) -> Result<Rate, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(Rate::Remove(NoLimit::None));
    }
    if t.starts_with('-') {
        return Err(format!(
            "{what} of {s:?}: give a positive rate, or `none` to remove it"
        ));
    }
    match parse(t)? {
        0 => Err(format!(
            "{what} of 0: give a positive rate, or `none` to remove it"
        )),
        n => Ok(Rate::Set(n)),
    }
}

/// A whole number of IOPS with an optional `k` or `m`.
fn iops_number(s: &str, what: &str) -> Result<u64, String> {
    let (num, scale) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1_000),
        Some((i, 'm' | 'M')) => (&s[..i], 1_000_000),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| {
            format!("invalid {what} {s:?}: expected a whole number such as 5000 or 20k, or `none`")
        })
}

/// A node's IOPS capacity as a daemon declares it at start: a positive number (`none` is
/// `node set`'s).
pub(crate) fn parse_iops_count(s: &str) -> Result<u64, String> {
    match parse_iops_capacity(s)? {
        Rate::Set(n) => Ok(n),
        Rate::Remove(_) => Err(
            "`none` is not a capacity: leave the flag out (`trireme node set ID --iops-capacity none` forgets one)".into(),
        ),
    }
}

/// A node's IOPS capacity: `none`, or a positive whole number with an optional `k` or `m`.
pub(crate) fn parse_iops_capacity(s: &str) -> Result<Rate, String> {
    rate(s, "an IOPS capacity", |t| iops_number(t, "IOPS capacity"))
}

/// An IOPS limit: `none`, or a positive whole number with an optional `k` (thousands) or
/// `m` (millions).
pub fn parse_iops_limit(s: &str) -> Result<Rate, String> {
    limit(s, "an IOPS", |t| iops_number(t, "IOPS limit"))
}

/// A weight against other volumes on busy nodes: `none` (back to 1) or 1 to 1000.
pub fn parse_weight(s: &str) -> Result<Rate, String> {
    let max = trireme_replication::qos::MAX_WEIGHT;
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(Rate::Remove(NoLimit::None));
    }
    match t.parse::<u32>() {
        Ok(w) if (1..=max).contains(&w) => Ok(Rate::Set(u64::from(w))),
        _ => Err(format!(
            "invalid weight {s:?}: expected a whole number from 1 to {max}, or `none`"
        )),
    }
}

/// A bytes-a-second limit: `none`, or a size (as `--size` reads them) with an optional
/// `/s`: `100M` is 100 MiB/s, `100MB/s` 100 MB/s.
pub fn parse_bps_limit(s: &str) -> Result<Rate, String> {
    limit(s, "a bytes-a-second", |t| {
        parse_size(t.strip_suffix("/s").unwrap_or(t))
    })
}

/// A burst: `0`, or a duration such as `500ms` or `2s` up to an hour, in milliseconds.
pub fn parse_burst(s: &str) -> Result<u32, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    let d = parse_duration(s)?;
    match d.as_millis() {
        ms if ms <= u128::from(trireme_replication::qos::MAX_BURST_MS) => Ok(ms as u32),
        _ => Err(format!("a burst of {s:?} is longer than the longest, 1h")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse() {
        let set = |n| Ok(Rate::Set(n));
        assert_eq!(parse_iops_limit("5000"), set(5000));
        assert_eq!(parse_iops_limit("20k"), set(20_000));
        assert_eq!(parse_iops_limit("1M"), set(1_000_000));
        assert_eq!(parse_iops_limit("None"), Ok(Rate::Remove(NoLimit::None)));
        assert_eq!(parse_bps_limit("100M"), set(100 << 20));
        assert_eq!(parse_bps_limit("100MB/s"), set(100_000_000));
        assert_eq!(parse_burst("0"), Ok(0));
        assert_eq!(parse_burst("2s"), Ok(2000));
        assert_eq!(parse_burst("500ms"), Ok(500));
        for bad in ["0", "-5", "", "5x", "k", "1.5k", "99999999999999999999"] {
            let e = parse_iops_limit(bad).unwrap_err();
            assert!(e.contains("limit"), "{bad}: {e}");
        }
        assert!(parse_iops_limit("-5").unwrap_err().contains("of \"-5\""));
        assert!(parse_iops_limit("0").unwrap_err().contains("of 0"));
        assert_eq!(parse_weight("7"), set(7));
        assert_eq!(parse_weight("none"), Ok(Rate::Remove(NoLimit::None)));
        for bad in ["0", "1001", "-1", "2.5", "heavy", ""] {
            assert!(
                parse_weight(bad).unwrap_err().contains("invalid weight"),
                "{bad}"
            );
        }
        for bad in ["0", "-1M", "10Q", "M/s"] {
            assert!(parse_bps_limit(bad).is_err(), "{bad}");
        }
        for bad in ["2h", "-1s", "x"] {
            assert!(parse_burst(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trash_times_parse() {
        let secs = |s| parse_keep(s).map(|d| d.as_secs());
        assert_eq!(secs("0"), Ok(0));
        assert_eq!(secs("90"), Ok(90));
        assert_eq!(secs("30m"), Ok(1800));
        assert_eq!(secs("12h"), Ok(43200));
        assert_eq!(secs("7d"), Ok(7 * 86400));
        for bad in [
            "",
            "d",
            "-1d",
            "1.5d",
            "1w",
            "400d",
            "99999999999999999999d",
            "1dd",
        ] {
            assert!(parse_keep(bad).is_err(), "{bad}");
        }
    }
    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_size("10gib"), Ok(10 << 30));
        assert_eq!(parse_size("2TB"), Ok(2_000_000_000_000));
        assert_eq!(parse_size("512B"), Ok(512));
        assert!(parse_size("1GBB").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1 << 30), "1.0 GiB");
    }
}
