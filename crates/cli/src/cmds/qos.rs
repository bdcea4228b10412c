//! `trireme qos policy`: QoS policies shared by several volumes.

#[allow(unused_imports)]
use super::*;

/// ` (under QoS policy P)` for a volume under one.
pub(crate) fn policy_text(v: &VolumeRecord) -> String {
    v.qos_policy()
        .map_or(String::new(), |p| format!(" (under QoS policy {p})"))
}

pub(crate) async fn policy_cmd(
    cc: &mut trireme_control::ControlClient,
    out: Output,
    c: &PolicyCmd,
) -> Result<(), CliError> {
    let policy_line = |p: &trireme_meta::QosPolicy| {
        format!(
            "QoS policy {}: {}{}\n",
            p.name,
            p.limits,
            if p.aggregated {
                ", aggregated over its volumes"
            } else {
                ", each volume"
            }
        )
    };
    match c {
        PolicyCmd::Create {
            name,
            limits,
            aggregated,
        } => {
            let p: trireme_meta::QosPolicy = cc
                .call(&Request::QosPolicyCreate {
                    name: name.clone(),
                    limits: limits.change(),
                    aggregated: *aggregated,
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &p, policy_line);
        }
        PolicyCmd::Set { name, limits } => {
            let limits = limits.change();
            if limits.is_empty() {
                return Err(CliError::Usage(
                    "qos policy set: give a limit (--iops-limit N, ...)".into(),
                ));
            }
            let p: Warned<trireme_meta::QosPolicy> = cc
                .call(&Request::QosPolicySet {
                    name: name.clone(),
                    limits,
                })
                .await
                .map_err(usage_if_remote)?;
            print_warned(out, &p, policy_line);
        }
        PolicyCmd::Delete { name } => {
            let p: trireme_meta::QosPolicy = cc
                .call(&Request::QosPolicyDelete { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            print(out, &p, |p| format!("deleted QoS policy {}\n", p.name));
        }
        PolicyCmd::List => {
            let ps: Vec<trireme_control::PolicyInfo> = cc.call(&Request::QosPolicyList).await?;
            print(out, &ps, |ps| {
                if ps.is_empty() {
                    return "no QoS policies (`trireme qos policy create NAME --iops-limit N`)\n"
                        .to_string();
                }
                let mut s = String::new();
                for p in ps {
                    s += &policy_line(&p.policy);
                    for v in &p.volumes {
                        s += &format!("  {:<20} {}\n", v.name, v.limits);
                    }
                }
                s
            });
        }
    }
    Ok(())
}

/// Prints an answer; in text, its warnings go to standard error (JSON keeps them in the
/// object).
pub(crate) fn print_warned<T: serde::Serialize>(
    out: Output,
    w: &Warned<T>,
    text: impl FnOnce(&T) -> String,
) {
    print(out, w, |w| text(&w.value));
    if !matches!(out, Output::Json) {
        for line in &w.warnings {
            eprintln!("warning: {line}");
        }
    }
}

/// `trireme node set ID --iops-capacity N|none`.
pub(crate) async fn node_set(
    cc: &mut trireme_control::ControlClient,
    out: Output,
    id: u32,
    iops_capacity: Option<trireme_control::Rate>,
) -> Result<(), CliError> {
    if iops_capacity.is_none() {
        return Err(CliError::Usage(
            "node set: give --iops-capacity N (or none)".into(),
        ));
    }
    let n: Warned<trireme_meta::NodeRecord> = cc
        .call(&Request::NodeSet { id, iops_capacity })
        .await
        .map_err(usage_if_remote)?;
    print_warned(out, &n, |n| match n.iops_capacity {
        Some(c) => format!(
            "node {}: IOPS capacity {} (8 KiB units a second)\n",
            n.id,
            trireme_control::reserves::grouped(c)
        ),
        None => format!(
            "node {}: no IOPS capacity declared (its reserves are not checked)\n",
            n.id
        ),
    });
    Ok(())
}
