//! `trireme bench --compare AXIS=V1,V2,...`: one profile over several values of one axis,
//! interleaved (V1 V2 V1 V2 ...) for several rounds, medians side by side with the seed
//! table's deltas.
//!
//! Axes:
//! * `target=A,B`: each value is a target spec.
//! * `replicas=1,2,3`: temporary volumes with that many copies in the running cluster (removed
//!   afterwards), driven through the native client.
//! * `store=null,memory,file`: a temporary local cluster per store, each with one 3-way volume.
//! * `transport=tcp,unix,ucx` (or `auto`): the native-client target (`volume:NAME`) attached
//!   over each transport in turn. `tcp` is TCP through the kernel's network stack even on one
//!   host, `unix` the same-host sockets trireme uses without UCX. The table says which lanes UCX
//!   ran on (shared memory here: these machines have no RDMA device).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::profile::Profile;
use crate::suite::{Format, SuiteError};
use crate::target::Target;

/// What a comparison runs besides its axis: `trireme bench`'s own flags.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// `-c`: the size to create a file target with, or of a `null` target.
    pub create: Option<u64>,
    /// Interleaved rounds per value.
    pub rounds: u32,
    /// Processes whose CPU counts as storage (default: the cluster's, from its `pids` file).
    pub storage_pids: Vec<u32>,
    /// The target (the native-client target `--compare transport` attaches).
    pub target: Option<String>,
}

/// Parsed `--compare` value.
#[derive(Debug, Clone)]
pub struct Compare {
    pub axis: String,
    pub values: Vec<String>,
}

/// Parses `--compare AXIS=V1,V2,...`.
pub fn parse(s: &str) -> Result<Compare, SuiteError> {
    parse_spec(s).map_err(SuiteError::Usage)
}

fn parse_spec(s: &str) -> Result<Compare, String> {
    let (axis, vals) = s
        .split_once('=')
        .ok_or_else(|| format!("--compare {s:?}: expected AXIS=V1,V2"))?;
    let values: Vec<String> = vals
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(String::from)
        .collect();
    if values.len() < 2 {
        return Err(format!("--compare {s:?}: give at least two values"));
    }
    match axis {
        "target" | "replicas" | "store" => {}
        "transport" => {
            if let Some(v) = values
                .iter()
                .find(|v| crate::target::volume::transport(v).is_none())
            {
                return Err(format!(
                    "unknown transport {v:?}: use tcp, unix, ucx or auto"
                ));
            }
        }
        _ => {
            return Err(format!(
                "unknown --compare axis {axis:?}: use target, replicas, store or transport"
            ))
        }
    }
    if axis == "replicas" {
        for v in &values {
            if !matches!(v.as_str(), "1" | "2" | "3") {
                return Err(format!("replicas must be 1, 2 or 3, not {v:?}"));
            }
        }
    }
    if axis == "store" {
        for v in &values {
            if trireme_store::StoreKind::parse(v).is_none() {
                return Err(format!("unknown store {v:?}: use null, memory or file"));
            }
        }
    }
    Ok(Compare {
        axis: axis.to_string(),
        values,
    })
}

/// A `trireme up` started for one value of the `store` axis; stopped on drop.
struct TempCluster {
    child: Child,
    dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed on drop.
    #[derive(Debug)]
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl TempCluster {
    fn start(store: &str, size: u64) -> Result<TempCluster, String> {
        let dir =
            std::env::temp_dir().join(format!("trireme-compare-{}-{store}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("up.log")).map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .arg("--data-dir")
            .arg(&dir)
            .args([
                "--log",
                "warn",
                "up",
                "--port",
                "0",
                "--store",
                store,
                "--size",
                &size.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut c = TempCluster {
            child,
            dir: tempdir::Dir(dir),
        };
        let t0 = Instant::now();
        while !c.dir.0.join("exports").exists() {
            if c.child.try_wait().ok().flatten().is_some() || t0.elapsed() > Duration::from_secs(60)
            {
                return Err(format!(
                    "a temporary {store} cluster failed to start; see {}",
                    c.dir.0.join("up.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(c)
    }
    fn path(&self) -> &Path {
        &self.dir.0
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child we spawned.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && t0.elapsed() < Duration::from_secs(15)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One value of the axis, ready to run: where the target is and whose CPU is storage.
struct Setup {
    value: String,
    target: String,
    data_dir: PathBuf,
}

fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

fn control(data_dir: &Path, req: trireme_control::Request) -> Result<Value, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut c = trireme_control::ControlClient::connect(&data_dir.join("control.sock"))
            .await
            .map_err(|e| e.to_string())?;
        c.call::<Value>(&req).await.map_err(|e| e.to_string())
    })
}

/// Runs the comparison and prints the table (text) or the JSON document.
pub fn run(
    cmp: &Compare,
    profile: &Profile,
    a: &CompareOptions,
    data_dir: &Path,
    output: Format,
) -> Result<(), SuiteError> {
    let (create, rounds, explicit_pids, target) =
        (a.create, a.rounds, &a.storage_pids, a.target.as_deref());
    let mut clusters = Vec::new();
    let mut created = Vec::new();
    let mut setups = Vec::new();
    let size = profile.span.max(256 << 20);
    for v in &cmp.values {
        match cmp.axis.as_str() {
            "target" => setups.push(Setup {
                value: v.clone(),
                target: v.clone(),
                data_dir: data_dir.to_path_buf(),
            }),
            "replicas" => {
                let name = format!("bench-r{v}-{}", std::process::id());
                control(
                    data_dir,
                    trireme_control::Request::VolumeCreate {
                        access: None,
                        min_copies: None,
                        tier: None,
                        preallocate: false,
                        name: name.clone(),
                        size,
                        replicas: v.parse().unwrap_or(1),
                        layout: None,
                        limits: Default::default(),
                        qos_policy: None,
                    },
                )
                .map_err(SuiteError::Usage)?;
                created.push(name.clone());
                setups.push(Setup {
                    value: v.clone(),
                    target: format!("volume:{name}"),
                    data_dir: data_dir.to_path_buf(),
                });
            }
            "transport" => {
                let t = target.filter(|t| t.starts_with("volume:")).ok_or_else(|| {
                    SuiteError::Usage(
                        "--compare transport needs a native-client target: volume:NAME".into(),
                    )
                })?;
                setups.push(Setup {
                    value: v.clone(),
                    target: format!("{t}?transport={v}"),
                    data_dir: data_dir.to_path_buf(),
                });
            }
            "store" => {
                let c = TempCluster::start(v, size).map_err(SuiteError::Failed)?;
                setups.push(Setup {
                    value: v.clone(),
                    target: "volume:vol0".into(),
                    data_dir: c.path().to_path_buf(),
                });
                clusters.push(c);
            }
            _ => unreachable!("checked in parse"),
        }
    }
    let mut runs: Vec<Vec<Value>> = setups.iter().map(|_| Vec::new()).collect();
    let result = (|| {
        for round in 0..rounds {
            for (i, s) in setups.iter().enumerate() {
                let p = if explicit_pids.is_empty() {
                    pids(&s.data_dir)
                } else {
                    explicit_pids.to_vec()
                };
                let (spec, dir, threads) = (
                    s.target.clone(),
                    s.data_dir.clone(),
                    profile.threads as usize,
                );
                let open = async move {
                    Target::open(&spec, &dir, create, threads)
                        .await
                        .map_err(|e| e.to_string())
                };
                let r = crate::run(profile, open, &p, false)
                    .map_err(|e| SuiteError::Usage(e.to_string()))?;
                let j = crate::report::json(&r);
                if output != Format::Json {
                    eprintln!(
                        "round {}/{rounds} {}={}: {:.0} IOPS, p90 read {:.1} us, p90 write {:.1} us",
                        round + 1,
                        cmp.axis,
                        s.value,
                        j["iops"].as_f64().unwrap_or(0.0),
                        j["read"]["latency_us"]["p90"].as_f64().unwrap_or(f64::NAN),
                        j["write"]["latency_us"]["p90"].as_f64().unwrap_or(f64::NAN)
                    );
                }
                runs[i].push(j);
            }
        }
        Ok::<(), SuiteError>(())
    })();
    // The benchmark's own scratch volumes: freed at once, not kept in the trash.
    for name in created {
        let _ = control(
            data_dir,
            trireme_control::Request::VolumeDelete {
                name: name.clone(),
                force: true,
                keep_secs: Some(0),
            },
        );
        let _ = control(
            data_dir,
            trireme_control::Request::TrashPurge { name: Some(name) },
        );
    }
    drop(clusters);
    result?;
    let medians: Vec<Value> = setups
        .iter()
        .zip(&runs)
        .map(|(s, r)| median_doc(&s.value, r))
        .collect();
    if output == Format::Markdown {
        print!("{}", markdown(cmp, &medians));
    } else if output == Format::Json {
        let doc =
            json!({ "axis": cmp.axis, "rounds": rounds, "profile": profile, "runs": medians });
        println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
    } else {
        print!("{}", table(cmp, profile, rounds, &medians));
    }
    Ok(())
}

/// The keys compared, where to find them, and whether more is better.
const METRICS: [(&str, &str, bool); 9] = [
    ("IOPS", "/iops", true),
    ("IOPS per % kernel CPU", "/iops_per_kernel_pct", true),
    ("MiB/s", "/mib_per_s", true),
    (
        "90th percentile write latency (us)",
        "/write/latency_us/p90",
        false,
    ),
    (
        "90th percentile read latency (us)",
        "/read/latency_us/p90",
        false,
    ),
    (
        "99th percentile latency (us)",
        "/total/latency_us/p99",
        false,
    ),
    ("kernel CPU %", "/cpu/kernel_pct", false),
    (
        "CPU us per IO, load generator",
        "/cpu_us_per_io/generator",
        false,
    ),
    ("CPU us per IO, storage", "/cpu_us_per_io/storage", false),
];

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The median of every numeric key the report has, as a document with the run's shape.
fn median_doc(value: &str, rounds: &[Value]) -> Value {
    fn walk(docs: &[&Value]) -> Value {
        match docs[0] {
            Value::Object(m) => {
                let mut out = serde_json::Map::new();
                for k in m.keys() {
                    let sub: Vec<&Value> = docs
                        .iter()
                        .map(|d| d.get(k).unwrap_or(&Value::Null))
                        .collect();
                    out.insert(k.clone(), walk(&sub));
                }
                Value::Object(out)
            }
            Value::Number(_) => median(docs.iter().filter_map(|d| d.as_f64()).collect())
                .map_or(Value::Null, |m| json!(m)),
            other => other.clone(),
        }
    }
    let refs: Vec<&Value> = rounds.iter().collect();
    let mut doc = walk(&refs);
    doc["value"] = json!(value);
    doc
}

fn table(cmp: &Compare, profile: &Profile, rounds: u32, runs: &[Value]) -> String {
    let mut o = format!(
        "{} comparison: {}K blocks, {}% writes, {} threads x {} outstanding, {}s runs, {} interleaved rounds, medians\n",
        cmp.axis,
        profile.block_size / 1024,
        profile.write_pct,
        profile.threads,
        profile.outstanding,
        profile.duration_s,
        rounds
    );
    if cmp.axis == "transport" {
        for r in runs {
            let links: Vec<&str> = r["links"]
                .as_array()
                .map(|l| l.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            o += &format!(
                "{}: {}, links {}\n",
                r["value"].as_str().unwrap_or("?"),
                r["target"].as_str().unwrap_or("?"),
                links.join(", ")
            );
        }
        o += "tcp is TCP through the kernel's network stack (loopback on one host), unix the same-host sockets trireme uses without UCX.\n";
        o += "This machine has no RDMA device: UCX ran over the lanes shown (shared memory between processes here), not RDMA.\n\n";
    } else {
        o += "Transport: as each link negotiated (UCX where a probe works, else TCP; unix sockets between processes on one host); this machine has no RDMA device.\n\n";
    }
    // Wide enough for every column's heading, with two spaces between columns.
    let w = runs
        .iter()
        .map(|r| cmp.axis.len() + r["value"].as_str().unwrap_or("?").len() + 3)
        .max()
        .unwrap_or(0)
        .max(14);
    o += &format!("{:<38}", "");
    for r in runs {
        o += &format!(
            "{:>w$}",
            format!("{}={}", cmp.axis, r["value"].as_str().unwrap_or("?"))
        );
    }
    o += &format!(
        "  delta ({} vs {})\n",
        runs.last().and_then(|r| r["value"].as_str()).unwrap_or("?"),
        runs[0]["value"].as_str().unwrap_or("?")
    );
    for (label, ptr, more_is_better) in METRICS {
        o += &format!("{label:<38}");
        let vals: Vec<Option<f64>> = runs
            .iter()
            .map(|r| r.pointer(ptr).and_then(Value::as_f64))
            .collect();
        for v in &vals {
            o += &match v {
                Some(x) if *x >= 100.0 => format!("{:>w$}", group(*x)),
                Some(x) => format!("{x:>w$.1}"),
                None => format!("{:>w$}", "n/a"),
            };
        }
        if let (Some(Some(a)), Some(Some(b))) = (vals.first(), vals.last()) {
            o += &format!("  {}", delta(label, *a, *b, more_is_better));
        }
        o += "\n";
    }
    o
}

/// The comparison as a Markdown table.
fn markdown(cmp: &Compare, runs: &[Value]) -> String {
    let mut o = String::from("| metric |");
    for r in runs {
        o += &format!(" {}={} |", cmp.axis, r["value"].as_str().unwrap_or("?"));
    }
    o += " delta |\n|---|";
    o += &"---:|".repeat(runs.len() + 1);
    o += "\n";
    for (label, ptr, more_is_better) in METRICS {
        o += &format!("| {label} |");
        let vals: Vec<Option<f64>> = runs
            .iter()
            .map(|r| r.pointer(ptr).and_then(Value::as_f64))
            .collect();
        for v in &vals {
            o += &v.map_or(" n/a |".to_string(), |x| {
                format!(
                    " {} |",
                    if x >= 100.0 {
                        group(x)
                    } else {
                        format!("{x:.1}")
                    }
                )
            });
        }
        o += &match (vals.first(), vals.last()) {
            (Some(Some(a)), Some(Some(b))) => {
                format!(" {} |\n", delta(label, *a, *b, more_is_better))
            }
            _ => " |\n".to_string(),
        };
    }
    o
}

/// A number with thousands separators, as the seed table prints them.
fn group(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 && c != '-' {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The seed table's wording: "40,000 additional IOPS with the same workload (+27%)".
fn delta(label: &str, a: f64, b: f64, more_is_better: bool) -> String {
    if a == 0.0 {
        return "n/a".into();
    }
    let pct = (b / a - 1.0) * 100.0;
    let better = (b > a) == more_is_better;
    let what = if label == "IOPS" {
        if b >= a {
            format!("{} additional IOPS with the same workload", group(b - a))
        } else {
            format!("{} fewer IOPS with the same workload", group(a - b))
        }
    } else {
        (if better { "better" } else { "worse" }).to_string()
    };
    format!("{what} ({pct:+.0}%)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_and_wording() {
        assert!(parse("replicas=1,3").is_ok());
        assert!(parse("replicas=1,4").is_err());
        assert!(parse("replicas=2").is_err());
        assert!(parse("colour=red,blue").is_err());
        assert_eq!(parse("transport=tcp,ucx").unwrap().values, ["tcp", "ucx"]);
        assert_eq!(
            parse("transport=tcp,unix,ucx").unwrap().values,
            ["tcp", "unix", "ucx"]
        );
        let e = parse("transport=tcp,rdma").unwrap_err();
        assert!(e.to_string().contains("unknown transport \"rdma\""), "{e}");
        assert_eq!(group(185500.0), "185,500");
        assert_eq!(
            delta("IOPS", 145_500.0, 185_500.0, true),
            "40,000 additional IOPS with the same workload (+27%)"
        );
        assert_eq!(delta("p90", 390.0, 250.0, false), "better (-36%)");
        let m = median_doc(
            "x",
            &[
                json!({"a": 1.0, "b": {"c": 5}}),
                json!({"a": 3.0, "b": {"c": 1}}),
                json!({"a": 2.0, "b": {"c": 9}}),
            ],
        );
        assert_eq!(
            (m["a"].as_f64(), m["b"]["c"].as_f64()),
            (Some(2.0), Some(5.0))
        );
    }
}
