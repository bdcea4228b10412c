//! The dashboard's state: the cluster's status, each volume's rates and latency over the last
//! interval (from the writer's counters in this process, or a writer's report from another
//! host), and the recent events, as the manager's recorder keeps them in the metadata store
//! (`trireme_control::events`: they outlive a manager move). One sampler runs while a browser
//! listens, once a second, whatever the number of browsers; none runs when nobody looks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use trireme_control::{Manager, StatusReport};
use trireme_meta::{ClusterEvent, IoRates};
use trireme_metrics::{Op, VolumeSnapshot};

/// How often the board is sampled while someone watches.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Events shown.
const EVENTS: usize = 50;

/// One volume's I/O over the last interval, as its writer saw it: the writer in this process,
/// or one on another host through its report (`trireme_meta::WriterReport`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VolumeRates {
    pub volume: String,
    #[serde(flatten)]
    pub rates: IoRates,
}

/// What the page shows.
#[derive(Debug, Clone, Serialize)]
pub struct BoardState {
    pub time_ms: u64,
    /// The cluster's status (`None` with `error` set if it could not be read).
    pub status: Option<StatusReport>,
    pub error: Option<String>,
    pub rates: Vec<VolumeRates>,
    /// Newest last.
    pub events: Vec<ClusterEvent>,
    /// This process's CPU time and resident memory.
    pub process_cpu_seconds: f64,
    pub process_resident_bytes: u64,
}

#[derive(Debug, Default)]
struct Memory {
    volumes: HashMap<String, (Instant, VolumeSnapshot)>,
}

#[derive(Debug)]
struct Inner {
    memory: Mutex<Memory>,
    tx: watch::Sender<Option<Arc<String>>>,
    sampling: AtomicBool,
}

/// The dashboard's sampler and its latest state.
#[derive(Debug, Clone)]
pub struct Board(Arc<Inner>);

impl Default for Board {
    fn default() -> Self {
        Board::new()
    }
}

impl Board {
    pub fn new() -> Board {
        Board(Arc::new(Inner {
            memory: Mutex::new(Memory::default()),
            tx: watch::channel(None).0,
            sampling: AtomicBool::new(false),
        }))
    }

    /// The board's JSON, a new one each period, while the receiver is held.
    pub fn subscribe(&self, m: Arc<Manager>) -> watch::Receiver<Option<Arc<String>>> {
        let rx = self.0.tx.subscribe();
        if !self.0.sampling.swap(true, Ordering::AcqRel) {
            let board = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(PERIOD);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let state = board.sample_now(&m).await;
                    let json = serde_json::to_string(&state).unwrap_or_default();
                    board.0.tx.send_replace(Some(Arc::new(json)));
                    if board.0.tx.receiver_count() == 0 {
                        board.0.sampling.store(false, Ordering::Release);
                        // A subscriber that came between the count and the store finds the
                        // flag down and starts its own sampler.
                        break;
                    }
                }
            });
        }
        rx
    }

    /// Samples the cluster now.
    pub async fn sample_now(&self, m: &Manager) -> BoardState {
        let status = m.status().await;
        let now = Instant::now();
        let volumes = trireme_metrics::volumes();
        let proc_ = trireme_metrics::process::stats().unwrap_or_default();
        // Writers on other hosts (a cluster on etcd) report their own rates.
        let reports = m.meta().reports().await.unwrap_or_default();
        let events = m.meta().events(Some(EVENTS)).await.unwrap_or_default();
        let mut mem = self.0.memory.lock().unwrap_or_else(|e| e.into_inner());
        let mut rates: Vec<VolumeRates> = volumes
            .iter()
            .map(|v| {
                let r = match mem.volumes.get(&v.name) {
                    Some((t, prev)) => rates(v, prev, now.duration_since(*t)),
                    None => rates(v, v, Duration::ZERO),
                };
                mem.volumes.insert(v.name.clone(), (now, v.clone()));
                VolumeRates {
                    volume: v.name.clone(),
                    rates: r,
                }
            })
            .collect();
        for (name, r) in reports {
            if let Some(io) = r.io.filter(|_| !rates.iter().any(|x| x.volume == name)) {
                rates.push(VolumeRates {
                    volume: name,
                    rates: io,
                });
            }
        }
        let (status, error): (Option<StatusReport>, _) = match status {
            Ok(st) => (Some(st), None),
            Err(e) => (None, Some(e.to_string())),
        };
        BoardState {
            time_ms: trireme_control::events::now_ms(),
            status,
            error,
            rates,
            events,
            process_cpu_seconds: proc_.cpu_seconds,
            process_resident_bytes: proc_.resident_bytes,
        }
    }
}

/// The I/O between two snapshots of a volume's counters taken `over` apart.
pub(crate) fn rates(now: &VolumeSnapshot, prev: &VolumeSnapshot, over: Duration) -> IoRates {
    let secs = over.as_secs_f64();
    let d = |op: Op| {
        let (a, b) = (&now.ops[op as usize], &prev.ops[op as usize]);
        (
            a.ops.saturating_sub(b.ops),
            a.bytes.saturating_sub(b.bytes),
            a.latency.since(&b.latency),
            a.errors.saturating_sub(b.errors),
        )
    };
    let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let (r_ops, r_bytes, r_lat, r_err) = d(Op::Read);
    let (w_ops, w_bytes, w_lat, w_err) = d(Op::Write);
    IoRates {
        read_iops: per_s(r_ops),
        write_iops: per_s(w_ops),
        read_bytes_per_s: per_s(r_bytes),
        write_bytes_per_s: per_s(w_bytes),
        read_p50_s: r_lat.quantile(0.5),
        read_p99_s: r_lat.quantile(0.99),
        write_p50_s: w_lat.quantile(0.5),
        write_p99_s: w_lat.quantile(0.99),
        errors: r_err + w_err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_the_counters_difference() {
        let m = trireme_metrics::volume("board-test");
        let a = m.snapshot();
        for _ in 0..100 {
            m.record(Op::Read, 4096, Duration::from_micros(100), true);
        }
        m.record(Op::Write, 8192, Duration::from_millis(2), true);
        let b = m.snapshot();
        let r = rates(&b, &a, Duration::from_secs(2));
        assert_eq!(r.read_iops, 50.0);
        assert_eq!(r.read_bytes_per_s, 50.0 * 4096.0);
        assert_eq!(r.write_iops, 0.5);
        let p50 = r.read_p50_s.unwrap();
        assert!((65e-6..=131.1e-6).contains(&p50), "{p50}");
        assert!(r.write_p99_s.unwrap() > 1e-3);
    }
}
