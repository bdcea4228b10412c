//! This server's NVMe/TCP export record (`trireme_meta::NvmfExportRecord`): where it listens,
//! its subsystem NQN, its ANA state and the hosts connected, for `status` and `volume info`.
//! It is claimed before the port serves — so two servers given the same port id, or
//! presenting the volume under two NQNs (a `--cluster` typo), are refused at start rather
//! than breaking a host's multipath — and kept under a lease of this process's own, so it
//! goes when the process does.

use std::sync::Arc;
use std::time::Duration;

use trireme_meta::{NvmfExportRecord, MAX_EXPORT_HOSTS};
use trireme_nvmf::ident::ana;

use super::NvmfExport;
use crate::attach::until_reachable;
use crate::recorder::Recorder;
use crate::DaemonError;

/// How often the record's ANA state and hosts are compared with the port's.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The record's task; it ends (and the record goes) with [`Announced::end`].
#[derive(Debug)]
pub struct Announced {
    task: tokio::task::JoinHandle<()>,
    lease: Arc<std::sync::atomic::AtomicI64>,
    rec: Recorder,
}

impl Announced {
    /// Stops updating the record and takes it down (its lease revoked).
    pub async fn end(self) {
        self.task.abort();
        let l = self.lease.load(std::sync::atomic::Ordering::Relaxed);
        let _ = self.rec.meta().store().revoke(l).await;
    }
}

/// The record `ex` deserves now.
fn record(ex: &NvmfExport, volume: &str) -> NvmfExportRecord {
    let mut hosts: Vec<String> = ex.port.connected().into_iter().map(|c| c.hostnqn).collect();
    let more_hosts = hosts.len().saturating_sub(MAX_EXPORT_HOSTS);
    hosts.truncate(MAX_EXPORT_HOSTS);
    NvmfExportRecord {
        volume: volume.to_string(),
        port_id: ex.port.port_id,
        addr: ex.port.addr.to_string(),
        nqn: ex.nqn.clone(),
        host: crate::hostname(),
        pid: std::process::id(),
        ana: ana::name(ex.ana.get().state).to_string(),
        hosts,
        more_hosts,
        identity: None,
    }
}

/// Refuses an export whose NQN differs from another server's export of the same volume:
/// a host would see two subsystems, and its multipath would not join them.
async fn check_same_nqn(rec: &Recorder, mine: &NvmfExportRecord) -> Result<(), DaemonError> {
    let others = until_reachable("reading the volume's exports", || {
        rec.meta().nvmf_exports_of(&mine.volume)
    })
    .await?;
    match others.iter().find(|o| o.nqn != mine.nqn) {
        Some(o) => Err(DaemonError::Usage(format!(
            "volume {} is exported as {} by pid {} on host {} ({}); this server would present {}: \
             every server of a volume presents the same subsystem (give the same --cluster, or \
             TRIREME_CLUSTER, on each)",
            mine.volume, o.nqn, o.pid, o.host, o.addr, mine.nqn
        ))),
        None => Ok(()),
    }
}

/// Claims `ex`'s port id of `volume` for this process (refused, naming the holder, if another
/// holds it) and keeps its record current until [`Announced::end`].
pub async fn announce(
    rec: Recorder,
    ex: &NvmfExport,
    volume: &str,
    ttl: Duration,
) -> Result<Announced, DaemonError> {
    let ttl = ttl.max(crate::lease::MIN_TTL);
    let first = record(ex, volume);
    check_same_nqn(&rec, &first).await?;
    let lease = crate::lease::grant(&**rec.meta().store(), ttl).await?;
    if let Err(e) = claim(&rec, &first, lease).await {
        let _ = rec.meta().store().revoke(lease).await;
        return Err(e);
    }
    let shared = Arc::new(std::sync::atomic::AtomicI64::new(lease));
    let task = tokio::spawn(keep_current(
        rec.clone(),
        ex.clone(),
        volume.to_string(),
        Some(first),
        shared.clone(),
        ttl,
    ));
    Ok(Announced {
        task,
        lease: shared,
        rec,
    })
}

/// Writes the first record. A port id held by a process of this host that is gone (killed,
/// and started again at once by its service manager) is waited for: its record goes when its
/// lease expires. One held by a live process, or another host's, is refused.
async fn claim(rec: &Recorder, first: &NvmfExportRecord, lease: i64) -> Result<(), DaemonError> {
    let mut said = false;
    loop {
        let held =
            until_reachable("recording the export", || rec.nvmf_export(first, lease)).await?;
        let Some(h) = held else {
            return Ok(());
        };
        let dead = h.host == first.host
            && h.pid != first.pid
            && !std::path::Path::new(&format!("/proc/{}", h.pid)).exists();
        if !dead {
            return Err(DaemonError::Usage(format!(
                "port id {} of volume {} is served by pid {} on host {} ({}): give each \
                 server of a volume its own --port-id (1 to 15)",
                h.port_id, first.volume, h.pid, h.host, h.addr
            )));
        }
        if !said {
            tracing::info!(volume = %first.volume, pid = h.pid, "the previous server of this port id on this host died: waiting for its record's lease to expire");
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // This process's own lease lives on meanwhile.
        let _ = rec.meta().store().keep_alive(lease).await;
    }
}

/// Keeps the lease; writes the record again when the ANA state or the hosts change, and
/// under a new lease when the old one is lost (etcd unreachable for longer than its TTL).
async fn keep_current(
    rec: Recorder,
    ex: NvmfExport,
    volume: String,
    // What the record holds now under the lease (none: to be written).
    mut written: Option<NvmfExportRecord>,
    lease: Arc<std::sync::atomic::AtomicI64>,
    ttl: Duration,
) {
    use std::sync::atomic::Ordering;
    let store = rec.meta().store().clone();
    loop {
        let l = lease.load(Ordering::Relaxed);
        let keep = crate::lease::keep(&*store, l, ttl);
        tokio::pin!(keep);
        let mut warned = false;
        // Until the lease is lost.
        loop {
            tokio::select! {
                _ = &mut keep => break,
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
            let now = record(&ex, &volume);
            if written.as_ref() == Some(&now) {
                continue;
            }
            match rec.nvmf_export(&now, l).await {
                Ok(None) => written = Some(now),
                Ok(Some(h)) if !warned => {
                    warned = true;
                    tracing::warn!(%volume, port_id = now.port_id, holder = h.pid, host = %h.host, "the export's port id is held by another process now: status shows that one")
                }
                Ok(Some(_)) => {}
                // Tried again at the next look (a busy manager, etcd away).
                Err(e) => tracing::debug!(%volume, "recording the export: {e}"),
            }
        }
        tracing::warn!(%volume, "the export record's lease is lost: taking a new one");
        let Ok(new) = crate::lease::grant(&*store, ttl).await else {
            return;
        };
        lease.store(new, Ordering::Relaxed);
        let _ = store.revoke(l).await;
        // Written again under the new lease at the next look.
        written = None;
    }
}
