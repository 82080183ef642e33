//! Ground truth of a run (`DIR/truth.json`): what was injected, where, and
//! when it actually took effect, for scoring a report against.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    layout::Coords,
    spec::{Fault, FaultKind, Parallel},
};

/// Bumped on incompatible changes of this file's shape.
pub const TRUTH_VERSION: u32 = 1;

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every rank ran every iteration.
    Completed,
    /// A hang was injected, held for `run.hang_hold_s`, then the job stopped.
    Hang,
    /// The run hit its time limit.
    Timeout,
    /// No progress for `run.stall_s` without an injected hang.
    Stalled,
    /// A rank process failed.
    Failed,
    /// Ctrl-C / SIGTERM.
    Interrupted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Truth {
    pub version: u32,
    pub scenario: String,
    pub seed: u64,
    pub run_id: String,
    pub hosts: u32,
    pub ranks_per_host: u32,
    pub world_size: u32,
    pub parallel: Parallel,
    pub iterations: u64,
    /// Iterations every rank completed.
    pub iterations_completed: u64,
    pub outcome: Outcome,
    /// Why the run stopped, in words.
    pub reason: String,
    pub started_wall_ns: u64,
    pub ended_wall_ns: u64,
    /// `CLOCK_MONOTONIC` at start; all rank processes share it.
    pub started_mono_ns: u64,
    pub ranks: Vec<RankTruth>,
    pub hosts_clock: Vec<InjectedClock>,
    pub faults: Vec<FaultTruth>,
    /// Rendezvous (collective instances) some members never reached when
    /// the run stopped: what a hang looks like.
    pub blocked: Vec<Blocked>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankTruth {
    pub rank: u32,
    pub host: u32,
    pub local_rank: u32,
    pub pid: u32,
    pub coords: Coords,
    pub exit: Option<i32>,
}

/// The clock skew the host's agent is told to apply (test-only setting).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InjectedClock {
    pub host: u32,
    pub offset_us: i64,
    pub drift_ppm: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultTruth {
    /// Index in the spec's `[[fault]]` list.
    pub index: usize,
    pub kind: FaultKind,
    pub ranks: Vec<u32>,
    /// The spec entry, as written.
    pub spec: Fault,
    /// When the fault was actually on (one window, or several when
    /// intermittent), as observed by the injected ranks.
    pub windows: Vec<Window>,
    /// What it cost the job, measured against a run without it
    /// ([`crate::counterfactual`]); written by `eval`, absent after a plain
    /// `run` and for a hang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::counterfactual::FaultCost>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub onset_iteration: u64,
    pub onset_wall_ns: u64,
    pub onset_mono_ns: u64,
    /// `None` while still on when the run stopped (always for a hang).
    pub end_iteration: Option<u64>,
    pub end_wall_ns: Option<u64>,
    pub end_mono_ns: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Blocked {
    /// Hub key: `c/<comm>/<seq>` for a collective, `p/<comm>/<from>-<to>/<n>`
    /// for a send/receive, `init/..`, `split/..`, `qp/..` for setup.
    pub key: String,
    pub members: u32,
    /// Member indices (ranks within the communicator) that arrived.
    pub arrived: Vec<u32>,
    pub since_mono_ns: u64,
}

/// Collects fault on/off reports into windows.
#[derive(Debug, Default)]
pub struct WindowLog {
    /// (fault, onset iteration) -> window, earliest report wins.
    windows: BTreeMap<(usize, u64), Window>,
    /// fault -> onset iteration of its currently open window.
    open: BTreeMap<usize, u64>,
}

impl WindowLog {
    pub fn record(
        &mut self,
        fault: usize,
        active: bool,
        iteration: u64,
        mono_ns: u64,
        wall_ns: u64,
    ) {
        if active {
            let w = self.windows.entry((fault, iteration)).or_insert(Window {
                onset_iteration: iteration,
                onset_wall_ns: wall_ns,
                onset_mono_ns: mono_ns,
                ..Default::default()
            });
            if mono_ns < w.onset_mono_ns {
                w.onset_mono_ns = mono_ns;
                w.onset_wall_ns = wall_ns;
            }
            self.open.insert(fault, iteration);
        } else if let Some(onset) = self.open.get(&fault).copied() {
            if let Some(w) = self.windows.get_mut(&(fault, onset)) {
                if w.end_mono_ns.is_none_or(|m| mono_ns < m) {
                    w.end_iteration = Some(iteration);
                    w.end_mono_ns = Some(mono_ns);
                    w.end_wall_ns = Some(wall_ns);
                }
            }
        }
    }

    pub fn windows_of(&self, fault: usize) -> Vec<Window> {
        self.windows
            .iter()
            .filter(|((f, _), _)| *f == fault)
            .map(|(_, w)| w.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_the_earliest_member_report() {
        let mut log = WindowLog::default();
        log.record(0, true, 10, 500, 1500);
        log.record(0, true, 10, 400, 1400);
        log.record(0, false, 20, 900, 1900);
        log.record(0, false, 20, 950, 1950);
        log.record(0, true, 30, 1200, 2200);
        let w = log.windows_of(0);
        assert_eq!(w.len(), 2);
        assert_eq!(
            (w[0].onset_mono_ns, w[0].end_iteration, w[0].end_mono_ns),
            (400, Some(20), Some(900))
        );
        assert_eq!(w[1].end_iteration, None);
        assert!(log.windows_of(1).is_empty());
    }
}
