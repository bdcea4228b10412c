//! What trireme measures, and how it is shown to Prometheus.
//!
//! * The I/O path updates [`VolumeMetrics`]: per operation, relaxed atomic counters and a
//!   power-of-two [`Histogram`] of latency. No lock, no allocation: a volume's metrics are made
//!   once, when it is opened, and found again by name if it is opened again in the same process
//!   (so counters never go back).
//! * Everything else (replica states, capacity, tiers, the process's CPU and memory) is read
//!   when Prometheus scrapes, into an [`Exposition`]: families of samples, encoded in the
//!   OpenMetrics text format by `prometheus-client`. `prometheus-client`'s own histogram takes
//!   a lock on every observation, so ours is encoded through its collector interface instead.

pub mod expo;
pub mod histogram;
pub mod process;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use expo::{Exposition, Kind, Labels};
pub use histogram::{HistSnapshot, Histogram};

/// The operations a volume counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Write-zeroes that may leave a hole (NBD TRIM, or WRITE_ZEROES without NO_HOLE).
    Trim,
    /// Write-zeroes that must allocate.
    Zero,
    Flush,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Read, Op::Write, Op::Trim, Op::Zero, Op::Flush];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Trim => "trim",
            Op::Zero => "zero",
            Op::Flush => "flush",
        }
    }
}

/// One operation's counts.
#[derive(Debug, Default)]
pub struct OpMetrics {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub latency: Histogram,
}

/// One operation's counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpSnapshot {
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    pub latency: HistSnapshot,
}

/// Shards of a volume's counters: each thread counts into its own (threads are spread over
/// them), so the cores do not pass the counters' cache lines back and forth under load.
const SHARDS: usize = 8;

/// One shard: every operation's counts, on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard([OpMetrics; 5]);

static NEXT_SHARD: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Relaxed) as usize % SHARDS;
}

/// A volume's I/O as its writer saw it.
#[derive(Debug)]
pub struct VolumeMetrics {
    pub name: String,
    shards: Box<[Shard; SHARDS]>,
    /// Time requests waited for the volume's limits (ns): only a throttled request adds.
    throttled_ns: AtomicU64,
}

/// A volume's counts at one moment, indexed like [`Op::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSnapshot {
    pub name: String,
    pub ops: [OpSnapshot; 5],
    /// Nanoseconds requests waited for the volume's limits, summed.
    pub throttled_ns: u64,
}

impl VolumeMetrics {
    fn new(name: &str) -> VolumeMetrics {
        VolumeMetrics {
            name: name.to_string(),
            shards: Box::default(),
            throttled_ns: AtomicU64::new(0),
        }
    }

    /// Counts time a request waited for the volume's limits.
    pub fn throttled(&self, waited: Duration) {
        self.throttled_ns
            .fetch_add(waited.as_nanos() as u64, Relaxed);
    }

    /// Counts one completed request: `bytes` it moved (0 for a flush), how long it took, and
    /// whether it failed. Up to four relaxed atomic adds, on the calling thread's shard.
    #[inline]
    pub fn record(&self, op: Op, bytes: u64, took: Duration, ok: bool) {
        let shard = SHARD.with(|s| *s);
        let m = &self.shards[shard].0[op as usize];
        if !ok {
            m.errors.fetch_add(1, Relaxed);
            return;
        }
        m.ops.fetch_add(1, Relaxed);
        if bytes != 0 {
            m.bytes.fetch_add(bytes, Relaxed);
        }
        m.latency.record(took);
    }

    pub fn snapshot(&self) -> VolumeSnapshot {
        VolumeSnapshot {
            name: self.name.clone(),
            ops: std::array::from_fn(|i| {
                let mut s = OpSnapshot::default();
                for shard in self.shards.iter() {
                    let m = &shard.0[i];
                    s.ops += m.ops.load(Relaxed);
                    s.bytes += m.bytes.load(Relaxed);
                    s.errors += m.errors.load(Relaxed);
                    s.latency.add(&m.latency.snapshot());
                }
                s
            }),
            throttled_ns: self.throttled_ns.load(Relaxed),
        }
    }
}

/// The volumes this process writes.
static VOLUMES: Mutex<Vec<Arc<VolumeMetrics>>> = Mutex::new(Vec::new());

/// The metrics of volume `name` in this process: made at the first call, the same ones after.
pub fn volume(name: &str) -> Arc<VolumeMetrics> {
    let mut all = VOLUMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = all.iter().find(|v| v.name == name) {
        return v.clone();
    }
    let v = Arc::new(VolumeMetrics::new(name));
    all.push(v.clone());
    v
}

/// Every volume this process has written, as they are now.
pub fn volumes() -> Vec<VolumeSnapshot> {
    let all = VOLUMES.lock().unwrap_or_else(|e| e.into_inner()).clone();
    all.iter().map(|v| v.snapshot()).collect()
}

/// Adds the volumes' families to `e`.
pub fn expose_volumes(e: &mut Exposition, volumes: &[VolumeSnapshot]) {
    if volumes.is_empty() {
        return;
    }
    let labels =
        |v: &VolumeSnapshot, op: Op| Labels::new().with("volume", &v.name).with("op", op.name());
    let mut ops = Vec::new();
    let mut bytes = Vec::new();
    let mut errors = Vec::new();
    let mut latency = Vec::new();
    for v in volumes {
        for op in Op::ALL {
            let s = &v.ops[op as usize];
            ops.push((labels(v, op), s.ops as f64));
            if op != Op::Flush {
                bytes.push((labels(v, op), s.bytes as f64));
            }
            errors.push((labels(v, op), s.errors as f64));
            latency.push((labels(v, op), s.latency));
        }
    }
    e.family(
        "trireme_volume_ops",
        "Requests the writer completed, by volume and operation.",
        Kind::Counter,
        ops,
    );
    e.family(
        "trireme_volume_bytes",
        "Bytes the writer's completed requests read, wrote, trimmed or zeroed.",
        Kind::Counter,
        bytes,
    );
    e.family(
        "trireme_volume_errors",
        "Requests the writer failed (an error returned to the client).",
        Kind::Counter,
        errors,
    );
    e.family(
        "trireme_volume_throttled_seconds",
        "Time the writer's requests waited for the volume's limits, summed over requests.",
        Kind::Counter,
        volumes
            .iter()
            .map(|v| {
                (
                    Labels::new().with("volume", &v.name),
                    v.throttled_ns as f64 / 1e9,
                )
            })
            .collect(),
    );
    e.histograms(
        "trireme_volume_op_duration_seconds",
        "Time from the writer receiving a request to its completion, by volume and operation.",
        latency,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_keeps_its_counters_when_opened_again() {
        let a = volume("metrics-test-a");
        a.record(Op::Write, 4096, Duration::from_micros(50), true);
        a.record(Op::Write, 4096, Duration::from_micros(50), false);
        let b = volume("metrics-test-a");
        assert!(Arc::ptr_eq(&a, &b));
        let s = b.snapshot();
        let w = s.ops[Op::Write as usize];
        assert_eq!((w.ops, w.bytes, w.errors, w.latency.count), (1, 4096, 1, 1));
        assert!(volumes().iter().any(|v| v.name == "metrics-test-a"));
    }

    #[test]
    fn counts_from_many_threads_add_up() {
        let v = volume("metrics-test-threads");
        std::thread::scope(|s| {
            for _ in 0..12 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        v.record(Op::Read, 512, Duration::from_micros(20), true);
                    }
                });
            }
        });
        let r = v.snapshot().ops[Op::Read as usize];
        assert_eq!(
            (r.ops, r.bytes, r.latency.count),
            (12_000, 12_000 * 512, 12_000)
        );
        assert_eq!(r.latency.sum_ns, 12_000 * 20_000);
    }
}
