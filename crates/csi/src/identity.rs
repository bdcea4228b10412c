//! The identity service: the driver's name and version, what it serves, and whether it is
//! ready (for a controller: whether the cluster's manager answers).

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use crate::pb::plugin_capability::{service, volume_expansion, Service, Type, VolumeExpansion};
use crate::pb::{self, identity_server::Identity, PluginCapability};
use crate::ControllerService;

#[derive(Debug, Clone)]
pub struct IdentityService {
    controller: Option<ControllerService>,
}

impl IdentityService {
    pub fn new(controller: Option<ControllerService>) -> IdentityService {
        IdentityService { controller }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: crate::DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = vec![PluginCapability {
            // Offline: the volume grows online, but a kernel NBD device cannot take a new
            // size while mapped; the node's filesystem grows at the next stage.
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Offline as i32,
            })),
        }];
        if self.controller.is_some() {
            // The controller's process serves changed-block tracking too.
            for t in [
                service::Type::ControllerService,
                service::Type::SnapshotMetadataService,
            ] {
                capabilities.push(PluginCapability {
                    r#type: Some(Type::Service(Service { r#type: t as i32 })),
                });
            }
        }
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        if let Some(c) = &self.controller {
            c.reachable().await?;
        }
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}
