//! A node's bookkeeping read back from disk (activity log pages, dirty records): a corrupt or
//! torn file must be refused or read as "everything marked", never panic, and never drive an
//! allocation past what the volume's size bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_node::books::{decode_log, decode_records, encode_records};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(log)) = decode_log(data, 1) {
        assert_eq!(log.words.len(), log.header.words());
    }
    if let Ok(r) = decode_records(data, 1, 1 << 30) {
        assert_eq!(encode_records(1, &r), data);
    }
});
