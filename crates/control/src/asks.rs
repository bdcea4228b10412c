//! Which job of this manager is asking a volume's writer on another host for something.
//!
//! A writer on another host serves one request of each kind per volume, through keys in the
//! metadata store: `takeouts/<volume>` (a planned restart's take-out, the first step of a
//! parity copy's move) and `moves/<volume>` (a copy's move). Two jobs on one volume at once
//! (a restart of one node and a drain of another; drains of two nodes) would replace each
//! other's request, and each would read the other's answers. So a job claims the volume
//! first, for as long as it uses the keys:
//!
//! | job | when the volume is claimed already |
//! |---|---|
//! | a move (`node drain`, `node remove`) | waits for the claim to end: moves go on one after another |
//! | a planned restart (`node restart`) | refused, naming the job that holds it: a restart does not wait hours for a drain |
//!
//! A request in the store that no job of this manager claims was left by a manager that
//! died, and is replaced: jobs run under the manager role.

use std::collections::HashMap;
use std::sync::Mutex;

/// The volumes claimed, each with what holds it (for the refusal).
#[derive(Debug, Default)]
pub(crate) struct WriterAsks {
    busy: Mutex<HashMap<String, String>>,
    freed: tokio::sync::Notify,
}

/// A volume claimed; dropping it ends the claim.
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    asks: &'a WriterAsks,
    volume: String,
}

impl WriterAsks {
    fn busy(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `volume` for `what` now; what holds it, if another job does.
    pub(crate) fn try_claim(&self, volume: &str, what: &str) -> Result<Claim<'_>, String> {
        let mut busy = self.busy();
        if let Some(holder) = busy.get(volume) {
            return Err(holder.clone());
        }
        busy.insert(volume.to_string(), what.to_string());
        Ok(Claim {
            asks: self,
            volume: volume.to_string(),
        })
    }

    /// Claims `volume` for `what`, once the job that holds it lets it go.
    pub(crate) async fn claim(&self, volume: &str, what: &str) -> Claim<'_> {
        let mut said = false;
        loop {
            // Registered before the look, so a release between the two is not missed.
            let freed = self.freed.notified();
            match self.try_claim(volume, what) {
                Ok(c) => return c,
                Err(holder) if !said => {
                    tracing::info!(
                        volume,
                        "{what} waits for {holder}, which is asking its writer"
                    );
                    said = true;
                }
                Err(_) => {}
            }
            freed.await;
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.asks.busy().remove(&self.volume);
        self.asks.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_claimed_volume_is_refused_naming_its_holder_until_let_go() {
        let asks = WriterAsks::default();
        let a = asks.try_claim("vol", "the drain of node 2").unwrap();
        assert_eq!(
            asks.try_claim("vol", "the restart of node 3").unwrap_err(),
            "the drain of node 2"
        );
        let other = asks.try_claim("other", "the restart of node 3").unwrap();
        drop(a);
        asks.try_claim("vol", "the restart of node 3").unwrap();
        drop(other);
    }

    #[tokio::test]
    async fn a_waiting_claim_goes_on_once_the_holder_lets_go() {
        let asks = std::sync::Arc::new(WriterAsks::default());
        let first = asks.try_claim("vol", "the drain of node 2").unwrap();
        let waiter = {
            let asks = asks.clone();
            tokio::spawn(async move {
                let _c = asks.claim("vol", "the drain of node 3").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "claimed while the first held it");
        drop(first);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter goes on")
            .unwrap();
        asks.try_claim("vol", "again")
            .expect("the waiter let it go");
    }
}
