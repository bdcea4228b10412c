//! What the manager reports: a volume's record with its writer and tiers, the nodes', and the
//! cluster's status.

use tokio::time::Instant;

use trireme_meta::{NodeRecord, NodeState, VolumeRecord};
use trireme_proto::{Header, Op, Status};

use crate::api::{NodeStatus, ReplicaStatus, ReplicaStatusState, StatusReport, VolumeStatus};

use super::{Manager, Result};

impl Manager {
    /// A volume's record, with who is attached to it.
    pub(super) async fn volume_info(&self, name: &str) -> Result<crate::api::VolumeInfo> {
        let record = self.meta.volume(name).await?;
        let mut tiers = Vec::new();
        for r in &record.replicas {
            let Ok(n) = self.node(r.node).await else {
                continue;
            };
            if let Some(t) = self.tier_info(&n, record.id).await.and_then(|t| t.replica) {
                tiers.push(crate::api::ReplicaTierStatus::new(n.id, t));
            }
        }
        let scrub = self.meta.scrub_record(name, record.id).await?;
        let every = self.scrub_every();
        let snapshots = self.snapshot_list(name).await?;
        Ok(crate::api::VolumeInfo {
            snapshots,
            // A volume the schedule has not looked at yet counts from its first look, now.
            next_scrub: every.map(|e| {
                scrub
                    .as_ref()
                    .map_or_else(super::trash::now_secs, |r| r.since)
                    .saturating_add(e.as_secs())
            }),
            scrub,
            tiers,
            writer: self.writer_status(&record).await,
            client_links: self.client_links(name),
            nvmf: self.meta.nvmf_exports_of(name).await.unwrap_or_default(),
            resiliency: Some(self.layout_status(&record).await),
            record,
        })
    }

    /// How `v` is kept, with a parity volume's regions as recorded (not counted if the
    /// record cannot be read: never shown as all mirrored).
    async fn layout_status(&self, v: &VolumeRecord) -> crate::api::LayoutStatus {
        if v.layout.is_mirror() {
            return crate::api::LayoutStatus::of(v);
        }
        match self.meta.regions(v.id).await {
            Ok(recorded) => {
                let overlay = self.overlay_of(v).await;
                crate::api::LayoutStatus::with_regions(v, &recorded, overlay)
            }
            Err(e) => {
                tracing::warn!(volume = %v.name, "reading the region record: {e}");
                crate::api::LayoutStatus::of(v)
            }
        }
    }

    /// A parity volume's overlay in blocks, as its writer of the volume's epoch says: this
    /// process's, one attached through the control socket, or the report of another's.
    async fn overlay_of(&self, v: &VolumeRecord) -> Option<u64> {
        if let Some(w) = self.writer(&v.name).filter(|w| w.info().epoch == v.epoch) {
            return w.overlay_blocks();
        }
        if let Some(o) = self.said_overlay(&v.name, v.epoch) {
            return Some(o);
        }
        let report = self.meta.report(&v.name).await.ok().flatten()?;
        (report.epoch == v.epoch)
            .then_some(report.overlay_blocks)
            .flatten()
    }

    /// Who writes `v`: its attach record (a cluster on etcd), or the writer in this process
    /// superseded by another (fenced), or what a writer attaching through the control socket
    /// said of itself, while it holds the volume's epoch and its process lives.
    async fn writer_status(&self, v: &VolumeRecord) -> Option<crate::api::WriterStatus> {
        use crate::api::WriterStatus;
        if let Some((a, _)) = self.meta.attachment(&v.name).await.ok().flatten() {
            return Some(
                WriterStatus {
                    epoch: a.epoch,
                    pid: Some(a.pid),
                    host: Some(a.host),
                    client: a
                        .identity
                        .map(|i| i.trim_start_matches("client ").to_string()),
                    uris: a.exports,
                    ..WriterStatus::default()
                }
                .describe(),
            );
        }
        if let Some(w) = self.writer(&v.name).filter(|w| w.info().epoch != v.epoch) {
            return Some(
                WriterStatus {
                    epoch: w.info().epoch,
                    pid: Some(std::process::id()),
                    fenced: Some(format!(
                        "this process's writer (epoch {}) was superseded by a writer of epoch {}{}",
                        w.info().epoch,
                        v.epoch,
                        if v.writer_open {
                            ""
                        } else {
                            " that has detached"
                        }
                    )),
                    ..WriterStatus::default()
                }
                .describe(),
            );
        }
        let local = self
            .local_writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&v.name)
            .cloned();
        // This process's own writer is shown by its links (`client_links`).
        let (epoch, hello) = local.filter(|(e, h)| {
            *e == v.epoch
                && v.writer_open
                && h.pid != std::process::id()
                && std::path::Path::new(&format!("/proc/{}", h.pid)).exists()
        })?;
        Some(
            WriterStatus {
                epoch,
                pid: Some(hello.pid),
                host: Some(crate::hostname()),
                uris: hello.uris,
                ..WriterStatus::default()
            }
            .describe(),
        )
    }

    /// A node's tiers and its replica of `volume`'s (`None`: no tiers, or no answer).
    async fn tier_info(&self, node: &NodeRecord, volume: u64) -> Option<trireme_proto::TierReport> {
        let h = Header {
            volume,
            ..Header::request(Op::TierInfo, 0)
        };
        match self.node_call(node, h).await {
            Ok(f) if f.header.status == Status::Ok => {
                match trireme_proto::TierReport::decode(&f.payload) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        tracing::warn!(node = node.id, "a tier report that does not decode: {e}");
                        None
                    }
                }
            }
            _ => None,
        }
    }

    pub(super) async fn node_status(
        &self,
        n: &NodeRecord,
        vols: &[VolumeRecord],
        alive: Option<&std::collections::BTreeMap<u32, trireme_meta::AliveRecord>>,
        reserves: &[crate::reserves::NodeReserves],
    ) -> NodeStatus {
        let t0 = Instant::now();
        let registered = alive.map(|a| a.contains_key(&n.id));
        // A node whose lease expired is down at once; no ping to wait out.
        let ping = match registered {
            Some(false) => None,
            _ => self.node_call(n, Header::request(Op::Ping, 0)).await.ok(),
        };
        let up = ping.is_some();
        // Its reply carries the node's capacity, if it sets one.
        let capacity = ping
            .as_ref()
            .and_then(|f| trireme_proto::PingAnswer::read(&f.header, &f.payload).capacity);
        let tiers = match up {
            true => self.tier_info(n, 0).await.map(|t| t.node.into()),
            false => None,
        };
        let space = match up {
            true => self.space(n).await,
            false => None,
        };
        NodeStatus {
            tiers,
            id: n.id,
            addr: n.addr.clone(),
            store: n.store.clone(),
            up,
            ping_us: up.then(|| t0.elapsed().as_micros() as u64),
            transport: "tcp".into(),
            state: n.state,
            replicas: vols
                .iter()
                .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                .count(),
            last_seen_ms: self.last_seen_ms(n.id),
            registered,
            zone: n.zone.clone(),
            capacity: space.as_ref().map_or(capacity, |s| s.capacity),
            space,
            iops_capacity: n.iops_capacity,
            reserved_iops: reserves
                .iter()
                .find(|r| r.node == n.id)
                .map_or(0, |r| r.reserved),
        }
    }

    /// A node's room (`None`: no answer, or a node from before the `Space` op).
    async fn space(&self, node: &NodeRecord) -> Option<crate::api::NodeSpaceStatus> {
        match self.node_call(node, Header::request(Op::Space, 0)).await {
            Ok(f) if f.header.status == Status::Ok => {
                match trireme_proto::NodeSpace::decode(&f.payload) {
                    Ok(s) => Some(s.into()),
                    Err(e) => {
                        tracing::warn!(node = node.id, "a space report that does not decode: {e}");
                        None
                    }
                }
            }
            _ => None,
        }
    }

    /// Every node still in the cluster (not removed).
    pub(super) async fn member_nodes(&self) -> Result<Vec<NodeRecord>> {
        Ok(self
            .meta
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.state != NodeState::Removed)
            .collect())
    }

    pub async fn status(&self) -> Result<StatusReport> {
        let nodes = self.member_nodes().await?;
        let (vols, bad) = self.meta.volumes_checked().await?;
        let alive = self.registered().await;
        let reserves = crate::reserves::node_reserves(&nodes, &vols);
        let mut ns = Vec::new();
        for n in &nodes {
            ns.push(self.node_status(n, &vols, alive.as_ref(), &reserves).await);
        }
        let tiered: Vec<u32> = ns
            .iter()
            .filter(|n| n.tiers.is_some())
            .map(|n| n.id)
            .collect();
        // Every volume's writer report and scrub record, one read each: the event recorder
        // asks for the status every second.
        let mut reports = self.meta.reports_by_volume().await;
        let scrubbed = self.meta.scrub_records().await.unwrap_or_default();
        let exports = self.meta.nvmf_exports().await.unwrap_or_default();
        let mut vs = Vec::new();
        for v in &vols {
            // A writer here that another has fenced knows nothing current.
            let own = self.writer(&v.name);
            let live = own.as_ref().filter(|w| w.info().epoch == v.epoch);
            // A writer on another host reports its view itself (`WriterReport`).
            let report = match live {
                Some(_) => None,
                None => reports.remove(&v.name).filter(|r| r.epoch == v.epoch),
            };
            let views = live.map(|w| w.replica_views()).or_else(|| {
                report.as_ref().map(|r| {
                    r.replicas
                        .iter()
                        .map(|x| trireme_client::ReplicaView {
                            node: x.node,
                            state: x.state,
                            resync: x.resync.clone(),
                        })
                        .collect()
                })
            });
            let mut reps = Vec::new();
            for r in &v.replicas {
                // The writer knows better than the record (resyncing, progress).
                let live = views
                    .as_ref()
                    .and_then(|vs| vs.iter().find(|x| x.node == r.node));
                let mut st = ReplicaStatus {
                    node: r.node,
                    state: live.map_or(r.state, |l| l.state).into(),
                    allocated_bytes: None,
                    epoch: None,
                    resync: live.and_then(|l| l.resync.clone()),
                    tier: None,
                    integrity: None,
                };
                let down = ns.iter().any(|x| x.id == r.node && !x.up);
                match nodes.iter().find(|n| n.id == r.node) {
                    None => st.state = ReplicaStatusState::Unreachable,
                    // Down (no lease, or no answer to the ping just now): not asked again.
                    Some(_) if down => st.state = ReplicaStatusState::Unreachable,
                    Some(n) => {
                        let h = Header {
                            volume: v.id,
                            ..Header::request(Op::ReplicaInfo, 0)
                        };
                        match self.node_call(n, h).await {
                            Ok(f) if f.header.status == Status::Ok => {
                                let a =
                                    trireme_proto::ReplicaInfoAnswer::read(&f.header, &f.payload);
                                st.allocated_bytes = a.as_ref().ok().map(|a| a.allocated_bytes);
                                st.epoch = a.as_ref().ok().map(|a| a.epoch);
                                st.integrity = a.as_ref().ok().and_then(|a| {
                                    a.integrity
                                        .as_ref()
                                        .and_then(crate::api::ReplicaIntegrityStatus::new)
                                });
                                if tiered.contains(&n.id) {
                                    st.tier = self
                                        .tier_info(n, v.id)
                                        .await
                                        .and_then(|t| t.replica)
                                        .map(|t| crate::api::ReplicaTierStatus::new(n.id, t));
                                }
                            }
                            Ok(f) if f.header.status == Status::NoReplica => {
                                st.state = ReplicaStatusState::Missing
                            }
                            _ => st.state = ReplicaStatusState::Unreachable,
                        }
                    }
                }
                reps.push(st);
            }
            vs.push(VolumeStatus {
                name: v.name.clone(),
                id: v.id,
                size: v.size,
                preallocate: v.preallocate,
                epoch: v.epoch,
                access: v.access.clone(),
                replicas: reps,
                client_links: if live.is_some() {
                    self.client_links(&v.name)
                } else {
                    // A writer on another host says what its links run on.
                    report
                        .as_ref()
                        .map(|r| {
                            r.links
                                .iter()
                                .map(|l| crate::api::LinkStatus {
                                    node: l.node,
                                    transport: l.transport.clone(),
                                    peer: l.peer.clone(),
                                    streams: l.streams,
                                    lanes: l.lanes.clone(),
                                    fallback: l.fallback.clone(),
                                    reported: true,
                                })
                                .collect()
                        })
                        .unwrap_or_default()
                },
                writer: self.writer_status(v).await,
                min_copies: v.min_copies(),
                writes_suspended: live.is_some_and(|w| w.writes_suspended())
                    || report.as_ref().is_some_and(|r| r.writes_suspended),
                tier: v.tier,
                scrub: live
                    .and_then(|w| w.scrub_progress())
                    .or_else(|| report.as_ref().and_then(|r| r.scrub.clone())),
                health: None,
                io: report.as_ref().and_then(|r| r.io),
                last_scrub: scrubbed
                    .get(&v.name)
                    .filter(|r| r.volume_id == v.id)
                    .and_then(|r| r.last.clone()),
                nvmf: exports
                    .iter()
                    .filter(|e| e.volume == v.name)
                    .cloned()
                    .collect(),
                resiliency: Some(self.layout_status(v).await),
                limits: v.limits_in_force(),
                qos_policy: v.qos_policy().map(String::from),
                throttled_seconds: live
                    .map(|w| w.throttled().as_secs_f64())
                    .or_else(|| report.as_ref().map(|r| r.throttled_seconds)),
            });
        }
        for v in &mut vs {
            v.health = Some(crate::health::volume_health(v, &ns));
        }
        let mut health = crate::health::cluster_health(&ns, &vs);
        for a in self.store_alarms().await {
            health.verdict = health.verdict.max(crate::health::Verdict::Degraded);
            health.reasons.push(a);
        }
        // A record that does not decode hides its volume: said, never silent.
        for e in bad {
            tracing::warn!("status: {e}");
            health.verdict = health.verdict.max(crate::health::Verdict::Degraded);
            health.reasons.push(format!("a record is unreadable: {e}"));
        }
        Ok(StatusReport {
            nodes: ns,
            volumes: vs,
            moves: self.moves(),
            manager: self.meta.manager().await.ok().flatten().map(|(m, _)| m),
            health: Some(health),
            warnings: reserves.iter().filter_map(|r| r.warning()).collect(),
        })
    }
}
