//! Per-host services next to the job: the one place where, in agent mode,
//! one `slowrank-agent` per simulated host (given that host's clock offset
//! and drift as a test-only setting) and one coordinator are started and
//! stopped. Without agents it starts nothing.

use std::path::Path;

use crate::spec::Spec;

/// What runs next to the rank processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The job alone (`--no-agent`).
    JobOnly,
    /// Coordinator + one agent per host.
    WithAgents,
}

/// What a host's agent is started with.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPlan {
    pub host: u32,
    /// Global ranks on this host.
    pub ranks: std::ops::Range<u32>,
    /// Clock skew the agent applies to its timestamps (test-only setting).
    pub clock_offset_us: i64,
    pub clock_drift_ppm: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum OrchestrateError {
    #[error(
        "agent mode is not wired yet: run with --no-agent (the coordinator and per-host agents will be started from scenarios/src/orchestrate.rs)"
    )]
    AgentModeNotWired,
}

/// The per-host plan of a spec.
pub fn host_plans(spec: &Spec) -> Vec<HostPlan> {
    (0..spec.hosts)
        .map(|h| HostPlan {
            host: h,
            ranks: h * spec.ranks_per_host..(h + 1) * spec.ranks_per_host,
            clock_offset_us: spec.clock.offset_us(h),
            clock_drift_ppm: spec.clock.drift_ppm(h),
        })
        .collect()
}

/// Services started for a run; stopped when dropped.
#[derive(Debug, Default)]
pub struct Services {
    pub hosts: Vec<HostPlan>,
}

/// Starts the coordinator and the agents (agent mode) before the ranks.
pub fn start(spec: &Spec, _run_dir: &Path, mode: Mode) -> Result<Services, OrchestrateError> {
    match mode {
        Mode::JobOnly => Ok(Services {
            hosts: host_plans(spec),
        }),
        Mode::WithAgents => Err(OrchestrateError::AgentModeNotWired),
    }
}
