//! `trireme etcd`: etcd's own access control for the cluster (`trireme_meta::rbac`).

use std::sync::Arc;

use super::*;

/// The cluster's etcd, for what the metadata seam does not cover.
pub(crate) async fn etcd_store(cli: &Cli) -> Result<Arc<trireme_meta::EtcdMeta>, CliError> {
    let urls = cli.etcd.as_deref().ok_or_else(|| {
        CliError::Usage("this command needs --etcd URLS (or TRIREME_ETCD)".into())
    })?;
    let eps = trireme_meta::parse_endpoints(urls).map_err(|e| CliError::Usage(e.to_string()))?;
    let tls = etcd_tls(cli)?;
    Ok(Arc::new(
        trireme_meta::EtcdMeta::connect(&eps, tls.as_ref()).await?,
    ))
}

/// What `etcd rbac` is asked for beyond what the records say.
#[derive(Debug, Default)]
pub(crate) struct RbacAsk<'a> {
    pub clients: &'a [String],
    /// Nodes to give a user although no record names them yet (or whose certificate was
    /// revoked and replaced).
    pub nodes: &'a [u32],
    pub enable: bool,
    pub drop_shared_node_user: bool,
    /// The nodes that may hold the manager role from now on (`--managers`; `None`: as
    /// recorded).
    pub managers: Option<&'a str>,
}

/// Brings etcd's users and roles in line with the volumes' access lists, the member nodes
/// and what `ask` names, turning its access control on with `ask.enable`.
pub(crate) async fn rbac_sync(
    cli: &Cli,
    ask: &RbacAsk<'_>,
) -> Result<trireme_meta::rbac::Applied, CliError> {
    use trireme_meta::rbac;
    let store = etcd_store(cli).await?;
    let meta = trireme_meta::ClusterMeta::new(store.clone());
    let volumes = meta.volumes().await?;
    let (members, retired) =
        rbac::node_ids(&meta.nodes().await?, &meta.revoked().await?, ask.nodes);
    let managers = managers(&meta, ask.managers, &members).await?;
    let nodes = rbac::Nodes {
        members: &members,
        retired: &retired,
        managers: managers.as_ref(),
    };
    let mut plan = rbac::plan(&volumes, &nodes, ask.clients);
    if ask.drop_shared_node_user {
        plan.delete.insert(rbac::SHARED_NODE_USER.to_string());
    }
    let mut done = rbac::apply(&mut store.client(), &plan, ask.enable).await?;
    if ask.managers.is_some() {
        meta.set_setting(
            rbac::MANAGERS_SETTING,
            &rbac::format_managers(managers.as_ref()),
        )
        .await?;
    }
    done.managers = managers.as_ref().map(|m| m.iter().copied().collect());
    done.manager_deposed = depose(&meta, managers.as_ref()).await?;
    Ok(done)
}

/// The nodes that may hold the manager role: `asked` (checked against the members: a typo
/// must not leave the cluster without a manager), or as recorded.
async fn managers(
    meta: &trireme_meta::ClusterMeta,
    asked: Option<&str>,
    members: &[u32],
) -> Result<Option<std::collections::BTreeSet<u32>>, CliError> {
    use trireme_meta::rbac;
    let Some(asked) = asked else {
        return match meta.setting(rbac::MANAGERS_SETTING).await? {
            None => Ok(None),
            Some(s) => Ok(rbac::parse_managers(&s)?),
        };
    };
    let ids = rbac::parse_managers(asked).map_err(|e| CliError::Usage(e.to_string()))?;
    if let Some(ids) = &ids {
        let strangers: Vec<String> = ids
            .iter()
            .filter(|id| !members.contains(id))
            .map(u32::to_string)
            .collect();
        if !strangers.is_empty() {
            return Err(CliError::Usage(format!(
                "--managers names node {} that is no member (members: {}); name it with \
                 --node too if its server has not started yet",
                strangers.join(", "),
                members
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(ids)
}

/// Takes the manager role from a node that may no longer hold it (its writes are refused
/// now): deletes the `manager` key, which its holder gives up at once, for a node that may
/// hold it to take. Returns that node.
async fn depose(
    meta: &trireme_meta::ClusterMeta,
    managers: Option<&std::collections::BTreeSet<u32>>,
) -> Result<Option<u32>, CliError> {
    let (Some(managers), Some((m, _))) = (managers, meta.manager().await?) else {
        return Ok(None);
    };
    if managers.contains(&m.node) {
        return Ok(None);
    }
    meta.depose_manager().await?;
    Ok(Some(m.node))
}

/// After an operator changed an access list: etcd's roles follow it. Only an operator's
/// identity may change them; a failure is said, and the command's own change stands.
pub(crate) async fn rbac_follow(cli: &Cli) {
    let admin = cli
        .tls_identity
        .as_ref()
        .is_some_and(|d| d.join("admin-cert.pem").exists());
    if cli.etcd.is_none() || !admin {
        return;
    }
    match rbac_sync(cli, &RbacAsk::default()).await {
        Ok(done) if !done.users_deleted.is_empty() => eprintln!(
            "etcd users deleted: {} (removed or revoked nodes write nothing more)",
            done.users_deleted.join(", ")
        ),
        Ok(_) => {}
        Err(CliError::Usage(e) | CliError::Runtime(e)) => eprintln!(
            "warning: etcd's access control is not up to date with this change ({e}): run `trireme etcd rbac`"
        ),
    }
}

pub(crate) async fn etcd_cmd(cli: &Cli, c: &crate::EtcdCmd) -> Result<(), CliError> {
    match c {
        crate::EtcdCmd::Rbac {
            clients,
            nodes,
            no_enable,
            drop_shared_node_user,
            managers,
        } => {
            for c in clients {
                trireme_tls::check_client_name(c).map_err(|e| CliError::Usage(e.to_string()))?;
            }
            let ask = RbacAsk {
                clients,
                nodes,
                enable: !no_enable,
                drop_shared_node_user: *drop_shared_node_user,
                managers: managers.as_deref(),
            };
            let done = rbac_sync(cli, &ask).await?;
            print(cli.output, &done, |d| {
                let mut s = String::new();
                if !d.users_added.is_empty() {
                    s += &format!("etcd users added: {}\n", d.users_added.join(", "));
                }
                if !d.users_deleted.is_empty() {
                    s += &format!(
                        "etcd users deleted (nodes removed or revoked, or the shared node user): {}\n",
                        d.users_deleted.join(", ")
                    );
                }
                if d.shared_node_user {
                    s += &format!(
                        "warning: the etcd user {:?} that older node certificates share is still there: \
                         any of those certificates, a removed node's too, writes as it. Issue each \
                         node a new certificate (`trireme ca issue node N`), then run `etcd rbac \
                         --drop-shared-node-user`\n",
                        trireme_meta::rbac::SHARED_NODE_USER
                    );
                }
                if let Some(m) = &d.managers {
                    s += &format!(
                        "nodes that may hold the manager role: {} (the others write only their own records)\n",
                        m.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                    );
                    if m.len() < 2 {
                        s += "warning: with one node able to hold the manager role, nobody \
                              takes failing copies out while it is down\n";
                    }
                }
                if let Some(n) = d.manager_deposed {
                    s += &format!(
                        "node {n} held the manager role and may no longer: it was taken back\n"
                    );
                }
                if !d.roles_added.is_empty() {
                    s += &format!("etcd roles added: {}\n", d.roles_added.join(", "));
                }
                s += &format!(
                    "{} permissions granted, {} taken back\n",
                    d.granted, d.revoked
                );
                s += if d.enabled {
                    "etcd's access control is on now: each certificate writes only what its role needs\n"
                } else if *no_enable {
                    "etcd's access control left as it was (--no-enable)\n"
                } else {
                    "etcd's access control was on already\n"
                };
                s
            });
            Ok(())
        }
    }
}
