//! A whole NBD session, handshake and transmission, with the fuzzer's bytes as everything the
//! client sends (over an in-memory stream, to a small in-memory export): the server must end
//! the session cleanly or with an error, never panic or hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    assert!(
        trireme_nbd::testing::session_ends(data.to_vec()),
        "the session panicked or did not end after the client hung up"
    );
});
