//! Iteration counting from the collective stream.
//!
//! The *reference communicator* is the largest communicator carrying
//! collectives (ties: the lowest id) — the world or a data-parallel group.
//! The period is not decided on a smaller one while a larger communicator
//! is seen issuing collectives whose joins have not come in yet (in a 3-D
//! job the tensor-parallel pairs, inside one host, join long before the
//! data-parallel groups that span hosts).
//! Its instances repeat with a fixed period per training step (e.g. one
//! all-reduce per gradient bucket). The period `P` is found from the gaps
//! between consecutive instances: a step boundary is a long gap (optimizer,
//! synchronize, data loading, forward) that recurs every `P` instances, so
//! `P` is the smallest lag whose per-phase grouping explains the gaps best
//! (adjusted R², which does not reward overfitting noise). The phase `o` is
//! the residue with the longest mean gap before it: instance `o` starts a step.
//!
//! Iteration of reference instance `seq` = `(seq - o) / P` (0 for the few
//! instances before `o`). Iteration `k` *ends* at the completion of its last
//! reference instance; any other instance (another communicator, a p2p
//! transfer, a counter interval) belongs to the first iteration whose end is
//! not before its time. Iteration `k` is *sealed* (its statistics final) once
//! the reference communicator has finished iteration `k + lag`.

use std::collections::{BTreeMap, VecDeque};

use crate::clock::CoordNs;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IterationConfig {
    /// Reference instances collected before the period is decided.
    pub detect_instances: usize,
    /// Fixed instances per iteration on the reference communicator, if known.
    pub override_period: Option<u64>,
    /// Iterations of slack before one is sealed.
    pub seal_lag: u64,
    /// Iteration ends remembered.
    pub history: usize,
    /// Gaps between reference instances that show no pattern are one
    /// instance per step when the median change from one gap to the next
    /// is under this share of the median gap. The even-spacing rule
    /// (standard deviation under a tenth of the mean) reads the whole run
    /// at once, so a step whose length changed within it (a straggler's
    /// onset, work imbalance) fails it; from one step to the next only the
    /// onset itself jumps.
    pub even_jump: f64,
}

impl Default for IterationConfig {
    fn default() -> Self {
        Self {
            detect_instances: 48,
            override_period: None,
            seal_lag: 2,
            history: 4096,
            even_jump: 0.15,
        }
    }
}

/// The decided period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Period {
    pub comm_id: u64,
    pub comm_nranks: u32,
    pub instances_per_iteration: u64,
    pub phase: u64,
    /// How it was told (absent in journals written before it was kept).
    #[serde(default)]
    pub method: Method,
}

/// How the step was told (`job.step_inferred_by` in `report.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The host's wait for the GPU (stream/device synchronize) that ends
    /// every step lands before the same instance of every step.
    SyncMarker,
    /// The burst of kernel launches of the forward pass lands before the
    /// same instance of every step.
    LaunchBurst,
    /// The (operation, bytes) sequence repeats with this period.
    OpBytesPattern,
    /// The gaps between instances repeat with this period (a long gap for
    /// optimizer + data loading + forward).
    GapPattern,
    /// Instances are evenly spaced: one per step.
    EvenSpacing,
    /// Given on the command line.
    Override,
    /// Nothing repeats clearly enough: each instance is counted as a step,
    /// and the report says the step could not be told.
    #[default]
    Undetermined,
}

/// What a reference instance's members did before it, for telling where
/// steps begin (medians over its members).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Marks {
    pub op: u8,
    pub bytes: u64,
    /// CUDA launches since the member's previous collective.
    pub launches: u32,
    /// Host time blocked in GPU syncs since the member's previous collective.
    pub sync_wait_ns: u64,
}

/// seq → (start, end, marks) of one communicator's completed instances.
type Instances = BTreeMap<u64, (CoordNs, CoordNs, Marks)>;

/// A communicator issuing at least this many collectives is a candidate
/// worth waiting for; fewer (a start-up barrier or broadcast) is not.
const REPEATING: u64 = 8;

/// Candidate instances kept per communicator before the period is decided,
/// as a multiple of `detect_instances`; past it the best candidate so far
/// is taken even if a larger communicator never completes a join.
const PATIENCE: usize = 8;

#[derive(Debug)]
pub struct IterationClock {
    cfg: IterationConfig,
    /// comm → (members, seq → (start, end)) of completed instances, before
    /// the period is known; only communicators at least as large as the
    /// largest repeating one are kept.
    pending: BTreeMap<u64, (u32, Instances)>,
    period: Option<Period>,
    /// (iteration, end time), increasing iteration.
    ends: VecDeque<(u64, CoordNs)>,
    /// Members of the largest communicator seen issuing at least
    /// [`REPEATING`] collectives (joined or not).
    largest_repeating: u32,
}

impl IterationClock {
    pub fn new(cfg: IterationConfig) -> Self {
        Self {
            cfg,
            pending: BTreeMap::new(),
            period: None,
            ends: VecDeque::new(),
            largest_repeating: 0,
        }
    }

    pub fn period(&self) -> Option<Period> {
        self.period
    }

    /// Starts from the period an earlier coordinator life decided
    /// ([`crate::resume`]): one that joins a job mid-run sees sequence holes
    /// (instances whose halves went to the dead life) and would fall back
    /// to one instance per iteration.
    pub fn restore_period(&mut self, p: Period) {
        if self.period.is_none() {
            self.period = Some(p);
            self.pending.clear();
        }
    }

    /// A member issued collective `seq` on a communicator of `nranks`
    /// (joined or not yet): a larger communicator that repeats holds the
    /// decision back until its own instances come in.
    pub fn note_issued(&mut self, _comm_id: u64, nranks: u32, seq: u64) {
        if self.period.is_none() && seq + 1 >= REPEATING {
            self.largest_repeating = self.largest_repeating.max(nranks);
            let floor = self.largest_repeating;
            self.pending.retain(|_, (n, _)| *n >= floor);
        }
    }

    /// Feeds one completed collective instance (not p2p).
    pub fn observe(
        &mut self,
        comm_id: u64,
        nranks: u32,
        seq: u64,
        start: CoordNs,
        end: CoordNs,
        marks: Marks,
    ) {
        if let Some(p) = self.period {
            if p.comm_id == comm_id {
                let k = self.iteration_of_seq(seq).expect("period known");
                self.record_end(k, end);
            }
            return;
        }
        if seq + 1 >= REPEATING {
            self.note_issued(comm_id, nranks, seq);
        }
        if nranks < self.largest_repeating {
            return;
        }
        let cap = PATIENCE * self.cfg.detect_instances.max(1);
        let (_, q) = self
            .pending
            .entry(comm_id)
            .or_insert_with(|| (nranks, BTreeMap::new()));
        q.insert(seq, (start, end, marks));
        while q.len() > cap {
            q.pop_first();
        }
        self.try_lock();
    }

    /// The reference: the largest communicator (lowest id on ties) with
    /// enough instances, once no larger repeating one is still to come.
    fn try_lock(&mut self) {
        let need = if self.cfg.override_period.is_some() {
            1
        } else {
            self.cfg.detect_instances
        };
        let Some((&comm_id, &(nranks, _))) = self
            .pending
            .iter()
            .filter(|(_, (_, q))| q.len() >= need)
            .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))
        else {
            return;
        };
        let patience_over = self
            .pending
            .values()
            .any(|(_, q)| q.len() >= PATIENCE * self.cfg.detect_instances.max(1));
        if nranks < self.largest_repeating && !patience_over {
            return;
        }
        let cap = PATIENCE * self.cfg.detect_instances.max(1);
        let q = &self.pending[&comm_id].1;
        // Longest run of consecutive sequence numbers from the lowest one.
        let mut run: Vec<(u64, CoordNs, CoordNs, Marks)> = Vec::new();
        for (&s, &(a, b, m)) in q {
            if let Some(&(last, _, _, _)) = run.last() {
                if s != last + 1 {
                    break;
                }
            }
            run.push((s, a, b, m));
        }
        let (p, o, method) = match self.cfg.override_period {
            Some(p) => (p.max(1), 0, Method::Override),
            None => {
                if run.len() < self.cfg.detect_instances.min(q.len()).max(8) {
                    if q.len() > 4 * self.cfg.detect_instances {
                        // Sequence holes everywhere: give up on structure.
                        (1, 0, Method::Undetermined)
                    } else {
                        return;
                    }
                } else {
                    let found = detect_by_marks(&run)
                        .unwrap_or_else(|| detect_period(&run, self.cfg.even_jump));
                    // A step longer than a third of what was collected
                    // cannot show yet (a tensor-parallel group carries a
                    // collective per layer and micro-batch: 24 a step in
                    // a tp2×pp2×dp2 job with 3 layers and 4 micro-batches):
                    // collect more before calling it undetermined.
                    if found.2 == Method::Undetermined && q.len() < cap {
                        return;
                    }
                    found
                }
            }
        };
        tracing::info!(
            instances_per_step = p,
            phase = o,
            method = ?method,
            "step inferred on the reference communicator"
        );
        self.period = Some(Period {
            comm_id,
            comm_nranks: nranks,
            instances_per_iteration: p,
            phase: o,
            method,
        });
        let pending = std::mem::take(&mut self.pending);
        for (s, (_, end, _)) in pending
            .into_iter()
            .filter(|(c, _)| *c == comm_id)
            .flat_map(|(_, (_, q))| q)
        {
            let k = self.iteration_of_seq(s).expect("period known");
            self.record_end(k, end);
        }
    }

    fn record_end(&mut self, k: u64, end: CoordNs) {
        match self.ends.binary_search_by_key(&k, |e| e.0) {
            Ok(i) => self.ends[i].1 = self.ends[i].1.max(end),
            Err(i) => self.ends.insert(i, (k, end)),
        }
        while self.ends.len() > self.cfg.history {
            self.ends.pop_front();
        }
    }

    /// Iteration of a reference-communicator instance.
    pub fn iteration_of_seq(&self, seq: u64) -> Option<u64> {
        let p = self.period?;
        Some(if seq < p.phase {
            0
        } else {
            (seq - p.phase) / p.instances_per_iteration
        })
    }

    /// Median step duration over the last few known iterations (ns).
    pub fn step_ns(&self) -> Option<f64> {
        let n = self.ends.len();
        if n < 2 {
            return None;
        }
        let mut d: Vec<f64> = self
            .ends
            .iter()
            .skip(n.saturating_sub(9))
            .zip(self.ends.iter().skip(n.saturating_sub(9) + 1))
            .filter(|(a, b)| b.0 == a.0 + 1)
            .map(|(a, b)| b.1.saturating_sub(a.1) as f64)
            .collect();
        crate::clock::median(&mut d)
    }

    /// Duration of iteration `k` (ns), if both its end and the previous are known.
    pub fn duration_of(&self, k: u64) -> Option<f64> {
        let end = self.end_of(k)?;
        let prev = self.end_of(k.checked_sub(1)?)?;
        Some(end.saturating_sub(prev) as f64)
    }

    pub fn end_of(&self, k: u64) -> Option<CoordNs> {
        self.ends
            .binary_search_by_key(&k, |e| e.0)
            .ok()
            .map(|i| self.ends[i].1)
    }

    /// Iteration a coordinator time belongs to.
    pub fn iteration_at(&self, t: CoordNs) -> Option<u64> {
        self.period?;
        let (first_k, _) = *self.ends.front()?;
        let (last_k, last_end) = *self.ends.back()?;
        let i = self.ends.partition_point(|e| e.1 < t);
        if i < self.ends.len() {
            return Some(if i == 0 { first_k } else { self.ends[i].0 });
        }
        let step = self.step_ns().unwrap_or(f64::INFINITY);
        let extra = if step.is_finite() && step > 0.0 {
            (t.saturating_sub(last_end) as f64 / step).floor() as u64
        } else {
            0
        };
        Some(last_k + 1 + extra)
    }

    /// Highest iteration whose statistics are final.
    pub fn sealed_through(&self) -> Option<u64> {
        let (last_k, _) = *self.ends.back()?;
        last_k.checked_sub(self.cfg.seal_lag)
    }
}

/// Share of positions where a marker must equal the marker one period
/// later for the period to count: a step that is sometimes odd (a
/// checkpoint, an evaluation pass, a descheduled host that syncs late) must
/// not hide the pattern, a coincidence must not make one.
const MARK_AGREEMENT: f64 = 0.9;

/// Returns `(period, phase, method)` from what every step repeats before
/// the same instance — the sync that ends a step, the forward pass's launch
/// burst, the (op, bytes) sequence — or `None` when no marker varies.
/// Markers are tried in that order; a marker that repeats with a period that
/// another, stronger marker's period is a multiple of defers to it (a
/// two-bucket op/bytes alternation inside a four-bucket step).
fn detect_by_marks(run: &[(u64, CoordNs, CoordNs, Marks)]) -> Option<(u64, u64, Method)> {
    let n = run.len();
    if n < 8 {
        return None;
    }
    // A step-ending sync: far longer than a bucket's incidental syncs.
    let max_sync = run.iter().map(|r| r.3.sync_wait_ns).max().unwrap_or(0);
    let sync: Vec<u64> = run
        .iter()
        .map(|r| u64::from(max_sync > 0 && r.3.sync_wait_ns * 4 >= max_sync))
        .collect();
    // A step-ending sync before (nearly) every instance: one instance per
    // step, whatever pattern the gaps show. An intermittent straggler
    // (slow 3 steps in 4) gives the gaps of a 1-per-step data-parallel
    // all-reduce a period of 4, which a random dp16 spec's step was read as
    // (2.47 s against the job's 0.74 s).
    let synced = sync.iter().filter(|x| **x == 1).count();
    if synced * 10 >= n * 9 {
        return Some((1, 0, Method::SyncMarker));
    }
    let mut launches: Vec<u32> = run.iter().map(|r| r.3.launches).collect();
    launches.sort_unstable();
    let med_launch = launches[n / 2];
    let burst: Vec<u64> = run
        .iter()
        .map(|r| u64::from(r.3.launches > 0 && r.3.launches as f64 >= 1.5 * med_launch as f64))
        .collect();
    let opb: Vec<u64> = run
        .iter()
        .map(|r| (u64::from(r.3.op) << 56) ^ r.3.bytes)
        .collect();
    let found: Vec<(u64, Option<u64>, Method)> = [
        (&sync, Method::SyncMarker, true),
        (&burst, Method::LaunchBurst, true),
        (&opb, Method::OpBytesPattern, false),
    ]
    .into_iter()
    .filter_map(|(f, method, phased)| {
        let p = marker_period(f)?;
        // The instance after the marker's "on" residue starts a step.
        let phase = phased
            .then(|| {
                (0..p).max_by_key(|r| {
                    run.iter()
                        .zip(f.iter())
                        .filter(|(x, on)| x.0 % p == *r && **on == 1)
                        .count()
                })
            })
            .flatten();
        Some((p, phase, method))
    })
    .collect();
    // The longest period; among equals, the first marker (the strongest).
    let best = found.iter().rev().max_by_key(|(p, _, _)| *p).copied()?;
    // Every marker that found a period must agree with the longest one.
    if found.iter().any(|(p, _, _)| best.0 % p != 0) {
        return None;
    }
    let phase = best
        .1
        .or_else(|| {
            found
                .iter()
                .find_map(|(q, o, _)| (*q == best.0).then_some(*o).flatten())
        })
        .unwrap_or_else(|| gap_phase(run, best.0));
    Some((best.0, phase % best.0, best.2))
}

/// The residue after the longest mean gap starts a step.
fn gap_phase(run: &[(u64, CoordNs, CoordNs, Marks)], p: u64) -> u64 {
    let mut sum = vec![0.0; p as usize];
    let mut cnt = vec![0usize; p as usize];
    for w in run.windows(2) {
        let g = w[1].1.saturating_sub(w[0].1) as f64;
        sum[(w[1].0 % p) as usize] += g;
        cnt[(w[1].0 % p) as usize] += 1;
    }
    (0..p as usize)
        .max_by(|a, b| {
            let ma = sum[*a] / cnt[*a].max(1) as f64;
            let mb = sum[*b] / cnt[*b].max(1) as f64;
            ma.total_cmp(&mb)
        })
        .unwrap_or(0) as u64
}

/// The smallest period `p ≥ 2` with which `f` repeats, or `None` for a
/// constant or aperiodic marker.
///
/// The marker is compared with its own template: the most common value at
/// each position of the period. The period counts when the template is not
/// constant (the marker varies *within* a step), at least
/// [`MARK_AGREEMENT`] of all positions match it, and so do at least that
/// share of the positions where the marker or the template is not the
/// marker's usual value. The last rule keeps a rare or windowed marker from
/// matching every period: launches are counted only in short sampled
/// windows (issue 23), so "a burst before this instance" is a block of ons
/// amid offs, which agrees with itself two instances later almost
/// everywhere and yet says nothing about where steps begin.
fn marker_period(f: &[u64]) -> Option<u64> {
    let n = f.len();
    if f.iter().all(|x| *x == f[0]) {
        return None;
    }
    let usual = most_common(f.iter().copied())?;
    (2..=n / 3).find_map(|p| {
        let template: Vec<u64> = (0..p)
            .map(|r| most_common(f.iter().skip(r).step_by(p).copied()).expect("p ≤ n/3"))
            .collect();
        if template.iter().all(|t| *t == template[0]) {
            return None;
        }
        let mut same = 0usize;
        let (mut telling, mut telling_same) = (0usize, 0usize);
        for (i, v) in f.iter().enumerate() {
            let t = template[i % p];
            let hit = *v == t;
            same += usize::from(hit);
            if *v != usual || t != usual {
                telling += 1;
                telling_same += usize::from(hit);
            }
        }
        let agrees = |k: usize, of: usize| k as f64 >= MARK_AGREEMENT * of as f64;
        (agrees(same, n) && agrees(telling_same, telling)).then_some(p as u64)
    })
}

/// The most common value (the smallest on ties, so the answer does not
/// depend on order).
fn most_common(values: impl Iterator<Item = u64>) -> Option<u64> {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(v, _)| v)
}

/// Consecutive gaps alike: the median change from one gap to the next
/// under `even_jump` of the median gap ([`IterationConfig::even_jump`]),
/// and no gap more than [`STEP_CHANGE`] times longer or shorter than the
/// median. The last keeps a per-layer communicator from passing for one
/// instance per step before three of its steps show: its gaps inside a
/// step are alike too, but the gap between steps (optimizer, data
/// loading) is many of them.
fn alike(gaps: &[(u64, f64)], even_jump: f64) -> bool {
    if gaps.len() < 8 {
        return false;
    }
    let mut g: Vec<f64> = gaps.iter().map(|x| x.1).collect();
    let mut jumps: Vec<f64> = g.windows(2).map(|w| (w[1] - w[0]).abs()).collect();
    let median = crate::robust::midpoint_median(&mut g);
    let jump = crate::robust::midpoint_median(&mut jumps);
    let (shortest, longest) = (g[0], g[g.len() - 1]);
    median > 0.0
        && jump < even_jump * median
        && longest < STEP_CHANGE * median
        && median < STEP_CHANGE * shortest
}

/// The largest change of step length [`alike`] takes for a straggler's
/// onset rather than a step boundary (the random specs' slowest ranks are
/// up to 3× slower).
const STEP_CHANGE: f64 = 4.0;

/// Returns `(period, phase, method)` from the gaps between instances.
fn detect_period(run: &[(u64, CoordNs, CoordNs, Marks)], even_jump: f64) -> (u64, u64, Method) {
    let gaps: Vec<(u64, f64)> = run
        .windows(2)
        .map(|w| (w[1].0, w[1].1.saturating_sub(w[0].1) as f64))
        .collect();
    let n = gaps.len();
    if n < 4 {
        return (1, 0, Method::Undetermined);
    }
    let mean = gaps.iter().map(|g| g.1).sum::<f64>() / n as f64;
    let total: f64 = gaps.iter().map(|g| (g.1 - mean).powi(2)).sum();
    // Even gaps: one instance per step.
    if total <= 0.0 || (total / n as f64).sqrt() < 0.1 * mean.abs() {
        return (1, 0, Method::EvenSpacing);
    }
    let mut best: Vec<(u64, f64)> = Vec::new();
    for p in 2..=(n / 3) as u64 {
        let mut sum = vec![0.0; p as usize];
        let mut cnt = vec![0usize; p as usize];
        for (s, g) in &gaps {
            let r = (s % p) as usize;
            sum[r] += g;
            cnt[r] += 1;
        }
        let within: f64 = gaps
            .iter()
            .map(|(s, g)| {
                let r = (s % p) as usize;
                (g - sum[r] / cnt[r] as f64).powi(2)
            })
            .sum();
        let dof = n as f64 - p as f64;
        if dof <= 0.0 {
            continue;
        }
        let adj = 1.0 - (within / dof) / (total / (n as f64 - 1.0));
        best.push((p, adj));
    }
    let top = best.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
    if top < 0.5 {
        // No pattern, but each gap like the one before: one instance per
        // step whose length changed within the run (a straggler's onset,
        // work imbalance), which inflates the spread the even-spacing rule
        // above reads. Seen live on random pp×dp specs whose data-parallel
        // all-reduce came once per step: the step was never told, and the
        // report said "0 iterations observed" for a 60-step job.
        if alike(&gaps, even_jump) {
            return (1, 0, Method::EvenSpacing);
        }
        return (1, 0, Method::Undetermined);
    }
    let p = best.iter().find(|b| b.1 >= top - 0.05).map_or(1, |b| b.0);
    let o = gap_phase(run, p);
    (p, o, Method::GapPattern)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slowrank_synth::Rng;

    fn feed(clock: &mut IterationClock, per_step: u64, steps: u64, jitter: f64, seed: u64) {
        let mut rng = Rng::new(seed);
        let mut t = 1_000_000i64;
        let mut seq = 0;
        for _ in 0..steps {
            t += (20_000_000.0 * (1.0 + jitter * rng.sym())) as i64;
            for b in 0..per_step {
                if b > 0 {
                    t += (1_500_000.0 * (1.0 + jitter * rng.sym())) as i64;
                }
                clock.observe(1, 8, seq, t, t + 500_000, Marks::default());
                seq += 1;
            }
        }
    }

    #[test]
    fn finds_four_buckets_per_step() {
        let mut c = IterationClock::new(IterationConfig::default());
        feed(&mut c, 4, 40, 0.05, 1);
        let p = c.period().unwrap();
        assert_eq!((p.instances_per_iteration, p.phase), (4, 0));
        assert_eq!(c.iteration_of_seq(11), Some(2));
        assert_eq!(c.sealed_through(), Some(37));
        let s = c.step_ns().unwrap();
        assert!((s - 24_500_000.0).abs() < 2_000_000.0, "{s}");
    }

    #[test]
    fn one_per_step_under_noise_is_period_one() {
        let mut c = IterationClock::new(IterationConfig::default());
        feed(&mut c, 1, 60, 0.05, 2);
        assert_eq!(c.period().unwrap().instances_per_iteration, 1);
    }

    #[test]
    fn one_per_step_whose_length_changed_is_period_one() {
        // 36 steps of 20 ms, then a slowdown: steps of 26 ms ± 15 %. The
        // gaps' spread is over a tenth of their mean, and no pattern.
        let mut c = IterationClock::new(IterationConfig::default());
        let mut rng = Rng::new(11);
        let mut t = 0i64;
        for seq in 0..50u64 {
            let (ms, jitter) = if seq < 36 { (20.0, 0.05) } else { (26.0, 0.15) };
            t += (ms * 1e6 * (1.0 + jitter * rng.sym())) as i64;
            c.observe(1, 4, seq, t, t + 500_000, Marks::default());
        }
        let p = c.period().expect("told after 48 instances");
        assert_eq!(
            (p.instances_per_iteration, p.method),
            (1, Method::EvenSpacing)
        );
    }

    #[test]
    fn a_per_layer_communicator_is_not_one_per_step_before_its_steps_show() {
        // 24 alike instances a step (one per layer and micro-batch), then
        // the optimizer and data loading: after 50 instances (two steps)
        // the step cannot show yet, and must not be read as one instance.
        let mut c = IterationClock::new(IterationConfig::default());
        let mut rng = Rng::new(13);
        let mut t = 0i64;
        for seq in 0..50u64 {
            t += if seq % 24 == 0 {
                30_000_000
            } else {
                (300_000.0 * (1.0 + 0.05 * rng.sym())) as i64
            };
            c.observe(1, 8, seq, t, t + 100_000, Marks::default());
        }
        assert_eq!(c.period(), None);
    }

    #[test]
    fn a_sync_before_every_instance_is_one_per_step_whatever_the_gaps() {
        // One all-reduce a step, a straggler slow three steps in four: the
        // gaps repeat every 4 instances, the step-ending sync every one.
        let mut c = IterationClock::new(IterationConfig::default());
        let mut t = 0i64;
        for seq in 0..60u64 {
            let slow = seq % 4 != 0;
            t += if slow { 56_000_000 } else { 20_000_000 };
            let marks = Marks {
                sync_wait_ns: if slow { 30_000_000 } else { 12_000_000 },
                ..Marks::default()
            };
            c.observe(1, 16, seq, t, t + 500_000, marks);
        }
        let p = c.period().expect("told");
        assert_eq!(
            (p.instances_per_iteration, p.method),
            (1, Method::SyncMarker)
        );
    }

    #[test]
    fn one_per_step_that_became_three_times_longer_is_period_one() {
        // A 2.8x straggler from step 22: the gaps are two groups, and the
        // middle half of them spans both.
        let mut c = IterationClock::new(IterationConfig::default());
        let mut rng = Rng::new(12);
        let mut t = 0i64;
        for seq in 0..50u64 {
            let ms = if seq < 22 { 20.0 } else { 56.0 };
            t += (ms * 1e6 * (1.0 + 0.05 * rng.sym())) as i64;
            c.observe(1, 8, seq, t, t + 500_000, Marks::default());
        }
        let p = c.period().expect("told after 48 instances");
        assert_eq!(
            (p.instances_per_iteration, p.method),
            (1, Method::EvenSpacing)
        );
    }

    #[test]
    fn time_maps_to_the_iteration_it_ends_in() {
        let mut c = IterationClock::new(IterationConfig::default());
        feed(&mut c, 4, 40, 0.0, 3);
        let end5 = c.end_of(5).unwrap();
        assert_eq!(c.iteration_at(end5 - 1_000), Some(5));
        assert_eq!(c.iteration_at(end5 + 1_000), Some(6));
    }

    /// 3-D job: the 2-member tensor-parallel comm completes 16 instances per
    /// step long before the 4-member data-parallel comm's first joins arrive;
    /// the clock must wait and lock on the larger one.
    #[test]
    fn waits_for_a_larger_communicator_already_issuing() {
        let mut c = IterationClock::new(IterationConfig::default());
        // A start-up barrier on the world: not a candidate to wait for.
        c.observe(0x1, 16, 0, 0, 1_000, Marks::default());
        c.observe(0x1, 16, 1, 2_000, 3_000, Marks::default());
        c.note_issued(0xd, 4, 9);
        let step = 150_000_000i64;
        for s in 0..64u64 {
            let t = (s / 16) as i64 * step + (s % 16) as i64 * 5_000_000;
            c.observe(0x7, 2, s, t, t + 1_000_000, Marks::default());
        }
        assert!(c.period().is_none(), "locked on the tensor-parallel comm");
        for k in 0..16u64 {
            for b in 0..4u64 {
                let t = k as i64 * step + 100_000_000 + b as i64 * 8_000_000;
                c.observe(0xd, 4, k * 4 + b, t, t + 2_000_000, Marks::default());
            }
        }
        let p = c.period().expect("locked");
        assert_eq!((p.comm_id, p.instances_per_iteration), (0xd, 4));
    }

    /// Buckets evenly spaced in time (the gaps alone say "one per step"),
    /// but the step-ending sync lands before every fifth: five per step,
    /// starting after the sync.
    #[test]
    fn the_step_ending_sync_tells_the_step_when_gaps_cannot() {
        let mut c = IterationClock::new(IterationConfig::default());
        let mut rng = Rng::new(4);
        for seq in 0..80u64 {
            let t = seq as i64 * 10_000_000 + (2e6 * rng.sym()) as i64;
            let first = seq % 5 == 2;
            let marks = Marks {
                op: 0,
                bytes: 1 << 20,
                launches: if first { 60 } else { 20 },
                sync_wait_ns: if first { 30_000_000 } else { 40_000 },
            };
            c.observe(1, 8, seq, t, t + 1_000_000, marks);
        }
        let p = c.period().unwrap();
        assert_eq!(
            (p.instances_per_iteration, p.phase, p.method),
            (5, 2, Method::SyncMarker)
        );
    }

    /// Without syncs or launch counts (probes off), a repeating byte
    /// pattern still tells the step; the phase comes from the gaps.
    #[test]
    fn a_bytes_pattern_tells_the_step_without_syncs() {
        let mut c = IterationClock::new(IterationConfig::default());
        let sizes = [25u64 << 20, 25 << 20, 25 << 20, 7 << 20];
        let mut t = 0i64;
        for seq in 0..80u64 {
            t += if seq % 4 == 0 { 20_000_000 } else { 1_500_000 };
            let marks = Marks {
                bytes: sizes[(seq % 4) as usize],
                ..Marks::default()
            };
            c.observe(1, 8, seq, t, t + 500_000, marks);
        }
        let p = c.period().unwrap();
        assert_eq!(p.instances_per_iteration, 4);
        assert_eq!(p.method, Method::OpBytesPattern);
    }

    /// Noise everywhere and no marker: not a guess dressed as a step.
    #[test]
    fn nothing_repeating_is_undetermined() {
        let mut c = IterationClock::new(IterationConfig::default());
        let mut rng = Rng::new(5);
        let mut t = 0i64;
        for seq in 0..80u64 {
            t += (10_000_000.0 * (1.0 + 0.9 * rng.sym())) as i64;
            c.observe(1, 8, seq, t, t + 500_000, Marks::default());
        }
        // Not given up on while a longer step could still show...
        assert!(c.period().is_none());
        for seq in 80..400u64 {
            t += (10_000_000.0 * (1.0 + 0.9 * rng.sym())) as i64;
            c.observe(1, 8, seq, t, t + 500_000, Marks::default());
        }
        // ... but said once the patience is spent.
        let p = c.period().unwrap();
        assert_eq!(p.instances_per_iteration, 1);
        assert_eq!(p.method, Method::Undetermined);
    }

    /// Launches counted only in one sampled window (issue 23): a block of
    /// ons amid zeros agrees with itself two instances on almost everywhere
    /// but is no step marker. Seen on a random pp2×dp8 spec: the step was
    /// read as two of its six buckets (0.9 ms against 333 ms). The gaps
    /// tell it.
    #[test]
    fn a_windowed_launch_count_is_no_step_marker() {
        let mut c = IterationClock::new(IterationConfig::default());
        let mut t = 0i64;
        for seq in 0..96u64 {
            t += if seq % 6 == 0 { 330_000_000 } else { 300_000 };
            let marks = Marks {
                bytes: 64 << 20,
                launches: if (24..42).contains(&seq) {
                    [5, 5, 4][(seq % 3) as usize]
                } else {
                    0
                },
                ..Marks::default()
            };
            c.observe(1, 8, seq, t, t + 1_000_000, marks);
        }
        let p = c.period().unwrap();
        assert_eq!(
            (p.instances_per_iteration, p.phase, p.method),
            (6, 0, Method::GapPattern)
        );
    }

    /// A rare marker that fires at random (a sync now and then) matches any
    /// period on its offs alone; it must not be taken for one.
    #[test]
    fn a_rare_random_marker_has_no_period() {
        let mut rng = Rng::new(9);
        let f: Vec<u64> = (0..96).map(|_| u64::from(rng.sym() > 0.9)).collect();
        assert!(f.contains(&1));
        assert_eq!(marker_period(&f), None);
        // ... while one that fires before every fifth instance has one.
        let g: Vec<u64> = (0..96).map(|i| u64::from(i % 5 == 2)).collect();
        assert_eq!(marker_period(&g), Some(5));
    }

    /// A tensor-parallel group with a collective per layer and micro-batch
    /// (24 a step) is the reference of a tp2×pp2×dp2 job: 48 instances are
    /// two steps, too few to see the period; the clock waits for more
    /// instead of counting each instance as a step (seen on a random spec:
    /// a 0.2 ms "step" against 473 ms).
    #[test]
    fn a_long_step_is_waited_for_not_called_undetermined() {
        let mut c = IterationClock::new(IterationConfig::default());
        let mut rng = Rng::new(11);
        let mut t = 0i64;
        for seq in 0..240u64 {
            t += if seq % 24 == 0 {
                200_000_000
            } else {
                (300_000.0 * (1.0 + 0.8 * rng.sym())) as i64
            };
            c.observe(1, 2, seq, t, t + 200_000, Marks::default());
        }
        let p = c.period().expect("locked");
        assert_eq!(
            (p.instances_per_iteration, p.phase, p.method),
            (24, 0, Method::GapPattern)
        );
    }
}
