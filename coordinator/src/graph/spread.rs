//! Did the spread between ranks grow with the job's slowdown? In: each
//! iteration's costliest rank's what-if share of the step (and whether the
//! iteration was GPU-side). Out: the share before a slowdown began and
//! since, so that work imbalance is said only of a slowdown it explains.
//!
//! Every job has imbalance of its own: its jitter. Balancing a healthy
//! dp16 run would save 10% of its step (random 2027-15), so a finding needs
//! the job to have slowed. But a job slows for other reasons too: when
//! every rank's GPU becomes 1.3× slower (a host-wide throttle, a slower
//! input for all), the job's jitter stays what it was, the rule finds it
//! imbalanced as it always was, and the slowdown gave it the rise it
//! needed (a synthetic dp8 job with jitter 0.2: "work imbalance, costing
//! 7%"). What imbalance does, and a common slowdown does not, is make the
//! slowest rank later against the others: the costliest rank's share of
//! the step grows. Pure; `now` is the iteration number.

use std::collections::{BTreeMap, VecDeque};

/// Knobs of [`Spread`] (`[structure]` thresholds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpreadConfig {
    /// Iterations before the slowdown that give the share it had.
    pub before: usize,
    /// Most recent iterations that give the share it has now.
    pub recent: usize,
    /// How much the costliest share must have grown (share of the step)
    /// for imbalance to have come with the slowdown.
    pub min_growth: f64,
}

/// What the spread was and is ([`Spread::growth`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    /// Median costliest share over the iterations before the slowdown.
    pub before: f64,
    /// Median costliest share over the most recent iterations.
    pub now: f64,
    /// Whether it grew by at least `min_growth`.
    pub explains: bool,
}

/// Iterations kept: enough for `before` ahead of a slowdown that began a
/// few hundred iterations ago.
const KEEP: usize = 1024;

/// The costliest rank's share per iteration.
#[derive(Debug, Clone, Default)]
pub struct Spread {
    /// (iteration, costliest share, GPU-side).
    shares: VecDeque<(u64, f64, bool)>,
}

impl Spread {
    /// One iteration's what-if shares (share of the step per rank).
    pub fn observe(&mut self, k: u64, shares: &BTreeMap<u32, f64>, gpu_side: bool) {
        let top = shares
            .values()
            .copied()
            .filter(|x| x.is_finite())
            .fold(0.0f64, f64::max)
            .min(1.0);
        self.shares.push_back((k, top, gpu_side));
        while self.shares.len() > KEEP {
            self.shares.pop_front();
        }
    }

    /// The spread before iteration `since` (when the slowdown began) and
    /// now. Compared
    /// on one kind of arrival: GPU-side steps exist mostly in deep windows,
    /// which open after a slowdown, and their shares are not those of
    /// host-side ones. `None` while either side has too few iterations
    /// (a slowdown from the first steps has no "before").
    pub fn growth(&self, since: u64, cfg: &SpreadConfig) -> Option<Growth> {
        let need = |n: usize| n.div_ceil(2).max(3);
        for gpu in [false, true] {
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
            if before.len() < need(cfg.before) || now.len() < need(cfg.recent) {
                continue;
            }
            let (b, n) = (median(before), median(now));
            return Some(Growth {
                before: b,
                now: n,
                explains: n - b >= cfg.min_growth,
            });
        }
        None
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
        recent: 12,
        min_growth: 0.03,
    };

    fn spread(series: impl Iterator<Item = (u64, f64, bool)>) -> Spread {
        let mut s = Spread::default();
        for (k, top, gpu) in series {
            s.observe(k, &BTreeMap::from([(0, top), (1, top / 3.0)]), gpu);
        }
        s
    }

    /// The costliest rank's share rose with the job's step: imbalance
    /// explains the slowdown. It stayed: the job slowed as a whole.
    #[test]
    fn imbalance_grows_the_spread_a_common_slowdown_does_not() {
        // Slower from 40: the top share 0.04 → 0.15.
        let grew = spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.15 }, false)));
        let g = grew.growth(40, &CFG).unwrap();
        assert!(g.explains && (g.before - 0.04).abs() < 1e-9, "{g:?}");
        // Same slowdown, the share as it was (a bit smaller: same jitter,
        // longer step).
        let common = spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.035 }, false)));
        assert!(!common.growth(40, &CFG).unwrap().explains);
    }

    /// Host-side before, GPU-side after (a deep window opened): nothing to
    /// compare on one kind, no answer, not a guess; a slowdown from the
    /// first steps has no "before" either.
    #[test]
    fn no_answer_without_iterations_of_one_kind_on_both_sides() {
        let s = spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.3 }, k >= 40)));
        assert_eq!(s.growth(40, &CFG), None);
        let early = spread((0..80).map(|k| (k, 0.3, false)));
        assert_eq!(early.growth(2, &CFG), None);
        // Some host-side steps between deep windows are enough.
        let mixed =
            spread((0..80).map(|k| (k, if k < 40 { 0.04 } else { 0.2 }, k >= 40 && k % 3 != 0)));
        assert!(mixed.growth(40, &CFG).unwrap().explains);
    }
}
