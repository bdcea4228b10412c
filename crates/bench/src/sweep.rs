//! `trireme bench --sweep qd=1,2,4,... bs=4K,64K,...`: the DRBD post's charts, measured.
//!
//! Runs the profile once per (block size, queue depth) pair, prints IOPS and MiB/s tables, and
//! draws three charts as SVG and PNG: IOPS against io-depth (a line per block size), bandwidth
//! against block size (a line per io-depth), and the latency CDF at the lowest io-depth (a line
//! per block size). Each caption names the machine, the transport and the date.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::chart::{self, Chart, Scale, Series};
use crate::profile::{Pattern, Profile};
use crate::suite::SuiteError;
use crate::target::Target;
use crate::RunResult;

/// The axes of a sweep: queue depths and block sizes (either may be empty: the profile's).
#[derive(Debug, Clone)]
pub struct Sweep {
    pub qd: Vec<u32>,
    pub bs: Vec<u64>,
}

/// A block size as the charts label it: 4K, 64K, 1M, 1.5M.
fn size_label(b: u64) -> String {
    let (v, unit) = match b {
        b if b >= 1 << 20 => (b as f64 / (1 << 20) as f64, "M"),
        b if b >= 1 << 10 => (b as f64 / (1 << 10) as f64, "K"),
        b => (b as f64, ""),
    };
    let v = format!("{v:.1}");
    format!("{}{unit}", v.trim_end_matches(".0"))
}

/// A UTC timestamp, `YYYY-MM-DD HH:MM UTC`, from the system clock.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// What the links measured ran over: the native client's own, or for an NBD export of a
/// local cluster the links of the writer behind it (`status`); the same ones grouped.
fn links_line(own: &[String], target: &str, data_dir: &Path) -> String {
    let links: Vec<String> = if !own.is_empty() {
        own.to_vec()
    } else {
        crate::tier::volume_of(target)
            .and_then(|v| {
                let st: trireme_control::StatusReport =
                    crate::tier::call(data_dir, trireme_control::Request::Status)?;
                let vol = st.volumes.into_iter().find(|x| x.name == v)?;
                Some(
                    vol.client_links
                        .iter()
                        .map(|l| match &l.lanes {
                            Some(lanes) => format!("node {}: {} over {lanes}", l.node, l.transport),
                            None => format!("node {}: {}", l.node, l.transport),
                        })
                        .collect(),
                )
            })
            .unwrap_or_default()
    };
    let rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    let host = if rdma {
        ""
    } else {
        "; this host has no RDMA device"
    };
    if links.is_empty() {
        return format!("links: none of the writer's to report for this target{host}");
    }
    // "node 1: ucx over X" for every node reads as one line: "ucx over X to nodes 1, 2, 3".
    let how: Vec<&str> = links
        .iter()
        .map(|l| l.split_once(": ").map_or(l.as_str(), |(_, h)| h))
        .collect();
    if how.iter().all(|h| *h == how[0]) {
        let nodes: Vec<&str> = links
            .iter()
            .filter_map(|l| l.split_once(": ")?.0.strip_prefix("node "))
            .collect();
        format!("links: {} to nodes {}{host}", how[0], nodes.join(", "))
    } else {
        format!("links: {}{host}", links.join(", "))
    }
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    sw: &Sweep,
    base: &Profile,
    target: &str,
    data_dir: &Path,
    create: Option<u64>,
    chart_dir: &Path,
    json_out: bool,
    pids: &[u32],
) -> Result<(), SuiteError> {
    let qds = if sw.qd.is_empty() {
        vec![base.outstanding]
    } else {
        sw.qd.clone()
    };
    let bss = if sw.bs.is_empty() {
        vec![base.block_size]
    } else {
        sw.bs.clone()
    };
    let mut results: Vec<(u64, u32, RunResult)> = Vec::new();
    for &bs in &bss {
        for &qd in &qds {
            let mut p = base.clone();
            p.block_size = bs;
            p.outstanding = qd;
            if let Pattern::Random { .. } = p.pattern {
                p.pattern = Pattern::Random { align: bs };
            }
            let (spec, dir, threads) = (
                target.to_string(),
                data_dir.to_path_buf(),
                p.threads as usize,
            );
            let open = async move {
                Target::open(&spec, &dir, create, threads)
                    .await
                    .map_err(|e| e.to_string())
            };
            let r =
                crate::run(&p, open, pids, false).map_err(|e| SuiteError::Usage(e.to_string()))?;
            if !json_out {
                let h = crate::report::headline(&r);
                eprintln!(
                    "bs {:>5} qd {:>4}: {:>10.0} IOPS {:>9.1} MiB/s",
                    size_label(bs),
                    qd,
                    h.iops,
                    h.mib_per_s
                );
            }
            results.push((bs, qd, r));
        }
    }
    std::fs::create_dir_all(chart_dir)
        .map_err(|e| SuiteError::Usage(format!("--chart-dir {}: {e}", chart_dir.display())))?;
    let first = &results[0].2;
    let caption = format!(
        "trireme bench, {}, {} thread(s), {}, {}% writes, {}s per point\nmachine {}, {} CPUs, kernel {}, {}\n{}",
        first.target,
        base.threads,
        if matches!(base.pattern, Pattern::Random { .. }) { "random" } else { "sequential" },
        base.write_pct,
        base.duration_s,
        read_trim("/proc/sys/kernel/hostname"),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        read_trim("/proc/sys/kernel/osrelease"),
        utc_now(),
        links_line(&first.links, target, data_dir)
    );
    let headline = |r: &RunResult| crate::report::headline(r);
    let iops = Chart {
        title: "IOPS vs io-depth".into(),
        x_label: "io-depth per thread".into(),
        y_label: "IOPS".into(),
        caption: caption.clone(),
        x_scale: Scale::Log2,
        x_ticks: qds.iter().map(|q| (f64::from(*q), q.to_string())).collect(),
        series: bss
            .iter()
            .map(|&bs| Series {
                label: size_label(bs),
                points: results
                    .iter()
                    .filter(|x| x.0 == bs)
                    .map(|x| (f64::from(x.1), headline(&x.2).iops))
                    .collect(),
            })
            .collect(),
        y_max: None,
    };
    let bw = Chart {
        title: "Bandwidth vs block size".into(),
        x_label: "block size".into(),
        y_label: "MiB/s".into(),
        caption: caption.clone(),
        x_scale: Scale::Log2,
        x_ticks: bss.iter().map(|b| (*b as f64, size_label(*b))).collect(),
        series: qds
            .iter()
            .map(|&qd| Series {
                label: format!("io-depth {qd}"),
                points: results
                    .iter()
                    .filter(|x| x.1 == qd)
                    .map(|x| (x.0 as f64, headline(&x.2).mib_per_s))
                    .collect(),
            })
            .collect(),
        y_max: None,
    };
    let low_qd = *qds.iter().min().unwrap_or(&1);
    let mut lat_series = Vec::new();
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for (bs, _, r) in results.iter().filter(|x| x.1 == low_qd) {
        let (rd, wr) = r.total();
        let mut h = rd.hist.clone();
        let _ = h.add(&wr.hist);
        if h.is_empty() {
            continue;
        }
        let mut pts = Vec::new();
        for i in 0..=200 {
            let q = (i as f64 / 200.0).min(0.9999);
            let us = h.value_at_quantile(q) as f64 / 1000.0;
            lo = lo.min(us);
            hi = hi.max(us);
            pts.push((us.max(0.001), q * 100.0));
        }
        lat_series.push(Series {
            label: size_label(*bs),
            points: pts,
        });
    }
    let mut lat_ticks = Vec::new();
    let mut t = 10f64.powf(lo.max(0.001).log10().floor());
    while t <= hi * 10.0 && lat_ticks.len() < 10 {
        lat_ticks.push((
            t,
            if t >= 1000.0 {
                format!("{} ms", trim_num(t / 1000.0))
            } else {
                format!("{} us", trim_num(t))
            },
        ));
        t *= 10.0;
    }
    let cdf = Chart {
        title: format!("Latency CDF at io-depth {low_qd}"),
        x_label: "latency (log scale)".into(),
        y_label: "percent of I/Os completed".into(),
        caption,
        x_scale: Scale::Log10,
        x_ticks: lat_ticks,
        series: lat_series,
        y_max: Some(100.0),
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for (c, name) in [
        (&iops, "iops_vs_iodepth"),
        (&bw, "bandwidth_vs_blocksize"),
        (&cdf, "latency_cdf"),
    ] {
        files.extend(
            chart::write(c, &chart_dir.join(name))
                .map_err(|e| SuiteError::Failed(e.to_string()))?,
        );
    }
    if json_out {
        let runs: Vec<_> = results
            .iter()
            .map(|(bs, qd, r)| {
                let mut j = crate::report::json(r);
                j["bs"] = json!(bs);
                j["qd"] = json!(qd);
                j
            })
            .collect();
        let doc = json!({"sweep": {"qd": qds, "bs": bss}, "runs": runs, "charts": files});
        println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
    } else {
        for (label, f) in [("IOPS", 0usize), ("MiB/s", 1)] {
            print!("{label:<8}");
            for q in &qds {
                print!("{:>12}", format!("qd {q}"));
            }
            println!();
            for &bs in &bss {
                print!("{:<8}", size_label(bs));
                for &q in &qds {
                    let r = results
                        .iter()
                        .find(|x| x.0 == bs && x.1 == q)
                        .map(|x| headline(&x.2));
                    let v = r.map_or(0.0, |h| if f == 0 { h.iops } else { h.mib_per_s });
                    print!("{v:>12.0}");
                }
                println!();
            }
            println!();
        }
        println!("charts:");
        for f in &files {
            println!("  {}", f.display());
        }
    }
    Ok(())
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn labels_and_dates() {
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(1536), "1.5K");
        assert_eq!(size_label(512), "512");
        assert!(utc_now().ends_with("UTC"));
    }
}
