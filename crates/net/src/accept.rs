//! Accepting connections: a loop that outlives every transient error, and a [`Gate`] that
//! bounds the connections a port holds at each stage.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

#[derive(Debug, Default)]
struct InProgress {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// Admission to one listening port (see the crate docs). Shared by the port's accept loop
/// and its connections' tasks.
#[derive(Debug)]
pub struct Gate {
    name: &'static str,
    limits: Limits,
    established: Arc<Semaphore>,
    handshakes: Mutex<InProgress>,
    refused: Throttle,
}

/// A connection's place among the handshakes in progress; given back when dropped (the
/// handshake failed or timed out) or exchanged by [`Gate::establish`].
#[derive(Debug)]
pub struct Handshaking {
    gate: Arc<Gate>,
    source: Option<IpAddr>,
}

/// A connection's place among the established ones, held for its life.
#[derive(Debug)]
pub struct Admitted {
    _slot: OwnedSemaphorePermit,
}

impl Gate {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            limits,
            established: Arc::new(Semaphore::new(limits.established)),
            handshakes: Mutex::default(),
            refused: Throttle::per_second(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A place among the handshakes in progress for a connection from `source` (`None`: a
    /// same-host socket, counted in the total only), or `None` when the port or that source
    /// has all it may have (the refusal is logged, throttled).
    pub fn handshake(self: &Arc<Self>, source: Option<IpAddr>) -> Option<Handshaking> {
        let mut p = self.handshakes.lock().unwrap_or_else(|e| e.into_inner());
        let from_source = source.map_or(0, |s| p.by_source.get(&s).copied().unwrap_or(0));
        let why = if p.total >= self.limits.handshakes {
            Some(format!("{} handshakes in progress", p.total))
        } else if source.is_some() && from_source >= self.limits.handshakes_per_source {
            Some(format!(
                "{from_source} handshakes in progress from that address"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            drop(p);
            crate::warn_throttled!(
                self.refused,
                port = self.name,
                source = ?source,
                "refused a connection: {why}"
            );
            return None;
        }
        p.total += 1;
        if let Some(s) = source {
            *p.by_source.entry(s).or_insert(0) += 1;
        }
        Some(Handshaking {
            gate: self.clone(),
            source,
        })
    }

    /// Exchanges a finished handshake's place for an established one, or `None` (logged,
    /// throttled) when the port serves all it may.
    pub fn establish(&self, hs: Handshaking) -> Option<Admitted> {
        drop(hs);
        match self.established.clone().try_acquire_owned() {
            Ok(slot) => Some(Admitted { _slot: slot }),
            Err(_) => {
                crate::warn_throttled!(
                    self.refused,
                    port = self.name,
                    "refused a connection: {} already served",
                    self.limits.established
                );
                None
            }
        }
    }

    /// A place among the established connections for a peer with no handshake (a same-host
    /// socket whose credentials were checked at accept).
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let hs = self.handshake(None)?;
        self.establish(hs)
    }

    /// Connections established now.
    pub fn established(&self) -> usize {
        self.limits.established - self.established.available_permits()
    }

    /// Connections in their handshake now.
    pub fn in_handshake(&self) -> usize {
        self.handshakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .total
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut p = self
            .gate
            .handshakes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.total -= 1;
        if let Some(s) = self.source {
            if let Some(n) = p.by_source.get_mut(&s) {
                *n -= 1;
                if *n == 0 {
                    p.by_source.remove(&s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn handshakes_are_capped_per_source_and_in_total_and_established_apart() {
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
        assert!(g.handshake(ip(1)).is_none(), "a third from one source");
        let b1 = g.handshake(ip(2)).unwrap();
        let _c1 = g.handshake(None).unwrap();
        assert!(g.handshake(ip(3)).is_none(), "a fifth in total");
        assert_eq!(g.in_handshake(), 4);
        // Established places are apart from handshakes: they free theirs.
        let e1 = g.establish(a1).unwrap();
        let e2 = g.establish(a2).unwrap();
        assert_eq!(g.in_handshake(), 2);
        let a3 = g.handshake(ip(1)).unwrap();
        let _e3 = g.establish(b1).unwrap();
        assert!(g.establish(a3).is_none(), "a fourth established");
        assert_eq!((g.established(), g.in_handshake()), (3, 1));
        drop((e1, e2));
        assert_eq!(g.established(), 1);
        assert!(g.admit().is_some());
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
