//! The checks of a request's arguments every service shares: capabilities (one node at a
//! time, ext4 or xfs), sizes in whole 4 KiB blocks within a capacity range, and list pages.

use tonic::Status;

use crate::errors::invalid;
use crate::pb::{self, volume_capability};

/// A volume asked with no capacity.
pub const DEFAULT_SIZE: u64 = 1 << 30;
/// Volumes are whole 4 KiB blocks.
pub(crate) const BLOCK: u64 = 4096;

/// What a capability asks that trireme cannot give, if anything.
pub(crate) fn unsupported(c: &pb::VolumeCapability) -> Option<String> {
    use volume_capability::access_mode::Mode;
    match &c.access_type {
        None => return Some("a capability without access_type (block or mount)".into()),
        Some(volume_capability::AccessType::Mount(m)) => {
            if !matches!(m.fs_type.as_str(), "" | "ext4" | "xfs") {
                return Some(format!(
                    "filesystem {:?}: the node makes ext4 or xfs",
                    m.fs_type
                ));
            }
        }
        Some(volume_capability::AccessType::Block(_)) => {}
    }
    let mode = c.access_mode.as_ref().map_or(0, |m| m.mode);
    match Mode::try_from(mode) {
        Ok(
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter,
        ) => None,
        Ok(Mode::Unknown) | Err(_) => Some("a capability without an access mode".into()),
        Ok(m) => Some(format!(
            "access mode {}: a volume is used on one node at a time (one writer, fenced by epoch)",
            m.as_str_name()
        )),
    }
}

/// Every capability supported, or INVALID_ARGUMENT naming the first that is not.
pub(crate) fn check_caps(caps: &[pb::VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(invalid("volume_capabilities is required"));
    }
    match caps.iter().find_map(unsupported) {
        Some(why) => Err(invalid(why)),
        None => Ok(()),
    }
}

/// The size to create for a capacity range: the required bytes rounded up to a block
/// (default [`DEFAULT_SIZE`]), within the limit.
pub(crate) fn size_of(r: Option<&pb::CapacityRange>) -> Result<u64, Status> {
    let (req, limit) = r.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if req < 0 || limit < 0 {
        return Err(invalid("a negative capacity"));
    }
    let (req, limit) = (req as u64, limit as u64);
    let want = match (req, limit) {
        (0, 0) => DEFAULT_SIZE,
        (0, l) => DEFAULT_SIZE.min(l / BLOCK * BLOCK),
        (r, _) => r.div_ceil(BLOCK) * BLOCK,
    };
    if want == 0 || (limit != 0 && want > limit) || (req != 0 && limit != 0 && req > limit) {
        return Err(Status::out_of_range(format!(
            "no size of whole 4 KiB blocks is at least {req} and at most {limit} bytes"
        )));
    }
    Ok(want)
}

/// A page of `all` from `token` (an index this driver gave), at most `max` (0: all) long, and
/// the token of the next page (empty: none).
pub(crate) fn page<'a, T>(
    all: &'a [T],
    max: i32,
    token: &str,
) -> Result<(&'a [T], String), Status> {
    if max < 0 {
        return Err(invalid("max_entries is negative"));
    }
    let start = match token {
        "" => 0,
        t => t
            .parse::<usize>()
            .ok()
            .filter(|&s| s <= all.len())
            .ok_or_else(|| {
                Status::aborted(format!("starting_token {t:?} is not one this driver gave"))
            })?,
    };
    let end = match max {
        0 => all.len(),
        m => all.len().min(start + m as usize),
    };
    let next = match end < all.len() {
        true => end.to_string(),
        false => String::new(),
    };
    Ok((&all[start..end], next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[test]
    fn sizes_are_whole_blocks_within_the_range() {
        let r = |req, limit| {
            size_of(Some(&pb::CapacityRange {
                required_bytes: req,
                limit_bytes: limit,
            }))
        };
        assert_eq!(size_of(None).unwrap(), DEFAULT_SIZE);
        assert_eq!(r(1, 0).unwrap(), 4096);
        assert_eq!(r(10_000, 0).unwrap(), 12_288);
        assert_eq!(r(0, 1 << 20).unwrap(), 1 << 20);
        assert_eq!(r(4096, 4096).unwrap(), 4096);
        for (req, lim) in [(5000, 6000), (0, 100), (8192, 4096)] {
            assert_eq!(
                r(req, lim).unwrap_err().code(),
                tonic::Code::OutOfRange,
                "{req} {lim}"
            );
        }
        assert_eq!(r(-1, 0).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn pages_follow_their_tokens() {
        let all: Vec<u32> = (0..5).collect();
        let (p, t) = page(&all, 2, "").unwrap();
        assert_eq!((p, t.as_str()), (&all[0..2], "2"));
        let (p, t) = page(&all, 2, "4").unwrap();
        assert_eq!((p, t.as_str()), (&all[4..5], ""));
        assert_eq!(page(&all, 0, "").unwrap().0.len(), 5);
        assert_eq!(page(&all, 1, "9").unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page(&all, 1, "x").unwrap_err().code(), tonic::Code::Aborted);
        assert!(page(&all, -1, "").is_err());
    }

    #[test]
    fn capabilities_one_node_at_a_time() {
        use volume_capability::{
            access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
        };
        let cap = |t: AccessType, m: Mode| pb::VolumeCapability {
            access_type: Some(t),
            access_mode: Some(AccessMode { mode: m as i32 }),
        };
        let mount = |fs: &str| {
            AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            })
        };
        assert!(check_caps(&[cap(mount(""), Mode::SingleNodeWriter)]).is_ok());
        assert!(check_caps(&[cap(
            AccessType::Block(BlockVolume {}),
            Mode::SingleNodeSingleWriter
        )])
        .is_ok());
        assert!(check_caps(&[cap(mount("zfs"), Mode::SingleNodeWriter)]).is_err());
        assert!(check_caps(&[cap(mount("ext4"), Mode::MultiNodeMultiWriter)]).is_err());
        assert!(check_caps(&[]).is_err());
        assert!(check_caps(&[pb::VolumeCapability::default()]).is_err());
    }
}
