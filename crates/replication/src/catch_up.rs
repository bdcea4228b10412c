//! Before a resync, the snapshots a returning or new copy lacks, as a step machine: which it
//! is given, from which base, which regions of each, at which size, and what a snapshot
//! deleted meanwhile changes.
//!
//! A copy out of sync when a snapshot is taken does not get it (the barrier goes to copies in
//! sync), and the new copy of a move starts with none. Before it takes any write it gets each
//! snapshot an in-sync copy (the source) holds and it lacks, oldest first:
//!
//! - **Its history known** (an incremental resync follows): the regions where it may differ
//!   from snapshot X are those the survivors recorded for it (outside them its head is the
//!   source's head) and those the source changed since X, and for a later snapshot also every
//!   region written for an earlier one. They are marked on the survivors' records first (a
//!   catch-up cut short leaves them to the resync), then written from X. Once X is given the
//!   copy's head is X everywhere, so the next snapshot Y is given only what differs between X
//!   and Y (every region again if X was deleted meanwhile). Resized to a smaller snapshot,
//!   the copy loses the head's bytes past its end: that range is marked too; a snapshot
//!   larger than the head (taken before the volume shrank) is given whole past the head's
//!   end, where the copy's head was cut.
//! - **Its history unknown** (a full resync follows): for X, the copy is rolled back to the
//!   latest snapshot it holds before X that the source holds too (a copy may keep one that
//!   failed everywhere else), and given what differs between that one and X; with none, the
//!   whole of X. Its head is rebuilt by the full resync.
//!
//! A snapshot has the size the volume had when it was taken: the copy is resized to it before
//! it is given X (and to a base's before a rollback); the runtime gives it the volume's size
//! back at the end, even after a failure ([`CatchUp::copy_size`]). A snapshot deleted while
//! it is used is skipped.

/// A snapshot, as a node lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snap {
    pub id: u64,
    pub size: u64,
}

/// What the runtime does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatchUpStep {
    /// Ask the survivors what the copy missed: report [`Report::Ranges`], or
    /// [`Report::Unknown`] if they cannot say.
    Dirty,
    /// The ranges the source changed since snapshot `from` (up to snapshot `to`, or to the
    /// head), in its first `upto` bytes: report [`Report::Ranges`] or [`Report::Deleted`].
    Changed {
        from: u64,
        to: Option<u64>,
        upto: u64,
    },
    /// Mark these regions on every survivor's record of what the copy misses.
    Mark(Vec<(u64, u64)>),
    /// Resize the copy to this many bytes.
    Resize(u64),
    /// Roll the copy back to this snapshot.
    Rollback(u64),
    /// Write these regions of snapshot `id` as the source holds it, flush, and take the
    /// snapshot on the copy.
    Give { id: u64, regions: Vec<(u64, u64)> },
    /// Nothing more to give.
    Done,
}

/// How a step went (a failure of another kind ends the catch-up: the runtime stops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Done; with the ranges a `Dirty` or `Changed` step asked for.
    Ranges(Vec<(u64, u64)>),
    Ok,
    /// A snapshot it used was deleted meanwhile.
    Deleted,
    /// The survivors cannot say what the copy missed.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ask the survivors what the copy missed.
    Dirty,
    /// Take the next snapshot the copy lacks.
    Next,
    /// Known history: what the source changed since X.
    KnownChanged,
    /// Known history: mark the regions on the survivors.
    KnownMark,
    /// Known history: what changed between the last one given and X.
    KnownDelta,
    /// Unknown history: the copy at the base's size, rolled back to it, then what changed
    /// between the base and X.
    BaseSize,
    Rollback,
    BaseChanged,
    /// The copy at X's size, then X given.
    GiveSize,
    Give,
    Done,
}

/// One copy's catch-up (see the module docs).
#[derive(Debug, Clone)]
pub struct CatchUp {
    missed: Vec<Snap>,
    /// Known history: the regions to be marked and given (grows with each snapshot). None:
    /// unknown history.
    regions: Option<Vec<(u64, u64)>>,
    /// Unknown history: what the copy holds that the source holds too.
    held: Vec<Snap>,
    next: usize,
    /// The snapshot at hand, and the head's size when it was taken up.
    at: Option<(Snap, u64)>,
    /// Known history: the last snapshot given (the copy's head is that one everywhere).
    given: Option<u64>,
    /// Unknown history: the base of the snapshot at hand.
    base: Option<Snap>,
    to_give: Vec<(u64, u64)>,
    /// The copy's size now, and the one a resize under way gives it.
    size: u64,
    resizing: Option<u64>,
    phase: Phase,
}

impl CatchUp {
    /// The catch-up of a copy `size` bytes long holding `mine`, whose source holds `theirs`;
    /// `incremental`: its history is known (the survivors are asked what it missed).
    pub fn new(mut theirs: Vec<Snap>, mine: &[Snap], incremental: bool, size: u64) -> CatchUp {
        theirs.sort_by_key(|s| s.id);
        let has = |id: u64, list: &[Snap]| list.iter().any(|s| s.id == id);
        let held = mine
            .iter()
            .copied()
            .filter(|m| has(m.id, &theirs))
            .collect();
        let missed: Vec<Snap> = theirs.into_iter().filter(|s| !has(s.id, mine)).collect();
        let phase = match (missed.is_empty(), incremental) {
            (true, _) => Phase::Done,
            (false, true) => Phase::Dirty,
            (false, false) => Phase::Next,
        };
        CatchUp {
            missed,
            regions: None,
            held,
            next: 0,
            at: None,
            given: None,
            base: None,
            to_give: Vec::new(),
            size,
            resizing: None,
            phase,
        }
    }

    /// The copy's size now: the runtime resizes it back to the volume's at the end.
    pub fn copy_size(&self) -> u64 {
        self.size
    }

    /// Whether the copy's history is known: the survivors said what it missed (false before
    /// they answered, and when they could not say).
    pub fn known(&self) -> bool {
        self.regions.is_some()
    }

    /// Unknown history: the base the snapshot at hand is given from (None: given whole).
    pub fn base(&self) -> Option<u64> {
        self.base.map(|b| b.id)
    }

    /// Whether it got past asking what the copy missed (the copy may have changed since).
    pub fn started(&self) -> bool {
        !matches!(self.phase, Phase::Dirty)
    }

    /// What to do next; `head`: the volume's size now. A step repeats until reported.
    pub fn step(&mut self, head: u64) -> CatchUpStep {
        loop {
            let at = self.at.map(|a| a.0);
            return match self.phase {
                Phase::Dirty => CatchUpStep::Dirty,
                Phase::Next => {
                    let Some(&x) = self.missed.get(self.next) else {
                        self.phase = Phase::Done;
                        continue;
                    };
                    self.next += 1;
                    self.at = Some((x, head));
                    self.phase = self.first_phase(x);
                    continue;
                }
                Phase::KnownChanged => {
                    let (x, then) = self.at.expect("a snapshot at hand");
                    CatchUpStep::Changed {
                        from: x.id,
                        to: None,
                        upto: x.size.min(then),
                    }
                }
                Phase::KnownMark => CatchUpStep::Mark(self.regions.clone().unwrap_or_default()),
                Phase::KnownDelta => CatchUpStep::Changed {
                    from: self.given.expect("a snapshot given"),
                    to: at.map(|x| x.id),
                    upto: at.expect("a snapshot at hand").size,
                },
                Phase::BaseSize | Phase::GiveSize => {
                    let want = match self.phase {
                        Phase::BaseSize => self.base.expect("a base").size,
                        _ => at.expect("a snapshot at hand").size,
                    };
                    if want == self.size {
                        self.phase = match self.phase {
                            Phase::BaseSize => Phase::Rollback,
                            _ => Phase::Give,
                        };
                        continue;
                    }
                    self.resizing = Some(want);
                    CatchUpStep::Resize(want)
                }
                Phase::Rollback => CatchUpStep::Rollback(self.base.expect("a base").id),
                Phase::BaseChanged => CatchUpStep::Changed {
                    from: self.base.expect("a base").id,
                    to: at.map(|x| x.id),
                    upto: at.expect("a snapshot at hand").size,
                },
                Phase::Give => CatchUpStep::Give {
                    id: at.expect("a snapshot at hand").id,
                    regions: self.to_give.clone(),
                },
                Phase::Done => CatchUpStep::Done,
            };
        }
    }

    /// Where snapshot `x` starts.
    fn first_phase(&mut self, x: Snap) -> Phase {
        if self.regions.is_some() {
            return Phase::KnownChanged;
        }
        self.base = self
            .held
            .iter()
            .copied()
            .filter(|h| h.id < x.id)
            .max_by_key(|h| h.id);
        if self.base.is_some() {
            return Phase::BaseSize;
        }
        self.to_give = vec![(0, x.size)];
        Phase::GiveSize
    }

    /// How the last step went.
    pub fn report(&mut self, r: Report) {
        if r == Report::Ok {
            if let Some(size) = self.resizing.take() {
                self.size = size;
            }
        }
        self.resizing = None;
        let known = self.regions.is_some();
        self.phase = match (self.phase, r) {
            (Phase::Dirty, Report::Ranges(v)) => {
                self.regions = Some(v);
                Phase::Next
            }
            (Phase::Dirty, _) => Phase::Next,
            // Known history, X deleted before it was looked at: on to the next.
            (Phase::KnownChanged, Report::Deleted) => Phase::Next,
            (Phase::KnownChanged, Report::Ranges(v)) => {
                let (x, head) = self.at.expect("a snapshot at hand");
                let regions = self.regions.get_or_insert_with(Vec::new);
                regions.extend(v);
                // Resized to a smaller snapshot, the copy loses the head's bytes past its end.
                if x.size < head {
                    regions.push((x.size, head - x.size));
                }
                *regions = crate::union_ranges(std::mem::take(regions));
                Phase::KnownMark
            }
            (Phase::KnownMark, _) if self.given.is_some() => Phase::KnownDelta,
            (Phase::KnownMark, _) => {
                self.to_give = self.known_to_give(self.regions.clone().unwrap_or_default());
                Phase::GiveSize
            }
            // The base deleted meanwhile: every region.
            (Phase::KnownDelta, Report::Deleted) => {
                self.to_give = self.known_to_give(self.regions.clone().unwrap_or_default());
                Phase::GiveSize
            }
            (Phase::KnownDelta, Report::Ranges(v)) => {
                self.to_give = self.known_to_give(crate::union_ranges(v));
                Phase::GiveSize
            }
            // Unknown history: X or its base deleted meanwhile skips X.
            (Phase::BaseSize | Phase::Rollback | Phase::BaseChanged, Report::Deleted) => {
                Phase::Next
            }
            (Phase::GiveSize, Report::Deleted) if !known => Phase::Next,
            (Phase::BaseSize, _) => Phase::Rollback,
            (Phase::Rollback, _) => Phase::BaseChanged,
            (Phase::BaseChanged, Report::Ranges(v)) => {
                let (x, _) = self.at.expect("a snapshot at hand");
                self.to_give = within(&v, x.size);
                Phase::GiveSize
            }
            (Phase::GiveSize, _) => Phase::Give,
            (Phase::Give, r) => {
                let (x, _) = self.at.expect("a snapshot at hand");
                match (r == Report::Deleted, known) {
                    // Deleted, part written: the next is given every region, which
                    // overwrites that part.
                    (true, true) => self.given = None,
                    (false, true) => self.given = Some(x.id),
                    (true, false) => {}
                    (false, false) => self.held.push(x),
                }
                Phase::Next
            }
            (p, _) => p,
        };
    }

    /// Known history: `delta` plus, past the head's end (the volume shrank since X), the rest
    /// of X whole (the copy's head was cut there; not marked: the resync has nothing to copy
    /// there); cut to X.
    fn known_to_give(&self, mut delta: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        let (x, head) = self.at.expect("a snapshot at hand");
        if x.size > head {
            delta.push((head, x.size - head));
        }
        within(&crate::union_ranges(delta), x.size)
    }
}

/// `ranges` cut to the first `size` bytes.
pub fn within(ranges: &[(u64, u64)], size: u64) -> Vec<(u64, u64)> {
    ranges
        .iter()
        .filter(|&&(o, _)| o < size)
        .map(|&(o, l)| (o, l.min(size - o)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use CatchUpStep::*;

    const MIB: u64 = 1 << 20;

    fn snap(id: u64, size: u64) -> Snap {
        Snap { id, size }
    }

    #[test]
    fn nothing_missed_nothing_asked() {
        let s = [snap(1, MIB)];
        let mut p = CatchUp::new(s.to_vec(), &s, true, MIB);
        assert_eq!(p.step(MIB), Done);
    }

    #[test]
    fn known_history_marks_then_gives_and_the_next_only_its_difference() {
        let mut p = CatchUp::new(vec![snap(2, MIB), snap(1, MIB)], &[], true, MIB);
        assert_eq!(p.step(MIB), Dirty);
        p.report(Report::Ranges(vec![(0, 4096)]));
        // Snapshot 1 (oldest first): what changed since it, with what the copy missed.
        assert_eq!(
            p.step(MIB),
            Changed {
                from: 1,
                to: None,
                upto: MIB
            }
        );
        p.report(Report::Ranges(vec![(8192, 4096)]));
        assert_eq!(p.step(MIB), Mark(vec![(0, 4096), (8192, 4096)]));
        p.report(Report::Ok);
        assert_eq!(
            p.step(MIB),
            Give {
                id: 1,
                regions: vec![(0, 4096), (8192, 4096)]
            }
        );
        p.report(Report::Ok);
        // Snapshot 2: its changes marked with the rest, then only what differs from 1.
        assert!(matches!(
            p.step(MIB),
            Changed {
                from: 2,
                to: None,
                ..
            }
        ));
        p.report(Report::Ranges(vec![(65536, 4096)]));
        assert_eq!(
            p.step(MIB),
            Mark(vec![(0, 4096), (8192, 4096), (65536, 4096)])
        );
        p.report(Report::Ok);
        assert_eq!(
            p.step(MIB),
            Changed {
                from: 1,
                to: Some(2),
                upto: MIB
            }
        );
        p.report(Report::Ranges(vec![(65536, 4096)]));
        assert_eq!(
            p.step(MIB),
            Give {
                id: 2,
                regions: vec![(65536, 4096)]
            }
        );
        p.report(Report::Ok);
        assert_eq!(p.step(MIB), Done);
    }

    #[test]
    fn known_history_with_snapshots_of_other_sizes() {
        // Taken when the volume was 2 MiB; it is 1 MiB now: given whole past the head's end.
        let mut p = CatchUp::new(vec![snap(1, 2 * MIB)], &[], true, MIB);
        p.step(MIB);
        p.report(Report::Ranges(vec![]));
        assert!(matches!(p.step(MIB), Changed { upto, .. } if upto == MIB));
        p.report(Report::Ranges(vec![(0, 4096)]));
        assert_eq!(p.step(MIB), Mark(vec![(0, 4096)]));
        p.report(Report::Ok);
        assert_eq!(p.step(MIB), Resize(2 * MIB));
        p.report(Report::Ok);
        assert_eq!(
            p.step(MIB),
            Give {
                id: 1,
                regions: vec![(0, 4096), (MIB, MIB)]
            }
        );
        p.report(Report::Ok);
        assert_eq!(p.step(MIB), Done);
        assert_eq!(
            p.copy_size(),
            2 * MIB,
            "the runtime gives the volume's size back"
        );

        // Taken at 1 MiB, the volume 2 MiB now: the head's tail is marked (the copy loses it).
        let mut p = CatchUp::new(vec![snap(1, MIB)], &[], true, 2 * MIB);
        p.step(2 * MIB);
        p.report(Report::Ranges(vec![]));
        p.step(2 * MIB);
        p.report(Report::Ranges(vec![]));
        assert_eq!(p.step(2 * MIB), Mark(vec![(MIB, MIB)]));
        p.report(Report::Ok);
        assert_eq!(p.step(2 * MIB), Resize(MIB));
        p.report(Report::Ok);
        assert_eq!(
            p.step(2 * MIB),
            Give {
                id: 1,
                regions: vec![]
            }
        );
    }

    #[test]
    fn unknown_history_rolls_back_to_a_base_the_source_holds() {
        // The copy keeps 3, which the source dropped (simulator seed 2296), and 1.
        let mut p = CatchUp::new(
            vec![snap(1, MIB), snap(4, MIB)],
            &[snap(1, MIB), snap(3, MIB)],
            false,
            MIB,
        );
        assert_eq!(p.step(MIB), Rollback(1));
        p.report(Report::Ok);
        assert_eq!(
            p.step(MIB),
            Changed {
                from: 1,
                to: Some(4),
                upto: MIB
            }
        );
        p.report(Report::Ranges(vec![(0, 2 * MIB)]));
        assert_eq!(
            p.step(MIB),
            Give {
                id: 4,
                regions: vec![(0, MIB)]
            }
        );
        p.report(Report::Ok);
        assert_eq!(p.step(MIB), Done);
    }

    #[test]
    fn a_snapshot_deleted_meanwhile_is_skipped() {
        // Unknown history: 1 gone while given; 2 then has no base and is given whole.
        let mut p = CatchUp::new(vec![snap(1, MIB), snap(2, MIB)], &[], false, MIB);
        assert!(matches!(p.step(MIB), Give { id: 1, .. }));
        p.report(Report::Deleted);
        assert_eq!(
            p.step(MIB),
            Give {
                id: 2,
                regions: vec![(0, MIB)]
            }
        );
        // Known history: the base of the difference gone: every region.
        let mut p = CatchUp::new(vec![snap(1, MIB), snap(2, MIB)], &[], true, MIB);
        p.step(MIB);
        p.report(Report::Ranges(vec![(0, 4096)]));
        p.step(MIB);
        p.report(Report::Ranges(vec![]));
        p.step(MIB);
        p.report(Report::Ok);
        p.step(MIB);
        p.report(Report::Ok);
        p.step(MIB);
        p.report(Report::Ranges(vec![]));
        p.step(MIB);
        p.report(Report::Ok);
        assert!(matches!(
            p.step(MIB),
            Changed {
                from: 1,
                to: Some(2),
                ..
            }
        ));
        p.report(Report::Deleted);
        assert_eq!(
            p.step(MIB),
            Give {
                id: 2,
                regions: vec![(0, 4096)]
            }
        );
    }
}
