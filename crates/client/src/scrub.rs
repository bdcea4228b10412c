//! Scrub: every region compared across the in-sync replicas while I/O goes on, and repaired
//! from a copy that passes its block checksums and that the majority holds.

use serde::{Deserialize, Serialize};
use trireme_proto::Op;

use crate::{Volume, VolumeError};
use trireme_replication::{majority, Sum, Verdict, CHUNK};

/// What a scrub found and did.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ScrubReport {
    pub volume: String,
    pub bytes_compared: u64,
    pub region_bytes: u64,
    /// In-sync replicas compared.
    pub replicas: Vec<u32>,
    /// Regions where the replicas disagreed.
    pub mismatched_regions: u64,
    /// Of those, repaired from the copy the majority holds: `(offset, node repaired)`.
    pub repaired: Vec<(u64, u32)>,
    /// Regions with no majority (two copies that differ): reported, left alone.
    pub unresolved: Vec<u64>,
    /// Copies whose blocks failed their checksums (known bad, repaired from a good one even
    /// when only one good copy is left).
    #[serde(default)]
    pub bad_copies: u64,
    /// Nodes whose copy was compared in every region, and which cleared what they noted
    /// against it (an unclean stop, bad blocks met) once the scrub ended with nothing left
    /// unresolved (`node/src/integrity.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified: Vec<u32>,
    /// A parity volume's stripes whose parity was checked against their data
    /// (`parity_scrub.rs`).
    #[serde(default)]
    pub stripes_checked: u64,
}

impl Volume {
    /// Compares every region across the in-sync replicas (crc32c computed on each node) while
    /// I/O goes on, each region under its write lock. A copy whose blocks fail their checksums
    /// (sealed stores) is known bad and rewritten from a good one. Where good copies differ,
    /// the copy held by a majority is written over the others; with no majority (two copies
    /// that both pass their checksums) nothing is guessed: the region is reported. A parity
    /// volume's stripes are checked against their data too (`parity_scrub.rs`).
    pub async fn scrub(&self, region: u64) -> Result<ScrubReport, VolumeError> {
        self.scrub_at(region, None).await
    }

    /// [`Volume::scrub`] going through at most `rate` bytes a second (a scheduled scrub:
    /// it reads every copy, and shares the disks with the volume's I/O).
    pub async fn scrub_at(
        &self,
        region: u64,
        rate: Option<u64>,
    ) -> Result<ScrubReport, VolumeError> {
        let started = tokio::time::Instant::now();
        let progress = |done: u64, repaired: u64| {
            *self.scrubbing.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(trireme_replication::ResyncProgress {
                    full: true,
                    total_bytes: self.size(),
                    done_bytes: done,
                    copied_bytes: repaired,
                    elapsed_ms: started.elapsed().as_millis() as u64,
                });
        };
        progress(0, 0);
        let r = self.scrub_regions(region, rate, &progress).await;
        *self.scrubbing.lock().unwrap_or_else(|e| e.into_inner()) = None;
        r
    }

    /// How far the scrub running now has gone (`copied_bytes`: bytes rewritten).
    pub fn scrub_progress(&self) -> Option<trireme_replication::ResyncProgress> {
        self.scrubbing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn scrub_regions(
        &self,
        region: u64,
        rate: Option<u64>,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<ScrubReport, VolumeError> {
        if self.parity.is_some() {
            return self.scrub_parity(rate, progress).await;
        }
        let started = tokio::time::Instant::now();
        let region = region.clamp(4096, CHUNK);
        let mut report = ScrubReport {
            volume: self.info.name.clone(),
            region_bytes: region,
            replicas: self.in_sync().iter().map(|&i| self.node(i)).collect(),
            ..ScrubReport::default()
        };
        // Copies compared in every region so far, with the node's token when the scrub began.
        let mut always = self.integrity_tokens(&self.in_sync()).await;
        let mut off = 0;
        while off < self.size() {
            let len = region.min(self.size() - off);
            let _r = self.core.acquire(off, off + len).await;
            let targets = self.in_sync();
            always.retain(|(i, _)| targets.contains(i));
            let replies = self.checksums(&targets, off, len).await;
            // A copy whose blocks fail their checksums is known bad: it gets no vote.
            let mut sums = Vec::with_capacity(targets.len());
            for (&t, r) in targets.iter().zip(replies) {
                match r {
                    Ok(c) => sums.push((t, Sum::Good(c))),
                    Err(e) if e.is_bad_copy() => sums.push((t, Sum::Bad)),
                    Err(e) => return Err(e),
                }
            }
            report.bytes_compared += len;
            let verdict = majority(&sums);
            if verdict != Verdict::Agree {
                report.mismatched_regions += 1;
                report.bad_copies += sums.iter().filter(|s| s.1 == Sum::Bad).count() as u64;
            }
            match verdict {
                Verdict::Agree => {}
                Verdict::Unresolved => report.unresolved.push(off),
                Verdict::Repair { source, rewrite } => {
                    let data = self.read_from(source, off, len).await?;
                    for t in rewrite {
                        let w = self.recovery_header(Op::Write, off, len);
                        self.expect_ok(t, self.call(t, w, data.clone()).await?)?;
                        report.repaired.push((off, self.node(t)));
                        tracing::warn!(volume = %self.info.name, node = self.node(t), offset = off, "scrub repaired a region from the majority copy");
                    }
                }
            }
            off += len;
            progress(off, report.repaired.len() as u64 * region);
            drop(_r);
            if let Some(rate) = rate.filter(|&r| r > 0) {
                // Ahead of the rate: wait, holding no range.
                let due = std::time::Duration::from_secs_f64(off as f64 / rate as f64);
                tokio::time::sleep_until(started + due).await;
            }
        }
        if report.unresolved.is_empty() {
            report.verified = self.mark_verified(&always).await;
        }
        Ok(report)
    }

    /// Each copy's integrity token now (`ReplicaInfo`), for those whose node reports one.
    pub(crate) async fn integrity_tokens(&self, copies: &[usize]) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        for &i in copies {
            if let Some(g) = self.integrity_of(i).await {
                out.push((i, g.token));
            }
        }
        out
    }

    /// Which of `copies` their nodes note as stopped uncleanly since a scrub or a whole
    /// resync last verified them (a copy that does not answer counts as one).
    pub(crate) async fn unclean_copies(&self, copies: &[usize]) -> Vec<usize> {
        let mut out = Vec::new();
        for &i in copies {
            if self.integrity_of(i).await.is_none_or(|g| g.unclean) {
                out.push(i);
            }
        }
        out
    }

    /// What copy `i`'s node notes of its integrity, if it answers.
    async fn integrity_of(&self, i: usize) -> Option<trireme_proto::ReplicaIntegrity> {
        let h = self.header(Op::ReplicaInfo, 0, 0);
        self.call(i, h, bytes::Bytes::new())
            .await
            .and_then(|f| self.expect_ok(i, f))
            .ok()
            .and_then(|f| trireme_proto::ReplicaInfoAnswer::read(&f.header, &f.payload).ok())
            .and_then(|a| a.integrity)
    }

    /// Tells each copy compared in every region that a scrub verified it, with the token its
    /// node gives now, if that node's process is the one the scrub began with (a copy whose
    /// node restarted meanwhile stays noted). The nodes told; a refusal is logged, not an
    /// error: the copy stays noted, and the next scrub tries again.
    pub(crate) async fn mark_verified(&self, copies: &[(usize, u64)]) -> Vec<u32> {
        let idx: Vec<usize> = copies.iter().map(|c| c.0).collect();
        let now = self.integrity_tokens(&idx).await;
        let mut told = Vec::new();
        for (i, token) in now {
            let began = copies.iter().find(|c| c.0 == i).map(|c| c.1);
            if began.is_none_or(|b| b >> 32 != token >> 32) {
                continue;
            }
            let h = self.header(Op::Verified, token, 0);
            match self
                .call(i, h, bytes::Bytes::new())
                .await
                .and_then(|f| self.expect_ok(i, f))
            {
                Ok(_) => told.push(self.node(i)),
                Err(e) => {
                    tracing::info!(volume = %self.info.name, node = self.node(i), "the copy stays unverified: {e}")
                }
            }
        }
        told
    }
}
