//! The on-disk formats of a replica's versions (the main file, a snapshot's file, the redirect
//! log): a corrupt file must be refused, never panic, and never drive a large allocation; what
//! is accepted encodes back to the same bytes (a main file of format version 1, written
//! before versions had sizes, to a version 2 file that reads back the same).
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::versions::format::{
    decode_log, decode_main, decode_snap, encode_log, encode_main, encode_snap,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_main(data) {
        let b = encode_main(&m);
        if data[8..12] == 1u32.to_le_bytes() {
            assert_eq!(decode_main(&b), Ok(m));
        } else {
            assert_eq!(b, data);
        }
    }
    if let Ok(s) = decode_snap(data) {
        assert_eq!(encode_snap(&s), data);
    }
    let log = decode_log(data);
    assert!(log.len() <= data.len() / 40);
    for w in log.windows(2) {
        assert!(w[0].seq() < w[1].seq(), "records come back in sequence order, once each");
    }
    for r in &log {
        assert_eq!(decode_log(&encode_log(r)), vec![*r]);
    }
});
