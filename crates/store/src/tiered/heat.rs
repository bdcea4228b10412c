//! Heat per extent, and the migration plan it drives — both without I/O.
//!
//! Every small request adds one to the heat of the extents it touches; the heat halves every
//! second, so it tracks roughly twice the accesses of the last second. Requests that stream do
//! not heat: a large request (`STREAM_LEN` or more), or one that starts where one of the last
//! few requests ended (a scan in small pieces: `dd`, a backup, a resync). A full sequential
//! read of a volume therefore promotes nothing.
//!
//! [`plan`] turns the heat and the tiers of every extent on a node into moves, in the order to
//! run them: first what pins demand (a volume pinned to slow leaves the fast tier; one pinned
//! to fast gets its room, taken from the coldest unpinned extents), then what heat asks —
//! the hottest slow extent goes to a free fast place (any heat will do: free flash serves
//! nothing), or replaces the coldest fast extent if it is clearly hotter (more than twice as
//! hot plus one, so two extents of equal heat never swap back and forth, and a single access
//! never evicts anything).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::map::{Pin, Tier};

/// Requests of this size or more are streams: they do not heat.
pub const STREAM_LEN: u64 = 128 * 1024;
/// A request that starts at most this far after a recent one ended continues its stream: the
/// gap a scan in pieces under `STREAM_LEN`, spread over up to three copies, leaves on each.
pub const STREAM_GAP: u64 = 2 * STREAM_LEN;
/// Heat that earns free fast room. One access is enough there (free flash serves nothing);
/// taking a place from another extent needs more than twice its heat plus one, so at least 2.
pub const MIN_HEAT: u32 = 1;
/// Recent request ends remembered to spot scans in small pieces.
const STREAMS: usize = 8;
/// An extent not touched for more than this many decay periods counts as cold, whatever heat
/// it had: when the hot zone moves, the extents it left give their places up within seconds
/// instead of waiting for their heat to halve away.
const IDLE_PERIODS: u32 = 2;

thread_local! {
    static STREAM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a read) as part of a stream the caller recognized (the writer sees every piece of
/// a scan; a copy sees only those it serves): it heats nothing.
pub fn as_stream<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            STREAM.with(|b| b.set(self.0));
        }
    }
    let _reset = Reset(STREAM.with(|b| b.replace(true)));
    f()
}

fn in_stream() -> bool {
    STREAM.with(std::cell::Cell::get)
}

/// Heat of one replica's extents.
#[derive(Debug)]
pub struct Heat {
    shift: u32,
    heat: Vec<AtomicU32>,
    /// The decay period each extent was last touched in.
    last: Vec<AtomicU32>,
    period: AtomicU32,
    ends: [AtomicU64; STREAMS],
    next: AtomicUsize,
}

impl Heat {
    /// Heat for `extents` extents of `1 << shift` bytes.
    pub fn new(extents: u64, shift: u32) -> Heat {
        Heat {
            shift,
            heat: (0..extents).map(|_| AtomicU32::new(0)).collect(),
            last: (0..extents).map(|_| AtomicU32::new(0)).collect(),
            period: AtomicU32::new(0),
            ends: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            next: AtomicUsize::new(0),
        }
    }

    /// Keeps heat for `extents` extents: those past it go, new ones start cold.
    pub fn resize(&mut self, extents: u64) {
        self.heat
            .resize_with(extents as usize, || AtomicU32::new(0));
        self.last
            .resize_with(extents as usize, || AtomicU32::new(0));
    }

    /// Counts one request of `len` bytes at `offset`; true if it heated (was not a stream).
    pub fn touch(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len).filter(|_| len > 0) else {
            return false;
        };
        // A scan in small pieces: it starts where a recent request ended, or a little after
        // (reads rotate over the copies, so each copy sees every second or third piece of a
        // scan). Racy by design (two threads may pick the same slot); a lost end costs one
        // extent one unit of heat.
        if let Some(slot) = self.ends.iter().find(|e| {
            offset
                .checked_sub(e.load(Ordering::Relaxed))
                .is_some_and(|gap| gap <= STREAM_GAP)
        }) {
            slot.store(end, Ordering::Relaxed);
            return false;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % STREAMS;
        self.ends[i].store(end, Ordering::Relaxed);
        if len >= STREAM_LEN || in_stream() {
            return false;
        }
        for e in offset >> self.shift..=(end - 1) >> self.shift {
            self.add(e, 1);
        }
        true
    }

    /// Whether [`Heat::touch`] would count a request now (it changes nothing).
    pub fn would_heat(&self, offset: u64, len: u64) -> bool {
        len > 0
            && len < STREAM_LEN
            && !in_stream()
            && !self.ends.iter().any(|e| {
                offset
                    .checked_sub(e.load(Ordering::Relaxed))
                    .is_some_and(|gap| gap <= STREAM_GAP)
            })
    }

    /// Halves every extent's heat (called once a second), rounding down.
    pub fn decay(&self) {
        self.period.fetch_add(1, Ordering::Relaxed);
        for h in &self.heat {
            let v = h.load(Ordering::Relaxed);
            if v != 0 {
                // A concurrent touch between load and store loses one unit: harmless.
                h.store(v / 2, Ordering::Relaxed);
            }
        }
    }

    /// The extent's heat; 0 if it has not been touched for more than `IDLE_PERIODS`.
    pub fn get(&self, extent: u64) -> u32 {
        let (Some(h), Some(l)) = (
            self.heat.get(extent as usize),
            self.last.get(extent as usize),
        ) else {
            return 0;
        };
        let idle = self
            .period
            .load(Ordering::Relaxed)
            .wrapping_sub(l.load(Ordering::Relaxed));
        if idle > IDLE_PERIODS {
            0
        } else {
            h.load(Ordering::Relaxed)
        }
    }

    /// Adds heat to an extent (this copy's reads, or another copy's the writer told of).
    pub fn add(&self, extent: u64, heat: u32) {
        if let (Some(h), Some(l)) = (
            self.heat.get(extent as usize),
            self.last.get(extent as usize),
        ) {
            // Saturating: a counter that wrapped would turn the hottest extent cold.
            let _ = h.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(heat))
            });
            l.store(self.period.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// One extent as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub volume: u64,
    pub extent: u64,
    pub heat: u32,
    pub tier: Tier,
    pub pin: Pin,
}

/// A move to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub volume: u64,
    pub extent: u64,
    pub to: Tier,
}

fn to(v: &View, tier: Tier) -> Move {
    Move {
        volume: v.volume,
        extent: v.extent,
        to: tier,
    }
}

/// The moves that bring a node's extents closer to what pins and heat ask, with `capacity`
/// fast places, at most `limit` of them, in order (see the module docs).
pub fn plan(views: &[View], capacity: u64, limit: usize) -> Vec<Move> {
    let mut moves = Vec::new();
    let mut used = views.iter().filter(|v| v.tier == Tier::Fast).count() as u64;
    // Pinned to slow: leave the fast tier.
    for v in views
        .iter()
        .filter(|v| v.pin == Pin::Slow && v.tier == Tier::Fast)
    {
        moves.push(to(v, Tier::Slow));
        used -= 1;
    }
    let mut auto_fast: Vec<&View> = views
        .iter()
        .filter(|v| v.pin == Pin::Auto && v.tier == Tier::Fast)
        .collect();
    auto_fast.sort_by_key(|v| (v.heat, v.volume, v.extent));
    let mut coldest = auto_fast.into_iter();
    // Pinned to fast: make room among the unpinned, then move in.
    let pinned: Vec<&View> = views
        .iter()
        .filter(|v| v.pin == Pin::Fast && v.tier == Tier::Slow)
        .collect();
    let mut need = pinned.len() as u64;
    while used + need > capacity {
        let Some(c) = coldest.next() else { break };
        moves.push(to(c, Tier::Slow));
        used -= 1;
    }
    for v in pinned {
        if used >= capacity {
            break;
        }
        moves.push(to(v, Tier::Fast));
        used += 1;
        need -= 1;
    }
    // Heat: the hottest slow extents, into free places or over clearly colder ones.
    let mut hot: Vec<&View> = views
        .iter()
        .filter(|v| v.pin == Pin::Auto && v.tier == Tier::Slow && v.heat >= MIN_HEAT)
        .collect();
    hot.sort_by_key(|v| (std::cmp::Reverse(v.heat), v.volume, v.extent));
    let mut free = capacity.saturating_sub(used + need);
    for p in hot {
        if moves.len() >= limit {
            break;
        }
        if free > 0 {
            moves.push(to(p, Tier::Fast));
            free -= 1;
            continue;
        }
        match coldest.next() {
            Some(c) if p.heat > c.heat.saturating_mul(2) + 1 => {
                moves.push(to(c, Tier::Slow));
                moves.push(to(p, Tier::Fast));
            }
            _ => break,
        }
    }
    moves.truncate(limit);
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_random_requests_heat_and_streams_do_not() {
        let h = Heat::new(16, 20);
        assert!(h.touch(5 << 20, 4096));
        assert!(h.touch(9 << 20, 4096));
        assert_eq!(h.get(5), 1);
        // A scan in 4 KiB pieces from 2 MiB: only its first piece heats.
        let heated = (0..256u64)
            .filter(|i| h.touch((2 << 20) + i * 4096, 4096))
            .count();
        assert_eq!(heated, 1);
        // So does a scan in 64 KiB pieces of which this copy sees every third.
        let heated = (0..40u64)
            .filter(|i| h.touch((10 << 20) + i * 3 * 65536, 65536))
            .count();
        assert_eq!(heated, 1);
        // Large requests never heat.
        assert!(!h.would_heat(12 << 20, 1 << 20));
        assert!(!h.touch(12 << 20, 1 << 20));
        assert!(h.would_heat(14 << 20, 4096));
        assert!(
            !h.would_heat((2 << 20) + 256 * 4096, 4096),
            "the scan's next piece"
        );
        assert_eq!(h.get(12), 0);
        // A request across two extents heats both.
        assert!(h.touch((7 << 20) - 2048, 4096));
        assert_eq!((h.get(6), h.get(7)), (1, 1));
    }

    #[test]
    fn reads_the_caller_marks_as_a_stream_do_not_heat() {
        let h = Heat::new(4, 20);
        assert!(!as_stream(|| h.would_heat(1 << 20, 4096)));
        assert!(!as_stream(|| h.touch(1 << 20, 4096)));
        assert_eq!(h.get(1), 0);
        assert!(h.touch(3 << 20, 4096), "the marker is gone after the call");
    }

    #[test]
    fn an_extent_left_alone_turns_cold_at_once() {
        let h = Heat::new(2, 20);
        h.add(0, 1000);
        h.decay();
        h.decay();
        assert_eq!(h.get(0), 250);
        h.decay();
        assert_eq!(h.get(0), 0, "idle for three periods");
        h.add(0, 1);
        assert_eq!(h.get(0), 126, "touched again: its heat counts again");
    }

    #[test]
    fn heat_halves_and_reaches_zero() {
        let h = Heat::new(2, 20);
        h.add(1, 9);
        h.decay();
        assert_eq!(h.get(1), 4);
        for _ in 0..3 {
            h.decay();
        }
        assert_eq!(h.get(1), 0);
        h.add(1, u32::MAX);
        h.add(1, 5);
        assert_eq!(h.get(1), u32::MAX, "heat saturates");
    }

    fn v(extent: u64, heat: u32, tier: Tier, pin: Pin) -> View {
        View {
            volume: 1,
            extent,
            heat,
            tier,
            pin,
        }
    }

    #[test]
    fn hot_extents_fill_free_room_hottest_first() {
        let views = [
            v(0, 1, Tier::Slow, Pin::Auto),
            v(1, 9, Tier::Slow, Pin::Auto),
            v(2, 5, Tier::Slow, Pin::Auto),
            v(3, 7, Tier::Slow, Pin::Auto),
        ];
        let m = plan(&views, 2, 10);
        assert_eq!(
            m,
            vec![to(&views[1], Tier::Fast), to(&views[3], Tier::Fast)]
        );
        assert_eq!(plan(&views, 2, 1).len(), 1);
    }

    #[test]
    fn a_hot_extent_replaces_only_a_clearly_colder_one() {
        let views = [
            v(0, 4, Tier::Fast, Pin::Auto),
            v(1, 8, Tier::Slow, Pin::Auto),
            v(2, 10, Tier::Slow, Pin::Auto),
        ];
        // 10 > 2*4+1: swap; 8 is not: stop.
        assert_eq!(
            plan(&views, 1, 10),
            vec![to(&views[0], Tier::Slow), to(&views[2], Tier::Fast)]
        );
    }

    #[test]
    fn pins_come_first_and_take_room_from_the_coldest() {
        let views = [
            v(0, 50, Tier::Fast, Pin::Auto),
            v(1, 3, Tier::Fast, Pin::Auto),
            View {
                volume: 2,
                ..v(0, 0, Tier::Slow, Pin::Fast)
            },
            View {
                volume: 3,
                ..v(0, 0, Tier::Fast, Pin::Slow)
            },
        ];
        let m = plan(&views, 2, 10);
        assert_eq!(
            m,
            vec![
                to(&views[3], Tier::Slow),
                to(&views[1], Tier::Slow),
                to(&views[2], Tier::Fast)
            ]
        );
    }

    fn view() -> impl Strategy<Value = View> {
        (0u32..20, any::<bool>(), 0u8..3).prop_map(|(heat, fast, pin)| View {
            volume: 0,
            extent: 0,
            heat,
            tier: if fast { Tier::Fast } else { Tier::Slow },
            pin: Pin::from_code(pin).unwrap(),
        })
    }

    proptest! {
        /// Run in order, a plan never holds more than the capacity on the fast tier once it
        /// starts within it, moves each extent at most once, never against its pin, and
        /// never promotes a cold unpinned extent.
        #[test]
        fn plans_respect_capacity_and_pins(
            mut views in proptest::collection::vec(view(), 0..60),
            capacity in 0u64..30,
            limit in 0usize..80,
        ) {
            for (i, v) in views.iter_mut().enumerate() {
                v.extent = i as u64;
            }
            let fast0 = views.iter().filter(|v| v.tier == Tier::Fast).count() as u64;
            let moves = plan(&views, capacity, limit);
            prop_assert!(moves.len() <= limit);
            let mut tiers: Vec<Tier> = views.iter().map(|v| v.tier).collect();
            let mut used = fast0;
            for m in &moves {
                let v = &views[m.extent as usize];
                prop_assert_ne!(tiers[m.extent as usize], m.to, "moves an extent where it is");
                prop_assert_eq!(tiers[m.extent as usize], v.tier, "moves an extent twice");
                tiers[m.extent as usize] = m.to;
                match m.to {
                    Tier::Fast => {
                        prop_assert!(v.pin != Pin::Slow);
                        prop_assert!(v.pin == Pin::Fast || v.heat >= MIN_HEAT);
                        used += 1;
                        if fast0 <= capacity {
                            prop_assert!(used <= capacity);
                        }
                    }
                    Tier::Slow => {
                        prop_assert!(v.pin != Pin::Fast);
                        used -= 1;
                    }
                }
            }
        }
    }
}
