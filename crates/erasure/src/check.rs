//! A scrub's question about one stripe: does its parity match its data, and if not, which
//! chunk is wrong? No I/O: the caller reads the chunks and writes the repairs.
//!
//! | chunks read good | wrong ones | answer |
//! |---|---|---|
//! | fewer than K | any | [`StripeCheck::Unresolved`]: too few to rebuild from |
//! | exactly K | none known bad | [`StripeCheck::Unchecked`]: any K are consistent |
//! | K or more, consistent | those known bad | [`StripeCheck::Repair`] of the bad ones |
//! | more than K+1, inconsistent | one chunk whose removal leaves the rest consistent | that chunk repaired |
//! | K+1, inconsistent | any | [`StripeCheck::Unresolved`]: every chunk is a suspect |
//!
//! A chunk is *known bad* when its node says its blocks fail their checksums: it gets no
//! say, as a mirror copy that fails them gets no vote. A chunk not read (its node is not in
//! sync) is neither checked nor repaired: a resync rebuilds it.
//!
//! Locating a silent error needs two spare chunks: with M = 1 (2+1), one wrong chunk makes
//! the stripe inconsistent, but removing any one chunk leaves K consistent ones, so nothing
//! says which was wrong and nothing is guessed (as a mirror scrub with no majority).

use crate::{Codec, CodecError};

/// One chunk as the scrub found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Read; its node vouches for its blocks.
    Good(Vec<u8>),
    /// Its node says its blocks fail their checksums.
    Bad,
    /// Not read: its node is not in sync.
    Absent,
}

/// What to do with the stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StripeCheck {
    /// Every chunk was read and the parity matches the data.
    Agree,
    /// Only K chunks (or some chunks not read but the rest consistent): nothing wrong found,
    /// though not every chunk could be compared.
    Unchecked,
    /// Write each `(chunk, bytes)`: the chunks known bad or found wrong.
    Repair(Vec<(usize, Vec<u8>)>),
    /// Nothing can be trusted to repair from.
    Unresolved,
}

/// Checks one stripe of `codec`'s shape (see the module docs).
pub fn check_stripe(codec: &dyn Codec, chunks: &[Chunk]) -> Result<StripeCheck, CodecError> {
    let (k, m) = (codec.data(), codec.parity());
    if chunks.len() != k + m {
        return Err(CodecError::Count {
            data: k,
            parity: m,
            got: chunks.len(),
        });
    }
    let good: Vec<usize> = (0..k + m)
        .filter(|&i| matches!(chunks[i], Chunk::Good(_)))
        .collect();
    let bad: Vec<usize> = (0..k + m).filter(|&i| chunks[i] == Chunk::Bad).collect();
    if good.len() < k {
        return Ok(StripeCheck::Unresolved);
    }
    if let Some(full) = consistent(codec, chunks, &good)? {
        return Ok(match bad.is_empty() {
            true if good.len() == k + m => StripeCheck::Agree,
            true => StripeCheck::Unchecked,
            false => StripeCheck::Repair(take(full, &bad)),
        });
    }
    // Inconsistent: look for the one chunk whose removal leaves a set that still proves
    // something (more than K chunks) and is consistent.
    if good.len() < k + 2 {
        return Ok(StripeCheck::Unresolved);
    }
    let mut found = None;
    for &suspect in &good {
        let rest: Vec<usize> = good.iter().copied().filter(|&i| i != suspect).collect();
        if let Some(full) = consistent(codec, chunks, &rest)? {
            if found.is_some() {
                return Ok(StripeCheck::Unresolved);
            }
            found = Some((suspect, full));
        }
    }
    Ok(match found {
        Some((suspect, full)) => {
            let mut wrong = bad;
            wrong.push(suspect);
            wrong.sort_unstable();
            StripeCheck::Repair(take(full, &wrong))
        }
        None => StripeCheck::Unresolved,
    })
}

/// The whole stripe the first K chunks of `set` make, if every other chunk of `set` agrees
/// with it.
fn consistent(
    codec: &dyn Codec,
    chunks: &[Chunk],
    set: &[usize],
) -> Result<Option<Vec<Vec<u8>>>, CodecError> {
    let k = codec.data();
    let mut full: Vec<Option<Vec<u8>>> = vec![None; chunks.len()];
    for &i in &set[..k] {
        if let Chunk::Good(b) = &chunks[i] {
            full[i] = Some(b.clone());
        }
    }
    codec.reconstruct(&mut full)?;
    let full: Vec<Vec<u8>> = full.into_iter().map(Option::unwrap_or_default).collect();
    let agree = set[k..].iter().all(|&i| match &chunks[i] {
        Chunk::Good(b) => *b == full[i],
        _ => false,
    });
    Ok(agree.then_some(full))
}

fn take(mut full: Vec<Vec<u8>>, which: &[usize]) -> Vec<(usize, Vec<u8>)> {
    which
        .iter()
        .map(|&i| (i, std::mem::take(&mut full[i])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReedSolomon;

    /// A consistent stripe of K+M chunks of `len` bytes.
    fn stripe(k: usize, m: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        let codec = ReedSolomon::new(k, m).unwrap();
        let data: Vec<Vec<u8>> = (0..k)
            .map(|c| {
                (0..len)
                    .map(|i| (i as u8).wrapping_mul(31) ^ (c as u8) ^ seed)
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = codec.encode(&refs).unwrap();
        data.into_iter().chain(parity).collect()
    }

    fn good(s: &[Vec<u8>]) -> Vec<Chunk> {
        s.iter().cloned().map(Chunk::Good).collect()
    }

    #[test]
    fn a_whole_consistent_stripe_agrees() {
        let codec = ReedSolomon::new(4, 2).unwrap();
        let s = stripe(4, 2, 4096, 1);
        assert_eq!(check_stripe(&codec, &good(&s)).unwrap(), StripeCheck::Agree);
    }

    #[test]
    fn one_silently_wrong_chunk_of_4_2_is_found_and_rebuilt_wherever_it_is() {
        let codec = ReedSolomon::new(4, 2).unwrap();
        let s = stripe(4, 2, 4096, 2);
        for wrong in 0..6 {
            let mut c = good(&s);
            if let Chunk::Good(b) = &mut c[wrong] {
                b[100] ^= 0x40;
            }
            assert_eq!(
                check_stripe(&codec, &c).unwrap(),
                StripeCheck::Repair(vec![(wrong, s[wrong].clone())]),
                "chunk {wrong}"
            );
        }
    }

    #[test]
    fn a_wrong_chunk_is_found_beside_a_known_bad_one_when_two_spares_remain() {
        // 4+3: one known bad leaves K+2 good, enough to locate one silent error.
        let codec = ReedSolomon::new(4, 3).unwrap();
        let s = stripe(4, 3, 512, 3);
        let mut c = good(&s);
        c[1] = Chunk::Bad;
        if let Chunk::Good(b) = &mut c[5] {
            b[0] ^= 1;
        }
        assert_eq!(
            check_stripe(&codec, &c).unwrap(),
            StripeCheck::Repair(vec![(1, s[1].clone()), (5, s[5].clone())])
        );
    }

    #[test]
    fn a_known_bad_chunk_is_rebuilt_from_the_others() {
        let codec = ReedSolomon::new(2, 1).unwrap();
        let s = stripe(2, 1, 4096, 4);
        let mut c = good(&s);
        c[0] = Chunk::Bad;
        assert_eq!(
            check_stripe(&codec, &c).unwrap(),
            StripeCheck::Repair(vec![(0, s[0].clone())])
        );
    }

    #[test]
    fn nothing_is_guessed_when_every_chunk_is_a_suspect() {
        // 2+1: one wrong chunk, and any two of three are consistent.
        let codec = ReedSolomon::new(2, 1).unwrap();
        let s = stripe(2, 1, 4096, 5);
        let mut c = good(&s);
        if let Chunk::Good(b) = &mut c[2] {
            b[7] ^= 0xff;
        }
        assert_eq!(check_stripe(&codec, &c).unwrap(), StripeCheck::Unresolved);
        // 4+2 with two wrong chunks: no single one explains it.
        let codec = ReedSolomon::new(4, 2).unwrap();
        let s = stripe(4, 2, 4096, 6);
        let mut c = good(&s);
        for w in [0, 3] {
            if let Chunk::Good(b) = &mut c[w] {
                b[9] ^= 2;
            }
        }
        assert_eq!(check_stripe(&codec, &c).unwrap(), StripeCheck::Unresolved);
        // 4+2 with a node out: K+1 chunks, one wrong: unresolved too.
        let mut c = good(&stripe(4, 2, 4096, 7));
        c[4] = Chunk::Absent;
        if let Chunk::Good(b) = &mut c[0] {
            b[0] ^= 2;
        }
        assert_eq!(check_stripe(&codec, &c).unwrap(), StripeCheck::Unresolved);
    }

    #[test]
    fn absent_chunks_are_neither_checked_nor_repaired() {
        let codec = ReedSolomon::new(4, 2).unwrap();
        let s = stripe(4, 2, 4096, 8);
        let mut c = good(&s);
        c[2] = Chunk::Absent;
        assert_eq!(check_stripe(&codec, &c).unwrap(), StripeCheck::Unchecked);
        c[5] = Chunk::Absent;
        assert_eq!(check_stripe(&codec, &c).unwrap(), StripeCheck::Unchecked);
        c[0] = Chunk::Bad;
        assert_eq!(check_stripe(&codec, &c).unwrap(), StripeCheck::Unresolved);
        // A wrong count is the caller's mistake.
        assert!(check_stripe(&codec, &c[..5]).is_err());
    }
}
