//! What a resumed life carries over from the earlier one besides verdicts
//! ([`crate::resume`] keeps it in `--out`): the job's pace (the baseline
//! its slowdowns are told against, and the step history the slow
//! stretches read), the recent steps the deep window's slowdown test
//! reads, the spread between ranks that work imbalance is told by, and the
//! report page's series.
//!
//! Not carried, because the new life's own warm-up (`warmup_iterations`)
//! relearns them before it judges anything: the per-rank windows of the
//! cross-sectional test (the last 5 iterations), the sequential test's sums
//! (they fall back to zero within about 3 clean iterations anyway), the
//! wait-graph and rotation windows.

use super::*;
use crate::classify::pace::PaceState;
use crate::report::timeline::Timeline;

/// Steps of the slow stretches' history kept in `--out`: 16 bytes each in
/// memory, about 30 in JSON, rewritten with the report every few seconds
/// (300 KB); at a step a second, the last 2.8 hours.
pub const KEPT_HISTORY: usize = 10_000;

/// The last batch ingested from one agent: what the ingest journal keeps
/// ([`crate::resume`]) so that a resumed life knows the agent's resends.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    pub agent_id: String,
    pub host: String,
    pub seq: u64,
    pub ringbuf_drops: u64,
    pub spool_drops: u64,
}

/// An earlier life's learning ([`Analyzer::baselines`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Baselines {
    /// The job they were learned on: another job's are not used.
    pub job_id: Option<String>,
    pub pace: PaceState,
    /// The last sealed steps (ns), oldest first.
    pub steps: Vec<f64>,
    /// The costliest rank's share of recent steps ([`crate::graph::spread`]):
    /// work imbalance is said only of a slowdown whose spread grew, and a
    /// new life without it would judge a slowdown by its rise alone.
    #[serde(default)]
    pub spread: Vec<crate::graph::spread::SpreadPoint>,
}

/// Carried state waiting for the resumed life's first iteration.
#[derive(Debug, Default)]
pub(super) struct Carried {
    pub baselines: Baselines,
    pub timeline: Timeline,
}

impl Analyzer {
    /// What this life has learned, to be kept for a later one; `None`
    /// before its first warm step.
    pub fn baselines(&self) -> Option<Baselines> {
        let core = lock(&self.core);
        let pace = core.pace.state(KEPT_HISTORY);
        if pace.baseline.is_empty() && pace.recent.is_empty() && pace.history.is_empty() {
            return None;
        }
        Some(Baselines {
            job_id: self.job_id(),
            pace,
            steps: core.steps.iter().copied().collect(),
            spread: core.spread.state(),
        })
    }

    /// Starts this life from an earlier one's `baselines` and report page
    /// series, once its first iteration is sealed (when the job's identity
    /// is known and can be checked against theirs). Call with
    /// [`Analyzer::resumed_life`].
    pub fn carry_over(&self, baselines: Baselines, timeline: Timeline) {
        lock(&self.core).carried = Some(Carried {
            baselines,
            timeline,
        });
    }

    /// The job's id as its ranks announced it.
    fn job_id(&self) -> Option<String> {
        self.ranks
            .iter()
            .map(|r| r.job_id.clone())
            .find(|j| !j.is_empty())
    }

    /// Applies what was carried over (at the resumed life's first sealed
    /// iteration), unless it was learned on another job.
    pub(super) fn apply_carried(&self, core: &mut Core) {
        let Some(c) = core.carried.take() else {
            return;
        };
        let (then, now) = (c.baselines.job_id.as_deref(), self.job_id());
        if let (Some(a), Some(b)) = (then, now.as_deref()) {
            if a != b {
                warn!(
                    earlier = a,
                    job = b,
                    "the earlier coordinator's baselines are another job's; learning them again"
                );
                return;
            }
        }
        let baseline_steps = c.baselines.pace.baseline.len();
        let pace = c.baselines.pace;
        let learned = !pace.baseline.is_empty() || !pace.history.is_empty();
        if learned && core.pace.restore(pace) {
            core.steps = c
                .baselines
                .steps
                .into_iter()
                .filter(|s| s.is_finite() && *s > 0.0)
                .collect();
            while core.steps.len() > STEP_HISTORY {
                core.steps.pop_front();
            }
            core.spread.restore(&c.baselines.spread);
            info!(
                baseline_steps,
                spread_steps = c.baselines.spread.len(),
                "the job's pace goes on from the earlier coordinator's baseline"
            );
        }
        if core.timeline.rows.is_empty() {
            core.timeline = c.timeline;
        }
    }
}
