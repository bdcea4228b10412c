//! Nodes, their running daemons, the manager role and its jobs.

use std::collections::BTreeMap;

use serde::Serialize;

use super::*;
use crate::kv::{Compare, KeyValue, LeaseId, Op, Txn};
use crate::{MetaError, NodeRecord};

impl ClusterMeta {
    pub async fn put_node(&self, node: &NodeRecord) -> Result<(), MetaError> {
        let k = key(&format!("nodes/{}", node.id));
        self.write(vec![], vec![Op::put(k, encode(node))])
            .await?
            .ok_or_else(|| MetaError::Refused("node record: conflicting write".into()))?;
        Ok(())
    }

    /// Where the node records live (for watches).
    pub fn nodes_prefix() -> String {
        key("nodes/")
    }

    /// Every registered node, by id, whose record decodes; one that does not is skipped, named
    /// in a warning (one bad record must not take every listing, status and placement down).
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MetaError> {
        let (kvs, _) = self.store.range(&key("nodes/")).await?;
        let mut v: Vec<NodeRecord> = kvs
            .iter()
            .filter_map(|kv| {
                decode(kv)
                    .inspect_err(|e| tracing::warn!("skipping a node: {e}"))
                    .ok()
            })
            .collect();
        v.sort_by_key(|n| n.id);
        Ok(v)
    }

    /// The daemons running now, by node id.
    pub async fn alive(&self) -> Result<BTreeMap<u32, AliveRecord>, MetaError> {
        let v: Vec<AliveRecord> = self.list("alive/").await?;
        Ok(v.into_iter().map(|a| (a.id, a)).collect())
    }

    /// Registers the daemon of node `rec.id` under `lease`, and its node record, in one step,
    /// only if no other daemon holds the id. On refusal, says who holds it.
    pub async fn register_alive(
        &self,
        rec: &AliveRecord,
        node: &NodeRecord,
        lease: LeaseId,
    ) -> Result<(), MetaError> {
        let k = key(&format!("alive/{}", rec.id));
        let r = self
            .store
            .txn(
                Txn::when(vec![Compare::absent(k.clone())])
                    .then(vec![
                        Op::put_leased(k.clone(), encode(rec), lease),
                        Op::put(key(&format!("nodes/{}", node.id)), encode(node)),
                    ])
                    .otherwise(vec![Op::get(k)]),
            )
            .await?;
        if r.succeeded {
            return Ok(());
        }
        let holder = match r.gets.first().and_then(|g| g.as_ref()) {
            Some(kv) => match decode::<AliveRecord>(kv) {
                Ok(a) => format!("pid {} on {} at {}", a.pid, a.host, a.addr),
                Err(_) => "another process".into(),
            },
            None => "another process (it has just gone; try again)".into(),
        };
        Err(MetaError::Refused(format!(
            "node id {} is already held by a running daemon: {holder}",
            rec.id
        )))
    }

    /// Takes the manager role under `lease` if nobody holds it. `Ok(false)`: someone does.
    pub async fn campaign(&self, rec: &ManagerRecord, lease: LeaseId) -> Result<bool, MetaError> {
        let k = key("manager");
        let r = self
            .store
            .txn(
                Txn::when(vec![Compare::absent(k.clone())]).then(vec![Op::put_leased(
                    k,
                    encode(rec),
                    lease,
                )]),
            )
            .await?;
        Ok(r.succeeded)
    }

    /// Who holds the manager role, and the revision of its record.
    pub async fn manager(&self) -> Result<Option<(ManagerRecord, KeyValue)>, MetaError> {
        self.get(&key("manager")).await
    }

    /// Takes the manager role from whoever holds it (an operator's act: its node may no longer
    /// hold it). The holder sees its key gone and gives the role up; the others campaign.
    pub async fn depose_manager(&self) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(key("manager"))]).await?;
        Ok(())
    }

    /// The manager key (for watches).
    pub fn manager_key() -> String {
        key("manager")
    }

    /// The lease the running daemon of node `id` registered under, if one runs.
    pub async fn alive_lease(&self, id: u32) -> Result<Option<LeaseId>, MetaError> {
        Ok(self
            .store
            .get(&key(&format!("alive/{id}")))
            .await?
            .map(|kv| kv.lease))
    }

    /// Gives the manager role up: deletes the `manager` key if `lease` still holds it.
    pub async fn resign(&self, lease: LeaseId) -> Result<(), MetaError> {
        let k = key("manager");
        self.store
            .txn(Txn::when(vec![Compare::lease(k.clone(), lease)]).then(vec![Op::delete(k)]))
            .await?;
        Ok(())
    }

    /// The manager's persisted jobs (`jobs/<node>`), for its successor.
    pub async fn jobs<T: DeserializeOwned>(&self) -> Result<Vec<T>, MetaError> {
        self.list("jobs/").await
    }

    /// Forgets the job of `node` (a finished drain the node was taken back from).
    pub async fn delete_job(&self, node: u32) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(key(&format!("jobs/{node}")))])
            .await?
            .ok_or_else(|| MetaError::Refused("job record: conflicting write".into()))?;
        Ok(())
    }

    pub async fn put_job<T: Serialize>(&self, node: u32, job: &T) -> Result<(), MetaError> {
        self.write(
            vec![],
            vec![Op::put(key(&format!("jobs/{node}")), encode(job))],
        )
        .await?
        .ok_or_else(|| MetaError::Refused("job record: conflicting write".into()))?;
        Ok(())
    }

    /// Puts a certificate on the deny list (kept for good: an entry costs a few bytes).
    pub async fn revoke(&self, rec: &RevokedCert) -> Result<(), MetaError> {
        if rec.fingerprint.len() != 64 || !rec.fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(MetaError::Refused(format!(
                "{:?} is not a SHA-256 fingerprint (64 hex digits)",
                rec.fingerprint
            )));
        }
        let k = key(&format!("revoked/{}", rec.fingerprint.to_ascii_lowercase()));
        self.write(vec![], vec![Op::put(k, encode(rec))])
            .await?
            .ok_or_else(|| MetaError::Refused("revocation: conflicting write".into()))?;
        Ok(())
    }

    /// The deny list.
    pub async fn revoked(&self) -> Result<Vec<RevokedCert>, MetaError> {
        self.list("revoked/").await
    }

    /// Where the deny list lives (for watches).
    pub fn revoked_prefix() -> String {
        key("revoked/")
    }
}
