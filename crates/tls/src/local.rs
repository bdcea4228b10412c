//! Same-host access: unix sockets bound readable and writable by their owner only, every
//! peer checked by the kernel's credentials (`SO_PEERCRED`): only this process's user (or
//! root) gets in. What a certificate does for TCP, the file mode and the peer's uid do here.
//! Data directories likewise: only their owner may enter them ([`private_dir`]).

use std::path::Path;

/// Binds a unix socket at `path` (replacing a stale one) with mode 0600.
pub fn bind_private(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    check_socket_path(path)?;
    // A socket left by a process that died; never anything else (a mistyped path must not
    // delete a file).
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path)?;
    }
    let l = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Whether a unix socket can be made at `path`: its directory exists and this process may
/// create files in it, and nothing but a socket is there already. Checked before anything
/// that a failed bind would leave half done (an attach takes an epoch first).
pub fn check_socket_path(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(std::io::Error::other(format!(
                "{} is not a directory",
                dir.display()
            )))
        }
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("directory {}: {e}", dir.display()),
            ))
        }
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
    // SAFETY: access(2) reads the NUL-terminated path and touches no other memory.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("directory {}: {e}", dir.display()),
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(std::io::Error::other(format!(
            "{} exists and is not a socket; it is left alone",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Makes `dir` a directory only its owner may enter: created 0700 if it does not exist. One
/// that exists and that others may enter or list is tightened to 0700 when it belongs to this
/// process's user, with a warning that says what it was; one of another user is refused (a
/// directory someone else controls cannot be made private by us). Files inside it are then
/// out of other users' reach whatever their own modes (an older version made them 0644).
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir),
        Err(e) => Err(e),
        Ok(m) if !m.is_dir() => Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        ))),
        Ok(m) if m.mode() & 0o077 == 0 => Ok(()),
        Ok(m) => {
            // SAFETY: geteuid has no preconditions and touches no memory.
            let me = unsafe { libc::geteuid() };
            if m.uid() != me {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "{} belongs to uid {} and other users may enter it (mode {:o}): \
                         give this process a directory of its own, or chmod 700 it",
                        dir.display(),
                        m.uid(),
                        m.mode() & 0o777
                    ),
                ));
            }
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            tracing::warn!(
                dir = %dir.display(),
                "the data directory was open to other users (mode {:o}); it is 0700 now",
                m.mode() & 0o777
            );
            Ok(())
        }
    }
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

    #[test]
    fn data_directories_are_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let new = d.path().join("a/b");
        private_dir(&new).unwrap();
        assert_eq!(mode(&new), 0o700);
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
        let file = d.path().join("f");
        std::fs::write(&file, "").unwrap();
        assert!(private_dir(&file).is_err());
    }

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
