//! The active messages' headers, checked before anything of a payload is received.

use bytes::Bytes;
use trireme_proto::{check_payload, decode_header, Header, HEADER_LEN};

use super::SECRET_LEN;
use crate::{Frame, TransportError};

/// UCX header of a request and of a response: the frame header, then the link's secret.
pub(super) const AM_HEADER: usize = HEADER_LEN + SECRET_LEN;

/// What ends a node's UCX offer (after its worker address and the link's secret): says the
/// node answers with the secret too. An offer without it comes from a node that does not (an
/// older version), whose answers a client cannot tell from forged ones: it stays on TCP.
pub const OFFER_MAGIC: [u8; 4] = *b"TRU2";

/// Longest worker address a node may offer (UCX's are a few hundred bytes).
pub const MAX_ADDRESS: usize = 16 << 10;

/// A node's UCX offer: its worker address, the link's secret, [`OFFER_MAGIC`].
pub fn encode_offer(address: &[u8], secret: &[u8; SECRET_LEN]) -> Vec<u8> {
    let mut v = Vec::with_capacity(address.len() + SECRET_LEN + OFFER_MAGIC.len());
    v.extend_from_slice(address);
    v.extend_from_slice(secret);
    v.extend_from_slice(&OFFER_MAGIC);
    v
}

/// Splits a node's UCX offer into its worker address and the link's secret.
pub fn decode_offer(offer: &[u8]) -> Result<(&[u8], [u8; SECRET_LEN]), String> {
    let Some(rest) = offer.strip_suffix(&OFFER_MAGIC) else {
        return Err(
            "the node does not authenticate its UCX answers (an older version): upgrade it".into(),
        );
    };
    let Some(cut) = rest.len().checked_sub(SECRET_LEN) else {
        return Err("the node's UCX offer is too short to hold a secret".into());
    };
    let (address, secret) = rest.split_at(cut);
    if address.is_empty() || address.len() > MAX_ADDRESS {
        return Err(format!(
            "the node's UCX address is {} bytes long, not 1 to {MAX_ADDRESS}",
            address.len()
        ));
    }
    Ok((
        address,
        secret.try_into().expect("split at the secret's length"),
    ))
}

/// Compares two secrets in time that does not depend on where they differ.
pub(super) fn same_secret(a: &[u8; SECRET_LEN], b: &[u8; SECRET_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Splits a UCX request's active-message header: the frame header (decoded and checked: a
/// request, its payload length within the frame limit), then the link's secret. Runs before
/// anything of the payload is received.
pub fn parse_request_header(hdr: &[u8]) -> Result<(Header, [u8; SECRET_LEN]), String> {
    let (h, secret) = split(hdr)?;
    if h.is_response() {
        return Err("a response sent as a request".into());
    }
    Ok((h, secret))
}

/// Splits a UCX response's active-message header like a request's ([`parse_request_header`]):
/// a response frame header, whose payload length must be `payload_len` (what UCX says is
/// coming), then the secret of the link its request went out on. Runs before anything of the
/// payload is received.
pub fn parse_response_header(
    hdr: &[u8],
    payload_len: usize,
) -> Result<(Header, [u8; SECRET_LEN]), String> {
    let (h, secret) = split(hdr)?;
    if !h.is_response() {
        return Err("a request sent as a response".into());
    }
    if h.payload_len as usize != payload_len {
        return Err(format!(
            "a response announcing {} payload bytes with {payload_len}",
            h.payload_len
        ));
    }
    Ok((h, secret))
}

fn split(hdr: &[u8]) -> Result<(Header, [u8; SECRET_LEN]), String> {
    if hdr.len() != AM_HEADER {
        return Err(format!("a {}-byte header, not {AM_HEADER}", hdr.len()));
    }
    let h = decode_header(&hdr[..HEADER_LEN]).map_err(|e| e.to_string())?;
    let secret = hdr[HEADER_LEN..]
        .try_into()
        .map_err(|_| "a short secret".to_string())?;
    Ok((h, secret))
}

/// The frame of a header checked by [`parse_request_header`] or [`parse_response_header`] and
/// its payload, once the payload's checksum holds.
pub(super) fn frame_of(header: Header, payload: Bytes) -> Result<Frame, TransportError> {
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
            let b: Vec<u8> = (0..AM_HEADER).map(|i| (i * 31 + n * 7) as u8).collect();
            let _ = parse_request_header(&b[..n.min(b.len())]);
        }
    }

    #[test]
    fn responses_carry_the_secret_and_say_what_follows() {
        let req = Header::request(Op::Read, 9);
        let mut hdr = req.response(Status::Ok).encode(&[1, 2, 3, 4]).to_vec();
        hdr.extend_from_slice(&[4; SECRET_LEN]);
        let (h, secret) = parse_response_header(&hdr, 4).unwrap();
        assert_eq!(
            (h.request_id, h.payload_len, secret),
            (9, 4, [4; SECRET_LEN])
        );
        // The payload UCX announces must be the one the header declares.
        assert!(parse_response_header(&hdr, 5).is_err());
        assert!(parse_response_header(&hdr, 0).is_err());
        // No secret (an older node's answer), a request, a broken header.
        assert!(parse_response_header(&hdr[..HEADER_LEN], 4).is_err());
        let mut as_req = req.encode(&[1, 2, 3, 4]).to_vec();
        as_req.extend_from_slice(&[4; SECRET_LEN]);
        assert!(parse_response_header(&as_req, 4).is_err());
        hdr[3] ^= 0x40;
        assert!(parse_response_header(&hdr, 4).is_err());
    }

    #[test]
    fn offers_name_address_and_secret_and_old_ones_are_told_apart() {
        let offer = encode_offer(b"worker-address", &[3; SECRET_LEN]);
        let (a, s) = decode_offer(&offer).unwrap();
        assert_eq!((a, s), (&b"worker-address"[..], [3; SECRET_LEN]));
        // An older node's offer: address and secret, no magic.
        let old = &offer[..offer.len() - OFFER_MAGIC.len()];
        assert!(decode_offer(old).unwrap_err().contains("older version"));
        // Too short for a secret, an empty address, an oversized one.
        assert!(decode_offer(&OFFER_MAGIC).is_err());
        assert!(decode_offer(&encode_offer(b"", &[0; SECRET_LEN])).is_err());
        assert!(decode_offer(&encode_offer(&vec![1; MAX_ADDRESS + 1], &[0; SECRET_LEN])).is_err());
        assert!(same_secret(&[1; SECRET_LEN], &[1; SECRET_LEN]));
        assert!(!same_secret(
            &[1; SECRET_LEN],
            &[[1; 15].as_slice(), &[2]].concat().try_into().unwrap()
        ));
    }
}
