//! One scrape: what this process knows, as metric families.
//!
//! Each fact has one source, so sums across processes count it once:
//! * the writer's own counters (`trireme_volume_*`), from the process that writes the volume;
//! * the cluster as the manager sees it (`trireme_node_up`, `trireme_replica_state`, resyncs,
//!   links of the writers in its process, drain and remove jobs), from the manager alone;
//! * a node's store and tiers (`trireme_store_*`, `trireme_tier_*`), from the node's process;
//! * `process_*`, from every process.

use trireme_control::{ReplicaStatusState, StatusReport};
use trireme_metrics::{Exposition, Kind, Labels};

use super::HttpSources;

pub(super) async fn scrape(src: &HttpSources) -> String {
    let mut e = Exposition::new();
    trireme_metrics::expose_volumes(&mut e, &trireme_metrics::volumes());
    if let Some(node) = &src.node {
        node_families(&mut e, &node.usage());
    }
    let mut links = Vec::new();
    if let Some(m) = src.manager() {
        match m.status().await {
            Ok(st) => {
                cluster_families(&mut e, &st);
                for v in &st.volumes {
                    // A writer on another host exports its own links.
                    links.extend(
                        v.client_links
                            .iter()
                            .filter(|l| !l.reported)
                            .map(|l| (l.node, l.transport.clone())),
                    );
                }
            }
            Err(err) => tracing::warn!("metrics: cluster status: {err}"),
        }
    }
    for v in &src.writers {
        for (node, info) in v.connections() {
            if let Some(i) = info {
                links.push((node, i.transport));
            }
        }
    }
    links.sort();
    links.dedup();
    if !links.is_empty() {
        e.family(
            "trireme_link_transport",
            "1 for each transport a writer in this process reaches a node over (ucx, unix, tcp).",
            Kind::Gauge,
            links
                .into_iter()
                .map(|(n, t)| (Labels::new().with("node", n).with("transport", t), 1.0))
                .collect(),
        );
    }
    let r = trireme_nbd::refusals();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed) as f64;
    e.family(
        "trireme_nbd_refused_requests",
        "NBD requests this process's server refused before they reached the volume, by reason: over the 32 MiB limit (oversize), past the export's end (out-of-range), unknown command or flags (invalid).",
        Kind::Counter,
        vec![
            (Labels::new().with("reason", "oversize"), n(&r.oversize)),
            (Labels::new().with("reason", "out-of-range"), n(&r.out_of_range)),
            (Labels::new().with("reason", "invalid"), n(&r.invalid)),
        ],
    );
    trireme_metrics::process::expose(&mut e);
    e.encode()
}

const REPLICA_STATES: [ReplicaStatusState; 7] = [
    ReplicaStatusState::InSync,
    ReplicaStatusState::Outdated,
    ReplicaStatusState::Failed,
    ReplicaStatusState::Resyncing,
    ReplicaStatusState::Removed,
    ReplicaStatusState::Unreachable,
    ReplicaStatusState::Missing,
];

fn cluster_families(e: &mut Exposition, st: &StatusReport) {
    let node = |id: u32| Labels::new().with("node", id);
    e.family(
        "trireme_node_up",
        "1 if the node answered the manager just now (and holds its lease, on etcd).",
        Kind::Gauge,
        st.nodes
            .iter()
            .map(|n| (node(n.id), if n.up { 1.0 } else { 0.0 }))
            .collect(),
    );
    e.family(
        "trireme_node_ping_seconds",
        "Round trip of the manager's ping to the node over the data path.",
        Kind::Gauge,
        st.nodes
            .iter()
            .filter_map(|n| n.ping_us.map(|p| (node(n.id), p as f64 / 1e6)))
            .collect(),
    );
    e.family(
        "trireme_node_iops_capacity",
        "What the node serves flat out, in 8 KiB units a second, as declared (node set --iops-capacity).",
        Kind::Gauge,
        st.nodes
            .iter()
            .filter_map(|n| n.iops_capacity.map(|c| (node(n.id), c as f64)))
            .collect(),
    );
    e.family(
        "trireme_node_reserved_iops",
        "The IOPS reserves of the volumes with a copy on the node, added up (8 KiB units a second).",
        Kind::Gauge,
        st.nodes
            .iter()
            .map(|n| (node(n.id), n.reserved_iops as f64))
            .collect(),
    );
    let mut states = Vec::new();
    for n in &st.nodes {
        for s in [
            trireme_meta::NodeState::Active,
            trireme_meta::NodeState::Draining,
            trireme_meta::NodeState::Removed,
        ] {
            let name = match s {
                trireme_meta::NodeState::Active => "active",
                trireme_meta::NodeState::Draining => "draining",
                trireme_meta::NodeState::Removed => "removed",
            };
            states.push((
                node(n.id).with("state", name),
                if n.state == s { 1.0 } else { 0.0 },
            ));
        }
    }
    e.family(
        "trireme_node_state",
        "1 for the node's place in the cluster: active, draining (takes no new replicas) or removed.",
        Kind::Gauge,
        states,
    );

    let mut replica_state = Vec::new();
    let mut remaining = Vec::new();
    let mut allocated = Vec::new();
    let mut unverified = Vec::new();
    let mut bad = Vec::new();
    for v in &st.volumes {
        for r in &v.replicas {
            let l = || Labels::new().with("volume", &v.name).with("node", r.node);
            for s in REPLICA_STATES {
                replica_state.push((l().with("state", s), if r.state == s { 1.0 } else { 0.0 }));
            }
            match (&r.resync, r.state) {
                (Some(p), _) => {
                    remaining.push((l(), p.total_bytes.saturating_sub(p.done_bytes) as f64))
                }
                (None, ReplicaStatusState::InSync) => remaining.push((l(), 0.0)),
                _ => {}
            }
            if let Some(a) = r.allocated_bytes {
                allocated.push((l(), a as f64));
                let i = r.integrity.as_ref();
                let unclean = i.is_some_and(|i| i.unclean);
                unverified.push((l(), if unclean { 1.0 } else { 0.0 }));
                bad.push((l(), i.map_or(0, |i| i.bad_blocks) as f64));
            }
        }
    }
    e.family(
        "trireme_replica_state",
        "1 for each replica's state (in-sync, outdated, failed, resyncing, removed, unreachable, missing), 0 for the others.",
        Kind::Gauge,
        replica_state,
    );
    e.family(
        "trireme_resync_remaining_bytes",
        "Bytes a resync still has to go through (0 for an in-sync replica; absent before a resync starts).",
        Kind::Gauge,
        remaining,
    );
    e.family(
        "trireme_replica_allocated_bytes",
        "Bytes the replica holds in allocated grains, as its node reports.",
        Kind::Gauge,
        allocated,
    );
    e.family(
        "trireme_replica_unverified",
        "1 while the replica's node stopped uncleanly with it open and no scrub has compared it since (the volume's health says unverified).",
        Kind::Gauge,
        unverified,
    );
    e.family(
        "trireme_replica_bad_blocks",
        "Reads that met a block of the replica failing its checksum since a scrub last verified it (the volume's health says degraded).",
        Kind::Gauge,
        bad,
    );
    let vol = |name: &str| Labels::new().with("volume", name);
    e.family(
        "trireme_volume_size_bytes",
        "The volume's size.",
        Kind::Gauge,
        st.volumes
            .iter()
            .map(|v| (vol(&v.name), v.size as f64))
            .collect(),
    );
    e.family(
        "trireme_volume_replicas_in_sync",
        "The volume's replicas in sync now.",
        Kind::Gauge,
        st.volumes
            .iter()
            .map(|v| {
                let n = v
                    .replicas
                    .iter()
                    .filter(|r| r.state == ReplicaStatusState::InSync)
                    .count();
                (vol(&v.name), n as f64)
            })
            .collect(),
    );
    e.family(
        "trireme_volume_min_copies",
        "Fewest in-sync copies writes go on with.",
        Kind::Gauge,
        st.volumes
            .iter()
            .map(|v| (vol(&v.name), v.min_copies as f64))
            .collect(),
    );
    let mut limits = Vec::new();
    for v in &st.volumes {
        for k in trireme_replication::qos::Kind::ALL {
            if let Some(n) = v.limits.get(k) {
                limits.push((vol(&v.name).with("limit", k.name()), n as f64));
            }
        }
    }
    e.family(
        "trireme_volume_limit",
        "A volume's I/O limit, by kind: iops, read-iops, write-iops (8 KiB units a second), bps, read-bps, write-bps (bytes a second).",
        Kind::Gauge,
        limits,
    );
    let claims = st
        .volumes
        .iter()
        .flat_map(|v| {
            let (reserve, weight) = v.limits.claim();
            [
                (vol(&v.name).with("claim", "iops-reserve"), reserve as f64),
                (vol(&v.name).with("claim", "weight"), f64::from(weight)),
            ]
        })
        .collect();
    e.family(
        "trireme_volume_claim",
        "A volume's claim on busy nodes: its iops-reserve (8 KiB units a second, 0 for none) and its weight against other volumes (1 by default).",
        Kind::Gauge,
        claims,
    );
    let mut health = Vec::new();
    for v in &st.volumes {
        if let Some(h) = &v.health {
            for verdict in trireme_control::health::Verdict::ALL {
                health.push((
                    vol(&v.name).with("verdict", verdict.as_str()),
                    if h.verdict == verdict { 1.0 } else { 0.0 },
                ));
            }
        }
    }
    e.family(
        "trireme_volume_health",
        "1 for the volume's health verdict (healthy, resyncing, degraded, writes-suspended, writer-fenced, unavailable), 0 for the others.",
        Kind::Gauge,
        health,
    );
    if let Some(h) = &st.health {
        e.family(
            "trireme_cluster_health",
            "1 for the cluster's health verdict (its worst volume's, or degraded with a node down), 0 for the others.",
            Kind::Gauge,
            trireme_control::health::Verdict::ALL
                .iter()
                .map(|&verdict| {
                    (
                        Labels::new().with("verdict", verdict.as_str()),
                        if h.verdict == verdict { 1.0 } else { 0.0 },
                    )
                })
                .collect(),
        );
    }
    let scrubbed: Vec<_> = st
        .volumes
        .iter()
        .filter_map(|v| v.last_scrub.as_ref().map(|o| (vol(&v.name), o)))
        .collect();
    e.family(
        "trireme_volume_last_scrub_timestamp_seconds",
        "When the volume's last scrub (asked or scheduled) ended, in seconds since the Unix epoch.",
        Kind::Gauge,
        scrubbed
            .iter()
            .map(|(l, o)| (l.clone(), o.at as f64))
            .collect(),
    );
    e.family(
        "trireme_volume_last_scrub_ok",
        "1 if the volume's last scrub finished with every region agreeing or repaired, 0 if it failed or left regions with no majority.",
        Kind::Gauge,
        scrubbed
            .iter()
            .map(|(l, o)| {
                let ok = o.error.is_none() && o.unresolved_regions == 0;
                (l.clone(), if ok { 1.0 } else { 0.0 })
            })
            .collect(),
    );
    e.family(
        "trireme_volume_last_scrub_mismatched_regions",
        "Regions where the copies disagreed in the volume's last scrub.",
        Kind::Gauge,
        scrubbed
            .iter()
            .map(|(l, o)| (l.clone(), o.mismatched_regions as f64))
            .collect(),
    );
    e.family(
        "trireme_volume_last_scrub_repaired_regions",
        "Regions the volume's last scrub rewrote from the majority copy.",
        Kind::Gauge,
        scrubbed
            .iter()
            .map(|(l, o)| (l.clone(), o.repaired_regions as f64))
            .collect(),
    );
    e.family(
        "trireme_volume_writes_suspended",
        "1 while the writer in the manager's process holds writes back for want of in-sync copies.",
        Kind::Gauge,
        st.volumes
            .iter()
            .map(|v| (vol(&v.name), if v.writes_suspended { 1.0 } else { 0.0 }))
            .collect(),
    );
    e.family(
        "trireme_scrub_remaining_bytes",
        "Bytes a running scrub has still to compare (absent when none runs).",
        Kind::Gauge,
        st.volumes
            .iter()
            .filter_map(|v| {
                v.scrub.as_ref().map(|p| {
                    (
                        vol(&v.name),
                        p.total_bytes.saturating_sub(p.done_bytes) as f64,
                    )
                })
            })
            .collect(),
    );
    let running: Vec<_> = st
        .moves
        .iter()
        .filter(|m| m.state == trireme_control::MoveState::Running)
        .collect();
    let job = |m: &trireme_control::MoveStatus| {
        Labels::new().with("node", m.node).with(
            "kind",
            match m.kind {
                trireme_control::MoveKind::Drain => "drain",
                trireme_control::MoveKind::Remove => "remove",
            },
        )
    };
    e.family(
        "trireme_move_volumes_remaining",
        "Volumes a running drain or remove job has still to move off its node.",
        Kind::Gauge,
        running
            .iter()
            .map(|m| {
                (
                    job(m),
                    m.volumes_total.saturating_sub(m.volumes_done) as f64,
                )
            })
            .collect(),
    );
    e.family(
        "trireme_move_copy_remaining_bytes",
        "Bytes the copy of the volume a drain or remove job is moving has still to go through.",
        Kind::Gauge,
        running
            .iter()
            .filter_map(|m| {
                m.progress
                    .as_ref()
                    .map(|p| (job(m), p.total_bytes.saturating_sub(p.done_bytes) as f64))
            })
            .collect(),
    );
}

fn node_families(e: &mut Exposition, u: &trireme_node::NodeUsage) {
    let node = || Labels::new().with("node", u.id);
    // Set at start: its --capacity, or the default `node::build_node` gives its kind of store
    // (0 only for a store with no limit, the null store).
    if u.capacity > 0 {
        e.sample(
            "trireme_store_capacity_bytes",
            "Most bytes the node's replicas may hold together (their sizes): its --capacity, or the default for its store.",
            Kind::Gauge,
            node(),
            u.capacity as f64,
        );
    }
    e.sample(
        "trireme_store_used_bytes",
        "Bytes in the allocated grains of the node's replicas.",
        Kind::Gauge,
        node(),
        u.allocated as f64,
    );
    e.sample(
        "trireme_store_provisioned_bytes",
        "The sizes of the node's replicas, summed.",
        Kind::Gauge,
        node(),
        u.provisioned as f64,
    );
    e.sample(
        "trireme_store_replicas",
        "Replicas the node serves.",
        Kind::Gauge,
        node(),
        u.replicas as f64,
    );
    e.sample(
        "trireme_store_bad_block_reads",
        "Reads and checksums that met a block failing its checksum since the node started (the writer repairs the block; a scrub checks the rest of the copy).",
        Kind::Counter,
        node(),
        u.bad_block_reads as f64,
    );
    e.sample(
        "trireme_store_unverified_replicas",
        "Replicas the node opened after an unclean stop that no scrub has verified since.",
        Kind::Gauge,
        node(),
        u.unverified as f64,
    );
    let Some(t) = &u.tiers else {
        return;
    };
    let tier = |name: &str| node().with("tier", name);
    e.sample(
        "trireme_tier_capacity_bytes",
        "Bytes of the fast tier (the slow tier's is its file system's).",
        Kind::Gauge,
        tier("fast"),
        t.fast_capacity as f64,
    );
    e.family(
        "trireme_tier_used_bytes",
        "Bytes each tier holds: whole extents on the fast tier, allocated bytes on the slow.",
        Kind::Gauge,
        vec![
            (tier("fast"), t.fast_used as f64),
            (tier("slow"), t.slow_used as f64),
        ],
    );
    e.sample(
        "trireme_tier_migrated_bytes",
        "Bytes moved between the tiers since the node started.",
        Kind::Counter,
        node(),
        t.migrated_bytes as f64,
    );
    e.sample(
        "trireme_tier_migrate_rate_limit_bytes_per_second",
        "Most bytes the mover moves per second.",
        Kind::Gauge,
        node(),
        t.migrate_rate as f64,
    );
    let rep = |v: u64| node().with("volume_id", v);
    let mut reads = Vec::new();
    let mut extents = Vec::new();
    let mut moves = Vec::new();
    for (v, r) in &u.replica_tiers {
        reads.push((rep(*v).with("tier", "fast"), r.reads_fast as f64));
        reads.push((rep(*v).with("tier", "slow"), r.reads_slow as f64));
        extents.push((rep(*v).with("tier", "fast"), r.fast_extents as f64));
        extents.push((rep(*v).with("tier", "slow"), r.slow_extents as f64));
        moves.push((rep(*v).with("direction", "promote"), r.promotions as f64));
        moves.push((rep(*v).with("direction", "demote"), r.demotions as f64));
    }
    e.family(
        "trireme_tier_reads",
        "Read requests each tier served, per replica (by volume id).",
        Kind::Counter,
        reads,
    );
    e.family(
        "trireme_tier_extents",
        "A replica's extents on each tier.",
        Kind::Gauge,
        extents,
    );
    e.family(
        "trireme_tier_moves",
        "Extents a replica promoted to the fast tier or demoted to the slow.",
        Kind::Counter,
        moves,
    );
}
