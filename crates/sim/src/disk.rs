//! A simulated disk with a volatile write cache, so a node can lose power.
//!
//! Writes land in memory at once (reads see them), but until a flush (or a FUA write) the
//! disk remembers what each one overwrote. A power loss then decides, for every 512-byte
//! sector touched since the last flush, which version the platter kept: the one before, or
//! the one after any of the writes to it. So a write may survive, vanish, or be torn (some
//! sectors new, some old) — what real disks do. The replica then reports a new incarnation, as
//! the file store does when it finds it was not shut down cleanly in another boot: its history
//! is unknown and it gets a full (compare) resync.
//!
//! Each replica also has a ledger (`trireme_store::Ledger`), where its node keeps the activity
//! log and the peers' dirty records across restarts, as on the file store. Its writes are
//! durable when they return (the file ledger syncs each one); a power loss may tear one log
//! page — a page write the node had in flight — which the node must read as fully marked.
//! A parity replica's held map has a live copy there too, which outlives a crash of the
//! node's process but not a power loss (the file ledger's is read back only in its boot).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use trireme_store::{Ledger, MemoryStore, Replica, Store, StoreError};

/// A replica's ledger on the simulated disk.
#[derive(Debug, Default)]
pub(crate) struct SimLedger {
    log: Mutex<Vec<u8>>,
    records: Mutex<Option<Vec<u8>>>,
    held: Mutex<Option<Vec<u8>>>,
    /// The held map's live copy, until the power goes.
    live: Mutex<Option<Vec<u8>>>,
}

impl SimLedger {
    /// The machine restarts: the live copy, never synced, is gone.
    fn reboot(&self) {
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A power loss while a page was being written: one byte of page `page` (if the log
    /// has it) changes.
    fn tear(&self, page: u64) -> bool {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let at = (page as usize) * trireme_store::ledger::PAGE + 100;
        match log.get_mut(at) {
            Some(b) => {
                *b ^= 0x5a;
                true
            }
            None => false,
        }
    }
}

impl Ledger for SimLedger {
    fn read_log(&self) -> Result<Vec<u8>, StoreError> {
        Ok(self.log.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn write_log(&self, first: u64, pages: &[u8]) -> Result<(), StoreError> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        trireme_store::ledger::put_pages(&mut log, first, pages);
        Ok(())
    }
    fn read_records(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone())
    }
    fn save_records(&self, bytes: &[u8]) -> Result<(), StoreError> {
        *self.records.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes.to_vec());
        Ok(())
    }
    fn read_held(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.held.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn create_held(&self, len: u64) -> Result<(), StoreError> {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(vec![0; len as usize]);
        Ok(())
    }
    fn write_held(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let map = held
            .as_mut()
            .ok_or_else(|| StoreError::Invalid("the replica keeps no held map".into()))?;
        let page = trireme_store::held::PAGE;
        for (at, bytes) in pages {
            let at = *at as usize * page;
            map.get_mut(at..at + bytes.len())
                .ok_or_else(|| StoreError::Invalid("held map page past its end".into()))?
                .copy_from_slice(bytes);
        }
        Ok(())
    }
    fn read_live_held(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.live.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn start_live_held(&self, bits: &[u8]) -> Result<(), StoreError> {
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = Some(bits.to_vec());
        Ok(())
    }
    fn write_live_held(&self, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let at = at as usize;
        live.as_mut()
            .and_then(|l| l.get_mut(at..at + bytes.len()))
            .ok_or_else(|| {
                StoreError::Invalid("live copy not started, or written past its end".into())
            })?
            .copy_from_slice(bytes);
        Ok(())
    }
}

/// The smallest unit a disk writes atomically.
const SECTOR: u64 = 512;
/// Bytes the cache holds before the oldest write is destaged (made durable) by itself.
const CACHE: usize = 8 << 20;

#[derive(Debug)]
struct Unflushed {
    offset: u64,
    old: Vec<u8>,
    new: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct SimReplica {
    inner: Arc<dyn Replica>,
    cache: Mutex<VecDeque<Unflushed>>,
    incarnation: AtomicU64,
    ledger: Arc<SimLedger>,
    /// Its node died with it open (a crash or a power loss; the simulator never stops a
    /// node cleanly): what the file store's open flag tells the next process.
    unclean: AtomicBool,
}

impl SimReplica {
    /// Applies a write, remembering what it overwrote until the next flush.
    fn cached(
        &self,
        offset: u64,
        len: u64,
        apply: impl FnOnce() -> Result<(), StoreError>,
        new: impl FnOnce() -> Vec<u8>,
    ) -> Result<(), StoreError> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut old = vec![0u8; len as usize];
        self.inner.read(offset, &mut old)?;
        apply()?;
        c.push_back(Unflushed {
            offset,
            old,
            new: new(),
        });
        while c.iter().map(|w| w.new.len()).sum::<usize>() > CACHE {
            c.pop_front();
        }
        Ok(())
    }

    /// Power loss: every sector written since the last flush keeps a version chosen by `pick`
    /// (given the number of versions, returns one below it: 0 is the one before the first
    /// unflushed write). Returns how many sectors lost their newest version.
    fn lose_power(&self, pick: &mut dyn FnMut(u64) -> u64, unnoticed: bool) -> u64 {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        // Per sector, its versions in write order, the first being what was there before.
        let mut versions: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        for w in c.iter() {
            let mut pos = w.offset;
            while pos < w.offset + w.new.len() as u64 {
                let s = pos / SECTOR;
                let end = ((s + 1) * SECTOR).min(w.offset + w.new.len() as u64);
                let (a, b) = ((pos - w.offset) as usize, (end - w.offset) as usize);
                // A write covering part of a sector changes only that part; the sim writes
                // whole 4 KiB blocks, so sectors are whole here and the part is the sector.
                let v = versions
                    .entry(pos)
                    .or_insert_with(|| vec![w.old[a..b].to_vec()]);
                v.push(w.new[a..b].to_vec());
                pos = end;
            }
        }
        let mut lost = 0;
        for (pos, v) in versions {
            let k = pick(v.len() as u64) as usize;
            if k + 1 != v.len() {
                lost += 1;
            }
            // The memory store cannot fail a write in range.
            let _ = self.inner.write(pos, &v[k], false);
        }
        c.clear();
        // Now and then a log page was being written when the power went.
        let pages =
            (self.ledger.read_log().map_or(0, |l| l.len()) / trireme_store::ledger::PAGE) as u64;
        if pages > 0 && pick(2) == 1 {
            self.ledger.tear(pick(pages));
        }
        if !unnoticed {
            self.incarnation
                .store(trireme_store::new_incarnation(), Ordering::Release);
            self.ledger.reboot();
        }
        lost
    }
}

impl trireme_store::filter::ReplicaFilter for SimReplica {
    fn next(&self) -> &dyn Replica {
        &*self.inner
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        if fua {
            return self.inner.write(offset, data, true);
        }
        self.cached(
            offset,
            data.len() as u64,
            || self.inner.write(offset, data, false),
            || data.to_vec(),
        )
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), StoreError> {
        if fua {
            return self.inner.write_zeroes(offset, len, may_trim, true);
        }
        self.cached(
            offset,
            len,
            || self.inner.write_zeroes(offset, len, may_trim, false),
            || vec![0u8; len as usize],
        )
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.inner.flush()
    }
    fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }
    fn ledger(&self) -> Option<Arc<dyn Ledger>> {
        Some(self.ledger.clone())
    }
    fn unclean_stop(&self) -> bool {
        self.unclean.load(Ordering::Acquire)
    }
    /// A clean shutdown writes the cache out, as a flush does.
    fn close(&self) -> Result<(), StoreError> {
        trireme_store::filter::ReplicaFilter::flush(self)
    }
}

/// A node's disk: memory replicas behind a volatile cache.
#[derive(Debug, Default)]
pub(crate) struct SimDisk {
    inner: MemoryStore,
    replicas: Mutex<HashMap<u64, Arc<SimReplica>>>,
}

impl SimDisk {
    /// The power goes out; see the module docs. Returns the sectors that lost their newest write.
    /// With `unnoticed` (the checker's own test), the replicas keep their incarnation, as if the
    /// node could not tell a power loss from a process crash.
    pub(crate) fn lose_power(&self, pick: &mut dyn FnMut(u64) -> u64, unnoticed: bool) -> u64 {
        let reps: Vec<_> = self
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        reps.iter().map(|r| r.lose_power(pick, unnoticed)).sum()
    }
}

impl SimDisk {
    /// Its node's process died (a crash, or a power loss): the next one opens every replica
    /// as stopped uncleanly. With `forget_live` (the checker's own test), the held maps' live
    /// copies go with the process, as if the node kept none.
    pub(crate) fn died(&self, forget_live: bool) {
        for r in self
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            r.unclean.store(true, Ordering::Release);
            if forget_live {
                r.ledger.reboot();
            }
        }
    }
}

impl trireme_store::filter::StoreFilter for SimDisk {
    fn next(&self) -> &dyn Store {
        &self.inner
    }
    fn create(&self, volume: u64, size: u64) -> Result<Arc<dyn Replica>, StoreError> {
        let inner = self.inner.create(volume, size)?;
        let r = Arc::new(SimReplica {
            incarnation: AtomicU64::new(inner.incarnation()),
            inner,
            cache: Mutex::default(),
            ledger: Arc::default(),
            unclean: AtomicBool::new(false),
        });
        self.replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume, r.clone());
        Ok(r)
    }
    fn open_all(&self) -> Vec<Result<Arc<dyn Replica>, StoreError>> {
        self.replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|r| Ok(r.clone() as Arc<dyn Replica>))
            .collect()
    }
    fn delete(&self, volume: u64) -> Result<(), StoreError> {
        self.replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&volume);
        self.inner.delete(volume)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(r: &dyn Replica, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        r.read(off, &mut b).unwrap();
        b
    }

    #[test]
    fn power_loss_keeps_flushed_writes_and_picks_a_version_per_sector() {
        let d = SimDisk::default();
        let r = d.create(1, 1 << 20).unwrap();
        let inc = r.incarnation();
        r.write(0, &[1u8; 1024], false).unwrap();
        r.flush().unwrap();
        r.write(0, &[2u8; 1024], false).unwrap();
        r.write(512, &[3u8; 512], false).unwrap();
        r.write(4096, &[4u8; 512], true).unwrap(); // FUA: durable
                                                   // Sector 0 has versions [1, 2]; sector 1 has [1, 2, 3]. Keep the oldest of sector 0
                                                   // and the middle one of sector 1.
        let mut calls = Vec::new();
        let lost = d.lose_power(
            &mut |n| {
                calls.push(n);
                if n == 2 {
                    0
                } else {
                    1
                }
            },
            false,
        );
        assert_eq!(calls, vec![2, 3]);
        assert_eq!(lost, 2);
        assert_eq!(read(&*r, 0, 512), vec![1u8; 512], "flushed version");
        assert_eq!(read(&*r, 512, 512), vec![2u8; 512], "torn: an older write");
        assert_eq!(read(&*r, 4096, 512), vec![4u8; 512]);
        assert_ne!(r.incarnation(), inc, "history lost");
        assert_eq!(d.lose_power(&mut |_| 0, false), 0, "nothing unflushed");
    }
}
