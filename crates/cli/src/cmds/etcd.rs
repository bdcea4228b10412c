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

/// Brings etcd's users and roles in line with the volumes' access lists (and `clients`),
/// turning its access control on with `enable`.
pub(crate) async fn rbac_sync(
    cli: &Cli,
    clients: &[String],
    enable: bool,
) -> Result<trireme_meta::rbac::Applied, CliError> {
    let store = etcd_store(cli).await?;
    let meta = trireme_meta::ClusterMeta::new(store.clone());
    let volumes = meta.volumes().await?;
    let nodes: Vec<u32> = meta.nodes().await?.into_iter().map(|n| n.id).collect();
    let plan = trireme_meta::rbac::plan(&volumes, &nodes, clients);
    Ok(trireme_meta::rbac::apply(&mut store.client(), &plan, enable).await?)
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
    if let Err(CliError::Usage(e) | CliError::Runtime(e)) = rbac_sync(cli, &[], false).await {
        eprintln!(
            "warning: etcd's access control is not up to date with this change ({e}): run `trireme etcd rbac`"
        );
    }
}

pub(crate) async fn etcd_cmd(cli: &Cli, c: &crate::EtcdCmd) -> Result<(), CliError> {
    match c {
        crate::EtcdCmd::Rbac { clients, no_enable } => {
            for c in clients {
                trireme_tls::check_client_name(c).map_err(|e| CliError::Usage(e.to_string()))?;
            }
            let done = rbac_sync(cli, clients, !no_enable).await?;
            print(cli.output, &done, |d| {
                let mut s = String::new();
                if !d.users_added.is_empty() {
                    s += &format!("etcd users added: {}\n", d.users_added.join(", "));
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
