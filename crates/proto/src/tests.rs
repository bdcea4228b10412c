use super::*;
use proptest::prelude::*;

fn any_op() -> impl Strategy<Value = Op> {
    (1u8..=38).prop_map(|v| Op::from_u8(v).unwrap())
}

prop_compose! {
    fn any_header()(op in any_op(), flags in 0u16..8, request_id: u64, volume: u64, epoch: u64,
                    offset: u64, length: u64, status in 0u32..9) -> Header {
        Header { op, flags, request_id, volume, epoch, offset, length,
                 status: Status::from_u32(status), payload_len: 0, payload_crc: 0 }
    }
}

proptest! {
    #[test]
    fn header_round_trips(h in any_header(), payload in proptest::collection::vec(any::<u8>(), 0..256)) {
        let bytes = h.encode(&payload);
        let d = decode_header(&bytes).unwrap();
        prop_assert_eq!(d.payload_len as usize, payload.len());
        prop_assert_eq!(Header { payload_len: 0, payload_crc: 0, ..d }, h);
        prop_assert!(check_payload(&d, &payload).is_ok());
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = decode_header(&b);
        let _ = decode_extents(&b);
    }

    #[test]
    fn any_single_bit_flip_is_caught(h in any_header(), bit in 0usize..(HEADER_LEN * 8)) {
        let mut bytes = h.encode(b"payload");
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_header(&bytes).is_err());
    }

    #[test]
    fn payload_corruption_is_caught(payload in proptest::collection::vec(any::<u8>(), 1..256), at: usize) {
        let h = Header::request(Op::Write, 7);
        let d = decode_header(&h.encode(&payload)).unwrap();
        let mut bad = payload.clone();
        let i = at % bad.len();
        bad[i] ^= 0x5a;
        prop_assert_eq!(check_payload(&d, &bad), Err(DecodeError::PayloadChecksum));
    }

    #[test]
    fn extents_round_trip(v in proptest::collection::vec((1u64.., any::<u32>()), 0..32)) {
        let ext: Vec<Extent> = v.into_iter().map(|(length, flags)| Extent { length, flags }).collect();
        prop_assert_eq!(decode_extents(&encode_extents(&ext)).unwrap(), ext);
    }

    /// Whatever a peer sends, what passes `decode_extents_within` adds up to at most the span
    /// asked about, and data ranges built on it stay inside `[base, base + span)`.
    #[test]
    fn extents_from_peers_stay_in_their_range(
        v in proptest::collection::vec((any::<u64>(), 0u32..4), 0..8),
        span in any::<u64>(),
        base in any::<u64>(),
    ) {
        let ext: Vec<Extent> = v.into_iter().map(|(length, flags)| Extent { length, flags }).collect();
        if let Ok(got) = decode_extents_within(&encode_extents(&ext), span) {
            let total = got.iter().try_fold(0u64, |t, e| t.checked_add(e.length));
            prop_assert!(total.is_some_and(|t| t <= span));
            for (off, len) in data_ranges(&got, base) {
                prop_assert!(off >= base);
                prop_assert!(off - base <= span && len <= span - (off - base));
            }
        }
    }
}

#[test]
fn extents_that_wrap_or_overrun_are_refused() {
    let e = |length| Extent { length, flags: 0 };
    // Two extents whose sum wraps to exactly the span asked about.
    let wrap = encode_extents(&[e(u64::MAX), e(4097)]);
    assert!(decode_extents_within(&wrap, 4096).is_err());
    assert!(decode_extents_within(&encode_extents(&[e(4096), e(1)]), 4096).is_err());
    assert_eq!(
        decode_extents_within(&encode_extents(&[e(1024), e(3072)]), 4096).unwrap(),
        vec![e(1024), e(3072)]
    );
}

#[test]
fn oversize_payload_is_refused_before_allocation() {
    let mut bytes = Header::request(Op::Write, 1).encode(&[]);
    bytes[52..56].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
    let crc = crc32c::crc32c(&bytes[0..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        decode_header(&bytes),
        Err(DecodeError::PayloadTooLarge {
            len: MAX_PAYLOAD + 1
        })
    );
}

#[test]
fn wrong_version_and_magic_are_named() {
    let mut bytes = Header::request(Op::Ping, 1).encode(&[]);
    bytes[4] = 9;
    assert_eq!(
        decode_header(&bytes),
        Err(DecodeError::BadVersion { found: 9 })
    );
    bytes[0] = b'X';
    assert!(matches!(
        decode_header(&bytes),
        Err(DecodeError::BadMagic { .. })
    ));
    assert_eq!(
        decode_header(&bytes[..10]),
        Err(DecodeError::ShortHeader { got: 10 })
    );
}

#[test]
fn a_header_for_a_sealed_link_carries_no_payload_checksum() {
    let payload = b"bytes a TLS record authenticates";
    let bytes = Header::request(Op::Write, 1).encode_unchecked_payload(payload.len());
    let h = decode_header(&bytes).unwrap();
    assert_eq!(h.payload_len as usize, payload.len());
    assert_eq!(h.payload_crc, 0);
    assert_eq!(check_payload_len(&h, payload), Ok(()));
    assert!(check_payload_len(&h, &payload[1..]).is_err());
    // A plain link's check still wants the checksum.
    assert_eq!(
        check_payload(&h, payload),
        Err(DecodeError::PayloadChecksum)
    );
}
