//! Deleting a volume without losing it by mistake: a volume in use is refused unless the
//! operator says `--force` (which fences its writer first), and a deleted volume waits in the
//! trash, its replicas untouched, until it is restored or purged (by hand, or by the manager
//! once its time is up).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use trireme_meta::{TrashRecord, VolumeRecord};
use trireme_proto::{Header, Op, Status};

use super::{Manager, Result};
use crate::error::{in_use, refused};
use crate::moves::MoveState;

/// How long a deleted volume stays in the trash when the request names no time.
pub const DEFAULT_TRASH_KEEP: Duration = Duration::from_secs(24 * 3600);
/// How often the manager looks for trashed volumes whose time is up.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How long a fencing attach waits for a node to learn the new epoch from the metadata.
const FENCE_TRIES: u32 = 20;
const FENCE_RETRY: Duration = Duration::from_millis(150);

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Manager {
    /// Who holds `v` open, in words an operator can act on, if anyone does.
    pub(crate) async fn holder(&self, v: &VolumeRecord) -> Result<Option<String>> {
        if let Some(w) = self.writer(&v.name).filter(|w| w.info().epoch == v.epoch) {
            return Ok(Some(format!(
                "a writer in the cluster's own process (epoch {})",
                w.info().epoch
            )));
        }
        if let Some((a, _)) = self.meta.attachment(&v.name).await? {
            let who = a.identity.map(|i| format!(" as {i}")).unwrap_or_default();
            return Ok(Some(format!(
                "pid {} on {}{who} (epoch {})",
                a.pid, a.host, a.epoch
            )));
        }
        if v.writer_open {
            return Ok(Some(format!(
                "a writer of epoch {} that has not detached (a `trireme nbd`, or one that died)",
                v.epoch
            )));
        }
        Ok(None)
    }

    /// `volume delete`: moves the volume to the trash for `keep`. Refused while a writer holds
    /// it (naming the writer) or a drain moves it; `force` fences the writer first.
    pub async fn delete_to_trash(
        &self,
        name: &str,
        force: bool,
        keep: Option<Duration>,
        by: &str,
    ) -> Result<TrashRecord> {
        let _g = self.volume_lock.lock().await;
        let v = self.meta.volume(name).await?;
        self.check_no_clones(&v, None).await?;
        if let Some(m) = self
            .moves()
            .into_iter()
            .find(|m| m.state == MoveState::Running && m.volume.as_deref() == Some(name))
        {
            return Err(in_use(format!(
                "volume {name} is being moved off node {} (`node {}`): delete it once the job is done",
                m.node, m.kind
            )));
        }
        let v = match self.holder(&v).await? {
            None => v,
            Some(who) if !force => {
                return Err(in_use(format!(
                    "volume {name} is in use: attached by {who}. Detach it there first, or \
                     `trireme volume delete {name} --force` fences that writer (its I/O fails \
                     from then on) and deletes the volume"
                )))
            }
            Some(who) => {
                tracing::warn!(
                    volume = name,
                    holder = who,
                    "delete --force: fencing the writer"
                );
                self.fence_writer(&v).await?
            }
        };
        let keep = keep.unwrap_or(DEFAULT_TRASH_KEEP);
        let at = now_secs();
        let rec = self
            .meta
            .trash_volume(&v, at, at.saturating_add(keep.as_secs()), by)
            .await?;
        tracing::warn!(
            volume = name,
            id = v.id,
            by,
            "volume moved to the trash for {}",
            humantime_secs(keep.as_secs())
        );
        self.event(
            "trash",
            format!(
                "volume {name} deleted by {by}: in the trash for {} (`volume trash restore {name}` until then)",
                humantime_secs(keep.as_secs())
            ),
        )
        .await;
        Ok(rec)
    }

    /// Fences whoever writes `v`: a writer in this process detaches; any other is fenced by
    /// a new epoch on record and an attach at that epoch on every replica that answers (its
    /// I/O is refused from then on). The volume as it is afterwards.
    pub(crate) async fn fence_writer(&self, v: &VolumeRecord) -> Result<VolumeRecord> {
        if let Some(w) = self.writer(&v.name) {
            self.unregister_client(&w);
            if let Err(e) = w.detach().await {
                tracing::warn!(volume = %v.name, "detaching the cluster's own writer: {e}");
            }
        }
        let v = self
            .meta
            .update_volume(&v.name, &mut |rec| {
                rec.epoch += 1;
                Ok(())
            })
            .await?;
        for r in &v.replicas {
            let Ok(node) = self.node(r.node).await else {
                continue;
            };
            let h = Header {
                volume: v.id,
                epoch: v.epoch,
                ..Header::request(Op::Attach, 0)
            };
            let mut tries = 0;
            loop {
                match self.node_call(&node, h).await {
                    Ok(f)
                        if f.header.status == Status::Ok
                            || f.header.status == Status::NoReplica =>
                    {
                        break
                    }
                    // The node has not yet heard of the new epoch from the metadata.
                    Ok(f) if f.header.status == Status::Denied && tries < FENCE_TRIES => {
                        tries += 1;
                        tokio::time::sleep(FENCE_RETRY).await;
                    }
                    other => {
                        // Its clients are refused anyway once it sees the volume gone.
                        tracing::warn!(volume = %v.name, node = r.node, "fencing attach: {:?}", other.map(|f| f.header.status));
                        break;
                    }
                }
            }
        }
        Ok(v)
    }

    /// The trash, oldest first.
    pub async fn trash_list(&self) -> Result<Vec<TrashRecord>> {
        Ok(self.meta.trashed().await?)
    }

    /// The trashed volume `what` names: an id, or a name (the newest deletion of it).
    async fn trashed_one(&self, what: &str) -> Result<TrashRecord> {
        let all = self.meta.trashed().await?;
        let found = match what.parse::<u64>() {
            Ok(id) => all.into_iter().find(|t| t.volume.id == id),
            Err(_) => all.into_iter().rev().find(|t| t.volume.name == what),
        };
        found.ok_or_else(|| {
            crate::ManagerError::NotFound(format!(
                "no volume {what:?} in the trash (`trireme volume trash list`)"
            ))
        })
    }

    /// `volume trash restore`: the volume back under its name, as it was.
    pub async fn trash_restore(&self, what: &str) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let t = self.trashed_one(what).await?;
        let v = self.meta.restore_volume(t.volume.id).await.map_err(|e| match e {
            trireme_meta::MetaError::VolumeExists(n) => refused(format!(
                "a volume named {n} exists again: delete it first (or restore this one after renaming that one)"
            )),
            e => e.into(),
        })?;
        tracing::warn!(volume = %v.name, id = v.id, "volume restored from the trash");
        self.event(
            "trash",
            format!("volume {} restored from the trash", v.name),
        )
        .await;
        Ok(v)
    }

    /// `volume trash purge`: frees the replicas of `what` (all whose time is up if `None`)
    /// and forgets them. A replica on a node that does not answer keeps its volume in the
    /// trash (purged when the node is back); a node removed from the cluster holds nothing.
    pub async fn trash_purge(&self, what: Option<&str>) -> Result<Vec<TrashRecord>> {
        let chosen = match what {
            Some(w) => vec![self.trashed_one(w).await?],
            None => {
                let now = now_secs();
                self.meta
                    .trashed()
                    .await?
                    .into_iter()
                    .filter(|t| t.purge_at <= now)
                    .collect()
            }
        };
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for t in chosen {
            match self.purge_one(&t).await {
                Ok(()) => done.push(t),
                Err(e) => failed.push(format!("{} (id {}): {e}", t.volume.name, t.volume.id)),
            }
        }
        if what.is_some() && !failed.is_empty() {
            return Err(refused(failed.join("; ")));
        }
        for f in failed {
            tracing::warn!("purge postponed: {f}");
        }
        Ok(done)
    }

    async fn purge_one(&self, t: &TrashRecord) -> Result<()> {
        let v = &t.volume;
        self.delete_replicas(v).await?;
        self.meta.forget_trashed(v.id).await?;
        tracing::warn!(volume = %v.name, id = v.id, "trashed volume purged: its replicas are freed");
        self.event(
            "trash",
            format!(
                "volume {} (id {}) purged from the trash: its replicas freed",
                v.name, v.id
            ),
        )
        .await;
        Ok(())
    }

    /// Purges trashed volumes whose time is up, every minute while the manager lives.
    pub fn start_trash_purge(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PURGE_EVERY).await;
                let Some(m) = me.upgrade() else { return };
                if let Err(e) = m.trash_purge(None).await {
                    tracing::debug!("trash purge: {e}");
                }
            }
        });
    }
}

/// `secs` as an operator reads it: "1 day", "3 h", "90 s".
fn humantime_secs(secs: u64) -> String {
    match secs {
        s if s >= 86400 && s % 86400 == 0 => {
            let d = s / 86400;
            format!("{d} day{}", if d == 1 { "" } else { "s" })
        }
        s if s >= 3600 && s % 3600 == 0 => format!("{} h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}
