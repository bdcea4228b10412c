//! The CA's list of revoked serials (`revoked-serials`, read back at each `ca revoke` and
//! `ca crl`): any text is refused, naming its line, or read, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = trireme_tls::crl::check_serials(s);
    }
});
