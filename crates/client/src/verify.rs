//! Replica verification: do all in-sync replicas hold identical bytes?

use serde::Serialize;

use crate::{Volume, VolumeError};

/// A region whose replicas disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    pub offset: u64,
    pub length: u64,
    /// `(node, crc32c)` per replica whose copy passed its block checksums.
    pub checksums: Vec<(u32, u32)>,
    /// Nodes whose copy failed its block checksums (known bad).
    pub bad_copies: Vec<u32>,
}

/// What `verify_replicas` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub volume: String,
    pub bytes_compared: u64,
    pub region_bytes: u64,
    pub replicas: Vec<u32>,
    pub mismatches: Vec<Mismatch>,
    /// Each snapshot's copies compared (filled by the caller: see [`verify_snapshot`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotVerify>,
}

/// Compares the replicas of `vol` region by region (crc32c computed on each node, so only
/// checksums cross the network). A region that differs is checked once more before it is
/// reported, so a write landing during the scan is not mistaken for divergence.
pub async fn verify_replicas(vol: &Volume, region: u64) -> Result<VerifyReport, VolumeError> {
    verify_replicas_with(vol, region, &mut |_, _| {}).await
}

/// [`verify_replicas`], telling `progress` (bytes compared, bytes in all) after each region.
pub async fn verify_replicas_with(
    vol: &Volume,
    region: u64,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<VerifyReport, VolumeError> {
    vol.mirror_only("verifying copies against each other")?;
    let size = vol.size();
    let region = region.clamp(4096, crate::MAX_IO);
    let mut report = VerifyReport {
        volume: vol.info().name.clone(),
        bytes_compared: 0,
        region_bytes: region,
        replicas: vol.info().replicas.iter().map(|r| r.node).collect(),
        mismatches: Vec::new(),
        snapshots: Vec::new(),
    };
    let mut offset = 0;
    while offset < size {
        let len = region.min(size - offset);
        let mut sums = collect(vol, None, &vol.connected(), offset, len).await?;
        if !all_equal(&sums) {
            sums = collect(vol, None, &vol.connected(), offset, len).await?;
            if !all_equal(&sums) {
                report.mismatches.push(Mismatch {
                    offset,
                    length: len,
                    checksums: sums.0,
                    bad_copies: sums.1,
                });
            }
        }
        report.bytes_compared += len;
        offset += len;
        progress(report.bytes_compared, size);
    }
    Ok(report)
}

/// Whether the copies of one snapshot hold identical bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotVerify {
    pub name: String,
    pub id: u64,
    /// The nodes compared: those that hold it among the volume's copies now.
    pub nodes: Vec<u32>,
    pub bytes_compared: u64,
    pub mismatches: Vec<Mismatch>,
}

/// Compares the copies of snapshot `id` (`name`, `size` bytes) on `nodes` region by region,
/// as [`verify_replicas`] does the volume (a snapshot does not change, so a difference is
/// one). Nodes that are not among the volume's copies now are left out.
pub async fn verify_snapshot(
    vol: &Volume,
    name: &str,
    id: u64,
    nodes: &[u32],
    size: u64,
    region: u64,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<SnapshotVerify, VolumeError> {
    let region = region.clamp(4096, crate::MAX_IO);
    let targets: Vec<usize> = vol
        .connected()
        .into_iter()
        .filter(|&i| nodes.contains(&vol.node(i)))
        .collect();
    let mut out = SnapshotVerify {
        name: name.to_string(),
        id,
        nodes: targets.iter().map(|&i| vol.node(i)).collect(),
        bytes_compared: 0,
        mismatches: Vec::new(),
    };
    let mut offset = 0;
    while offset < size {
        let len = region.min(size - offset);
        let sums = collect(vol, Some(id), &targets, offset, len).await?;
        if !all_equal(&sums) {
            out.mismatches.push(Mismatch {
                offset,
                length: len,
                checksums: sums.0,
                bad_copies: sums.1,
            });
        }
        out.bytes_compared += len;
        offset += len;
        progress(out.bytes_compared, size);
    }
    Ok(out)
}

/// Each replica's checksum, and the nodes whose copy failed its block checksums.
type Sums = (Vec<(u32, u32)>, Vec<u32>);

/// The checksums of `[offset, offset+len)` on the replicas `targets` (of snapshot
/// `snapshot`'s bytes, or the replica's now for `None`).
async fn collect(
    vol: &Volume,
    snapshot: Option<u64>,
    targets: &[usize],
    offset: u64,
    len: u64,
) -> Result<Sums, VolumeError> {
    let mut sums: Sums = (Vec::new(), Vec::new());
    let answers = vol.checksums_of(snapshot, targets, offset, len).await;
    for (k, r) in answers.into_iter().enumerate() {
        let node = vol.node(targets[k]);
        match r {
            Ok(c) => sums.0.push((node, c as u32)),
            Err(e) if e.is_bad_copy() => sums.1.push(node),
            Err(e) => return Err(e),
        }
    }
    Ok(sums)
}

fn all_equal(s: &Sums) -> bool {
    s.1.is_empty() && s.0.windows(2).all(|w| w[0].1 == w[1].1)
}
