//! What every listening port of trireme shares, so that none of them can be stopped or made to
//! hold unbounded memory by a peer, authenticated or not:
//!
//! * [`accept::accept`]: an accept that never gives up. A transient error (the process or the
//!   system out of descriptors, out of buffers) is logged at most once a second and retried
//!   after a growing pause; a listener only ever stops with its process.
//! * [`accept::Gate`]: admission to a port. Connections are admitted in two steps, each with
//!   its own cap: a place among the handshakes in progress (few per source address, so one
//!   host cannot take them all, and bounded in time by the caller's handshake deadline), then,
//!   once the peer is authenticated, a place among the established connections. A peer that is
//!   refused holds neither.
//! * [`io::read_header`]: a header read with an idle timeout before its first byte and a
//!   deadline for the rest, so a half-sent header cannot hold a connection for good.
//! * [`throttle::Throttle`]: warnings about refused peers, at most one a second with a count of
//!   the ones held back, so a flood of bad peers cannot fill a disk with log lines.
//! * [`limits::raise_nofile`]: the descriptor limit raised to its hard limit at start.
//!
//! Ports use these with numbers of their own (see `docs/security.md`, issue 16).

pub mod accept;
pub mod io;
pub mod limits;
pub mod peer_uid;
pub mod throttle;

pub use accept::{accept, Admitted, Gate, Handshaking, Limits, Source, Standing};
pub use io::Guarded;
pub use throttle::{Throttle, Throttles};
