//! The manager role, held by one node daemon at a time.
//!
//! Every daemon runs [`run`]: while it holds its lease it campaigns (create the lease-bound
//! `manager` key if absent). The winner runs a [`Manager`] whose metadata handle is fenced by
//! that lease (every write compares it: a deposed manager writes nothing) and answers the
//! control API on its control port; the others watch the key and campaign again the moment it
//! is deleted (the holder stopped, or its lease expired). A holder gives the role up when its
//! lease is lost or the key is no longer its own. The control port stays bound on every
//! daemon; one that is not the manager answers with where the manager is.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use trireme_control::Manager;
use trireme_meta::kv::LeaseId;
use trireme_meta::{ClusterMeta, ManagerRecord, MetaError};

/// How often a node that etcd bars from the manager role asks again (an operator may let it
/// in with `etcd rbac --managers`).
const BARRED_RETRY: Duration = Duration::from_secs(5);

/// How the manager watches nodes.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// How often every node is pinged.
    pub heartbeat_every: Duration,
    /// A node silent this long is logged down (a node without its lease is down at once).
    pub down_after: Duration,
    /// A node down this long has its replicas re-created on other nodes (`None`: never).
    pub down_out: Option<Duration>,
    /// Copy rate limit for those re-creations (bytes per second).
    pub rate: Option<u64>,
    /// Whether the manager records the cluster's events (`trireme_control::events`).
    pub events: bool,
    /// The scrub schedule (an interval of zero: none).
    pub scrub: trireme_control::ScrubSchedule,
    /// How the manager dials nodes (`None`: TCP to their address; the simulator's network).
    pub connector: Option<std::sync::Arc<dyn trireme_client::Connector>>,
    /// Node daemons hold lease-bound liveness keys, so a node without one is down at once
    /// (true for every real cluster on a metadata store; the simulator's nodes hold none and
    /// are judged by heartbeats alone).
    pub node_leases: bool,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            heartbeat_every: Duration::from_millis(500),
            down_after: Duration::from_secs(3),
            down_out: Some(Duration::from_secs(600)),
            rate: None,
            events: true,
            scrub: Default::default(),
            connector: None,
            node_leases: true,
        }
    }
}

/// Campaigns for the role while `lease` holds one, runs it when won, and serves the control
/// API on `control`, until aborted. `current_tx` carries the manager while this process holds
/// the role (the HTTP endpoint serves the dashboard then).
pub async fn run(
    meta: ClusterMeta,
    lease: watch::Receiver<Option<LeaseId>>,
    rec: ManagerRecord,
    control: tokio::net::TcpListener,
    opts: ManagerOptions,
    current_tx: watch::Sender<Option<Arc<Manager>>>,
) {
    let current = current_tx.subscribe();
    let api = tokio::spawn(serve_control(control, current, meta.clone()));
    campaign(meta, lease, rec, opts, current_tx).await;
    api.abort();
}

/// The election alone: campaigns while `lease` holds one; while this process holds the role,
/// `current` carries its [`Manager`] (and `None` otherwise). Returns when the lease sender is
/// gone.
pub async fn campaign(
    meta: ClusterMeta,
    mut lease: watch::Receiver<Option<LeaseId>>,
    rec: ManagerRecord,
    opts: ManagerOptions,
    current: watch::Sender<Option<Arc<Manager>>>,
) {
    let mut barred = false;
    loop {
        let Some(l) = *lease.borrow_and_update() else {
            if lease.changed().await.is_err() {
                break;
            }
            continue;
        };
        match meta.campaign(&rec, l).await {
            Ok(true) => {
                barred = false;
                tracing::info!(node = rec.node, control = %rec.control, "took the manager role");
                let m = Arc::new(Manager::new(meta.fenced(l)));
                m.set_liveness_from_leases(opts.node_leases);
                if let Some(c) = &opts.connector {
                    m.set_connector(c.clone());
                }
                m.set_own_node(rec.node);
                // A volume created without an access list is the operators' until they name
                // its clients; without TLS there are no identities to name.
                m.set_default_access(if trireme_transport::tcp::tls_setup().is_some() {
                    Vec::new()
                } else {
                    trireme_meta::any_client()
                });
                m.start_heartbeats(opts.heartbeat_every, opts.down_after);
                m.start_trash_purge();
                m.start_qos_shares();
                m.start_compaction();
                m.start_finishing_deletes();
                if opts.events {
                    m.start_event_recorder();
                }
                m.start_scrub_schedule(opts.scrub);
                if let Some(after) = opts.down_out {
                    m.start_down_out(after, opts.rate);
                }
                if let Err(e) = m.resume_jobs().await {
                    tracing::warn!("reading the jobs of the previous manager: {e}");
                }
                let _ = current.send(Some(m.clone()));
                let resigned = tokio::select! {
                    biased;
                    _ = hold(&meta, &mut lease, l) => false,
                    _ = m.resigned() => true,
                };
                let _ = current.send(None);
                drop(m);
                if resigned {
                    hand_over(&meta, l).await;
                } else {
                    tracing::warn!(node = rec.node, "gave up the manager role");
                }
            }
            Ok(false) => wait_for_vacancy(&meta, &mut lease).await,
            Err(MetaError::Denied(e)) => {
                if !barred {
                    tracing::info!(
                        node = rec.node,
                        "this node may not hold the manager role (etcd refuses it the manager \
                         key: `trireme etcd rbac --managers`); it serves its copies and stays \
                         out of the election ({e})"
                    );
                    barred = true;
                }
                tokio::time::sleep(BARRED_RETRY).await;
            }
            Err(e) => {
                tracing::debug!("campaign: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Gives the role up for another daemon to take (this one's node is about to restart) and
/// sits out until one has, or for [`HAND_OVER_WAIT`] (no other daemon runs: take it back).
async fn hand_over(meta: &ClusterMeta, l: LeaseId) {
    if let Err(e) = meta.resign(l).await {
        tracing::warn!("handing the manager role over: {e}");
        return;
    }
    tracing::info!("handed the manager role over");
    let t0 = std::time::Instant::now();
    while t0.elapsed() < HAND_OVER_WAIT {
        if let Ok(Some((_, kv))) = meta.manager().await {
            if kv.lease != l {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long a manager that handed its role over leaves it to the others.
const HAND_OVER_WAIT: Duration = Duration::from_secs(5);

/// Returns when the role is no longer ours: the lease is lost, or the key is gone or changed.
async fn hold(meta: &ClusterMeta, lease: &mut watch::Receiver<Option<LeaseId>>, l: LeaseId) {
    loop {
        let start = match meta.manager().await {
            Ok(Some((_, kv))) if kv.lease == l => kv.mod_revision + 1,
            Ok(_) => return,
            Err(e) => {
                tracing::debug!("reading the manager key: {e}");
                0
            }
        };
        let w = if start > 0 {
            meta.store()
                .watch(&ClusterMeta::manager_key(), start)
                .await
                .ok()
        } else {
            None
        };
        let Some(mut w) = w else {
            // The store is unreachable: the lease keeper decides when the lease is lost.
            tokio::select! {
                biased;
                _ = lease.changed() => if *lease.borrow() != Some(l) { return },
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            continue;
        };
        loop {
            tokio::select! {
                biased;
                r = lease.changed() => {
                    if r.is_err() || *lease.borrow() != Some(l) {
                        return;
                    }
                }
                ev = w.recv() => match ev {
                    Some(e) if e.deleted || e.kv.lease != l => return,
                    Some(_) => {}
                    // The watch broke: read the key again.
                    None => break,
                },
            }
        }
    }
}

/// Returns when the manager key is gone, the lease changes, or the watch breaks (a dead
/// connection to etcd ends the stream: the client keeps HTTP/2 keep-alives on it). No timer: an
/// idle cluster sends etcd nothing for the election.
async fn wait_for_vacancy(meta: &ClusterMeta, lease: &mut watch::Receiver<Option<LeaseId>>) {
    let start = match meta.manager().await {
        Ok(Some((_, kv))) => kv.mod_revision + 1,
        _ => return,
    };
    let Ok(mut w) = meta.store().watch(&ClusterMeta::manager_key(), start).await else {
        tokio::time::sleep(Duration::from_millis(500)).await;
        return;
    };
    loop {
        tokio::select! {
            biased;
            _ = lease.changed() => return,
            ev = w.recv() => match ev {
                Some(e) if e.deleted => return,
                Some(_) => {}
                None => return,
            },
        }
    }
}

/// The control port: served by the current manager, or answered with where it is.
async fn serve_control(
    listener: tokio::net::TcpListener,
    current: watch::Receiver<Option<Arc<Manager>>>,
    meta: ClusterMeta,
) {
    // Mutual TLS when the daemon has an identity: only certificates of the cluster's CA get in,
    // and what they may ask depends on their role (`trireme_control::serve_conn`).
    let acceptor = trireme_transport::tcp::tls_setup()
        .and_then(|t| t.server.clone())
        .map(trireme_tls::tokio_rustls::TlsAcceptor::from);
    let gate = trireme_control::control_gate();
    loop {
        let (sock, addr) = trireme_net::accept("control", || listener.accept()).await;
        let Some(handshake) = gate.handshake_tcp(sock.local_addr().ok(), addr) else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let mut current = current.clone();
        let meta = meta.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let (sock, peer): (Box<dyn trireme_control::ControlStream>, _) = match acceptor {
                None => (Box::new(sock), trireme_transport::Peer::Trusted),
                Some(a) => match handshake
                    .run(async {
                        // Its ClientHello arrived: it goes after silent peers if the gate
                        // must make room.
                        if matches!(sock.peek(&mut [0u8; 1]).await, Ok(n) if n > 0) {
                            handshake.spoke();
                        }
                        trireme_transport::tcp::accept_tls(&a, sock).await
                    })
                    .await
                    .unwrap_or_else(|| Err("evicted to make room for another handshake".into()))
                {
                    Ok((s, role)) => (Box::new(s), trireme_transport::Peer::Cert(Arc::new(role))),
                    Err(why) => {
                        trireme_net::warn_throttled_by!(
                            trireme_control::REFUSED,
                            &why,
                            %addr,
                            "refused a control connection: {why}"
                        );
                        return;
                    }
                },
            };
            let Some(place) = gate.establish(handshake) else {
                return;
            };
            let mut sock =
                trireme_net::Guarded::new(sock, trireme_control::CONTROL_IDLE, Some(place));
            // A daemon that has just won the election is named in etcd a moment before its
            // manager is ready (it reads the previous manager's jobs first): a client sent here
            // in that moment waits for it rather than being told to go elsewhere.
            let m = tokio::time::timeout(READY_WAIT, current.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(|r| r.ok().and_then(|m| m.clone()));
            if let Some(m) = m {
                return trireme_control::serve_conn(sock, m, peer).await;
            }
            use tokio::io::AsyncWriteExt;
            let where_ = match meta.manager().await {
                Ok(Some((r, _))) => format!("the manager is node {} at {}", r.node, r.control),
                _ => "no manager is elected right now; try again in a moment".into(),
            };
            let line =
                serde_json::json!({ "error": format!("this daemon is not the manager: {where_}") });
            let _ = sock.write_all(format!("{line}\n").as_bytes()).await;
        });
    }
}

/// How long a control connection waits for this daemon's manager to be ready.
const READY_WAIT: Duration = Duration::from_secs(3);
