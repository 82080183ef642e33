//! Did the spread between ranks grow with the job's slowdown? In: each
//! iteration's balanced saving, what the iteration would have saved had
//! every rank worked at its role's median, as a share of the step (and
//! whether the iteration was GPU-side). Out: the share before a slowdown
//! began and since, so that work imbalance is said only of a slowdown it
//! explains.
//!
//! Every job has imbalance of its own: its jitter. Balancing a healthy
//! dp16 run would save 10% of its step (random 2027-15), so a finding needs
//! the job to have slowed. But a job slows for other reasons too: when
//! every rank's GPU becomes 1.3× slower (a host-wide throttle, a slower
//! input for all), the job's jitter stays what it was, the rule finds it
//! imbalanced as it always was, and the slowdown gave it the rise it
//! needed (a synthetic dp8 job with jitter 0.2: "work imbalance, costing
//! 7%"). What imbalance does, and a common slowdown does not, is make the
//! slowest ranks later against the others: the balanced saving's share of
//! the step grows.
//!
//! The costliest single rank's share was the measure first, and it missed
//! imbalance spread over many ranks: random 6211-2 (dp8, work ×1.46 drawn
//! anew every step) had its costliest rank's median share go from 0.8% to
//! 2.1% of the step (fixing one rank of eight leaves the next slowest),
//! while balancing all of them saved 15–16% of each step. Pure; `now` is
//! the iteration number.

use std::collections::VecDeque;

/// Knobs of [`Spread`] (`[structure]` thresholds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpreadConfig {
    /// Iterations before the slowdown that give the share it had.
    pub before: usize,
    /// Fewest of them that give an answer.
    pub min_before: usize,
    /// Most recent iterations that give the share it has now.
    pub recent: usize,
    /// How much the balanced saving must have grown (share of the step)
    /// for imbalance to have come with the slowdown.
    pub min_growth: f64,
}

/// What the spread was and is ([`Spread::growth`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    /// Median balanced saving (share of the step) over the iterations
    /// before the slowdown.
    pub before: f64,
    /// Median balanced saving over the most recent iterations.
    pub now: f64,
    /// Whether it grew by at least `min_growth`.
    pub explains: bool,
}

/// Iterations kept: enough for `before` ahead of a slowdown that began a
/// few hundred iterations ago.
const KEEP: usize = 1024;

/// The balanced saving's share of the step, per iteration.
#[derive(Debug, Clone, Default)]
pub struct Spread {
    /// (iteration, balanced saving's share, GPU-side).
    shares: VecDeque<(u64, f64, bool)>,
}

/// One iteration's balanced saving as a restarted coordinator gets it back
/// ([`Spread::state`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpreadPoint {
    pub iteration: u64,
    pub share: f64,
    pub gpu_side: bool,
}

impl Spread {
    /// One iteration's balanced saving, as a share of its step.
    pub fn observe(&mut self, k: u64, balanced_share: f64, gpu_side: bool) {
        if !balanced_share.is_finite() {
            return;
        }
        self.shares
            .push_back((k, balanced_share.clamp(0.0, 1.0), gpu_side));
        while self.shares.len() > KEEP {
            self.shares.pop_front();
        }
    }

    /// What a later coordinator life needs to tell a slowdown's spread
    /// from the one before it: without it, a slowdown after a restart has
    /// no "before" and the rise alone decides, as for a slowdown in the
    /// job's first steps.
    pub fn state(&self) -> Vec<SpreadPoint> {
        self.shares
            .iter()
            .map(|&(iteration, share, gpu_side)| SpreadPoint {
                iteration,
                share,
                gpu_side,
            })
            .collect()
    }

    /// Takes an earlier life's [`Self::state`] back: its iterations go
    /// before this life's (those it already has win), at most [`KEEP`].
    pub fn restore(&mut self, earlier: &[SpreadPoint]) {
        let first = self.shares.front().map_or(u64::MAX, |s| s.0);
        let mut old: VecDeque<(u64, f64, bool)> = earlier
            .iter()
            .filter(|p| p.iteration < first && p.share.is_finite())
            .map(|p| (p.iteration, p.share, p.gpu_side))
            .collect();
        old.make_contiguous().sort_by_key(|s| s.0);
        old.extend(self.shares.drain(..));
        while old.len() > KEEP {
            old.pop_front();
        }
        self.shares = old;
    }

    /// The spread before iteration `since` (when the slowdown began) and
    /// now, on one kind of arrival (`gpu`: GPU-side steps): the kind the
    /// finding was read on. Host-side arrivals do not show GPU work, so
    /// their spread stays what it was under an imbalance of GPU work
    /// (random 6211-2, dp8, work ×1.46: host-side 1.7% → 3.9% of the step,
    /// GPU-side 15–16%); GPU-side steps exist in deep windows, the
    /// warm-up's first look among them. `None` while either side has too
    /// few iterations (a slowdown from the first steps has no "before").
    pub fn growth(&self, since: u64, gpu: bool, cfg: &SpreadConfig) -> Option<Growth> {
        let before: Vec<f64> = self
            .shares
            .iter()
            .filter(|(k, _, g)| *k < since && *g == gpu)
            .rev()
            .take(cfg.before)
            .map(|s| s.1)
            .collect();
        let now: Vec<f64> = self
            .shares
            .iter()
            .filter(|(k, _, g)| *k >= since && *g == gpu)
            .rev()
            .take(cfg.recent)
            .map(|s| s.1)
            .collect();
        if before.len() < cfg.min_before.max(3) || now.len() < cfg.recent.div_ceil(2).max(3) {
            return None;
        }
        let (b, n) = (median(before), median(now));
        Some(Growth {
            before: b,
            now: n,
            explains: n - b >= cfg.min_growth,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: SpreadConfig = SpreadConfig {
        before: 24,
        min_before: 8,
        recent: 12,
        min_growth: 0.03,
    };

    fn spread(series: impl Iterator<Item = (u64, f64, bool)>) -> Spread {
        let mut s = Spread::default();
        for (k, top, gpu) in series {
            s.observe(k, top, gpu);
        }
        s
    }

    /// The balanced saving's share rose with the job's step: imbalance
    /// explains the slowdown. It stayed: the job slowed as a whole.
    #[test]
    fn imbalance_grows_the_spread_a_common_slowdown_does_not() {
        // Slower from 40: the balanced saving 0.04 → 0.15 of the step.
        let grew = spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.15 }, false)));
        let g = grew.growth(40, false, &CFG).unwrap();
        assert!(g.explains && (g.before - 0.04).abs() < 1e-9, "{g:?}");
        // Same slowdown, the share as it was (a bit smaller: same jitter,
        // longer step).
        let common = spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.035 }, false)));
        assert!(!common.growth(40, false, &CFG).unwrap().explains);
    }

    /// A restarted coordinator gets the earlier life's spread back: the
    /// slowdown it sees has a "before" again, and its own iterations win.
    #[test]
    fn the_spread_survives_a_restart() {
        let first = spread((0..40).map(|k| (k, 0.04, false)));
        let mut second = spread((38..80).map(|k| (k, 0.035, false)));
        assert_eq!(
            second.growth(45, false, &CFG),
            None,
            "no before in the new life"
        );
        second.restore(&first.state());
        let g = second.growth(45, false, &CFG).unwrap();
        assert!(!g.explains, "{g:?}");
        assert_eq!(second.state().len(), 80);
        assert!(second
            .state()
            .windows(2)
            .all(|w| w[0].iteration < w[1].iteration));
        // Iterations 38 and 39 are the new life's, not the earlier one's.
        assert_eq!(second.state()[38].share, 0.035);
    }

    /// Host-side before, GPU-side after (a deep window opened): nothing to
    /// compare on one kind, no answer, not a guess; a slowdown from the
    /// first steps has no "before" either.
    #[test]
    fn no_answer_without_iterations_of_one_kind_on_both_sides() {
        let s = spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.3 }, k >= 40)));
        assert_eq!(s.growth(40, false, &CFG), None);
        assert_eq!(s.growth(40, true, &CFG), None);
        let early = spread((0..80).map(|k| (k, 0.3, false)));
        assert_eq!(early.growth(2, false, &CFG), None);
        // Some host-side steps between deep windows are enough.
        let mixed =
            spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.2 }, k >= 40 && k % 3 != 0)));
        assert!(mixed.growth(40, false, &CFG).unwrap().explains);
    }

    /// GPU work moved, host-side arrivals did not show it: the GPU-side
    /// steps of a first look before the slowdown and of a deep window
    /// after it answer; the host-side ones are not asked.
    #[test]
    fn the_kind_the_finding_was_read_on_answers() {
        let s = spread((0..60).map(|k| {
            let gpu = (13..23).contains(&k) || k >= 47;
            let share = match (gpu, k >= 39) {
                (true, true) => 0.15,
                (true, false) => 0.05,
                (false, true) => 0.039,
                (false, false) => 0.017,
            };
            (k, share, gpu)
        }));
        assert!(!s.growth(39, false, &CFG).unwrap().explains);
        let g = s.growth(39, true, &CFG).unwrap();
        assert!(g.explains && (g.before - 0.05).abs() < 1e-9, "{g:?}");
    }
}
