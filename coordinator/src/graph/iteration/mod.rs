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
//! not before its time, or, with `stream_learn_iterations` set, by its own
//! stream's ordinal once that stream's step is learnt ([`streams`]). Iteration `k` is *sealed* (its statistics final) once
//! the reference communicator has finished iteration `k + lag`.

use std::collections::{BTreeMap, VecDeque};

use crate::clock::CoordNs;

mod detect;
pub mod streams;
use detect::{detect_by_marks, detect_period};

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
    /// Iterations of time-placed instances a stream outside the reference
    /// (a communicator's collectives, one pipeline pair's sends) is learnt
    /// from before its own ordinal places it (`graph/iteration/streams.rs`;
    /// 6 leaves four interior iterations, the first and last seen may be
    /// partial). 0, the default, keeps every such instance placed by its
    /// start time. Off because each stream learns its own cut: on the fresh
    /// random set 4421 the two pp4 × dp4 stage-imbalance specs put their
    /// stage's extra work on the neighbouring stage (a stage-2 rank's
    /// sends to stage 1 and to stage 3 cut a step apart, so its chain
    /// mixed two steps), while on set 9241 it named one more straggler
    /// (spec 11) and moved spec 8's cost from 26 % to 28 % (37.8 %
    /// measured).
    pub stream_learn_iterations: usize,
    /// Share of those instances the learnt ordinal rule must place where
    /// their start time did. A straggler moves the instances near a step
    /// boundary, not most of them.
    pub stream_agreement: f64,
    /// A learnt stream placed this many iterations from its start time for
    /// a step's worth of instances in a row has changed shape (an extra
    /// collective every N steps) and is learnt again. A straggler holds its
    /// replica back by less than a step: every step ends in an all-reduce
    /// that waits for it.
    pub stream_drift_iterations: u64,
    /// Learning instances kept per stream: one with more than this over
    /// `stream_learn_iterations` a step stays placed by time (memory at
    /// 16,384 ranks matters more than its boundary instances).
    pub stream_max_samples: usize,
}

impl Default for IterationConfig {
    fn default() -> Self {
        Self {
            detect_instances: 48,
            override_period: None,
            seal_lag: 2,
            history: 4096,
            even_jump: 0.15,
            stream_learn_iterations: 0,
            stream_agreement: 0.7,
            stream_drift_iterations: 2,
            stream_max_samples: 2048,
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
    /// Iterations whose last reference instance has been seen: their end
    /// is final before they are sealed.
    whole: std::collections::BTreeSet<u64>,
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
            whole: std::collections::BTreeSet::new(),
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
                self.note_whole(seq, k);
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
        let Some((comm_id, nranks)) = self.reference_candidate() else {
            return;
        };
        let Some((p, o, method)) = self.infer_period(&self.pending[&comm_id].1) else {
            return;
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
            self.note_whole(s, k);
        }
    }

    /// The communicator to take as the reference now, with its size: the
    /// largest with enough instances, unless a larger repeating one may
    /// still come (and patience has not run out).
    fn reference_candidate(&self) -> Option<(u64, u32)> {
        let need = if self.cfg.override_period.is_some() {
            1
        } else {
            self.cfg.detect_instances
        };
        let (&comm_id, &(nranks, _)) = self
            .pending
            .iter()
            .filter(|(_, (_, q))| q.len() >= need)
            .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))?;
        let patience_over = self
            .pending
            .values()
            .any(|(_, q)| q.len() >= PATIENCE * self.cfg.detect_instances.max(1));
        if nranks < self.largest_repeating && !patience_over {
            return None;
        }
        Some((comm_id, nranks))
    }

    /// The step (instances per iteration, phase, how it was found) in the
    /// reference's instances `q`; `None` while more are needed to tell.
    fn infer_period(&self, q: &Instances) -> Option<(u64, u64, Method)> {
        let cap = PATIENCE * self.cfg.detect_instances.max(1);
        let run = consecutive_run(q);
        Some(match self.cfg.override_period {
            Some(p) => (p.max(1), 0, Method::Override),
            None => {
                if run.len() < self.cfg.detect_instances.min(q.len()).max(8) {
                    if q.len() > 4 * self.cfg.detect_instances {
                        // Sequence holes everywhere: give up on structure.
                        (1, 0, Method::Undetermined)
                    } else {
                        return None;
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
                        return None;
                    }
                    found
                }
            }
        })
    }

    fn record_end(&mut self, k: u64, end: CoordNs) {
        match self.ends.binary_search_by_key(&k, |e| e.0) {
            Ok(i) => self.ends[i].1 = self.ends[i].1.max(end),
            Err(i) => self.ends.insert(i, (k, end)),
        }
        while self.ends.len() > self.cfg.history {
            if let Some((k, _)) = self.ends.pop_front() {
                self.whole.remove(&k);
            }
        }
    }

    /// Marks iteration `k` whole when `seq` is its last reference instance.
    fn note_whole(&mut self, seq: u64, k: u64) {
        let Some(p) = self.period else { return };
        if self.end_of(k).is_some()
            && seq + 1 >= p.phase + p.instances_per_iteration
            && (seq + 1 - p.phase).is_multiple_of(p.instances_per_iteration.max(1))
        {
            self.whole.insert(k);
        }
    }

    /// Duration of iteration `k` (ns) once it and the one before are whole
    /// (their last reference instance seen): final before `k` is sealed,
    /// which waits [`IterationConfig::seal_lag`] iterations more for the
    /// records of every rank.
    pub fn whole_duration_of(&self, k: u64) -> Option<f64> {
        let p = k.checked_sub(1)?;
        (self.whole.contains(&k) && self.whole.contains(&p))
            .then(|| self.duration_of(k))
            .flatten()
    }

    /// Highest iteration with a known end.
    pub fn last_ended(&self) -> Option<u64> {
        self.ends.back().map(|e| e.0)
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

    /// Whether `t` falls inside iterations already seen, where
    /// [`Self::iteration_at`] reads ends rather than extrapolates.
    pub fn within_seen(&self, t: CoordNs) -> bool {
        self.ends.back().is_some_and(|e| t <= e.1)
    }

    /// Highest iteration whose statistics are final.
    pub fn sealed_through(&self) -> Option<u64> {
        let (last_k, _) = *self.ends.back()?;
        last_k.checked_sub(self.cfg.seal_lag)
    }
}

/// Longest run of consecutive sequence numbers from the lowest one.
fn consecutive_run(q: &Instances) -> Vec<(u64, CoordNs, CoordNs, Marks)> {
    let mut run: Vec<(u64, CoordNs, CoordNs, Marks)> = Vec::new();
    for (&s, &(a, b, m)) in q {
        if let Some(&(last, _, _, _)) = run.last() {
            if s != last + 1 {
                break;
            }
        }
        run.push((s, a, b, m));
    }
    run
}

#[cfg(test)]
mod tests;
