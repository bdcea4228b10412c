//! NVMe/TCP between hosts: a volume served by `trireme nvmf serve` on two servers of a
//! cluster on etcd (network namespaces on a bridge), a host that runs our NVMe/TCP initiator
//! with multipath (`trireme bench nvme+tcp://A,B/NQN --verify`), the optimized server killed
//! -9 mid-job and later the other stopped: the host sees no error and no write is lost, the
//! copies stay identical, and a host not on the access list is refused at Connect.

mod common;
#[allow(dead_code)] // the etcd test uses the rest of the world
mod etcd_world;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{signal, BIN};
use etcd_world::*;

const BENCH_HOST: &str = "nqn.2026-12.io.trireme:bench";
const NQN: &str = "nqn.2026-12.io.trireme:trireme:vol";

struct Target {
    child: Child,
    log: std::path::PathBuf,
    addr: String,
    port_id: u64,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Target {
    fn holds_writer(&self) -> bool {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains("its path is ANA optimized")
    }
}

/// `nvmf serve vol` on client host `host` with port id `port_id`; returns once it listens.
fn serve(w: &World, host: usize, port_id: u32, tag: &str) -> Target {
    let h = w.clients[host].clone();
    let addr = format!("{}:4420", h.ip);
    let log = w.dir.path().join(format!("nvmf-{tag}.log"));
    let mut child = w
        .cmd_on(&h)
        .args([
            "nvmf",
            "serve",
            "vol",
            "--listen",
            &addr,
            "--lease-ttl",
            "3s",
        ])
        .args(["--port-id", &port_id.to_string()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let line = String::from_utf8_lossy(&line).to_string();
    assert_eq!(line, format!("nvme/tcp {addr} {NQN}"), "{}", w.log());
    Target {
        child,
        log,
        addr,
        port_id: port_id.into(),
    }
}

fn wait_for(what: &str, limit: Duration, w: &World, cond: &dyn Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}\n{}", w.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nvme_tcp_multipath_fails_over_between_servers_without_an_error() {
    if skipped() {
        return;
    }
    let w = World::start(1, 3, 3);
    w.cli_ok(&[
        "volume",
        "create",
        "vol",
        "--size",
        "64M",
        "--replicas",
        "3",
    ]);
    w.cli_ok(&[
        "volume", "access", "vol", "--allow", BENCH_HOST, "--deny", "*",
    ]);
    let info = w.cli_ok(&["--output", "json", "volume", "info", "vol"]);
    assert!(info.contains(BENCH_HOST), "{info}");
    // The direct client (what NVMe/TCP's numbers compare with) benches the volume on etcd
    // too, as its writer for the run; it detaches cleanly, leaving no writer behind.
    let direct = w
        .cmd_on(&w.clients[2])
        .args([
            "--output", "json", "bench", "-b4K", "-r", "-w50", "-d2", "-W0", "--verify",
        ])
        .arg("volume:vol")
        .output()
        .unwrap();
    assert!(direct.status.success(), "{direct:?}\n{}", w.log());
    let v: serde_json::Value = serde_json::from_slice(&direct.stdout).unwrap();
    assert!(v["iops"].as_f64().unwrap() > 0.0, "{v}");
    assert!(w.status()["volumes"][0]["writer"].is_null());
    let mut a = serve(&w, 0, 1, "a");
    wait_for(
        "server A takes the writer",
        Duration::from_secs(20),
        &w,
        &|| a.holds_writer(),
    );
    let b = serve(&w, 1, 2, "b");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !b.holds_writer(),
        "B is a standby while A holds the volume\n{}",
        w.log()
    );
    // `status` shows both exports with their ANA states; `volume info` names the NQN.
    wait_for(
        "status shows both exports",
        Duration::from_secs(10),
        &w,
        &|| {
            exports(&w)
                == [
                    ana(1, &a.addr, "optimized"),
                    ana(2, &b.addr, "inaccessible"),
                ]
        },
    );
    let info = w.cli_ok(&["volume", "info", "vol"]);
    assert!(
        info.contains(&format!("nvme/tcp {NQN}")) && info.contains("port 2"),
        "{info}"
    );
    // Operators' mistakes that would break a host's multipath are refused at start: a port
    // id another server holds, or another cluster name (another NQN) for the same volume.
    let refused = |args: &[&str]| {
        let o = w
            .cmd_on(&w.clients[2])
            .args(["nvmf", "serve", "vol", "--listen"])
            .arg(format!("{}:4420", w.clients[2].ip))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let why = refused(&["--port-id", "1"]);
    assert!(
        why.contains("port id 1 of volume vol is served by pid"),
        "{why}"
    );
    let why = refused(&["--port-id", "3", "--cluster", "typo"]);
    assert!(
        why.contains(&format!("is exported as {NQN}")) && why.contains(":typo:vol"),
        "{why}"
    );

    // A host not on the access list is refused at Connect.
    let stranger = w.clients[2]
        .cmd(BIN)
        .args(["bench", "-d1", "-W0", "-b4K"])
        .arg(format!(
            "nvme+tcp://{}/{NQN}?hostnqn=nqn.2014-08.org.nvmexpress:uuid:mallory",
            a.addr
        ))
        .output()
        .unwrap();
    assert!(!stranger.status.success());
    let err = String::from_utf8_lossy(&stranger.stderr);
    assert!(
        err.contains("status 0x4184"),
        "Connect Invalid Host (with DNR): {err}"
    );

    let uri = format!("nvme+tcp://{},{}/{NQN}", a.addr, b.addr);
    let bench = w.clients[2]
        .cmd(BIN)
        .args([
            "--output", "json", "bench", "--verify", "-b4K", "-w40", "-r", "-t2", "-o8", "-d24",
            "-W0",
        ])
        .arg(&uri)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its host is connected on both paths, as status says.
    wait_for("status shows the host", Duration::from_secs(4), &w, &|| {
        w.status()["volumes"][0]["nvmf"]
            .as_array()
            .is_some_and(|l| l.len() == 2 && l.iter().all(|e| e["hosts"][0] == BENCH_HOST))
    });
    std::thread::sleep(Duration::from_secs(2));
    // The optimized server dies mid-job: a standby takes the writer when A's lease expires.
    signal(a.child.id() as i32, libc::SIGKILL);
    let _ = a.child.wait();
    // Its service manager starts it again at once: it waits for the dead one's export record
    // to go (not refused for its port id), then races B for the writer, as a standby.
    drop(a);
    let a2 = serve(&w, 0, 1, "a2");
    wait_for(
        "a standby takes the writer",
        Duration::from_secs(30),
        &w,
        &|| b.holds_writer() || a2.holds_writer(),
    );
    let (first, second) = match b.holds_writer() {
        true => (b, a2),
        false => (a2, b),
    };
    std::thread::sleep(Duration::from_secs(1));
    assert!(!second.holds_writer());
    // Then the writer is stopped (a drain): the other takes the writer at once.
    let t0 = Instant::now();
    signal(first.child.id() as i32, libc::SIGTERM);
    wait_for(
        "the other server takes the writer",
        Duration::from_secs(20),
        &w,
        &|| second.holds_writer(),
    );
    eprintln!("handover after SIGTERM: {:?}", t0.elapsed());
    let v = common::check_workload(bench, 500, &|| w.log());
    eprintln!("{}", v["verify"]);
    w.verify();
    drop(first);
    let id = second.port_id;
    wait_for(
        "the stopped one's export goes with it",
        Duration::from_secs(10),
        &w,
        &|| exports(&w) == [ana(id, &second.addr, "optimized")],
    );

    // A writer that another supersedes (an operator's forced attach) turns its path
    // inaccessible and is a standby again; it takes the writer back when the volume is free.
    let mut forced = w
        .cmd_on(&w.clients[2])
        .args(["attach", "vol", "--force", "--socket"])
        .arg(w.dir.path().join("forced.sock"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(w.dir.path().join("forced.log")).unwrap())
        .spawn()
        .unwrap();
    wait_for(
        "its path turns inaccessible",
        Duration::from_secs(20),
        &w,
        &|| exports(&w) == [ana(id, &second.addr, "inaccessible")],
    );
    assert!(std::fs::read_to_string(&second.log)
        .unwrap()
        .contains("a standby again"));
    signal(forced.id() as i32, libc::SIGTERM);
    let _ = forced.wait();
    wait_for(
        "it takes the writer back",
        Duration::from_secs(20),
        &w,
        &|| exports(&w) == [ana(id, &second.addr, "optimized")],
    );
    w.verify();
    drop(second);
}

/// `status`'s exports of the volume: (port id, address, ANA state).
fn exports(w: &World) -> Vec<(u64, String, String)> {
    let s = w.status();
    s["volumes"][0]["nvmf"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|e| {
                    (
                        e["port_id"].as_u64().unwrap_or(0),
                        e["addr"].as_str().unwrap_or("").to_string(),
                        e["ana"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn ana(port_id: u64, addr: &str, state: &str) -> (u64, String, String) {
    (port_id, addr.to_string(), state.to_string())
}
