//! What a writer is given to open a volume: where it lives and which epoch it holds
//! ([`AttachInfo`], [`ReplicaTarget`]), how to reach a node ([`Connector`]) and how to
//! handle failures ([`VolumeOptions`]).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trireme_replication::ReplicaState;
use trireme_transport::{Connection, TransportKind};

use crate::{BoxFut, VolumeError};

/// Where a volume lives and which epoch this writer holds: the answer to an attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachInfo {
    pub name: String,
    pub id: u64,
    pub size: u64,
    pub epoch: u64,
    pub replicas: Vec<ReplicaTarget>,
    /// The previous writer did not detach cleanly: writes it had in flight may have reached
    /// some replicas and not others, so the new writer reconciles the replicas.
    #[serde(default)]
    pub reconcile: bool,
    /// Fewest in-sync copies writes go on with (0: as many as are in sync when attached,
    /// less one, at least one); below it, writes wait (`copies.rs`).
    #[serde(default)]
    pub min_copies: u32,
    /// Thick: a copy grown by a resize reserves its new space too.
    #[serde(default)]
    pub preallocate: bool,
    /// How the volume's bytes are kept (a mirror unless said).
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::Layout::is_mirror"
    )]
    pub layout: trireme_replication::Layout,
    /// A parity volume's regions as recorded (none yet: every region mirrored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<trireme_replication::Region>,
    /// The I/O limits the writer keeps (`volume set --iops-limit ...`).
    #[serde(
        default,
        skip_serializing_if = "trireme_replication::qos::Limits::is_default"
    )]
    pub limits: trireme_replication::qos::Limits,
}

/// One replica as the client reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaTarget {
    pub node: u32,
    pub addr: String,
    /// The node's same-host socket (`unix:/path`), tried first when it exists on this host.
    #[serde(default)]
    pub local_addr: Option<String>,
    pub state: ReplicaState,
    /// The incarnation recorded when it was last in sync (0: unknown).
    #[serde(default)]
    pub incarnation: u64,
    /// A parity copy's move: the node whose place this new copy follows until it takes it
    /// (`follow.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<u32>,
}

/// Tuning of failure handling.
#[derive(Debug, Clone)]
pub struct VolumeOptions {
    /// How long a replica may take to answer one request before it is taken out (writes) or
    /// another replica is tried (reads).
    pub replica_timeout: Duration,
    /// How often the background task looks for replicas to bring back.
    pub resync_interval: Duration,
    /// Resync copy rate limit in bytes per second; `None` copies as fast as the replicas go.
    pub resync_rate: Option<u64>,
    pub kind: TransportKind,
    pub streams: usize,
    /// How to reach a replica; `None` uses the transports (same-host socket first, then the
    /// network address). The seeded simulator plugs in its in-memory network here.
    pub connector: Option<Arc<dyn Connector>>,
    /// Reach a node on this host through its same-host socket (unix) when it has one. Off,
    /// every connection goes over the network address: the benchmark's TCP baseline.
    pub same_host_socket: bool,
    /// Activity-log extent in bytes: what a new writer compares per extent the dead one may
    /// have had writes in flight in.
    pub activity_extent: u64,
    /// Most extents left marked in the activity log; beyond it the least recently written are
    /// cleared. Bounds the reconciliation after a writer dies to this many extents plus those
    /// written in the last five periods.
    pub activity_extents: usize,
    /// How often quiet extents are cleared from the activity log.
    pub activity_period: Duration,
    /// Count requests and their latency in this process's metrics (`trireme_metrics::volume`),
    /// for the `--http` endpoint. Relaxed atomic adds and two clock reads per request.
    pub metrics: bool,
    /// How long a request waits for a copy to answer again before it fails with EIO; zero
    /// fails at once. In the writer, a request no in-sync copy answered waits for one to
    /// answer and be linked again (`relink.rs`); in the process serving the volume, a request
    /// of a writer that lost the link to every copy (the cluster restarted) waits for the
    /// process to attach again.
    pub reattach_wait: Duration,
    /// A parity volume's encoder, with a control plane: the most volume data it turns into
    /// stripes a second; 0 runs none (`encoder.rs`).
    pub encode_rate: u64,
    /// How far past its share, in percent of the volume, a parity volume's mirrored part may
    /// grow under writes without a pause before the encoder goes on beside them (`encoder.rs`).
    pub encode_headroom: u8,
}

/// Opens a connection to a replica's node.
pub trait Connector: Send + Sync + std::fmt::Debug {
    fn connect<'a>(
        &'a self,
        target: &'a ReplicaTarget,
    ) -> BoxFut<'a, Result<Arc<dyn Connection>, VolumeError>>;
}

impl VolumeOptions {
    /// The defaults, over a given transport and stream count.
    pub fn over(kind: TransportKind, streams: usize) -> VolumeOptions {
        VolumeOptions {
            kind,
            streams,
            ..VolumeOptions::default()
        }
    }
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            replica_timeout: Duration::from_secs(1),
            resync_interval: Duration::from_millis(500),
            resync_rate: None,
            kind: TransportKind::Auto,
            streams: 2,
            connector: None,
            same_host_socket: true,
            activity_extent: 4 << 20,
            activity_extents: 1024,
            activity_period: Duration::from_millis(500),
            metrics: true,
            reattach_wait: Duration::from_secs(30),
            encode_rate: crate::encoder::ENCODE_RATE,
            encode_headroom: crate::encoder::ENCODE_HEADROOM,
        }
    }
}
