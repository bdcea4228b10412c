//! The devices the node service maps: one `trireme map VOLUME` child per staged volume,
//! watched. A child that dies while its volume is staged is started again, and the device
//! it served goes on with the requests it had queued (the kernel holds them for the dead-
//! connection timeout); at start, the service serves again every device this host has
//! mapped whose server is gone (the service itself restarted).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tonic::Status;
use trireme_kernel::mapped;

use super::NodeConfig;

/// How long a `map` may take to give its device (a guest under emulation is slow).
const MAP_WAIT: Duration = Duration::from_secs(120);
/// The exit code of a Rust process that panicked.
const PANICKED: i32 = 101;
/// Wait before serving again a device whose `map` died.
const RESTART: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(crate) struct Maps {
    cfg: Arc<NodeConfig>,
    /// Volumes staged here: their device is kept served.
    staged: Arc<Mutex<HashSet<String>>>,
}

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

impl Maps {
    pub(crate) fn new(cfg: Arc<NodeConfig>) -> Maps {
        Maps {
            cfg,
            staged: Arc::default(),
        }
    }

    fn set_staged(&self, vol: &str, on: bool) {
        let mut s = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        match on {
            true => s.insert(vol.to_string()),
            false => s.remove(vol),
        };
    }

    fn is_staged(&self, vol: &str) -> bool {
        self.staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(vol)
    }

    /// The record of `vol`'s device on this host.
    pub(crate) fn record(&self, vol: &str) -> Result<Option<mapped::Mapped>, Status> {
        mapped::get(&self.cfg.devices, vol).map_err(|e| internal("the device records", e))
    }

    /// `vol`'s device, mapped now if it is not.
    pub(crate) async fn ensure(&self, vol: &str) -> Result<PathBuf, Status> {
        self.set_staged(vol, true);
        if let Some(m) = self.record(vol)? {
            if m.serving() {
                return Ok(m.path());
            }
        }
        match self.start(vol).await {
            Ok(p) => Ok(p),
            Err(e) => {
                self.set_staged(vol, false);
                Err(e)
            }
        }
    }

    /// Serves again, at start, every device whose server is gone.
    pub(crate) fn adopt(&self) {
        for m in mapped::list(&self.cfg.devices).into_iter().flatten() {
            if m.serving() {
                continue;
            }
            tracing::warn!(volume = m.volume, device = %m.path().display(), "serving a device whose map process is gone");
            self.set_staged(&m.volume, true);
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.start(&m.volume).await {
                    tracing::error!(
                        volume = m.volume,
                        "could not serve its device again: {}",
                        e.message()
                    );
                }
            });
        }
    }

    fn log(&self, vol: &str) -> PathBuf {
        self.cfg.logs.join(format!("{vol}.log"))
    }

    /// Starts `trireme map VOL` and waits for its device; a task watches it from then on
    /// (boxed: the watcher starts it again, and a recursive future must say it is `Send`).
    fn start<'a>(
        &'a self,
        vol: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<PathBuf, Status>> + Send + 'a>>
    {
        Box::pin(self.start_now(vol))
    }

    async fn start_now(&self, vol: &str) -> Result<PathBuf, Status> {
        std::fs::create_dir_all(&self.cfg.logs).map_err(|e| internal("the log directory", e))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(vol))
            .map_err(|e| internal("the map log", e))?;
        let mut cmd = tokio::process::Command::new(&self.cfg.exe);
        cmd.envs(self.cfg.env.iter().map(|(k, v)| (k, v)))
            .args(["map", vol, "--device", &self.cfg.device])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            // Its own process group: a signal to the service's does not stop the devices.
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| internal("starting trireme map", e))?;
        let out = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(out).lines();
        let first = tokio::time::timeout(MAP_WAIT, lines.next_line()).await;
        let dev = match first {
            Ok(Ok(Some(l))) if l.starts_with("/dev/") => PathBuf::from(l.trim()),
            _ => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(self.map_failed(vol));
            }
        };
        // Whatever it prints later goes nowhere (it would die of a closed pipe otherwise).
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let me = self.clone();
        let vol = vol.to_string();
        tokio::spawn(async move { me.watch(vol, child).await });
        tracing::info!(device = %dev.display(), "mapped");
        Ok(dev)
    }

    /// What a failed `map` said, as the CO's error.
    fn map_failed(&self, vol: &str) -> Status {
        let said = std::fs::read_to_string(self.log(vol)).unwrap_or_default();
        let last = said
            .lines()
            .rev()
            .find(|l| l.starts_with("error"))
            .unwrap_or("it gave no device")
            .to_string();
        // Held by a writer elsewhere (not fenced by a publish), or no kernel driver: the
        // CO's state or this host's, not a bad request.
        Status::failed_precondition(format!("trireme map {vol}: {last}"))
    }

    /// Waits for a `map` child; serves the device again if it was killed (a signal, or a
    /// panic) while staged, each new child with a watcher of its own. A child that exited on
    /// its own said why in its log (fenced: another node writes the volume now) and is not
    /// started again: that would take the volume back from the node it moved to.
    async fn watch(self, vol: String, mut child: tokio::process::Child) {
        let st = child.wait().await;
        let killed = st
            .as_ref()
            .map_or(true, |s| s.code().is_none() || s.code() == Some(PANICKED));
        if !killed {
            tracing::error!(volume = vol, status = ?st, "its map process ended on its own: not started again (its log says why)");
            return;
        }
        loop {
            let still = self.is_staged(&vol) && matches!(self.record(&vol), Ok(Some(_)));
            if !still {
                return;
            }
            tracing::warn!(volume = vol, status = ?st, "its map process ended while staged: serving the device again");
            tokio::time::sleep(RESTART).await;
            match self.start(&vol).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::error!(volume = vol, "serving its device again: {}", e.message())
                }
            }
        }
    }

    /// Flushes and ends `vol`'s device (`trireme unmap`); `force` even while in use.
    pub(crate) async fn unmap(&self, vol: &str, force: bool) -> Result<(), Status> {
        self.set_staged(vol, false);
        if self.record(vol)?.is_none() {
            return Ok(());
        }
        let mut cmd = tokio::process::Command::new(&self.cfg.exe);
        cmd.envs(self.cfg.env.iter().map(|(k, v)| (k, v)))
            .args(["unmap", vol]);
        if force {
            cmd.arg("--force");
        }
        let o = cmd
            .output()
            .await
            .map_err(|e| internal("running trireme unmap", e))?;
        if !o.status.success() && self.record(vol)?.is_some() {
            self.set_staged(vol, true);
            return Err(Status::failed_precondition(format!(
                "trireme unmap {vol}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        Ok(())
    }
}
