//! The eBPF maps' names: the one definition both sides use. The kernel
//! side declares each as a `#[map] static` of exactly this name (aya names
//! a map after its static); user space opens them through these constants,
//! and a test of the agent (`maps_match_the_object`) reads the built
//! object's map symbols and fails on any name that is not here, or any
//! here that the object lacks.

/// Call events for user space (ring buffer).
pub const EVENTS: &str = "EVENTS";
/// Size of the [`EVENTS`] ring: the agent's drain waits follow how much of
/// it a drain found (`node-agent/src/cadence.rs`).
pub const EVENTS_BYTES: u32 = 1 << 20;
/// Followed processes: tgid → rank, and the probe traps each took.
pub const FOLLOWED: &str = "FOLLOWED";
/// Processes forked from a followed tree, before the agent classified them.
pub const TREE: &str = "TREE";
/// Processes that exec'd (tgid per record, ring buffer): the agent's /proc
/// scan looks again only at these and at new pids.
pub const EXECS: &str = "EXECS";
/// Settings written by the agent (the fork record's `child_pid` offset).
pub const CONFIG: &str = "CONFIG";
/// Per-CPU counters indexed by [`crate::probe::counter`].
pub const COUNTERS: &str = "COUNTERS";
/// CUDA call counters per followed process.
pub const CUDA_COUNTS: &str = "CUDA_COUNTS";
/// Out-pointer argument of a call in flight (kernel-side only).
pub const OUT_PTRS: &str = "OUT_PTRS";
/// `wc` array of a poll_cq in flight (kernel-side only).
pub const WC_PTRS: &str = "WC_PTRS";
/// Stack records for user space (ring buffer).
pub const STACKS: &str = "STACKS";
/// Size of the [`STACKS`] ring (≈ 10,000 records).
pub const STACKS_BYTES: u32 = 8 << 20;
/// Processes whose stacks are recorded.
pub const STACK_PIDS: &str = "STACK_PIDS";
/// Stack sampler settings (off-CPU period).
pub const STACK_CONFIG: &str = "STACK_CONFIG";
/// Per-CPU counters indexed by [`crate::stack::stack_counter`].
pub const STACK_COUNTERS: &str = "STACK_COUNTERS";
/// Off-CPU intervals in flight.
pub const OFF_CPU: &str = "OFF_CPU";
/// A zeroed off-CPU record to insert from (kernel-side only).
pub const OFF_CPU_ZERO: &str = "OFF_CPU_ZERO";

/// Every map the object declares.
pub const ALL: &[&str] = &[
    EVENTS,
    FOLLOWED,
    TREE,
    EXECS,
    CONFIG,
    COUNTERS,
    CUDA_COUNTS,
    OUT_PTRS,
    WC_PTRS,
    STACKS,
    STACK_PIDS,
    STACK_CONFIG,
    STACK_COUNTERS,
    OFF_CPU,
    OFF_CPU_ZERO,
];
