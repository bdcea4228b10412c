//! What tests share across crates: host resources claimed under a lock.
//!
//! Test binaries run side by side (`TEST_LANES=2`), and each may start servers (etcd, a CSI
//! endpoint, a guest's forwarded port) on a port it must name before the server binds it. A
//! port found free by binding port 0 and letting it go is free only for a moment: another
//! binary, or any outgoing connection, can take it before the server binds. So a port here is
//! claimed, not found:
//!
//! - it lies outside the kernel's ephemeral range, which nothing binds by accident;
//! - it belongs to a block that this process holds with `flock`, which the kernel lets go
//!   when the process exits, even by kill -9;
//! - within the process it is handed out once;
//! - it is checked free by a bind (a server a killed run left behind may still hold it).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// Ports per claimed block: one lock file serves this many ports.
const BLOCK: u16 = 32;

/// An exclusive `flock` on `trireme-NAME` in the temporary directory, or `None` if another
/// process holds it. The lock lasts as long as the file stays open.
pub fn lock(name: &str) -> Option<File> {
    let path = std::env::temp_dir().join(format!("trireme-{name}"));
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    // SAFETY: flock on a descriptor this function owns.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    (r == 0).then_some(f)
}

/// The ports this host's kernel hands out on its own (`ip_local_port_range`).
fn ephemeral() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|x| x.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// The blocks ports are claimed from: below the ephemeral range if there is room, else above.
fn blocks() -> std::ops::Range<u16> {
    let (lo, hi) = ephemeral();
    if lo >= 12_000 {
        10_000 / BLOCK..lo / BLOCK
    } else {
        hi / BLOCK + 1..u16::MAX / BLOCK
    }
}

struct Held {
    /// The held blocks' locks; never let go before the process ends.
    locks: Vec<File>,
    /// The next port to hand out, and the end of its block.
    next: u16,
    end: u16,
}

static HELD: Mutex<Held> = Mutex::new(Held {
    locks: Vec::new(),
    next: 0,
    end: 0,
});

/// Claims the next free block, starting from a place that depends on the process.
fn claim_block(held: &mut Held) {
    let range = blocks();
    let span = u32::from(range.end - range.start);
    let first = (std::process::id() + held.locks.len() as u32 * 7919) % span;
    for k in 0..span {
        let b = range.start + ((first + k) % span) as u16;
        if let Some(f) = lock(&format!("ports-{b}")) {
            held.locks.push(f);
            held.next = b * BLOCK;
            held.end = b * BLOCK + BLOCK;
            return;
        }
    }
    panic!("no free block of test ports in {range:?} x {BLOCK}: all held by other processes");
}

/// A TCP port on 127.0.0.1 that no other process claimed, that this process has not handed
/// out before, and that nothing listens on now.
pub fn port() -> u16 {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if held.next == held.end {
            claim_block(&mut held);
        }
        let p = held.next;
        held.next += 1;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_outside_the_ephemeral_range_and_never_repeat() {
        let (lo, hi) = ephemeral();
        let ps: Vec<u16> = (0..100).map(|_| port()).collect();
        let mut seen = std::collections::HashSet::new();
        for p in &ps {
            assert!(*p < lo || *p > hi, "{p} in {lo}..={hi}");
            assert!(seen.insert(*p), "{p} twice");
        }
        // 100 ports span at least four blocks, each held under its lock.
        let held = HELD.lock().unwrap();
        assert!(held.locks.len() >= 4);
    }

    #[test]
    fn a_held_lock_is_refused_to_a_second_holder() {
        let name = format!("selftest-{}", std::process::id());
        let a = lock(&name).expect("first");
        // flock conflicts between open file descriptions, even in one process.
        assert!(lock(&name).is_none());
        drop(a);
        assert!(lock(&name).is_some());
    }
}
