//! A parity volume's core stepped directly: writes to each region's mirrored copies landing in
//! any order, nodes going down (up to M at once, the layout's tolerance) and coming back, some
//! having lost their data, their resyncs (mirrored blocks copied from a copy of the same
//! region, chunks of a node that lost its data rebuilt from K others), the writer restarting,
//! and the encoder and the fold-back carried out as the core hands them out, each step at a
//! moment of the seed's choosing.
//!
//! The model of a node: its mirrored blocks (block → the write that last landed there; absent:
//! never written, or trimmed) and its chunk slots ((region, slot, chunk, block) → the encode
//! that wrote it and the K data values it coded). A data chunk reads its own value; a lost one
//! is rebuilt from any K chunks in sync, which must come from one encode, or the rebuild is
//! garbage. A restarted writer rebuilds its overlay from the blocks the mirrors hold and first
//! makes the mirrors agree on them (as a mirror's writer reconciles after an unclean change).
//!
//! Checked, at every read the seed makes and for every block at the end: a block reads the
//! last acknowledged write to it, or one sent after it (not yet answered, or failed: NBD leaves
//! those undefined), never an older one; and at the end, the chunks of every stripe agree.
//! The checker's self-tests plant flaws ([`Sabotage`]); each must fail seeds. (Before discards
//! were modelled, an encoder reading without a hold failed none: a write acknowledged while
//! the encode runs is never trimmed by it. A discard sent as a trim before the encode began
//! and landing after its read is what needs the hold.)
//!
//! A discard is a trim (the copies drop the blocks) where no stripe is beneath, zeroes where
//! one is or is being made; either reads back as zeroes.
//!
//! A copy out of sync is sometimes replaced by a new node's, in its place (`node remove`):
//! the new node comes in empty and is rebuilt whole, and a restarted writer takes the
//! stripe's nodes in the record's order (the places), not by node id.
//!
//! Nodes also lose power, one at a time or all at once (`power.rs`): what was not flushed
//! may be lost, torn block by block, and the held maps' rules decide what the overlay is
//! after it. The client's flushes make every acknowledged write durable; after all nodes lost
//! power, a block reads the last write acknowledged before the last flush, or one after it.

use std::collections::{BTreeMap, BTreeSet};

use trireme_replication::{
    Action, Answers, ChunkRebuild, Decision, EncodeAction, EncodeEnd, EncodeStep, Input,
    MirrorCopy, Mirrored, Parity, ReadFrom, Refusal, Region, ReplicaOutcome, ReplicaState,
    ResyncStart, Ticket, VolumeCore, CHUNK_BLOCKS,
};

use crate::core_steps::{open_targets, progress};
use crate::Rng;

const BLOCK: u64 = 4096;
/// Events of the random part of a run.
const EVENTS: usize = 500;
/// Blocks written at the start of each chunk (few, so writes collide).
const HOT: u64 = 3;
/// The writer's slots: K+M and at most two replacements between restarts.
const SLOTS: usize = 8;

/// A flaw planted on purpose, for the checker's own test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    None,
    /// The encoder trims the mirrors without holding the region against writes.
    FreeWithoutHold,
    /// The encoder answers its chunk writes with one node's chunk never written.
    ChunkNotWritten,
    /// A resync copies a block from any copy in sync, whatever region it mirrors.
    CopyFromAnyNode,
    /// A discard is always sent as a trim, even over a stripe.
    TrimOverStripe,
    /// The encoder reads its region without holding it against requests in flight.
    ReadWithoutHold,
    /// A restarted writer orders the stripe's nodes by id, not in the record's order: a
    /// replacement's node then lands in another place.
    NodesById,
    /// The encoder's flush of the new chunks is answered without one: the map is switched and
    /// the mirrors freed while the stripe is not durable.
    FlushSkipped,
    /// A node makes a block's held bit durable with its write, before the data.
    HeldBeforeData,
    /// A reconcile trims the blocks its source does not hold on the other copies only: bytes
    /// the source kept without their held bit (a power loss) stay there alone.
    SourceGapsKept,
    /// A reconcile takes its source in the record's order, even a copy that lost power
    /// where another kept its history.
    LostAsSource,
    /// The restarted writer takes out every copy that lost its history while one kept its
    /// own, as for a mirror, even when the others cannot rebuild them.
    LostTakenOut,
}

/// What one run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub writes: u64,
    pub encodes: u64,
    pub fold_backs: u64,
    pub abandoned: u64,
    pub rebuilt_reads: u64,
    pub restarts: u64,
    pub lost_nodes: u64,
    pub resyncs: u64,
    pub chunks_rebuilt: u64,
    pub replaced: u64,
    pub flushes: u64,
    pub power_losses: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.writes += o.writes;
        self.encodes += o.encodes;
        self.fold_backs += o.fold_backs;
        self.abandoned += o.abandoned;
        self.rebuilt_reads += o.rebuilt_reads;
        self.restarts += o.restarts;
        self.lost_nodes += o.lost_nodes;
        self.resyncs += o.resyncs;
        self.chunks_rebuilt += o.chunks_rebuilt;
        self.replaced += o.replaced;
        self.flushes += o.flushes;
        self.power_losses += o.power_losses;
    }
}

/// One chunk block: the encode that wrote it and the K data values it coded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cell {
    encode: u64,
    data: Vec<u64>,
}

#[derive(Debug, Default)]
struct Node {
    up: bool,
    /// Changes when it comes back without its data.
    incarnation: u64,
    /// The incarnation the record names: the one last recorded in sync.
    recorded: u64,
    mirror: BTreeMap<u64, u64>,
    /// The blocks its held map sets (`power.rs`).
    held: BTreeSet<u64>,
    slots: BTreeMap<power::CellAt, Cell>,
    /// What a power loss leaves (`power.rs`).
    durable: power::Durable,
    /// Blocks written while it was out (the survivors' marks for it).
    missed: BTreeSet<u64>,
    /// Its resync's blocks still to copy, and chunks still to rebuild.
    to_copy: BTreeSet<u64>,
    rebuilds: Vec<ChunkRebuild>,
}

/// A resync copy of one block, holding (or waiting for) the block's range.
#[derive(Debug)]
struct Copy {
    place: Ticket,
    replica: usize,
    block: u64,
}

/// A write between its submit and its answers (`targets` empty while it waits).
#[derive(Debug)]
struct Write {
    place: Ticket,
    blocks: (u64, u64),
    seq: u64,
    targets: Vec<(usize, Option<ReplicaOutcome>)>,
}

#[derive(Debug)]
struct Encoder {
    region: u64,
    id: u64,
    place: Option<Ticket>,
    /// Per hot block of a chunk, the K data values read.
    read: Vec<Vec<u64>>,
    fold_back: bool,
    /// A trim of the mirrors sent (blocks, nodes), landing at the encoder's next event: writes
    /// may come meanwhile, and only the region's hold keeps them from landing first. With it,
    /// a fold-back's trim of the stripe it replaced (dropped from the nodes).
    trim: Option<(Vec<u64>, Vec<u32>, Vec<trireme_replication::ChunkAt>)>,
}

struct Run {
    rng: Rng,
    sabotage: Sabotage,
    parity: Parity,
    regions: u64,
    core: VolumeCore,
    /// Indexed by the core's slots (node id: slot + 1); a replaced node stays, out of the
    /// set, until a restart compacts them.
    nodes: Vec<Node>,
    /// The nodes in the stripe's places (the record's order).
    members: Vec<usize>,
    writes: Vec<Write>,
    copies: Vec<Copy>,
    gate: Vec<(u64, u64, u64)>,
    encoder: Option<Encoder>,
    /// The regions as the record keeps them (a switch writes here).
    recorded: Vec<Region>,
    seq: u64,
    /// Per block, the last acknowledged write, and every write sent to it.
    acked: BTreeMap<u64, u64>,
    /// `acked` at the last client flush: what survives every node losing power.
    floor: BTreeMap<u64, u64>,
    sent: BTreeMap<u64, BTreeSet<u64>>,
    /// Discards: all read back as zeroes; trims drop the blocks where they land.
    zeroes: BTreeSet<u64>,
    trims: BTreeSet<u64>,
    counts: Counts,
    /// `TRIREME_SIM_TRACE` set: every step is printed.
    trace: bool,
}

macro_rules! trace {
    ($r:expr, $($a:tt)*) => {
        if $r.trace {
            eprintln!($($a)*);
        }
    };
}

mod encoder;
mod power;
mod restart;
mod resync;

/// One run of seed `seed`: what it did, or the first broken guarantee.
pub fn run(seed: u64, sabotage: Sabotage) -> Result<Counts, String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let parity = match rng.below(2) {
        0 => Parity {
            data: 2,
            parity: 1,
            mirror_share: 20,
        },
        _ => Parity {
            data: 4,
            parity: 2,
            mirror_share: 20,
        },
    };
    let regions = 2 + rng.below(2);
    let width = usize::from(parity.data + parity.parity);
    let nodes = (0..width)
        .map(|_| Node {
            up: true,
            incarnation: 1,
            recorded: 1,
            ..Node::default()
        })
        .collect();
    let mut r = Run {
        rng,
        sabotage,
        parity,
        regions,
        core: VolumeCore::new(&[], 0, true, 1),
        nodes,
        members: (0..width).collect(),
        writes: Vec::new(),
        copies: Vec::new(),
        gate: Vec::new(),
        encoder: None,
        recorded: vec![Region::Mirror; regions as usize],
        seq: 0,
        acked: BTreeMap::new(),
        floor: BTreeMap::new(),
        sent: BTreeMap::new(),
        zeroes: BTreeSet::new(),
        trims: BTreeSet::new(),
        counts: Counts::default(),
        trace: std::env::var_os("TRIREME_SIM_TRACE").is_some(),
    };
    r.core = r.new_core(|_| ReplicaState::InSync)?;
    for _ in 0..EVENTS {
        r.event()?;
    }
    r.settle()?;
    Ok(r.counts)
}

impl Run {
    fn region_blocks(&self) -> u64 {
        u64::from(self.parity.data) * CHUNK_BLOCKS
    }

    fn new_core(&self, state: impl Fn(usize) -> ReplicaState) -> Result<VolumeCore, String> {
        let states: Vec<(u32, ReplicaState)> = (0..self.nodes.len())
            .map(|i| (i as u32 + 1, state(i)))
            .collect();
        let mut core = VolumeCore::new(&states, 0, true, SLOTS)
            .with_stripes(self.parity, self.regions * self.region_blocks() * BLOCK)
            .map_err(|e| e.to_string())?;
        for i in 0..states.len() {
            core.attached(i, self.nodes[i].recorded);
        }
        Ok(core)
    }

    fn event(&mut self) -> Result<(), String> {
        // A node down stops encodes (a stripe is made on all K+M nodes), so nodes go down
        // seldom: about two a run.
        match self.rng.below(28) {
            0..=5 => self.write(),
            6..=12 => self.deliver(),
            13..=17 => self.encode(),
            18 | 19 => {
                let b = self.hot_block();
                let v = self.read(b)?;
                self.check(b, v)
            }
            20 if self.rng.chance(0.1) => {
                self.lose_node();
                Ok(())
            }
            21 if self.rng.chance(0.25) => match self.rng.chance(0.3) {
                true => self.power_loss_many(),
                false => self.restart(),
            },
            22..=24 => self.resync_step(),
            25 if self.rng.chance(0.3) => self.come_back(),
            26 if self.rng.chance(0.15) => self.replace(),
            27 => self.client_flush(),
            _ => self.retry_gate(),
        }
    }

    /// A block at the start of some chunk of some region.
    fn hot_block(&mut self) -> u64 {
        let region = self.rng.below(self.regions);
        let chunk = self.rng.below(u64::from(self.parity.data));
        region * self.region_blocks() + chunk * CHUNK_BLOCKS + self.rng.below(HOT)
    }

    fn write(&mut self) -> Result<(), String> {
        let at = self.hot_block();
        let len = 1 + self.rng.below(HOT - at % CHUNK_BLOCKS);
        self.seq += 1;
        if self.rng.chance(0.2) {
            self.zeroes.insert(self.seq);
            let zeroes = self.core.trim_needs_zeroes(at * BLOCK, len * BLOCK);
            if !zeroes || self.sabotage == Sabotage::TrimOverStripe {
                self.trims.insert(self.seq);
            }
        }
        self.submit(at, at + len, self.seq)
    }

    fn submit(&mut self, start: u64, end: u64, seq: u64) -> Result<(), String> {
        let request = data(start, end);
        let (place, targets) = match self.core.step(Input::Submit(request)).pop() {
            Some(Action::Proceed {
                place: Some(p),
                targets,
            }) => (p, targets),
            Some(Action::Wait { place }) => (place, Vec::new()),
            Some(Action::Short) => {
                self.gate.push((start, end, seq));
                return Ok(());
            }
            other => return Err(format!("a write's submit: {other:?}")),
        };
        for b in start..end {
            self.sent.entry(b).or_default().insert(seq);
        }
        if !targets.is_empty() {
            self.mark_missed((start, end), &targets);
        }
        trace!(
            self,
            "write {seq} {start}..{end} place {place} -> {targets:?}"
        );
        self.writes.push(Write {
            place,
            blocks: (start, end),
            seq,
            targets: targets.into_iter().map(|t| (t, None)).collect(),
        });
        Ok(())
    }

    /// One target of one write in flight gets it, or fails it (its node is lost).
    fn deliver(&mut self) -> Result<(), String> {
        let open = open_targets(&self.writes, |w| &w.targets);
        let Some(&(k, j)) = open.get(self.rng.below(open.len() as u64) as usize) else {
            return Ok(());
        };
        let (i, seq, blocks) = {
            let w = &self.writes[k];
            (w.targets[j].0, w.seq, w.blocks)
        };
        let up = self.nodes[i].up;
        trace!(self, "write {seq} lands on {i}: {up}");
        if up {
            for b in blocks.0..blocks.1 {
                match self.trims.contains(&seq) {
                    true => self.nodes[i].trim(b),
                    false => self.land(i, b, seq),
                }
            }
        }
        self.writes[k].targets[j].1 = Some(match up {
            true => ReplicaOutcome::Done,
            false => ReplicaOutcome::Failed,
        });
        if self.writes[k].targets.iter().all(|t| t.1.is_some()) {
            let w = self.writes.remove(k);
            self.answered(w)?;
        }
        Ok(())
    }

    fn answered(&mut self, w: Write) -> Result<(), String> {
        let targets: Vec<usize> = w.targets.iter().map(|t| t.0).collect();
        let outcomes: Vec<ReplicaOutcome> = w.targets.iter().filter_map(|t| t.1).collect();
        let answers = Answers {
            place: Some(w.place),
            request: data(w.blocks.0, w.blocks.1),
            targets: &targets,
            outcomes: &outcomes,
            from_reserve: false,
        };
        let mut release = false;
        for a in self.core.step(Input::Answered(answers)) {
            match a {
                Action::Granted { places } => self.granted(places),
                Action::Ack { .. } => {}
                Action::Carry(Decision::TakeOut { replicas, .. }) => {
                    for &i in &replicas {
                        self.nodes[i].missed.extend(w.blocks.0..w.blocks.1);
                    }
                    self.take_out(&replicas)?;
                    release = true;
                }
                other => return Err(format!("write {} answered: {other:?}", w.seq)),
            }
        }
        for b in w.blocks.0..w.blocks.1 {
            self.acked.insert(b, w.seq);
        }
        trace!(self, "write {} acked", w.seq);
        self.counts.writes += 1;
        if release {
            self.release(w.place);
        }
        Ok(())
    }

    fn release(&mut self, place: Ticket) {
        for a in self.core.step(Input::Release(place)) {
            if let Action::Granted { places } = a {
                self.granted(places);
            }
        }
    }

    /// Waiting writes go to the targets their grant names (a hold's grant sends nothing).
    fn granted(&mut self, places: Vec<(Ticket, Vec<usize>)>) {
        for (p, targets) in places {
            if let Some(k) = self.writes.iter().position(|w| w.place == p) {
                let blocks = self.writes[k].blocks;
                self.mark_missed(blocks, &targets);
                self.writes[k].targets = targets.into_iter().map(|t| (t, None)).collect();
            }
        }
    }

    /// The survivors mark a write for every copy it does not go to, and for every copy not
    /// in sync even if it goes to it (so a resync cut short still finds it marked); copies not
    /// mirroring its region skip it when they resync.
    fn mark_missed(&mut self, blocks: (u64, u64), targets: &[usize]) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if !targets.contains(&i) || self.core.set().state(i) != ReplicaState::InSync {
                node.missed.extend(blocks.0..blocks.1);
            }
        }
    }

    /// Takes replicas out, recorded and marked, as a failed write does; a resync cut short
    /// leaves what it had still to copy missed again.
    fn take_out(&mut self, failed: &[usize]) -> Result<(), String> {
        trace!(self, "take out {failed:?}");
        for &i in failed {
            let node = &mut self.nodes[i];
            let rest = std::mem::take(&mut node.to_copy);
            node.missed.extend(rest);
            node.rebuilds.clear();
            if self.core.resyncing(i) {
                self.core.resync_failed(i);
            }
        }
        let up: Vec<bool> = self.nodes.iter().map(|n| n.up).collect();
        crate::core_steps::take_out(&mut self.core, failed, |i| up[i])
    }

    /// A node goes down, while fewer than M are out (the layout's tolerance): down, not in
    /// sync, or about to be taken out (a write it failed is not answered yet).
    fn lose_node(&mut self) {
        let failing = |i: usize| {
            self.writes
                .iter()
                .any(|w| w.targets.contains(&(i, Some(ReplicaOutcome::Failed))))
        };
        let out = self
            .members
            .iter()
            .filter(|&&i| {
                !self.nodes[i].up || self.core.set().state(i) != ReplicaState::InSync || failing(i)
            })
            .count();
        if out < usize::from(self.parity.parity) {
            let i = self.members[self.rng.below(self.members.len() as u64) as usize];
            if self.nodes[i].up {
                trace!(self, "node {i} down");
                self.nodes[i].up = false;
                self.counts.lost_nodes += 1;
                if self.rng.chance(0.5) {
                    self.power_loss(i);
                }
            }
        }
    }

    /// What block `b` reads now, as the core routes it; a node found lost is taken out and the
    /// read routed again.
    fn read(&mut self, b: u64) -> Result<u64, String> {
        for _ in 0..=self.nodes.len() {
            let route = match self.core.parity_read(b) {
                Some(Ok(r)) => r,
                other => {
                    return Err(format!(
                        "block {b} reads from nowhere: {other:?}; states {:?}, up {:?}",
                        self.core.set().states(),
                        self.nodes.iter().map(|n| n.up).collect::<Vec<_>>()
                    ))
                }
            };
            let sources: Vec<usize> = match &route {
                ReadFrom::Mirror(nodes) => {
                    let k = self.rng.below(nodes.len() as u64) as usize;
                    vec![nodes[k] as usize - 1]
                }
                ReadFrom::Chunk(at) => vec![at.node as usize - 1],
                ReadFrom::Rebuild { from, .. } => {
                    from.iter().map(|c| c.node as usize - 1).collect()
                }
            };
            if let Some(&down) = sources.iter().find(|&&i| !self.nodes[i].up) {
                self.take_out(&[down])?;
                continue;
            }
            let v = self.read_from(b, &route, sources[0]);
            trace!(self, "read {b} via {route:?} from {}: {v:?}", sources[0]);
            return v;
        }
        Err(format!("block {b}: every route met a lost node"))
    }

    fn read_from(&mut self, b: u64, route: &ReadFrom, first: usize) -> Result<u64, String> {
        let cell = |c: &trireme_replication::ChunkAt| {
            self.nodes[c.node as usize - 1]
                .slots
                .get(&(c.region, c.slot, c.chunk, c.block))
                .cloned()
        };
        match route {
            ReadFrom::Mirror(_) => Ok(self.nodes[first].mirror.get(&b).copied().unwrap_or(0)),
            ReadFrom::Chunk(at) => Ok(cell(at).map_or(0, |c| c.data[at.chunk])),
            ReadFrom::Rebuild { lost, from } => {
                self.counts.rebuilt_reads += 1;
                let cells: Vec<Option<Cell>> = from.iter().map(cell).collect();
                let Some(Some(first)) = cells.first() else {
                    return Ok(0);
                };
                if cells.iter().any(|c| c.as_ref() != Some(first)) {
                    return Err(format!(
                        "block {b} rebuilt from chunks of different encodes: {cells:?}"
                    ));
                }
                Ok(first.data[*lost])
            }
        }
    }

    /// A read of `b` saw write `v`: the last acknowledged one, or one sent after it.
    fn check(&self, b: u64, v: u64) -> Result<(), String> {
        let acked = self.acked.get(&b).copied().unwrap_or(0);
        let zero = |s: u64| s == 0 || self.zeroes.contains(&s);
        let later = || {
            self.sent
                .get(&b)
                .into_iter()
                .flat_map(|s| s.range(acked + 1..))
        };
        let sent_after = v > acked && later().any(|&s| s == v);
        // What a discard leaves reads as zeroes, whether a trim or zeroes left it.
        let same = v == acked || (zero(v) && zero(acked));
        let zeroed_after = zero(v) && later().any(|&s| zero(s));
        if same || sent_after || zeroed_after {
            return Ok(());
        }
        Err(format!(
            "block {b} read write {v}, but write {acked} was acknowledged there (regions {:?})",
            self.recorded
        ))
    }

    fn retry_gate(&mut self) -> Result<(), String> {
        for (start, end, seq) in std::mem::take(&mut self.gate) {
            self.submit(start, end, seq)?;
        }
        Ok(())
    }

    // ---- the end ----------------------------------------------------------------------------

    /// Everything lands and the encoder finishes; then every block reads right and every
    /// stripe's chunks agree.
    fn settle(&mut self) -> Result<(), String> {
        for _ in 0..100_000 {
            let in_sync = self.core.set().in_sync().len() == self.members.len();
            if self.writes.is_empty()
                && self.gate.is_empty()
                && self.encoder.is_none()
                && self.copies.is_empty()
                && in_sync
            {
                return self.compare();
            }
            if let Some(&i) = self.members.iter().find(|&&i| !self.nodes[i].up) {
                self.back(i, false)?;
            }
            self.start_resyncs()?;
            self.deliver()?;
            self.resync_step()?;
            self.retry_gate()?;
            if self.encoder.is_some() {
                self.encode()?;
            }
        }
        Err(format!(
            "never settled: {} writes in flight, states {:?}",
            self.writes.len(),
            self.core.set().states()
        ))
    }

    fn compare(&mut self) -> Result<(), String> {
        for region in 0..self.regions {
            for c in 0..u64::from(self.parity.data) {
                for at in 0..HOT {
                    let b = region * self.region_blocks() + c * CHUNK_BLOCKS + at;
                    let v = self.read(b)?;
                    self.check(b, v)?;
                }
            }
            let Region::Parity { slot } = self.recorded[region as usize] else {
                self.mirrors_agree(region)?;
                continue;
            };
            let width = self.members.len();
            for at in 0..HOT {
                // The node in place p holds chunk p - region (mod K+M) of the stripe.
                let cells: Vec<(usize, Option<&Cell>)> = (0..width)
                    .map(|p| (p, self.members[p]))
                    .filter(|&(_, i)| self.nodes[i].up)
                    .map(|(p, i)| {
                        let chunk = (p + width - (region as usize % width)) % width;
                        (i, self.nodes[i].slots.get(&(region, slot, chunk, at)))
                    })
                    .collect();
                let first = cells[0].1;
                if first.is_none() || cells.iter().any(|c| c.1 != first) {
                    return Err(format!(
                        "region {region}'s stripe (slot {slot}) disagrees at block {at}: {cells:?}"
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

impl Run {
    /// Every copy of mirrored region `region` holds the same blocks.
    fn mirrors_agree(&self, region: u64) -> Result<(), String> {
        let Some(map) = self.core.region_map() else {
            return Ok(());
        };
        let mirrors = map.stripes().mirrors_of(region);
        let first = region * self.region_blocks();
        for b in first..first + self.region_blocks() {
            let held: Vec<Option<u64>> = mirrors
                .iter()
                .map(|&n| self.nodes[n as usize - 1].mirror.get(&b).copied())
                .collect();
            if held.iter().any(|h| *h != held[0]) {
                return Err(format!("mirrored block {b}: copies hold {held:?}"));
            }
        }
        Ok(())
    }
}

fn data(start: u64, end: u64) -> Mirrored {
    Mirrored::Data {
        offset: start * BLOCK,
        len: (end - start) * BLOCK,
    }
}
