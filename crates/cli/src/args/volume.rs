//! `trireme volume` and its subcommands: snapshots, the trash, settings and limits.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::*;

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Take snapshot NAME of VOLUME, online: crash-consistent across its copies (every write
    /// answered before the command is in it, none started after it returned). Writes pause
    /// only while the copies in sync record it. Read it with `trireme nbd VOLUME@NAME`.
    Create { volume: String, name: String },
    /// VOLUME's snapshots, oldest first: when each was taken, where, and the bytes only it
    /// holds (what deleting it frees).
    List { volume: String },
    /// Delete snapshot NAME of VOLUME from every copy, freeing the blocks only it held.
    /// Refused while an export (`trireme nbd VOLUME@NAME`) serves it, naming the export.
    Delete {
        volume: String,
        name: String,
        /// Delete it even though an export serves it: its reads fail from then on.
        #[arg(long)]
        force: bool,
    },
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

/// A volume's I/O limits, kept by its writer whatever the protocol or the number of
/// connections (`volume create`, `volume set`). Each takes `none` to remove it.
#[derive(Debug, Clone, Default, Args)]
pub struct LimitArgs {
    /// Most IOPS, reads and writes together, counted in 8 KiB units as S2D's Storage QoS (a
    /// 64 KiB request counts 8): e.g. 5000 or 20k.
    #[arg(long, value_name = "IOPS", value_parser = units::parse_iops_limit, allow_hyphen_values = true)]
    pub iops_limit: Option<trireme_control::Rate>,
    /// Most read IOPS (8 KiB units).
    #[arg(long, value_name = "IOPS", value_parser = units::parse_iops_limit, allow_hyphen_values = true)]
    pub read_iops_limit: Option<trireme_control::Rate>,
    /// Most write IOPS (8 KiB units; a zeroing or trim counts 1).
    #[arg(long, value_name = "IOPS", value_parser = units::parse_iops_limit, allow_hyphen_values = true)]
    pub write_iops_limit: Option<trireme_control::Rate>,
    /// Most bytes a second, reads and writes together: e.g. 100M (MiB/s) or 100MB/s.
    #[arg(long, value_name = "RATE", value_parser = units::parse_bps_limit, allow_hyphen_values = true)]
    pub bps_limit: Option<trireme_control::Rate>,
    /// Most bytes read a second.
    #[arg(long, value_name = "RATE", value_parser = units::parse_bps_limit, allow_hyphen_values = true)]
    pub read_bps_limit: Option<trireme_control::Rate>,
    /// Most bytes written a second.
    #[arg(long, value_name = "RATE", value_parser = units::parse_bps_limit, allow_hyphen_values = true)]
    pub write_bps_limit: Option<trireme_control::Rate>,
    /// How long an idle volume may run above its limits: it saves up at most this much of
    /// each (e.g. 500ms, 2s; at most 1h). Default 0: never above them.
    #[arg(long, value_name = "DURATION", value_parser = units::parse_burst)]
    pub burst: Option<u32>,
    /// IOPS (8 KiB units) the volume gets of its nodes when they are busy, whatever the other
    /// volumes do; at most its --iops-limit. `none` removes it.
    #[arg(long, value_name = "IOPS", value_parser = units::parse_iops_limit, allow_hyphen_values = true)]
    pub iops_reserve: Option<trireme_control::Rate>,
    /// Its part of busy nodes against the other volumes' (1 to 1000; default 1): with weight
    /// 3 it gets three times what a volume of weight 1 gets, past the reserves.
    #[arg(long, value_name = "N", value_parser = units::parse_weight, allow_hyphen_values = true)]
    pub weight: Option<trireme_control::Rate>,
}

impl LimitArgs {
    /// The change these flags ask for.
    pub fn change(&self) -> trireme_control::LimitsChange {
        trireme_control::LimitsChange {
            iops: self.iops_limit,
            read_iops: self.read_iops_limit,
            write_iops: self.write_iops_limit,
            bps: self.bps_limit,
            read_bps: self.read_bps_limit,
            write_bps: self.write_bps_limit,
            burst_ms: self.burst,
            iops_reserve: self.iops_reserve,
            weight: self.weight,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Create a volume mirrored on REPLICAS nodes.
    Create {
        name: String,
        #[arg(long, value_parser = units::parse_size)]
        size: u64,
        /// Copies, each on its own node (1 to 3). Default: 3, or as many as the cluster has
        /// nodes that take replicas if that is fewer (the output says how many).
        #[arg(long, value_parser = units::count(1, 3))]
        replicas: Option<u32>,
        /// A client identity (the NAME of `trireme ca issue client NAME`) that may attach the
        /// volume and reach its replicas; repeat for several. Default: every client of the
        /// cluster (`*`). Nodes and operators always may.
        #[arg(long, value_name = "NAME")]
        allow: Vec<String>,
        /// Fewest in-sync copies writes go on with: with fewer, writes wait (not failed, not
        /// acknowledged) until a copy is back in sync. Default: one fewer than the replicas
        /// (2 of 3, 1 of 2). Parity: of a region's M+1 mirrored copies (default M).
        #[arg(long, value_name = "N", value_parser = units::count(1, 4))]
        min_copies: Option<u32>,
        /// On nodes with `--store tiered`: `auto` (hot extents on the fast tier, by heat),
        /// `fast` (every extent on flash; refused if a node's fast tier cannot hold it) or
        /// `slow`.
        #[arg(long, value_enum, default_value_t = TierArg::Auto)]
        tier: TierArg,
        /// Thick: every copy reserves the volume's whole size on its node now (refused if a
        /// file system cannot). Default: thin, space is taken as blocks are written.
        #[arg(long)]
        preallocate: bool,
        /// Parity instead of a mirror: K data and M parity chunks per stripe on K+M nodes
        /// (e.g. `2+1` on 3, `4+2` on 6), surviving M lost nodes. Hot writes land on M+1
        /// mirrored copies of a share of the volume; cold regions are encoded in the
        /// background.
        #[arg(long, value_name = "K+M", conflicts_with_all = ["replicas", "preallocate"])]
        parity: Option<String>,
        /// The share of a parity volume kept mirrored for hot writes, in percent (1 to 99;
        /// default 20).
        #[arg(long, value_name = "PERCENT", requires = "parity", value_parser = units::count(1, 99))]
        mirror_share: Option<u32>,
        #[command(flatten)]
        limits: LimitArgs,
        /// Put it under a QoS policy (`trireme qos policy create`): the policy's limits and
        /// its own both hold.
        #[arg(long, value_name = "POLICY")]
        qos_policy: Option<String>,
    },
    /// Grow a volume, online: its writer gives every copy the new size while I/O pauses a
    /// moment. New NBD connections see the new size; connected clients see it when they
    /// reconnect (NBD has no way to tell them). Shrinking drops the bytes past the new end:
    /// refused unless `--allow-shrink`, and only while nobody is attached.
    Resize {
        name: String,
        /// The new size (K/M/G/T: powers of 1024; KB/MB/GB/TB: of 1000), a multiple of 4K.
        #[arg(value_parser = units::parse_size)]
        size: u64,
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Change a volume's settings (one or more of them).
    Set {
        name: String,
        /// Fewest in-sync copies writes go on with (1 to the number of replicas; for a parity
        /// volume, of a region's M+1 mirrored copies, default M). Lowering it lets writes
        /// suspended for want of copies go on.
        #[arg(long, value_name = "N", value_parser = units::count(1, 4))]
        min_copies: Option<u32>,
        /// Move every extent to a tier (`fast`, `slow`; within the migration rate) or let heat
        /// place them (`auto`). A pin to fast reserves the room, and is refused if it does not
        /// fit.
        #[arg(long, value_enum)]
        tier: Option<TierArg>,
        /// Kept from the next request on, attached or not (within a second).
        #[command(flatten)]
        limits: LimitArgs,
        /// Put it under a QoS policy (`trireme qos policy create`), or `none`: off its policy.
        /// The policy's limits and the volume's own both hold (the lower of each); its own
        /// reserve and weight, if set, take the place of the policy's.
        #[arg(long, value_name = "POLICY")]
        qos_policy: Option<String>,
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
    /// Snapshots of a volume: take one, list them, delete one.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Make NAME, a new volume holding what snapshot VOLUME@SNAPSHOT holds, at once whatever
    /// its size: it shares the snapshot's blocks until it writes them, on the nodes that hold
    /// the snapshot, with VOLUME's access list. The snapshot (and VOLUME) cannot be deleted
    /// while a clone reads from it: `volume flatten NAME` makes the clone independent.
    Clone {
        #[arg(value_name = "VOLUME@SNAPSHOT")]
        snapshot: String,
        name: String,
    },
    /// Copy every block clone NAME still shares with its parent's snapshot into it, with I/O
    /// going on; then the snapshot may be deleted.
    Flatten { name: String },
    /// Make VOLUME hold what its snapshot NAME holds, on every copy (the snapshot stays; what
    /// was written since is gone). Refused while the volume is attached, unless `--force`,
    /// which fences its writer first; refused while a copy is out of sync.
    Rollback {
        volume: String,
        name: String,
        #[arg(long)]
        force: bool,
    },
    /// Write the blocks that changed between two snapshots as a diff file in Ceph's
    /// `rbd export-diff` format, which `rbd import-diff` and `trireme volume import-diff`
    /// apply. Give only VOLUME@TO for the whole snapshot. Reads only the changed blocks, from
    /// the copies that hold the snapshots; the writer is not disturbed.
    Diff {
        /// `VOLUME@FROM VOLUME@TO`, or `VOLUME@TO` alone.
        #[arg(num_args = 1..=2, required = true, value_name = "VOLUME@SNAPSHOT")]
        snapshots: Vec<String>,
        /// Where to write it (`-`: standard output).
        #[arg(short = 'o', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// The stream's version: 1 is what `rbd export-diff` writes and the only one `rbd
        /// import-diff` reads; 2 has a length after each tag, as inside `rbd export
        /// --export-format 2`.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        export_format: u8,
    },
    /// Apply a diff file (`rbd export-diff` v1 or v2, from Ceph or from `trireme volume
    /// diff`) to VOLUME through a writer of its own: refused if it starts from a snapshot
    /// VOLUME does not have. VOLUME first takes the size of the image the diff ends at (grown
    /// or shrunk), and then the snapshot the diff ends at, as `rbd import-diff` does.
    ImportDiff {
        /// The diff. A file is read whole first, so a damaged one changes nothing; `-`
        /// (standard input) is applied as it streams in.
        file: PathBuf,
        volume: String,
        /// Fence the volume's writer if one is attached.
        #[arg(long)]
        force: bool,
    },
    /// Back VOLUME up into DIR: takes a snapshot, and writes the blocks changed since the
    /// last backup in DIR (the first, or with `--full`: every allocated block), with a
    /// progress line. The newest backup's snapshot stays on the volume, the base of the next.
    Backup {
        volume: String,
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// A full backup even if DIR has one to build on.
        #[arg(long)]
        full: bool,
    },
    /// Restore a backup from DIR as a new volume NAME: its chain of backups applied from the
    /// full one, each file's checksum checked first.
    Restore {
        dir: PathBuf,
        name: String,
        /// Which backup (its snapshot's name); the newest if not given.
        #[arg(long, value_name = "SNAPSHOT")]
        at: Option<String>,
        /// Copies, as for `volume create`.
        #[arg(long, value_parser = units::count(1, 3))]
        replicas: Option<u32>,
    },
    /// Compare the replicas of a volume and repair regions that differ from the copy a
    /// majority holds (online, region by region), through its writer, or a writer of the
    /// manager's own if nobody writes it. Exit 1 if a region has no majority (two copies
    /// that differ). The manager also scrubs every volume by itself (`--scrub-interval`).
    Scrub {
        name: String,
        /// Bytes per compared region.
        #[arg(long, default_value = "1M", value_parser = units::parse_size)]
        region: u64,
        /// Most bytes compared per second (e.g. 100M); as fast as it goes if not given.
        #[arg(long, value_parser = units::parse_size)]
        rate: Option<u64>,
    },
    /// Compare the replicas of a volume by checksum; exit 1 if any region differs.
    Verify {
        name: String,
        /// Bytes per compared region.
        #[arg(long, default_value = "4M", value_parser = units::parse_size)]
        region: u64,
    },
}

/// `trireme qos`: quality of service shared by several volumes.
#[derive(Debug, Subcommand)]
pub enum QosCmd {
    /// Policies: limits, a reserve and a weight for several volumes, as S2D's Storage QoS.
    #[command(subcommand)]
    Policy(PolicyCmd),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Create policy NAME. Dedicated (the default): each volume under it keeps its limits
    /// whole. `--aggregated`: its volumes keep them together, each getting a share by demand
    /// (the manager moves the shares every second).
    Create {
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
        #[arg(long)]
        aggregated: bool,
    },
    /// Change policy NAME's limits: its volumes keep the new ones within a second.
    Set {
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Delete policy NAME; refused while volumes are under it (the message names them).
    Delete { name: String },
    /// The policies, each with its volumes and what each keeps now.
    List,
}
