//! The activity log: which extents of a volume may have writes in flight.
//!
//! When a writer dies, writes it had in flight may have reached some replicas and not others.
//! The next writer must make the replicas agree before it serves I/O, and without a record it
//! would have to compare the whole volume. So each replica keeps a log, as DRBD does: every write
//! it receives marks its extent (a coarse region, 4 MiB by default) *before* it is applied, and
//! the writer clears extents in which it has had no write in flight for a while (holding the
//! range, so no write races the clear). After an unclean writer change, the new writer compares
//! only the union of the replicas' marked extents.
//!
//! A write marks the log with one atomic OR, so the log costs the write path a map lookup and
//! no lock.
//!
//! **On disk** (a store with a [`Ledger`]: the file store), the log survives the node, as
//! DRBD's on-disk activity log does. The disk copy is a superset of the memory one:
//! * a write to an extent not marked on disk marks it there first (one 4 KiB page written and
//!   made durable) and only then is applied; extents already marked on disk cost nothing more,
//!   so a warm working set writes no log at all;
//! * clears reach the disk lazily, in [`ActivityLogs::sync`] (every second, by the node's
//!   bookkeeping task), and only after the replica's data and the peers' dirty records were
//!   made durable, and only for extents no write touched meanwhile. So whatever a crash loses
//!   from memory — unflushed writes, dirty marks not yet saved — lies inside an extent the
//!   disk log still shows, and a restarted node answers with that log.
//!
//! A volatile store keeps the log in memory only: a node that restarts answers "no log", and
//! the next writer then compares everything — slower, never wrong.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use trireme_proto::Extent;
use trireme_store::{Ledger, StoreError};

use crate::books::{self, LogHeader, WORDS_PER_PAGE};

/// Smallest extent a writer may ask for.
pub const MIN_EXTENT: u64 = 64 << 10;
/// Largest extent a writer may ask for.
pub const MAX_EXTENT: u64 = 1 << 30;
/// Most extents one volume's log may have (a 2 MiB bitmap).
pub const MAX_EXTENTS: u64 = 1 << 24;

#[derive(Debug)]
struct Log {
    /// Epoch of the writer that started it.
    epoch: u64,
    shift: u32,
    /// The volume's size (its last extent may be short).
    size: u64,
    bits: Vec<AtomicU64>,
    /// Extents written since the current sync began (see [`ActivityLogs::sync`]).
    touched: Vec<AtomicU64>,
    disk: Option<Disk>,
}

/// The log's copy on disk.
#[derive(Debug)]
struct Disk {
    ledger: Arc<dyn Ledger>,
    /// What the pages on disk say, or are to say: a write sets its bit here before it takes
    /// `lock`, so the page written next carries every mark asked for meanwhile.
    bits: Vec<AtomicU64>,
    /// What the pages on disk are known to say (each word as its page was last written in
    /// full). A write is applied only once its extent's bit is here.
    durable: Vec<AtomicU64>,
    /// Held while pages are written, so two writers never interleave a page.
    lock: Mutex<()>,
    /// One sync at a time.
    sync: Mutex<()>,
}

impl Disk {
    /// Writes a whole log, header and pages of `words`, in one durable write (a crash midway
    /// leaves pages that do not match the header, which read back as fully marked): the disk
    /// copy that then says `words`.
    fn write_whole(
        ledger: Arc<dyn Ledger>,
        header: &LogHeader,
        words: &[u64],
    ) -> Result<Disk, StoreError> {
        let mut b = books::encode_log_header(header);
        for (k, c) in words.chunks(WORDS_PER_PAGE).enumerate() {
            b.extend(books::encode_log_page(header.epoch, k as u32 + 1, c));
        }
        ledger.write_log(0, &b)?;
        Ok(Disk::new(ledger, words))
    }

    /// The disk copy of a log whose pages say `words`.
    fn new(ledger: Arc<dyn Ledger>, words: &[u64]) -> Disk {
        let atomic = || words.iter().map(|w| AtomicU64::new(*w)).collect();
        Disk {
            ledger,
            bits: atomic(),
            durable: atomic(),
            lock: Mutex::new(()),
            sync: Mutex::new(()),
        }
    }

    /// Writes bitmap page `n` (1-based) from `bits`; the caller holds `lock`. After a failed
    /// write the page may say the old words, the new ones or nothing readable (all marked):
    /// `durable` keeps only what both say.
    fn write_page(&self, epoch: u64, n: usize) -> Result<(), StoreError> {
        let first = (n - 1) * WORDS_PER_PAGE;
        let last = (first + WORDS_PER_PAGE).min(self.bits.len());
        let words: Vec<u64> = self.bits[first..last]
            .iter()
            .map(|w| w.load(Ordering::SeqCst))
            .collect();
        let written = self
            .ledger
            .write_log(n as u64, &books::encode_log_page(epoch, n as u32, &words));
        for (d, w) in self.durable[first..last].iter().zip(&words) {
            match written {
                Ok(()) => d.store(*w, Ordering::SeqCst),
                Err(_) => _ = d.fetch_and(*w, Ordering::SeqCst),
            };
        }
        written
    }

    /// Makes extents `first..=last` marked on disk (they are set in `bits`): waits for the
    /// page writer, then writes the pages that do not yet say so. Marks asked for while a page
    /// was being written go out together in the next write, so a burst of writes to cold
    /// extents costs a few syncs, not one each (a group commit).
    fn mark(&self, epoch: u64, first: u64, last: u64) -> Result<(), StoreError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut pages = Vec::new();
        for k in first..=last {
            let (w, bit) = ((k / 64) as usize, 1u64 << (k % 64));
            if w < self.durable.len() && self.durable[w].load(Ordering::SeqCst) & bit == 0 {
                pages.push(w / WORDS_PER_PAGE + 1);
            }
        }
        pages.dedup();
        for n in pages {
            // Not on disk after a failure: this write fails, and the next one here tries again.
            self.write_page(epoch, n)?;
        }
        Ok(())
    }
}

impl Log {
    fn new(epoch: u64, shift: u32, size: u64, words: &[u64]) -> Log {
        Log {
            epoch,
            shift,
            size,
            bits: words.iter().map(|w| AtomicU64::new(*w)).collect(),
            touched: words.iter().map(|_| AtomicU64::new(0)).collect(),
            disk: None,
        }
    }

    fn extents(&self) -> u64 {
        self.size.div_ceil(1 << self.shift)
    }

    fn is_set(&self, k: u64) -> bool {
        self.bits
            .get((k / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (k % 64)) != 0)
    }

    /// The marked extents as byte ranges.
    fn marked(&self) -> Vec<(u64, u64)> {
        let e = 1u64 << self.shift;
        (0..self.extents())
            .filter(|k| self.is_set(*k))
            .map(|k| (k * e, e.min(self.size - k * e)))
            .collect()
    }
}

/// What a query returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityView {
    /// 0 when the volume has no log on this node.
    pub epoch: u64,
    pub extent: u64,
    /// Marked extents as data, the rest as holes, covering the queried range.
    pub extents: Vec<Extent>,
}

/// The activity logs of every volume on this node.
#[derive(Debug, Default)]
pub struct ActivityLogs {
    logs: RwLock<HashMap<u64, Arc<Log>>>,
}

impl ActivityLogs {
    fn get(&self, volume: u64) -> Option<Arc<Log>> {
        self.logs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
    }

    /// Starts an empty log for the writer of `epoch`, replacing any older one. With a ledger
    /// the empty log is on disk when this returns; the caller has made everything the old log
    /// covered durable first (the replica's data, the peers' dirty records).
    pub fn start(
        &self,
        volume: u64,
        epoch: u64,
        extent: u64,
        size: u64,
        ledger: Option<Arc<dyn Ledger>>,
    ) -> Result<(), String> {
        if !extent.is_power_of_two() || !(MIN_EXTENT..=MAX_EXTENT).contains(&extent) {
            return Err(format!(
                "activity-log extent {extent} is not a power of two from {MIN_EXTENT} to {MAX_EXTENT}"
            ));
        }
        let n = size.div_ceil(extent);
        if n > MAX_EXTENTS {
            return Err(format!(
                "activity log of {n} extents is too large (at most {MAX_EXTENTS}); use larger extents"
            ));
        }
        let words = vec![0u64; n.div_ceil(64) as usize];
        let mut log = Log::new(epoch, extent.trailing_zeros(), size, &words);
        if let Some(ledger) = ledger {
            let header = LogHeader {
                volume,
                size,
                shift: log.shift,
                epoch,
            };
            log.disk = Some(
                Disk::write_whole(ledger, &header, &words)
                    .map_err(|e| format!("starting the activity log on disk: {e}"))?,
            );
        }
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, Arc::new(log));
        Ok(())
    }

    /// Loads the log `ledger` kept for `volume` (at the node's start) and returns its marked
    /// extents as byte ranges: `None` when there is no usable log (then nothing bounds where
    /// writes went before the restart).
    pub fn load(
        &self,
        volume: u64,
        size: u64,
        ledger: Arc<dyn Ledger>,
    ) -> Result<Option<Vec<(u64, u64)>>, String> {
        let bytes = ledger.read_log().map_err(|e| e.to_string())?;
        let Some(d) = books::decode_log(&bytes, volume).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        if d.header.size != size {
            return Err(format!(
                "the log describes {} bytes, the replica has {size}",
                d.header.size
            ));
        }
        if d.assumed_pages > 0 {
            tracing::warn!(
                volume,
                pages = d.assumed_pages,
                "activity log pages unreadable (torn or stale): their extents count as written"
            );
        }
        let mut log = Log::new(d.header.epoch, d.header.shift, size, &d.words);
        log.disk = Some(Disk::new(ledger, &d.words));
        let marked = log.marked();
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, Arc::new(log));
        Ok(Some(marked))
    }

    /// A write of `[offset, offset+len)` arrived: marks its extents. Called before the write is
    /// applied, so a replica never holds a write its log does not show — on disk too: an
    /// extent not yet marked there is written first. An error means the write must not be
    /// applied.
    pub fn on_write(&self, volume: u64, offset: u64, len: u64) -> Result<(), StoreError> {
        let Some(log) = self.get(volume) else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let first = offset >> log.shift;
        let last = ((offset + len - 1) >> log.shift).min(log.extents().saturating_sub(1));
        let mut cold = false;
        for k in first..=last {
            let (w, bit) = ((k / 64) as usize, 1u64 << (k % 64));
            let Some(word) = log.bits.get(w) else {
                continue;
            };
            word.fetch_or(bit, Ordering::AcqRel);
            if let Some(d) = &log.disk {
                // Touched before the disk bit is looked at: a sync that clears this extent
                // on disk meanwhile sees the touch and puts it back before writing the page.
                log.touched[w].fetch_or(bit, Ordering::SeqCst);
                // Set in `bits` but not yet durable: another write's page is on its way
                // and may not carry it; wait for it rather than run ahead of the disk. A
                // warm extent costs two loads, no store.
                let on_disk =
                    d.bits[w].load(Ordering::SeqCst) & d.durable[w].load(Ordering::SeqCst);
                if on_disk & bit == 0 {
                    // Asked for before the page writer is waited for, so a page written
                    // meanwhile carries it.
                    d.bits[w].fetch_or(bit, Ordering::SeqCst);
                    cold = true;
                }
            }
        }
        match &log.disk {
            Some(d) if cold => d.mark(log.epoch, first, last),
            _ => Ok(()),
        }
    }

    /// Clears the extents lying wholly inside `[offset, offset+len)` (in memory; the disk
    /// follows at the next [`ActivityLogs::sync`]).
    pub fn clear(&self, volume: u64, offset: u64, len: u64) {
        let Some(log) = self.get(volume) else { return };
        let extent = 1u64 << log.shift;
        let first = offset.div_ceil(extent);
        // The last extent may be short: it is wholly inside when the range reaches the end.
        let stop = offset + len;
        let end = if stop >= log.size {
            log.extents()
        } else {
            stop >> log.shift
        };
        for k in first..end {
            if let Some(w) = log.bits.get((k / 64) as usize) {
                w.fetch_and(!(1 << (k % 64)), Ordering::AcqRel);
            }
        }
    }

    /// Brings the disk copy of `volume`'s log down to the memory one: extents cleared in
    /// memory and not written since the previous sync are cleared on disk — once
    /// `make_durable` (the replica's flush and the dirty records' save) has succeeded, so no
    /// crash can lose a write the disk log no longer shows. Returns whether there was anything
    /// to clear (and so `make_durable` ran).
    pub fn sync(
        &self,
        volume: u64,
        make_durable: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<bool, StoreError> {
        let Some(log) = self.get(volume) else {
            return Ok(false);
        };
        let Some(d) = &log.disk else {
            return Ok(false);
        };
        let _s = d.sync.lock().unwrap_or_else(|e| e.into_inner());
        // Writes from here on are in `touched`.
        for t in &log.touched {
            t.store(0, Ordering::SeqCst);
        }
        // An extent is a candidate when it is marked on disk and cleared in memory. The writer
        // clears an extent only once no write of its is in flight there, and a write sets the
        // memory bit before anything else: so every write to a candidate that arrived before
        // this point has completed, and its data and dirty marks are in what `make_durable`
        // saves. Those that arrive later are in `touched`, and stay.
        let candidates: Vec<u64> = (0..d.bits.len())
            .map(|w| d.bits[w].load(Ordering::SeqCst) & !log.bits[w].load(Ordering::SeqCst))
            .collect();
        if candidates.iter().all(|c| *c == 0) {
            return Ok(false);
        }
        make_durable()?;
        let _g = d.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut pages = Vec::new();
        for (w, c) in candidates.iter().enumerate() {
            // Written again meanwhile: those stay.
            let clear = c & !log.touched[w].load(Ordering::SeqCst);
            if clear == 0 {
                continue;
            }
            d.bits[w].fetch_and(!clear, Ordering::SeqCst);
            // A write that touched one of these after we looked, and saw its disk bit still
            // set, skipped the disk: keep its extent.
            let again = log.touched[w].load(Ordering::SeqCst) & clear;
            d.bits[w].fetch_or(again, Ordering::SeqCst);
            if clear & !again != 0 && pages.last() != Some(&(w / WORDS_PER_PAGE + 1)) {
                pages.push(w / WORDS_PER_PAGE + 1);
            }
        }
        for n in pages {
            d.write_page(log.epoch, n)?;
        }
        Ok(true)
    }

    /// The log of `volume` for a replica resized to `size`: every mark is kept (new extents
    /// start unmarked, extents past a smaller end go), the disk copy rewritten whole, header
    /// and pages in one durable write, before this returns. The caller keeps writes out.
    pub fn resize(&self, volume: u64, size: u64) -> Result<(), String> {
        let Some(old) = self.get(volume) else {
            return Ok(());
        };
        let n = size.div_ceil(1 << old.shift);
        if n > MAX_EXTENTS {
            return Err(format!(
                "an activity log of {n} extents is too large (at most {MAX_EXTENTS})"
            ));
        }
        let keep = |bits: &[AtomicU64]| -> Vec<u64> {
            let mut words: Vec<u64> = (0..n.div_ceil(64) as usize)
                .map(|w| bits.get(w).map_or(0, |b| b.load(Ordering::SeqCst)))
                .collect();
            if !n.is_multiple_of(64) {
                if let Some(last) = words.last_mut() {
                    *last &= (1u64 << (n % 64)) - 1;
                }
            }
            words
        };
        let mut log = Log::new(old.epoch, old.shift, size, &keep(&old.bits));
        if let Some(d) = &old.disk {
            let _s = d.sync.lock().unwrap_or_else(|e| e.into_inner());
            let _g = d.lock.lock().unwrap_or_else(|e| e.into_inner());
            let words = keep(&d.bits);
            let header = LogHeader {
                volume,
                size,
                shift: old.shift,
                epoch: old.epoch,
            };
            log.disk = Some(
                Disk::write_whole(d.ledger.clone(), &header, &words)
                    .map_err(|e| format!("rewriting the activity log on disk: {e}"))?,
            );
        }
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, Arc::new(log));
        Ok(())
    }

    /// Extents marked on disk for `volume` (for tests and status).
    pub fn marked_on_disk(&self, volume: u64) -> Option<usize> {
        let log = self.get(volume)?;
        let d = log.disk.as_ref()?;
        Some(
            d.bits
                .iter()
                .map(|w| w.load(Ordering::Acquire).count_ones() as usize)
                .sum(),
        )
    }

    pub fn query(&self, volume: u64, offset: u64, len: u64) -> ActivityView {
        match self.get(volume) {
            None => ActivityView {
                epoch: 0,
                extent: 0,
                extents: trireme_store::extents_from(offset, len, MIN_EXTENT, |_| false),
            },
            Some(log) => {
                let extent = 1u64 << log.shift;
                ActivityView {
                    epoch: log.epoch,
                    extent,
                    extents: trireme_store::extents_from(offset, len, extent, |k| log.is_set(k)),
                }
            }
        }
    }

    /// Forgets a deleted volume's log.
    pub fn forget(&self, volume: u64) {
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&volume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = MIN_EXTENT;

    fn marked(l: &ActivityLogs, len: u64) -> Vec<(u64, u64)> {
        trireme_proto::data_ranges(&l.query(1, 0, len).extents, 0)
    }

    #[test]
    fn writes_mark_their_extents_and_clears_take_whole_ones() {
        let l = ActivityLogs::default();
        l.on_write(1, 0, 4096).unwrap();
        assert_eq!(l.query(1, 0, E).epoch, 0, "no log yet");
        l.start(1, 7, E, 100 * E, None).unwrap();
        l.on_write(1, 3 * E - 1, 2).unwrap(); // straddles extents 2 and 3
        l.on_write(1, 70 * E, 1).unwrap(); // in the second bitmap word
        l.on_write(2, 0, E).unwrap(); // another volume
        assert_eq!(marked(&l, 100 * E), vec![(2 * E, 2 * E), (70 * E, E)]);
        let v = l.query(1, 0, E);
        assert_eq!((v.epoch, v.extent), (7, E));
        l.clear(1, E / 2, 3 * E); // wholly covers extents 1 and 2 only
        assert_eq!(marked(&l, 100 * E), vec![(3 * E, E), (70 * E, E)]);
        l.start(1, 8, E, 100 * E, None).unwrap();
        assert_eq!(marked(&l, 100 * E), vec![], "a new writer starts empty");
        l.forget(1);
        assert_eq!(l.query(1, 0, E).epoch, 0);
    }

    #[test]
    fn the_short_last_extent_is_marked_and_cleared() {
        let l = ActivityLogs::default();
        let size = 10 * E + 4096;
        l.start(1, 1, E, size, None).unwrap();
        l.on_write(1, size - 4096, 4096).unwrap();
        assert_eq!(marked(&l, 11 * E), vec![(10 * E, E)]);
        l.clear(1, 10 * E + 1, 4095);
        assert_eq!(marked(&l, 11 * E), vec![(10 * E, E)], "not wholly inside");
        l.clear(1, 10 * E, 4096);
        assert_eq!(marked(&l, 11 * E), vec![]);
    }

    /// A log kept in memory whose page writes can be held at a gate, or fail.
    #[derive(Debug, Default)]
    struct GatedLedger {
        log: Mutex<Vec<u8>>,
        writes: AtomicU64,
        closed: Mutex<bool>,
        opened: std::sync::Condvar,
        fail: std::sync::atomic::AtomicBool,
    }

    impl GatedLedger {
        fn gate(&self, closed: bool) {
            *self.closed.lock().unwrap() = closed;
            self.opened.notify_all();
        }
    }

    impl Ledger for GatedLedger {
        fn read_log(&self) -> Result<Vec<u8>, StoreError> {
            Ok(self.log.lock().unwrap().clone())
        }
        fn write_log(&self, first: u64, pages: &[u8]) -> Result<(), StoreError> {
            let mut closed = self.closed.lock().unwrap();
            while *closed {
                closed = self.opened.wait(closed).unwrap();
            }
            self.writes.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Invalid("injected".into()));
            }
            trireme_store::ledger::put_pages(&mut self.log.lock().unwrap(), first, pages);
            Ok(())
        }
        fn read_records(&self) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(None)
        }
        fn save_records(&self, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
        fn read_held(&self) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(None)
        }
        fn create_held(&self, _: u64) -> Result<(), StoreError> {
            Ok(())
        }
        fn write_held(&self, _: &[(u64, &[u8])]) -> Result<(), StoreError> {
            Ok(())
        }
        fn read_live_held(&self) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(None)
        }
        fn start_live_held(&self, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
        fn write_live_held(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// A log on `ledger` (100 extents), and the ledger's page writes so far.
    fn gated() -> (Arc<ActivityLogs>, Arc<GatedLedger>) {
        let (l, g) = (
            Arc::new(ActivityLogs::default()),
            Arc::new(GatedLedger::default()),
        );
        l.start(1, 7, E, 100 * E, Some(g.clone())).unwrap();
        (l, g)
    }

    /// What a node restarted from `g` finds marked.
    fn reloaded(g: &Arc<GatedLedger>) -> Vec<(u64, u64)> {
        ActivityLogs::default()
            .load(1, 100 * E, g.clone())
            .unwrap()
            .unwrap()
    }

    fn spawn_write(l: &Arc<ActivityLogs>, k: u64) -> std::thread::JoinHandle<()> {
        let l = l.clone();
        std::thread::spawn(move || l.on_write(1, k * E + 4096, 4096).unwrap())
    }

    #[test]
    fn marks_asked_for_during_a_page_write_go_out_together() {
        let (l, g) = gated();
        let before = g.writes.load(Ordering::SeqCst);
        g.gate(true);
        let first = spawn_write(&l, 0);
        let rest: Vec<_> = (1..=8).map(|k| spawn_write(&l, k)).collect();
        // Every write has asked for its mark and waits behind the first page write.
        std::thread::sleep(std::time::Duration::from_millis(300));
        g.gate(false);
        first.join().unwrap();
        rest.into_iter().for_each(|t| t.join().unwrap());
        let writes = g.writes.load(Ordering::SeqCst) - before;
        // One page write each would be 9; the first and then all the others together is 2.
        assert!(writes <= 3, "{writes} page writes for 9 marks");
        assert_eq!(reloaded(&g), (0..9).map(|k| (k * E, E)).collect::<Vec<_>>());
    }

    #[test]
    fn a_write_waits_for_the_mark_another_write_is_making() {
        let (l, g) = gated();
        g.gate(true);
        let first = spawn_write(&l, 3);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let second = {
            let (l, done) = (l.clone(), done.clone());
            std::thread::spawn(move || {
                l.on_write(1, 3 * E, 4096).unwrap();
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !done.load(Ordering::SeqCst),
            "a write to an extent went ahead while its mark was not yet on disk"
        );
        g.gate(false);
        first.join().unwrap();
        second.join().unwrap();
        assert_eq!(reloaded(&g), vec![(3 * E, E)]);
    }

    #[test]
    fn a_failed_mark_fails_its_write_and_the_next_write_marks_again() {
        let (l, g) = gated();
        g.fail.store(true, Ordering::SeqCst);
        assert!(l.on_write(1, 5 * E, 4096).is_err());
        assert!(l.on_write(1, 5 * E, 4096).is_err(), "not taken as marked");
        g.fail.store(false, Ordering::SeqCst);
        let before = g.writes.load(Ordering::SeqCst);
        l.on_write(1, 5 * E, 4096).unwrap();
        l.on_write(1, 5 * E + 8192, 4096).unwrap();
        assert_eq!(g.writes.load(Ordering::SeqCst) - before, 1, "marked once");
        assert_eq!(reloaded(&g), vec![(5 * E, E)]);
    }

    #[test]
    fn bad_extent_sizes_are_refused() {
        let l = ActivityLogs::default();
        assert!(l.start(1, 1, 3 * E, E, None).is_err());
        assert!(l.start(1, 1, E / 2, E, None).is_err());
        assert!(l.start(1, 1, E, E * (MAX_EXTENTS + 1), None).is_err());
        assert_eq!(l.query(1, 0, E).epoch, 0, "nothing started");
    }
}
