//! Accepting connections: a loop that outlives every transient error, and a [`Gate`] that
//! bounds the connections a port holds at each stage.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::throttle::Throttle;

/// Shortest and longest pause before accepting again after a resource error.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// True for errors that concern only the connection being accepted (it went away, or a
/// firewall refused it): accept again at once.
fn connection_only(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::ECONNRESET
                | libc::EPROTO
                | libc::EPERM
                | libc::EINTR
                | libc::EAGAIN
                | libc::ETIMEDOUT
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::ENETDOWN
                | libc::ENONET
                | libc::ENOPROTOOPT
                | libc::EOPNOTSUPP
        )
    )
}

/// Accepts the next connection from `accept_once` (a listener's `accept`), never failing:
/// an error of the connection alone is skipped; any other (no descriptor left in the process
/// or the system, no buffer memory) is logged at most once a second and retried after a pause
/// that doubles from 10 ms to 1 s while it lasts. `what` names the port in the log.
pub async fn accept<F, Fut, C>(what: &str, mut accept_once: F) -> C
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<C>>,
{
    static RESOURCE: Throttle = Throttle::per_second();
    let mut pause = BACKOFF_MIN;
    loop {
        match accept_once().await {
            Ok(c) => return c,
            Err(e) if connection_only(&e) => continue,
            Err(e) => {
                crate::warn_throttled!(
                    RESOURCE,
                    port = what,
                    "accept failed, retrying in {pause:?}: {e}"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// How many connections a port admits at each stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Authenticated connections served at once.
    pub established: usize,
    /// Connections still in their handshake, from all sources.
    pub handshakes: usize,
    /// Connections in their handshake from one source address.
    pub handshakes_per_source: usize,
}

/// A connection's standing at its gate, shared with the connection itself: when it was last
/// active, and whether the gate evicted it (to make room for a newcomer). An evicted
/// connection ends at its next poll (see [`crate::Guarded`], and [`Handshaking::evicted`] for
/// a handshake in progress).
#[derive(Debug, Default)]
pub struct Standing {
    evicted: std::sync::atomic::AtomicBool,
    /// The peer sent its first bytes (a TLS ClientHello): evicted after the silent ones.
    spoke: std::sync::atomic::AtomicBool,
    /// Milliseconds since the process's first use of a gate, at the last byte moved.
    active_ms: std::sync::atomic::AtomicU64,
    wake: Mutex<Option<std::task::Waker>>,
    notify: tokio::sync::Notify,
}

impl Standing {
    pub fn is_evicted(&self) -> bool {
        self.evicted.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records activity (a byte moved).
    pub fn touch(&self) {
        self.active_ms.store(
            crate::throttle::now_ms(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Registers the task to wake when the connection is evicted.
    pub fn register(&self, w: &std::task::Waker) {
        let mut g = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        match &*g {
            Some(old) if old.will_wake(w) => {}
            _ => *g = Some(w.clone()),
        }
    }

    fn evict(&self) {
        self.evicted
            .store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_waiters();
        self.notify.notify_one();
        let waker = self.wake.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Where a connection comes from, as the gate shares its handshakes: the peer's address, and
/// for a peer on this host the local user holding its socket (so one local user's redial
/// loop has a share of its own, not every local client's: `peer_uid.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    pub ip: IpAddr,
    pub uid: Option<u32>,
}

impl Source {
    /// The source of a TCP connection from `peer` accepted at `local`.
    pub fn of_tcp(local: Option<std::net::SocketAddr>, peer: std::net::SocketAddr) -> Source {
        Source {
            ip: peer.ip(),
            uid: local.and_then(|l| crate::peer_uid::loopback_peer_uid(l, peer)),
        }
    }
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Source {
        Source { ip, uid: None }
    }
}

#[derive(Debug)]
struct Entry {
    id: u64,
    source: Option<Source>,
    standing: Arc<Standing>,
}

#[derive(Debug, Default)]
struct Places {
    next: u64,
    /// Handshakes in progress, oldest first.
    handshakes: Vec<Entry>,
    /// Established connections, with their activity (for a port that evicts idle ones).
    established: Vec<Entry>,
}

/// Admission to one listening port (see the crate docs). Shared by the port's accept loop
/// and its connections' tasks.
///
/// When its handshakes are all taken, a newcomer evicts the oldest handshake of the source
/// holding the most (its own, if that source is over its share): a peer that opens
/// connections and says nothing cannot keep others out for the handshake deadline. When its
/// established places are all taken, a port made with [`Gate::evicting_idle`] evicts the
/// connection idle the longest (HTTP: clients reconnect); others refuse the newcomer (an NBD
/// session of an idle disk is never cut).
#[derive(Debug)]
pub struct Gate {
    name: &'static str,
    limits: Limits,
    evict_idle: bool,
    places: Mutex<Places>,
    refused: Throttle,
}

/// A connection's place among the handshakes in progress; given back when dropped (the
/// handshake failed or timed out) or exchanged by [`Gate::establish`].
#[derive(Debug)]
pub struct Handshaking {
    gate: Arc<Gate>,
    id: u64,
    standing: Arc<Standing>,
}

impl Handshaking {
    /// Resolves when the gate evicted this handshake to make room: the connection should end.
    pub async fn evicted(&self) {
        loop {
            let n = self.standing.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.standing.is_evicted() {
                return;
            }
            n.await;
        }
    }

    /// Notes that the peer sent its first bytes: among handshakes to evict, the silent ones go
    /// first (a redial loop that never speaks cannot push out clients that do).
    pub fn spoke(&self) {
        self.standing
            .spoke
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f` (the handshake) unless the gate evicts this connection first (`None`).
    pub async fn run<T>(&self, f: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            r = f => Some(r),
            _ = self.evicted() => None,
        }
    }
}

/// A connection's place among the established ones, held for its life.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<Gate>,
    id: u64,
    standing: Arc<Standing>,
}

impl Admitted {
    /// The connection's standing (what [`crate::Guarded`] reports activity to).
    pub fn standing(&self) -> &Arc<Standing> {
        &self.standing
    }
}

impl Gate {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            limits,
            evict_idle: false,
            places: Mutex::default(),
            refused: Throttle::per_second(),
        })
    }

    /// A gate that, when full, evicts its connection idle the longest for a newcomer.
    pub fn evicting_idle(name: &'static str, limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            limits,
            evict_idle: true,
            places: Mutex::default(),
            refused: Throttle::per_second(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place among the handshakes in progress for a connection from `source` (`None`: a
    /// same-host socket, counted in the total only). When `source` has its share, its oldest
    /// silent handshake (else its oldest) is evicted for it; when they are all taken, the
    /// oldest silent handshake of any source (a peer that sent nothing yet: see
    /// [`Handshaking::spoke`]), else the oldest of the busiest source (logged, throttled).
    pub fn handshake(self: &Arc<Self>, source: Option<IpAddr>) -> Option<Handshaking> {
        self.handshake_from(source.map(Source::from))
    }

    /// [`Gate::handshake`] for a TCP connection accepted at `local` from `peer`: a peer on
    /// this host is told apart by its user ([`Source::of_tcp`]).
    pub fn handshake_tcp(
        self: &Arc<Self>,
        local: Option<std::net::SocketAddr>,
        peer: std::net::SocketAddr,
    ) -> Option<Handshaking> {
        self.handshake_from(Some(Source::of_tcp(local, peer)))
    }

    fn handshake_from(self: &Arc<Self>, source: Option<Source>) -> Option<Handshaking> {
        let mut p = self.places();
        let of =
            |p: &Places, s: Source| p.handshakes.iter().filter(|e| e.source == Some(s)).count();
        let silent = |e: &Entry| !e.standing.spoke.load(std::sync::atomic::Ordering::Relaxed);
        let victim = match source {
            Some(s) if of(&p, s) >= self.limits.handshakes_per_source => {
                let theirs = |e: &&Entry| e.source == Some(s);
                let pick = p.handshakes.iter().filter(theirs).find(|e| silent(e));
                pick.or_else(|| p.handshakes.iter().find(theirs))
                    .map(|e| e.id)
            }
            _ if p.handshakes.len() >= self.limits.handshakes => {
                let mut counts: HashMap<Option<Source>, usize> = HashMap::new();
                for e in &p.handshakes {
                    *counts.entry(e.source).or_insert(0) += 1;
                }
                let busiest = counts.into_iter().max_by_key(|(_, n)| *n).map(|(s, _)| s);
                p.handshakes
                    .iter()
                    .find(|e| silent(e))
                    .or_else(|| p.handshakes.iter().find(|e| Some(e.source) == busiest))
                    .map(|e| e.id)
            }
            _ => None,
        };
        if let Some(id) = victim {
            if let Some(i) = p.handshakes.iter().position(|e| e.id == id) {
                let vs = p.handshakes[i].source;
                let e = p.handshakes.remove(i);
                e.standing.evict();
                drop(p);
                crate::warn_throttled!(
                    self.refused,
                    port = self.name,
                    source = ?vs,
                    "a handshake in progress ended to make room: too many from that source or in all"
                );
                p = self.places();
            }
        }
        if p.handshakes.len() >= self.limits.handshakes {
            return None;
        }
        p.next += 1;
        let standing = Arc::new(Standing::default());
        standing.touch();
        let id = p.next;
        p.handshakes.push(Entry {
            id,
            source,
            standing: standing.clone(),
        });
        Some(Handshaking {
            gate: self.clone(),
            id,
            standing,
        })
    }

    /// Exchanges a finished handshake's place for an established one, or `None` (logged,
    /// throttled) when the port serves all it may (a port that evicts idle connections makes
    /// room instead), or when the handshake was evicted meanwhile.
    pub fn establish(self: &Arc<Self>, hs: Handshaking) -> Option<Admitted> {
        let mut p = self.places();
        let i = p.handshakes.iter().position(|e| e.id == hs.id)?;
        let entry = p.handshakes.remove(i);
        if p.established.len() >= self.limits.established && self.evict_idle {
            let idle = p
                .established
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| {
                    e.standing
                        .active_ms
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
                .map(|(i, _)| i);
            if let Some(i) = idle {
                let e = p.established.remove(i);
                e.standing.evict();
            }
        }
        if p.established.len() >= self.limits.established {
            drop(p);
            crate::warn_throttled!(
                self.refused,
                port = self.name,
                "refused a connection: {} already served",
                self.limits.established
            );
            return None;
        }
        entry.standing.touch();
        let admitted = Admitted {
            gate: self.clone(),
            id: entry.id,
            standing: entry.standing.clone(),
        };
        p.established.push(entry);
        Some(admitted)
    }

    /// A place among the established connections for a peer with no handshake (a same-host
    /// socket whose credentials were checked at accept).
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let hs = self.handshake(None)?;
        self.establish(hs)
    }

    /// Connections established now.
    pub fn established(&self) -> usize {
        self.places().established.len()
    }

    /// Connections in their handshake now.
    pub fn in_handshake(&self) -> usize {
        self.places().handshakes.len()
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut p = self.gate.places();
        p.handshakes.retain(|e| e.id != self.id);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut p = self.gate.places();
        p.established.retain(|e| e.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn handshakes_make_room_by_evicting_the_busiest_source_and_established_places_are_apart() {
        let g = Gate::new(
            "test",
            Limits {
                established: 3,
                handshakes: 4,
                handshakes_per_source: 2,
            },
        );
        let a1 = g.handshake(ip(1)).unwrap();
        let a2 = g.handshake(ip(1)).unwrap();
        // A third from one source evicts that source's oldest.
        let a3 = g.handshake(ip(1)).unwrap();
        assert!(a1.standing.is_evicted() && !a2.standing.is_evicted());
        let b1 = g.handshake(ip(2)).unwrap();
        let _c1 = g.handshake(None).unwrap();
        // Full: a fifth evicts the oldest of the busiest source (ip 1: a2).
        let d1 = g.handshake(ip(3)).unwrap();
        assert!(a2.standing.is_evicted() && !b1.standing.is_evicted());
        assert_eq!(g.in_handshake(), 4);
        // An evicted handshake gets no established place; the others do.
        assert!(g.establish(a1).is_none());
        let e1 = g.establish(a3).unwrap();
        let e2 = g.establish(b1).unwrap();
        let _e3 = g.establish(d1).unwrap();
        let late = g.handshake(ip(4)).unwrap();
        assert!(g.establish(late).is_none(), "a fourth established");
        assert_eq!(g.established(), 3);
        drop((e1, e2));
        assert_eq!(g.established(), 1);
        assert!(g.admit().is_some());
    }

    #[test]
    fn silent_handshakes_are_evicted_before_those_that_spoke() {
        let g = Gate::new(
            "test",
            Limits {
                established: 8,
                handshakes: 4,
                handshakes_per_source: 3,
            },
        );
        // A client that sent its ClientHello, then a redial loop that never speaks, from
        // more sources than the gate holds.
        let client = g.handshake(ip(1)).unwrap();
        client.spoke();
        let mut silent = Vec::new();
        for k in 0..20u8 {
            silent.push(g.handshake(ip(10 + k % 3)).unwrap());
        }
        assert!(!client.standing.is_evicted());
        assert_eq!(g.in_handshake(), 4);
        // Over its source's share, a client's own silent handshake goes before its spoken one.
        let again = g.handshake(ip(1)).unwrap();
        let third = g.handshake(ip(1)).unwrap();
        let fourth = g.handshake(ip(1)).unwrap();
        assert!(!client.standing.is_evicted());
        assert!(again.standing.is_evicted() && !fourth.standing.is_evicted());
        drop(third);
        assert!(g.establish(client).is_some());
    }

    #[test]
    fn a_gate_that_evicts_idle_makes_room_from_the_longest_idle() {
        let g = Gate::evicting_idle(
            "test",
            Limits {
                established: 2,
                handshakes: 8,
                handshakes_per_source: 8,
            },
        );
        let old = g.admit().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let busy = g.admit().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        busy.standing().touch();
        let new = g.admit().unwrap();
        assert!(old.standing().is_evicted());
        assert!(!busy.standing().is_evicted() && !new.standing().is_evicted());
        assert_eq!(g.established(), 2);
    }

    #[tokio::test]
    async fn accept_skips_connection_errors_and_waits_out_resource_errors() {
        let mut script = vec![
            Err(std::io::Error::from_raw_os_error(libc::ECONNABORTED)),
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            Ok(7),
        ]
        .into_iter();
        let t = std::time::Instant::now();
        let got = accept("test", || {
            let next = script.next().unwrap();
            async move { next }
        })
        .await;
        assert_eq!(got, 7);
        // Two resource errors: 10 ms then 20 ms of pause.
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "{:?}",
            t.elapsed()
        );
    }
}
