//! What a node can serve, and the reserves held against it (`node set --iops-capacity`): a
//! reserve the nodes cannot keep is said when it is set, and in `status` while it lasts.

use trireme_meta::{NodeRecord, NodeState};

use super::{Manager, Result};
use crate::api::{Rate, Warned};
use crate::error::refused;
use crate::reserves;

impl Manager {
    /// Declares (or, `none`, forgets) node `id`'s IOPS capacity; warns if the reserves of its
    /// volumes pass it.
    pub(crate) async fn node_set(
        &self,
        id: u32,
        iops_capacity: Option<Rate>,
    ) -> Result<Warned<NodeRecord>> {
        let Some(cap) = iops_capacity else {
            return Err(refused(
                "node set: nothing to change (give --iops-capacity N or none)",
            ));
        };
        let mut rec = self.node(id).await?;
        if rec.state == NodeState::Removed {
            return Err(refused(format!("node {id} was removed from the cluster")));
        }
        rec.iops_capacity = match cap {
            Rate::Set(0) => return Err(refused("an IOPS capacity of 0: give a positive rate")),
            Rate::Set(n) => Some(n),
            Rate::Remove(_) => None,
        };
        self.meta.put_node(&rec).await?;
        let what = rec.iops_capacity.map_or("not declared".to_string(), |c| {
            reserves::grouped(c) + " IOPS"
        });
        tracing::info!(node = id, "IOPS capacity: {what}");
        self.event("node", format!("node {id}: IOPS capacity {what}"))
            .await;
        let vols = self.meta.volumes().await?;
        let warnings = reserves::node_reserves(std::slice::from_ref(&rec), &vols)
            .iter()
            .filter_map(|r| r.warning())
            .collect();
        Ok(Warned::new(rec, warnings))
    }

    /// What to tell whoever just gave volumes `names` a reserve (or a policy with one): the
    /// nodes of theirs that cannot keep the reserves they hold, and those never told what
    /// they can serve. Logged too: an API caller may not show them.
    pub(crate) async fn reserve_warnings(&self, names: &[&str]) -> Vec<String> {
        let (nodes, vols) = match (self.meta.nodes().await, self.meta.volumes().await) {
            (Ok(n), Ok(v)) => (n, v),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("reserves not checked: {e}");
                return vec![format!("reserves not checked: {e}")];
            }
        };
        let out = reserves::warnings_for(&reserves::node_reserves(&nodes, &vols), names);
        for w in &out {
            tracing::warn!("{w}");
        }
        out
    }
}
