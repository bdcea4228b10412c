//! Extent lists: the payload of a `BlockStatus` response.

use crate::DecodeError;

/// Bytes per encoded extent: `length: u64`, `flags: u32`.
pub const EXTENT_LEN: usize = 12;
/// Extent flag: never written (or deallocated).
pub const EXTENT_HOLE: u32 = 1;
/// Extent flag: reads return zeros.
pub const EXTENT_ZERO: u32 = 2;

/// A run of bytes with the same allocation state, in order from the request's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// `EXTENT_HOLE | EXTENT_ZERO` for holes, 0 for data (the NBD `base:allocation` bits).
    pub flags: u32,
}

impl Extent {
    pub const HOLE: u32 = EXTENT_HOLE;
    pub const ZERO: u32 = EXTENT_ZERO;
}

/// The byte ranges of the data extents (flags 0) in a list that starts at `base`: what a dirty
/// or activity query marks.
pub fn data_ranges(extents: &[Extent], base: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = base;
    for e in extents {
        if e.flags == 0 {
            out.push((pos, e.length));
        }
        // Lists from peers are checked first (`decode_extents_within`); this stays sound
        // for any list: it never wraps.
        pos = pos.saturating_add(e.length);
    }
    out
}

pub fn encode_extents(extents: &[Extent]) -> Vec<u8> {
    let mut out = Vec::with_capacity(extents.len() * EXTENT_LEN);
    for e in extents {
        out.extend_from_slice(&e.length.to_le_bytes());
        out.extend_from_slice(&e.flags.to_le_bytes());
    }
    out
}

/// Decodes an extent list that answers a request for `span` bytes: like [`decode_extents`],
/// and the extents may not add up past `span` (nor overflow on the way). What a peer says of
/// a range is range-checked before anyone adds offsets to it.
pub fn decode_extents_within(b: &[u8], span: u64) -> Result<Vec<Extent>, DecodeError> {
    let ext = decode_extents(b)?;
    let mut total: u64 = 0;
    for e in &ext {
        total = total.checked_add(e.length).filter(|&t| t <= span).ok_or(
            DecodeError::MalformedPayload {
                what: "extents run past the range asked about",
            },
        )?;
    }
    Ok(ext)
}

/// Decodes an extent list. Rejects a ragged payload and zero-length extents.
pub fn decode_extents(b: &[u8]) -> Result<Vec<Extent>, DecodeError> {
    if !b.len().is_multiple_of(EXTENT_LEN) {
        return Err(DecodeError::MalformedPayload {
            what: "extent list length is not a multiple of 12",
        });
    }
    let mut out = Vec::with_capacity(b.len() / EXTENT_LEN);
    for c in b.chunks_exact(EXTENT_LEN) {
        let mut l = [0u8; 8];
        l.copy_from_slice(&c[0..8]);
        let mut f = [0u8; 4];
        f.copy_from_slice(&c[8..12]);
        let e = Extent {
            length: u64::from_le_bytes(l),
            flags: u32::from_le_bytes(f),
        };
        if e.length == 0 {
            return Err(DecodeError::MalformedPayload {
                what: "zero-length extent",
            });
        }
        out.push(e);
    }
    Ok(out)
}
