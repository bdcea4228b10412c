//! What a port exports: subsystems (one volume each, namespace 1), their ANA state on this
//! port, and who may connect.

use std::sync::Arc;

use tokio::sync::watch;

use crate::ident::ana;

/// `allow(host_nqn)`: true if that host may connect to the subsystem.
pub type AllowHost = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The ANA state of a subsystem's namespace on this port, and how often it changed (the
/// ANA log's change count): a controller sends an ANA change notice on each change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnaState {
    pub state: u8,
    pub chgcnt: u64,
}

/// A subsystem's ANA state on this port, shared by its controllers.
#[derive(Debug, Clone)]
pub struct Ana(Arc<watch::Sender<AnaState>>);

impl Ana {
    pub fn new(state: u8) -> Ana {
        Ana(Arc::new(watch::Sender::new(AnaState { state, chgcnt: 1 })))
    }

    pub fn get(&self) -> AnaState {
        *self.0.borrow()
    }

    /// Moves to `state` (a no-op if it is the current one): controllers tell their hosts.
    pub fn set(&self, state: u8) {
        self.0.send_if_modified(|s| {
            if s.state == state {
                return false;
            }
            s.state = state;
            s.chgcnt += 1;
            true
        });
    }

    pub fn optimized(&self) -> bool {
        self.get().state == ana::OPTIMIZED
    }

    pub fn subscribe(&self) -> watch::Receiver<AnaState> {
        self.0.subscribe()
    }

    /// The state's name, for logs and `status`.
    pub fn name(state: u8) -> &'static str {
        match state {
            ana::OPTIMIZED => "optimized",
            ana::NON_OPTIMIZED => "non-optimized",
            ana::INACCESSIBLE => "inaccessible",
            ana::CHANGE => "change",
            _ => "unknown",
        }
    }
}

/// One exported volume.
pub struct Subsystem<D> {
    pub nqn: String,
    /// Controller serial number: the same on every port of the subsystem (the host's
    /// multipath matches paths by NQN, serial and namespace ids).
    pub serial: String,
    pub nguid: [u8; 16],
    pub dev: Arc<D>,
    pub ana: Ana,
    pub allow: AllowHost,
}

impl<D> std::fmt::Debug for Subsystem<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subsystem")
            .field("nqn", &self.nqn)
            .field("serial", &self.serial)
            .field("ana", &self.ana.get())
            .finish()
    }
}

/// The NQN trireme gives volume `volume` of cluster `cluster`.
pub fn volume_nqn(cluster: &str, volume: &str) -> String {
    format!("nqn.2026-12.io.trireme:{cluster}:{volume}")
}

/// The NGUID and serial of a volume, from a stable id of it (its cluster and name, or its
/// uuid): the same on every server, so a host sees one namespace through every path.
pub fn volume_ids(stable: &str) -> ([u8; 16], String) {
    // Two FNV-1a 64 hashes, seeded apart: stable across builds and platforms.
    let fnv = |seed: u64| {
        stable.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x8422_2325_cbf2_9ce4));
    let mut nguid = [0u8; 16];
    nguid[..8].copy_from_slice(&a.to_be_bytes());
    nguid[8..].copy_from_slice(&b.to_be_bytes());
    let serial: String = nguid[..10].iter().map(|b| format!("{b:02x}")).collect();
    (nguid, serial)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ana_counts_changes_only() {
        let a = Ana::new(ana::INACCESSIBLE);
        a.set(ana::INACCESSIBLE);
        assert_eq!(a.get().chgcnt, 1);
        a.set(ana::OPTIMIZED);
        assert_eq!(
            a.get(),
            AnaState {
                state: ana::OPTIMIZED,
                chgcnt: 2
            }
        );
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        let (g1, s1) = volume_ids("c:v1");
        let (g2, _) = volume_ids("c:v2");
        assert_eq!(volume_ids("c:v1").0, g1);
        assert_ne!(g1, g2);
        assert_eq!(s1.len(), 20);
    }
}
