//! Payloads of the dirty-region tracking ops (`DirtyMark`, `DirtyQuery`, `DirtyClear`,
//! `DirtyTrack`): which peer replica, which incarnation of it, and how to track it.

use crate::DecodeError;

/// Stop tracking the peer and forget its dirty regions (it is in sync again).
pub const DIRTY_DROP: u8 = 0;
/// Mark every write this replica receives dirty for the peer (the peer is out).
pub const DIRTY_AUTO: u8 = 1;
/// Keep the peer's dirty regions but mark nothing new by itself; only explicit `DirtyMark`s add
/// regions. (The volume client does not use it: it keeps survivors in auto mode while a peer
/// resyncs, so a resync that stops halfway still leaves a record covering everything.)
pub const DIRTY_MANUAL: u8 = 2;

/// `DirtyMark` only: the peer has just gone out of sync, so a record started now is complete.
/// A mark with [`DIRTY_AUTO`] for a peer this replica has no record of starts an *untrusted*
/// one (it would miss what happened before): a resync never relies on it.
pub const DIRTY_START: u8 = 3;

/// Encoded size of [`DirtyPeer`].
pub const DIRTY_PEER_LEN: usize = 13;

/// A peer replica as named in a tracking request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyPeer {
    /// The node holding the peer replica.
    pub peer: u32,
    /// The peer replica's incarnation when it went out: a resync may use the regions only if the
    /// peer still has this incarnation.
    pub incarnation: u64,
    /// One of [`DIRTY_DROP`], [`DIRTY_AUTO`], [`DIRTY_MANUAL`], [`DIRTY_START`].
    pub mode: u8,
}

impl DirtyPeer {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(DIRTY_PEER_LEN);
        b.extend_from_slice(&self.peer.to_le_bytes());
        b.extend_from_slice(&self.incarnation.to_le_bytes());
        b.push(self.mode);
        b
    }

    pub fn decode(b: &[u8]) -> Result<DirtyPeer, DecodeError> {
        if b.len() != DIRTY_PEER_LEN {
            return Err(DecodeError::MalformedPayload {
                what: "dirty-peer payload must be 13 bytes",
            });
        }
        let mode = b[12];
        if mode > DIRTY_START {
            return Err(DecodeError::MalformedPayload {
                what: "unknown dirty tracking mode",
            });
        }
        Ok(DirtyPeer {
            peer: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            incarnation: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")),
            mode,
        })
    }
}

/// The payload naming just a peer (`DirtyQuery`, `DirtyClear`).
pub fn encode_peer(peer: u32) -> Vec<u8> {
    peer.to_le_bytes().to_vec()
}

pub fn decode_peer(b: &[u8]) -> Result<u32, DecodeError> {
    let b: [u8; 4] = b.try_into().map_err(|_| DecodeError::MalformedPayload {
        what: "peer payload must be 4 bytes",
    })?;
    Ok(u32::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn dirty_peer_round_trips(peer: u32, incarnation: u64, mode in 0u8..=3) {
            let p = DirtyPeer { peer, incarnation, mode };
            prop_assert_eq!(DirtyPeer::decode(&p.encode()), Ok(p));
        }

        #[test]
        fn dirty_peer_decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..32)) {
            let _ = DirtyPeer::decode(&b);
            let _ = decode_peer(&b);
        }
    }

    #[test]
    fn bad_mode_is_refused() {
        let mut b = DirtyPeer {
            peer: 1,
            incarnation: 2,
            mode: DIRTY_AUTO,
        }
        .encode();
        b[12] = 9;
        assert!(DirtyPeer::decode(&b).is_err());
    }
}
