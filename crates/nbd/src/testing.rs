//! In-memory pieces for tests and fuzzing (`cfg(test)` or the `testing` feature): an export
//! held in memory, and a whole NBD session driven with arbitrary client bytes.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trireme_blockdev::mem::MemDevice;
use trireme_blockdev::{DevError, ErrorKind, Filter, Filtered, Want};

use crate::{serve_connection, Exports, Extent};

/// A device in memory that offers two dirty bitmaps, so sessions negotiate several contexts
/// and get a chunk per context; bitmap `b` fails.
#[derive(Debug)]
pub struct TwoBitmaps(pub MemDevice);

/// An export held in memory (see [`TwoBitmaps`]).
pub type MemBackend = Filtered<TwoBitmaps>;

/// A memory export of `size` bytes.
pub fn mem(size: usize) -> MemBackend {
    Filtered(TwoBitmaps(MemDevice::new(size)))
}

impl Filter for TwoBitmaps {
    type Next = MemDevice;
    fn next(&self) -> &MemDevice {
        &self.0
    }
    async fn contexts(&self) -> Vec<String> {
        vec!["qemu:dirty-bitmap:a".into(), "qemu:dirty-bitmap:b".into()]
    }
    async fn context_status(
        &self,
        name: &str,
        _offset: u64,
        len: u32,
        _want: Want,
    ) -> Result<Vec<Extent>, DevError> {
        if name.ends_with(":b") {
            return Err(DevError::new(ErrorKind::Io, "bitmap b fails"));
        }
        let half = u64::from(len) / 2;
        Ok([(half, 1), (u64::from(len) - half, 0)]
            .into_iter()
            .filter(|&(n, _)| n > 0)
            .map(|(length, flags)| Extent { length, flags })
            .collect())
    }
}

/// Serves one session of a 64 KiB memory export (`vol0`) whose client sends `input` and
/// then hangs up, replies drained, in virtual time. Whether it ended (cleanly or with an
/// error): `false` if it panicked or never ended.
pub fn session_ends(input: Vec<u8>) -> bool {
    paused_runtime().block_on(async move {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut ex = Exports::new();
        ex.add("vol0", "in memory", Arc::new(mem(1 << 16)));
        let srv = tokio::spawn(serve_connection(server, Arc::new(ex)));
        let (rd, wr) = tokio::io::split(client);
        talk(rd, wr, input);
        // Ok(Ok(_)): it ended (cleanly or with an error); Ok(Err(_)): it panicked.
        let r = tokio::time::timeout(std::time::Duration::from_secs(3600), srv).await;
        matches!(r, Ok(Ok(_)))
    })
}

/// Runs the NBD client against a "server" that sends `input` and then hangs up: the
/// handshake, then a read, a write and a flush, in virtual time. `false` if the client
/// panicked or never ended. Whatever the bytes, it must end with a result or an error.
pub fn client_ends(input: Vec<u8>) -> bool {
    paused_runtime().block_on(async move {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (srd, swr) = tokio::io::split(server);
        talk(srd, swr, input);
        let run = tokio::spawn(async move {
            let (r, w) = tokio::io::split(client);
            let Ok(c) = crate::client::NbdClient::handshake(r, Box::new(w), "vol0").await else {
                return;
            };
            let _ = c.read(0, 4096).await;
            let _ = c.write(0, &[1u8; 512], false).await;
            let _ = c.flush().await;
        });
        let r = tokio::time::timeout(std::time::Duration::from_secs(3600), run).await;
        matches!(r, Ok(Ok(())))
    })
}

/// One end of an in-memory session: sends `input` and hangs up, and reads and drops whatever
/// the other end sends.
fn talk(
    mut rd: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    mut wr: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    input: Vec<u8>,
) {
    tokio::spawn(async move {
        let _ = wr.write_all(&input).await;
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    });
}

/// A current-thread runtime in virtual time: a session that waits only sleeps in it.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}
