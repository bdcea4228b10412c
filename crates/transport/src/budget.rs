//! The process's budget for request payloads: the bytes of requests received, or being
//! received, that are not answered yet, over every link of the process (TCP and UCX alike).
//! A payload is charged before the first of its bytes is read (TCP) or fetched (a UCX
//! rendezvous) and pays back when it is dropped, so what peers can make a node hold is bounded
//! per process, not per connection. A payload that does not fit waits its turn (first come,
//! first served): back-pressure, not an error.

use std::sync::{Arc, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of request payloads a process holds at most: eight of the largest frames.
pub const PAYLOAD_BUDGET: usize = 8 * trireme_proto::MAX_PAYLOAD as usize;

fn payloads() -> &'static Arc<Semaphore> {
    static SEM: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SEM.get_or_init(|| Arc::new(Semaphore::new(PAYLOAD_BUDGET)))
}

/// A payload's share of the budget, paid back when dropped.
#[derive(Debug)]
pub struct Charge(#[allow(dead_code)] OwnedSemaphorePermit);

/// Charges `len` bytes now, if they fit.
pub fn try_charge(len: usize) -> Option<Charge> {
    payloads()
        .clone()
        .try_acquire_many_owned(len as u32)
        .ok()
        .map(Charge)
}

/// Charges `len` bytes (at most a frame's payload), waiting until they fit.
pub async fn charge(len: usize) -> Charge {
    let p = payloads()
        .clone()
        .acquire_many_owned(len as u32)
        .await
        .expect("the payload budget is never closed");
    Charge(p)
}

/// Bytes charged now (tests and metrics).
pub fn charged() -> usize {
    PAYLOAD_BUDGET - payloads().available_permits()
}

/// A received payload with its charge: `Bytes::from_owner(Charged(buf, charge))` pays back
/// when the last view of the bytes is dropped.
#[derive(Debug)]
pub struct Charged<B>(pub B, pub Option<Charge>);

impl<B: AsRef<[u8]>> AsRef<[u8]> for Charged<B> {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref()
    }
}
