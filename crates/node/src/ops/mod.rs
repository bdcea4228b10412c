//! One handler per node op, by concern; `serve.rs` authorizes a request and picks its
//! handler. Each takes the request (and the answer's header, for ops that answer in it) and
//! returns the answer's payload, or the refusal.

mod books;
mod clones;
mod io;
mod replicas;
mod snapshots;
mod tiers;
