//! Mounts as the node service needs them, by system call (no mount(8) in the plugin's
//! image needed): what is mounted where (`/proc/self/mountinfo`), a device or a bind mount,
//! an unmount that never waits on a dead backend, and which filesystem a device holds.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// What is mounted (a device, or for a bind mount the device of what was bound).
    pub source: String,
    /// The path within the source's filesystem that is mounted (`/` for a whole device).
    pub root: String,
    pub target: PathBuf,
    pub fstype: String,
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = |c: u8| (b'0'..=b'7').contains(&c);
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|&c| oct(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; lines that do not parse are skipped.
pub(crate) fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                root: unescape(f.get(3)?),
                target: PathBuf::from(unescape(f.get(4)?)),
                fstype: r.first()?.to_string(),
                source: unescape(r.get(1)?),
            })
        })
        .collect()
}

pub(crate) fn mounts() -> io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mount at `p`, if something is mounted there (the last one mounted wins).
pub(crate) fn at(p: &Path) -> io::Result<Option<Mount>> {
    Ok(mounts()?.into_iter().rev().find(|m| m.target == p))
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
}

fn sys(r: libc::c_int) -> io::Result<()> {
    match r {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Mount flags and the filesystem's own options from CSI's `mount_flags`.
pub(crate) fn flags(opts: &[String], readonly: bool) -> (libc::c_ulong, String) {
    let mut f: libc::c_ulong = if readonly { libc::MS_RDONLY } else { 0 };
    let mut data = Vec::new();
    for o in opts.iter().flat_map(|o| o.split(',')).map(str::trim) {
        match o {
            "" | "rw" | "defaults" => {}
            "ro" => f |= libc::MS_RDONLY,
            "noatime" => f |= libc::MS_NOATIME,
            "nodiratime" => f |= libc::MS_NODIRATIME,
            "relatime" => f |= libc::MS_RELATIME,
            "nosuid" => f |= libc::MS_NOSUID,
            "nodev" => f |= libc::MS_NODEV,
            "noexec" => f |= libc::MS_NOEXEC,
            "sync" => f |= libc::MS_SYNCHRONOUS,
            "dirsync" => f |= libc::MS_DIRSYNC,
            other => data.push(other.to_string()),
        }
    }
    (f, data.join(","))
}

/// Mounts filesystem `fstype` of `dev` at `target`.
pub(crate) fn mount_dev(
    dev: &Path,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (s, t) = (cstr(dev)?, cstr(target)?);
    let ty = CString::new(fstype).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let d = CString::new(data).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    sys(unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            ty.as_ptr(),
            flags,
            d.as_ptr().cast(),
        )
    })
}

/// Binds `src` (a directory, or a device onto a file) at `target`; read-only if asked (a
/// bind mount takes that only from a remount).
pub(crate) fn bind(src: &Path, target: &Path, readonly: bool) -> io::Result<()> {
    let (s, t) = (cstr(src)?, cstr(target)?);
    let none = std::ptr::null();
    // SAFETY: valid strings; null type and data are what MS_BIND takes.
    sys(unsafe { libc::mount(s.as_ptr(), t.as_ptr(), none, libc::MS_BIND, none.cast()) })?;
    if readonly {
        let f = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        // SAFETY: as above.
        sys(unsafe { libc::mount(none, t.as_ptr(), none, f, none.cast()) })?;
    }
    Ok(())
}

/// Unmounts `target`. `detach`: lazily (it goes now; the filesystem when its last user
/// does), for a backend that is gone, where a plain unmount would wait on its writes.
pub(crate) fn unmount(target: &Path, detach: bool) -> io::Result<()> {
    let t = cstr(target)?;
    let f = if detach { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid path string.
    sys(unsafe { libc::umount2(t.as_ptr(), f) })
}

/// A block device's size in bytes.
pub(crate) fn device_size(dev: &Path) -> io::Result<u64> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(dev)?;
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t).
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `size`, which lives across the call.
    sys(unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) })?;
    Ok(size)
}

/// The filesystem a device holds: `Some("ext4")` (the ext family), `Some("xfs")`, `None` if
/// its first 64 KiB are zero (nothing there yet), or `Some("unknown")`.
pub(crate) fn filesystem(head: &[u8]) -> Option<&'static str> {
    if head.len() >= 1082 && head[1080..1082] == [0x53, 0xef] {
        return Some("ext4");
    }
    if head.starts_with(b"XFSB") {
        return Some("xfs");
    }
    match head.iter().all(|&b| b == 0) {
        true => None,
        false => Some("unknown"),
    }
}

/// [`filesystem`] of device `dev`.
pub(crate) fn filesystem_on(dev: &Path) -> io::Result<Option<&'static str>> {
    use std::io::Read;
    let mut head = vec![0u8; 64 << 10];
    let mut f = std::fs::File::open(dev)?;
    f.read_exact(&mut head)?;
    Ok(filesystem(&head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let t = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/nbd0 rw\n\
                 37 35 98:0 /sub /pods/x rw - ext4 /dev/nbd0 rw\n\
                 garbage\n";
        let m = parse(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].target, PathBuf::from("/mnt/a b"));
        assert_eq!(
            (
                m[0].source.as_str(),
                m[0].fstype.as_str(),
                m[0].root.as_str()
            ),
            ("/dev/nbd0", "ext4", "/")
        );
        assert_eq!(m[1].root, "/sub");
    }

    proptest::proptest! {
        /// Any text, a line cut anywhere, escapes half-written: parsed or skipped, no panic.
        #[test]
        fn mountinfo_of_any_text_parses_or_is_skipped(t in "(\\PC|\\\\[0-7]{0,3}| - |\n){0,80}") {
            for m in parse(&t) {
                proptest::prop_assert!(!m.fstype.contains(' '));
            }
        }
    }

    #[test]
    fn flags_split_from_options() {
        let (f, d) = flags(&["noatime,discard".into(), "ro".into()], false);
        assert_eq!(f, libc::MS_NOATIME | libc::MS_RDONLY);
        assert_eq!(d, "discard");
        assert_eq!(flags(&[], true).0, libc::MS_RDONLY);
    }

    #[test]
    fn filesystems_by_their_magic() {
        let mut h = vec![0u8; 4096];
        assert_eq!(filesystem(&h), None);
        h[1080] = 0x53;
        h[1081] = 0xef;
        assert_eq!(filesystem(&h), Some("ext4"));
        let mut x = vec![0u8; 4096];
        x[..4].copy_from_slice(b"XFSB");
        assert_eq!(filesystem(&x), Some("xfs"));
        x[..4].copy_from_slice(b"junk");
        assert_eq!(filesystem(&x), Some("unknown"));
    }
}
