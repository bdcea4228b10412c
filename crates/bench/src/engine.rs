//! The closed-loop load engine.
//!
//! `threads x outstanding` loops run on a tokio runtime with `threads` workers (capped at the
//! CPU count: async loops need no more). Each loop issues its next I/O the moment the previous
//! one completes. Latency is taken around each I/O with the monotonic clock and recorded, in
//! nanoseconds, into the loop's own HDR histogram, for I/Os that complete inside the measured
//! window (after warm-up, before cool-down), the way DISKSPD counts them — and for I/Os that
//! start inside it and complete after it ends, whose latency counts but not their bytes: a
//! stall that outlasts the window (a failover near its end) shows in the tail instead of
//! vanishing. The first I/O error stops the run: numbers from a failing target mean nothing.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;

use crate::cpu::{self, CpuReport};
use crate::profile::{Buffers, Pattern, Profile};
use crate::target::Target;
use crate::verify::{Oracle, Stamp, VerifyReport};

/// Largest latency the histograms hold (longer ones are clamped), in nanoseconds.
const MAX_LATENCY_NS: u64 = 60_000_000_000;
/// Inline targets yield to the other loops every this many I/Os.
const INLINE_YIELD: u32 = 64;

/// Whether an I/O from `t0` to `now` counts in the window `[start, end)`: its bytes (it
/// completed inside), and its latency (that, or it started inside and outlasted it).
fn counted(t0: Instant, now: Instant, start: Instant, end: Instant) -> (bool, bool) {
    let inside = |t: Instant| t >= start && t < end;
    let done_inside = inside(now);
    (done_inside, done_inside || (inside(t0) && now >= end))
}

/// Counters and latencies of one kind of I/O.
#[derive(Debug, Clone)]
pub struct OpStats {
    pub ios: u64,
    pub bytes: u64,
    /// Latency in nanoseconds.
    pub hist: Histogram<u64>,
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            ios: 0,
            bytes: 0,
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid bounds"),
        }
    }
    fn add(&mut self, o: &OpStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.hist.add(&o.hist).expect("same bounds");
    }
}

/// Per-thread results.
#[derive(Debug, Clone)]
pub struct ThreadStats {
    pub read: OpStats,
    pub write: OpStats,
}

impl ThreadStats {
    fn new() -> ThreadStats {
        ThreadStats {
            read: OpStats::new(),
            write: OpStats::new(),
        }
    }
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub profile: Profile,
    pub target: String,
    pub target_size: u64,
    pub threads: Vec<ThreadStats>,
    /// Length of the measured window in seconds.
    pub elapsed_s: f64,
    pub cpu: CpuReport,
    pub started: SystemTime,
    /// With `--verify`: what the reads during the run and the final re-read found.
    pub verify: Option<VerifyReport>,
    /// For a volume on tiered nodes: what the tiers did in the measured window.
    pub tier: Option<crate::tier::TierSection>,
    /// The data-path links of a native-client target (`node N: ucx over ...`).
    pub links: Vec<String>,
    /// For a volume with I/O limits: them, and how long requests waited for them.
    pub limits: Option<LimitsSection>,
}

/// A limited volume's part of a report.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsSection {
    pub limits: trireme_replication::qos::Limits,
    /// Seconds the writer's requests waited for the limits in the measured window, summed
    /// over requests (`None`: the writer behind the target does not say).
    pub waited_s: Option<f64>,
}

impl RunResult {
    pub fn total(&self) -> (OpStats, OpStats) {
        let (mut r, mut w) = (OpStats::new(), OpStats::new());
        for t in &self.threads {
            r.add(&t.read);
            w.add(&t.write);
        }
        (r, w)
    }
}

struct Ctx {
    target: Arc<Target>,
    profile: Profile,
    span: u64,
    window_start: Instant,
    window_end: Instant,
    run_end: Instant,
    stop: AtomicBool,
    error: Mutex<Option<String>>,
    progress: Option<Progress>,
    oracle: Option<Oracle>,
}

/// Live counters for the progress line.
struct Progress {
    ios: AtomicU64,
    bytes: AtomicU64,
    hist: Mutex<Histogram<u64>>,
}

/// A small seeded generator (splitmix64): every random choice of a run replays from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0), without modulo bias worth measuring at these ranges.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

fn fill_random(rng: &mut Rng, b: &mut [u8]) {
    for c in b.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

async fn io_loop(ctx: Arc<Ctx>, thread: usize, slot: usize) -> ThreadStats {
    let p = &ctx.profile;
    let bs = p.block_size;
    let mut rng = Rng::new(
        p.seed ^ ((thread as u64) << 32 | slot as u64).wrapping_mul(0x2545_F491_4F6C_DD1D),
    );
    let mut stats = ThreadStats::new();
    let pattern_buf: Bytes = match p.buffers {
        Buffers::Zero => Bytes::from(vec![0u8; bs as usize]),
        _ => {
            let mut b = vec![0u8; bs as usize];
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i % 251) as u8 ^ 0x5A;
            }
            Bytes::from(b)
        }
    };
    // Sequential: each thread owns an equal region; its loops interleave block by block.
    let region = (ctx.span / u64::from(p.threads)).max(bs);
    let region_start = (thread as u64 * region).min(ctx.span - bs);
    let mut seq_pos = slot as u64 * bs;
    let blocks = match p.pattern {
        Pattern::Random { align } => (ctx.span - bs) / align + 1,
        Pattern::Sequential => 0,
    };
    let inline = ctx.target.completes_inline();
    let mut since_yield = 0u32;
    let (mut batch_ios, mut batch_bytes) = (0u64, 0u64);
    let mut batch_hist = ctx
        .progress
        .as_ref()
        .map(|_| Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_NS, 2).expect("bounds"));
    let mut now = Instant::now();
    while now < ctx.run_end && !ctx.stop.load(Ordering::Relaxed) {
        let offset = match p.pattern {
            Pattern::Random { align } => match &p.hot {
                Some(z) => {
                    let (start, n) = z.pick(rng.below(100), blocks);
                    (start + rng.below(n)) * align
                }
                None => rng.below(blocks) * align,
            },
            Pattern::Sequential => {
                if seq_pos + bs > region.min(ctx.span - region_start) {
                    seq_pos = slot as u64 * bs % region.max(1);
                }
                let o = region_start + seq_pos;
                seq_pos += u64::from(p.outstanding) * bs;
                o
            }
        };
        let is_write = p.write_pct > 0 && rng.below(100) < u64::from(p.write_pct);
        let t0 = Instant::now();
        let res = if let Some(o) = &ctx.oracle {
            if is_write {
                let (data, _) = o.prepare_write(offset, bs);
                let r = ctx.target.write(thread, offset, data).await;
                if r.is_ok() {
                    o.write_acked(offset, bs);
                }
                r
            } else {
                let floor = o.read_floor(offset, bs);
                ctx.target.read(thread, offset, bs).await.map(|d| {
                    o.check_read(offset, &d, &floor);
                })
            }
        } else if is_write {
            let data = if p.buffers == Buffers::Random {
                let mut b = BytesMut::zeroed(bs as usize);
                fill_random(&mut rng, &mut b);
                b.freeze()
            } else {
                pattern_buf.clone()
            };
            ctx.target.write(thread, offset, data).await
        } else {
            ctx.target.read(thread, offset, bs).await.map(|_| ())
        };
        now = Instant::now();
        if let Err(e) = res {
            ctx.stop.store(true, Ordering::Relaxed);
            let mut g = ctx.error.lock().unwrap_or_else(|e| e.into_inner());
            g.get_or_insert_with(|| {
                format!(
                    "{} at offset {offset}: {e}",
                    if is_write { "write" } else { "read" }
                )
            });
            break;
        }
        let ns = (now - t0).as_nanos().clamp(1, u128::from(MAX_LATENCY_NS)) as u64;
        let (done_inside, latency) = counted(t0, now, ctx.window_start, ctx.window_end);
        if latency {
            let s = if is_write {
                &mut stats.write
            } else {
                &mut stats.read
            };
            if done_inside {
                s.ios += 1;
                s.bytes += bs;
            }
            s.hist.saturating_record(ns);
        }
        if let (Some(pr), Some(h)) = (&ctx.progress, batch_hist.as_mut()) {
            batch_ios += 1;
            batch_bytes += bs;
            h.saturating_record(ns);
            if batch_ios >= 256 {
                pr.ios.fetch_add(batch_ios, Ordering::Relaxed);
                pr.bytes.fetch_add(batch_bytes, Ordering::Relaxed);
                let _ = pr.hist.lock().unwrap_or_else(|e| e.into_inner()).add(&*h);
                h.reset();
                (batch_ios, batch_bytes) = (0, 0);
            }
        }
        if inline {
            since_yield += 1;
            if since_yield >= INLINE_YIELD {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
    }
    stats
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

async fn show_progress(ctx: Arc<Ctx>, started: Instant) {
    let Some(pr) = &ctx.progress else { return };
    let mut last = (Instant::now(), 0u64, 0u64);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (ios, bytes) = (
            pr.ios.load(Ordering::Relaxed),
            pr.bytes.load(Ordering::Relaxed),
        );
        let dt = last.0.elapsed().as_secs_f64();
        let (p50, p99) = {
            let h = pr.hist.lock().unwrap_or_else(|e| e.into_inner());
            (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
        };
        let phase = if Instant::now() < ctx.window_start {
            "warm-up"
        } else if Instant::now() < ctx.window_end {
            "measuring"
        } else {
            "cool-down"
        };
        eprint!(
            "\r{:>5.0}s {:<9} {:>10.0} IOPS {:>9.1} MiB/s  p50 {:>8.1} us  p99 {:>8.1} us   ",
            started.elapsed().as_secs_f64(),
            phase,
            (ios - last.1) as f64 / dt,
            (bytes - last.2) as f64 / dt / 1048576.0,
            us(p50),
            us(p99)
        );
        last = (Instant::now(), ios, bytes);
        if Instant::now() >= ctx.run_end || ctx.stop.load(Ordering::Relaxed) {
            eprintln!();
            return;
        }
    }
}

/// Why a benchmark run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    /// The target could not be opened.
    #[error("{0}")]
    Open(Box<dyn std::error::Error + Send + Sync>),
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
    #[error("--verify needs a target that stores data (not null)")]
    VerifyNull,
    #[error("--verify covers at most {max} bytes; use --span")]
    VerifySpan { max: u64 },
    #[error("{target} needs block size and alignment in multiples of {align} bytes")]
    Alignment { target: String, align: u64 },
    /// An I/O of the run failed (the target's error, with the I/O that met it).
    #[error("{0}")]
    Io(String),
    #[error("the run stopped before its window ended")]
    Stopped,
}

/// Runs `profile` against `target` and returns what it measured. `storage_pids` are the
/// processes whose CPU counts as the storage system's. Call from outside any async runtime.
pub fn run<F, E>(
    profile: &Profile,
    open: F,
    storage_pids: &[u32],
    progress: bool,
) -> Result<RunResult, BenchError>
where
    F: std::future::Future<Output = Result<Target, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let workers = (profile.threads as usize)
        .min(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    // Opened inside the runtime that drives it: connections spawn their tasks here.
    let target = Arc::new(rt.block_on(open).map_err(|e| BenchError::Open(e.into()))?);
    profile.validate(target.size())?;
    if profile.verify && target.completes_inline() {
        return Err(BenchError::VerifyNull);
    }
    let oracle = if profile.verify {
        let writer = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        let stamp = Stamp {
            target: crate::verify::target_id(&target.describe()),
            writer,
            epoch: target.epoch(),
        };
        Some(Oracle::new(profile.span_for(target.size()), stamp)?)
    } else {
        None
    };
    let align = target.alignment();
    if !profile.block_size.is_multiple_of(align)
        || matches!(profile.pattern, Pattern::Random { align: a } if a % align != 0)
    {
        return Err(BenchError::Alignment {
            target: target.describe(),
            align,
        });
    }
    let started = SystemTime::now();
    let t0 = Instant::now();
    let window_start = t0 + Duration::from_secs(profile.warmup_s);
    let window_end = window_start + Duration::from_secs(profile.duration_s);
    let ctx = Arc::new(Ctx {
        span: profile.span_for(target.size()),
        target,
        profile: profile.clone(),
        window_start,
        window_end,
        run_end: window_end + Duration::from_secs(profile.cooldown_s),
        stop: AtomicBool::new(false),
        error: Mutex::new(None),
        progress: (progress && std::io::stderr().is_terminal()).then(|| Progress {
            ios: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            hist: Mutex::new(Histogram::new_with_bounds(1, MAX_LATENCY_NS, 2).expect("bounds")),
        }),
        oracle,
    });
    let pids = storage_pids.to_vec();
    let (threads, cpu_pair, (links, limits)) = rt.block_on(async {
        let c = ctx.clone();
        let monitor = tokio::spawn(async move {
            tokio::time::sleep_until(c.window_start.into()).await;
            let a = cpu::sample(&pids);
            let waited_a = c.target.throttled();
            tokio::time::sleep_until(c.window_end.into()).await;
            let b = cpu::sample(&pids);
            let waited = c.target.throttled().zip(waited_a).map(|(b, a)| b - a);
            (a, b, pids, waited)
        });
        let prog = tokio::spawn(show_progress(ctx.clone(), t0));
        let mut threads: Vec<ThreadStats> =
            (0..profile.threads).map(|_| ThreadStats::new()).collect();
        if ctx.target.per_thread() {
            // One OS thread per benchmark thread, each with its own runtime and connection:
            // like one fio job per thread, replies wake the thread as they would any client.
            let mut handles = Vec::new();
            for t in 0..profile.threads as usize {
                let (c, outstanding) = (ctx.clone(), profile.outstanding as usize);
                handles.push((
                    t,
                    std::thread::spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .ok()?;
                        rt.block_on(async {
                            if let Err(e) = c.target.open_slot(t).await {
                                c.stop.store(true, Ordering::Relaxed);
                                c.error
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .get_or_insert(e.to_string());
                                return None;
                            }
                            let loops: Vec<_> = (0..outstanding)
                                .map(|k| tokio::spawn(io_loop(c.clone(), t, k)))
                                .collect();
                            let mut s = ThreadStats::new();
                            for l in loops {
                                if let Ok(x) = l.await {
                                    s.read.add(&x.read);
                                    s.write.add(&x.write);
                                }
                            }
                            Some(s)
                        })
                    }),
                ));
            }
            join_os_threads(handles, &mut threads).await;
        } else if ctx.target.blocks() {
            // Blocking targets: one OS thread per loop, each I/O a plain syscall on it (fio's
            // psync with one job per loop), rather than a hand-off to a thread pool per I/O.
            let mut handles = Vec::new();
            for t in 0..profile.threads as usize {
                for k in 0..profile.outstanding as usize {
                    let c = ctx.clone();
                    handles.push((
                        t,
                        std::thread::spawn(move || {
                            tokio::runtime::Builder::new_current_thread()
                                .build()
                                .ok()
                                .map(|rt| rt.block_on(io_loop(c, t, k)))
                        }),
                    ));
                }
            }
            join_os_threads(handles, &mut threads).await;
        } else {
            let mut handles = Vec::new();
            for t in 0..profile.threads as usize {
                for k in 0..profile.outstanding as usize {
                    handles.push((t, tokio::spawn(io_loop(ctx.clone(), t, k))));
                }
            }
            for (t, h) in handles {
                if let Ok(s) = h.await {
                    threads[t].read.add(&s.read);
                    threads[t].write.add(&s.write);
                }
            }
        }
        prog.abort();
        if ctx.progress.is_some() {
            eprintln!();
        }
        let cpu_pair = if ctx.stop.load(Ordering::Relaxed) {
            None
        } else {
            monitor.await.ok()
        };
        if let (Some(o), false) = (&ctx.oracle, ctx.stop.load(Ordering::Relaxed)) {
            final_pass(&ctx.target, o).await;
        }
        let links = ctx.target.links();
        let limits = ctx.target.limits();
        ctx.target.close().await;
        (threads, cpu_pair, (links, limits))
    });
    let error = ctx.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(e) = error {
        return Err(BenchError::Io(e));
    }
    let (a, b, pids, waited) = cpu_pair.ok_or(BenchError::Stopped)?;
    let limits = limits
        .filter(|l| !l.is_default())
        .map(|limits| LimitsSection {
            limits,
            waited_s: waited.map(|d| d.as_secs_f64()),
        });
    Ok(RunResult {
        profile: profile.clone(),
        target: ctx.target.describe(),
        target_size: ctx.target.size(),
        threads,
        elapsed_s: (b.at - a.at).as_secs_f64(),
        cpu: cpu::report(&a, &b, &pids),
        started,
        verify: ctx.oracle.as_ref().map(Oracle::report),
        tier: None,
        links,
        limits,
    })
}

/// Waits (off the async threads) for loop threads and adds what each measured to its bench
/// thread's totals.
async fn join_os_threads(
    handles: Vec<(usize, std::thread::JoinHandle<Option<ThreadStats>>)>,
    threads: &mut [ThreadStats],
) {
    let joined = tokio::task::spawn_blocking(move || {
        handles
            .into_iter()
            .filter_map(|(t, h)| Some((t, h.join().ok()??)))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for (t, s) in joined {
        threads[t].read.add(&s.read);
        threads[t].write.add(&s.write);
    }
}

/// After the load stops: re-reads every block the run saw acknowledged, in runs of up to
/// 1 MiB, and checks each against the oracle (nothing is in flight now, so each block must hold
/// one of its issued writes, no older than the last acknowledged).
async fn final_pass(target: &Target, o: &Oracle) {
    const RUN: u64 = 1 << 20;
    // Per-thread connections died with their threads' runtimes: open one here.
    if target.per_thread() {
        if let Err(e) = target.open_slot(0).await {
            eprintln!("verify: cannot reconnect for the final re-read: {e}");
        }
    }
    let mut blocks = o.written_blocks().peekable();
    while let Some(start) = blocks.next() {
        let mut end = start + crate::verify::BLOCK;
        while end - start < RUN && blocks.peek() == Some(&end) {
            end += crate::verify::BLOCK;
            blocks.next();
        }
        let floor = o.read_floor(start, end - start);
        match target.read(0, start, end - start).await {
            Ok(d) => {
                o.check_read(start, &d, &floor);
            }
            Err(e) => {
                // An unreadable acknowledged block is lost data: count it through the oracle.
                let zeros = vec![0u8; (end - start) as usize];
                o.check_read(start, &zeros, &floor);
                eprintln!("verify: re-read at {start} failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_that_outlasts_the_window_counts_its_latency_not_its_bytes() {
        let s = Instant::now();
        let at = |ms: u64| s + Duration::from_millis(ms);
        let (start, end) = (at(100), at(200));
        // Inside, and completed inside: both.
        assert_eq!(counted(at(120), at(150), start, end), (true, true));
        // Begun in the warm-up, completed inside: both (DISKSPD's rule).
        assert_eq!(counted(at(50), at(150), start, end), (true, true));
        // Begun inside, completed after the window (a stall at its end): the latency only.
        assert_eq!(counted(at(150), at(2150), start, end), (false, true));
        // Wholly before or after: neither.
        assert_eq!(counted(at(10), at(50), start, end), (false, false));
        assert_eq!(counted(at(200), at(250), start, end), (false, false));
    }
}
