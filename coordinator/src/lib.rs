//! The slowrank coordinator as a library: ingest → clock → join → graph →
//! verdict → report. The `slowrank` binary wires these together.
//!
//! Data flows one way, folder by folder (see `coordinator/README.md`):
//! [`net`] takes batches, clock samples and agents in; [`clock`] aligns agent
//! times; [`join`] validates records and gathers the members of each
//! collective instance (parking early ones, working out splits);
//! [`classify`] turns instances into per-rank lateness and says why
//! (compute, host, communication); [`graph`] counts training steps, replays
//! each iteration's wait graph for the what-if cost and reads structural
//! causes from it; [`verdict`] opens and closes verdicts with hysteresis and
//! diffs their flame graphs; [`report`] renders them (text,
//! JSON, page, trace, metrics, alerts). [`analyzer`] and [`serve`] are the
//! runtime that wires the stages; [`replay`] feeds recorded sources through
//! the same path. Synthetic jobs with ground truth, for tests and load,
//! live in their own crate (`slowrank-synth`), outside this library.

// The stages; data flows net → clock → join → classify → graph → verdict →
// report (rustfmt keeps these lines in alphabetical order).
pub mod classify;
pub mod clock;
pub mod graph;
pub mod join;
pub mod net;
pub mod report;
pub mod verdict;

// The runtime that wires them (the only place with tasks, channels and
// locks), what survives a restart, and shared helpers.
pub mod analyzer;
pub mod overhead;
pub mod replay;
pub mod resume;
pub mod robust;
pub mod serve;
#[cfg(test)]
mod synthjob;
pub mod thresholds;

pub use analyzer::{Analyzer, AnalyzerConfig, IngestSummary, Metrics, Slowdown};
pub use clock::{ClockSample, CoordNs};
pub use report::{render_human, render_json, Report};
pub use verdict::{EventKind, Verdict, VerdictEvent};
