//! The volume's [`VolumeCore`] behind one plain mutex: the executor of its steps, and the
//! waiting the write order needs.
//!
//! Every decision about replicas lives in the core (`trireme-replication`); this file keeps
//! it behind a lock that is never held across an `.await`, steps it, and parks tasks whose
//! range an earlier overlapping write holds. A write, resync step or pause takes a place; if
//! it may not hold its range yet, its task parks until a step grants its place, which hands
//! it the replicas to send to. Each release wakes exactly the places it freed, not every
//! waiter. A write that meets no failure and no earlier overlapping write visits the lock
//! twice: its submit and its answers (`io.rs`).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;
use trireme_replication::{
    Action, Answers, Decision, Input, Mirrored, Ticket, VolumeCore, WriteFailure,
};

#[derive(Debug)]
struct Inner {
    core: VolumeCore,
    /// Parked waiters, by place: each is sent the replicas its request goes to.
    parked: HashMap<Ticket, oneshot::Sender<Vec<usize>>>,
}

/// One volume's core, shared by its request tasks and background tasks.
#[derive(Debug)]
pub(crate) struct Core {
    inner: Mutex<Inner>,
    /// Visits to the lock so far (what a write costs is counted, not assumed).
    visits: AtomicU64,
}

/// The core, locked. Used within one statement or a short block, never across an `.await`.
pub(crate) struct Locked<'a>(MutexGuard<'a, Inner>);

impl Deref for Locked<'_> {
    type Target = VolumeCore;
    fn deref(&self) -> &VolumeCore {
        &self.0.core
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut VolumeCore {
        &mut self.0.core
    }
}

/// A place in the write order, until dropped (or given up by the answers that acknowledge
/// its request). Before [`Place::wait`] it may not hold its range yet.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    core: &'a Core,
    ticket: Option<Ticket>,
    /// Granted already: the replicas its request goes to.
    targets: Option<Vec<usize>>,
}

/// What a submitted request does next.
pub(crate) enum Submitted<'a> {
    /// It goes, once its place is held (a flush holds none), to the targets the place gives.
    Go(Place<'a>),
    /// Too few copies in sync: nothing was taken.
    Short,
    /// Refused by the core before it took anything.
    Refused(WriteFailure),
}

/// What a request's answers made of it.
pub(crate) enum Answered {
    /// Done; its place is given up. `wait_copies`: acknowledged once enough copies are in
    /// sync again.
    Ack { wait_copies: bool },
    /// Carry it out; the place stays held.
    Carry(trireme_replication::Decision),
}

impl Core {
    pub(crate) fn new(core: VolumeCore) -> Core {
        Core {
            inner: Mutex::new(Inner {
                core,
                parked: HashMap::new(),
            }),
            visits: AtomicU64::new(0),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.visits.fetch_add(1, Ordering::Relaxed);
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked(self.inner())
    }

    /// Visits to the core's lock so far.
    #[cfg(test)]
    pub(crate) fn visits(&self) -> u64 {
        self.visits.load(Ordering::Relaxed)
    }

    /// Steps the core with `input` in one visit; grants go to the parked places they name.
    fn step(&self, input: Input<'_>) -> Vec<Action> {
        Core::step_in(&mut self.inner(), input)
    }

    fn step_in(inner: &mut Inner, input: Input<'_>) -> Vec<Action> {
        let mut actions = inner.core.step(input);
        actions.retain(|a| match a {
            Action::Granted { places } => {
                for (p, targets) in places {
                    if let Some(tx) = inner.parked.remove(p) {
                        let _ = tx.send(targets.clone());
                    }
                }
                false
            }
            _ => true,
        });
        actions
    }

    /// A request arrives ([`Input::Submit`]): the copies are checked, a data request takes its
    /// place, and the replicas it goes to come with the place once held.
    ///
    /// `trim`: a parity volume's discard, which comes back with whether it must be sent as
    /// zeroes (a stripe is beneath it, or being made), asked in the same visit so that no
    /// encode begins in between.
    pub(crate) fn submit(&self, request: Mirrored, trim: bool) -> (Submitted<'_>, bool) {
        let mut inner = self.inner();
        let zeroes = match (trim, request) {
            (true, Mirrored::Data { offset, len }) => inner.core.trim_needs_zeroes(offset, len),
            _ => false,
        };
        let action = Core::step_in(&mut inner, Input::Submit(request)).pop();
        drop(inner);
        (self.submitted(action), zeroes)
    }

    fn submitted(&self, action: Option<Action>) -> Submitted<'_> {
        match action {
            Some(Action::Proceed { place, targets }) => Submitted::Go(Place {
                core: self,
                ticket: place,
                targets: Some(targets),
            }),
            Some(Action::Wait { place }) => Submitted::Go(self.waiting(place)),
            Some(Action::Carry(Decision::Fail(f))) => Submitted::Refused(f),
            _ => Submitted::Short,
        }
    }

    /// Waits until no earlier overlapping write is in flight, then holds `[start, end)`.
    pub(crate) async fn acquire(&self, start: u64, end: u64) -> Place<'_> {
        self.register(start, end).wait().await.0
    }

    /// Takes a place in the order for `[start, end)` now, whatever the copies, without waiting:
    /// places taken in some order hold their ranges in that order.
    pub(crate) fn register(&self, start: u64, end: u64) -> Place<'_> {
        match self.step(Input::Hold { start, end }).pop() {
            Some(Action::Proceed { place, targets }) => Place {
                core: self,
                ticket: place,
                targets: Some(targets),
            },
            Some(Action::Wait { place }) => self.waiting(place),
            other => unreachable!("a hold always takes a place: {other:?}"),
        }
    }

    fn waiting(&self, ticket: Ticket) -> Place<'_> {
        // The place exists from here on, so a cancelled wait still gives it up.
        Place {
            core: self,
            ticket: Some(ticket),
            targets: None,
        }
    }

    /// Every target of a request answered ([`Input::Answered`]). An acknowledged request
    /// gives its place up in the same visit.
    pub(crate) fn answered(&self, place: Option<&mut Place<'_>>, answers: Answers<'_>) -> Answered {
        let place = place.filter(|p| p.ticket.is_some());
        let answers = Answers {
            place: place.as_ref().and_then(|p| p.ticket),
            ..answers
        };
        match self.step(Input::Answered(answers)).pop() {
            Some(Action::Ack { wait_copies }) => {
                if let Some(p) = place {
                    p.ticket = None;
                }
                Answered::Ack { wait_copies }
            }
            Some(Action::Carry(d)) => Answered::Carry(d),
            other => unreachable!("answers end in an acknowledgement or a decision: {other:?}"),
        }
    }
}

impl<'a> Place<'a> {
    /// Its ticket in the write order, while it has one.
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        self.ticket
    }

    /// Waits until no earlier overlapping write is in flight; the range is held from then on.
    /// With it, the replicas its request goes to.
    pub(crate) async fn wait(mut self) -> (Place<'a>, Vec<usize>) {
        if let Some(targets) = self.targets.take() {
            return (self, targets);
        }
        let Some(ticket) = self.ticket else {
            return (self, Vec::new());
        };
        let rx = {
            let mut inner = self.core.inner();
            if inner.core.may_hold(ticket) {
                // Granted between its submit and now.
                let targets = inner.core.place_targets(ticket);
                drop(inner);
                return (self, targets);
            }
            let (tx, rx) = oneshot::channel();
            inner.parked.insert(ticket, tx);
            rx
        };
        // Sent by the step that grants this place. Never dropped unsent while this place
        // lives: only its own drop removes it.
        let targets = rx.await.unwrap_or_default();
        (self, targets)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let mut inner = self.core.inner();
        inner.parked.remove(&ticket);
        Core::step_in(&mut inner, Input::Release(ticket));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use trireme_replication::ReplicaState;

    #[tokio::test]
    async fn overlapping_writes_wait_in_order_and_others_do_not() {
        let o = Arc::new(Core::new(VolumeCore::new(
            &[(1, ReplicaState::InSync)],
            0,
            false,
            4,
        )));
        let a = o.acquire(0, 8192).await;
        // Disjoint: no wait.
        let b = tokio::time::timeout(Duration::from_millis(100), o.acquire(8192, 4096 * 3))
            .await
            .expect("disjoint write waited");
        // Overlapping: waits for `a`.
        let o2 = o.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let t = tokio::spawn(async move {
            let _g = o2.acquire(4096, 8192).await;
            tx.send(()).unwrap();
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            rx.try_recv().is_err(),
            "overlapping write went ahead of an earlier one"
        );
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap();
        t.await.unwrap();
        drop(b);
        let inner = o.inner.lock().unwrap();
        assert!(inner.core.places() == 0 && inner.parked.is_empty());
    }
}

/// What the write path costs the core's lock, on a real volume: two nodes over memory stores,
/// served over TCP on 127.0.0.1.
#[cfg(test)]
mod visits {
    use std::sync::Arc;

    use bytes::Bytes;
    use trireme_replication::ReplicaState;
    use trireme_store::{MemoryStore, Store};
    use trireme_transport::TransportKind;

    use crate::{AttachInfo, ReplicaTarget, Volume};

    const VOLUME: u64 = 7;
    const SIZE: u64 = 1 << 20;

    async fn node(id: u32) -> ReplicaTarget {
        let store = Arc::new(MemoryStore::default());
        store.create(VOLUME, SIZE).expect("create replica");
        let node = Arc::new(trireme_node::Node::new(id, store));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(trireme_transport::tcp::serve(listener, node));
        ReplicaTarget {
            node: id,
            addr,
            local_addr: None,
            state: ReplicaState::InSync,
            incarnation: 0,
            follows: None,
        }
    }

    #[tokio::test]
    async fn a_write_or_flush_visits_the_core_twice_and_an_overlapping_one_three_times() {
        let info = AttachInfo {
            name: "v".into(),
            id: VOLUME,
            size: SIZE,
            epoch: 1,
            replicas: vec![node(1).await, node(2).await],
            reconcile: false,
            min_copies: 0,
            preallocate: false,
            layout: Default::default(),
            regions: Vec::new(),
            limits: Default::default(),
        };
        let v = Volume::attach(info, TransportKind::Tcp, 1).await.unwrap();
        let block = |k: u64| Bytes::from(vec![k as u8; 4096]);
        let before = v.core.visits();
        for k in 0..64 {
            v.write(k * 4096, block(k), false).await.unwrap();
        }
        v.flush().await.unwrap();
        assert_eq!(
            v.core.visits() - before,
            2 * 65,
            "visits for 64 writes and a flush"
        );
        // Two writes to one block at once: the second waits for the first, and parks once.
        let before = v.core.visits();
        let (a, b) = tokio::join!(v.write(0, block(1), false), v.write(0, block(2), false));
        a.unwrap();
        b.unwrap();
        assert_eq!(v.core.visits() - before, 2 + 3);
        assert_eq!(
            v.read(0, 4096).await.unwrap(),
            block(2),
            "the later write landed last"
        );
    }

    /// A volume kept in a layout of a newer trireme is not attached: this writer would
    /// write it as a mirror; nor a parity volume whose region record names more regions
    /// than it has. Refused before any node is reached (the addresses here lead nowhere).
    #[tokio::test]
    async fn a_layout_this_writer_does_not_serve_is_refused_at_attach() {
        let parity = trireme_replication::Parity::parse("2+1", None).unwrap();
        let encoded = vec![trireme_replication::Region::Parity { slot: 0 }; SIZE as usize];
        for (layout, regions) in [
            (trireme_replication::Layout::Parity(parity), encoded),
            (trireme_replication::Layout::Unknown, Vec::new()),
        ] {
            let nowhere = |node| ReplicaTarget {
                node,
                addr: "127.0.0.1:1".into(),
                local_addr: None,
                state: ReplicaState::InSync,
                incarnation: 0,
                follows: None,
            };
            let info = AttachInfo {
                name: "v".into(),
                id: VOLUME,
                size: SIZE,
                epoch: 1,
                replicas: vec![nowhere(1), nowhere(2), nowhere(3)],
                reconcile: false,
                min_copies: 0,
                preallocate: false,
                layout,
                regions,
                limits: Default::default(),
            };
            match Volume::attach(info, TransportKind::Tcp, 1).await {
                Err(e @ crate::VolumeError::Layout { .. }) => {
                    assert!(e.to_string().starts_with("volume v: "), "{e}")
                }
                Err(e) => panic!("{layout}: refused for another reason: {e}"),
                Ok(_) => panic!("{layout}: attached"),
            }
        }
    }
}
