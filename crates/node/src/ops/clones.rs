//! Clones on the node: create a replica as a clone of a snapshot of another replica here,
//! flatten one; and what depends on a parent (a snapshot a clone reads is not deleted, nor a
//! replica clones read from).

use bytes::Bytes;
use trireme_proto::{CloneRequest, Header, Status};
use trireme_transport::Frame;

use crate::{Node, Refusal};

impl Node {
    /// `CreateClone`: as `CreateReplica`, within the node's room, then tied to its parent
    /// before anything can reach it; all or nothing.
    pub(crate) fn on_create_clone(&self, req: &Frame) -> Result<Bytes, Refusal> {
        let h = &req.header;
        let c = CloneRequest::decode(&req.payload)
            .map_err(|e| Refusal(Status::Invalid, e.to_string()))?;
        let mut reps = self.replicas.write().unwrap_or_else(|e| e.into_inner());
        let parent = reps.get(&c.parent).cloned().ok_or_else(|| {
            Refusal(
                Status::NoReplica,
                format!(
                    "the parent volume {} has no replica on node {}",
                    c.parent, self.id
                ),
            )
        })?;
        self.check_room(&reps, h.length)?;
        let r = self.store.create(h.volume, h.length)?;
        if let Err(e) = r.set_backing(parent, c.snapshot) {
            let _ = self.store.delete(h.volume);
            return Err(e.into());
        }
        reps.insert(h.volume, r);
        drop(reps);
        self.activity.forget(h.volume);
        self.integrity.forget(h.volume);
        tracing::info!(
            node = self.id,
            volume = h.volume,
            parent = c.parent,
            snapshot = c.snapshot,
            "created a clone"
        );
        Ok(Bytes::new())
    }

    /// `Flatten`: the clone's blocks copied from its parent while I/O goes on.
    pub(crate) fn on_flatten(&self, h: &Header) -> Result<Bytes, Refusal> {
        let r = self.replica(h.volume)?;
        let Some(b) = r.backing() else {
            return Ok(Bytes::new());
        };
        let t0 = std::time::Instant::now();
        r.flatten()?;
        tracing::info!(
            node = self.id,
            volume = h.volume,
            parent = b.parent,
            copied = b.from_parent,
            ms = t0.elapsed().as_millis() as u64,
            "flattened a clone"
        );
        Ok(Bytes::new())
    }

    /// Refuses to take away what a clone on this node reads: snapshot `id` of `volume`, or
    /// (`None`) any of its snapshots, the replica itself.
    pub(crate) fn check_no_clone_reads(&self, volume: u64, id: Option<u64>) -> Result<(), Refusal> {
        let reps = self.replicas.read().unwrap_or_else(|e| e.into_inner());
        let mut clones: Vec<u64> = reps
            .values()
            .filter_map(|r| Some((r.volume(), r.backing()?)))
            .filter(|(_, b)| b.parent == volume && id.is_none_or(|id| b.snapshot == id))
            .map(|(v, _)| v)
            .collect();
        if clones.is_empty() {
            return Ok(());
        }
        clones.sort_unstable();
        let what = match id {
            Some(id) => format!("snapshot {id} of volume {volume}"),
            None => format!("the replica of volume {volume}"),
        };
        Err(Refusal(
            Status::InUse,
            format!(
                "{what} is read by the clones {clones:?} on node {}: flatten or delete them first",
                self.id
            ),
        ))
    }

    /// Ties every clone found at start to its parent's replica here.
    pub(crate) fn link_clones(&self) {
        let reps = self.replicas.read().unwrap_or_else(|e| e.into_inner());
        for r in reps.values() {
            let Some(b) = r.backing() else { continue };
            let linked = match reps.get(&b.parent) {
                Some(p) => r.link_backing(p.clone()).map_err(|e| e.to_string()),
                None => Err(format!("volume {} has no replica here", b.parent)),
            };
            if let Err(why) = linked {
                tracing::error!(
                    node = self.id,
                    volume = r.volume(),
                    parent = b.parent,
                    snapshot = b.snapshot,
                    "a clone's parent is missing: its blocks not yet written cannot be read: {why}"
                );
            }
        }
    }
}
