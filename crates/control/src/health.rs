//! One word per volume and one for the cluster, each with its reasons (as `ceph health detail`
//! gives them), worked out from what `status` sees. The words, from best to worst:
//!
//! | verdict | the volume |
//! |---|---|
//! | `healthy` | every copy in sync on a node that answers |
//! | `unverified` | every copy in sync, but one's node stopped uncleanly and no scrub has compared it since (a scrub is on its way) |
//! | `resyncing` | a copy is being brought back (bytes left, rate, ETA in the reasons) |
//! | `degraded` | fewer copies in sync than it has, none being brought back now; or a copy met blocks failing their checksums since its last scrub |
//! | `writes-suspended` | fewer in sync than its minimum: writes wait |
//! | `writer-fenced` | the writer in the cluster's process was superseded by another |
//! | `unavailable` | no copy in sync on a node that answers: nothing can be read |
//!
//! The cluster's word is its worst volume's, or `degraded` when a member node is down while
//! every volume is healthy; a volume without a writer is no fault.

use serde::{Deserialize, Serialize};

use crate::api::{NodeStatus, ReplicaStatusState, VolumeStatus};

/// A health word; the order is from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Healthy,
    Unverified,
    Resyncing,
    Degraded,
    WritesSuspended,
    WriterFenced,
    Unavailable,
}

impl Verdict {
    pub const ALL: [Verdict; 7] = [
        Verdict::Healthy,
        Verdict::Unverified,
        Verdict::Resyncing,
        Verdict::Degraded,
        Verdict::WritesSuspended,
        Verdict::WriterFenced,
        Verdict::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Unverified => "unverified",
            Verdict::Resyncing => "resyncing",
            Verdict::Degraded => "degraded",
            Verdict::WritesSuspended => "writes-suspended",
            Verdict::WriterFenced => "writer-fenced",
            Verdict::Unavailable => "unavailable",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verdict and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            verdict: Verdict::Healthy,
            reasons: Vec::new(),
        }
    }
}

/// The health of volume `v`, given the nodes as `status` saw them.
pub fn volume_health(v: &VolumeStatus, nodes: &[NodeStatus]) -> Health {
    let up = |id: u32| nodes.iter().any(|n| n.id == id && n.up);
    let copies: Vec<_> = v
        .replicas
        .iter()
        .filter(|r| r.state != ReplicaStatusState::Removed)
        .collect();
    let in_sync = copies
        .iter()
        .filter(|r| r.state == ReplicaStatusState::InSync && up(r.node))
        .count();
    let mut reasons = Vec::new();
    let mut resyncing = false;
    for r in &copies {
        match (r.state, &r.resync) {
            (ReplicaStatusState::InSync, _) if up(r.node) => {}
            (ReplicaStatusState::InSync, _) => {
                reasons.push(format!("node {} does not answer", r.node))
            }
            (ReplicaStatusState::Resyncing, p) => {
                resyncing = true;
                reasons.push(match p {
                    Some(p) => {
                        let left = p.total_bytes.saturating_sub(p.done_bytes);
                        let eta = p
                            .eta_secs()
                            .map_or_else(|| "unknown".to_string(), |s| format!("{s} s"));
                        format!(
                            "node {} resyncing: {} left at {}/s, ETA {eta}",
                            r.node,
                            crate::human(left),
                            crate::human(p.rate())
                        )
                    }
                    None => format!("node {} resyncing", r.node),
                })
            }
            (s, _) => reasons.push(format!(
                "node {}: {s}{}",
                r.node,
                if up(r.node) { "" } else { " (node down)" }
            )),
        }
    }
    let n = copies.len();
    let fenced = v
        .writer
        .as_ref()
        .filter(|w| w.fenced.is_some())
        .map(|w| w.text.clone());
    let verdict = if in_sync == 0 {
        reasons.insert(0, format!("no copy of {n} in sync on a node that answers"));
        Verdict::Unavailable
    } else if let Some(w) = fenced {
        reasons.insert(0, w);
        Verdict::WriterFenced
    } else if v.writes_suspended || (in_sync as u32) < v.min_copies {
        reasons.insert(
            0,
            format!(
                "{in_sync} of {n} copies in sync, fewer than its minimum of {}: writes wait",
                v.min_copies
            ),
        );
        Verdict::WritesSuspended
    } else if resyncing {
        reasons.insert(0, format!("{in_sync} of {n} copies in sync"));
        Verdict::Resyncing
    } else if in_sync < n {
        reasons.insert(0, format!("{in_sync} of {n} copies in sync"));
        Verdict::Degraded
    } else {
        Verdict::Healthy
    };
    let (worst, mut more) = integrity(&copies);
    reasons.append(&mut more);
    Health {
        verdict: match worst {
            // A word for the integrity only where the copies' states gave no worse one.
            Some(w) if verdict < w => w,
            _ => verdict,
        },
        reasons,
    }
}

/// What the nodes note against the copies until a scrub verifies them: bad blocks make the
/// volume `degraded`, an unclean stop `unverified` (issue 63: a bad copy must never hide
/// behind `healthy`).
fn integrity(copies: &[&crate::api::ReplicaStatus]) -> (Option<Verdict>, Vec<String>) {
    let mut worst = None;
    let mut reasons = Vec::new();
    for r in copies {
        let Some(i) = &r.integrity else { continue };
        if i.bad_blocks > 0 {
            worst = Some(Verdict::Degraded);
            reasons.push(format!(
                "node {}: {} read{} met blocks failing their checksums since its last scrub (the last at offset {}); a scrub checks and repairs the copy",
                r.node,
                i.bad_blocks,
                if i.bad_blocks == 1 { "" } else { "s" },
                i.last_bad_offset.unwrap_or(0)
            ));
        }
        if i.unclean {
            worst = worst.max(Some(Verdict::Unverified));
            reasons.push(format!(
                "node {} stopped uncleanly with its copy open: unverified until a scrub compares it",
                r.node
            ));
        }
    }
    (worst, reasons)
}

/// The cluster's health: its worst volume's, with every volume's reasons, and member nodes
/// that are down.
pub fn cluster_health(nodes: &[NodeStatus], volumes: &[VolumeStatus]) -> Health {
    let mut h = Health::default();
    for n in nodes
        .iter()
        .filter(|n| !n.up && n.state != trireme_meta::NodeState::Removed)
    {
        h.verdict = h.verdict.max(Verdict::Degraded);
        h.reasons
            .push(format!("node {} ({}) is down", n.id, n.addr));
    }
    for v in volumes {
        let vh = v.health.clone().unwrap_or_else(|| volume_health(v, nodes));
        if vh.verdict != Verdict::Healthy {
            h.verdict = h.verdict.max(vh.verdict);
            h.reasons.push(format!(
                "volume {} is {}: {}",
                v.name,
                vh.verdict,
                vh.reasons.join("; ")
            ));
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ReplicaStatus;

    fn node(id: u32, up: bool) -> NodeStatus {
        serde_json::from_value(serde_json::json!({
            "id": id, "addr": format!("h{id}:7000"), "store": "file", "up": up,
            "ping_us": null, "transport": "tcp", "replicas": 1, "state": "active"
        }))
        .unwrap()
    }

    fn replica(node: u32, state: ReplicaStatusState) -> ReplicaStatus {
        ReplicaStatus {
            node,
            state,
            allocated_bytes: None,
            epoch: None,
            resync: None,
            tier: None,
            integrity: None,
        }
    }

    fn volume(replicas: Vec<ReplicaStatus>, min_copies: u32) -> VolumeStatus {
        VolumeStatus {
            name: "v".into(),
            id: 1,
            size: 1 << 30,
            preallocate: false,
            epoch: 1,
            access: vec![],
            replicas,
            client_links: vec![],
            writer: None,
            min_copies,
            writes_suspended: false,
            tier: Default::default(),
            scrub: None,
            health: None,
            io: None,
            last_scrub: None,
            nvmf: vec![],
            resiliency: None,
            limits: Default::default(),
            qos_policy: None,
            throttled_seconds: None,
        }
    }

    #[test]
    fn each_state_of_the_copies_has_its_word_and_reasons() {
        use ReplicaStatusState::*;
        let nodes = [node(1, true), node(2, true), node(3, false)];
        let h = |v: &VolumeStatus| volume_health(v, &nodes);
        let all = volume(vec![replica(1, InSync), replica(2, InSync)], 1);
        assert_eq!(h(&all), Health::default());

        let down = volume(
            vec![replica(1, InSync), replica(2, InSync), replica(3, InSync)],
            2,
        );
        let d = h(&down);
        assert_eq!(d.verdict, Verdict::Degraded);
        assert_eq!(d.reasons[0], "2 of 3 copies in sync");
        assert!(d.reasons[1].contains("node 3 does not answer"), "{d:?}");

        let mut rs = replica(2, Resyncing);
        rs.resync = Some(trireme_client::ResyncProgress {
            full: true,
            total_bytes: 4 << 20,
            done_bytes: 1 << 20,
            copied_bytes: 1 << 20,
            elapsed_ms: 1000,
        });
        let r = h(&volume(vec![replica(1, InSync), rs], 1));
        assert_eq!(r.verdict, Verdict::Resyncing);
        assert!(
            r.reasons[1].contains("3.0 MiB left at 1.0 MiB/s, ETA 3 s"),
            "{r:?}"
        );

        let s = h(&volume(vec![replica(1, InSync), replica(2, Outdated)], 2));
        assert_eq!(s.verdict, Verdict::WritesSuspended);
        assert!(s.reasons[0].contains("minimum of 2"), "{s:?}");

        let mut f = volume(vec![replica(1, InSync), replica(2, InSync)], 1);
        f.writer = Some(
            crate::api::WriterStatus {
                fenced: Some("this process's writer (epoch 1) was superseded".into()),
                ..Default::default()
            }
            .describe(),
        );
        assert_eq!(h(&f).verdict, Verdict::WriterFenced);

        let u = h(&volume(vec![replica(3, InSync), replica(2, Failed)], 1));
        assert_eq!(u.verdict, Verdict::Unavailable);

        // The cluster: its worst volume, every reason, and nodes down.
        let c = cluster_health(&nodes, &[all, down]);
        assert_eq!(c.verdict, Verdict::Degraded);
        assert!(
            c.reasons
                .iter()
                .any(|r| r.contains("node 3 (h3:7000) is down")),
            "{c:?}"
        );
        assert!(
            c.reasons
                .iter()
                .any(|r| r.starts_with("volume v is degraded")),
            "{c:?}"
        );
        assert!(Verdict::Unavailable > Verdict::WriterFenced);
        assert!(Verdict::Resyncing < Verdict::Degraded);
    }

    /// Issue 63: a copy in sync whose node stopped uncleanly makes the volume `unverified`,
    /// one that met bad blocks `degraded`, each naming the node; neither hides a worse word.
    #[test]
    fn what_the_nodes_note_against_a_copy_is_never_healthy() {
        use crate::api::ReplicaIntegrityStatus;
        use ReplicaStatusState::*;
        let nodes = [node(1, true), node(2, true)];
        let noted = |n: u32, s, unclean: bool, bad: u64| {
            let mut r = replica(n, s);
            r.integrity = Some(ReplicaIntegrityStatus {
                unclean,
                bad_blocks: bad,
                last_bad_offset: (bad > 0).then_some(8192),
            });
            r
        };
        let u = volume_health(
            &volume(vec![replica(1, InSync), noted(2, InSync, true, 0)], 1),
            &nodes,
        );
        assert_eq!(u.verdict, Verdict::Unverified);
        assert!(u.reasons[0].contains("node 2 stopped uncleanly"), "{u:?}");
        let b = volume_health(
            &volume(vec![replica(1, InSync), noted(2, InSync, true, 3)], 1),
            &nodes,
        );
        assert_eq!(b.verdict, Verdict::Degraded);
        assert!(
            b.reasons[0].contains("node 2: 3 reads met blocks failing their checksums")
                && b.reasons[0].contains("offset 8192"),
            "{b:?}"
        );
        let r = volume_health(
            &volume(vec![replica(1, InSync), noted(2, Outdated, true, 0)], 2),
            &nodes,
        );
        assert_eq!(r.verdict, Verdict::WritesSuspended, "{r:?}");
        assert!(Verdict::Healthy < Verdict::Unverified && Verdict::Unverified < Verdict::Resyncing);
    }
}
