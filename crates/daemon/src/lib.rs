//! The roles a trireme process plays in a cluster of several servers, each in its own module:
//!
//! * [`node`] — the storage daemon of one server (`trireme node run`): serves its store over
//!   TCP/UCX, registers itself in the cluster metadata under a lease (one daemon per node id),
//!   and keeps that lease while the data path runs on regardless of the metadata store.
//! * [`manager_role`] — every node daemon campaigns for the manager role (placement, replica
//!   re-creation, drain/remove jobs, health, the control API); exactly one holds it, through a
//!   lease-bound key, and every metadata write it makes compares that lease.
//! * [`attach`] — the writer of a volume on a client host (`trireme attach`): takes the next
//!   epoch in one metadata transaction, holds a lease-bound attach record, records replica
//!   states itself, and serves NBD locally through [`export`].
//!
//! * [`local`] — the supervisor of `trireme up`: a whole cluster on one host on the embedded
//!   store, its node processes restarted when they die, the manager and the NBD export in the
//!   supervisor's process.
//!
//! `cli` turns arguments into the configurations here.
//!
//! Liveness rule for every lease holder: a lease is refreshed every third of its TTL; a holder
//! that has not had a refresh confirmed within one TTL of *sending* it treats the lease as
//! lost (etcd's own deadline is later than that), so a manager steps down before another can
//! take over.

pub mod access;
pub mod attach;
pub mod export;
pub mod http;
pub mod kernel_loop;
pub mod kernel_nbd;
pub mod kernel_size;
pub mod kernel_ublk;
mod keys;
pub mod lease;
pub mod local;
pub mod manager_role;
pub mod node;
pub mod nvmf;
pub mod recorder;
pub mod scrubs;
pub mod writer_slot;

/// A failure of a role, and whether it is the user's input (exit 2) or the system (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Runtime(String),
    /// An attach reached none of the volume's in-sync copies (their nodes are down or cut
    /// off); it changed nothing, and may be tried again once one is back.
    #[error("{0}")]
    NoCopy(String),
    #[error(transparent)]
    Manager(#[from] trireme_control::ManagerError),
    #[error(transparent)]
    Meta(#[from] trireme_meta::MetaError),
}

impl DaemonError {
    /// True if the user's input or the cluster's state refused it (exit 2), not a failure.
    pub fn is_usage(&self) -> bool {
        use trireme_meta::MetaError;
        matches!(
            self,
            DaemonError::Usage(_)
                | DaemonError::Meta(
                    MetaError::NoVolume(_)
                        | MetaError::NoSnapshot { .. }
                        | MetaError::Refused(_)
                        | MetaError::Attached { .. }
                )
        )
    }
}

impl From<std::io::Error> for DaemonError {
    fn from(e: std::io::Error) -> Self {
        DaemonError::Runtime(e.to_string())
    }
}

pub use trireme_control::hostname;

/// Puts this process's TCP data-path links on mutual TLS with the identity in `dir`
/// (`<stem>-cert.pem`, `<stem>-key.pem`, `ca-cert.pem`): connections to nodes present it and
/// check the node against the CA; a node (`serve`) also accepts only peers of that CA.
static TLS_ROLE: std::sync::OnceLock<trireme_tls::Role> = std::sync::OnceLock::new();

/// The identity this process reaches nodes with, once [`use_tls`] set one.
pub fn tls_role() -> Option<&'static trireme_tls::Role> {
    TLS_ROLE.get()
}

/// The fingerprint of that identity's certificate (as it was loaded), for the deny list.
static TLS_FINGERPRINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn tls_fingerprint() -> Option<&'static str> {
    TLS_FINGERPRINT.get().map(String::as_str)
}

/// `stem` names the certificate (`node`); `None` picks a client process's (see
/// `Identity::load_client`).
pub fn use_tls(dir: &std::path::Path, stem: Option<&str>, serve: bool) -> Result<(), DaemonError> {
    let id = match stem {
        Some(stem) => trireme_tls::Identity::load(dir, stem),
        None => trireme_tls::Identity::load_client(dir),
    }
    .map_err(|e| DaemonError::Usage(format!("TLS identity: {e}")))?;
    let err = |e: trireme_tls::TlsError| DaemonError::Usage(format!("TLS identity: {e}"));
    let server = if serve {
        Some(id.server_config().map_err(err)?)
    } else {
        None
    };
    trireme_transport::tcp::set_tls(trireme_transport::tcp::TlsSetup {
        client: Some(id.client_config().map_err(err)?),
        server,
    });
    tracing::debug!(role = %id.role, "data-path links use mutual TLS");
    let _ = TLS_ROLE.set(id.role.clone());
    let _ = TLS_FINGERPRINT.set(id.fingerprint());
    Ok(())
}
