//! A node's room for replicas: its capacity, the over-commit limit on the sum of their sizes,
//! and the file system under its store. `CreateReplica` and `ResizeReplica` are checked
//! against it; the `Space` op reports it (the pool view of `status` and `trireme pool`).
//!
//! Volumes on the file store are thin: a replica takes space as it is written. The capacity
//! bounds what the replicas may *provision* (their sizes) times the over-commit limit: 1.0, the
//! default, never promises more than the node has; 2.0 promises twice that, betting that
//! volumes stay half full, as thin pools do. A file system that fills up anyway (thin
//! volumes, snapshots) is met by the reserve below.
//!
//! **The reserve.** A full file system must not cost a copy: its metadata, maps and logs are
//! replaced or appended as it works, and a replica that cannot write them loses track of its
//! history. So a node keeps the last part of its file system in reserve (2% of it, at least
//! 32 MiB, at most 4 GiB): once the free space is below that, a write or write-zeroes is
//! refused with `NoSpace` before anything is marked or written, and trims (which give space
//! back) still run. The writer never takes a copy out for that: with no copy written it fails
//! the write (ENOSPC to the guest); if another copy wrote it (copies on one file system cross
//! the line a moment apart) it sends it again with `FLAG_SPACE_RESERVE`, which may use the
//! reserve, so the copies never differ. Before, the first copy to find its device full was
//! taken out, then the next, and the writer waited for copies that could never come back.
//!
//! The capacity is `--capacity` when given. Otherwise a node on a file system counts what its
//! directory takes on disk plus its share of what the file system has free (all of it, or a
//! `1/N` share when `N` nodes live on it, as those of `trireme up` do): the room it really has,
//! not the file system's size, which other files use too. It is measured when a replica is
//! created and when the room is asked for.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use trireme_proto::{human, NodeSpace};

#[derive(Debug)]
pub(crate) struct Room {
    /// Bytes the replicas may hold (`u64::MAX`: no limit set), as last measured.
    capacity: AtomicU64,
    /// Measured on the file system (`--capacity` not given): of how many nodes this one is.
    fs_share: AtomicU64,
    /// The over-commit limit in thousandths.
    overcommit_milli: AtomicU64,
    /// The directory of the node's store, for its file system's size and free space.
    dir: RwLock<Option<PathBuf>>,
    /// The file system's free space and size as last looked at, and when (nanoseconds since
    /// `epoch`, plus one: 0 is never): writes look at most every [`FREE_CHECK`].
    free: AtomicU64,
    fs_size: AtomicU64,
    checked: AtomicU64,
    epoch: std::time::Instant,
    /// What the writes admitted and not yet done may take (see [`Room::admit`]).
    pending: AtomicU64,
}

/// A write admitted by [`Room::admit`]: pending until dropped.
pub(crate) struct Admitted<'a>(Option<(&'a AtomicU64, u64)>);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some((pending, len)) = self.0 {
            pending.fetch_sub(len, Ordering::AcqRel);
        }
    }
}

/// How long a write may go by the free space another looked at.
const FREE_CHECK: std::time::Duration = std::time::Duration::from_millis(5);
/// The reserve: this share of the file system (in parts of 1000), within the bounds below.
const RESERVE_MILLI: u64 = 20;
const RESERVE_MIN: u64 = 32 << 20;
const RESERVE_MAX: u64 = 4 << 30;

/// The reserve of a file system of `fs_size` bytes.
pub(crate) fn reserve_of(fs_size: u64) -> u64 {
    (fs_size / 1000 * RESERVE_MILLI).clamp(RESERVE_MIN, RESERVE_MAX)
}

impl Default for Room {
    fn default() -> Self {
        Room {
            capacity: AtomicU64::new(u64::MAX),
            fs_share: AtomicU64::new(0),
            overcommit_milli: AtomicU64::new(1000),
            dir: RwLock::new(None),
            free: AtomicU64::new(0),
            fs_size: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            pending: AtomicU64::new(0),
        }
    }
}

impl Room {
    pub(crate) fn set_capacity(&self, bytes: u64) {
        self.fs_share.store(0, Ordering::Relaxed);
        self.capacity.store(bytes, Ordering::Relaxed);
    }

    /// Measures the capacity on the file system of the node's directory ([`Room::set_dir`]),
    /// one of `nodes` nodes living on it.
    pub(crate) fn measure_capacity(&self, nodes: u32) {
        self.fs_share
            .store(u64::from(nodes.max(1)), Ordering::Relaxed);
        self.space(0, 0, 0);
    }

    /// The capacity as last measured (or as set).
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// `ratio` is checked by the caller (at least 1, finite).
    pub(crate) fn set_overcommit(&self, ratio: f64) {
        self.overcommit_milli
            .store((ratio * 1000.0).round() as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_dir(&self, dir: PathBuf) {
        *self.dir.write().unwrap_or_else(|e| e.into_inner()) = Some(dir);
    }

    /// Admits a write of `len` bytes, or says why it must be refused for want of space (see
    /// the module's docs): what is free, less what writes admitted and not yet done may still
    /// take, must leave the reserve whole, and as many times over as nodes share the file
    /// system (`up`'s do, each admitting its own writes a moment apart). A write that may use
    /// the reserve (`reserve`) and a node without a file system to look at are admitted. The
    /// write counts as pending until the returned guard is dropped.
    pub(crate) fn admit(&self, reserve: bool, len: u64) -> Result<Admitted<'_>, String> {
        let Some((size, free)) = self.fs_now() else {
            return Ok(Admitted(None));
        };
        // A write takes more than its bytes: the rest of partly written blocks, a redirect
        // log record per block, the file system's own blocks.
        let len = len.saturating_add(len / 8).saturating_add(16 << 10);
        let pending = self
            .pending
            .fetch_add(len, Ordering::AcqRel)
            .saturating_add(len);
        let admitted = Admitted(Some((&self.pending, len)));
        if reserve {
            return Ok(admitted);
        }
        let share = self.fs_share.load(Ordering::Relaxed).max(1);
        let keep = reserve_of(size);
        let wanted = keep.saturating_add(pending.saturating_mul(share));
        if free >= wanted {
            return Ok(admitted);
        }
        let others = if share > 1 {
            format!(", {share} nodes sharing it")
        } else {
            String::new()
        };
        Err(format!(
            "no space: {} free on the node's file system, which keeps {} in reserve and {} for the writes under way{others}",
            human(free),
            human(keep),
            human(wanted - keep),
        ))
    }

    /// The file system's size and free space, looked at again if the last look is older than
    /// [`FREE_CHECK`]; `None` without a directory or if it cannot be looked at.
    fn fs_now(&self) -> Option<(u64, u64)> {
        let now = self.epoch.elapsed().as_nanos() as u64 + 1;
        let checked = self.checked.load(Ordering::Acquire);
        if checked == 0 || now.saturating_sub(checked) > FREE_CHECK.as_nanos() as u64 {
            let dir = self.dir.read().unwrap_or_else(|e| e.into_inner()).clone();
            let (size, free) = trireme_store::fs_space(dir.as_deref()?).ok()?;
            self.fs_size.store(size, Ordering::Relaxed);
            self.free.store(free, Ordering::Relaxed);
            self.checked.store(now, Ordering::Release);
        }
        Some((
            self.fs_size.load(Ordering::Relaxed),
            self.free.load(Ordering::Relaxed),
        ))
    }

    /// The room now, with what the replicas provision and hold.
    pub(crate) fn space(&self, provisioned: u64, allocated: u64, replicas: u64) -> NodeSpace {
        let dir = self.dir.read().unwrap_or_else(|e| e.into_inner()).clone();
        let (fs_size, fs_free) = dir
            .as_deref()
            .and_then(|d| trireme_store::fs_space(d).ok())
            .unwrap_or((0, 0));
        let share = self.fs_share.load(Ordering::Relaxed);
        if let (Some(d), true) = (&dir, share > 0) {
            let taken = disk_usage(d);
            self.capacity
                .store(taken.saturating_add(fs_free / share), Ordering::Relaxed);
        }
        NodeSpace {
            capacity: self.capacity(),
            overcommit_milli: self.overcommit_milli.load(Ordering::Relaxed).max(1),
            provisioned,
            allocated,
            replicas,
            fs_size,
            fs_free,
        }
    }
}

/// Bytes the files under `dir` take on disk (allocated blocks, so holes count nothing).
fn disk_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut sum = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                todo.push(e.path());
            } else {
                sum = sum.saturating_add(m.blocks() * 512);
            }
        }
    }
    sum
}

/// Why `what` (`more` bytes of replicas) does not fit beside `s.provisioned`, with the
/// numbers.
pub(crate) fn refusal(s: &NodeSpace, what: &str, more: u64) -> String {
    let limit = s.limit();
    let ratio = s.overcommit_milli as f64 / 1000.0;
    let limit_text = match s.overcommit_milli {
        1000 => format!("its capacity of {}", human(s.capacity)),
        _ => format!(
            "{} (its capacity of {} times its over-commit limit of {ratio:.2})",
            human(limit),
            human(s.capacity)
        ),
    };
    format!(
        "no space: {what} {} does not fit, the node's replicas provision {} of {limit_text} ({} free to provision)",
        human(more),
        human(s.provisioned),
        human(limit.saturating_sub(s.provisioned))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_give_the_numbers() {
        let r = Room::default();
        r.set_capacity(256 << 20);
        let s = r.space(64 << 20, 1 << 20, 1);
        assert_eq!(
            refusal(&s, "a replica of", 1 << 30),
            "no space: a replica of 1.0 GiB does not fit, the node's replicas provision 64.0 MiB of its capacity of 256.0 MiB (192.0 MiB free to provision)"
        );
        r.set_overcommit(2.5);
        let s = r.space(600 << 20, 0, 3);
        assert_eq!(s.limit(), 640 << 20);
        assert_eq!(
            refusal(&s, "a replica of", 64 << 20),
            "no space: a replica of 64.0 MiB does not fit, the node's replicas provision 600.0 MiB of 640.0 MiB (its capacity of 256.0 MiB times its over-commit limit of 2.50) (40.0 MiB free to provision)"
        );
    }

    #[test]
    fn a_measured_capacity_is_what_the_directory_takes_plus_a_share_of_the_free_space() {
        let dir = std::env::temp_dir().join(format!("trireme-room-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/f"), vec![1u8; 1 << 20]).unwrap();
        let r = Room::default();
        r.set_dir(dir.clone());
        // Other writers on this file system move its free space: each measure is bracketed
        // by a read before and after.
        let measure = |nodes: u32| {
            let (_, before) = trireme_store::fs_space(&dir).unwrap();
            r.measure_capacity(nodes);
            let (_, after) = trireme_store::fs_space(&dir).unwrap();
            let n = u64::from(nodes);
            (r.capacity(), before.min(after) / n, before.max(after) / n)
        };
        for nodes in [1, 4] {
            let (c, lo, hi) = measure(nodes);
            // The megabyte written counts (and a little more for the file's own blocks).
            assert!(
                c >= (1 << 20) + lo && c <= (2 << 20) + hi,
                "{nodes} node(s): {c} not within 1 MiB + [{lo}, {hi}]"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
