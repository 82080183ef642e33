//! The job's pace: did its step slow down, by how much, since when — and
//! which ranks' what-if costs were highest meanwhile. "No slow rank found"
//! is only said of a job that did not slow (DESIGN.md §5).
//!
//! In: each sealed iteration's duration and the ranks' what-if shares of it
//! ([`crate::graph::whatif`]). Out: a [`Slowing`] while the recent median step is
//! above the baseline by more than the job's own noise. Pure.

use std::collections::{BTreeMap, VecDeque};

use crate::robust::{midpoint_median as median, MAD_TO_SIGMA};

/// The job's pace rules (the `[pace]` table of a thresholds file).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaceConfig {
    /// Steps whose median is the baseline (after warm-up), once the job has
    /// run that long: the first ones, so a slow stretch never becomes the
    /// norm.
    pub baseline_steps: usize,
    /// Steps whose median is compared with the baseline, once the job has
    /// run long enough.
    pub recent_steps: usize,
    /// Before `baseline_steps + recent_steps` steps, the steps seen so far
    /// are split two to one (the last third is "recent"), as long as the
    /// baseline holds at least this many: a short job (a 60-step run, a job
    /// watched since its start) is told whether it slowed instead of
    /// nothing. The wider standard error of the smaller medians keeps the
    /// noise test honest.
    pub min_baseline_steps: usize,
    /// Smallest rise reported, as a share of the baseline: below it a job's
    /// pace drifts with load on shared hosts and nobody would act on it.
    pub min_rise: f64,
    /// How many standard errors of the difference of the two medians a rise
    /// must exceed (the medians of 20 and 40 noisy steps).
    pub noise_sigmas: f64,
    /// How near the slowdown's onset must be to a verdict's first sighting
    /// (iterations) for the rise to be read as that verdict's: the pace's
    /// onset is the first step past halfway up, a verdict opens on evidence
    /// that takes a few steps to gather, and 10 spans both on 60-step runs.
    pub onset_match: u64,
}

/// Defaults of [`PaceConfig`] the tests and the report's wording use.
pub const BASELINE_STEPS: usize = 40;
pub const RECENT_STEPS: usize = 20;
pub const MIN_BASELINE_STEPS: usize = 16;

impl Default for PaceConfig {
    fn default() -> Self {
        Self {
            baseline_steps: BASELINE_STEPS,
            recent_steps: RECENT_STEPS,
            min_baseline_steps: MIN_BASELINE_STEPS,
            min_rise: 0.03,
            noise_sigmas: 4.0,
            onset_match: 10,
        }
    }
}

/// A slowdown of the job's step.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Slowing {
    pub baseline_step_ms: f64,
    pub recent_step_ms: f64,
    /// (recent − baseline) / baseline.
    pub rise: f64,
    /// First iteration of the current run of slow windows.
    pub since_iteration: u64,
    /// Ranks the recent iterations waited for most: (rank, mean what-if
    /// share of the step over the recent window), largest first, at most 3.
    pub candidates: Vec<Candidate>,
}

impl Slowing {
    /// An ongoing slow stretch read as a slowdown against the job's best
    /// pace (no candidates: the stretch does not keep the shares).
    pub fn of_stretch(st: &crate::classify::stretches::Stretch) -> Self {
        Slowing {
            baseline_step_ms: st.pace_ms,
            recent_step_ms: st.step_ms,
            rise: st.rise,
            since_iteration: st.from_iteration,
            candidates: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    pub rank: u32,
    /// Mean what-if share of the step over the recent window.
    pub cost_fraction: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Pace {
    cfg: PaceConfig,
    stretch: crate::classify::stretches::StretchConfig,
    baseline: Vec<f64>,
    recent: VecDeque<(u64, f64)>,
    shares: VecDeque<BTreeMap<u32, f64>>,
    since: Option<u64>,
    /// Every step from the stretches' `first_step`, for
    /// [`crate::classify::stretches`] (the last [`HISTORY_STEPS`]).
    history: VecDeque<(u64, f64)>,
}

/// Steps kept for the slow stretches: 16 bytes each, 1.6 MB; at a step a
/// second, the last 28 hours of the job.
pub const HISTORY_STEPS: usize = 100_000;

/// Median and robust standard deviation (MAD × [`MAD_TO_SIGMA`]).
fn center_sigma(v: &[f64]) -> (f64, f64) {
    let mut c = v.to_vec();
    let m = median(&mut c);
    let mut d: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    (m, MAD_TO_SIGMA * median(&mut d))
}

impl Pace {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_config(
        cfg: PaceConfig,
        stretch: crate::classify::stretches::StretchConfig,
    ) -> Self {
        Self {
            cfg,
            stretch,
            ..Self::default()
        }
    }

    pub fn config(&self) -> &PaceConfig {
        &self.cfg
    }

    /// How many of `n` steps seen form the recent window: a third until
    /// the baseline is full, then [`RECENT_STEPS`] (continuous at
    /// `n = BASELINE_STEPS + RECENT_STEPS`).
    fn recent_len(&self, n: usize) -> usize {
        if self.baseline.len() >= self.cfg.baseline_steps {
            self.cfg.recent_steps
        } else {
            (n / 3).min(self.cfg.recent_steps)
        }
    }

    /// One sealed, post-warm-up iteration `k` of `step_ns`, with the
    /// ranks' what-if shares of it.
    pub fn observe(&mut self, k: u64, step_ns: f64, shares: &BTreeMap<u32, f64>) {
        if !step_ns.is_finite() || step_ns <= 0.0 {
            return;
        }
        self.recent.push_back((k, step_ns));
        self.shares.push_back(shares.clone());
        // The oldest recent steps move into the baseline until it is full,
        // then leave.
        while self.recent.len() > self.recent_len(self.baseline.len() + self.recent.len()) {
            let Some((_, old)) = self.recent.pop_front() else {
                break;
            };
            self.shares.pop_front();
            if self.baseline.len() < self.cfg.baseline_steps {
                self.baseline.push(old);
            }
        }
        match self.slowing_now() {
            Some((b, m)) if self.since.is_none() => {
                // Onset: the first step past halfway up from which most
                // of the window stays there (a noisy early step is not it).
                let half = b + 0.5 * (m - b);
                let v: Vec<(u64, f64)> = self.recent.iter().copied().collect();
                self.since = (0..v.len())
                    .find(|&i| {
                        let above = v[i..].iter().filter(|r| r.1 > half).count();
                        v[i].1 > half && above as f64 >= 0.8 * (v.len() - i) as f64
                    })
                    .map(|i| v[i].0);
            }
            Some(_) => {}
            None => self.since = None,
        }
    }

    fn slowing_now(&self) -> Option<(f64, f64)> {
        if self.baseline.len() < self.cfg.min_baseline_steps {
            return None;
        }
        let (b, sb) = center_sigma(&self.baseline);
        let r: Vec<f64> = self.recent.iter().map(|x| x.1).collect();
        let (m, sr) = center_sigma(&r);
        // Standard error of a median ≈ 1.25 σ / √n. The recent window's σ is
        // at least the baseline's: a MAD of a few steps can be small by chance.
        let sr = sr.max(sb);
        let se =
            1.25 * ((sb * sb) / self.baseline.len() as f64 + (sr * sr) / r.len() as f64).sqrt();
        let rise = m - b;
        (b > 0.0 && rise > self.cfg.min_rise * b && rise > self.cfg.noise_sigmas * se)
            .then_some((b, m))
    }

    /// The slowdown now, if the job's step rose beyond its noise.
    pub fn slowing(&self) -> Option<Slowing> {
        let (b, m) = self.slowing_now()?;
        let mut sums: BTreeMap<u32, f64> = BTreeMap::new();
        for s in &self.shares {
            for (r, x) in s {
                *sums.entry(*r).or_default() += x;
            }
        }
        let n = self.shares.len().max(1) as f64;
        let mut candidates: Vec<Candidate> = sums
            .into_iter()
            .map(|(rank, s)| Candidate {
                rank,
                cost_fraction: s / n,
            })
            .filter(|c| c.cost_fraction > 0.0)
            .collect();
        candidates.sort_by(|a, b| b.cost_fraction.total_cmp(&a.cost_fraction));
        candidates.truncate(3);
        Some(Slowing {
            baseline_step_ms: b / 1e6,
            recent_step_ms: m / 1e6,
            rise: (m - b) / b,
            since_iteration: self.since.unwrap_or(0),
            candidates,
        })
    }

    /// One sealed iteration's step for the slow stretches: every one from
    /// the stretches' `first_step` on, warm-up included (a
    /// fault from iteration 11 of a job whose warm-up is 20 steps would
    /// otherwise be its pace).
    pub fn record_step(&mut self, k: u64, step_ns: f64) {
        if k < self.stretch.first_step || !step_ns.is_finite() || step_ns <= 0.0 {
            return;
        }
        if self.history.len() == HISTORY_STEPS {
            self.history.pop_front();
        }
        self.history.push_back((k, step_ns));
    }

    /// Stretches of the run slower than the job's own best pace, ended ones
    /// included ([`crate::classify::stretches`]).
    pub fn stretches(&self) -> Vec<crate::classify::stretches::Stretch> {
        let v: Vec<(u64, f64)> = self.history.iter().copied().collect();
        crate::classify::stretches::find(&v, &self.stretch)
    }

    /// The baseline step (ms), once known: without it nothing can be said
    /// of the job's pace.
    pub fn baseline_ms(&self) -> Option<f64> {
        (self.baseline.len() >= self.cfg.min_baseline_steps).then(|| {
            let mut b = self.baseline.clone();
            median(&mut b) / 1e6
        })
    }
}

/// What a [`Pace`] has learned, for a coordinator started again on the
/// same `--out` ([`crate::resume`]): without it the new life's baseline
/// would be its own first steps, and a restart in the middle of a slowdown
/// would make the slow steps the job's norm.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PaceState {
    /// The baseline steps (ns), at most `baseline_steps`.
    pub baseline: Vec<f64>,
    /// The recent window: (iteration, step ns), oldest first.
    pub recent: Vec<(u64, f64)>,
    /// Onset of the slowdown under way, if any.
    pub since: Option<u64>,
    /// The last steps of the history the slow stretches read (iteration,
    /// step ns), oldest first.
    pub history: Vec<(u64, f64)>,
}

impl PaceState {
    /// Drops what no pace could have produced (a step not finite or not
    /// positive, iterations out of order), so a hand-edited or corrupt file
    /// cannot poison the medians.
    fn sane(mut self) -> Self {
        let ok = |x: &f64| x.is_finite() && *x > 0.0;
        self.baseline.retain(ok);
        for v in [&mut self.recent, &mut self.history] {
            v.retain(|(_, x)| ok(x));
            let mut last = None;
            v.retain(|(k, _)| {
                let keep = last.is_none_or(|l| *k > l);
                if keep {
                    last = Some(*k);
                }
                keep
            });
        }
        self
    }
}

impl Pace {
    /// What this pace has learned, with the last `max_history` steps of
    /// its history.
    pub fn state(&self, max_history: usize) -> PaceState {
        let skip = self.history.len().saturating_sub(max_history);
        PaceState {
            baseline: self.baseline.clone(),
            recent: self.recent.iter().copied().collect(),
            since: self.since,
            history: self.history.iter().skip(skip).copied().collect(),
        }
    }

    /// Continues from an earlier life's `state`, before this life observed
    /// anything (returns false and changes nothing otherwise). The recent
    /// window's per-rank shares are not kept: the candidates of a slowdown
    /// come from this life's iterations as they arrive.
    pub fn restore(&mut self, state: PaceState) -> bool {
        if !self.baseline.is_empty() || !self.recent.is_empty() || !self.history.is_empty() {
            return false;
        }
        let mut s = state.sane();
        s.baseline.truncate(self.cfg.baseline_steps);
        let extra = s.recent.len().saturating_sub(self.cfg.recent_steps);
        s.recent.drain(..extra);
        let extra = s.history.len().saturating_sub(HISTORY_STEPS);
        s.history.drain(..extra);
        self.baseline = s.baseline;
        self.shares = s.recent.iter().map(|_| BTreeMap::new()).collect();
        self.recent = s.recent.into();
        self.since = s.since;
        self.history = s.history.into();
        true
    }
}

/// A verdict's cost read from the job's pace instead of the what-if.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RiseEstimate {
    /// The rise as a share of the slower step, less what costed verdicts
    /// explain.
    pub fraction: f64,
    pub baseline_step_ms: f64,
    pub recent_step_ms: f64,
    pub since_iteration: u64,
}

/// An active verdict as [`rise_owner`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Costing {
    pub first_seen_iteration: u64,
    /// Its what-if cost (share of the step), `None` where never measured.
    pub measured: Option<f64>,
}

/// The one active verdict the job's slowdown can be put on when the
/// what-if cannot cost it: the only uncosted one, first seen within
/// `onset_match` of the slowdown's onset, while the costed ones explain
/// less than half of the rise. Its estimate is the rise (as a share of the
/// slower step) less what the costed ones explain. Two uncosted verdicts,
/// or one that began far from the onset, get none: the rise is not theirs
/// to split or to claim. Returns (its index in `active`, the estimate).
pub fn rise_owner(
    slowing: &Slowing,
    onset_match: u64,
    active: &[Costing],
) -> Option<(usize, RiseEstimate)> {
    let needed = slowing.rise / (1.0 + slowing.rise);
    let explained: f64 = active.iter().filter_map(|c| c.measured).sum();
    if explained >= 0.5 * needed {
        return None;
    }
    let mut uncosted = active
        .iter()
        .enumerate()
        .filter(|(_, c)| c.measured.is_none());
    let (i, c) = uncosted.next()?;
    if uncosted.next().is_some()
        || c.first_seen_iteration.abs_diff(slowing.since_iteration) > onset_match
    {
        return None;
    }
    Some((
        i,
        RiseEstimate {
            fraction: needed - explained,
            baseline_step_ms: slowing.baseline_step_ms,
            recent_step_ms: slowing.recent_step_ms,
            since_iteration: slowing.since_iteration,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(k: u64) -> f64 {
        // ±5% deterministic wobble around 45 ms.
        45e6 * (1.0 + 0.05 * ((k * 7919 % 101) as f64 / 50.0 - 1.0))
    }

    /// A coordinator restarted 10 steps into a 30 % slowdown: the new life,
    /// started from the earlier life's state, still tells the slowdown and
    /// its onset; one that learned its baseline afresh takes the slow steps
    /// for the job's pace.
    #[test]
    fn a_restart_mid_slowdown_keeps_the_baseline() {
        let mut first = Pace::new();
        for k in 0..70 {
            first.observe(k, noisy(k), &BTreeMap::new());
            first.record_step(k, noisy(k));
        }
        for k in 70..80 {
            first.observe(k, noisy(k) * 1.3, &BTreeMap::new());
            first.record_step(k, noisy(k) * 1.3);
        }
        let kept = first.state(1_000);
        // Through JSON, as in `--out`.
        let kept: PaceState = serde_json::from_str(&serde_json::to_string(&kept).unwrap()).unwrap();
        let mut resumed = Pace::new();
        assert!(resumed.restore(kept.clone()));
        let mut afresh = Pace::new();
        // The restarted life's own warm-up (20 steps) is not observed.
        for k in 100..160 {
            resumed.observe(k, noisy(k) * 1.3, &BTreeMap::new());
            afresh.observe(k, noisy(k) * 1.3, &BTreeMap::new());
        }
        let s = resumed.slowing().expect("the slowdown is still told");
        assert!((s.rise - 0.3).abs() < 0.06, "{s:?}");
        assert!((68..=72).contains(&s.since_iteration), "{s:?}");
        assert!((resumed.baseline_ms().unwrap() - 45.0).abs() < 1.5);
        assert!(afresh.slowing().is_none(), "the slow steps became the norm");
        assert_eq!(
            resumed.history, first.history,
            "the stretches' history goes on"
        );
        // Only into a pace that has seen nothing yet.
        assert!(!resumed.restore(kept));
    }

    #[test]
    fn a_corrupt_pace_state_is_cleaned_before_use() {
        let mut p = Pace::new();
        let mut s = PaceState {
            baseline: vec![45e6; 50],
            recent: vec![(5, 45e6), (4, 46e6), (6, f64::NAN), (7, -1.0), (8, 44e6)],
            since: None,
            history: vec![(1, f64::INFINITY), (2, 45e6)],
        };
        s.baseline.push(f64::NAN);
        assert!(p.restore(s));
        assert_eq!(p.baseline.len(), BASELINE_STEPS);
        assert!(p.baseline.iter().all(|x| x.is_finite()));
        assert_eq!(
            p.recent.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![5, 8],
            "out of order, NaN and negative steps dropped"
        );
        assert_eq!(p.shares.len(), p.recent.len());
        assert_eq!(p.history.len(), 1);
    }

    #[test]
    fn a_steady_noisy_job_did_not_slow() {
        let mut p = Pace::new();
        for k in 0..500 {
            p.observe(k, noisy(k), &BTreeMap::new());
            assert!(p.slowing().is_none(), "iteration {k}");
        }
        assert!((p.baseline_ms().unwrap() - 45.0).abs() < 1.5);
    }

    /// A 60-step job (warm-up excluded, ~50 steps) slowed by 15 % from its
    /// 35th: told while it runs, not only after 60 steps.
    #[test]
    fn a_short_job_is_told_whether_it_slowed() {
        let mut p = Pace::new();
        // 22 steps: 15 would be baseline, one short.
        for k in 0..22 {
            p.observe(k, noisy(k), &BTreeMap::new());
        }
        assert_eq!(p.baseline_ms(), None, "too few steps to have a baseline");
        p.observe(22, noisy(22), &BTreeMap::new());
        assert!(p.baseline_ms().is_some());
        let mut healthy = p.clone();
        for k in 23..35 {
            p.observe(k, noisy(k), &BTreeMap::new());
            healthy.observe(k, noisy(k), &BTreeMap::new());
            assert!(healthy.slowing().is_none(), "healthy, step {k}");
        }
        for k in 35..50 {
            p.observe(k, noisy(k) * 1.15, &BTreeMap::new());
            healthy.observe(k, noisy(k), &BTreeMap::new());
            assert!(healthy.slowing().is_none(), "healthy, step {k}");
        }
        let s = p.slowing().expect("slowed");
        assert!((s.rise - 0.15).abs() < 0.05, "{s:?}");
        assert!((33..=40).contains(&s.since_iteration), "{s:?}");
        // The windows grow into the long-run ones without a jump: at 60
        // steps the baseline is the first 40.
        for k in 50..200 {
            healthy.observe(k, noisy(k), &BTreeMap::new());
            assert!(healthy.slowing().is_none(), "healthy, step {k}");
        }
        assert_eq!(healthy.baseline.len(), BASELINE_STEPS);
        assert_eq!(healthy.recent.len(), RECENT_STEPS);
    }

    #[test]
    fn a_slower_step_is_reported_with_its_onset_and_candidates() {
        let mut p = Pace::new();
        for k in 0..100 {
            p.observe(k, noisy(k), &BTreeMap::new());
        }
        let slow: BTreeMap<u32, f64> = [(5, 0.09), (2, 0.01)].into();
        for k in 100..130 {
            p.observe(k, noisy(k) * 1.1, &slow);
        }
        let s = p.slowing().expect("slowed");
        assert!((s.rise - 0.1).abs() < 0.03, "{s:?}");
        // Within a few steps of the onset: a noisy healthy step just before
        // it may already pass halfway.
        assert!((94..=110).contains(&s.since_iteration), "{s:?}");
        assert_eq!(s.candidates[0].rank, 5);
        assert!((s.candidates[0].cost_fraction - 0.09).abs() < 1e-9);
        // Back to pace: no longer slowing.
        for k in 130..160 {
            p.observe(k, noisy(k), &BTreeMap::new());
        }
        assert!(p.slowing().is_none());
    }

    #[test]
    fn the_rise_is_put_on_the_one_uncosted_verdict_that_began_with_it() {
        let slowing = Slowing {
            baseline_step_ms: 400.0,
            recent_step_ms: 600.0,
            rise: 0.5,
            since_iteration: 36,
            candidates: Vec::new(),
        };
        let at = |first: u64, measured: Option<f64>| Costing {
            first_seen_iteration: first,
            measured,
        };
        // One uncosted verdict from iteration 40: the rise is a third of
        // the slower step, less the 5% a costed verdict explains.
        let (i, e) = rise_owner(&slowing, 10, &[at(20, Some(0.05)), at(40, None)]).unwrap();
        assert_eq!(i, 1);
        assert!((e.fraction - (1.0 / 3.0 - 0.05)).abs() < 1e-9, "{e:?}");
        assert_eq!((e.baseline_step_ms, e.since_iteration), (400.0, 36));
        // Began far from the onset, or two to split it: no estimate.
        assert!(rise_owner(&slowing, 10, &[at(60, None)]).is_none());
        assert!(rise_owner(&slowing, 10, &[at(36, None), at(38, None)]).is_none());
        // Costed verdicts explain most of it: nothing left to put.
        assert!(rise_owner(&slowing, 10, &[at(36, None), at(30, Some(0.2))]).is_none());
        assert!(rise_owner(&slowing, 10, &[]).is_none());
    }
}
