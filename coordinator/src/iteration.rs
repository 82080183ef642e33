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

#[derive(Debug, Clone, serde::Serialize)]
pub struct IterationConfig {
    /// Reference instances collected before the period is decided.
    pub detect_instances: usize,
    /// Fixed instances per iteration on the reference communicator, if known.
    pub override_period: Option<u64>,
    /// Iterations of slack before one is sealed.
    pub seal_lag: u64,
    /// Iteration ends remembered.
    pub history: usize,
}

impl Default for IterationConfig {
    fn default() -> Self {
        Self {
            detect_instances: 48,
            override_period: None,
            seal_lag: 2,
            history: 4096,
        }
    }
}

/// The decided period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Period {
    pub comm_id: u64,
    pub comm_nranks: u32,
    pub instances_per_iteration: u64,
    pub phase: u64,
}

/// seq → (start, end) of one communicator's completed instances.
type Instances = BTreeMap<u64, (CoordNs, CoordNs)>;

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
    pub fn observe(&mut self, comm_id: u64, nranks: u32, seq: u64, start: CoordNs, end: CoordNs) {
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
        q.insert(seq, (start, end));
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
        let q = &self.pending[&comm_id].1;
        // Longest run of consecutive sequence numbers from the lowest one.
        let mut run: Vec<(u64, CoordNs, CoordNs)> = Vec::new();
        for (&s, &(a, b)) in q {
            if let Some(&(last, _, _)) = run.last() {
                if s != last + 1 {
                    break;
                }
            }
            run.push((s, a, b));
        }
        let (p, o) = match self.cfg.override_period {
            Some(p) => (p.max(1), 0),
            None => {
                if run.len() < self.cfg.detect_instances.min(q.len()).max(8) {
                    if q.len() > 4 * self.cfg.detect_instances {
                        // Sequence holes everywhere: give up on structure.
                        (1, 0)
                    } else {
                        return;
                    }
                } else {
                    detect_period(&run)
                }
            }
        };
        self.period = Some(Period {
            comm_id,
            comm_nranks: nranks,
            instances_per_iteration: p,
            phase: o,
        });
        let pending = std::mem::take(&mut self.pending);
        for (s, (_, end)) in pending
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

/// Returns `(period, phase)` for a run of consecutive instances.
fn detect_period(run: &[(u64, CoordNs, CoordNs)]) -> (u64, u64) {
    let gaps: Vec<(u64, f64)> = run
        .windows(2)
        .map(|w| (w[1].0, w[1].1.saturating_sub(w[0].1) as f64))
        .collect();
    let n = gaps.len();
    if n < 4 {
        return (1, 0);
    }
    let mean = gaps.iter().map(|g| g.1).sum::<f64>() / n as f64;
    let total: f64 = gaps.iter().map(|g| (g.1 - mean).powi(2)).sum();
    // Even gaps: one instance per step.
    if total <= 0.0 || (total / n as f64).sqrt() < 0.1 * mean.abs() {
        return (1, 0);
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
        return (1, 0);
    }
    let p = best.iter().find(|b| b.1 >= top - 0.05).map_or(1, |b| b.0);
    // The residue after the longest mean gap starts a step.
    let mut sum = vec![0.0; p as usize];
    let mut cnt = vec![0usize; p as usize];
    for (s, g) in &gaps {
        sum[(s % p) as usize] += g;
        cnt[(s % p) as usize] += 1;
    }
    let o = (0..p as usize)
        .max_by(|a, b| {
            let ma = sum[*a] / cnt[*a].max(1) as f64;
            let mb = sum[*b] / cnt[*b].max(1) as f64;
            ma.total_cmp(&mb)
        })
        .unwrap_or(0) as u64;
    (p, o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Rng;

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
                clock.observe(1, 8, seq, t, t + 500_000);
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
        c.observe(0x1, 16, 0, 0, 1_000);
        c.observe(0x1, 16, 1, 2_000, 3_000);
        c.note_issued(0xd, 4, 9);
        let step = 150_000_000i64;
        for s in 0..64u64 {
            let t = (s / 16) as i64 * step + (s % 16) as i64 * 5_000_000;
            c.observe(0x7, 2, s, t, t + 1_000_000);
        }
        assert!(c.period().is_none(), "locked on the tensor-parallel comm");
        for k in 0..16u64 {
            for b in 0..4u64 {
                let t = k as i64 * step + 100_000_000 + b as i64 * 8_000_000;
                c.observe(0xd, 4, k * 4 + b, t, t + 2_000_000);
            }
        }
        let p = c.period().expect("locked");
        assert_eq!((p.comm_id, p.instances_per_iteration), (0xd, 4));
    }
}
