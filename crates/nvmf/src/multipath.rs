//! Native multipath as a host does it: one controller per path to the same subsystem, I/O to
//! the path whose ANA state is optimized, and a command that fails with a path error (or on
//! a lost connection) queued until a path is usable again — the Linux host's behaviour while
//! every path is inaccessible or reconnecting — then run there. Only other errors reach the
//! caller.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::ident::ana;
use crate::initiator::{ConnectOptions, Controller, HostError, HostId};

/// One path: an address, its controller while connected, its last known ANA state.
#[derive(Debug)]
struct Path {
    addr: SocketAddr,
    ctrl: Option<Arc<Controller>>,
    state: u8,
}

/// Paths to one subsystem.
#[derive(Debug)]
pub struct Multipath {
    subnqn: String,
    host: HostId,
    opts: ConnectOptions,
    paths: Mutex<Vec<Path>>,
    /// How long a command waits for a usable path before it fails (Linux waits as long as
    /// a controller may reconnect: `ctrl_loss_tmo`, 600 s by default).
    pub no_path_wait: Duration,
}

impl Multipath {
    /// Connects to every address that answers (at least one must).
    pub async fn connect(
        addrs: &[SocketAddr],
        subnqn: &str,
        host: HostId,
        opts: ConnectOptions,
    ) -> Result<Multipath, HostError> {
        let mp = Multipath {
            subnqn: subnqn.to_string(),
            host,
            opts,
            paths: Mutex::new(
                addrs
                    .iter()
                    .map(|&addr| Path {
                        addr,
                        ctrl: None,
                        state: ana::INACCESSIBLE,
                    })
                    .collect(),
            ),
            no_path_wait: Duration::from_secs(120),
        };
        let errors = mp.refresh().await;
        if mp.paths.lock().await.iter().all(|p| p.ctrl.is_none()) {
            return Err(HostError::Refused(format!(
                "no path connected: {}",
                errors.join("; ")
            )));
        }
        Ok(mp)
    }

    /// Reconnects lost paths and reads every path's ANA state; the errors met.
    async fn refresh(&self) -> Vec<String> {
        let mut paths = self.paths.lock().await;
        let mut errors = Vec::new();
        for p in paths.iter_mut() {
            if p.ctrl.as_ref().is_some_and(|c| c.is_broken()) {
                p.ctrl = None;
            }
            if p.ctrl.is_none() {
                match Controller::connect(p.addr, &self.subnqn, &self.host, &self.opts).await {
                    Ok(c) => p.ctrl = Some(Arc::new(c)),
                    Err(e) => {
                        errors.push(format!("{}: {e}", p.addr));
                        continue;
                    }
                }
            }
            let c = p.ctrl.clone().expect("connected");
            match c.ana_state().await {
                Ok(s) => p.state = s,
                Err(e) => {
                    errors.push(format!("{}: {e}", p.addr));
                    p.ctrl = None;
                }
            }
        }
        errors
    }

    /// The controller of an optimized path, if any.
    async fn usable(&self) -> Option<Arc<Controller>> {
        let paths = self.paths.lock().await;
        paths
            .iter()
            .find(|p| p.state == ana::OPTIMIZED && p.ctrl.as_ref().is_some_and(|c| !c.is_broken()))
            .and_then(|p| p.ctrl.clone())
    }

    /// The ANA state of each path, by address.
    pub async fn states(&self) -> Vec<(SocketAddr, u8)> {
        self.paths
            .lock()
            .await
            .iter()
            .map(|p| (p.addr, p.state))
            .collect()
    }

    /// Runs `op` on a usable path, again on another after a path error.
    pub async fn run<T, F, Fut>(&self, op: F) -> Result<T, HostError>
    where
        F: Fn(Arc<Controller>) -> Fut,
        Fut: std::future::Future<Output = Result<T, HostError>>,
    {
        let t0 = tokio::time::Instant::now();
        loop {
            let ctrl = match self.usable().await {
                Some(c) => c,
                None => {
                    if t0.elapsed() > self.no_path_wait {
                        return Err(HostError::Refused(format!(
                            "no usable path for {:?}",
                            self.no_path_wait
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    self.refresh().await;
                    continue;
                }
            };
            match op(ctrl.clone()).await {
                Err(e) if e.is_path_error() => {
                    tracing::debug!(path = %ctrl.addr, "path error, retrying on another path: {e}");
                    self.mark(&ctrl).await;
                }
                r => return r,
            }
        }
    }

    /// A path failed a command: not used again until a refresh says it is optimized.
    async fn mark(&self, ctrl: &Arc<Controller>) {
        let mut paths = self.paths.lock().await;
        if let Some(p) = paths
            .iter_mut()
            .find(|p| p.ctrl.as_ref().is_some_and(|c| Arc::ptr_eq(c, ctrl)))
        {
            p.state = ana::CHANGE;
        }
    }

    pub async fn size(&self) -> Result<u64, HostError> {
        self.run(|c| async move { c.refresh_size().await }).await
    }

    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, HostError> {
        self.run(|c| async move { c.read(offset, len).await }).await
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), HostError> {
        self.run(|c| {
            let data = data.clone();
            async move { c.write(offset, data, fua).await }
        })
        .await
    }

    pub async fn flush(&self) -> Result<(), HostError> {
        self.run(|c| async move { c.flush().await }).await
    }
}
