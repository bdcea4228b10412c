//! Who may ask what of this node: the access lists of its volumes, and the rule that applies
//! them to every request, on its header alone (before any payload is read).

use std::collections::HashMap;

use trireme_proto::{Op, Status};
use trireme_transport::{Frame, Peer};

use crate::{Node, Refusal};

impl Node {
    /// Sets which client identities may use each volume (by id), replacing what was known.
    pub fn set_access(&self, access: HashMap<u64, Vec<String>>) {
        *self.access.write().unwrap_or_else(|e| e.into_inner()) = Some(access);
    }

    /// Refuses a request its sender's identity may not make: clients only reach volumes whose
    /// access list names them (or `*`), and never create or delete replicas. Nodes, operators
    /// and trusted links may do everything.
    pub(crate) fn authorize(&self, req: &Frame) -> Result<(), Refusal> {
        let role = match &req.peer {
            Peer::Trusted => return Ok(()),
            Peer::Cert(r) if r.is_cluster() => return Ok(()),
            Peer::Cert(r) => r,
        };
        let h = &req.header;
        if matches!(h.op, Op::Ping | Op::UcxAddress) {
            return Ok(());
        }
        let allowed = match &**role {
            trireme_tls::Role::Client(name)
                if !matches!(h.op, Op::CreateReplica | Op::DeleteReplica | Op::TierSet) =>
            {
                let access = self.access.read().unwrap_or_else(|e| e.into_inner());
                access
                    .as_ref()
                    .and_then(|a| a.get(&h.volume))
                    .is_some_and(|l| l.iter().any(|c| c == "*" || c == name))
            }
            _ => false,
        };
        if allowed {
            return Ok(());
        }
        let msg = format!(
            "{role} may not {:?} volume {}: {}",
            h.op,
            h.volume,
            if matches!(h.op, Op::CreateReplica | Op::DeleteReplica | Op::TierSet) {
                "only nodes and operators create, delete or place replicas"
            } else {
                "not on the volume's access list"
            }
        );
        tracing::warn!(node = self.id, "refused: {msg}");
        Err(Refusal(Status::Denied, msg))
    }
}
