//! The order in which a node serves the data requests waiting for its I/O threads: reserves
//! first, then recovery and clients by the recovery share, then the volumes by weight.
//!
//! When requests come faster than the node's disk serves them, they wait in this queue, and
//! the order it gives decides who gets the node. First come, first served lets one busy
//! volume (a backup, a `dd`) or a rebuild after an outage take the node from every other
//! volume. The order here is mClock's (Gulati et al., OSDI 2010), as Ceph's OSDs use it:
//!
//! | step | who | rule |
//! |---|---|---|
//! | 1 | a volume behind its **reserve** | the volume whose reserved unit is due earliest |
//! | 2 | **recovery** against clients | start-time fair queueing of the two, each tag moved on by work over share: recovery gets `share` of the work served while both wait, all of it when clients do not |
//! | 3 | the volumes by **weight** | start-time fair queueing: the smallest virtual start tag; a volume gets a share in proportion to its weight |
//!
//! Two measures of a request: its **units**, its length in 8 KiB units (as the writer's limits
//! and S2D's policies count IOPS), at least one and at most [`MAX_COST`], which reserves count;
//! and its **work**, an estimate of the disk's time, [`PER_IO`] units for the request plus its
//! units, which the recovery share and the weights divide. Counted in units alone, a resync's
//! 1 MiB copy cost 128 random 4 KiB reads, where a disk spends 2 to 20 times one read's time on
//! it: behind a busy volume, at a 20% share, each copy waited for 512 reads, and a resync
//! never finished. (Ceph's mClock charges a request likewise: a cost per I/O plus its bytes.)
//! Service from weights counts towards a volume's reserve and service from its reserve does not
//! count against its weight (mClock's rule): a busy volume gets at least its reserve, or more if
//! its weight gives it more. A volume that goes idle saves nothing up: when it has
//! requests again its reserve counts from now and its tag from the queue's virtual time. A
//! reserve the node cannot serve keeps at most [`MAX_DEBT_NS`] of debt.
//!
//! The scheduler is work-conserving (a thread never idles while a request waits) and reads no
//! clock: the caller passes the time.

use std::collections::{HashMap, VecDeque};

/// Virtual time one cost unit takes at weight 1.
const V: u64 = 1 << 20;
const NS: u64 = 1_000_000_000;
/// The most a volume's reserve may fall behind: after the node could not serve its reserve for
/// a while, it catches up at most this much time's worth ahead of the others.
pub(crate) const MAX_DEBT_NS: u64 = 100_000_000;
/// A request's own part of its work, in 8 KiB units: a 4 KiB read is 17, a 1 MiB write 144
/// (a flash drive spends about 5-10 times a small read's time on 1 MiB, a spinning disk 2).
pub(crate) const PER_IO: u64 = 16;
/// The most one request costs here (a request's length comes from the wire before it is
/// checked; a valid one is at most 32 MiB, 4,096 units).
const MAX_COST: u64 = 1 << 16;
pub use trireme_replication::qos::MAX_WEIGHT;
/// Recovery's share of a busy node when its flag does not say, in percent.
pub const DEFAULT_RECOVERY_SHARE: u32 = 20;

/// Who a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// A volume's client I/O (from its writer).
    Client(u64),
    /// Resync, repair, scrub and drain copies (the request has `FLAG_RECOVERY`).
    Recovery,
}

/// A volume's claim on a busy node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// 8 KiB units a second the volume gets whatever the others do (0: none).
    pub reserve: u64,
    /// Its part of what is left, against the other volumes' (1 to [`MAX_WEIGHT`]).
    pub weight: u32,
}

impl Share {
    /// The claim a volume's settings give it.
    pub fn of(limits: &trireme_replication::qos::Limits) -> Share {
        let (reserve, weight) = limits.claim();
        Share { reserve, weight }
    }
}

impl Default for Share {
    fn default() -> Share {
        Share {
            reserve: 0,
            weight: 1,
        }
    }
}

#[derive(Debug)]
struct Flow<J> {
    jobs: VecDeque<(J, u64)>,
    /// When its next reserved unit is due (ns).
    due: u64,
    /// Its virtual start tag.
    tag: u64,
}

/// The waiting requests, in the order they are to be served.
#[derive(Debug)]
pub(crate) struct Scheduler<J> {
    flows: HashMap<u64, Flow<J>>,
    /// Volumes with requests waiting.
    backlog: Vec<u64>,
    recovery: VecDeque<(J, u64)>,
    shares: HashMap<u64, Share>,
    /// The clients' virtual time: the start tag of the last request served by weight.
    vclock: u64,
    /// Recovery's and the clients' start tags for step 2 (of their next request), and the
    /// start tag of the last request step 2 served.
    recovery_v: u64,
    clients_v: u64,
    level_v: u64,
    /// Recovery's share, in percent (1 to 99).
    recovery_share: u32,
    len: usize,
}

impl<J> Default for Scheduler<J> {
    fn default() -> Self {
        Scheduler {
            flows: HashMap::new(),
            backlog: Vec::new(),
            recovery: VecDeque::new(),
            shares: HashMap::new(),
            vclock: 0,
            recovery_v: 0,
            clients_v: 0,
            level_v: 0,
            recovery_share: DEFAULT_RECOVERY_SHARE,
            len: 0,
        }
    }
}

impl<J> Scheduler<J> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Recovery's share of a busy node in percent, kept within 1 to 99 (recovery never
    /// stalls, nor takes every turn while clients wait).
    pub(crate) fn set_recovery_share(&mut self, percent: u32) {
        self.recovery_share = percent.clamp(1, 99);
    }

    /// `volume`'s claim from now on (the default share forgets it).
    pub(crate) fn set_share(&mut self, volume: u64, share: Share) {
        let share = Share {
            weight: share.weight.clamp(1, MAX_WEIGHT),
            ..share
        };
        if share == Share::default() {
            self.shares.remove(&volume);
        } else {
            self.shares.insert(volume, share);
        }
    }

    /// Every volume's claim from now on: those not in `shares` get the default.
    pub(crate) fn set_shares(&mut self, shares: HashMap<u64, Share>) {
        self.shares.clear();
        for (v, s) in shares {
            self.set_share(v, s);
        }
    }

    /// Forgets `volume` (its replica was deleted); requests of it still queued are served.
    pub(crate) fn forget(&mut self, volume: u64) {
        self.shares.remove(&volume);
        if self.flows.get(&volume).is_some_and(|f| f.jobs.is_empty()) {
            self.flows.remove(&volume);
        }
    }

    pub(crate) fn share(&self, volume: u64) -> Share {
        self.shares.get(&volume).copied().unwrap_or_default()
    }

    /// Queues `job` of `units` (8 KiB units; at least 1) for `class`, at `now` (ns).
    pub(crate) fn push(&mut self, class: Class, units: u64, job: J, now: u64) {
        let cost = units.clamp(1, MAX_COST);
        self.len += 1;
        match class {
            Class::Recovery => {
                if self.recovery.is_empty() {
                    self.recovery_v = self.recovery_v.max(self.level_v);
                }
                self.recovery.push_back((job, cost));
            }
            Class::Client(volume) => {
                if self.backlog.is_empty() {
                    self.clients_v = self.clients_v.max(self.level_v);
                }
                let flow = self.flows.entry(volume).or_insert_with(|| Flow {
                    jobs: VecDeque::new(),
                    due: now,
                    tag: 0,
                });
                if flow.jobs.is_empty() {
                    // Back from idle: nothing saved up.
                    flow.due = flow.due.max(now);
                    flow.tag = flow.tag.max(self.vclock);
                    self.backlog.push(volume);
                }
                flow.jobs.push_back((job, cost));
            }
        }
    }

    /// The next request to serve at `now` (ns), and who it is for.
    pub(crate) fn pop(&mut self, now: u64) -> Option<(J, Class)> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        if let Some(volume) = self.reserve_due(now) {
            return Some((self.serve_client(volume, now, false), Class::Client(volume)));
        }
        let recovery_turn = !self.recovery.is_empty()
            && (self.backlog.is_empty() || self.recovery_v <= self.clients_v);
        if recovery_turn {
            let (job, cost) = self.recovery.pop_front().expect("not empty");
            self.level_v = self.level_v.max(self.recovery_v);
            self.recovery_v += work(cost) * V / u64::from(self.recovery_share);
            return Some((job, Class::Recovery));
        }
        let volume = self.lightest();
        Some((self.serve_client(volume, now, true), Class::Client(volume)))
    }

    /// The waiting volume whose reserved unit is due earliest, if one is due.
    fn reserve_due(&self, now: u64) -> Option<u64> {
        self.backlog
            .iter()
            .filter(|v| self.share(**v).reserve > 0)
            .map(|v| (self.flows[v].due, *v))
            .filter(|&(due, _)| due <= now)
            .min()
            .map(|(_, v)| v)
    }

    /// The waiting volume with the smallest start tag (the backlog is never empty here).
    fn lightest(&self) -> u64 {
        let (_, v) = self
            .backlog
            .iter()
            .map(|v| (self.flows[v].tag, *v))
            .min()
            .expect("a request is waiting");
        v
    }

    fn serve_client(&mut self, volume: u64, now: u64, by_weight: bool) -> J {
        let share = self.share(volume);
        let flow = self.flows.get_mut(&volume).expect("backlogged");
        let (job, cost) = flow.jobs.pop_front().expect("backlogged");
        if let Some(step) = (cost * NS).checked_div(share.reserve) {
            flow.due = flow.due.max(now.saturating_sub(MAX_DEBT_NS)) + step;
        }
        if by_weight {
            self.vclock = self.vclock.max(flow.tag);
            flow.tag += work(cost) * V / u64::from(share.weight);
        }
        self.level_v = self.level_v.max(self.clients_v);
        self.clients_v += work(cost) * V / u64::from(100 - self.recovery_share);
        if flow.jobs.is_empty() {
            let at = self.backlog.iter().position(|v| *v == volume);
            self.backlog.swap_remove(at.expect("backlogged"));
        }
        job
    }
}

/// A request's work: its own part and its units.
pub(crate) fn work(units: u64) -> u64 {
    PER_IO + units
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A node that serves one unit each `service` ns, with `flows` always having a request
    /// waiting (each a class and its units), for `units` of service: the requests each flow
    /// got.
    fn saturate(
        s: &mut Scheduler<usize>,
        flows: &[(Class, u64)],
        service: u64,
        units: u64,
    ) -> Vec<u64> {
        let mut now = 0;
        for (i, &(c, cost)) in flows.iter().enumerate() {
            s.push(c, cost, i, now);
        }
        let mut got = vec![0; flows.len()];
        let mut served = 0;
        while served < units {
            let (i, _) = s.pop(now).expect("always waiting");
            let (c, cost) = flows[i];
            got[i] += 1;
            served += cost;
            now += cost * service;
            s.push(c, cost, i, now);
        }
        got
    }

    #[test]
    fn one_volume_alone_is_served_in_order() {
        let mut s = Scheduler::default();
        for i in 0..10 {
            s.push(Class::Client(7), 1, i, 0);
        }
        let order: Vec<_> = std::iter::from_fn(|| s.pop(0).map(|(j, _)| j)).collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
        assert_eq!(s.len(), 0);
        assert!(s.backlog.is_empty());
        s.forget(7);
        assert!(s.flows.is_empty());
    }

    #[test]
    fn busy_volumes_share_by_weight_whatever_their_queue_depth() {
        let mut s = Scheduler::default();
        s.set_share(
            2,
            Share {
                reserve: 0,
                weight: 3,
            },
        );
        // Volume 1 has 8 requests waiting for each of volume 2's: first come, first served
        // would give it 8 turns in 9.
        let mut flows = vec![(Class::Client(1), 1); 8];
        flows.push((Class::Client(2), 1));
        let got = saturate(&mut s, &flows, 10_000, 40_000);
        let one: u64 = got[..8].iter().sum();
        let ratio = got[8] as f64 / one as f64;
        assert!((ratio - 3.0).abs() < 0.05, "weight 3 against 1: {ratio}");
    }

    #[test]
    fn a_reserve_holds_against_a_heavier_volume() {
        let mut s = Scheduler::default();
        // The node does 10,000 units a second; volume 1 has weight 9, volume 2 weight 1 and
        // a reserve of 3,000: by weight alone it would get 1,000.
        s.set_share(
            1,
            Share {
                reserve: 0,
                weight: 9,
            },
        );
        s.set_share(
            2,
            Share {
                reserve: 3_000,
                weight: 1,
            },
        );
        let got = saturate(
            &mut s,
            &[(Class::Client(1), 1), (Class::Client(2), 1)],
            100_000,
            50_000,
        );
        let share = got[1] as f64 / (got[0] + got[1]) as f64;
        // Its reserve (0.3), where its weight would give it 0.1.
        assert!((0.295..0.305).contains(&share), "{share}");
    }

    #[test]
    fn recovery_gets_its_share_when_clients_are_busy_and_all_when_they_are_not() {
        let mut s = Scheduler::default();
        s.set_recovery_share(25);
        let busy = saturate(
            &mut s,
            &[
                (Class::Client(1), 1),
                (Class::Client(2), 2),
                (Class::Recovery, 16),
            ],
            1_000,
            200_000,
        );
        // Shares of work: recovery's 1 MiB copies are not 16 times a 4 KiB read's.
        let w = [busy[0] * work(1), busy[1] * work(2), busy[2] * work(16)];
        let share = w[2] as f64 / w.iter().sum::<u64>() as f64;
        assert!((share - 0.25).abs() < 0.01, "{share}");
        // The two volumes split the rest evenly.
        assert!((w[0] as f64 / w[1] as f64 - 1.0).abs() < 0.01, "{w:?}");

        let mut s = Scheduler::default();
        let alone = saturate(&mut s, &[(Class::Recovery, 16)], 1_000, 10_000);
        assert_eq!(alone, vec![10_000 / 16]);
    }

    /// A resync's 1 MiB copies beside a volume's 4 KiB reads, at a 20% share: a copy is served
    /// after some 34 reads, not 512 (what counting units alone gave: a resync behind a busy
    /// volume then never finished).
    #[test]
    fn a_large_recovery_copy_waits_for_tens_of_small_reads_not_hundreds() {
        let mut s = Scheduler::default();
        let got = saturate(
            &mut s,
            &[(Class::Client(1), 1), (Class::Recovery, 128)],
            1_000,
            1_000_000,
        );
        let reads_per_copy = got[0] as f64 / got[1] as f64;
        assert!((30.0..40.0).contains(&reads_per_copy), "{got:?}");
    }

    #[test]
    fn an_idle_volume_saves_nothing_up() {
        let mut s = Scheduler::default();
        // Volume 1 runs alone for a long time, then volume 2 arrives: they alternate from
        // then on, volume 1 is not made to wait for what it got alone.
        let mut now = 0;
        for i in 0..1000 {
            s.push(Class::Client(1), 1, 1, now);
            assert_eq!(s.pop(now).map(|(j, _)| j), Some(1), "{i}");
            now += 1000;
        }
        s.push(Class::Client(1), 1, 1, now);
        s.push(Class::Client(2), 1, 2, now);
        let mut got = [0u32; 3];
        for _ in 0..100 {
            let (j, _) = s.pop(now).unwrap();
            got[j] += 1;
            s.push(Class::Client(j as u64), 1, j, now);
            now += 1000;
        }
        assert_eq!((got[1], got[2]), (50, 50));
    }

    proptest! {
        /// Whatever comes in, everything queued comes out once, and a volume's own requests
        /// keep their order.
        #[test]
        fn every_request_comes_out_once_in_its_volumes_order(
            ops in proptest::collection::vec((0u64..4, prop_oneof![9 => 1u64..20, 1 => any::<u64>()], any::<bool>(), 0u64..2_000_000), 1..300),
            reserves in proptest::collection::vec(0u64..5_000, 4),
            share in 1u32..100,
        ) {
            let mut s = Scheduler::default();
            s.set_recovery_share(share);
            for (v, r) in reserves.iter().enumerate() {
                s.set_share(v as u64, Share { reserve: *r, weight: (v as u32) + 1 });
            }
            let mut now = 0;
            let mut out = Vec::new();
            for (i, (v, cost, pop, dt)) in ops.iter().enumerate() {
                now += dt;
                let class = if *v == 3 { Class::Recovery } else { Class::Client(*v) };
                s.push(class, *cost, (i, class), now);
                if *pop {
                    let ((j, c), got) = s.pop(now).unwrap();
                    prop_assert_eq!(c, got);
                    out.push(j);
                }
            }
            while let Some(((j, _), _)) = s.pop(now) {
                out.push(j);
            }
            prop_assert_eq!(s.len(), 0);
            let mut sorted = out.clone();
            sorted.sort();
            prop_assert_eq!(sorted, (0..ops.len()).collect::<Vec<_>>());
            for v in 0..4 {
                let mine: Vec<_> = out.iter().filter(|&&j| ops[j].0 == v).collect();
                prop_assert!(mine.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
