//! Simulated training jobs for testing slowrank without GPUs.
//!
//! - [`spec`]: scenario TOML (layout, modelled step, faults, clocks).
//! - [`libs`]: the ABI-true stand-in libraries laid out under real names.
//! - [`run`]: the launcher (torchrun-like), writing [`truth`] and [`steps`].
//! - [`orchestrate`]: where agents and the coordinator join a run.
//! - [`shaping`]: `communication` faults as `tc` shaping of each NIC's port
//!   replica on its host's veth (hosts as namespaces).
//! - [`trainer`]: the PyTorch-like job each rank process runs.
//! - [`layout`]: ranks, hosts and parallel groups.
//! - [`score`]: a run's report against its truth.
//! - [`scratch`]: test output directories that clean up after a pass.
//! - [`flood`]: synthetic many-agent load into one coordinator.
//! - [`counterfactual`]: what a fault cost the job, against runs without it.
//! - [`random`]: random specs for `eval --random`.
//! - [`eval`]: many runs scored into accuracy/latency tables, with [`baseline`]s.

pub mod baseline;
pub mod children;
pub mod command;
pub mod counterfactual;
pub mod eval;
pub mod flood;
pub mod layout;
pub mod libs;
pub mod netns;
pub mod orchestrate;
pub mod progress;
pub mod random;
pub mod run;
pub mod score;
pub mod scratch;
pub mod shaping;
pub mod spec;
pub mod steps;
pub mod trainer;
pub mod truth;

pub use slowrank_sim as sim;
