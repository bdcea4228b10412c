//! Pure decoders for what an NBD client sends: option payloads and request headers. They take
//! bytes and return values or a reason; they never panic and never allocate more than the input
//! (fuzzed in `fuzz/`).

use crate::consts::*;

/// Longest export name or metadata query accepted (the protocol's own limit).
pub const MAX_STRING: usize = 4096;
/// Most info requests or metadata queries in one option.
pub const MAX_ITEMS: usize = 256;

/// Why an option payload or request was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("payload too short for {0}")]
    Short(&'static str),
    #[error("trailing bytes after {0}")]
    Trailing(&'static str),
    #[error("string longer than {MAX_STRING} bytes")]
    LongString,
    #[error("string is not UTF-8 or contains NUL")]
    BadString,
    #[error("more than {MAX_ITEMS} items")]
    TooMany,
    #[error("bad request magic {0:#010x}")]
    BadMagic(u32),
}

struct Cursor<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.b.len() < n {
            return Err(CodecError::Short(self.what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn string(&mut self) -> Result<String, CodecError> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return Err(CodecError::LongString);
        }
        let s = self.take(n)?;
        let s = std::str::from_utf8(s).map_err(|_| CodecError::BadString)?;
        if s.contains('\0') {
            return Err(CodecError::BadString);
        }
        Ok(s.to_string())
    }
    fn end(&self) -> Result<(), CodecError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Trailing(self.what))
        }
    }
}

/// The payload of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub info: Vec<u16>,
}

pub fn decode_go(b: &[u8]) -> Result<GoRequest, CodecError> {
    let mut c = Cursor {
        b,
        what: "NBD_OPT_GO",
    };
    let name = c.string()?;
    let n = c.u16()? as usize;
    if n > MAX_ITEMS {
        return Err(CodecError::TooMany);
    }
    let mut info = Vec::with_capacity(n);
    for _ in 0..n {
        info.push(c.u16()?);
    }
    c.end()?;
    Ok(GoRequest { name, info })
}

/// The payload of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub name: String,
    pub queries: Vec<String>,
}

pub fn decode_meta(b: &[u8]) -> Result<MetaRequest, CodecError> {
    let mut c = Cursor {
        b,
        what: "NBD_OPT_*_META_CONTEXT",
    };
    let name = c.string()?;
    let n = c.u32()? as usize;
    if n > MAX_ITEMS {
        return Err(CodecError::TooMany);
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        queries.push(c.string()?);
    }
    c.end()?;
    Ok(MetaRequest { name, queries })
}

/// The fixed 28-byte transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub const REQUEST_LEN: usize = 28;

pub fn decode_request(b: &[u8; REQUEST_LEN]) -> Result<Request, CodecError> {
    let magic = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    if magic != REQUEST_MAGIC {
        return Err(CodecError::BadMagic(magic));
    }
    let mut cookie = [0u8; 8];
    cookie.copy_from_slice(&b[8..16]);
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&b[16..24]);
    Ok(Request {
        flags: u16::from_be_bytes([b[4], b[5]]),
        command: u16::from_be_bytes([b[6], b[7]]),
        cookie: u64::from_be_bytes(cookie),
        offset: u64::from_be_bytes(offset),
        length: u32::from_be_bytes([b[24], b[25], b[26], b[27]]),
    })
}

/// Encodes a request header (for tests and clients).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.command.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.length.to_be_bytes());
    b
}
