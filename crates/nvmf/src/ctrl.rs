//! Controllers: what one host's association with a subsystem holds across its queues
//! (properties, granted queues, asynchronous events, keep-alive), and the registry of a port.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::cmd::Cqe;

/// Locks `m`, taking the data of a poisoned lock (a panicked request holds no invariant
/// these maps need).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// PDUs a queue's writer sends, in order.
pub(crate) type Out = mpsc::Sender<Vec<Bytes>>;

// Asynchronous event results (dword 0): a notice (type 2), its information, its log page.
/// Namespace attribute changed (Changed Namespace List log).
pub(crate) const EVENT_NS_CHANGED: u32 = 0x2 | 0x04 << 16;
/// ANA change (ANA log).
pub(crate) const EVENT_ANA_CHANGE: u32 = 0x2 | 0x03 << 8 | 0x0c << 16;

/// One controller.
#[derive(Debug)]
pub struct Ctrl {
    pub cntlid: u16,
    /// Index of the subsystem in the port's list; `None`: the discovery controller.
    pub subsys: Option<usize>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub peer: std::net::SocketAddr,
    pub(crate) cc: AtomicU32,
    pub(crate) csts: AtomicU32,
    /// Keep-alive timeout in ms (0: none).
    pub(crate) kato_ms: AtomicU32,
    /// When the host was last heard from, in ms since `born`.
    last_seen: AtomicU64,
    born: Instant,
    /// I/O queues granted (Set Features, Number of Queues), and those connected.
    pub(crate) queues: Mutex<(u16, HashSet<u16>)>,
    /// Outstanding asynchronous event requests: command id and the admin queue's writer.
    aers: Mutex<VecDeque<(u16, Out)>>,
    /// Events not yet reported (no request was outstanding).
    events: Mutex<VecDeque<u32>>,
    /// Asynchronous event configuration (Set Features 0Bh).
    pub(crate) aen_config: AtomicU32,
    /// The namespace changed since the host last read the changed namespace list.
    pub(crate) ns_changed: AtomicBool,
    /// Set when the controller ends (keep-alive expired, admin queue gone): every queue
    /// closes.
    dead: watch::Sender<bool>,
}

impl Ctrl {
    pub(crate) fn new(
        cntlid: u16,
        subsys: Option<usize>,
        hostnqn: String,
        hostid: [u8; 16],
        peer: std::net::SocketAddr,
        kato_ms: u32,
    ) -> Ctrl {
        Ctrl {
            cntlid,
            subsys,
            hostnqn,
            hostid,
            peer,
            cc: AtomicU32::new(0),
            csts: AtomicU32::new(0),
            kato_ms: AtomicU32::new(kato_ms),
            last_seen: AtomicU64::new(0),
            born: Instant::now(),
            queues: Mutex::new((0, HashSet::new())),
            aers: Mutex::new(VecDeque::new()),
            events: Mutex::new(VecDeque::new()),
            aen_config: AtomicU32::new(0),
            ns_changed: AtomicBool::new(false),
            dead: watch::Sender::new(false),
        }
    }

    /// The host was heard from (any command on any of its queues).
    pub(crate) fn seen(&self) {
        self.last_seen
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_seen.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    pub fn is_dead(&self) -> bool {
        *self.dead.borrow()
    }

    pub(crate) fn kill(&self) {
        self.dead.send_replace(true);
        lock(&self.aers).clear();
    }

    pub(crate) fn dead_rx(&self) -> watch::Receiver<bool> {
        self.dead.subscribe()
    }

    /// Holds an asynchronous event request, or completes it at once with an event waiting.
    /// Refuses one past the limit.
    pub(crate) fn add_aer(&self, cid: u16, out: Out) -> Result<(), ()> {
        let next = lock(&self.events).pop_front();
        if let Some(ev) = next {
            complete_aer(cid, &out, ev);
            return Ok(());
        }
        let mut aers = lock(&self.aers);
        if aers.len() >= crate::ident::AER_LIMIT {
            return Err(());
        }
        aers.push_back((cid, out));
        Ok(())
    }

    /// Reports `event` (an AER result) through an outstanding request, or keeps it for the
    /// next one (once: the same event pending twice says no more). Events the host did not
    /// enable are dropped, except on a discovery controller, which always reports.
    pub(crate) fn event(&self, event: u32, enable_bit: u32) {
        let enabled =
            self.subsys.is_none() || self.aen_config.load(Ordering::Relaxed) & enable_bit != 0;
        if !enabled {
            return;
        }
        let aer = lock(&self.aers).pop_front();
        match aer {
            Some((cid, out)) => complete_aer(cid, &out, event),
            None => {
                let mut evs = lock(&self.events);
                if !evs.contains(&event) {
                    evs.push_back(event);
                }
            }
        }
    }
}

fn complete_aer(cid: u16, out: &Out, result: u32) {
    let cqe = Cqe {
        result: u64::from(result),
        cid,
        ..Cqe::default()
    };
    let resp = crate::pdu::capsule_resp(&cqe.encode());
    // A full or closed queue drops the event: the host reads the logs at its next connect.
    let _ = out.try_send(vec![resp]);
}

/// The controllers of one port.
#[derive(Debug)]
pub struct Registry {
    /// Controller ids given on this port: `base..base + 0x0fff`, distinct from every other
    /// port of the same subsystem (a host refuses a path whose controller id it already has).
    base: u16,
    next: Mutex<u16>,
    ctrls: Mutex<HashMap<u16, Arc<Ctrl>>>,
}

/// Controller ids per port.
pub const CNTLIDS_PER_PORT: u16 = 0x0fff;

impl Registry {
    /// The registry of port `port_id` (1 to 15): ids `port_id * 0x1000 + 1` onwards.
    pub fn new(port_id: u16) -> Registry {
        let base = (port_id & 0xf) << 12;
        Registry {
            base,
            next: Mutex::new(1),
            ctrls: Mutex::new(HashMap::new()),
        }
    }

    /// Adds a controller with the next free id; `None` when every id is taken.
    pub(crate) fn add(&self, make: impl FnOnce(u16) -> Ctrl) -> Option<Arc<Ctrl>> {
        let mut ctrls = lock(&self.ctrls);
        let mut next = lock(&self.next);
        for _ in 0..CNTLIDS_PER_PORT {
            let id = self.base | *next;
            *next = *next % CNTLIDS_PER_PORT + 1;
            if let std::collections::hash_map::Entry::Vacant(e) = ctrls.entry(id) {
                let c = Arc::new(make(id));
                e.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    pub(crate) fn get(&self, id: u16) -> Option<Arc<Ctrl>> {
        lock(&self.ctrls).get(&id).cloned()
    }

    pub(crate) fn remove(&self, id: u16) {
        let gone = lock(&self.ctrls).remove(&id);
        if let Some(c) = gone {
            c.kill();
        }
    }

    /// Every live controller.
    pub fn all(&self) -> Vec<Arc<Ctrl>> {
        lock(&self.ctrls).values().cloned().collect()
    }

    /// Ends controllers whose host has been silent past their keep-alive timeout; returns
    /// how many.
    pub(crate) fn expire(&self) -> usize {
        let gone: Vec<Arc<Ctrl>> = lock(&self.ctrls)
            .values()
            .filter(|c| {
                let kato = c.kato_ms.load(Ordering::Relaxed);
                kato > 0 && c.silent_for() > Duration::from_millis(u64::from(kato))
            })
            .cloned()
            .collect();
        for c in &gone {
            tracing::warn!(
                cntlid = c.cntlid,
                host = %c.hostnqn,
                peer = %c.peer,
                "keep-alive timeout: the host was silent longer than it asked; its queues are dropped"
            );
            self.remove(c.cntlid);
        }
        gone.len()
    }
}
