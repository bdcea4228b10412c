//! Same-host unix sockets: bound readable and writable by their owner only, and every peer
//! checked by the kernel's credentials (`SO_PEERCRED`): only this process's user (or root)
//! gets in. What a certificate does for TCP, the file mode and the peer's uid do here.

use std::path::Path;

/// Binds a unix socket at `path` (replacing a stale one) with mode 0600.
pub fn bind_private(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let l = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Why a same-host peer was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("cannot read the peer's credentials: {0}")]
    Credentials(std::io::Error),
    #[error("uid {uid} (pid {}) is neither this process's user ({me}) nor root", pid.map_or_else(|| "?".to_string(), |p| p.to_string()))]
    Stranger { uid: u32, pid: Option<i32>, me: u32 },
}

/// Whether the peer of `sock` may talk to this process: the same user, or root. `Err` says who
/// it was, for the log line.
pub fn check_peer(sock: &tokio::net::UnixStream) -> Result<(), PeerError> {
    let cred = sock.peer_cred().map_err(PeerError::Credentials)?;
    // SAFETY: geteuid has no preconditions and touches no memory.
    let me = unsafe { libc::geteuid() };
    if cred.uid() == me || cred.uid() == 0 {
        Ok(())
    } else {
        Err(PeerError::Stranger {
            uid: cred.uid(),
            pid: cred.pid(),
            me,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_is_private_and_its_owner_gets_in() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.sock");
        let l = bind_private(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let c = tokio::net::UnixStream::connect(&p).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert!(check_peer(&s).is_ok());
        drop(c);
    }
}
