//! Resizing a volume online, as a step machine: in which order the copies and the record take
//! the new size, and what a failure undoes.
//!
//! The writer holds the whole volume in the write order and its membership lock first, so no
//! request is in flight and no copy goes out or comes back; [`ResizePlan::step`] then says
//! what to do next, and the writer reports how it went.
//!
//! * **Grow**: the copies first, then the record. A copy that refuses (no room) or does not
//!   answer fails the resize: every copy gets the old size back, and one that does not take
//!   that either is taken out (its size is unknown, and a copy in sync at another size would
//!   take a snapshot at it). The record comes last, so a writer that dies in between leaves
//!   copies larger than the record, whose tail nobody wrote; the next writer gives them the
//!   recorded size. Only once recorded does the writer take the new size (requests past the
//!   old end pass).
//! * **Shrink**: the record first, then the writer, then the copies. What a shrink drops is
//!   meant to go, so a copy that fails to shrink is taken out (its resync gives it the size)
//!   rather than the others grown back, which would leave them zeros where it kept its bytes.

/// What the writer does next for a resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeStep {
    /// Send `ResizeReplica` to `size` to each of `targets`; report [`ResizePlan::answered`].
    Send { targets: Vec<usize>, size: u64 },
    /// Record `size` as the volume's (compared with the writer's epoch); report
    /// [`ResizePlan::recorded`].
    Record(u64),
    /// The writer takes `size`: requests up to it pass from now on. Nothing to report.
    Take(u64),
    /// Take these copies out (their membership lock let go first), as for a failed write;
    /// report [`ResizePlan::taken_out`].
    TakeOut(Vec<usize>),
    /// The resize is over.
    Done(ResizeEnd),
}

/// How a resize ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeEnd {
    /// The volume has the new size.
    Resized,
    /// It kept the old size: the first failure reported is the resize's.
    Failed,
    /// It has the new size, but taking out the copies that did not take it failed: that
    /// failure is the resize's.
    TakeOutFailed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    SendNew,
    WaitNew,
    RecordNew,
    WaitRecord,
    TakeNew,
    /// Grow failed: every copy gets the old size back.
    SendOld,
    WaitOld,
    TakeOut {
        end: ResizeEnd,
    },
    WaitTakeOut {
        end: ResizeEnd,
    },
    Done(ResizeEnd),
}

/// One resize from `from` to `to` bytes over the copies that take writes (see the module docs).
#[derive(Debug, Clone)]
pub struct ResizePlan {
    from: u64,
    to: u64,
    targets: Vec<usize>,
    phase: Phase,
    /// Copies to take out at the end.
    out: Vec<usize>,
}

impl ResizePlan {
    /// A resize from `from` to `to` (different) bytes, of the copies `targets`.
    pub fn new(from: u64, to: u64, targets: Vec<usize>) -> ResizePlan {
        let phase = if to > from {
            Phase::SendNew
        } else {
            Phase::RecordNew
        };
        ResizePlan {
            from,
            to,
            targets,
            phase,
            out: Vec::new(),
        }
    }

    fn grows(&self) -> bool {
        self.to > self.from
    }

    /// What to do next. A step that waits for a report repeats until it comes.
    pub fn step(&mut self) -> ResizeStep {
        let (next, step) = match &self.phase {
            Phase::SendNew | Phase::WaitNew => (
                Phase::WaitNew,
                ResizeStep::Send {
                    targets: self.targets.clone(),
                    size: self.to,
                },
            ),
            Phase::RecordNew | Phase::WaitRecord => {
                (Phase::WaitRecord, ResizeStep::Record(self.to))
            }
            Phase::TakeNew => {
                let next = if self.grows() {
                    Phase::Done(ResizeEnd::Resized)
                } else {
                    Phase::SendNew
                };
                (next, ResizeStep::Take(self.to))
            }
            Phase::SendOld | Phase::WaitOld => (
                Phase::WaitOld,
                ResizeStep::Send {
                    targets: self.targets.clone(),
                    size: self.from,
                },
            ),
            Phase::TakeOut { end } | Phase::WaitTakeOut { end } if !self.out.is_empty() => (
                Phase::WaitTakeOut { end: *end },
                ResizeStep::TakeOut(self.out.clone()),
            ),
            Phase::TakeOut { end } | Phase::WaitTakeOut { end } | Phase::Done(end) => {
                (Phase::Done(*end), ResizeStep::Done(*end))
            }
        };
        self.phase = next;
        step
    }

    /// The copies among the targets that did not take the size sent (refused, or did not
    /// answer).
    pub fn answered(&mut self, failed: &[usize]) {
        self.phase = match self.phase {
            // Grow: all took it, so the record; else every copy back to the old size.
            Phase::WaitNew if self.grows() && failed.is_empty() => Phase::RecordNew,
            Phase::WaitNew if self.grows() => Phase::SendOld,
            // Shrink, the record and the writer at the new size already: a copy that did
            // not shrink goes out.
            Phase::WaitNew => {
                self.out = failed.to_vec();
                Phase::TakeOut {
                    end: ResizeEnd::Resized,
                }
            }
            // A copy that did not take the old size back either: its size is unknown.
            Phase::WaitOld => {
                self.out = failed.to_vec();
                Phase::TakeOut {
                    end: ResizeEnd::Failed,
                }
            }
            ref p => p.clone(),
        };
    }

    /// Whether the record took the new size.
    pub fn recorded(&mut self, ok: bool) {
        if self.phase != Phase::WaitRecord {
            return;
        }
        self.phase = match (ok, self.grows()) {
            (true, _) => Phase::TakeNew,
            // Grow: the copies took it, the record did not: they get the old size back.
            (false, true) => Phase::SendOld,
            // Shrink: nothing changed yet.
            (false, false) => Phase::Done(ResizeEnd::Failed),
        };
    }

    /// Whether taking the copies out worked.
    pub fn taken_out(&mut self, ok: bool) {
        if let Phase::WaitTakeOut { end } = self.phase {
            self.out.clear();
            self.phase = Phase::Done(match end {
                // A failed grow fails with its own failure; taking out is only logged.
                ResizeEnd::Resized if !ok => ResizeEnd::TakeOutFailed,
                end => end,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ResizeStep::*;

    fn send(size: u64) -> ResizeStep {
        Send {
            targets: vec![0, 1],
            size,
        }
    }

    #[test]
    fn a_grow_sends_then_records_then_takes() {
        let mut p = ResizePlan::new(8, 16, vec![0, 1]);
        assert_eq!(p.step(), send(16));
        assert_eq!(p.step(), send(16), "repeats until answered");
        p.answered(&[]);
        assert_eq!(p.step(), Record(16));
        p.recorded(true);
        assert_eq!(p.step(), Take(16));
        assert_eq!(p.step(), Done(ResizeEnd::Resized));
    }

    #[test]
    fn a_failed_grow_gives_the_old_size_back_and_takes_out_the_unsure() {
        let mut p = ResizePlan::new(8, 16, vec![0, 1]);
        p.step();
        p.answered(&[1]);
        assert_eq!(p.step(), send(8));
        p.answered(&[1]);
        assert_eq!(p.step(), TakeOut(vec![1]));
        p.taken_out(false);
        assert_eq!(
            p.step(),
            Done(ResizeEnd::Failed),
            "its own failure, not the take-out's"
        );

        // The record refused: the copies took it, and get the old size back.
        let mut p = ResizePlan::new(8, 16, vec![0, 1]);
        p.step();
        p.answered(&[]);
        p.step();
        p.recorded(false);
        assert_eq!(p.step(), send(8));
        p.answered(&[]);
        assert_eq!(p.step(), Done(ResizeEnd::Failed));
    }

    #[test]
    fn a_shrink_records_takes_then_sends_and_takes_out_who_did_not_shrink() {
        let mut p = ResizePlan::new(16, 8, vec![0, 1]);
        assert_eq!(p.step(), Record(8));
        p.recorded(true);
        assert_eq!(p.step(), Take(8));
        assert_eq!(p.step(), send(8));
        p.answered(&[0]);
        assert_eq!(p.step(), TakeOut(vec![0]));
        p.taken_out(false);
        assert_eq!(p.step(), Done(ResizeEnd::TakeOutFailed));

        let mut p = ResizePlan::new(16, 8, vec![0, 1]);
        p.step();
        p.recorded(false);
        assert_eq!(p.step(), Done(ResizeEnd::Failed), "nothing sent");
    }
}
