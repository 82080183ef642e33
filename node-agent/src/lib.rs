//! The slowrank node agent as a library: discover → probes (eBPF) → fold →
//! ship.
//!
//! The binary in `main.rs` wires these together; tests use them directly.
pub mod agent;
pub mod announced;
pub mod budget;
pub mod cadence;
pub mod catalog;
pub mod certhost;
pub mod clock;
pub mod clockport;
pub mod commlayout;
pub mod discover;
pub mod fold;
pub mod folded;
pub mod gpuside;
pub mod gputime;
pub mod output;
pub mod probes;
pub mod sched;
pub mod selfcost;
pub mod ship;
pub mod spool;
pub mod stack_collector;
pub mod stackfeed;
pub mod stacks;
pub mod stackworker;
pub mod symbolize;
pub mod takeover;
pub mod tracefs;
