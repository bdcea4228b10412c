//! Processes and the metadata store as they reach it.
//!
//! A simulated process (a writer, a manager candidate) owns a [`Proc`]. When it dies it sends
//! nothing more: its connections to the nodes close (a request already delivered is still
//! applied, its answer lost) and its calls to the metadata store never complete, so its leases
//! lapse as a killed process's do. [`SimMeta`] is the store as one process reaches it over the
//! network: during an outage of the store ([`MetaNet`]) every call fails after a connect
//! timeout and every watch breaks, as with an unreachable etcd; the store itself (leases
//! included) keeps running on tokio's virtual clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use trireme_meta::kv::KeyValue;
use trireme_meta::kv::{LeaseId, MetaFut, MetaStore, Txn, TxnResult, Watch, WATCH_BUFFER};
use trireme_meta::MetaError;

/// How long a call to an unreachable store takes to fail.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// One simulated process's fate.
#[derive(Debug, Default)]
pub(crate) struct Proc {
    dead: AtomicBool,
}

impl Proc {
    pub(crate) fn kill(&self) {
        self.dead.store(true, Ordering::Release);
    }
    pub(crate) fn dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

/// The network between the processes and the metadata store.
#[derive(Debug)]
pub(crate) struct MetaNet {
    out: AtomicBool,
    /// Every watch stream subscribes; an outage sends once. A broadcast channel, not a watch
    /// channel: a watch channel's receivers wait on randomly chosen shards and are woken in a
    /// random order, so two processes' watches broken by one outage would resume in a
    /// different order each time and a seed would not replay.
    breaks: tokio::sync::broadcast::Sender<()>,
}

impl MetaNet {
    pub(crate) fn new() -> MetaNet {
        MetaNet {
            out: AtomicBool::new(false),
            breaks: tokio::sync::broadcast::channel(16).0,
        }
    }
    pub(crate) fn set_out(&self, out: bool) {
        self.out.store(out, Ordering::Release);
        if out {
            let _ = self.breaks.send(());
        }
    }
    pub(crate) fn out(&self) -> bool {
        self.out.load(Ordering::Acquire)
    }
}

/// The metadata store as one process reaches it.
#[derive(Debug)]
pub(crate) struct SimMeta {
    pub(crate) inner: Arc<dyn MetaStore>,
    pub(crate) net: Arc<MetaNet>,
    pub(crate) proc_: Arc<Proc>,
}

impl SimMeta {
    /// Before a call: a dead process makes none; an unreachable store fails it.
    async fn reach(&self) -> Result<(), MetaError> {
        if self.proc_.dead() {
            std::future::pending::<()>().await;
        }
        if self.net.out() {
            tokio::time::sleep(CONNECT_TIMEOUT).await;
            return Err(MetaError::Unavailable(
                "sim: the metadata store is unreachable".into(),
            ));
        }
        Ok(())
    }

    /// After a call: a process that died meanwhile never sees the answer.
    async fn answer<T>(&self, r: Result<T, MetaError>) -> Result<T, MetaError> {
        if self.proc_.dead() {
            std::future::pending::<()>().await;
        }
        r
    }
}

impl MetaStore for SimMeta {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn range<'a>(&'a self, prefix: &'a str) -> MetaFut<'a, (Vec<KeyValue>, i64)> {
        Box::pin(async move {
            self.reach().await?;
            let r = self.inner.range(prefix).await;
            self.answer(r).await
        })
    }

    fn txn(&self, txn: Txn) -> MetaFut<'_, TxnResult> {
        Box::pin(async move {
            self.reach().await?;
            let r = self.inner.txn(txn).await;
            self.answer(r).await
        })
    }

    fn grant(&self, ttl: Duration) -> MetaFut<'_, LeaseId> {
        Box::pin(async move {
            self.reach().await?;
            let r = self.inner.grant(ttl).await;
            self.answer(r).await
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> MetaFut<'_, bool> {
        Box::pin(async move {
            self.reach().await?;
            let r = self.inner.keep_alive(lease).await;
            self.answer(r).await
        })
    }

    fn revoke(&self, lease: LeaseId) -> MetaFut<'_, ()> {
        Box::pin(async move {
            self.reach().await?;
            let r = self.inner.revoke(lease).await;
            self.answer(r).await
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> MetaFut<'a, Watch> {
        Box::pin(async move {
            self.reach().await?;
            let mut inner = self
                .answer(self.inner.watch(prefix, from_revision).await)
                .await?;
            let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
            let mut breaks = self.net.breaks.subscribe();
            let proc_ = self.proc_.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        biased;
                        ev = inner.recv() => match ev {
                            Some(e) if !proc_.dead() => {
                                if tx.send(e).await.is_err() {
                                    return;
                                }
                            }
                            _ => return,
                        },
                        // An outage: the stream breaks (the receiver sees `None`).
                        _ = breaks.recv() => return,
                    }
                }
            });
            Ok(Watch { rx })
        })
    }
}
