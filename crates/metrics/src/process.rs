//! This process's CPU, memory, threads and file descriptors, read from `/proc/self` at each
//! scrape, under the names Prometheus's own client libraries use (`process_*`), so existing
//! dashboards and alerts work on them.

use crate::{Exposition, Kind, Labels};

/// What `/proc/self` says now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    pub open_fds: u64,
    /// Seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

fn sysconf(name: libc::c_int) -> f64 {
    // SAFETY: sysconf takes an integer and returns one; no memory is shared.
    let v = unsafe { libc::sysconf(name) };
    if v > 0 {
        v as f64
    } else {
        // Linux's defaults, should the call fail.
        match name {
            libc::_SC_CLK_TCK => 100.0,
            _ => 4096.0,
        }
    }
}

/// Fields of `/proc/<pid>/stat` after the command (which may hold spaces and parentheses).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// Reads `/proc/self`; `None` where it is not there (not Linux).
pub fn stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let f = stat_fields(&stat)?;
    // Fields after the command, from 0: state(0) ... utime(11) stime(12) ... num_threads(17)
    // ... starttime(19) vsize(20) rss(21).
    let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
    let tick = sysconf(libc::_SC_CLK_TCK);
    let page = sysconf(libc::_SC_PAGESIZE) as u64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    Some(ProcessStats {
        cpu_seconds: (num(11)? + num(12)?) as f64 / tick,
        resident_bytes: num(21)? * page,
        virtual_bytes: num(20)?,
        threads: num(17)?,
        open_fds,
        start_time_seconds: boot as f64 + num(19)? as f64 / tick,
    })
}

/// Adds this process's families to `e`.
pub fn expose(e: &mut Exposition) {
    let Some(s) = stats() else {
        return;
    };
    let one = |e: &mut Exposition, name: &str, help: &str, kind: Kind, v: f64| {
        e.sample(name, help, kind, Labels::new(), v)
    };
    one(
        e,
        "process_cpu_seconds",
        "User and system CPU time this process has used, in seconds.",
        Kind::Counter,
        s.cpu_seconds,
    );
    one(
        e,
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        Kind::Gauge,
        s.resident_bytes as f64,
    );
    one(
        e,
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        Kind::Gauge,
        s.virtual_bytes as f64,
    );
    one(
        e,
        "process_threads",
        "Threads in this process.",
        Kind::Gauge,
        s.threads as f64,
    );
    one(
        e,
        "process_open_fds",
        "Open file descriptors.",
        Kind::Gauge,
        s.open_fds as f64,
    );
    one(
        e,
        "process_start_time_seconds",
        "When the process started, in seconds since the Unix epoch.",
        Kind::Gauge,
        s.start_time_seconds,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = stats().expect("/proc/self on Linux");
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes);
        assert!(s.threads >= 1 && s.open_fds >= 3);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86400.0);
        // Burn a little CPU: the counter moves.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(stats().unwrap().cpu_seconds >= s.cpu_seconds);
    }

    #[test]
    fn a_command_with_parentheses_does_not_shift_the_fields() {
        let f = stat_fields("42 (a) b) (c) S 1 2 3").unwrap();
        assert_eq!(f, vec!["S", "1", "2", "3"]);
    }
}
