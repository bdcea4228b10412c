//! The storage daemon of one server.
//!
//! [`build_node`] opens the store and wraps it (seals, fault injection) — what both `trireme
//! node serve` (a node of `trireme up`) and `trireme node run` (a cluster member) serve.
//! [`run_member`] is the cluster member: it binds its data-path port first, registers under a
//! lease only if no other daemon holds its id (and only then opens its store, so a second
//! daemon of the same id never touches the first one's files), serves, keeps its lease, and
//! campaigns for the manager role. Losing the lease (etcd unreachable for a TTL) does not stop
//! the data path: the daemon re-registers when it can.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use trireme_meta::{AliveRecord, ClusterMeta, MetaError, NodeRecord, NodeState};
use trireme_node::UcxOffer;
use trireme_store::StoreKind;
use trireme_transport::TransportKind;

use crate::DaemonError;

/// What a node serves and how.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: u32,
    /// Directory of its store.
    pub dir: PathBuf,
    pub listen: SocketAddr,
    /// A same-host unix socket too (`trireme up`).
    pub socket: Option<PathBuf>,
    pub store: StoreKind,
    /// The tiers of a tiered store.
    pub tiers: Option<trireme_store::TierConfig>,
    pub dirty_grain: u64,
    /// Inject store errors at the rates in this file (fault tests).
    pub inject_faults: Option<PathBuf>,
    pub block_checksums: bool,
    /// Keep the activity log and dirty records on disk (stores that can: the file store).
    pub books: bool,
    pub transport: TransportKind,
    /// Bytes the node's replicas may hold; `None`: half the host's memory for a memory store,
    /// what the directory takes plus its share of the file system's free space for a file or
    /// tiered store (measured each time), no limit for the null store.
    pub capacity: Option<u64>,
    /// How many times its capacity the sizes of the node's (thin) replicas may sum to.
    pub overcommit: f64,
    /// How many nodes share the file system of its directory (`trireme up`'s do).
    pub fs_share: u32,
    /// Threads serving reads and writes of a store on disk ([`trireme_node::Node::set_io_threads`]).
    pub io_threads: usize,
    /// Recovery's share of the disk while clients want it all, in percent
    /// ([`trireme_node::Node::set_recovery_share`]).
    pub recovery_share: u32,
    /// Where it serves its metrics (and, while it is the manager, the dashboard); the bound
    /// address is written to `<dir>/http`.
    pub http: Option<SocketAddr>,
    /// The file holding the token its HTTP endpoint asks for (`None`: `<dir>/http-token`,
    /// made if missing).
    pub http_token: Option<PathBuf>,
}

/// Opens the node's store with its wrappers.
pub fn build_node(cfg: &NodeConfig) -> Result<Arc<trireme_node::Node>, DaemonError> {
    trireme_tls::local::private_dir(&cfg.dir)
        .map_err(|e| DaemonError::Usage(format!("--dir {}: {e}", cfg.dir.display())))?;
    let mut store = trireme_store::open_store(cfg.store, &cfg.dir, cfg.tiers)
        .map_err(|e| DaemonError::Runtime(e.to_string()))?;
    if let Some(t) = store.tiers() {
        tracing::info!(
            fast = crate::local::human(t.fast_capacity),
            migrate_rate = crate::local::human(t.migrate_rate),
            slow = t.disk_model.as_deref().unwrap_or("a real disk"),
            "tiers"
        );
    }
    // Every block written is sealed (crc32c over LBA, generation and bytes) and checked on
    // read; the file store keeps the seals beside its replicas. The null store holds nothing.
    match cfg.store {
        _ if !cfg.block_checksums => {
            tracing::warn!("block checksums are off: reads are not checked");
            // Seals from a sealed run would not match what this run writes.
            trireme_store::sealed::forget_all(&cfg.dir)
                .map_err(|e| DaemonError::Runtime(e.to_string()))?;
        }
        StoreKind::Null => {}
        StoreKind::Memory => store = Arc::new(trireme_store::SealedStore::new(store, None)),
        StoreKind::File | StoreKind::Tiered => {
            store = Arc::new(trireme_store::SealedStore::new(store, Some(&cfg.dir)))
        }
    }
    // Clones, then snapshots, keep their maps beside the replicas (in memory for a memory
    // store); a replica that is no clone, and one never snapshotted, passes straight through.
    // Clones sit under versions: they see physical blocks, so a clone's own snapshots work.
    let dir = (!cfg.store.volatile()).then_some(cfg.dir.as_path());
    if cfg.store != StoreKind::Null {
        store = Arc::new(trireme_store::BackedStore::new(store, dir));
        store = Arc::new(trireme_store::VersionedStore::new(store, dir));
    }
    if let Some(spec) = &cfg.inject_faults {
        tracing::warn!(spec = %spec.display(), "store errors will be injected (fault testing)");
        store = Arc::new(trireme_store::FaultyStore::new(store, spec));
    }
    let node = Arc::new(trireme_node::Node::with_dirty_grain(
        cfg.id,
        store,
        cfg.dirty_grain,
    ));
    if matches!(cfg.store, StoreKind::File | StoreKind::Tiered) {
        node.set_space_dir(cfg.dir.clone());
    }
    node.set_overcommit(cfg.overcommit);
    node.set_io_threads(cfg.io_threads);
    node.set_recovery_share(cfg.recovery_share);
    match cfg.capacity {
        Some(c) => node.set_capacity(c),
        None => match cfg.store {
            StoreKind::Null => {}
            StoreKind::Memory => node.set_capacity(memory_capacity()?),
            StoreKind::File | StoreKind::Tiered => node.measure_capacity(cfg.fs_share),
        },
    }
    let space = node.space();
    if cfg.books {
        node.keep_books();
    } else if !cfg.store.volatile() {
        tracing::warn!(
            "bookkeeping in memory only: a restart makes the next resync compare everything"
        );
    }
    tracing::info!(
        node = cfg.id,
        store = cfg.store.as_str(),
        replicas = node.replica_count(),
        capacity = match space.capacity {
            u64::MAX => "unlimited".to_string(),
            c if cfg.capacity.is_none() && space.fs_size > 0 => format!(
                "{} (what its directory takes and {} of the file system's free space)",
                crate::local::human(c),
                match cfg.fs_share {
                    1 => "all".to_string(),
                    n => format!("1/{n}"),
                }
            ),
            c => crate::local::human(c),
        },
        overcommit = cfg.overcommit,
        "node starting"
    );
    offer_ucx(&node, cfg.transport, cfg.listen.ip())?;
    Ok(node)
}

/// Half the host's memory: what replicas in memory may hold when no `--capacity` is given
/// (the rest is the system's).
fn memory_capacity() -> Result<u64, DaemonError> {
    // SAFETY: sysconf takes no pointers.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return Err(DaemonError::Runtime(
            "cannot tell the host's memory size; give --capacity".into(),
        ));
    }
    Ok(pages as u64 * page as u64 / 2)
}

/// Starts UCX for the node unless `--transport tcp`, and offers its worker address to clients.
/// UCX's network lanes are kept to the device that holds the listen address.
fn offer_ucx(
    node: &Arc<trireme_node::Node>,
    kind: TransportKind,
    ip: std::net::IpAddr,
) -> Result<(), DaemonError> {
    if kind == TransportKind::Tcp {
        node.set_ucx(UcxOffer::Unavailable(
            "the node runs with --transport tcp".into(),
        ));
        return Ok(());
    }
    let net_devices = std::env::var("TRIREME_UCX_NET_DEVICES")
        .ok()
        .or_else(|| trireme_transport::ucx::device_of(ip));
    trireme_transport::ucx::configure(trireme_transport::ucx::Config {
        tls: std::env::var("TRIREME_UCX_TLS").ok(),
        net_devices,
        ..Default::default()
    });
    match trireme_transport::ucx::Hub::get() {
        Ok(hub) => {
            node.set_ucx(UcxOffer::Address(hub.address().to_vec()));
            hub.serve(node.clone());
            tracing::info!(node = node.id(), config = ?hub.config(), "UCX offered");
            Ok(())
        }
        Err(e) if kind == TransportKind::Ucx => Err(DaemonError::Runtime(format!(
            "--transport ucx, but UCX cannot start: {e}"
        ))),
        Err(e) => {
            tracing::warn!(node = node.id(), "UCX cannot start, TCP only: {e}");
            node.set_ucx(UcxOffer::Unavailable(format!(
                "UCX cannot start on the node: {e}"
            )));
            Ok(())
        }
    }
}

/// How a node daemon takes part in the cluster.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// Failure domain; a volume's copies go to distinct zones when there are enough.
    pub zone: Option<String>,
    /// What the node serves flat out, in 8 KiB units a second; reserves are checked against it.
    pub iops_capacity: Option<u64>,
    /// TTL of the daemon's lease: how long after it dies (or loses etcd) it is shown down and
    /// another daemon may take over the manager role.
    pub lease_ttl: Duration,
    /// Where the control API listens while this daemon holds the manager role.
    pub control: SocketAddr,
    pub manager: crate::manager_role::ManagerOptions,
}

/// Holds `<dir>/node.lock` for the life of the process: two daemons never share a store
/// directory, whatever ids they were given.
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, DaemonError> {
    use std::os::fd::AsRawFd;
    trireme_tls::local::private_dir(dir)
        .map_err(|e| DaemonError::Usage(format!("--dir {}: {e}", dir.display())))?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("node.lock"))?;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(DaemonError::Usage(format!(
            "{} is in use by another node daemon",
            dir.display()
        )));
    }
    Ok(f)
}

/// Runs a cluster member until SIGTERM or Ctrl-C. Prints `listening ADDR` once registered.
pub async fn run_member(
    cfg: NodeConfig,
    member: MemberConfig,
    meta: ClusterMeta,
) -> Result<(), DaemonError> {
    if cfg.listen.ip().is_unspecified() {
        return Err(DaemonError::Usage(format!(
            "--listen {}: name the address other servers reach this one at (it is registered)",
            cfg.listen
        )));
    }
    // Where this binary was started from, to start again on a planned restart (a binary
    // upgraded in place since is the one started).
    let exe = std::env::current_exe()?;
    let _lock = lock_dir(&cfg.dir)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| DaemonError::Runtime(format!("listen on {}: {e}", cfg.listen)))?;
    let addr = listener.local_addr()?;
    let control = tokio::net::TcpListener::bind(member.control)
        .await
        .map_err(|e| DaemonError::Runtime(format!("control listen on {}: {e}", member.control)))?;
    let control_addr = control.local_addr()?;
    let http = match cfg.http {
        Some(a) => Some(crate::http::bind(a).await?),
        None => None,
    };
    let http_addr = match &http {
        Some(l) => Some(l.local_addr()?.to_string()),
        None => None,
    };

    let ttl = member.lease_ttl.max(crate::lease::MIN_TTL);
    let alive = AliveRecord {
        id: cfg.id,
        addr: addr.to_string(),
        host: crate::hostname(),
        pid: std::process::id(),
    };
    let lease = register(&meta, &cfg, &member, &alive, http_addr.clone(), ttl).await?;
    tracing::info!(node = cfg.id, %addr, lease, "registered");

    let node = build_node(&cfg)?;
    {
        use std::io::Write;
        let mut o = std::io::stdout();
        let _ = writeln!(o, "listening {addr}");
        let _ = o.flush();
    }
    // Every volume's access list, writer and epoch, and the cluster's members, read before
    // the node serves and kept current: until they are read, clients reach nothing (nodes and
    // operators still do).
    crate::access::first_node_policies(&meta, &node).await;
    let access = tokio::spawn(crate::access::follow_node(meta.clone(), node.clone()));
    let serve = trireme_transport::tcp::serve(listener, node.clone());

    // The lease, kept (and re-taken after a loss) in the background; the manager role follows it.
    let (lease_tx, lease_rx) = tokio::sync::watch::channel(Some(lease));
    let mut keeper = {
        let (meta, cfg, member, alive, http_addr) = (
            meta.clone(),
            cfg.clone(),
            member.clone(),
            alive.clone(),
            http_addr.clone(),
        );
        tokio::spawn(async move {
            let mut lease = lease;
            loop {
                crate::lease::keep(&**meta.store(), lease, ttl).await;
                let _ = lease_tx.send(None);
                // Taken as lost here may still be alive in etcd: end it, so the key frees.
                while let Err(e) = meta.store().revoke(lease).await {
                    tracing::debug!("revoking the lost lease: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                match register(&meta, &cfg, &member, &alive, http_addr.clone(), ttl).await {
                    Ok(l) => {
                        tracing::info!(node = cfg.id, lease = l, "registered again");
                        lease = l;
                        let _ = lease_tx.send(Some(l));
                    }
                    Err(e) => {
                        // Another daemon holds this id now: this one must not serve.
                        tracing::error!(node = cfg.id, "cannot register again: {e}");
                        return e;
                    }
                }
            }
        })
    };
    let (current_tx, current) = tokio::sync::watch::channel(None);
    let _http = match http {
        Some(l) => Some(crate::http::serve(
            l,
            crate::http::HttpSources {
                node: Some(node.clone()),
                manager: Some(current),
                writers: Vec::new(),
                meta: Some(meta.clone()),
                beside: None,
            },
            crate::http::Token::for_dir(cfg.http_token.as_deref(), &cfg.dir)?,
            Some(&cfg.dir.join("http")),
        )?),
        None => None,
    };
    let role = tokio::spawn(crate::manager_role::run(
        meta.clone(),
        lease_rx.clone(),
        trireme_meta::ManagerRecord {
            node: cfg.id,
            control: control_addr.to_string(),
            host: alive.host.clone(),
            pid: alive.pid,
            http: http_addr.clone(),
        },
        control,
        member.manager.clone(),
        current_tx,
    ));

    let restart = follow_restart_orders(meta.clone(), cfg.id, lease_rx.clone());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut restarting = false;
    let mut keeper_ended = false;
    let outcome = tokio::select! {
        r = serve => r.map_err(|e| DaemonError::Runtime(format!("node {}: serving {addr}: {e}", cfg.id))),
        r = &mut keeper => {
            keeper_ended = true;
            Err(match r {
                Ok(e) => e,
                Err(e) => DaemonError::Runtime(format!("lease keeper: {e}")),
            })
        }
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = restart => {
            tracing::info!(node = cfg.id, "planned restart: stopping, then starting again");
            restarting = true;
            Ok(())
        }
        why = left_the_cluster(meta.clone(), cfg.id) => {
            tracing::error!(node = cfg.id, "{why}");
            Err(DaemonError::Runtime(why))
        }
    };
    role.abort();
    access.abort();
    // No registration after this (one racing the stop would outlive it, under a new lease).
    if !keeper_ended {
        keeper.abort();
        let _ = keeper.await;
    }
    // Give the lease back at once: the node is shown down and the manager role (if this
    // daemon held it) passes on without waiting for the TTL.
    let held = *lease_rx.borrow();
    if let Some(l) = held {
        let _ = tokio::time::timeout(Duration::from_secs(2), meta.store().revoke(l)).await;
    }
    let n = node.clone();
    let _ = tokio::task::spawn_blocking(move || n.close_all()).await;
    tracing::info!(node = cfg.id, "node stopped");
    if restarting {
        drop(_lock);
        return Err(start_again(&exe));
    }
    outcome
}

/// How often a node daemon checks it is still a member ([`left_the_cluster`]).
const MEMBERSHIP_CHECK: Duration = Duration::from_secs(2);

/// Returns, saying why, once node `id` is no member any more: its record says removed, or
/// etcd refuses its identity twice in a row (`node remove` and `ca revoke` delete its etcd
/// user). A daemon that went on would keep its lease alive, and the manager role with it,
/// while every write it tried was refused.
async fn left_the_cluster(meta: ClusterMeta, id: u32) -> String {
    let mut denied = 0;
    loop {
        tokio::time::sleep(MEMBERSHIP_CHECK).await;
        match meta.nodes().await {
            Ok(ns)
                if ns
                    .iter()
                    .any(|n| n.id == id && n.state == NodeState::Removed) =>
            {
                return format!("node {id} was removed from the cluster: stopping for good");
            }
            Ok(_) => denied = 0,
            Err(MetaError::Denied(m)) => {
                denied += 1;
                if denied >= 2 {
                    return format!(
                        "etcd refuses this node's identity ({m}): node {id} was removed or its \
                         certificate revoked; stopping"
                    );
                }
            }
            Err(_) => {}
        }
    }
}

/// Returns when the manager orders this daemon (the one registered under the lease `lease`
/// holds now) to restart: see [`trireme_meta::RestartOrder`].
async fn follow_restart_orders(
    meta: ClusterMeta,
    id: u32,
    lease: tokio::sync::watch::Receiver<Option<trireme_meta::kv::LeaseId>>,
) {
    let key = ClusterMeta::restart_key(id);
    loop {
        let (now, rev) = crate::keys::read(&meta, &key).await;
        if let Some(kv) = now {
            match serde_json::from_slice::<trireme_meta::RestartOrder>(&kv.value) {
                Ok(o) if Some(o.lease) == *lease.borrow() => return,
                Ok(_) => {}
                Err(e) => tracing::warn!("ignoring a restart order that does not decode: {e}"),
            }
        }
        crate::keys::changed(&meta, &key, rev).await;
    }
}

/// Replaces this process with a new run of the same command (same pid, arguments and
/// environment; sockets and locks close on exec). Returns only if that fails.
fn start_again(exe: &std::path::Path) -> DaemonError {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let _ = std::io::stdout().flush();
    let e = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    DaemonError::Runtime(format!(
        "planned restart: cannot start {} again: {e}",
        exe.display()
    ))
}

/// Registers the daemon under a new lease (retrying while the store is unreachable), keeping
/// what the cluster decided about the node (draining) and refusing a removed one.
async fn register(
    meta: &ClusterMeta,
    cfg: &NodeConfig,
    member: &MemberConfig,
    alive: &AliveRecord,
    http: Option<String>,
    ttl: Duration,
) -> Result<trireme_meta::kv::LeaseId, DaemonError> {
    loop {
        let lease = crate::lease::grant(&**meta.store(), ttl).await?;
        let known = match meta.nodes().await {
            Ok(ns) => ns.into_iter().find(|n| n.id == cfg.id),
            Err(MetaError::Unavailable(_)) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let state = known.as_ref().map_or(NodeState::Active, |n| n.state);
        if state == NodeState::Removed {
            return Err(DaemonError::Usage(format!(
                "node {} was removed from the cluster; give this server a new --id",
                cfg.id
            )));
        }
        let rec = NodeRecord {
            id: cfg.id,
            addr: alive.addr.clone(),
            local_addr: None,
            store: cfg.store.as_str().to_string(),
            state,
            // A restart without --zone keeps the zone on record (a restart command that
            // dropped the flag must not take the server out of its failure domain).
            zone: member
                .zone
                .clone()
                .or_else(|| known.as_ref().and_then(|n| n.zone.clone())),
            http: http.clone(),
            // Likewise --iops-capacity (or what `node set` declared since).
            iops_capacity: member
                .iops_capacity
                .or_else(|| known.as_ref().and_then(|n| n.iops_capacity)),
        };
        if member.zone.is_none() {
            if let Some(z) = &rec.zone {
                tracing::info!(zone = %z, "no --zone given: keeping the zone on record");
            }
        }
        match meta.register_alive(alive, &rec, lease).await {
            Ok(()) => return Ok(lease),
            Err(MetaError::Unavailable(m)) => {
                tracing::warn!("registering: {m}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(MetaError::Refused(m)) => {
                let _ = meta.store().revoke(lease).await;
                // A daemon of this id that died on this host (kill -9, then a restart by
                // systemd) leaves its key until its lease expires: wait for that.
                let holder = meta
                    .alive()
                    .await
                    .ok()
                    .and_then(|a| a.get(&cfg.id).cloned());
                match holder {
                    // This very process before it started its binary again in place (a planned
                    // restart): nobody keeps that lease alive any more.
                    Some(h) if h.host == alive.host && h.pid == alive.pid => {
                        tracing::info!(
                            node = cfg.id,
                            "this daemon's registration from before its restart in place; waiting for its lease to expire"
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Some(h) if h.host == alive.host && !trireme_kernel::process::alive(h.pid) => {
                        tracing::info!(
                            node = cfg.id,
                            pid = h.pid,
                            "the previous daemon of this node died; waiting for its lease to expire"
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                    Some(_) => return Err(DaemonError::Usage(m)),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}
