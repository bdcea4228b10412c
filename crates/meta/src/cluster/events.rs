//! The cluster's events (`events/<seq>`): what changed, in words, as the manager saw it — a
//! node down or back, a replica taken out or resynced, a volume's health word changing, a
//! drain's steps, the manager role moving. They live in the metadata store, not in the
//! manager's memory, so they outlive the manager that recorded them: its successor, on
//! another host, shows the same list and goes on from it.
//!
//! Beside them, `events-seen` holds what the recorder last compared against (its own format,
//! opaque here), so a new manager tells what changed while the role moved. The newest
//! [`EVENTS_KEPT`] are kept; older ones are deleted as new ones come.

use serde::{Deserialize, Serialize};

use super::*;
use crate::kv::{Compare, Op};
use crate::MetaError;

/// Events kept in the store.
pub const EVENTS_KEPT: usize = 200;

/// Most events one call records: etcd takes at most 128 operations in a transaction, and a
/// call also deletes as many old ones. A larger burst keeps its first ones and says how many
/// more there were.
pub const EVENTS_PER_CALL: usize = 60;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// Its number: events are numbered in the order they were recorded, from 1.
    #[serde(default)]
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `node-down`, `node-up`, `replica`, `resync-done`, `volume`, `health`, `move`,
    /// `manager`, `scrub`.
    pub kind: String,
    pub text: String,
}

impl ClusterEvent {
    pub fn new(time_ms: u64, kind: &str, text: String) -> ClusterEvent {
        ClusterEvent {
            seq: 0,
            time_ms,
            kind: kind.to_string(),
            text,
        }
    }
}

fn event_key(seq: u64) -> String {
    key(&format!("events/{seq:020}"))
}

fn seen_key() -> String {
    key("events-seen")
}

impl ClusterMeta {
    /// The events kept, oldest first; the last `limit` of them if given.
    pub async fn events(&self, limit: Option<usize>) -> Result<Vec<ClusterEvent>, MetaError> {
        let prefix = key("events/");
        let (kvs, _) = self.store().range(&prefix).await?;
        let skip = limit.map_or(0, |l| kvs.len().saturating_sub(l));
        let mut out = Vec::with_capacity(kvs.len() - skip);
        for kv in &kvs[skip..] {
            match decode::<ClusterEvent>(kv) {
                Ok(e) => out.push(e),
                // One bad record costs itself, not the list.
                Err(e) => tracing::warn!("{e}"),
            }
        }
        Ok(out)
    }

    /// What the recorder last compared against, with its revision (see the module doc).
    pub async fn events_seen(&self) -> Result<Option<(Vec<u8>, i64)>, MetaError> {
        Ok(self
            .store()
            .get(&seen_key())
            .await?
            .map(|kv| (kv.value, kv.mod_revision)))
    }

    /// Appends `events` (numbered here) and puts `seen` in one transaction, deleting the
    /// oldest beyond [`EVENTS_KEPT`]. `seen_rev` is the revision of the `seen` read (0: none):
    /// if another recorder wrote since, nothing is written and `Ok(None)` says so; else the
    /// new revision of `seen`.
    pub async fn record_events(
        &self,
        events: &[ClusterEvent],
        seen: &[u8],
        seen_rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.append(events, Some((seen, seen_rev))).await
    }

    /// Appends `events` that are not the recorder's (a scrub's outcome), numbered after the
    /// newest.
    pub async fn append_events(&self, events: &[ClusterEvent]) -> Result<(), MetaError> {
        for _ in 0..MAX_TRIES {
            if self.append(events, None).await?.is_some() {
                return Ok(());
            }
        }
        Err(MetaError::Refused(
            "events: too many conflicting writers".into(),
        ))
    }

    async fn append(
        &self,
        events: &[ClusterEvent],
        seen: Option<(&[u8], i64)>,
    ) -> Result<Option<i64>, MetaError> {
        let mut events = events.to_vec();
        if events.len() > EVENTS_PER_CALL {
            let more = events.len() - (EVENTS_PER_CALL - 1);
            let t = events[EVENTS_PER_CALL - 1].time_ms;
            events.truncate(EVENTS_PER_CALL - 1);
            events.push(ClusterEvent::new(
                t,
                "more",
                format!("and {more} more changes at once"),
            ));
        }
        let prefix = key("events/");
        let (kvs, _) = self.store().range(&prefix).await?;
        let last = kvs
            .last()
            .and_then(|kv| kv.key.strip_prefix(&prefix))
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        // The oldest beyond the limit go.
        let extra = (kvs.len() + events.len()).saturating_sub(EVENTS_KEPT);
        let mut ops = Vec::new();
        for kv in kvs.iter().take(extra) {
            ops.push(Op::delete(kv.key.clone()));
        }
        for (i, e) in events.iter().enumerate() {
            let seq = last + 1 + i as u64;
            let e = ClusterEvent { seq, ..e.clone() };
            ops.push(Op::put(event_key(seq), encode(&e)));
        }
        // Two writers numbering events at once: the second finds its first number taken.
        let mut compare = vec![Compare::absent(event_key(last + 1))];
        if let Some((seen, seen_rev)) = seen {
            ops.push(Op::put(seen_key(), seen.to_vec()));
            // An absent key compares as revision 0.
            compare.push(Compare::mod_revision(seen_key(), seen_rev));
        }
        Ok(self.write(compare, ops).await?.map(|r| r.revision))
    }
}
