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
    #[error("target of {span} bytes is smaller than one {block}-byte block")]
    TargetTooSmall { span: u64, block: u64 },
}
