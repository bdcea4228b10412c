//! What tiered nodes and writers send each other: a node's tier report (`TierInfo`) and the
//! heat a writer shares (`TierHeat`). Refused or decoded, never a panic; what decodes encodes
//! back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_proto::{decode_heat, encode_heat, TierReport};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = TierReport::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if let Ok(h) = decode_heat(data) {
        assert_eq!(encode_heat(&h), data);
    }
});
