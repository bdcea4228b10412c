//! How long writes wait while a replica's redirect log is folded into its main file. The
//! node's stack (versions over clones over seals over the file store, O_DIRECT) in a
//! directory; one volume of SIZE, snapshotted while empty, so that every write after is a
//! block's first overwrite (a redirect, one redirect-log record) and the head's map grows by
//! one entry per write; THREADS threads write 4 KiB blocks, each block once, for SECS seconds,
//! and the replica is flushed each second, as a node does. A flush folds the log once it holds
//! as many records as the main file's head, so folds come rarer and larger as the head grows.
//! Prints, per second: writes, the longest write, the flush's time, whether it folded (the
//! redirect logs came back shorter) and whether the pool grew; then the longest write.
//!
//! Usage: cargo run --release -p trireme-store --example fold_pause -- DIR
//! [SIZE_MIB=4096] [THREADS=4] [SECS=20]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use trireme_store::aligned::AlignedBuf;
use trireme_store::{BackedStore, FileStore, SealedStore, Store, VersionedStore};

const BLOCK: u64 = 4096;

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).map_or(default, |s| {
        s.parse()
            .unwrap_or_else(|_| panic!("argument {i}: not a number: {s}"))
    })
}

/// The summed lengths of the files in `dir` whose names `pick` takes: the data file (the
/// pool included), or the redirect logs (both, if there are two).
fn lengths(dir: &std::path::Path, pick: impl Fn(&str) -> bool) -> u64 {
    std::fs::read_dir(dir)
        .expect("read DIR")
        .flatten()
        .filter(|e| pick(&e.file_name().to_string_lossy()))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: fold_pause DIR [SIZE_MIB] [THREADS] [SECS]");
        std::process::exit(2);
    };
    let dir = std::path::Path::new(dir);
    let size = arg(&args, 2, 4096) << 20;
    let threads = arg(&args, 3, 4);
    let secs = arg(&args, 4, 20);
    std::fs::create_dir_all(dir).expect("create DIR");
    let mut store: Arc<dyn Store> = Arc::new(FileStore::open(dir).expect("file store"));
    store = Arc::new(SealedStore::new(store, Some(dir)));
    store = Arc::new(BackedStore::new(store, Some(dir)));
    store = Arc::new(VersionedStore::new(store, Some(dir)));
    let r = store.create(1, size).expect("create the volume");
    r.snapshot(1, 0).expect("snapshot");
    let blocks = size / BLOCK;
    println!(
        "{} MiB volume snapshotted empty, {threads} threads writing each block once, {secs} s, in {}",
        size >> 20,
        dir.display()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let (ops, longest) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (r, stop, next) = (r.clone(), stop.clone(), next.clone());
            let (ops, longest) = (ops.clone(), longest.clone());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(BLOCK as usize);
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= blocks {
                        break;
                    }
                    // A stride coprime with the block count: each block once, scattered.
                    let at = (n.wrapping_mul(2_654_435_761) % blocks) * BLOCK;
                    buf[..8].copy_from_slice(&n.to_le_bytes());
                    let t = Instant::now();
                    r.write(at, &buf, false).expect("write");
                    longest.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut worst = 0;
    let mut grown = lengths(dir, |n| n.ends_with(".data") || n.ends_with(".pool"));
    for s in 1..=secs {
        std::thread::sleep(Duration::from_secs(1));
        let before = lengths(dir, |n| n.contains("vlog"));
        let t = Instant::now();
        r.flush().expect("flush");
        let flush_ms = t.elapsed().as_secs_f64() * 1e3;
        let folded = lengths(dir, |n| n.contains("vlog")) < before;
        let (n, max) = (
            ops.swap(0, Ordering::Relaxed),
            longest.swap(0, Ordering::Relaxed),
        );
        worst = worst.max(max);
        let len = lengths(dir, |n| n.ends_with(".data") || n.ends_with(".pool"));
        println!(
            "{s:>3} s: {n:>6} writes, longest {:>7.1} ms, flush {flush_ms:>6.1} ms{}{}",
            max as f64 / 1e3,
            if folded { ", folded" } else { "" },
            if len > grown { ", pool grew" } else { "" }
        );
        grown = len;
        if next.load(Ordering::Relaxed) >= blocks {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    println!(
        "longest write: {:.1} ms; head: {} blocks moved",
        worst as f64 / 1e3,
        next.load(Ordering::Relaxed).min(blocks)
    );
    drop(r);
    store.delete(1).expect("delete");
}
