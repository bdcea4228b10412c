//! The SnapshotMetadata service (changed-block tracking): a snapshot's allocated ranges,
//! and the ranges that changed between two snapshots of a volume, from the copies' own
//! block maps (4 KiB granularity), streamed in offset order. What reads the copies is the
//! caller's ([`SnapshotBlocks`]: the CLI gives one on the cluster's data path).

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::errors::invalid;
use crate::ids;
use crate::pb::{self, snapshot_metadata_server::SnapshotMetadata};

/// Bytes asked of the copies at once.
const WINDOW: u64 = 256 << 20;
/// Ranges in one message when the request names no maximum.
const DEFAULT_RESULTS: usize = 1024;

/// The ranges of one snapshot, as the copies tell them.
#[tonic::async_trait]
pub trait BlockRanges: Send + Sync {
    /// The snapshot's size.
    fn size(&self) -> u64;
    /// The ranges of `[offset, offset+len)` (at most [`WINDOW`]) that hold data, or that
    /// changed since the base snapshot, in order, as (offset, length).
    async fn ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, Status>;
}

/// Opens snapshot `snapshot` of `volume` (with `base`: the changes since that snapshot).
/// NOT_FOUND for a volume or snapshot that is not there; INVALID_ARGUMENT for a base that
/// is not older than the snapshot.
#[tonic::async_trait]
pub trait SnapshotBlocks: Send + Sync + 'static {
    async fn open(
        &self,
        volume: &str,
        snapshot: &str,
        base: Option<&str>,
    ) -> Result<Box<dyn BlockRanges>, Status>;
}

#[derive(Clone)]
pub struct SnapshotMetadataService {
    blocks: Arc<dyn SnapshotBlocks>,
}

impl std::fmt::Debug for SnapshotMetadataService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotMetadataService")
    }
}

impl SnapshotMetadataService {
    pub fn new(blocks: Arc<dyn SnapshotBlocks>) -> SnapshotMetadataService {
        SnapshotMetadataService { blocks }
    }
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Where a stream starts and how many ranges each message holds.
fn bounds(start: i64, max: i32, size: u64) -> Result<(u64, usize), Status> {
    if start < 0 || max < 0 {
        return Err(invalid(
            "starting_offset and max_results may not be negative",
        ));
    }
    if start as u64 > size {
        return Err(Status::out_of_range(format!(
            "starting_offset {start} is past the snapshot's end ({size} bytes)"
        )));
    }
    let max = match max {
        0 => DEFAULT_RESULTS,
        m => m as usize,
    };
    Ok((start as u64, max))
}

/// Streams `src`'s ranges from `start`, `max` to a message, each made by `make`.
fn stream<T: Send + 'static>(
    src: Box<dyn BlockRanges>,
    start: u64,
    max: usize,
    make: fn(i64, Vec<pb::BlockMetadata>) -> T,
) -> Out<T> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let size = src.size();
        let mut pos = start / 4096 * 4096;
        let mut batch = Vec::new();
        while pos < size {
            let n = (size - pos).min(WINDOW);
            let ranges = match src.ranges(pos, n).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            for (a, l) in ranges {
                // Nothing that ends before the start; the first range cut to it.
                let (a, end) = (a.max(start), a + l);
                if a >= end {
                    continue;
                }
                batch.push(pb::BlockMetadata {
                    byte_offset: a as i64,
                    size_bytes: (end - a) as i64,
                });
                if batch.len() == max {
                    let full = std::mem::take(&mut batch);
                    if tx.send(Ok(make(size as i64, full))).await.is_err() {
                        return;
                    }
                }
            }
            pos += n;
        }
        if !batch.is_empty() {
            let _ = tx.send(Ok(make(size as i64, batch))).await;
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

const VARIABLE: i32 = pb::BlockMetadataType::VariableLength as i32;

#[tonic::async_trait]
impl SnapshotMetadata for SnapshotMetadataService {
    type GetMetadataAllocatedStream = Out<pb::GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Out<pb::GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        r: Request<pb::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let r = r.into_inner();
        let (vol, snap) = ids::parse_snapshot_id(&r.snapshot_id)?;
        let src = self.blocks.open(vol, snap, None).await?;
        let (start, max) = bounds(r.starting_offset, r.max_results, src.size())?;
        Ok(Response::new(stream(
            src,
            start,
            max,
            |size, block_metadata| pb::GetMetadataAllocatedResponse {
                block_metadata_type: VARIABLE,
                volume_capacity_bytes: size,
                block_metadata,
            },
        )))
    }

    async fn get_metadata_delta(
        &self,
        r: Request<pb::GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let r = r.into_inner();
        let (vol, snap) = ids::parse_snapshot_id(&r.target_snapshot_id)?;
        let (base_vol, base) = ids::parse_snapshot_id(&r.base_snapshot_id)?;
        if base_vol != vol {
            return Err(invalid(format!(
                "{} and {} are snapshots of different volumes",
                r.base_snapshot_id, r.target_snapshot_id
            )));
        }
        let src = self.blocks.open(vol, snap, Some(base)).await?;
        let (start, max) = bounds(r.starting_offset, r.max_results, src.size())?;
        Ok(Response::new(stream(
            src,
            start,
            max,
            |size, block_metadata| pb::GetMetadataDeltaResponse {
                block_metadata_type: VARIABLE,
                volume_capacity_bytes: size,
                block_metadata,
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// Ranges from a list, asked window by window.
    struct Fixed(u64, Vec<(u64, u64)>);

    #[tonic::async_trait]
    impl BlockRanges for Fixed {
        fn size(&self) -> u64 {
            self.0
        }
        async fn ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, Status> {
            assert!(len <= WINDOW);
            Ok(self
                .1
                .iter()
                .filter_map(|&(a, l)| {
                    let (x, y) = (a.max(offset), (a + l).min(offset + len));
                    (x < y).then(|| (x, y - x))
                })
                .collect())
        }
    }

    async fn all(src: Fixed, start: u64, max: usize) -> Vec<Vec<(i64, i64)>> {
        let s = stream(Box::new(src), start, max, |_, b| b);
        s.map(|m| {
            m.unwrap()
                .iter()
                .map(|b| (b.byte_offset, b.size_bytes))
                .collect()
        })
        .collect()
        .await
    }

    #[tokio::test]
    async fn ranges_stream_in_order_from_the_start_asked() {
        let g = 1u64 << 30;
        let src = || {
            Fixed(
                2 * g,
                vec![(0, 4096), (g - 4096, 8192), (2 * g - 4096, 4096)],
            )
        };
        // A range across a window's edge comes as its two parts.
        let msgs = all(src(), 0, 2).await;
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0], vec![(0, 4096), ((g - 4096) as i64, 4096)]);
        assert_eq!(
            msgs[1],
            vec![(g as i64, 4096), ((2 * g - 4096) as i64, 4096)]
        );
        // From the middle of a range: it is cut there; nothing before it.
        let msgs = all(src(), g - 1024, 0).await;
        let want = vec![((g - 1024) as i64, 5120), ((2 * g - 4096) as i64, 4096)];
        assert_eq!(msgs, vec![want]);
        assert!(all(Fixed(g, vec![]), 0, 0).await.is_empty());
        assert!(bounds(-1, 0, g).is_err());
        assert_eq!(bounds(0, 0, g).unwrap(), (0, DEFAULT_RESULTS));
        assert_eq!(
            bounds(g as i64 + 1, 0, g).unwrap_err().code(),
            tonic::Code::OutOfRange
        );
    }
}
