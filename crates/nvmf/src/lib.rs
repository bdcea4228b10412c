//! NVMe over TCP: a target that serves any [`trireme_blockdev::BlockDevice`] as namespace 1
//! of a subsystem, to hosts with nothing of ours installed (Linux's `nvme-tcp`, ESXi, Windows
//! Server 2025), with ANA multipath across servers; and a host of our own for the tests and
//! the benchmark.
//!
//! | part | what | where |
//! |---|---|---|
//! | PDUs | common header, ICReq/ICResp, capsules, H2CData/C2HData/R2T, termination; every length checked before allocation (fuzzed) | [`pdu`] |
//! | entries | SQE and CQE, opcodes, status codes | [`cmd`] |
//! | data structures | Identify controller and namespace, log pages (SMART, changed namespaces, command effects, ANA, discovery) | [`ident`] |
//! | subsystems | a volume, its ids (the same on every server), its ANA state on this port, who may connect | [`subsystem`] |
//! | port | the listener, its controllers (ids in a range of their own per port), keep-alive, events | [`target`], [`ctrl`] |
//! | queues | one connection: handshake, Connect, admin and I/O commands | `queue`, `connect`, `admin`, `io` |
//! | host | controller and queues (ours), and multipath over several | [`initiator`], [`multipath`] |
//!
//! Transport: no header or data digests (a host that asks is refused with a termination
//! request), no TLS and no in-band authentication: the port belongs on a storage network of
//! its own (see the README).

mod admin;
pub mod cmd;
mod connect;
pub mod ctrl;
pub mod ident;
pub mod initiator;
mod io;
pub mod multipath;
pub mod pdu;
mod queue;
pub mod subsystem;
pub mod target;

#[cfg(test)]
mod tests;

pub use admin::MAX_IO_QUEUES;
pub use initiator::{ConnectOptions, Controller, HostError, HostId};
pub use multipath::Multipath;
pub use queue::{serve as serve_queue, QueueError, MAXH2CDATA, MAX_TRANSFER};
pub use subsystem::{volume_ids, volume_nqn, AllowHost, Ana, AnaState, Subsystem};
pub use target::{Connected, Port, PORT_IDS};
