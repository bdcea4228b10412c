//! The header of a UCX request (frame header, then the link's secret), as a node checks it
//! before it receives any payload: never a panic, and what it accepts is a request whose
//! header encodes back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, secret)) = trireme_transport::ucx::parse_request_header(data) {
        assert!(!h.is_response());
        assert_eq!(&data[trireme_proto::HEADER_LEN..], &secret[..]);
    }
});
