//! What the kernel puts in a ublk request's descriptor (op and flags, start sector, sector
//! count) and the buffer it gave: any of it decodes to a request within the buffer, or an
//! errno, never a panic or a read past the buffer.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trireme_kernel::ublk::{decode, Op};

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let op_flags = u32::from_le_bytes(data[0..4].try_into().unwrap());
    let start = u64::from_le_bytes(data[4..12].try_into().unwrap());
    let sectors = u32::from_le_bytes(data[12..16].try_into().unwrap());
    let buf = &data[16..];
    match decode(op_flags, start, sectors, buf) {
        Ok(Op::Write { data, .. }) => assert!(data.len() <= buf.len()),
        Ok(Op::Read { len, .. }) => assert!(len as usize <= buf.len()),
        Ok(_) => {}
        Err(errno) => assert!(errno < 0),
    }
});
