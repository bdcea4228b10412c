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
    let mut plan = rbac::plan(&volumes, &members, &retired, ask.clients);
    if ask.drop_shared_node_user {
        plan.delete.insert(rbac::SHARED_NODE_USER.to_string());
    }
    Ok(rbac::apply(&mut store.client(), &plan, ask.enable).await?)
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
        } => {
            for c in clients {
                trireme_tls::check_client_name(c).map_err(|e| CliError::Usage(e.to_string()))?;
            }
            let ask = RbacAsk {
                clients,
                nodes,
                enable: !no_enable,
                drop_shared_node_user: *drop_shared_node_user,
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
