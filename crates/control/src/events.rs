//! The event recorder: while a manager holds its role, it compares the cluster's status with
//! what it saw before, every [`RECORD_EVERY`], and records what changed, in words, in the
//! metadata store ([`trireme_meta::ClusterEvent`]): a node down or back, a replica taken out
//! or resynced, a volume's health word changing (a writer fenced among them), a drain's steps,
//! the manager role taken. What it compared against is stored with the events (`Seen`), so
//! the next manager — on another host, after a crash — tells what changed meanwhile and
//! the list goes on where it was: the dashboard and `trireme events` read it from the store.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trireme_meta::{ClusterEvent, MetaError};

use crate::api::{ReplicaStatusState, StatusReport};
use crate::health::Verdict;
use crate::{Manager, MoveKind, MoveState};

/// How often the recorder looks.
pub const RECORD_EVERY: Duration = Duration::from_secs(1);

/// What the recorder compares: the parts of a status that make events, nothing that moves
/// by itself (pings, progress), so it changes only when something happened.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    nodes: Vec<(u32, bool)>,
    volumes: Vec<SeenVolume>,
    moves: Vec<SeenMove>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SeenVolume {
    name: String,
    health: Option<Verdict>,
    /// Node, state, and the size of its resync if one runs.
    replicas: Vec<(u32, ReplicaStatusState, Option<u64>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SeenMove {
    node: u32,
    kind: MoveKind,
    state: MoveState,
    error: Option<String>,
}

impl Seen {
    pub fn of(s: &StatusReport) -> Seen {
        Seen {
            nodes: s.nodes.iter().map(|n| (n.id, n.up)).collect(),
            volumes: s
                .volumes
                .iter()
                .map(|v| SeenVolume {
                    name: v.name.clone(),
                    health: v.health.as_ref().map(|h| h.verdict),
                    replicas: v
                        .replicas
                        .iter()
                        .map(|r| (r.node, r.state, r.resync.as_ref().map(|p| p.total_bytes)))
                        .collect(),
                })
                .collect(),
            moves: s
                .moves
                .iter()
                .map(|m| SeenMove {
                    node: m.node,
                    kind: m.kind,
                    state: m.state,
                    error: m.error.clone(),
                })
                .collect(),
        }
    }
}

/// What changed between `prev` and the status `now`, stamped `time_ms`.
pub fn changes(prev: &Seen, now: &StatusReport, time_ms: u64) -> Vec<ClusterEvent> {
    let ev = |kind: &str, text: String| ClusterEvent::new(time_ms, kind, text);
    let mut out = Vec::new();
    for n in &now.nodes {
        match prev.nodes.iter().find(|p| p.0 == n.id) {
            Some(&(_, true)) if !n.up => {
                out.push(ev("node-down", format!("node {} is down", n.id)))
            }
            Some(&(_, false)) if n.up => out.push(ev("node-up", format!("node {} is up", n.id))),
            None => out.push(ev("node-up", format!("node {} joined", n.id))),
            _ => {}
        }
    }
    for p in &prev.nodes {
        if !now.nodes.iter().any(|n| n.id == p.0) {
            out.push(ev("node-down", format!("node {} left the cluster", p.0)));
        }
    }
    for v in &now.volumes {
        // A volume's coming and going are the manager's own events (created, cloned,
        // restored from the trash, deleted: `manager/`), which know which it was.
        let Some(pv) = prev.volumes.iter().find(|p| p.name == v.name) else {
            continue;
        };
        for r in &v.replicas {
            let Some(&(_, pstate, ptotal)) = pv.replicas.iter().find(|p| p.0 == r.node) else {
                out.push(ev(
                    "replica",
                    format!(
                        "{}: a replica on node {} was added ({})",
                        v.name, r.node, r.state
                    ),
                ));
                continue;
            };
            if pstate == r.state {
                continue;
            }
            let text = match (pstate, r.state) {
                (ReplicaStatusState::Resyncing, ReplicaStatusState::InSync) => {
                    let what = ptotal
                        .map(|t| format!(" ({} gone through)", crate::human(t)))
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
        for &(node, ..) in &pv.replicas {
            if !v.replicas.iter().any(|r| r.node == node) {
                out.push(ev(
                    "replica",
                    format!("{}: the replica on node {node} is gone", v.name),
                ));
            }
        }
        let health = v.health.as_ref();
        if let (Some(was), Some(h)) = (pv.health, health) {
            if was != h.verdict {
                let why = h
                    .reasons
                    .first()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                out.push(ev(
                    "health",
                    format!("{}: {was} → {}{why}", v.name, h.verdict),
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
                MoveKind::Drain => "drain",
                MoveKind::Remove => "remove",
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

/// Milliseconds since the Unix epoch, as events and the dashboard stamp them.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The recorder's memory between two looks: what it compared last and the revision of that
/// mark in the store (`None`: read it from the store first).
#[derive(Debug)]
struct Recorder {
    mark: Option<(Option<Seen>, i64)>,
    /// The manager role's own event is still to be recorded.
    announce: bool,
}

impl Manager {
    /// Records the cluster's events while this manager lives (see the module doc).
    pub fn start_event_recorder(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut rec = Recorder {
                mark: None,
                announce: true,
            };
            loop {
                let Some(m) = me.upgrade() else { return };
                match m.record_events(&mut rec).await {
                    Ok(()) => {}
                    Err(MetaError::Deposed(_)) => return,
                    Err(e) => tracing::debug!("event recorder: {e}"),
                }
                drop(m);
                tokio::time::sleep(RECORD_EVERY).await;
            }
        });
    }

    async fn record_events(&self, rec: &mut Recorder) -> Result<(), MetaError> {
        let (prev, rev) = match rec.mark.take() {
            Some(m) => m,
            None => match self.meta.events_seen().await? {
                // A mark of another version reads as none: the list goes on, without the
                // changes made while the role moved.
                Some((bytes, rev)) => (serde_json::from_slice::<Seen>(&bytes).ok(), rev),
                None => (None, 0),
            },
        };
        let status = match self.status().await {
            Ok(s) => s,
            Err(e) => {
                rec.mark = Some((prev, rev));
                return Err(MetaError::Unavailable(e.to_string()));
            }
        };
        let now = Seen::of(&status);
        let t = now_ms();
        let mut events = prev
            .as_ref()
            .map(|p| changes(p, &status, t))
            .unwrap_or_default();
        if rec.announce {
            let own = self.own_node.load(std::sync::atomic::Ordering::Relaxed);
            events.insert(
                0,
                ClusterEvent::new(
                    t,
                    "manager",
                    match own {
                        0 => "the manager started".to_string(),
                        n => format!("node {n} took the manager role"),
                    },
                ),
            );
        }
        if events.is_empty() && prev.as_ref() == Some(&now) {
            rec.mark = Some((prev, rev));
            return Ok(());
        }
        let bytes = serde_json::to_vec(&now).expect("a mark always serializes");
        match self.meta.record_events(&events, &bytes, rev).await? {
            Some(new_rev) => {
                rec.announce = false;
                rec.mark = Some((Some(now), new_rev));
            }
            // Another recorder wrote meanwhile (a manager that had not yet seen it was
            // deposed): read its mark next time.
            None => rec.mark = None,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeStatus, ReplicaStatus, VolumeStatus};
    use crate::health::Health;

    fn status(up2: bool, state: ReplicaStatusState, verdict: Verdict) -> StatusReport {
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
            space: None,
            iops_capacity: None,
            reserved_iops: 0,
        };
        StatusReport {
            nodes: vec![node(1, true), node(2, up2)],
            volumes: vec![VolumeStatus {
                name: "v".into(),
                id: 1,
                size: 1 << 20,
                preallocate: false,
                epoch: 1,
                access: vec![],
                replicas: vec![ReplicaStatus {
                    node: 2,
                    state,
                    allocated_bytes: None,
                    epoch: None,
                    resync: None,
                    tier: None,
                    integrity: None,
                }],
                client_links: vec![],
                writer: None,
                min_copies: 1,
                writes_suspended: false,
                tier: Default::default(),
                scrub: None,
                resiliency: None,
                limits: Default::default(),
                qos_policy: None,
                throttled_seconds: None,
                health: Some(Health {
                    verdict,
                    reasons: vec!["the reason".into()],
                }),
                io: None,
                last_scrub: None,
                nvmf: vec![],
            }],
            moves: vec![],
            manager: None,
            health: None,
            warnings: vec![],
        }
    }

    #[test]
    fn a_node_going_down_its_replica_taken_out_and_the_health_word_are_events() {
        let a = status(true, ReplicaStatusState::InSync, Verdict::Healthy);
        let b = status(false, ReplicaStatusState::Failed, Verdict::Degraded);
        let evs = changes(&Seen::of(&a), &b, 7);
        let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["node-down", "replica", "health"], "{evs:?}");
        assert!(evs[1].text.contains("taken out"), "{evs:?}");
        assert_eq!(evs[2].text, "v: healthy → degraded: the reason");
        assert!(evs.iter().all(|e| e.time_ms == 7));
        let c = status(true, ReplicaStatusState::Resyncing, Verdict::Resyncing);
        let d = status(true, ReplicaStatusState::InSync, Verdict::Resyncing);
        let evs = changes(&Seen::of(&c), &d, 0);
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].kind, "resync-done");
        assert!(changes(&Seen::of(&d), &d, 0).is_empty());
        // What it compares survives the store (the next manager reads it).
        let bytes = serde_json::to_vec(&Seen::of(&b)).unwrap();
        assert_eq!(
            serde_json::from_slice::<Seen>(&bytes).unwrap(),
            Seen::of(&b)
        );
        // A volume gone, a node gone.
        let mut e = d.clone();
        e.volumes.clear();
        e.nodes.pop();
        let evs = changes(&Seen::of(&d), &e, 0);
        let texts: Vec<&str> = evs.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(
            texts,
            ["node 2 left the cluster"],
            "a volume's going is the manager's own event"
        );
    }
}
