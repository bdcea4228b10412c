//! The on-disk replica metadata format: a corrupt file must be refused, never panic, and never
//! drive a large allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::file_meta::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode(data) {
        assert_eq!(encode(&m), data);
    }
});
