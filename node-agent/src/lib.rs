//! The slowrank node agent as a library: probes (eBPF) → fold → ship.
//!
//! The binary in `main.rs` wires these together; tests use them directly.
pub mod clock;
pub mod folded;
pub mod gputime;
pub mod launch;
pub mod output;
pub mod probes;
pub mod ship;
pub mod spool;
pub mod stack_collector;
pub mod stacks;
pub mod symbolize;
