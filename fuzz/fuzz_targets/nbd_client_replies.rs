//! What an NBD server sends the client (the benchmark's NBD target and the interop tools'
//! counterpart): the handshake's option replies and the transmission replies, driven over an
//! in-memory stream. Whatever the bytes, the client ends with results or errors.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    assert!(trireme_nbd::testing::client_ends(data.to_vec()));
});
