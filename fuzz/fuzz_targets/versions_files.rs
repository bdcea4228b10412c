//! The on-disk formats of a replica's versions (the main file and a snapshot's file): a
//! corrupt file must be refused, never panic, and never drive a large allocation; what is
//! accepted encodes back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::versions::format::{decode_main, decode_snap, encode_main, encode_snap};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_main(data) {
        assert_eq!(encode_main(&m), data);
    }
    if let Ok(s) = decode_snap(data) {
        assert_eq!(encode_snap(&s), data);
    }
});
