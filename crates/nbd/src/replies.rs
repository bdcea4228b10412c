//! Replies: their encodings, and the task that writes them to the socket.

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::consts::*;
use crate::BackendError;

/// A reply ready to be written: header bytes and optional data.
pub(crate) type Reply = (BytesMut, Bytes);

/// A reply on its way to the writer, with the budget it holds until it is written.
pub(crate) type Queued = (Reply, Option<crate::transmission::Held>);

pub(crate) fn simple_reply(cookie: u64, error: u32) -> BytesMut {
    let mut b = BytesMut::with_capacity(16);
    b.put_u32(SIMPLE_REPLY_MAGIC);
    b.put_u32(error);
    b.put_u64(cookie);
    b
}

pub(crate) fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> BytesMut {
    let mut b = BytesMut::with_capacity(20 + 8);
    b.put_u32(STRUCTURED_REPLY_MAGIC);
    b.put_u16(flags);
    b.put_u16(kind);
    b.put_u64(cookie);
    b.put_u32(len);
    b
}

pub(crate) fn error_reply(structured: bool, cookie: u64, e: &BackendError) -> Reply {
    if !structured {
        return (simple_reply(cookie, e.errno), Bytes::new());
    }
    let msg = &e.message.as_bytes()[..e.message.len().min(1024)];
    let mut b = chunk_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        6 + msg.len() as u32,
    );
    b.put_u32(e.errno);
    b.put_u16(msg.len() as u16);
    b.put_slice(msg);
    (b, Bytes::new())
}

pub(crate) fn invalid(errno: u32, message: impl Into<String>) -> BackendError {
    BackendError {
        errno,
        message: message.into(),
    }
}

pub(crate) async fn write_replies<W: AsyncWrite + Unpin>(
    wr: W,
    rx: mpsc::UnboundedReceiver<Queued>,
) -> std::io::Result<()> {
    if wr.is_write_vectored() {
        write_replies_vectored(wr, rx).await
    } else {
        write_replies_buffered(wr, rx).await
    }
}

/// Writes every reply ready at once in one `writev`: the data goes from the backend's buffer
/// to the socket with no copy on the way (a 4K read reply was copied into a buffer first).
pub(crate) async fn write_replies_vectored<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) -> std::io::Result<()> {
    let mut parts: Vec<Bytes> = Vec::new();
    let mut permits = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(((h, d), permit)) = next {
            parts.push(h.freeze());
            if !d.is_empty() {
                parts.push(d);
            }
            permits.push(permit);
            next = if parts.len() < BATCH_PARTS {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        write_all_parts(&mut w, &mut parts).await?;
        // Written: the budget the replies held goes back.
        permits.clear();
    }
    w.shutdown().await
}

/// The most buffers in one `writev` (Linux's `IOV_MAX` is 1024).
pub(crate) const BATCH_PARTS: usize = 256;

/// Writes `parts` in order, as few `writev` calls as the socket takes, and empties it.
pub(crate) async fn write_all_parts<W: AsyncWrite + Unpin>(
    w: &mut W,
    parts: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < parts.len() {
        let n = {
            let slices: Vec<std::io::IoSlice<'_>> = parts[done..]
                .iter()
                .map(|p| std::io::IoSlice::new(p))
                .collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut n = n;
        while n > 0 {
            let len = parts[done].len();
            if n >= len {
                n -= len;
                done += 1;
            } else {
                bytes::Buf::advance(&mut parts[done], n);
                n = 0;
            }
        }
    }
    parts.clear();
    w.flush().await
}

/// For streams without vectored writes (TLS): replies copied into one buffer per batch.
pub(crate) async fn write_replies_buffered<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(256 * 1024, wr);
    while let Some(((h, d), permit)) = rx.recv().await {
        w.write_all(&h).await?;
        w.write_all(&d).await?;
        drop(permit);
        while let Ok(((h, d), permit)) = rx.try_recv() {
            w.write_all(&h).await?;
            w.write_all(&d).await?;
            drop(permit);
        }
        w.flush().await?;
    }
    w.shutdown().await
}
#[cfg(test)]
mod write_tests {
    use super::*;
    use std::io::IoSlice;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket that takes at most `max` bytes per write, as a full socket buffer does.
    struct Trickle {
        got: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            self.calls += 1;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.max - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Short writes that end inside a buffer and across buffers still put every byte out once,
    /// in order; a socket that takes everything gets one call.
    #[tokio::test]
    async fn replies_go_out_whole_and_in_order_through_short_writes() {
        let parts: Vec<Bytes> = (0..40u8)
            .map(|k| Bytes::from(vec![k; 1 + (k as usize * 37) % 300]))
            .collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for max in [1, 7, 16, 4096, 1 << 20] {
            let mut w = Trickle {
                got: Vec::new(),
                max,
                calls: 0,
            };
            let mut p = parts.clone();
            write_all_parts(&mut w, &mut p).await.unwrap();
            assert!(p.is_empty());
            assert_eq!(w.got, want, "max {max}");
            if max == 1 << 20 {
                assert_eq!(w.calls, 1);
            }
        }
    }
}
