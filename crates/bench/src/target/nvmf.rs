//! An NVMe/TCP subsystem through our host (`trireme-nvmf`): one controller per path, I/O on
//! the ANA optimized one, queued across a failover as Linux's native multipath does.
//! `nvme+tcp://ADDR:PORT[,ADDR:PORT...]/NQN[?hostnqn=NQN]`.

use std::net::SocketAddr;

use bytes::Bytes;
use trireme_nvmf::{ConnectOptions, HostId, Multipath};

use super::TargetError;

/// The host NQN the benchmark connects as unless the URI names one.
pub const BENCH_HOSTNQN: &str = "nqn.2026-12.io.trireme:bench";

#[derive(Debug)]
pub struct NvmfTarget {
    uri: String,
    paths: usize,
    io_queues: u16,
    mp: Multipath,
    size: u64,
}

/// Addresses, subsystem NQN and host NQN of a `nvme+tcp://` URI.
pub fn parse(uri: &str) -> Result<(Vec<SocketAddr>, String, String), TargetError> {
    let bad = |why: &str| {
        TargetError(format!(
            "{uri}: {why} (nvme+tcp://ADDR:PORT[,ADDR:PORT]/NQN[?hostnqn=NQN])"
        ))
    };
    let rest = uri
        .strip_prefix("nvme+tcp://")
        .ok_or_else(|| bad("not an nvme+tcp URI"))?;
    let (addrs, path) = rest
        .split_once('/')
        .ok_or_else(|| bad("no subsystem NQN"))?;
    let (nqn, query) = path.split_once('?').unwrap_or((path, ""));
    let addrs = addrs
        .split(',')
        .map(|a| {
            a.parse::<SocketAddr>()
                .map_err(|e| bad(&format!("address {a:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if nqn.is_empty() {
        return Err(bad("no subsystem NQN"));
    }
    let host = match query.strip_prefix("hostnqn=") {
        Some(h) if !h.is_empty() => h.to_string(),
        Some(_) => return Err(bad("empty hostnqn")),
        None if query.is_empty() => BENCH_HOSTNQN.to_string(),
        None => return Err(bad("unknown query")),
    };
    Ok((addrs, nqn.to_string(), host))
}

impl NvmfTarget {
    /// Connects every path; `queues` I/O queues on each (one per benchmark thread, up to 8).
    pub async fn connect(uri: &str, queues: usize) -> Result<NvmfTarget, TargetError> {
        let (addrs, nqn, host) = parse(uri)?;
        let io_queues = queues.clamp(1, trireme_nvmf::MAX_IO_QUEUES as usize) as u16;
        let opts = ConnectOptions {
            io_queues,
            ..ConnectOptions::default()
        };
        let mp = Multipath::connect(&addrs, &nqn, HostId::new(&host), opts)
            .await
            .map_err(|e| TargetError(e.to_string()))?;
        let size = mp.size().await.map_err(|e| TargetError(e.to_string()))?;
        Ok(NvmfTarget {
            uri: uri.to_string(),
            paths: addrs.len(),
            io_queues,
            mp,
            size,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn describe(&self) -> String {
        format!(
            "{} (NVMe/TCP, {} path(s), {} I/O queue(s) each)",
            self.uri, self.paths, self.io_queues
        )
    }

    /// Reads `len` bytes in commands of at most the controller's transfer size.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        let max = u64::from(trireme_nvmf::MAX_TRANSFER);
        if len <= max {
            return self.read_one(offset, len).await;
        }
        let mut out = bytes::BytesMut::with_capacity(len as usize);
        let mut at = 0;
        while at < len {
            let n = (len - at).min(max);
            out.extend_from_slice(&self.read_one(offset + at, n).await?);
            at += n;
        }
        Ok(out.freeze())
    }

    async fn read_one(&self, offset: u64, len: u64) -> Result<Bytes, TargetError> {
        self.mp
            .read(offset, len as u32)
            .await
            .map_err(|e| TargetError(e.to_string()))
    }

    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), TargetError> {
        let max = trireme_nvmf::MAX_TRANSFER as usize;
        let mut at = 0;
        while at < data.len() {
            let n = (data.len() - at).min(max);
            self.mp
                .write(offset + at as u64, data.slice(at..at + n), false)
                .await
                .map_err(|e| TargetError(e.to_string()))?;
            at += n;
        }
        Ok(())
    }

    pub async fn close(&self) {
        let _ = self.mp.flush().await;
    }
}
