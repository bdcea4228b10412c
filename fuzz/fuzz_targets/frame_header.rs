//! Node wire frames: header decode, payload check and extent lists must never panic, and a
//! header that decodes must re-encode to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_proto::{check_payload, decode_extents, decode_header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = decode_header(data) {
        let payload = &data[HEADER_LEN.min(data.len())..];
        if check_payload(&h, payload).is_ok() {
            assert_eq!(&h.encode(payload)[..], &data[..HEADER_LEN]);
        }
        let _ = decode_extents(payload);
    }
    let _ = decode_extents(data);
});
