//! What load to offer.

use serde::Serialize;

/// Access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Uniform random offsets aligned to `align` bytes (DISKSPD `-r[align]`).
    Random { align: u64 },
    /// Each thread walks its own region in order (DISKSPD `-s`).
    Sequential,
}

/// DISKSPD's hot-zone distribution (`-rdpct90/10`: 90% of the I/O to the first 10% of the
/// target). Zones follow each other from the start of the target; what the listed zones leave
/// of the I/O goes to what they leave of the target. Each zone is uniform inside (unlike fio's
/// zipf and pareto, which hash offsets and so scatter the hot blocks over the whole target,
/// where no extent-based tier can hold them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HotZones {
    /// (percent of I/O, percent of the target), in target order, covering all of the I/O.
    pub zones: Vec<(u32, u32)>,
}

impl HotZones {
    /// Parses `90/10` or `80/10:15/20` (I/O percent / target percent, `:` between zones).
    pub fn parse(s: &str) -> Result<HotZones, String> {
        let mut zones = Vec::new();
        for z in s.split(':') {
            let (io, t) = z
                .split_once('/')
                .ok_or_else(|| format!("hot zone {z:?}: expected IO%/TARGET%, e.g. 90/10"))?;
            let num = |v: &str| {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("hot zone {z:?}: {v:?} is not a whole percentage"))
            };
            let (io, t) = (num(io)?, num(t)?);
            if t == 0 {
                return Err(format!(
                    "hot zone {z:?}: a zone covers at least 1% of the target"
                ));
            }
            zones.push((io, t));
        }
        let (io, t): (u32, u32) = zones.iter().fold((0, 0), |(a, b), &(i, t)| {
            (a.saturating_add(i), b.saturating_add(t))
        });
        if io > 100 || t > 100 {
            return Err(format!(
                "hot zones add up to {io}% of the I/O and {t}% of the target; at most 100 each"
            ));
        }
        match (io < 100, t < 100) {
            (true, true) => zones.push((100 - io, 100 - t)),
            (true, false) => {
                return Err(format!(
                    "hot zones cover the whole target with {io}% of the I/O; the I/O must add up to 100"
                ))
            }
            _ => {}
        }
        Ok(HotZones { zones })
    }

    /// The zone an I/O goes to, from `pick` in `0..100`, as (start, length) in `blocks` blocks.
    pub fn pick(&self, pick: u64, blocks: u64) -> (u64, u64) {
        let (mut io_acc, mut t_acc) = (0u64, 0u64);
        for &(io, t) in &self.zones {
            let start = blocks * t_acc / 100;
            t_acc += u64::from(t);
            io_acc += u64::from(io);
            let end = (blocks * t_acc / 100).max(start + 1).min(blocks);
            if pick < io_acc {
                return (start.min(blocks - 1), (end - start.min(blocks - 1)).max(1));
            }
        }
        (0, blocks)
    }
}

/// Write buffer contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Buffers {
    /// A fixed non-zero pattern, the same for every write (DISKSPD's default).
    Pattern,
    /// Zeros (`-Z`).
    Zero,
    /// Fresh random bytes for every write (`-Zr`).
    Random,
}

/// A benchmark profile. Times are in whole seconds, like DISKSPD's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    pub block_size: u64,
    /// Percentage of I/Os that are writes (0..=100).
    pub write_pct: u32,
    pub threads: u32,
    /// Outstanding I/Os per thread.
    pub outstanding: u32,
    pub pattern: Pattern,
    pub duration_s: u64,
    pub warmup_s: u64,
    pub cooldown_s: u64,
    pub buffers: Buffers,
    pub seed: u64,
    /// Bytes of the target to use (0: all of it).
    pub span: u64,
    /// Write self-describing blocks and check every read (see `verify`).
    pub verify: bool,
    /// With a random pattern: DISKSPD's `-rdpct` hot zones (default: uniform).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot: Option<HotZones>,
}

impl Profile {
    /// The workload of the Storage Spaces Direct RDMA-vs-TCP table: 4K, 70:30 read/write,
    /// random, 10 threads x 4 outstanding.
    pub fn s2d() -> Profile {
        Profile {
            block_size: 4096,
            write_pct: 30,
            threads: 10,
            outstanding: 4,
            pattern: Pattern::Random { align: 4096 },
            duration_s: 30,
            warmup_s: 5,
            cooldown_s: 0,
            buffers: Buffers::Pattern,
            seed: 0,
            span: 0,
            verify: false,
            hot: None,
        }
    }

    /// Checks the profile against a target of `target_size` bytes; the message is one line.
    pub fn validate(&self, target_size: u64) -> Result<(), ProfileError> {
        if self.block_size == 0 || self.block_size > 32 << 20 {
            return Err(ProfileError::BlockSize(self.block_size));
        }
        if self.write_pct > 100 {
            return Err(ProfileError::WritePct(self.write_pct));
        }
        if self.threads == 0 || self.outstanding == 0 {
            return Err(ProfileError::NoIo);
        }
        if self.threads as u64 * self.outstanding as u64 > 4096 {
            return Err(ProfileError::TooManyInFlight);
        }
        if self.duration_s == 0 {
            return Err(ProfileError::NoDuration);
        }
        if let Pattern::Random { align } = self.pattern {
            if align == 0 {
                return Err(ProfileError::ZeroAlignment);
            }
        }
        if self.verify
            && (!self.block_size.is_multiple_of(4096)
                || matches!(self.pattern, Pattern::Random { align } if align % 4096 != 0))
        {
            return Err(ProfileError::VerifyAlignment);
        }
        if self.hot.is_some() && self.pattern == Pattern::Sequential {
            return Err(ProfileError::HotZonesSequential);
        }
        let span = self.span_for(target_size);
        if span < self.block_size {
            return Err(ProfileError::TargetTooSmall {
                span,
                block: self.block_size,
            });
        }
        Ok(())
    }

    /// Bytes of a target of `target_size` bytes the load covers.
    pub fn span_for(&self, target_size: u64) -> u64 {
        if self.span == 0 {
            target_size
        } else {
            self.span.min(target_size)
        }
    }
}

/// Why a profile cannot run against a target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("block size {0} must be 1 byte to 32 MiB")]
    BlockSize(u64),
    #[error("write percentage {0} is over 100")]
    WritePct(u32),
    #[error("threads and outstanding I/Os must be at least 1")]
    NoIo,
    #[error("more than 4096 I/Os in flight")]
    TooManyInFlight,
    #[error("duration must be at least 1 second")]
    NoDuration,
    #[error("random alignment must be at least 1 byte")]
    ZeroAlignment,
    #[error("--verify needs block size and alignment in multiples of 4 KiB")]
    VerifyAlignment,
    #[error("hot zones (-rdpct) need random I/O (-r)")]
    HotZonesSequential,
    #[error("target of {span} bytes is smaller than one {block}-byte block")]
    TargetTooSmall { span: u64, block: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_zones_parse_like_diskspd() {
        assert_eq!(
            HotZones::parse("90/10").unwrap().zones,
            vec![(90, 10), (10, 90)]
        );
        assert_eq!(
            HotZones::parse("80/10:15/20").unwrap().zones,
            vec![(80, 10), (15, 20), (5, 70)]
        );
        // All of the I/O in the listed zones: the rest of the target is never touched.
        assert_eq!(HotZones::parse("100/10").unwrap().zones, vec![(100, 10)]);
        for bad in ["90", "90/0", "60/10:50/10", "90/100", "a/10", "90/10:"] {
            assert!(HotZones::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn picks_land_in_their_zone() {
        let z = HotZones::parse("90/10").unwrap();
        assert_eq!(z.pick(0, 1000), (0, 100));
        assert_eq!(z.pick(89, 1000), (0, 100));
        assert_eq!(z.pick(90, 1000), (100, 900));
        // Tiny targets still give every zone at least one block.
        let (s, n) = z.pick(95, 3);
        assert!(s < 3 && n >= 1 && s + n <= 3);
    }
}
