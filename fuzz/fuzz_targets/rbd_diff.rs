//! Ceph's rbd diff stream and a backup catalog as `import-diff` and `restore` read them: any
//! bytes are refused or read, never a panic; no record reaches past the size it declared,
//! and no piece of data is larger than the reader hands out.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_backup::rbd_diff::{DiffReader, Record, MAX_PIECE};

fuzz_target!(|data: &[u8]| {
    if let Ok(mut r) = DiffReader::new(data) {
        for _ in 0..10_000 {
            match r.next_record() {
                Ok(Record::End) | Err(_) => break,
                Ok(Record::Write { offset, data }) => {
                    assert!(data.len() as u64 <= MAX_PIECE);
                    assert!(offset + data.len() as u64 <= r.size().expect("a size first"));
                }
                Ok(Record::Zero { offset, len }) => {
                    assert!(offset.checked_add(len).expect("checked") <= r.size().expect("a size first"));
                }
                Ok(_) => {}
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = serde_json::from_str::<trireme_backup::catalog::Catalog>(text);
    }
});
