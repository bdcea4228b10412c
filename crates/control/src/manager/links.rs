//! The manager's calls to nodes: over links it keeps per node address (dropped when a call
//! fails), a replica operation for a volume, and a new replica put on its volume's tier.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use trireme_meta::{NodeRecord, VolumeRecord};
use trireme_proto::{Header, Op, Status};
use trireme_transport::TransportKind;

use crate::error::{refused, ManagerError};

use super::{Link, Manager, Result, NODE_TIMEOUT};

impl Manager {
    pub(crate) async fn node_call(
        &self,
        node: &NodeRecord,
        h: Header,
    ) -> Result<trireme_transport::Frame> {
        self.node_call_within(node, h, NODE_TIMEOUT).await
    }

    pub(crate) async fn node_call_within(
        &self,
        node: &NodeRecord,
        h: Header,
        limit: Duration,
    ) -> Result<trireme_transport::Frame> {
        self.node_send_within(node, h, Bytes::new(), limit).await
    }

    /// [`Manager::node_call_within`] with a payload.
    pub(crate) async fn node_send_within(
        &self,
        node: &NodeRecord,
        h: Header,
        payload: Bytes,
        limit: Duration,
    ) -> Result<trireme_transport::Frame> {
        let fut = async {
            let cached = {
                let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
                links.get(&node.addr).filter(|c| !c.is_closed()).cloned()
            };
            let c = match cached {
                Some(c) => c,
                None => {
                    let dialer = self
                        .connector
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    let c = match dialer {
                        Some(d) => {
                            let target = trireme_client::ReplicaTarget {
                                node: node.id,
                                addr: node.addr.clone(),
                                local_addr: None,
                                state: trireme_replication::ReplicaState::InSync,
                                incarnation: 0,
                                follows: None,
                            };
                            d.connect(&target).await.map_err(|e| e.to_string())?
                        }
                        None => trireme_transport::connect(TransportKind::Tcp, &node.addr, 1)
                            .await
                            .map_err(|e| e.to_string())?,
                    };
                    self.links
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(node.addr.clone(), c.clone());
                    c
                }
            };
            let r = c.call(h, payload).await.map_err(|e| e.to_string());
            if r.is_err() {
                self.forget_link(&node.addr, &c);
            }
            r
        };
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| {
                // A node that does not answer may be frozen: the next call starts afresh.
                // (The lock is released before `forget_link` takes it again: a guard in an
                // `if let` scrutinee would live through the block, and deadlock.)
                let stale = self
                    .links
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&node.addr)
                    .cloned();
                if let Some(c) = stale {
                    self.forget_link(&node.addr, &c);
                }
                ManagerError::Node {
                    node: node.id,
                    what: format!("at {} did not answer in {limit:?}", node.addr),
                }
            })?
            .map_err(|what| ManagerError::Node {
                node: node.id,
                what,
            })
    }

    fn forget_link(&self, addr: &str, c: &Link) {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if links.get(addr).is_some_and(|k| Arc::ptr_eq(k, c)) {
            links.remove(addr);
        }
    }

    pub(crate) async fn node(&self, id: u32) -> Result<NodeRecord> {
        self.meta
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.id == id)
            .ok_or_else(|| refused(format!("node {id} is not registered")))
    }

    pub(crate) async fn replica_op(
        &self,
        node: &NodeRecord,
        op: Op,
        v: &VolumeRecord,
    ) -> Result<Status> {
        Ok(self.replica_call(node, op, v).await?.header.status)
    }

    /// [`Manager::replica_op`], with the node's whole answer (a refusal's message is its
    /// payload).
    pub(crate) async fn replica_call(
        &self,
        node: &NodeRecord,
        op: Op,
        v: &VolumeRecord,
    ) -> Result<trireme_transport::Frame> {
        let mut h = Header {
            volume: v.id,
            length: v.layout.replica_size(v.size),
            ..Header::request(op, 0)
        };
        // A thick volume's copies are thick wherever they are made (creation, moves, down-out).
        if op == Op::CreateReplica && v.preallocate {
            h.flags |= trireme_proto::FLAG_PREALLOCATE;
        }
        // A parity volume's copies keep which blocks they hold (`node/src/held.rs`).
        if op == Op::CreateReplica && !v.layout.is_mirror() {
            h.flags |= trireme_proto::FLAG_HELD;
        }
        self.node_call(node, h).await
    }

    /// Pins the volume's replica on `node` to the volume's tier. A volume left to heat on a
    /// node without tiers is nothing to do; a pin there is refused with the node's reason.
    pub(crate) async fn apply_tier(
        &self,
        node: &NodeRecord,
        v: &VolumeRecord,
    ) -> std::result::Result<(), String> {
        let h = Header {
            volume: v.id,
            offset: v.tier.code(),
            ..Header::request(Op::TierSet, 0)
        };
        match self.node_call(node, h).await {
            Ok(f) if f.header.status == Status::Ok => Ok(()),
            Ok(f) if f.header.status == Status::Unsupported && v.tier.is_auto() => Ok(()),
            Ok(f) => Err(format!(
                "node {}: {}: {}",
                node.id,
                f.header.status.as_str(),
                String::from_utf8_lossy(&f.payload)
            )),
            Err(e) => Err(format!("node {}: {e}", node.id)),
        }
    }

    /// A new replica of a pinned volume takes the pin; if its node cannot (a full fast tier,
    /// no tiers), the copy stays where heat puts it and the operator is told.
    pub(crate) async fn pin_new_replica(&self, node: &NodeRecord, v: &VolumeRecord) {
        if v.tier.is_auto() {
            return;
        }
        if let Err(why) = self.apply_tier(node, v).await {
            tracing::warn!(volume = %v.name, node = node.id, tier = v.tier.as_str(), "the new replica is not on its volume's tier: {why}");
        }
    }
}
