//! Request and response types of the control API, and its client (what `status` reports: `api/status.rs`).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Longest request or response line.
pub const MAX_LINE: u64 = 1 << 20;

mod codes;
mod limits;
mod status;
pub use codes::{ErrorCode, Refusal};
pub use limits::{LimitsChange, NoLimit, Rate};
pub use status::*;

/// An answer with what the caller should know of it (reserves past what nodes can serve):
/// the answer's own fields, and `warnings` beside them when there are any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Warned<T> {
    #[serde(flatten)]
    pub value: T,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl<T> Warned<T> {
    pub fn new(value: T, warnings: Vec<String>) -> Warned<T> {
        Warned { value, warnings }
    }
}

/// A control request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    NodeList,
    VolumeCreate {
        name: String,
        size: u64,
        /// 0: the default, 3 or as many as there are nodes that take replicas if fewer.
        #[serde(default)]
        replicas: usize,
        /// Client identities that may use it (`*`: all); default: all.
        #[serde(default)]
        access: Option<Vec<String>>,
        /// Fewest in-sync copies writes go on with; default: one fewer than the replicas.
        #[serde(default)]
        min_copies: Option<u32>,
        /// The tier its extents live on (tiered nodes); default: by heat.
        #[serde(default)]
        tier: Option<trireme_meta::TierPolicy>,
        /// Thick: reserve every replica's whole size now; default thin.
        #[serde(default)]
        preallocate: bool,
        /// How its bytes are kept; default a mirror of `replicas` copies. A parity layout
        /// out of bounds is refused as the request is read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layout: Option<trireme_replication::Layout>,
        /// Its I/O limits; default none.
        #[serde(default, skip_serializing_if = "LimitsChange::is_empty")]
        limits: LimitsChange,
        /// The QoS policy it is under; default none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        qos_policy: Option<String>,
    },
    /// Changes a volume's settings: each one given.
    VolumeSet {
        name: String,
        /// Fewest in-sync copies writes go on with (1 to the number of replicas).
        #[serde(default)]
        min_copies: Option<u32>,
        /// The tier its extents live on.
        #[serde(default)]
        tier: Option<trireme_meta::TierPolicy>,
        /// Its I/O limits: each one given is set or removed; its writer keeps them within a
        /// second, attached or not.
        #[serde(default, skip_serializing_if = "LimitsChange::is_empty")]
        limits: LimitsChange,
        /// The QoS policy it goes under (`none`: off its policy).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        qos_policy: Option<String>,
    },
    /// What a writer attached through `up`'s control socket did so far (see
    /// `ControlMembership::report_usage`); kept in the manager's memory.
    WriterUsage {
        name: String,
        epoch: u64,
        units: u64,
        throttled_seconds: f64,
        /// A parity volume's overlay, in blocks (`status` shows it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        overlay_blocks: Option<u64>,
    },
    /// Creates a QoS policy: limits, a reserve and a weight for the volumes put under it,
    /// each whole (dedicated) or all of them together (`aggregated`).
    QosPolicyCreate {
        name: String,
        #[serde(default)]
        limits: LimitsChange,
        #[serde(default)]
        aggregated: bool,
    },
    /// Changes a QoS policy's limits; its volumes' writers keep them within a second.
    QosPolicySet {
        name: String,
        limits: LimitsChange,
    },
    /// Deletes a QoS policy no volume is under.
    QosPolicyDelete {
        name: String,
    },
    /// The QoS policies, with their volumes.
    QosPolicyList,
    /// Changes who may use a volume: `allow` added to its access list, `deny` taken off.
    VolumeAccess {
        name: String,
        #[serde(default)]
        allow: Vec<String>,
        #[serde(default)]
        deny: Vec<String>,
    },
    VolumeList,
    /// Fences the volume's writer if it runs where `at` says (on a host, or on any host but
    /// one) and drops its attach record: for a CSI controller moving a volume between hosts.
    /// Answers a [`crate::Fenced`]; nobody matching changes nothing.
    VolumeFence {
        name: String,
        #[serde(default)]
        at: crate::FenceWhere,
    },
    VolumeInfo {
        name: String,
    },
    /// Moves a volume to the trash. Refused while a writer holds it, unless `force` (which
    /// fences the writer first).
    VolumeDelete {
        name: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
        /// How long it stays in the trash, in seconds; default a day.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep_secs: Option<u64>,
    },
    /// The volumes in the trash.
    TrashList,
    /// Puts a trashed volume back (`name`: its name, for the newest deletion, or its id).
    TrashRestore {
        name: String,
    },
    /// Frees a trashed volume's replicas for good (`name` as for restore); without a name,
    /// every one whose time is up.
    TrashPurge {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// Puts a certificate on the cluster's deny list (operators only).
    CaRevoke {
        /// SHA-256 of the certificate, hex.
        fingerprint: String,
        /// The role it names, for the record.
        role: String,
    },
    /// The deny list.
    CaRevoked,
    /// Take a new epoch for a writer: fences every older writer of the volume. `writer`: who
    /// it is, for `status` (absent from a writer from before it).
    Attach {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        writer: Option<WriterHello>,
    },
    /// A writer on another host attaches through the manager (`daemon::attach` with a client
    /// certificate): its attach record goes under `lease`, a lease it keeps alive itself.
    /// The record's identity is the caller's certificate, whatever the request says. `force`
    /// fences the holder only if it has the caller's identity (its own process, dead or
    /// stuck); an operator fences anyone (`volume delete --force`).
    WriterAttach {
        name: String,
        record: trireme_meta::AttachRecord,
        lease: i64,
        #[serde(default)]
        force: bool,
    },
    /// The writer of `record.epoch` puts its attach record back under a new lease after
    /// losing the old one (see `ClusterMeta::reattach`).
    WriterReattach {
        name: String,
        record: trireme_meta::AttachRecord,
        lease: i64,
    },
    /// The writer of `epoch` drops its attach record (a clean stop).
    WriterRelease {
        name: String,
        epoch: u64,
    },
    /// The writer of `epoch` answers a request of the manager's (a move, a take-out, a scrub,
    /// a resize, a snapshot) read at revision `at`: only the fields a writer answers with
    /// are taken from it (see `WriterAnswer::merge`).
    WriterAnswer {
        name: String,
        epoch: u64,
        at: i64,
        answer: trireme_meta::WriterAnswer,
    },
    /// The writer of `epoch` reports how its volume is (replica states, links, I/O): written
    /// under its attach record's lease, at most [`trireme_meta::MAX_REPORT`] bytes and one
    /// each [`REPORT_EVERY`] per volume. A client writes nothing in etcd itself.
    WriterReport {
        name: String,
        epoch: u64,
        report: trireme_meta::WriterReport,
    },
    /// A server's NVMe/TCP export of a volume (`nvmf serve`): written under `lease`, the
    /// serving process's own, if its port id is free or already held under that lease. A
    /// client must be on the volume's access list; the record is bounded
    /// (`NvmfExportRecord::check`) and its identity is the caller's certificate. Answers the
    /// record of the process that holds the port id, if another does (nothing written).
    NvmfExport {
        record: trireme_meta::NvmfExportRecord,
        lease: i64,
    },
    /// Where a volume lives, without a new epoch (for verification).
    Locate {
        name: String,
    },
    /// The writer of `epoch` records a replica's state (taking it out, or back in after a
    /// resync). Refused for a stale epoch and for taking out the last in-sync replica.
    SetReplicaState {
        name: String,
        epoch: u64,
        node: u32,
        state: trireme_replication::ReplicaState,
        /// With `in-sync`: the replica's incarnation, recorded (0: keep what is recorded).
        #[serde(default)]
        incarnation: u64,
    },
    /// The writer of `epoch` resized the volume: its new size, recorded.
    SetVolumeSize {
        name: String,
        epoch: u64,
        size: u64,
    },
    /// The writer of `epoch` on volume `id` switched a parity volume's `region` to `to`
    /// (the encoder's one step that changes what reads see): recorded.
    SetRegion {
        name: String,
        id: u64,
        epoch: u64,
        region: u64,
        to: trireme_replication::Region,
    },
    /// Resize a volume through its writer: grow it (online), or shrink it when nobody writes
    /// it and `allow_shrink`.
    VolumeResize {
        name: String,
        size: u64,
        #[serde(default)]
        allow_shrink: bool,
    },
    /// Takes snapshot `snapshot` of the volume through its writer (crash-consistent across
    /// the copies in sync).
    SnapshotCreate {
        name: String,
        snapshot: String,
    },
    /// The volume's snapshots, oldest first.
    SnapshotList {
        name: String,
    },
    /// Deletes snapshot `snapshot` of the volume from every copy. Refused while an export
    /// holds it, naming the export, unless `force`.
    SnapshotDelete {
        name: String,
        snapshot: String,
        #[serde(default)]
        force: bool,
    },
    /// Makes the volume hold what snapshot `snapshot` holds. Refused while a writer holds it,
    /// unless `force` (which fences the writer first).
    VolumeRollback {
        name: String,
        snapshot: String,
        #[serde(default)]
        force: bool,
    },
    /// Makes volume `name` a clone of snapshot `snapshot` of volume `source` (instantly: it
    /// shares the snapshot's blocks until it writes them).
    VolumeClone {
        source: String,
        snapshot: String,
        name: String,
    },
    /// Copies every block clone `name` still shares with its parent's snapshot into it.
    VolumeFlatten {
        name: String,
    },
    /// The writer of `epoch` detached cleanly.
    Detach {
        name: String,
        epoch: u64,
    },
    /// Compare the replicas and repair from the majority, through the writer attached in the
    /// cluster process.
    VolumeScrub {
        name: String,
        region: u64,
        /// Most bytes compared per second; none: as fast as it goes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate: Option<u64>,
    },
    /// Planned stop of a node process (not restarted until `NodeStart`).
    NodeStop {
        id: u32,
    },
    NodeStart {
        id: u32,
    },
    /// Planned restart of a node of `trireme up`: its replicas are taken out cleanly, the
    /// node stops (flushing) and starts again, and the answer comes once every one of its
    /// replicas is back in sync (a [`NodeRestartReport`]).
    NodeRestart {
        id: u32,
    },
    /// Move every replica off a node while volumes stay online (background job; `status`
    /// shows its progress). `rate` limits each copy, in bytes per second.
    NodeDrain {
        id: u32,
        #[serde(default)]
        rate: Option<u64>,
    },
    /// Like `NodeDrain`, then the node leaves the cluster (it may be dead already: its
    /// replicas are re-created elsewhere from the other copies).
    NodeRemove {
        id: u32,
        #[serde(default)]
        rate: Option<u64>,
    },
    /// A node gone for good (not registered, not answering): each volume that holds a copy
    /// in sync there records it failed, accepting its other copies in sync as they are, even
    /// if that copy alone held writes they lost (a power loss). Without `force`, a dry run:
    /// the answer (a [`NodeLostReport`]) says what it would do, and nothing changes.
    NodeLost {
        id: u32,
        #[serde(default)]
        force: bool,
    },
    /// A drained node takes new replicas again.
    NodeUndrain {
        id: u32,
    },
    /// Changes what the cluster knows of a node: its IOPS capacity (`none` forgets it).
    /// Answered with its record and warnings for the reserves past it.
    NodeSet {
        id: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iops_capacity: Option<Rate>,
    },
    Status,
    /// The cluster's events, oldest first: the last `limit` if given.
    Events {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
}

impl Request {
    /// A volume writer's request (checked against the writer of record: `writers.rs`).
    pub fn is_writer(&self) -> bool {
        matches!(
            self,
            Request::WriterAttach { .. }
                | Request::WriterReattach { .. }
                | Request::WriterRelease { .. }
                | Request::WriterAnswer { .. }
                | Request::WriterReport { .. }
                | Request::NvmfExport { .. }
                | Request::SetReplicaState { .. }
                | Request::SetVolumeSize { .. }
                | Request::SetRegion { .. }
                | Request::Detach { .. }
        )
    }
}

/// The most often the manager writes one volume's report for its writer: a client that
/// reports in a loop does not grow etcd's history faster than this.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The manager's answer to a [`Request::WriterAttach`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum WriterAttached {
    /// The caller writes the volume now, at `volume.epoch`; `unclean`: the previous writer did
    /// not detach (reconcile first).
    Attached {
        volume: Box<trireme_meta::VolumeRecord>,
        unclean: bool,
    },
    /// Another writer holds it (and `force` was not asked).
    Held { pid: u32, host: String, epoch: u64 },
}

/// What a writer attaching through the control socket says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterHello {
    pub pid: u32,
    /// Where it serves the volume (NBD URIs).
    #[serde(default)]
    pub uris: Vec<String>,
}

impl WriterHello {
    /// This process, serving at `uris`.
    pub fn me(uris: Vec<String>) -> WriterHello {
        WriterHello {
            pid: std::process::id(),
            uris,
        }
    }
}

/// Errors seen by a control client.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot reach the cluster at {path}: {source} (is `trireme up` running with this --data-dir?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot reach the manager at {addr}: {source}")]
    ConnectTcp {
        addr: String,
        source: std::io::Error,
    },
    #[error("control connection: {0}")]
    Io(#[from] std::io::Error),
    /// The manager refused the request as given (exit 2 at the CLI).
    #[error("{0}")]
    Remote(Refusal),
    /// The manager could not do it for the cluster's state, not the request's fault: no
    /// space, a name taken (exit 1 at the CLI).
    #[error("{0}")]
    Failed(Refusal),
    /// The manager refused because node `node` holds no replica of the volume on record (a
    /// writer leaves that copy out: `MembershipError::NotOnRecord`).
    #[error("{message}")]
    NotOnRecord { node: u32, message: String },
    /// The manager is handing its role over (to restart its own node): find the next manager
    /// and ask again.
    #[error("{0}")]
    Elsewhere(String),
    #[error("malformed control response: {0}")]
    Malformed(String),
}

impl ControlError {
    /// The stable code of this failure (see [`ErrorCode`]).
    pub fn code(&self) -> ErrorCode {
        match self {
            ControlError::Remote(r) | ControlError::Failed(r) => r.code,
            ControlError::NotOnRecord { .. } => ErrorCode::Busy,
            ControlError::Connect { .. }
            | ControlError::ConnectTcp { .. }
            | ControlError::Io(_)
            | ControlError::Elsewhere(_) => ErrorCode::Unavailable,
            ControlError::Malformed(_) => ErrorCode::Internal,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    Ok(serde_json::Value),
    Error(Refusal),
    /// Not the request's fault: the cluster's state (see [`ControlError::Failed`]).
    Failed(Refusal),
    /// This manager hands its role to another daemon: ask the next one again.
    Elsewhere(String),
    /// Refused: node `node` holds no replica of the volume on record. Its own variant so a
    /// writer tells it apart by type, not by the message.
    NotOnRecord {
        node: u32,
        message: String,
    },
}

/// A byte stream the control API runs over (a unix socket on one host, TCP to the manager of
/// a cluster of several servers).
pub trait ControlStream: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> ControlStream for T {}

/// A connection to the control API.
#[derive(Debug)]
pub struct ControlClient {
    stream: BufReader<Box<dyn ControlStream>>,
}

impl ControlClient {
    pub async fn connect(path: &Path) -> Result<ControlClient, ControlError> {
        let s = UnixStream::connect(path)
            .await
            .map_err(|source| ControlError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(ControlClient {
            stream: BufReader::new(Box::new(s)),
        })
    }

    /// Connects to a manager's control API over TCP (`host:port`): over mutual TLS when this
    /// process has a TLS identity (the manager's certificate checked against the address).
    pub async fn connect_tcp(addr: &str) -> Result<ControlClient, ControlError> {
        let err = |source| ControlError::ConnectTcp {
            addr: addr.to_string(),
            source,
        };
        let s = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
        let _ = s.set_nodelay(true);
        let Some(cfg) = trireme_transport::tcp::tls_setup().and_then(|t| t.client.clone()) else {
            return Ok(ControlClient {
                stream: BufReader::new(Box::new(s)),
            });
        };
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| err(std::io::Error::other(format!("{host}: {e}"))))?;
        let tls = tokio::time::timeout(
            std::time::Duration::from_secs(3),
            tokio_rustls::TlsConnector::from(cfg).connect(name, s),
        )
        .await
        .map_err(|_| err(std::io::Error::other("no TLS handshake within 3s")))?
        .map_err(err)?;
        // The manager's control port is a node daemon's: no other role passes for it.
        match trireme_tls::peer_role(tls.get_ref().1) {
            Some(trireme_tls::Role::Node(_)) => {}
            other => {
                return Err(err(std::io::Error::other(format!(
                    "its certificate names {}, not a node",
                    other.map_or_else(|| "no trireme role".to_string(), |r| r.to_string())
                ))))
            }
        }
        Ok(ControlClient {
            stream: BufReader::new(Box::new(tls)),
        })
    }

    pub async fn call<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, ControlError> {
        let mut line = serde_json::to_vec(req).expect("requests serialize");
        line.push(b'\n');
        self.stream.get_mut().write_all(&line).await?;
        let mut buf = Vec::new();
        let n = (&mut self.stream)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
            .await?;
        if n == 0 {
            return Err(ControlError::Malformed("connection closed".into()));
        }
        decode_reply(&buf)
    }
}

/// A reply line of the manager, as a client reads it: the value (of the type the request
/// answers with), or the error the manager sent, or why the line is not a reply.
pub fn decode_reply<T: DeserializeOwned>(line: &[u8]) -> Result<T, ControlError> {
    match serde_json::from_slice::<Reply>(line)
        .map_err(|e| ControlError::Malformed(e.to_string()))?
    {
        Reply::Ok(v) => {
            serde_json::from_value(v).map_err(|e| ControlError::Malformed(e.to_string()))
        }
        Reply::Error(e) => Err(ControlError::Remote(e)),
        Reply::Failed(e) => Err(ControlError::Failed(e)),
        Reply::Elsewhere(e) => Err(ControlError::Elsewhere(e)),
        Reply::NotOnRecord { node, message } => Err(ControlError::NotOnRecord { node, message }),
    }
}

#[cfg(test)]
mod tests {
    use super::{LimitsChange, NoLimit, Rate, Request};
    use proptest::prelude::*;

    proptest! {
        /// What the fuzz target `control_request` checks, on every test run: any line decodes
        /// to an error or to a request that encodes back to itself.
        #[test]
        fn any_line_decodes_to_an_error_or_a_request_that_round_trips(
            line in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..200),
                "\\{\"cmd\":\"(volume_create|volume_access|attach|node_drain|set_replica_state)\"(,\"[a-z_]{1,8}\":(\"[a-z*]{0,6}\"|[0-9]{1,20}|\\[\\]|\\[\"[a-z*]{0,4}\"\\]|null)){0,4}\\}"
                    .prop_map(String::into_bytes),
            ]
        ) {
            if let Ok(r) = serde_json::from_slice::<Request>(&line) {
                let again = serde_json::to_vec(&r).unwrap();
                prop_assert_eq!(serde_json::from_slice::<Request>(&again).ok(), Some(r));
            }
        }
    }

    #[test]
    fn an_access_request_decodes() {
        let r: Request =
            serde_json::from_str(r#"{"cmd":"volume_access","name":"v","allow":["a"]}"#).unwrap();
        assert_eq!(
            r,
            Request::VolumeAccess {
                name: "v".into(),
                allow: vec!["a".into()],
                deny: vec![]
            }
        );
        let r: Request =
            serde_json::from_str(r#"{"cmd":"volume_set","name":"v","min_copies":1}"#).unwrap();
        assert_eq!(
            r,
            Request::VolumeSet {
                name: "v".into(),
                min_copies: Some(1),
                tier: None,
                limits: LimitsChange::default(),
                qos_policy: None,
            }
        );
        let r: Request = serde_json::from_str(
            r#"{"cmd":"volume_set","name":"v","limits":{"iops":100,"bps":"none"}}"#,
        )
        .unwrap();
        let Request::VolumeSet { limits, .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!(limits.iops, Some(Rate::Set(100)));
        assert_eq!(limits.bps, Some(Rate::Remove(NoLimit::None)));
        let r: Request =
            serde_json::from_str(r#"{"cmd":"volume_set","name":"v","tier":"fast"}"#).unwrap();
        assert!(matches!(
            r,
            Request::VolumeSet {
                min_copies: None,
                tier: Some(trireme_meta::TierPolicy::Fast),
                ..
            }
        ));
        assert!(
            serde_json::from_str::<Request>(r#"{"cmd":"volume_set","name":"v","tier":"ssd"}"#)
                .is_err()
        );
        // Older clients send no minimum at creation.
        let r: Request =
            serde_json::from_str(r#"{"cmd":"volume_create","name":"v","size":4096,"replicas":3}"#)
                .unwrap();
        assert!(matches!(
            r,
            Request::VolumeCreate {
                min_copies: None,
                ..
            }
        ));
    }
}
