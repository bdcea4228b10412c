//! The benchmark engine behind `trireme bench`.
//!
//! A [`Profile`] says what load to offer (DISKSPD's vocabulary: block size, write percentage,
//! threads, outstanding I/Os per thread, random or sequential, duration, warm-up, cool-down). The
//! [`engine`] runs it closed-loop against a [`target::Target`]: `threads x outstanding` loops,
//! each issuing its next I/O when the previous one completes, recording latency into an HDR
//! histogram during the measured window only. [`cpu`] samples `/proc` around the window, so the
//! report can say what the load cost: system-wide user/kernel split, IOPS per % kernel CPU, and
//! CPU microseconds per I/O for the load generator and for the storage processes.
//!
//! Targets: `null` (the harness alone), a file or block device (`O_DIRECT`), `volume:NAME` (the
//! native volume client, no NBD hop) and `nbd://` / `nbd+unix://` URIs (a built-in NBD client).

pub mod chart;
pub mod compare;
pub mod cpu;
pub mod engine;
pub mod limits;
pub mod profile;
pub mod report;
pub mod suite;
pub mod sweep;
pub mod target;
pub mod tier;
pub mod verify;

pub use engine::{run, BenchError, RunResult};
pub use profile::{Pattern, Profile, ProfileError};
pub use suite::{Format, SuiteError};
