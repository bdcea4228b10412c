//! A file or block device, opened with `O_DIRECT` (through the page cache only where the
//! filesystem refuses it). I/O runs on tokio's blocking pool with `pread`/`pwrite`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use trireme_store::aligned::{AlignedBuf, ALIGN};

use super::TargetError;

#[derive(Debug)]
pub struct FileTarget {
    file: Arc<File>,
    path: String,
    size: u64,
    direct: bool,
}

impl FileTarget {
    pub fn open(path: &Path, create: Option<u64>) -> Result<FileTarget, TargetError> {
        let name = path.display().to_string();
        let e = |what: &str, err: std::io::Error| TargetError(format!("{what} {name}: {err}"));
        if !path.exists() && create.is_none() {
            return Err(TargetError(format!(
                "{name}: no such file or device (use -c SIZE to create it)"
            )));
        }
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .create(create.is_some())
            .truncate(false);
        let (file, direct) = match o.clone().custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => (f, true),
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                (o.open(path).map_err(|x| e("open", x))?, false)
            }
            Err(err) => return Err(e("open", err)),
        };
        if let Some(size) = create {
            if file.metadata().map_err(|x| e("stat", x))?.len() < size {
                file.set_len(size).map_err(|x| e("size", x))?;
            }
        }
        // Seeking to the end works for regular files and block devices alike.
        let size = {
            use std::io::Seek;
            (&file)
                .seek(std::io::SeekFrom::End(0))
                .map_err(|x| e("size of", x))?
        };
        Ok(FileTarget {
            file: Arc::new(file),
            path: name,
            size,
            direct,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn alignment(&self) -> u64 {
        if self.direct {
            ALIGN as u64
        } else {
            1
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} ({})",
            self.path,
            if self.direct {
                "O_DIRECT"
            } else {
                "buffered: O_DIRECT refused"
            }
        )
    }

    /// Reads on the calling thread: the engine runs file loops on threads of their own.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        let mut buf = AlignedBuf::new(len as usize);
        self.file
            .read_exact_at(&mut buf[..len as usize], offset)
            .map_err(|e| TargetError(format!("read at {offset}: {e}")))?;
        Ok(Bytes::copy_from_slice(&buf[..len as usize]))
    }

    /// Writes on the calling thread (see `read`).
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), TargetError> {
        let mut buf = AlignedBuf::new(data.len());
        buf[..data.len()].copy_from_slice(&data);
        self.file
            .write_all_at(&buf[..data.len()], offset)
            .map_err(|e| TargetError(format!("write at {offset}: {e}")))
    }
}
