//! `node lost`: an operator says a node is gone for good, and the volumes that wait for its
//! copies accept the others as they are.
//!
//! A writer that attaches does not take out an in-sync copy that does not answer when every
//! copy that did answer lost its history (a power loss): the silent one may hold the writes
//! they lost, so the attach waits for it (`WaitReason::LostHistory`). When that node never
//! comes back, only an operator can say so. Then each volume with a copy in sync there records
//! it failed (it is resynced whole if the node ever returns), in one transaction that also
//! finds no writer attached and bumps the epoch; the next attach takes the copies that
//! answer, reconciled among themselves. Whatever only the lost copy held is gone: that is
//! what the operator accepts.
//!
//! | refused, or left as it was | why |
//! |---|---|
//! | the node answers, or is registered | its copies are not lost: `node remove` moves them |
//! | a volume whose only copy in sync is there | nothing else holds its writes |
//! | a parity volume with fewer than K other copies in sync | its stripes cannot be read |
//! | a volume a writer holds | a running writer takes the copy out itself |

use trireme_meta::{MetaError, NodeState, VolumeRecord};
use trireme_proto::{Header, Op};
use trireme_replication::{Layout, ReplicaState};

use super::{Manager, Result};

/// How many times (a second apart) a volume a writer holds is tried.
const ATTACHED_TRIES: u32 = 5;
use crate::api::{LostVolume, NodeLostReport};
use crate::error::refused;

impl Manager {
    /// Records node `node`'s in-sync copies failed, accepting each volume's other copies as
    /// they are (`force`); without it, says what it would do and changes nothing.
    pub(crate) async fn node_lost(&self, node: u32, force: bool) -> Result<NodeLostReport> {
        let rec = self.node(node).await?;
        if rec.state == NodeState::Removed {
            return Err(refused(format!("node {node} was removed from the cluster")));
        }
        if self
            .node_call(&rec, Header::request(Op::Ping, 0))
            .await
            .is_ok()
        {
            return Err(refused(format!(
                "node {node} is up: its copies are not lost (`trireme node remove {node}` moves them off it)"
            )));
        }
        if self.meta.alive().await?.contains_key(&node) {
            return Err(refused(format!(
                "node {node} is still registered (its lease has not lapsed since it stopped answering): run this again once `trireme status` shows it down"
            )));
        }
        let mut report = NodeLostReport {
            node,
            applied: force,
            accepted: Vec::new(),
            left: Vec::new(),
        };
        let held = self.meta.volumes().await?.into_iter().filter(|v| {
            v.replicas
                .iter()
                .any(|r| r.node == node && r.state == ReplicaState::InSync)
        });
        for v in held {
            let name = v.name.clone();
            let outcome = match force {
                true => self.accept_without(&name, node).await,
                false => self.lost_verdict(&v, node).await,
            };
            match outcome {
                Ok(why) => report.accepted.push(LostVolume { volume: name, why }),
                Err(why) => report.left.push(LostVolume { volume: name, why }),
            }
        }
        if force && !report.accepted.is_empty() {
            let names: Vec<&str> = report.accepted.iter().map(|a| a.volume.as_str()).collect();
            self.event(
                "volume",
                format!(
                    "node {node} declared lost: {} accept their other copies as they are",
                    names.join(", ")
                ),
            )
            .await;
        }
        Ok(report)
    }

    /// Whether `v` can do without its copy on `node`: what accepting does (`Ok`), or why it
    /// is left as it was.
    async fn lost_verdict(
        &self,
        v: &VolumeRecord,
        node: u32,
    ) -> std::result::Result<String, String> {
        if let Ok(Some((a, _))) = self.meta.attachment(&v.name).await {
            return Err(attached(&a.host, a.pid, a.epoch));
        }
        without(v, node)
    }

    /// Records `node`'s copy of `name` failed if [`without`] allows it, while no writer holds
    /// the volume. An attach that holds it a moment (one that waits for the copy fails and
    /// lets go: the manager's own, re-creating the copy elsewhere, tries again and again) is
    /// waited out for a few seconds.
    async fn accept_without(&self, name: &str, node: u32) -> std::result::Result<String, String> {
        let mut said = String::new();
        let mut tries = 0;
        let r = loop {
            let r = self
                .meta
                .update_unattached(name, &mut |v| {
                    said = without(v, node).map_err(MetaError::Refused)?;
                    for r in v.replicas.iter_mut().filter(|r| r.node == node) {
                        r.state = ReplicaState::Failed;
                        r.incarnation = 0;
                    }
                    Ok(())
                })
                .await;
            tries += 1;
            match r {
                Err(MetaError::Attached { .. }) if tries < ATTACHED_TRIES => {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                r => break r,
            }
        };
        match r {
            Ok(_) => {
                tracing::warn!(volume = name, node, "node declared lost: {said}");
                Ok(said)
            }
            Err(MetaError::Refused(why)) => Err(why),
            Err(MetaError::Attached {
                host, pid, epoch, ..
            }) => Err(attached(&host, pid, epoch)),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What recording `node`'s copy of `v` failed leaves, or why it must not be.
fn without(v: &VolumeRecord, node: u32) -> std::result::Result<String, String> {
    let others: Vec<u32> = v
        .replicas
        .iter()
        .filter(|r| r.node != node && r.state == ReplicaState::InSync)
        .map(|r| r.node)
        .collect();
    if others.is_empty() {
        return Err(format!(
            "node {node} holds its only copy in sync: nothing else holds its writes (bring the node back, or restore a backup)"
        ));
    }
    if let Layout::Parity(p) = v.layout {
        if others.len() < usize::from(p.data) {
            return Err(format!(
                "its stripes are read from {} copies in sync; only {} others are (nodes {others:?})",
                p.data,
                others.len()
            ));
        }
    }
    Ok(format!(
        "its copies in sync on nodes {others:?} are accepted as they are; node {node}'s is recorded failed (resynced whole if it comes back)"
    ))
}

fn attached(host: &str, pid: u32, epoch: u64) -> String {
    format!(
        "a writer holds it (pid {pid} on {host}, epoch {epoch}): it takes the copy out itself; if it waits for the copy, stop it and run this again"
    )
}

#[cfg(test)]
mod tests {
    use trireme_replication::Parity;

    use super::*;

    fn volume(states: &[(u32, &str)], layout: Layout) -> VolumeRecord {
        let mut v: VolumeRecord = serde_json::from_value(serde_json::json!({
            "name": "v", "id": 1, "size": 1 << 30, "epoch": 1,
            "replicas": states.iter().map(|(n, s)| serde_json::json!({"node": n, "state": s})).collect::<Vec<_>>(),
        }))
        .unwrap();
        v.layout = layout;
        v
    }

    /// A mirror is accepted with one other copy in sync; its only copy, never; a parity
    /// volume needs K others in sync (its stripes are read from K).
    #[test]
    fn a_lost_copy_is_given_up_only_where_the_others_can_serve() {
        let two = volume(&[(1, "in-sync"), (2, "in-sync")], Layout::Mirror);
        assert!(without(&two, 2).unwrap().contains("nodes [1] are accepted"));
        let only = volume(&[(1, "outdated"), (2, "in-sync")], Layout::Mirror);
        assert!(without(&only, 2)
            .unwrap_err()
            .contains("its only copy in sync"));
        let p = Layout::Parity(Parity::new(2, 1, 20).unwrap());
        let short = volume(&[(1, "in-sync"), (2, "in-sync"), (3, "failed")], p);
        let e = without(&short, 2).unwrap_err();
        assert!(e.contains("read from 2 copies in sync; only 1"), "{e}");
        let whole = volume(&[(1, "in-sync"), (2, "in-sync"), (3, "in-sync")], p);
        assert!(without(&whole, 2).is_ok());
    }
}
