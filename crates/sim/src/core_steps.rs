//! The replication core stepped directly, with no runtime: writes whose frames reach each
//! replica in any order, replicas that stop answering and come back, and resyncs that hold
//! their ranges through the write order, all chosen by the seed.
//!
//! The whole simulator runs the core through the writer; this runs it alone, thousands of
//! interleavings a second, with a model of what each replica holds: every block a number (the
//! write that last landed there). A write lands on each of its targets at a time of the
//! seed's choosing, so two writes in flight together that overlap would land in different
//! orders on different copies. Checked: no two ranges in flight overlap, and once everything
//! has landed and every copy is back, every copy holds, block by block, the last write the
//! core let go to that block. The checker's own tests plant flaws (`Sabotage`): writes sent
//! when the core told them to wait, resync copies that take no place in the write order;
//! each must fail seeds.

use std::collections::BTreeSet;

use trireme_replication::{
    Action, Answers, Decision, Input, Mirrored, ReplicaOutcome, ReplicaState, ResyncStart,
    TakeOutStep, Ticket, VolumeCore,
};

use crate::Rng;

/// Blocks of the modelled volume (few, so writes collide).
const BLOCKS: u64 = 12;
const BLOCK: u64 = 4096;
/// Events of the random part of a run.
const EVENTS: usize = 400;

/// A flaw planted on purpose, for the checker's own test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    None,
    /// A write told to wait for an earlier overlapping one is sent at once.
    IgnoreWait,
    /// A resync copies a block without holding its range against writes.
    CopyWithoutHold,
}

/// A write or a resync copy between its place and its end.
#[derive(Debug)]
struct Flight {
    place: Ticket,
    blocks: (u64, u64),
    /// The write's number (0: a resync copy, which sends nothing).
    seq: u64,
    /// Targets, each with its outcome once it answered.
    targets: Vec<(usize, Option<ReplicaOutcome>)>,
    /// A resync copy's replica and source, once it holds its range.
    copy: Option<usize>,
}

#[derive(Debug, Default)]
struct Replica {
    up: bool,
    data: Vec<u64>,
    /// Blocks written while it was out (the survivors' record of what it missed).
    missed: BTreeSet<u64>,
    /// Blocks its running resync has still to copy.
    to_copy: BTreeSet<u64>,
}

struct Run {
    rng: Rng,
    core: VolumeCore,
    sabotage: Sabotage,
    replicas: Vec<Replica>,
    /// Holding their ranges, or waiting for them (`targets` empty until granted).
    flights: Vec<Flight>,
    /// Writes turned back for want of copies, to submit again.
    gate: Vec<(u64, u64, u64)>,
    seq: u64,
    /// The replica that never goes down.
    steady: usize,
    /// Per block, the last write let go to it.
    last: Vec<u64>,
}

/// One run of seed `seed`; the first broken guarantee, if any.
pub fn run(seed: u64, sabotage: Sabotage) -> Result<u64, String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let n = 2 + rng.below(2) as usize;
    let states: Vec<(u32, ReplicaState)> = (0..n)
        .map(|k| (k as u32 + 1, ReplicaState::InSync))
        .collect();
    let mut core = VolumeCore::new(&states, 0, true, 8);
    for i in 0..n {
        core.attached(i, 1);
    }
    let replicas = (0..n)
        .map(|_| Replica {
            up: true,
            data: vec![0; BLOCKS as usize],
            ..Replica::default()
        })
        .collect();
    let mut r = Run {
        rng,
        core,
        sabotage,
        replicas,
        flights: Vec::new(),
        gate: Vec::new(),
        seq: 0,
        steady: 0,
        last: vec![0; BLOCKS as usize],
    };
    r.steady = r.rng.below(n as u64) as usize;
    for _ in 0..EVENTS {
        r.event()?;
    }
    r.settle()?;
    Ok(r.seq)
}

impl Run {
    fn event(&mut self) -> Result<(), String> {
        match self.rng.below(20) {
            0..=6 => {
                let at = self.rng.below(BLOCKS);
                let len = 1 + self.rng.below(3.min(BLOCKS - at));
                self.seq += 1;
                self.submit(at, at + len, self.seq)
            }
            7..=15 => self.deliver(),
            16 => {
                self.crash();
                Ok(())
            }
            17 => self.come_back(),
            18 => self.resync_step(),
            _ => self.retry_gate(),
        }
    }

    fn submit(&mut self, start: u64, end: u64, seq: u64) -> Result<(), String> {
        let request = Mirrored::Data {
            offset: start * BLOCK,
            len: (end - start) * BLOCK,
        };
        match self.core.step(Input::Submit(request)).pop() {
            Some(Action::Proceed {
                place: Some(place),
                targets,
            }) => self.go(place, (start, end), seq, targets),
            Some(Action::Wait { place }) if self.sabotage == Sabotage::IgnoreWait => {
                let targets = self.core.place_targets(place);
                self.go(place, (start, end), seq, targets)
            }
            Some(Action::Wait { place }) => {
                self.flights.push(Flight {
                    place,
                    blocks: (start, end),
                    seq,
                    targets: Vec::new(),
                    copy: None,
                });
                Ok(())
            }
            Some(Action::Short) => {
                self.gate.push((start, end, seq));
                Ok(())
            }
            other => Err(format!("a write's submit: {other:?}")),
        }
    }

    /// Write `seq` goes to `targets`, holding `place`.
    fn go(
        &mut self,
        place: Ticket,
        blocks: (u64, u64),
        seq: u64,
        targets: Vec<usize>,
    ) -> Result<(), String> {
        if self.sabotage == Sabotage::None {
            if let Some(f) = self.flights.iter().find(|f| {
                f.place != place
                    && (f.seq == 0 || !f.targets.is_empty())
                    && f.blocks.0 < blocks.1
                    && blocks.0 < f.blocks.1
                    && self.core.may_hold(f.place)
            }) {
                return Err(format!(
                    "write {seq} on {blocks:?} goes while {} holds {:?}",
                    f.seq, f.blocks
                ));
            }
        }
        for b in blocks.0..blocks.1 {
            self.last[b as usize] = seq;
        }
        // The copies out miss it: the survivors note it for them.
        for (i, rep) in self.replicas.iter_mut().enumerate() {
            if !targets.contains(&i) && self.core.set().state(i) != ReplicaState::Removed {
                rep.missed.extend(blocks.0..blocks.1);
            }
        }
        let targets = targets.into_iter().map(|t| (t, None)).collect();
        match self.flights.iter_mut().find(|f| f.place == place) {
            Some(f) => f.targets = targets,
            None => self.flights.push(Flight {
                place,
                blocks,
                seq,
                targets,
                copy: None,
            }),
        }
        Ok(())
    }

    /// One target of one write in flight gets it (or does not, if its replica is down).
    fn deliver(&mut self) -> Result<(), String> {
        let open = open_targets(&self.flights, |f| &f.targets);
        let Some(&(k, j)) = open.get(self.rng.below(open.len() as u64) as usize) else {
            return Ok(());
        };
        let (i, seq, blocks) = {
            let f = &self.flights[k];
            (f.targets[j].0, f.seq, f.blocks)
        };
        let up = self.replicas[i].up;
        // A replica that went down may have applied it without answering.
        if up || self.rng.chance(0.5) {
            for b in blocks.0..blocks.1 {
                self.replicas[i].data[b as usize] = seq;
            }
        }
        self.flights[k].targets[j].1 = Some(if up {
            ReplicaOutcome::Done
        } else {
            ReplicaOutcome::Failed
        });
        if self.flights[k].targets.iter().all(|t| t.1.is_some()) {
            self.answered(k)?;
        }
        Ok(())
    }

    fn answered(&mut self, k: usize) -> Result<(), String> {
        let f = self.flights.remove(k);
        let targets: Vec<usize> = f.targets.iter().map(|t| t.0).collect();
        let outcomes: Vec<ReplicaOutcome> = f.targets.iter().filter_map(|t| t.1).collect();
        let answers = Answers {
            place: Some(f.place),
            request: Mirrored::Data {
                offset: f.blocks.0 * BLOCK,
                len: (f.blocks.1 - f.blocks.0) * BLOCK,
            },
            targets: &targets,
            outcomes: &outcomes,
            from_reserve: false,
        };
        let actions = self.core.step(Input::Answered(answers));
        let mut release = true;
        for a in actions {
            match a {
                Action::Granted { places } => self.granted(places)?,
                Action::Ack { .. } => release = false,
                Action::Carry(Decision::TakeOut { replicas, .. }) => {
                    self.take_out(&replicas, f.blocks)?
                }
                Action::Carry(d) => return Err(format!("write {} failed: {d:?}", f.seq)),
                other => return Err(format!("after answers: {other:?}")),
            }
        }
        if release {
            let actions = self.core.step(Input::Release(f.place));
            self.apply_grants(actions)?;
        }
        Ok(())
    }

    fn apply_grants(&mut self, actions: Vec<Action>) -> Result<(), String> {
        for a in actions {
            match a {
                Action::Granted { places } => self.granted(places)?,
                other => return Err(format!("a release: {other:?}")),
            }
        }
        Ok(())
    }

    fn granted(&mut self, places: Vec<(Ticket, Vec<usize>)>) -> Result<(), String> {
        for (p, targets) in places {
            let Some(f) = self.flights.iter().find(|f| f.place == p) else {
                continue;
            };
            // A resync copy (it lands at its next step), or a write sent already (the
            // sabotage sent it without waiting).
            if f.seq == 0 || !f.targets.is_empty() {
                continue;
            }
            let (blocks, seq) = (f.blocks, f.seq);
            self.go(p, blocks, seq, targets)?;
        }
        Ok(())
    }

    /// The take-out of `failed`, a write on `blocks` missed by them: recorded and marked
    /// (the survivors that are up mark), then applied.
    fn take_out(&mut self, failed: &[usize], blocks: (u64, u64)) -> Result<(), String> {
        for &i in failed {
            self.replicas[i].missed.extend(blocks.0..blocks.1);
            // A resync cut short: what it had still to copy is missed again.
            let rest = std::mem::take(&mut self.replicas[i].to_copy);
            self.replicas[i].missed.extend(rest);
            if self.core.resyncing(i) {
                self.core.resync_failed(i);
            }
        }
        let up: Vec<bool> = self.replicas.iter().map(|r| r.up).collect();
        take_out(&mut self.core, failed, |i| up[i])
    }

    /// A replica goes down, unless it is the seed's steady one (the contract, as in the
    /// whole simulator: one copy always stays in sync and well).
    fn crash(&mut self) {
        let i = self.rng.below(self.replicas.len() as u64) as usize;
        if i != self.steady {
            self.replicas[i].up = false;
        }
    }

    /// A replica that is down comes back, with its data; if it is out, its resync begins.
    fn come_back(&mut self) -> Result<(), String> {
        if let Some(rep) = self.replicas.iter_mut().find(|r| !r.up) {
            rep.up = true;
        }
        let due = self.core.to_resync(std::time::Duration::ZERO);
        for i in due {
            if !self.replicas[i].up || !self.replicas[i].to_copy.is_empty() {
                continue;
            }
            match self.core.resync_start(i, 1) {
                Ok(ResyncStart::From { incremental, .. }) => {
                    let rep = &mut self.replicas[i];
                    rep.to_copy = match incremental {
                        true => std::mem::take(&mut rep.missed),
                        false => (0..BLOCKS).collect(),
                    };
                    rep.missed.clear();
                    self.core.resync_begun(i, progress());
                    if self.replicas[i].to_copy.is_empty() {
                        self.core.resync_done(i, 1, progress());
                    }
                }
                Ok(ResyncStart::NotNeeded) => {}
                Err(e) => return Err(format!("resync of {i}: {e}")),
            }
        }
        Ok(())
    }

    /// A resync takes the next block it has to copy, through the write order; one that holds
    /// its block copies it from an in-sync copy.
    fn resync_step(&mut self) -> Result<(), String> {
        // Copies that hold their ranges land first.
        if let Some(k) = self
            .flights
            .iter()
            .position(|f| f.seq == 0 && self.core.may_hold(f.place))
        {
            let f = self.flights.remove(k);
            let i = f.copy.expect("a copy's replica");
            self.copy(i, f.blocks.0);
            let actions = self.core.step(Input::Release(f.place));
            return self.apply_grants(actions);
        }
        let resyncing: Vec<usize> = (0..self.replicas.len())
            .filter(|&i| self.core.resyncing(i) && !self.replicas[i].to_copy.is_empty())
            .collect();
        let Some(&i) = resyncing.get(self.rng.below(resyncing.len() as u64) as usize) else {
            return Ok(());
        };
        let pending: BTreeSet<u64> = self
            .flights
            .iter()
            .filter(|f| f.copy == Some(i))
            .map(|f| f.blocks.0)
            .collect();
        let Some(&b) = self.replicas[i]
            .to_copy
            .iter()
            .find(|b| !pending.contains(b))
        else {
            return Ok(());
        };
        if self.sabotage == Sabotage::CopyWithoutHold {
            self.copy(i, b);
            return Ok(());
        }
        let place = match self
            .core
            .step(Input::Hold {
                start: b * BLOCK,
                end: (b + 1) * BLOCK,
            })
            .pop()
        {
            Some(Action::Proceed { place: Some(p), .. } | Action::Wait { place: p }) => p,
            other => return Err(format!("a resync's hold: {other:?}")),
        };
        self.flights.push(Flight {
            place,
            blocks: (b, b + 1),
            seq: 0,
            targets: Vec::new(),
            copy: Some(i),
        });
        Ok(())
    }

    /// Replica `i`'s resync copies block `b` from an in-sync copy that is up; the last
    /// block done, it is in sync.
    fn copy(&mut self, i: usize, b: u64) {
        let source = self
            .core
            .set()
            .in_sync()
            .into_iter()
            .find(|&s| self.replicas[s].up);
        if let (Some(s), true, true) = (source, self.replicas[i].up, self.core.resyncing(i)) {
            let v = self.replicas[s].data[b as usize];
            self.replicas[i].data[b as usize] = v;
            self.replicas[i].to_copy.remove(&b);
            if self.replicas[i].to_copy.is_empty() {
                self.core.resync_done(i, 1, progress());
            }
        }
    }

    fn retry_gate(&mut self) -> Result<(), String> {
        for (start, end, seq) in std::mem::take(&mut self.gate) {
            self.submit(start, end, seq)?;
        }
        Ok(())
    }

    /// Everything lands, every replica comes back and is resynced; then the copies compare.
    fn settle(&mut self) -> Result<(), String> {
        for _ in 0..100_000 {
            self.replicas.iter_mut().for_each(|r| r.up = true);
            let quiet = self.flights.is_empty()
                && self.gate.is_empty()
                && self.core.set().in_sync().len() == self.replicas.len();
            if quiet {
                return self.compare();
            }
            self.deliver()?;
            self.come_back()?;
            self.resync_step()?;
            self.retry_gate()?;
        }
        Err(format!(
            "never settled: {} in flight, states {:?}",
            self.flights.len(),
            self.core.set().states()
        ))
    }

    fn compare(&self) -> Result<(), String> {
        for (i, rep) in self.replicas.iter().enumerate() {
            for b in 0..BLOCKS as usize {
                if rep.data[b] != self.last[b] {
                    return Err(format!(
                        "replica {i} block {b} holds write {}, the last let go there was {}",
                        rep.data[b], self.last[b]
                    ));
                }
            }
        }
        if self.core.places() != 0 {
            return Err(format!(
                "{} places left in the write order",
                self.core.places()
            ));
        }
        Ok(())
    }
}

/// Takes `failed` out of `core` as a writer does: recorded, marked on the survivors `up`
/// says answer, applied.
pub(crate) fn take_out(
    core: &mut VolumeCore,
    failed: &[usize],
    up: impl Fn(usize) -> bool,
) -> Result<(), String> {
    let mut plan = core.take_out(failed, false);
    loop {
        match plan.step() {
            TakeOutStep::Record(rs) => rs.into_iter().for_each(|(i, _)| plan.recorded(i)),
            TakeOutStep::Mark(ms) => {
                for m in ms {
                    plan.marked(m.survivor, up(m.survivor));
                }
            }
            TakeOutStep::Apply(out)
            | TakeOutStep::Stranded(out)
            | TakeOutStep::Short { apply: out, .. } => {
                core.apply(&out);
                return Ok(());
            }
            TakeOutStep::NoneLeft => return Err("no in-sync copy left".into()),
        }
    }
}

/// The (request, target) pairs not answered yet, of requests whose targets `targets` gives.
pub(crate) fn open_targets<T>(
    requests: &[T],
    targets: impl Fn(&T) -> &[(usize, Option<ReplicaOutcome>)],
) -> Vec<(usize, usize)> {
    requests
        .iter()
        .enumerate()
        .flat_map(|(k, r)| {
            targets(r)
                .iter()
                .enumerate()
                .filter(|(_, t)| t.1.is_none())
                .map(move |(j, _)| (k, j))
        })
        .collect()
}

pub(crate) fn progress() -> trireme_replication::ResyncProgress {
    trireme_replication::ResyncProgress {
        full: false,
        total_bytes: 0,
        done_bytes: 0,
        copied_bytes: 0,
        elapsed_ms: 0,
    }
}
