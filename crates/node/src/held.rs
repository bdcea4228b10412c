//! The held maps of the node's parity replicas (issue 67): which 4 KiB blocks each holds,
//! exactly, so that a writer that restarts rebuilds a parity region's overlay from what its
//! mirrors say (`trireme_store::held`, ARCHITECTURE.md "The overlay after a crash").
//!
//! A replica keeps one when it was created with `FLAG_HELD`; its ledger's held file says so
//! after a restart. The rules, each for a crash at the worst moment:
//!
//! | event | in memory and in the live copy | on disk |
//! |---|---|---|
//! | a write (or zeroes written) | its blocks set once the store took it | at the next flush |
//! | a flush | — | the changed pages, after the data they describe is durable |
//! | a trim | its whole blocks cleared | cleared before the bytes are punched |
//! | a trim that leaves its store grain with no block held | widened over the whole grain | the same |
//!
//! The live copy (`Ledger::write_live_held`) is the map as memory holds it, written before
//! the request is answered and never synced: after a crash of the node's process, the next
//! one in the same boot takes it whole, so no acknowledged write loses its bit. After a power
//! loss it is not read: a block read as held holds the data written to it at its last
//! flush; one not held reads the stripe, which has the bytes the block had when it was last
//! acknowledged durable. A write whose flush never came may be lost with its bit then: it was
//! never durable.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use trireme_proto::{Extent, Status, MAX_HELD_QUERY};
use trireme_store::held::HeldMap;
use trireme_store::{Ledger, Replica, StoreError};

use crate::Refusal;

/// The map's grain.
const BLOCK: u64 = 4096;
/// The store's grain: what a trim punches whole once none of its blocks is held.
const GRAIN: u64 = trireme_store::GRAIN;

/// Every parity replica's held map, by volume.
#[derive(Debug, Default)]
pub(crate) struct HeldMaps {
    kept: RwLock<HashMap<u64, Arc<Kept>>>,
}

#[derive(Debug)]
struct Kept {
    /// `Err`: the map read back corrupt; the node cannot say what the replica holds.
    map: Mutex<Result<HeldMap, String>>,
    /// One writer of the map's pages at a time (see `HeldMap::take_pending`).
    flushing: Mutex<()>,
    /// Trims marked in the map so far: a trim's number is its count after its mark.
    trims: AtomicU64,
    /// The highest trim number a successful flush of the map's pages took in: every trim
    /// up to it is durable in the map.
    trims_durable: AtomicU64,
    /// Where the map is durable; `None` on a volatile store.
    ledger: Option<Arc<dyn Ledger>>,
    /// A write of the live copy failed: it no longer follows the map, so every later change
    /// fails its request (its writer takes the copy out) until the node opens the replica
    /// again and starts the copy anew.
    live_broken: AtomicBool,
    /// Store grains with a write between its data and its bits, and grains a trim punches
    /// whole ([`HeldMaps::writing`], [`HeldMaps::trimming`]).
    grains: Mutex<Grains>,
    /// Told when a trim is done punching its grains.
    punched: Condvar,
}

#[derive(Debug, Default)]
struct Grains {
    /// Writes under way, by grain.
    writing: HashMap<u64, u32>,
    punching: HashSet<u64>,
    /// Grains a write fills whole ([`Kept::filling`]): one of the writes counted.
    filling: HashSet<u64>,
}

impl Grains {
    /// Whether a write must wait before it takes `grain`: a trim punches it or a write fills it.
    fn busy(&self, grain: u64) -> bool {
        self.punching.contains(&grain) || self.filling.contains(&grain)
    }
}

/// A write's or a trim's hold on store grains of a parity replica, let go when dropped.
#[derive(Debug)]
pub(crate) struct GrainTurn {
    kept: Arc<Kept>,
    hold: Hold,
}

#[derive(Debug)]
enum Hold {
    /// A write's grains, one after another.
    Writing(std::ops::Range<u64>),
    /// The grains a trim punches whole: at most one at either end.
    Punching(Vec<u64>),
    /// The one grain a write fills whole, alone.
    Filling(u64),
}

impl GrainTurn {
    /// The grain this turn fills whole, if it is a fill's.
    pub(crate) fn filled(&self) -> Option<u64> {
        match self.hold {
            Hold::Filling(grain) => Some(grain),
            _ => None,
        }
    }
}

impl Drop for GrainTurn {
    fn drop(&mut self) {
        let mut g = self.kept.grains.lock().unwrap_or_else(|e| e.into_inner());
        match &self.hold {
            Hold::Writing(grains) => {
                for grain in grains.clone() {
                    if let Some(n) = g.writing.get_mut(&grain) {
                        *n -= 1;
                        if *n == 0 {
                            g.writing.remove(&grain);
                        }
                    }
                }
            }
            Hold::Punching(grains) => {
                for grain in grains {
                    g.punching.remove(grain);
                }
                self.kept.punched.notify_all();
            }
            Hold::Filling(grain) => {
                g.filling.remove(grain);
                g.writing.remove(grain);
                self.kept.punched.notify_all();
            }
        }
    }
}

/// The store grains the range `[offset, end)` covers only in part: at most one at
/// either end, one if both ends lie in the same grain.
pub(crate) fn part_grains(offset: u64, end: u64) -> impl Iterator<Item = u64> {
    let head = (!offset.is_multiple_of(GRAIN)).then_some(offset / GRAIN);
    let tail = (!end.is_multiple_of(GRAIN))
        .then_some(end / GRAIN)
        .filter(|&t| Some(t) != head);
    head.into_iter().chain(tail)
}

/// A trim as the store applies it: the range asked, widened to whole grains at an end whose
/// grain holds nothing else, and the hold that keeps writes out of those grains meanwhile.
#[derive(Debug)]
pub(crate) struct Trim {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    _turn: Option<GrainTurn>,
}

fn blocks_of(size: u64) -> u64 {
    size.div_ceil(BLOCK)
}

impl HeldMaps {
    /// The replica of `volume` keeps a map from now, empty (a new replica).
    pub(crate) fn start(
        &self,
        volume: u64,
        size: u64,
        ledger: Option<Arc<dyn Ledger>>,
    ) -> Result<(), StoreError> {
        let map = HeldMap::new(blocks_of(size));
        if let Some(l) = &ledger {
            l.create_held(map.disk_len() as u64)?;
            l.start_live_held(&map.live_image())?;
        }
        self.insert(volume, Ok(map), ledger);
        Ok(())
    }

    /// Reads back the map of a replica the node opened, if it keeps one: as its live copy
    /// says, where the last process died in this boot, else as on disk. A map that does not
    /// decode is kept as corrupt: its queries fail, so no writer trusts a guess.
    pub(crate) fn load(&self, volume: u64, size: u64, ledger: Arc<dyn Ledger>) {
        let mut map = match ledger.read_held() {
            Ok(None) => return,
            Ok(Some(bytes)) => HeldMap::decode(&bytes, blocks_of(size)).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match &mut map {
            Ok(m) => take_live(volume, m, &*ledger),
            Err(e) => tracing::error!(volume, "held map not read: {e}"),
        }
        let live = match &map {
            Ok(m) => ledger.start_live_held(&m.live_image()),
            Err(_) => Ok(()),
        };
        let kept = self.insert(volume, map, Some(ledger));
        if let Err(e) = live {
            tracing::error!(volume, "held map's live copy not started: {e}");
            kept.live_broken.store(true, Ordering::Release);
        }
    }

    fn insert(
        &self,
        volume: u64,
        map: Result<HeldMap, String>,
        ledger: Option<Arc<dyn Ledger>>,
    ) -> Arc<Kept> {
        let kept = Arc::new(Kept {
            map: Mutex::new(map),
            flushing: Mutex::new(()),
            trims: AtomicU64::new(0),
            trims_durable: AtomicU64::new(0),
            ledger,
            live_broken: AtomicBool::new(false),
            grains: Mutex::default(),
            punched: Condvar::new(),
        });
        self.kept
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, kept.clone());
        kept
    }

    pub(crate) fn forget(&self, volume: u64) {
        self.kept
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&volume);
    }

    pub(crate) fn keeps(&self, volume: u64) -> bool {
        self.get(volume).is_some()
    }

    fn get(&self, volume: u64) -> Option<Arc<Kept>> {
        self.kept
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&volume)
            .cloned()
    }

    /// The store took a write of `[offset, offset+len)` (data or zeroes): its blocks are
    /// held, any block it touches, in memory and in the live copy before the write is
    /// answered.
    pub(crate) fn wrote(&self, volume: u64, offset: u64, len: u64) -> Result<(), StoreError> {
        let Some(k) = self.get(volume) else {
            return Ok(());
        };
        let mut guard = k.map.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *guard {
            Ok(map) => {
                let first = offset / BLOCK;
                k.live(map.mark(first, blocks_of(offset + len) - first, true))
            }
            Err(_) => Ok(()),
        }
    }

    /// A write of `[offset, offset+len)` to a parity replica's store is about to begin: its
    /// grains are held until the returned turn drops, after its bits are set
    /// ([`HeldMaps::wrote`]), so no trim takes them for empty and punches the write away.
    /// Waits while a trim punches one of them. `None`: the replica keeps no map.
    pub(crate) fn writing(&self, volume: u64, offset: u64, len: u64) -> Option<GrainTurn> {
        Some(self.get(volume)?.writing(offset, len))
    }

    /// A data write's turn: a fill's where the write may fill its grain whole
    /// ([`Kept::filling`]), else [`HeldMaps::writing`]'s. `None`: the replica keeps no map.
    pub(crate) fn write_turn(
        &self,
        volume: u64,
        r: &dyn Replica,
        offset: u64,
        len: u64,
    ) -> Option<GrainTurn> {
        let k = self.get(volume)?;
        Some(
            k.filling(r, offset, len)
                .unwrap_or_else(|| k.writing(offset, len)),
        )
    }

    /// [`Kept::filling`] alone: `None` where the write may not fill, or the replica keeps no map.
    #[cfg(test)]
    pub(crate) fn filling(
        &self,
        volume: u64,
        r: &dyn Replica,
        offset: u64,
        len: u64,
    ) -> Option<GrainTurn> {
        self.get(volume)?.filling(r, offset, len)
    }

    /// Before a trim of `[offset, offset+len)` is applied: its whole blocks are not held,
    /// durably (a part block at either end is zeroed, not punched: a write, held). Returns
    /// the range to trim: where the trim leaves a grain at either end with no block held and
    /// no write under way, the whole grain, so the store punches it whole. A fold-back trims
    /// an overlay block by block; punched one 4 KiB block at a time, its grain kept what an
    /// overlay write reserved around it (`ops/io.rs`, `reserve_grains`) for good.
    pub(crate) fn trimming(
        &self,
        volume: u64,
        r: &dyn Replica,
        offset: u64,
        len: u64,
    ) -> Result<Trim, StoreError> {
        let Some(k) = self.get(volume) else {
            return Ok(Trim {
                offset,
                len,
                _turn: None,
            });
        };
        let (first, end) = (offset.div_ceil(BLOCK), (offset + len) / BLOCK);
        let (mine, trim) = {
            let mut guard = k.map.lock().unwrap_or_else(|e| e.into_inner());
            let mut trim = Trim {
                offset,
                len,
                _turn: None,
            };
            if let Ok(map) = &mut *guard {
                k.live(map.mark(
                    offset / BLOCK,
                    blocks_of(offset + len) - offset / BLOCK,
                    true,
                ))?;
                if end > first {
                    k.live(map.mark(first, end - first, false))?;
                }
                trim = k.widen(map, trim, r.size());
            }
            // Numbered after the widening looked at the map: the flush that makes this trim
            // durable takes every bit cleared before, those of the grains widened over too.
            (k.trims.fetch_add(1, Ordering::SeqCst) + 1, trim)
        };
        // Trims sent together (a fold-back's) share one flush: the first to get the
        // flush lock makes every mark made so far durable, and the others find theirs in it.
        let _one = k.flushing.lock().unwrap_or_else(|e| e.into_inner());
        if k.trims_durable.load(Ordering::SeqCst) < mine {
            k.persist_locked(r)?;
        }
        Ok(trim)
    }

    /// A flush of `r`: its data, then the pages of its map that changed.
    pub(crate) fn flush(&self, volume: u64, r: &dyn Replica) -> Result<(), StoreError> {
        match self.get(volume) {
            Some(k) => k.persist(r),
            None => r.flush(),
        }
    }

    /// The held blocks of `[offset, offset+len)` as extents covering it (held: data).
    pub(crate) fn query(&self, volume: u64, offset: u64, len: u64) -> Result<Vec<Extent>, Refusal> {
        let k = self.get(volume).ok_or_else(|| {
            Refusal(
                Status::Unsupported,
                format!("the replica of volume {volume} keeps no held map (not a parity volume's)"),
            )
        })?;
        if !offset.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK) || len > MAX_HELD_QUERY {
            return Err(Refusal(
                Status::Invalid,
                format!(
                    "held query {offset}+{len}: whole {BLOCK}-byte blocks, at most {MAX_HELD_QUERY} bytes"
                ),
            ));
        }
        let guard = k.map.lock().unwrap_or_else(|e| e.into_inner());
        let map = guard.as_ref().map_err(|why| {
            Refusal(
                Status::Io,
                format!("the held map of volume {volume} is unreadable: {why}"),
            )
        })?;
        let (first, count) = (offset / BLOCK, len / BLOCK);
        Ok(extents(&map.held(first, count), first, count))
    }
}

/// Takes the live copy as `map`, where the node's last process left one in this boot.
fn take_live(volume: u64, map: &mut HeldMap, ledger: &dyn Ledger) {
    match ledger.read_live_held() {
        Ok(Some(bits)) => match map.adopt_live(&bits) {
            Ok(0) => {}
            Ok(newer) => tracing::warn!(
                volume,
                pages = newer,
                "held map taken from its live copy: the last process died before these pages were flushed"
            ),
            Err(e) => tracing::warn!(volume, "held map's live copy not taken: {e}"),
        },
        Ok(None) => {}
        Err(e) => tracing::warn!(volume, "held map's live copy not read: {e}"),
    }
}

impl Kept {
    /// [`HeldMaps::writing`] on this map.
    fn writing(self: &Arc<Self>, offset: u64, len: u64) -> GrainTurn {
        let grains = offset / GRAIN..(offset + len.max(1)).div_ceil(GRAIN);
        let mut g = self.grains.lock().unwrap_or_else(|e| e.into_inner());
        while grains.clone().any(|x| g.busy(x)) {
            g = self.punched.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        for x in grains.clone() {
            *g.writing.entry(x).or_default() += 1;
        }
        drop(g);
        GrainTurn {
            kept: self.clone(),
            hold: Hold::Writing(grains),
        }
    }

    /// A write of `[offset, offset+len)`, within one store grain and less than all of it,
    /// that may write the grain whole: the grain is a hole in the store and no other write,
    /// trim or fill has it. The returned turn holds the grain alone (other writes to it wait,
    /// and no trim widens over it) until it drops, after the bits are set. `None`: write as
    /// [`Kept::writing`] says. Never waits.
    ///
    /// Why whole: a write into a reserved grain (`ops/io.rs`, `reserve_grains`) lands in an
    /// unwritten extent, which the file system converts at the write's end, block by block,
    /// a journal update each; the grain's other blocks convert at their own first writes. A
    /// grain written whole at its first write takes every later one as an overwrite.
    /// `SIZE=8G SECS=5 bench/fio-holes.sh` here, 4K random writes at 10 x QD4: 7.6 us of CPU
    /// a write into a written file, 21.3 into a reserved one, 50.4 into a sparse one; with
    /// `BS=64k`, 52.5 into a sparse one, about a 4K write's.
    fn filling(self: &Arc<Self>, r: &dyn Replica, offset: u64, len: u64) -> Option<GrainTurn> {
        let grain = offset / GRAIN;
        let whole = offset.is_multiple_of(GRAIN) && len == GRAIN;
        if len == 0 || whole || (offset + len).div_ceil(GRAIN) != grain + 1 {
            return None;
        }
        if (grain + 1) * GRAIN > r.size() {
            return None;
        }
        let mut g = self.grains.lock().unwrap_or_else(|e| e.into_inner());
        if g.busy(grain) || g.writing.contains_key(&grain) || !r.hole(grain * GRAIN, GRAIN) {
            return None;
        }
        g.filling.insert(grain);
        g.writing.insert(grain, 1);
        drop(g);
        Some(GrainTurn {
            kept: self.clone(),
            hold: Hold::Filling(grain),
        })
    }

    /// Widens a block-aligned trim to the whole grain at either end where no block is held
    /// and no write is under way, and takes those grains (the map's lock held).
    fn widen(self: &Arc<Self>, map: &HeldMap, trim: Trim, size: u64) -> Trim {
        let (offset, end) = (trim.offset, trim.offset + trim.len);
        if !offset.is_multiple_of(BLOCK) || !end.is_multiple_of(BLOCK) || trim.len == 0 {
            return trim;
        }
        let mut g = self.grains.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = Vec::new();
        let (mut a, mut b) = (offset, end);
        for grain in part_grains(offset, end) {
            let blocks = grain * (GRAIN / BLOCK)..((grain + 1) * (GRAIN / BLOCK)).min(map.blocks());
            if !blocks.into_iter().any(|x| map.is_held(x))
                && (grain + 1) * GRAIN <= size
                && !g.writing.contains_key(&grain)
                && g.punching.insert(grain)
            {
                taken.push(grain);
                a = a.min(grain * GRAIN);
                b = b.max((grain + 1) * GRAIN);
            }
        }
        if taken.is_empty() {
            return trim;
        }
        Trim {
            offset: a,
            len: b - a,
            _turn: Some(GrainTurn {
                kept: self.clone(),
                hold: Hold::Punching(taken),
            }),
        }
    }

    /// Writes what a mark changed (`HeldMap::mark`'s bytes) into the live copy, with the
    /// map's lock held so that copies of one byte land in the order they were made.
    fn live(&self, (at, bytes): (u64, Vec<u8>)) -> Result<(), StoreError> {
        let Some(l) = self.ledger.as_ref().filter(|_| !bytes.is_empty()) else {
            return Ok(());
        };
        if self.live_broken.load(Ordering::Acquire) {
            return Err(StoreError::Invalid(
                "the held map's live copy failed a write earlier; the replica must be opened again"
                    .into(),
            ));
        }
        l.write_live_held(at, &bytes).inspect_err(|_| {
            self.live_broken.store(true, Ordering::Release);
        })
    }

    /// Makes what the map says durable: the pages taken before the data flush describe only
    /// writes the store had taken, so each bit on disk has its data there first.
    fn persist(&self, r: &dyn Replica) -> Result<(), StoreError> {
        let _one = self.flushing.lock().unwrap_or_else(|e| e.into_inner());
        self.persist_locked(r)
    }

    /// [`Kept::persist`], the caller holding `flushing`.
    fn persist_locked(&self, r: &dyn Replica) -> Result<(), StoreError> {
        let (pages, trims) = {
            let mut guard = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let pages = guard
                .as_mut()
                .map(HeldMap::take_pending)
                .unwrap_or_default();
            (pages, self.trims.load(Ordering::SeqCst))
        };
        let written = r.flush().and_then(|()| match &self.ledger {
            Some(l) if !pages.is_empty() => {
                let at: Vec<(u64, &[u8])> = pages.iter().map(|(s, b)| (*s, &b[..])).collect();
                l.write_held(&at)
            }
            _ => Ok(()),
        });
        let slots: Vec<u64> = pages.iter().map(|(s, _)| *s).collect();
        let mut guard = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(map) = &mut *guard {
            map.settled(&slots, written.is_ok());
        }
        if written.is_ok() {
            self.trims_durable.fetch_max(trims, Ordering::SeqCst);
        }
        written
    }
}

/// Held runs of `[first, first+count)` blocks as byte extents covering all of it.
fn extents(held: &[(u64, u64)], first: u64, count: u64) -> Vec<Extent> {
    let hole = |blocks: u64| Extent {
        length: blocks * BLOCK,
        flags: Extent::HOLE | Extent::ZERO,
    };
    let mut out = Vec::with_capacity(2 * held.len() + 1);
    let mut at = first;
    for &(start, n) in held {
        if start > at {
            out.push(hole(start - at));
        }
        out.push(Extent {
            length: n * BLOCK,
            flags: 0,
        });
        at = start + n;
    }
    if at < first + count {
        out.push(hole(first + count - at));
    }
    out
}
