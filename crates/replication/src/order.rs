//! The write-order rule, as plain data.
//!
//! NBD lets a client have two overlapping writes in flight and promises nothing about which
//! lands last. A mirror must still make every replica pick the same one, or the copies diverge
//! (DESIGN.md guarantee 2). So, as DRBD does with conflicting requests, a write waits while an
//! earlier write overlapping it is in flight: overlapping writes reach every replica one after
//! the other, in arrival order (first come, first served, so none starves), and writes that do
//! not overlap never wait. Resync steps, scrub repairs and the writer's short pauses take their
//! ranges through the same order, so a copy never races a write to the same bytes.
//!
//! [`RangeOrder`] only keeps the book: who registered which range in which order, who may
//! hold theirs now, and whom a release lets go. Waiting is the caller's business (the writer
//! parks a task per blocked ticket and wakes exactly the ones [`RangeOrder::release`] names).

/// A place in the order. Earlier registrations have smaller tickets.
pub type Ticket = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    ticket: Ticket,
    start: u64,
    end: u64,
    /// Told that it may hold its range (at registration or by a release).
    granted: bool,
}

/// The byte ranges registered on one volume, in registration order.
#[derive(Debug, Clone, Default)]
pub struct RangeOrder {
    last: Ticket,
    /// Sorted by ticket (registration appends; release removes).
    entries: Vec<Entry>,
}

impl RangeOrder {
    pub fn new() -> RangeOrder {
        RangeOrder::default()
    }

    /// Takes the next place for `[start, end)`. Returns its ticket and whether it may hold the
    /// range at once (no earlier registered range overlaps it).
    pub fn register(&mut self, start: u64, end: u64) -> (Ticket, bool) {
        self.last += 1;
        let ticket = self.last;
        let granted = !self.entries.iter().any(|e| overlaps(e, start, end));
        self.entries.push(Entry {
            ticket,
            start,
            end,
            granted,
        });
        (ticket, granted)
    }

    /// Whether `ticket` may hold its range now. False for a ticket not registered.
    pub fn may_hold(&self, ticket: Ticket) -> bool {
        self.entries
            .iter()
            .find(|e| e.ticket == ticket)
            .is_some_and(|e| e.granted)
    }

    /// Gives `ticket`'s place up (its write finished, or its waiter went away). Returns the
    /// tickets that may hold their ranges now and could not before, in ticket order; each is
    /// named once over the order's life.
    pub fn release(&mut self, ticket: Ticket) -> Vec<Ticket> {
        let Some(at) = self.entries.iter().position(|e| e.ticket == ticket) else {
            return Vec::new();
        };
        let gone = self.entries.remove(at);
        let mut woken = Vec::new();
        // Only later entries that overlapped the released one can have been waiting on it.
        for k in at..self.entries.len() {
            let e = &self.entries[k];
            if e.granted || !overlaps(e, gone.start, gone.end) {
                continue;
            }
            let (start, end) = (e.start, e.end);
            if !self.entries[..k].iter().any(|b| overlaps(b, start, end)) {
                self.entries[k].granted = true;
                woken.push(self.entries[k].ticket);
            }
        }
        woken
    }

    /// The range `ticket` registered, while registered.
    pub fn range(&self, ticket: Ticket) -> Option<(u64, u64)> {
        self.entries
            .iter()
            .find(|e| e.ticket == ticket)
            .map(|e| (e.start, e.end))
    }

    /// Ranges registered and not released.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn overlaps(e: &Entry, start: u64, end: u64) -> bool {
    e.start < end && start < e.end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlapping_ranges_wait_in_order_and_others_do_not() {
        let mut o = RangeOrder::new();
        let (a, now) = o.register(0, 8192);
        assert!(now);
        let (b, now) = o.register(8192, 12288);
        assert!(now, "disjoint ranges never wait");
        let (c, now) = o.register(4096, 8192);
        assert!(!now, "overlaps a");
        let (d, now) = o.register(8192, 8193);
        assert!(!now, "overlaps b");
        assert_eq!(o.release(b), vec![d]);
        assert_eq!(o.release(a), vec![c]);
        assert!(o.may_hold(c) && o.may_hold(d));
        o.release(c);
        o.release(d);
        assert!(o.is_empty());
        assert_eq!(
            o.release(a),
            Vec::<Ticket>::new(),
            "released twice: nothing"
        );
    }

    #[test]
    fn a_waiting_range_blocks_later_overlapping_ones_too() {
        // First come, first served: c waits for b, which waits for a, even where c does
        // not overlap a.
        let mut o = RangeOrder::new();
        let (a, _) = o.register(0, 100);
        let (b, _) = o.register(50, 150);
        let (c, now) = o.register(120, 200);
        assert!(!now);
        assert_eq!(o.release(a), vec![b]);
        assert!(!o.may_hold(c));
        assert_eq!(o.release(b), vec![c]);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Register(u64, u64),
        /// Releases the k-th live ticket (modulo the live count), held or waiting.
        Release(usize),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                (0u64..64, 1u64..16).prop_map(|(s, l)| Step::Register(s, s + l)),
                (0usize..64).prop_map(Step::Release),
            ],
            1..200,
        )
    }

    proptest! {
        /// Against a model that recomputes everything from scratch: a ticket may hold its
        /// range exactly when no earlier live ticket overlaps it; no two held ranges overlap;
        /// a release names exactly the tickets that became free.
        #[test]
        fn the_order_matches_its_model(steps in steps()) {
            let mut o = RangeOrder::new();
            let mut live: Vec<(Ticket, u64, u64)> = Vec::new();
            let mut granted: std::collections::BTreeSet<Ticket> = Default::default();
            let model_free = |live: &[(Ticket, u64, u64)], t: Ticket| {
                let (_, s, e) = *live.iter().find(|x| x.0 == t).unwrap();
                !live.iter().any(|&(u, us, ue)| u < t && us < e && s < ue)
            };
            for step in steps {
                match step {
                    Step::Register(s, e) => {
                        let (t, now) = o.register(s, e);
                        live.push((t, s, e));
                        prop_assert_eq!(now, model_free(&live, t));
                        if now {
                            granted.insert(t);
                        }
                    }
                    Step::Release(k) if !live.is_empty() => {
                        let (t, _, _) = live.remove(k % live.len());
                        granted.remove(&t);
                        let woken = o.release(t);
                        let expect: Vec<Ticket> = live
                            .iter()
                            .filter(|x| !granted.contains(&x.0) && model_free(&live, x.0))
                            .map(|x| x.0)
                            .collect();
                        prop_assert_eq!(&woken, &expect);
                        granted.extend(woken);
                    }
                    Step::Release(_) => {}
                }
                for &(t, _, _) in &live {
                    prop_assert_eq!(o.may_hold(t), granted.contains(&t));
                }
                let held: Vec<_> = live.iter().filter(|x| granted.contains(&x.0)).collect();
                for (i, a) in held.iter().enumerate() {
                    for b in &held[i + 1..] {
                        prop_assert!(!(a.1 < b.2 && b.1 < a.2), "{:?} and {:?} held at once", a, b);
                    }
                }
                prop_assert_eq!(o.len(), live.len());
            }
        }
    }
}
