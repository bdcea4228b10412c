//! The node processes of `trireme up` and their supervisor: each node is started as a process
//! of its own (in its network namespace if asked), registered under the address it prints, and
//! restarted when it dies, after a back-off, as systemd restarts a unit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use trireme_control::Manager;
use trireme_meta::{ClusterMeta, NodeRecord, NodeState};

use super::{write_atomically, NodeNetns};
use crate::DaemonError;

pub(super) struct NodeProc {
    pub(super) pid: u32,
    pub(super) addr: String,
    pub(super) local_addr: Option<String>,
    /// Where it serves its metrics (`host:port`).
    pub(super) http: Option<String>,
}

pub(super) async fn spawn_node(
    sup: &Supervisor,
    id: u32,
) -> Result<(Child, NodeProc), DaemonError> {
    let (dir, store) = (sup.dir.as_path(), sup.store.as_str());
    let netns = sup.netns.get(id as usize - 1);
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    let listen = match netns {
        Some(n) => std::net::SocketAddr::new(n.addr, 0).to_string(),
        None => "127.0.0.1:0".to_string(),
    };
    let transport = sup
        .node_transport
        .iter()
        .rev()
        .find(|(n, _)| *n == id)
        .map_or(sup.transport.as_str(), |(_, t)| t.as_str());
    cmd.arg("--log")
        .arg(&sup.log)
        .arg("--transport")
        .arg(transport)
        .args([
            "node",
            "serve",
            "--id",
            &id.to_string(),
            "--listen",
            &listen,
            "--store",
            store,
            "--dirty-grain",
            &sup.dirty_grain.to_string(),
            "--io-threads",
            &sup.io_threads.to_string(),
            "--recovery-share",
            &sup.recovery_share.to_string(),
            "--dir",
        ])
        .arg(dir.join(format!("node-{id}")));
    if sup.no_block_checksums {
        cmd.arg("--no-block-checksums");
    }
    if sup.volatile_bookkeeping {
        cmd.arg("--volatile-bookkeeping");
    }
    match sup.capacity {
        Some(c) => cmd.arg("--capacity").arg(c.to_string()),
        None => cmd.arg("--fs-share").arg(sup.fs_share.to_string()),
    };
    cmd.arg("--overcommit").arg(sup.overcommit.to_string());
    if let Some(t) = &sup.tiers {
        cmd.arg("--fast-size")
            .arg(t.fast_capacity.to_string())
            .arg("--migrate-rate")
            .arg(t.migrate_rate.to_string())
            .arg("--slow-disk")
            .arg(if t.disk.is_some() { "model" } else { "real" });
    }
    if sup.tls {
        let members: Vec<String> = (1..=sup.members).map(|n| n.to_string()).collect();
        cmd.arg("--members").arg(members.join(","));
        cmd.arg("--tls-dir")
            .arg(dir.join("tls").join(format!("node-{id}")));
    } else {
        cmd.arg("--insecure");
    }
    if netns.is_none() {
        cmd.arg("--socket").arg(dir.join(format!("node-{id}.sock")));
    }
    // Its metrics on the address it listens on, any port: where Prometheus can reach it,
    // behind the cluster's one token.
    match sup.http {
        true => cmd
            .arg("--http")
            .arg(match netns {
                Some(n) => std::net::SocketAddr::new(n.addr, 0).to_string(),
                None => "127.0.0.1:0".to_string(),
            })
            .arg("--http-token-file")
            .arg(dir.join("http-token")),
        false => cmd.arg("--http").arg("off"),
    };
    if sup.inject_faults {
        cmd.arg("--inject-faults")
            .arg(dir.join(format!("node-{id}.faults")));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Own process group: Ctrl-C reaches `up`, which stops the nodes in order.
        .process_group(0)
        .kill_on_drop(true);
    // Appended, so a restarted node's log follows the one that died.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("node-{id}.log")))?;
    cmd.stderr(log);
    // The namespace is opened here (close-on-exec) and entered in the child before exec.
    let ns_file = match netns {
        Some(n) => Some(
            std::fs::File::open(Path::new("/var/run/netns").join(&n.name)).map_err(|e| {
                DaemonError::Usage(format!(
                    "network namespace {:?} (for node {id}): {e}; create it with `ip netns add`",
                    n.name
                ))
            })?,
        ),
        None => None,
    };
    let ns_fd = ns_file.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    // SAFETY: prctl and setns are async-signal-safe system calls that touch no memory of the
    // parent. PR_SET_PDEATHSIG makes the kernel send SIGTERM to the node if `up` dies without
    // cleaning up (kill -9); setns moves the child into the node's network namespace, through
    // a descriptor that stays open in the parent until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = ns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(ns_file);
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(20),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await;
    // "listening HOST:PORT [unix:PATH]"
    let words: Vec<String> = match read {
        Ok(Ok(n)) if n > 0 => line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    };
    let Some(addr) = words.first().cloned() else {
        let _ = child.kill().await;
        return Err(DaemonError::Runtime(format!(
            "node {id} failed to start; see {}",
            dir.join(format!("node-{id}.log")).display()
        )));
    };
    let pid = child.id().unwrap_or(0);
    let local_addr = words.iter().find(|w| w.starts_with("unix:")).cloned();
    let http = words
        .iter()
        .find_map(|w| w.strip_prefix("http:"))
        .map(str::to_string);
    Ok((
        child,
        NodeProc {
            pid,
            addr,
            local_addr,
            http,
        },
    ))
}

/// One supervised node process.
pub(super) struct Supervised {
    /// Running process, if any.
    pub(super) pid: Option<u32>,
    /// Bumped at every spawn, so a death report of an older process is recognised.
    pub(super) generation: u64,
    /// Stopped on purpose (`node stop`): not restarted.
    pub(super) held: bool,
    pub(super) started: std::time::Instant,
    /// Wait before the next restart.
    pub(super) backoff: Duration,
}

pub(super) type Died = (u32, u64, String);

/// Restarts node processes that die, as systemd would restart a unit: after a back-off that
/// doubles while a node keeps dying quickly (up to 30 s) and resets once it has run a while.
pub(super) struct Supervisor {
    pub(super) nodes: std::collections::BTreeMap<u32, Supervised>,
    pub(super) died: (
        tokio::sync::mpsc::UnboundedSender<Died>,
        tokio::sync::mpsc::UnboundedReceiver<Died>,
    ),
    pub(super) dir: PathBuf,
    pub(super) store: String,
    pub(super) tiers: Option<trireme_store::TierConfig>,
    pub(super) dirty_grain: u64,
    pub(super) io_threads: u32,
    pub(super) recovery_share: u32,
    pub(super) capacity: Option<u64>,
    pub(super) overcommit: f64,
    /// How many nodes live on the file system of `dir` (each counts its share of it).
    pub(super) fs_share: u32,
    pub(super) inject_faults: bool,
    pub(super) backoff: Duration,
    /// Per node (index id-1): the network namespace it runs in, if any.
    pub(super) netns: Vec<NodeNetns>,
    pub(super) no_block_checksums: bool,
    pub(super) volatile_bookkeeping: bool,
    /// Nodes that run another transport than the cluster's.
    pub(super) node_transport: Vec<(u32, String)>,
    pub(super) log: String,
    pub(super) transport: String,
    /// Nodes serve over mutual TLS (`<data-dir>/tls/node-N`).
    pub(super) tls: bool,
    /// Nodes serve their metrics over HTTP.
    pub(super) http: bool,
    /// How many nodes `up` runs (ids 1 to this): each admits only their certificates.
    pub(super) members: u32,
}

pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A node that ran this long before dying gets the base back-off again.
pub(super) const STABLE: Duration = Duration::from_secs(10);

impl Supervisor {
    pub(super) async fn spawn(&mut self, id: u32, meta: &ClusterMeta) -> Result<(), DaemonError> {
        let (mut child, p) = spawn_node(self, id).await?;
        // A restart keeps what the cluster decided about the node (draining, say) and what
        // the operator declared of it (`node set --iops-capacity`).
        let known = meta.nodes().await?.into_iter().find(|n| n.id == id);
        meta.put_node(&NodeRecord {
            id,
            addr: p.addr.clone(),
            local_addr: p.local_addr.clone(),
            store: self.store.clone(),
            state: known.as_ref().map_or(NodeState::Active, |n| n.state),
            zone: None,
            http: p.http.clone(),
            iops_capacity: known.and_then(|n| n.iops_capacity),
        })
        .await?;
        let base = self.backoff;
        let n = self.nodes.entry(id).or_insert(Supervised {
            pid: None,
            generation: 0,
            held: false,
            started: std::time::Instant::now(),
            backoff: base,
        });
        n.generation += 1;
        n.pid = Some(p.pid);
        n.started = std::time::Instant::now();
        let generation = n.generation;
        let tx = self.died.0.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send((
                id,
                generation,
                status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string()),
            ));
        });
        Ok(())
    }

    pub(super) fn write_pids(&self) -> std::io::Result<()> {
        let mut pids: String = self
            .nodes
            .iter()
            .filter_map(|(id, n)| n.pid.map(|p| format!("node-{id} {p}\n")))
            .collect();
        pids += &format!("up {}\n", std::process::id());
        write_atomically(&self.dir.join("pids"), &pids)
    }

    /// A node process exited; returns how long to wait before restarting it, if it should be.
    pub(super) fn on_death(&mut self, id: u32, generation: u64, status: &str) -> Option<Duration> {
        let n = self.nodes.get_mut(&id)?;
        if n.generation != generation {
            return None;
        }
        n.pid = None;
        if n.held {
            tracing::info!(node = id, "node stopped ({status})");
            return None;
        }
        if n.started.elapsed() >= STABLE {
            n.backoff = self.backoff;
        }
        let wait = n.backoff;
        n.backoff = (n.backoff * 2).min(MAX_BACKOFF);
        tracing::error!(
            node = id,
            "node process exited ({status}); restarting in {wait:?}"
        );
        Some(wait)
    }

    pub(super) fn wants_respawn(&self, id: u32, generation: u64) -> bool {
        self.nodes
            .get(&id)
            .is_some_and(|n| n.generation == generation && n.pid.is_none() && !n.held)
    }

    pub(super) async fn respawn(&mut self, id: u32, meta: &ClusterMeta, manager: &Manager) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.held = false;
        }
        match self.spawn(id, meta).await {
            Ok(()) => {
                tracing::info!(node = id, "node restarted");
                if let Err(e) = self.write_pids() {
                    tracing::warn!("writing pids: {e}");
                }
                // A volatile store comes back empty: re-create its replicas (marked failed
                // where the volume has data elsewhere, so they get a full resync).
                if let Err(e) = manager.ensure_replicas().await {
                    tracing::error!(node = id, "re-creating replicas: {e}");
                }
            }
            Err(e) => {
                // Counts as a quick death: retried after the back-off.
                tracing::error!(node = id, "restart failed: {e:?}");
                let generation = self.nodes.get(&id).map_or(0, |n| n.generation);
                let _ = self.died.0.send((id, generation, "did not start".into()));
            }
        }
    }

    pub(super) fn stop(&mut self, id: u32) -> Result<String, String> {
        let n = self.nodes.get_mut(&id).ok_or(format!("no node {id}"))?;
        n.held = true;
        match n.pid {
            Some(pid) => {
                // SAFETY: kill(2) with a pid we spawned; no memory is involved.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                Ok(format!(
                    "node {id} stopping (pid {pid}); `trireme node start {id}` brings it back"
                ))
            }
            None => Ok(format!("node {id} is not running; it stays stopped")),
        }
    }
}
