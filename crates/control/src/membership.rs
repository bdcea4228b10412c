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
            ControlError::Remote(m) => MembershipError::Refused(m),
            e => MembershipError::Unreachable(e.to_string()),
        })
    }
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
}
