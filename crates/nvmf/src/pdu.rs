//! NVMe/TCP PDUs (transport specification 1.0): the 8-byte common header, the PDU-specific
//! headers, and their checks. Pure: no I/O. Every length is checked against its type and
//! against a bound before anything is allocated.

use bytes::{BufMut, Bytes, BytesMut};

/// PDU types.
pub mod kind {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM: u8 = 0x02;
    pub const C2H_TERM: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flag {
    pub const HDGST: u8 = 0x01;
    pub const DDGST: u8 = 0x02;
    /// H2CData / C2HData: the last PDU of the transfer.
    pub const DATA_LAST: u8 = 0x04;
    /// C2HData: the command succeeded; no response capsule follows.
    pub const DATA_SUCCESS: u8 = 0x08;
}

/// The common header's length.
pub const CH_LEN: usize = 8;
/// ICReq and ICResp: header and PDU length.
pub const IC_LEN: usize = 128;
/// A submission queue entry.
pub const SQE_LEN: usize = 64;
/// A completion queue entry.
pub const CQE_LEN: usize = 16;
/// Command capsule header: common header and SQE.
pub const CMD_HLEN: usize = CH_LEN + SQE_LEN;
/// Response capsule: common header and CQE.
pub const RESP_HLEN: usize = CH_LEN + CQE_LEN;
/// H2CData, C2HData and R2T headers.
pub const DATA_HLEN: usize = 24;
/// Termination request headers (the offending header follows, up to 152 bytes).
pub const TERM_HLEN: usize = 24;
/// The most of an offending header a termination request carries.
pub const TERM_MAX_DATA: usize = 152;

/// Fatal error status of a termination request.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE: u16 = 0x02;
    pub const DATA_TRANSFER_LIMIT: u16 = 0x05;
    pub const INVALID_DATA_UNSUPPORTED_PARAMETER: u16 = 0x07;
}

/// Why bytes are not a PDU we take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("unknown PDU type {0:#04x}")]
    UnknownType(u8),
    #[error("PDU type {kind:#04x} with header length {hlen} (must be {want})")]
    HeaderLength { kind: u8, hlen: u8, want: usize },
    #[error("PDU type {kind:#04x} of {plen} bytes: {why}")]
    PduLength {
        kind: u8,
        plen: u32,
        why: &'static str,
    },
    #[error(
        "PDU data offset {pdo} in a PDU whose header is {hlen} bytes and which is {plen} long"
    )]
    DataOffset { pdo: u8, hlen: u8, plen: u32 },
    #[error("digest flags {0:#04x}: digests were not negotiated")]
    Digest(u8),
    #[error("{0}")]
    Field(&'static str),
}

impl PduError {
    /// The termination request's fatal error status and the offset of the field at fault.
    pub fn fes(&self) -> (u16, u32) {
        match self {
            PduError::UnknownType(_) => (fes::INVALID_HEADER_FIELD, 0),
            PduError::HeaderLength { .. } => (fes::INVALID_HEADER_FIELD, 2),
            PduError::PduLength { .. } => (fes::INVALID_HEADER_FIELD, 4),
            PduError::DataOffset { .. } => (fes::INVALID_HEADER_FIELD, 3),
            PduError::Digest(_) => (fes::INVALID_HEADER_FIELD, 1),
            PduError::Field(_) => (fes::INVALID_DATA_UNSUPPORTED_PARAMETER, 8),
        }
    }
}

/// The common header of every PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Common {
    pub kind: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl Common {
    pub fn decode(b: &[u8; CH_LEN]) -> Common {
        Common {
            kind: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    pub fn put(&self, out: &mut BytesMut) {
        out.put_u8(self.kind);
        out.put_u8(self.flags);
        out.put_u8(self.hlen);
        out.put_u8(self.pdo);
        out.put_u32_le(self.plen);
    }

    /// The bytes after the header that carry data (0 when none).
    pub fn data_len(&self) -> usize {
        if self.pdo == 0 {
            0
        } else {
            self.plen as usize - self.pdo as usize
        }
    }

    /// Checks a PDU a controller receives from a host: a known type, its header length, a
    /// PDU length within `max_data` bytes of data, a data offset inside it, and no digest
    /// (this target negotiates none).
    pub fn check_from_host(&self, max_data: usize) -> Result<(), PduError> {
        let want = match self.kind {
            kind::IC_REQ => IC_LEN,
            kind::H2C_TERM => TERM_HLEN,
            kind::CAPSULE_CMD => CMD_HLEN,
            kind::H2C_DATA => DATA_HLEN,
            k => return Err(PduError::UnknownType(k)),
        };
        self.check(want, max_data)
    }

    /// Checks a PDU a host receives from a controller (the initiator's side).
    pub fn check_from_controller(&self, max_data: usize) -> Result<(), PduError> {
        let want = match self.kind {
            kind::IC_RESP => IC_LEN,
            kind::C2H_TERM => TERM_HLEN,
            kind::CAPSULE_RESP => RESP_HLEN,
            kind::C2H_DATA | kind::R2T => DATA_HLEN,
            k => return Err(PduError::UnknownType(k)),
        };
        self.check(want, max_data)
    }

    fn check(&self, want: usize, max_data: usize) -> Result<(), PduError> {
        if self.hlen as usize != want {
            return Err(PduError::HeaderLength {
                kind: self.kind,
                hlen: self.hlen,
                want,
            });
        }
        if self.flags & (flag::HDGST | flag::DDGST) != 0 {
            return Err(PduError::Digest(self.flags));
        }
        let plen = self.plen as usize;
        let bad = |why| PduError::PduLength {
            kind: self.kind,
            plen: self.plen,
            why,
        };
        if plen < want {
            return Err(bad("shorter than its header"));
        }
        let fixed = matches!(
            self.kind,
            kind::IC_REQ | kind::IC_RESP | kind::CAPSULE_RESP | kind::R2T
        );
        if fixed && plen != want {
            return Err(bad("this type carries no data"));
        }
        let is_term = matches!(self.kind, kind::H2C_TERM | kind::C2H_TERM);
        if is_term {
            return match plen - want <= TERM_MAX_DATA {
                true => Ok(()),
                false => Err(bad("a termination request carries at most 152 bytes")),
            };
        }
        if plen - want > max_data {
            return Err(bad("more data than this queue takes"));
        }
        let pdo = self.pdo as usize;
        let offset_ok = match plen == want {
            true => pdo == 0 || pdo == want,
            false => pdo >= want && pdo <= plen,
        };
        if !offset_ok {
            return Err(PduError::DataOffset {
                pdo: self.pdo,
                hlen: self.hlen,
                plen: self.plen,
            });
        }
        // This target asks for no alignment (CPDA 0), so data follows the header at once;
        // a pad between them is accepted and skipped.
        Ok(())
    }
}

/// The fields ICReq and ICResp share the layout of: a format version, a byte each for the
/// data alignment and the digests, and a 32-bit limit.
fn ic_decode(b: &[u8], what: &'static str) -> Result<(u16, u8, u8, u32), PduError> {
    if b.len() < IC_LEN - CH_LEN {
        return Err(PduError::Field(what));
    }
    Ok((
        u16::from_le_bytes([b[0], b[1]]),
        b[2],
        b[3],
        u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    ))
}

fn ic_encode(kind: u8, pfv: u16, align: u8, digest: u8, limit: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(IC_LEN);
    Common {
        kind,
        flags: 0,
        hlen: IC_LEN as u8,
        pdo: 0,
        plen: IC_LEN as u32,
    }
    .put(&mut out);
    out.put_u16_le(pfv);
    out.put_u8(align);
    out.put_u8(digest);
    out.put_u32_le(limit);
    out.resize(IC_LEN, 0);
    out.freeze()
}

/// Initialize connection request (host to controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    pub hpda: u8,
    pub digest: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

impl IcReq {
    /// From the 120 bytes after the common header.
    pub fn decode(b: &[u8]) -> Result<IcReq, PduError> {
        let (pfv, hpda, digest, maxr2t) = ic_decode(b, "ICReq too short")?;
        Ok(IcReq {
            pfv,
            hpda,
            digest,
            maxr2t,
        })
    }

    pub fn encode(&self) -> Bytes {
        ic_encode(kind::IC_REQ, self.pfv, self.hpda, self.digest, self.maxr2t)
    }
}

/// Initialize connection response (controller to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    pub cpda: u8,
    pub digest: u8,
    /// The most data one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

impl IcResp {
    pub fn decode(b: &[u8]) -> Result<IcResp, PduError> {
        let (pfv, cpda, digest, maxh2cdata) = ic_decode(b, "ICResp too short")?;
        Ok(IcResp {
            pfv,
            cpda,
            digest,
            maxh2cdata,
        })
    }

    pub fn encode(&self) -> Bytes {
        ic_encode(
            kind::IC_RESP,
            self.pfv,
            self.cpda,
            self.digest,
            self.maxh2cdata,
        )
    }
}

/// The header of H2CData, C2HData and R2T PDUs (after the common header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// The command's identifier.
    pub cccid: u16,
    /// Transfer tag (H2CData and R2T; reserved in C2HData).
    pub ttag: u16,
    /// Offset of this data in the command's buffer.
    pub offset: u32,
    pub len: u32,
}

impl DataHeader {
    pub fn decode(b: &[u8]) -> Result<DataHeader, PduError> {
        if b.len() < DATA_HLEN - CH_LEN {
            return Err(PduError::Field("data header too short"));
        }
        Ok(DataHeader {
            cccid: u16::from_le_bytes([b[0], b[1]]),
            ttag: u16::from_le_bytes([b[2], b[3]]),
            offset: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        })
    }

    /// The whole header of a PDU of `kind` whose data (`self.len` bytes) follows at once.
    pub fn encode(&self, kind: u8, flags: u8) -> Bytes {
        let mut out = BytesMut::with_capacity(DATA_HLEN);
        let carries = kind != self::kind::R2T;
        Common {
            kind,
            flags,
            hlen: DATA_HLEN as u8,
            pdo: if carries { DATA_HLEN as u8 } else { 0 },
            plen: DATA_HLEN as u32 + if carries { self.len } else { 0 },
        }
        .put(&mut out);
        out.put_u16_le(self.cccid);
        out.put_u16_le(self.ttag);
        out.put_u32_le(self.offset);
        out.put_u32_le(self.len);
        out.put_u32_le(0);
        out.freeze()
    }
}

/// A termination request: its fatal error status, the field's offset, and up to 152 bytes of
/// the header at fault.
pub fn term_req(kind: u8, fes: u16, fei: u32, offending: &[u8]) -> Bytes {
    let copy = &offending[..offending.len().min(TERM_MAX_DATA)];
    let mut out = BytesMut::with_capacity(TERM_HLEN + copy.len());
    Common {
        kind,
        flags: 0,
        hlen: TERM_HLEN as u8,
        pdo: if copy.is_empty() { 0 } else { TERM_HLEN as u8 },
        plen: (TERM_HLEN + copy.len()) as u32,
    }
    .put(&mut out);
    out.put_u16_le(fes);
    out.put_u32_le(fei);
    out.resize(TERM_HLEN, 0);
    out.put_slice(copy);
    out.freeze()
}

/// A command capsule's header: the common header and the SQE; `data` in-capsule bytes follow.
pub fn capsule_cmd(sqe: &[u8; SQE_LEN], data: usize) -> Bytes {
    let mut out = BytesMut::with_capacity(CMD_HLEN);
    Common {
        kind: kind::CAPSULE_CMD,
        flags: 0,
        hlen: CMD_HLEN as u8,
        pdo: if data > 0 { CMD_HLEN as u8 } else { 0 },
        plen: (CMD_HLEN + data) as u32,
    }
    .put(&mut out);
    out.put_slice(sqe);
    out.freeze()
}

/// A response capsule around a CQE.
pub fn capsule_resp(cqe: &[u8; CQE_LEN]) -> Bytes {
    let mut out = BytesMut::with_capacity(RESP_HLEN);
    Common {
        kind: kind::CAPSULE_RESP,
        flags: 0,
        hlen: RESP_HLEN as u8,
        pdo: 0,
        plen: RESP_HLEN as u32,
    }
    .put(&mut out);
    out.put_slice(cqe);
    out.freeze()
}
