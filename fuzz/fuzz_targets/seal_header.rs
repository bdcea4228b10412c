//! The header of a replica's block-seal file: a damaged one must be refused, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::sealed::check_header;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let v = u64::from_le_bytes(data[..8].try_into().unwrap());
        let n = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let _ = check_header(&data[16..], v, n);
    }
});
