//! Events a rank process reports to the launcher through the hub.

use serde::{Deserialize, Serialize};

/// One report, sent without waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Report {
    /// The trainer started.
    Hello { rank: u32, pid: u32, host: u32 },
    /// One training iteration finished on `rank` (monotonic ns).
    Step {
        rank: u32,
        iteration: u64,
        start_ns: u64,
        end_ns: u64,
        wall_ns: u64,
    },
    /// Fault `fault` (index in the spec) turned on or off on `rank`.
    Fault {
        fault: usize,
        rank: u32,
        active: bool,
        iteration: u64,
        mono_ns: u64,
        wall_ns: u64,
    },
    /// The trainer finished all iterations.
    Done { rank: u32 },
}
