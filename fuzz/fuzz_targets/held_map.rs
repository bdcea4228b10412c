//! A parity replica's held-block map read back from disk: any bytes are refused or read as a
//! map of the replica's size, never panic, and never hold a block past its end.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::held::{HeldMap, BLOCKS_PER_PAGE, PAGE};

fuzz_target!(|data: &[u8]| {
    let Some((&tail, bytes)) = data.split_last() else {
        return;
    };
    let pages = (bytes.len() / (2 * PAGE)) as u64;
    let blocks = (pages * BLOCKS_PER_PAGE).saturating_sub(u64::from(tail));
    if let Ok(m) = HeldMap::decode(bytes, blocks) {
        assert_eq!(m.blocks(), blocks);
        assert!(m.held(blocks, u64::MAX).is_empty());
        assert!(!m.is_dirty());
    }
});
