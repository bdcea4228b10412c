//! The extents the last first-extents query returned, to answer the next queries that start
//! inside them without a round trip to a node.
//!
//! qemu asks block status one extent at a time (`REQ_ONE`), each request where the last
//! extent ended: 72,000 round trips to a node for `qemu-img map` of a fragmented volume. A
//! node answers the first [`FIRST_EXTENTS`](trireme_proto::FIRST_EXTENTS) at once, so all but
//! one request in a thousand are answered from here (issue 63).
//!
//! What a volume's extents say changes only with its writes: each write, zeroing, trim,
//! rollback or resize that ends bumps [`ExtentCache::changed`], and an answer asked before
//! it is not used after it. A snapshot never changes: its reader never bumps it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use trireme_proto::{Extent, FIRST_EXTENTS};

use crate::Extents;

/// Which extents: the allocation, or what changed since a snapshot (a dirty bitmap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Allocation,
    ChangedSince(u64),
}

#[derive(Debug)]
struct Cached {
    kind: Kind,
    /// The count of changes when it was asked.
    asked_at: u64,
    start: u64,
    extents: Vec<Extent>,
}

#[derive(Debug, Default)]
pub(crate) struct ExtentCache {
    changes: AtomicU64,
    last: Mutex<Option<Cached>>,
}

impl ExtentCache {
    /// A change to what the extents say ended (see the module docs).
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The count of changes now: what an answer asked from here is stamped with.
    pub(crate) fn stamp(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The extents of `kind` from `offset`, as `want` asks (at most `len` bytes), if the last
    /// answer covers `offset` and nothing changed since it was asked.
    pub(crate) fn get(
        &self,
        kind: Kind,
        offset: u64,
        len: u64,
        want: Extents,
    ) -> Option<Vec<Extent>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let c = last.as_ref()?;
        if c.kind != kind || c.asked_at != self.stamp() || offset < c.start {
            return None;
        }
        let mut pos = c.start;
        let mut out = Vec::new();
        let most = match want {
            Extents::One => 1,
            _ => FIRST_EXTENTS,
        };
        let mut left = len;
        for e in &c.extents {
            let end = pos + e.length;
            if end > offset && left > 0 && out.len() < most {
                let from = pos.max(offset);
                let n = (end - from).min(left);
                out.push(Extent {
                    length: n,
                    flags: e.flags,
                });
                left -= n;
            }
            pos = end;
        }
        // The last cached extent may go on past what was asked of the node: never answer
        // from it alone (its end is unknown), ask instead.
        let whole = out.len() > 1 || pos > offset + (len - left);
        (!out.is_empty() && whole).then_some(out)
    }

    /// The extents of `kind` from `offset` as `want` asks: all of them from `ask`, or the first
    /// from the last answer if it covers `offset` and nothing changed since, else from `ask`
    /// (called with what to ask a node for: as many as it gives at once), kept for the next.
    pub(crate) async fn answer<F, Fut>(
        &self,
        kind: Kind,
        offset: u64,
        len: u64,
        want: Extents,
        ask: F,
    ) -> Result<Vec<Extent>, crate::VolumeError>
    where
        F: FnOnce(Extents) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Extent>, crate::VolumeError>>,
    {
        if want == Extents::All {
            return ask(want).await;
        }
        if let Some(e) = self.get(kind, offset, len, want) {
            return Ok(e);
        }
        let stamp = self.stamp();
        tracing::trace!(offset, len, ?kind, "extent cache miss");
        let mut e = ask(Extents::First).await?;
        self.put(kind, stamp, offset, e.clone());
        if want == Extents::One {
            e.truncate(1);
        }
        Ok(e)
    }

    /// Keeps `extents` of `kind` from `start`, asked at `stamp`.
    pub(crate) fn put(&self, kind: Kind, stamp: u64, start: u64, extents: Vec<Extent>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Cached {
            kind,
            asked_at: stamp,
            start,
            extents,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(length: u64, flags: u32) -> Extent {
        Extent { length, flags }
    }

    #[test]
    fn queries_inside_the_last_answer_are_answered_until_a_change() {
        let c = ExtentCache::default();
        let k = Kind::Allocation;
        assert_eq!(c.get(k, 0, 100, Extents::One), None);
        c.put(k, c.stamp(), 100, vec![e(10, 0), e(20, 3), e(30, 0)]);
        assert_eq!(c.get(k, 50, 1000, Extents::One), None, "before it");
        assert_eq!(c.get(k, 100, 1000, Extents::One), Some(vec![e(10, 0)]));
        assert_eq!(c.get(k, 115, 1000, Extents::One), Some(vec![e(15, 3)]));
        assert_eq!(
            c.get(k, 105, 1000, Extents::First),
            Some(vec![e(5, 0), e(20, 3), e(30, 0)])
        );
        assert_eq!(
            c.get(k, 105, 10, Extents::First),
            Some(vec![e(5, 0), e(5, 3)])
        );
        // The last extent alone: its end is not known here.
        assert_eq!(c.get(k, 140, 1000, Extents::One), None);
        assert_eq!(c.get(Kind::ChangedSince(1), 100, 10, Extents::One), None);
        c.changed();
        assert_eq!(c.get(k, 100, 1000, Extents::One), None, "a write since");
    }
}
