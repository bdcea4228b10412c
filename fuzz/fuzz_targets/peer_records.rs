//! What a peer node or writer sends inside frames: dirty-record requests and extent lists.
//! Every decoded value must encode back to the bytes it came from.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_proto::{decode_extents, decode_peer, encode_extents, encode_peer, DirtyPeer};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = DirtyPeer::decode(data) {
        assert_eq!(DirtyPeer::decode(&p.encode()).ok(), Some(p));
    }
    if let Ok(n) = decode_peer(data) {
        assert_eq!(decode_peer(&encode_peer(n)).ok(), Some(n));
    }
    if let Ok(e) = decode_extents(data) {
        assert_eq!(decode_extents(&encode_extents(&e)).ok(), Some(e));
    }
});
