//! The simulator's own pieces: block stamps and the like.
use super::*;

#[test]
fn stamps_parse_and_reject_corruption() {
    let s = stamp(7, 42);
    assert_eq!(parse(7, &s), Ok(42));
    assert!(parse(8, &s).is_err(), "misplaced");
    let mut bad = s.to_vec();
    bad[4000] ^= 1;
    assert!(parse(7, &bad).is_err(), "torn");
    assert_eq!(parse(7, &[0u8; 4096]), Ok(0));
}

#[test]
fn a_seed_replays_the_same_run() {
    let a = run(&Config::new(11)).unwrap();
    let b = run(&Config::new(11)).unwrap();
    assert_eq!((a.writes, a.reads), (b.writes, b.reads));
    assert_eq!(a.faults, b.faults, "same faults at the same virtual times");
    assert!(!a.faults.is_empty());
}

/// The same with resyncs paced by a rate limit: the writer paces them by tokio's clock,
/// which is virtual here (it read the system's clock once, and such a seed did not replay).
#[test]
fn a_seed_with_a_resync_rate_replays_the_same_run() {
    const RATE: u64 = 64 << 10;
    let mut paced = 0;
    for seed in [11, 12, 13] {
        let mut c = Config::new(seed);
        c.resync_rate = Some(RATE);
        let a = run(&c).unwrap();
        let b = run(&c).unwrap();
        assert_eq!((a.writes, a.reads), (b.writes, b.reads));
        assert_eq!(a.faults, b.faults, "same faults at the same virtual times");
        // Paced in virtual time: each resync took as long as its bytes at the rate.
        for r in &a.resyncs {
            assert!(
                r.elapsed_ms + 1 >= r.done_bytes * 1000 / RATE,
                "seed {seed}: {r:?}"
            );
            paced += (r.done_bytes > 0) as u32;
        }
    }
    assert!(paced > 0, "no resync ran");
}

/// After a writer crash, the new writer compares only what the activity log shows: the
/// extents of the hot region (4 of 64 KiB), not the 16 MiB volume.
#[test]
fn reconciliation_is_bounded_by_the_activity_log() {
    let mut n = 0;
    for seed in 0..6 {
        let mut c = Config::new(seed);
        c.blocks = 4096;
        c.hot = 64;
        c.only_writer_crashes = true;
        let o = run(&c).unwrap();
        for r in &o.reconciles {
            assert!(!r.whole, "seed {seed}: {r:?}");
            assert!(r.compared_bytes <= 64 * BLOCK, "seed {seed}: {r:?}");
            n += 1;
        }
    }
    assert!(n > 5, "only {n} writer crashes");
}

/// The checker is not blind: when restarted nodes silently lose their data (see
/// `Config::sabotage`), some seed of forty must fail, of a mirror and of a parity volume.
#[test]
fn the_checker_is_not_blind() {
    let mirror: fn(u64) -> Config = Config::new;
    for (what, config) in [("mirror", mirror), ("parity", Config::parity)] {
        let caught = (0..40).any(|seed| {
            let mut c = config(seed);
            c.sabotage = true;
            run(&c).is_err()
        });
        assert!(
            caught,
            "forty sabotaged {what} runs passed: the checker sees nothing"
        );
    }
}

/// Nor is it blind to torn and lost writes: when a node cannot tell a power loss from a
/// process crash, some seed must fail. (Not so for a parity volume, rightly: over 400
/// seeds nothing was lost. The torn and lost writes lie in extents the copy's activity log
/// on disk still shows, and a parity copy's resync copies those again from another mirror,
/// where a mirror's trusts the survivors' records alone.)
#[test]
fn the_checker_sees_unnoticed_power_losses() {
    let caught = (0..40).any(|seed| {
        let mut c = Config::new(seed);
        c.sabotage_power_loss = true;
        run(&c).is_err()
    });
    assert!(caught, "forty runs with unnoticed power losses passed");
}

/// Nor to the held bits a node's process loses when it dies: with the live copies of the
/// held maps taken away (`Config::sabotage_live_held`), a whole-cluster crash leaves writes
/// acknowledged and not yet flushed in no mirror's map, so they read the stripe's older
/// bytes: some parity seed must fail, by a stale read.
#[test]
fn the_checker_sees_held_bits_lost_with_the_process() {
    sabotaged_seeds_fail(
        Config::parity,
        |c| c.sabotage_live_held = true,
        "stale read",
    );
}

/// The first lines of the failures of forty seeds run with `sabotage` applied to their
/// `config`; each must name `what` (the check that caught it), and one at least must fail.
fn sabotaged_seeds_fail(config: fn(u64) -> Config, sabotage: fn(&mut Config), what: &str) {
    let mut failed = Vec::new();
    for seed in 0..40 {
        let mut c = config(seed);
        sabotage(&mut c);
        if let Err(e) = run(&c) {
            failed.push(e.to_string());
        }
    }
    assert!(!failed.is_empty(), "forty sabotaged runs passed ({what})");
    for e in &failed {
        let first = e.lines().next().unwrap_or_default();
        assert!(first.contains(what), "failed for another reason: {first}");
    }
}

/// Nor to a snapshot taken without the writer's barrier (straight to each copy while writes
/// go on): some seed must fail, and only by the snapshot checks.
#[test]
fn the_checker_sees_a_skipped_snapshot_barrier() {
    sabotaged_seeds_fail(Config::new, |c| c.sabotage_barrier = true, "snapshot");
}

/// Nor to a clone that reads another snapshot than the one it was asked of: some seed must
/// fail, and only by the clone checks.
#[test]
fn the_checker_sees_a_clone_of_the_wrong_snapshot() {
    sabotaged_seeds_fail(Config::new, |c| c.sabotage_clone = true, "clone");
}

/// The core stepped alone keeps every copy the same over many interleavings...
#[test]
fn the_core_stepped_alone_keeps_the_copies_the_same() {
    let mut writes = 0;
    for seed in 0..300 {
        writes += core_steps::run(seed, core_steps::Sabotage::None)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    assert!(writes > 300 * 100, "only {writes} writes");
}

/// ...and its checker sees writes sent against the write order, and resyncs that copy
/// without taking their place in it.
#[test]
fn the_core_steps_checker_sees_writes_and_copies_out_of_order() {
    use core_steps::Sabotage::{CopyWithoutHold, IgnoreWait};
    for sabotage in [IgnoreWait, CopyWithoutHold] {
        let caught = (0..100)
            .filter(|&seed| core_steps::run(seed, sabotage).is_err())
            .count();
        eprintln!("{sabotage:?}: {caught} of 100 seeds fail");
        assert!(caught > 0, "a hundred runs with {sabotage:?} passed");
    }
}

/// A parity volume's core stepped alone: no block reads older than its last acknowledged
/// write through writes, encodes, fold-backs, nodes down and back (some wiped), their
/// resyncs, writer restarts, client flushes and power losses...
#[test]
fn a_parity_volumes_core_stepped_alone_reads_every_acknowledged_write() {
    let mut counts = parity_steps::Counts::default();
    for seed in 0..300 {
        counts += parity_steps::run(seed, parity_steps::Sabotage::None)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    eprintln!("{counts:?}");
    assert!(counts.encodes > 100 && counts.fold_backs > 50, "{counts:?}");
    assert!(
        counts.rebuilt_reads > 50 && counts.restarts > 100,
        "{counts:?}"
    );
    assert!(
        counts.resyncs > 300 && counts.chunks_rebuilt > 100,
        "{counts:?}"
    );
    assert!(counts.replaced > 20, "{counts:?}");
    assert!(
        counts.flushes > 1000 && counts.power_losses > 100,
        "{counts:?}"
    );
}

/// ...and its checker sees an encoder that reads or trims its region with requests to it in
/// flight, one whose stripe lacks a chunk, a resync that copies from a node not mirroring the
/// region, a discard trimmed over a stripe, a restarted writer that orders the stripe's
/// nodes by id after a replacement, an encoder that switches and frees before its stripe is
/// flushed, a node whose held bits are durable before their data, a reconcile that leaves
/// its source's bytes without held bits where they are, one that takes a copy that lost
/// power as its source where another kept its history, and a writer that takes out more
/// copies that lost their history than the others can rebuild.
#[test]
fn the_parity_checker_sees_an_encoder_out_of_order() {
    use parity_steps::Sabotage::*;
    for sabotage in [
        FreeWithoutHold,
        ReadWithoutHold,
        ChunkNotWritten,
        CopyFromAnyNode,
        TrimOverStripe,
        NodesById,
        FlushSkipped,
        HeldBeforeData,
        SourceGapsKept,
        LostAsSource,
        LostTakenOut,
    ] {
        let caught = (0..1000)
            .filter(|&seed| parity_steps::run(seed, sabotage).is_err())
            .count();
        eprintln!("{sabotage:?}: {caught} of 1000 seeds fail");
        assert!(caught > 0, "1000 runs with {sabotage:?} passed");
    }
}
