//! What a snapshot costs a node's store, without the network or the other copies: the node's
//! stack (versions over clones over seals over the file store, O_DIRECT) in a directory, two
//! volumes of SIZE written whole, then THREADS threads of 4 KiB random writes (and reads) for
//! SECS seconds per phase (flushed each second, as a node does), alternating a volume never
//! snapshotted ("none") with one just snapshotted ("first": nearly every write is a block's
//! first overwrite, a redirect), ROUNDS times. Prints per phase the operations a second and the CPU time per operation: of this
//! process (getrusage) and of the whole machine (/proc/stat, which counts the kernel's
//! workers too: ext4's conversion of unwritten extents runs in one), and the voluntary
//! context switches per operation (a thread that blocked: on its I/O, or on a lock).
//!
//! Usage: cargo run --release -p trireme-store --example redirect_cost -- DIR
//! [SIZE_MIB=1024] [THREADS=4] [SECS=5] [ROUNDS=3] [WRITE_PCT=100]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use trireme_store::aligned::AlignedBuf;
use trireme_store::{BackedStore, FileStore, Replica, SealedStore, Store, VersionedStore};

const BLOCK: u64 = 4096;

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).map_or(default, |s| {
        s.parse()
            .unwrap_or_else(|_| panic!("argument {i}: not a number: {s}"))
    })
}

/// This process's resource usage so far.
fn rusage() -> libc::rusage {
    // SAFETY: rusage is plain integers, for which all zeros is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given, which lives through the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u
}

/// Voluntary context switches of this process's threads so far (each a thread that blocked).
fn process_switches() -> f64 {
    rusage().ru_nvcsw as f64
}

/// CPU seconds of this process, user plus system.
fn process_cpu() -> f64 {
    let u = rusage();
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Busy CPU seconds of the whole machine (user, nice, system, irq, softirq).
fn machine_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/stat").expect("read /proc/stat");
    let v: Vec<u64> = s
        .lines()
        .next()
        .expect("a cpu line")
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().expect("a number"))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (v[0] + v[1] + v[2] + v[5] + v[6]) as f64 / hz
}

/// Random 4 KiB operations on `r` by `threads` threads for `secs`, and a flush each second:
/// (ops/s, process CPU µs per op, machine CPU µs per op, voluntary switches per op).
fn run(
    r: &Arc<dyn Replica>,
    threads: u64,
    secs: u64,
    write_pct: u64,
    seed: u64,
) -> (f64, f64, f64, f64) {
    let blocks = r.size() / BLOCK;
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let (p0, m0, c0, t0) = (
        process_cpu(),
        machine_cpu(),
        process_switches(),
        Instant::now(),
    );
    let workers: Vec<_> = (0..threads)
        .map(|k| {
            let (r, stop, ops) = (r.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(BLOCK as usize);
                let mut x = seed ^ (k + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    // xorshift64
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = (x % blocks) * BLOCK;
                    if (x >> 40) % 100 < write_pct {
                        buf[..8].copy_from_slice(&x.to_le_bytes());
                        r.write(at, &buf, false).expect("write");
                    } else {
                        r.read(at, &mut buf).expect("read");
                    }
                    n += 1;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    // A node flushes its replicas about once a second (its bookkeeping does): a flush is
    // where the versions fold a full redirect log into their main file.
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        r.flush().expect("flush");
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let (dt, n) = (
        t0.elapsed().as_secs_f64(),
        ops.load(Ordering::Relaxed) as f64,
    );
    (
        n / dt,
        (process_cpu() - p0) * 1e6 / n,
        (machine_cpu() - m0) * 1e6 / n,
        (process_switches() - c0) / n,
    )
}

/// For a profiler: with PERF_AT set, creates file PERF_AT.PHASE as each phase starts.
fn mark(phase: &str) {
    if let Ok(p) = std::env::var("PERF_AT") {
        std::fs::write(format!("{p}.{phase}"), b"").expect("PERF_AT");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: redirect_cost DIR [SIZE_MIB] [THREADS] [SECS] [ROUNDS] [WRITE_PCT]");
        std::process::exit(2);
    };
    let dir = std::path::Path::new(dir);
    let size = arg(&args, 2, 1024) << 20;
    let threads = arg(&args, 3, 4);
    let secs = arg(&args, 4, 5);
    let rounds = arg(&args, 5, 3);
    let write_pct = arg(&args, 6, 100);
    std::fs::create_dir_all(dir).expect("create DIR");
    let mut store: Arc<dyn Store> = Arc::new(FileStore::open(dir).expect("file store"));
    store = Arc::new(SealedStore::new(store, Some(dir)));
    store = Arc::new(BackedStore::new(store, Some(dir)));
    store = Arc::new(VersionedStore::new(store, Some(dir)));
    let fill = |r: &Arc<dyn Replica>| {
        let mut chunk = AlignedBuf::new(1 << 20);
        for (i, b) in chunk.chunks_mut(8).enumerate() {
            b.copy_from_slice(&(i as u64).to_le_bytes());
        }
        for at in (0..size).step_by(1 << 20) {
            r.write(at, &chunk, false).expect("fill");
        }
        r.flush().expect("flush");
    };
    let none = store.create(1, size).expect("create volume 1");
    let snapped = store.create(2, size).expect("create volume 2");
    fill(&none);
    fill(&snapped);
    println!(
        "{} MiB volumes, {threads} threads, {write_pct}% writes, {secs} s per phase, in {}",
        size >> 20,
        dir.display()
    );
    for round in 1..=rounds {
        mark("none");
        let (a, ap, am, ac) = run(&none, threads, secs, write_pct, round);
        snapped.snapshot(round, 0).expect("snapshot");
        // The first redirect grows the pool: before the clock starts.
        let warm = AlignedBuf::new(BLOCK as usize);
        snapped.write(0, &warm, false).expect("write");
        mark("first");
        let (b, bp, bm, bc) = run(&snapped, threads, secs, write_pct, round);
        println!(
            "round {round}: none {a:.0} ops/s, {ap:.1} µs process / {am:.1} µs machine CPU, \
             {ac:.2} blocking switches per op; first {b:.0} ops/s, {bp:.1} / {bm:.1} µs, {bc:.2}; \
             ratio {:.2}x ops/s, {:.2}x machine CPU",
            b / a,
            bm / am
        );
        none.flush().expect("flush");
        snapped.flush().expect("flush");
    }
    for v in [1, 2] {
        store.delete(v).expect("delete");
    }
}
