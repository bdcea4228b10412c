//! Commands that talk to a running cluster, and the node daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use trireme_control::{
    ControlClient, MoveState, MoveStatus, NodeLostReport, NodeRestartReport, NodeStatus, Request,
    StatusReport, Warned,
};
use trireme_meta::VolumeRecord;

use crate::units::human;
use crate::{
    Cli, CliError, Cmd, MaintenanceCmd, NodeCmd, NodeServeArgs, NvmfCmd, Output, PolicyCmd, QosCmd,
    SnapshotCmd, TrashCmd, VolumeCmd,
};

pub use trireme_daemon::local::control_path;

mod backup;
mod ca;
mod client;
mod csi;
mod daemons;
mod etcd;
mod jobs;
mod map;
mod nvmf;
mod qos;
mod text;

use ca::*;
use client::*;
pub(crate) use daemons::etcd_meta;
use daemons::*;
use etcd::*;
use jobs::*;
use text::*;

pub(crate) fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, CliError> {
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    rt.map_err(|e| CliError::Runtime(format!("tokio runtime: {e}")))
}

/// `trireme up`'s arguments as the supervisor's configuration.
pub(crate) fn local_config(
    cli: &Cli,
    a: &crate::UpArgs,
) -> Result<trireme_daemon::local::LocalConfig, CliError> {
    // The fast tier defaults to a tenth of the volume each node holds a copy of.
    let tiers = a
        .tiers
        .config(
            a.store,
            Some((a.size / 10).max(trireme_store::tiered::EXTENT)),
        )
        .map_err(CliError::Usage)?;
    Ok(trireme_daemon::local::LocalConfig {
        http: a.http.addr.0,
        scrub: a.scrub.schedule(),
        tiers,
        data_dir: cli.data_dir.clone(),
        nodes: a.nodes,
        replicas: a.replicas,
        layout: match &a.parity {
            Some(spec) => trireme_replication::Layout::Parity(
                trireme_replication::Parity::parse(spec, a.mirror_share)
                    .map_err(|e| CliError::Usage(e.to_string()))?,
            ),
            None => trireme_replication::Layout::Mirror,
        },
        size: a.size,
        volume: a.volume.clone(),
        store: a.store.kind().as_str().to_string(),
        port: a.port,
        dirty_grain: a.dirty_grain,
        io_threads: a.io_threads,
        recovery_share: a.recovery_share,
        node_capacity: a.node_capacity,
        overcommit: a.overcommit,
        preallocate: a.preallocate,
        inject_faults: a.inject_faults,
        restart_backoff: a.restart_backoff,
        node_netns: a.node_netns.clone(),
        no_block_checksums: a.no_block_checksums,
        volatile_bookkeeping: a.volatile_bookkeeping,
        log: cli.log.clone(),
        transport: cli.transport.as_str().to_string(),
        node_transport: a
            .node_transport
            .iter()
            .map(|(n, t)| (*n, t.as_str().to_string()))
            .collect(),
        volume_opts: a.failure.volume_options(a.streams, cli.transport.kind()),
        nvmf: a.nvmf,
        insecure: a.insecure,
    })
}

/// The TCP export's TLS: `--tls-dir`, else `default` if it holds a server identity; none with
/// `--insecure`. A TCP export without either is refused: NBD over TCP is TLS unless asked.
pub(crate) fn export_tls(
    e: &crate::ExportArgs,
    default: Option<&Path>,
) -> Result<Option<trireme_daemon::export::ExportTls>, CliError> {
    if e.listen.is_none() || e.insecure {
        return Ok(None);
    }
    let dir = match (&e.tls_dir, default) {
        (Some(d), _) => d.clone(),
        (None, Some(d)) if d.join("server-cert.pem").exists() => d.to_path_buf(),
        _ => {
            return Err(CliError::Usage(
                "NBD on TCP is served over TLS: give --tls-dir DIR (a server certificate from \
                 `trireme ca issue server`), or --insecure for plain text"
                    .into(),
            ))
        }
    };
    // Client credentials beside the server's (as `trireme up` lays them out), for the URI.
    let client = dir
        .parent()
        .map(|p| p.join("client"))
        .filter(|c| c.join("client-cert.pem").exists());
    trireme_daemon::export::ExportTls::load(&dir, client)
        .map(Some)
        .map_err(|e| CliError::Usage(format!("--tls-dir {}: {e}", dir.display())))
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    // A process beside a local cluster that reaches its nodes (a `trireme nbd` export, a bench
    // on `volume:NAME`) does so as `up` does: with `up`'s client identity, over mutual TLS.
    let local_id = cli.data_dir.join("tls").join("up");
    if matches!(
        cli.cmd,
        Cmd::Up(_)
            | Cmd::Node(NodeCmd::Serve(_) | NodeCmd::Run(_))
            | Cmd::Ca(crate::CaCmd::Init { .. } | crate::CaCmd::Issue(_))
    ) {
        // Their own identities.
    } else if let Some(d) = &cli.tls_identity {
        trireme_daemon::use_tls(d, None, false).map_err(daemon_err)?;
    } else if cli.etcd.is_none() && local_id.join("admin-cert.pem").exists() {
        trireme_daemon::use_tls(&local_id, None, false).map_err(daemon_err)?;
    }
    if matches!(cli.cmd, Cmd::Csi(_)) {
        return runtime(2)?.block_on(csi::csi(Arc::new(cli)));
    }
    match cli.cmd {
        Cmd::Up(ref a) => {
            let cfg = local_config(&cli, a)?;
            runtime(a.threads as usize)?
                .block_on(trireme_daemon::local::run(&cfg))
                .map_err(daemon_err)
        }
        Cmd::Node(NodeCmd::Serve(ref a)) => runtime(1)?.block_on(node_serve(&cli, a)),
        Cmd::Nbd(ref a) => runtime(a.export.threads as usize)?.block_on(nbd(&cli, a)),
        Cmd::Node(NodeCmd::Run(ref a)) => runtime(1)?.block_on(node_run(&cli, a)),
        Cmd::Attach(ref a) => runtime(a.export.threads as usize)?.block_on(attach(&cli, a)),
        Cmd::Map(ref a) => runtime(1)?.block_on(map::map(&cli, a)),
        Cmd::Nvmf(NvmfCmd::Serve(ref a)) => runtime(2)?.block_on(nvmf::serve(&cli, a)),
        Cmd::Unmap(ref a) => map::unmap(a),
        Cmd::Device(crate::DeviceCmd::List) => map::device_list(&cli),
        Cmd::Bench(ref a) => crate::bench::run(&cli, a),
        Cmd::Ca(ref c) => ca(&cli, c),
        Cmd::Etcd(ref c) => runtime(1)?.block_on(etcd_cmd(&cli, c)),
        _ => runtime(1)?.block_on(client_cmd(&cli)),
    }
}

pub(crate) fn print<T: Serialize>(out: Output, v: &T, text: impl FnOnce(&T) -> String) {
    match out {
        Output::Json => println!("{}", serde_json::to_string_pretty(v).expect("serializable")),
        Output::Text | Output::Markdown => print!("{}", text(v)),
    }
}

/// The control API: the elected manager's (found in etcd) with `--etcd`, else `trireme up`'s
/// socket in `--data-dir`.
pub(crate) async fn control_client(cli: &Cli) -> Result<ControlClient, CliError> {
    if cli.etcd.is_none() {
        return Ok(ControlClient::connect(&control_path(&cli.data_dir)).await?);
    }
    let meta = etcd_meta(cli).await?;
    // Right after a manager dies the role may be vacant for up to a lease TTL: wait for it.
    let t0 = std::time::Instant::now();
    loop {
        let found = match meta.manager().await? {
            Some((m, _)) => match ControlClient::connect_tcp(&m.control).await {
                Ok(c) => return Ok(c),
                Err(e) => e.to_string(),
            },
            None => "no daemon holds the manager role (is any `trireme node run` up?)".into(),
        };
        if t0.elapsed() > std::time::Duration::from_secs(15) {
            return Err(CliError::Runtime(found));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A refusal from the manager about the request itself (unknown volume, bad size) is a usage
/// error; anything else is a runtime failure.
pub(crate) fn usage_if_remote(e: trireme_control::ControlError) -> CliError {
    match e {
        trireme_control::ControlError::Remote(r) => CliError::Usage(r.message),
        trireme_control::ControlError::NotOnRecord { message: m, .. } => CliError::Usage(m),
        e => CliError::Runtime(e.to_string()),
    }
}

pub(crate) fn daemon_err(e: trireme_daemon::DaemonError) -> CliError {
    match e {
        trireme_daemon::DaemonError::Usage(m) => CliError::Usage(m),
        e if e.is_usage() => CliError::Usage(e.to_string()),
        e => CliError::Runtime(e.to_string()),
    }
}
