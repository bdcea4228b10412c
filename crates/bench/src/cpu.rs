//! CPU accounting over the measured window, from `/proc`.
//!
//! System-wide: per-CPU deltas of `/proc/stat`, split the way DISKSPD splits them:
//! user = user+nice, kernel = system+irq+softirq, idle = idle+iowait, each over the CPU's total
//! (steal included in the total, and reported on its own so a noisy neighbour is visible).
//! Per process: utime+stime of the load generator (this process) and of the storage processes
//! (by pid), turned into CPU seconds; whatever else ran is "other".

use std::time::Instant;

use serde::Serialize;

/// Cumulative jiffies of one CPU (or of all CPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user: u64,
    pub kernel: u64,
    pub idle: u64,
    pub steal: u64,
    pub total: u64,
}

/// A snapshot of everything the report needs.
#[derive(Debug, Clone)]
pub struct CpuSample {
    pub all: CpuTimes,
    pub per_cpu: Vec<CpuTimes>,
    pub generator_ticks: u64,
    pub storage_ticks: u64,
    pub at: Instant,
}

/// Usage of one CPU over the window, in percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    pub usage_pct: f64,
    pub user_pct: f64,
    pub kernel_pct: f64,
    pub idle_pct: f64,
    pub steal_pct: f64,
}

/// What the window cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuReport {
    pub per_cpu: Vec<CpuUsage>,
    pub avg: CpuUsage,
    pub generator_cpu_s: f64,
    pub storage_cpu_s: f64,
    /// Busy CPU time of everything else on the machine (a noisy run shows here).
    pub other_cpu_s: f64,
    pub storage_pids: Vec<u32>,
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Parses one `cpu` line of `/proc/stat`.
pub fn parse_cpu_line(line: &str) -> Option<CpuTimes> {
    let mut it = line.split_whitespace();
    let name = it.next()?;
    if !name.starts_with("cpu") {
        return None;
    }
    let v: Vec<u64> = it.map(|x| x.parse().unwrap_or(0)).collect();
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    let (user, nice, system, idle, iowait, irq, softirq, steal) = (
        get(0),
        get(1),
        get(2),
        get(3),
        get(4),
        get(5),
        get(6),
        get(7),
    );
    Some(CpuTimes {
        user: user + nice,
        kernel: system + irq + softirq,
        idle: idle + iowait,
        steal,
        total: user + nice + system + idle + iowait + irq + softirq + steal,
    })
}

fn process_ticks(pid: u32) -> u64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name, which may contain spaces, start after the last ')'.
    let Some((_, rest)) = s.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// Takes a snapshot.
pub fn sample(storage_pids: &[u32]) -> CpuSample {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let mut all = CpuTimes::default();
    let mut per_cpu = Vec::new();
    for line in stat.lines().filter(|l| l.starts_with("cpu")) {
        if let Some(t) = parse_cpu_line(line) {
            if line.starts_with("cpu ") {
                all = t;
            } else {
                per_cpu.push(t);
            }
        }
    }
    CpuSample {
        all,
        per_cpu,
        generator_ticks: process_ticks(std::process::id()),
        storage_ticks: storage_pids.iter().map(|&p| process_ticks(p)).sum(),
        at: Instant::now(),
    }
}

fn usage(a: &CpuTimes, b: &CpuTimes) -> CpuUsage {
    let total = b.total.saturating_sub(a.total).max(1) as f64;
    let pct = |x: u64, y: u64| 100.0 * y.saturating_sub(x) as f64 / total;
    let idle = pct(a.idle, b.idle);
    CpuUsage {
        usage_pct: 100.0 - idle,
        user_pct: pct(a.user, b.user),
        kernel_pct: pct(a.kernel, b.kernel),
        idle_pct: idle,
        steal_pct: pct(a.steal, b.steal),
    }
}

/// The report for the window between two samples.
pub fn report(a: &CpuSample, b: &CpuSample, storage_pids: &[u32]) -> CpuReport {
    let tps = ticks_per_second();
    let busy = |t: &CpuTimes| t.total - t.idle;
    let busy_s = busy(&b.all).saturating_sub(busy(&a.all)) as f64 / tps;
    let generator_cpu_s = b.generator_ticks.saturating_sub(a.generator_ticks) as f64 / tps;
    let storage_cpu_s = b.storage_ticks.saturating_sub(a.storage_ticks) as f64 / tps;
    CpuReport {
        per_cpu: a
            .per_cpu
            .iter()
            .zip(&b.per_cpu)
            .map(|(x, y)| usage(x, y))
            .collect(),
        avg: usage(&a.all, &b.all),
        generator_cpu_s,
        storage_cpu_s,
        other_cpu_s: (busy_s - generator_cpu_s - storage_cpu_s).max(0.0),
        storage_pids: storage_pids.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_is_system_irq_softirq() {
        let a = parse_cpu_line("cpu  100 0 50 800 10 5 5 0 0 0").unwrap();
        let b = parse_cpu_line("cpu  200 0 110 900 10 15 15 10 0 0").unwrap();
        let u = usage(&a, &b);
        // d(total) = 100 + 60 + 100 + 10 + 10 + 10 = 290; kernel = 60 + 10 + 10 = 80.
        assert!((u.kernel_pct - 100.0 * 80.0 / 290.0).abs() < 1e-9);
        assert!((u.user_pct - 100.0 * 100.0 / 290.0).abs() < 1e-9);
        assert!((u.steal_pct - 100.0 * 10.0 / 290.0).abs() < 1e-9);
        assert!(parse_cpu_line("intr 1 2 3").is_none());
    }

    #[test]
    fn own_process_is_sampled() {
        let a = sample(&[]);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = sample(&[]);
        assert!(b.generator_ticks >= a.generator_ticks);
        assert!(!b.per_cpu.is_empty());
    }
}
