//! Per-volume I/O limits with real processes (issue 68): two volumes on one `trireme up`,
//! `vol0` through `up`'s own export and `vol1` through a `trireme nbd` writer of its own,
//! both driven at once by `trireme bench`. A limit on one holds within 5% whatever its
//! writer, and the other goes faster; a change reaches a writer in another process within a
//! second; the limit holds after a node's crash and after the writer itself is killed and
//! another attaches; bad limits are refused with the volume left as it was; a reserve and a
//! weight are kept and shown.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    node_pid, ok, refused, signal, spawn_nbd, stop_nbd, wait_all_in_sync, wait_restarted,
    wait_within, Cluster, BIN,
};

/// Starts a 4K random 50/50 bench of `secs` seconds at 8 in flight on `target`.
fn start(c: &Cluster, target: &str, secs: u32) -> std::process::Child {
    Command::new(BIN)
        .arg("--data-dir")
        .arg(c.path())
        .args([
            "--output", "json", "bench", "-b4K", "-w50", "-r", "-t1", "-o8", "-W0",
        ])
        .arg(format!("-d{secs}"))
        .arg(target)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The IOPS a bench started by [`start`] measured.
fn iops(c: &Cluster, b: std::process::Child) -> f64 {
    let out = wait_within(b, Duration::from_secs(60), &|| c.log());
    assert!(
        out.status.success(),
        "bench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["iops"].as_f64().unwrap()
}

/// Both targets at once for `secs`: their IOPS.
fn both(c: &Cluster, a: &str, b: &str, secs: u32) -> (f64, f64) {
    let (x, y) = (start(c, a, secs), start(c, b, secs));
    (iops(c, x), iops(c, y))
}

/// At most 5% over the limit (the limiter's promise, its burst included) and at least 90%
/// of it: the lower side is the machine keeping up over a short run whose start the bench
/// counts too (a fresh-clone CI once measured 0.944x).
fn near_limit(got: f64, limit: u64, what: &str, c: &Cluster) {
    let r = got / limit as f64;
    assert!(
        (0.90..=1.05).contains(&r),
        "{what}: {got:.0} IOPS against a limit of {limit} ({r:.3}x)\n{}",
        c.log()
    );
}

/// Reads one block at a time from `uri` for `secs` under a limit of 20 IOPS; at 1 s in,
/// removes the limit of `volume`. Prints how long after the command started the reads ran
/// free (the first of ten in a row that take under 10 ms each; at 20 IOPS each waits 50 ms).
const LIFT: &str = r#"
import json, subprocess, sys, threading, time
import nbd
uri, trireme, data_dir, volume = sys.argv[1:5]
h = nbd.NBD()
h.connect_uri(uri)
t0 = time.monotonic()
marks = {}
def lift():
    time.sleep(1.0)
    marks["asked"] = time.monotonic()
    subprocess.run([trireme, "--data-dir", data_dir, "volume", "set", volume,
                    "--iops-limit", "none"], check=True, stdout=subprocess.DEVNULL)
    marks["answered"] = time.monotonic()
th = threading.Thread(target=lift)
th.start()
done, fast, free_at = [], 0, None
while time.monotonic() - t0 < 3.0:
    a = time.monotonic()
    h.pread(4096, (len(done) * 4096) % (32 << 20))
    b = time.monotonic()
    done.append(b)
    fast = fast + 1 if b - a < 0.010 else 0
    if fast == 1:
        first_fast = a
    if fast == 10 and free_at is None:
        free_at = first_fast
th.join()
print(json.dumps({"after_asked": None if free_at is None else free_at - marks["asked"],
                  "set_took": marks["answered"] - marks["asked"], "reads": len(done)}))
"#;

fn lift_within(c: &Cluster, uri: &str, volume: &str) -> serde_json::Value {
    // Debian's python3, which has python3-libnbd.
    let out = Command::new("/usr/bin/python3")
        .args(["-c", LIFT, uri, BIN])
        .arg(c.path())
        .arg(volume)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn limits(c: &Cluster, volume: &str) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_str(&ok(c, &["--output", "json", "volume", "info", volume])).unwrap();
    v["limits"].clone()
}

#[test]
fn a_volumes_limit_holds_whatever_its_writer_and_frees_the_others_share() {
    common::need("/usr/bin/python3");
    let c = Cluster::start(&["--store", "file", "--size", "64M"]);
    ok(&c, &["volume", "create", "vol1", "--size", "64M"]);
    let sock = c.path().join("vol1.sock");
    let (nbd, uri1) = spawn_nbd(&c, "vol1", &sock);
    let uri0 = c.unix.clone();

    // Side by side, unlimited; then vol0 limited to a quarter of what it did.
    let (a0, b0) = both(&c, &uri0, &uri1, 3);
    let limit = ((a0 / 4.0) as u64).max(50);
    let out = ok(
        &c,
        &["volume", "set", "vol0", "--iops-limit", &limit.to_string()],
    );
    assert!(out.contains(&format!("limits iops {limit}")), "{out}");
    let (a1, b1) = both(&c, &uri0, &uri1, 3);
    near_limit(a1, limit, "vol0 limited", &c);
    assert!(
        b1 > b0,
        "vol1 did {b1:.0} IOPS beside vol0 limited to {limit}, {b0:.0} beside it unlimited ({a0:.0})"
    );
    eprintln!("unlimited: vol0 {a0:.0}, vol1 {b0:.0} IOPS; vol0 limited to {limit}: {a1:.0}, vol1 {b1:.0}");
    let st = ok(&c, &["status"]);
    assert!(
        st.contains(&format!("limits: iops {limit} (requests waited")),
        "{st}"
    );

    // A change reaches a writer in another process within a second.
    ok(&c, &["volume", "set", "vol1", "--iops-limit", "20"]);
    std::thread::sleep(Duration::from_millis(1200));
    let lift = lift_within(&c, &uri1, "vol1");
    let after = lift["after_asked"].as_f64();
    eprintln!("a lifted limit: {lift}");
    assert!(
        after.is_some_and(|s| s < 1.0),
        "reads ran free {after:?} s after `volume set` was asked ({lift})"
    );

    // Bad limits: refused, nothing changed.
    refused(&c, &["volume", "set", "vol0", "--iops-limit", "0"], "of 0");
    refused(
        &c,
        &["volume", "set", "vol0", "--iops-limit", "-5"],
        "positive",
    );
    refused(
        &c,
        &["volume", "set", "vol0", "--bps-limit", "fast"],
        "invalid size",
    );
    refused(&c, &["volume", "set", "vol0", "--burst", "2h"], "longest");
    refused(&c, &["volume", "set", "vol0"], "give");
    let over = (limit + 1).to_string();
    refused(
        &c,
        &["volume", "set", "vol0", "--iops-reserve", &over],
        "above the volume's iops limit",
    );
    refused(
        &c,
        &["volume", "set", "vol0", "--weight", "0"],
        "invalid weight",
    );
    refused(
        &c,
        &["volume", "set", "vol0", "--weight", "1001"],
        "invalid weight",
    );
    assert_eq!(limits(&c, "vol0"), serde_json::json!({ "iops": limit }));
    // A reserve and a weight (the nodes serve by them when busy), shown, then removed.
    let half = (limit / 2).to_string();
    let out = ok(
        &c,
        &[
            "volume",
            "set",
            "vol0",
            "--iops-reserve",
            &half,
            "--weight",
            "4",
        ],
    );
    assert!(
        out.contains(&format!("iops-reserve {half}, weight 4")),
        "{out}"
    );
    assert_eq!(
        limits(&c, "vol0"),
        serde_json::json!({ "iops": limit, "iops_reserve": limit / 2, "weight": 4 })
    );
    ok(
        &c,
        &[
            "volume",
            "set",
            "vol0",
            "--iops-reserve",
            "none",
            "--weight",
            "none",
        ],
    );
    assert_eq!(limits(&c, "vol0"), serde_json::json!({ "iops": limit }));

    // A node crashes and comes back: vol0's writer keeps its limit.
    let p1 = node_pid(&c, 1);
    signal(p1, libc::SIGKILL);
    wait_restarted(&c, 1, p1);
    wait_all_in_sync(&c);
    near_limit(
        iops(&c, start(&c, &uri0, 3)),
        limit,
        "vol0 after a node crash",
        &c,
    );

    // vol1's writer is killed and another attaches: it takes the limit from the record.
    let limit1 = (limit / 2).max(50);
    ok(
        &c,
        &["volume", "set", "vol1", "--iops-limit", &limit1.to_string()],
    );
    let mut nbd = nbd;
    nbd.kill().unwrap();
    nbd.wait().unwrap();
    let _ = std::fs::remove_file(&sock);
    let (nbd, uri1) = spawn_nbd(&c, "vol1", Path::new(&sock));
    near_limit(
        iops(&c, start(&c, &uri1, 3)),
        limit1,
        "vol1 after its writer was replaced",
        &c,
    );
    policies(&c, &uri0, &uri1, limit);
    reserves(&c);
    stop_nbd(nbd);
}

/// Reserves against what the nodes can serve: unchecked until a node's capacity is declared
/// (`node set`), then a reserve past it is warned of, naming each node's total, in the reply,
/// `status` and `node list`; bad capacities are refused.
fn reserves(c: &Cluster) {
    for (args, says) in [
        (&["node", "set", "1", "--iops-capacity", "0"][..], "of 0"),
        (&["node", "set", "1", "--iops-capacity", "-5"], "positive"),
        (
            &["node", "set", "1", "--iops-capacity", "lots"],
            "invalid IOPS capacity",
        ),
        (
            &["node", "set", "99", "--iops-capacity", "5k"],
            "not registered",
        ),
        (&["node", "set", "1"], "give --iops-capacity"),
    ] {
        refused(c, args, says);
    }
    // Off the aggregated policy: its share would cap vol0's reserve.
    ok(c, &["volume", "set", "vol0", "--qos-policy", "none"]);
    let out = ok(c, &["volume", "set", "vol0", "--iops-reserve", "30"]);
    assert!(
        out.contains("warning: reserves not checked on nodes 1, 2, 3: no IOPS capacity declared"),
        "{out}"
    );
    for n in ["1", "2", "3"] {
        let out = ok(c, &["node", "set", n, "--iops-capacity", "50"]);
        assert!(
            out.contains("IOPS capacity 50") && !out.contains("warning"),
            "{out}"
        );
    }
    let reply: serde_json::Value = serde_json::from_str(&ok(
        c,
        &[
            "--output",
            "json",
            "volume",
            "set",
            "vol1",
            "--iops-reserve",
            "30",
        ],
    ))
    .unwrap();
    let over = "reserves add up to 60 IOPS (vol0 30, vol1 30), above the 50 it can serve";
    let warnings = reply["warnings"].as_array().cloned().unwrap_or_default();
    assert_eq!(warnings.len(), 3, "{reply}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("node 1: {over}")),
        "{reply}"
    );
    let st = ok(c, &["status"]);
    assert!(st.contains(&format!("warning: node 2: {over}")), "{st}");
    assert!(ok(c, &["node", "list"]).contains("60/50 (over)"));
    // More room on node 1: it no longer warns; the others still do.
    ok(c, &["node", "set", "1", "--iops-capacity", "1k"]);
    let st = ok(c, &["status"]);
    assert!(
        !st.contains("warning: node 1:") && st.contains("warning: node 3:"),
        "{st}"
    );
    for n in ["1", "2", "3"] {
        let out = ok(c, &["node", "set", n, "--iops-capacity", "none"]);
        assert!(out.contains("no IOPS capacity declared"), "{out}");
    }
    for v in ["vol0", "vol1"] {
        ok(c, &["volume", "set", v, "--iops-reserve", "none"]);
    }
    assert!(!ok(c, &["status"]).contains("warning:"));
}

/// QoS policies: an aggregated one holds vol0 (`up`'s own writer) and vol1 (a `trireme nbd`
/// beside it) together within its limit, and gives a volume alone what the other leaves; a
/// dedicated one gives a volume its limits whole and follows its changes; bad names and a
/// delete of a policy in use are refused.
fn policies(c: &Cluster, uri0: &str, uri1: &str, pool: u64) {
    let qos = |v: &str| -> serde_json::Value {
        let i: serde_json::Value =
            serde_json::from_str(&ok(c, &["--output", "json", "volume", "info", v])).unwrap();
        i["qos"].clone()
    };
    refused(
        c,
        &["qos", "policy", "create", "none", "--iops-limit", "100"],
        "may not be named",
    );
    refused(
        c,
        &["volume", "set", "vol0", "--qos-policy", "nosuch"],
        "no QoS policy",
    );
    let p = pool.to_string();
    ok(
        c,
        &[
            "qos",
            "policy",
            "create",
            "pair",
            "--iops-limit",
            &p,
            "--aggregated",
        ],
    );
    refused(
        c,
        &["qos", "policy", "create", "pair", "--iops-limit", "5"],
        "already exists",
    );
    // Off their own limits and under the policy in one change (a writer beside `up` would
    // otherwise run free until it sees the second); then a second for vol1's writer to see it.
    for v in ["vol0", "vol1"] {
        ok(
            c,
            &[
                "volume",
                "set",
                v,
                "--iops-limit",
                "none",
                "--qos-policy",
                "pair",
            ],
        );
    }
    std::thread::sleep(Duration::from_millis(1200));
    // The bench that ends last has the whole policy for its last moments (the other's share
    // comes to it within a second or two): 15% over at most, in six seconds.
    let (a, b) = both(c, uri0, uri1, 6);
    eprintln!("aggregated policy of {pool} IOPS: vol0 {a:.0}, vol1 {b:.0}");
    let r = (a + b) / pool as f64;
    assert!(
        (0.85..=1.15).contains(&r) && a > 0.3 * pool as f64 && b > 0.3 * pool as f64,
        "vol0 {a:.0} and vol1 {b:.0} IOPS under an aggregated policy of {pool}\n{}",
        c.log()
    );
    // Alone, vol0 takes what vol1 leaves within two seconds or so (half of it all along, were
    // the shares fixed).
    let alone = iops(c, start(c, uri0, 6));
    eprintln!("vol0 alone under it: {alone:.0}");
    assert!(
        alone > 0.62 * pool as f64 && alone < 1.05 * pool as f64,
        "vol0 alone did {alone:.0} IOPS under an aggregated policy of {pool}\n{}",
        c.log()
    );
    let list = ok(c, &["qos", "policy", "list"]);
    assert!(
        list.contains("QoS policy pair") && list.contains("vol1"),
        "{list}"
    );
    refused(c, &["qos", "policy", "delete", "pair"], "vol0, vol1");

    // Dedicated: vol1 keeps its limits whole, and their change at once.
    ok(
        c,
        &[
            "qos",
            "policy",
            "create",
            "each",
            "--iops-limit",
            "77",
            "--weight",
            "3",
        ],
    );
    ok(c, &["volume", "set", "vol1", "--qos-policy", "each"]);
    let each = |iops: u64| serde_json::json!({ "policy": "each", "limits": { "iops": iops, "weight": 3 } });
    assert_eq!(qos("vol1"), each(77));
    ok(c, &["qos", "policy", "set", "each", "--iops-limit", "88"]);
    assert_eq!(qos("vol1"), each(88));
    let st = ok(c, &["status"]);
    assert!(
        st.contains("limits: iops 88, weight 3 under QoS policy each"),
        "{st}"
    );
    ok(c, &["volume", "set", "vol1", "--qos-policy", "none"]);
    assert_eq!(qos("vol1"), serde_json::Value::Null);
    ok(c, &["qos", "policy", "delete", "each"]);
    refused(
        c,
        &["volume", "set", "vol1", "--qos-policy", "each"],
        "no QoS policy",
    );
}
