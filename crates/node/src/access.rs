//! Who may ask what of this node, decided on a request's header alone (before any payload is
//! read), from what the cluster's metadata says:
//!
//! * Pings and the UCX offer: any authenticated peer.
//! * Operators (`admin`) and trusted links (a same-host socket of this user, or a cluster run
//!   `--insecure`): everything.
//! * A node certificate: everything, while that node is a member of the cluster (a
//!   certificate of a node that was removed, or never joined, gets nothing).
//! * A client certificate: requests on a volume whose access list names it (or `*`), and only
//!   while it is that volume's writer — the identity its attach record names. A client never
//!   creates, deletes or places replicas, nor sets its volume's reserve or weight on the node. So a listed client that is not the writer can
//!   neither take a replica over at the current epoch nor write, read or query it directly.
//! * Whoever asks: an attach may not move a replica's epoch past the newest the metadata has
//!   handed out (once this node knows it), so no epoch leap can fence a volume for good.
//!
//! A volume this node knows nothing of yet (its metadata not read since the start) is out of
//! clients' reach; nodes and operators are not held up by it.

use std::collections::{HashMap, HashSet};

use trireme_proto::{Header, Op, Status};
use trireme_transport::Peer;

use crate::{Node, Refusal};

/// What the metadata says of a volume, as far as this node's access rules need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumePolicy {
    /// Client names that may use the volume (`*`: every client of the cluster).
    pub access: Vec<String>,
    /// The newest epoch the metadata handed out: no attach goes past it.
    pub epoch: u64,
    /// The identity of its writer at that epoch, as its attach record names it (a role's
    /// display: `client NAME`, `admin`, `node N`); `None` while nobody is attached.
    pub writer: Option<String>,
}

/// Refusals are logged at most once a second (a peer refused a million times writes one line
/// a second to the log, on the replicas' file system).
static REFUSED: trireme_net::Throttles = trireme_net::Throttles::per_second();

impl Node {
    /// Sets what the metadata says of each volume (by id), replacing what was known.
    pub fn set_policies(&self, policies: HashMap<u64, VolumePolicy>) {
        *self.policies.write().unwrap_or_else(|e| e.into_inner()) = Some(policies);
    }

    /// Sets which client identities may use each volume (by id), with no writer or epoch
    /// known: such a volume is open to no client's volume requests (see the module docs).
    pub fn set_access(&self, access: HashMap<u64, Vec<String>>) {
        self.set_policies(
            access
                .into_iter()
                .map(|(id, access)| {
                    (
                        id,
                        VolumePolicy {
                            access,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        )
    }

    /// Sets the cluster's members (node ids): a node certificate of any other id gets nothing.
    /// `None`: not known (a node of `trireme up`), every node certificate of the CA counts.
    pub fn set_members(&self, members: Option<HashSet<u32>>) {
        *self.members.write().unwrap_or_else(|e| e.into_inner()) = members;
    }

    /// Refuses a request its sender may not make (see the module docs), on its header.
    pub(crate) fn authorize(&self, h: &Header, peer: &Peer) -> Result<(), Refusal> {
        let r = self.rule(h, peer);
        if let Err(Refusal(_, msg)) = &r {
            trireme_net::warn_throttled_by!(REFUSED, msg, node = self.id, "refused: {msg}");
        }
        r
    }

    fn rule(&self, h: &Header, peer: &Peer) -> Result<(), Refusal> {
        // The data path's common case, decided without a lock: a trusted link or an
        // operator, on anything but an attach (whose epoch is checked below).
        let trusted = match peer {
            Peer::Trusted => true,
            Peer::Cert(r) => **r == trireme_tls::Role::Admin,
        };
        if trusted && h.op != Op::Attach {
            return Ok(());
        }
        let policies = self.policies.read().unwrap_or_else(|e| e.into_inner());
        let policy = policies.as_ref().and_then(|p| p.get(&h.volume));
        let denied = |why: String| {
            let who = match peer {
                Peer::Trusted => "a trusted link".to_string(),
                Peer::Cert(r) => r.to_string(),
            };
            Err(Refusal(
                Status::Denied,
                format!("{who} may not {:?} volume {}: {why}", h.op, h.volume),
            ))
        };
        // An attach never goes past the newest epoch of the metadata. Refused as Denied:
        // a writer that just took its epoch tries again while this node catches up.
        if h.op == Op::Attach {
            if let Some(p) = policy.filter(|p| h.epoch > p.epoch) {
                return denied(format!(
                    "epoch {} is past the newest the metadata handed out ({})",
                    h.epoch, p.epoch
                ));
            }
        }
        let role = match peer {
            Peer::Trusted => return Ok(()),
            Peer::Cert(r) => &**r,
        };
        // What any authenticated peer may send: a ping, the UCX offer, the node's room, and
        // the hello that names its link (no request of its own).
        if matches!(h.op, Op::Ping | Op::UcxAddress | Op::Hello | Op::Space) {
            return Ok(());
        }
        match role {
            trireme_tls::Role::Admin => Ok(()),
            trireme_tls::Role::Node(n) => {
                let members = self.members.read().unwrap_or_else(|e| e.into_inner());
                match &*members {
                    Some(m) if !m.contains(n) => {
                        denied(format!("node {n} is not a member of the cluster"))
                    }
                    _ => Ok(()),
                }
            }
            trireme_tls::Role::Server => {
                denied("a server certificate (an NBD export's) is no node's nor client's".into())
            }
            trireme_tls::Role::Client(_)
                if matches!(
                    h.op,
                    Op::CreateReplica
                        | Op::CreateClone
                        | Op::Flatten
                        | Op::DeleteReplica
                        | Op::TierSet
                        | Op::SnapshotDelete
                        | Op::SnapshotHolders
                ) =>
            {
                denied(
                    "only nodes and operators create, clone, flatten, delete or place replicas or delete snapshots"
                        .into(),
                )
            }
            trireme_tls::Role::Client(_) if h.op == Op::Qos => {
                denied("a client does not set its volume's claim on the node (its record does)".into())
            }
            trireme_tls::Role::Client(name) => {
                let Some(p) = policy else {
                    return denied("not on the volume's access list (none known yet)".into());
                };
                if !p.access.iter().any(|c| c == "*" || c == name) {
                    return denied("not on the volume's access list".into());
                }
                // Reading a snapshot is not writing the volume: no attach record needed.
                if matches!(
                    h.op,
                    Op::SnapshotList
                        | Op::SnapshotRead
                        | Op::SnapshotStatus
                        | Op::SnapshotChanged
                        | Op::SnapshotHold
                ) {
                    return Ok(());
                }
                let me = role.to_string();
                match &p.writer {
                    Some(w) if *w == me => Ok(()),
                    Some(w) => denied(format!(
                        "the volume's writer is {w} (its attach record), not this client"
                    )),
                    None => denied("nobody is attached to the volume".into()),
                }
            }
        }
    }
}
