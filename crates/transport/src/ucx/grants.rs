//! The secrets a node hands out with its UCX address, one per TCP link.

use std::collections::HashMap;
use std::sync::RwLock;

use super::SECRET_LEN;

/// The UCX secrets a server handed out, each with the link it went out on (its `Hello`
/// token and its peer): a UCX request is served as if it came on that link.
static GRANTED: RwLock<Option<GrantMap>> = RwLock::new(None);

/// Secret → (the link's `Hello` token, its peer).
type GrantMap = HashMap<[u8; SECRET_LEN], (u64, crate::Peer)>;

/// The link a secret was handed out on, if it still is open.
pub(super) fn granted(secret: &[u8; SECRET_LEN]) -> Option<(u64, crate::Peer)> {
    look_up(secret, |link| link.clone())
}

/// Whether the link `secret` was handed out on is still open: [`granted`] without a copy of
/// the link's peer (an allocation for a certificate's role), for each late answer.
pub(super) fn is_open(secret: &[u8; SECRET_LEN]) -> bool {
    look_up(secret, |_| ()).is_some()
}

/// `f` of the link `secret` was handed out on, if it still is open.
fn look_up<T>(secret: &[u8; SECRET_LEN], f: impl FnOnce(&(u64, crate::Peer)) -> T) -> Option<T> {
    if refusing_all() {
        return None;
    }
    GRANTED
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .get(secret)
        .map(f)
}

/// A fault to stage in tests: with `TRIREME_FAULT_REFUSE_UCX_SECRETS=1` this process refuses
/// every secret it handed out, as a node that lost track of them would, so that what a writer
/// does then (it stays on TCP) can be seen between real processes.
fn refusing_all() -> bool {
    static REFUSING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REFUSING.get_or_init(|| {
        let on = std::env::var_os("TRIREME_FAULT_REFUSE_UCX_SECRETS").is_some_and(|v| v == "1");
        if on {
            tracing::warn!("TRIREME_FAULT_REFUSE_UCX_SECRETS=1: every UCX request is refused (a fault staged for tests)");
        }
        on
    })
}

/// Logs UCX requests with an unknown secret, at most once a second.
pub(super) fn note_unknown_secret() {
    static DROPPED: trireme_net::Throttle = trireme_net::Throttle::per_second();
    trireme_net::warn_throttled!(DROPPED, "UCX request without a valid secret dropped unread");
}

/// The UCX secrets handed out on one server link: revoked when the link closes (dropped).
#[derive(Debug, Default)]
pub struct Grants(Vec<[u8; SECRET_LEN]>);

impl Grants {
    /// A fresh secret for UCX requests of the link `origin` from `peer`.
    pub fn grant(&mut self, origin: u64, peer: crate::Peer) -> [u8; SECRET_LEN] {
        let mut secret = [0u8; SECRET_LEN];
        fill_random(&mut secret);
        GRANTED
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(secret, (origin, peer));
        self.0.push(secret);
        secret
    }
}

impl Drop for Grants {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut g = GRANTED.write().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = g.as_mut() {
            for s in &self.0 {
                m.remove(s);
            }
        }
    }
}

/// Fills `buf` from the kernel's random source.
fn fill_random(buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into the rest of `buf`, which we own.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n > 0 {
            done += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // getrandom(2) does not fail on Linux 3.17+ once the pool is initialised.
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
}
