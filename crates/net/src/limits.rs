//! Process limits set at start.

/// Raises the soft limit on open descriptors to the hard limit (systemd's default soft limit
/// is 1024, less than the connections a node serves). Returns the limit now in force.
pub fn raise_nofile() -> std::io::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if r.rlim_cur < r.rlim_max {
        let want = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        r = want;
    }
    Ok(r.rlim_cur)
}
