//! The dashboard's state: the cluster's status, each volume's rates and latency over the last
//! interval (from the writer's counters in this process), and the recent events, found by
//! comparing one status with the one before. One sampler runs while a browser listens, once a
//! second, whatever the number of browsers; none runs when nobody looks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use trireme_control::{Manager, ReplicaStatusState, StatusReport};
use trireme_meta::IoRates;
use trireme_metrics::{Op, VolumeSnapshot};

/// How often the board is sampled while someone watches.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Events kept.
const EVENTS: usize = 50;

/// One volume's I/O over the last interval, as its writer saw it: the writer in this process,
/// or one on another host through its report (`trireme_meta::WriterReport`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VolumeRates {
    pub volume: String,
    #[serde(flatten)]
    pub rates: IoRates,
}

/// Something that changed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BoardEvent {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `node-down`, `node-up`, `replica`, `resync-done`, `move`.
    pub kind: String,
    pub text: String,
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
    pub events: Vec<BoardEvent>,
    /// This process's CPU time and resident memory.
    pub process_cpu_seconds: f64,
    pub process_resident_bytes: u64,
}

#[derive(Debug, Default)]
struct Memory {
    volumes: HashMap<String, (Instant, VolumeSnapshot)>,
    status: Option<StatusReport>,
    events: VecDeque<BoardEvent>,
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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
        let (status, error) = match status {
            Ok(st) => {
                if let Some(prev) = &mem.status {
                    for ev in events(prev, &st) {
                        mem.events.push_back(ev);
                    }
                    while mem.events.len() > EVENTS {
                        mem.events.pop_front();
                    }
                }
                mem.status = Some(st.clone());
                (Some(st), None)
            }
            Err(e) => (None, Some(e.to_string())),
        };
        BoardState {
            time_ms: now_ms(),
            status,
            error,
            rates,
            events: mem.events.iter().cloned().collect(),
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

/// What changed between two statuses.
pub(crate) fn events(prev: &StatusReport, now: &StatusReport) -> Vec<BoardEvent> {
    let t = now_ms();
    let ev = |kind: &str, text: String| BoardEvent {
        time_ms: t,
        kind: kind.to_string(),
        text,
    };
    let mut out = Vec::new();
    for n in &now.nodes {
        match prev.nodes.iter().find(|p| p.id == n.id) {
            Some(p) if p.up && !n.up => out.push(ev("node-down", format!("node {} is down", n.id))),
            Some(p) if !p.up && n.up => out.push(ev("node-up", format!("node {} is up", n.id))),
            None => out.push(ev("node-up", format!("node {} joined", n.id))),
            _ => {}
        }
    }
    for v in &now.volumes {
        let Some(pv) = prev.volumes.iter().find(|p| p.name == v.name) else {
            out.push(ev("volume", format!("volume {} created", v.name)));
            continue;
        };
        for r in &v.replicas {
            let Some(pr) = pv.replicas.iter().find(|p| p.node == r.node) else {
                out.push(ev(
                    "replica",
                    format!(
                        "{}: a replica on node {} was added ({})",
                        v.name, r.node, r.state
                    ),
                ));
                continue;
            };
            if pr.state == r.state {
                continue;
            }
            let text = match (pr.state, r.state) {
                (ReplicaStatusState::Resyncing, ReplicaStatusState::InSync) => {
                    let what = pr
                        .resync
                        .as_ref()
                        .map(|p| format!(" ({} gone through)", crate::local::human(p.total_bytes)))
                        .unwrap_or_default();
                    out.push(ev(
                        "resync-done",
                        format!(
                            "{}: the replica on node {} is resynced{what}",
                            v.name, r.node
                        ),
                    ));
                    continue;
                }
                (ReplicaStatusState::InSync, s) => {
                    format!(
                        "{}: the replica on node {} is taken out ({s})",
                        v.name, r.node
                    )
                }
                (a, b) => format!("{}: the replica on node {}: {a} → {b}", v.name, r.node),
            };
            out.push(ev("replica", text));
        }
        for pr in &pv.replicas {
            if !v.replicas.iter().any(|r| r.node == pr.node) {
                out.push(ev(
                    "replica",
                    format!("{}: the replica on node {} is gone", v.name, pr.node),
                ));
            }
        }
    }
    for m in &now.moves {
        let before = prev
            .moves
            .iter()
            .find(|p| p.node == m.node && p.kind == m.kind);
        if before.map(|p| p.state) != Some(m.state) {
            let kind = match m.kind {
                trireme_control::MoveKind::Drain => "drain",
                trireme_control::MoveKind::Remove => "remove",
            };
            out.push(ev(
                "move",
                format!("{kind} of node {}: {}", m.node, m.state)
                    + &m.error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_control::{NodeStatus, ReplicaStatus, VolumeStatus};

    fn status(up2: bool, state: ReplicaStatusState) -> StatusReport {
        let node = |id, up| NodeStatus {
            id,
            addr: String::new(),
            store: "memory".into(),
            up,
            ping_us: None,
            transport: "tcp".into(),
            state: Default::default(),
            replicas: 1,
            last_seen_ms: None,
            registered: None,
            zone: None,
            tiers: None,
            capacity: None,
        };
        StatusReport {
            nodes: vec![node(1, true), node(2, up2)],
            volumes: vec![VolumeStatus {
                name: "v".into(),
                id: 1,
                size: 1 << 20,
                epoch: 1,
                access: vec![],
                replicas: vec![ReplicaStatus {
                    node: 2,
                    state,
                    allocated_bytes: None,
                    epoch: None,
                    resync: None,
                    tier: None,
                }],
                client_links: vec![],
                writer: None,
                min_copies: 1,
                writes_suspended: false,
                tier: Default::default(),
                scrub: None,
                health: None,
                io: None,
            }],
            moves: vec![],
            manager: None,
            health: None,
        }
    }

    #[test]
    fn a_node_going_down_and_its_replica_taken_out_are_events() {
        let a = status(true, ReplicaStatusState::InSync);
        let b = status(false, ReplicaStatusState::Failed);
        let evs = events(&a, &b);
        let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["node-down", "replica"], "{evs:?}");
        assert!(evs[1].text.contains("taken out"), "{evs:?}");
        let c = status(true, ReplicaStatusState::Resyncing);
        let d = status(true, ReplicaStatusState::InSync);
        let evs = events(&c, &d);
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].kind, "resync-done");
        assert!(events(&d, &d).is_empty());
    }

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
