//! Incremental backups of trireme volumes, in the format Ceph RBD uses for them.
//!
//! - [`rbd_diff`]: the `rbd export-diff` stream (versions 1 and 2), read and written.
//! - [`make_diff`]: a diff from one snapshot to a later one (or from nothing), reading only
//!   the blocks that changed: the copies say which (`SnapshotChanged`), at 4 KiB granularity.
//! - [`apply_diff`]: a diff applied through a volume's writer.
//! - [`catalog`]: a directory of full and incremental backups of one volume, and the chain
//!   that restores one of them.

pub mod catalog;
pub mod rbd_diff;

use std::io::{Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use rbd_diff::{DiffError, DiffReader, DiffWriter, Record};
use trireme_client::{Extents, SnapshotReader, Volume, VolumeError};
use trireme_proto::Extent;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Diff(#[from] DiffError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
}

/// How much a diff took and holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiffStats {
    /// Bytes the copies said changed (for a full diff: the allocated bytes).
    pub changed_bytes: u64,
    /// Bytes read from the volume to write it.
    pub read_bytes: u64,
    /// Bytes of data records, and bytes of zeroed ranges.
    pub data_bytes: u64,
    pub zero_bytes: u64,
    /// The diff's length.
    pub file_bytes: u64,
}

/// Bytes asked about at once (block status, changed blocks).
const WINDOW: u64 = 256 << 20;
/// Bytes read at once.
const PIECE: u64 = 4 << 20;

/// A piece of a snapshot on its way.
type PieceRead = tokio::task::JoinHandle<Result<Bytes, VolumeError>>;

/// Reads in flight at once while making a diff.
const READS_IN_FLIGHT: usize = 16;

/// Writes to `out` the diff (of `version`) from snapshot `from` (name, id; `None`: from an
/// empty image) to the snapshot `to` reads, named `to_name`. Only blocks that changed are
/// read, a few reads in flight; a range that reads as zeros becomes a zero record (or, from an
/// empty image, nothing). `progress` gets the bytes of the volume covered so far and its size.
pub async fn make_diff<W: Write>(
    to: &Arc<SnapshotReader>,
    to_name: &str,
    from: Option<(&str, u64)>,
    out: W,
    version: rbd_diff::Version,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(W, DiffStats), BackupError> {
    let size = to.size();
    let mut w = DiffWriter::new(out, from.map(|f| f.0), Some(to_name), size, version)?;
    let mut st = DiffStats::default();
    let incremental = from.is_some();
    // Reads in flight, in the order their records go out.
    let mut flying: std::collections::VecDeque<(u64, u64, PieceRead)> =
        std::collections::VecDeque::new();
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(WINDOW);
        let changed: Vec<(u64, u64)> = match from {
            Some((_, id)) => ranges(pos, &to.changed(id, pos, n, Extents::All).await?, |e| {
                e.flags & trireme_proto::EXTENT_CHANGED != 0
            }),
            None => vec![(pos, n)],
        };
        // The window's allocation, asked once, cut to the changed ranges.
        let alloc = runs(pos, &to.block_status(pos, n, Extents::All).await?);
        for (b, blen, zero) in within(&alloc, &changed) {
            if zero {
                // Records go out in offset order: the reads before this range first.
                while let Some((at, k, h)) = flying.pop_front() {
                    put(&mut w, &mut st, incremental, at, k, h).await?;
                }
                if incremental {
                    w.zero(b, blen)?;
                    st.changed_bytes += blen;
                    st.zero_bytes += blen;
                }
                continue;
            }
            st.changed_bytes += blen;
            let mut at = b;
            while at < b + blen {
                let k = (b + blen - at).min(PIECE);
                if flying.len() >= READS_IN_FLIGHT {
                    let (x, y, h) = flying.pop_front().expect("in flight");
                    put(&mut w, &mut st, incremental, x, y, h).await?;
                }
                let r = to.clone();
                flying.push_back((at, k, tokio::spawn(async move { r.read(at, k).await })));
                at += k;
            }
        }
        pos += n;
        progress(pos, size);
    }
    while let Some((at, k, h)) = flying.pop_front() {
        put(&mut w, &mut st, incremental, at, k, h).await?;
    }
    st.file_bytes = w.bytes + 1;
    let out = w.finish()?;
    Ok((out, st))
}

/// The record for `k` bytes read at `at`: data, or zeros (nothing from an empty image).
async fn put<W: Write>(
    w: &mut DiffWriter<W>,
    st: &mut DiffStats,
    incremental: bool,
    at: u64,
    k: u64,
    read: PieceRead,
) -> Result<(), BackupError> {
    let data = read
        .await
        .map_err(|e| BackupError::Invalid(format!("a read task failed: {e}")))??;
    st.read_bytes += k;
    if data.iter().all(|&x| x == 0) {
        if incremental {
            w.zero(at, k)?;
            st.zero_bytes += k;
        }
    } else {
        w.write(at, &data)?;
        st.data_bytes += k;
    }
    Ok(())
}

/// The ranges of extents (starting at `start`) that `pick` picks, merged.
fn ranges(start: u64, ext: &[Extent], pick: impl Fn(&Extent) -> bool) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut pos = start;
    for e in ext {
        if pick(e) {
            match out.last_mut() {
                Some((a, n)) if *a + *n == pos => *n += e.length,
                _ => out.push((pos, e.length)),
            }
        }
        pos += e.length;
    }
    out
}

/// The parts of `runs` (data or zeros, in order) inside `ranges` (in order, apart), in order.
fn within(runs: &[(u64, u64, bool)], ranges: &[(u64, u64)]) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    let mut r = 0;
    for &(a, n) in ranges {
        let end = a + n;
        while r < runs.len() && runs[r].0 + runs[r].1 <= a {
            r += 1;
        }
        let mut k = r;
        while k < runs.len() && runs[k].0 < end {
            let (s, l, zero) = runs[k];
            let (x, y) = (s.max(a), (s + l).min(end));
            if x < y {
                out.push((x, y - x, zero));
            }
            k += 1;
        }
    }
    out
}

/// Allocation extents (starting at `start`) as runs of data and of zeros, merged.
fn runs(start: u64, ext: &[Extent]) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    let mut pos = start;
    for e in ext {
        let zero = e.flags & Extent::ZERO != 0;
        match out.last_mut() {
            Some((a, n, z)) if *z == zero && *a + *n == pos => *n += e.length,
            _ => out.push((pos, e.length, zero)),
        }
        pos += e.length;
    }
    out
}

/// What a diff says before its data: where it starts and ends, and the image's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffHead {
    pub from: Option<String>,
    pub to: Option<String>,
    pub size: u64,
    /// The first data record (or the end), read to find where the metadata stops.
    first: Record,
}

/// Reads a diff's metadata records.
pub fn read_head<R: Read>(r: &mut DiffReader<R>) -> Result<DiffHead, BackupError> {
    let (mut from, mut to) = (None, None);
    loop {
        match r.next_record()? {
            Record::From(n) => from = Some(n),
            Record::To(n) => to = Some(n),
            Record::Size(_) => {}
            first => {
                let size = r
                    .size()
                    .ok_or_else(|| BackupError::Diff(DiffError::Format("no size record".into())))?;
                return Ok(DiffHead {
                    from,
                    to,
                    size,
                    first,
                });
            }
        }
    }
}

/// Reads a whole diff, keeping nothing: an error if any of it is bad or it is cut short.
/// Checked before a diff from a file is applied, so a damaged one changes nothing.
pub fn validate<R: Read>(r: R) -> Result<(), BackupError> {
    let mut r = DiffReader::new(r)?;
    read_head(&mut r)?;
    while r.next_record()? != Record::End {}
    Ok(())
}

/// How much applying a diff wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    pub written_bytes: u64,
    pub zeroed_bytes: u64,
}

/// Writes in flight at once while applying.
const IN_FLIGHT: usize = 8;

/// Applies the rest of the diff `head` began (its data records) through `vol`'s writer, a
/// few writes in flight, then flushes. `progress` gets the offset reached and the size. The
/// caller checks first that the diff fits the volume (its size, where it starts).
pub async fn apply_diff<R: Read>(
    vol: &Arc<Volume>,
    r: &mut DiffReader<R>,
    head: DiffHead,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Applied, BackupError> {
    if head.size > vol.size() {
        return Err(BackupError::Invalid(format!(
            "the diff is of a {}-byte image; the volume has {} bytes",
            head.size,
            vol.size()
        )));
    }
    let mut done = Applied::default();
    let mut tasks = tokio::task::JoinSet::new();
    // The ranges in flight: a record that overlaps one waits for them all (a diff's records
    // do not overlap as Ceph and trireme write them, but the later must win if they do).
    let mut flying: Vec<(u64, u64)> = Vec::new();
    let mut rec = head.first;
    loop {
        let span = match &rec {
            Record::Write { offset, data } => Some((*offset, offset + data.len() as u64)),
            Record::Zero { offset, len } => Some((*offset, offset + len)),
            _ => None,
        };
        let overlaps = span.is_some_and(|(a, b)| flying.iter().any(|&(x, y)| a < y && x < b));
        if overlaps || tasks.len() >= IN_FLIGHT {
            while let Some(t) = tasks.join_next().await {
                t.expect("a task")?;
            }
            flying.clear();
        }
        flying.extend(span);
        let v = vol.clone();
        match rec {
            Record::End => break,
            Record::Write { offset, data } => {
                done.written_bytes += data.len() as u64;
                progress(offset + data.len() as u64, head.size);
                tasks.spawn(async move {
                    let mut at = 0;
                    let data = Bytes::from(data);
                    while at < data.len() {
                        let n = (data.len() - at).min(trireme_client::MAX_IO as usize);
                        v.write(offset + at as u64, data.slice(at..at + n), false)
                            .await?;
                        at += n;
                    }
                    Ok::<(), VolumeError>(())
                });
            }
            Record::Zero { offset, len } => {
                done.zeroed_bytes += len;
                progress(offset + len, head.size);
                tasks.spawn(async move { v.write_zeroes(offset, len, true, false).await });
            }
            Record::From(_) | Record::To(_) | Record::Size(_) => {
                return Err(BackupError::Diff(DiffError::Format(
                    "a metadata record among the data records".into(),
                )))
            }
        }
        rec = r.next_record()?;
    }
    while let Some(t) = tasks.join_next().await {
        t.expect("a task")?;
    }
    vol.flush().await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_become_ranges_and_runs() {
        let e = |length, flags| Extent { length, flags };
        let ext = [e(10, 1), e(5, 1), e(20, 0), e(4, 1)];
        assert_eq!(
            ranges(100, &ext, |x| x.flags == 1),
            vec![(100, 15), (135, 4)]
        );
        let alloc = [e(8, 0), e(8, 0), e(4, Extent::HOLE | Extent::ZERO), e(2, 0)];
        let r = runs(0, &alloc);
        assert_eq!(r, vec![(0, 16, false), (16, 4, true), (20, 2, false)]);
        assert_eq!(
            within(&r, &[(2, 3), (15, 3), (21, 1)]),
            vec![(2, 3, false), (15, 1, false), (16, 2, true), (21, 1, false)]
        );
        assert!(within(&r, &[]).is_empty());
    }
}
