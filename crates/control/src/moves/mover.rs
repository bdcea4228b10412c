//! Who moves a volume's replica (its writer here, its writer on another host through a
//! [`MoveRequest`], or a writer the manager attaches for the move), and the writer's half of a
//! move ([`copy_then_retire`]).

use crate::error::{refused, ManagerError};
use std::sync::Arc;

use trireme_client::{Following, ResyncProgress, Volume};
use trireme_meta::MetaError;
use trireme_meta::{MoveRequest, MoveRequestState, VolumeRecord};
use trireme_replication::{ReplicaState, TransitionError};

use crate::manager::{Manager, OwnWriter, Result};

use super::{POLL, REATTACH_GRACE, REMOTE_POLL};

/// How many writers in turn a volume's move goes through before the job gives up.
const MOVE_ATTEMPTS: u32 = 4;

/// Who carries out a volume's move.
enum Mover {
    /// A writer in this process; `own` if attached for the move (released after).
    Here {
        writer: Arc<Volume>,
        own: Option<OwnWriter>,
    },
    /// The writer of `epoch` on another host, asked through a [`MoveRequest`].
    Remote { epoch: u64, host: String },
}

impl Manager {
    /// Who moves `v`'s replica: its writer here, its writer on another host, or a writer
    /// attached here for the move.
    async fn mover(self: &Arc<Self>, v: &VolumeRecord) -> Result<Mover> {
        if let Some(w) = self.writer(&v.name) {
            return Ok(Mover::Here {
                writer: w,
                own: None,
            });
        }
        // A manager that holds its role by a lease (on etcd) works beside writers whose
        // attach records are lease-bound too; `up`'s manager (no lease) beside writers that
        // may hold none (`trireme nbd`).
        let on_leases = self.meta().fence_lease().is_some();
        let mut held = self.meta().attachment(&v.name).await?;
        if held.is_none() && v.writer_open && on_leases {
            // A live writer whose lease expired (etcd was out for longer than its TTL) puts
            // its record back as soon as etcd answers it, and etcd may come and go meanwhile:
            // give it REATTACH_GRACE of etcd answering before taking the volume for a dead
            // writer's. Attaching over a live one fences it (simulator seeds 59382, 121292).
            let mut answered = std::time::Duration::ZERO;
            while held.is_none() && answered < REATTACH_GRACE {
                tokio::time::sleep(POLL).await;
                match self.meta().attachment(&v.name).await {
                    Ok(h) => {
                        held = h;
                        answered += POLL;
                    }
                    Err(MetaError::Unavailable(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if let Some((a, _)) = held {
            return Ok(Mover::Remote {
                epoch: a.epoch,
                host: a.host,
            });
        }
        // On etcd every writer holds an attach record: writer-open without one is a writer
        // that died, and attaching reconciles first. Beside `up`, it may be `trireme nbd`.
        if v.writer_open && !on_leases {
            return Err(refused(format!(
                "volume {} is attached by a writer outside the cluster process; detach it first (a move through another writer would fence it)",
                v.name
            )));
        }
        let own = self.attach_own(v).await?;
        Ok(Mover::Here {
            writer: own.writer.clone(),
            own: Some(own),
        })
    }

    /// Moves `v`'s replica off `from` through whoever carries the move out. If the writer
    /// changed between its retiring `from` and the layout dropping it, the move runs again
    /// through the new writer (it finds the copy already made, `add_target`).
    pub(super) async fn move_volume(
        self: &Arc<Self>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        let mut attempt = 1;
        loop {
            let v = self.meta().volume(&v.name).await?;
            match self.move_once(&v, from, rate).await {
                Err(ManagerError::Meta(MetaError::Transition(TransitionError::StaleEpoch {
                    request,
                    current,
                }))) if attempt < MOVE_ATTEMPTS => {
                    tracing::info!(
                        volume = %v.name,
                        from,
                        request,
                        current,
                        "the volume's writer changed while it moved the replica: the move goes on through the new one"
                    );
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn move_once(
        self: &Arc<Self>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        match self.mover(v).await? {
            Mover::Here { writer, own } => {
                let r = self.move_with(&writer, v, from, rate).await;
                if let Some(own) = own {
                    self.release_own(own).await;
                }
                r
            }
            Mover::Remote { epoch, host } => {
                let _asking = self
                    .asks
                    .claim(&v.name, &format!("the move off node {from}"))
                    .await;
                self.move_remote(v, from, rate, epoch, &host).await
            }
        }
    }

    async fn move_with(
        &self,
        writer: &Arc<Volume>,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
    ) -> Result<()> {
        let (to, v) = self.add_target(v, from).await?;
        tracing::info!(volume = %v.name, from, to, "moving a replica");
        move_as_writer(self.meta(), writer, from, to, rate, &mut |p| {
            self.update_move(from, |m| m.progress = p.cloned())
        })
        .await?;
        self.finish(&v, from, writer.info().epoch).await?;
        tracing::info!(volume = %v.name, from, to, "replica moved");
        Ok(())
    }

    /// Steps 2 and 3 by the writer of `epoch` on `host`, through a [`MoveRequest`]. A request
    /// of this move already under way (a previous manager made it) is waited for, not made
    /// again.
    async fn move_remote(
        &self,
        v: &VolumeRecord,
        from: u32,
        rate: Option<u64>,
        epoch: u64,
        host: &str,
    ) -> Result<()> {
        let name = v.name.as_str();
        let to = match self.pending_move(name, from, epoch).await? {
            Some(to) => to,
            None => {
                let (to, _) = self.add_target(v, from).await?;
                self.ask_move(name, from, to, rate, epoch, host).await?;
                to
            }
        };
        self.await_move(name, from, to, epoch, host).await?;
        let v = self.meta().volume(name).await?;
        // A newer writer meanwhile: the next attempt asks it anew (its request replaces this).
        self.finish(&v, from, epoch).await?;
        self.meta().delete_move_request(name).await?;
        tracing::info!(
            volume = name,
            from,
            to,
            host,
            "replica moved by the volume's writer"
        );
        Ok(())
    }

    /// The node a move of `name` off `from` by the writer of `epoch` is already making a
    /// copy on (a previous manager asked it), if one is.
    pub(super) async fn pending_move(
        &self,
        name: &str,
        from: u32,
        epoch: u64,
    ) -> Result<Option<u32>> {
        Ok(match self.meta().move_request(name).await? {
            Some((r, _))
                if r.from == from && r.epoch == epoch && r.state != MoveRequestState::Failed =>
            {
                tracing::info!(
                    volume = name,
                    from,
                    to = r.to,
                    "waiting for the move its writer is making"
                );
                self.update_move(from, |m| m.to = Some(r.to));
                Some(r.to)
            }
            _ => None,
        })
    }

    /// Asks the writer of `epoch` on `host` to move `name`'s copy off `from` onto `to`.
    pub(super) async fn ask_move(
        &self,
        name: &str,
        from: u32,
        to: u32,
        rate: Option<u64>,
        epoch: u64,
        host: &str,
    ) -> Result<()> {
        let meta = self.meta();
        let req = MoveRequest {
            from,
            to,
            rate,
            epoch,
            state: MoveRequestState::Asked,
            progress: None,
            error: None,
        };
        meta.delete_move_request(name).await?;
        if meta.put_move_request(name, &req, 0).await?.is_none() {
            return Err(refused("another move request was made meanwhile"));
        }
        self.update_move(from, |m| m.to = Some(to));
        tracing::info!(
            volume = name,
            from,
            to,
            host,
            "asked the volume's writer to move a replica"
        );
        Ok(())
    }

    /// Waits until the writer of `epoch` on `host` answers the move request `done` (its
    /// progress shown meanwhile); a failure deletes the request.
    pub(super) async fn await_move(
        &self,
        name: &str,
        from: u32,
        to: u32,
        epoch: u64,
        host: &str,
    ) -> Result<()> {
        let meta = self.meta();
        let outcome = loop {
            tokio::time::sleep(REMOTE_POLL).await;
            let req = meta.move_request(name).await;
            match req {
                Ok(Some((r, _))) if r.from == from && r.to == to => match r.state {
                    MoveRequestState::Done => break Ok(()),
                    MoveRequestState::Failed => {
                        break Err(refused(format!(
                            "the writer on {host}: {}",
                            r.error.unwrap_or_default()
                        )))
                    }
                    MoveRequestState::Asked | MoveRequestState::Copying => {
                        self.update_move(from, |m| m.progress = r.progress.clone())
                    }
                },
                Ok(_) => break Err(refused("the move request was replaced or deleted")),
                Err(e) => {
                    tracing::debug!(volume = name, "reading the move request: {e}");
                    continue;
                }
            }
            match meta.attachment(name).await {
                Ok(Some((a, _))) if a.epoch == epoch => {}
                Ok(_) => {
                    break Err(refused(format!(
                        "the writer on {host} detached or was replaced during the move; run the command again"
                    )))
                }
                Err(_) => {}
            }
        };
        if outcome.is_err() {
            let _ = meta.delete_move_request(name).await;
        }
        outcome
    }
}

/// The writer's half of a move off `from` onto `to`, asked by the manager: a mirror's new
/// copy sits beside the old one until it is in sync ([`copy_then_retire`]); a parity copy
/// follows the old one's place until it is whole, then takes it ([`follow_then_promote`]).
/// Either way the old copy serves until the new one can.
pub async fn move_as_writer(
    meta: &trireme_meta::ClusterMeta,
    writer: &Volume,
    from: u32,
    to: u32,
    rate: Option<u64>,
    progress: &mut (dyn FnMut(Option<&ResyncProgress>) + Send),
) -> Result<()> {
    match writer.info().layout.is_mirror() {
        true => copy_then_retire(meta, writer, from, to, rate, progress).await,
        false => follow_then_promote(meta, writer, from, to, rate, progress).await,
    }
}

/// Steps 2 and 3 as the writer does them: adds the replica on `to` (it takes new writes at
/// once), waits while the resync fills it (`progress` sees each look), then retires `from`.
/// Fails if the writer is fenced by a newer attach meanwhile.
pub(super) async fn copy_then_retire(
    meta: &trireme_meta::ClusterMeta,
    writer: &Volume,
    from: u32,
    to: u32,
    rate: Option<u64>,
    progress: &mut (dyn FnMut(Option<&ResyncProgress>) + Send),
) -> Result<()> {
    writer.add_replica(to, rate).await?;
    wait_in_sync(meta, writer, to, progress).await?;
    check_snapshots_moved(meta, writer, from, to).await?;
    writer
        .retire_replica(from)
        .await
        .map_err(ManagerError::from)
}

/// A parity copy's move as the writer does it (`parity.rs`): the copy on `to`, on record
/// beside the one on `from` (`moving_from` it), follows `from`'s place while its resync
/// rebuilds it whole (`progress` sees each look), then takes the place; the old copy serves
/// until then. The same on a writer here and on another host (through a [`MoveRequest`]); one
/// that finds `to` in place already (a move resumed through a newer writer) has nothing to
/// do. Fails if the writer is fenced meanwhile, or drops the new copy.
pub(super) async fn follow_then_promote(
    meta: &trireme_meta::ClusterMeta,
    writer: &Volume,
    from: u32,
    to: u32,
    rate: Option<u64>,
    progress: &mut (dyn FnMut(Option<&ResyncProgress>) + Send),
) -> Result<()> {
    writer.follow_replica(from, to, rate).await?;
    loop {
        still_the_writer(meta, writer).await?;
        match writer.caught_up(to) {
            Some(Following::CaughtUp | Following::InPlace) => break,
            Some(Following::Filling) => {
                let view = writer.replica_views().into_iter().find(|r| r.node == to);
                progress(view.and_then(|r| r.resync).as_ref());
            }
            None => {
                return Err(refused(format!(
                    "the writer dropped the new copy on node {to}"
                )))
            }
        }
        tokio::time::sleep(POLL).await;
    }
    progress(None);
    writer
        .promote_replica(from, to)
        .await
        .map_err(ManagerError::from)
}

/// Refused once a newer attach has fenced `writer`: a move goes on only through the
/// volume's writer.
async fn still_the_writer(meta: &trireme_meta::ClusterMeta, writer: &Volume) -> Result<()> {
    let epoch = meta.volume(&writer.info().name).await?.epoch;
    match epoch == writer.info().epoch {
        true => Ok(()),
        false => Err(refused(
            "the writer was fenced by a newer attach; run the command again",
        )),
    }
}

/// Waits until `writer` has its copy on `to` in sync (`progress` sees each look, and `None`
/// at the end). Fails if the writer is fenced by a newer attach, or drops the copy.
async fn wait_in_sync(
    meta: &trireme_meta::ClusterMeta,
    writer: &Volume,
    to: u32,
    progress: &mut (dyn FnMut(Option<&ResyncProgress>) + Send),
) -> Result<()> {
    loop {
        still_the_writer(meta, writer).await?;
        let view = writer.replica_views().into_iter().find(|r| r.node == to);
        match view {
            Some(r) if r.state == ReplicaState::InSync => break,
            Some(r) => progress(r.resync.as_ref()),
            None => {
                return Err(refused(format!(
                    "the writer dropped the new copy on node {to}"
                )))
            }
        }
        tokio::time::sleep(POLL).await;
    }
    progress(None);
    Ok(())
}

/// Snapshots move with a copy (the new one is given them before its resync, `trireme_client`'s
/// `catch_up.rs`): the old copy is retired only if the new one holds every snapshot, ready on
/// record, that the old one holds. An old copy that does not answer (a removal of a dead
/// node) has nothing left to lose.
async fn check_snapshots_moved(
    meta: &trireme_meta::ClusterMeta,
    writer: &Volume,
    from: u32,
    to: u32,
) -> Result<()> {
    let Ok(old) = writer.snapshot_ids_on(from).await else {
        return Ok(());
    };
    if old.is_empty() {
        return Ok(());
    }
    let new = writer.snapshot_ids_on(to).await?;
    let v = meta.volume(&writer.info().name).await?;
    let lacking: Vec<String> = meta
        .snapshots(&v)
        .await?
        .into_iter()
        .filter(|s| s.state == trireme_meta::SnapshotState::Ready)
        .filter(|s| old.contains(&s.id) && !new.contains(&s.id))
        .map(|s| format!("{}@{}", v.name, s.name))
        .collect();
    if lacking.is_empty() {
        return Ok(());
    }
    Err(refused(format!(
        "the new copy on node {to} lacks snapshot(s) {} that the copy on node {from} holds (giving them to it failed: see the writer's log); the old copy is kept",
        lacking.join(", ")
    )))
}
