//! The TLS record layer the data path seals and opens itself: records of any inner type and
//! content sealed with the link's keys, and raw bytes in between, from a peer that finished
//! the handshake. The reader ends with the data or an error, never a panic or a hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trireme_transport::fuzzing::tls_records(data);
});
