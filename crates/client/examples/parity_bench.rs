//! A parity volume against a 3-way mirror on the same three nodes, side by side (issue 67).
//!
//! `cargo run --release -p trireme-client --example parity_bench -- [SECONDS] [MIB] [DIR] [K+M] [same]`
//!
//! K+M nodes (default 2+1) in this process, each over a sparse file store (O_DIRECT) in DIR
//! (default /var/tmp), served over TCP on 127.0.0.1. A K+M parity volume on all of them and
//! a 3-way mirror on the first three, of MIB MiB each (default 256). Each phase runs SECONDS
//! seconds (default 5) per volume, the two volumes taking turns in two rounds so drift on a
//! shared host hits both; the table gives each side's total and their ratio.
//!
//! 1. hot 4 KiB random writes into the part still mirrored (the first fifth), QD1 and QD16
//!    (`same`: only into regions mirrored on nodes 1-3, the mirror's own nodes);
//! 2. the encoder: every other region into a stripe (volume bytes a second);
//! 3. cold 4 KiB random writes into encoded regions (the overlay), QD1 and QD16;
//! 4. 4 KiB random reads of encoded regions, QD1: against the mirror; then the parity
//!    volume healthy and with one node failing every read (an error-injecting store), taking
//!    turns, so a third of them are rebuilt from K chunks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use trireme_client::{AttachInfo, ReplicaTarget, Volume};
use trireme_replication::{Layout, Parity, ReplicaState, Stripes};
use trireme_store::{FaultyStore, FileStore, Store};
use trireme_transport::{Handler, TransportKind};

const PARITY: u64 = 1;
const MIRROR: u64 = 2;

struct Args {
    seconds: u64,
    size: u64,
    dir: PathBuf,
    parity: Parity,
    same_nodes: bool,
}

fn args() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| -> Result<u64, String> {
        a.get(i).map_or(Ok(d), |s| {
            s.parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("`{s}`: not a positive number"))
        })
    };
    Ok(Args {
        seconds: num(0, 5)?,
        size: num(1, 256)? << 20,
        dir: a
            .get(2)
            .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from),
        parity: Parity::parse(a.get(3).map_or("2+1", String::as_str), None)
            .map_err(|e| e.to_string())?,
        same_nodes: match a.get(4).map(String::as_str) {
            None => false,
            Some("same") => true,
            Some(other) => {
                return Err(format!(
                    "`{other}`: the fifth argument is `same` or nothing"
                ))
            }
        },
    })
}

/// Starts a node over a file store in `dir` (failing reads while `faults` says `read=1`).
async fn node(
    id: u32,
    dir: &std::path::Path,
    faults: &std::path::Path,
    sizes: &[(u64, u64)],
) -> ReplicaTarget {
    let files: Arc<dyn Store> =
        Arc::new(FileStore::open_thin(&dir.join(format!("node{id}"))).unwrap());
    let store = Arc::new(FaultyStore::new(files, faults));
    let node = Arc::new(trireme_node::Node::new(id, store));
    for &(volume, size) in sizes {
        // The parity volume's copies keep held maps, as they must (`node/src/held.rs`).
        let mut h = trireme_proto::Header {
            volume,
            length: size,
            ..trireme_proto::Header::request(trireme_proto::Op::CreateReplica, 0)
        };
        if volume == PARITY {
            h.flags |= trireme_proto::FLAG_HELD;
        }
        let created = node
            .clone()
            .handle(trireme_transport::Frame::new(h, Bytes::new()))
            .await;
        assert_eq!(created.header.status, trireme_proto::Status::Ok, "create");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(trireme_transport::tcp::serve(listener, node));
    ReplicaTarget {
        node: id,
        addr,
        local_addr: None,
        state: ReplicaState::InSync,
        incarnation: 0,
        follows: None,
    }
}

fn info(id: u64, size: u64, replicas: Vec<ReplicaTarget>, layout: Layout) -> AttachInfo {
    AttachInfo {
        name: format!("v{id}"),
        id,
        size,
        epoch: 1,
        replicas,
        reconcile: false,
        min_copies: 0,
        preallocate: false,
        layout,
        regions: Vec::new(),
        limits: Default::default(),
    }
}

/// What one timed run did.
#[derive(Default)]
struct Tally {
    ops: u64,
    secs: f64,
    lat: Vec<u32>,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.ops += o.ops;
        self.secs += o.secs;
        self.lat.extend(o.lat);
    }
    fn iops(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
    fn p50_us(&mut self) -> f64 {
        self.pct(0.5)
    }
    fn pct(&mut self, q: f64) -> f64 {
        self.lat.sort_unstable();
        let i = ((self.lat.len() as f64 * q) as usize).min(self.lat.len().saturating_sub(1));
        self.lat.get(i).copied().unwrap_or(0) as f64
    }
}

#[derive(Clone, Copy)]
enum Io {
    Write,
    Read,
}

/// `depth` tasks doing 4 KiB `io` at random blocks `pick` gives, for `secs` seconds.
async fn run(
    v: &Arc<Volume>,
    io: Io,
    depth: usize,
    secs: u64,
    pick: Arc<dyn Fn(u64) -> u64 + Send + Sync>,
) -> Tally {
    let end = Instant::now() + Duration::from_secs(secs);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..depth)
        .map(|k| {
            let (v, pick) = (v.clone(), pick.clone());
            tokio::spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ ((k as u64 + 1) * 0x2545_f491);
                let mut t = Tally::default();
                let data = Bytes::from(vec![k as u8 ^ 0x5a; 4096]);
                while Instant::now() < end {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = pick(x) * 4096;
                    let s = Instant::now();
                    match io {
                        Io::Write => v.write(at, data.clone(), false).await.map(|_| ()),
                        Io::Read => v.read(at, 4096).await.map(|_| ()),
                    }
                    .expect("I/O");
                    t.lat.push(s.elapsed().as_micros() as u32);
                    t.ops += 1;
                }
                t
            })
        })
        .collect();
    let mut all = Tally::default();
    for t in tasks {
        let t = t.await.unwrap();
        all.ops += t.ops;
        all.lat.extend(t.lat);
    }
    all.secs = t0.elapsed().as_secs_f64();
    all
}

/// Both volumes, taking turns over two rounds: (mirror, parity).
async fn side_by_side(
    m: &Arc<Volume>,
    p: &Arc<Volume>,
    io: Io,
    depth: usize,
    secs: u64,
    pick: Arc<dyn Fn(u64) -> u64 + Send + Sync>,
) -> (Tally, Tally) {
    let (mut a, mut b) = (Tally::default(), Tally::default());
    for _ in 0..2 {
        a.add(run(m, io, depth, secs.div_ceil(2), pick.clone()).await);
        b.add(run(p, io, depth, secs.div_ceil(2), pick.clone()).await);
    }
    (a, b)
}

fn row(what: &str, (mut m, mut p): (Tally, Tally)) {
    println!(
        "| {what} | {:.0} | {:.0} | {:.2}x | {:.0} | {:.0} |",
        m.iops(),
        p.iops(),
        p.iops() / m.iops().max(1e-9),
        m.p50_us(),
        p.p50_us()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("parity_bench: {e}\nusage: parity_bench [SECONDS] [MIB] [DIR] [K+M] [same]");
            std::process::exit(2);
        }
    };
    let work = Work(
        a.dir
            .join(format!("trireme-parity-bench-{}", std::process::id())),
    );
    // Only the last node reads this spec: the others' never exists.
    let faults = work.0.join("faults");
    let parity = a.parity;
    let width = u32::from(parity.data + parity.parity);
    let stripes = Stripes::new(&parity, (1..=width).collect()).unwrap();
    let size = a.size.div_ceil(stripes.region_blocks() * 4096) * stripes.region_blocks() * 4096;
    let replica = stripes.replica_blocks(size / 4096) * 4096;
    let sizes = [(PARITY, replica), (MIRROR, size)];
    let mut targets = Vec::new();
    for id in 1..=width {
        let spec = match id {
            n if n == width => faults.clone(),
            _ => work.0.join("no-faults"),
        };
        let holds = if id <= 3 { &sizes[..] } else { &sizes[..1] };
        targets.push(node(id, &work.0, &spec, holds).await);
    }
    let p = Arc::new(
        Volume::attach(
            info(PARITY, size, targets.clone(), Layout::Parity(parity)),
            TransportKind::Tcp,
            1,
        )
        .await
        .unwrap(),
    );
    let m = Arc::new(
        Volume::attach(
            info(MIRROR, size, targets[..3].to_vec(), Layout::Mirror),
            TransportKind::Tcp,
            1,
        )
        .await
        .unwrap(),
    );
    // Fill both, so reads and encodes move real bytes.
    let mib = Bytes::from((0..1 << 20).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    for v in [&m, &p] {
        for at in (0..size).step_by(1 << 20) {
            let len = (size - at).min(1 << 20) as usize;
            v.write(at, mib.slice(..len), false).await.unwrap();
        }
        v.flush().await.unwrap();
    }
    let blocks = size / 4096;
    let region_blocks = stripes.region_blocks();
    let regions = blocks / region_blocks;
    println!("parity {}+{} on {width} nodes against a 3-way mirror on three of them, all in one process (file stores in {}, TCP on 127.0.0.1), {} MiB each, {} s a phase", parity.data, parity.parity, work.0.display(), size >> 20, a.seconds);
    println!();
    println!("| 4 KiB random | mirror IOPS | parity IOPS | parity/mirror | mirror p50 us | parity p50 us |");
    println!("|---|---|---|---|---|---|");
    // `same`: hot writes only to regions mirrored on nodes 1-3, the mirror's own nodes.
    let w = u64::from(width);
    let hot: Arc<dyn Fn(u64) -> u64 + Send + Sync> = match a.same_nodes {
        true => Arc::new(move |x| {
            let r = w * ((x >> 20) % (regions / 5 / w).max(1));
            r * region_blocks + x % region_blocks
        }),
        false => Arc::new(move |x| x % (blocks / 5)),
    };
    row(
        "hot writes, QD1",
        side_by_side(&m, &p, Io::Write, 1, a.seconds, hot.clone()).await,
    );
    row(
        "hot writes, QD16",
        side_by_side(&m, &p, Io::Write, 16, a.seconds, hot.clone()).await,
    );
    // Encode every other region past the first fifth.
    let t0 = Instant::now();
    let mut encoded = 0u64;
    let ok = |_, _| async { Ok::<(), String>(()) };
    for r in (regions / 5..regions).step_by(2) {
        p.encode(r, ok).await.unwrap();
        encoded += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cold: Arc<dyn Fn(u64) -> u64 + Send + Sync> = Arc::new(move |x| {
        let r = regions / 5 + 2 * ((x >> 20) % ((regions - regions / 5).div_ceil(2)));
        (r * region_blocks + x % region_blocks).min(blocks - 1)
    });
    row(
        "cold writes (over stripes), QD1",
        side_by_side(&m, &p, Io::Write, 1, a.seconds, cold.clone()).await,
    );
    row(
        "cold writes (over stripes), QD16",
        side_by_side(&m, &p, Io::Write, 16, a.seconds, cold.clone()).await,
    );
    // Reads of blocks still in stripes: fold the overlay back first.
    for r in (regions / 5..regions).step_by(2) {
        let _ = p.encode(r, ok).await;
    }
    row(
        "reads of stripes, QD1, healthy",
        side_by_side(&m, &p, Io::Read, 1, a.seconds, cold.clone()).await,
    );
    // Healthy and with the last node failing every read (its chunks rebuilt from K
    // others), taking turns.
    let (mut healthy, mut degraded) = (Tally::default(), Tally::default());
    for _ in 0..2 {
        healthy.add(run(&p, Io::Read, 1, a.seconds.div_ceil(2), cold.clone()).await);
        std::fs::write(&faults, "read=1").unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        degraded.add(run(&p, Io::Read, 1, a.seconds.div_ceil(2), cold.clone()).await);
        std::fs::remove_file(&faults).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!();
    println!("| parity 4 KiB random reads of stripes, QD1 | IOPS | p50 us | p99 us |");
    println!("|---|---|---|---|");
    for (what, t) in [
        ("healthy", &mut healthy),
        ("the last node failing every read", &mut degraded),
    ] {
        println!(
            "| {what} | {:.0} | {:.0} | {:.0} |",
            t.iops(),
            t.pct(0.5),
            t.pct(0.99)
        );
    }
    println!(
        "degraded / healthy: p50 {:.2}x, p99 {:.2}x",
        degraded.pct(0.5) / healthy.pct(0.5).max(1.0),
        degraded.pct(0.99) / healthy.pct(0.99).max(1.0)
    );
    // The encoder's cost to foreground writes: hot writes at QD1 alone, then beside fold-backs
    // of cold regions at the encoder task's default rate, taking turns.
    let (mut alone, mut beside) = (Tally::default(), Tally::default());
    let mut folded = (0u64, 0.0f64);
    for _ in 0..2 {
        alone.add(run(&p, Io::Write, 1, a.seconds.div_ceil(2), hot.clone()).await);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let enc = tokio::spawn(fold_backs(p.clone(), stop.clone(), regions, region_blocks));
        beside.add(run(&p, Io::Write, 1, a.seconds.div_ceil(2), hot.clone()).await);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (n, s) = enc.await.unwrap();
        folded = (folded.0 + n, folded.1 + s);
    }
    println!();
    println!("| parity hot 4 KiB random writes, QD1 | IOPS | p50 us | p99 us |");
    println!("|---|---|---|---|");
    for (what, t) in [
        ("encoder idle", &mut alone),
        (
            "beside fold-backs at the encoder's default rate",
            &mut beside,
        ),
    ] {
        println!(
            "| {what} | {:.0} | {:.0} | {:.0} |",
            t.iops(),
            t.pct(0.5),
            t.pct(0.99)
        );
    }
    println!(
        "with the encoder / idle: p50 {:.2}x, p99 {:.2}x; it folded back {} regions, {:.0} MiB/s",
        beside.pct(0.5) / alone.pct(0.5).max(1.0),
        beside.pct(0.99) / alone.pct(0.99).max(1.0),
        folded.0,
        (folded.0 * region_blocks * 4096) as f64 / folded.1.max(1e-9) / (1 << 20) as f64
    );
    println!();
    println!(
        "encoder: {encoded} regions of {} KiB in {secs:.2} s: {:.0} MiB/s of volume data",
        region_blocks * 4,
        (encoded * region_blocks * 4096) as f64 / secs / (1 << 20) as f64
    );
    drop((p, m));
}

/// Until `stop`: a block written into a cold region in parity (past the first fifth), then
/// the region folded back, one region after another at most at the encoder task's default
/// rate, as the task does. Regions folded back, and the seconds it ran.
async fn fold_backs(
    p: Arc<Volume>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    regions: u64,
    region_blocks: u64,
) -> (u64, f64) {
    let ok = |_, _| async { Ok::<(), String>(()) };
    let t0 = Instant::now();
    let mut n = 0u64;
    let block = Bytes::from(vec![0xc3; 4096]);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let r = regions / 5 + 2 * (n % (regions - regions / 5).div_ceil(2));
        let at = (r * region_blocks + n % region_blocks) * 4096;
        p.write(at, block.clone(), false).await.expect("I/O");
        if p.encode(r, ok).await.is_ok() {
            n += 1;
        }
        let rate = trireme_client::ENCODE_RATE as f64;
        let due = Duration::from_secs_f64((n * region_blocks * 4096) as f64 / rate);
        tokio::time::sleep(due.saturating_sub(t0.elapsed())).await;
    }
    (n, t0.elapsed().as_secs_f64())
}

/// The bench's directory, removed however the bench ends.
struct Work(PathBuf);

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
