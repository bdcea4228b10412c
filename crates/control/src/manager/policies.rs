//! QoS policies (`trireme qos policy`): limits, a reserve and a weight shared by several
//! volumes, as S2D's Storage QoS policies. A volume under a dedicated policy keeps the
//! policy's limits whole; the volumes under an aggregated one keep them together: the manager
//! gives each a share, by demand ([`share_out`]), every [`SHARE_EVERY`].
//!
//! What a volume gets is written into its layout (`trireme_meta::PolicyShare`), the key its
//! writer watches: a writer anywhere needs nothing but its own record, and a client writer
//! reads no policy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use trireme_meta::{PolicyShare, QosPolicy, VolumeRecord};
use trireme_replication::qos::{Limits, IOPS_UNIT};

use super::{Manager, Result};
use crate::api::LimitsChange;
use crate::error::refused;

/// How often the shares of aggregated policies are looked at.
pub(crate) const SHARE_EVERY: Duration = Duration::from_secs(1);

/// What every volume of an aggregated policy keeps, idle or not, of the policy, all of them
/// together: an idle volume that starts is held to its part of this for at most a second or
/// two, until the manager sees it wait and gives it its fair share.
const IDLE_SHARE: f64 = 0.05;

/// A share moves only by more than this (of the policy): each move restarts the volume's
/// limiter, and is a write of its layout.
const SHARE_STEP: f64 = 0.03;

/// A policy with the volumes under it, as `qos policy list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInfo {
    #[serde(flatten)]
    pub policy: QosPolicy,
    /// Its volumes, each with what it keeps of the policy now.
    pub volumes: Vec<PolicyMember>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyMember {
    pub name: String,
    pub limits: Limits,
}

/// One volume's demand on an aggregated policy, over the last interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Demand {
    /// 8 KiB units a second it did.
    pub used: f64,
    /// Its requests waited for its limits: it would do more.
    pub waited: bool,
    /// The fraction of the policy it has now.
    pub share: f64,
}

/// The fractions of an aggregated policy of `total` units a second its volumes get (they add
/// up to 1), by max-min fairness over what each wants: every one keeps an equal part of
/// [`IDLE_SHARE`]; one that waited wants twice what it has, and at least an equal share; one
/// that did not, a quarter more than it used. What nobody wants is split equally, so the
/// volumes together can always use all of the policy.
pub(crate) fn share_out(total: f64, ds: &[Demand]) -> Vec<f64> {
    let n = ds.len();
    if n == 0 || total <= 0.0 {
        return vec![];
    }
    let floor = total * IDLE_SHARE / n as f64;
    let wants: Vec<f64> = ds
        .iter()
        .map(|d| {
            let want = match d.waited {
                true => (d.used.max(d.share * total) * 2.0).max(total / n as f64),
                false => d.used * 1.25,
            };
            (want - floor).max(0.0)
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| wants[a].total_cmp(&wants[b]));
    let mut left = total - floor * n as f64;
    let mut given = vec![floor; n];
    for (i, &v) in order.iter().enumerate() {
        let give = wants[v].min(left / (n - i) as f64);
        given[v] += give;
        left -= give;
    }
    given
        .iter()
        .map(|g| (g + left / n as f64) / total)
        .collect()
}

/// The units a second a policy's shares are counted in: its IOPS limit, else its bandwidth
/// in 8 KiB units, else its reserve.
fn policy_units(l: &Limits) -> f64 {
    l.iops
        .or(l.bps.map(|b| b / IOPS_UNIT))
        .or(l.read_iops.zip(l.write_iops).map(|(r, w)| r + w))
        .or(l.read_iops.or(l.write_iops))
        .or(l.iops_reserve)
        .unwrap_or(1)
        .max(1) as f64
}

/// What the manager last saw of a volume under an aggregated policy, and made of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    look: Look,
    demand: Demand,
}

/// One look at what a volume's writer did.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Look {
    /// Its units and its seconds throttled so far, read at `at` (a writer in this process,
    /// or one beside `up` that said so).
    Counters {
        units: u64,
        at: Instant,
        throttled: f64,
    },
    /// Its report: its rate since its previous report, and its seconds throttled so far.
    Report { units_per_s: f64, throttled: f64 },
    /// No writer, or none that says anything.
    Nothing,
}

impl Look {
    fn throttled(self) -> Option<f64> {
        match self {
            Look::Counters { throttled, .. } | Look::Report { throttled, .. } => Some(throttled),
            Look::Nothing => None,
        }
    }

    /// The demand this look shows after `before`.
    fn since(self, before: Option<Look>, share: f64) -> Demand {
        let used = match (before, self) {
            (
                Some(Look::Counters {
                    units: u0, at: t0, ..
                }),
                Look::Counters {
                    units: u1, at: t1, ..
                },
            ) if t1 > t0 => u1.saturating_sub(u0) as f64 / (t1 - t0).as_secs_f64(),
            (_, Look::Report { units_per_s, .. }) => units_per_s,
            _ => 0.0,
        };
        let waited = match (before.and_then(Look::throttled), self.throttled()) {
            // A millisecond of waiting in a second: held back, not a stray late request.
            (Some(a), Some(b)) => b - a > 0.001,
            _ => false,
        };
        Demand {
            used,
            waited,
            share,
        }
    }
}

/// What a writer beside `up` said it did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    epoch: u64,
    units: u64,
    throttled: f64,
    /// A parity volume's overlay, in blocks.
    overlay: Option<u64>,
    at: Instant,
}

impl Manager {
    pub(crate) async fn qos_policy_create(
        &self,
        name: &str,
        change: &LimitsChange,
        aggregated: bool,
    ) -> Result<QosPolicy> {
        let p = QosPolicy {
            name: name.to_string(),
            limits: change.apply(Limits::default()),
            aggregated,
        };
        self.meta.put_qos_policy(&p, 0).await?;
        self.event(
            "qos",
            format!("QoS policy {name} created: {}", describe(&p)),
        )
        .await;
        Ok(p)
    }

    /// Changes policy `name`'s limits, and gives its volumes their new share at once.
    pub(crate) async fn qos_policy_set(
        &self,
        name: &str,
        change: &LimitsChange,
    ) -> Result<QosPolicy> {
        if change.is_empty() {
            return Err(refused("qos policy set: nothing to change (give a limit)"));
        }
        let (mut p, rev) = self.meta.qos_policy(name).await?;
        p.limits = change.apply(p.limits);
        self.meta.put_qos_policy(&p, rev).await?;
        self.event("qos", format!("QoS policy {name}: {}", describe(&p)))
            .await;
        self.reshare(&p, None).await?;
        Ok(p)
    }

    /// Deletes policy `name`; refused, naming them, while volumes are under it.
    pub(crate) async fn qos_policy_delete(&self, name: &str) -> Result<QosPolicy> {
        let (p, rev) = self.meta.qos_policy(name).await?;
        let members = self.policy_members(name).await?;
        if !members.is_empty() {
            return Err(refused(format!(
                "QoS policy {name} has volumes under it: {} (`volume set VOLUME --qos-policy none` first)",
                members.join(", ")
            )));
        }
        self.meta.delete_qos_policy(name, rev).await?;
        self.event("qos", format!("QoS policy {name} deleted"))
            .await;
        Ok(p)
    }

    pub(crate) async fn qos_policy_list(&self) -> Result<Vec<PolicyInfo>> {
        let vols = self.meta.volumes().await?;
        let mut out = Vec::new();
        for policy in self.meta.qos_policies().await? {
            let volumes = vols
                .iter()
                .filter(|v| v.qos_policy() == Some(policy.name.as_str()))
                .map(|v| PolicyMember {
                    name: v.name.clone(),
                    limits: v.limits_in_force(),
                })
                .collect();
            out.push(PolicyInfo { policy, volumes });
        }
        Ok(out)
    }

    /// Puts volume `name` under policy `policy` (`none`: under none), and gives the policy's
    /// volumes their shares.
    pub(crate) async fn set_qos_policy(&self, name: &str, policy: &str) -> Result<VolumeRecord> {
        let p = match policy {
            "none" => None,
            p => Some(self.meta.qos_policy(p).await?.0),
        };
        let before = self.meta.volume(name).await?.qos.map(|q| q.policy);
        let others = match &p {
            Some(p) => self.members(&p.name).await?.len(),
            None => 0,
        };
        let share = p.as_ref().map(|p| PolicyShare {
            policy: p.name.clone(),
            // An aggregated policy's newcomer starts with a fair part; `reshare` evens out.
            limits: match p.aggregated {
                true => p.limits.scaled(1.0 / (others + 1) as f64),
                false => p.limits,
            },
        });
        let v = self.give_share(name, share).await?;
        self.event(
            "qos",
            format!(
                "volume {name}: QoS policy {}",
                p.as_ref().map_or("none", |p| &p.name)
            ),
        )
        .await;
        // The policy it left shares among fewer; the one it joined among more.
        if let Some(old) = before.filter(|o| Some(o) != p.as_ref().map(|p| &p.name)) {
            if let Ok((old, _)) = self.meta.qos_policy(&old).await {
                self.reshare(&old, None).await?;
            }
        }
        if let Some(p) = &p {
            self.reshare(p, None).await?;
        }
        Ok(self.meta.volume(name).await.unwrap_or(v))
    }

    /// The names of the volumes under `policy`.
    pub(crate) async fn policy_members(&self, policy: &str) -> Result<Vec<String>> {
        Ok(self
            .members(policy)
            .await?
            .into_iter()
            .map(|v| v.name)
            .collect())
    }

    async fn members(&self, policy: &str) -> Result<Vec<VolumeRecord>> {
        Ok(self
            .meta
            .volumes()
            .await?
            .into_iter()
            .filter(|v| v.qos_policy() == Some(policy))
            .collect())
    }

    /// Writes what volume `name` gets of its policy, and tells a writer in this process.
    async fn give_share(&self, name: &str, share: Option<PolicyShare>) -> Result<VolumeRecord> {
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                v.qos = share.clone();
                Ok(())
            })
            .await?;
        if let Some(w) = self.writer(name) {
            w.set_limits(v.limits_in_force()).await;
        }
        Ok(v)
    }

    /// Gives every volume of `p` its share: the whole of a dedicated policy; of an aggregated
    /// one, by `demands` (by volume name) if given, else in equal parts. Writes only the
    /// volumes whose share moved.
    async fn reshare(
        &self,
        p: &QosPolicy,
        demands: Option<&HashMap<String, Demand>>,
    ) -> Result<()> {
        let members = self.members(&p.name).await?;
        let fractions: Vec<f64> = match (p.aggregated, demands) {
            (false, _) => vec![1.0; members.len()],
            (true, d) => {
                let ds: Vec<Demand> = members
                    .iter()
                    .map(|v| d.and_then(|d| d.get(&v.name)).copied().unwrap_or_default())
                    .collect();
                share_out(policy_units(&p.limits), &ds)
            }
        };
        for (v, f) in members.iter().zip(fractions) {
            let limits = match p.aggregated {
                true => p.limits.scaled(f),
                false => p.limits,
            };
            let now = v.qos.as_ref().map(|q| q.limits);
            let moved = match (now, p.aggregated && demands.is_some()) {
                // A round by demand: only a share that moved by more than a step.
                (Some(l), true) => (fraction(&l, &p.limits) - f).abs() > SHARE_STEP,
                (now, _) => now != Some(limits),
            };
            if moved {
                let share = PolicyShare {
                    policy: p.name.clone(),
                    limits,
                };
                if let Err(e) = self.give_share(&v.name, Some(share)).await {
                    tracing::warn!(volume = %v.name, policy = %p.name, "giving a volume its QoS share: {e}");
                }
            }
        }
        Ok(())
    }

    /// Every [`SHARE_EVERY`], shares each aggregated policy out among its volumes by what
    /// they did and whether they waited (a writer in this process tells it directly, one
    /// elsewhere through its report).
    pub fn start_qos_shares(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut seen: HashMap<String, Seen> = HashMap::new();
            loop {
                tokio::time::sleep(SHARE_EVERY).await;
                let Some(m) = me.upgrade() else { return };
                if let Err(e) = m.share_round(&mut seen).await {
                    tracing::debug!("sharing out aggregated QoS policies: {e}");
                }
            }
        });
    }

    async fn share_round(&self, seen: &mut HashMap<String, Seen>) -> Result<()> {
        let policies: Vec<QosPolicy> = self
            .meta
            .qos_policies()
            .await?
            .into_iter()
            .filter(|p| p.aggregated)
            .collect();
        if policies.is_empty() {
            seen.clear();
            return Ok(());
        }
        let vols = self.meta.volumes().await?;
        let reports = self.meta.reports_by_volume().await;
        let mut demands = HashMap::new();
        for v in &vols {
            let Some(q) = &v.qos else { continue };
            let Some(p) = policies.iter().find(|p| p.name == q.policy) else {
                continue;
            };
            let share = fraction(&q.limits, &p.limits);
            let d = self.demand(v, reports.get(&v.name), seen, share);
            demands.insert(v.name.clone(), d);
        }
        seen.retain(|k, _| demands.contains_key(k));
        for p in &policies {
            self.reshare(p, Some(&demands)).await?;
        }
        Ok(())
    }

    /// What volume `v` did since the last round: from its writer here, else from its report,
    /// else from what its writer beside `up` said.
    fn demand(
        &self,
        v: &VolumeRecord,
        report: Option<&trireme_meta::WriterReport>,
        seen: &mut HashMap<String, Seen>,
        share: f64,
    ) -> Demand {
        let live = self.writer(&v.name).filter(|w| w.info().epoch == v.epoch);
        let said = self.usage_of(&v.name).filter(|u| u.epoch == v.epoch);
        let look = match (&live, report.filter(|r| r.epoch == v.epoch), said) {
            (Some(w), _, _) => Look::Counters {
                units: w.io_units(),
                at: Instant::now(),
                throttled: w.throttled().as_secs_f64(),
            },
            (None, Some(r), _) => Look::Report {
                units_per_s: r.units_per_s,
                throttled: r.throttled_seconds,
            },
            (None, None, Some(u)) => Look::Counters {
                units: u.units,
                at: u.at,
                throttled: u.throttled,
            },
            (None, None, None) => Look::Nothing,
        };
        let before = seen.get(&v.name).copied();
        let demand = match before {
            // Nothing new since the last round (a writer elsewhere tells each second or so,
            // not in step with the rounds): as it was then.
            Some(b) if b.look == look && look != Look::Nothing => Demand { share, ..b.demand },
            b => look.since(b.map(|b| b.look), share),
        };
        seen.insert(v.name.clone(), Seen { look, demand });
        demand
    }
}

impl Manager {
    /// Keeps what a writer beside `up` said it did (`Request::WriterUsage`).
    pub(crate) fn note_usage(
        &self,
        name: &str,
        epoch: u64,
        units: u64,
        throttled: f64,
        overlay: Option<u64>,
    ) {
        let u = Usage {
            epoch,
            units,
            throttled,
            overlay,
            at: Instant::now(),
        };
        let mut m = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        // A few hundred bytes a volume; a deleted volume's goes when another name comes.
        if m.len() > 100_000 {
            m.clear();
        }
        m.insert(name.to_string(), u);
    }

    fn usage_of(&self, name: &str) -> Option<Usage> {
        let m = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        m.get(name).copied()
    }

    /// The overlay the writer of `name` at `epoch` attached through the control socket
    /// last said it has.
    pub(crate) fn said_overlay(&self, name: &str, epoch: u64) -> Option<u64> {
        self.usage_of(name)
            .filter(|u| u.epoch == epoch)
            .and_then(|u| u.overlay)
    }
}

/// The fraction of `policy` that `share` is (by the rate its shares are counted in).
fn fraction(share: &Limits, policy: &Limits) -> f64 {
    let whole = policy_units(policy);
    (policy_units(share) / whole).clamp(0.0, 1.0)
}

fn describe(p: &QosPolicy) -> String {
    format!(
        "{}{}",
        p.limits,
        if p.aggregated { " (aggregated)" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(used: f64, waited: bool, share: f64) -> Demand {
        Demand {
            used,
            waited,
            share,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn shares_add_up_to_the_policy() {
        for ds in [
            vec![],
            vec![d(0.0, false, 0.0)],
            vec![d(900.0, true, 0.9), d(10.0, false, 0.1)],
            vec![
                d(5000.0, true, 0.2),
                d(0.0, false, 0.3),
                d(300.0, false, 0.5),
            ],
        ] {
            let f = share_out(1000.0, &ds);
            assert_eq!(f.len(), ds.len());
            if !ds.is_empty() {
                assert!(close(f.iter().sum(), 1.0), "{f:?}");
            }
        }
    }

    #[test]
    fn idle_volumes_share_equally() {
        let f = share_out(1000.0, &[d(0.0, false, 0.0); 4]);
        assert!(f.iter().all(|&x| close(x, 0.25)), "{f:?}");
    }

    #[test]
    fn two_busy_volumes_settle_at_half_each() {
        let mut s = [0.9, 0.1];
        for _ in 0..5 {
            let f = share_out(
                1000.0,
                &[d(s[0] * 1000.0, true, s[0]), d(s[1] * 1000.0, true, s[1])],
            );
            s = [f[0], f[1]];
        }
        assert!(close(s[0], 0.5) && close(s[1], 0.5), "{s:?}");
    }

    #[test]
    fn a_busy_volume_takes_what_the_idle_ones_leave() {
        let mut s = [0.5, 0.5];
        for _ in 0..6 {
            let f = share_out(1000.0, &[d(s[0] * 1000.0, true, s[0]), d(0.0, false, s[1])]);
            s = [f[0], f[1]];
        }
        // All but the idle volume's part of the idle share.
        assert!(close(s[0], 1.0 - IDLE_SHARE / 2.0), "{s:?}");
        // The idle one starts and waits: its fair half at once.
        let f = share_out(1000.0, &[d(s[0] * 1000.0, true, s[0]), d(20.0, true, s[1])]);
        assert!(close(f[1], 0.5), "{f:?}");
    }

    #[test]
    fn a_light_volume_keeps_what_it_uses_and_the_busy_one_the_rest() {
        let f = share_out(1000.0, &[d(100.0, false, 0.5), d(500.0, true, 0.5)]);
        assert!(f[0] >= 0.125 && f[0] < 0.2, "{f:?}");
        assert!(close(f[0] + f[1], 1.0));
    }
}
