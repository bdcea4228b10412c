//! The records trireme keeps under its prefix, beside volumes and nodes.

use serde::{Deserialize, Serialize};

use crate::kv::LeaseId;

/// The running daemon of a node (lease-bound: it disappears when the daemon dies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AliveRecord {
    pub id: u32,
    pub addr: String,
    pub host: String,
    pub pid: u32,
}

/// The holder of the manager role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerRecord {
    /// The node daemon that holds it (0: a process that is no node, e.g. `trireme up`).
    pub node: u32,
    /// Where its control API listens (TCP `host:port`).
    pub control: String,
    pub host: String,
    pub pid: u32,
    /// Where it serves metrics and the dashboard over HTTP (`host:port`), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
}

/// A revoked certificate (`revoked/<fingerprint>`): refused at every handshake of the
/// cluster's processes from when they read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedCert {
    /// SHA-256 of the certificate, lower-case hex.
    pub fingerprint: String,
    /// The role it named (`client alice`, `node 3`), for the operator's eyes.
    pub role: String,
    /// When, in seconds since the Unix epoch.
    pub at: u64,
}

/// The writer of a volume (lease-bound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachRecord {
    pub epoch: u64,
    pub host: String,
    pub pid: u32,
    /// Where it serves the volume (NBD URIs).
    pub exports: Vec<String>,
    /// The identity it reaches the nodes with (its certificate's role), if it uses TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// A request of the manager to the writer of a volume attached on another host (`moves/<name>`):
/// add the replica on `to` (already created, recorded failed), copy the volume to it, then
/// retire the one on `from`. The writer reports its progress and outcome in the same key; the
/// manager then drops `from` from the layout, deletes its copy and the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    pub from: u32,
    pub to: u32,
    /// Copy rate limit, bytes per second.
    pub rate: Option<u64>,
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    pub state: MoveRequestState,
    pub progress: Option<trireme_replication::ResyncProgress>,
    pub error: Option<String>,
}

/// Where a [`MoveRequest`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveRequestState {
    /// Written by the manager, not yet taken by the writer.
    Asked,
    /// The writer is copying the volume to the new replica.
    Copying,
    /// The new replica is in sync and the old one retired from the write set.
    Done,
    Failed,
}

/// A scrub's request to the writer of a volume attached on another host (`scrubs/<name>`):
/// compare the copies region by region and repair from the majority, through the writer (the
/// only process that may write the volume). The writer reports its outcome in the same key;
/// the manager, waiting for it, then deletes the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubRequest {
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    /// Bytes compared at a time.
    pub region: u64,
    pub state: ScrubState,
    /// The writer's report (`trireme_client::ScrubReport`), once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Most bytes compared per second (a scheduled scrub); none: as fast as it goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
}

/// The manager's request to a volume's writer on another host to resize it
/// (`resizes/<name>`): the writer grows every copy, records the size in the layout and serves
/// it, then answers in the same key (as for a [`ScrubRequest`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeRequest {
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    pub size: u64,
    pub state: ScrubState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A volume's scrubs (`scrubbed/<name>`): when its schedule counts from, and how its last
/// scrub went. The manager writes it after every scrub, asked or scheduled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubRecord {
    /// The volume's id: a record left by a deleted volume of the same name is not its.
    pub volume_id: u64,
    /// Seconds since the Unix epoch the next scheduled scrub counts from: the last one's end,
    /// or when the schedule first saw the volume.
    pub since: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<ScrubOutcome>,
}

/// How one scrub went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubOutcome {
    /// When it ended, in seconds since the Unix epoch.
    pub at: u64,
    pub took_ms: u64,
    /// `schedule` or `operator`.
    pub by: String,
    pub bytes_compared: u64,
    /// Regions where the copies disagreed, of which repaired, and left alone (no majority).
    pub mismatched_regions: u64,
    pub repaired_regions: u64,
    pub unresolved_regions: u64,
    /// Why it did not finish, if it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a [`ScrubRequest`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScrubState {
    /// Written by the manager, not yet taken by the writer.
    Asked,
    /// The writer is scrubbing (its progress is in its report, `reports/<name>`).
    Running,
    Done,
    Failed,
}

/// A planned restart's request to the writer of a volume attached on another host
/// (`takeouts/<name>`): take the replica on `node` out cleanly before its node restarts, then
/// bring it back. The manager and the writer take turns on the key; see [`TakeOutState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeOutRequest {
    pub node: u32,
    /// The writer it is for: a writer of another epoch leaves it alone.
    pub epoch: u64,
    pub state: TakeOutState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the resync copied back (state `back`).
    #[serde(default)]
    pub resynced_bytes: u64,
    /// The resync had to compare everything (the replica's history was lost).
    #[serde(default)]
    pub full: bool,
}

/// Where a [`TakeOutRequest`] is. The manager writes `asked` and `return`, the writer the
/// others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TakeOutState {
    /// Written by the manager: take the replica out.
    Asked,
    /// The replica is out (recorded outdated, the survivors record what it misses); the
    /// writer does not try to bring it back until `return` (or for a while at most).
    Out,
    /// The writer refused (fewer in-sync copies than the volume's minimum would remain).
    Refused,
    /// Written by the manager once the node is back: resync it.
    Return,
    /// The replica is in sync again.
    Back,
}

/// The manager's order to a node daemon to restart itself (`restarts/<node>`): flush, record a
/// clean shutdown, give its lease back and start again. Only the daemon registered under
/// `lease` obeys, so the one it starts (a new lease) does not restart again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartOrder {
    pub node: u32,
    pub lease: LeaseId,
}
