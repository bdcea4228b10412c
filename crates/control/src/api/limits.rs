//! A change of a volume's I/O limits, as `volume set` and `volume create` send it.

use serde::{Deserialize, Serialize};
use trireme_replication::qos::{Kind, Limits};

/// One rate in a change: a number sets it, `"none"` removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Rate {
    Set(u64),
    Remove(NoLimit),
}

/// The word that removes a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoLimit {
    None,
}

impl Rate {
    fn value(self) -> Option<u64> {
        match self {
            Rate::Set(n) => Some(n),
            Rate::Remove(_) => None,
        }
    }
}

/// What to change in a volume's limits: each field given is set or removed, the rest kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsChange {
    /// Reads and writes together, in 8 KiB units a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<Rate>,
    /// Bytes a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps: Option<Rate>,
    /// How long an idle volume may run above its limits, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u32>,
    /// What the volume gets of busy nodes, in 8 KiB units a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_reserve: Option<Rate>,
    /// Its part of busy nodes against other volumes' (`none`: back to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<Rate>,
}

impl LimitsChange {
    pub fn rate(&self, k: Kind) -> Option<Rate> {
        match k {
            Kind::Iops => self.iops,
            Kind::ReadIops => self.read_iops,
            Kind::WriteIops => self.write_iops,
            Kind::Bps => self.bps,
            Kind::ReadBps => self.read_bps,
            Kind::WriteBps => self.write_bps,
        }
    }

    pub fn set_rate(&mut self, k: Kind, r: Option<Rate>) {
        let slot = match k {
            Kind::Iops => &mut self.iops,
            Kind::ReadIops => &mut self.read_iops,
            Kind::WriteIops => &mut self.write_iops,
            Kind::Bps => &mut self.bps,
            Kind::ReadBps => &mut self.read_bps,
            Kind::WriteBps => &mut self.write_bps,
        };
        *slot = r;
    }

    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        *self == LimitsChange::default()
    }

    /// Takes every field `later` gives over this change's (CSI's mutable parameters over a
    /// StorageClass's).
    pub fn overlay(&mut self, later: &LimitsChange) {
        for k in Kind::ALL {
            if let Some(r) = later.rate(k) {
                self.set_rate(k, Some(r));
            }
        }
        if later.burst_ms.is_some() {
            self.burst_ms = later.burst_ms;
        }
        if later.iops_reserve.is_some() {
            self.iops_reserve = later.iops_reserve;
        }
        if later.weight.is_some() {
            self.weight = later.weight;
        }
    }

    /// `limits` with this change made (not checked: see [`Limits::check`]).
    pub fn apply(&self, mut limits: Limits) -> Limits {
        for k in Kind::ALL {
            if let Some(r) = self.rate(k) {
                limits.set(k, r.value());
            }
        }
        if let Some(b) = self.burst_ms {
            limits.burst_ms = b;
        }
        if let Some(r) = self.iops_reserve {
            limits.iops_reserve = r.value();
        }
        if let Some(w) = self.weight {
            // Past u32 is past the largest weight: refused by `Limits::check` as it is.
            limits.weight = w.value().map(|w| u32::try_from(w).unwrap_or(u32::MAX));
        }
        limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_sets_none_removes_and_the_rest_is_kept() {
        let c: LimitsChange = serde_json::from_str(
            r#"{"iops":500,"write_bps":"none","burst_ms":1000,"iops_reserve":200,"weight":"none"}"#,
        )
        .unwrap();
        let was = Limits {
            iops: Some(10),
            write_bps: Some(1 << 20),
            read_iops: Some(7),
            weight: Some(4),
            ..Limits::default()
        };
        let now = c.apply(was);
        assert_eq!(
            now,
            Limits {
                iops: Some(500),
                read_iops: Some(7),
                burst_ms: 1000,
                iops_reserve: Some(200),
                ..Limits::default()
            }
        );
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"iops":500,"write_bps":"none","burst_ms":1000,"iops_reserve":200,"weight":"none"}"#
        );
        for bad in [
            r#"{"iops":-1}"#,
            r#"{"iops":"unlimited"}"#,
            r#"{"iopz":5}"#,
            r#"{"iops":1.5}"#,
        ] {
            assert!(serde_json::from_str::<LimitsChange>(bad).is_err(), "{bad}");
        }
        assert!(LimitsChange::default().is_empty());
    }
}
