//! A sequential test per rank on what it costs each iteration: a straggler
//! is named as soon as the evidence adds up, and stays named while it lasts.
//!
//! In: per sealed iteration, each rank's what-if saving as a share of the
//! step ([`crate::graph::whatif`]: how much shorter the iteration would have been
//! had the rank worked at its peers' median). Out: the ranks whose
//! cumulative excess crossed the alarm level, and whether a rank's evidence
//! is still standing. Pure: no clock, no IO.
//!
//! Why this statistic: it is paired (a rank against its peers in the same
//! iteration), so common-mode noise — the whole host slowed, every rank
//! late together — does not touch it; and it is 0 for every rank but the
//! ones the iteration actually waited for, so a healthy job's noise only
//! ever feeds the last arriver of each iteration, a different rank from one
//! iteration to the next.
//!
//! The test is a one-sided CUSUM (Page, 1954): `S ← max(0, S + x − k)`,
//! alarm at `S ≥ h`. A rank costing a share `c > k` of every step crosses
//! after about `h / (c − k)` iterations; one costing less never does, and a
//! healthy rank's occasional turn as the last arriver decays by `k` per
//! iteration. Once the rank keeps pace, `S` falls by `k` per iteration, so
//! a verdict is released a few iterations after its fault ends, not while
//! a fault that dips for an iteration or two still lasts. An alarm opens a
//! verdict only on a rank the per-iteration test (`stats`) also finds
//! suspicious in that iteration — unless the what-if is *decisive* on its
//! own: the rank saved a large share of every one of the last few steps.
//! That is the case the lateness test cannot see: in a pipeline whose
//! replicas re-synchronise every step, a slow first stage delays its
//! data-parallel peers too (they wait on the later stages it holds up), so
//! it arrives barely later than they do at their own collectives, while the
//! replay says half the step is its.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequentialConfig {
    /// Allowance `k` per iteration, as a share of the step: what a rank
    /// may cost on average without building up evidence. Chosen on recorded
    /// runs (the five golden replays and two runs of the demo spec taken on
    /// a machine at load 18–29): at `k` = 1.5% or 3% ranks of the healthy and
    /// loaded runs that really ran behind for a dozen steps (run-queue delay
    /// 19% against 9%) were named; at 5% none was, and the demo's 8 ms
    /// data-loader fault (≈ 10% of the step) was named 6–11 iterations after
    /// its onset. Costs below `k` are left to the window rule (6 of 8).
    pub allowance: f64,
    /// Alarm level `h`, as a share of a step: with `k` = 5%, a rank costing
    /// 10% of every step crosses after 10 iterations, 20% after 4, 50%
    /// after 2.
    pub alarm: f64,
    /// Cap on `S`, in alarms: bounds how long the evidence outlives its
    /// fault (`(cap − release) × h / k` iterations at most).
    pub cap: f64,
    /// The evidence stands while `S ≥ release × h`: a straggler that keeps
    /// pace for a couple of iterations mid-fault stays named, one that has
    /// kept pace for `(cap − release) × h / k` ≈ 3 iterations is let go
    /// (and its verdict closes after the lifecycle's clean streak).
    pub release: f64,
    /// A rank whose what-if share was at least this in each of the last
    /// [`Self::decisive_run`] iterations is named without the lateness
    /// test's agreement. Chosen on seed 555 of the random evaluation: its
    /// five healthy runs with a told step (285 iterations) never had a
    /// rank above 1.6%, let alone twice running at 5%; 10% is the issue's
    /// "named within 10 iterations" class.
    pub decisive_share: f64,
    /// Consecutive iterations the decisive share must hold.
    pub decisive_run: u32,
}

impl Default for SequentialConfig {
    fn default() -> Self {
        Self {
            allowance: 0.05,
            alarm: 0.5,
            cap: 1.0,
            release: 0.5,
            decisive_share: 0.10,
            decisive_run: 5,
        }
    }
}

/// Per-rank CUSUM state.
#[derive(Debug, Clone, Default)]
pub struct Sequential {
    cfg: SequentialConfig,
    sums: BTreeMap<u32, f64>,
    /// Consecutive iterations each rank saved at least the decisive share.
    runs: BTreeMap<u32, u32>,
}

impl Sequential {
    pub fn new(cfg: SequentialConfig) -> Self {
        Self {
            cfg,
            sums: BTreeMap::new(),
            runs: BTreeMap::new(),
        }
    }

    /// One sealed iteration: `shares` are the ranks whose what-if saving
    /// was measured (share of the step, ≥ 0); ranks not listed saved
    /// nothing. Returns the ranks in alarm after it.
    pub fn update(&mut self, shares: &BTreeMap<u32, f64>) -> Vec<u32> {
        let cap = self.cfg.cap * self.cfg.alarm;
        for r in shares.keys() {
            self.sums.entry(*r).or_insert(0.0);
        }
        for (r, s) in self.sums.iter_mut() {
            let x = shares.get(r).copied().unwrap_or(0.0).clamp(0.0, 1.0);
            *s = (*s + x - self.cfg.allowance).clamp(0.0, cap);
        }
        self.sums.retain(|_, s| *s > 0.0);
        // A share above 1 (a saving longer than the step) means the step's
        // bounds are wrong, not that the rank is decisive.
        let strong = |x: f64| x >= self.cfg.decisive_share && x <= 1.0;
        self.runs
            .retain(|r, _| shares.get(r).is_some_and(|x| strong(*x)));
        for (r, x) in shares {
            if strong(*x) {
                *self.runs.entry(*r).or_insert(0) += 1;
            }
        }
        self.alarms()
    }

    /// Whether the what-if alone names `rank`: it saved at least the
    /// decisive share of each of the last `decisive_run` iterations.
    pub fn decisive(&self, rank: u32) -> bool {
        self.runs
            .get(&rank)
            .is_some_and(|n| *n >= self.cfg.decisive_run)
    }

    /// Ranks whose sum is at or above the alarm level.
    pub fn alarms(&self) -> Vec<u32> {
        self.sums
            .iter()
            .filter(|(_, s)| **s >= self.cfg.alarm)
            .map(|(r, _)| *r)
            .collect()
    }

    /// Whether `rank`'s evidence still stands: an open verdict on it is not
    /// cleared meanwhile.
    pub fn standing(&self, rank: u32) -> bool {
        self.sums
            .get(&rank)
            .is_some_and(|s| *s >= self.cfg.release * self.cfg.alarm)
    }

    pub fn config(&self) -> &SequentialConfig {
        &self.cfg
    }

    /// The current sum (share of a step), for evidence and tests.
    pub fn sum(&self, rank: u32) -> f64 {
        self.sums.get(&rank).copied().unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(r: u32, x: f64) -> BTreeMap<u32, f64> {
        [(r, x)].into()
    }

    fn iterations_to_alarm(x: f64) -> Option<usize> {
        let mut s = Sequential::new(SequentialConfig::default());
        (1..=100).find(|_| !s.update(&one(7, x)).is_empty())
    }

    #[test]
    fn only_a_large_share_held_for_several_steps_is_decisive() {
        let mut s = Sequential::new(SequentialConfig::default());
        for _ in 0..4 {
            s.update(&one(3, 0.5));
        }
        assert!(!s.decisive(3), "four steps are not enough");
        s.update(&one(3, 0.5));
        assert!(s.decisive(3));
        // One step below the share starts the run again.
        s.update(&one(3, 0.05));
        assert!(!s.decisive(3));
        // Shares above 1 (broken step bounds) never count.
        let mut t = Sequential::new(SequentialConfig::default());
        for _ in 0..10 {
            t.update(&one(4, 3.0));
        }
        assert!(!t.decisive(4));
    }

    #[test]
    fn a_costlier_straggler_is_named_sooner() {
        // Issue 25's target for ≥ 10%: within 10 iterations.
        let at10 = iterations_to_alarm(0.10).unwrap();
        let at20 = iterations_to_alarm(0.20).unwrap();
        assert!(at10 <= 10, "10%: {at10}");
        assert!(at20 <= 4, "20%: {at20}");
        assert_eq!(iterations_to_alarm(0.04), None, "below the allowance");
    }

    #[test]
    fn a_rotating_last_arriver_never_alarms() {
        // A healthy job: each iteration a different rank of 8 is last and
        // saves 30% (a long deschedule under load).
        let mut s = Sequential::new(SequentialConfig::default());
        for it in 0..1000u32 {
            assert!(s.update(&one(it % 8, 0.30)).is_empty(), "iteration {it}");
        }
    }

    #[test]
    fn a_dip_does_not_release_but_keeping_pace_does() {
        let mut s = Sequential::new(SequentialConfig::default());
        for _ in 0..20 {
            s.update(&one(2, 0.15));
        }
        assert_eq!(s.alarms(), vec![2]);
        // Two iterations at peers' pace: still standing.
        s.update(&BTreeMap::new());
        s.update(&BTreeMap::new());
        assert!(s.standing(2));
        // Kept pace for long enough: released, and the bound holds.
        let cfg = SequentialConfig::default();
        let bound = ((cfg.cap - cfg.release) * cfg.alarm / cfg.allowance).ceil() as usize;
        for _ in 0..bound {
            s.update(&BTreeMap::new());
        }
        assert!(!s.standing(2));
    }
}
