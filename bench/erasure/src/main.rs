//! Encode and rebuild throughput of K+M stripes, reed-solomon-simd against ISA-L (Cauchy
//! matrix, through trireme-erasure's codec, so its checks and copies are counted), interleaved
//! round by round on one core so that a noisy machine hits both alike. Prints a table of
//! medians and ratios.
//!
//! Usage: erasure-bench [ROUNDS] [K+M ...]; stripes of K x 4 KiB (what a degraded 4 KiB read
//! rebuilds), 64 KiB, 1 MiB and 4 MiB of data. Each row gives GB/s of data and microseconds
//! per stripe: the second is what a degraded read waits for.

use std::hint::black_box;
use std::time::Instant;

use trireme_erasure::{Codec, ReedSolomon};

/// Bytes of data coded per measurement (each sample codes at least this much).
const PER_SAMPLE: usize = 32 << 20;

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// GB/s of data through `f`, run until PER_SAMPLE bytes of data went through.
fn rate(stripe: usize, mut f: impl FnMut()) -> f64 {
    let n = PER_SAMPLE.div_ceil(stripe).max(1);
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    (n * stripe) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Row {
    what: String,
    simd: f64,
    isal: f64,
}

fn measure(k: usize, m: usize, stripe: usize, rounds: usize) -> Vec<Row> {
    let chunk = stripe / k;
    let data: Vec<Vec<u8>> = (0..k).map(|i| random(chunk, i as u64 + 1)).collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let isal = ReedSolomon::new(k, m).expect("shape");
    // Both must rebuild what they encode before they are timed.
    let parity = isal.encode(&refs).unwrap();
    let simd_parity = reed_solomon_simd::encode(k, m, &refs).unwrap();
    let lose: Vec<usize> = (0..m.min(2)).collect();
    let mut lost: Vec<Option<Vec<u8>>> = data.iter().chain(&parity).cloned().map(Some).collect();
    for &i in &lose {
        lost[i] = None;
    }
    isal.reconstruct(&mut lost).unwrap();
    assert_eq!(lost[0].as_ref(), Some(&data[0]));
    let back = simd_rebuild(k, m, &data, &simd_parity, &lose);
    assert_eq!(back[&0], data[0]);

    let (mut e_s, mut e_i, mut r_s, mut r_i) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        e_s.push(rate(stripe, || {
            black_box(reed_solomon_simd::encode(k, m, &refs).unwrap());
        }));
        e_i.push(rate(stripe, || {
            black_box(isal.encode(&refs).unwrap());
        }));
        // A degraded read: the first min(M, 2) data chunks rebuilt from the rest, one call
        // per rebuild on both sides (ISA-L inverts its matrix each time).
        r_s.push(rate(stripe, || {
            black_box(simd_rebuild(k, m, &data, &simd_parity, &lose));
        }));
        let whole: Vec<Option<Vec<u8>>> = data.iter().chain(&parity).cloned().map(Some).collect();
        r_i.push(rate(stripe, || {
            let mut c = whole.clone();
            for &i in &lose {
                c[i] = None;
            }
            isal.reconstruct(&mut c).unwrap();
            black_box(&c);
        }));
    }
    let name = |what: &str| format!("{k}+{m} {} KiB stripe, {what}", stripe >> 10);
    vec![
        Row {
            what: name("encode"),
            simd: median(e_s),
            isal: median(e_i),
        },
        Row {
            what: name(&format!("rebuild {} lost", lose.len())),
            simd: median(r_s),
            isal: median(r_i),
        },
    ]
}

/// reed-solomon-simd's rebuild of the `lose` data chunks, copying the survivors first as the
/// ISA-L side does (its chunks are cloned into the call).
fn simd_rebuild(
    k: usize,
    m: usize,
    data: &[Vec<u8>],
    parity: &[Vec<u8>],
    lose: &[usize],
) -> std::collections::BTreeMap<usize, Vec<u8>> {
    let data: Vec<Vec<u8>> = data.to_vec();
    let parity: Vec<Vec<u8>> = parity.to_vec();
    let originals = (0..k)
        .filter(|i| !lose.contains(i))
        .map(|i| (i, data[i].as_slice()));
    let recovery = parity.iter().enumerate().map(|(i, c)| (i, c.as_slice()));
    reed_solomon_simd::decode(k, m, originals, recovery)
        .unwrap()
        .into_iter()
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(7, |r| r.parse().expect("ROUNDS"));
    let mut shapes: Vec<(usize, usize)> = args
        .map(|s| {
            let (k, m) = s.split_once('+').expect("K+M");
            (k.parse().expect("K"), m.parse().expect("M"))
        })
        .collect();
    if shapes.is_empty() {
        shapes = vec![(2, 1), (4, 2), (8, 3)];
    }
    println!("data GB/s (and us per stripe), median of {rounds} interleaved rounds, one core;");
    println!("rebuilds include copying the stripe; simd/isa-l > 1 means rs-simd is faster");
    println!(
        "{:<40} {:>10} {:>10} {:>10} {:>10} {:>11}",
        "", "rs-simd", "isa-l", "rs-simd us", "isa-l us", "simd/isa-l"
    );
    for (k, m) in shapes {
        for stripe in [k * 4096, 64 << 10, 1 << 20, 4 << 20] {
            let us = |gbs: f64| stripe as f64 / gbs / 1e3;
            for r in measure(k, m, stripe, rounds) {
                println!(
                    "{:<40} {:>10.2} {:>10.2} {:>10.1} {:>10.1} {:>11.2}",
                    r.what,
                    r.simd,
                    r.isal,
                    us(r.simd),
                    us(r.isal),
                    r.simd / r.isal
                );
            }
        }
    }
}
