//! Frames on a stream: read with their checks and deadlines, written in batches.

use bytes::{Bytes, BytesMut};
use tokio::io::{
    AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::sync::mpsc;
use trireme_proto::{check_payload, decode_header, Header, HEADER_LEN};

use super::client::Outgoing;
use super::WRITE_BATCH;
use crate::Frame;

/// Like [`read_frame`]; once a header has arrived, its payload must follow within `deadline`
/// (a peer that announces a payload and stalls is dropped, not waited for).
/// Reads one frame. `Ok(None)` on a clean end of stream between frames. Once a header has
/// arrived, its payload must follow within `deadline` (a peer that announces a payload and
/// stalls is dropped, not waited for).
pub(crate) async fn read_frame_within<R: FrameSource>(
    rd: &mut R,
    deadline: Option<std::time::Duration>,
) -> Result<Option<Frame>, ReadError> {
    let mut hb = [0u8; HEADER_LEN];
    match rd.read_exact(&mut hb).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(ReadError::Io(e)),
    }
    let header = decode_header(&hb).map_err(ReadError::Decode)?;
    let len = header.payload_len as usize;
    let payload = match deadline {
        _ if len == 0 => BytesMut::new(),
        None => read_payload(rd, len).await?,
        Some(d) => tokio::time::timeout(d, read_payload(rd, len))
            .await
            .map_err(|_| ReadError::Stalled { len, within: d })??,
    };
    if rd.payload_sealed() {
        trireme_proto::check_payload_len(&header, &payload)
    } else {
        check_payload(&header, &payload)
    }
    .map_err(ReadError::Decode)?;
    Ok(Some(Frame::new(header, payload.freeze())))
}

/// How long a client's stream stays silent before it sends a keepalive ping: well within a
/// node's idle timeout (`server::IDLE`), so that an idle volume's links stay open.
pub(crate) const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);

/// The request id of keepalive pings: calls count from 1, so their answers are told apart.
pub(crate) const KEEPALIVE_ID: u64 = 0;

/// The next frame to send; a keepalive ping when none came for [`KEEPALIVE`]; `None` once
/// every sender is gone.
async fn next_or_keepalive(rx: &mut mpsc::UnboundedReceiver<Outgoing>) -> Option<Outgoing> {
    match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
        Ok(next) => next,
        Err(_) => Some((
            Header::request(trireme_proto::Op::Ping, KEEPALIVE_ID),
            Bytes::new(),
            None,
        )),
    }
}

/// Reads the payload `header` announces, charged to the process's payload budget before its
/// first byte is read (waiting for room: back-pressure on this link), within `deadline`, and
/// checks it as [`read_frame_within`] does. The charge is paid back when the payload is
/// dropped.
pub(crate) async fn read_payload_charged<R: FrameSource>(
    rd: &mut R,
    header: Header,
    deadline: std::time::Duration,
) -> Result<Frame, ReadError> {
    let len = header.payload_len as usize;
    if len == 0 {
        check_payload(&header, &[]).map_err(ReadError::Decode)?;
        return Ok(Frame::new(header, Bytes::new()));
    }
    let charge = crate::budget::charge(len).await;
    let payload = tokio::time::timeout(deadline, read_payload(rd, len))
        .await
        .map_err(|_| ReadError::Stalled {
            len,
            within: deadline,
        })??;
    if rd.payload_sealed() {
        trireme_proto::check_payload_len(&header, &payload)
    } else {
        check_payload(&header, &payload)
    }
    .map_err(ReadError::Decode)?;
    let payload = Bytes::from_owner(crate::budget::Charged(payload, Some(charge)));
    Ok(Frame::new(header, payload))
}

/// Reads and drops `len` bytes within `deadline`, through a small buffer: a refused request's
/// payload costs no memory.
pub(crate) async fn skip_payload<R: AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
    deadline: std::time::Duration,
) -> Result<(), ReadError> {
    let skip = async {
        let mut left = len as u64;
        let mut scratch = [0u8; 8192];
        while left > 0 {
            let n = rd
                .read(&mut scratch[..left.min(8192) as usize])
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            left -= n as u64;
        }
        Ok(())
    };
    tokio::time::timeout(deadline, skip)
        .await
        .map_err(|_| ReadError::Stalled {
            len,
            within: deadline,
        })?
}

/// Reads a payload of `len` bytes (bounded by `decode_header`). Memory follows the bytes that
/// arrived, a megabyte ahead at most, not the length the peer announced; and nothing is
/// zero-filled before the data overwrites it.
pub(crate) async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
) -> Result<BytesMut, ReadError> {
    const AHEAD: usize = 1 << 20;
    let mut payload = BytesMut::with_capacity(len.min(AHEAD));
    while payload.len() < len {
        let left = len - payload.len();
        if payload.capacity() == payload.len() {
            payload.reserve(left.min(payload.len().max(AHEAD)));
        }
        let n = (&mut *rd)
            .take(left as u64)
            .read_buf(&mut payload)
            .await
            .map_err(ReadError::Io)?;
        if n == 0 {
            return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok(payload)
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("read: {0}")]
    Io(std::io::Error),
    #[error("decode: {0}")]
    Decode(trireme_proto::DecodeError),
    #[error("header: {0}")]
    Header(trireme_net::io::HeaderError),
    #[error("a {len}-byte payload did not arrive within {within:?}")]
    Stalled {
        len: usize,
        within: std::time::Duration,
    },
}

/// The writer of a plain stream: each batch of queued frames goes out in one `writev`, headers
/// from a small array and payloads straight from their shared buffers. A payload sent to three
/// replicas is never copied into three stream buffers.
pub(crate) async fn write_frames_vectored<W: FrameSink>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    let mut headers: Vec<[u8; HEADER_LEN]> = Vec::with_capacity(WRITE_BATCH);
    let mut payloads: Vec<Bytes> = Vec::with_capacity(WRITE_BATCH);
    while let Some(first) = next_or_keepalive(&mut rx).await {
        headers.clear();
        payloads.clear();
        let mut next = Some(first);
        while let Some((h, payload, crc)) = next.take() {
            headers.push(match crc {
                Some(crc) => {
                    debug_assert_eq!(crc, trireme_proto::payload_crc(&payload));
                    h.encode_with_crc(payload.len(), crc)
                }
                None => h.encode(&payload),
            });
            payloads.push(payload);
            if headers.len() < WRITE_BATCH {
                next = rx.try_recv().ok();
            }
        }
        let mut slices: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(2 * headers.len());
        for (h, p) in headers.iter().zip(&payloads) {
            slices.push(std::io::IoSlice::new(h));
            if !p.is_empty() {
                slices.push(std::io::IoSlice::new(p));
            }
        }
        let mut left = &mut slices[..];
        while !left.is_empty() {
            let n = w.write_vectored(left).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            std::io::IoSlice::advance_slices(&mut left, n);
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), w.shutdown()).await;
    Ok(())
}

pub(crate) async fn write_frames<W: FrameSink>(
    mut w: BufWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    while let Some((h, payload, crc)) = next_or_keepalive(&mut rx).await {
        write_one(&mut w, &h, &payload, crc).await?;
        // Batch whatever else is already queued into the same flush.
        let mut n = 1;
        while n < WRITE_BATCH {
            match rx.try_recv() {
                Ok((h, p, crc)) => write_one(&mut w, &h, &p, crc).await?,
                Err(_) => break,
            }
            n += 1;
        }
        w.flush().await?;
    }
    // Every handle is gone: close our side, so the peer ends the link (and our reader with
    // it). Dropping a split TLS stream's write half would not: the read half still holds the
    // socket, and both ends would keep it open for good.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), w.shutdown()).await;
    Ok(())
}

pub(crate) async fn write_one<W: FrameSink>(
    w: &mut BufWriter<W>,
    h: &Header,
    payload: &[u8],
    crc: Option<u32>,
) -> std::io::Result<()> {
    let header = if w.get_ref().payload_sealed() {
        h.encode_unchecked_payload(payload.len())
    } else if let Some(crc) = crc {
        debug_assert_eq!(
            crc,
            trireme_proto::payload_crc(payload),
            "the caller's checksum"
        );
        h.encode_with_crc(payload.len(), crc)
    } else {
        h.encode(payload)
    };
    w.write_all(&header).await?;
    w.write_all(payload).await
}

/// Where a stream's frames are read from: a plain socket under a [`BufReader`], or a TLS
/// link's reader (which is its own buffer).
pub(crate) trait FrameSource: AsyncBufRead + AsyncRead + Unpin + Send {
    /// Payload checksums are neither sent nor checked on this link: it authenticates every
    /// byte itself (a TLS link whose peer agreed, see `records::SEALED_FRAMES`); headers keep
    /// theirs.
    fn payload_sealed(&self) -> bool;
    /// Bytes that can be read now without waiting (fewer is fine, never more).
    fn ready_len(&mut self) -> usize;
}

impl<R: AsyncRead + Unpin + Send> FrameSource for BufReader<R> {
    fn payload_sealed(&self) -> bool {
        false
    }
    fn ready_len(&mut self) -> usize {
        self.buffer().len()
    }
}

impl FrameSource for crate::records::TlsReader {
    fn payload_sealed(&self) -> bool {
        self.frames_sealed()
    }
    fn ready_len(&mut self) -> usize {
        crate::records::TlsReader::ready_len(self)
    }
}

/// Where a stream's frames are written to; see [`FrameSource::payload_sealed`].
pub(crate) trait FrameSink: AsyncWrite + Unpin + Send {
    fn payload_sealed(&self) -> bool;
}

impl FrameSink for tokio::net::tcp::OwnedWriteHalf {
    fn payload_sealed(&self) -> bool {
        false
    }
}

impl FrameSink for tokio::net::unix::OwnedWriteHalf {
    fn payload_sealed(&self) -> bool {
        false
    }
}

impl FrameSink for crate::records::TlsWriter {
    fn payload_sealed(&self) -> bool {
        self.frames_sealed()
    }
}
