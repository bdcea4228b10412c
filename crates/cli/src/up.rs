//! `trireme up`: a whole cluster on this host, in the foreground.
//!
//! Layout of the data directory:
//! * `meta.redb` — cluster metadata (nodes, volumes, epochs); `up.lock` — one `up` per directory.
//! * `node-N/` — node N's store; `node-N.log` — its log.
//! * `control.sock` — the control API; `nbd.sock` — the NBD unix socket.
//! * `exports` — the NBD URIs, one per line, written once they accept connections.
//! * `pids` — `node-N PID` lines and `up PID`, so a benchmark can find the storage processes.

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use trireme_control::Manager;
use trireme_meta::{EmbeddedMeta, MetaStore, NodeRecord};

use crate::cmds::control_path;
use crate::units::human;
use crate::{Cli, CliError, UpArgs};

struct NodeProc {
    id: u32,
    pid: u32,
    addr: String,
    local_addr: Option<String>,
}

fn lock_dir(dir: &Path) -> Result<std::fs::File, CliError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("up.lock"))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(CliError::Usage(format!(
            "another `trireme up` is running on {}",
            dir.display()
        )));
    }
    Ok(f)
}

async fn spawn_node(
    cli: &Cli,
    dir: &Path,
    id: u32,
    store: &str,
) -> Result<(Child, NodeProc), CliError> {
    let exe = std::env::current_exe()?;
    let log = std::fs::File::create(dir.join(format!("node-{id}.log")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--log")
        .arg(&cli.log)
        .args([
            "node",
            "serve",
            "--id",
            &id.to_string(),
            "--listen",
            "127.0.0.1:0",
            "--store",
            store,
            "--dir",
        ])
        .arg(dir.join(format!("node-{id}")))
        .arg("--socket")
        .arg(dir.join(format!("node-{id}.sock")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Own process group: Ctrl-C reaches `up`, which stops the nodes in order.
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent; it makes the
    // kernel send SIGTERM to the node if `up` dies without cleaning up (kill -9).
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
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
        return Err(CliError::Runtime(format!(
            "node {id} failed to start; see {}",
            dir.join(format!("node-{id}.log")).display()
        )));
    };
    let pid = child.id().unwrap_or(0);
    let local_addr = words.get(1).cloned();
    Ok((
        child,
        NodeProc {
            id,
            pid,
            addr,
            local_addr,
        },
    ))
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

pub async fn run(cli: &Cli, a: &UpArgs) -> Result<(), CliError> {
    if a.replicas > a.nodes {
        return Err(CliError::Usage(format!(
            "--replicas {} needs at least {} nodes, but --nodes is {}",
            a.replicas, a.replicas, a.nodes
        )));
    }
    if a.size == 0 || !a.size.is_multiple_of(4096) {
        return Err(CliError::Usage(format!(
            "--size {} must be a non-zero multiple of 4096",
            a.size
        )));
    }
    trireme_meta::check_name(&a.volume).map_err(|e| CliError::Usage(e.to_string()))?;
    std::fs::create_dir_all(&cli.data_dir).map_err(|e| {
        CliError::Usage(format!(
            "cannot create --data-dir {}: {e}",
            cli.data_dir.display()
        ))
    })?;
    let dir: PathBuf = std::fs::canonicalize(&cli.data_dir)?;
    let _lock = lock_dir(&dir)?;
    let meta = Arc::new(EmbeddedMeta::open(&dir.join("meta.redb"))?);
    let store = a.store.kind().as_str();
    match meta.setting("store")? {
        Some(s) if s != store => {
            return Err(CliError::Usage(format!(
                "{} holds a cluster created with --store {s}; start it with --store {s} or use another --data-dir",
                dir.display()
            )))
        }
        Some(_) => {}
        None => meta.set_setting("store", store)?,
    }
    let known = meta.nodes()?.len() as u32;
    if known != 0 && known != a.nodes {
        return Err(CliError::Usage(format!(
            "{} holds a cluster of {known} nodes; start it with --nodes {known} or use another --data-dir",
            dir.display()
        )));
    }
    let tcp = tokio::net::TcpListener::bind(("127.0.0.1", a.port))
        .await
        .map_err(|e| {
            CliError::Runtime(format!(
                "NBD port 127.0.0.1:{}: {e} (pick another with --port)",
                a.port
            ))
        })?;
    let tcp_addr = tcp.local_addr()?;

    // Nodes.
    let mut procs = Vec::new();
    let (died_tx, mut died_rx) = tokio::sync::mpsc::unbounded_channel();
    for id in 1..=a.nodes {
        let (mut child, p) = spawn_node(cli, &dir, id, store).await?;
        meta.put_node(&NodeRecord {
            id,
            addr: p.addr.clone(),
            local_addr: p.local_addr.clone(),
            store: store.to_string(),
        })?;
        let tx = died_tx.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send((
                id,
                status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string()),
            ));
        });
        procs.push(p);
    }
    let mut pids: String = procs
        .iter()
        .map(|p| format!("node-{} {}\n", p.id, p.pid))
        .collect();
    pids += &format!("up {}\n", std::process::id());
    write_atomically(&dir.join("pids"), &pids)?;

    // Control plane.
    let manager = Arc::new(Manager::new(meta.clone()));
    manager.ensure_replicas().await.map_err(CliError::Runtime)?;
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
    match meta.volume(&a.volume) {
        Ok(v) => {
            if v.size != a.size || v.replicas.len() != a.replicas as usize {
                tracing::warn!(
                    "volume {} already exists with {} and {} replicas; keeping it as it is",
                    v.name,
                    human(v.size),
                    v.replicas.len()
                );
            }
        }
        Err(trireme_meta::MetaError::NoVolume(_)) => {
            manager
                .create_volume(&a.volume, a.size, a.replicas as usize)
                .await
                .map_err(CliError::Runtime)?;
        }
        Err(e) => return Err(e.into()),
    }

    // NBD.
    let sock = dir.join("nbd.sock");
    let (vol, nbd_tasks) =
        crate::frontend::export(&ctl, &a.volume, Some(&sock), Some(tcp), a.streams as usize)
            .await
            .map_err(CliError::Runtime)?;
    manager.register_client(vol.clone());
    let uris = crate::frontend::uris(&a.volume, Some(&sock), Some(tcp_addr));
    write_atomically(&dir.join("exports"), &(uris.join("\n") + "\n"))?;

    let v = &vol.info();
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
    println!("Press Ctrl-C to stop.");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            Some((id, status)) = died_rx.recv() => {
                tracing::error!(node = id, "node process exited ({status}); its replicas are unreachable until `trireme up` is restarted");
            }
        }
    }

    println!("trireme: stopping");
    for t in nbd_tasks {
        t.abort();
    }
    if let Err(e) = tokio::time::timeout(Duration::from_secs(10), vol.flush())
        .await
        .unwrap_or(Ok(()))
    {
        tracing::error!("final flush: {e}");
    }
    control_task.abort();
    for p in &procs {
        // SAFETY: kill(2) with a pid we spawned; no memory is involved.
        unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut stopped = 0;
    while stopped < procs.len() {
        match tokio::time::timeout_at(deadline, died_rx.recv()).await {
            Ok(Some(_)) => stopped += 1,
            _ => break,
        }
    }
    for f in ["exports", "nbd.sock", "control.sock", "pids"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    for p in &procs {
        let _ = std::fs::remove_file(dir.join(format!("node-{}.sock", p.id)));
    }
    Ok(())
}
