//! Reserves against what the nodes can serve: each copy of a volume claims the volume's
//! reserve on its node (writes go to every copy, reads to any), so a node holds the sum of
//! the reserves of the volumes with a copy on it. A node whose sum passes its IOPS capacity
//! (`--iops-capacity`, in 8 KiB units a second) cannot keep those promises when it is busy:
//! the manager says so when a reserve is set, and `status` says so while it lasts.

use serde::{Deserialize, Serialize};
use trireme_meta::{NodeRecord, NodeState, VolumeRecord};

/// One node's reserves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReserves {
    pub node: u32,
    /// What it serves flat out, in 8 KiB units a second (`None`: not declared).
    pub capacity: Option<u64>,
    /// The reserves of the volumes with a copy on it, added up.
    pub reserved: u64,
    /// Those volumes and their reserves, largest first.
    pub volumes: Vec<(String, u64)>,
}

impl NodeReserves {
    /// Reserves past its capacity.
    pub fn overcommitted(&self) -> bool {
        self.capacity.is_some_and(|c| self.reserved > c)
    }

    /// `node 2: reserves add up to 12,000 IOPS (a 8,000, b 4,000), above the 10,000 it can
    /// serve`, for an overcommitted node.
    pub fn warning(&self) -> Option<String> {
        let cap = self.capacity.filter(|_| self.overcommitted())?;
        Some(format!(
            "node {}: reserves add up to {} IOPS ({}), above the {} it can serve (--iops-capacity); under load some volumes get less than their reserve",
            self.node,
            grouped(self.reserved),
            self.volumes_text(),
            grouped(cap)
        ))
    }

    fn volumes_text(&self) -> String {
        const SHOWN: usize = 4;
        let mut parts: Vec<String> = self
            .volumes
            .iter()
            .take(SHOWN)
            .map(|(name, r)| format!("{name} {}", grouped(*r)))
            .collect();
        if self.volumes.len() > SHOWN {
            parts.push(format!("{} more", self.volumes.len() - SHOWN));
        }
        parts.join(", ")
    }
}

/// Every node's reserves (removed nodes left out), by node id.
pub fn node_reserves(nodes: &[NodeRecord], volumes: &[VolumeRecord]) -> Vec<NodeReserves> {
    nodes
        .iter()
        .filter(|n| n.state != NodeState::Removed)
        .map(|n| {
            let mut vols: Vec<(String, u64)> = volumes
                .iter()
                .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                .filter_map(|v| Some((v.name.clone(), v.limits_in_force().iops_reserve?)))
                .collect();
            vols.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            NodeReserves {
                node: n.id,
                capacity: n.iops_capacity,
                reserved: vols.iter().map(|(_, r)| r).sum(),
                volumes: vols,
            }
        })
        .collect()
}

/// What to tell whoever just set a reserve on `volumes` (their names): each overcommitted
/// node holding one of them, and the nodes holding one whose capacity nobody declared (their
/// reserves are not checked).
pub fn warnings_for(all: &[NodeReserves], volumes: &[&str]) -> Vec<String> {
    let touched: Vec<&NodeReserves> = all
        .iter()
        .filter(|n| n.volumes.iter().any(|(v, _)| volumes.contains(&v.as_str())))
        .collect();
    let mut out: Vec<String> = touched.iter().filter_map(|n| n.warning()).collect();
    let unknown: Vec<String> = touched
        .iter()
        .filter(|n| n.capacity.is_none())
        .map(|n| n.node.to_string())
        .collect();
    if !unknown.is_empty() {
        out.push(format!(
            "reserves not checked on node{} {}: no IOPS capacity declared (`trireme node set ID --iops-capacity N`)",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.join(", ")
        ));
    }
    out
}

/// `12345678` as `12,345,678`.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_replication::qos::Limits;

    fn node(id: u32, capacity: Option<u64>) -> NodeRecord {
        NodeRecord {
            id,
            addr: format!("h{id}:7000"),
            local_addr: None,
            store: "file".into(),
            state: NodeState::Active,
            zone: None,
            http: None,
            iops_capacity: capacity,
        }
    }

    fn volume(name: &str, on: &[u32], reserve: Option<u64>) -> VolumeRecord {
        let mut v: VolumeRecord = serde_json::from_value(serde_json::json!({
            "name": name, "id": 1, "size": 1 << 30, "epoch": 1,
            "replicas": on.iter().map(|n| serde_json::json!({"node": n, "state": "in-sync"})).collect::<Vec<_>>(),
        }))
        .unwrap();
        v.limits = Limits {
            iops_reserve: reserve,
            ..Limits::default()
        };
        v
    }

    #[test]
    fn a_node_past_its_capacity_is_named_with_its_total() {
        let nodes = [node(1, Some(10_000)), node(2, Some(20_000)), node(3, None)];
        let vols = [
            volume("a", &[1, 2], Some(8_000)),
            volume("b", &[1, 3], Some(4_000)),
            volume("c", &[2, 3], None),
        ];
        let r = node_reserves(&nodes, &vols);
        assert_eq!(
            r.iter().map(|n| n.reserved).collect::<Vec<_>>(),
            [12_000, 8_000, 4_000]
        );
        assert!(r[0].overcommitted() && !r[1].overcommitted() && !r[2].overcommitted());
        assert_eq!(
            r[0].warning().unwrap(),
            "node 1: reserves add up to 12,000 IOPS (a 8,000, b 4,000), above the 10,000 it can serve (--iops-capacity); under load some volumes get less than their reserve"
        );
        let w = warnings_for(&r, &["b"]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("node 1: reserves add up to 12,000"));
        assert!(w[1].starts_with("reserves not checked on node 3:"), "{w:?}");
        // A volume on nodes with room and a declared capacity: nothing to say.
        assert!(warnings_for(&node_reserves(&nodes[1..2], &vols), &["a"]).is_empty());
        // A volume without a reserve touches no node.
        assert!(warnings_for(&r, &["c"]).is_empty());
    }

    #[test]
    fn removed_nodes_count_nothing_and_numbers_are_grouped() {
        let mut gone = node(4, Some(1));
        gone.state = NodeState::Removed;
        assert!(node_reserves(&[gone], &[volume("a", &[4], Some(5))]).is_empty());
        for (n, s) in [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (1234567, "1,234,567"),
        ] {
            assert_eq!(grouped(n), s);
        }
    }
}
