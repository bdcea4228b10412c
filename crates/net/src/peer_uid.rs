//! Which local user holds the other end of a TCP connection over loopback, asked of the kernel
//! (netlink `sock_diag`, one exact lookup by the connection's addresses and ports).
//!
//! On one host every peer comes from 127.0.0.1: a gate that shares its handshakes per source
//! address gave one local user's redial loop the same share as every other local client, and
//! the loop's churn evicted their handshakes before they could speak. Keyed by user too, a
//! loop evicts only its own (`accept.rs`).

use std::net::SocketAddr;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const HEADER: usize = 16;
/// `inet_diag_req_v2`: family, protocol, ext, pad, states, then the socket id (48 bytes).
const REQUEST: usize = 8 + 48;
/// The uid in an `inet_diag_msg`: after 4 bytes, the socket id and three u32s.
const UID_AT: usize = 4 + 48 + 12;

/// The uid owning the socket at `peer` connected to `local`, if both are on this host and the
/// kernel says; `None` otherwise (other hosts, no netlink, any error).
pub fn loopback_peer_uid(local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    if !peer.ip().is_loopback() || local.is_ipv4() != peer.is_ipv4() {
        return None;
    }
    let req = request(local, peer);
    // SAFETY: a netlink socket of our own, closed below; buffers are ours and sized.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        );
        if fd < 0 {
            return None;
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        let mut out = None;
        if libc::send(fd, req.as_ptr().cast(), req.len(), 0) == req.len() as isize {
            let mut buf = [0u8; 512];
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n > 0 {
                out = uid_of(&buf[..n as usize]);
            }
        }
        libc::close(fd);
        out
    }
}

/// The request: the peer's socket, whose source is `peer` and destination `local`.
fn request(local: SocketAddr, peer: SocketAddr) -> Vec<u8> {
    let len = HEADER + REQUEST;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    let family = if peer.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    m.push(family as u8);
    m.push(libc::IPPROTO_TCP as u8);
    m.push(0); // no extensions
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    m.extend_from_slice(&peer.port().to_be_bytes());
    m.extend_from_slice(&local.port().to_be_bytes());
    m.extend_from_slice(&addr16(peer));
    m.extend_from_slice(&addr16(local));
    m.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // no cookie
    m.extend_from_slice(&u32::MAX.to_ne_bytes());
    m
}

fn addr16(a: SocketAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match a {
        SocketAddr::V4(v) => b[..4].copy_from_slice(&v.ip().octets()),
        SocketAddr::V6(v) => b.copy_from_slice(&v.ip().octets()),
    }
    b
}

/// The uid in the kernel's answer, if it found the socket (not found: an error message).
fn uid_of(b: &[u8]) -> Option<u32> {
    let kind = u16::from_ne_bytes(b.get(4..6)?.try_into().ok()?);
    if kind != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    let at = HEADER + UID_AT;
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_names_the_user_of_a_loopback_peer() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        assert_eq!(loopback_peer_uid(s.local_addr().unwrap(), peer), Some(me));
        // No such connection: no answer, no guess.
        let gone: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(loopback_peer_uid(s.local_addr().unwrap(), gone), None);
        // Not on this host: not asked.
        let far: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        assert_eq!(loopback_peer_uid(s.local_addr().unwrap(), far), None);
    }
}
