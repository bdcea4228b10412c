//! What the kernel answers `map`'s netlink requests with: any datagram parses to replies and
//! their attributes, or is refused, never a panic or a read past its end.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_kernel::netlink::{parse_attrs, parse_replies, Reply};

fuzz_target!(|data: &[u8]| {
    if let Ok(replies) = parse_replies(data) {
        for r in replies {
            if let Reply::Message { attrs, .. } = r {
                if let Ok(a) = parse_attrs(attrs) {
                    for (_, v) in a {
                        let _ = parse_attrs(v);
                    }
                }
            }
        }
    }
    let _ = parse_attrs(data);
});
