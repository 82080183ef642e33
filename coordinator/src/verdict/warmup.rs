//! When a life's warm-up ends. A job's first steps (allocator growth,
//! autotuning, the data loader's workers starting, NCCL's lazy
//! connections) are no baseline and open no verdict; a fixed count of them
//! was the only rule, and 20 of a 60-step job kept a straggler that began
//! at step 6 unnamed until step 20 (random 4421-20, 44% of the job) and
//! one from step 7 to 25 never named at all (4421-29, 15%).
//!
//! In: each sealed iteration's step. Out: whether it is warm. The warm-up
//! ends once `warmup_settle` steps in a row lie within `warmup_tolerance`
//! of their median (the job's pace has settled, whatever it is: a straggler
//! from the first step settles too, and is a straggler against its peers),
//! and at `warmup_iterations` at the latest. Pure: no clock, no IO.

use std::collections::VecDeque;

use super::LifecycleConfig;

#[derive(Debug, Clone)]
pub struct WarmUp {
    /// This life's first iteration (a resumed coordinator's, or 0).
    first: u64,
    /// `first + warmup_iterations`: warm from here whatever the steps do.
    latest: u64,
    settle: usize,
    tolerance: f64,
    recent: VecDeque<f64>,
    /// The first warm iteration, once known.
    warm_from: Option<u64>,
}

impl WarmUp {
    pub fn new(first: u64, cfg: &LifecycleConfig) -> Self {
        Self {
            first,
            latest: first.saturating_add(cfg.warmup_iterations),
            settle: cfg.warmup_settle,
            tolerance: cfg.warmup_tolerance,
            recent: VecDeque::new(),
            warm_from: None,
        }
    }

    /// Iteration `k` was sealed with step `step_ns` (if it has one):
    /// is it warm? Iterations come in order; once warm, a life stays warm.
    pub fn observe(&mut self, k: u64, step_ns: Option<f64>) -> bool {
        if let Some(w) = self.warm_from {
            return k >= w;
        }
        if k < self.first {
            return false;
        }
        if let Some(d) = step_ns.filter(|d| d.is_finite() && *d > 0.0) {
            self.recent.push_back(d);
            while self.recent.len() > self.settle {
                self.recent.pop_front();
            }
        }
        if k >= self.latest || self.settled() {
            self.warm_from = Some(k);
            return true;
        }
        false
    }

    fn settled(&self) -> bool {
        if self.settle == 0 || self.recent.len() < self.settle {
            return false;
        }
        let mut v: Vec<f64> = self.recent.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        v.iter()
            .all(|d| (d - median).abs() <= self.tolerance * median)
    }

    /// Whether the warm-up has ended.
    pub fn is_warm(&self) -> bool {
        self.warm_from.is_some()
    }

    /// This life's first iteration.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The first warm iteration, or the latest it can be while the steps
    /// have not settled yet.
    pub fn warm_from(&self) -> u64 {
        self.warm_from.unwrap_or(self.latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LifecycleConfig {
        LifecycleConfig::default()
    }

    fn run(w: &mut WarmUp, steps: &[f64]) -> Option<u64> {
        for (k, s) in steps.iter().enumerate() {
            if w.observe(k as u64, Some(*s)) {
                return Some(k as u64);
            }
        }
        None
    }

    #[test]
    fn a_job_whose_first_steps_are_slow_warms_once_they_settle() {
        // Autotuning and lazy connections: 5×, 2×, 1.3×, then its pace.
        let mut w = WarmUp::new(0, &cfg());
        let at = run(&mut w, &[500.0, 200.0, 130.0, 101.0, 99.0, 100.0, 100.0]);
        assert_eq!(at, Some(5));
        assert_eq!(w.warm_from(), 5);
    }

    #[test]
    fn a_steady_job_warms_after_the_settling_steps() {
        let c = cfg();
        let mut w = WarmUp::new(0, &c);
        let at = run(&mut w, &[100.0; 30]);
        assert_eq!(at, Some(c.warmup_settle as u64 - 1));
    }

    #[test]
    fn steps_that_never_settle_warm_at_the_configured_count() {
        // An intermittent fault from the first step: 1×, 1.5× in turns.
        let c = cfg();
        let mut w = WarmUp::new(0, &c);
        let steps: Vec<f64> = (0..40)
            .map(|k| if k % 2 == 0 { 100.0 } else { 150.0 })
            .collect();
        assert_eq!(run(&mut w, &steps), Some(c.warmup_iterations));
    }

    #[test]
    fn a_resumed_life_warms_from_its_own_first_iteration() {
        let c = cfg();
        let mut w = WarmUp::new(1000, &c);
        assert!(!w.observe(999, Some(100.0)));
        assert_eq!(w.warm_from(), 1000 + c.warmup_iterations);
        let mut at = None;
        for k in 1000..1100 {
            if w.observe(k, Some(100.0)) {
                at = Some(k);
                break;
            }
        }
        assert_eq!(at, Some(1000 + c.warmup_settle as u64 - 1));
        assert!(w.observe(1050, None), "once warm, a life stays warm");
    }

    #[test]
    fn iterations_without_a_step_do_not_settle_it() {
        let mut w = WarmUp::new(0, &cfg());
        for k in 0..10 {
            assert!(!w.observe(k, None));
        }
    }

    #[test]
    fn no_warm_up_is_warm_at_once() {
        let c = LifecycleConfig {
            warmup_iterations: 0,
            ..cfg()
        };
        assert!(WarmUp::new(0, &c).observe(0, None));
    }
}
