//! A control API request line as the manager decodes it (JSON, from `trireme` CLIs and remote
//! hosts): never a panic, and what decodes encodes back to the same request.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_control::Request;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<Request>(data) {
        let again = serde_json::to_vec(&r).expect("a request always encodes");
        assert_eq!(serde_json::from_slice::<Request>(&again).ok(), Some(r));
    }
});
