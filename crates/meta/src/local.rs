//! The local backends: in memory (the simulator, tests) and embedded in one redb file (the
//! default for `trireme up`), with etcd's semantics (see `kv.rs`).
//!
//! One engine serves both: the keys live in a `BTreeMap` under one mutex; the embedded store
//! also writes every change to redb (one fsynced write transaction per metadata transaction)
//! before the change is applied in memory or seen by a watch. Leases live in this process
//! only: they die with it, so at open the embedded store holds no lease-bound key (they are
//! never written to the file). Time is tokio's clock, so a paused runtime (the simulator)
//! expires leases in virtual time.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redb::{Database, ReadableTable, TableDefinition, TableHandle};
use tokio::time::Instant;

use crate::kv::{
    KeyValue, LeaseId, MetaFut, MetaStore, Op, Txn, TxnResult, Watch, WatchEvent, WATCH_BUFFER,
};
use crate::MetaError;

const KV: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("kv");
const REVISION: TableDefinition<'_, &str, i64> = TableDefinition::new("revision");
/// Tables of the format before the key-value layout (nodes, volumes, settings).
const LEGACY_VOLUMES: TableDefinition<'_, &str, &str> = TableDefinition::new("volumes");

/// Changes kept for watches that start in the past.
const HISTORY: usize = 8192;
/// The shortest lease.
const MIN_TTL: Duration = Duration::from_secs(1);

/// Metadata in this process (and, when embedded, in a redb file).
#[derive(Clone)]
pub struct EmbeddedMeta {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    db: Option<Database>,
    path: String,
}

#[derive(Default)]
struct State {
    kv: BTreeMap<String, KeyValue>,
    revision: i64,
    /// Revisions up to this one are no longer in `history`.
    compacted: i64,
    history: VecDeque<WatchEvent>,
    watchers: Vec<(String, tokio::sync::mpsc::Sender<WatchEvent>)>,
    leases: BTreeMap<LeaseId, Lease>,
    next_lease: LeaseId,
}

struct Lease {
    ttl: Duration,
    deadline: Instant,
}

impl std::fmt::Debug for EmbeddedMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedMeta")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// Stored form of a key: create revision, mod revision, version (8 bytes each, LE), value.
fn encode(kv: &KeyValue) -> Vec<u8> {
    let mut b = Vec::with_capacity(24 + kv.value.len());
    b.extend_from_slice(&kv.create_revision.to_le_bytes());
    b.extend_from_slice(&kv.mod_revision.to_le_bytes());
    b.extend_from_slice(&kv.version.to_le_bytes());
    b.extend_from_slice(&kv.value);
    b
}

fn decode(key: &str, b: &[u8]) -> Result<KeyValue, MetaError> {
    if b.len() < 24 {
        return Err(MetaError::Corrupt {
            key: key.to_string(),
            what: format!(
                "stored record of {} bytes, under its 24-byte header",
                b.len()
            ),
        });
    }
    let n = |i: usize| i64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Ok(KeyValue {
        key: key.to_string(),
        create_revision: n(0),
        mod_revision: n(8),
        version: n(16),
        value: b[24..].to_vec(),
        lease: 0,
    })
}

impl EmbeddedMeta {
    /// A store that lives in this process only.
    pub fn in_memory() -> EmbeddedMeta {
        EmbeddedMeta::with(None, "memory".into(), State::default())
    }

    /// Opens or creates the metadata file. Fails clearly if another process holds it.
    pub fn open(path: &Path) -> Result<EmbeddedMeta, MetaError> {
        let p = path.display().to_string();
        let err = |e: &dyn std::fmt::Display| MetaError::Storage {
            path: p.clone(),
            what: e.to_string(),
        };
        let db = Database::create(path).map_err(|e| err(&e))?;
        let mut st = State::default();
        {
            let tx = db.begin_write().map_err(|e| err(&e))?;
            {
                let kv = tx.open_table(KV).map_err(|e| err(&e))?;
                let rev = tx.open_table(REVISION).map_err(|e| err(&e))?;
                st.revision = rev
                    .get("revision")
                    .map_err(|e| err(&e))?
                    .map_or(0, |v| v.value());
                for r in kv.iter().map_err(|e| err(&e))? {
                    let (k, v) = r.map_err(|e| err(&e))?;
                    let rec = decode(k.value(), v.value())?;
                    st.kv.insert(rec.key.clone(), rec);
                }
            }
            if st.kv.is_empty() && legacy(&tx) {
                return Err(err(
                    &"written by an earlier trireme (tables nodes/volumes/settings, \
                     before the key-value layout); start a new --data-dir, or keep using the \
                     earlier version for this one",
                ));
            }
            tx.commit().map_err(|e| err(&e))?;
        }
        st.compacted = st.revision;
        // Lease ids of this process never equal those of an earlier one on this file.
        st.next_lease = st.revision.saturating_mul(1 << 20);
        Ok(EmbeddedMeta::with(Some(db), p, st))
    }

    fn with(db: Option<Database>, path: String, state: State) -> EmbeddedMeta {
        EmbeddedMeta {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                db,
                path,
            }),
        }
    }
}

fn legacy(tx: &redb::WriteTransaction) -> bool {
    tx.list_tables()
        .map(|mut ts| ts.any(|t| t.name() == LEGACY_VOLUMES.name()))
        .unwrap_or(false)
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn storage_err(&self, e: impl std::fmt::Display) -> MetaError {
        MetaError::Storage {
            path: self.path.clone(),
            what: e.to_string(),
        }
    }

    /// Writes planned changes durably (embedded) then applies them and tells the watches.
    fn commit(
        &self,
        st: &mut State,
        changes: Vec<(String, Option<KeyValue>)>,
    ) -> Result<(), MetaError> {
        if changes.is_empty() {
            return Ok(());
        }
        let rev = st.revision + 1;
        if let Some(db) = &self.db {
            let tx = db.begin_write().map_err(|e| self.storage_err(e))?;
            {
                let mut kv = tx.open_table(KV).map_err(|e| self.storage_err(e))?;
                for (k, v) in &changes {
                    match v {
                        // A leased key dies with this process: never on disk.
                        Some(v) if v.lease == 0 => {
                            kv.insert(k.as_str(), encode(v).as_slice())
                                .map_err(|e| self.storage_err(e))?;
                        }
                        _ => {
                            kv.remove(k.as_str()).map_err(|e| self.storage_err(e))?;
                        }
                    }
                }
                let mut r = tx.open_table(REVISION).map_err(|e| self.storage_err(e))?;
                r.insert("revision", rev).map_err(|e| self.storage_err(e))?;
            }
            tx.commit().map_err(|e| self.storage_err(e))?;
        }
        st.revision = rev;
        for (k, v) in changes {
            let ev = match v {
                Some(v) => {
                    st.kv.insert(k, v.clone());
                    WatchEvent {
                        deleted: false,
                        kv: v,
                    }
                }
                None => {
                    st.kv.remove(&k);
                    WatchEvent {
                        deleted: true,
                        kv: KeyValue {
                            key: k,
                            value: Vec::new(),
                            create_revision: 0,
                            mod_revision: rev,
                            version: 0,
                            lease: 0,
                        },
                    }
                }
            };
            // A watch that cannot take an event is closed: its owner reads afresh.
            st.watchers.retain(|(p, tx)| {
                !ev.kv.key.starts_with(p.as_str()) || tx.try_send(ev.clone()).is_ok()
            });
            st.history.push_back(ev);
            if st.history.len() > HISTORY {
                if let Some(old) = st.history.pop_front() {
                    st.compacted = st.compacted.max(old.kv.mod_revision);
                }
            }
        }
        Ok(())
    }

    /// Deletes the keys of every lease past its deadline (one revision for all of them).
    fn expire(&self, st: &mut State) -> Result<(), MetaError> {
        let now = Instant::now();
        let dead: Vec<LeaseId> = st
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        if dead.is_empty() {
            return Ok(());
        }
        for id in &dead {
            st.leases.remove(id);
        }
        let changes: Vec<_> = st
            .kv
            .values()
            .filter(|kv| dead.contains(&kv.lease))
            .map(|kv| (kv.key.clone(), None))
            .collect();
        self.commit(st, changes)
    }

    fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError> {
        let mut st = self.lock();
        self.expire(&mut st)?;
        let succeeded = txn.compare.iter().all(|c| c.holds(st.kv.get(&c.key)));
        let ops = if succeeded { txn.success } else { txn.failure };
        let rev = st.revision + 1;
        // Plan against an overlay so later ops of the transaction see earlier ones.
        let mut overlay: BTreeMap<String, Option<KeyValue>> = BTreeMap::new();
        let mut gets = Vec::new();
        for op in ops {
            match op {
                Op::Get { key } => {
                    let cur = match overlay.get(&key) {
                        Some(v) => v.clone(),
                        None => st.kv.get(&key).cloned(),
                    };
                    gets.push(cur);
                }
                Op::Put { key, value, lease } => {
                    if lease != 0 && !st.leases.contains_key(&lease) {
                        return Err(MetaError::NoLease(lease));
                    }
                    let prev = match overlay.get(&key) {
                        Some(v) => v.clone(),
                        None => st.kv.get(&key).cloned(),
                    };
                    let kv = KeyValue {
                        create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                        version: prev.as_ref().map_or(1, |p| p.version + 1),
                        mod_revision: rev,
                        key: key.clone(),
                        value,
                        lease,
                    };
                    overlay.insert(key, Some(kv));
                }
                Op::Delete { key } => {
                    let exists = match overlay.get(&key) {
                        Some(v) => v.is_some(),
                        None => st.kv.contains_key(&key),
                    };
                    if exists {
                        overlay.insert(key, None);
                    }
                }
            }
        }
        // A key put then deleted inside one transaction, and never stored before, is no change.
        let changes: Vec<_> = overlay
            .into_iter()
            .filter(|(k, v)| v.is_some() || st.kv.contains_key(k))
            .collect();
        self.commit(&mut st, changes)?;
        Ok(TxnResult {
            succeeded,
            revision: st.revision,
            gets,
        })
    }
}

/// Expires a lease in time even when no other call comes: sleeps to its deadline, and again
/// if it was refreshed meanwhile.
fn reap(inner: Weak<Inner>, id: LeaseId) {
    tokio::spawn(async move {
        loop {
            let deadline = {
                let Some(i) = inner.upgrade() else { return };
                let st = i.lock();
                match st.leases.get(&id) {
                    Some(l) => l.deadline,
                    None => return,
                }
            };
            tokio::time::sleep_until(deadline).await;
            let Some(i) = inner.upgrade() else { return };
            let mut st = i.lock();
            if let Err(e) = i.expire(&mut st) {
                tracing::error!("expiring lease {id}: {e}");
            }
        }
    });
}

impl MetaStore for EmbeddedMeta {
    fn backend(&self) -> &'static str {
        if self.inner.db.is_some() {
            "embedded"
        } else {
            "memory"
        }
    }

    fn range<'a>(&'a self, prefix: &'a str) -> MetaFut<'a, (Vec<KeyValue>, i64)> {
        Box::pin(async move {
            let mut st = self.inner.lock();
            self.inner.expire(&mut st)?;
            let out = st
                .kv
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, v)| v.clone())
                .collect();
            Ok((out, st.revision))
        })
    }

    fn txn(&self, txn: Txn) -> MetaFut<'_, TxnResult> {
        Box::pin(async move { self.inner.txn(txn) })
    }

    fn grant(&self, ttl: Duration) -> MetaFut<'_, LeaseId> {
        Box::pin(async move {
            let ttl = ttl.max(MIN_TTL);
            let id = {
                let mut st = self.inner.lock();
                st.next_lease += 1;
                let id = st.next_lease;
                st.leases.insert(
                    id,
                    Lease {
                        ttl,
                        deadline: Instant::now() + ttl,
                    },
                );
                id
            };
            reap(Arc::downgrade(&self.inner), id);
            Ok(id)
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> MetaFut<'_, bool> {
        Box::pin(async move {
            let mut st = self.inner.lock();
            self.inner.expire(&mut st)?;
            Ok(match st.leases.get_mut(&lease) {
                Some(l) => {
                    l.deadline = Instant::now() + l.ttl;
                    true
                }
                None => false,
            })
        })
    }

    fn revoke(&self, lease: LeaseId) -> MetaFut<'_, ()> {
        Box::pin(async move {
            let mut st = self.inner.lock();
            if let Some(l) = st.leases.get_mut(&lease) {
                l.deadline = Instant::now();
            }
            self.inner.expire(&mut st)
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> MetaFut<'a, Watch> {
        Box::pin(async move {
            let mut st = self.inner.lock();
            self.inner.expire(&mut st)?;
            let from = if from_revision <= 0 {
                st.revision + 1
            } else {
                from_revision
            };
            if from <= st.compacted {
                return Err(MetaError::Compacted {
                    asked: from,
                    oldest: st.compacted + 1,
                });
            }
            let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
            for ev in st
                .history
                .iter()
                .filter(|e| e.kv.mod_revision >= from && e.kv.key.starts_with(prefix))
            {
                if tx.try_send(ev.clone()).is_err() {
                    return Err(MetaError::Compacted {
                        asked: from,
                        oldest: st.revision + 1,
                    });
                }
            }
            st.watchers.push((prefix.to_string(), tx));
            Ok(Watch { rx })
        })
    }
}
