//! The pool view (`trireme pool`, and its line in `status`): per node and in total, what the
//! volumes provision, what they hold, and the room left, as `ceph df` shows a cluster. Made
//! from a [`StatusReport`], so it says what `status` says.

use serde::{Deserialize, Serialize};

use crate::api::{StatusReport, VolumeStatus};
use crate::human;

/// One node's share of the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodePool {
    pub node: u32,
    pub up: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Bytes its replicas may hold (`None`: no limit, or the node did not answer).
    pub capacity: Option<u64>,
    pub overcommit: Option<f64>,
    /// Its replicas' sizes, summed, and what the over-commit limit lets them sum to.
    pub provisioned: Option<u64>,
    pub provision_limit: Option<u64>,
    /// Bytes its replicas hold.
    pub allocated: Option<u64>,
    pub fs_size: Option<u64>,
    pub fs_free: Option<u64>,
    /// Its thin replicas could still write more than its file system has free.
    pub at_risk: bool,
}

/// One volume's part of the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumePool {
    pub name: String,
    pub size: u64,
    pub copies: usize,
    pub thick: bool,
    /// The size times the copies.
    pub provisioned: u64,
    /// The most any one of its copies holds (`None`: no copy answered).
    pub allocated: Option<u64>,
}

/// The whole pool: sums over the nodes that answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolReport {
    pub nodes: Vec<NodePool>,
    pub volumes: Vec<VolumePool>,
    /// Capacity of the nodes that answered and have a limit.
    pub capacity: u64,
    pub provisioned: u64,
    pub provision_limit: u64,
    pub allocated: u64,
    /// The largest volume of `copies` copies that could be created now is at most this (the
    /// room left to provision on the `copies`-th roomiest node): for 1, 2 and 3 copies.
    pub largest_new_volume: [u64; 3],
}

impl PoolReport {
    pub fn from_status(s: &StatusReport) -> PoolReport {
        let nodes: Vec<NodePool> = s
            .nodes
            .iter()
            .map(|n| {
                let sp = n.space.as_ref();
                let limit = sp.and_then(|sp| {
                    sp.capacity
                        .map(|c| (c as f64 * sp.overcommit).min(u64::MAX as f64) as u64)
                });
                NodePool {
                    node: n.id,
                    up: n.up,
                    zone: n.zone.clone(),
                    capacity: sp.and_then(|sp| sp.capacity),
                    overcommit: sp.map(|sp| sp.overcommit),
                    provisioned: sp.map(|sp| sp.provisioned),
                    provision_limit: limit,
                    allocated: sp.map(|sp| sp.allocated),
                    fs_size: sp.and_then(|sp| sp.fs_size),
                    fs_free: sp.and_then(|sp| sp.fs_free),
                    at_risk: sp.is_some_and(|sp| {
                        sp.fs_free
                            .is_some_and(|f| sp.provisioned.saturating_sub(sp.allocated) > f)
                    }),
                }
            })
            .collect();
        let volumes = s.volumes.iter().map(volume_pool).collect();
        let sum = |f: &dyn Fn(&NodePool) -> Option<u64>| -> u64 {
            nodes.iter().filter_map(f).fold(0u64, u64::saturating_add)
        };
        // What each node that takes replicas could still provision, roomiest first.
        let mut room: Vec<u64> = nodes
            .iter()
            .filter(|n| n.up)
            .filter(|n| {
                s.nodes
                    .iter()
                    .any(|x| x.id == n.node && x.state == trireme_meta::NodeState::Active)
            })
            .map(|n| match (n.provision_limit, n.provisioned) {
                (Some(l), Some(p)) => l.saturating_sub(p),
                _ => u64::MAX,
            })
            .collect();
        room.sort_unstable_by(|a, b| b.cmp(a));
        let largest = |k: usize| room.get(k - 1).copied().unwrap_or(0);
        PoolReport {
            capacity: sum(&|n| n.capacity),
            provisioned: sum(&|n| n.provisioned),
            provision_limit: sum(&|n| n.provision_limit),
            allocated: sum(&|n| n.allocated),
            largest_new_volume: [largest(1), largest(2), largest(3)],
            nodes,
            volumes,
        }
    }

    /// The pool in one line, for `status`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "pool: {} provisioned of {} (capacity {}), {} written",
            human(self.provisioned),
            human(self.provision_limit),
            human(self.capacity),
            human(self.allocated),
        );
        let risky: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.at_risk)
            .map(|n| n.node.to_string())
            .collect();
        if !risky.is_empty() {
            s += &format!(
                "; node {}: thin volumes could write more than the file system has free",
                risky.join(", ")
            );
        }
        s
    }

    /// The pool as a table, for `trireme pool`.
    pub fn text(&self) -> String {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), human);
        let mut s = format!(
            "{:<5} {:<10} {:<10} {:<30} {:<10} {:<10} {}\n",
            "NODE",
            "CAPACITY",
            "OVERCOMMIT",
            "PROVISIONED (OF LIMIT)",
            "WRITTEN",
            "FS FREE",
            "FS SIZE"
        );
        let provisioned = |p: Option<u64>, l: Option<u64>| match (p, l) {
            (Some(p), Some(l)) if l > 0 => format!(
                "{} of {} ({:.0}%)",
                human(p),
                human(l),
                p as f64 * 100.0 / l as f64
            ),
            (p, _) => opt(p),
        };
        for n in &self.nodes {
            s += &format!(
                "{:<5} {:<10} {:<10} {:<30} {:<10} {:<10} {}{}\n",
                n.node,
                if n.up { opt(n.capacity) } else { "down".into() },
                n.overcommit.map_or("-".into(), |o| format!("{o:.2}x")),
                provisioned(n.provisioned, n.provision_limit),
                opt(n.allocated),
                opt(n.fs_free),
                opt(n.fs_size),
                if n.at_risk {
                    "  (its thin volumes could write more than is free)"
                } else {
                    ""
                }
            );
        }
        s += &format!(
            "{:<5} {:<10} {:<10} {:<30} {}\n",
            "all",
            human(self.capacity),
            "",
            provisioned(Some(self.provisioned), Some(self.provision_limit)),
            human(self.allocated)
        );
        s += &format!(
            "room for a new volume of 1 copy: {}, 2 copies: {}, 3 copies: {}\n",
            room(self.largest_new_volume[0]),
            room(self.largest_new_volume[1]),
            room(self.largest_new_volume[2])
        );
        s += &format!(
            "\n{:<16} {:<10} {:<7} {:<6} {:<12} {}\n",
            "VOLUME", "SIZE", "COPIES", "KIND", "PROVISIONED", "WRITTEN (largest copy)"
        );
        for v in &self.volumes {
            s += &format!(
                "{:<16} {:<10} {:<7} {:<6} {:<12} {}\n",
                v.name,
                human(v.size),
                v.copies,
                if v.thick { "thick" } else { "thin" },
                human(v.provisioned),
                opt(v.allocated)
            );
        }
        s
    }
}

fn room(b: u64) -> String {
    match b {
        u64::MAX => "no limit".into(),
        0 => "none".into(),
        b => human(b),
    }
}

fn volume_pool(v: &VolumeStatus) -> VolumePool {
    VolumePool {
        name: v.name.clone(),
        size: v.size,
        copies: v.replicas.len(),
        thick: v.preallocate,
        provisioned: v.size.saturating_mul(v.replicas.len() as u64),
        allocated: v.replicas.iter().filter_map(|r| r.allocated_bytes).max(),
    }
}
