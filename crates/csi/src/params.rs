//! StorageClass parameters (`CreateVolume`'s `parameters` and `mutable_parameters`) and
//! VolumeAttributesClass parameters (`ControllerModifyVolume`): each one checked, an unknown
//! one refused by name, so a typo in a StorageClass is an error, not a silent default.

use std::collections::HashMap;

use tonic::Status;
use trireme_control::{LimitsChange, NoLimit, Rate};
use trireme_meta::TierPolicy;
use trireme_replication::qos::Kind;

use crate::errors::invalid;

/// What a StorageClass may set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateParams {
    /// Copies (1 to 3; default the cluster's: 3, or as many nodes as take replicas).
    pub replicas: usize,
    pub changes: Changes,
    /// Client identities that may use it; default every client of the cluster (`*`), since
    /// any node of the CO may stage it.
    pub access: Vec<String>,
    /// Thick: every copy reserves the volume's size at creation.
    pub preallocate: bool,
}

/// What may change after creation (`mutable_parameters`, `ControllerModifyVolume`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub min_copies: Option<u32>,
    pub tier: Option<TierPolicy>,
    /// I/O limits: `iopsLimit` (8 KiB units), `bpsLimit` (bytes a second), their `read` and
    /// `write` forms, each a positive whole number or `none`; `limitBurstMs`; `iopsReserve`
    /// and `weight` (1 to 1000), what the volume gets of busy nodes.
    pub limits: LimitsChange,
    /// `qosPolicy`: the QoS policy (`trireme qos policy create`) it goes under; `none` takes
    /// it off its policy.
    pub qos_policy: Option<String>,
}

/// The limits' parameter names, each with its kind.
const LIMIT_KEYS: [(&str, Kind); 6] = [
    ("iopsLimit", Kind::Iops),
    ("readIopsLimit", Kind::ReadIops),
    ("writeIopsLimit", Kind::WriteIops),
    ("bpsLimit", Kind::Bps),
    ("readBpsLimit", Kind::ReadBps),
    ("writeBpsLimit", Kind::WriteBps),
];

fn rate(k: &str, v: &str) -> Result<Rate, Status> {
    match v.trim() {
        "none" => Ok(Rate::Remove(NoLimit::None)),
        t => Ok(Rate::Set(number(k, t, 1u64, u64::MAX)?)),
    }
}

/// Keys the CO's sidecars add on their own (external-provisioner's
/// `--extra-create-metadata`): taken and ignored.
const CO_PREFIX: &str = "csi.storage.k8s.io/";

fn number<T>(k: &str, v: &str, lo: T, hi: T) -> Result<T, Status>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match v.trim().parse::<T>() {
        Ok(n) if n >= lo && n <= hi => Ok(n),
        _ => Err(invalid(format!(
            "parameter {k}={v:?}: a whole number from {lo} to {hi}"
        ))),
    }
}

fn tier(v: &str) -> Result<TierPolicy, Status> {
    match v.trim() {
        "auto" => Ok(TierPolicy::Auto),
        "fast" => Ok(TierPolicy::Fast),
        "slow" => Ok(TierPolicy::Slow),
        _ => Err(invalid(format!("parameter tier={v:?}: auto, fast or slow"))),
    }
}

impl Changes {
    /// Takes `k` if it is a mutable parameter; `false` if it is not one.
    fn take(&mut self, k: &str, v: &str) -> Result<bool, Status> {
        match k {
            "minCopies" => self.min_copies = Some(number(k, v, 1u32, 3)?),
            "tier" => self.tier = Some(tier(v)?),
            "qosPolicy" => {
                let name = v.trim();
                if name != "none" {
                    trireme_meta::check_name(name)
                        .map_err(|e| invalid(format!("parameter {k}={v:?}: {e}")))?;
                }
                self.qos_policy = Some(name.to_string());
            }
            "limitBurstMs" => {
                let most = trireme_replication::qos::MAX_BURST_MS;
                self.limits.burst_ms = Some(number(k, v, 0u32, most)?);
            }
            "iopsReserve" => self.limits.iops_reserve = Some(rate(k, v)?),
            "weight" => {
                let most = u64::from(trireme_replication::qos::MAX_WEIGHT);
                self.limits.weight = Some(match v.trim() {
                    "none" => Rate::Remove(NoLimit::None),
                    t => Rate::Set(number(k, t, 1u64, most)?),
                });
            }
            _ => match LIMIT_KEYS.iter().find(|(name, _)| *name == k) {
                Some(&(_, kind)) => self.limits.set_rate(kind, Some(rate(k, v)?)),
                None => return Ok(false),
            },
        }
        Ok(true)
    }

    /// `ControllerModifyVolume`'s parameters.
    pub fn parse(p: &HashMap<String, String>) -> Result<Changes, Status> {
        let mut c = Changes::default();
        for (k, v) in sorted(p) {
            if !c.take(k, v)? {
                return Err(invalid(format!(
                    "unknown mutable parameter {k:?}: trireme changes minCopies, tier, \
                     iopsLimit, readIopsLimit, writeIopsLimit, bpsLimit, readBpsLimit, \
                     writeBpsLimit, limitBurstMs, iopsReserve, weight and qosPolicy"
                )));
            }
        }
        Ok(c)
    }

    pub fn is_empty(&self) -> bool {
        self.min_copies.is_none()
            && self.tier.is_none()
            && self.limits.is_empty()
            && self.qos_policy.is_none()
    }
}

fn sorted(p: &HashMap<String, String>) -> Vec<(&str, &str)> {
    let mut v: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    v.sort();
    v
}

impl CreateParams {
    /// `parameters`, then `mutable_parameters` (which win, as the spec says).
    pub fn parse(
        p: &HashMap<String, String>,
        mutable: &HashMap<String, String>,
    ) -> Result<CreateParams, Status> {
        let mut c = CreateParams {
            access: vec!["*".into()],
            ..CreateParams::default()
        };
        for (k, v) in sorted(p) {
            if c.changes.take(k, v)? || k.starts_with(CO_PREFIX) {
                continue;
            }
            match k {
                "replicas" => c.replicas = number(k, v, 1usize, 3)?,
                "preallocate" => {
                    c.preallocate = match v.trim() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(invalid(format!("parameter {k}={v:?}: true or false"))),
                    }
                }
                "access" => {
                    c.access = v
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect();
                    if c.access.is_empty() {
                        return Err(invalid("parameter access: at least one client name, or *"));
                    }
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown parameter {k:?}: trireme takes replicas, minCopies, tier, \
                         access, preallocate, the limits (iopsLimit, bpsLimit, ...) and qosPolicy"
                    )))
                }
            }
        }
        let m = Changes::parse(mutable)?;
        if m.min_copies.is_some() {
            c.changes.min_copies = m.min_copies;
        }
        if m.tier.is_some() {
            c.changes.tier = m.tier;
        }
        c.changes.limits.overlay(&m.limits);
        if m.qos_policy.is_some() {
            c.changes.qos_policy = m.qos_policy;
        }
        if let Some(n) = c.changes.min_copies {
            if c.replicas != 0 && n as usize > c.replicas {
                return Err(invalid(format!(
                    "minCopies={n} is more than replicas={}",
                    c.replicas
                )));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_storage_class_is_read_and_typos_refused() {
        let p = CreateParams::parse(
            &map(&[
                ("replicas", "2"),
                ("minCopies", "1"),
                ("tier", "fast"),
                ("access", "node-a, node-b"),
                ("csi.storage.k8s.io/pvc/name", "data"),
            ]),
            &map(&[("tier", "slow")]),
        )
        .unwrap();
        assert_eq!(p.replicas, 2);
        assert_eq!(p.changes.min_copies, Some(1));
        assert_eq!(p.changes.tier, Some(TierPolicy::Slow));
        assert_eq!(p.access, vec!["node-a", "node-b"]);
        let d = CreateParams::parse(&map(&[]), &map(&[])).unwrap();
        assert_eq!(d.access, vec!["*"]);
        for bad in [
            [("replica", "2")],
            [("replicas", "4")],
            [("replicas", "two")],
            [("tier", "warm")],
            [("preallocate", "yes")],
            [("access", " , ")],
        ] {
            let e = CreateParams::parse(&map(&bad), &map(&[])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(e.message().contains(bad[0].0), "{bad:?}: {}", e.message());
        }
        let e = CreateParams::parse(&map(&[("replicas", "2"), ("minCopies", "3")]), &map(&[]));
        assert!(e.is_err());
        assert!(Changes::parse(&map(&[("replicas", "2")])).is_err());
    }

    #[test]
    fn limits_are_parameters_and_mutable_ones_win() {
        let p = CreateParams::parse(
            &map(&[("iopsLimit", "5000"), ("writeBpsLimit", "1048576")]),
            &map(&[
                ("iopsLimit", "none"),
                ("limitBurstMs", "500"),
                ("iopsReserve", "2000"),
                ("weight", "5"),
            ]),
        )
        .unwrap();
        let l = p.changes.limits;
        assert_eq!(l.iops, Some(Rate::Remove(NoLimit::None)));
        assert_eq!(l.write_bps, Some(Rate::Set(1 << 20)));
        assert_eq!(l.burst_ms, Some(500));
        assert_eq!(l.iops_reserve, Some(Rate::Set(2000)));
        assert_eq!(l.weight, Some(Rate::Set(5)));
        for bad in [
            ("iopsReserve", "0"),
            ("weight", "1001"),
            ("weight", "0"),
            ("iopsLimit", "0"),
            ("bpsLimit", "-1"),
            ("readIopsLimit", "lots"),
            ("limitBurstMs", "3600001"),
            ("qosPolicy", "a/b"),
            ("qosPolicy", ""),
        ] {
            let e = Changes::parse(&map(&[bad])).unwrap_err();
            assert!(e.message().contains(bad.0), "{bad:?}: {}", e.message());
        }
    }

    #[test]
    fn a_qos_policy_is_a_parameter_and_a_mutable_one_wins() {
        let p = CreateParams::parse(
            &map(&[("qosPolicy", "gold")]),
            &map(&[("qosPolicy", "silver")]),
        )
        .unwrap();
        assert_eq!(p.changes.qos_policy.as_deref(), Some("silver"));
        let c = Changes::parse(&map(&[("qosPolicy", "none")])).unwrap();
        assert_eq!(c.qos_policy.as_deref(), Some("none"));
        assert!(!c.is_empty());
    }
}
