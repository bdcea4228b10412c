//! The key-value seam under the cluster metadata, with etcd's semantics.
//!
//! Every backend keeps one totally ordered history of revisions. A key carries the revision
//! that created it, the one that last changed it, its version (puts since creation) and the
//! lease it is bound to. A transaction compares keys against expected values and applies one
//! of two lists of operations atomically, as one new revision. A lease expires `ttl` after its
//! last refresh and deletes every key bound to it. A watch streams every change under a prefix
//! from a given revision on, in order.
//!
//! Rules every backend keeps (the conformance suite in `tests.rs` checks them on each):
//! - a transaction that changes nothing (only gets, or a failed compare with no failure ops)
//!   does not take a revision;
//! - `create_revision`/`mod_revision`/`version` of an absent key compare as 0;
//! - a put to a key keeps its `create_revision` and bumps its `version`; a delete then a put
//!   starts over (new `create_revision`, version 1);
//! - a put bound to an unknown or expired lease fails the whole transaction with
//!   [`MetaError::NoLease`], changing nothing;
//! - watch events come in revision order, one per changed key, with the key's state after the
//!   change (for a delete: the key, empty value and the deleting revision); a watch that falls
//!   behind is closed, and one asked for revisions the backend no longer holds fails with
//!   [`MetaError::Compacted`]: the caller reads the range afresh and watches from there.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::MetaError;

/// What every call returns: boxed so the trait stays object safe.
pub type MetaFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, MetaError>> + Send + 'a>>;

/// A lease id (never 0: 0 means "no lease").
pub type LeaseId = i64;

/// One key and its history markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    /// 0 if the key is bound to no lease.
    pub lease: LeaseId,
}

/// How [`MetaStore::alarms`] names a store that is full and refuses writes.
pub const ALARM_NOSPACE: &str = "NOSPACE";

/// What a compare looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Vec<u8>),
    Lease(LeaseId),
}

/// How a compare judges the key's field against the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

/// One condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub op: CmpOp,
    pub target: Target,
}

impl Compare {
    /// True when the key does not exist.
    pub fn absent(key: impl Into<String>) -> Compare {
        Compare {
            key: key.into(),
            op: CmpOp::Equal,
            target: Target::Version(0),
        }
    }
    /// True when the key was last changed at `rev` (0: absent).
    pub fn mod_revision(key: impl Into<String>, rev: i64) -> Compare {
        Compare {
            key: key.into(),
            op: CmpOp::Equal,
            target: Target::ModRevision(rev),
        }
    }
    /// True when the key exists and is bound to `lease`.
    pub fn lease(key: impl Into<String>, lease: LeaseId) -> Compare {
        Compare {
            key: key.into(),
            op: CmpOp::Equal,
            target: Target::Lease(lease),
        }
    }

    /// Evaluates the compare against the key's current state (`None`: absent).
    pub fn holds(&self, kv: Option<&KeyValue>) -> bool {
        use std::cmp::Ordering;
        let ord = match (&self.target, kv) {
            (Target::Version(v), k) => k.map_or(0, |k| k.version).cmp(v),
            (Target::CreateRevision(v), k) => k.map_or(0, |k| k.create_revision).cmp(v),
            (Target::ModRevision(v), k) => k.map_or(0, |k| k.mod_revision).cmp(v),
            (Target::Lease(v), k) => k.map_or(0, |k| k.lease).cmp(v),
            // etcd: a value compare on an absent key is false whatever the operator.
            (Target::Value(_), None) => return false,
            (Target::Value(v), Some(k)) => k.value.as_slice().cmp(v.as_slice()),
        };
        match self.op {
            CmpOp::Equal => ord == Ordering::Equal,
            CmpOp::NotEqual => ord != Ordering::Equal,
            CmpOp::Greater => ord == Ordering::Greater,
            CmpOp::Less => ord == Ordering::Less,
        }
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        /// Bind the key to this lease (0: none).
        lease: LeaseId,
    },
    Delete {
        key: String,
    },
    /// Reads the key as of the transaction (its result is in [`TxnResult::gets`]).
    Get {
        key: String,
    },
}

impl Op {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: 0,
        }
    }
    pub fn put_leased(key: impl Into<String>, value: impl Into<Vec<u8>>, lease: LeaseId) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }
    pub fn delete(key: impl Into<String>) -> Op {
        Op::Delete { key: key.into() }
    }
    pub fn get(key: impl Into<String>) -> Op {
        Op::Get { key: key.into() }
    }
}

/// A transaction: if every compare holds, `success` is applied, else `failure`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub fn when(compare: Vec<Compare>) -> Txn {
        Txn {
            compare,
            ..Txn::default()
        }
    }
    pub fn then(mut self, ops: Vec<Op>) -> Txn {
        self.success = ops;
        self
    }
    pub fn otherwise(mut self, ops: Vec<Op>) -> Txn {
        self.failure = ops;
        self
    }
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether every compare held (`success` ran) or not (`failure` ran).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
    /// The result of each `Get` of the branch that ran, in order.
    pub gets: Vec<Option<KeyValue>>,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub deleted: bool,
    /// The key after the change (for a delete: the key, an empty value, `mod_revision` = the
    /// revision of the delete).
    pub kv: KeyValue,
}

/// A stream of changes under a prefix. Closed (`recv` gives `None`) when the backend drops it
/// (it fell behind, or the connection to the store broke): read afresh and watch again.
#[derive(Debug)]
pub struct Watch {
    pub rx: tokio::sync::mpsc::Receiver<WatchEvent>,
}

impl Watch {
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

/// Events a watch may hold before it is dropped as too slow.
pub const WATCH_BUFFER: usize = 1024;

/// Cluster metadata storage with etcd's semantics (see the module doc). Implementations are
/// cheap to share and safe to call concurrently; every call that returns `Ok` for a write is
/// durable (embedded: fsynced; etcd: committed by a quorum).
pub trait MetaStore: Send + Sync + std::fmt::Debug {
    /// Which backend this is, for messages (`embedded`, `memory`, `etcd`).
    fn backend(&self) -> &'static str;
    /// Every key starting with `prefix`, in key order, and the revision they were read at.
    fn range<'a>(&'a self, prefix: &'a str) -> MetaFut<'a, (Vec<KeyValue>, i64)>;
    /// Runs a transaction atomically.
    fn txn(&self, txn: Txn) -> MetaFut<'_, TxnResult>;
    /// A new lease that expires `ttl` after its last refresh (at least 1 s).
    fn grant(&self, ttl: Duration) -> MetaFut<'_, LeaseId>;
    /// Refreshes a lease; `Ok(false)` if it has expired or never existed.
    fn keep_alive(&self, lease: LeaseId) -> MetaFut<'_, bool>;
    /// Ends a lease now, deleting its keys. Unknown leases are not an error.
    fn revoke(&self, lease: LeaseId) -> MetaFut<'_, ()>;
    /// Changes under `prefix` with revisions from `from_revision` on.
    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> MetaFut<'a, Watch>;

    /// Drops the history of revisions before `revision` (etcd's compaction: what a store that
    /// keeps every revision needs to stay within its quota). A no-op where no history is kept.
    fn compact(&self, _revision: i64) -> MetaFut<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    /// What the store says is wrong with itself (etcd's alarms: `NOSPACE` when it is full and
    /// refuses writes, `CORRUPT`). Empty where there is no such thing.
    fn alarms(&self) -> MetaFut<'_, Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// One key, or `None`.
    fn get<'a>(&'a self, key: &'a str) -> MetaFut<'a, Option<KeyValue>> {
        Box::pin(async move {
            let r = self.txn(Txn::when(vec![]).then(vec![Op::get(key)])).await?;
            Ok(r.gets.into_iter().next().flatten())
        })
    }
}
