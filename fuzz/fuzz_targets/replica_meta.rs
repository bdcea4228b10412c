//! The on-disk replica metadata format: a corrupt file must be refused, never panic, and never
//! drive a large allocation. A file of the current version reads back byte for byte; one of an
//! older version (still read) is written back in the current one, saying the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::file_meta::{decode, encode};

/// The version `encode` writes (bytes 8..12).
const CURRENT: u32 = 2;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode(data) {
        let again = encode(&m);
        if data.get(8..12) == Some(&CURRENT.to_le_bytes()[..]) {
            assert_eq!(again, data);
        }
        assert_eq!(decode(&again).ok(), Some(m));
    }
});
