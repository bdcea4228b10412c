//! The arguments of the commands that run processes and manage volumes: `up`, `node`,
//! `attach`, `nbd`, `volume` (clap's derive; `main.rs` holds the top of the command tree).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::*;

mod volume;
pub use volume::*;

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub scrub: ScrubArgs,
    /// Number of storage node processes.
    #[arg(long, default_value_t = 3, value_parser = units::count(1, 7))]
    pub nodes: u32,
    /// Copies of the volume, each on a different node.
    #[arg(long, default_value_t = 3, value_parser = units::count(1, 3))]
    pub replicas: u32,
    /// Keep the volume as parity instead: K data and M parity chunks on K+M of the nodes
    /// (`--nodes 3 --parity 2+1`, `--nodes 6 --parity 4+2`); see `volume create --parity`.
    #[arg(long, value_name = "K+M", conflicts_with_all = ["replicas", "preallocate"])]
    pub parity: Option<String>,
    /// With `--parity`: the share of the volume kept mirrored for hot writes, in percent.
    #[arg(long, value_name = "PERCENT", requires = "parity", value_parser = units::count(1, 99))]
    pub mirror_share: Option<u32>,
    /// Size of the volume (e.g. 1G, 512M).
    #[arg(long, default_value = "1G", value_parser = units::parse_size)]
    pub size: u64,
    /// Where nodes keep replicas.
    #[arg(long, value_enum, default_value_t = StoreArg::File)]
    pub store: StoreArg,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// NBD TCP port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 10809)]
    pub port: u16,
    /// Serve the volume over NVMe/TCP at ADDR:PORT too (subsystem
    /// nqn.2026-12.io.trireme:local:VOLUME; hosts whose NQN is on its access list).
    #[arg(long, value_name = "ADDR:PORT")]
    pub nvmf: Option<std::net::SocketAddr>,
    /// Name of the volume to create and export.
    #[arg(long, default_value = "vol0")]
    pub volume: String,
    /// Streams from the volume client to each node.
    #[arg(long, default_value_t = 2, value_parser = units::count(1, 16))]
    pub streams: u32,
    /// Threads for the NBD frontend and volume client (1 is cheapest per IO on small hosts).
    #[arg(long, default_value_t = 1, value_parser = units::count(1, 64))]
    pub threads: u32,
    #[command(flatten)]
    pub failure: FailureArgs,
    /// Granularity of the regions replicas track for a peer that is out.
    #[arg(long, default_value = "4K", value_parser = units::parse_dirty_grain)]
    pub dirty_grain: u64,
    /// Threads serving each node's reads and writes (see `node serve --io-threads`).
    #[arg(long, default_value_t = trireme_node::DEFAULT_IO_THREADS as u32, value_parser = units::count(1, 1024))]
    pub io_threads: u32,
    /// Each node's share of its disk for recovery while clients want it all (see `node serve
    /// --recovery-share`).
    #[arg(long, default_value_t = trireme_node::DEFAULT_RECOVERY_SHARE, value_name = "PERCENT", value_parser = units::count(1, 99))]
    pub recovery_share: u32,
    /// Bytes each node's replicas may hold (see `node serve --capacity`). Default: for the
    /// file and tiered stores, what each node's directory takes plus an equal share of what
    /// the file system has free (every node of `up` lives on the one under `--data-dir`).
    #[arg(long, value_parser = units::parse_size)]
    pub node_capacity: Option<u64>,
    /// Reserve the volume's whole space on every node now (thick), rather than as it is written.
    #[arg(long)]
    pub preallocate: bool,
    /// Over-commit limit of each node's thin volumes (see `node serve --overcommit`).
    #[arg(long, default_value = "1", value_parser = units::parse_overcommit, value_name = "RATIO")]
    pub overcommit: f64,
    /// Fault tests: every node injects store errors at the rates in `<data-dir>/node-N.faults`
    /// (see `node serve --inject-faults`).
    #[arg(long)]
    pub inject_faults: bool,
    /// Wait before restarting a node process that died (doubles on quick repeated deaths, up
    /// to 30s).
    #[arg(long, default_value = "500ms", value_parser = units::parse_duration)]
    pub restart_backoff: std::time::Duration,
    /// Run node N (the N-th time this is given) inside network namespace NS, listening on
    /// ADDR (an address NS holds), with no same-host socket: every link to it crosses that
    /// namespace's network. For fault tests with partitions (`ip netns`, veth, iptables).
    #[arg(long = "node-netns", value_name = "NS@ADDR", value_parser = parse_netns)]
    pub node_netns: Vec<NodeNetns>,
    /// Run node N with another `--transport` than the cluster's (e.g. `2=tcp`: node 2 offers
    /// no UCX, so links to it use TCP while the others use UCX).
    #[arg(long = "node-transport", value_name = "N=TRANSPORT", value_parser = parse_node_transport)]
    pub node_transport: Vec<(u32, TransportArg)>,
    /// Nodes do not seal blocks with checksums (to measure their cost; see `node serve`).
    #[arg(long)]
    pub no_block_checksums: bool,
    /// Nodes keep their activity log and dirty records in memory only (to measure what
    /// keeping them on disk costs; see `node serve`).
    #[arg(long)]
    pub volatile_bookkeeping: bool,
    /// Plain text on every TCP link. Without it the NBD export on TCP speaks TLS only (NBD
    /// STARTTLS, client certificates of the cluster's CA) and the links to the nodes are mutual
    /// TLS; the credentials are in `<data-dir>/tls/`.
    #[arg(long)]
    pub insecure: bool,
}

/// How a writer handles replica failures.
/// `--scrub-interval`, `--scrub-rate`: the manager's scrub schedule.
#[derive(Debug, Args)]
pub struct ScrubArgs {
    /// While this process is the manager: scrub every volume this long after its last scrub
    /// (compare its copies and repair from the majority, as Ceph's deep scrub), one volume
    /// at a time; e.g. `12h`, `7d`; `0` never.
    #[arg(long, default_value = "7d", value_parser = units::parse_keep)]
    pub scrub_interval: std::time::Duration,
    /// Most bytes a scheduled scrub compares per second (it reads every copy).
    #[arg(long, default_value = "64M", value_parser = units::parse_size)]
    pub scrub_rate: u64,
}

impl ScrubArgs {
    pub fn schedule(&self) -> trireme_control::ScrubSchedule {
        trireme_control::ScrubSchedule {
            every: self.scrub_interval,
            rate: Some(self.scrub_rate).filter(|&r| r > 0),
            region: 1 << 20,
            integrity: true,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct FailureArgs {
    /// A replica that does not answer a request within this time is taken out of the in-sync
    /// set (writes go on with the others) and resynced when it is back.
    #[arg(long, default_value = "1s", value_parser = units::parse_duration)]
    pub replica_timeout: std::time::Duration,
    /// Resync copy rate limit per second (e.g. 200M); unlimited if not given.
    #[arg(long, value_parser = units::parse_size)]
    pub resync_rate: Option<u64>,
    /// When the writer has lost every copy at once (the cluster restarted), how long NBD
    /// requests wait for this process to attach again before they fail with EIO; `0` fails
    /// them at once.
    #[arg(long, default_value = "30s", value_parser = units::parse_interval)]
    pub reattach_wait: std::time::Duration,
    /// A parity volume's encoder: the most volume data it turns into stripes (or folds back)
    /// a second; `0` runs no encoder (writes then stay on the mirrored copies).
    #[arg(long, default_value = "64M", value_parser = units::parse_size)]
    pub encode_rate: u64,
    /// A parity volume's encoder: how far past its mirrored share, in percent of the volume,
    /// writes without a pause may take the mirrored part before the encoder goes on beside
    /// them (within it, it waits for a pause); `0` encodes beside them at once.
    #[arg(long, default_value_t = trireme_client::ENCODE_HEADROOM, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub encode_headroom: u8,
}

impl FailureArgs {
    /// The volume client's options for these flags.
    pub fn volume_options(
        &self,
        streams: u32,
        kind: trireme_transport::TransportKind,
    ) -> trireme_client::VolumeOptions {
        trireme_client::VolumeOptions {
            replica_timeout: self.replica_timeout,
            resync_rate: self.resync_rate,
            reattach_wait: self.reattach_wait,
            encode_rate: self.encode_rate,
            encode_headroom: self.encode_headroom,
            streams: streams as usize,
            kind,
            ..Default::default()
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// List registered nodes and whether they answer.
    List,
    /// Run one storage node in the foreground (`trireme up` starts these itself).
    Serve(NodeServeArgs),
    /// Run this server's node daemon in a cluster on etcd (needs --etcd): registers under a
    /// lease (one daemon per id), serves its replicas, and takes the manager role when none
    /// holds it.
    Run(NodeRunArgs),
    /// Stop a node of the running `trireme up` for planned maintenance (it is not restarted
    /// until `node start`); its replicas go out of sync and resync when it is back.
    Stop { id: u32 },
    /// Start a node stopped with `node stop`.
    Start { id: u32 },
    /// Planned restart of a node (patch Tuesday): its replicas are taken out cleanly by their
    /// writers (no write fails on them), the node stops — flushing — and starts again, and
    /// the command returns once they are back in sync, resynced incrementally. In `trireme
    /// up` the node process restarts; on etcd (`--etcd`) the node's daemon starts its binary
    /// again in place (an upgraded one, if it was replaced). Refused when fewer in-sync
    /// copies than a volume's minimum would remain.
    Restart { id: u32 },
    /// Move every replica off a node while volumes stay online (each volume's writer copies
    /// it to another node, then drops the old copy). The node stays, empty, and takes no new
    /// replicas. Prints progress until done.
    Drain(MoveArgs),
    /// Take a node out of the cluster, dead or alive: its replicas are re-created on other
    /// nodes from the remaining copies, then it is stopped and forgotten.
    Remove(MoveArgs),
    /// Say a node is gone for good (not running, never coming back): every volume waiting
    /// for its copy in sync (the others lost their unflushed writes in a power loss, and
    /// only it may hold them) accepts the others as they are, losing what only it held. A
    /// dry run unless `--force`: it prints what it would do. Refused while the node answers;
    /// a volume whose only copy in sync is there, or a parity volume left with fewer than K,
    /// or one a writer holds, is left as it was. Then `node remove ID` replaces its copies.
    Lost {
        /// The node's id (`trireme node list`).
        id: u32,
        /// Change the records (without it, nothing changes).
        #[arg(long)]
        force: bool,
    },
    /// Let a drained (or draining) node take new replicas again.
    Undrain { id: u32 },
    /// Change what the cluster knows of a node: its IOPS capacity, which the reserves of the
    /// volumes on it are checked against.
    Set {
        /// The node's id (`trireme node list`).
        id: u32,
        /// What the node serves flat out, in 8 KiB units a second (measure it: `trireme bench`
        /// of a one-copy volume on it, or fio on its drive); `none` forgets it.
        #[arg(long, value_name = "IOPS", value_parser = units::parse_iops_capacity, allow_hyphen_values = true)]
        iops_capacity: Option<trireme_control::Rate>,
    },
}

#[derive(Subcommand, Debug)]
pub enum MaintenanceCmd {
    /// Restart every node in turn (`node restart`), waiting for every copy of every volume
    /// to be in sync before the next, with the workload running; prints each node's downtime,
    /// time back to in sync and bytes resynced.
    Rolling,
}

pub use trireme_daemon::local::NodeNetns;

fn parse_netns(s: &str) -> Result<NodeNetns, String> {
    let (name, addr) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?}: expected NS@ADDR, e.g. trireme-n1@10.201.1.2"))?;
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(format!("{name:?} is not a network namespace name"));
    }
    let addr = addr
        .parse()
        .map_err(|e| format!("{addr:?} is not an IP address: {e}"))?;
    Ok(NodeNetns {
        name: name.to_string(),
        addr,
    })
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    pub id: u32,
    /// Copy rate limit per second for each volume moved (e.g. 100M); unlimited if not given.
    #[arg(long, value_parser = units::parse_size)]
    pub rate: Option<u64>,
    /// Start the job and return; `trireme status` shows its progress.
    #[arg(long)]
    pub no_wait: bool,
}

/// `--http ADDR|off`.
#[derive(Debug, Args)]
pub struct HttpArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (and, where the manager runs, the
    /// dashboard at http://ADDR/); port 0 picks a free one, printed and written to the file
    /// `http` in the data directory; `off` serves nothing.
    #[arg(long = "http", value_name = "ADDR|off", default_value = "127.0.0.1:0", value_parser = parse_http)]
    pub addr: HttpAddr,
    /// The token requests to the endpoint must carry (`Authorization: Bearer TOKEN`, or
    /// `/?token=TOKEN` in a browser), read from FILE; default: the file `http-token` in the
    /// data directory, made (mode 0600) if missing. Give every server of a cluster the same
    /// file so one Prometheus job scrapes them all.
    #[arg(long = "http-token-file", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// An `--http` address, or none (`off`).
#[derive(Debug, Clone, Copy)]
pub struct HttpAddr(pub Option<std::net::SocketAddr>);

fn parse_http(s: &str) -> Result<HttpAddr, String> {
    trireme_daemon::http::parse_addr(s).map(HttpAddr)
}

#[derive(Debug, Args)]
pub struct NodeServeArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    #[arg(long)]
    pub id: u32,
    /// Directory of the node's store.
    #[arg(long)]
    pub dir: PathBuf,
    /// Data-path address; port 0 picks a free one, printed as `listening ADDR` on stdout.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Also serve clients on this host through a unix socket at PATH (printed as `unix:PATH`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = StoreArg::File)]
    pub store: StoreArg,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// Granularity of the regions a replica tracks for a peer that is out (what an incremental
    /// resync copies): a power of two from 4K to 64M.
    #[arg(long, default_value = "4K", value_parser = units::parse_dirty_grain)]
    pub dirty_grain: u64,
    /// Fault tests: fail store reads/writes/flushes with EIO at the rates written in FILE
    /// (`read=0.01 write=0.01 flush=0.1`), re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub inject_faults: Option<PathBuf>,
    /// Do not seal blocks with checksums (for measuring what they cost; reads are then not
    /// checked). Seals kept from earlier runs are dropped at the next sealed open.
    #[arg(long)]
    pub no_block_checksums: bool,
    /// Keep the activity log and the peers' dirty records in memory only (for measuring what
    /// keeping them on disk costs): after a restart, the next resync or reconcile compares
    /// whole replicas. File stores keep them on disk by default.
    #[arg(long)]
    pub volatile_bookkeeping: bool,
    /// Serve TCP peers over mutual TLS with the identity in DIR (`node-cert.pem`,
    /// `node-key.pem`, `ca-cert.pem`; `trireme ca issue node N`): only peers with a certificate
    /// of that CA get in. Required unless `--insecure`.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Serve TCP in plain text, trusting every peer that reaches the port (a test cluster on
    /// a network of its own).
    #[arg(long, conflicts_with = "tls_dir")]
    pub insecure: bool,
    /// The cluster's node ids (`1,2,3`): a node certificate of any other id gets nothing.
    /// `trireme up` passes its own; without it, every node certificate of the CA counts.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub members: Option<Vec<u32>>,
    /// Threads serving reads and writes of a store on disk: the most I/Os the node has on
    /// its disk at once. More than the disk's queue needs cost a thread wakeup per I/O.
    #[arg(long, default_value_t = trireme_node::DEFAULT_IO_THREADS as u32, value_parser = units::count(1, 1024))]
    pub io_threads: u32,
    /// Recovery's share of the node's disk while clients' requests wait too, in percent:
    /// resyncs, repairs, scrubs, drains and the parity encoder get this much of what the node
    /// serves when clients want it all, and all of it when they do not.
    #[arg(long, default_value_t = trireme_node::DEFAULT_RECOVERY_SHARE, value_name = "PERCENT", value_parser = units::count(1, 99))]
    pub recovery_share: u32,
    #[command(flatten)]
    pub room: RoomArgs,
    /// This node's directory is on a file system N nodes share (those of `trireme up`): its
    /// default capacity counts 1/N of the free space.
    #[arg(long, default_value_t = 1, value_parser = units::count(1, 1024), hide = true)]
    pub fs_share: u32,
}

/// How much a node's replicas may take.
#[derive(Debug, Args)]
pub struct RoomArgs {
    /// Bytes this node's replicas may hold. Their sizes may sum to this times
    /// `--overcommit`; creating or growing one past it is refused. Default: half the host's
    /// memory for `--store memory`; for `--store file` and `tiered`, what the node's directory
    /// takes on disk plus what its file system has free (measured each time).
    #[arg(long, value_parser = units::parse_size)]
    pub capacity: Option<u64>,
    /// Over-commit limit of the node's thin volumes: their sizes may sum to this many times
    /// its capacity (1 to 100; 1 never promises more than the node has).
    #[arg(long, default_value = "1", value_parser = units::parse_overcommit, value_name = "RATIO")]
    pub overcommit: f64,
}

#[derive(Debug, Args)]
pub struct NodeRunArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub room: RoomArgs,
    /// Serve and reach peers over mutual TLS with the identity in DIR (as `node serve`).
    /// Required unless `--insecure`.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Serve TCP in plain text, trusting every peer that reaches the port, and accept an etcd
    /// that lets any certificate write every key (a test cluster on a network of its own).
    #[arg(long, conflicts_with = "tls_dir")]
    pub insecure: bool,
    /// This node's id in the cluster (unique; a second daemon with it is refused).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub id: u32,
    /// Directory of the node's store.
    #[arg(long)]
    pub dir: PathBuf,
    /// Data-path address other servers and clients reach this node at (port 0 picks a free
    /// one; the bound address is registered).
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// Control API address while this daemon holds the manager role (default: the --listen
    /// host, a free port).
    #[arg(long)]
    pub control: Option<std::net::SocketAddr>,
    /// Failure domain (rack, room): a volume's copies go to distinct zones when there are enough.
    #[arg(long)]
    pub zone: Option<String>,
    /// What this node serves flat out, in 8 KiB units a second: the reserves of the volumes
    /// on it are checked against it (kept on record when not given; see `node set`).
    #[arg(long, value_name = "IOPS", value_parser = units::parse_iops_count, allow_hyphen_values = true)]
    pub iops_capacity: Option<u64>,
    #[arg(long, value_enum, default_value_t = StoreArg::File)]
    pub store: StoreArg,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// How long after this daemon dies (or loses etcd) it is shown down, and the manager role
    /// it held passes on.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub lease_ttl: std::time::Duration,
    /// While this daemon is the manager: a node down this long has its replicas re-created on
    /// other nodes (like Ceph's mon_osd_down_out_interval); `0` never.
    #[arg(long, default_value = "10m", value_parser = units::parse_interval)]
    pub down_out_interval: std::time::Duration,
    /// Copy rate limit for those re-creations, per second (e.g. 100M).
    #[arg(long, value_parser = units::parse_size)]
    pub recovery_rate: Option<u64>,
    #[command(flatten)]
    pub scrub: ScrubArgs,
    #[arg(long, default_value = "4K", value_parser = units::parse_dirty_grain)]
    pub dirty_grain: u64,
    /// Do not seal blocks with checksums.
    #[arg(long)]
    pub no_block_checksums: bool,
    /// Keep the activity log and dirty records in memory only (see `node serve`).
    #[arg(long)]
    pub volatile_bookkeeping: bool,
    /// Fault tests: fail store I/O at the rates in FILE (see `node serve --inject-faults`).
    #[arg(long, value_name = "FILE")]
    pub inject_faults: Option<PathBuf>,
    /// Threads serving reads and writes (see `node serve --io-threads`).
    #[arg(long, default_value_t = trireme_node::DEFAULT_IO_THREADS as u32, value_parser = units::count(1, 1024))]
    pub io_threads: u32,
    /// Recovery's share of the disk while clients want it all (see `node serve
    /// --recovery-share`).
    #[arg(long, default_value_t = trireme_node::DEFAULT_RECOVERY_SHARE, value_name = "PERCENT", value_parser = units::count(1, 99))]
    pub recovery_share: u32,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    pub volume: String,
    /// Fence the current writer (its host may be cut off, not dead) instead of refusing.
    #[arg(long)]
    pub force: bool,
    /// How long after this process dies another host may attach without --force.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub lease_ttl: std::time::Duration,
    #[command(flatten)]
    pub export: ExportArgs,
    #[command(flatten)]
    pub http: HttpArgs,
}

/// Which kernel block device `map` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceKind {
    /// What this kernel has: ublk where `ublk_drv` is loaded, else the NBD client.
    Auto,
    /// The kernel's NBD client (`nbd.ko`).
    Nbd,
    /// ublk (`ublk_drv`).
    Ublk,
    /// A loop device over a FUSE file (`nbdfuse`, `losetup`), for a host with neither
    /// driver (a container, a CI runner): it does not survive this process, so never auto.
    Loop,
}

#[derive(Debug, Args)]
pub struct MapArgs {
    pub volume: String,
    /// Which kernel device (auto: what this kernel has).
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Fence the current writer (its host may be cut off, not dead) instead of refusing.
    #[arg(long)]
    pub force: bool,
    /// How long after this process dies another host may attach without --force.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub lease_ttl: std::time::Duration,
    /// NBD: a request the device has not had answered this long is sent again (after this
    /// process died: to the next `map`). ublk re-issues them when the next `map` serves.
    #[arg(long, default_value = "30s", value_parser = units::parse_duration)]
    pub io_timeout: std::time::Duration,
    /// NBD: how long a device whose process died keeps its requests for the next `map`
    /// before they fail. A ublk device keeps them until the next `map` or `unmap`.
    #[arg(long, default_value = "10m", value_parser = units::parse_duration)]
    pub dead_timeout: std::time::Duration,
    /// Streams from the volume client to each node.
    #[arg(long, default_value_t = 2, value_parser = units::count(1, 16))]
    pub streams: u32,
    #[command(flatten)]
    pub failure: FailureArgs,
}

#[derive(Debug, Subcommand)]
pub enum NvmfCmd {
    /// Serve VOLUME over NVMe/TCP (namespace 1 of subsystem
    /// nqn.2026-12.io.trireme:CLUSTER:VOLUME) on this server, for hosts with nothing of
    /// trireme installed (`nvme connect -t tcp`). Run it on two or three servers with distinct
    /// --port-id: the one that holds the volume's writer is the ANA optimized path, the others
    /// wait as inaccessible standbys and take the writer when it dies or stops. Hosts may
    /// connect if their NQN is on the volume's access list (`volume access VOL --allow NQN`).
    /// No TLS and no in-band authentication: put the port on a storage network of its own.
    Serve(NvmfServeArgs),
}

/// The cluster's name in NQNs when none is given.
pub const DEFAULT_CLUSTER: &str = "trireme";

#[derive(Debug, Args)]
pub struct NvmfServeArgs {
    pub volume: String,
    /// Address and port to listen on (4420 is NVMe/TCP's).
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// This server's port id for the volume, 1 to 15: distinct on each server that serves it
    /// (it sets the range of controller ids, which a host's multipath requires to differ).
    #[arg(long, default_value_t = 1, value_parser = units::count(1, 15))]
    pub port_id: u32,
    /// The cluster's name in the NQN: the same on every server.
    #[arg(long, default_value = DEFAULT_CLUSTER, env = "TRIREME_CLUSTER")]
    pub cluster: String,
    /// How long after this process dies a standby may take the writer.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub lease_ttl: std::time::Duration,
    /// Streams from the volume client to each node.
    #[arg(long, default_value_t = 2, value_parser = units::count(1, 16))]
    pub streams: u32,
    #[command(flatten)]
    pub failure: FailureArgs,
}

#[derive(Debug, Args)]
pub struct CsiArgs {
    /// Where to listen: unix:///PATH, the socket the CO's sidecars dial (tcp://ADDR:PORT is
    /// for tests only: it asks nobody who they are).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,
    /// Serve the controller service (one per cluster, beside the CO's provisioner,
    /// attacher, resizer and snapshotter).
    #[arg(long)]
    pub controller: bool,
    /// Serve the node service (on every host that runs pods; root).
    #[arg(long)]
    pub node: bool,
    /// This node's name in the CO (Kubernetes: the node's name); the writers it starts
    /// record it as their host. Default: the host name.
    #[arg(long, env = "TRIREME_HOST")]
    pub node_id: Option<String>,
    /// The zone this node is in, given to the CO as its topology.
    #[arg(long)]
    pub zone: Option<String>,
    /// How long a volume the CO deletes stays in the trash (default: a day; `0s` frees it
    /// at once).
    #[arg(long, value_parser = units::parse_keep)]
    pub trash_keep: Option<std::time::Duration>,
    /// Which kernel device the node service maps volumes as (`map --device`).
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
}

#[derive(Debug, Args)]
pub struct UnmapArgs {
    /// The volume, or its device (/dev/nbdN).
    pub target: String,
    /// End the device even while it is in use: a file system on it gets I/O errors.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct NbdArgs {
    pub volume: String,
    #[command(flatten)]
    pub export: ExportArgs,
    #[command(flatten)]
    pub http: HttpArgs,
}

/// Where and how a volume is served over NBD (`nbd`, `attach`).
#[derive(Debug, Args)]
#[group(required = true, multiple = true, id = "where")]
pub struct ExportArgs {
    /// Serve on a unix socket at PATH.
    #[arg(long, group = "where")]
    pub socket: Option<PathBuf>,
    /// Serve on a TCP address (e.g. 127.0.0.1:10810); TLS only unless `--insecure`.
    #[arg(long, group = "where")]
    pub listen: Option<std::net::SocketAddr>,
    /// The TCP export's TLS identity: a directory with `server-cert.pem`, `server-key.pem` and
    /// `ca-cert.pem` (`trireme ca issue server`). Default for `nbd`: `<data-dir>/tls/server`.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Serve NBD on TCP in plain text.
    #[arg(long, conflicts_with = "tls_dir")]
    pub insecure: bool,
    /// Streams from the volume client to each node.
    #[arg(long, default_value_t = 2, value_parser = units::count(1, 16))]
    pub streams: u32,
    /// Threads for the NBD frontend and volume client.
    #[arg(long, default_value_t = 1, value_parser = units::count(1, 64))]
    pub threads: u32,
    #[command(flatten)]
    pub failure: FailureArgs,
}
