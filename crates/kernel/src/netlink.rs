//! Generic netlink, as much as the kernel's NBD family needs: resolve a family's id, send a
//! request with attributes, read the replies up to the kernel's acknowledgement.
//!
//! Replies are parsed by [`parse_replies`] and [`parse_attrs`], pure functions that check every
//! length before they read (fuzzed: `netlink_replies`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::KernelError;

const NETLINK_GENERIC: i32 = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// Bit set on a nested attribute's type by some senders.
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));
const HEADER: usize = 16;
const GENL_HEADER: usize = 4;

/// Attributes of a request, built in place.
#[derive(Debug, Default, Clone)]
pub struct Attrs(Vec<u8>);

fn align(n: usize) -> usize {
    (n + 3) & !3
}

impl Attrs {
    pub fn new() -> Attrs {
        Attrs::default()
    }

    fn put(&mut self, ty: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.0.resize(align(self.0.len()), 0);
    }

    pub fn u32(mut self, ty: u16, v: u32) -> Attrs {
        self.put(ty, &v.to_ne_bytes());
        self
    }

    pub fn u64(mut self, ty: u16, v: u64) -> Attrs {
        self.put(ty, &v.to_ne_bytes());
        self
    }

    /// A NUL-terminated string.
    pub fn str(mut self, ty: u16, v: &str) -> Attrs {
        let mut b = v.as_bytes().to_vec();
        b.push(0);
        self.put(ty, &b);
        self
    }

    /// `inner` nested in an attribute of type `ty`.
    pub fn nested(mut self, ty: u16, inner: Attrs) -> Attrs {
        self.put(ty | NLA_F_NESTED, &inner.0);
        self
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// One message of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The kernel's answer to the request: 0 is an acknowledgement, else a negative errno.
    Error(i32),
    /// The end of a dump.
    Done,
    /// A generic netlink message of type (family) `ty`, command `cmd`: its attributes.
    Message { ty: u16, cmd: u8, attrs: &'a [u8] },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The messages in one datagram the kernel sent.
pub fn parse_replies(buf: &[u8]) -> Result<Vec<Reply<'_>>, KernelError> {
    let bad = |w: &str| KernelError::Malformed(w.to_string());
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let len = u32_at(buf, at).ok_or_else(|| bad("a header cut short"))? as usize;
        if len < HEADER || len > buf.len() - at {
            return Err(bad("a message length outside the datagram"));
        }
        let ty = u16_at(buf, at + 4).ok_or_else(|| bad("a header cut short"))?;
        let body = &buf[at + HEADER..at + len];
        out.push(match ty {
            NLMSG_ERROR => Reply::Error(
                u32_at(body, 0).ok_or_else(|| bad("an error message cut short"))? as i32,
            ),
            NLMSG_DONE => Reply::Done,
            _ => {
                if body.len() < GENL_HEADER {
                    return Err(bad("a generic netlink header cut short"));
                }
                Reply::Message {
                    ty,
                    cmd: body[0],
                    attrs: &body[GENL_HEADER..],
                }
            }
        });
        at += align(len).min(buf.len() - at);
    }
    Ok(out)
}

/// The attributes in `b`, by type (the nested flag cleared).
pub fn parse_attrs(b: &[u8]) -> Result<Vec<(u16, &[u8])>, KernelError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() {
        let len = u16_at(b, at).unwrap_or(0) as usize;
        let ty = u16_at(b, at + 2).unwrap_or(0) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() - at {
            return Err(KernelError::Malformed(format!(
                "an attribute of {len} bytes at {at} of {}",
                b.len()
            )));
        }
        out.push((ty, &b[at + 4..at + len]));
        at += align(len);
    }
    Ok(out)
}

/// The first attribute of type `ty` as a u32.
pub fn attr_u32(attrs: &[(u16, &[u8])], ty: u16) -> Option<u32> {
    attrs
        .iter()
        .find(|(t, _)| *t == ty)
        .and_then(|(_, v)| u32_at(v, 0))
}

/// A generic netlink socket.
#[derive(Debug)]
pub struct Genl {
    fd: OwnedFd,
    seq: u32,
}

impl Genl {
    pub fn open() -> Result<Genl, KernelError> {
        // SAFETY: socket(2) with constant arguments; the descriptor it returns is owned here.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return Err(KernelError::Io {
                what: "a generic netlink socket".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a descriptor socket(2) just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        // SAFETY: setsockopt(2) on our socket with a timeval that outlives the call.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        Ok(Genl { fd, seq: 1 })
    }

    /// The id of generic netlink family `name`; `None` if the kernel has none of that name
    /// (its module is not loaded).
    pub fn family(&mut self, name: &str) -> Result<Option<u16>, KernelError> {
        let attrs = Attrs::new().str(CTRL_ATTR_FAMILY_NAME, name);
        match self.request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, &attrs, "resolve") {
            Ok(replies) => {
                for a in &replies {
                    let parsed = parse_attrs(a)?;
                    if let Some((_, v)) = parsed.iter().find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID) {
                        return Ok(u16_at(v, 0));
                    }
                }
                Err(KernelError::Malformed(format!("no id for family {name}")))
            }
            Err(KernelError::Refused { errno, .. }) if errno == libc::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends command `cmd` of family `family` with `attrs`, and returns the attributes of
    /// every message the kernel answered with, once it acknowledged. `what` names the request
    /// in errors.
    pub fn request(
        &mut self,
        family: u16,
        cmd: u8,
        version: u8,
        attrs: &Attrs,
        what: &str,
    ) -> Result<Vec<Vec<u8>>, KernelError> {
        self.seq = self.seq.wrapping_add(1);
        let len = HEADER + GENL_HEADER + attrs.bytes().len();
        let mut m = Vec::with_capacity(len);
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&family.to_ne_bytes());
        m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        m.extend_from_slice(&self.seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[cmd, version, 0, 0]);
        m.extend_from_slice(attrs.bytes());
        // SAFETY: send(2) of a buffer that outlives the call on our socket; the kernel is
        // the peer of an unbound netlink socket.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        if n < 0 {
            return Err(KernelError::Io {
                what: what.into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: recv(2) into a buffer of the length given, owned here.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(KernelError::Io {
                    what: format!("{what}: the kernel's answer"),
                    source: std::io::Error::last_os_error(),
                });
            }
            for r in parse_replies(&buf[..n as usize])? {
                match r {
                    Reply::Error(0) | Reply::Done => return Ok(out),
                    Reply::Error(e) => {
                        return Err(KernelError::Refused {
                            what: what.into(),
                            errno: -e,
                        })
                    }
                    Reply::Message { attrs, .. } => out.push(attrs.to_vec()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn attributes_read_back_nested_and_padded() {
        let a = Attrs::new()
            .u32(1, 7)
            .str(10, "trireme:v")
            .nested(7, Attrs::new().nested(1, Attrs::new().u32(1, 42)))
            .u64(2, 1 << 40);
        let top = parse_attrs(a.bytes()).unwrap();
        assert_eq!(attr_u32(&top, 1), Some(7));
        assert_eq!(top[1].1, b"trireme:v\0");
        let socks = parse_attrs(top[2].1).unwrap();
        let item = parse_attrs(socks[0].1).unwrap();
        assert_eq!(attr_u32(&item, 1), Some(42));
        assert_eq!(top[3].1, &(1u64 << 40).to_ne_bytes());
    }

    #[test]
    fn a_reply_with_a_length_past_its_end_is_refused() {
        let mut m = vec![0u8; 20];
        m[..4].copy_from_slice(&200u32.to_ne_bytes());
        assert!(parse_replies(&m).is_err());
        m[..4].copy_from_slice(&20u32.to_ne_bytes());
        m[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m[16..20].copy_from_slice(&(-19i32).to_ne_bytes());
        assert_eq!(parse_replies(&m).unwrap(), vec![Reply::Error(-19)]);
    }

    proptest! {
        /// What the fuzz target `netlink_replies` checks on every run: any bytes parse to
        /// replies and attributes, or to an error; never a panic.
        #[test]
        fn any_bytes_parse_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(rs) = parse_replies(&b) {
                for r in rs {
                    if let Reply::Message { attrs, .. } = r {
                        let _ = parse_attrs(attrs);
                    }
                }
            }
            let _ = parse_attrs(&b);
        }
    }
}
