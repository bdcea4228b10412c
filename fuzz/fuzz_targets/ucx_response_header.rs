//! What a writer's UCX worker checks of an answer before it fetches any payload (the frame
//! header, the length UCX announces, the link's secret), and the offer a node hands out with
//! its worker address: never a panic; what is accepted is what the bytes say.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_transport::ucx::{decode_offer, encode_offer, parse_response_header, SECRET_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 4 {
        let announced = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
        if let Ok((h, secret)) = parse_response_header(&data[4..], announced) {
            assert!(h.is_response());
            assert_eq!(h.payload_len as usize, announced);
            assert_eq!(&data[data.len() - SECRET_LEN..], &secret[..]);
        }
    }
    if let Ok(o) = decode_offer(data) {
        assert!(!o.address.is_empty() && o.address.len() <= trireme_transport::ucx::MAX_ADDRESS);
        assert_eq!(encode_offer(o.address, &o.secret, o.locality.as_ref()), data);
    }
});
