//! Stretches of the run where the job's step was slower than its own best
//! sustained pace, past ones included (DESIGN.md §5: "No slow rank found"
//! is only said of a job that did not slow).
//!
//! [`crate::classify::pace`] compares the recent steps with the first ones,
//! which answers "is the job slower now?". It cannot see a slowdown that
//! began before its baseline filled (the slow steps *are* the baseline) or
//! one that ended before the report: a job 3× slower for twenty steps in
//! the middle of a run, back to pace at the end, "kept its pace" by that
//! test. Here the whole post-warm-up history is read at once: its pace is
//! what it sustained at its best, and every stretch sustained well above
//! it is reported, with where it began and ended.
//!
//! In: the sealed iterations' steps, in order. Out: [`Stretch`]es. Pure.

use crate::robust::{midpoint_median as median, MAD_TO_SIGMA};

/// The slow stretches' rules (the `[stretches]` table of a thresholds
/// file).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StretchConfig {
    /// The first iteration the stretches read. The verdicts' warm-up (20
    /// steps) keeps allocator and autotuning steps out of the baseline, but
    /// a stretch needs `min_stretch` steps in a row `min_rise` above the
    /// best pace, which those do not make after the first few; and a fault
    /// that began within the warm-up would otherwise be the job's pace
    /// (random 3119-19: a GPU 1.61× slower from iteration 20 of 60 was the
    /// whole history).
    pub first_step: u64,
    /// Steps in the centred running median that smooths the step: one odd
    /// step (a checkpoint, a collection) never makes or breaks a stretch.
    pub smooth_steps: usize,
    /// Shortest stretch reported (iterations): a few slow steps in a row
    /// are an evaluation pass or a checkpoint, not a slowdown anyone acts
    /// on. Fewer than three times as many steps seen tell nothing.
    pub min_stretch: usize,
    /// Gaps of at most this many steps back at pace do not split a stretch
    /// (a fault that slows some steps more than others dips under the
    /// line).
    pub max_gap: usize,
    /// The job's pace is this quantile of its smoothed steps: its best
    /// sustained level, as long as it ran at pace for at least this share
    /// of the history (below it, the whole run is "the pace" and nothing
    /// is told, as before any baseline).
    pub pace_quantile: f64,
    /// Smallest rise reported, as a share of the pace. Higher than the live
    /// test's (`[pace] min_rise`): the pace here is the job's best
    /// stretch, so a shared host's load drifting up and down reads as a
    /// rise. Healthy runs of the random evaluation (143, seeds 1127, 2027
    /// and 3119, a 2-core VM) drifted up to 7% above their best pace for
    /// ten steps; at 10% none is told.
    pub min_rise: f64,
    /// How many standard errors of a smoothed step above the pace a step
    /// must be to be slow (σ from the steps' own scatter around the
    /// smoothed line).
    pub noise_sigmas: f64,
}

impl Default for StretchConfig {
    fn default() -> Self {
        Self {
            first_step: 5,
            smooth_steps: 5,
            min_stretch: 6,
            max_gap: 2,
            pace_quantile: 0.2,
            min_rise: 0.10,
            noise_sigmas: 4.0,
        }
    }
}

/// A stretch of iterations slower than the job's pace.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Stretch {
    pub from_iteration: u64,
    /// Already slow at the first step read (`first_step`): it began then
    /// or earlier.
    pub from_first_step: bool,
    /// The last slow iteration.
    pub to_iteration: u64,
    /// It lasted to the last step seen.
    pub ongoing: bool,
    /// Median step over the stretch (ms).
    pub step_ms: f64,
    /// The job's pace (ms).
    pub pace_ms: f64,
    /// (step − pace) / pace.
    pub rise: f64,
}

/// The slow stretches of `steps` ((iteration, step ns), in iteration
/// order).
pub fn find(steps: &[(u64, f64)], cfg: &StretchConfig) -> Vec<Stretch> {
    let steps: Vec<(u64, f64)> = steps
        .iter()
        .copied()
        .filter(|(_, s)| s.is_finite() && *s > 0.0)
        .collect();
    let n = steps.len();
    if n < 3 * cfg.min_stretch.max(1) || cfg.smooth_steps == 0 {
        return Vec::new();
    }
    let smooth = running_median(&steps, cfg.smooth_steps);
    let pace = {
        let mut v = smooth.clone();
        v.sort_by(f64::total_cmp);
        v[((n - 1) as f64 * cfg.pace_quantile.clamp(0.0, 1.0)).round() as usize]
    };
    let sigma = {
        let mut r: Vec<f64> = steps
            .iter()
            .zip(&smooth)
            .map(|((_, s), m)| (s - m).abs())
            .collect();
        MAD_TO_SIGMA * median(&mut r)
    };
    // Standard error of a median of `smooth_steps` ≈ 1.25 σ / √n.
    let se = 1.25 * sigma / (cfg.smooth_steps as f64).sqrt();
    let line = pace + (cfg.min_rise * pace).max(cfg.noise_sigmas * se);
    let slow: Vec<bool> = smooth.iter().map(|m| *m > line).collect();
    runs(&slow, cfg.max_gap)
        .into_iter()
        .filter(|(a, b)| b - a + 1 >= cfg.min_stretch)
        .filter_map(|(a, b)| {
            let mut v: Vec<f64> = steps[a..=b].iter().map(|x| x.1).collect();
            let m = median(&mut v);
            let rise = (m - pace) / pace;
            (rise > cfg.min_rise).then(|| Stretch {
                from_iteration: steps[a].0,
                from_first_step: a == 0,
                to_iteration: steps[b].0,
                ongoing: b == n - 1,
                step_ms: m / 1e6,
                pace_ms: pace / 1e6,
                rise,
            })
        })
        .collect()
}

/// Centred running median of the steps over `w` (shrunk at the ends).
fn running_median(steps: &[(u64, f64)], w: usize) -> Vec<f64> {
    let h = w / 2;
    (0..steps.len())
        .map(|i| {
            let lo = i.saturating_sub(h);
            let hi = (i + h + 1).min(steps.len());
            let mut v: Vec<f64> = steps[lo..hi].iter().map(|x| x.1).collect();
            median(&mut v)
        })
        .collect()
}

/// Maximal runs of `true` (first, last index), joined across gaps of at
/// most `gap` `false`s.
fn runs(v: &[bool], gap: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, _) in v.iter().enumerate().filter(|(_, s)| **s) {
        match out.last_mut() {
            Some((_, b)) if i - *b <= gap + 1 => *b = i,
            _ => out.push((i, i)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the default rules.
    fn find(steps: &[(u64, f64)]) -> Vec<Stretch> {
        super::find(steps, &StretchConfig::default())
    }

    /// ±`j` deterministic wobble around `base` ms.
    fn wobble(k: u64, base: f64, j: f64) -> f64 {
        base * 1e6 * (1.0 + j * ((k * 7919 % 101) as f64 / 50.0 - 1.0))
    }

    fn job(n: u64, slow: impl Fn(u64) -> f64) -> Vec<(u64, f64)> {
        (0..n)
            .map(|k| (k, wobble(k, 300.0, 0.03) * slow(k)))
            .collect()
    }

    #[test]
    fn a_steady_noisy_job_has_no_slow_stretch() {
        assert!(find(&job(60, |_| 1.0)).is_empty());
        assert!(find(&job(5000, |_| 1.0)).is_empty());
        // Odd slow steps (a checkpoint every 50) are not a stretch.
        let spikes = job(500, |k| if k % 50 == 0 { 3.0 } else { 1.0 });
        assert!(find(&spikes).is_empty(), "{:?}", find(&spikes));
    }

    /// The slowdown began before a baseline could have filled and ended
    /// before the report: the pace test says "kept its pace"; this does not.
    #[test]
    fn a_stretch_in_the_middle_is_found_with_its_ends() {
        let s = find(&job(
            58,
            |k| if (14..=40).contains(&k) { 1.43 } else { 1.0 },
        ));
        assert_eq!(s.len(), 1, "{s:?}");
        let s = &s[0];
        assert!((13..=15).contains(&s.from_iteration), "{s:?}");
        assert!((39..=41).contains(&s.to_iteration), "{s:?}");
        assert!(!s.ongoing);
        assert!((s.rise - 0.43).abs() < 0.05, "{s:?}");
        assert!((s.pace_ms - 300.0).abs() < 10.0, "{s:?}");
    }

    #[test]
    fn a_slowdown_to_the_end_is_ongoing_and_two_are_two() {
        let s = find(&job(120, |k| match k {
            20..=39 => 1.2,
            90.. => 1.5,
            _ => 1.0,
        }));
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(!s[0].ongoing && s[1].ongoing, "{s:?}");
        assert_eq!(s[1].to_iteration, 119);
        assert!((s[0].rise - 0.2).abs() < 0.04 && (s[1].rise - 0.5).abs() < 0.05);
    }

    /// Uneven work (every other step of a stretch much slower) stays one
    /// stretch; a rise below the floor is none.
    #[test]
    fn uneven_stretches_hold_together_and_small_rises_are_not_told() {
        let s = find(&job(80, |k| match k {
            30..=50 if k % 3 != 0 => 2.0,
            30..=50 => 1.1,
            _ => 1.0,
        }));
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(find(&job(80, |k| if k >= 40 { 1.02 } else { 1.0 })).is_empty());
        assert!(find(&job(10, |k| if k >= 5 { 2.0 } else { 1.0 })).is_empty());
    }

    #[test]
    fn runs_join_small_gaps() {
        let v = [
            false, true, true, false, false, true, false, false, false, true,
        ];
        assert_eq!(runs(&v, 2), vec![(1, 5), (9, 9)]);
        assert_eq!(runs(&v, 0), vec![(1, 2), (5, 5), (9, 9)]);
        assert!(runs(&[false; 3], 2).is_empty());
    }
}
