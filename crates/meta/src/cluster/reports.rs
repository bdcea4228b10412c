//! What a volume's writer on another host reports of itself (`reports/<name>`): the replica
//! states it sees (a resync's progress among them), whether its writes wait for copies, a
//! scrub's progress, its I/O rates, and where its own metrics are served. The manager
//! runs elsewhere; without it, `status` on a cluster on etcd showed a resyncing copy as
//! outdated with no progress until the end, the dashboard's I/O charts stayed empty, and
//! Prometheus's targets left the writer out. The key is bound to the writer's attach lease,
//! so a report dies with its writer.

use serde::{Deserialize, Serialize};
use trireme_replication::{ReplicaState, ResyncProgress};

use super::*;
use crate::kv::Op;
use crate::MetaError;

/// One replica as the writer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedReplica {
    pub node: u32,
    pub state: ReplicaState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<ResyncProgress>,
}

/// One of the writer's data-path links to a node: the transport, and why not UCX if not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedLink {
    pub node: u32,
    /// `ucx`, `unix` (same host) or `tcp`.
    pub transport: String,
    pub peer: String,
    /// Streams (of TCP) under it.
    #[serde(default)]
    pub streams: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// A volume's I/O over an interval, as its writer saw it (the dashboard's charts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct IoRates {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    /// Latency quantiles in seconds over the interval (`None`: no request of that kind).
    pub read_p50_s: Option<f64>,
    pub read_p99_s: Option<f64>,
    pub write_p50_s: Option<f64>,
    pub write_p99_s: Option<f64>,
    pub errors: u64,
}

/// A writer's report of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriterReport {
    /// The writer's epoch: a report of another epoch than the volume's is stale.
    pub epoch: u64,
    pub replicas: Vec<ReportedReplica>,
    pub writes_suspended: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<ResyncProgress>,
    /// Its I/O since its previous report, if it counts requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoRates>,
    /// `host:port` of its metrics endpoint, if it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// Its links to the nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<ReportedLink>,
    /// Seconds its requests waited for the volume's limits, summed since it attached.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub throttled_seconds: f64,
    /// Its I/O since its previous report, in 8 KiB units a second (a 64 KiB request is 8):
    /// what an aggregated QoS policy shares out by.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub units_per_s: f64,
    /// A parity volume's overlay: blocks kept on the mirrors over a stripe (they count in
    /// the mirrored share with the mirrored regions). Only its writer knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay_blocks: Option<u64>,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

/// The most a writer's report may hold: a larger one is skipped with a warning.
pub const MAX_REPORT: usize = 64 << 10;

impl ClusterMeta {
    /// The key of `name`'s writer report: `reports/<name>` for a writer of the cluster's own
    /// (`up`, a node or an operator's identity), `reports/<name>/<client>` for a client's,
    /// the one key etcd's access control lets that client write (`rbac.rs`).
    pub fn report_key_of(name: &str, client: Option<&str>) -> String {
        match client {
            Some(c) => key(&format!("reports/{name}/{c}")),
            None => key(&format!("reports/{name}")),
        }
    }

    /// Puts the writer's report of `name`, bound to `lease`. `client`: the writer's client
    /// name, if a client certificate is its identity.
    pub async fn put_report(
        &self,
        name: &str,
        client: Option<&str>,
        report: &WriterReport,
        lease: LeaseId,
    ) -> Result<(), MetaError> {
        let value = encode(report);
        if value.len() > MAX_REPORT {
            return Err(MetaError::Refused(format!(
                "a writer report of {} bytes (at most {MAX_REPORT})",
                value.len()
            )));
        }
        self.write(
            vec![],
            vec![Op::put_leased(
                Self::report_key_of(name, client),
                value,
                lease,
            )],
        )
        .await?;
        Ok(())
    }

    /// The report of `name`'s writer, if one is alive.
    pub async fn report(&self, name: &str) -> Result<Option<WriterReport>, MetaError> {
        Ok(self
            .reports()
            .await?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r))
    }

    /// [`Self::reports`] by volume name; empty if they cannot be read (they only add to
    /// what the records say).
    pub async fn reports_by_volume(&self) -> std::collections::HashMap<String, WriterReport> {
        self.reports()
            .await
            .unwrap_or_default()
            .into_iter()
            .collect()
    }

    /// Every writer's report, by volume. A client's report counts only while that client is
    /// the volume's writer of record (its attach record, which only the manager writes, names
    /// it) and for its epoch: another client on the volume's access list may write a report
    /// of its own, and it is not read. A report that does not decode or is too large is
    /// skipped, named in a warning.
    pub async fn reports(&self) -> Result<Vec<(String, WriterReport)>, MetaError> {
        let prefix = key("reports/");
        let writers = self.attachments().await?;
        // By volume: a client's report of the writer of record wins over a stale one of the
        // cluster's own.
        let mut out: std::collections::BTreeMap<String, WriterReport> = Default::default();
        for kv in self.store().range(&prefix).await?.0 {
            let Some(rest) = kv.key.strip_prefix(&prefix) else {
                continue;
            };
            let (name, client) = match rest.split_once('/') {
                Some((n, c)) => (n, Some(c)),
                None => (rest, None),
            };
            if kv.value.len() > MAX_REPORT {
                tracing::warn!(key = %kv.key, bytes = kv.value.len(), "skipping a writer report over {MAX_REPORT} bytes");
                continue;
            }
            let r = match serde_json::from_slice::<WriterReport>(&kv.value) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(key = %kv.key, "a writer report that does not decode: {e}");
                    continue;
                }
            };
            if let Some(c) = client {
                let of_record = writers.get(name).is_some_and(|a| {
                    a.epoch == r.epoch
                        && a.identity.as_deref() == Some(format!("client {c}").as_str())
                });
                if !of_record {
                    continue;
                }
            }
            if client.is_some() || !out.contains_key(name) {
                out.insert(name.to_string(), r);
            }
        }
        Ok(out.into_iter().collect())
    }
}
