//! **Stage: verdict.** In: per-iteration observations. Out: verdicts that
//! open and close with hysteresis ([`victims`] hands a finding to its
//! cause), each with its flame-graph diff ([`flame`], over the stack windows
//! [`stackstore`] keeps).
//!
//! Verdict lifecycle with hysteresis.
//!
//! Every sealed iteration, each subject (a rank's lateness, a rank's NIC, a
//! link) is either observed suspicious or not. A verdict opens when at least
//! `open_min` of the last `open_window` iterations were suspicious, and
//! closes only after `close_after` clean iterations in a row, so a noisy
//! borderline rank cannot flap. A costly compute straggler whose class rests
//! on GPU-side arrivals opens sooner, after `fast_open_min` suspicious
//! iterations in a row: host descheduling (what the 6-of-8 rule guards
//! against) does not move a GPU's arrival. Its first-seen iteration is the earliest
//! suspicious iteration of the run that opened it, not the iteration the
//! decision was made in. A subject that turns bad again reopens its own
//! verdict (episodes + 1) instead of adding a new one, which keeps an
//! intermittent fault one line in the report. The first `warmup_iterations`
//! of a job count as clean: allocators, autotuning, data-loader workers
//! starting and the agents attaching make them unrepresentative (a rank
//! slow for iterations 2–13 of a healthy job was a false verdict).

pub mod deep_ask;
pub mod flame;
mod flameref;
mod lifecycle;
pub mod stackstore;
pub mod victims;
pub mod warmup;

use chrono::{DateTime, Utc};

use crate::classify::Kind;
pub use crate::classify::{Observation, Structural, Subject, OFF_CRITICAL_PATH};
use crate::clock::CoordNs;
use crate::join::HangCandidate;
pub use flameref::{FlameRef, FlameView, FrameDiff};
pub use lifecycle::Lifecycle;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LifecycleConfig {
    /// Iterations the opening rule looks back over.
    pub open_window: usize,
    /// Of those, how many must have observed the subject for a verdict to
    /// open (6 of 8: on a loaded machine a rank's host is descheduled for a
    /// few iterations at a time, which 4 of 5 mistook for a fault). The
    /// sequential test's alarm and `fast_open_min` open sooner.
    pub open_min: usize,
    /// Suspicious iterations in a row that open a verdict whose every
    /// observation is GPU-side and costs at least `fast_open_cost`.
    pub fast_open_min: usize,
    /// Share of the job's GPU time each of those iterations must lose.
    pub fast_open_cost: f64,
    /// Iterations in a row without an observation after which an active
    /// verdict closes: a straggler that keeps pace for a step or two
    /// mid-fault stays named (and a rank whose sequential evidence still
    /// stands keeps being observed).
    pub close_after: u64,
    /// Iterations at the start of a job (or of a resumed coordinator's
    /// life) that never open a verdict and are no baseline, at most
    /// ([`warmup::WarmUp`]): the warm-up ends sooner once its steps settle.
    pub warmup_iterations: u64,
    /// Steps in a row within `warmup_tolerance` of their median that end
    /// the warm-up before `warmup_iterations` (0: never sooner). A PyTorch
    /// job's first two or three steps autotune, grow the allocator and
    /// connect NCCL's peers; three settled steps are past them.
    pub warmup_settle: usize,
    /// How far from their median those steps may lie (share of it). A
    /// warm-up step is 1.3–10× the job's pace; healthy steps of the random
    /// evaluation's jobs (jitter up to 0.2 per kernel) lie within 5%, and an
    /// intermittent fault's 1.5× steps keep the warm-up to its end.
    pub warmup_tolerance: f64,
    /// Verdicts kept (closed ones dropped oldest first beyond this).
    pub max_verdicts: usize,
    /// A closed verdict whose rank was slow over fewer iterations than
    /// this (first to last observation, one episode) and then kept pace is
    /// reported as a *transient*, not as a straggler (`transients[]`, not
    /// `verdicts[]`). On a loaded host a healthy rank is really descheduled
    /// now and then, for a few hundred ms: in the fault tests beside two
    /// busy loops, episodes of 6 and 9 iterations at 17–30% of the step
    /// each, named as soon as they began (as they must be: a 10%-costly
    /// straggler is named within 10 iterations) and cleared after. Nothing
    /// tells such an episode from a fault's first iterations while it
    /// lasts; only its end does. 10 is the naming promise: what did not
    /// outlast the time a lasting straggler is given to be named is not
    /// one. Its alert was sent; the report keeps it under its own heading.
    pub transient_below: u64,
    /// The bound for an episode that cost the job less than
    /// `modest_cost` of its step: such a straggler is given 30 iterations
    /// to be named (issue 25: ≥ 3% within 30, ≥ 10% within 10), so what
    /// did not outlast those is not one either. Seen beside two busy
    /// loops: a healthy rank 7% of a step late for 10 iterations, costing
    /// 4%, named and cleared.
    pub transient_below_modest: u64,
    /// Measured cost (fraction of the step) under which an episode is
    /// modest; one whose cost was not measured takes the stricter bound.
    pub modest_cost: f64,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            open_window: 8,
            open_min: 6,
            fast_open_min: 3,
            // A 1.3× GPU in a synchronous job costs ≈ 20%; 1.1× ≈ 8%.
            fast_open_cost: 0.1,
            close_after: 8,
            warmup_iterations: 20,
            warmup_settle: 3,
            warmup_tolerance: 0.15,
            max_verdicts: 4096,
            transient_below: 10,
            transient_below_modest: 30,
            modest_cost: 0.10,
        }
    }
}

/// A verdict's cost while hidden behind a bigger straggler (DESIGN.md §5).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OnceFixed {
    /// The rank whose delay hides this one's.
    pub rank: u32,
    /// The share of the step this subject would cost once `rank` is fixed.
    pub cost_fraction: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkRef {
    pub ranks: [u32; 2],
}

/// A verdict as reported (`verdicts[]` in `report.json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    pub id: u64,
    pub rank: u32,
    pub host: String,
    pub kind: Kind,
    pub confidence: f64,
    pub first_seen_iteration: u64,
    pub active: bool,
    pub lost_gpu_seconds: f64,
    pub link: Option<LinkRef>,
    /// A host-wide verdict: every rank of `host` (`rank` is the costliest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<u32>,
    pub evidence: Vec<String>,
    /// What-if cost: how much shorter the job's steps would have been, as
    /// a share of their length, had this subject been as fast as its peers
    /// (summed over the iterations it was measured in while active).
    pub cost_fraction: f64,
    /// Iterations the what-if was measured in (0: `cost_fraction` is
    /// unmeasured and 0).
    #[serde(default)]
    pub cost_iterations: u64,
    /// Set while its cost is hidden behind a bigger straggler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_once_fixed: Option<OnceFixed>,
    /// Where the what-if could not cost this verdict (no GPU-side times
    /// of its rank) but the job's step rose from about when it was first
    /// seen, and no costed verdict explains the rise: the rise, as an
    /// estimate ([`crate::classify::pace::rise_owner`]). Set in reports only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_estimate: Option<crate::classify::pace::RiseEstimate>,
    /// Set on a structural verdict (`kind: "structural"`): not a slow rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structural: Option<Structural>,
    pub clock_error_us: f64,
    pub first_seen: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub first_seen_coord_ns: CoordNs,
    /// When the verdict was last raised (a reopened verdict: its reopening).
    pub opened_iteration: u64,
    /// When it was raised the first time (detection latency counts from here).
    #[serde(default)]
    pub first_opened_iteration: u64,
    pub last_seen_iteration: u64,
    /// The last iteration its own lateness named it: `last_seen_iteration`
    /// also counts iterations where only the sequential test's standing
    /// evidence kept it named ([`Observation::held`]), which outlast a
    /// short episode by as long as the test takes to forget it.
    #[serde(default)]
    pub last_slow_iteration: u64,
    /// Set when no iteration of the job could be observed right after its
    /// last slow one (an agent gone, its collectives unjoined): the last
    /// iteration of that blind stretch. The rank may have stayed slow
    /// through it, so the episode is not called brief on its account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unobserved_to: Option<u64>,
    pub closed_iteration: Option<u64>,
    pub episodes: u32,
    #[serde(skip)]
    pub subject: Subject,
    #[serde(skip)]
    exposure_ns: f64,
    #[serde(skip)]
    saved_ns: f64,
    #[serde(skip)]
    costed_step_ns: f64,
    #[serde(skip)]
    once_fixed_ns: (Option<u32>, f64, f64),
    /// What-ifs of the iterations since its last slow one (unobserved, or
    /// held by standing evidence alone): part of the episode's cost if the
    /// rank is slow again, dropped if the verdict closes. Averaged in, the
    /// clean iterations before a close diluted a 15 % straggler of 13
    /// iterations to "7 %" and under `modest_cost` (random 4421-29).
    #[serde(skip)]
    tail: Vec<WhatIfReading>,
    /// Where the rank differs from a healthy peer (stacks), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flamegraph: Option<FlameRef>,
}

impl Verdict {
    /// Slowness that began and ended within its naming window
    /// ([`Verdict::transient_bound`]): closed, and from its first sighting
    /// to the last iteration its rank was slow on its own, over fewer
    /// iterations than the bound, however many episodes that took (two
    /// blips 12 iterations apart beside two busy loops are one
    /// disturbance; a rank that comes back later spans more). A rank's (or
    /// its host's, its NIC's, a link's) slowness; hangs and structural
    /// findings are never transients.
    pub fn is_transient(&self, cfg: &LifecycleConfig) -> bool {
        !self.active
            && !matches!(self.kind, Kind::Hang | Kind::Structural)
            && self.slow_span_bound() < self.transient_bound(cfg)
    }

    /// The most iterations it may have been slow for: [`Self::slow_iterations`],
    /// through a blind stretch that followed its last slow iteration.
    pub fn slow_span_bound(&self) -> u64 {
        match self.unobserved_to {
            Some(to) if to > self.last_slow_iteration => {
                to.saturating_sub(self.first_seen_iteration) + 1
            }
            _ => self.slow_iterations(),
        }
    }

    /// Iterations this episode had to outlast to be a straggler: the
    /// naming promise for its cost (`transient_below`, or
    /// `transient_below_modest` where it measurably cost less than
    /// `modest_cost`).
    pub fn transient_bound(&self, cfg: &LifecycleConfig) -> u64 {
        let cost = match (&self.cost_estimate, self.cost_iterations) {
            (Some(e), _) => Some(e.fraction),
            (None, n) if n > 0 => Some(self.cost_fraction),
            _ => None,
        };
        match cost {
            Some(c) if c < cfg.modest_cost => cfg.transient_below_modest.max(cfg.transient_below),
            _ => cfg.transient_below,
        }
    }

    /// Iterations from its first sighting to the last its own lateness
    /// named it (a report of an older version: to its last sighting).
    pub fn slow_iterations(&self) -> u64 {
        let last = if self.last_slow_iteration >= self.first_seen_iteration {
            self.last_slow_iteration
        } else {
            self.last_seen_iteration
        };
        last.saturating_sub(self.first_seen_iteration) + 1
    }

    /// Its cost in a table cell: "12.3%" measured, "≈46%" estimated from
    /// the job's pace, "?" not measured.
    pub fn cost_cell(&self) -> String {
        match (self.cost_iterations, &self.cost_estimate) {
            (_, Some(e)) => format!("≈{:.0}%", 100.0 * e.fraction),
            (0, None) => "?".to_string(),
            _ => format!("{:.1}%", 100.0 * self.cost_fraction),
        }
    }

    /// "rank 37 on node-5 is compute-slow, costing 11% of the job".
    pub fn headline(&self) -> String {
        if let Some(st) = &self.structural {
            let cost = if self.cost_iterations == 0 {
                String::from("cost not measured yet")
            } else {
                format!("costing {:.0}% of the job", 100.0 * self.cost_fraction)
            };
            return match st.stage {
                Some(stage) => format!(
                    "pipeline stage {stage} ({}) is slower than the other stages on every replica: partition imbalance, not a slow rank, {cost}",
                    span(&self.ranks)
                ),
                None => format!(
                    "work imbalance: the slowest rank changes from iteration to iteration (not a slow rank), {cost}"
                ),
            };
        }
        let who = match &self.link {
            Some(l) => format!("link {}↔{} (from {})", l.ranks[0], l.ranks[1], self.host),
            None if !self.ranks.is_empty() => format!("host {} ({})", self.host, span(&self.ranks)),
            None => format!("rank {} on {}", self.rank, self.host),
        };
        let class = self.kind.as_str();
        if self.cost_iterations == 0 {
            return match &self.cost_estimate {
                Some(e) => format!(
                    "{who} is {class}-slow, costing ≈{:.0}% of the job (estimated: the step rose from {:.1} to {:.1} ms from iteration {}, when it was first seen; no replay of its iterations timed it: no GPU-side times, or none that replays the step as it ran)",
                    100.0 * e.fraction,
                    e.baseline_step_ms,
                    e.recent_step_ms,
                    e.since_iteration
                ),
                None => format!("{who} is {class}-slow (its cost to the job is not measured yet)"),
            };
        }
        if let (true, Some(e)) = (self.cost_fraction < OFF_CRITICAL_PATH, &self.cost_estimate) {
            return format!(
                "{who} is {class}-slow, costing ≈{:.0}% of the job (estimated: the step rose from {:.1} to {:.1} ms from iteration {}, when it was first seen; the replay put it off the critical path, which the rise contradicts)",
                100.0 * e.fraction,
                e.baseline_step_ms,
                e.recent_step_ms,
                e.since_iteration
            );
        }
        if self.cost_fraction < OFF_CRITICAL_PATH {
            return match &self.cost_once_fixed {
                Some(f) => format!(
                    "{who} is {class}-slow, hidden behind rank {}: costing {:.0}% of the job once rank {} is fixed",
                    f.rank,
                    100.0 * f.cost_fraction,
                    f.rank
                ),
                None => format!(
                    "{who} is {class}-slow but off the critical path: it costs the job nothing now"
                ),
            };
        }
        format!(
            "{who} is {class}-slow, costing {:.0}% of the job",
            100.0 * self.cost_fraction
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Opened,
    Reopened,
    /// An active verdict's class changed within its episode (a compute-slow
    /// GPU first read host-side as a host that reached its collectives
    /// late): the user who read the first alert hears the correction.
    Reclassified,
    Closed,
    HangDetected,
    HangResolved,
}

/// One iteration's what-if of a verdict's rank: the step it would have
/// saved, the step, and the same once the rank hiding it is fixed.
type WhatIfReading = (Option<f64>, f64, Option<(u32, f64)>);

/// What the CLI prints as one line and posts to webhooks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerdictEvent {
    pub event: EventKind,
    pub iteration: Option<u64>,
    pub verdict: Option<Verdict>,
    pub hang: Option<HangCandidate>,
    /// One-line alert.
    pub line: String,
}

pub fn who(v: &Verdict) -> String {
    if let Some(st) = &v.structural {
        return match st.stage {
            Some(s) => format!("pipeline stage {s}"),
            None => String::from("work imbalance"),
        };
    }
    match &v.link {
        Some(l) => format!("link {}↔{}", l.ranks[0], l.ranks[1]),
        None if !v.ranks.is_empty() => format!("host {} ({})", v.host, span(&v.ranks)),
        None => format!("rank {} on {}", v.rank, v.host),
    }
}

/// "ranks 8–15" for a contiguous set, else "ranks 1, 3, 4".
pub fn span(ranks: &[u32]) -> String {
    let contiguous = ranks.windows(2).all(|w| w[1] == w[0] + 1);
    match (ranks.first(), ranks.last()) {
        (Some(a), Some(b)) if contiguous && ranks.len() > 2 => format!("ranks {a}–{b}"),
        _ => format!(
            "ranks {}",
            ranks
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests;
