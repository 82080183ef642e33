//! The slowrank coordinator as a library: ingest → clock → join → graph →
//! verdict → report. The `slowrank` binary wires these together.
//!
//! Data flows one way: [`clock`] aligns agent times, [`join`] gathers the
//! members of each collective instance, [`iteration`] counts training steps,
//! [`stats`] turns instances into per-rank lateness and waits, [`graph`] finds
//! where waiting starts and what it costs, [`classify`] says why, [`hostwide`] folds a whole
//! late host into one finding, [`verdict`]
//! opens and closes verdicts with hysteresis, and [`report`] / [`trace`]
//! render them. [`analyzer`] is the facade the ingest path calls; [`synth`]
//! generates synthetic jobs with ground truth.

pub mod admission;
pub mod alert;
pub mod analyzer;
pub mod classify;
pub mod clock;
pub mod clockport;
pub mod control;
pub mod cost;
pub mod events;
pub mod flame;
pub mod graph;
pub mod hostwide;
pub mod html;
pub mod ingest;
pub mod intervals;
pub mod iteration;
pub mod itergraph;
pub mod join;
pub mod links;
pub mod metrics_http;
pub mod metrics_text;
pub mod outputs;
pub mod overhead;
pub mod ownership;
pub mod pace;
pub mod park;
pub mod prom;
pub mod replay;
pub mod report;
pub mod resume;
pub mod robust;
pub mod sequential;
pub mod serve;
pub mod splits;
pub mod stackstore;
pub mod stats;
pub mod structure;
pub mod synth;
pub mod timeline;
pub mod tls;
pub mod trace;
pub mod validate;
pub mod verdict;
pub mod victims;
pub mod whatif;

pub use analyzer::{Analyzer, AnalyzerConfig, IngestSummary, Metrics, Slowdown};
pub use clock::{ClockSample, CoordNs};
pub use report::{render_human, render_json, Report};
pub use verdict::{EventKind, Verdict, VerdictEvent};
