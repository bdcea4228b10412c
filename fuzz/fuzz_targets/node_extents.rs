//! Extent lists a node sends back (block status, dirty and activity queries), as a writer
//! checks them against the range it asked about: whatever passes adds up to at most that
//! range, and the data ranges built on it stay inside it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_proto::{data_ranges, decode_extents_within};

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let span = u64::from_le_bytes(data[..8].try_into().unwrap());
    let base = u64::from_le_bytes(data[8..16].try_into().unwrap());
    if let Ok(ext) = decode_extents_within(&data[16..], span) {
        let total = ext
            .iter()
            .try_fold(0u64, |t, e| t.checked_add(e.length))
            .expect("a list that passed does not overflow");
        assert!(total <= span);
        for (off, len) in data_ranges(&ext, base) {
            assert!(off >= base && off - base <= span && len <= span - (off - base));
        }
    }
});
