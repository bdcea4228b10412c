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
