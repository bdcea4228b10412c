//! What a node notes of its copies' integrity until a scrub verifies them (issue 63).
//!
//! * **An unclean stop.** The last process died with the copy open. The node trusts what its
//!   activity log says of it (the seals kept outside the log's extents, the writer's record of
//!   what the copy missed); a mistake there would hide a bad block behind "in sync". So the
//!   copy counts as unverified until a scrub has compared it with the others.
//! * **Bad blocks.** Reads (and checksums) that met a block failing its checksum, counted by
//!   the store (`Replica::bad_blocks`). The writer repairs the block it read; the rest of the
//!   copy may hold more, so it is not trusted either until a scrub has gone over it.
//!
//! `ReplicaInfo` reports both ([`ReplicaIntegrity`]); the manager turns them into the volume's
//! health (`unverified`, `degraded` with the node named) and a scrub, and the scrub, once it
//! has compared and repaired every region, hands back the token it read at its end in
//! `Verified`, which clears what that token covers. The token names this process (its high
//! 32 bits, random per process) and the store's count of bad blocks (its low 32 bits): a scrub
//! that began under an earlier process clears nothing, nor does one a later bad block
//! outlives.

use std::collections::HashMap;
use std::sync::Mutex;

use trireme_proto::ReplicaIntegrity;
use trireme_store::Replica;

#[derive(Debug, Default, Clone, Copy)]
struct Note {
    unclean: bool,
    /// The store's count of bad blocks a scrub last cleared up to.
    cleared: u64,
}

/// The notes of every replica on the node (see the module docs).
#[derive(Debug)]
pub(crate) struct Integrity {
    run: u32,
    notes: Mutex<HashMap<u64, Note>>,
}

impl Default for Integrity {
    fn default() -> Integrity {
        Integrity {
            run: (trireme_store::new_incarnation() >> 32) as u32,
            notes: Mutex::default(),
        }
    }
}

impl Integrity {
    fn notes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Note>> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replica `r` was opened by this process (after an unclean stop, or not).
    pub(crate) fn opened(&self, r: &dyn Replica) {
        let note = Note {
            unclean: r.unclean_stop(),
            cleared: 0,
        };
        if note.unclean {
            tracing::warn!(
                volume = r.volume(),
                "the copy was open when the node stopped: unverified until a scrub compares it"
            );
        }
        self.notes().insert(r.volume(), note);
    }

    /// A replica created or deleted: nothing is noted of it.
    pub(crate) fn forget(&self, volume: u64) {
        self.notes().remove(&volume);
    }

    /// What is noted of replica `r`.
    pub(crate) fn report(&self, r: &dyn Replica) -> ReplicaIntegrity {
        let note = self.notes().get(&r.volume()).copied().unwrap_or_default();
        let bad = r.bad_blocks();
        ReplicaIntegrity {
            unclean: note.unclean,
            bad_blocks: bad.seen.saturating_sub(note.cleared),
            last_bad_offset: bad.last_offset,
            token: (u64::from(self.run) << 32) | (bad.seen & 0xffff_ffff),
        }
    }

    /// A scrub verified replica `r` up to `token`: the unclean stop and the bad blocks it
    /// covers are cleared. `Err` for a token of another process (nothing cleared).
    pub(crate) fn verified(&self, r: &dyn Replica, token: u64) -> Result<(), String> {
        if (token >> 32) as u32 != self.run {
            return Err(format!(
                "token {token:#x} names another run of this node (it restarted since the scrub looked)"
            ));
        }
        let seen = r.bad_blocks().seen;
        // The count's high bits from now: it grows by one per bad block met.
        let upto = (seen & !0xffff_ffff) | (token & 0xffff_ffff);
        let upto = if upto > seen { seen } else { upto };
        let mut notes = self.notes();
        let note = notes.entry(r.volume()).or_default();
        note.unclean = false;
        note.cleared = note.cleared.max(upto);
        tracing::info!(
            volume = r.volume(),
            bad_blocks_left = seen - note.cleared,
            "a scrub verified the copy"
        );
        Ok(())
    }
}
