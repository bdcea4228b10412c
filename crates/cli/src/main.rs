//! `trireme`: the one binary. Subcommands run a local cluster (`up`), a storage node
//! (`node serve`), an NBD export (`nbd`), and talk to a running cluster (`volume`, `node list`,
//! `status`).
//!
//! Exit codes: 0 success, 1 a runtime failure (cluster unreachable, I/O error, replicas that
//! differ), 2 bad usage or configuration (one `error:` line on stderr).

mod args;
mod bench;
mod cmds;
mod progress;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use args::*;

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
        help_heading = "Global options",
        default_value = "./trireme-data",
        env = "TRIREME_DATA_DIR"
    )]
    pub data_dir: PathBuf,
    /// Output format for commands that report.
    #[arg(long, global = true, help_heading = "Global options", value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Log filter (error, warn, info, debug, or a tracing filter).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        default_value = "info",
        env = "TRIREME_LOG"
    )]
    pub log: String,
    /// Data-path transport: `auto` uses UCX where it reaches the node over RDMA (or shared
    /// memory, on one host) and a probe works, and TCP on the rest (UCX's own tcp lanes, which
    /// carry no TLS, only if `TRIREME_UCX_TLS` asks for them); `tcp` never uses UCX (nodes do
    /// not offer it); `ucx` fails a connection that cannot use it.
    #[arg(long, global = true, help_heading = "Global options", value_enum, default_value_t = TransportArg::Auto, env = "TRIREME_TRANSPORT")]
    pub transport: TransportArg,
    /// The cluster's etcd endpoints (`HOST:PORT,...`): commands then reach the cluster of
    /// several servers through etcd (and its elected manager) instead of `--data-dir`.
    /// `https://HOST:PORT` endpoints are reached over TLS with this process's identity
    /// (`--tls-identity`, or a node's `--tls-dir`) as the client certificate.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "TRIREME_ETCD",
        value_name = "URLS"
    )]
    pub etcd: Option<String>,
    /// The CA that issued etcd's server certificate, if not the cluster's (`ca-cert.pem` of the
    /// identity directory).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "TRIREME_ETCD_CA",
        value_name = "FILE"
    )]
    pub etcd_ca: Option<PathBuf>,
    /// This process's identity for links to nodes that serve over mutual TLS: a directory with
    /// `client-cert.pem`, `client-key.pem` and `ca-cert.pem` (`trireme ca issue client NAME`).
    /// Beside a local cluster, `<data-dir>/tls/up` is used without asking.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "TRIREME_TLS_IDENTITY",
        value_name = "DIR"
    )]
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
    /// Files with O_DIRECT, thin (space taken as written; `--preallocate` reserves it all);
    /// survive restarts.
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
    /// Quality of service: policies of limits shared by several volumes.
    #[command(subcommand)]
    Qos(QosCmd),
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
    /// Space, per node and in total: each node's capacity and over-commit limit, what the
    /// volumes provision and what they hold (thin volumes take space as they are written),
    /// each file system's free space, the room left for a new volume; then each volume.
    Pool,
    /// What changed in the cluster, oldest first: nodes down and up, replicas taken out and
    /// resynced, health words, drains, the manager role moving. Kept in the cluster's metadata
    /// (the newest 200), so they outlive the manager that saw them.
    Events {
        /// Only the last N.
        #[arg(long, short = 'n', value_name = "N")]
        last: Option<usize>,
    },
    /// Attach a volume (new epoch: older writers are fenced) and serve it over NBD; or serve
    /// a snapshot, VOLUME@NAME, read-only (the volume's writer is not touched).
    Nbd(NbdArgs),
    /// On a client host of a cluster on etcd: become the volume's writer (a new epoch; refused
    /// while another host holds it, unless --force) and serve it over NBD to local clients.
    Attach(AttachArgs),
    /// Become the volume's writer (a new epoch, as `attach`) and give this host a block
    /// device for it (Linux, root): `/dev/nbdN` through the kernel's NBD client. The process
    /// serves the device; kill it and `map` again, and the same device goes on, its queued
    /// requests with it. `unmap` ends the device. VOLUME@NAME maps snapshot NAME read-only.
    Map(MapArgs),
    /// NVMe over TCP exports: a volume for hosts that run nothing of trireme, with ANA
    /// multipath across servers.
    #[command(subcommand)]
    Nvmf(NvmfCmd),
    /// Flush and end a device `map` made (VOLUME or /dev/nbdN); refused while it is in use (a
    /// mounted file system) unless --force.
    Unmap(UnmapArgs),
    /// The block devices this host has mapped.
    #[command(subcommand)]
    Device(DeviceCmd),
    /// Serve the CSI driver (Kubernetes, or any CO speaking CSI 1.12) on a unix socket: the
    /// controller (volumes, snapshots, clones, expansion, publishing) with an operator's
    /// identity, and/or the node service (map, mkfs, mount) on each host that runs pods.
    Csi(CsiArgs),
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
pub enum DeviceCmd {
    /// Each mapped device: its volume, path, kind and why, and the process serving it.
    List,
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
        /// Nodes to give an etcd user each (`--node 1,2,3`; repeat or list), besides the
        /// members already recorded: servers not started yet, or a node given a new
        /// certificate after `ca revoke`. Removed nodes and revoked ones not named lose theirs.
        #[arg(long = "node", value_name = "ID", value_delimiter = ',')]
        nodes: Vec<u32>,
        /// Set up the users and roles, but leave etcd's access control as it is.
        #[arg(long)]
        no_enable: bool,
        /// Delete the etcd user `trireme node` that node certificates of older releases share
        /// (after every node has a certificate of its own).
        #[arg(long)]
        drop_shared_node_user: bool,
        /// The nodes that may hold the manager role (`--managers 1,2,3`, or `all`, the
        /// default). The others write only their own liveness key and record in etcd. Kept
        /// in etcd: later runs follow it until changed.
        #[arg(long, value_name = "IDS|all")]
        managers: Option<String>,
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
    /// directory). With the CA at hand, its serial also goes on the CA's `crl.pem`, for
    /// etcd's `--client-crl-file`; a node's certificate also loses its etcd user.
    Revoke {
        /// The certificate's PEM file (`<role>-cert.pem`).
        cert: PathBuf,
        /// The CA that issued it (default: `<data-dir>/tls/ca` where there is one).
        #[arg(long, value_name = "DIR")]
        ca: Option<PathBuf>,
    },
    /// Write the CA's revocation list, `crl.pem` (empty until `ca revoke`), for etcd's
    /// `--client-crl-file`: for a CA made before `ca init` wrote one.
    Crl {
        /// The CA (default: `<data-dir>/tls/ca`).
        #[arg(long, value_name = "DIR")]
        ca: Option<PathBuf>,
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
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .map(|a| match a.to_str() {
            Some(s) if s.starts_with("-rdpct") => format!("--rdpct={}", &s[6..]).into(),
            _ => a,
        })
        .collect();
    let log_asked = std::env::var_os("TRIREME_LOG").is_some()
        || args.iter().any(|a| {
            a.to_str()
                .is_some_and(|s| s == "--log" || s.starts_with("--log="))
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
            // And clap's tips (a similar command or flag), as "did you mean".
            let tips: Vec<String> = msg
                .lines()
                .filter_map(|l| l.trim().strip_prefix("tip: "))
                .map(|t| {
                    t.replace("a similar subcommand exists: ", "did you mean ")
                        .replace("a similar argument exists: ", "did you mean ")
                        .replace("some similar subcommands exist: ", "did you mean one of ")
                        .replace("some similar arguments exist: ", "did you mean one of ")
                })
                .collect();
            let tips = match tips.is_empty() {
                true => String::new(),
                false => format!("; {}?", tips.join("; ")),
            };
            eprintln!("{}{tips} (see trireme --help)", first.join(" "));
            return ExitCode::from(2);
        }
    };
    // rustls warns of peers' harmless quirks (an NBD client that sends its server's IP address
    // as SNI, as qemu and libnbd do: "Illegal SNI extension"); a handshake that fails is
    // reported by trireme itself. Unless the filter names rustls, only its errors show.
    // A command that runs a writer for a moment and reports what it did (backup, restore,
    // diffs) says only warnings from the writer unless asked: its links and attach are noise
    // on an operator's terminal.
    let quiet = matches!(
        &cli.cmd,
        Cmd::Volume(
            VolumeCmd::Backup { .. }
                | VolumeCmd::Restore { .. }
                | VolumeCmd::Diff { .. }
                | VolumeCmd::ImportDiff { .. }
        )
    );
    let level = match (quiet, log_asked) {
        (true, false) => "warn".to_string(),
        _ => cli.log.clone(),
    };
    let spec = match level.contains("rustls") {
        true => level.clone(),
        false => format!("{level},rustls=error"),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&spec);
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
