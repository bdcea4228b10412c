//! What nodes report of themselves and writers share: a node's tier report (`TierInfo`), the
//! heat a writer shares (`TierHeat`), and a node's room (`Space`). Refused or decoded, never a
//! panic; what decodes encodes back to the same bytes (a room report to its known fields).
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_proto::{decode_heat, encode_heat, NodeSpace, TierReport, NODE_SPACE_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = TierReport::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if let Ok(h) = decode_heat(data) {
        assert_eq!(encode_heat(&h), data);
    }
    if let Ok(s) = NodeSpace::decode(data) {
        let b = s.encode();
        assert_eq!(b[..40], data[..40]);
        assert_eq!(b[48..64], data[48..64]);
        assert_eq!(b.len(), NODE_SPACE_LEN);
        let _ = s.limit();
    }
});
