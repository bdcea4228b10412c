//! Commands that talk to a running cluster, and the node daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use trireme_control::{
    ControlClient, MoveState, MoveStatus, NodeRestartReport, NodeStatus, Request, StatusReport,
};
use trireme_meta::VolumeRecord;

use crate::units::human;
use crate::{Cli, CliError, Cmd, MaintenanceCmd, NodeCmd, NodeServeArgs, Output, VolumeCmd};

pub use trireme_daemon::local::control_path;

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, CliError> {
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
fn local_config(
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
        tiers,
        data_dir: cli.data_dir.clone(),
        nodes: a.nodes,
        replicas: a.replicas,
        size: a.size,
        volume: a.volume.clone(),
        store: a.store.kind().as_str().to_string(),
        port: a.port,
        dirty_grain: a.dirty_grain,
        node_capacity: a.node_capacity,
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
        insecure: a.insecure,
    })
}

/// The TCP export's TLS: `--tls-dir`, else `default` if it holds a server identity; none with
/// `--insecure`. A TCP export without either is refused: NBD over TCP is TLS unless asked.
fn export_tls(
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
    if matches!(cli.cmd, Cmd::Up(_) | Cmd::Node(_) | Cmd::Ca(_)) {
        // Their own identities.
    } else if let Some(d) = &cli.tls_identity {
        trireme_daemon::use_tls(d, None, false).map_err(daemon_err)?;
    } else if cli.etcd.is_none() && local_id.join("admin-cert.pem").exists() {
        trireme_daemon::use_tls(&local_id, None, false).map_err(daemon_err)?;
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
        Cmd::Bench(ref a) => crate::bench::run(&cli, a),
        Cmd::Ca(ref c) => ca(&cli, c),
        _ => runtime(1)?.block_on(client_cmd(&cli)),
    }
}

/// `trireme ca init | issue`.
fn ca(cli: &Cli, c: &crate::CaCmd) -> Result<(), CliError> {
    use trireme_tls::{Ca, Role, San};
    let default_ca = cli.data_dir.join("tls").join("ca");
    let usage = |e: trireme_tls::TlsError| match e {
        trireme_tls::TlsError::Usage(m) => CliError::Usage(m),
        e => CliError::Runtime(e.to_string()),
    };
    #[derive(Serialize)]
    struct Written {
        role: Option<String>,
        dir: String,
        files: Vec<String>,
    }
    let (w, what) = match c {
        crate::CaCmd::Init { dir } => {
            let dir = dir.clone().unwrap_or(default_ca);
            Ca::init(&dir).map_err(usage)?;
            let w = Written {
                role: None,
                dir: dir.display().to_string(),
                files: vec![trireme_tls::CA_CERT.into(), trireme_tls::CA_KEY.into()],
            };
            (w, "a new cluster CA".to_string())
        }
        crate::CaCmd::Issue(a) => {
            let role = match &a.role {
                crate::CaRole::Node { id } => Role::Node(*id),
                crate::CaRole::Client { name } => {
                    trireme_tls::check_client_name(name).map_err(usage)?;
                    Role::Client(name.clone())
                }
                crate::CaRole::Server => Role::Server,
                crate::CaRole::Admin => Role::Admin,
            };
            let sans: Vec<San> = a
                .sans
                .iter()
                .map(|s| s.parse())
                .collect::<Result<_, _>>()
                .map_err(usage)?;
            if matches!(role, Role::Server) && sans.is_empty() {
                return Err(CliError::Usage(
                    "a server certificate needs the names clients reach it by: --san HOST (repeat for several)".into(),
                ));
            }
            let out = a.out.clone().ok_or_else(|| {
                CliError::Usage("--out DIR: where to write the certificate and key".into())
            })?;
            let ca_dir = a.ca.clone().unwrap_or(default_ca);
            let ca = Ca::open(&ca_dir).map_err(|e| {
                CliError::Usage(format!(
                    "no usable CA in {} ({e}); create one with `trireme ca init`",
                    ca_dir.display()
                ))
            })?;
            ca.issue(&role, &sans)
                .and_then(|i| i.write(&out))
                .map_err(usage)?;
            let stem = role.stem();
            let w = Written {
                role: Some(role.to_string()),
                dir: out.display().to_string(),
                files: vec![
                    trireme_tls::CA_CERT.into(),
                    format!("{stem}-cert.pem"),
                    format!("{stem}-key.pem"),
                ],
            };
            (w, format!("a certificate for {role}"))
        }
    };
    print(cli.output, &w, |w| {
        format!("{what} in {}: {}\n", w.dir, w.files.join(", "))
    });
    Ok(())
}

fn print<T: Serialize>(out: Output, v: &T, text: impl FnOnce(&T) -> String) {
    match out {
        Output::Json => println!("{}", serde_json::to_string_pretty(v).expect("serializable")),
        Output::Text | Output::Markdown => print!("{}", text(v)),
    }
}

/// The control API: the elected manager's (found in etcd) with `--etcd`, else `trireme up`'s
/// socket in `--data-dir`.
async fn control_client(cli: &Cli) -> Result<ControlClient, CliError> {
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

async fn client_cmd(cli: &Cli) -> Result<(), CliError> {
    let mut cc = control_client(cli).await?;
    let out = cli.output;
    match &cli.cmd {
        Cmd::Node(NodeCmd::List) => {
            let nodes: Vec<NodeStatus> = cc.call(&Request::NodeList).await?;
            print(out, &nodes, |n| nodes_table(n));
        }
        Cmd::Node(NodeCmd::Stop { id })
        | Cmd::Node(NodeCmd::Start { id })
        | Cmd::Node(NodeCmd::Undrain { id }) => {
            let req = match &cli.cmd {
                Cmd::Node(NodeCmd::Stop { .. }) => Request::NodeStop { id: *id },
                Cmd::Node(NodeCmd::Start { .. }) => Request::NodeStart { id: *id },
                _ => Request::NodeUndrain { id: *id },
            };
            let msg: String = cc.call(&req).await.map_err(usage_if_remote)?;
            print(out, &msg, |m| format!("{m}\n"));
        }
        Cmd::Node(NodeCmd::Restart { id }) => {
            if matches!(out, Output::Text) {
                eprintln!("restarting node {id}...");
            }
            let restart = restart_node(cli, &mut cc, *id);
            let r = with_progress(cli, &format!("node {id} resync"), restart, resync_to(*id))
                .await
                .map_err(usage_if_remote)?;
            print(out, &r, |r| format!("{}\n", restart_text(r)));
        }
        Cmd::Maintenance(MaintenanceCmd::Rolling) => {
            let t0 = std::time::Instant::now();
            let nodes: Vec<NodeStatus> = cc.call(&Request::NodeList).await?;
            let ids: Vec<u32> = nodes
                .iter()
                .filter(|n| n.state != trireme_meta::NodeState::Removed)
                .map(|n| n.id)
                .collect();
            let mut done = Vec::new();
            for (k, id) in ids.iter().enumerate() {
                wait_in_sync(&mut cc).await?;
                if matches!(out, Output::Text) {
                    eprintln!("[{}/{}] restarting node {id}...", k + 1, ids.len());
                }
                let restart = restart_node(cli, &mut cc, *id);
                let r = with_progress(cli, &format!("node {id} resync"), restart, resync_to(*id))
                    .await
                    .map_err(|e| CliError::Runtime(format!("node {id}: {e}")))?;
                if matches!(out, Output::Text) {
                    eprintln!("[{}/{}] {}", k + 1, ids.len(), restart_text(&r));
                }
                done.push(r);
            }
            let report = RollingReport {
                total_ms: t0.elapsed().as_millis() as u64,
                nodes: done,
            };
            print(out, &report, |r| {
                let mut s = String::from("node  down (s)  back in sync (s)  resynced\n");
                for n in &r.nodes {
                    s += &format!(
                        "{:<5} {:>8.1}  {:>16.1}  {}{}\n",
                        n.node,
                        n.down_ms as f64 / 1000.0,
                        n.total_ms as f64 / 1000.0,
                        human(n.resynced_bytes),
                        if n.full { " (full compare)" } else { "" }
                    );
                }
                s += &format!(
                    "rolling restart of {} nodes done in {:.1} s\n",
                    r.nodes.len(),
                    r.total_ms as f64 / 1000.0
                );
                s
            });
        }
        Cmd::Node(NodeCmd::Drain(a)) | Cmd::Node(NodeCmd::Remove(a)) => {
            let remove = matches!(&cli.cmd, Cmd::Node(NodeCmd::Remove(_)));
            let req = if remove {
                Request::NodeRemove {
                    id: a.id,
                    rate: a.rate,
                }
            } else {
                Request::NodeDrain {
                    id: a.id,
                    rate: a.rate,
                }
            };
            let job: MoveStatus = cc.call(&req).await.map_err(usage_if_remote)?;
            let job = if a.no_wait {
                job
            } else {
                wait_move(&mut cc, out, job).await?
            };
            if job.state != MoveState::Failed {
                print(out, &job, move_text);
            } else {
                return Err(CliError::Runtime(format!(
                    "node {} {}: {}",
                    job.node,
                    job.kind,
                    job.error.as_deref().unwrap_or("failed")
                )));
            }
        }
        Cmd::Status { watch: None } => {
            let s: StatusReport = cc.call(&Request::Status).await?;
            print(out, &s, status_text);
        }
        Cmd::Status { watch: Some(every) } => {
            use std::io::{IsTerminal, Write};
            let every = (*every).max(std::time::Duration::from_millis(100));
            let tty = std::io::stdout().is_terminal();
            loop {
                // The control port closes a connection idle for a minute: a slow watch
                // connects again.
                let s: StatusReport = match cc.call(&Request::Status).await {
                    Ok(s) => s,
                    Err(_) => {
                        cc = control_client(cli).await?;
                        cc.call(&Request::Status).await?
                    }
                };
                let mut o = std::io::stdout().lock();
                match out {
                    // One document per line: a stream a program can follow.
                    Output::Json => {
                        let _ = writeln!(o, "{}", serde_json::to_string(&s).expect("json"));
                    }
                    _ if tty => {
                        // Home, draw, then clear what the last, longer frame left below.
                        let _ = write!(
                            o,
                            "\x1b[H{}\x1b[J",
                            status_text(&s).replace('\n', "\x1b[K\n")
                        );
                    }
                    _ => {
                        let _ = writeln!(o, "{}", status_text(&s));
                    }
                }
                let _ = o.flush();
                drop(o);
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
            }
        }
        Cmd::Volume(VolumeCmd::Access { name, allow, deny }) => {
            if allow.is_empty() && deny.is_empty() {
                return Err(CliError::Usage(
                    "volume access: give --allow NAME or --deny NAME".into(),
                ));
            }
            let v: VolumeRecord = cc
                .call(&Request::VolumeAccess {
                    name: name.clone(),
                    allow: allow.clone(),
                    deny: deny.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                format!("volume {}: access {}\n", v.name, access_text(&v.access))
            });
        }
        Cmd::Volume(VolumeCmd::Set {
            name,
            min_copies,
            tier,
        }) => {
            if min_copies.is_none() && tier.is_none() {
                return Err(CliError::Usage(
                    "volume set: give --min-copies N or --tier auto|fast|slow".into(),
                ));
            }
            let v: VolumeRecord = cc
                .call(&Request::VolumeSet {
                    name: name.clone(),
                    min_copies: *min_copies,
                    tier: tier.map(|t| t.policy()),
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                format!(
                    "volume {}: min copies {}, tier {}\n",
                    v.name,
                    v.min_copies(),
                    v.tier.as_str()
                )
            });
        }
        Cmd::Volume(VolumeCmd::Create {
            name,
            size,
            replicas,
            allow,
            min_copies,
            tier,
        }) => {
            let v: VolumeRecord = cc
                .call(&Request::VolumeCreate {
                    name: name.clone(),
                    size: *size,
                    replicas: *replicas as usize,
                    access: (!allow.is_empty()).then(|| allow.clone()),
                    min_copies: *min_copies,
                    tier: Some(tier.policy()),
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                format!(
                    "created {} ({}), replicas on nodes {:?}\n",
                    v.name,
                    human(v.size),
                    nodes_of(v)
                )
            });
        }
        Cmd::Volume(VolumeCmd::List) => {
            let vs: Vec<VolumeRecord> = cc.call(&Request::VolumeList).await?;
            print(out, &vs, |vs| volumes_table(vs));
        }
        Cmd::Volume(VolumeCmd::Info { name }) => {
            let v: trireme_control::VolumeInfo = cc
                .call(&Request::VolumeInfo { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                let mut s = volumes_table(std::slice::from_ref(&v.record));
                if let Some(w) = &v.writer {
                    s += &format!("attached by {w}\n");
                }
                for l in &v.client_links {
                    s += &format!(
                        "attached by this cluster's process: link to node {} over {} ({})\n",
                        l.node, l.transport, l.peer
                    );
                }
                if !v.record.tier.is_auto() || !v.tiers.is_empty() {
                    s += &format!("tier: {}\n", v.record.tier.as_str());
                }
                for t in &v.tiers {
                    s += &format!("{}\n", replica_tier_text(t));
                }
                s
            });
        }
        Cmd::Volume(VolumeCmd::Delete { name }) => {
            let v: VolumeRecord = cc
                .call(&Request::VolumeDelete { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| format!("deleted {}\n", v.name));
        }
        Cmd::Volume(VolumeCmd::Scrub { name, region }) => {
            let req = Request::VolumeScrub {
                name: name.clone(),
                region: *region,
            };
            let call = cc.call::<trireme_client::ScrubReport>(&req);
            // The scrub runs in the writer's process: its progress comes through `status`.
            let pick = |st: &StatusReport| {
                st.volumes
                    .iter()
                    .find(|v| v.name == *name)
                    .and_then(|v| v.scrub.as_ref())
                    .map(|p| (p.done_bytes, p.total_bytes))
            };
            let r = with_progress(cli, &format!("scrub {name}"), call, pick)
                .await
                .map_err(usage_if_remote)?;
            print(out, &r, |r| {
                let mut s = format!(
                    "volume {}: scrubbed {} on nodes {:?}: {} region(s) differed ({} bad copies by checksum), {} copy(ies) repaired, {} without a majority\n",
                    r.volume,
                    human(r.bytes_compared),
                    r.replicas,
                    r.mismatched_regions,
                    r.bad_copies,
                    r.repaired.len(),
                    r.unresolved.len()
                );
                for (off, node) in &r.repaired {
                    s += &format!("  repaired offset {off} on node {node}\n");
                }
                for off in &r.unresolved {
                    s += &format!("  no majority at offset {off}: left alone\n");
                }
                s
            });
            if !r.unresolved.is_empty() {
                return Err(CliError::Runtime(format!(
                    "{} region(s) differ with no majority copy",
                    r.unresolved.len()
                )));
            }
        }
        Cmd::Volume(VolumeCmd::Verify { name, region }) => {
            let info: trireme_client::AttachInfo = cc
                .call(&Request::Locate { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            let vol =
                trireme_client::Volume::connect(info, trireme_transport::TransportKind::Tcp, 1)
                    .await?;
            let mut bar = crate::progress::Progress::new(
                &format!("verify {name}"),
                vol.size(),
                out == Output::Text,
            );
            let r =
                trireme_client::verify_replicas_with(&vol, *region, &mut |done, _| bar.set(done))
                    .await?;
            bar.finish();
            print(out, &r, |r| {
                let mut s = format!(
                    "volume {}: compared {} across replicas on nodes {:?}: {} mismatching region(s)\n",
                    r.volume,
                    human(r.bytes_compared),
                    r.replicas,
                    r.mismatches.len()
                );
                for m in &r.mismatches {
                    s += &format!(
                        "  offset {} length {}: (node, crc32c) {:?}",
                        m.offset, m.length, m.checksums
                    );
                    if !m.bad_copies.is_empty() {
                        s += &format!(
                            ", bad copy (fails block checksums) on nodes {:?}",
                            m.bad_copies
                        );
                    }
                    s += "\n";
                }
                s
            });
            if !r.mismatches.is_empty() {
                return Err(CliError::Runtime(format!(
                    "{} region(s) differ between replicas",
                    r.mismatches.len()
                )));
            }
        }
        Cmd::Up(_)
        | Cmd::Nbd(_)
        | Cmd::Attach(_)
        | Cmd::Bench(_)
        | Cmd::Ca(_)
        | Cmd::Node(NodeCmd::Serve(_))
        | Cmd::Node(NodeCmd::Run(_)) => {
            unreachable!("dispatched in run()")
        }
    }
    Ok(())
}

/// A refusal from the manager about the request itself (unknown volume, bad size) is a usage
/// error; anything else is a runtime failure.
fn usage_if_remote(e: trireme_control::ControlError) -> CliError {
    match e {
        trireme_control::ControlError::Remote(m)
        | trireme_control::ControlError::NotOnRecord { message: m, .. } => CliError::Usage(m),
        e => CliError::Runtime(e.to_string()),
    }
}

fn nodes_of(v: &VolumeRecord) -> Vec<u32> {
    v.replicas.iter().map(|r| r.node).collect()
}

fn nodes_table(nodes: &[NodeStatus]) -> String {
    let mut s = format!(
        "{:<5} {:<22} {:<7} {:<13} {:<9} {:<9} {}\n",
        "NODE", "ADDRESS", "STORE", "STATE", "TRANSPORT", "PING", "REPLICAS"
    );
    for n in nodes {
        let ping = n.ping_us.map_or("-".into(), |p| format!("{p} us"));
        let state = match (n.up, n.state) {
            (_, trireme_meta::NodeState::Removed) => "removed".to_string(),
            (up, trireme_meta::NodeState::Draining) => {
                format!("{}/draining", if up { "up" } else { "down" })
            }
            (true, _) => "up".to_string(),
            (false, _) => "down".to_string(),
        };
        s += &format!(
            "{:<5} {:<22} {:<7} {:<13} {:<9} {:<9} {}\n",
            n.id, n.addr, n.store, state, n.transport, ping, n.replicas
        );
        if let Some(t) = &n.tiers {
            s += &format!("      {}\n", node_tiers_text(t));
        }
    }
    s
}

/// A node's tiers in one line.
fn node_tiers_text(t: &trireme_control::NodeTierStatus) -> String {
    format!(
        "tiers: fast {} of {} used, slow {} used {}; {} extents; migrating {}/s (up to {}/s), {} moved",
        human(t.fast_used),
        human(t.fast_capacity),
        human(t.slow_used),
        t.disk_model
            .as_deref()
            .map_or("on a real disk".to_string(), |m| format!("behind a {m}")),
        human(t.extent),
        human(t.migrating_per_s),
        human(t.migrate_rate),
        human(t.migrated_bytes)
    )
}

/// A replica's tiers in one line.
fn replica_tier_text(t: &trireme_control::ReplicaTierStatus) -> String {
    format!(
        "tier on node {}: {} extents fast, {} slow (pin {}); reads {} fast, {} slow, hit ratio {}; {} promoted, {} demoted",
        t.node,
        t.fast_extents,
        t.slow_extents,
        t.pin.as_str(),
        t.reads_fast,
        t.reads_slow,
        t.hit_ratio.map_or("-".to_string(), |h| format!("{h:.3}")),
        t.promotions,
        t.demotions
    )
}

/// An access list as `status` and `volume info` print it.
fn access_text(a: &[String]) -> String {
    if a.is_empty() {
        "nodes and operators only".to_string()
    } else if a.iter().any(|c| c == trireme_meta::ANY_CLIENT) {
        "every client".to_string()
    } else {
        a.join(", ")
    }
}

fn volumes_table(vs: &[VolumeRecord]) -> String {
    let mut s = format!(
        "{:<16} {:<6} {:<10} {:<6} {:<24} {}\n",
        "VOLUME", "ID", "SIZE", "EPOCH", "REPLICAS (node: state)", "ACCESS"
    );
    for v in vs {
        let reps: Vec<String> = v
            .replicas
            .iter()
            .map(|r| format!("{}: {}", r.node, r.state))
            .collect();
        s += &format!(
            "{:<16} {:<6} {:<10} {:<6} {:<24} {}\n",
            v.name,
            v.id,
            human(v.size),
            v.epoch,
            reps.join(", "),
            access_text(&v.access)
        );
    }
    s
}

fn status_text(s: &StatusReport) -> String {
    let up = s.nodes.iter().filter(|n| n.up).count();
    let mut out = format!("nodes: {up} of {} up\n", s.nodes.len());
    out += &nodes_table(&s.nodes);
    for m in &s.moves {
        out += &move_text(m);
    }
    if let Some(m) = &s.manager {
        out += &format!(
            "\nmanager: node {} (pid {} on {}), control API at {}\n",
            m.node, m.pid, m.host, m.control
        );
    }
    out += &format!("\nvolumes: {}\n", s.volumes.len());
    out += &format!(
        "{:<16} {:<10} {:<6} {}\n",
        "VOLUME", "SIZE", "EPOCH", "REPLICAS"
    );
    for v in &s.volumes {
        let reps: Vec<String> = v
            .replicas
            .iter()
            .map(|r| match r.allocated_bytes {
                Some(a) => format!(
                    "node {} {} ({} allocated, epoch {})",
                    r.node,
                    r.state,
                    human(a),
                    r.epoch.unwrap_or(0)
                ),
                None => format!("node {} {}", r.node, r.state),
            })
            .collect();
        out += &format!(
            "{:<16} {:<10} {:<6} {}\n",
            v.name,
            human(v.size),
            v.epoch,
            reps.join("; ")
        );
        if let Some(w) = &v.writer {
            out += &format!("{:<16} attached by {w}\n", "");
        }
        out += &format!("{:<16} access: {}\n", "", access_text(&v.access));
        if !v.tier.is_auto() {
            out += &format!("{:<16} pinned to the {} tier\n", "", v.tier.as_str());
        }
        for t in v.replicas.iter().filter_map(|r| r.tier.as_ref()) {
            out += &format!("{:<16} {}\n", "", replica_tier_text(t));
        }
        if v.writes_suspended {
            let in_sync = v
                .replicas
                .iter()
                .filter(|r| r.state == trireme_control::ReplicaStatusState::InSync)
                .count();
            out += &format!(
                "{:<16} WRITES SUSPENDED: {in_sync} in-sync copies, minimum {} (they resume when a copy is back, or with `trireme volume set {} --min-copies N`)\n",
                "", v.min_copies, v.name
            );
        }
        for l in &v.client_links {
            let how = match (&l.lanes, &l.fallback) {
                (Some(lanes), _) => format!(" over {lanes}"),
                (None, Some(why)) => format!(" (UCX not used: {why})"),
                (None, None) => String::new(),
            };
            out += &format!(
                "{:<16} writer link to node {}: {} {} ({} streams){how}\n",
                "", l.node, l.transport, l.peer, l.streams
            );
        }
        for r in &v.replicas {
            if let Some(p) = &r.resync {
                let pct = p.done_bytes as f64 * 100.0 / p.total_bytes.max(1) as f64;
                out += &format!(
                    "{:<16} resync to node {}: {} {:.1}% ({} of {}, {} copied, {}/s, ETA {})\n",
                    "",
                    r.node,
                    if p.full {
                        "full compare"
                    } else {
                        "incremental"
                    },
                    pct,
                    human(p.done_bytes),
                    human(p.total_bytes),
                    human(p.copied_bytes),
                    human(p.rate()),
                    p.eta_secs().map_or("-".to_string(), |s| format!("{s}s")),
                );
            }
        }
    }
    out
}

/// What `maintenance rolling` did.
#[derive(Debug, serde::Serialize)]
struct RollingReport {
    nodes: Vec<NodeRestartReport>,
    total_ms: u64,
}

fn restart_text(r: &NodeRestartReport) -> String {
    format!(
        "node {} restarted: down {:.1} s, back in sync after {:.1} s, {} resynced{} ({} volumes)",
        r.node,
        r.down_ms as f64 / 1000.0,
        r.total_ms as f64 / 1000.0,
        human(r.resynced_bytes),
        if r.full { ", full compare" } else { "" },
        r.volumes.len()
    )
}

/// Asks for a planned restart of node `id`. A manager asked to restart its own node hands its
/// role to another daemon first: the request then goes to the next manager (and `cc` with it).
async fn restart_node(
    cli: &Cli,
    cc: &mut ControlClient,
    id: u32,
) -> Result<NodeRestartReport, trireme_control::ControlError> {
    let t0 = std::time::Instant::now();
    loop {
        match cc.call(&Request::NodeRestart { id }).await {
            Err(trireme_control::ControlError::Elsewhere(why))
                if t0.elapsed() < std::time::Duration::from_secs(30) =>
            {
                tracing::info!("{why}");
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                match control_client(cli).await {
                    Ok(c) => *cc = c,
                    Err(e) => tracing::debug!("finding the next manager: {e:?}"),
                }
            }
            r => return r,
        }
    }
}

/// Runs `work`; meanwhile, with text output on a terminal, draws a progress line from `pick`
/// (bytes done, bytes in all) applied to `status`, asked every 100 ms on a second
/// connection. A pipe or `--output json` gets no line.
async fn with_progress<T>(
    cli: &Cli,
    label: &str,
    work: impl std::future::Future<Output = T>,
    pick: impl Fn(&StatusReport) -> Option<(u64, u64)>,
) -> T {
    use std::io::IsTerminal;
    if cli.output != Output::Text || !std::io::stderr().is_terminal() {
        return work.await;
    }
    let Ok(mut watcher) = control_client(cli).await else {
        return work.await;
    };
    let mut bar = crate::progress::Progress::new(label, 0, true);
    let watch = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let Ok(st) = watcher.call::<StatusReport>(&Request::Status).await else {
                continue;
            };
            if let Some((done, total)) = pick(&st) {
                bar.set_total(total);
                bar.set(done);
            }
        }
    };
    let r = tokio::select! {
        r = work => r,
        _ = watch => unreachable!("the watch loop does not end"),
    };
    bar.finish();
    r
}

/// The resyncs to node `id` in a status, summed: (bytes gone through, bytes in all).
fn resync_to(id: u32) -> impl Fn(&StatusReport) -> Option<(u64, u64)> {
    move |st| {
        let ps: Vec<_> = st
            .volumes
            .iter()
            .flat_map(|v| v.replicas.iter())
            .filter(|r| r.node == id)
            .filter_map(|r| r.resync.as_ref())
            .collect();
        (!ps.is_empty()).then(|| {
            (
                ps.iter().map(|p| p.done_bytes).sum(),
                ps.iter().map(|p| p.total_bytes).sum(),
            )
        })
    }
}

/// Waits until every replica of every volume is in sync (between two restarts).
async fn wait_in_sync(cc: &mut ControlClient) -> Result<(), CliError> {
    let t0 = std::time::Instant::now();
    loop {
        let s: StatusReport = cc.call(&Request::Status).await?;
        if s.volumes.iter().all(|v| {
            v.replicas
                .iter()
                .all(|r| r.state == trireme_control::ReplicaStatusState::InSync)
        }) {
            return Ok(());
        }
        if t0.elapsed() > std::time::Duration::from_secs(3600) {
            return Err(CliError::Runtime(
                "replicas not all in sync within an hour; rolling restart stopped".into(),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Polls `status` until the move job of `job.node` ends, showing its progress once a second
/// on a terminal (redrawn in place; nothing through a pipe or with `--output json`).
async fn wait_move(
    cc: &mut ControlClient,
    out: Output,
    job: MoveStatus,
) -> Result<MoveStatus, CliError> {
    use std::io::{IsTerminal, Write};
    let show = matches!(out, Output::Text) && std::io::stderr().is_terminal();
    let mut drawn = false;
    let result = loop {
        let s: StatusReport = cc.call(&Request::Status).await?;
        let Some(now) = s.moves.into_iter().find(|m| m.node == job.node) else {
            break Err(CliError::Runtime(format!(
                "the cluster lost track of the {} of node {} (restarted?)",
                job.kind, job.node
            )));
        };
        if now.state != MoveState::Running {
            break Ok(now);
        }
        if show {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[2K{}", move_text(&now).trim_end());
            let _ = e.flush();
            drawn = true;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    if drawn {
        eprint!("\r\x1b[2K");
    }
    result
}

fn move_text(m: &MoveStatus) -> String {
    let mut s = format!(
        "node {} {}: {} ({} of {} volumes moved",
        m.node, m.kind, m.state, m.volumes_done, m.volumes_total
    );
    if let Some(r) = m.rate {
        s += &format!(", rate limit {}/s", human(r));
    }
    s += ")";
    if let (Some(v), Some(to)) = (&m.volume, m.to) {
        s += &format!("; {v} -> node {to}");
        if let Some(p) = &m.progress {
            s += &format!(
                ": {} of {} ({:.1}%), {}/s, ETA {}",
                human(p.done_bytes),
                human(p.total_bytes),
                p.done_bytes as f64 * 100.0 / p.total_bytes.max(1) as f64,
                human(p.rate()),
                p.eta_secs().map_or("-".to_string(), |s| format!("{s}s"))
            );
        }
    }
    if let Some(e) = &m.error {
        s += &format!(": {e}");
    }
    s + "\n"
}

fn daemon_err(e: trireme_daemon::DaemonError) -> CliError {
    match e {
        trireme_daemon::DaemonError::Usage(m) => CliError::Usage(m),
        e if e.is_usage() => CliError::Usage(e.to_string()),
        e => CliError::Runtime(e.to_string()),
    }
}

fn node_config(cli: &Cli, a: &NodeServeArgs) -> Result<trireme_daemon::node::NodeConfig, CliError> {
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
        capacity: a.capacity,
        http: a.http.addr.0,
        http_token: a.http.token_file.clone(),
    })
}

/// A node serves TCP over mutual TLS, or in plain text only when told: a daemon that would
/// trust every peer says so at start, and is never that way by accident.
fn node_tls(tls_dir: Option<&std::path::Path>, insecure: bool) -> Result<(), CliError> {
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

async fn node_serve(cli: &Cli, a: &NodeServeArgs) -> Result<(), CliError> {
    node_tls(a.tls_dir.as_deref(), a.insecure)?;
    let node = trireme_daemon::node::build_node(&node_config(cli, a)?).map_err(daemon_err)?;
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
fn etcd_tls(cli: &Cli) -> Result<Option<trireme_meta::EtcdTls>, CliError> {
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
async fn etcd_meta(cli: &Cli) -> Result<trireme_meta::ClusterMeta, CliError> {
    let urls = cli.etcd.as_deref().ok_or_else(|| {
        CliError::Usage("this command needs --etcd URLS (or TRIREME_ETCD)".into())
    })?;
    let eps = trireme_meta::parse_endpoints(urls).map_err(|e| CliError::Usage(e.to_string()))?;
    let tls = etcd_tls(cli)?;
    let store = trireme_meta::EtcdMeta::connect(&eps, tls.as_ref()).await?;
    Ok(trireme_meta::ClusterMeta::new(Arc::new(store)))
}

async fn node_run(cli: &Cli, a: &crate::NodeRunArgs) -> Result<(), CliError> {
    node_tls(a.tls_dir.as_deref(), a.insecure)?;
    let meta = etcd_meta(cli).await?;
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
        capacity: a.capacity,
        http: a.http.addr.0,
        http_token: a.http.token_file.clone(),
    };
    let member = trireme_daemon::node::MemberConfig {
        zone: a.zone.clone(),
        lease_ttl: a.lease_ttl,
        control: a
            .control
            .unwrap_or_else(|| std::net::SocketAddr::new(a.listen.ip(), 0)),
        manager: trireme_daemon::manager_role::ManagerOptions {
            down_out: (!a.down_out_interval.is_zero()).then_some(a.down_out_interval),
            rate: a.recovery_rate,
            ..Default::default()
        },
    };
    trireme_daemon::node::run_member(cfg, member, meta)
        .await
        .map_err(daemon_err)
}

/// The NBD TCP listener, if `--listen` was given.
async fn bind_nbd(
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
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn catch() -> Result<Stop, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let err = |e: std::io::Error| CliError::Runtime(format!("signal handler: {e}"));
        Ok(Stop {
            term: signal(SignalKind::terminate()).map_err(err)?,
            int: signal(SignalKind::interrupt()).map_err(err)?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

async fn attach(cli: &Cli, a: &crate::AttachArgs) -> Result<(), CliError> {
    let stop = Stop::catch()?;
    let meta = etcd_meta(cli).await?;
    // TLS clients open the volume only if its access list names them.
    let access = trireme_daemon::access::AccessView::default();
    let follow = {
        let view = access.clone();
        tokio::spawn(trireme_daemon::access::follow(meta.clone(), move |vs| {
            view.set(&vs)
        }))
    };
    let tls = export_tls(&a.export, None)?.map(|t| t.gated(&access));
    let tcp = bind_nbd(a.export.listen).await?;
    let tcp_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());
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
    let att = trireme_daemon::attach::attach(meta, &cfg, uris.clone())
        .await
        .map_err(daemon_err)?;
    let tasks =
        trireme_daemon::export::serve(&att.volume, a.export.socket.as_deref(), tcp, tls.as_ref())
            .map_err(CliError::Runtime)?;
    let _http = writer_http(cli, &a.http, &att.volume, "attach").await?;
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

/// The HTTP endpoint of a process that writes a volume (`attach`, `nbd`): its metrics, at
/// the address written to `<data-dir>/ROLE-VOLUME.http` and printed on stderr, behind the data
/// directory's `http-token` unless `--http-token-file` names one.
async fn writer_http(
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

async fn nbd(cli: &Cli, a: &crate::NbdArgs) -> Result<(), CliError> {
    let stop = Stop::catch()?;
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
    let (vol, tasks) = trireme_daemon::export::export_local(
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
    let _http = writer_http(cli, &a.http, &vol, "nbd").await?;
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
    for t in tasks {
        t.abort();
    }
    if let Err(e) = vol.detach().await {
        tracing::error!("final flush and detach: {e}");
    }
    if let Some(p) = &a.export.socket {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}
