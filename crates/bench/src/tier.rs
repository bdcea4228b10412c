//! The tier section of a report: reads served by each tier, the hit ratio and the migrations
//! during the measured window, summed over the volume's replicas on tiered nodes, and whether
//! the slow tier was a disk model (its numbers are then the model's).

use std::path::Path;

use serde::Serialize;
use trireme_control::{ReplicaTierStatus, Request, StatusReport, VolumeInfo};

/// What the tiers did during a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierSection {
    /// Reads served by the fast tier over all reads; `None` if nothing was read.
    pub hit_ratio: Option<f64>,
    pub reads_fast: u64,
    pub reads_slow: u64,
    pub promotions: u64,
    pub demotions: u64,
    /// Extents on the fast tier at the end, per node.
    pub fast_extents: Vec<(u32, u64)>,
    /// The disk model in front of the slow tier, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_model: Option<String>,
}

/// The volume's tier counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    tiers: Vec<ReplicaTierStatus>,
    disk_model: Option<String>,
}

/// The volume a cluster target names: `volume:NAME`, `nbd://HOST:PORT/NAME`,
/// `nbd+unix:///NAME?socket=PATH`.
pub fn volume_of(target: &str) -> Option<String> {
    if let Some(v) = target.strip_prefix("volume:") {
        return Some(v.to_string());
    }
    let rest = target.split_once("://")?.1;
    if !target.starts_with("nbd") {
        return None;
    }
    let path = rest.split_once('/')?.1;
    let name = path.split(['?', '#']).next()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// One control request to the cluster at `data_dir`; `None` if nothing answers there.
pub(crate) fn call<T: serde::de::DeserializeOwned>(data_dir: &Path, req: Request) -> Option<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let mut c = trireme_control::ControlClient::connect(&data_dir.join("control.sock"))
            .await
            .ok()?;
        c.call::<T>(&req).await.ok()
    })
}

/// The counters of `volume` in the cluster at `data_dir`; `None` if it has no tiered replica
/// (or no cluster answers there).
pub fn snapshot(data_dir: &Path, volume: &str) -> Option<Snapshot> {
    let info: VolumeInfo = call(
        data_dir,
        Request::VolumeInfo {
            name: volume.to_string(),
        },
    )?;
    if info.tiers.is_empty() {
        return None;
    }
    let status: Option<StatusReport> = call(data_dir, Request::Status);
    let disk_model = status.and_then(|s| {
        s.nodes
            .iter()
            .find_map(|n| n.tiers.as_ref().and_then(|t| t.disk_model.clone()))
    });
    Some(Snapshot {
        tiers: info.tiers,
        disk_model,
    })
}

/// What happened between two snapshots.
pub fn section(before: &Snapshot, after: &Snapshot) -> TierSection {
    let mut s = TierSection {
        hit_ratio: None,
        reads_fast: 0,
        reads_slow: 0,
        promotions: 0,
        demotions: 0,
        fast_extents: Vec::new(),
        disk_model: after.disk_model.clone(),
    };
    for a in &after.tiers {
        // A node restarted in between starts its counters again: count from zero then.
        let b = before.tiers.iter().find(|b| b.node == a.node);
        let d = |f: fn(&ReplicaTierStatus) -> u64| {
            let was = b.map_or(0, f);
            let now = f(a);
            if now >= was {
                now - was
            } else {
                now
            }
        };
        s.reads_fast += d(|t| t.reads_fast);
        s.reads_slow += d(|t| t.reads_slow);
        s.promotions += d(|t| t.promotions);
        s.demotions += d(|t| t.demotions);
        s.fast_extents.push((a.node, a.fast_extents));
    }
    let reads = s.reads_fast + s.reads_slow;
    s.hit_ratio = (reads > 0).then(|| s.reads_fast as f64 / reads as f64);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_are_found_in_cluster_targets() {
        assert_eq!(volume_of("volume:vol0").as_deref(), Some("vol0"));
        assert_eq!(
            volume_of("nbd://127.0.0.1:10809/vol0").as_deref(),
            Some("vol0")
        );
        assert_eq!(
            volume_of("nbd+unix:///data?socket=/tmp/x/nbd.sock").as_deref(),
            Some("data")
        );
        assert_eq!(volume_of("/dev/sdb"), None);
        assert_eq!(volume_of("nbd://host/"), None);
        assert_eq!(volume_of("null"), None);
    }
}
