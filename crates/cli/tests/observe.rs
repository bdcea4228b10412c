//! Seeing a running cluster from outside, with the real tools: a Prometheus server scrapes it
//! (finding every process through `/targets`), and headless Chromium, driven over WebDriver
//! by chromedriver, watches the dashboard while a node is killed.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A cluster whose killed nodes stay down for the test (no restart within it), under a
/// verifying workload.
fn loaded_cluster(secs: u32) -> (Cluster, std::process::Child, String) {
    let c = Cluster::start(&[
        "--store",
        "memory",
        "--size",
        "64M",
        "--restart-backoff",
        "120s",
    ]);
    let http = addr_in(&c.path().join("http"));
    let bench = start_bench(&c, secs);
    (c, bench, http)
}

/// The cluster's HTTP token (`<data-dir>/http-token`).
fn token(c: &Cluster) -> String {
    std::fs::read_to_string(c.path().join("http-token"))
        .unwrap()
        .trim()
        .to_string()
}

/// Runs a PromQL instant query: the result vector.
fn promql(prom: &str, q: &str) -> Vec<serde_json::Value> {
    let v = http_json(prom, &format!("/api/v1/query?query={}", urlencode(q)));
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The value of a one-sample result.
fn value(r: &serde_json::Value) -> f64 {
    r["value"][1].as_str().unwrap().parse().unwrap()
}

/// Polls `q` until `ok` holds of its result, for `within`.
fn wait_promql(
    prom: &str,
    q: &str,
    within: Duration,
    ok: impl Fn(&[serde_json::Value]) -> bool,
    log: &dyn Fn() -> String,
) -> Vec<serde_json::Value> {
    let t0 = Instant::now();
    loop {
        let r = promql(prom, q);
        if ok(&r) {
            return r;
        }
        assert!(
            t0.elapsed() < within,
            "{q} never held in {within:?}: {r:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn prometheus_scrapes_the_cluster_and_sees_a_killed_node() {
    need("prometheus");
    let (c, bench, http) = loaded_cluster(25);
    let tmp = tempfile::tempdir().unwrap();
    // Without the token, nothing is served; with it in a header, all of it.
    for path in ["/metrics", "/targets", "/", "/api/board"] {
        let (code, _) = common::http(&http, "GET", path, None);
        assert_eq!(code, 401, "GET {path} without the token");
    }
    let t = token(&c);
    // The page's address may hold the token: no referrer carries it, no cache keeps a page.
    for auth in [None, Some(format!("Bearer {t}"))] {
        let h: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let head = common::http_head(&http, "/", &h);
        assert!(head.contains("referrer-policy: no-referrer"), "{head}");
        assert!(head.contains("cache-control: no-store"), "{head}");
    }
    let (code, _) = http_with(
        &http,
        "GET",
        "/metrics",
        &[("Authorization", &format!("Bearer {t}x"))],
    );
    assert_eq!(code, 401, "a wrong token");
    let (code, body) = http_with(
        &http,
        "GET",
        "/metrics",
        &[("Authorization", &format!("Bearer {t}"))],
    );
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("trireme_node_up"));
    // One service-discovery entry: `up` lists itself and its nodes; the token file is the
    // credential of the discovery and of every scrape (the nodes share it).
    let tf = c.path().join("http-token");
    let tf = tf.display();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: trireme\n    authorization:\n      credentials_file: {tf}\n    http_sd_configs:\n      - url: http://{http}/targets\n        refresh_interval: 5s\n        authorization:\n          type: Bearer\n          credentials_file: {tf}\n"
    );
    std::fs::write(tmp.path().join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let prom = format!("127.0.0.1:{port}");
    let log_path = tmp.path().join("prometheus.log");
    let _prometheus = Server(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                tmp.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("prometheus"),
    );
    let log = || {
        format!(
            "prometheus:\n{}\ncluster:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default(),
            c.log()
        )
    };
    let within = Duration::from_secs(30);
    // Ready, not just listening: until its storage is open it answers queries with 503.
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&prom).is_err()
        || common::http(&prom, "GET", "/-/ready", None).0 != 200
    {
        assert!(
            t0.elapsed() < within,
            "prometheus did not start:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Every process is found and scraped: the manager and three nodes.
    wait_promql(
        &prom,
        "up{job=\"trireme\"} == 1",
        within,
        |r| r.len() == 4,
        &log,
    );
    // The writer's rate of operations, as Prometheus computes it from the counters.
    let r = wait_promql(
        &prom,
        "sum by (op) (rate(trireme_volume_ops_total{volume=\"vol0\",op=~\"read|write\"}[5s]))",
        within,
        |r| r.len() == 2 && r.iter().all(|s| value(s) > 10.0),
        &log,
    );
    eprintln!("ops rate: {r:?}");
    wait_promql(
        &prom,
        "trireme_replica_state{volume=\"vol0\",state=\"in-sync\"} == 1",
        within,
        |r| r.len() == 3,
        &log,
    );
    // Latency histogram: a p99 that is a real duration.
    let p99 = wait_promql(
        &prom,
        "histogram_quantile(0.99, sum by (le) (rate(trireme_volume_op_duration_seconds_bucket{volume=\"vol0\",op=\"write\"}[5s])))",
        within,
        |r| r.len() == 1 && value(&r[0]) > 0.0,
        &log,
    );
    assert!(value(&p99[0]) < 1.0, "{p99:?}");
    // Each node reports its store, and each process its CPU and memory.
    wait_promql(
        &prom,
        "trireme_store_capacity_bytes > 0",
        within,
        |r| r.len() == 3,
        &log,
    );
    wait_promql(
        &prom,
        "process_resident_memory_bytes{job=\"trireme\"} > 0",
        within,
        |r| r.len() == 4,
        &log,
    );

    grafana_board_queries_hold(&prom);
    // One word per volume and for the cluster.
    wait_promql(
        &prom,
        "trireme_volume_health{volume=\"vol0\",verdict=\"healthy\"} == 1",
        within,
        |r| r.len() == 1,
        &log,
    );
    wait_promql(
        &prom,
        "trireme_cluster_health{verdict=\"healthy\"} == 1",
        within,
        |r| r.len() == 1,
        &log,
    );

    // Kill node 2: its replica leaves the in-sync state, and Prometheus sees it.
    signal(node_pid(&c, 2), libc::SIGKILL);
    let t0 = Instant::now();
    wait_promql(
        &prom,
        "trireme_replica_state{volume=\"vol0\",node=\"2\",state=\"in-sync\"} == 0",
        Duration::from_secs(15),
        |r| r.len() == 1,
        &log,
    );
    wait_promql(
        &prom,
        "trireme_node_up{node=\"2\"} == 0",
        Duration::from_secs(15),
        |r| r.len() == 1,
        &log,
    );
    wait_promql(
        &prom,
        "trireme_volume_health{volume=\"vol0\",verdict=~\"degraded|resyncing\"} == 1",
        Duration::from_secs(15),
        |r| r.len() == 1,
        &log,
    );
    eprintln!(
        "Prometheus saw node 2's replica out after {:?}",
        t0.elapsed()
    );
    // The workload went on, on the two copies left, and lost nothing.
    let v = check_workload(bench, 1000, &|| c.log());
    eprintln!("workload: {}", v["verify"]);
}

/// Every query of the Grafana board in `contrib/grafana` is valid PromQL to this Prometheus,
/// and every metric it names exists (but those of tiers and of drain jobs, which this
/// cluster has none of).
fn grafana_board_queries_hold(prom: &str) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/grafana/trireme.json"
    );
    let board: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for p in board["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() > 15, "{exprs:?}");
    let mut names = std::collections::BTreeSet::new();
    for e in &exprs {
        let q = e
            .replace("$__rate_interval", "5s")
            .replace("$volume", ".*")
            .replace("$job", ".*");
        // Valid PromQL: the query API accepts it.
        promql(prom, &q);
        let mut rest = e.as_str();
        while let Some(i) = rest.find("trireme_").or_else(|| rest.find("process_")) {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            names.insert(name);
        }
    }
    for n in names {
        if n.starts_with("trireme_tier_") || n.starts_with("trireme_move_") {
            continue;
        }
        let r = promql(prom, &format!("count({n})"));
        assert!(
            !r.is_empty(),
            "the Grafana board uses {n}, which no process exports"
        );
    }
}

/// A WebDriver session on headless Chromium.
struct Browser {
    driver: Server,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let driver = Server(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver"),
        );
        let t0 = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = serde_json::json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--window-size=1400,1100",
                        format!("--user-data-dir={}", profile.path().display()),
                    ],
                },
            }},
        });
        let (code, body) = http(&addr, "POST", "/session", Some(&caps.to_string()));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(code, 200, "new session: {v}");
        let session = v["value"]["sessionId"].as_str().unwrap().to_string();
        Browser {
            driver,
            addr,
            session,
            _profile: profile,
        }
    }

    fn call(&self, method: &str, what: &str, body: serde_json::Value) -> serde_json::Value {
        let path = format!("/session/{}/{what}", self.session);
        let (code, out) = http(&self.addr, method, &path, Some(&body.to_string()));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(code, 200, "{method} {what}: {v}");
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "url", serde_json::json!({ "url": url }));
    }

    fn eval(&self, script: &str) -> serde_json::Value {
        self.call(
            "POST",
            "execute/sync",
            serde_json::json!({ "script": script, "args": [] }),
        )
    }

    /// Saves a PNG of the page under `target/test-artifacts/` (kept, not committed).
    fn screenshot(&self, name: &str) -> std::path::PathBuf {
        use base64::Engine;
        let png = self.call("GET", "screenshot", serde_json::json!({}));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .unwrap()
            .join("test-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session: chromedriver stops its Chromium.
        let _ = http(
            &self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = &self.driver;
    }
}

/// What the page shows now, read from its DOM.
const PAGE_STATE: &str = r#"
const q = (s) => document.querySelector(s);
const chart = q('#iops-chart');
return {
  samples: Number(document.body.dataset.samples || 0),
  marker: window.__marker || null,
  nodes: [...document.querySelectorAll('#nodes tr[data-node]')].map(r => [r.dataset.node, r.dataset.state]),
  replicas: [...document.querySelectorAll('#volumes tr[data-replica]')].map(r => [r.dataset.replica, r.dataset.state]),
  volume: !!q('#volumes td[data-volume="vol0"]'),
  layout: (q('#volumes td[data-volume="vol0"]') || {dataset: {}}).dataset.layout || null,
  layout_text: ((q('#volumes td[data-volume="vol0"] .legend') || {}).textContent) || null,
  limits: ((q('#volumes td[data-volume="vol0"] .limits') || {}).textContent) || null,
  verdict: q('#health').dataset.verdict || null,
  iops_last: Number(chart.dataset.last || 0),
  iops_points: Number(chart.dataset.points || 0),
  chart: chart.toDataURL().length + ':' + chart.toDataURL().slice(-64),
  events: [...document.querySelectorAll('#events div[data-kind]')].map(e => e.dataset.kind + ' ' + e.textContent),
};
"#;

#[test]
fn the_dashboard_shows_the_cluster_live_in_a_real_browser() {
    need("chromedriver");
    need("chromium");
    let (c, bench, http_addr) = loaded_cluster(25);
    // Limits the bench never reaches, to be shown.
    ok(
        &c,
        &[
            "volume",
            "set",
            "vol0",
            "--iops-limit",
            "1000000",
            "--weight",
            "2",
        ],
    );
    let b = Browser::start();
    // Without the token the page is refused; with it once in the URL, the page and its
    // event stream work (a cookie carries it).
    b.open(&format!("http://{http_addr}/"));
    let refused = b.eval("return document.body.innerText");
    assert!(
        refused.as_str().unwrap().contains("needs its token"),
        "{refused}"
    );
    b.open(&format!("http://{http_addr}/?token={}", token(&c)));

    // The page fills in from the event stream: three nodes up, the volume and its replicas in
    // sync, and an IOPS chart that moves.
    let t0 = Instant::now();
    let first = loop {
        let s = b.eval(PAGE_STATE);
        let ready = s["samples"].as_u64().unwrap_or(0) >= 3
            && s["iops_last"].as_f64().unwrap_or(0.0) > 0.0
            && s["nodes"].as_array().is_some_and(|n| n.len() == 3);
        if ready {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the page did not fill in: {s}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(first["volume"].as_bool().unwrap(), "{first}");
    assert_eq!(first["layout"], "mirror", "{first}");
    assert_eq!(
        first["layout_text"], "mirror, survives 2 lost, 33% usable",
        "{first}"
    );
    assert_eq!(first["verdict"], "healthy", "{first}");
    assert_eq!(first["limits"], "limits: iops 1000000, weight 2", "{first}");
    for n in first["nodes"].as_array().unwrap() {
        assert_eq!(n[1], "up", "{first}");
    }
    let replicas = first["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3, "{first}");
    for r in replicas {
        assert_eq!(r[1], "in-sync", "{first}");
    }
    std::thread::sleep(Duration::from_millis(2100));
    let later = b.eval(PAGE_STATE);
    assert!(
        later["samples"].as_u64() > first["samples"].as_u64(),
        "no new samples: {first} then {later}"
    );
    assert!(
        later["iops_points"].as_u64() > first["iops_points"].as_u64(),
        "{later}"
    );
    assert_ne!(
        later["chart"], first["chart"],
        "the IOPS chart did not change"
    );
    let shot = b.screenshot("dashboard-under-load.png");
    eprintln!("screenshot: {}", shot.display());

    // Kill node 2; the page shows it within 2 s, without a reload (the marker set on this
    // page survives).
    b.eval("window.__marker = 'same page'; return null;");
    signal(node_pid(&c, 2), libc::SIGKILL);
    let t0 = Instant::now();
    let seen = loop {
        let s = b.eval(PAGE_STATE);
        let node2 = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n[0] == "2")
            .cloned();
        let replica2 = s["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == "vol0:2")
            .cloned();
        if node2.is_some_and(|n| n[1] == "down") && replica2.is_some_and(|r| r[1] != "in-sync") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the page did not show node 2 down within 2 s: {s}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t0.elapsed();
    assert_eq!(seen["marker"], "same page", "the page was reloaded: {seen}");
    assert_eq!(seen["verdict"], "degraded", "the cluster's word: {seen}");
    eprintln!("node 2 shown down after {took:?}: {seen}");
    // The events list says so too (it may take one more sample).
    let t1 = Instant::now();
    loop {
        let s = b.eval(PAGE_STATE);
        let evs = s["events"].as_array().unwrap();
        if evs
            .iter()
            .any(|e| e.as_str().unwrap().starts_with("node-down"))
        {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "no node-down event: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let shot = b.screenshot("dashboard-node-down.png");
    eprintln!("screenshot: {}", shot.display());
    drop(b);
    check_workload(bench, 1000, &|| c.log());
}

/// A cluster on etcd whose writer is a process of its own (`trireme attach`, as on a client
/// host): the manager's dashboard charts that writer's I/O from the report it writes to etcd,
/// and the events the page lists outlive the manager — the next one, in another daemon,
/// shows them on its own dashboard.
#[test]
fn the_dashboard_charts_a_remote_writer_and_keeps_its_events_across_a_manager_kill() {
    need("etcd");
    need("chromedriver");
    need("chromium");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (cport, pport) = (free_port(), free_port());
    let etcd_url = format!("127.0.0.1:{cport}");
    let mut procs = vec![Server(
        Command::new("etcd")
            .args([
                "--name=m0".to_string(),
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{cport}"),
                format!("--advertise-client-urls=http://127.0.0.1:{cport}"),
                format!("--listen-peer-urls=http://127.0.0.1:{pport}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{pport}"),
                format!("--initial-cluster=m0=http://127.0.0.1:{pport}"),
                "--log-level=warn".to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("etcd.log")).unwrap())
            .spawn()
            .unwrap(),
    )];
    common::wait_listening(&mut procs[0].0, cport, &d.join("etcd.log"));
    let trireme = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.current_dir(d)
            .env("TRIREME_ETCD", &etcd_url)
            .env("TRIREME_LOG", "info")
            .args(args);
        c
    };
    let log = || {
        let mut s = String::new();
        for i in 1..=3 {
            let p = d.join(format!("node-{i}.log"));
            s += &format!("--- {}\n", p.display());
            s += &std::fs::read_to_string(p).unwrap_or_default();
        }
        s
    };
    let node = |id: u32| {
        Server(
            trireme(&["node", "run", "--id", &id.to_string()])
                .args(["--listen", "127.0.0.1:0", "--insecure", "--store", "memory"])
                .args(["--lease-ttl", "2s", "--http", "127.0.0.1:0", "--dir"])
                .arg(d.join(format!("node-{id}")))
                .stdout(Stdio::null())
                .stderr(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(d.join(format!("node-{id}.log")))
                        .unwrap(),
                )
                .spawn()
                .unwrap(),
        )
    };
    let mut nodes: Vec<Option<Server>> = (1..=3).map(|i| Some(node(i))).collect();
    let status = || -> Option<serde_json::Value> {
        let o = trireme(&["--output", "json", "status"]).output().ok()?;
        serde_json::from_slice(&o.stdout).ok()
    };
    let manager = |not: u32| -> u32 {
        let t0 = Instant::now();
        loop {
            let m = status()
                .filter(|s| s["nodes"].as_array().is_some_and(|n| n.len() == 3))
                .and_then(|s| s["manager"]["node"].as_u64())
                .map(|n| n as u32);
            if let Some(m) = m.filter(|&m| m != not) {
                return m;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no manager:\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let m1 = manager(0);
    run(&mut trireme(&[
        "volume",
        "create",
        "vol0",
        "--size",
        "64M",
        "--replicas",
        "2",
    ]));
    // The writer: a process of its own, like a client host's.
    let sock = d.join("vol0.sock");
    let mut writer = trireme(&["attach", "vol0", "--lease-ttl", "2s", "--socket"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.join("attach.log")).unwrap())
        .spawn()
        .unwrap();
    {
        use std::io::Read;
        let mut first = [0u8; 1];
        let _ = writer.stdout.as_mut().unwrap().read(&mut first);
    }
    procs.push(Server(writer));
    let bench = Command::new(BIN)
        .args([
            "--output", "json", "bench", "--verify", "-b4K", "-w30", "-r", "-t1", "-o4", "-d25",
            "-W0",
        ])
        .arg(format!("nbd+unix:///vol0?socket={}", sock.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let board = |m: u32| -> String {
        let nd = d.join(format!("node-{m}"));
        let addr = addr_in(&nd.join("http"));
        let token = std::fs::read_to_string(nd.join("http-token")).unwrap();
        format!("http://{addr}/?token={}", token.trim())
    };
    let b = Browser::start();
    b.open(&board(m1));
    let t0 = Instant::now();
    let first = loop {
        let s = b.eval(PAGE_STATE);
        if s["iops_last"].as_f64().unwrap_or(0.0) > 0.0 && s["volume"] == true {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the manager's page never charted the remote writer's I/O: {s}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let listed = |s: &serde_json::Value, kind: &str, text: &str| {
        s["events"].as_array().unwrap().iter().any(|e| {
            let e = e.as_str().unwrap_or("");
            e.starts_with(kind) && e.contains(text)
        })
    };
    assert!(listed(&first, "volume", "volume vol0 created"), "{first}");
    let shot = b.screenshot("dashboard-remote-writer.png");
    eprintln!("screenshot: {}", shot.display());

    // The manager's daemon dies; the next manager's page lists the same events, and its own.
    nodes[m1 as usize - 1] = None;
    let m2 = manager(m1);
    b.open(&board(m2));
    let t0 = Instant::now();
    loop {
        let s = b.eval(PAGE_STATE);
        let took = format!("node {m2} took the manager role");
        if listed(&s, "volume", "volume vol0 created") && listed(&s, "manager", &took) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the next manager's page lost the events: {s}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(b);
    check_workload(bench, 300, &log);
    drop(nodes);
    drop(procs);
}
