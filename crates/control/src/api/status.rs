//! What `status`, `node list` and `volume info` answer: nodes, volumes, replicas, writers and
//! links as the control API reports them (re-exported from `api`).

use serde::{Deserialize, Serialize};

/// A node as `status` and `node list` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: u32,
    pub addr: String,
    pub store: String,
    pub up: bool,
    /// Ping round trip over the data path, if up.
    pub ping_us: Option<u64>,
    /// The transport the manager reached it with.
    pub transport: String,
    /// `active`, `draining` (takes no new replicas) or `removed`.
    #[serde(default)]
    pub state: trireme_meta::NodeState,
    pub replicas: usize,
    /// Milliseconds since the node last answered a heartbeat (None: never).
    #[serde(default)]
    pub last_seen_ms: Option<u64>,
    /// Whether its daemon holds its lease in the cluster metadata (a cluster on etcd; `None`
    /// for `trireme up`, whose supervisor watches its nodes itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The node's tiers (a tiered store), if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<NodeTierStatus>,
    /// Bytes its replicas may hold, if it answered and has a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Its room: over-commit limit, what its replicas provision and hold, its file system
    /// (`None`: down, or a node from before the `Space` op).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<NodeSpaceStatus>,
    /// What it serves flat out, in 8 KiB units a second, as declared (`node set`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_capacity: Option<u64>,
    /// The reserves of the volumes with a copy on it, added up (8 KiB units a second).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_iops: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A node's room for replicas, as its `Space` answer gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSpaceStatus {
    /// Bytes its replicas may hold (`None`: no limit).
    pub capacity: Option<u64>,
    /// How many times its capacity the replicas' sizes may sum to.
    pub overcommit: f64,
    /// The replicas' sizes, summed.
    pub provisioned: u64,
    /// Bytes the replicas hold (written and not trimmed).
    pub allocated: u64,
    /// The file system under its directory (`None`: its store keeps nothing on one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_free: Option<u64>,
}

impl From<trireme_proto::NodeSpace> for NodeSpaceStatus {
    fn from(s: trireme_proto::NodeSpace) -> Self {
        let fs = s.fs_size > 0;
        NodeSpaceStatus {
            capacity: (s.capacity != u64::MAX).then_some(s.capacity),
            overcommit: s.overcommit_milli as f64 / 1000.0,
            provisioned: s.provisioned,
            allocated: s.allocated,
            fs_size: fs.then_some(s.fs_size),
            fs_free: fs.then_some(s.fs_free),
        }
    }
}

/// A node's fast and slow tiers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTierStatus {
    pub fast_capacity: u64,
    /// Bytes of the fast tier taken by extents.
    pub fast_used: u64,
    /// The unit of heat and of migration.
    pub extent: u64,
    /// Most bytes migrated per second.
    pub migrate_rate: u64,
    /// Bytes migrated since the node started.
    pub migrated_bytes: u64,
    /// Bytes the slow tier holds (allocated; its capacity is the file system's).
    #[serde(default)]
    pub slow_used: u64,
    /// Bytes migrated in the last second.
    #[serde(default)]
    pub migrating_per_s: u64,
    /// The disk model in front of the slow tier; `None`: a real disk. Numbers measured over
    /// a model are the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_model: Option<String>,
}

impl From<trireme_proto::NodeTiers> for NodeTierStatus {
    fn from(t: trireme_proto::NodeTiers) -> Self {
        NodeTierStatus {
            fast_capacity: t.fast_capacity,
            fast_used: t.fast_used,
            extent: t.extent,
            migrate_rate: t.migrate_rate,
            migrated_bytes: t.migrated_bytes,
            slow_used: t.slow_used,
            migrating_per_s: t.migrating_per_s,
            disk_model: t.disk_model,
        }
    }
}

/// One replica's tiers on its node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaTierStatus {
    pub node: u32,
    pub pin: trireme_meta::TierPolicy,
    pub fast_extents: u64,
    pub slow_extents: u64,
    /// Read requests served by each tier since the node started.
    pub reads_fast: u64,
    pub reads_slow: u64,
    /// `reads_fast` over all reads; `None` before the first read.
    pub hit_ratio: Option<f64>,
    pub promotions: u64,
    pub demotions: u64,
}

impl ReplicaTierStatus {
    pub fn new(node: u32, r: trireme_proto::ReplicaTierInfo) -> ReplicaTierStatus {
        let reads = r.reads_fast + r.reads_slow;
        ReplicaTierStatus {
            node,
            pin: match r.pin {
                1 => trireme_meta::TierPolicy::Fast,
                2 => trireme_meta::TierPolicy::Slow,
                _ => trireme_meta::TierPolicy::Auto,
            },
            fast_extents: r.fast_extents,
            slow_extents: r.slow_extents,
            reads_fast: r.reads_fast,
            reads_slow: r.reads_slow,
            hit_ratio: (reads > 0).then(|| r.reads_fast as f64 / reads as f64),
            promotions: r.promotions,
            demotions: r.demotions,
        }
    }
}

/// A replica's state as `status` shows it: its record's (or the live writer's), or what was
/// seen just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaStatusState {
    InSync,
    Outdated,
    Failed,
    /// The writer is copying to it.
    Resyncing,
    /// Moved off (the live writer's view, before the record drops it).
    Removed,
    /// Its node is down or did not answer.
    Unreachable,
    /// Its node answers but holds no such replica.
    Missing,
}

impl From<trireme_replication::ReplicaState> for ReplicaStatusState {
    fn from(s: trireme_replication::ReplicaState) -> Self {
        use trireme_replication::ReplicaState as R;
        match s {
            R::InSync => ReplicaStatusState::InSync,
            R::Outdated => ReplicaStatusState::Outdated,
            R::Failed => ReplicaStatusState::Failed,
            R::Resyncing => ReplicaStatusState::Resyncing,
            R::Removed => ReplicaStatusState::Removed,
        }
    }
}

impl std::fmt::Display for ReplicaStatusState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReplicaStatusState::InSync => "in-sync",
            ReplicaStatusState::Outdated => "outdated",
            ReplicaStatusState::Failed => "failed",
            ReplicaStatusState::Resyncing => "resyncing",
            ReplicaStatusState::Removed => "removed",
            ReplicaStatusState::Unreachable => "unreachable",
            ReplicaStatusState::Missing => "missing",
        })
    }
}

/// Who writes a volume, as `status` and `volume info` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WriterStatus {
    /// The epoch it holds.
    pub epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The client identity it reaches the nodes with (a cluster on etcd with TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Where it serves the volume (NBD URIs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uris: Vec<String>,
    /// Set when the writer in the cluster's process was superseded: by what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
    /// The same, in one line for a person.
    pub text: String,
}

impl WriterStatus {
    /// The one-line text from the fields.
    pub fn describe(mut self) -> WriterStatus {
        self.text = match &self.fenced {
            Some(why) => format!("fenced: {why}"),
            None => format!(
                "{}{}{} (epoch {}){}",
                self.pid
                    .map_or("a writer".to_string(), |p| format!("pid {p}")),
                self.host
                    .as_ref()
                    .map_or(String::new(), |h| format!(" on {h}")),
                self.client
                    .as_ref()
                    .map_or(String::new(), |c| format!(" as {c}")),
                self.epoch,
                if self.uris.is_empty() {
                    String::new()
                } else {
                    format!(": {}", self.uris.join(" "))
                }
            ),
        };
        self
    }
}

/// One replica as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub node: u32,
    pub state: ReplicaStatusState,
    pub allocated_bytes: Option<u64>,
    pub epoch: Option<u64>,
    /// Progress when `state` is `resyncing`.
    #[serde(default)]
    pub resync: Option<trireme_client::ResyncProgress>,
    /// Where its extents live, on a tiered node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<ReplicaTierStatus>,
    /// What its node notes against its integrity until a scrub verifies it (absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity: Option<ReplicaIntegrityStatus>,
}

/// What a node notes against a copy until a scrub verifies it (issue 63).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaIntegrityStatus {
    /// The node stopped uncleanly with the copy open.
    #[serde(default)]
    pub unclean: bool,
    /// Reads that met a block failing its checksum.
    #[serde(default)]
    pub bad_blocks: u64,
    /// The last such block's offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_bad_offset: Option<u64>,
}

impl ReplicaIntegrityStatus {
    /// `None` when nothing is noted.
    pub fn new(i: &trireme_proto::ReplicaIntegrity) -> Option<ReplicaIntegrityStatus> {
        (!i.is_clean()).then(|| ReplicaIntegrityStatus {
            unclean: i.unclean,
            bad_blocks: i.bad_blocks,
            last_bad_offset: (i.bad_blocks > 0).then_some(i.last_bad_offset),
        })
    }
}

/// How a volume's bytes are kept, and what that costs and buys (`status`, `volume info`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutStatus {
    /// `{"kind": "mirror"}`, or a parity layout with its K, M and mirrored share.
    pub layout: trireme_replication::Layout,
    /// The nodes it spans: the copies of a mirror, the K+M of a parity stripe.
    pub nodes: usize,
    /// The nodes it may lose at once and lose nothing.
    pub survives: usize,
    /// The fraction of raw space a user can fill (1/3 for a 3-way mirror).
    pub usable_to_raw: f64,
    /// All of the above in one line.
    pub summary: String,
    /// A parity volume's regions, and how many are stripes now (the rest mirrored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<RegionShare>,
}

/// How much of a parity volume is in stripes (`status`, `volume info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionShare {
    pub regions: u64,
    pub parity: u64,
    /// The overlay over the stripes, as its writer last said (none: no writer said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay_blocks: Option<u64>,
    /// The same as a share of the volume, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay_percent: Option<u64>,
}

impl RegionShare {
    /// `97 of 128 regions in parity (76%), 24% mirrored, and 3% of the volume mirrored over
    /// parity (the overlay)`.
    pub fn line(&self) -> String {
        let pct = (self.parity * 100).checked_div(self.regions).unwrap_or(0);
        let overlay = match self.overlay_percent {
            Some(o) => format!(", and {o}% of the volume mirrored over parity (the overlay)"),
            None => String::new(),
        };
        format!(
            "{} of {} regions in parity ({pct}%), {}% mirrored{overlay}",
            self.parity,
            self.regions,
            100 - pct
        )
    }
}

impl LayoutStatus {
    /// Of a volume kept as `layout` on `copies` copies.
    pub fn new(layout: trireme_replication::Layout, copies: usize) -> LayoutStatus {
        LayoutStatus {
            layout,
            nodes: layout.nodes(copies),
            survives: layout.losses_tolerated(copies),
            usable_to_raw: (layout.usable_to_raw(copies) * 1000.0).round() / 1000.0,
            summary: layout.summary(copies),
            regions: None,
        }
    }

    /// Of the volume `v`.
    pub fn of(v: &trireme_meta::VolumeRecord) -> LayoutStatus {
        LayoutStatus::new(v.layout, v.replicas.len())
    }

    /// As [`LayoutStatus::of`], with a parity volume's `recorded` regions counted, and the
    /// `overlay` blocks its writer said it has.
    pub fn with_regions(
        v: &trireme_meta::VolumeRecord,
        recorded: &[trireme_replication::Region],
        overlay: Option<u64>,
    ) -> LayoutStatus {
        let mut s = LayoutStatus::of(v);
        if let trireme_replication::Layout::Parity(p) = v.layout {
            let region = trireme_replication::CHUNK_BLOCKS * u64::from(p.data) * 4096;
            s.regions = Some(RegionShare {
                regions: v.size.div_ceil(region),
                parity: recorded
                    .iter()
                    .filter(|r| **r != trireme_replication::Region::Mirror)
                    .count() as u64,
                overlay_blocks: overlay,
                overlay_percent: overlay.map(|b| (b * 4096 * 100).checked_div(v.size).unwrap_or(0)),
            });
        }
        s
    }
}

/// A volume as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub name: String,
    pub id: u64,
    pub size: u64,
    /// Thick: its copies reserved their whole size at creation.
    #[serde(default)]
    pub preallocate: bool,
    pub epoch: u64,
    /// Client identities that may use it (`*`: every client of the cluster).
    #[serde(default)]
    pub access: Vec<String>,
    pub replicas: Vec<ReplicaStatus>,
    /// The data-path links of the writer attached in this cluster process, if any.
    #[serde(default)]
    pub client_links: Vec<LinkStatus>,
    /// Who writes the volume: from its attach record (a cluster on etcd), or what a writer
    /// attaching through the control socket said of itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<WriterStatus>,
    /// Fewest in-sync copies writes go on with.
    #[serde(default)]
    pub min_copies: u32,
    /// True while the writer in this cluster process holds writes back for want of in-sync
    /// copies (fewer than `min_copies`).
    #[serde(default)]
    pub writes_suspended: bool,
    /// The tier its extents live on, on tiered nodes.
    #[serde(default)]
    pub tier: trireme_meta::TierPolicy,
    /// The progress of a scrub its writer runs now
    /// (`copied_bytes`: bytes rewritten).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<trireme_client::ResyncProgress>,
    /// Its health in one word, with the reasons (`health.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::Health>,
    /// Its I/O over the last few seconds, as a writer on another host reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<trireme_meta::IoRates>,
    /// How its last scrub went (asked or scheduled), if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrub: Option<trireme_meta::ScrubOutcome>,
    /// Its NVMe/TCP exports (`nvmf serve`): one per server, with its ANA state and hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvmf: Vec<trireme_meta::NvmfExportRecord>,
    /// How its bytes are kept (absent from a manager from before layouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resiliency: Option<LayoutStatus>,
    /// Its I/O limits (none unless set).
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::qos::Limits::is_default"
    )]
    pub limits: trireme_replication::qos::Limits,
    /// The QoS policy it is under (its limits are in `limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_policy: Option<String>,
    /// Seconds its writer's requests waited for the limits, since that writer attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled_seconds: Option<f64>,
}

/// What `node lost` did, or would do (`applied` false: a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLostReport {
    pub node: u32,
    /// Whether the records were changed (`--force`), or this only says what would be.
    pub applied: bool,
    /// Volumes whose copies in sync elsewhere are (or would be) accepted as they are.
    pub accepted: Vec<LostVolume>,
    /// Volumes left as they were, and why.
    pub left: Vec<LostVolume>,
}

/// One volume in a [`NodeLostReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostVolume {
    pub volume: String,
    pub why: String,
}

/// What a planned node restart did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRestartReport {
    pub node: u32,
    /// Volumes whose replica there was taken out and resynced.
    pub volumes: Vec<String>,
    /// From the stop until the node served again.
    pub down_ms: u64,
    /// From the stop until every replica there was back in sync.
    pub total_ms: u64,
    /// Bytes the resyncs copied to it.
    pub resynced_bytes: u64,
    /// True if a resync had to compare everything (its history was lost).
    pub full: bool,
}

/// The answer to `volume info`: the volume's record (its fields at the top level of the JSON),
/// and who is attached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeInfo {
    #[serde(flatten)]
    pub record: trireme_meta::VolumeRecord,
    /// Who writes it (see [`VolumeStatus::writer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<WriterStatus>,
    /// The data-path links of the writer attached in the cluster process (`trireme up`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_links: Vec<LinkStatus>,
    /// Each replica's tiers, from the tiered nodes that answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<ReplicaTierStatus>,
    /// Its scrubs: the last one's outcome, and when the schedule counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<trireme_meta::ScrubRecord>,
    /// When the schedule scrubs it next, in seconds since the Unix epoch (none: no schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scrub: Option<u64>,
    /// Its snapshots, oldest first, with the bytes only each holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<crate::SnapshotInfo>,
    /// Its NVMe/TCP exports (see [`VolumeStatus::nvmf`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvmf: Vec<trireme_meta::NvmfExportRecord>,
    /// How its bytes are kept (see [`VolumeStatus::resiliency`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resiliency: Option<LayoutStatus>,
}

/// One data-path link of a volume client to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStatus {
    pub node: u32,
    /// `ucx`, `unix` (same host) or `tcp`.
    pub transport: String,
    pub peer: String,
    pub streams: usize,
    /// For UCX: the lanes UCX chose (`transport/device`, joined by `+`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<String>,
    /// Why a link that could have used UCX runs over TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Reported by a writer on another host (its own process exports it as a metric).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reported: bool,
}

/// The answer to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub nodes: Vec<NodeStatus>,
    pub volumes: Vec<VolumeStatus>,
    /// `node drain` / `node remove` jobs (the latest per node).
    #[serde(default)]
    pub moves: Vec<crate::MoveStatus>,
    /// Who holds the manager role (a cluster on etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<trireme_meta::ManagerRecord>,
    /// The cluster's health in one word, with the reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::Health>,
    /// What is wrong with no copy at risk: nodes whose volumes' reserves add up past their
    /// IOPS capacity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}
