//! Moving a parity volume's copy through its writer on another host (`parity.rs` has the
//! steps; here each that needs the writer is a request to it, as a planned restart's and a
//! mirror's move are):
//!
//! | step | who | how |
//! |---|---|---|
//! | 1. the old copy out | the writer | a [`TakeOutRequest`], answered `out` (or `refused`, below the minimum of copies) |
//! | 2. the new copy on record in the old one's place, created | the manager | `record_replacement` |
//! | 3. the new copy in the old one's place in the stripes, rebuilt whole | the writer | a [`MoveRequest`] (`move_as_writer`) |
//! | 4. the move forgotten, the old copy deleted | the manager | `finish_replacement` |
//!
//! The take-out request holds the old copy out of the writer's resyncs from step 1 until the
//! replacement lets it go; it is deleted at the end, or when a step fails (the writer then
//! brings the old copy back). A move run again finds the copy an earlier attempt recorded
//! (`moving_from`) and asks the writer for step 3 alone.

use trireme_meta::{TakeOutRequest, TakeOutState, VolumeRecord};

use crate::error::refused;
use crate::manager::{Manager, Result};

impl Manager {
    /// Moves `v`'s parity copy off `from` through the writer of `epoch` on `host`.
    pub(super) async fn replace_remote(
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
                let to = self.remote_place(v, from, epoch, host).await?;
                if let Err(e) = self.ask_move(name, from, to, rate, epoch, host).await {
                    let _ = self.meta().delete_takeout(name).await;
                    return Err(e);
                }
                to
            }
        };
        self.save_job(from).await;
        let rebuilt = self.await_move(name, from, to, epoch, host).await;
        // The old copy is out of the stripes (or, failed, comes back): the hold goes.
        let _ = self.meta().delete_takeout(name).await;
        rebuilt?;
        self.finish_replacement(name, from, to).await?;
        self.meta().delete_move_request(name).await?;
        Ok(())
    }

    /// Steps 1 and 2 (see the module docs): the node the new copy is on.
    async fn remote_place(
        &self,
        v: &VolumeRecord,
        from: u32,
        epoch: u64,
        host: &str,
    ) -> Result<u32> {
        if let Some(to) = self.resume_replacement(v, from).await? {
            return Ok(to);
        }
        let to = self.pick_target(v, Some(from)).await?;
        self.remote_take_out(&v.name, from, epoch, host).await?;
        super::parity::warn_meanwhile(v, from, to);
        let placed = match self.meta().volume(&v.name).await {
            Ok(now) => self.record_replacement(&now, from, to).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = placed {
            let _ = self.meta().delete_takeout(&v.name).await;
            return Err(e);
        }
        tracing::info!(volume = %v.name, from, to, host, "replacing a parity copy in its place through the volume's writer");
        Ok(to)
    }

    /// Asks the writer of `epoch` on `host` to take `name`'s copy on `from` out and hold it
    /// out, and waits for its answer.
    async fn remote_take_out(&self, name: &str, from: u32, epoch: u64, host: &str) -> Result<()> {
        let meta = self.meta();
        let req = TakeOutRequest {
            node: from,
            epoch,
            state: TakeOutState::Asked,
            error: None,
            resynced_bytes: 0,
            full: false,
        };
        // One left by a manager that died is replaced: jobs run under the manager role.
        let rev = meta.takeout(name).await?.map_or(0, |(_, r)| r);
        if meta.put_takeout(name, &req, rev).await?.is_none() {
            return Err(refused(format!(
                "volume {name}: its take-out request changed while it was being made"
            )));
        }
        let answered = self
            .takeout_reaches(
                name,
                |s| s != TakeOutState::Asked,
                crate::restart::ANSWER_LIMIT,
            )
            .await;
        let why = match answered {
            Ok(r) if r.state == TakeOutState::Out => return Ok(()),
            Ok(r) => format!("refused: {}", r.error.unwrap_or_default()),
            Err(e) => e.to_string(),
        };
        let _ = meta.delete_takeout(name).await;
        Err(refused(format!(
            "volume {name}: taking the copy on node {from} out, its writer on {host}: {why}"
        )))
    }
}
