//! A held map's live copy read back after a crash (`trireme_store::ledger::live_bits`, then
//! `HeldMap::adopt_live`): any bytes are refused or taken as bits of the replica's size,
//! never panic, and never hold a block past its end.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_store::held::HeldMap;
use trireme_store::ledger::live_bits;

fuzz_target!(|data: &[u8]| {
    let Some((&tail, file)) = data.split_last() else {
        return;
    };
    let Some(bits) = live_bits(file, "boot") else {
        return;
    };
    let blocks = (bits.len() as u64 * 8).saturating_sub(u64::from(tail));
    let mut map = HeldMap::new(blocks);
    if map.adopt_live(bits).is_ok() {
        assert!(map.held(blocks, u64::MAX).is_empty());
        assert_eq!(map.live_image(), bits);
    }
});
