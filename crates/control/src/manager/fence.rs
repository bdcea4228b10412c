//! Fencing a volume's writer by where it runs: what a CSI controller asks when a volume moves
//! to another host (`ControllerPublishVolume` fences a writer elsewhere) or leaves a host that
//! may be dead (`ControllerUnpublishVolume`). The epoch fence makes the old writer harmless at
//! once: nobody waits for its lease, nor for the host to answer.

use serde::{Deserialize, Serialize};

use super::{Manager, Result};

/// What a [`crate::Request::VolumeFence`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    /// The writer fenced, in words (none: nobody matched, nothing changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
    /// The volume's epoch afterwards.
    pub epoch: u64,
}

/// Which writer a fence is for: on `host`, or on any host but `except` (both: both hold).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceWhere {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<String>,
}

impl FenceWhere {
    fn matches(&self, host: &str) -> bool {
        self.host.as_deref().is_none_or(|h| h == host)
            && self.except.as_deref().is_none_or(|h| h != host)
    }
}

impl Manager {
    /// Fences the writer of `name` on record if it runs where `at` says, and drops its attach
    /// record so the next writer attaches without `--force`. Idempotent: a second call finds
    /// no writer and changes nothing.
    pub async fn fence_where(&self, name: &str, at: &FenceWhere) -> Result<Fenced> {
        let _g = self.volume_lock.lock().await;
        let v = self.meta.volume(name).await?;
        let Some((a, _)) = self.meta.attachment(name).await? else {
            return Ok(Fenced {
                writer: None,
                epoch: v.epoch,
            });
        };
        if !at.matches(&a.host) {
            return Ok(Fenced {
                writer: None,
                epoch: v.epoch,
            });
        }
        let who = format!("pid {} on {} (epoch {})", a.pid, a.host, a.epoch);
        let v = self.fence_writer(&v).await?;
        self.meta.release_attachment(name, a.epoch).await?;
        tracing::warn!(
            volume = name,
            writer = who,
            epoch = v.epoch,
            "writer fenced"
        );
        self.event(
            "fence",
            format!("volume {name}: writer {who} fenced, epoch now {}", v.epoch),
        )
        .await;
        Ok(Fenced {
            writer: Some(who),
            epoch: v.epoch,
        })
    }
}
