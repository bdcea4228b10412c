//! A replica's tier map read from disk: a corrupt file must be refused, never panic, and never
//! drive a large allocation; what decodes encodes back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::tiered::map::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode(data) {
        assert_eq!(encode(&m), data);
    }
});
