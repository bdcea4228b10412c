//! The local supervisor of `trireme up`: a whole cluster on this host, in the foreground, on
//! the embedded metadata store. It spawns one `trireme node serve` process per node (in a
//! network namespace each, if asked), restarts those that die as systemd would, runs the
//! manager and the control API in this process, and serves the volume over NBD.
//!
//! Layout of the data directory:
//! * `meta.redb` — cluster metadata (nodes, volumes, epochs); `up.lock` — one `up` per directory.
//! * `node-N/` — node N's store; `node-N.log` — its log.
//! * `control.sock` — the control API; `nbd.sock` — the NBD unix socket.
//! * `exports` — the NBD URIs, one per line, written once they accept connections.
//! * `pids` — `node-N PID` lines and `up PID`, so a benchmark can find the storage processes.
//! * `http` — where this process serves metrics and the dashboard (`--http`); each node's
//!   endpoint is in `node-N/http` and in its node record.

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use trireme_control::{Manager, ManagerError};
use trireme_meta::{ClusterMeta, EmbeddedMeta, NodeState};

use crate::DaemonError;

mod supervisor;
use supervisor::*;

/// The client name of the credentials `up` writes for this host's NBD clients (`tls/client`).
pub const LOCAL_CLIENT: &str = "local";

/// A node's network namespace and address (`--node-netns NS@ADDR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNetns {
    pub name: String,
    pub addr: std::net::IpAddr,
}

/// What `trireme up` runs.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    pub data_dir: PathBuf,
    /// The manager's scrub schedule.
    pub scrub: trireme_control::ScrubSchedule,
    pub nodes: u32,
    pub replicas: u32,
    /// How the volume is kept: a mirror of `replicas` copies, or parity.
    pub layout: trireme_replication::Layout,
    pub size: u64,
    pub volume: String,
    /// The store kind every node uses (`file`, `memory`, ...).
    pub store: String,
    /// Every node's tiers, with `--store tiered`.
    pub tiers: Option<trireme_store::TierConfig>,
    /// NBD TCP port on 127.0.0.1.
    pub port: u16,
    pub dirty_grain: u64,
    /// Each node's `--io-threads`.
    pub io_threads: u32,
    /// Each node's `--recovery-share`.
    pub recovery_share: u32,
    /// Each node's `--capacity`.
    pub node_capacity: Option<u64>,
    /// Each node's `--overcommit`.
    pub overcommit: f64,
    /// Reserve the volume's whole space at creation (thick).
    pub preallocate: bool,
    pub inject_faults: bool,
    pub restart_backoff: Duration,
    /// Per node (index id-1): the network namespace it runs in; empty: none.
    pub node_netns: Vec<NodeNetns>,
    pub no_block_checksums: bool,
    pub volatile_bookkeeping: bool,
    /// The `--log` filter handed to node processes.
    pub log: String,
    /// The cluster's transport (`--transport` of the node processes), and per-node exceptions.
    pub transport: String,
    pub node_transport: Vec<(u32, String)>,
    /// How the NBD export's volume client runs.
    pub volume_opts: trireme_client::VolumeOptions,
    /// Serve the volume over NVMe/TCP here too (`up --nvmf`).
    pub nvmf: Option<std::net::SocketAddr>,
    /// Plain text on every TCP link: the NBD export and the data path to the nodes (otherwise
    /// TLS only, with the credentials in `<data-dir>/tls/`).
    pub insecure: bool,
    /// Where this process serves metrics and the dashboard (`None`: nowhere; the nodes then
    /// serve no metrics either).
    pub http: Option<std::net::SocketAddr>,
}

/// The cluster CA of `trireme up` in `<data-dir>/tls/ca` (created at the first start), a server
/// certificate for this host's names (issued at every start) in `tls/server`, client
/// credentials for this host's NBD clients in `tls/client` (kept once issued), a certificate
/// per node for the addresses it listens on (`tls/node-N`, every start), and this process's own
/// (`tls/up`: the manager's and the writer's links to the nodes), put to use at once.
fn local_tls(
    dir: &Path,
    nodes: u32,
    netns: &[NodeNetns],
) -> Result<crate::export::ExportTls, DaemonError> {
    use trireme_tls::{Ca, Identity, Role, San};
    let tls = dir.join("tls");
    let err = |e: trireme_tls::TlsError| DaemonError::Runtime(e.to_string());
    let (ca, new) = Ca::open_or_init(&tls.join("ca")).map_err(err)?;
    if new {
        tracing::info!(dir = %tls.join("ca").display(), "created the cluster CA");
    }
    let mut names = vec![
        San::Ip(std::net::Ipv4Addr::LOCALHOST.into()),
        San::Dns("localhost".into()),
    ];
    if let Ok(h) = crate::hostname().parse::<San>() {
        if !names.contains(&h) {
            names.push(h);
        }
    }
    ca.issue(&Role::Server, &names)
        .and_then(|i| i.write(&tls.join("server")))
        .map_err(err)?;
    let client = tls.join("client");
    if Identity::load(&client, "client").is_err() {
        ca.issue(&Role::Client(LOCAL_CLIENT.into()), &[])
            .and_then(|i| i.write(&client))
            .map_err(err)?;
    }
    for id in 1..=nodes {
        let mut names = vec![San::Ip(std::net::Ipv4Addr::LOCALHOST.into())];
        if let Some(n) = netns.get(id as usize - 1) {
            names.push(San::Ip(n.addr));
        }
        ca.issue(&Role::Node(id), &names)
            .and_then(|i| i.write(&tls.join(format!("node-{id}"))))
            .map_err(err)?;
    }
    // The manager's and operators' identity: every node operation, every volume.
    ca.issue(&Role::Admin, &[])
        .and_then(|i| i.write(&tls.join("up")))
        .map_err(err)?;
    crate::use_tls(&tls.join("up"), Some("admin"), false)?;
    crate::export::ExportTls::load(&tls.join("server"), Some(client)).map_err(DaemonError::Runtime)
}

/// The control API's socket in a data directory.
pub fn control_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

pub use trireme_control::human;

fn lock_dir(dir: &Path) -> Result<std::fs::File, DaemonError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("up.lock"))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(DaemonError::Usage(format!(
            "another `trireme up` is running on {}",
            dir.display()
        )));
    }
    Ok(f)
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

/// Runs the cluster until SIGTERM or Ctrl-C, then stops it in order: the NBD export flushes and
/// detaches, the nodes get SIGTERM.
pub async fn run(a: &LocalConfig) -> Result<(), DaemonError> {
    let width = a.layout.nodes(a.replicas as usize) as u32;
    if width > a.nodes {
        let what = match a.layout {
            trireme_replication::Layout::Parity(p) => format!("--parity {}+{}", p.data, p.parity),
            _ => format!("--replicas {}", a.replicas),
        };
        return Err(DaemonError::Usage(format!(
            "{what} needs at least {width} nodes, but --nodes is {}",
            a.nodes
        )));
    }
    if a.size == 0 || !a.size.is_multiple_of(4096) {
        return Err(DaemonError::Usage(format!(
            "--size {} must be a non-zero multiple of 4096",
            a.size
        )));
    }
    trireme_meta::check_name(&a.volume).map_err(|e| DaemonError::Usage(e.to_string()))?;
    trireme_tls::local::private_dir(&a.data_dir)
        .map_err(|e| DaemonError::Usage(format!("--data-dir {}: {e}", a.data_dir.display())))?;
    let dir: PathBuf = std::fs::canonicalize(&a.data_dir)?;
    let _lock = lock_dir(&dir)?;
    let meta = ClusterMeta::new(Arc::new(EmbeddedMeta::open(&dir.join("meta.redb"))?));
    let store = a.store.as_str();
    match meta.setting("store").await? {
        Some(s) if s != store => {
            return Err(DaemonError::Usage(format!(
                "{} holds a cluster created with --store {s}; start it with --store {s} or use another --data-dir",
                dir.display()
            )))
        }
        Some(_) => {}
        None => meta.set_setting("store", store).await?,
    }
    if !a.node_netns.is_empty() && a.node_netns.len() != a.nodes as usize {
        return Err(DaemonError::Usage(format!(
            "--node-netns is given {} time(s); give it once per node ({})",
            a.node_netns.len(),
            a.nodes
        )));
    }
    if let Some((n, _)) = a
        .node_transport
        .iter()
        .find(|(n, _)| *n == 0 || *n > a.nodes)
    {
        return Err(DaemonError::Usage(format!(
            "--node-transport names node {n}; nodes are 1 to {}",
            a.nodes
        )));
    }
    let known = meta.nodes().await?.len() as u32;
    if known != 0 && known != a.nodes {
        return Err(DaemonError::Usage(format!(
            "{} holds a cluster of {known} nodes; start it with --nodes {known} or use another --data-dir",
            dir.display()
        )));
    }
    let tcp = tokio::net::TcpListener::bind(("127.0.0.1", a.port))
        .await
        .map_err(|e| {
            DaemonError::Runtime(format!(
                "NBD port 127.0.0.1:{}: {e} (pick another with --port)",
                a.port
            ))
        })?;
    let tcp_addr = tcp.local_addr()?;
    let http = match a.http {
        Some(addr) => Some((
            crate::http::bind(addr).await?,
            crate::http::Token::load_or_create(&dir.join("http-token"))?,
        )),
        None => None,
    };

    // Identities, before any link to a node is made.
    let tls = if a.insecure {
        None
    } else {
        Some(local_tls(&dir, a.nodes, &a.node_netns)?)
    };

    // Nodes. The log files start fresh with each `up`; restarts append.
    for id in 1..=a.nodes {
        std::fs::File::create(dir.join(format!("node-{id}.log")))?;
    }
    let mut sup = Supervisor {
        nodes: std::collections::BTreeMap::new(),
        died: tokio::sync::mpsc::unbounded_channel(),
        dir: dir.clone(),
        store: store.to_string(),
        tiers: a.tiers,
        dirty_grain: a.dirty_grain,
        io_threads: a.io_threads,
        recovery_share: a.recovery_share,
        capacity: a.node_capacity,
        overcommit: a.overcommit,
        // A node in a network namespace still writes under --data-dir.
        fs_share: a.nodes,
        members: a.nodes,
        inject_faults: a.inject_faults,
        backoff: a.restart_backoff,
        netns: a.node_netns.clone(),
        no_block_checksums: a.no_block_checksums,
        volatile_bookkeeping: a.volatile_bookkeeping,
        node_transport: a.node_transport.clone(),
        log: a.log.clone(),
        transport: a.transport.clone(),
        tls: tls.is_some(),
        http: a.http.is_some(),
    };
    let removed: Vec<u32> = meta
        .nodes()
        .await?
        .into_iter()
        .filter(|n| n.state == NodeState::Removed)
        .map(|n| n.id)
        .collect();
    for id in (1..=a.nodes).filter(|id| !removed.contains(id)) {
        sup.spawn(id, &meta).await?;
    }
    sup.write_pids()?;

    // Control plane.
    let manager = Arc::new(Manager::new(meta.clone()));
    // A new volume is open to this host's client credentials (tls/client, named `local`)
    // until an operator names others.
    manager.set_default_access(if sup.tls {
        vec![LOCAL_CLIENT.to_string()]
    } else {
        trireme_meta::any_client()
    });
    manager.ensure_replicas().await?;
    manager.start_heartbeats(Duration::from_millis(500), Duration::from_secs(3));
    manager.start_trash_purge();
    manager.start_qos_shares();
    manager.start_finishing_deletes();
    manager.start_event_recorder();
    manager.start_scrub_schedule(a.scrub);
    let (ctl_tx, mut ctl_rx) = tokio::sync::mpsc::unbounded_channel();
    manager.set_supervisor(ctl_tx);
    let ctl = control_path(&dir);
    let _ = std::fs::remove_file(&ctl);
    let control_task = {
        let (m, p) = (manager.clone(), ctl.clone());
        tokio::spawn(async move { trireme_control::serve(&p, m).await })
    };
    for _ in 0..100 {
        if ctl.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The volume.
    match meta.volume(&a.volume).await {
        Ok(v) => {
            if v.size != a.size || v.replicas.len() != width as usize || v.layout != a.layout {
                tracing::warn!(
                    "volume {} already exists ({}, {}); keeping it as it is",
                    v.name,
                    human(v.size),
                    v.layout.summary(v.replicas.len())
                );
            }
        }
        Err(trireme_meta::MetaError::NoVolume(_)) => {
            let replicas = match a.layout.is_mirror() {
                true => a.replicas as usize,
                false => 0,
            };
            manager
                .create_volume_as(&a.volume, a.size, replicas, None, a.preallocate, a.layout)
                .await?;
        }
        Err(e) => return Err(e.into()),
    }

    // NBD. TLS clients open the volume only if its access list names them.
    let access = crate::access::AccessView::default();
    let follow = {
        let view = access.clone();
        tokio::spawn(crate::access::follow(meta.clone(), move |vs| view.set(&vs)))
    };
    // A change made through this manager applies before it is answered.
    {
        let view = access.clone();
        manager.on_access_change(move |vs| view.set(vs));
    }
    let tls = tls.map(|t| t.gated(&access));
    let sock = dir.join("nbd.sock");
    let (slot, nbd_tasks) = crate::export::export_local(
        &ctl,
        &a.volume,
        Some(&sock),
        Some(tcp),
        tls.as_ref(),
        a.volume_opts.clone(),
    )
    .await
    .map_err(DaemonError::Runtime)?;
    manager.register_client(slot.current());
    let take_back = tokio::spawn(crate::export::take_back(
        slot.clone(),
        manager.clone(),
        ctl.clone(),
        a.volume_opts.clone(),
    ));
    let reattach = tokio::spawn(crate::export::reattach_when_lost(
        slot.clone(),
        ctl.clone(),
        a.volume_opts.clone(),
        Some(manager.clone()),
    ));
    let nvmf = match a.nvmf {
        Some(listen) => {
            let (ex, l) =
                crate::nvmf::export_writer(&meta, &slot.slot, listen, "local", access.clone())
                    .await?;
            let line = format!("nvme/tcp {} {}", ex.port.addr, ex.nqn);
            let rec = crate::recorder::Recorder::Direct(meta.clone());
            let said = crate::nvmf::announce(rec, &ex, &a.volume, Duration::from_secs(10)).await?;
            Some((line, tokio::spawn(ex.port.clone().serve(l)), ex, said))
        }
        None => None,
    };
    // Before `exports` says the cluster is up: a SIGTERM from then on stops it cleanly (one
    // that came right after, before these, killed `up` with the default action).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Fault tests: SIGUSR2 tears down the writer's UCX path to the node named in
    // `<data-dir>/ucx-teardown` (calls in flight go on over TCP).
    let mut usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let uris = crate::export::uris(&a.volume, Some(&sock), Some(tcp_addr), tls.as_ref());
    write_atomically(&dir.join("exports"), &(uris.join("\n") + "\n"))?;
    let http = match http {
        Some((l, token)) => Some((
            crate::http::serve(
                l,
                crate::http::HttpSources {
                    node: None,
                    manager: Some(crate::http::always(manager.clone())),
                    writers: Vec::new(),
                    meta: None,
                    beside: Some(dir.clone()),
                },
                token.clone(),
                Some(&dir.join("http")),
            )?,
            token,
        )),
        None => None,
    };

    let v = &slot.current().info().clone();
    println!(
        "trireme: {} node(s), store {store}, volume {} ({}, {} replica(s) on nodes {:?}, epoch {}), data in {}",
        a.nodes,
        v.name,
        human(v.size),
        v.replicas.len(),
        v.replicas.iter().map(|r| r.node).collect::<Vec<_>>(),
        v.epoch,
        dir.display()
    );
    println!("NBD exports:");
    for u in &uris {
        println!("  {u}");
    }
    if let Some((line, ..)) = &nvmf {
        println!("NVMe/TCP export (hosts whose NQN is on the volume's access list):\n  {line}");
    }
    if let Some((h, token)) = &http {
        println!(
            "Dashboard: http://{0}/?token={1}\nMetrics: http://{0}/metrics and Prometheus targets: http://{0}/targets (Authorization: Bearer, the token in {2})",
            h.addr,
            token.as_str(),
            dir.join("http-token").display()
        );
    }
    println!("Press Ctrl-C to stop.");

    let (respawn_tx, mut respawn_rx) = tokio::sync::mpsc::unbounded_channel::<(u32, u64)>();
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = usr2.recv() => {
                let file = dir.join("ucx-teardown");
                match std::fs::read_to_string(&file).map(|s| s.trim().parse::<u32>()) {
                    Ok(Ok(node)) => {
                        let done = slot.current().drop_fast_path(node, "torn down on request (SIGUSR2)");
                        tracing::warn!(node, done, "UCX teardown requested");
                    }
                    _ => tracing::warn!(file = %file.display(), "SIGUSR2 without a node number in the file"),
                }
            }
            Some((id, generation, status)) = sup.died.1.recv() => {
                if let Some(wait) = sup.on_death(id, generation, &status) {
                    let tx = respawn_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        let _ = tx.send((id, generation));
                    });
                }
            }
            Some((id, generation)) = respawn_rx.recv() => {
                if sup.wants_respawn(id, generation) {
                    sup.respawn(id, &meta, &manager).await;
                }
            }
            Some(cmd) = ctl_rx.recv() => match cmd {
                trireme_control::NodeControl::Stop(id, reply) => {
                    let _ = reply.send(sup.stop(id).map_err(ManagerError::Refused));
                }
                trireme_control::NodeControl::Running(id, reply) => {
                    let _ = reply.send(sup.nodes.get(&id).is_some_and(|n| n.pid.is_some()));
                }
                trireme_control::NodeControl::Start(id, reply) => {
                    let r = match sup.nodes.get(&id) {
                        None => Err(format!("no node {id}")),
                        Some(n) if n.pid.is_some() => Err(format!("node {id} is already running")),
                        Some(_) => {
                            sup.respawn(id, &meta, &manager).await;
                            match sup.nodes.get(&id).and_then(|n| n.pid) {
                                Some(pid) => Ok(format!("node {id} started (pid {pid})")),
                                None => Err(format!("node {id} failed to start; see node-{id}.log")),
                            }
                        }
                    };
                    let _ = reply.send(r.map_err(ManagerError::Refused));
                }
            },
        }
    }

    println!("trireme: stopping");
    follow.abort();
    take_back.abort();
    reattach.abort();
    if let Some((_, task, ex, said)) = nvmf {
        // Hosts hold their I/O (no usable path) rather than see it fail in the detach.
        ex.ana.set(trireme_nvmf::ident::ana::INACCESSIBLE);
        task.abort();
        ex.port.shut();
        said.end().await;
    }
    for t in nbd_tasks {
        t.abort();
    }
    match tokio::time::timeout(Duration::from_secs(10), slot.current().detach()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("final flush and detach: {e}"),
        Err(_) => tracing::error!("final flush and detach did not finish in 10s"),
    }
    control_task.abort();
    let running: Vec<u32> = sup.nodes.values().filter_map(|n| n.pid).collect();
    for pid in &running {
        // SAFETY: kill(2) with a pid we spawned; no memory is involved.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut stopped = 0;
    while stopped < running.len() {
        match tokio::time::timeout_at(deadline, sup.died.1.recv()).await {
            Ok(Some(_)) => stopped += 1,
            _ => break,
        }
    }
    for f in ["exports", "nbd.sock", "control.sock", "pids"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    for id in sup.nodes.keys() {
        let _ = std::fs::remove_file(dir.join(format!("node-{id}.sock")));
    }
    Ok(())
}
