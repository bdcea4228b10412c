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

/// What ends an offer that also says where the node runs ([`Locality`], between the address
/// and the secret).
pub const OFFER_MAGIC_LOCAL: [u8; 4] = *b"TRU3";

/// Longest worker address a node may offer (UCX's are a few hundred bytes).
pub const MAX_ADDRESS: usize = 16 << 10;

/// Where a process runs, as far as UCX's shared memory cares: the host (its boot id) and the
/// network namespace. UCX joins peers with this host's machine id through shared memory,
/// whose wake-ups go over abstract unix sockets, which do not cross network namespaces: a
/// node in another namespace of the same host (a container, or the namespaces the tests use
/// as hosts) never hears of a request until something else wakes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locality {
    pub boot: [u8; 16],
    pub netns: u64,
}

/// Bytes of a [`Locality`] in an offer.
pub const LOCALITY_LEN: usize = 24;

impl Locality {
    /// This process's, if the kernel says (`/proc`).
    pub fn here() -> Option<Locality> {
        static HERE: std::sync::OnceLock<Option<Locality>> = std::sync::OnceLock::new();
        *HERE.get_or_init(|| {
            use std::os::unix::fs::MetadataExt;
            let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            let hex: String = id.trim().chars().filter(|c| *c != '-').collect();
            let mut boot = [0u8; 16];
            for (i, b) in boot.iter_mut().enumerate() {
                *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            let netns = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
            Some(Locality { boot, netns })
        })
    }

    /// Whether a peer at `other` is on this host but in another network namespace.
    pub fn across_namespaces(&self, other: &Locality) -> bool {
        self.boot == other.boot && self.netns != other.netns
    }

    fn encode(&self) -> [u8; LOCALITY_LEN] {
        let mut b = [0u8; LOCALITY_LEN];
        b[..16].copy_from_slice(&self.boot);
        b[16..].copy_from_slice(&self.netns.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Locality {
        Locality {
            boot: b[..16].try_into().expect("16 bytes"),
            netns: u64::from_le_bytes(b[16..LOCALITY_LEN].try_into().expect("8 bytes")),
        }
    }
}

/// A node's UCX offer, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer<'a> {
    pub address: &'a [u8],
    pub secret: [u8; SECRET_LEN],
    /// Where the node runs (`None`: a node that does not say).
    pub locality: Option<Locality>,
}

/// A node's UCX offer: its worker address, where it runs if known, the link's secret, and
/// [`OFFER_MAGIC_LOCAL`] ([`OFFER_MAGIC`] without a locality).
pub fn encode_offer(
    address: &[u8],
    secret: &[u8; SECRET_LEN],
    locality: Option<&Locality>,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(address.len() + LOCALITY_LEN + SECRET_LEN + 4);
    v.extend_from_slice(address);
    if let Some(l) = locality {
        v.extend_from_slice(&l.encode());
    }
    v.extend_from_slice(secret);
    v.extend_from_slice(match locality {
        Some(_) => &OFFER_MAGIC_LOCAL,
        None => &OFFER_MAGIC,
    });
    v
}

/// Splits a node's UCX offer into its worker address, where the node runs, and the link's
/// secret.
pub fn decode_offer(offer: &[u8]) -> Result<Offer<'_>, String> {
    let (rest, local) = if let Some(r) = offer.strip_suffix(&OFFER_MAGIC_LOCAL) {
        (r, true)
    } else if let Some(r) = offer.strip_suffix(&OFFER_MAGIC) {
        (r, false)
    } else {
        return Err(
            "the node does not authenticate its UCX answers (an older version): upgrade it".into(),
        );
    };
    let Some(cut) = rest.len().checked_sub(SECRET_LEN) else {
        return Err("the node's UCX offer is too short to hold a secret".into());
    };
    let (rest, secret) = rest.split_at(cut);
    let (address, locality) = match local {
        true => {
            let Some(cut) = rest.len().checked_sub(LOCALITY_LEN) else {
                return Err("the node's UCX offer is too short to say where it runs".into());
            };
            let (a, l) = rest.split_at(cut);
            (a, Some(Locality::decode(l)))
        }
        false => (rest, None),
    };
    if address.is_empty() || address.len() > MAX_ADDRESS {
        return Err(format!(
            "the node's UCX address is {} bytes long, not 1 to {MAX_ADDRESS}",
            address.len()
        ));
    }
    Ok(Offer {
        address,
        secret: secret.try_into().expect("split at the secret's length"),
        locality,
    })
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
        let here = Locality {
            boot: [9; 16],
            netns: 4026531840,
        };
        let offer = encode_offer(b"worker-address", &[3; SECRET_LEN], Some(&here));
        let o = decode_offer(&offer).unwrap();
        assert_eq!(
            (o.address, o.secret, o.locality),
            (&b"worker-address"[..], [3; SECRET_LEN], Some(here))
        );
        // A node that does not say where it runs.
        let plain = encode_offer(b"worker-address", &[3; SECRET_LEN], None);
        let o = decode_offer(&plain).unwrap();
        assert_eq!((o.address, o.locality), (&b"worker-address"[..], None));
        // An older node's offer: address and secret, no magic.
        let old = &plain[..plain.len() - OFFER_MAGIC.len()];
        assert!(decode_offer(old).unwrap_err().contains("older version"));
        // Too short for a secret or a locality, an empty address, an oversized one.
        assert!(decode_offer(&OFFER_MAGIC).is_err());
        assert!(decode_offer(&[[0; SECRET_LEN].as_slice(), &OFFER_MAGIC_LOCAL].concat()).is_err());
        assert!(decode_offer(&encode_offer(b"", &[0; SECRET_LEN], Some(&here))).is_err());
        assert!(decode_offer(&encode_offer(
            &vec![1; MAX_ADDRESS + 1],
            &[0; SECRET_LEN],
            None
        ))
        .is_err());
        // Same host, another namespace; another host.
        let mine = Locality { netns: 1, ..here };
        assert!(mine.across_namespaces(&here));
        assert!(!mine.across_namespaces(&mine));
        assert!(!mine.across_namespaces(&Locality {
            boot: [1; 16],
            ..here
        }));
        assert!(
            Locality::here().is_some(),
            "/proc says where this process runs"
        );
        assert!(same_secret(&[1; SECRET_LEN], &[1; SECRET_LEN]));
        assert!(!same_secret(
            &[1; SECRET_LEN],
            &[[1; 15].as_slice(), &[2]].concat().try_into().unwrap()
        ));
    }
}
