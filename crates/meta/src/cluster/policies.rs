//! QoS policies (`qos/<name>`): limits, a reserve and a weight shared by several volumes, as
//! S2D's Storage QoS policies. A dedicated policy gives each of its volumes its limits; an
//! aggregated one holds its volumes together within them (the manager shares them out by
//! demand). A volume names its policy in its layout (`crate::PolicyShare`), with what the
//! manager gives it.

use serde::{Deserialize, Serialize};
use trireme_replication::qos::Limits;

use super::*;
use crate::kv::{Compare, Op};
use crate::MetaError;

/// One QoS policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosPolicy {
    pub name: String,
    #[serde(default)]
    pub limits: Limits,
    /// The limits cover its volumes together (S2D's aggregated policy); otherwise each
    /// volume gets them whole.
    #[serde(default)]
    pub aggregated: bool,
}

impl QosPolicy {
    /// Refuses a name `volume set --qos-policy` could not give (`none` removes a policy) and
    /// limits a volume could not keep.
    pub fn check(&self) -> Result<(), MetaError> {
        check_policy_name(&self.name)?;
        if self.name == "none" {
            return Err(MetaError::Refused(
                "a QoS policy may not be named `none` (`--qos-policy none` takes a volume off its policy)".into(),
            ));
        }
        self.limits
            .check()
            .map_err(|e| MetaError::Refused(format!("QoS policy {}: {e}", self.name)))
    }
}

/// A policy's name follows a volume's rules (1-64 of `[A-Za-z0-9._-]`).
fn check_policy_name(name: &str) -> Result<(), MetaError> {
    crate::check_name(name).map_err(|_| {
        MetaError::Refused(format!(
            "invalid QoS policy name {name:?}: use 1-64 characters from [A-Za-z0-9._-]"
        ))
    })
}

fn policy_key(name: &str) -> String {
    key(&format!("qos/{name}"))
}

impl ClusterMeta {
    /// Every QoS policy, by name. One that does not decode is skipped, named in a warning.
    pub async fn qos_policies(&self) -> Result<Vec<QosPolicy>, MetaError> {
        let (kvs, _) = self.store.range(&key("qos/")).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| match decode(kv) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!("skipping a QoS policy: {e}");
                    None
                }
            })
            .collect())
    }

    /// The policy `name`, with its revision.
    pub async fn qos_policy(&self, name: &str) -> Result<(QosPolicy, i64), MetaError> {
        check_policy_name(name)?;
        match self.store.get(&policy_key(name)).await? {
            Some(kv) => Ok((decode(&kv)?, kv.mod_revision)),
            None => Err(MetaError::Refused(format!("no QoS policy named {name:?}"))),
        }
    }

    /// Writes `p`: a new policy if `rev` is 0 (refused if one of its name exists), else in
    /// place of the one read at `rev` (refused if it changed since: read it again).
    pub async fn put_qos_policy(&self, p: &QosPolicy, rev: i64) -> Result<(), MetaError> {
        p.check()?;
        let k = policy_key(&p.name);
        let cmp = match rev {
            0 => Compare::absent(k.clone()),
            r => Compare::mod_revision(k.clone(), r),
        };
        match self.write(vec![cmp], vec![Op::put(k, encode(p))]).await? {
            Some(_) => Ok(()),
            None if rev == 0 => Err(MetaError::Refused(format!(
                "a QoS policy named {:?} already exists",
                p.name
            ))),
            None => Err(MetaError::Contended {
                what: format!("updating QoS policy {:?}", p.name),
                tries: 1,
            }),
        }
    }

    /// Deletes the policy read at `rev` (the caller checked no volume is under it).
    pub async fn delete_qos_policy(&self, name: &str, rev: i64) -> Result<(), MetaError> {
        let k = policy_key(name);
        match self
            .write(
                vec![Compare::mod_revision(k.clone(), rev)],
                vec![Op::delete(k)],
            )
            .await?
        {
            Some(_) => Ok(()),
            None => Err(MetaError::Contended {
                what: format!("deleting QoS policy {name:?}"),
                tries: 1,
            }),
        }
    }
}
