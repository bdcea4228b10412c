//! A clone's files (its bitmap and its fill log) and the `CreateClone` request: a corrupt
//! file or payload must be refused, never panic, and never drive a large allocation; what
//! is accepted encodes back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::backing::file::{decode, encode, replay};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = decode(data) {
        assert_eq!(encode(&s), data);
        assert!(s.unfilled.count <= s.blocks);
    }
    let filled = replay(7, data);
    assert!(filled.len() <= data.len() / 16);
    if let Ok(c) = trireme_proto::CloneRequest::decode(data) {
        assert_eq!(c.encode(), data);
    }
});
