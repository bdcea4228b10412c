//! Scrubs: `volume scrub` of any volume — through the writer in this process (`up`), through
//! a writer on another host at the manager's request (`scrubs/<name>`, served by
//! `daemon/src/scrubs.rs`), or through a writer the manager attaches for it when nobody
//! writes the volume — and the schedule that scrubs every volume each `--scrub-interval`
//! under a rate limit. Every scrub's outcome is kept in the volume's scrub record
//! (`scrubbed/<name>`, shown by `volume info` and the metrics) and said as an event.

use std::sync::Arc;
use std::time::Duration;

use trireme_client::ScrubReport;
use trireme_meta::{ClusterEvent, ScrubOutcome, ScrubRecord, VolumeRecord};

use super::trash::now_secs;
use super::{Manager, Result};

/// When and how fast the manager scrubs every volume by itself (by default: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubSchedule {
    /// Each volume is scrubbed this long after its last scrub.
    pub every: Duration,
    /// Most bytes compared per second.
    pub rate: Option<u64>,
    /// Bytes compared at a time.
    pub region: u64,
    /// Also scrub, as soon as its copies are in sync, a volume whose nodes note something
    /// against a copy (an unclean stop, bad blocks met), whatever `every` says.
    pub integrity: bool,
}

/// Who asked for a scrub (its record's `by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScrubBy {
    Operator,
    /// The schedule, at this interval.
    Schedule(Duration),
    /// What a node noted against a copy (`scrub_noted`).
    Integrity,
}

/// How often the manager looks for copies its nodes note something against.
const INTEGRITY_LOOK: Duration = Duration::from_secs(5);
/// The least time between two scrubs of one volume for what its nodes note: a scrub that
/// could not clear it (a copy with no majority, a node that restarted meanwhile) is not
/// run again at once.
const INTEGRITY_AGAIN: Duration = Duration::from_secs(60);

/// A scheduled scrub that failed is tried again this long after, or at its interval if shorter.
const RETRY_FAILED: u64 = 3600;

impl Manager {
    /// `volume scrub NAME`, asked by an operator; the outcome is recorded.
    pub async fn scrub(
        self: &Arc<Self>,
        name: &str,
        region: u64,
        rate: Option<u64>,
    ) -> Result<ScrubReport> {
        let v = self.meta.volume(name).await?;
        self.scrub_recorded(&v, region, rate, ScrubBy::Operator)
            .await
    }

    /// Scrubs `v` and records how it went, and who asked (`by`).
    async fn scrub_recorded(
        self: &Arc<Self>,
        v: &VolumeRecord,
        region: u64,
        rate: Option<u64>,
        by: ScrubBy,
    ) -> Result<ScrubReport> {
        let schedule = match by {
            ScrubBy::Schedule(every) => Some(every),
            _ => None,
        };
        let t0 = std::time::Instant::now();
        let r = self.scrub_any(v, region, rate).await;
        let at = now_secs();
        let mut out = ScrubOutcome {
            at,
            took_ms: t0.elapsed().as_millis() as u64,
            by: match by {
                ScrubBy::Operator => "operator",
                ScrubBy::Schedule(_) => "schedule",
                ScrubBy::Integrity => "integrity",
            }
            .into(),
            bytes_compared: 0,
            mismatched_regions: 0,
            repaired_regions: 0,
            unresolved_regions: 0,
            error: None,
        };
        let text = match &r {
            Ok(rep) => {
                out.bytes_compared = rep.bytes_compared;
                out.mismatched_regions = rep.mismatched_regions;
                out.repaired_regions = rep.repaired.len() as u64;
                out.unresolved_regions = rep.unresolved.len() as u64;
                let mut nodes: Vec<u32> = rep.repaired.iter().map(|r| r.1).collect();
                nodes.sort_unstable();
                nodes.dedup();
                let mut t = format!(
                    "{}: scrubbed {} ({} copies)",
                    v.name,
                    crate::human(rep.bytes_compared),
                    rep.replicas.len()
                );
                if rep.stripes_checked > 0 {
                    t += &format!(", {} stripes checked", rep.stripes_checked);
                }
                if rep.mismatched_regions == 0 {
                    t += ": the copies agree";
                } else {
                    t += &format!(
                        ": {} region{} differed",
                        rep.mismatched_regions,
                        if rep.mismatched_regions == 1 { "" } else { "s" }
                    );
                    if !rep.repaired.is_empty() {
                        t += &format!(
                            ", {} rewritten on node {}",
                            rep.repaired.len(),
                            nodes
                                .iter()
                                .map(u32::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                    if !rep.unresolved.is_empty() {
                        t += &format!(", {} with no majority (left alone)", rep.unresolved.len());
                    }
                }
                if !rep.verified.is_empty() && by == ScrubBy::Integrity {
                    t += &format!(
                        "; node {} verified",
                        rep.verified
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                t
            }
            Err(e) => {
                out.error = Some(e.to_string());
                format!("{}: scrub failed: {e}", v.name)
            }
        };
        let since = match (&r, schedule) {
            (Ok(_), _) => at,
            (Err(_), Some(every)) => {
                at.saturating_sub(every.as_secs()) + every.as_secs().min(RETRY_FAILED)
            }
            // An operator's scrub that failed leaves the schedule where it was.
            (Err(_), None) => match self.meta.scrub_record(&v.name, v.id).await {
                Ok(Some(p)) => p.since,
                _ => at,
            },
        };
        let rec = ScrubRecord {
            volume_id: v.id,
            since,
            last: Some(out),
        };
        if let Err(e) = self.meta.put_scrub_record(&v.name, &rec).await {
            tracing::warn!(volume = %v.name, "recording the scrub's outcome: {e}");
        }
        let ev = ClusterEvent::new(crate::events::now_ms(), "scrub", text);
        if let Err(e) = self.meta.append_events(&[ev]).await {
            tracing::debug!(volume = %v.name, "recording the scrub's event: {e}");
        }
        r
    }

    /// The scrub schedule's interval, if one runs.
    pub(crate) fn scrub_every(&self) -> Option<Duration> {
        *self.scrub_every.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scrubs each volume once its interval since the last scrub is up, one at a time, oldest
    /// first, while this manager lives. A volume the schedule has not seen before counts
    /// from now.
    pub fn start_scrub_schedule(self: &Arc<Self>, s: ScrubSchedule) {
        if s.integrity {
            self.start_integrity_scrubs(s);
        }
        if s.every.is_zero() {
            return;
        }
        *self.scrub_every.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.every);
        let me = Arc::downgrade(self);
        let look = (s.every / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                let Some(m) = me.upgrade() else { return };
                if let Err(e) = m.scrub_due(s).await {
                    tracing::debug!("scrub schedule: {e}");
                }
                drop(m);
                tokio::time::sleep(look).await;
            }
        });
    }

    async fn scrub_due(self: &Arc<Self>, s: ScrubSchedule) -> Result<()> {
        let now = now_secs();
        let mut oldest: Option<(u64, VolumeRecord)> = None;
        let records = self.meta.scrub_records().await?;
        for v in self.meta.volumes().await? {
            match records.get(&v.name).filter(|r| r.volume_id == v.id) {
                None => {
                    let rec = ScrubRecord {
                        volume_id: v.id,
                        since: now,
                        last: None,
                    };
                    self.meta.put_scrub_record(&v.name, &rec).await?;
                }
                Some(r) if now >= r.since.saturating_add(s.every.as_secs()) => {
                    if oldest.as_ref().is_none_or(|(since, _)| r.since < *since) {
                        oldest = Some((r.since, v));
                    }
                }
                Some(_) => {}
            }
        }
        if let Some((_, v)) = oldest {
            tracing::info!(volume = %v.name, "scheduled scrub");
            // Its outcome is recorded, an error included; the next look goes on.
            let _ = self
                .scrub_recorded(&v, s.region, s.rate, ScrubBy::Schedule(s.every))
                .await;
        }
        Ok(())
    }

    /// Scrubs, one at a time, each volume whose nodes note something against a copy once
    /// all its copies are in sync, while this manager lives: `status` says `unverified` or
    /// `degraded` until a scrub has compared the copy (issue 63). The schedule's rate.
    fn start_integrity_scrubs(self: &Arc<Self>, s: ScrubSchedule) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut last: std::collections::HashMap<u64, tokio::time::Instant> = Default::default();
            loop {
                tokio::time::sleep(INTEGRITY_LOOK).await;
                let Some(m) = me.upgrade() else { return };
                if let Err(e) = m.scrub_noted(s, &mut last).await {
                    tracing::debug!("scrubs for what nodes noted: {e}");
                }
            }
        });
    }

    async fn scrub_noted(
        self: &Arc<Self>,
        s: ScrubSchedule,
        last: &mut std::collections::HashMap<u64, tokio::time::Instant>,
    ) -> Result<()> {
        let st = self.status().await?;
        let now = tokio::time::Instant::now();
        let due = st.volumes.iter().find(|v| {
            let noted = v.replicas.iter().any(|r| r.integrity.is_some());
            let ready = v.scrub.is_none()
                && v.replicas
                    .iter()
                    .all(|r| r.state == crate::api::ReplicaStatusState::InSync);
            let rested = last
                .get(&v.id)
                .is_none_or(|t| now.duration_since(*t) >= INTEGRITY_AGAIN);
            noted && ready && rested
        });
        let Some(vs) = due else { return Ok(()) };
        last.insert(vs.id, now);
        let v = self.meta.volume(&vs.name).await?;
        let why: Vec<String> = vs
            .health
            .iter()
            .flat_map(|h| h.reasons.iter().cloned())
            .collect();
        tracing::warn!(volume = %v.name, why = %why.join("; "), "scrubbing a volume for what its nodes note against a copy");
        // Its outcome is recorded, an error included.
        let _ = self
            .scrub_recorded(&v, s.region.max(4096), s.rate, ScrubBy::Integrity)
            .await;
        Ok(())
    }

    /// `volume scrub`: through the writer in this process if there is one; for a volume
    /// nobody writes, through a writer attached for the scrub (then released). A volume held
    /// by a writer elsewhere is refused, naming it: the scrub must go through that writer, and
    /// another would fence it.
    async fn scrub_any(
        self: &Arc<Self>,
        v: &VolumeRecord,
        region: u64,
        rate: Option<u64>,
    ) -> Result<ScrubReport> {
        let name = v.name.as_str();
        if let Some(w) = self.writer(name).filter(|w| w.info().epoch == v.epoch) {
            return Ok(w.scrub_at(region, rate).await?);
        }
        // A writer on another host (its attach record names it): it scrubs at our request.
        if let Some((a, _)) = self.meta.attachment(name).await? {
            if a.epoch == v.epoch {
                return self.scrub_remote(v, region, rate).await;
            }
        }
        if let Some(who) = self.holder(v).await? {
            return Err(crate::error::refused(format!(
                "volume {name} is attached by {who}: a scrub repairs through its writer, and that writer takes no requests (a `trireme nbd` beside `up`); detach it first"
            )));
        }
        let own = self.attach_own(v).await?;
        tracing::info!(
            volume = name,
            epoch = own.writer.info().epoch,
            "scrubbing through a writer of the manager's own"
        );
        let r = own.writer.scrub_at(region, rate).await;
        self.release_own(own).await;
        Ok(r?)
    }

    /// `volume scrub` of a volume written on another host: asks its writer through the scrub
    /// request (`daemon/src/scrubs.rs`) and waits for its report; its progress shows in
    /// `status` meanwhile (the writer's report). One scrub per volume at a time.
    async fn scrub_remote(
        &self,
        v: &VolumeRecord,
        region: u64,
        rate: Option<u64>,
    ) -> Result<ScrubReport> {
        use trireme_meta::{ScrubRequest, ScrubState};
        let name = &v.name;
        if let Some((old, _)) = self.meta.scrub_request(name).await? {
            let live = old.epoch == v.epoch
                && matches!(old.state, ScrubState::Asked | ScrubState::Running);
            if live {
                return Err(crate::error::refused(format!(
                    "a scrub of volume {name} is already running (`trireme status` shows its progress)"
                )));
            }
            // Left by a manager that stopped waiting (it crashed, or the role moved).
            self.meta.delete_scrub(name).await?;
        }
        let req = ScrubRequest {
            epoch: v.epoch,
            region,
            state: ScrubState::Asked,
            report: None,
            error: None,
            rate,
        };
        if self.meta.put_scrub(name, &req, 0).await?.is_none() {
            return Err(crate::error::refused(format!(
                "a scrub of volume {name} was asked at the same moment by another operator"
            )));
        }
        tracing::info!(volume = %name, epoch = v.epoch, "asked the volume's writer to scrub it");
        let outcome = loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let r = match self.meta.scrub_request(name).await {
                Ok(Some((r, _))) => r,
                Ok(None) => break Err(crate::error::refused("the scrub request was removed")),
                // etcd away a moment: the writer goes on, and so does the wait.
                Err(trireme_meta::MetaError::Unavailable(_)) => continue,
                Err(e) => break Err(e.into()),
            };
            match r.state {
                ScrubState::Done => {
                    break r
                        .report
                        .and_then(|j| serde_json::from_value(j).ok())
                        .ok_or_else(|| {
                            crate::error::refused("the writer's scrub report does not decode")
                        });
                }
                ScrubState::Failed => {
                    break Err(crate::error::refused(format!(
                        "the writer's scrub failed: {}",
                        r.error.unwrap_or_default()
                    )))
                }
                ScrubState::Asked | ScrubState::Running => {
                    let writer = self.meta.attachment(name).await;
                    if matches!(&writer, Ok(Some((a, _))) if a.epoch != v.epoch) {
                        break Err(crate::error::refused(format!(
                            "volume {name}'s writer changed during the scrub; run it again"
                        )));
                    }
                    if matches!(&writer, Ok(None)) && !self.meta.volume(name).await?.writer_open {
                        break Err(crate::error::refused(format!(
                            "volume {name}'s writer detached during the scrub; run it again"
                        )));
                    }
                }
            }
        };
        if let Err(e) = self.meta.delete_scrub(name).await {
            tracing::warn!(volume = %name, "removing the scrub request: {e}");
        }
        outcome
    }
}
