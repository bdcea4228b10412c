//! `trireme bench`: DISKSPD's flags over the bench engine.

use std::path::Path;

use clap::{Args, ValueEnum};
use trireme_bench::compare::CompareOptions;
use trireme_bench::profile::{Buffers, Pattern, Profile};
use trireme_bench::sweep::Sweep;
use trireme_bench::target::Target;
use trireme_bench::{Format, SuiteError};

use crate::units::parse_size;
use crate::{Cli, CliError, Output};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileName {
    /// The Storage Spaces Direct table's workload: -b4K -r -w30 -t10 -o4.
    S2d,
}

/// Short options take their value attached, as in DISKSPD: `-b4K -w30 -t10 -o4 -d30 -W5 -Zr`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to drive: `null`, `volume:NAME` (native client), `nbd://HOST[:PORT]/NAME`,
    /// `nbd+unix:///NAME?socket=PATH`, or a file or block device path.
    #[arg(required_unless_present = "compare")]
    pub target: Option<String>,
    /// Start from a preset; other flags override it.
    #[arg(long, value_enum)]
    pub profile: Option<ProfileName>,
    /// Block size (default 64K, or the preset's).
    #[arg(short = 'b', long = "block-size", value_parser = parse_size)]
    pub block_size: Option<u64>,
    /// Random I/O, aligned to ALIGN bytes (default: the block size).
    #[arg(short = 'r', long = "random", num_args = 0..=1, default_missing_value = "0", value_parser = parse_size, value_name = "ALIGN")]
    pub random: Option<u64>,
    /// DISKSPD's hot zones, `-rdpct90/10` (or `--rdpct 90/10`): 90% of the I/O to the first
    /// 10% of the target, the rest to the rest; `80/10:15/20` for more zones. Implies `-r`.
    #[arg(
        long = "rdpct",
        value_name = "IO%/TARGET%",
        conflicts_with = "sequential"
    )]
    pub rdpct: Option<String>,
    /// Sequential I/O (the default without a preset).
    #[arg(short = 's', long = "sequential", conflicts_with = "random")]
    pub sequential: bool,
    /// Percentage of writes.
    #[arg(short = 'w', long = "write", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub write_pct: Option<u32>,
    /// Threads.
    #[arg(short = 't', long = "threads", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// Outstanding I/Os per thread.
    #[arg(short = 'o', long = "outstanding", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub outstanding: Option<u32>,
    /// Measured seconds (default 10).
    #[arg(short = 'd', long = "duration", value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub duration: Option<u64>,
    /// Warm-up seconds, not measured (default 5 with a preset, else 0).
    #[arg(short = 'W', long = "warmup", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub warmup: Option<u64>,
    /// Cool-down seconds, not measured.
    #[arg(short = 'C', long = "cooldown", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub cooldown: Option<u64>,
    /// Create the file target with this size if it is missing or smaller; for `null`, its size.
    #[arg(short = 'c', long = "create", value_parser = parse_size)]
    pub create: Option<u64>,
    /// Latency statistics (always on; accepted for DISKSPD compatibility).
    #[arg(short = 'L', long = "latency")]
    pub latency: bool,
    /// Write buffers: `-Z` zeros, `-Zr` random bytes for every write (default: a fixed pattern).
    #[arg(short = 'Z', long = "buffers", num_args = 0..=1, default_missing_value = "zero", value_name = "r")]
    pub buffers: Option<String>,
    /// Seed of every random choice (offsets, read/write mix, random buffers).
    #[arg(short = 'z', long = "seed", num_args = 0..=1, default_missing_value = "0")]
    pub seed: Option<u64>,
    /// Use only the first SIZE bytes of the target.
    #[arg(long, value_parser = parse_size)]
    pub span: Option<u64>,
    /// Run the profile once per value of one axis and print the seed's table:
    /// `target=A,B`, `replicas=1,2,3`, `store=null,memory,file` (or `transport=...`).
    #[arg(long, value_name = "AXIS=V1,V2")]
    pub compare: Option<String>,
    /// Run the profile for every combination of `qd=1,2,4,...` and `bs=4K,64K,...` and draw
    /// IOPS vs io-depth, bandwidth vs block size and a latency CDF (SVG and PNG).
    #[arg(long, num_args = 1..=2, value_name = "qd=..|bs=..", conflicts_with = "compare")]
    pub sweep: Vec<String>,
    /// Where --sweep writes its charts.
    #[arg(long, default_value = "bench-charts")]
    pub chart_dir: std::path::PathBuf,
    /// Interleaved rounds for --compare; the table shows medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// Write self-describing blocks, check every read, and re-read everything written at the
    /// end; exit 1 if any block is lost, stale or corrupt.
    #[arg(long)]
    pub verify: bool,
    /// Processes whose CPU counts as storage (default for volume:/NBD targets of a local
    /// cluster: the pids in <data-dir>/pids).
    #[arg(long = "storage-pid")]
    pub storage_pids: Vec<u32>,
}

impl BenchArgs {
    pub fn to_profile(&self) -> Result<Profile, String> {
        let preset = self.profile.is_some();
        let mut p = match self.profile {
            Some(ProfileName::S2d) => Profile::s2d(),
            None => Profile {
                block_size: 64 * 1024,
                write_pct: 0,
                threads: 1,
                outstanding: 2,
                pattern: Pattern::Sequential,
                duration_s: 10,
                warmup_s: 0,
                cooldown_s: 0,
                buffers: Buffers::Pattern,
                seed: 0,
                span: 0,
                verify: false,
                hot: None,
            },
        };
        if let Some(b) = self.block_size {
            p.block_size = b;
        }
        if let Some(z) = &self.rdpct {
            p.hot = Some(trireme_bench::profile::HotZones::parse(z)?);
        }
        if let Some(a) = self.random {
            p.pattern = Pattern::Random {
                align: if a == 0 { p.block_size } else { a },
            };
        } else if p.hot.is_some() {
            p.pattern = Pattern::Random {
                align: p.block_size,
            };
        } else if let Pattern::Random { .. } = p.pattern {
            p.pattern = Pattern::Random {
                align: p.block_size,
            };
        }
        if self.sequential {
            p.pattern = Pattern::Sequential;
        }
        p.write_pct = self.write_pct.unwrap_or(p.write_pct);
        p.threads = self.threads.unwrap_or(p.threads);
        p.outstanding = self.outstanding.unwrap_or(p.outstanding);
        p.duration_s = self
            .duration
            .unwrap_or(if preset { p.duration_s } else { 10 });
        p.warmup_s = self.warmup.unwrap_or(p.warmup_s);
        p.cooldown_s = self.cooldown.unwrap_or(p.cooldown_s);
        p.seed = self.seed.unwrap_or(p.seed);
        p.span = self.span.unwrap_or(0);
        p.verify = self.verify;
        p.buffers = match self.buffers.as_deref() {
            None => p.buffers,
            Some("zero") => Buffers::Zero,
            Some("r") => Buffers::Random,
            Some(other) => {
                return Err(format!(
                    "-Z takes no value (zeros) or r (random), not {other:?}"
                ))
            }
        };
        if p.threads as u64 * p.outstanding as u64 > 4096 {
            return Err("threads x outstanding must be at most 4096".into());
        }
        Ok(p)
    }
}

fn storage_pids(a: &BenchArgs, data_dir: &Path) -> Vec<u32> {
    if !a.storage_pids.is_empty() {
        return a.storage_pids.clone();
    }
    let t = a.target.as_deref().unwrap_or("");
    let cluster_target = t.starts_with("volume:") || t.starts_with("nbd");
    if !cluster_target {
        return Vec::new();
    }
    std::fs::read_to_string(data_dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

fn suite_error(e: SuiteError) -> CliError {
    match e {
        SuiteError::Usage(m) => CliError::Usage(m),
        SuiteError::Failed(m) => CliError::Runtime(m),
    }
}

/// `--sweep qd=1,2,4 bs=4K,64K`.
fn parse_sweep(args: &[String]) -> Result<Sweep, String> {
    let mut s = Sweep {
        qd: Vec::new(),
        bs: Vec::new(),
    };
    for a in args {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| format!("--sweep {a:?}: expected qd=1,2,4 or bs=4K,64K"))?;
        for item in v.split(',').filter(|x| !x.is_empty()) {
            match k {
                "qd" => s.qd.push(
                    item.parse()
                        .ok()
                        .filter(|q| (1..=4096).contains(q))
                        .ok_or_else(|| format!("bad queue depth {item:?}"))?,
                ),
                "bs" => s.bs.push(parse_size(item)?),
                _ => return Err(format!("--sweep axis {k:?}: use qd or bs")),
            }
        }
    }
    if s.qd.is_empty() && s.bs.is_empty() {
        return Err("--sweep needs qd=... and/or bs=...".into());
    }
    Ok(s)
}

/// `volume:NAME` on a cluster on etcd: the native client in this process becomes the
/// volume's writer (a new epoch, an attach record under a lease, as `trireme attach`), and
/// detaches cleanly when the run ends. On `trireme up` it attaches through up's control
/// socket (`Target::open`).
async fn open_on_etcd(cli: &Cli, spec: &str) -> Result<Target, String> {
    let name = spec.trim_start_matches("volume:");
    if name.contains('?') {
        return Err(format!(
            "{spec}: on a cluster on etcd, volume: takes no options (the transport is \
             --transport's)"
        ));
    }
    let meta = crate::cmds::etcd_meta(cli).await.map_err(|e| match e {
        CliError::Usage(m) | CliError::Runtime(m) => m,
    })?;
    let cfg = trireme_daemon::attach::AttachConfig {
        volume: name.to_string(),
        force: false,
        lease_ttl: std::time::Duration::from_secs(5),
        opts: trireme_client::VolumeOptions {
            kind: cli.transport.kind(),
            ..Default::default()
        },
    };
    let att = trireme_daemon::attach::attach(meta, &cfg, Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    let vol = att.volume.clone();
    let closer: trireme_bench::target::Closer = Box::new(move || {
        Box::pin(async move {
            if let Err(e) = att.detach().await {
                eprintln!("volume: detach: {e}");
            }
        })
    });
    Ok(Target::Volume(
        trireme_bench::target::VolumeTarget::with_writer(vol, Some(closer)),
    ))
}

pub fn run(cli: &Cli, a: &BenchArgs) -> Result<(), CliError> {
    let profile = a.to_profile().map_err(|e| CliError::Usage(e.to_string()))?;
    if let Some(c) = &a.compare {
        let cmp = trireme_bench::compare::parse(c).map_err(suite_error)?;
        let format = match cli.output {
            Output::Text => Format::Text,
            Output::Json => Format::Json,
            Output::Markdown => Format::Markdown,
        };
        let opts = CompareOptions {
            create: a.create,
            rounds: a.rounds,
            storage_pids: a.storage_pids.clone(),
            target: a.target.clone(),
        };
        return trireme_bench::compare::run(&cmp, &profile, &opts, &cli.data_dir, format)
            .map_err(suite_error);
    }
    let pids = storage_pids(a, &cli.data_dir);
    if !a.sweep.is_empty() {
        let sw = parse_sweep(&a.sweep).map_err(CliError::Usage)?;
        let t = a.target.clone().unwrap_or_default();
        return trireme_bench::sweep::run(
            &sw,
            &profile,
            &t,
            &cli.data_dir,
            a.create,
            &a.chart_dir,
            cli.output == Output::Json,
            &pids,
        )
        .map_err(suite_error);
    }
    let connections = profile.threads as usize;
    let spec = a.target.clone().unwrap_or_default();
    let (data_dir, create) = (cli.data_dir.clone(), a.create);
    let on_etcd = cli.etcd.is_some() && spec.starts_with("volume:");
    let open = async move {
        if on_etcd {
            return open_on_etcd(cli, &spec).await;
        }
        Target::open(&spec, &data_dir, create, connections)
            .await
            .map_err(|e| e.to_string())
    };
    // A volume on tiered nodes: its tier counters when the measured window opens and after.
    let tier_volume = a.target.as_deref().and_then(trireme_bench::tier::volume_of);
    // And its limits with its writer's wait for them, when that writer is another process.
    let tier_before = tier_volume.clone().map(|v| {
        let (dir, warmup) = (cli.data_dir.clone(), profile.warmup_s);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(warmup));
            (
                trireme_bench::tier::snapshot(&dir, &v),
                trireme_bench::limits::snapshot(&dir, &v),
            )
        })
    });
    let mut result = trireme_bench::run(&profile, open, &pids, cli.output == Output::Text)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    if let (Some(v), Some(before)) = (&tier_volume, tier_before) {
        let after = trireme_bench::tier::snapshot(&cli.data_dir, v);
        let (tier_b, limits_b) = before.join().unwrap_or((None, None));
        if let (Some(b), Some(a)) = (tier_b, after) {
            result.tier = Some(trireme_bench::tier::section(&b, &a));
        }
        if result.limits.is_none() {
            let after = trireme_bench::limits::snapshot(&cli.data_dir, v);
            result.limits = trireme_bench::limits::section(limits_b, after);
        }
    }
    let command: Vec<String> = std::env::args().collect();
    match cli.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&trireme_bench::report::json(&result)).expect("json")
        ),
        Output::Markdown => print!("{}", trireme_bench::report::markdown(&result)),
        Output::Text => print!(
            "{}",
            trireme_bench::report::text(&result, &command.join(" "))
        ),
    }
    match &result.verify {
        Some(v) if !v.is_clean() => Err(CliError::Runtime(format!(
            "verification failed: {} lost, {} stale, {} corrupt block(s)",
            v.lost, v.stale, v.corrupt
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_axes_parse() {
        let s = parse_sweep(&["qd=1,2,32".into(), "bs=4K,1M".into()]).unwrap();
        assert_eq!((s.qd, s.bs), (vec![1, 2, 32], vec![4096, 1 << 20]));
        assert!(parse_sweep(&["qd=0".into()]).is_err());
        assert!(parse_sweep(&["depth=1".into()]).is_err());
    }
}
