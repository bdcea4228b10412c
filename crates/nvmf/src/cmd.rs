//! Submission and completion queue entries (NVMe base specification), the commands this
//! target serves, and their status codes. Pure.

use crate::pdu::{CQE_LEN, SQE_LEN};

/// Admin opcodes.
pub mod admin {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// I/O (NVM command set) opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// The fabrics opcode; the command type is byte 4.
pub const FABRICS: u8 = 0x7f;

/// Fabrics command types.
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
}

/// Status codes: (status code type << 8) | status code.
pub mod status {
    pub const SUCCESS: u16 = 0x000;
    pub const INVALID_OPCODE: u16 = 0x001;
    pub const INVALID_FIELD: u16 = 0x002;
    pub const DATA_TRANSFER_ERROR: u16 = 0x004;
    pub const INTERNAL: u16 = 0x006;
    pub const INVALID_NS: u16 = 0x00b;
    pub const SEQUENCE_ERROR: u16 = 0x00c;
    pub const SGL_INVALID_DATA_LENGTH: u16 = 0x00f;
    pub const SGL_INVALID_TYPE: u16 = 0x011;
    pub const LBA_RANGE: u16 = 0x080;
    pub const CAPACITY_EXCEEDED: u16 = 0x081;
    // Command specific (type 1).
    pub const INVALID_QUEUE_ID: u16 = 0x101;
    pub const INVALID_QUEUE_SIZE: u16 = 0x102;
    pub const ASYNC_LIMIT: u16 = 0x105;
    pub const INVALID_LOG_PAGE: u16 = 0x109;
    pub const FEATURE_NOT_SAVEABLE: u16 = 0x10d;
    pub const CONNECT_INCOMPATIBLE_FORMAT: u16 = 0x180;
    pub const CONNECT_CONTROLLER_BUSY: u16 = 0x181;
    pub const CONNECT_INVALID_PARAMETERS: u16 = 0x182;
    pub const CONNECT_INVALID_HOST: u16 = 0x184;
    // Media and data integrity (type 2).
    pub const WRITE_FAULT: u16 = 0x280;
    pub const UNRECOVERED_READ: u16 = 0x281;
    pub const ACCESS_DENIED: u16 = 0x286;
    // Path related (type 3).
    pub const ANA_INACCESSIBLE: u16 = 0x302;
    pub const ANA_TRANSITION: u16 = 0x303;
    /// Do Not Retry, in the CQE's status field.
    pub const DNR: u16 = 0x4000;
}

/// SGL descriptor types (type << 4 | subtype).
pub mod sgl {
    /// Data block, offset: data in the capsule at `addr`.
    pub const INCAPSULE: u8 = 0x01;
    /// Transport SGL data block, transport specific: data moved by R2T/H2CData or C2HData.
    pub const TRANSPORT: u8 = 0x5a;
}

/// A submission queue entry, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sqe {
    pub opcode: u8,
    pub flags: u8,
    pub cid: u16,
    pub nsid: u32,
    pub sgl_addr: u64,
    pub sgl_len: u32,
    pub sgl_type: u8,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub raw: [u8; SQE_LEN],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

impl Sqe {
    pub fn decode(b: &[u8; SQE_LEN]) -> Sqe {
        Sqe {
            opcode: b[0],
            flags: b[1],
            cid: u16::from_le_bytes([b[2], b[3]]),
            nsid: u32_at(b, 4),
            sgl_addr: u64_at(b, 24),
            sgl_len: u32_at(b, 32),
            sgl_type: b[39],
            cdw10: u32_at(b, 40),
            cdw11: u32_at(b, 44),
            cdw12: u32_at(b, 48),
            cdw13: u32_at(b, 52),
            cdw14: u32_at(b, 56),
            cdw15: u32_at(b, 60),
            raw: *b,
        }
    }

    /// A command with these fields (the initiator's side).
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        Sqe {
            opcode,
            flags: 0x40, // PSDT: SGLs
            cid,
            nsid,
            sgl_addr: 0,
            sgl_len: 0,
            sgl_type: sgl::TRANSPORT,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
            raw: [0; SQE_LEN],
        }
    }

    /// The 64 bytes: `raw` with the decoded fields written over it.
    pub fn encode(&self) -> [u8; SQE_LEN] {
        let mut b = self.raw;
        b[0] = self.opcode;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.cid.to_le_bytes());
        if self.opcode != crate::cmd::FABRICS {
            b[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        }
        b[24..32].copy_from_slice(&self.sgl_addr.to_le_bytes());
        b[32..36].copy_from_slice(&self.sgl_len.to_le_bytes());
        b[39] = self.sgl_type;
        for (i, v) in [
            self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
        ]
        .into_iter()
        .enumerate()
        {
            b[40 + 4 * i..44 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// A fabrics command's type.
    pub fn fctype(&self) -> u8 {
        self.raw[4]
    }

    /// The logical block and count (0's based) of a read, write or write-zeroes.
    pub fn lba_range(&self) -> (u64, u32) {
        (
            u64::from(self.cdw10) | u64::from(self.cdw11) << 32,
            (self.cdw12 & 0xffff) + 1,
        )
    }

    /// Force unit access.
    pub fn fua(&self) -> bool {
        self.cdw12 & (1 << 30) != 0
    }

    /// Whether the host sends data with this command, receives it, or neither (the
    /// opcode's low two bits; a fabrics command's by its type).
    pub fn direction(&self) -> Direction {
        let bits = match self.opcode {
            FABRICS => self.fctype() & 3,
            op => op & 3,
        };
        match bits {
            1 => Direction::ToController,
            2 => Direction::ToHost,
            _ => Direction::None,
        }
    }
}

/// Which way a command's data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    None,
    ToController,
    ToHost,
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    /// (type << 8) | code, and [`status::DNR`].
    pub status: u16,
}

impl Cqe {
    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        b[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        let sct_sc = self.status & 0x7ff;
        let dnr = self.status & status::DNR;
        b[14..16].copy_from_slice(&((sct_sc << 1) | dnr << 1).to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; CQE_LEN]) -> Cqe {
        let raw = u16::from_le_bytes([b[14], b[15]]);
        Cqe {
            result: u64_at(b, 0),
            sq_head: u16::from_le_bytes([b[8], b[9]]),
            sq_id: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: ((raw >> 1) & 0x7ff) | ((raw >> 1) & status::DNR),
        }
    }

    /// The status without Do Not Retry.
    pub fn code(&self) -> u16 {
        self.status & 0x7ff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_round_trips_with_dnr() {
        let c = Cqe {
            result: 0x1122_3344_5566_7788,
            sq_head: 7,
            sq_id: 2,
            cid: 0xbeef,
            status: status::CONNECT_INVALID_HOST | status::DNR,
        };
        let b = c.encode();
        // Phase bit 0, status code 0x84 in bits 8:1, type 1 in bits 11:9, DNR in bit 15.
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), (0x184 << 1) | 0x8000);
        assert_eq!(Cqe::decode(&b), c);
    }

    #[test]
    fn sqe_round_trips() {
        let mut s = Sqe::new(io::WRITE, 9, 1);
        s.cdw10 = 5;
        s.cdw12 = 7 | 1 << 30;
        s.sgl_len = 32768;
        let d = Sqe::decode(&s.encode());
        assert_eq!(d.lba_range(), (5, 8));
        assert!(d.fua());
        assert_eq!(d.sgl_len, 32768);
        assert_eq!(d.direction(), Direction::ToController);
    }
}
