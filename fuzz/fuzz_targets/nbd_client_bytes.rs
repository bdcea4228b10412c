//! What an NBD client sends: option payloads (GO/INFO, meta contexts) and request headers.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_nbd::codec::{decode_go, decode_meta, decode_request, encode_request, REQUEST_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = decode_go(data);
    let _ = decode_meta(data);
    if data.len() >= REQUEST_LEN {
        let b: &[u8; REQUEST_LEN] = data[..REQUEST_LEN].try_into().unwrap();
        if let Ok(r) = decode_request(b) {
            assert_eq!(&encode_request(&r), b);
        }
    }
});
