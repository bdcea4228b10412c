//! The manager's requests to writers (moves, take-outs) and to daemons (restarts).

use super::*;
use crate::kv::{Compare, Op};
use crate::MetaError;

impl ClusterMeta {
    /// The move request for `name`'s writer, if any, and its revision.
    pub async fn move_request(&self, name: &str) -> Result<Option<(MoveRequest, i64)>, MetaError> {
        Ok(self
            .get::<MoveRequest>(&Self::move_request_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    /// The key of `name`'s move request (for watches).
    pub fn move_request_key(name: &str) -> String {
        key(&format!("moves/{name}"))
    }

    /// Puts a move request for `name`: a new one (`rev` 0: only if there is none) or an update
    /// of the one at revision `rev`. Its new revision, or `None`: it changed meanwhile (or is
    /// gone).
    pub async fn put_move_request(
        &self,
        name: &str,
        req: &MoveRequest,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::move_request_key(name), encode(req), rev)
            .await
    }

    /// Puts `value` at `k` if the key's mod revision is still `rev` (0: the key is absent).
    /// Its new revision, or `None` when it changed meanwhile.
    pub(crate) async fn put_at_revision(
        &self,
        k: String,
        value: Vec<u8>,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        Ok(self
            .write(
                vec![Compare::mod_revision(k.clone(), rev)],
                vec![Op::put(k, value)],
            )
            .await?
            .map(|r| r.revision))
    }

    pub async fn delete_move_request(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::move_request_key(name))])
            .await?;
        Ok(())
    }

    /// The key of `name`'s take-out request (for watches).
    pub fn takeout_key(name: &str) -> String {
        key(&format!("takeouts/{name}"))
    }

    /// Puts a take-out request for `name`: a new one (`rev` 0: only if there is none) or an
    /// update of the one at revision `rev`. Its new revision, or `None`: it changed meanwhile.
    pub async fn put_takeout(
        &self,
        name: &str,
        req: &TakeOutRequest,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::takeout_key(name), encode(req), rev)
            .await
    }

    pub async fn takeout(&self, name: &str) -> Result<Option<(TakeOutRequest, i64)>, MetaError> {
        Ok(self
            .get::<TakeOutRequest>(&Self::takeout_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    pub async fn delete_takeout(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::takeout_key(name))])
            .await?;
        Ok(())
    }

    /// The key of `name`'s scrub request (for watches).
    pub fn resize_key(name: &str) -> String {
        key(&format!("resizes/{name}"))
    }

    /// Puts a resize request for `name` (as [`Self::put_scrub`]).
    pub async fn put_resize(
        &self,
        name: &str,
        req: &ResizeRequest,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::resize_key(name), encode(req), rev)
            .await
    }

    pub async fn resize_request(
        &self,
        name: &str,
    ) -> Result<Option<(ResizeRequest, i64)>, MetaError> {
        Ok(self
            .get::<ResizeRequest>(&Self::resize_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    pub async fn delete_resize(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::resize_key(name))])
            .await?;
        Ok(())
    }

    pub fn scrub_key(name: &str) -> String {
        key(&format!("scrubs/{name}"))
    }

    /// Puts a scrub request for `name`: a new one (`rev` 0: only if there is none) or an
    /// update of the one at revision `rev`. Its new revision, or `None`: it changed meanwhile.
    pub async fn put_scrub(
        &self,
        name: &str,
        req: &ScrubRequest,
        rev: i64,
    ) -> Result<Option<i64>, MetaError> {
        self.put_at_revision(Self::scrub_key(name), encode(req), rev)
            .await
    }

    pub async fn scrub_request(
        &self,
        name: &str,
    ) -> Result<Option<(ScrubRequest, i64)>, MetaError> {
        Ok(self
            .get::<ScrubRequest>(&Self::scrub_key(name))
            .await?
            .map(|(r, kv)| (r, kv.mod_revision)))
    }

    pub async fn delete_scrub(&self, name: &str) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::scrub_key(name))])
            .await?;
        Ok(())
    }

    fn scrubbed_key(name: &str) -> String {
        key(&format!("scrubbed/{name}"))
    }

    /// Volume `id`'s scrub record, if it has one (under its name `name`).
    pub async fn scrub_record(
        &self,
        name: &str,
        id: u64,
    ) -> Result<Option<ScrubRecord>, MetaError> {
        Ok(self
            .get::<ScrubRecord>(&Self::scrubbed_key(name))
            .await?
            .map(|(r, _)| r)
            .filter(|r| r.volume_id == id))
    }

    /// Every scrub record, by volume name, in one read (a record that does not decode is
    /// left out, with a warning). Match each to its volume by id.
    pub async fn scrub_records(
        &self,
    ) -> Result<std::collections::HashMap<String, ScrubRecord>, MetaError> {
        let prefix = key("scrubbed/");
        let mut out = std::collections::HashMap::new();
        for kv in self.store().range(&prefix).await?.0 {
            let Some(name) = kv.key.strip_prefix(&prefix) else {
                continue;
            };
            match decode::<ScrubRecord>(&kv) {
                Ok(r) => {
                    out.insert(name.to_string(), r);
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        Ok(out)
    }

    pub async fn put_scrub_record(&self, name: &str, r: &ScrubRecord) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::put(Self::scrubbed_key(name), encode(r))])
            .await?
            .ok_or_else(|| MetaError::Refused("scrub record: conflicting write".into()))?;
        Ok(())
    }

    /// The key of node `id`'s restart order (for watches).
    pub fn restart_key(id: u32) -> String {
        key(&format!("restarts/{id}"))
    }

    pub async fn put_restart_order(&self, order: &RestartOrder) -> Result<(), MetaError> {
        self.write(
            vec![],
            vec![Op::put(Self::restart_key(order.node), encode(order))],
        )
        .await?
        .ok_or_else(|| MetaError::Refused("restart order: conflicting write".into()))?;
        Ok(())
    }

    pub async fn restart_order(&self, id: u32) -> Result<Option<RestartOrder>, MetaError> {
        Ok(self.get(&Self::restart_key(id)).await?.map(|(r, _)| r))
    }

    pub async fn delete_restart_order(&self, id: u32) -> Result<(), MetaError> {
        self.write(vec![], vec![Op::delete(Self::restart_key(id))])
            .await?;
        Ok(())
    }
}
