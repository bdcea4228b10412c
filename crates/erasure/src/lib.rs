//! Erasure coding for parity volumes (issue 67): a stripe is K data chunks and M parity
//! chunks of one length; any K of the K+M rebuild the rest.
//!
//! The writer and the encoder speak to [`Codec`], a trait of our own, so the implementation
//! can change without touching them. [`ReedSolomon`] implements it with Intel's ISA-L
//! (through `erasure-isa-l`; Debian's `libisal` when it is installed, else built from
//! source): a systematic Reed-Solomon code over GF(2^8) with a Cauchy matrix, the code Ceph's
//! `isa` plugin writes. `bench/erasure` chose it over `reed-solomon-simd` (numbers in
//! ARCHITECTURE.md): 3-4x faster to encode here, and a degraded 4 KiB read rebuilds in
//! microseconds where the GF(2^16) code pays about 200 us per rebuild whatever its size.
//!
//! The parity bytes are a format: what one implementation wrote, only the same code reads.
//! A test computes them independently (a Cauchy matrix over GF(2^8), polynomial 0x11d) so
//! that a library update cannot change them unseen.
//!
//! Chunk indices: data `0..K`, parity `K..K+M`.

use std::fmt;
use std::num::NonZeroUsize;

use erasure_isa_l::erasure::ErasureCode;

mod check;
pub use check::{check_stripe, Chunk, StripeCheck};

/// Why coding failed. Every one is a caller's mistake or a stripe past saving; none loses
/// what the caller holds (inputs are only read, and outputs are written only on success).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error(
        "{data}+{parity}: the codec takes 1..={MAX_DATA} data and 1..={MAX_PARITY} parity chunks"
    )]
    Shape { data: usize, parity: usize },
    #[error("a stripe of {data}+{parity} has {data}+{parity} chunks, not {got}")]
    Count {
        data: usize,
        parity: usize,
        got: usize,
    },
    #[error("chunks must be one length and not empty (got {0} and {1} bytes)")]
    Length(usize, usize),
    #[error(
        "{present} of the stripe's chunks are left, fewer than the {data} it takes to rebuild"
    )]
    TooFew { present: usize, data: usize },
    #[error("the coding library refused: {0}")]
    Library(String),
}

/// K data + M parity chunks per stripe (see the module docs).
pub trait Codec: Send + Sync + fmt::Debug {
    /// K.
    fn data(&self) -> usize;
    /// M.
    fn parity(&self) -> usize;
    /// The M parity chunks of `data` (K chunks of one length).
    fn encode(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodecError>;
    /// Fills in the missing (`None`) chunks of a stripe of K+M from the ones present; at
    /// least K must be. On an error nothing is filled in.
    fn reconstruct(&self, chunks: &mut [Option<Vec<u8>>]) -> Result<(), CodecError>;

    /// Whether a whole stripe's parity matches its data (a scrub's question).
    fn verify(&self, chunks: &[&[u8]]) -> Result<bool, CodecError> {
        let (k, m) = (self.data(), self.parity());
        if chunks.len() != k + m {
            return Err(CodecError::Count {
                data: k,
                parity: m,
                got: chunks.len(),
            });
        }
        let parity = self.encode(&chunks[..k])?;
        Ok(parity.iter().zip(&chunks[k..]).all(|(a, b)| a == b))
    }
}

/// The widest stripe: 32 data and 16 parity chunks (GF(2^8) would allow 255 in all; no
/// cluster spreads a stripe wider than this).
pub const MAX_DATA: usize = 32;
pub const MAX_PARITY: usize = 16;

/// Cauchy Reed-Solomon over ISA-L (see the module docs).
pub struct ReedSolomon {
    k: usize,
    m: usize,
    code: ErasureCode,
}

impl fmt::Debug for ReedSolomon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReedSolomon({}+{}, ISA-L Cauchy)", self.k, self.m)
    }
}

impl ReedSolomon {
    pub fn new(data: usize, parity: usize) -> Result<ReedSolomon, CodecError> {
        let shape = CodecError::Shape { data, parity };
        if !(1..=MAX_DATA).contains(&data) || !(1..=MAX_PARITY).contains(&parity) {
            return Err(shape);
        }
        let (k, m) = (NonZeroUsize::new(data), NonZeroUsize::new(parity));
        let code =
            ErasureCode::with_cauchy(k.ok_or(shape.clone())?, m.ok_or(shape)?).map_err(library)?;
        Ok(ReedSolomon {
            k: data,
            m: parity,
            code,
        })
    }

    /// The one length of `chunks`, checked.
    fn length<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> Result<usize, CodecError> {
        let mut len = None;
        for c in chunks {
            match len {
                None if c.is_empty() => return Err(CodecError::Length(0, 0)),
                None => len = Some(c.len()),
                Some(l) if l != c.len() => return Err(CodecError::Length(l, c.len())),
                Some(_) => {}
            }
        }
        len.ok_or(CodecError::Length(0, 0))
    }

    fn count(&self, got: usize) -> CodecError {
        CodecError::Count {
            data: self.k,
            parity: self.m,
            got,
        }
    }
}

fn library(e: erasure_isa_l::Error) -> CodecError {
    CodecError::Library(e.to_string())
}

impl Codec for ReedSolomon {
    fn data(&self) -> usize {
        self.k
    }

    fn parity(&self) -> usize {
        self.m
    }

    fn encode(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodecError> {
        if data.len() != self.k {
            return Err(self.count(data.len() + self.m));
        }
        let len = Self::length(data.iter().copied())?;
        let mut parity = vec![vec![0u8; len]; self.m];
        self.code.encode(data, &mut parity).map_err(library)?;
        Ok(parity)
    }

    fn reconstruct(&self, chunks: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        let (k, m) = (self.k, self.m);
        if chunks.len() != k + m {
            return Err(self.count(chunks.len()));
        }
        let len = Self::length(chunks.iter().flatten().map(Vec::as_slice))?;
        let lost: Vec<usize> = (0..k + m).filter(|&i| chunks[i].is_none()).collect();
        if lost.len() > m {
            return Err(CodecError::TooFew {
                present: k + m - lost.len(),
                data: k,
            });
        }
        if lost.is_empty() {
            return Ok(());
        }
        // The library rebuilds in place: zeroed buffers stand in for the lost chunks, and
        // the present ones are moved in and back out, so an error leaves them as they were.
        let mut all: Vec<Vec<u8>> = chunks
            .iter_mut()
            .map(|c| c.take().unwrap_or_else(|| vec![0u8; len]))
            .collect();
        let (data, parity) = all.split_at_mut(k);
        let result = self
            .code
            .decode(data, parity, lost.clone())
            .map_err(library);
        for (i, c) in all.into_iter().enumerate() {
            if result.is_ok() || !lost.contains(&i) {
                chunks[i] = Some(c);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests;
