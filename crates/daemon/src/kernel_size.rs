//! A mapped device's size follows its volume's (`volume resize` while mapped): the kernel is
//! told the new size online, through the NBD client's reconfigure or ublk's `UPDATE_SIZE`.
//! A kernel that cannot (ublk before Linux 6.16) keeps the old size, said once in the log:
//! the next `map` gives the new one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use trireme_blockdev::BlockDevice;
use trireme_kernel::mapped::{self, Mapped};
use trireme_kernel::{nbd, ublk};

/// The size the kernel gives device `m` now (`/sys/block/NAME/size`, in 512-byte sectors).
pub fn kernel_size(m: &Mapped) -> Option<u64> {
    let name = m.path().file_name()?.to_string_lossy().into_owned();
    let s = std::fs::read_to_string(format!("/sys/block/{name}/size")).ok()?;
    s.trim().parse::<u64>().ok()?.checked_mul(512)
}

/// Tells the kernel `dev`'s size whenever it changes, checked each second while `m`'s record
/// (under `dir`) names this process.
pub fn follow<D: BlockDevice>(dev: Arc<D>, m: Mapped, dir: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut told = kernel_size(&m).unwrap_or_else(|| dev.size());
        loop {
            let size = dev.size();
            if size != told {
                told = tell(&m, told, size).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let ours = matches!(mapped::get(&dir, &m.volume), Ok(Some(r)) if r.pid == m.pid);
            if !ours {
                return;
            }
        }
    })
}

/// Resizes `m` from `from` to `size` bytes; what the kernel was told last (`size` either
/// way: a refusal is not asked again).
async fn tell(m: &Mapped, from: u64, size: u64) -> u64 {
    let (kind, i, id) = (m.kind.clone(), m.index, Mapped::identifier(&m.volume));
    let r = tokio::task::spawn_blocking(move || match kind.as_str() {
        "ublk" => ublk::resize(i, size),
        "loop" => Err(trireme_kernel::KernelError::Record(
            "a loop device over FUSE has the size nbdfuse saw at map".into(),
        )),
        _ => nbd::resize(i, &id, size),
    })
    .await;
    let device = m.path();
    match r {
        Ok(Ok(())) => {
            tracing::info!(device = %device.display(), from, size, "the device has the volume's new size")
        }
        Ok(Err(e)) => tracing::warn!(
            device = %device.display(),
            from,
            size,
            "the device keeps its size ({e}): unmap and map it again for the volume's"
        ),
        Err(e) => tracing::warn!(device = %device.display(), "resizing the device: {e}"),
    }
    size
}
