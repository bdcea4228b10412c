use proptest::prelude::*;

use super::*;

fn stripe(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed | 1;
    (0..k)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(Vec::as_slice).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any M chunks lost, data or parity, come back exactly from the K+M-M left; one more
    /// lost is refused and fills in nothing.
    #[test]
    fn any_m_lost_chunks_come_back_and_one_more_is_refused(
        k in 2usize..=16,
        m in 1usize..=3,
        blocks in 1usize..=8,
        seed in any::<u64>(),
        lost_seed in any::<u64>(),
    ) {
        let c = ReedSolomon::new(k, m).unwrap();
        let data = stripe(k, blocks * 64, seed);
        let parity = c.encode(&refs(&data)).unwrap();
        prop_assert_eq!(parity.len(), m);
        let whole: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
        prop_assert!(c.verify(&refs(&whole)).unwrap());
        // M distinct chunks, chosen by the seed.
        let mut order: Vec<usize> = (0..k + m).collect();
        let mut s = lost_seed;
        for i in (1..order.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        let mut chunks: Vec<Option<Vec<u8>>> = whole.iter().cloned().map(Some).collect();
        for &i in &order[..m] {
            chunks[i] = None;
        }
        c.reconstruct(&mut chunks).unwrap();
        let back: Vec<Vec<u8>> = chunks.into_iter().map(Option::unwrap).collect();
        prop_assert_eq!(&back, &whole);
        let mut chunks: Vec<Option<Vec<u8>>> = whole.iter().cloned().map(Some).collect();
        for &i in &order[..m + 1] {
            chunks[i] = None;
        }
        let before = chunks.clone();
        prop_assert_eq!(
            c.reconstruct(&mut chunks),
            Err(CodecError::TooFew { present: k - 1, data: k })
        );
        prop_assert_eq!(chunks, before);
    }

    /// A flipped byte anywhere in a stripe is seen by `verify`.
    #[test]
    fn a_flipped_byte_fails_verification(
        k in 2usize..=8,
        m in 1usize..=3,
        seed in any::<u64>(),
        at in any::<usize>(),
    ) {
        let c = ReedSolomon::new(k, m).unwrap();
        let data = stripe(k, 256, seed);
        let parity = c.encode(&refs(&data)).unwrap();
        let mut whole: Vec<Vec<u8>> = data.into_iter().chain(parity).collect();
        let chunk = at % (k + m);
        let byte = (at / (k + m)) % (256);
        whole[chunk][byte] ^= 0x5a;
        prop_assert!(!c.verify(&refs(&whole)).unwrap());
    }
}

#[test]
fn bad_shapes_and_lengths_are_refused() {
    assert_eq!(
        ReedSolomon::new(0, 1).unwrap_err(),
        CodecError::Shape { data: 0, parity: 1 }
    );
    assert!(ReedSolomon::new(4, 0).is_err());
    assert!(ReedSolomon::new(MAX_DATA + 1, 2).is_err());
    assert!(ReedSolomon::new(4, MAX_PARITY + 1).is_err());
    let c = ReedSolomon::new(4, 2).unwrap();
    let data = stripe(4, 128, 7);
    // Three chunks for a 4+2.
    assert!(matches!(
        c.encode(&refs(&data[..3])),
        Err(CodecError::Count { got: 5, .. })
    ));
    // Lengths that differ, or are empty.
    let mut odd = data.clone();
    odd[2].truncate(64);
    assert_eq!(c.encode(&refs(&odd)), Err(CodecError::Length(128, 64)));
    let empty = vec![Vec::new(); 4];
    assert!(matches!(
        c.encode(&refs(&empty)),
        Err(CodecError::Length(0, 0))
    ));
    let mut chunks: Vec<Option<Vec<u8>>> = vec![None; 5];
    assert!(matches!(
        c.reconstruct(&mut chunks),
        Err(CodecError::Count { got: 5, .. })
    ));
    assert!(c.verify(&refs(&data)).is_err());
}

/// A stripe with nothing lost is left as it is; one with only parity lost gets it again.
#[test]
fn only_what_is_missing_is_filled_in() {
    let c = ReedSolomon::new(4, 2).unwrap();
    let data = stripe(4, 256, 9);
    let parity = c.encode(&refs(&data)).unwrap();
    let mut chunks: Vec<Option<Vec<u8>>> = data.iter().chain(&parity).cloned().map(Some).collect();
    c.reconstruct(&mut chunks).unwrap();
    chunks[4] = None;
    chunks[5] = None;
    c.reconstruct(&mut chunks).unwrap();
    assert_eq!(chunks[4].as_ref(), Some(&parity[0]));
    assert_eq!(chunks[5].as_ref(), Some(&parity[1]));
}

/// An odd length (not a multiple of any SIMD width) codes and rebuilds like any other.
#[test]
fn an_odd_length_rebuilds() {
    let c = ReedSolomon::new(3, 2).unwrap();
    let data = stripe(3, 4097, 11);
    let parity = c.encode(&refs(&data)).unwrap();
    let mut chunks: Vec<Option<Vec<u8>>> = data.iter().chain(&parity).cloned().map(Some).collect();
    chunks[1] = None;
    chunks[3] = None;
    c.reconstruct(&mut chunks).unwrap();
    assert_eq!(chunks[1].as_ref(), Some(&data[1]));
    assert_eq!(chunks[3].as_ref(), Some(&parity[0]));
}

/// GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), bit by bit.
fn gf_mul(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    p
}

fn gf_inv(a: u8) -> u8 {
    (1..=255u8).find(|&x| gf_mul(a, x) == 1).unwrap()
}

/// The parity is the format on disk: parity chunk r of a K+M stripe is, byte by byte, the sum
/// over data chunks j of inv((K + r) xor j) times data byte j (a Cauchy matrix under an
/// identity), computed here without the library. A library or build that coded otherwise
/// would make every stored stripe unreadable; this fails first.
#[test]
fn the_parity_is_the_cauchy_code_over_gf256() {
    for (k, m) in [(2, 1), (4, 2), (8, 3)] {
        let c = ReedSolomon::new(k, m).unwrap();
        let data = stripe(k, 333, k as u64 * 31 + m as u64);
        let parity = c.encode(&refs(&data)).unwrap();
        for (r, chunk) in parity.iter().enumerate() {
            let coef: Vec<u8> = (0..k).map(|j| gf_inv(((k + r) ^ j) as u8)).collect();
            let want: Vec<u8> = (0..333)
                .map(|b| (0..k).fold(0, |acc, j| acc ^ gf_mul(coef[j], data[j][b])))
                .collect();
            assert_eq!(chunk, &want, "{k}+{m}, parity chunk {r}");
        }
    }
}
