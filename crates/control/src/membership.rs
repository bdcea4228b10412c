//! The writer's view of the control plane, over the control socket.

use std::path::PathBuf;

use trireme_client::{AttachInfo, BoxFut, Membership, MembershipError};
use trireme_replication::ReplicaState;

use crate::{ControlClient, ControlError, Request};

/// Records replica states and locates replicas through `<data-dir>/control.sock`. Each call
/// opens its own connection: calls are rare (a failure, a resync) and must not queue behind
/// one another.
#[derive(Debug, Clone)]
pub struct ControlMembership {
    pub path: PathBuf,
}

impl ControlMembership {
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        req: Request,
    ) -> Result<T, MembershipError> {
        let mut c = ControlClient::connect(&self.path)
            .await
            .map_err(|e| MembershipError::Unreachable(e.to_string()))?;
        c.call(&req).await.map_err(|e| match e {
            // The manager answered: it refused.
            ControlError::Remote(m) | ControlError::Failed(m) => {
                MembershipError::Refused(m.message)
            }
            ControlError::NotOnRecord { node, .. } => MembershipError::NotOnRecord(node),
            e => MembershipError::Unreachable(e.to_string()),
        })
    }

    /// Tells the manager what the writer of `name` at `epoch` did so far: the 8 KiB units of
    /// its requests and the seconds they waited for its limits (an aggregated QoS policy
    /// shares out by them), and a parity volume's overlay. A writer beside `up` writes no
    /// report of its own.
    pub async fn report_usage(
        &self,
        name: &str,
        epoch: u64,
        usage: WriterUsage,
    ) -> Result<(), MembershipError> {
        self.call::<serde_json::Value>(Request::WriterUsage {
            name: name.to_string(),
            epoch,
            units: usage.units,
            throttled_seconds: usage.throttled_seconds,
            overlay_blocks: usage.overlay_blocks,
        })
        .await
        .map(|_| ())
    }
}

/// What a writer attached through `up`'s control socket tells the manager each second.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriterUsage {
    /// 8 KiB units of its requests so far.
    pub units: u64,
    /// Seconds its requests waited for the volume's limits, so far.
    pub throttled_seconds: f64,
    /// A parity volume's overlay, in blocks.
    pub overlay_blocks: Option<u64>,
}

impl Membership for ControlMembership {
    fn set_state<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        node: u32,
        state: ReplicaState,
        incarnation: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            self.call::<serde_json::Value>(Request::SetReplicaState {
                name: volume.to_string(),
                epoch,
                node,
                state,
                incarnation,
            })
            .await
            .map(|_| ())
        })
    }

    fn locate<'a>(&'a self, volume: &'a str) -> BoxFut<'a, Result<AttachInfo, MembershipError>> {
        Box::pin(self.call(Request::Locate {
            name: volume.to_string(),
        }))
    }

    fn detach<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            self.call::<serde_json::Value>(Request::Detach {
                name: volume.to_string(),
                epoch,
            })
            .await
            .map(|_| ())
        })
    }

    fn record_size<'a>(
        &'a self,
        volume: &'a str,
        epoch: u64,
        size: u64,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            self.call::<serde_json::Value>(Request::SetVolumeSize {
                name: volume.to_string(),
                epoch,
                size,
            })
            .await
            .map(|_| ())
        })
    }

    fn record_region<'a>(
        &'a self,
        volume: &'a str,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    ) -> BoxFut<'a, Result<(), MembershipError>> {
        Box::pin(async move {
            self.call::<serde_json::Value>(Request::SetRegion {
                name: volume.to_string(),
                id,
                epoch,
                region,
                to,
            })
            .await
            .map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Reply;
    use crate::error::ManagerError;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use trireme_meta::MetaError;
    use trireme_replication::TransitionError;

    /// Serves one control connection on `path`: reads a request line, answers `reply`.
    async fn answer_once(listener: tokio::net::UnixListener, reply: Reply) {
        let (s, _) = listener.accept().await.unwrap();
        let mut s = BufReader::new(s);
        let mut line = String::new();
        s.read_line(&mut line).await.unwrap();
        let mut out = serde_json::to_vec(&reply).unwrap();
        out.push(b'\n');
        s.get_mut().write_all(&out).await.unwrap();
    }

    /// A writer on the control socket tells "no replica on record" from other refusals by
    /// type, as one on etcd does: it then leaves that copy out instead of failing.
    #[tokio::test]
    async fn a_replica_not_on_record_reaches_the_writer_as_its_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let m = ControlMembership { path: path.clone() };
        let refusals = [
            ManagerError::Meta(MetaError::Transition(TransitionError::NoSuchReplica(3))),
            ManagerError::Meta(MetaError::Transition(TransitionError::LastInSync(3))),
        ];
        let mut got = Vec::new();
        for e in refusals {
            let listener = tokio::net::UnixListener::bind(&path).unwrap();
            let server = tokio::spawn(answer_once(listener, crate::manager::error_reply(e)));
            got.push(m.set_state("v", 1, 3, ReplicaState::Outdated, 0).await);
            server.await.unwrap();
            std::fs::remove_file(&path).unwrap();
        }
        assert!(
            matches!(got[0], Err(MembershipError::NotOnRecord(3))),
            "{:?}",
            got[0]
        );
        assert!(
            matches!(&got[1], Err(MembershipError::Refused(m)) if m.contains("last in-sync")),
            "{:?}",
            got[1]
        );
    }
}
