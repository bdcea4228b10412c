//! The active messages' headers, checked before anything of a payload is received.

use bytes::Bytes;
use trireme_proto::{check_payload, decode_header, Header, HEADER_LEN};

use super::{REQUEST_HEADER, SECRET_LEN};
use crate::{Frame, TransportError};

/// Decodes a frame that came as an active message.
/// Splits a UCX request's active-message header: the frame header (decoded and checked: a
/// request, its payload length within the frame limit), then the link's secret. Runs before
/// anything of the payload is received.
pub fn parse_request_header(hdr: &[u8]) -> Result<(Header, [u8; SECRET_LEN]), String> {
    if hdr.len() != REQUEST_HEADER {
        return Err(format!("a {}-byte header, not {REQUEST_HEADER}", hdr.len()));
    }
    let h = decode_header(&hdr[..HEADER_LEN]).map_err(|e| e.to_string())?;
    if h.is_response() {
        return Err("a response sent as a request".into());
    }
    let secret = hdr[HEADER_LEN..]
        .try_into()
        .map_err(|_| "a short secret".to_string())?;
    Ok((h, secret))
}

pub(super) fn frame_of(hdr: &[u8], payload: Bytes) -> Result<Frame, TransportError> {
    let header = decode_header(hdr).map_err(|source| TransportError::Decode {
        peer: "ucx".into(),
        source,
    })?;
    check_payload(&header, &payload).map_err(|source| TransportError::Decode {
        peer: "ucx".into(),
        source,
    })?;
    Ok(Frame::new(header, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_proto::{Op, Status};

    #[test]
    fn request_headers_are_checked_before_the_payload() {
        let h = Header::request(Op::Write, 3).encode(&[1, 2, 3]);
        let mut hdr = h.to_vec();
        hdr.extend_from_slice(&[9; SECRET_LEN]);
        let (got, secret) = parse_request_header(&hdr).unwrap();
        assert_eq!(
            (got.op, got.payload_len, secret),
            (Op::Write, 3, [9; SECRET_LEN])
        );
        // A header without its secret, one with a byte more, a broken crc, a response.
        assert!(parse_request_header(&hdr[..HEADER_LEN + 8]).is_err());
        assert!(parse_request_header(&[&hdr[..], &[0]].concat()).is_err());
        let mut bad = hdr.clone();
        bad[20] ^= 1;
        assert!(parse_request_header(&bad).is_err());
        let mut resp = Header::request(Op::Write, 3)
            .response(Status::Ok)
            .encode(&[])
            .to_vec();
        resp.extend_from_slice(&[9; SECRET_LEN]);
        assert!(parse_request_header(&resp).is_err());
        // Any bytes: an error or a request, never a panic.
        for n in 0..200usize {
            let b: Vec<u8> = (0..REQUEST_HEADER)
                .map(|i| (i * 31 + n * 7) as u8)
                .collect();
            let _ = parse_request_header(&b[..n.min(b.len())]);
        }
    }
}
