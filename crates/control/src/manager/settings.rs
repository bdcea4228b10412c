//! A volume's settings as `volume create` and `volume set` give them: the minimum of copies,
//! the tier, the I/O limits. A volume is created with all of them or not at all.

use trireme_meta::{TierPolicy, VolumeRecord};

use super::{Manager, Result};
use crate::api::LimitsChange;
use crate::error::refused;

/// The settings a `volume create` or `volume set` gives (each: unchanged if absent).
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub min_copies: Option<u32>,
    pub tier: Option<TierPolicy>,
    pub limits: LimitsChange,
    /// The QoS policy it goes under (`none`: none).
    pub qos_policy: Option<String>,
}

impl Settings {
    fn is_empty(&self) -> bool {
        self.min_copies.is_none()
            && self.tier.is_none()
            && self.limits.is_empty()
            && self.qos_policy.is_none()
    }
}

impl Manager {
    /// Makes each change `s` gives, in order: minimum of copies, tier, limits, QoS policy.
    pub(crate) async fn change_settings(&self, name: &str, s: &Settings) -> Result<VolumeRecord> {
        if s.is_empty() {
            return Err(refused(
                "volume set: nothing to change (give a minimum of copies, a tier, a limit or a QoS policy)",
            ));
        }
        self.apply_settings(name, s).await
    }

    async fn apply_settings(&self, name: &str, s: &Settings) -> Result<VolumeRecord> {
        if let Some(n) = s.min_copies {
            self.set_min_copies(name, n).await?;
        }
        if let Some(t) = s.tier {
            self.set_tier(name, t).await?;
        }
        if !s.limits.is_empty() {
            self.set_limits(name, &s.limits).await?;
        }
        if let Some(p) = &s.qos_policy {
            self.set_qos_policy(name, p).await?;
        }
        Ok(self.meta.volume(name).await?)
    }

    /// What to tell of the reserves after `s` was given to volume `name` (nothing unless it
    /// touched a reserve or a policy).
    pub(crate) async fn settings_warnings(&self, name: &str, s: &Settings) -> Vec<String> {
        match s.limits.iops_reserve.is_some() || s.qos_policy.is_some() {
            true => self.reserve_warnings(&[name]).await,
            false => Vec::new(),
        }
    }

    /// Gives a volume just created its settings; a setting refused deletes the volume (the
    /// caller gets the refusal and no volume).
    pub(crate) async fn settle_new(&self, name: &str, s: &Settings) -> Result<VolumeRecord> {
        let s = Settings {
            // A new volume's tier is `auto` already.
            tier: s.tier.filter(|t| !t.is_auto()),
            ..s.clone()
        };
        match self.apply_settings(name, &s).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if let Err(d) = self.delete_volume(name).await {
                    tracing::warn!(
                        volume = name,
                        "removing a volume whose settings were refused: {d}"
                    );
                }
                Err(e)
            }
        }
    }

    /// Changes a volume's I/O limits. A writer in this process keeps them at once; one
    /// elsewhere when it sees the layout change (a watch on etcd, or within a second through
    /// `up`'s control socket).
    pub async fn set_limits(&self, name: &str, change: &LimitsChange) -> Result<VolumeRecord> {
        let v = self
            .meta
            .update_volume(name, &mut |v| {
                let limits = change.apply(v.limits);
                limits
                    .check()
                    .map_err(|e| trireme_meta::MetaError::Refused(e.to_string()))?;
                v.limits = limits;
                Ok(())
            })
            .await?;
        if let Some(w) = self.writer(name) {
            w.set_limits(v.limits_in_force()).await;
        }
        tracing::info!(volume = name, limits = %v.limits, "limits changed");
        self.event("volume", format!("volume {name}: limits {}", v.limits))
            .await;
        Ok(v)
    }
}
