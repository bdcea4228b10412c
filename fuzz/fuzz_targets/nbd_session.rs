//! A whole NBD session, handshake and transmission, with the fuzzer's bytes as everything the
//! client sends (over an in-memory stream, to a small in-memory export): the server must end
//! the session cleanly or with an error, never panic or hang.
#![no_main]
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trireme_nbd::{Backend, BackendError, Exports, Extent};

struct Mem(Mutex<Vec<u8>>);

impl Backend for Mem {
    fn size(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
    fn can_multi_conn(&self) -> bool {
        true
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, BackendError> {
        let v = self.0.lock().unwrap();
        Ok(Bytes::copy_from_slice(
            &v[offset as usize..offset as usize + len as usize],
        ))
    }
    async fn write(&self, offset: u64, data: Bytes, _: bool) -> Result<(), BackendError> {
        self.0.lock().unwrap()[offset as usize..offset as usize + data.len()]
            .copy_from_slice(&data);
        Ok(())
    }
    async fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _: bool,
        _: bool,
    ) -> Result<(), BackendError> {
        self.0.lock().unwrap()[offset as usize..(offset + u64::from(len)) as usize].fill(0);
        Ok(())
    }
    async fn block_status(&self, _: u64, len: u32) -> Result<Vec<Extent>, BackendError> {
        Ok(vec![Extent {
            length: u64::from(len),
            flags: 0,
        }])
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut ex = Exports::new();
        ex.add("vol0", "fuzz", Arc::new(Mem(Mutex::new(vec![0; 1 << 16]))));
        let srv = tokio::spawn(trireme_nbd::serve_connection(server, Arc::new(ex)));
        let (mut rd, mut wr) = tokio::io::split(client);
        let input = data.to_vec();
        tokio::spawn(async move {
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        });
        // Drain the server's replies so it never blocks on a full pipe.
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        });
        // Virtual time: a session that never ends trips this at once.
        let r = tokio::time::timeout(std::time::Duration::from_secs(3600), srv).await;
        assert!(
            r.is_ok(),
            "the session did not end after the client hung up"
        );
        assert!(r.unwrap().is_ok(), "the session panicked");
    });
});
