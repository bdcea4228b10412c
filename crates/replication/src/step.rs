//! The core's request path as a step machine: what happened goes in, what to do comes out.
//!
//! As raft-rs's `RawNode`: the runtime hands [`VolumeCore::step`] an [`Input`] (a request
//! arrives, its targets answered, a place is given up) and carries out the [`Action`]s it
//! returns (send to these replicas, wait, acknowledge, take out). The core decides, in one
//! visit, everything a request needs at that point: whether writes may go on, its place in
//! the write order, and the replicas it goes to. A write that meets no failure and no earlier
//! overlapping write takes two visits: [`Input::Submit`], then [`Input::Answered`].
//!
//! Which replicas a request goes to is the core's answer, not the runtime's lookup: today
//! every replica that takes writes (a mirror); a layout with parity regions answers per
//! region here too.

use crate::{decide, Decision, Mirrored, ReplicaOutcome, Ticket, VolumeCore, WriteFailure};

/// What happened, for the core to decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input<'a> {
    /// A mirrored request arrives. Data takes the next place in the write order for its
    /// range, unless too few copies are in sync (then nothing is taken: it waits at the
    /// copies' gate and is submitted again).
    Submit(Mirrored),
    /// A procedure (a resync copy, a repair, a pause of every write) takes the next place for
    /// `[start, end)`, whatever the copies: it holds the range against writes, it sends none.
    Hold { start: u64, end: u64 },
    /// Every target of a submitted request answered.
    Answered(Answers<'a>),
    /// A place is given up: its request ended without an acknowledgement of the core (it
    /// failed, was taken out first, its task went away) or its procedure is over.
    Release(Ticket),
}

/// The answers to one request, as [`Input::Answered`] carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answers<'a> {
    /// The request's place in the write order (data only).
    pub place: Option<Ticket>,
    pub request: Mirrored,
    /// The replicas it was sent to, as [`Action::Proceed`] named them.
    pub targets: &'a [usize],
    /// One outcome per target, in the same order.
    pub outcomes: &'a [ReplicaOutcome],
    /// A second send, to the copies that refused it for space, with leave to use their
    /// reserve ([`Decision::UseReserve`]); refused again, it fails.
    pub from_reserve: bool,
}

/// What the runtime does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Go on: send the request to `targets` now (a hold sends nothing). With a `place`, the
    /// range is held until the request's answers or its release give it up.
    Proceed {
        place: Option<Ticket>,
        targets: Vec<usize>,
    },
    /// Wait until a [`Action::Granted`] names `place`: an earlier overlapping write holds
    /// part of the range.
    Wait { place: Ticket },
    /// Too few copies are in sync: nothing was taken; the request waits for copies.
    Short,
    /// These places, which waited, hold their ranges now; each one's request goes to the
    /// targets beside it.
    Granted { places: Vec<(Ticket, Vec<usize>)> },
    /// The request is done and its place given up: acknowledge it. With `wait_copies`,
    /// acknowledge only once enough copies are in sync again (its answers took copies out
    /// below the minimum earlier): it waits without its range.
    Ack { wait_copies: bool },
    /// Carry the decision out (fail, take out then acknowledge, send again from the
    /// reserve); the place, if any, stays held until released. At a submit, a refusal (a
    /// data request across a parity region's end): nothing was taken.
    Carry(Decision),
}

impl VolumeCore {
    /// Takes `input` into account; what to do, in order (see the module docs).
    pub fn step(&mut self, input: Input<'_>) -> Vec<Action> {
        match input {
            Input::Submit(request) => vec![self.submit(request)],
            Input::Hold { start, end } => vec![self.hold_range(start, end)],
            Input::Answered(a) => self.answered(a),
            Input::Release(place) => self.release_place(place).into_iter().collect(),
        }
    }

    fn submit(&mut self, request: Mirrored) -> Action {
        if !self.enough_for(request) {
            return Action::Short;
        }
        if let Some(refused) = self.misrouted(request) {
            return Action::Carry(refused);
        }
        match request {
            Mirrored::Data { offset, len } => {
                self.writing(request);
                self.hold_range(offset, offset + len)
            }
            Mirrored::Flush | Mirrored::Snapshot => Action::Proceed {
                place: None,
                targets: self.targets_of(None),
            },
        }
    }

    fn hold_range(&mut self, start: u64, end: u64) -> Action {
        match self.order.register(start, end) {
            (place, true) => Action::Proceed {
                place: Some(place),
                targets: self.targets_of(Some((start, end))),
            },
            (place, false) => Action::Wait { place },
        }
    }

    fn answered(&mut self, a: Answers<'_>) -> Vec<Action> {
        let decision = match decide(a.request, a.targets, a.outcomes, &self.set, self.managed) {
            // Not again: refused for space once more, what the copy holds is its store's
            // failure to say.
            Decision::UseReserve { replicas } if a.from_reserve => {
                Decision::Fail(WriteFailure::NoSpace {
                    replica: replicas.first().copied().unwrap_or(0),
                })
            }
            d => d,
        };
        if matches!(decision, Decision::Ack | Decision::TakeOut { .. }) {
            self.held(a.request);
        }
        if decision != Decision::Ack {
            return vec![Action::Carry(decision)];
        }
        let mut out: Vec<Action> = a
            .place
            .and_then(|p| self.release_place(p))
            .into_iter()
            .collect();
        out.push(Action::Ack {
            wait_copies: !self.enough_for(a.request),
        });
        out
    }

    fn release_place(&mut self, place: Ticket) -> Option<Action> {
        let places: Vec<(Ticket, Vec<usize>)> = self
            .order
            .release(place)
            .into_iter()
            .map(|p| (p, self.place_targets(p)))
            .collect();
        (!places.is_empty()).then_some(Action::Granted { places })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReplicaState;

    fn core() -> VolumeCore {
        let r = [(1, ReplicaState::InSync), (2, ReplicaState::InSync)];
        VolumeCore::new(&r, 0, true, 4)
    }

    fn data(offset: u64, len: u64) -> Mirrored {
        Mirrored::Data { offset, len }
    }

    fn answers<'a>(place: Option<Ticket>, request: Mirrored, o: &'a [ReplicaOutcome]) -> Input<'a> {
        Input::Answered(Answers {
            place,
            request,
            targets: &[0, 1],
            outcomes: o,
            from_reserve: false,
        })
    }

    fn one(mut actions: Vec<Action>) -> Action {
        assert_eq!(actions.len(), 1, "{actions:?}");
        actions.remove(0)
    }

    const DONE: [ReplicaOutcome; 2] = [ReplicaOutcome::Done, ReplicaOutcome::Done];

    #[test]
    fn a_write_takes_two_steps_and_an_overlapping_one_is_granted_with_its_targets() {
        let mut c = core();
        let Action::Proceed {
            place: Some(a),
            targets,
        } = one(c.step(Input::Submit(data(0, 8192))))
        else {
            panic!("a write on an idle volume goes at once");
        };
        assert_eq!(targets, vec![0, 1]);
        let Action::Wait { place: b } = one(c.step(Input::Submit(data(4096, 4096)))) else {
            panic!("an overlapping write waits");
        };
        assert_eq!(
            c.step(answers(Some(a), data(0, 8192), &DONE)),
            vec![
                Action::Granted {
                    places: vec![(b, vec![0, 1])]
                },
                Action::Ack { wait_copies: false }
            ]
        );
        assert!(c.may_hold(b));
        assert_eq!(
            c.step(answers(Some(b), data(4096, 4096), &DONE)),
            vec![Action::Ack { wait_copies: false }]
        );
        assert_eq!(c.places(), 0);
    }

    #[test]
    fn a_failed_copy_keeps_the_place_until_it_is_taken_out_and_released() {
        let mut c = core();
        let Action::Proceed { place, .. } = one(c.step(Input::Submit(data(0, 4096)))) else {
            panic!()
        };
        let failed = [ReplicaOutcome::Done, ReplicaOutcome::Failed];
        let out = c.step(answers(place, data(0, 4096), &failed));
        assert!(matches!(
            out.as_slice(),
            [Action::Carry(Decision::TakeOut { replicas, .. })] if replicas == &vec![1]
        ));
        assert!(c.may_hold(place.unwrap()));
        assert_eq!(c.step(Input::Release(place.unwrap())), vec![]);
        assert_eq!(c.places(), 0);
    }

    #[test]
    fn a_refusal_for_space_is_sent_again_once_then_fails() {
        let mut c = core();
        let o = [ReplicaOutcome::Done, ReplicaOutcome::NoSpace];
        assert_eq!(
            c.step(answers(None, data(0, 4096), &o)),
            vec![Action::Carry(Decision::UseReserve { replicas: vec![1] })]
        );
        let again = Input::Answered(Answers {
            place: None,
            request: data(0, 4096),
            targets: &[0, 1],
            outcomes: &o,
            from_reserve: true,
        });
        assert_eq!(
            c.step(again),
            vec![Action::Carry(Decision::Fail(WriteFailure::NoSpace {
                replica: 1
            }))]
        );
    }

    #[test]
    fn below_the_minimum_nothing_is_taken_and_a_hold_still_goes() {
        let r = [(1, ReplicaState::InSync), (2, ReplicaState::Outdated)];
        let mut c = VolumeCore::new(&r, 2, true, 4);
        assert_eq!(c.step(Input::Submit(data(0, 4096))), vec![Action::Short]);
        assert_eq!(c.step(Input::Submit(Mirrored::Flush)), vec![Action::Short]);
        assert_eq!(c.places(), 0);
        let held = c.step(Input::Hold {
            start: 0,
            end: 4096,
        });
        assert!(matches!(
            held.as_slice(),
            [Action::Proceed { place: Some(_), .. }]
        ));
    }
}
