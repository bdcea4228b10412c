//! Reports of a run: DISKSPD-style text, and a stable JSON document.
//!
//! JSON schema (version 1; keys are only ever added):
//! ```text
//! { "schema": 1, "target": str, "profile": {...},
//!   "iops": f64, "mib_per_s": f64, "elapsed_s": f64,
//!   "read":  { "iops", "mib_per_s", "ios", "bytes",
//!              "latency_us": { "min", "mean", "stddev", "p25", "p50", "p75", "p90", "p95",
//!                              "p99", "p999", "p9999", "max" } },
//!   "write": { same as read },
//!   "total": { "latency_us": { same } },
//!   "cpu": { "user_pct", "kernel_pct", "idle_pct", "steal_pct", "per_cpu": [...],
//!            "generator_s", "storage_s", "other_s", "storage_pids": [...] },
//!   "iops_per_kernel_pct": f64,
//!   "cpu_us_per_io": { "generator": f64, "storage": f64 | null },
//!   "verify": { ... } | null,
//!   "links": [ "node N: TRANSPORT[ over LANES]", ... ],
//!   "limits": { "limits": { "iops"?, "read_iops"?, ..., "burst_ms"? },
//!               "waited_s": f64 | null } | null,
//!   "tier": { "hit_ratio": f64 | null, "reads_fast", "reads_slow", "promotions", "demotions",
//!             "fast_extents": [[node, extents], ...], "disk_model"?: str } | null }
//! ```
//! `cpu_us_per_io.storage` is null when no storage processes were named (`null`, a file).
//! `links` are the native client's (`volume:` targets); `tier` is there for a volume on
//! tiered nodes, counted over the measured window.

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::engine::{OpStats, RunResult};
use crate::profile::{Buffers, Pattern};

const QUANTILES: [(&str, f64); 9] = [
    ("p25", 0.25),
    ("p50", 0.50),
    ("p75", 0.75),
    ("p90", 0.90),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p999", 0.999),
    ("p9999", 0.9999),
    ("p99999", 0.99999),
];

fn latency_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut m = serde_json::Map::new();
    m.insert("min".into(), json!(us(h.min())));
    m.insert("mean".into(), json!(h.mean() / 1000.0));
    m.insert("stddev".into(), json!(h.stdev() / 1000.0));
    for (k, q) in QUANTILES {
        m.insert(k.into(), json!(us(h.value_at_quantile(q))));
    }
    m.insert("max".into(), json!(us(h.max())));
    Value::Object(m)
}

fn op_json(s: &OpStats, secs: f64) -> Value {
    json!({
        "ios": s.ios,
        "bytes": s.bytes,
        "iops": s.ios as f64 / secs,
        "mib_per_s": s.bytes as f64 / secs / 1048576.0,
        "latency_us": latency_json(&s.hist),
    })
}

/// Headline numbers shared by the text and JSON reports.
#[derive(Debug, Clone, Copy)]
pub struct Headline {
    pub iops: f64,
    pub mib_per_s: f64,
    pub iops_per_kernel_pct: f64,
    pub generator_us_per_io: f64,
    pub storage_us_per_io: Option<f64>,
}

pub fn headline(r: &RunResult) -> Headline {
    let (rd, wr) = r.total();
    let secs = r.elapsed_s.max(1e-9);
    let ios = (rd.ios + wr.ios) as f64;
    let iops = ios / secs;
    let k = r.cpu.avg.kernel_pct;
    Headline {
        iops,
        mib_per_s: (rd.bytes + wr.bytes) as f64 / secs / 1048576.0,
        iops_per_kernel_pct: if k > 0.0 { iops / k } else { f64::NAN },
        generator_us_per_io: r.cpu.generator_cpu_s * 1e6 / ios.max(1.0),
        storage_us_per_io: (!r.cpu.storage_pids.is_empty())
            .then(|| r.cpu.storage_cpu_s * 1e6 / ios.max(1.0)),
    }
}

pub fn json(r: &RunResult) -> Value {
    let (rd, wr) = r.total();
    let secs = r.elapsed_s.max(1e-9);
    let mut all = rd.hist.clone();
    all.add(&wr.hist).expect("same bounds");
    let h = headline(r);
    json!({
        "schema": 1,
        "target": r.target,
        "target_size": r.target_size,
        "profile": r.profile,
        "elapsed_s": r.elapsed_s,
        "iops": h.iops,
        "mib_per_s": h.mib_per_s,
        "read": op_json(&rd, secs),
        "write": op_json(&wr, secs),
        "total": { "latency_us": latency_json(&all) },
        "cpu": {
            "user_pct": r.cpu.avg.user_pct,
            "kernel_pct": r.cpu.avg.kernel_pct,
            "idle_pct": r.cpu.avg.idle_pct,
            "steal_pct": r.cpu.avg.steal_pct,
            "per_cpu": r.cpu.per_cpu,
            "generator_s": r.cpu.generator_cpu_s,
            "storage_s": r.cpu.storage_cpu_s,
            "other_s": r.cpu.other_cpu_s,
            "storage_pids": r.cpu.storage_pids,
        },
        "iops_per_kernel_pct": if h.iops_per_kernel_pct.is_finite() { json!(h.iops_per_kernel_pct) } else { Value::Null },
        "cpu_us_per_io": { "generator": h.generator_us_per_io, "storage": h.storage_us_per_io },
        "verify": r.verify,
        "tier": r.tier,
        "links": r.links,
        "limits": r.limits.as_ref().map(|l| json!({
            "limits": l.limits,
            "waited_s": l.waited_s,
        })),
    })
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn io_table(out: &mut String, title: &str, rows: &[(usize, &OpStats)], total: &OpStats, secs: f64) {
    out.push_str(&format!("{title}\n"));
    out.push_str("thread |       bytes     |     I/Os     |    MiB/s   |  I/O per s |  AvgLat(ms)  | LatStdDev(ms)\n");
    out.push_str("-----------------------------------------------------------------------------------------------\n");
    let line = |name: String, s: &OpStats| {
        let (avg, sd) = if s.hist.is_empty() {
            (0.0, 0.0)
        } else {
            (s.hist.mean() / 1e6, s.hist.stdev() / 1e6)
        };
        format!(
            "{name:>6} | {:>15} | {:>12} | {:>10.2} | {:>10.2} | {:>12.3} | {:>12.3}\n",
            s.bytes,
            s.ios,
            s.bytes as f64 / secs / 1048576.0,
            s.ios as f64 / secs,
            avg,
            sd
        )
    };
    for (i, s) in rows {
        out.push_str(&line(i.to_string(), s));
    }
    out.push_str("-----------------------------------------------------------------------------------------------\n");
    out.push_str(&line("total:".into(), total));
    out.push('\n');
}

/// The DISKSPD-style text report. `command` is the command line as typed.
pub fn text(r: &RunResult, command: &str) -> String {
    let p = &r.profile;
    let (rd, wr) = r.total();
    let secs = r.elapsed_s.max(1e-9);
    let mut o = String::new();
    o.push_str(&format!("Command Line: {command}\n\nInput parameters:\n\n"));
    o.push_str(&format!(
        "\ttarget: {} ({} bytes)\n",
        r.target, r.target_size
    ));
    if !r.links.is_empty() {
        o.push_str(&format!("\tlinks: {}\n", r.links.join(", ")));
    }
    o.push_str(&format!(
        "\tduration: {}s, warm up: {}s, cool down: {}s\n",
        p.duration_s, p.warmup_s, p.cooldown_s
    ));
    o.push_str(&format!("\tblock size: {} bytes\n", p.block_size));
    match p.pattern {
        Pattern::Random { align } => {
            o.push_str(&format!("\tusing random I/O (alignment: {align} bytes)\n"));
            if let Some(z) = &p.hot {
                let zones: Vec<String> = z
                    .zones
                    .iter()
                    .map(|(io, t)| format!("{io}% of I/O to {t}% of the target"))
                    .collect();
                o.push_str(&format!(
                    "\thot zones (-rdpct): {}\n",
                    zones.join(", then ")
                ));
            }
        }
        Pattern::Sequential => {
            o.push_str("\tusing sequential I/O, each thread in its own region\n")
        }
    }
    o.push_str(&format!(
        "\twrites: {}%, reads: {}%\n",
        p.write_pct,
        100 - p.write_pct
    ));
    o.push_str(&format!(
        "\tthreads: {}, outstanding I/Os per thread: {} ({} in flight)\n",
        p.threads,
        p.outstanding,
        p.threads * p.outstanding
    ));
    let buffers = match p.buffers {
        Buffers::Pattern => "fixed pattern",
        Buffers::Zero => "zeros",
        Buffers::Random => "random per write",
    };
    o.push_str(&format!("\twrite buffers: {buffers}; seed: {}\n\n", p.seed));
    o.push_str("Results:\n*******************************************************************************\n\n");
    o.push_str(&format!(
        "actual test time:\t{secs:.2}s\nthread count:\t\t{}\nproc count:\t\t{}\n\n",
        p.threads,
        r.cpu.per_cpu.len()
    ));
    o.push_str("CPU |  Usage |  User  |  Kernel |  Idle  | Steal\n");
    o.push_str("-------------------------------------------------\n");
    let row = |name: String, u: &crate::cpu::CpuUsage| {
        format!(
            "{name:>4}| {:>5.2}%| {:>5.2}%| {:>6.2}%| {:>5.2}%| {:>5.2}%\n",
            u.usage_pct, u.user_pct, u.kernel_pct, u.idle_pct, u.steal_pct
        )
    };
    for (i, u) in r.cpu.per_cpu.iter().enumerate() {
        o.push_str(&row(i.to_string(), u));
    }
    o.push_str("-------------------------------------------------\n");
    o.push_str(&row("avg.".into(), &r.cpu.avg));
    let h = headline(r);
    o.push_str(&format!(
        "\nCPU seconds in the window: generator {:.2}, storage {:.2}{}, other processes {:.2}\n\n",
        r.cpu.generator_cpu_s,
        r.cpu.storage_cpu_s,
        if r.cpu.storage_pids.is_empty() {
            " (no storage processes named)".to_string()
        } else {
            format!(" (pids {:?})", r.cpu.storage_pids)
        },
        r.cpu.other_cpu_s
    ));
    let mut tot: Vec<OpStats> = Vec::new();
    for t in &r.threads {
        let mut s = t.read.clone();
        s.ios += t.write.ios;
        s.bytes += t.write.bytes;
        s.hist.add(&t.write.hist).expect("same bounds");
        tot.push(s);
    }
    let mut all = rd.clone();
    all.ios += wr.ios;
    all.bytes += wr.bytes;
    all.hist.add(&wr.hist).expect("same bounds");
    io_table(
        &mut o,
        "Total IO",
        &tot.iter().enumerate().collect::<Vec<_>>(),
        &all,
        secs,
    );
    let reads: Vec<(usize, &OpStats)> = r
        .threads
        .iter()
        .enumerate()
        .map(|(i, t)| (i, &t.read))
        .collect();
    io_table(&mut o, "Read IO", &reads, &rd, secs);
    let writes: Vec<(usize, &OpStats)> = r
        .threads
        .iter()
        .enumerate()
        .map(|(i, t)| (i, &t.write))
        .collect();
    io_table(&mut o, "Write IO", &writes, &wr, secs);

    o.push_str("  %-ile |  Read (ms) | Write (ms) | Total (ms)\n");
    o.push_str("----------------------------------------------\n");
    let cell = |h: &Histogram<u64>, f: &dyn Fn(&Histogram<u64>) -> u64| {
        if h.is_empty() {
            "N/A".to_string()
        } else {
            format!("{:.3}", ms(f(h)))
        }
    };
    let lat_row = |name: &str, f: &dyn Fn(&Histogram<u64>) -> u64| {
        format!(
            "{name:>7} | {:>10} | {:>10} | {:>10}\n",
            cell(&rd.hist, f),
            cell(&wr.hist, f),
            cell(&all.hist, f)
        )
    };
    o.push_str(&lat_row("min", &|h| h.min()));
    for (name, q) in [
        ("25th", 0.25),
        ("50th", 0.5),
        ("75th", 0.75),
        ("90th", 0.9),
        ("95th", 0.95),
        ("99th", 0.99),
        ("3-nines", 0.999),
        ("4-nines", 0.9999),
        ("5-nines", 0.99999),
    ] {
        o.push_str(&lat_row(name, &|h| h.value_at_quantile(q)));
    }
    o.push_str(&lat_row("max", &|h| h.max()));
    if let Some(v) = &r.verify {
        o.push_str(&format!(
            "\nVerification: {} blocks checked: {} lost, {} stale, {} corrupt{}\n",
            v.blocks_checked,
            v.lost,
            v.stale,
            v.corrupt,
            if v.is_clean() { " (clean)" } else { "" }
        ));
        for f in &v.findings {
            o.push_str(&format!("  LBA {}: {:?}: {}\n", f.lba, f.verdict, f.detail));
        }
    }
    if let Some(t) = &r.tier {
        o.push_str(&tier_text(t));
    }
    if let Some(l) = &r.limits {
        o.push_str(&format!("\n{}\n", limits_text(l, r)));
    }
    o.push_str(&format!(
        "\nSummary: {:.0} IOPS, {:.2} MiB/s, {:.0} IOPS per % kernel CPU, CPU us per IO: generator {:.2}, storage {}\n",
        h.iops,
        h.mib_per_s,
        h.iops_per_kernel_pct,
        h.generator_us_per_io,
        h.storage_us_per_io.map_or("n/a".to_string(), |v| format!("{v:.2}"))
    ));
    o
}

/// `Limits (the volume's): iops 1000; requests waited 9.1 s for them in the measured
/// window, 0.91 ms a request`.
fn limits_text(l: &crate::engine::LimitsSection, r: &RunResult) -> String {
    let (rd, wr) = r.total();
    let ios = rd.ios + wr.ios;
    let waited = match l.waited_s {
        Some(s) if ios > 0 => format!(
            "; requests waited {s:.1} s for them in the measured window, {:.2} ms a request",
            s * 1e3 / ios as f64
        ),
        Some(s) => format!("; requests waited {s:.1} s for them"),
        None => "; how long requests waited for them: see the writer's trireme_volume_throttled_seconds_total".into(),
    };
    format!("Limits (the volume's): {}{waited}", l.limits)
}

fn tier_text(t: &crate::tier::TierSection) -> String {
    let per_node: Vec<String> = t
        .fast_extents
        .iter()
        .map(|(n, e)| format!("node {n}: {e}"))
        .collect();
    format!(
        "\nTiers (during the measured window): reads {} fast, {} slow, hit ratio {}; {} promotions, {} demotions; extents on fast at the end: {}\n\tslow tier: {}\n",
        t.reads_fast,
        t.reads_slow,
        t.hit_ratio.map_or("-".to_string(), |h| format!("{h:.3}")),
        t.promotions,
        t.demotions,
        per_node.join(", "),
        t.disk_model
            .as_deref()
            .map_or("a real disk".to_string(), |m| format!("{m} (these are the model's numbers)"))
    )
}

/// A Markdown summary of a run: the headline numbers and the latency percentiles, ready to
/// paste into an issue or a wiki page.
pub fn markdown(r: &RunResult) -> String {
    let h = headline(r);
    let (rd, wr) = r.total();
    let p = &r.profile;
    let mut o = format!(
        "**trireme bench** `{}`: {} B blocks, {}, {}% writes, {} threads x {} outstanding, {} s (warm-up {} s)\n\n",
        r.target,
        p.block_size,
        match p.pattern {
            Pattern::Random { .. } => "random",
            Pattern::Sequential => "sequential",
        },
        p.write_pct,
        p.threads,
        p.outstanding,
        p.duration_s,
        p.warmup_s
    );
    o += "| metric | value |\n|---|---:|\n";
    let secs = r.elapsed_s.max(1e-9);
    let mut row = |k: &str, v: String| o.push_str(&format!("| {k} | {v} |\n"));
    row("IOPS", format!("{:.0}", h.iops));
    row("MiB/s", format!("{:.1}", h.mib_per_s));
    row(
        "read / write IOPS",
        format!("{:.0} / {:.0}", rd.ios as f64 / secs, wr.ios as f64 / secs),
    );
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)] {
        let v = |s: &OpStats| {
            if s.hist.is_empty() {
                "n/a".to_string()
            } else {
                format!("{:.1}", s.hist.value_at_quantile(q) as f64 / 1000.0)
            }
        };
        row(
            &format!("{name} latency read / write (us)"),
            format!("{} / {}", v(&rd), v(&wr)),
        );
    }
    row(
        "CPU user / kernel %",
        format!("{:.1} / {:.1}", r.cpu.avg.user_pct, r.cpu.avg.kernel_pct),
    );
    row(
        "IOPS per % kernel CPU",
        format!("{:.0}", h.iops_per_kernel_pct),
    );
    row(
        "CPU us per IO: generator / storage",
        format!(
            "{:.2} / {}",
            h.generator_us_per_io,
            h.storage_us_per_io
                .map_or("n/a".into(), |v| format!("{v:.2}"))
        ),
    );
    if let Some(v) = &r.verify {
        row(
            "verify: checked / lost / stale / corrupt",
            format!(
                "{} / {} / {} / {}",
                v.blocks_checked, v.lost, v.stale, v.corrupt
            ),
        );
    }
    if let Some(l) = &r.limits {
        row(
            "limits / waited for them",
            format!(
                "{} / {}",
                l.limits,
                l.waited_s.map_or("n/a".into(), |s| format!("{s:.1} s"))
            ),
        );
    }
    if let Some(t) = &r.tier {
        row(
            "tiers: hit ratio / promotions / demotions",
            format!(
                "{} / {} / {}",
                t.hit_ratio.map_or("n/a".into(), |h| format!("{h:.3}")),
                t.promotions,
                t.demotions
            ),
        );
        if let Some(m) = &t.disk_model {
            o.push_str(&format!(
                "\nSlow tier: {m} (the model's numbers, not a disk's).\n"
            ));
        }
    }
    o
}
