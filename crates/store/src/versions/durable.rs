//! Making a replica's versions durable: the main file and the snapshots' files, the redirect
//! log's records and checkpoints, giving freed blocks back, folding back to plain (the
//! pool's growth is in `grow`; the module docs of `versions` say in which order, and why).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::files::Files;
use super::table::{self, Entry, Map, Table, BLOCK};
use super::{format, version_error, VersionedReplica};
use crate::{StoreError, GRAIN};

/// Grains given back to the file system per hold of the gate.
const PUNCH_GRAINS: u64 = 32;
/// The most bytes of freed blocks given back to the file system per second: a snapshot
/// holding 1 GiB of its own goes back in about two seconds, and a slow device is not handed
/// a storm of deallocations all at once. The manager's wait for a delete counts on it.
pub(super) const GIVE_BACK_RATE: u64 = trireme_proto::GIVE_BACK_RATE;

/// Block ranges (whole grains) freed and held off the free list until their space is given
/// back ([`VersionedReplica::give_back`]).
#[derive(Debug, Default)]
#[must_use]
pub(super) struct Holes(Vec<(u64, u64)>);

impl VersionedReplica {
    /// Writes the main file (the head's map and the snapshot list). The physical replica must
    /// have been flushed since the blocks the head names were written.
    pub(super) fn persist_main(&self) -> Result<(), StoreError> {
        self.persist_main_then(false)
    }

    /// As [`VersionedReplica::persist_main`]; with `flush`, the physical replica is flushed
    /// after the head is taken and before the file is written, for a caller whose I/O goes
    /// on (a fold): the head names only blocks whose writes were done when it was taken.
    fn persist_main_then(&self, flush: bool) -> Result<(), StoreError> {
        let _p = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        self.dirty.store(false, Ordering::Release);
        let Some(f) = &self.files else {
            return Ok(());
        };
        // The snapshots only the log holds get their files first, oldest first: each is a
        // diff against the one before it. One deleted meanwhile needs none.
        let unsaved = std::mem::take(&mut *self.unsaved());
        let mut by_gen: Vec<(u64, u64)> = {
            let t = self.table();
            unsaved
                .iter()
                .filter_map(|id| t.snaps.get(id).map(|s| (s.gen, *id)))
                .collect()
        };
        by_gen.sort_unstable();
        // Until the main file lists them, they stay to be saved.
        let failed = |e: StoreError| {
            self.unsaved().extend(by_gen.iter().map(|&(_, id)| id));
            self.dirty.store(true, Ordering::Release);
            e
        };
        for &(_, id) in &by_gen {
            self.persist_snap(id).map_err(failed)?;
        }
        let (gen, head, mut listed, applied, blocks, homes) = {
            let t = self.table();
            let listed: Vec<(u64, table::Snap)> =
                t.snaps.iter().map(|(id, s)| (*id, s.clone())).collect();
            // Under the table's lock: every record up to this one is in this head.
            (
                t.gen,
                t.head.clone(),
                listed,
                self.seq.load(Ordering::Acquire),
                t.blocks,
                t.homes,
            )
        };
        if flush {
            self.inner.flush().map_err(failed)?;
        }
        listed.sort_by_key(|(_, s)| s.gen);
        let (base, base_map) = listed
            .last()
            .map_or((0, Map::new()), |(id, s)| (*id, s.map.clone()));
        let m = format::Main {
            flags: match self.closed.load(Ordering::Acquire) {
                true => 0,
                false => format::FLAG_OPEN,
            },
            volume: self.vol(),
            size: blocks * BLOCK,
            homes: homes * BLOCK,
            gen,
            base,
            applied,
            snaps: listed
                .iter()
                .map(|(id, s)| format::Listed {
                    id: *id,
                    gen: s.gen,
                    created: s.created,
                    size: s.blocks * BLOCK,
                })
                .collect(),
            head: format::diff(&base_map, &head),
        };
        f.save(&f.main(), &format::encode_main(&m))
            .map_err(failed)?;
        self.main_entries
            .store(m.head.len() as u64, Ordering::Release);
        Ok(())
    }

    /// Writes snapshot `id`'s file as a diff against the snapshot before it.
    pub(super) fn persist_snap(&self, id: u64) -> Result<(), StoreError> {
        let Some(f) = &self.files else {
            return Ok(());
        };
        let (base, base_map, map) = {
            let t = self.table();
            let s = t.snaps.get(&id).ok_or(StoreError::NoSnapshot {
                volume: self.vol(),
                id,
            })?;
            let before = t
                .snaps
                .iter()
                .filter(|(_, o)| o.gen < s.gen)
                .max_by_key(|(_, o)| o.gen)
                .map_or((0, Map::new()), |(id, o)| (*id, o.map.clone()));
            (before.0, before.1, s.map.clone())
        };
        let file = format::SnapFile {
            volume: self.vol(),
            id,
            base,
            records: format::diff(&base_map, &map),
        };
        f.save(&f.snap(id), &format::encode_snap(&file))
    }

    /// With the gate held exclusive (or before anything is served): the physical flush, the
    /// main file, then an empty redirect log (the main file holds all it held).
    pub(super) fn checkpoint_locked(&self) -> Result<(), StoreError> {
        self.inner.flush()?;
        self.persist_and_empty_log()
    }

    /// With the gate held exclusive, the physical replica flushed since the head last changed:
    /// the main file, then both redirect logs empty.
    pub(super) fn persist_and_empty_log(&self) -> Result<(), StoreError> {
        self.persist_main()?;
        let mut other_full = self.folding.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &self.files {
            f.truncate_log(0)?;
            f.truncate_log(1)?;
        }
        *other_full = false;
        self.slot.store(0, Ordering::Release);
        Ok(())
    }

    /// Records in the log taking them past [`super::LOG_SLOTS`], or past the main file's
    /// head if it holds more.
    fn log_full(&self) -> bool {
        self.slot.load(Ordering::Acquire)
            >= self
                .log_slots
                .max(self.main_entries.load(Ordering::Acquire))
    }

    /// With the gate held shared (I/O going on), after the physical flush: if the log taking
    /// records is full, folds it into the main file. Records go to the other log from the
    /// switch on (which waits for the appends under way), so every record left in this one
    /// is in the head the main file is then written from; once that file is written, this
    /// log is emptied, ready for the next switch. A fold that fails keeps its log as it is,
    /// and the next one writes the main file again before it switches back. One fold at a
    /// time: a flush that finds one under way leaves it to it.
    pub(super) fn fold(&self) -> Result<(), StoreError> {
        let Some(f) = &self.files else {
            return Ok(());
        };
        let Ok(mut other_full) = self.folding.try_lock() else {
            return Ok(());
        };
        if !*other_full {
            if !self.log_full() {
                return Ok(());
            }
            let mut side = self.log_side.write().unwrap_or_else(|e| e.into_inner());
            *side ^= 1;
            self.slot.store(0, Ordering::Release);
            *other_full = true;
        }
        let retired = *self.log_side.read().unwrap_or_else(|e| e.into_inner()) ^ 1;
        let t0 = std::time::Instant::now();
        self.persist_main_then(true)?;
        f.truncate_log(retired)?;
        *other_full = false;
        tracing::debug!(
            volume = self.vol(),
            entries = self.main_entries.load(Ordering::Acquire),
            ms = t0.elapsed().as_millis() as u64,
            "redirect log folded into the main file"
        );
        Ok(())
    }

    /// The redirect-log record of the head's change of `l`: `t` is the table just changed,
    /// still locked, so one block's records get sequences in the order its entry changed.
    /// [`VersionedReplica::log`] writes it before the write that made it is answered.
    pub(super) fn record(&self, t: &Table, l: u64) -> format::LogRecord {
        self.record_entry(l, t.entry(&t.head, l))
    }

    /// As [`VersionedReplica::record`], with the head's new entry for `l` known; the caller
    /// still holds the table's lock.
    pub(super) fn record_entry(&self, l: u64, e: Entry) -> format::LogRecord {
        format::LogRecord::Block {
            seq: self.seq.fetch_add(1, Ordering::AcqRel) + 1,
            block: l,
            entry: e,
        }
    }

    /// Writes the main file if there is none (a plain replica: the identity, no snapshot),
    /// so that a snapshot finds one to be logged against ([`VersionedReplica::log_snapshot`])
    /// and does not write its files while I/O waits. Not fatal: without it, the first
    /// snapshot writes them.
    pub(super) fn ensure_main(&self) {
        let Some(f) = &self.files else {
            return;
        };
        if f.main().exists() {
            return;
        }
        if let Err(e) = self.persist_main() {
            tracing::warn!(volume = self.vol(), "writing the versions' main file: {e}");
        }
    }

    pub(super) fn unsaved(&self) -> MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.unsaved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With the gate held exclusive, snapshot `id` just taken in the table and a main file on
    /// disk: the snapshot's record in the redirect log, synced with every record before it if
    /// `synced` (the caller flushed the data). Its file and the main file listing it are
    /// written at the next flush or checkpoint.
    pub(super) fn log_snapshot(
        &self,
        f: &Files,
        id: u64,
        created: u64,
        synced: bool,
    ) -> Result<(), StoreError> {
        let r = format::LogRecord::Snapshot {
            seq: self.seq.fetch_add(1, Ordering::AcqRel) + 1,
            id,
            created,
            synced,
        };
        self.log(&[r])?;
        if synced {
            f.sync_log()?;
        }
        self.unsaved().insert(id);
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes `records` to the redirect log, in one write at slots of their own (replay
    /// orders records by sequence, not by slot).
    pub(super) fn log(&self, records: &[format::LogRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        // Held through the append: a fold's switch waits for it.
        let side = self.log_side.read().unwrap_or_else(|e| e.into_inner());
        let slot = self.slot.fetch_add(records.len() as u64, Ordering::AcqRel);
        if let Some(f) = &self.files {
            f.append(*side, slot, records)?;
        }
        drop(side);
        // After the append: a flush that finds the head clean has synced every record
        // appended before it looked ([`VersionedReplica::persist_head`]).
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// After the physical flush, with the head changed since the last: makes its changes
    /// durable. The redirect log holds each one, so syncing the log is enough, and costs
    /// the same however many blocks the head has moved; the main file, which holds the whole
    /// head, is written at checkpoints (a full log, a close, a snapshot's delete) and when
    /// the log holds a snapshot the main file does not list (an unsynced snapshot's record
    /// is dropped at a reopen unless the main file lists it).
    pub(super) fn persist_head(&self) -> Result<(), StoreError> {
        let Some(f) = &self.files else {
            self.dirty.store(false, Ordering::Release);
            return Ok(());
        };
        if !self.unsaved().is_empty() {
            return self.persist_main();
        }
        self.dirty.store(false, Ordering::Release);
        f.sync_log()
            .inspect_err(|_| self.dirty.store(true, Ordering::Release))
    }

    /// With the gate held exclusive: makes the dropped blocks' changes durable and frees
    /// them. Those in whole grains are held off the free list: the [`Holes`] returned give
    /// their space back to the file system once the caller has let go of the gate
    /// ([`VersionedReplica::give_back`]), so no I/O waits on it.
    ///
    /// `checkpointed`: the caller has just flushed the physical replica and written the main
    /// file under the same hold of the gate, so the drops are durable already.
    pub(super) fn settle_locked(&self, checkpointed: bool) -> Result<Holes, StoreError> {
        if self.table().pending() == 0 {
            self.fold_back_if_identity()?;
            return Ok(Holes::default());
        }
        if !checkpointed {
            self.checkpoint_locked()?;
        }
        let mut done = self.table().settle();
        done.sort_unstable();
        let holes = self.hold(&done);
        if self.table().is_identity() {
            // The pool goes whole: nothing to punch.
            self.fold_back()?;
            return Ok(Holes::default());
        }
        Ok(holes)
    }

    /// Holds the whole grains among the free blocks `blocks` (sorted) off the free list, in
    /// pieces of [`PUNCH_GRAINS`]: their space to give back. Smaller runs are overwritten
    /// before reuse.
    pub(super) fn hold(&self, blocks: &[u64]) -> Holes {
        let per_grain = GRAIN / BLOCK;
        let mut holes = Holes::default();
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            let (a, b) = (
                blocks[i].div_ceil(per_grain),
                (blocks[j - 1] + 1) / per_grain,
            );
            let mut g = a;
            while g < b {
                let e = (g + PUNCH_GRAINS).min(b);
                holes.0.push((g * per_grain, e * per_grain));
                g = e;
            }
            i = j;
        }
        let mut t = self.table();
        for &(a, b) in &holes.0 {
            t.hold(a..b);
        }
        holes
    }

    /// The free blocks' space, held to be given back: at open, where a crash may have left
    /// some of it not given back yet (giving back twice costs a look at a hole).
    pub(super) fn hold_free(&self) -> Holes {
        let free = self.table().free_list();
        self.hold(&free)
    }

    /// Gives the space of `holes` back to the file system, a piece at a time under the gate
    /// held shared, at most `rate` bytes a second ([`GIVE_BACK_RATE`] once I/O is served):
    /// I/O goes on meanwhile, and a snapshot, delete or reuse of freed blocks waits for one
    /// piece at most. A piece the pool took back meanwhile (it needed the blocks) is skipped, and so
    /// is all that is left once the replica is closed.
    pub(super) fn give_back(&self, holes: Holes, rate: Option<u64>) {
        let started = std::time::Instant::now();
        let mut given = 0u64;
        for (a, b) in holes.0 {
            {
                let _g = self.shared();
                if self.closed.load(Ordering::Acquire) || !self.table().held(a..b) {
                    continue;
                }
                let r = self
                    .inner
                    .write_zeroes(a * BLOCK, (b - a) * BLOCK, true, false);
                self.table().unhold(a..b);
                if let Err(e) = r {
                    // Said once: the rest would fail alike (a replica deleted meanwhile).
                    tracing::warn!(volume = self.vol(), "giving freed blocks back: {e}");
                    self.table().unhold_all();
                    return;
                }
            }
            given += (b - a) * BLOCK;
            let Some(rate) = rate else { continue };
            let due = std::time::Duration::from_secs_f64(given as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }

    /// Drops snapshot `id` under the gate held exclusive: its blocks' space to give back.
    pub(super) fn delete_locked(&self, id: u64) -> Result<Holes, StoreError> {
        let _g = self.exclusive();
        let next = {
            let mut t = self.table();
            let gen = t.snaps.get(&id).map(|s| s.gen);
            let next = gen.and_then(|g| {
                t.snaps
                    .iter()
                    .filter(|(_, s)| s.gen > g)
                    .min_by_key(|(_, s)| s.gen)
                    .map(|(id, _)| *id)
            });
            t.delete(id).map_err(|e| version_error(self.vol(), e))?;
            next
        };
        // The snapshot after it is a diff against it on disk: rewritten against the one
        // before, then the list without it (and the head, its redirects' bytes flushed
        // first), then its file goes.
        if let Some(next) = next {
            self.persist_snap(next)?;
        }
        self.checkpoint_locked()?;
        if let Some(f) = &self.files {
            let _ = std::fs::remove_file(f.snap(id));
        }
        self.settle_locked(true)
    }

    pub(super) fn fold_back_if_identity(&self) -> Result<(), StoreError> {
        let identity = self.table().is_identity();
        if identity && !self.plain.load(Ordering::Acquire) {
            return self.fold_back();
        }
        Ok(())
    }

    /// With the gate held exclusive and the table the identity: drops the pool and the files,
    /// so the replica is plain again. A crash in between leaves the main
    /// file naming the logical size, with the physical replica of that size or larger.
    pub(super) fn fold_back(&self) -> Result<(), StoreError> {
        let size = self.size.load(Ordering::Acquire);
        if self.inner.size() != size {
            self.inner.resize(size)?;
        }
        let blocks = size / BLOCK;
        *self.table() = Table::new(blocks, blocks);
        *self.reserved.lock().unwrap_or_else(|e| e.into_inner()) = 0..0;
        if let Some(f) = &self.files {
            f.remove_all();
        }
        *self.folding.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.plain.store(true, Ordering::Release);
        self.ensure_main();
        Ok(())
    }
}
