//! A parity volume's region map (issue 67): what each region is, as the writer switched it.
//!
//! | key | value |
//! |---|---|
//! | `regions/<volume id>/<group>` | the kinds of regions `group * 4096 ..`, one character each: `m` mirrored, `0` or `1` parity in that chunk slot |
//!
//! - **By id, not name.** Ids are never reused: a volume made under a deleted one's name
//!   never inherits its regions; a volume in the trash keeps them for its restore, and the
//!   purge forgets them.
//! - **Groups.** A region switches alone (one put of 4 KiB at most), and a volume of any size
//!   stays within etcd's request limit. A region past its group's text, or in a group with
//!   no key, is mirrored: a new volume has no keys.
//! - **Fenced.** A switch puts its group only if the volume's layout is as read, with the
//!   writer's epoch and id: a writer superseded cannot switch a region under the next one.

use serde::{Deserialize, Serialize};
use trireme_replication::Region;

use super::*;
use crate::kv::{Compare, Op};
use crate::{MetaError, VolumeRecord};

/// Regions per key.
pub const REGIONS_PER_KEY: u64 = 4096;

/// One group's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Group {
    kinds: String,
}

fn kind_char(r: Region) -> char {
    match r {
        Region::Mirror => 'm',
        Region::Parity { slot: 0 } => '0',
        Region::Parity { .. } => '1',
    }
}

fn char_kind(c: char) -> Option<Region> {
    match c {
        'm' => Some(Region::Mirror),
        '0' => Some(Region::Parity { slot: 0 }),
        '1' => Some(Region::Parity { slot: 1 }),
        _ => None,
    }
}

fn group_key(id: u64, group: u64) -> String {
    key(&format!("regions/{id}/{group:010}"))
}

impl ClusterMeta {
    /// The regions volume `id` has recorded, up to the last one not mirrored (every region
    /// after it is mirrored). A group that does not decode is corrupt, not mirrored: reading
    /// a stripe's region from the mirrors would return the bytes of before it.
    pub async fn regions(&self, id: u64) -> Result<Vec<Region>, MetaError> {
        let (kvs, _) = self.store.range(&key(&format!("regions/{id}/"))).await?;
        let mut out = Vec::new();
        for kv in &kvs {
            let corrupt = |what: &str| MetaError::Corrupt {
                key: kv.key.clone(),
                what: what.to_string(),
            };
            let group: u64 = kv
                .key
                .rsplit('/')
                .next()
                .and_then(|g| g.parse().ok())
                .ok_or_else(|| corrupt("not a region group's key"))?;
            let g: Group = decode(kv)?;
            if g.kinds.len() as u64 > REGIONS_PER_KEY {
                return Err(corrupt("more regions than a group holds"));
            }
            let first = group
                .checked_mul(REGIONS_PER_KEY)
                .ok_or_else(|| corrupt("group out of range"))? as usize;
            for (i, c) in g.kinds.chars().enumerate() {
                let r = char_kind(c).ok_or_else(|| corrupt("unknown region kind"))?;
                if r != Region::Mirror {
                    if out.len() <= first + i {
                        out.resize(first + i + 1, Region::Mirror);
                    }
                    out[first + i] = r;
                }
            }
        }
        Ok(out)
    }

    /// Records region `region` of volume `name` as `kind`, for the writer of `epoch` on the
    /// volume of id `id`: refused (and nothing written) if that writer was superseded or the
    /// volume replaced, is not parity, or has no such region.
    pub async fn record_region(
        &self,
        name: &str,
        id: u64,
        epoch: u64,
        region: u64,
        kind: Region,
    ) -> Result<(), MetaError> {
        let gk = group_key(id, region / REGIONS_PER_KEY);
        let at = (region % REGIONS_PER_KEY) as usize;
        for _ in 0..MAX_TRIES {
            let (v, rev) = self.read_volume(name).await?;
            check_writer(&v, id, epoch, region)?;
            let (mut group, grev) = match self.get::<Group>(&gk).await? {
                Some((g, kv)) => (g, Some(kv.mod_revision)),
                None => (Group::default(), None),
            };
            let mut kinds: Vec<char> = group.kinds.chars().collect();
            if kinds.len() <= at {
                kinds.resize(at + 1, 'm');
            }
            kinds[at] = kind_char(kind);
            group.kinds = kinds
                .into_iter()
                .collect::<String>()
                .trim_end_matches('m')
                .into();
            let mut compare = vec![Compare::mod_revision(key(&format!("layouts/{name}")), rev)];
            compare.push(match grev {
                Some(r) => Compare::mod_revision(gk.clone(), r),
                None => Compare::absent(gk.clone()),
            });
            let op = match group.kinds.is_empty() {
                true => Op::delete(gk.clone()),
                false => Op::put(gk.clone(), encode(&group)),
            };
            if self.write(compare, vec![op]).await?.is_some() {
                return Ok(());
            }
        }
        Err(MetaError::Contended {
            what: format!("recording region {region} of volume {name:?}"),
            tries: MAX_TRIES,
        })
    }

    /// Forgets every region of volume `id` (it was deleted for good).
    pub async fn forget_regions(&self, id: u64) -> Result<(), MetaError> {
        let (kvs, _) = self.store.range(&key(&format!("regions/{id}/"))).await?;
        if kvs.is_empty() {
            return Ok(());
        }
        let ops = kvs.iter().map(|kv| Op::delete(kv.key.clone())).collect();
        self.write(vec![], ops)
            .await?
            .ok_or_else(|| MetaError::Refused("regions: conflicting write".into()))?;
        Ok(())
    }
}

/// Whether the writer of `epoch` on volume `id` may switch `region` of `v`.
fn check_writer(v: &VolumeRecord, id: u64, epoch: u64, region: u64) -> Result<(), MetaError> {
    let trireme_replication::Layout::Parity(p) = v.layout else {
        return Err(MetaError::Refused(format!(
            "volume {:?} is not a parity volume: it has no regions",
            v.name
        )));
    };
    if v.id != id {
        return Err(MetaError::Refused(format!(
            "volume {:?} was replaced (id {} now, the writer's is {id})",
            v.name, v.id
        )));
    }
    if v.epoch != epoch {
        return Err(MetaError::Refused(format!(
            "volume {:?}: epoch {epoch} was superseded by {}: this writer is fenced",
            v.name, v.epoch
        )));
    }
    let region_bytes = u64::from(p.data) * trireme_replication::CHUNK_BLOCKS * 4096;
    let regions = v.size.div_ceil(region_bytes);
    if region >= regions {
        return Err(MetaError::Refused(format!(
            "volume {:?} has {regions} regions; there is no region {region}",
            v.name
        )));
    }
    Ok(())
}
