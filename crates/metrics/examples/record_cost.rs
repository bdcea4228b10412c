//! What counting one request costs: the writer's two clock reads and `VolumeMetrics::record`,
//! on one thread and on two threads counting into the same volume (its counters' cache lines
//! then move between the cores, as they do under a multi-threaded load).
//!
//!     cargo run --release -p trireme-metrics --example record_cost

use std::time::{Duration, Instant};

fn per_op(threads: usize, n: u64) -> f64 {
    let m = trireme_metrics::volume("cost");
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let m = m.clone();
            s.spawn(move || {
                for i in 0..n {
                    let start = Instant::now();
                    std::hint::black_box(i);
                    let op = if i % 10 < 7 {
                        trireme_metrics::Op::Read
                    } else {
                        trireme_metrics::Op::Write
                    };
                    m.record(op, 4096, start.elapsed(), true);
                }
            });
        }
    });
    t0.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let n = 5_000_000;
    per_op(1, n / 10); // warm up
    let one = per_op(1, n);
    let two = per_op(2, n);
    let clock = {
        let t0 = Instant::now();
        let mut d = Duration::ZERO;
        for _ in 0..n {
            d += std::hint::black_box(Instant::now()).elapsed();
        }
        std::hint::black_box(d);
        t0.elapsed().as_nanos() as f64 / n as f64
    };
    println!("two clock reads alone:                      {clock:6.1} ns per request");
    println!("clock reads + record, one thread:           {one:6.1} ns per request");
    println!("clock reads + record, two threads, one volume: {two:6.1} ns per request (wall, each thread)");
}
