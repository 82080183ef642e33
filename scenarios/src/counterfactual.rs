//! Counterfactual ground truth: what a fault really cost the job.
//!
//! `eval` runs a spec with its faults and again without them (same seed,
//! same layout, same mode), and for overlapping faults once more per fault
//! with only that one removed. A fault's cost is the job's median step over
//! the iterations it was active, with it against without it:
//! `fraction = (step_with − step_without) / step_with`, the share of the
//! job's current step the fault costs (what the report's `cost_fraction`
//! claims). Pure functions over plain data; the driver is [`crate::eval`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{
    spec::{FaultKind, Spec},
    steps::StepLog,
    truth::FaultTruth,
};

/// Iterations at the start of a run left out of a healthy run's
/// measurement: communicator setup, first-touch allocation and the probes
/// attaching make the first steps of every run slow, and they are not a
/// fault's cost.
pub const WARMUP_ITERATIONS: u64 = 5;

/// Quantile of the healthy pairs' relative differences taken as the
/// harness's noise floor: 9 of 10 pairs of identical runs differ by less,
/// so a cost above twice it is very unlikely to be the harness's own noise.
pub const FLOOR_QUANTILE: f64 = 0.9;

/// A cost below this many noise floors is below the harness's
/// resolution: neither right nor wrong when scored (issue 20).
pub const RESOLUTION_FLOORS: f64 = 2.0;

/// One counterfactual run to make: the spec without the faults `removed`
/// (indices in the spec's `[[fault]]` list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// Directory suffix: `without-all` or `without-<i>`.
    pub name: String,
    pub removed: Vec<usize>,
}

/// What one fault cost the job (written into `truth.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultCost {
    /// Iterations measured: those the fault was active in the faulted run.
    pub iterations: u64,
    /// Job's median step (ms) over those iterations, with every fault.
    pub step_with_ms: f64,
    /// The same iterations of the run without this fault (alone removed
    /// when faults overlap, else without any fault).
    pub step_without_ms: f64,
    /// `step_with_ms − step_without_ms`.
    pub difference_ms: f64,
    /// `difference_ms / step_with_ms`: the share of the step it costs.
    pub fraction: f64,
    /// Overlapping faults only: the same iterations with every fault removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_all_removed_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction_all_removed: Option<f64>,
    /// Twice the harness's noise floor of the evaluation this run was part
    /// of (a fraction of the step); set by `eval` once the floor is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<f64>,
}

impl FaultCost {
    /// Below the harness's resolution: too small to score either way. A
    /// fault whose run was *faster* than its counterfactual cost the job
    /// nothing measurable (the difference is the harness's noise, larger in
    /// that layout than the floor measured on the noise spec), so naming
    /// it or not is no more right than wrong either.
    pub fn below_resolution(&self) -> bool {
        self.resolution.is_some_and(|r| self.fraction < r)
    }
}

/// Faults whose active iterations overlap another fault's.
fn overlapping(spec: &Spec) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    let n = spec.faults.len();
    for i in 0..n {
        for j in i + 1..n {
            let both = (0..spec.iterations)
                .any(|it| spec.faults[i].active_at(it) && spec.faults[j].active_at(it));
            if both {
                out.insert(i);
                out.insert(j);
            }
        }
    }
    out
}

/// The counterfactual runs a spec needs: none when healthy; the spec
/// without any fault; and per overlapping fault, the spec without it
/// alone. Hangs are never removed alone (a hang's cost is the whole job).
pub fn plan(spec: &Spec) -> Vec<Variant> {
    if spec.faults.is_empty() {
        return Vec::new();
    }
    let mut v = vec![Variant {
        name: "without-all".into(),
        removed: (0..spec.faults.len()).collect(),
    }];
    for i in overlapping(spec) {
        if spec.faults[i].kind != FaultKind::Hang {
            v.push(Variant {
                name: format!("without-{i}"),
                removed: vec![i],
            });
        }
    }
    v
}

/// `spec` without the faults in `removed`.
pub fn without(spec: &Spec, removed: &[usize]) -> Spec {
    let mut s = spec.clone();
    s.faults = spec
        .faults
        .iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(i))
        .map(|(_, f)| f.clone())
        .collect();
    s
}

/// The iterations a fault was active in (its truth windows; an open window
/// runs to `completed`).
pub fn active_iterations(f: &FaultTruth, completed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = f
        .windows
        .iter()
        .flat_map(|w| w.onset_iteration..w.end_iteration.unwrap_or(completed).min(completed))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The job's step (ns) in `iteration`: the median over ranks of their step
/// durations (ranks of a synchronous job advance together; the median is
/// immune to one rank's scheduling hiccup).
pub fn job_step_ns(steps: &StepLog, iteration: u64) -> Option<u64> {
    let mut d: Vec<u64> = steps
        .steps
        .values()
        .filter(|s| s.iteration == iteration)
        .map(|s| s.duration_ns())
        .collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    Some(d[d.len() / 2])
}

/// The job's median step (ms) over `iterations` (those the run has).
pub fn median_step_ms(steps: &StepLog, iterations: &[u64]) -> Option<f64> {
    let mut v: Vec<u64> = iterations
        .iter()
        .filter_map(|i| job_step_ns(steps, *i))
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2] as f64 / 1e6)
}

/// Iterations a healthy run is measured over: those the spec's faults
/// would be active in (the same iterations a faulted run's cost is taken
/// over), or, without faults, everything after the warm-up.
pub fn healthy_iterations(spec: &Spec, completed: u64) -> Vec<u64> {
    let last = completed.min(spec.iterations);
    let faulted: Vec<u64> = (0..last)
        .filter(|it| spec.faults.iter().any(|f| f.active_at(*it)))
        .collect();
    if faulted.is_empty() {
        (WARMUP_ITERATIONS.min(last.saturating_sub(1))..last).collect()
    } else {
        faulted
    }
}

/// The cost of fault `f` given the faulted run's steps, the steps of the
/// run without it and, for overlapping faults, of the run without any.
pub fn cost(
    f: &FaultTruth,
    completed: u64,
    with: &StepLog,
    without_it: &StepLog,
    without_all: Option<&StepLog>,
) -> Option<FaultCost> {
    if f.kind == FaultKind::Hang {
        return None;
    }
    let its = active_iterations(f, completed);
    let w = median_step_ms(with, &its)?;
    let wo = median_step_ms(without_it, &its)?;
    let all = without_all.and_then(|s| median_step_ms(s, &its));
    Some(FaultCost {
        iterations: its.len() as u64,
        step_with_ms: w,
        step_without_ms: wo,
        difference_ms: w - wo,
        fraction: (w - wo) / w,
        step_all_removed_ms: all,
        fraction_all_removed: all.map(|a| (w - a) / w),
        resolution: None,
    })
}

/// One pair of healthy runs of the same spec and seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoisePair {
    pub spec: String,
    pub seed: u64,
    pub step_a_ms: f64,
    pub step_b_ms: f64,
    /// `|a − b| / mean(a, b)`.
    pub relative: f64,
}

impl NoisePair {
    pub fn new(spec: &str, seed: u64, a: f64, b: f64) -> Self {
        Self {
            spec: spec.into(),
            seed,
            step_a_ms: a,
            step_b_ms: b,
            relative: (a - b).abs() / ((a + b) / 2.0).max(f64::MIN_POSITIVE),
        }
    }
}

/// The harness's noise floor over healthy pairs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NoiseFloor {
    pub pairs: Vec<NoisePair>,
    pub median: Option<f64>,
    /// The [`FLOOR_QUANTILE`] of the pairs' relative differences.
    pub floor: Option<f64>,
    /// Costs below this fraction are below the harness's resolution.
    pub resolution: Option<f64>,
}

/// Floor from pairs (nearest-rank quantiles).
pub fn noise_floor(pairs: Vec<NoisePair>) -> NoiseFloor {
    let r: Vec<f64> = pairs.iter().map(|p| p.relative).collect();
    let floor = crate::eval::quantile(&r, FLOOR_QUANTILE);
    NoiseFloor {
        median: crate::eval::quantile(&r, 0.5),
        floor,
        resolution: floor.map(|f| f * RESOLUTION_FLOORS),
        pairs,
    }
}

/// Is a measured cost below the harness's resolution? (`false` when no
/// floor was measured: nothing can be excused then.)
pub fn below_resolution(fraction: f64, floor: &NoiseFloor) -> bool {
    floor.resolution.is_some_and(|r| fraction < r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{steps::StepTime, truth::Window};

    fn spec(faults: &str) -> Spec {
        Spec::parse(&format!(
            "name = \"t\"\niterations = 40\nhosts = 2\nranks_per_host = 2\n[parallel]\ntp = 1\npp = 1\ndp = 4\n{faults}"
        ))
        .expect("spec")
    }

    /// Steps of 4 ranks: `ms(it)` per iteration, rank 3 one ms slower.
    fn log(ms: impl Fn(u64) -> u64) -> StepLog {
        let mut s = StepLog::default();
        let mut t = 0;
        for it in 0..40 {
            for r in 0..4u32 {
                let d = (ms(it) + u64::from(r == 3)) * 1_000_000;
                s.add(StepTime {
                    rank: r,
                    iteration: it,
                    start_ns: t,
                    end_ns: t + d,
                    wall_ns: t + d,
                });
            }
            t += ms(it) * 1_000_000;
        }
        s
    }

    fn fault_truth(kind: FaultKind, windows: &[(u64, Option<u64>)]) -> FaultTruth {
        let sp = spec("[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = 1\n");
        FaultTruth {
            index: 0,
            kind,
            ranks: vec![1],
            spec: sp.faults[0].clone(),
            windows: windows
                .iter()
                .map(|(o, e)| Window {
                    onset_iteration: *o,
                    end_iteration: *e,
                    ..Default::default()
                })
                .collect(),
            cost: None,
        }
    }

    #[test]
    fn plan_removes_all_and_each_overlapping_fault_alone() {
        assert!(plan(&spec("")).is_empty());
        let apart = spec(
            "[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = 5\nend_iteration = 10\n\
             [[fault]]\nkind = \"host\"\nrank = 2\nstart_iteration = 10\n",
        );
        assert_eq!(
            plan(&apart),
            vec![Variant {
                name: "without-all".into(),
                removed: vec![0, 1]
            }]
        );
        let overlap = spec(
            "[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = 5\n\
             [[fault]]\nkind = \"host\"\nrank = 2\nstart_iteration = 9\n\
             [[fault]]\nkind = \"compute\"\nrank = 0\nstart_iteration = 2\nend_iteration = 4\n",
        );
        let names: Vec<String> = plan(&overlap).into_iter().map(|v| v.name).collect();
        assert_eq!(names, vec!["without-all", "without-0", "without-1"]);
        assert_eq!(without(&overlap, &[0]).faults.len(), 2);
        assert_eq!(without(&overlap, &[0]).faults[0].kind, FaultKind::Host);
    }

    #[test]
    fn cost_is_the_median_step_difference_over_the_active_iterations() {
        // Faulted: 13 ms in 20..30 (and a slow warm-up), 10 ms elsewhere.
        let with = log(|it| match it {
            0 => 50,
            20..=29 => 13,
            _ => 10,
        });
        let without = log(|it| if it == 0 { 50 } else { 10 });
        let f = fault_truth(FaultKind::Compute, &[(20, Some(30))]);
        let c = cost(&f, 40, &with, &without, None).expect("cost");
        assert_eq!(c.iterations, 10);
        // Median over ranks of 13,13,13,14 ms → 13 ms (the upper middle).
        assert!((c.step_with_ms - 13.0).abs() < 1e-9, "{c:?}");
        assert!((c.step_without_ms - 10.0).abs() < 1e-9);
        assert!((c.fraction - 3.0 / 13.0).abs() < 1e-9);
        assert_eq!(c.step_all_removed_ms, None);
        // Intermittent: two windows; an open window runs to the end.
        let f2 = fault_truth(FaultKind::Compute, &[(20, Some(25)), (35, None)]);
        assert_eq!(
            active_iterations(&f2, 40),
            vec![20, 21, 22, 23, 24, 35, 36, 37, 38, 39]
        );
        assert!(cost(
            &fault_truth(FaultKind::Hang, &[(5, None)]),
            40,
            &with,
            &without,
            None
        )
        .is_none());
    }

    #[test]
    fn healthy_iterations_follow_the_faults_or_skip_the_warmup() {
        assert_eq!(
            healthy_iterations(&spec(""), 10),
            (5..10).collect::<Vec<_>>()
        );
        let s = spec(
            "[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = 30\nend_iteration = 33\n",
        );
        assert_eq!(healthy_iterations(&s, 40), vec![30, 31, 32]);
    }

    #[test]
    fn noise_floor_is_the_p90_of_pair_differences() {
        let pairs: Vec<NoisePair> = (0..10)
            .map(|k| NoisePair::new("s", k, 100.0, 100.0 + k as f64 * 0.2))
            .collect();
        let f = noise_floor(pairs);
        // Relative differences 0, 0.2/100.1, ... nearest-rank p90 = 9th = 1.6/100.8.
        let p90 = 1.6 / 100.8;
        assert!((f.floor.unwrap() - p90).abs() < 1e-9, "{f:?}");
        assert!((f.resolution.unwrap() - 2.0 * p90).abs() < 1e-9);
        assert!(below_resolution(0.02, &f));
        assert!(!below_resolution(0.05, &f));
        // A faulted run faster than its counterfactual: no measurable cost.
        assert!(below_resolution(-0.07, &f));
        assert!(!below_resolution(0.0, &NoiseFloor::default()));
    }
}
