//! `trireme csi`: the CSI driver's process (`trireme_csi`), its controller a client of the
//! cluster this command line names (`--etcd`, or `up`'s `--data-dir`).

use super::*;
use crate::CsiArgs;

/// How the controller reaches the manager: as every other command does, again for each call
/// (the manager may have moved since the last one).
fn connector(cli: Arc<Cli>) -> trireme_csi::Connect {
    Arc::new(move || {
        let cli = cli.clone();
        Box::pin(async move {
            if cli.etcd.is_none() {
                return ControlClient::connect(&control_path(&cli.data_dir)).await;
            }
            // Not reaching etcd or its manager: the CO asks again later.
            control_client(&cli).await.map_err(|e| {
                let (CliError::Usage(m) | CliError::Runtime(m)) = e;
                trireme_control::ControlError::Elsewhere(m)
            })
        })
    })
}

pub(crate) async fn csi(cli: Arc<Cli>) -> Result<(), CliError> {
    let Cmd::Csi(a) = &cli.cmd else {
        unreachable!("csi() runs `trireme csi`")
    };
    let a: &CsiArgs = a;
    if !a.controller && !a.node {
        return Err(CliError::Usage(
            "csi: give --controller, --node, or both".into(),
        ));
    }
    let endpoint: trireme_csi::Endpoint = a
        .endpoint
        .parse()
        .map_err(|e: trireme_csi::CsiError| CliError::Usage(e.to_string()))?;
    let controller = a.controller.then(|| {
        let follow = cli.clone();
        let c = trireme_csi::ControllerService::new(
            connector(cli.clone()),
            a.trash_keep.map(|d| d.as_secs()),
        )
        .on_access_change(Arc::new(move || {
            let cli = follow.clone();
            Box::pin(async move { super::etcd::rbac_follow(&cli).await })
        }));
        let copies = Copies {
            connect: connector(cli.clone()),
            opts: trireme_client::VolumeOptions {
                kind: cli.transport.kind(),
                replica_timeout: std::time::Duration::from_secs(5),
                ..Default::default()
            },
        };
        (
            c,
            trireme_csi::SnapshotMetadataService::new(Arc::new(copies)),
        )
    });
    let node = match a.node {
        true => Some(trireme_csi::NodeService::new(
            node_config(&cli, a)?,
            connector(cli.clone()),
        )),
        false => None,
    };
    let stop = Stop::catch()?;
    tracing::info!(
        endpoint = a.endpoint,
        controller = a.controller,
        node = a.node,
        "CSI driver {} serving",
        trireme_csi::DRIVER_NAME
    );
    trireme_csi::serve(&endpoint, controller, node, stop.wait())
        .await
        .map_err(|e| CliError::Runtime(e.to_string()))
}

/// The node service's settings: its `map` children get this command line's cluster (as
/// environment variables) and record the node's name as their host.
fn node_config(cli: &Cli, a: &CsiArgs) -> Result<trireme_csi::NodeConfig, CliError> {
    use clap::ValueEnum;
    let node_id = a.node_id.clone().unwrap_or_else(trireme_control::hostname);
    let data_dir = std::path::absolute(&cli.data_dir)?;
    let mut env = vec![
        (
            "TRIREME_DATA_DIR".to_string(),
            data_dir.display().to_string(),
        ),
        ("TRIREME_HOST".to_string(), node_id.clone()),
        ("TRIREME_LOG".to_string(), cli.log.clone()),
    ];
    if let Some(t) = cli.transport.to_possible_value() {
        env.push(("TRIREME_TRANSPORT".into(), t.get_name().to_string()));
    }
    let paths = [
        ("TRIREME_ETCD_CA", cli.etcd_ca.as_ref()),
        ("TRIREME_TLS_IDENTITY", cli.tls_identity.as_ref()),
    ];
    for (k, p) in paths {
        if let Some(p) = p {
            env.push((k.into(), std::path::absolute(p)?.display().to_string()));
        }
    }
    if let Some(e) = &cli.etcd {
        env.push(("TRIREME_ETCD".into(), e.clone()));
    }
    Ok(trireme_csi::NodeConfig {
        node_id,
        zone: a.zone.clone(),
        exe: std::env::current_exe()?,
        env,
        devices: trireme_kernel::mapped::DIR.into(),
        logs: "/run/trireme/csi".into(),
        device: a
            .device
            .to_possible_value()
            .map_or("auto".into(), |v| v.get_name().to_string()),
    })
}

/// Changed-block tracking from the copies that hold a snapshot (as `volume diff` reads them).
struct Copies {
    connect: trireme_csi::Connect,
    opts: trireme_client::VolumeOptions,
}

/// One snapshot's ranges: allocated, or changed since the snapshot of id `base`.
struct Ranges {
    reader: trireme_client::SnapshotReader,
    base: Option<u64>,
}

#[tonic::async_trait]
impl trireme_csi::SnapshotBlocks for Copies {
    async fn open(
        &self,
        volume: &str,
        snap: &str,
        base: Option<&str>,
    ) -> Result<Box<dyn trireme_csi::BlockRanges>, tonic::Status> {
        use trireme_csi::control_status as status;
        let mut c = (self.connect)().await.map_err(status)?;
        let name = volume.to_string();
        let info: trireme_client::AttachInfo = c
            .call(&Request::Locate { name: name.clone() })
            .await
            .map_err(status)?;
        let list: Vec<trireme_control::SnapshotInfo> = c
            .call(&Request::SnapshotList { name })
            .await
            .map_err(status)?;
        let find = |s: &str| {
            list.iter().find(|x| x.name == s).ok_or_else(|| {
                tonic::Status::not_found(format!("volume {volume} has no snapshot {s}"))
            })
        };
        let target = find(snap)?;
        let base = match base {
            None => None,
            Some(b) => {
                let b = find(b)?;
                if b.id >= target.id {
                    return Err(tonic::Status::invalid_argument(format!(
                        "{volume}@{} is not older than {volume}@{snap}",
                        b.name
                    )));
                }
                Some(b.id)
            }
        };
        let reader = trireme_daemon::export::snapshot_reader(&info, &list, snap, self.opts.clone())
            .map_err(tonic::Status::failed_precondition)?;
        Ok(Box::new(Ranges { reader, base }))
    }
}

#[tonic::async_trait]
impl trireme_csi::BlockRanges for Ranges {
    fn size(&self) -> u64 {
        self.reader.size()
    }

    async fn ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, tonic::Status> {
        use trireme_client::Extents;
        let (ext, pick): (_, fn(u32) -> bool) = match self.base {
            None => (
                self.reader.block_status(offset, len, Extents::All).await,
                |f| f & trireme_proto::Extent::HOLE == 0,
            ),
            Some(id) => (
                self.reader.changed(id, offset, len, Extents::All).await,
                |f| f & trireme_proto::EXTENT_CHANGED != 0,
            ),
        };
        let ext = ext.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut pos = offset;
        for e in ext {
            if pick(e.flags) {
                match out.last_mut() {
                    Some((a, n)) if *a + *n == pos => *n += e.length,
                    _ => out.push((pos, e.length)),
                }
            }
            pos += e.length;
        }
        Ok(out)
    }
}
