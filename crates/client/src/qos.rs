//! A volume's I/O limits, kept by its writer: every read and write waits, before it goes to
//! the copies, until its limits let it start (the schedule is `trireme_replication::qos`'s).
//! The writer is the one place every frontend's requests pass, so the limits hold per volume
//! whatever the number of connections, devices or protocols. A volume without limits pays
//! one relaxed load per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use trireme_replication::qos::{Cost, Limiter, Limits};

use crate::Volume;

/// The writer's limiter and what it held back.
#[derive(Debug, Default)]
pub(crate) struct Qos {
    /// Any limit set: requests ask the limiter.
    limited: AtomicBool,
    limiter: Mutex<Limiter>,
    /// Woken when the limits change: waiting requests are admitted again under the new ones.
    changed: tokio::sync::Notify,
    /// Time requests spent waiting for their limits, summed (ns).
    throttled_ns: AtomicU64,
    /// 8 KiB units of the requests that went through, limited or not: the demand an
    /// aggregated QoS policy shares out by.
    units: AtomicU64,
    /// A node refused the volume's claim (this writer's identity may not set it; its nodes
    /// take it from the metadata): not sent again.
    claims_denied: AtomicBool,
}

impl Qos {
    pub(crate) fn new(limits: Limits) -> Qos {
        Qos {
            limited: AtomicBool::new(!limits.is_unlimited()),
            limiter: Mutex::new(Limiter::new(limits)),
            ..Qos::default()
        }
    }

    fn limiter(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Volume {
    /// The limits the writer keeps now.
    pub fn limits(&self) -> Limits {
        self.qos.limiter().limits()
    }

    /// Keeps `limits` from now on (requests waiting are admitted again under them); logs a
    /// change, and tells the copies' nodes of a new reserve or weight.
    pub async fn set_limits(&self, limits: Limits) {
        let now = self.nanos_open();
        let was = self.limits();
        let changed = self.qos.limiter().set(limits, now);
        if changed {
            self.qos.limited.store(!limits.is_unlimited(), Relaxed);
            self.qos.changed.notify_waiters();
            tracing::info!(volume = %self.info.name, limits = %limits, "limits changed");
        }
        if was.claim() != limits.claim() {
            self.send_claims().await;
        }
    }

    /// Tells every in-sync copy's node the volume's reserve and weight ([`Volume::send_claim`]).
    pub(crate) async fn send_claims(&self) {
        let sends = self
            .in_sync()
            .into_iter()
            .map(|i| Box::pin(self.send_claim(i)) as crate::BoxFut<'_, ()>)
            .collect();
        crate::join_all(sends).await;
    }

    /// The request that gives a node the volume's reserve and weight: none for the defaults,
    /// nor once a node refused this writer's.
    pub(crate) fn claim_request(&self) -> Option<trireme_proto::Header> {
        let (reserve, weight) = self.limits().claim();
        if (reserve, weight) == (0, 1) || self.qos.claims_denied.load(Relaxed) {
            return None;
        }
        Some(self.header(trireme_proto::Op::Qos, reserve, u64::from(weight)))
    }

    /// Tells replica `i`'s node the volume's reserve and weight (its I/O threads serve by
    /// them), unless they are the defaults. What the node answers changes nothing here: a
    /// node that missed it serves the volume by the defaults until the next attach or change.
    pub(crate) async fn send_claim(&self, i: usize) {
        let Some(h) = self.claim_request() else {
            return;
        };
        match self.call(i, h, bytes::Bytes::new()).await {
            Ok(f) if f.header.status == trireme_proto::Status::Denied => {
                // A client's writer: the nodes read the volume's claim from the metadata.
                self.qos.claims_denied.store(true, Relaxed);
            }
            Ok(f) if f.header.status != trireme_proto::Status::Ok => {
                tracing::debug!(volume = %self.info.name, node = self.node(i), status = ?f.header.status, "the node did not take the volume's claim");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(volume = %self.info.name, node = self.node(i), "sending the volume's claim: {e}")
            }
        }
    }

    /// How long requests have waited for the volume's limits, in all, since it was opened.
    pub fn throttled(&self) -> Duration {
        Duration::from_nanos(self.qos.throttled_ns.load(Relaxed))
    }

    /// 8 KiB units of I/O requests since it was opened (a 64 KiB request is 8).
    pub fn io_units(&self) -> u64 {
        self.qos.units.load(Relaxed)
    }

    fn nanos_open(&self) -> u64 {
        self.opened.elapsed().as_nanos() as u64
    }

    /// Waits until the volume's limits let a request of `cost` start.
    pub(crate) async fn throttle(&self, cost: Cost) {
        self.qos.units.fetch_add(cost.units, Relaxed);
        if !self.qos.limited.load(Relaxed) {
            return;
        }
        let arrived = self.nanos_open();
        loop {
            let changed = self.qos.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = self.nanos_open();
            let start = self.qos.limiter().admit(now, cost);
            if start <= now {
                break;
            }
            let at = self.opened + Duration::from_nanos(start);
            // Tokio's timer wakes a tick (1 ms) late: a short wait goes to the fine timer.
            let fine = start - now <= crate::fine_timer::FINE_NS;
            let sleep = async move {
                match fine {
                    true => crate::fine_timer::sleep_until(at).await,
                    false => tokio::time::sleep_until(at).await,
                }
            };
            tokio::select! {
                _ = sleep => break,
                _ = changed => {}
            }
        }
        let waited = self.nanos_open().saturating_sub(arrived);
        if waited > 0 {
            self.qos.throttled_ns.fetch_add(waited, Relaxed);
            if let Some(m) = &self.metrics {
                m.throttled(Duration::from_nanos(waited));
            }
        }
    }
}
