//! What the benchmark drives. Every target is opened once and shared by all I/O loops; `slot`
//! says which thread's loop is calling, so targets with one connection per thread (NBD) can
//! spread the load the way fio jobs or DISKSPD threads do.

mod file;
mod nbd;
mod null;
mod nvmf;
pub mod volume;

use std::path::Path;

use bytes::Bytes;

pub use file::FileTarget;
pub use nbd::NbdTarget;
pub use null::NullTarget;
pub use nvmf::NvmfTarget;
pub use volume::{Closer, VolumeTarget};

/// A failed I/O or an unusable target.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct TargetError(pub String);

/// A benchmark target.
#[derive(Debug)]
pub enum Target {
    Null(NullTarget),
    File(FileTarget),
    Volume(VolumeTarget),
    Nbd(NbdTarget),
    Nvmf(NvmfTarget),
}

impl Target {
    /// Opens `spec`: `null`, `volume:NAME`, an `nbd://` or `nbd+unix://` URI, an
    /// `nvme+tcp://` URI, or a path.
    /// `create` is DISKSPD's `-c`: create (or extend) a file target of that size first.
    /// `connections` is how many NBD connections to open (one per thread).
    pub async fn open(
        spec: &str,
        data_dir: &Path,
        create: Option<u64>,
        connections: usize,
    ) -> Result<Target, TargetError> {
        if spec == "null" {
            return Ok(Target::Null(NullTarget::new(create.unwrap_or(1 << 40))));
        }
        if let Some(name) = spec.strip_prefix("volume:") {
            return Ok(Target::Volume(VolumeTarget::attach(name, data_dir).await?));
        }
        if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") {
            return Ok(Target::Nbd(NbdTarget::connect(spec, connections).await?));
        }
        if spec.starts_with("nvme+tcp://") {
            return Ok(Target::Nvmf(NvmfTarget::connect(spec, connections).await?));
        }
        Ok(Target::File(FileTarget::open(Path::new(spec), create)?))
    }

    pub fn size(&self) -> u64 {
        match self {
            Target::Null(t) => t.size(),
            Target::File(t) => t.size(),
            Target::Volume(t) => t.size(),
            Target::Nbd(t) => t.size(),
            Target::Nvmf(t) => t.size(),
        }
    }

    /// What the report calls it.
    pub fn describe(&self) -> String {
        match self {
            Target::Null(_) => "null (the harness alone)".into(),
            Target::File(t) => t.describe(),
            Target::Volume(t) => t.describe(),
            Target::Nbd(t) => t.describe(),
            Target::Nvmf(t) => t.describe(),
        }
    }

    /// The data-path links the target itself opened (the native client's); empty for the
    /// others.
    pub fn links(&self) -> Vec<String> {
        match self {
            Target::Volume(t) => t.links(),
            _ => Vec::new(),
        }
    }

    /// The limits a native-client target's writer keeps.
    pub fn limits(&self) -> Option<trireme_replication::qos::Limits> {
        match self {
            Target::Volume(t) => Some(t.vol.limits()),
            _ => None,
        }
    }

    /// How long a native-client target's requests have waited for their volume's limits.
    pub fn throttled(&self) -> Option<std::time::Duration> {
        match self {
            Target::Volume(t) => Some(t.vol.throttled()),
            _ => None,
        }
    }

    /// Alignment the target needs for offsets and lengths (O_DIRECT files: 4096).
    pub fn alignment(&self) -> u64 {
        match self {
            Target::File(t) => t.alignment(),
            // NVMe namespaces of 4 KiB blocks.
            Target::Nvmf(_) => 4096,
            _ => 1,
        }
    }

    /// Reads `len` bytes at `offset` and returns them.
    pub async fn read(&self, slot: usize, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        match self {
            Target::Null(_) => Ok(Bytes::new()),
            Target::File(t) => t.read(offset, len).await,
            Target::Volume(t) => t.read(offset, len).await,
            Target::Nbd(t) => t.read(slot, offset, len).await,
            Target::Nvmf(t) => t.read(offset, len).await,
        }
    }

    pub async fn write(&self, slot: usize, offset: u64, data: Bytes) -> Result<(), TargetError> {
        match self {
            Target::Null(_) => Ok(()),
            Target::File(t) => t.write(offset, data).await,
            Target::Volume(t) => t.write(offset, data).await,
            Target::Nbd(t) => t.write(slot, offset, data).await,
            Target::Nvmf(t) => t.write(offset, data).await,
        }
    }

    /// The writer epoch this target holds (volumes: the attach epoch), stamped into verified
    /// blocks.
    /// Ends the run cleanly (a volume writer flushes and detaches).
    pub async fn close(&self) {
        match self {
            Target::Volume(t) => t.close().await,
            Target::Nvmf(t) => t.close().await,
            _ => {}
        }
    }

    pub fn epoch(&self) -> u64 {
        match self {
            Target::Volume(t) => t.epoch(),
            _ => 0,
        }
    }

    /// True for targets whose I/O blocks the calling thread (files): the engine gives each
    /// loop its own thread.
    pub fn blocks(&self) -> bool {
        matches!(self, Target::File(_))
    }

    /// True for targets with one connection per thread (NBD): the engine gives each thread its
    /// own single-threaded runtime, which opens that connection.
    pub fn per_thread(&self) -> bool {
        matches!(self, Target::Nbd(_))
    }

    /// Opens what thread `slot` needs, from the runtime that will drive it.
    pub async fn open_slot(&self, slot: usize) -> Result<(), TargetError> {
        match self {
            Target::Nbd(t) => t.connect_slot(slot).await,
            _ => Ok(()),
        }
    }

    /// Returns true for targets whose I/O completes without waiting (the engine then yields
    /// now and then so every loop gets its turn).
    pub fn completes_inline(&self) -> bool {
        matches!(self, Target::Null(_))
    }
}
