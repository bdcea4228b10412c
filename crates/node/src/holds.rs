//! Readers' holds on snapshots: a `VOLUME@SNAP` export holds its snapshot on every copy, for
//! [`HOLD_SECS`] each time it asks (every few seconds while it serves), so that a
//! `snapshot delete` meant for something else does not pull the snapshot from under it (issue
//! 63: the delete was allowed, and the export answered EIO with no log line). A delete of a
//! held snapshot is refused, naming the holders, unless forced; a hold of a reader that died
//! lapses by itself.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use trireme_proto::HOLD_SECS;

/// Per (volume, snapshot): who holds it, and until when.
type ByVersion = HashMap<(u64, u64), Vec<(String, Instant)>>;

/// The holds on each (volume, snapshot) of the node.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    holds: Mutex<ByVersion>,
}

impl Holds {
    fn map(&self) -> std::sync::MutexGuard<'_, ByVersion> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `who` holds snapshot `snap` of `volume` for [`HOLD_SECS`] from now.
    pub(crate) fn hold(&self, volume: u64, snap: u64, who: &str) {
        let until = Instant::now() + Duration::from_secs(HOLD_SECS);
        let mut m = self.map();
        let list = m.entry((volume, snap)).or_default();
        match list.iter_mut().find(|(w, _)| w == who) {
            Some(h) => h.1 = until,
            None => list.push((who.to_string(), until)),
        }
    }

    /// `who` lets snapshot `snap` of `volume` go.
    pub(crate) fn release(&self, volume: u64, snap: u64, who: &str) {
        if let Some(list) = self.map().get_mut(&(volume, snap)) {
            list.retain(|(w, _)| w != who);
        }
    }

    /// Who holds snapshot `snap` of `volume` now (lapsed holds are dropped).
    pub(crate) fn holders(&self, volume: u64, snap: u64) -> Vec<String> {
        let now = Instant::now();
        let mut m = self.map();
        let Some(list) = m.get_mut(&(volume, snap)) else {
            return Vec::new();
        };
        list.retain(|(_, until)| *until > now);
        let out = list.iter().map(|(w, _)| w.clone()).collect();
        if list.is_empty() {
            m.remove(&(volume, snap));
        }
        out
    }

    /// The snapshot (or the whole replica, `None`) is gone: so are its holds.
    pub(crate) fn forget(&self, volume: u64, snap: Option<u64>) {
        self.map()
            .retain(|&(v, s), _| v != volume || snap.is_some_and(|x| x != s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_name_their_holders_and_go_with_their_snapshot() {
        let h = Holds::default();
        h.hold(1, 5, "a");
        h.hold(1, 5, "b");
        h.hold(1, 5, "a");
        h.hold(1, 6, "c");
        assert_eq!(h.holders(1, 5), ["a", "b"]);
        h.release(1, 5, "b");
        assert_eq!(h.holders(1, 5), ["a"]);
        h.hold(1, 5, "b");
        assert!(h.holders(2, 5).is_empty());
        h.forget(1, Some(5));
        assert!(h.holders(1, 5).is_empty());
        assert_eq!(h.holders(1, 6), ["c"]);
        h.forget(1, None);
        assert!(h.holders(1, 6).is_empty());
    }
}
