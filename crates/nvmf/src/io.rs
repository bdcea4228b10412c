//! I/O commands (NVM command set) on a subsystem's namespace: read, write, flush, write
//! zeroes and dataset management, as calls of its [`BlockDevice`].

use bytes::Bytes;
use trireme_blockdev::{BlockDevice, DevError, ErrorKind};

use crate::cmd::{io, status, Sqe};
use crate::ident::{ana, LBA_SHIFT, NSID};
use crate::subsystem::Subsystem;

/// Namespace is write protected (generic status 20h).
const WRITE_PROTECTED: u16 = 0x020;

/// Data this command moves to the host, or its status.
pub(crate) type IoResult = Result<Option<Bytes>, u16>;

/// The status a device error becomes for `opcode`.
pub(crate) fn dev_status(opcode: u8, e: &DevError) -> u16 {
    match e.kind {
        ErrorKind::Io if opcode == io::READ => status::UNRECOVERED_READ,
        ErrorKind::Io => status::WRITE_FAULT,
        ErrorKind::Invalid => status::INVALID_FIELD | status::DNR,
        ErrorKind::NoSpace => status::CAPACITY_EXCEEDED | status::DNR,
        ErrorKind::ReadOnly => WRITE_PROTECTED | status::DNR,
        ErrorKind::Unsupported => status::INVALID_OPCODE | status::DNR,
    }
}

/// Checks that a command may run on this path now: namespace 1, and the path optimized
/// (else a path error: the host's multipath retries on another path).
pub(crate) fn admissible<D>(sub: &Subsystem<D>, sqe: &Sqe) -> Result<(), u16> {
    let flush_all = sqe.opcode == io::FLUSH && sqe.nsid == u32::MAX;
    if sqe.nsid != NSID && !flush_all {
        return Err(status::INVALID_NS | status::DNR);
    }
    match sub.ana.get().state {
        ana::OPTIMIZED | ana::NON_OPTIMIZED => Ok(()),
        ana::CHANGE => Err(status::ANA_TRANSITION),
        _ => Err(status::ANA_INACCESSIBLE),
    }
}

/// The byte range of a read, write or write zeroes, checked against the namespace.
fn byte_range(size: u64, sqe: &Sqe) -> Result<(u64, u32), u16> {
    let (slba, nlb) = sqe.lba_range();
    let blocks = size >> LBA_SHIFT;
    match slba.checked_add(u64::from(nlb)) {
        Some(end) if end <= blocks => Ok((slba << LBA_SHIFT, nlb << LBA_SHIFT)),
        _ => Err(status::LBA_RANGE | status::DNR),
    }
}

/// Runs one I/O command; `data` is what the host sent with it.
pub(crate) async fn run<D: BlockDevice>(sub: &Subsystem<D>, sqe: &Sqe, data: Bytes) -> IoResult {
    admissible(sub, sqe)?;
    let dev = &*sub.dev;
    let op = sqe.opcode;
    let writes = matches!(op, io::WRITE | io::WRITE_ZEROES | io::DSM);
    if writes && dev.caps().read_only {
        return Err(WRITE_PROTECTED | status::DNR);
    }
    let failed = |e: DevError| {
        tracing::debug!(opcode = op, "I/O command failed: {e}");
        dev_status(op, &e)
    };
    match op {
        io::READ => {
            let (off, len) = byte_range(dev.size(), sqe)?;
            if len != sqe.sgl_len {
                return Err(status::SGL_INVALID_DATA_LENGTH | status::DNR);
            }
            dev.read(off, len).await.map(Some).map_err(failed)
        }
        io::WRITE => {
            let (off, len) = byte_range(dev.size(), sqe)?;
            if data.len() != len as usize {
                return Err(status::SGL_INVALID_DATA_LENGTH | status::DNR);
            }
            dev.write(off, data, sqe.fua())
                .await
                .map(|_| None)
                .map_err(failed)
        }
        io::FLUSH => dev.flush().await.map(|_| None).map_err(failed),
        io::WRITE_ZEROES => {
            let (off, len) = byte_range(dev.size(), sqe)?;
            let deallocate = sqe.cdw12 & (1 << 25) != 0;
            dev.write_zeroes(off, len, deallocate, sqe.fua())
                .await
                .map(|_| None)
                .map_err(failed)
        }
        io::DSM => trim(dev, sqe, &data).await.map_err(failed),
        _ => Err(status::INVALID_OPCODE | status::DNR),
    }
}

/// Dataset management: deallocates every range when the host asks (AD) and the device's
/// trims deallocate; other attributes are hints and change nothing.
async fn trim<D: BlockDevice>(dev: &D, sqe: &Sqe, data: &[u8]) -> Result<Option<Bytes>, DevError> {
    let ranges = (sqe.cdw10 & 0xff) as usize + 1;
    if data.len() < ranges * 16 {
        return Err(DevError::new(
            ErrorKind::Invalid,
            "fewer ranges than the command says",
        ));
    }
    let deallocate = sqe.cdw11 & (1 << 2) != 0;
    if !deallocate || !dev.caps().trim {
        return Ok(None);
    }
    let blocks = dev.size() >> LBA_SHIFT;
    let mut todo = Vec::with_capacity(ranges);
    for r in data[..ranges * 16].chunks_exact(16) {
        let nlb = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
        let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
        match slba.checked_add(nlb) {
            Some(end) if end <= blocks => todo.push((slba << LBA_SHIFT, nlb << LBA_SHIFT)),
            _ => {
                return Err(DevError::new(
                    ErrorKind::Invalid,
                    format!("range of {nlb} blocks at {slba} is past the namespace's end"),
                ))
            }
        }
    }
    // A range may be 2^32 blocks: trimmed in pieces a device call takes.
    const PIECE: u64 = 1 << 30;
    for (mut off, mut len) in todo {
        while len > 0 {
            let n = len.min(PIECE);
            dev.trim(off, n as u32, false).await?;
            off += n;
            len -= n;
        }
    }
    Ok(None)
}
