//! CSI names and ids as trireme names: a CSI name that is already a valid trireme name is
//! kept (a PVC's `pvc-<uuid>` is), any other becomes `csi-` and the first 128 bits of its
//! SHA-256 in hex, so the same name always gives the same volume (what idempotency needs) and
//! two names never share one. A snapshot's id is `VOLUME@SNAPSHOT`.

use tonic::Status;

use crate::errors::invalid;

/// The prefix of the snapshots a clone of a volume is made from (see
/// [`clone_source_snapshot`]): never a CO's name, so never listed as the CO's.
pub const CLONE_SOURCE: &str = "clone-src-";

/// Longest CSI name taken (the spec's CO limit is 128 bytes; a little room above it).
pub const MAX_CSI_NAME: usize = 256;

/// The trireme name for CSI name `name` (of a volume or a snapshot).
pub fn trireme_name(name: &str) -> Result<String, Status> {
    if name.is_empty() {
        return Err(invalid("a name is required"));
    }
    if name.len() > MAX_CSI_NAME {
        return Err(invalid(format!(
            "a name of {} bytes: at most {MAX_CSI_NAME}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid("a name with control characters"));
    }
    let ours = name.starts_with("csi-") || name.starts_with(CLONE_SOURCE);
    if trireme_meta::check_name(name).is_ok() && !ours {
        return Ok(name.to_string());
    }
    Ok(format!("csi-{}", hash(name)))
}

/// 128 bits of `s`'s SHA-256, in hex.
fn hash(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The snapshot of a source volume that clone `clone` of it is made from: one per clone,
/// named after it, so a retried CreateVolume finds it.
pub fn clone_source_snapshot(clone: &str) -> String {
    format!("{CLONE_SOURCE}{}", hash(clone))
}

/// A volume id as the CO gives it back: a trireme volume name.
pub fn volume_id(id: &str) -> Result<&str, Status> {
    if id.is_empty() {
        return Err(invalid("volume_id is required"));
    }
    trireme_meta::check_name(id)
        .map_err(|_| Status::not_found(format!("no volume has id {id:?}")))?;
    Ok(id)
}

/// A snapshot's id.
pub fn snapshot_id(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

/// The volume and snapshot of a snapshot id; an id that is not one is not found (the spec:
/// an id this plugin never gave names nothing).
pub fn parse_snapshot_id(id: &str) -> Result<(&str, &str), Status> {
    if id.is_empty() {
        return Err(invalid("snapshot_id is required"));
    }
    let none = || Status::not_found(format!("no snapshot has id {id:?}"));
    let (v, s) = id.split_once('@').ok_or_else(none)?;
    trireme_meta::check_name(v).map_err(|_| none())?;
    trireme_meta::check_name(s).map_err(|_| none())?;
    Ok((v, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_pvc_name_is_kept_and_others_hashed() {
        let pvc = "pvc-3f2a1c44-8b1e-4d55-9c1e-0a5b7e9d1234";
        assert_eq!(trireme_name(pvc).unwrap(), pvc);
        let odd = trireme_name("Ünïcode name").unwrap();
        assert!(odd.starts_with("csi-") && odd.len() == 36, "{odd}");
        assert_eq!(trireme_name("Ünïcode name").unwrap(), odd);
        // A name that looks like a hashed one is hashed too: no collision with one.
        assert_ne!(trireme_name(&odd).unwrap(), odd);
        let src = clone_source_snapshot("pvc-1");
        assert!(trireme_meta::check_name(&src).is_ok());
        assert_ne!(trireme_name(&src).unwrap(), src);
        assert!(trireme_name("").is_err());
        assert!(trireme_name("a\u{7}b").is_err());
        assert!(trireme_name(&"x".repeat(300)).is_err());
    }

    #[test]
    fn snapshot_ids_round_trip_and_bad_ones_name_nothing() {
        assert_eq!(
            parse_snapshot_id(&snapshot_id("v", "s")).unwrap(),
            ("v", "s")
        );
        for bad in ["v", "@s", "v@", "v@s@t", "../v@s"] {
            let e = parse_snapshot_id(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::NotFound, "{bad}");
        }
        assert_eq!(
            parse_snapshot_id("").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    proptest! {
        #[test]
        fn every_name_maps_to_a_valid_name_the_same_way(name in "\\PC{1,64}") {
            let a = trireme_name(&name).unwrap();
            prop_assert!(trireme_meta::check_name(&a).is_ok(), "{a}");
            prop_assert_eq!(trireme_name(&name).unwrap(), a);
        }
    }
}
