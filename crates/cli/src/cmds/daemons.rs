//! The long-running roles: node daemons, writers on client hosts, NBD exports.

#[allow(unused_imports)]
use super::*;

pub(crate) fn node_config(
    cli: &Cli,
    a: &NodeServeArgs,
) -> Result<trireme_daemon::node::NodeConfig, CliError> {
    Ok(trireme_daemon::node::NodeConfig {
        tiers: a.tiers.config(a.store, None).map_err(CliError::Usage)?,
        id: a.id,
        dir: a.dir.clone(),
        listen: a.listen,
        socket: a.socket.clone(),
        store: a.store.kind(),
        dirty_grain: a.dirty_grain,
        inject_faults: a.inject_faults.clone(),
        block_checksums: !a.no_block_checksums,
        books: !a.volatile_bookkeeping,
        transport: cli.transport.kind(),
        capacity: a.room.capacity,
        overcommit: a.room.overcommit,
        fs_share: a.fs_share,
        io_threads: a.io_threads as usize,
        recovery_share: a.recovery_share,
        http: a.http.addr.0,
        http_token: a.http.token_file.clone(),
    })
}

/// A node serves TCP over mutual TLS, or in plain text only when told: a daemon that would
/// trust every peer says so at start, and is never that way by accident.
pub(crate) fn node_tls(tls_dir: Option<&std::path::Path>, insecure: bool) -> Result<(), CliError> {
    match (tls_dir, insecure) {
        (Some(d), _) => {
            trireme_daemon::use_tls(d, Some("node"), true).map_err(daemon_err)?;
            tracing::info!(dir = %d.display(), "serving TCP over mutual TLS");
            Ok(())
        }
        (None, true) => {
            tracing::warn!(
                "serving TCP in plain text (--insecure): every peer that reaches the port is trusted"
            );
            Ok(())
        }
        (None, false) => Err(CliError::Usage(
            "a node serves TCP over mutual TLS: give --tls-dir DIR (its certificate: \
             `trireme ca issue node N --san ADDR --out DIR`), or --insecure for plain text"
                .into(),
        )),
    }
}

pub(crate) async fn node_serve(cli: &Cli, a: &NodeServeArgs) -> Result<(), CliError> {
    node_tls(a.tls_dir.as_deref(), a.insecure)?;
    let node = trireme_daemon::node::build_node(&node_config(cli, a)?).map_err(daemon_err)?;
    if let Some(ids) = &a.members {
        node.set_members(Some(ids.iter().copied().collect()));
    }
    let http = match a.http.addr.0 {
        Some(addr) => {
            let l = trireme_daemon::http::bind(addr).await.map_err(daemon_err)?;
            Some(
                trireme_daemon::http::serve(
                    l,
                    trireme_daemon::http::HttpSources {
                        node: Some(node.clone()),
                        ..Default::default()
                    },
                    trireme_daemon::http::Token::for_dir(a.http.token_file.as_deref(), &a.dir)
                        .map_err(daemon_err)?,
                    Some(&a.dir.join("http")),
                )
                .map_err(daemon_err)?,
            )
        }
        None => None,
    };
    let http_word = http
        .as_ref()
        .map(|h| format!(" http:{}", h.addr))
        .unwrap_or_default();
    let serve = trireme_node::run(node.clone(), a.listen, a.socket.as_deref(), |addr, unix| {
        use std::io::Write;
        let mut o = std::io::stdout();
        let _ = match (&a.socket, unix) {
            (Some(p), true) => writeln!(o, "listening {addr} unix:{}{http_word}", p.display()),
            _ => writeln!(o, "listening {addr}{http_word}"),
        };
        let _ = o.flush();
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = serve => r.map_err(|e| CliError::Runtime(format!("node {}: listen on {}: {e}", a.id, a.listen)))?,
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let n = node.clone();
    let _ = tokio::task::spawn_blocking(move || n.close_all()).await;
    tracing::info!(node = a.id, "node stopped");
    Ok(())
}

/// The client identity for `https://` etcd endpoints: a node daemon's (`--tls-dir`), else the
/// process's `--tls-identity`.
pub(crate) fn etcd_tls(cli: &Cli) -> Result<Option<trireme_meta::EtcdTls>, CliError> {
    let (dir, stem) = match (&cli.cmd, &cli.tls_identity) {
        (Cmd::Node(NodeCmd::Run(a)), _) if a.tls_dir.is_some() => {
            (a.tls_dir.clone().unwrap_or_default(), "node")
        }
        (_, Some(d)) if d.join("admin-cert.pem").exists() => (d.clone(), "admin"),
        (_, Some(d)) => (d.clone(), "client"),
        _ => return Ok(None),
    };
    let read = |p: PathBuf| {
        std::fs::read(&p)
            .map_err(|e| CliError::Usage(format!("etcd TLS identity: {}: {e}", p.display())))
    };
    Ok(Some(trireme_meta::EtcdTls {
        ca_pem: read(
            cli.etcd_ca
                .clone()
                .unwrap_or_else(|| dir.join("ca-cert.pem")),
        )?,
        cert_pem: read(dir.join(format!("{stem}-cert.pem")))?,
        key_pem: read(dir.join(format!("{stem}-key.pem")))?,
    }))
}

/// The cluster metadata in etcd, for commands given `--etcd`.
pub(crate) async fn etcd_meta(cli: &Cli) -> Result<trireme_meta::ClusterMeta, CliError> {
    let urls = cli.etcd.as_deref().ok_or_else(|| {
        CliError::Usage("this command needs --etcd URLS (or TRIREME_ETCD)".into())
    })?;
    let eps = trireme_meta::parse_endpoints(urls).map_err(|e| CliError::Usage(e.to_string()))?;
    let tls = etcd_tls(cli)?;
    let store = trireme_meta::EtcdMeta::connect(&eps, tls.as_ref()).await?;
    Ok(trireme_meta::ClusterMeta::new(Arc::new(store)))
}

/// A node daemon trusts what etcd holds (access lists, epochs, its own restart orders): it
/// refuses an etcd that any certificate may write, unless `--insecure`. That is etcd without
/// TLS (no identities at all), or etcd whose access control is off — found by whether this
/// node's own identity may write outside trireme's keys (with `trireme etcd rbac`'s roles it
/// may not).
async fn etcd_is_guarded(store: &trireme_meta::EtcdMeta) -> Result<(), CliError> {
    if let Some(plain) = store.endpoints().iter().find(|e| e.starts_with("http://")) {
        return Err(CliError::Usage(format!(
            "etcd at {plain} is plain text: anyone who reaches it may write every key. A node \
             needs etcd over TLS (https://) with its access control on (`trireme etcd rbac`), \
             or --insecure"
        )));
    }
    let open = loop {
        match trireme_meta::rbac::open_to_all(&mut store.client()).await {
            Ok(open) => break open,
            Err(trireme_meta::MetaError::Unavailable(e)) => {
                tracing::warn!("etcd unreachable, retrying: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => return Err(CliError::Usage(format!("etcd: {e}"))),
        }
    };
    if open {
        return Err(CliError::Usage(
            "etcd lets this node write outside trireme's keys: its access control is off (or \
             the node holds etcd's root role), so any certificate of its CA may write every key \
             (a client could put itself on any volume's access list). Set up its users and \
             roles with `trireme --etcd URLS --tls-identity ADMIN-DIR etcd rbac`, or start with \
             --insecure"
                .into(),
        ));
    }
    tracing::info!("etcd's access control is on: this node writes trireme's keys only");
    Ok(())
}

pub(crate) async fn node_run(cli: &Cli, a: &crate::NodeRunArgs) -> Result<(), CliError> {
    node_tls(a.tls_dir.as_deref(), a.insecure)?;
    let store = etcd_store(cli).await?;
    if !a.insecure {
        etcd_is_guarded(&store).await?;
    }
    let meta = trireme_meta::ClusterMeta::new(store);
    let cfg = trireme_daemon::node::NodeConfig {
        tiers: a.tiers.config(a.store, None).map_err(CliError::Usage)?,
        id: a.id,
        dir: a.dir.clone(),
        listen: a.listen,
        socket: None,
        store: a.store.kind(),
        dirty_grain: a.dirty_grain,
        inject_faults: a.inject_faults.clone(),
        block_checksums: !a.no_block_checksums,
        books: !a.volatile_bookkeeping,
        transport: cli.transport.kind(),
        capacity: a.room.capacity,
        overcommit: a.room.overcommit,
        fs_share: 1,
        io_threads: a.io_threads as usize,
        recovery_share: a.recovery_share,
        http: a.http.addr.0,
        http_token: a.http.token_file.clone(),
    };
    let member = trireme_daemon::node::MemberConfig {
        zone: a.zone.clone(),
        iops_capacity: a.iops_capacity,
        lease_ttl: a.lease_ttl,
        control: a
            .control
            .unwrap_or_else(|| std::net::SocketAddr::new(a.listen.ip(), 0)),
        manager: trireme_daemon::manager_role::ManagerOptions {
            down_out: (!a.down_out_interval.is_zero()).then_some(a.down_out_interval),
            rate: a.recovery_rate,
            scrub: a.scrub.schedule(),
            ..Default::default()
        },
    };
    trireme_daemon::node::run_member(cfg, member, meta)
        .await
        .map_err(daemon_err)
}

/// The NBD TCP listener, if `--listen` was given.
pub(crate) async fn bind_nbd(
    listen: Option<std::net::SocketAddr>,
) -> Result<Option<tokio::net::TcpListener>, CliError> {
    match listen {
        Some(addr) => {
            Ok(Some(tokio::net::TcpListener::bind(addr).await.map_err(
                |e| CliError::Runtime(format!("bind {addr}: {e}")),
            )?))
        }
        None => Ok(None),
    }
}

/// A stop request (SIGTERM or Ctrl-C), caught from the moment this is made: made before a
/// process says it serves, so a stop that follows at once still detaches cleanly (the
/// default action would kill it with its attach record held until the lease expires).
pub(crate) struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    pub(crate) fn catch() -> Result<Stop, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let err = |e: std::io::Error| CliError::Runtime(format!("signal handler: {e}"));
        Ok(Stop {
            term: signal(SignalKind::terminate()).map_err(err)?,
            int: signal(SignalKind::interrupt()).map_err(err)?,
        })
    }

    pub(crate) async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

pub(crate) async fn attach(cli: &Cli, a: &crate::AttachArgs) -> Result<(), CliError> {
    let stop = Stop::catch()?;
    check_socket(&a.export)?;
    let meta = etcd_meta(cli).await?;
    // TLS clients open the volume only if its access list names them.
    let (access, follow) = trireme_daemon::access::followed(meta.clone());
    let tls = export_tls(&a.export, None)?.map(|t| t.gated(&access));
    let tcp = bind_nbd(a.export.listen).await?;
    let tcp_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());
    if let Some((volume, snap)) = a.volume.split_once('@') {
        // A snapshot, read-only: no writer and no attach record, so nothing is fenced.
        let found = trireme_daemon::export::snapshots_on_etcd(&meta, volume)
            .await
            .map_err(CliError::Runtime)?;
        serve_snapshot_until_stopped(stop, cli, &a.export, found, snap, tcp, tls.as_ref()).await?;
        follow.abort();
        return Ok(());
    }
    let uris = trireme_daemon::export::uris(
        &a.volume,
        a.export.socket.as_deref(),
        tcp_addr,
        tls.as_ref(),
    );
    let cfg = trireme_daemon::attach::AttachConfig {
        volume: a.volume.clone(),
        force: a.force,
        lease_ttl: a.lease_ttl,
        opts: a
            .export
            .failure
            .volume_options(a.export.streams, cli.transport.kind()),
    };
    let mut att = trireme_daemon::attach::attach(meta.clone(), &cfg, uris.clone())
        .await
        .map_err(daemon_err)?;
    let slot = trireme_daemon::export::WriterSlot::new(att.volume.clone());
    let source = trireme_daemon::export::SnapshotSource::Etcd(meta.clone());
    let tasks =
        trireme_daemon::export::serve(&slot, source, a.export.socket.as_deref(), tcp, tls.as_ref())
            .map_err(CliError::Runtime)?;
    let http = writer_http(cli, &a.http, &att.volume, "attach").await?;
    // The manager runs elsewhere: `status`, the dashboard and Prometheus's targets learn the
    // writer's view from its report.
    att.report(http.as_ref().map(|h| h.addr.to_string()));
    for u in &uris {
        println!("{u}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    stop.wait().await;
    for t in tasks {
        t.abort();
    }
    follow.abort();
    let r = att.detach().await.map_err(daemon_err);
    if let Some(p) = &a.export.socket {
        let _ = std::fs::remove_file(p);
    }
    r
}

/// Whether the export's `--socket` can be made, checked before the attach takes an epoch: an
/// attach that then fails to bind would leave its record and a new epoch behind for nothing.
fn check_socket(e: &crate::ExportArgs) -> Result<(), CliError> {
    match &e.socket {
        Some(p) => trireme_tls::local::check_socket_path(p)
            .map_err(|err| CliError::Usage(format!("--socket {}: {err}", p.display()))),
        None => Ok(()),
    }
}

/// The HTTP endpoint of a process that writes a volume (`attach`, `nbd`): its metrics, at
/// the address written to `<data-dir>/ROLE-VOLUME.http` and printed on stderr, behind the data
/// directory's `http-token` unless `--http-token-file` names one.
pub(crate) async fn writer_http(
    cli: &Cli,
    a: &crate::HttpArgs,
    vol: &std::sync::Arc<trireme_client::Volume>,
    role: &str,
) -> Result<Option<trireme_daemon::http::HttpServer>, CliError> {
    let Some(addr) = a.addr.0 else {
        return Ok(None);
    };
    let l = trireme_daemon::http::bind(addr).await.map_err(daemon_err)?;
    let token = trireme_daemon::http::Token::for_dir(a.token_file.as_deref(), &cli.data_dir)
        .map_err(daemon_err)?;
    let name = &vol.info().name;
    let h = trireme_daemon::http::serve(
        l,
        trireme_daemon::http::HttpSources {
            writers: vec![vol.clone()],
            ..Default::default()
        },
        token,
        Some(&cli.data_dir.join(format!("{role}-{name}.http"))),
    )
    .map_err(daemon_err)?;
    eprintln!("metrics: http://{}/metrics", h.addr);
    Ok(Some(h))
}

pub(crate) async fn nbd(cli: &Cli, a: &crate::NbdArgs) -> Result<(), CliError> {
    let stop = Stop::catch()?;
    check_socket(&a.export)?;
    // TLS clients open the volume only if its access list names them.
    let access = trireme_daemon::access::AccessView::default();
    let follow = tokio::spawn(trireme_daemon::access::follow_control(
        control_path(&cli.data_dir),
        access.clone(),
    ));
    let tls = export_tls(&a.export, Some(&cli.data_dir.join("tls").join("server")))?
        .map(|t| t.gated(&access));
    let tcp = bind_nbd(a.export.listen).await?;
    let tcp_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());
    if let Some((volume, snap)) = a.volume.split_once('@') {
        // A snapshot, read-only: no writer, so nothing to fence, detach or take back.
        let found =
            trireme_daemon::export::snapshots_via_control(&control_path(&cli.data_dir), volume)
                .await
                .map_err(CliError::Runtime)?;
        serve_snapshot_until_stopped(stop, cli, &a.export, found, snap, tcp, tls.as_ref()).await?;
        follow.abort();
        return Ok(());
    }
    let (slot, tasks) = trireme_daemon::export::export_local(
        &control_path(&cli.data_dir),
        &a.volume,
        a.export.socket.as_deref(),
        tcp,
        tls.as_ref(),
        a.export
            .failure
            .volume_options(a.export.streams, cli.transport.kind()),
    )
    .await
    .map_err(CliError::Runtime)?;
    let reattach = tokio::spawn(trireme_daemon::export::reattach_when_lost(
        slot.clone(),
        control_path(&cli.data_dir),
        a.export
            .failure
            .volume_options(a.export.streams, cli.transport.kind()),
        None,
    ));
    let _http = writer_http(cli, &a.http, &slot.current(), "nbd").await?;
    for u in trireme_daemon::export::uris(
        &a.volume,
        a.export.socket.as_deref(),
        tcp_addr,
        tls.as_ref(),
    ) {
        println!("{u}");
    }
    stop.wait().await;
    follow.abort();
    reattach.abort();
    for t in tasks {
        t.abort();
    }
    if let Err(e) = slot.current().detach().await {
        tracing::error!("final flush and detach: {e}");
    }
    if let Some(p) = &a.export.socket {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Serves snapshot `snap` of the volume `found` describes (where it lives, its snapshots)
/// read-only until Ctrl-C or SIGTERM: prints its URIs, then stops and removes the socket.
async fn serve_snapshot_until_stopped(
    stop: Stop,
    cli: &Cli,
    a: &crate::ExportArgs,
    found: (
        trireme_client::AttachInfo,
        Vec<trireme_control::SnapshotInfo>,
    ),
    snap: &str,
    tcp: Option<tokio::net::TcpListener>,
    tls: Option<&trireme_daemon::export::ExportTls>,
) -> Result<(), CliError> {
    let tcp_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());
    let (info, list) = found;
    let opts = a.failure.volume_options(a.streams, cli.transport.kind());
    let (tasks, reader) = trireme_daemon::export::serve_snapshot(
        &info,
        &list,
        snap,
        a.socket.as_deref(),
        tcp,
        tls,
        opts,
    )
    .await
    .map_err(CliError::Runtime)?;
    let label = format!("{}@{snap}", info.name);
    for u in trireme_daemon::export::uris(&label, a.socket.as_deref(), tcp_addr, tls) {
        println!("{u}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    stop.wait().await;
    for t in tasks {
        t.abort();
    }
    // A delete right after this stops is not refused for it.
    reader
        .release(trireme_daemon::export::export_holder(&label))
        .await;
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}
