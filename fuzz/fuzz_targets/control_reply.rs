//! What a control client reads back from the manager (a reply line): the value of the type
//! asked for, the manager's error, or why the line is not a reply — never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = trireme_control::decode_reply::<serde_json::Value>(data);
    let _ = trireme_control::decode_reply::<trireme_control::StatusReport>(data);
    let _ = trireme_control::decode_reply::<Vec<trireme_meta::VolumeRecord>>(data);
    let _ = trireme_control::decode_reply::<trireme_control::VolumeInfo>(data);
});
