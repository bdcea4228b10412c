//! Reads with deadlines.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Why a header could not be read.
#[derive(Debug)]
pub enum HeaderError {
    Io(std::io::Error),
    /// Nothing arrived within the idle timeout.
    Idle(Duration),
    /// The header began but did not end within its deadline.
    Stalled {
        got: usize,
        of: usize,
        within: Duration,
    },
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Io(e) => write!(f, "read: {e}"),
            HeaderError::Idle(d) => write!(f, "idle for {d:?}"),
            HeaderError::Stalled { got, of, within } => {
                write!(f, "a header stopped at {got} of {of} bytes for {within:?}")
            }
        }
    }
}

impl std::error::Error for HeaderError {}

/// Fills `buf` from `rd`: the first byte may take up to `idle` (`None`: no limit), the rest
/// must follow within `deadline`. `Ok(false)`: the stream ended cleanly before the first byte.
pub async fn read_header<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut [u8],
    idle: Option<Duration>,
    deadline: Duration,
) -> Result<bool, HeaderError> {
    let first = rd.read(buf);
    let n = match idle {
        None => first.await,
        Some(d) => tokio::time::timeout(d, first)
            .await
            .map_err(|_| HeaderError::Idle(d))?,
    }
    .map_err(HeaderError::Io)?;
    if n == 0 {
        return Ok(buf.is_empty());
    }
    let mut got = n;
    let rest = async {
        while got < buf.len() {
            let k = rd.read(&mut buf[got..]).await?;
            if k == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            got += k;
        }
        Ok(())
    };
    match tokio::time::timeout(deadline, rest).await {
        Ok(r) => r.map_err(HeaderError::Io).map(|()| true),
        Err(_) => Err(HeaderError::Stalled {
            got,
            of: buf.len(),
            within: deadline,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn headers_have_an_idle_timeout_and_a_deadline() {
        let d = Duration::from_millis(100);
        // Whole header, in two pieces.
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[1, 2]).await.unwrap();
        let w = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            a.write_all(&[3, 4]).await.unwrap();
            a
        });
        let mut buf = [0u8; 4];
        assert!(read_header(&mut b, &mut buf, Some(d), d).await.unwrap());
        assert_eq!(buf, [1, 2, 3, 4]);
        let mut a = w.await.unwrap();
        // Nothing at all: idle.
        let e = read_header(&mut b, &mut buf, Some(d), d).await.unwrap_err();
        assert!(matches!(e, HeaderError::Idle(_)), "{e}");
        // Half a header, then silence: stalled.
        a.write_all(&[9]).await.unwrap();
        let e = read_header(&mut b, &mut buf, None, d).await.unwrap_err();
        assert!(
            matches!(e, HeaderError::Stalled { got: 1, of: 4, .. }),
            "{e}"
        );
        // A clean end between headers.
        drop(a);
        assert!(!read_header(&mut b, &mut buf, None, d).await.unwrap());
    }
}

/// A connection that ends itself when it has been idle too long: a read or write that makes no
/// progress for the idle time fails with `TimedOut` (every byte moved either way starts the
/// time again). It also holds the connection's place at its port (an [`crate::Admitted`]),
/// given back when it is dropped.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    idle: Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    _place: Option<crate::Admitted>,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, idle: Duration, place: Option<crate::Admitted>) -> Guarded<S> {
        Guarded {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            _place: place,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn moved(&mut self) {
        self.timer
            .as_mut()
            .reset(tokio::time::Instant::now() + self.idle);
        if let Some(p) = &self._place {
            p.standing().touch();
        }
    }

    /// Whether its gate evicted the connection to make room (see `Gate::evicting_idle`).
    fn evicted(&self) -> Option<std::io::Error> {
        self._place
            .as_ref()
            .filter(|p| p.standing().is_evicted())
            .map(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "closed to make room for another connection",
                )
            })
    }

    /// On a poll that is pending: `Ready(TimedOut)` once the idle time is over (or the
    /// connection was evicted).
    fn expired(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Error> {
        if let Some(p) = &self._place {
            p.standing().register(cx.waker());
        }
        if let Some(e) = self.evicted() {
            return std::task::Poll::Ready(e);
        }
        match self.timer.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("idle for {:?}", self.idle),
            )),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

use std::future::Future;
use std::task::Poll;

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(e) = self.evicted() {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.expired(cx).map(Err),
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.expired(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.expired(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.expired(cx).map(Err),
            r => r,
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod guarded_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_quiet_connection_times_out_and_traffic_keeps_it_open() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut g = Guarded::new(a, Duration::from_millis(100), None);
        // Traffic every 50 ms for 300 ms: never idle for 100 ms.
        let w = tokio::spawn(async move {
            for i in 0..6u8 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                b.write_all(&[i]).await.unwrap();
            }
            b
        });
        let mut got = [0u8; 6];
        g.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
        let _b = w.await.unwrap();
        let t = std::time::Instant::now();
        let e = g.read(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(90));
    }
}

/// Resolves once the peer of `sock` has sent something (or closed): the moment a same-host
/// connection leaves its handshake stage. tokio's readiness may be a false positive (a new
/// socket starts out "ready"); this looks at the socket's queue without consuming it.
pub async fn first_bytes(sock: &tokio::net::UnixStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        sock.readable().await?;
        let peeked = sock.try_io(tokio::io::Interest::READABLE, || {
            let mut b = [0u8; 1];
            // SAFETY: recv into a 1-byte buffer we own, on the socket's own descriptor;
            // MSG_PEEK leaves the byte queued.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
        match peeked {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod first_bytes_tests {
    use super::*;

    #[tokio::test]
    async fn a_silent_peer_has_not_spoken_and_one_that_wrote_has() {
        use std::io::Write;
        let d = std::env::temp_dir().join(format!("trireme-net-{}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        let l = tokio::net::UnixListener::bind(&d).unwrap();
        let mut c = std::os::unix::net::UnixStream::connect(&d).unwrap();
        let (s, _) = l.accept().await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(200), first_bytes(&s)).await;
        assert!(quiet.is_err(), "a silent peer counted as having spoken");
        c.write_all(b"x").unwrap();
        tokio::time::timeout(Duration::from_secs(2), first_bytes(&s))
            .await
            .unwrap()
            .unwrap();
        // Nothing was consumed.
        let mut b = [0u8; 1];
        assert_eq!(s.try_read(&mut b).unwrap(), 1);
        let _ = std::fs::remove_file(&d);
    }
}
