//! Extent lists a node sends back (block status, dirty and activity queries), as a writer
//! checks them against the range it asked about: whatever passes adds up to at most that
//! range, and the data ranges built on it stay inside it. The typed answers that carry them
//! (and the other answers in header fields) read what they put, and refuse the rest.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_proto::{
    data_ranges, decode_extents_within, ActivityAnswer, AttachAnswer, ChecksumAnswer, DirtyAnswer,
    Header, Op, PingAnswer, ReplicaInfoAnswer,
};

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let span = u64::from_le_bytes(data[..8].try_into().unwrap());
    let base = u64::from_le_bytes(data[8..16].try_into().unwrap());
    if let Ok(ext) = decode_extents_within(&data[16..], span) {
        let total = ext
            .iter()
            .try_fold(0u64, |t, e| t.checked_add(e.length))
            .expect("a list that passed does not overflow");
        assert!(total <= span);
        for (off, len) in data_ranges(&ext, base) {
            assert!(off >= base && off - base <= span && len <= span - (off - base));
        }
    }
    // The answers' header fields from the same bytes, their payload the rest.
    let mut h = Header::request(Op::ReplicaInfo, 0);
    (h.length, h.offset, h.epoch) = (span, base, span ^ base.rotate_left(7));
    let p = &data[16..];
    let mut back = h;
    if let Ok(a) = ReplicaInfoAnswer::read(&h, p) {
        assert_eq!(a.put(&mut back), p);
        assert_eq!(ReplicaInfoAnswer::read(&back, p).unwrap(), a);
    }
    if let Ok(a) = DirtyAnswer::read(&h, p, span) {
        let b = a.put(&mut back);
        assert_eq!(DirtyAnswer::read(&back, &b, span).unwrap(), a);
    }
    if let Ok(a) = ActivityAnswer::read(&h, p, span) {
        let b = a.put(&mut back);
        assert_eq!(ActivityAnswer::read(&back, &b, span).unwrap(), a);
    }
    if let Ok(a) = ChecksumAnswer::read(&h) {
        a.put(&mut back);
        assert_eq!(ChecksumAnswer::read(&back).unwrap(), a);
    }
    let a = AttachAnswer::read(&h);
    a.put(&mut back);
    assert_eq!(AttachAnswer::read(&back), a);
    let a = PingAnswer::read(&h, p);
    let b = a.put(&mut back);
    assert_eq!(PingAnswer::read(&back, &b), a);
});
