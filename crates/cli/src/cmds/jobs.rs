//! Commands that wait on a job of the manager (restarts, moves), drawing its progress.

#[allow(unused_imports)]
use super::*;

/// Asks for a planned restart of node `id`. A manager asked to restart its own node hands its
/// role to another daemon first: the request then goes to the next manager (and `cc` with it).
pub(crate) async fn restart_node(
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
pub(crate) async fn with_progress<T>(
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
pub(crate) fn resync_to(id: u32) -> impl Fn(&StatusReport) -> Option<(u64, u64)> {
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
pub(crate) async fn wait_in_sync(cc: &mut ControlClient) -> Result<(), CliError> {
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
pub(crate) async fn wait_move(
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
