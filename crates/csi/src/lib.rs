//! trireme's CSI driver: the identity, controller and node services of the Container Storage
//! Interface (spec 1.12) over gRPC, on a unix socket as a CO's sidecars expect.
//!
//! - The **controller** (`controller.rs`, `snapshots.rs`) is a client of the cluster's
//!   manager: every call becomes a control request, its refusals mapped to the spec's codes
//!   from their stable codes (`errors.rs`), never from text.
//! - The **node** (`node.rs`) maps a volume as a kernel block device with `trireme map` (a
//!   child process per volume), makes and mounts its filesystem, and bind-mounts it where
//!   the CO asks.
//! - Names: a CSI name that is a valid trireme name is the volume's name; any other becomes
//!   `csi-` and a hash of it (`ids.rs`). A snapshot's id is `VOLUME@SNAPSHOT`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use trireme_control::{ControlClient, ControlError};

mod args;
mod busy;
mod controller;
mod errors;
mod identity;
pub mod ids;
mod node;
pub mod params;
mod snapmeta;
mod snapshots;

pub use controller::ControllerService;
pub use errors::status as control_status;
pub use identity::IdentityService;
pub use node::{NodeConfig, NodeService, TOPOLOGY_ZONE};
pub use snapmeta::{BlockRanges, SnapshotBlocks, SnapshotMetadataService};

/// The messages and services generated from `proto/csi.proto`.
#[allow(missing_debug_implementations, clippy::all, rust_2018_idioms)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}

/// The driver's name, as a CSIDriver object and StorageClasses name it.
pub const DRIVER_NAME: &str = "csi.trireme.io";

/// Opens a control connection to the cluster's manager (through `up`'s socket, or the manager
/// found on etcd): the CLI builds it from its global options.
pub type Connect = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<ControlClient, ControlError>> + Send>>
        + Send
        + Sync,
>;

/// Run after the controller made a volume whose access list names clients: a cluster on etcd
/// gives each client named its etcd user and role then (`etcd rbac`, as the CLI does after an
/// access-list change), or its node service could not read the volume it is to stage.
pub type AccessChanged = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Errors of the driver's process (a call's errors are gRPC statuses).
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("bad --endpoint {0:?}: give unix:///PATH or tcp://HOST:PORT")]
    Endpoint(String),
    #[error("listening on {endpoint}: {source}")]
    Listen {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("{0} exists and is not a socket: give --endpoint a path of its own")]
    NotASocket(PathBuf),
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Where the driver listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// For tests that reach a node service inside a VM: no authentication, so only where
    /// nothing else can connect.
    Tcp(std::net::SocketAddr),
}

impl std::str::FromStr for Endpoint {
    type Err = CsiError;
    fn from_str(s: &str) -> Result<Endpoint, CsiError> {
        let bad = || CsiError::Endpoint(s.to_string());
        if let Some(p) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            let p = PathBuf::from(p);
            return match p.is_absolute() {
                true => Ok(Endpoint::Unix(p)),
                false => Err(bad()),
            };
        }
        if let Some(a) = s.strip_prefix("tcp://") {
            return a.parse().map(Endpoint::Tcp).map_err(|_| bad());
        }
        Err(bad())
    }
}

/// Removes what is at `path` if it is a socket (a driver that died left it); anything else
/// there is refused, never removed: an endpoint mistyped onto a file must not delete it.
fn clear_stale_socket(path: &std::path::Path) -> Result<(), CsiError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| CsiError::Listen {
                endpoint: path.display().to_string(),
                source,
            })
        }
        Ok(_) => Err(CsiError::NotASocket(path.to_path_buf())),
        Err(_) => Ok(()),
    }
}

/// Serves the services given until `stop` resolves. A stale socket at the endpoint (a driver
/// that died) is replaced; the socket is made 0600 before it is served.
pub async fn serve(
    endpoint: &Endpoint,
    controller: Option<(ControllerService, SnapshotMetadataService)>,
    node: Option<NodeService>,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), CsiError> {
    use pb::controller_server::ControllerServer;
    use pb::identity_server::IdentityServer;
    use pb::node_server::NodeServer;
    use pb::snapshot_metadata_server::SnapshotMetadataServer;
    let (controller, metadata) = controller.unzip();
    let identity = IdentityService::new(controller.clone());
    let router = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_optional_service(controller.map(ControllerServer::new))
        .add_optional_service(metadata.map(SnapshotMetadataServer::new))
        .add_optional_service(node.map(NodeServer::new));
    let listen_err = |source| CsiError::Listen {
        endpoint: format!("{endpoint:?}"),
        source,
    };
    match endpoint {
        Endpoint::Unix(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(listen_err)?;
            }
            clear_stale_socket(path)?;
            let l = tokio::net::UnixListener::bind(path).map_err(listen_err)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(listen_err)?;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(l);
            router.serve_with_incoming_shutdown(incoming, stop).await?;
            let _ = std::fs::remove_file(path);
        }
        Endpoint::Tcp(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(listen_err)?;
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
            router.serve_with_incoming_shutdown(incoming, stop).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_a_file_in_the_way_is_kept() {
        assert_eq!(
            "unix:///run/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/csi.sock".into())
        );
        assert!("unix://relative.sock".parse::<Endpoint>().is_err());
        assert!("tcp://127.0.0.1:10000".parse::<Endpoint>().is_ok());
        assert!("http://x".parse::<Endpoint>().is_err());
        let d = std::env::temp_dir().join(format!("trireme-csi-ep-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("precious");
        std::fs::write(&f, b"keep me").unwrap();
        assert!(matches!(
            clear_stale_socket(&f),
            Err(CsiError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
        let s = d.join("old.sock");
        drop(std::os::unix::net::UnixListener::bind(&s).unwrap());
        clear_stale_socket(&s).unwrap();
        assert!(!s.exists());
        clear_stale_socket(&d.join("none")).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
