//! A replica's block-seal file as it is read back at start (header and body): a damaged,
//! short or foreign one is dropped with a warning, never a panic, and the replica still opens.
#![no_main]
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use trireme_store::{FileStore, SealedStore, Store};

fn dir() -> &'static std::path::Path {
    static D: OnceLock<std::path::PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("trireme-fuzz-seals-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = SealedStore::new(Arc::new(FileStore::open(&d).unwrap()), Some(&d));
        s.create(7, 64 << 10).unwrap();
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let d = dir();
    std::fs::write(d.join("replica-0000000000000007.seals"), data).unwrap();
    let s = SealedStore::new(Arc::new(FileStore::open(d).unwrap()), Some(d));
    let opened = s.open_all();
    assert_eq!(opened.len(), 1);
    let r = opened.into_iter().next().unwrap().expect("a bad seal file never loses the replica");
    let mut b = vec![0u8; 4096];
    // Reads check seals that loaded; zeros were never written, so either way no panic.
    let _ = r.read(0, &mut b);
});
