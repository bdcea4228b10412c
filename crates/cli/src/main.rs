//! `trireme`: the one binary. Subcommands run a local cluster (`up`), a storage node
//! (`node serve`), an NBD export (`nbd`), and talk to a running cluster (`volume`, `node list`,
//! `status`).
//!
//! Exit codes: 0 success, 1 a runtime failure (cluster unreachable, I/O error, replicas that
//! differ), 2 bad usage or configuration (one `error:` line on stderr).

mod bench;
mod cmds;
mod progress;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "trireme",
    version,
    about = "Software-defined block storage: synchronously mirrored volumes served over NBD"
)]
pub struct Cli {
    /// Cluster directory: metadata, node stores, control and NBD sockets, logs.
    #[arg(
        long,
        global = true,
        default_value = "./trireme-data",
        env = "TRIREME_DATA_DIR"
    )]
    pub data_dir: PathBuf,
    /// Output format for commands that report.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Log filter (error, warn, info, debug, or a tracing filter).
    #[arg(long, global = true, default_value = "info", env = "TRIREME_LOG")]
    pub log: String,
    /// Data-path transport: `auto` uses UCX (RDMA where the hardware has it, else shared
    /// memory or UCX's tcp) on every connection where a probe works and TCP on the rest; `tcp`
    /// never uses UCX (nodes do not offer it); `ucx` fails a connection that cannot use it.
    #[arg(long, global = true, value_enum, default_value_t = TransportArg::Auto, env = "TRIREME_TRANSPORT")]
    pub transport: TransportArg,
    /// The cluster's etcd endpoints (`HOST:PORT,...`): commands then reach the cluster of
    /// several servers through etcd (and its elected manager) instead of `--data-dir`.
    /// `https://HOST:PORT` endpoints are reached over TLS with this process's identity
    /// (`--tls-identity`, or a node's `--tls-dir`) as the client certificate.
    #[arg(long, global = true, env = "TRIREME_ETCD", value_name = "URLS")]
    pub etcd: Option<String>,
    /// The CA that issued etcd's server certificate, if not the cluster's (`ca-cert.pem` of the
    /// identity directory).
    #[arg(long, global = true, env = "TRIREME_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// This process's identity for links to nodes that serve over mutual TLS: a directory with
    /// `client-cert.pem`, `client-key.pem` and `ca-cert.pem` (`trireme ca issue client NAME`).
    /// Beside a local cluster, `<data-dir>/tls/up` is used without asking.
    #[arg(long, global = true, env = "TRIREME_TLS_IDENTITY", value_name = "DIR")]
    pub tls_identity: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

fn parse_node_transport(s: &str) -> Result<(u32, TransportArg), String> {
    let (n, t) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not N=TRANSPORT (e.g. 2=tcp)"))?;
    let n: u32 = n
        .parse()
        .map_err(|_| format!("{n:?} is not a node number"))?;
    let t = <TransportArg as ValueEnum>::from_str(t, true)
        .map_err(|_| format!("{t:?} is not a transport (auto, tcp, ucx)"))?;
    Ok((n, t))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    Auto,
    Tcp,
    Ucx,
}

impl TransportArg {
    pub fn as_str(self) -> &'static str {
        self.kind().as_str()
    }
    pub fn kind(self) -> trireme_transport::TransportKind {
        match self {
            TransportArg::Auto => trireme_transport::TransportKind::Auto,
            TransportArg::Tcp => trireme_transport::TransportKind::Tcp,
            TransportArg::Ucx => trireme_transport::TransportKind::Ucx,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
    /// Markdown tables (bench); other commands print text.
    Markdown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreArg {
    /// Discard writes, read zeros (measures the network path alone).
    Null,
    /// In RAM; lost when the node stops.
    Memory,
    /// Preallocated files with O_DIRECT; survive restarts.
    File,
    /// A fast tier (flash) and a slow tier (disk) of files; extents move between them by heat
    /// or by pin (`--fast-size`, `--slow-disk`).
    Tiered,
}

impl StoreArg {
    pub fn kind(self) -> trireme_store::StoreKind {
        match self {
            StoreArg::Null => trireme_store::StoreKind::Null,
            StoreArg::Memory => trireme_store::StoreKind::Memory,
            StoreArg::File => trireme_store::StoreKind::File,
            StoreArg::Tiered => trireme_store::StoreKind::Tiered,
        }
    }
}

/// Where a volume's extents live on tiered nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TierArg {
    Auto,
    Fast,
    Slow,
}

impl TierArg {
    pub fn policy(self) -> trireme_meta::TierPolicy {
        match self {
            TierArg::Auto => trireme_meta::TierPolicy::Auto,
            TierArg::Fast => trireme_meta::TierPolicy::Fast,
            TierArg::Slow => trireme_meta::TierPolicy::Slow,
        }
    }
}

/// What the slow tier of `--store tiered` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SlowDisk {
    /// A file behind a 7200 rpm disk model (8 ms per random I/O, 150 MB/s streaming, 2 in
    /// flight), for hosts without a spinning disk; every report says so.
    Model,
    /// The store directory's own device, unmodeled (put `slow/` on a real disk).
    Real,
}

/// The drives of a tiered node.
#[derive(Debug, Clone, Args)]
pub struct TierArgs {
    /// With `--store tiered`: bytes of the node's fast tier, shared by its replicas (`up`:
    /// default 10% of the volume; `node`: required).
    #[arg(long, value_parser = units::parse_size)]
    pub fast_size: Option<u64>,
    /// With `--store tiered`: most bytes moved between the tiers per second.
    #[arg(long, default_value = "32M", value_parser = units::parse_size)]
    pub migrate_rate: u64,
    /// With `--store tiered`: what the slow tier is.
    #[arg(long, value_enum, default_value_t = SlowDisk::Model)]
    pub slow_disk: SlowDisk,
}

impl TierArgs {
    /// The tier configuration for `store`; `default_fast` when `--fast-size` is not given.
    pub fn config(
        &self,
        store: StoreArg,
        default_fast: Option<u64>,
    ) -> Result<Option<trireme_store::TierConfig>, String> {
        if store != StoreArg::Tiered {
            if self.fast_size.is_some() {
                return Err("--fast-size needs --store tiered".into());
            }
            return Ok(None);
        }
        let fast = self
            .fast_size
            .or(default_fast)
            .ok_or("--store tiered needs --fast-size (the node's flash tier, e.g. 10G)")?;
        let extent = trireme_store::tiered::EXTENT;
        if fast < extent {
            return Err(format!(
                "--fast-size {fast} is less than one extent ({extent} bytes)"
            ));
        }
        if self.migrate_rate == 0 {
            return Err("--migrate-rate must be more than 0".into());
        }
        Ok(Some(trireme_store::TierConfig {
            fast_capacity: fast,
            disk: match self.slow_disk {
                SlowDisk::Model => Some(trireme_store::disk_model::DiskParams::HDD),
                SlowDisk::Real => None,
            },
            migrate_rate: self.migrate_rate,
            extent,
        }))
    }
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run a local cluster in the foreground: N node processes, one mirrored volume, NBD exports.
    Up(UpArgs),
    /// Storage nodes.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Volumes.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Maintenance of the cluster (`trireme up`, or on etcd with `--etcd`).
    #[command(subcommand)]
    Maintenance(MaintenanceCmd),
    /// Nodes up or down, volumes and the state of every replica.
    Status {
        /// Refresh every SECS seconds until interrupted: in place on a terminal, one JSON
        /// document per line with `--output json`.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = units::parse_duration)]
        watch: Option<std::time::Duration>,
    },
    /// Attach a volume (new epoch: older writers are fenced) and serve it over NBD.
    Nbd(NbdArgs),
    /// On a client host of a cluster on etcd: become the volume's writer (a new epoch; refused
    /// while another host holds it, unless --force) and serve it over NBD to local clients.
    Attach(AttachArgs),
    /// Measure a target with DISKSPD's flags: IOPS, latency percentiles, CPU per IO.
    Bench(Box<bench::BenchArgs>),
    /// The cluster's certificate authority: create it, issue certificates for nodes, clients
    /// and servers (`trireme up` makes its own in `<data-dir>/tls/`).
    #[command(subcommand)]
    Ca(CaCmd),
    /// etcd's own access control for the cluster (`--etcd`, with an operator's identity).
    #[command(subcommand)]
    Etcd(EtcdCmd),
}

#[derive(Debug, Subcommand)]
pub enum EtcdCmd {
    /// Set up etcd's users and roles so that each certificate writes only what its role
    /// needs (nodes: trireme's keys; clients: the records of the volumes they may attach;
    /// operators: everything), then turn etcd's access control on. Run once with an
    /// operator's identity (`--tls-identity DIR` holding `admin-*.pem`), and again after
    /// issuing certificates to new clients; changes of access lists made with an operator's
    /// identity keep it up to date by themselves.
    Rbac {
        /// A client to give an etcd user, besides those the access lists name (repeat).
        #[arg(long = "client", value_name = "NAME")]
        clients: Vec<String>,
        /// Set up the users and roles, but leave etcd's access control as it is.
        #[arg(long)]
        no_enable: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum CaCmd {
    /// Create a new CA (refused where one exists).
    Init {
        /// Where (default: `<data-dir>/tls/ca`).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Issue a certificate: writes `ca-cert.pem`, `<role>-cert.pem` and `<role>-key.pem` into
    /// `--out` (the layout qemu's tls-creds-x509 and libnbd's tls-certificates read). Issued
    /// over the files of a running process, it is picked up within seconds, no restart.
    Issue(CaIssueArgs),
    /// Put a certificate on the cluster's deny list: every process of the cluster refuses it
    /// at its next handshake (an operator's identity; `up`'s cluster through its data
    /// directory).
    Revoke {
        /// The certificate's PEM file (`<role>-cert.pem`).
        cert: PathBuf,
    },
    /// The cluster's deny list.
    Revoked,
}

#[derive(Debug, Args)]
pub struct CaIssueArgs {
    #[command(subcommand)]
    pub role: CaRole,
    /// The CA's directory (default: `<data-dir>/tls/ca`).
    #[arg(long, value_name = "DIR", global = true)]
    pub ca: Option<PathBuf>,
    /// Where to write the certificate and key.
    #[arg(long, value_name = "DIR", global = true)]
    pub out: Option<PathBuf>,
    /// A DNS name or IP address the holder serves at (repeat for several).
    #[arg(long = "san", value_name = "NAME", global = true)]
    pub sans: Vec<String>,
    /// How long the certificate is valid, in days (re-issue it in place before then).
    #[arg(long, default_value_t = trireme_tls::LEAF_DAYS, value_parser = clap::value_parser!(i64).range(1..=3650), global = true)]
    pub days: i64,
}

#[derive(Debug, Subcommand)]
pub enum CaRole {
    /// For node N's daemon (serves writers, connects to other nodes).
    Node {
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        id: u32,
    },
    /// For a client host, a remote CLI or an NBD client, named NAME (what access lists hold).
    Client { name: String },
    /// For a TLS server that is not a node (an NBD export on a client host).
    Server,
    /// For an operator: every node operation on every volume (what `trireme up`'s manager
    /// holds). Keep it off client hosts.
    Admin,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    /// Number of storage node processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=7))]
    pub nodes: u32,
    /// Copies of the volume, each on a different node.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=3))]
    pub replicas: u32,
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
    /// Name of the volume to create and export.
    #[arg(long, default_value = "vol0")]
    pub volume: String,
    /// Streams from the volume client to each node.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub streams: u32,
    /// Threads for the NBD frontend and volume client (1 is cheapest per IO on small hosts).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    #[command(flatten)]
    pub failure: FailureArgs,
    /// Granularity of the regions replicas track for a peer that is out.
    #[arg(long, default_value = "4K", value_parser = units::parse_dirty_grain)]
    pub dirty_grain: u64,
    /// Most bytes each node's replicas may hold together (see `node serve --capacity`).
    #[arg(long, value_parser = units::parse_size)]
    pub node_capacity: Option<u64>,
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
    /// Let a drained (or draining) node take new replicas again.
    Undrain { id: u32 },
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
    /// Most bytes this node's replicas may hold together (sizes summed); creating one past it
    /// is refused. Default: half the host's memory for `--store memory`, the file system's
    /// size for `--store file`.
    #[arg(long, value_parser = units::parse_size)]
    pub capacity: Option<u64>,
}

#[derive(Debug, Args)]
pub struct NodeRunArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    /// Most bytes this node's replicas may hold together (as `node serve --capacity`).
    #[arg(long, value_parser = units::parse_size)]
    pub capacity: Option<u64>,
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

#[derive(Debug, Subcommand)]
pub enum TrashCmd {
    /// The volumes in the trash, oldest deletion first, with when each is purged.
    List,
    /// Put a deleted volume back under its name, byte for byte (NAME: its name, for its
    /// newest deletion, or its id from `trash list`).
    Restore { name: String },
    /// Free a deleted volume's replicas now, for good (NAME as for restore); `--expired`:
    /// every one whose time is up.
    Purge {
        #[arg(required_unless_present = "expired")]
        name: Option<String>,
        #[arg(long, conflicts_with = "name")]
        expired: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Create a volume mirrored on REPLICAS nodes.
    Create {
        name: String,
        #[arg(long, value_parser = units::parse_size)]
        size: u64,
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=3))]
        replicas: u32,
        /// A client identity (the NAME of `trireme ca issue client NAME`) that may attach the
        /// volume and reach its replicas; repeat for several. Default: every client of the
        /// cluster (`*`). Nodes and operators always may.
        #[arg(long, value_name = "NAME")]
        allow: Vec<String>,
        /// Fewest in-sync copies writes go on with: with fewer, writes wait (not failed, not
        /// acknowledged) until a copy is back in sync. Default: one fewer than the replicas
        /// (2 of 3, 1 of 2).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=3))]
        min_copies: Option<u32>,
        /// On nodes with `--store tiered`: `auto` (hot extents on the fast tier, by heat),
        /// `fast` (every extent on flash; refused if a node's fast tier cannot hold it) or
        /// `slow`.
        #[arg(long, value_enum, default_value_t = TierArg::Auto)]
        tier: TierArg,
    },
    /// Change a volume's settings (one or more of them).
    Set {
        name: String,
        /// Fewest in-sync copies writes go on with (1 to the number of replicas). Lowering it
        /// lets writes suspended for want of copies go on.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=3))]
        min_copies: Option<u32>,
        /// Move every extent to a tier (`fast`, `slow`; within the migration rate) or let heat
        /// place them (`auto`). A pin to fast reserves the room, and is refused if it does not
        /// fit.
        #[arg(long, value_enum)]
        tier: Option<TierArg>,
    },
    /// Change who may use a volume: add client identities to its access list, take others
    /// off. Links a removed client already has stay up until they close.
    Access {
        name: String,
        /// Add NAME (`*`: every client of the cluster); repeat for several.
        #[arg(long, value_name = "NAME")]
        allow: Vec<String>,
        /// Take NAME off; repeat for several.
        #[arg(long, value_name = "NAME")]
        deny: Vec<String>,
    },
    /// List volumes.
    List,
    /// Show one volume.
    Info { name: String },
    /// Delete a volume: it goes to the trash (its replicas kept) and can be restored until
    /// its time there is up. Refused while the volume is attached (the message says by whom).
    Delete {
        name: String,
        /// Delete it even though a writer holds it: the writer is fenced first (its I/O fails
        /// from then on).
        #[arg(long)]
        force: bool,
        /// How long it stays in the trash before its replicas are freed: `0`, or e.g. `30m`,
        /// `12h`, `7d`.
        #[arg(long, default_value = "1d", value_parser = units::parse_keep)]
        keep: std::time::Duration,
    },
    /// Deleted volumes: list them, restore one, or free their replicas now.
    #[command(subcommand)]
    Trash(TrashCmd),
    /// Compare the replicas of the volume `trireme up` serves and repair regions that differ
    /// from the copy a majority holds (online, region by region). Exit 1 if a region has no
    /// majority (two copies that differ).
    Scrub {
        name: String,
        /// Bytes per compared region.
        #[arg(long, default_value = "1M", value_parser = units::parse_size)]
        region: u64,
    },
    /// Compare the replicas of a volume by checksum; exit 1 if any region differs.
    Verify {
        name: String,
        /// Bytes per compared region.
        #[arg(long, default_value = "4M", value_parser = units::parse_size)]
        region: u64,
    },
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
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub streams: u32,
    /// Threads for the NBD frontend and volume client.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    #[command(flatten)]
    pub failure: FailureArgs,
}

/// A failure, and whether it was the user's input (exit 2) or the system (exit 1).
#[derive(Debug)]
pub enum CliError {
    Usage(String),
    Runtime(String),
}

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError::Runtime(e.to_string())
    }
}

/// Keeps glibc from returning heap to the kernel after every burst of I/O buffers and taking it
/// back (a `brk` and a page fault per few requests on the data path). Buffers up to 64 MiB come
/// from the heap and are reused; at most 512 MiB of free heap is kept.
fn tune_allocator() {
    // SAFETY: mallopt only adjusts allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

fn main() -> ExitCode {
    // Everything this process creates is its owner's alone: replicas, their bookkeeping, the
    // metadata file, logs. The store and the TLS files set their modes themselves too.
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail.
    unsafe { libc::umask(0o077) };
    // Connections are bounded by each port's caps, not by systemd's soft limit of 1024
    // descriptors; what cannot be raised is lived with (accepts back off on EMFILE).
    let _ = trireme_net::limits::raise_nofile();
    tune_allocator();
    // DISKSPD spells hot zones `-rdpct90/10`, which reads as `-r` with a value: say it long.
    let args = std::env::args_os().map(|a| match a.to_str() {
        Some(s) if s.starts_with("-rdpct") => format!("--rdpct={}", &s[6..]).into(),
        _ => a,
    });
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::*;
            if matches!(
                e.kind(),
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            // One clear line, not a page of usage.
            // The first paragraph of clap's message, folded onto one line.
            let msg = e.to_string();
            let first: Vec<&str> = msg
                .lines()
                .map(str::trim)
                .skip_while(|l| l.is_empty())
                .take_while(|l| !l.is_empty())
                .collect();
            eprintln!("{} (see trireme --help)", first.join(" "));
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log);
    let Ok(filter) = filter else {
        eprintln!("error: invalid --log filter {:?}", cli.log);
        return ExitCode::from(2);
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match cmds::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m)) => {
            eprintln!("error: {m}");
            ExitCode::from(2)
        }
        Err(CliError::Runtime(m)) => {
            eprintln!("error: {m}");
            ExitCode::from(1)
        }
    }
}
