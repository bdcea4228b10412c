//! A resync's plan, as a state machine with no I/O and no clock.
//!
//! A replica that comes back is brought in sync region by region: each region is copied from
//! an in-sync replica (under the region's place in the write order), a few at a time; in an
//! incremental resync the survivors' records then forget the copied regions, in batches; and
//! the whole runs no faster than the rate asked for. [`ResyncPlan`] says what to do next; the
//! writer does it and reports back. Time comes in as an argument (virtual in the simulator), so
//! a seeded run with a rate limit replays exactly.

use std::time::Duration;

use crate::{ReplicaState, ResyncProgress};

/// Largest region one resync step copies (and a full resync's unit of comparison).
pub const CHUNK: u64 = 1 << 20;
/// Regions copied at once.
pub const PARALLEL: usize = 32;
/// Copied regions cleared on the survivors per batch.
pub const CLEAR_BATCH: usize = 256;

/// Whether a returning replica can be brought back from the survivors' records of what it
/// missed: only if it was merely outdated and answers with the incarnation it had when it
/// went out (`known`, 0 if unknown). Otherwise its history is unknown: every region is
/// compared by checksum and those that differ are copied.
pub fn incremental(state: ReplicaState, known: u64, returned: u64) -> bool {
    state == ReplicaState::Outdated && known != 0 && known == returned
}

/// Every region of a volume of `size` bytes, for a full resync.
pub fn all_chunks(size: u64) -> Vec<(u64, u64)> {
    union_chunks(vec![(0, size)])
}

/// The union of `(offset, len)` ranges, in order, each as long as it runs.
pub fn union_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (o, l) in ranges.into_iter().filter(|r| r.1 > 0) {
        match merged.last_mut() {
            Some((mo, ml)) if o <= *mo + *ml => *ml = (*ml).max(o + l - *mo),
            _ => merged.push((o, l)),
        }
    }
    merged
}

/// The union of `(offset, len)` ranges, in order, split into regions of at most [`CHUNK`].
pub fn union_chunks(ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (o, l) in union_ranges(ranges) {
        let mut p = o;
        while p < o + l {
            let n = CHUNK.min(o + l - p);
            out.push((p, n));
            p += n;
        }
    }
    out
}

/// What the writer does next for a resync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResyncStep {
    /// Copy these regions (each under its range in the write order), then report
    /// [`ResyncPlan::copied`] with the bytes actually written.
    Copy(Vec<(u64, u64)>),
    /// The survivors may forget these regions of their record (they are copied).
    Clear(Vec<(u64, u64)>),
    /// Wait until the resync has run this long, to keep to the rate.
    WaitUntil(Duration),
    /// Every region is copied.
    Done,
}

/// A resync's regions and how far it got.
#[derive(Debug, Clone)]
pub struct ResyncPlan {
    chunks: Vec<(u64, u64)>,
    /// Regions handed out so far.
    next: usize,
    /// A `Copy` step whose result is not reported yet.
    copying: Option<usize>,
    /// Copied regions the survivors still record (incremental resyncs only).
    to_clear: Vec<(u64, u64)>,
    progress: ResyncProgress,
}

impl ResyncPlan {
    /// A plan over `chunks` (from [`union_chunks`] or [`all_chunks`]); `full` when every
    /// region is compared rather than known to differ.
    pub fn new(chunks: Vec<(u64, u64)>, full: bool) -> ResyncPlan {
        let total_bytes = chunks.iter().map(|c| c.1).sum();
        ResyncPlan {
            chunks,
            next: 0,
            copying: None,
            to_clear: Vec::new(),
            progress: ResyncProgress {
                full,
                total_bytes,
                done_bytes: 0,
                copied_bytes: 0,
                elapsed_ms: 0,
            },
        }
    }

    /// What to do now, `elapsed` into the resync, at `rate` bytes per second at most (the
    /// rate may change while it runs).
    pub fn next(&mut self, elapsed: Duration, rate: Option<u64>) -> ResyncStep {
        assert!(
            self.copying.is_none(),
            "a copy's result is not reported yet"
        );
        self.progress.elapsed_ms = elapsed.as_millis() as u64;
        let last = self.next == self.chunks.len();
        if !self.to_clear.is_empty() && (self.to_clear.len() >= CLEAR_BATCH || last) {
            return ResyncStep::Clear(std::mem::take(&mut self.to_clear));
        }
        if let Some(rate) = rate.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(self.progress.done_bytes as f64 / rate as f64);
            if due > elapsed {
                return ResyncStep::WaitUntil(due);
            }
        }
        if last {
            return ResyncStep::Done;
        }
        let end = (self.next + PARALLEL).min(self.chunks.len());
        self.copying = Some(end);
        ResyncStep::Copy(self.chunks[self.next..end].to_vec())
    }

    /// The last `Copy` step is done; `copied` bytes were written (a full resync skips regions
    /// that already match).
    pub fn copied(&mut self, copied: u64) {
        let end = self.copying.take().expect("a copy step was handed out");
        let group = &self.chunks[self.next..end];
        self.progress.done_bytes += group.iter().map(|c| c.1).sum::<u64>();
        self.progress.copied_bytes += copied;
        if !self.progress.full {
            self.to_clear.extend_from_slice(group);
        }
        self.next = end;
    }

    pub fn progress(&self) -> &ResyncProgress {
        &self.progress
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_an_outdated_replica_with_its_known_history_resyncs_incrementally() {
        use ReplicaState::*;
        assert!(incremental(Outdated, 7, 7));
        assert!(!incremental(Outdated, 7, 8), "re-created meanwhile");
        assert!(!incremental(Outdated, 0, 0), "history unknown");
        assert!(!incremental(Failed, 7, 7), "recorded failed");
    }

    #[test]
    fn chunks_merge_overlaps_and_split_at_the_chunk_size() {
        let r = union_chunks(vec![
            (4096, 4096),
            (0, 8192),
            (65536, 32768),
            (8192, 65536),
            (CHUNK - 10, 30),
            (5 << 20, 4096),
        ]);
        assert_eq!(r, vec![(0, 98304), (CHUNK - 10, 30), (5 << 20, 4096)]);
        let big = union_chunks(vec![(0, 3 * CHUNK + 1)]);
        assert_eq!(big.len(), 4);
        assert_eq!(big[3], (3 * CHUNK, 1));
        assert_eq!(all_chunks(0), vec![]);
    }

    proptest! {
        /// Driven in virtual time: every region is copied once, in order; an incremental
        /// resync clears each copied region once, after its copy, in batches; a full one
        /// clears nothing; no copy starts ahead of the rate; the plan ends.
        #[test]
        fn a_resync_copies_each_region_once_and_keeps_to_its_rate(
            regions in prop::collection::vec((0u64..4096, 1u64..(3 * CHUNK)), 0..20),
            full in any::<bool>(),
            rate in prop_oneof![Just(None), (1u64..(64 << 20)).prop_map(Some)],
            costs in prop::collection::vec(0u64..200, 1..50),
        ) {
            let chunks = union_chunks(regions.iter().map(|&(o, l)| (o * 4096, l)).collect());
            let mut plan = ResyncPlan::new(chunks.clone(), full);
            let mut now = Duration::ZERO;
            let mut costs = costs.into_iter().cycle();
            let mut copied: Vec<(u64, u64)> = Vec::new();
            let mut cleared: Vec<(u64, u64)> = Vec::new();
            for _ in 0..100_000 {
                match plan.next(now, rate) {
                    ResyncStep::Copy(group) => {
                        prop_assert!(!group.is_empty() && group.len() <= PARALLEL);
                        if let Some(r) = rate {
                            let done: u64 = copied.iter().map(|c| c.1).sum();
                            prop_assert!(done as f64 / r as f64 <= now.as_secs_f64() + 1e-9);
                        }
                        copied.extend_from_slice(&group);
                        now += Duration::from_millis(costs.next().unwrap());
                        plan.copied(group.iter().map(|c| c.1).sum());
                    }
                    ResyncStep::Clear(batch) => {
                        prop_assert!(!full);
                        prop_assert!(batch.len() <= CLEAR_BATCH + PARALLEL);
                        for c in &batch {
                            prop_assert!(copied.contains(c) && !cleared.contains(c));
                        }
                        cleared.extend(batch);
                    }
                    ResyncStep::WaitUntil(t) => {
                        prop_assert!(t > now);
                        now = t;
                    }
                    ResyncStep::Done => {
                        prop_assert_eq!(&copied, &chunks);
                        if full {
                            prop_assert!(cleared.is_empty());
                        } else {
                            prop_assert_eq!(&cleared, &chunks);
                        }
                        let p = plan.progress();
                        prop_assert_eq!(p.done_bytes, p.total_bytes);
                        return Ok(());
                    }
                }
            }
            prop_assert!(false, "the plan did not end");
        }
    }
}
