//! Lateness statistics per rank per iteration, over aligned instances
//! ([`super::align`]).
//!
//! Per rank and iteration the accumulator keeps lateness on the rank's
//! *reference communicator* (its largest collective communicator — the
//! data-parallel group in 3-D layouts, whose members do identical work, so
//! cross-sectional comparison is fair), waits suffered elsewhere (tensor and
//! pipeline communicators: a rank that waited there arrives late through no
//! fault of its own), waits inflicted, order statistics and host counters.

use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, VecDeque};

use crate::clock::CoordNs;
use crate::join::InstanceKey;
use crate::robust::{median, robust_z, MAD_TO_SIGMA};

pub use super::align::{align, AlignedInstance, AlignedMember, Basis};

/// One rank's accumulators over one iteration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankIter {
    /// Instances on the rank's reference communicator.
    pub ref_n: u32,
    pub late_sum: f64,
    pub host_late_sum: f64,
    pub gpu_late_sum: f64,
    pub gpu_n: u32,
    pub last_n: u32,
    /// Sum of normalised arrival position (0 first … 1 last).
    pub pos_sum: f64,
    /// Waits suffered on other communicators (tensor, pipeline).
    pub wait_nonref: f64,
    pub wait_all: f64,
    /// Others' waits in instances where this rank arrived last.
    pub inflicted: f64,
    pub sync_wait: f64,
    pub launches: u64,
    pub coll_n: u32,
    /// Transfer time × members over instances containing the rank.
    pub xfer_member_ns: f64,
    pub xfer_n: u32,
    /// Its own time in transfers (GPU-side, deep set): last arrival to done.
    pub xfer_ns: f64,
    pub err_max: f64,
    pub first_t: Option<CoordNs>,
    pub nccl_errors: u32,
}

/// Everything known about one iteration.
#[derive(Debug, Clone, Default)]
pub struct IterBucket {
    pub ranks: HashMap<u32, RankIter>,
    /// (waiter, waited-for) → total wait (ns).
    pub edges: HashMap<(u32, u32), f64>,
    pub instances: u32,
}

/// One rank's score for one sealed iteration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RankScore {
    pub rank: u32,
    pub iteration: u64,
    pub ref_n: u32,
    pub late_ns: f64,
    pub host_late_ns: f64,
    pub gpu_late_ns: Option<f64>,
    /// Reference instances with GPU-side lateness.
    pub gpu_n: u32,
    pub excess_wait_ns: f64,
    pub unexplained_ns: f64,
    pub sync_excess_ns: f64,
    pub last_frac: f64,
    pub mean_pos: f64,
    pub inflicted_ns: f64,
    /// Waiting attributed to this rank as a root by the wait graph (ns).
    pub blame_ns: f64,
    /// Blame above the median of its reference peers (ns).
    pub blame_excess_ns: f64,
    /// Robust z-score of that excess.
    pub blame_z: f64,
    pub err_ns: f64,
    pub step_ns: f64,
    pub peers: usize,
    pub suspicious: bool,
    pub first_t: Option<CoordNs>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsConfig {
    /// Unsealed iterations kept; older instances are dropped and counted.
    pub max_open_iterations: usize,
    /// Unexplained lateness per iteration, as a fraction of the step, below
    /// which a rank is never suspicious.
    pub min_step_fraction: f64,
    /// Robust z-score (vs the peers' median and MAD) a suspect must exceed.
    pub min_robust_z: f64,
    /// Mean host-side lateness per reference instance, as a fraction of the
    /// step, that a host-bound root last in most instances must reach.
    pub min_host_step_fraction: f64,
    /// Absolute floor on unexplained lateness per iteration (ns).
    pub min_late_ns: f64,
    /// Smoothing of the per-rank lateness gauge.
    pub ewma_alpha: f64,
    /// Suspicious iterations (of a rank's last 5) before a suspect that
    /// only the deep set can class asks for it (or the sequential test's
    /// alarm on it). 1: at once. One suspicious iteration of a healthy
    /// job's jitter then opens a 30-s deep window on every agent (on
    /// dp8-healthy it held the verbs data-path probes on for half of a
    /// 56-s run, ≈ 3,000 traps per rank-second). 3 spares that, but the
    /// latency sweep (1.1× and 1.3× GPU, 2 seeds) then named 3 of 4 faults
    /// instead of 4 and the 1.3× GPU 9–12 iterations after onset instead
    /// of 2: a window already open by chance had been doing the naming
    /// (BENCHMARKS.md, 2026-11-28). Detection comes first: 1, until the
    /// deep window itself is cheap.
    pub deep_ask_min: usize,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            max_open_iterations: 32,
            min_step_fraction: 0.04,
            min_robust_z: 6.0,
            min_host_step_fraction: 0.1,
            min_late_ns: 100_000.0,
            ewma_alpha: 0.2,
            deep_ask_min: 1,
        }
    }
}

/// Point-to-point peers remembered per rank (a pipeline stage talks to
/// the stage before and after it).
const MAX_P2P_PEERS: usize = 16;

/// Iterations the smoothed test takes the median over.
pub const SMOOTH_ITERATIONS: usize = 5;

#[derive(Debug)]
pub struct Stats {
    cfg: StatsConfig,
    buckets: BTreeMap<u64, IterBucket>,
    /// rank → (members, comm id) of its reference communicator.
    rank_ref: HashMap<u32, (u32, u64)>,
    comm_members: HashMap<u64, Vec<u32>>,
    /// comm → (last lateness by position, EWMA of Spearman ρ).
    spearman: HashMap<u64, (Vec<f64>, Option<f64>)>,
    /// rank → EWMA of mean lateness per reference instance (ns).
    lateness_gauge: HashMap<u32, f64>,
    /// rank → its unexplained lateness over the last iterations scored
    /// (iteration, ns), for the smoothed test.
    recent: HashMap<u32, VecDeque<(u64, f64)>>,
    /// rank → the ranks it sends to or receives from point to point
    /// (pipeline neighbours), at most [`MAX_P2P_PEERS`] each.
    p2p_peers: HashMap<u32, Vec<u32>>,
    /// rank → the ranks it shares a collective communicator with inside one
    /// host (tensor parallel over NVLink): waits there have no GPU-side
    /// times, so they never explain its lateness.
    blind_partners: HashMap<u32, Vec<u32>>,
    /// rank → (one-host communicator, EWMA of the rank's host-side
    /// lateness there, ns): which of two partners waited for the other.
    blind_gauge: HashMap<u32, Vec<(u64, f64)>>,
    /// Ranks in some instance spanning hosts: the deep set can time them.
    crosses_hosts: foldhash::HashSet<u32>,
    /// Collective communicators whose instances span hosts.
    spanning_comms: foldhash::HashSet<u64>,
    /// rank → the last iteration it was in an instance timed GPU-side.
    gpu_timed: HashMap<u32, u64>,
    pub dropped_late: u64,
    pub dropped_overflow: u64,
    sealed_through: Option<u64>,
}

impl Stats {
    pub fn new(cfg: StatsConfig) -> Self {
        Self {
            cfg,
            buckets: BTreeMap::new(),
            rank_ref: HashMap::new(),
            comm_members: HashMap::new(),
            spearman: HashMap::new(),
            lateness_gauge: HashMap::new(),
            recent: HashMap::new(),
            p2p_peers: HashMap::new(),
            blind_partners: HashMap::new(),
            blind_gauge: HashMap::new(),
            crosses_hosts: foldhash::HashSet::default(),
            spanning_comms: foldhash::HashSet::default(),
            gpu_timed: HashMap::new(),
            dropped_late: 0,
            dropped_overflow: 0,
            sealed_through: None,
        }
    }

    pub fn config(&self) -> &StatsConfig {
        &self.cfg
    }

    /// The rank's point-to-point peers seen so far (pipeline neighbours).
    pub fn p2p_peers(&self, rank: u32) -> &[u32] {
        self.p2p_peers.get(&rank).map_or(&[], |v| v.as_slice())
    }

    /// Whether the deep set could time `rank` GPU-side (it takes part in
    /// traffic between hosts) but has not around iteration `it`.
    pub fn gpu_time_missing(&self, rank: u32, it: u64) -> bool {
        self.crosses_hosts.contains(&rank) && self.gpu_timed.get(&rank).is_none_or(|t| t + 1 < it)
    }

    /// Every other member of the collective communicators spanning hosts
    /// that `rank` is in: a ring all-reduce runs at its slowest link, so a
    /// slow NIC holds all of them back.
    pub fn inter_host_peers(&self, rank: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .spanning_comms
            .iter()
            .filter_map(|c| self.comm_members.get(c))
            .filter(|m| m.contains(&rank))
            .flatten()
            .copied()
            .filter(|r| *r != rank)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Ranks sharing a one-host collective communicator with `rank`.
    pub fn blind_partners(&self, rank: u32) -> &[u32] {
        self.blind_partners.get(&rank).map_or(&[], |v| v.as_slice())
    }

    /// The rank's one-host partners outside its reference communicator:
    /// the ones whose waits its reference lateness can hide. A partner on
    /// the reference communicator itself is compared with it there
    /// directly, each late or not on its own (a data-parallel group inside
    /// one host with two slow ranks: the finding went back and forth
    /// between them).
    pub fn blind_partners_elsewhere(&self, rank: u32) -> Vec<u32> {
        let own = self.peers(rank);
        self.blind_partners(rank)
            .iter()
            .copied()
            .filter(|q| !own.contains(q))
            .collect()
    }

    /// How much later `q` arrives than `r` on the one-host communicators
    /// they share (smoothed host-side lateness, ns; the largest gap over
    /// shared communicators by magnitude), or `None` if they share none.
    /// Positive: `r` waits for `q` there.
    pub fn blind_gap(&self, r: u32, q: u32) -> Option<f64> {
        let theirs = self.blind_gauge.get(&q)?;
        self.blind_gauge
            .get(&r)?
            .iter()
            .filter_map(|(c, lr)| theirs.iter().find(|(d, _)| d == c).map(|(_, lq)| lq - lr))
            .max_by(|a, b| a.abs().total_cmp(&b.abs()))
    }

    /// Members of the rank's reference communicator (itself included).
    pub fn peers(&self, rank: u32) -> &[u32] {
        self.rank_ref
            .get(&rank)
            .and_then(|(_, c)| self.comm_members.get(c))
            .map_or(&[], |v| v.as_slice())
    }

    pub fn reference_comm(&self, rank: u32) -> Option<u64> {
        self.rank_ref.get(&rank).map(|r| r.1)
    }

    /// EWMA of Spearman ρ between consecutive instances' lateness orders on a
    /// communicator: near 1 means the same ranks stay late (a persistent
    /// straggler), near 0 means jitter.
    pub fn order_persistence(&self, comm_id: u64) -> Option<f64> {
        self.spearman.get(&comm_id).and_then(|s| s.1)
    }

    pub fn lateness_gauge(&self) -> &HashMap<u32, f64> {
        &self.lateness_gauge
    }

    /// Adds one aligned instance to iteration `it`: what it tells of the
    /// job's layout, then its members' accumulators.
    pub fn add(&mut self, inst: &AlignedInstance, it: u64) {
        if self.sealed_through.is_some_and(|s| it <= s) {
            self.dropped_late += 1;
            return;
        }
        if !self.buckets.contains_key(&it) && self.buckets.len() >= self.cfg.max_open_iterations {
            self.dropped_overflow += 1;
            return;
        }
        let p2p = matches!(inst.key, InstanceKey::P2p { .. });
        self.learn_layout(inst, it, p2p);
        self.accumulate(inst, it, p2p);
    }

    /// Who talks to whom, over what: pipeline peers, ranks that cross
    /// hosts or were GPU-timed, one-host partners and their lateness there,
    /// communicator members, each rank's reference communicator, and the
    /// persistence of the lateness order.
    fn learn_layout(&mut self, inst: &AlignedInstance, it: u64, p2p: bool) {
        if p2p {
            for a in &inst.members {
                for b in inst.members.iter().filter(|b| b.rank != a.rank) {
                    let v = self.p2p_peers.entry(a.rank).or_default();
                    if !v.contains(&b.rank) && v.len() < MAX_P2P_PEERS {
                        v.push(b.rank);
                    }
                }
            }
        }
        let one_host = inst
            .members
            .first()
            .is_some_and(|f| inst.members.iter().all(|m| m.host == f.host));
        // Once per communicator (a 4,096-rank all-reduce comes 100 times a
        // second); a pair for each point-to-point instance.
        if !one_host && (p2p || self.spanning_comms.insert(inst.comm_id)) {
            self.crosses_hosts
                .extend(inst.members.iter().map(|m| m.rank));
        }
        if inst.basis == Basis::Gpu {
            for m in &inst.members {
                let t = self.gpu_timed.entry(m.rank).or_insert(it);
                *t = (*t).max(it);
            }
        }
        if !p2p && one_host && inst.basis == Basis::Host {
            for (a, late) in inst.members.iter().zip(&inst.lateness) {
                let v = self.blind_gauge.entry(a.rank).or_default();
                if let Some((_, g)) = v.iter_mut().find(|(c, _)| *c == inst.comm_id) {
                    *g += self.cfg.ewma_alpha * (late - *g);
                } else if v.len() < MAX_P2P_PEERS {
                    v.push((inst.comm_id, *late));
                }
            }
            for a in &inst.members {
                for b in inst.members.iter().filter(|b| b.rank != a.rank) {
                    let v = self.blind_partners.entry(a.rank).or_default();
                    if !v.contains(&b.rank) && v.len() < MAX_P2P_PEERS {
                        v.push(b.rank);
                    }
                }
            }
        }
        if !p2p {
            let n = inst.members.len() as u32;
            let ranks: Vec<u32> = inst.members.iter().map(|m| m.rank).collect();
            self.comm_members
                .entry(inst.comm_id)
                .or_insert_with(|| ranks.clone());
            for r in &ranks {
                let e = self.rank_ref.entry(*r).or_insert((n, inst.comm_id));
                if n > e.0 || (n == e.0 && inst.comm_id < e.1) {
                    *e = (n, inst.comm_id);
                }
            }
            if (3..=4096).contains(&n) {
                let cur: Vec<f64> = inst.arrival.iter().map(|a| *a as f64).collect();
                let entry = self
                    .spearman
                    .entry(inst.comm_id)
                    .or_insert((Vec::new(), None));
                if entry.0.len() == cur.len() {
                    let rho = spearman(&entry.0, &cur);
                    entry.1 = Some(entry.1.map_or(rho, |o| 0.9 * o + 0.1 * rho));
                }
                entry.0 = cur;
            }
        }
    }

    /// The instance's share of each member's accumulators for iteration
    /// `it`, and the waits between them.
    fn accumulate(&mut self, inst: &AlignedInstance, it: u64, p2p: bool) {
        let n = inst.members.len();
        let bucket = self.buckets.entry(it).or_default();
        bucket.instances += 1;
        // Order of arrival: positions 0..n-1 (ties broken by index).
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|i| inst.arrival[*i]);
        let mut pos = vec![0usize; n];
        for (p, i) in order.iter().enumerate() {
            pos[*i] = p;
        }
        let last_rank = inst.members[inst.last].rank;
        let inflicted: f64 = inst.wait.iter().sum();
        for (i, m) in inst.members.iter().enumerate() {
            let is_ref = !p2p
                && self
                    .rank_ref
                    .get(&m.rank)
                    .is_some_and(|r| r.1 == inst.comm_id);
            let acc = bucket.ranks.entry(m.rank).or_default();
            acc.coll_n += 1;
            acc.sync_wait += m.sync_wait_ns as f64;
            acc.launches += m.launches as u64;
            acc.wait_all += inst.wait[i];
            acc.err_max = acc.err_max.max(inst.member_err[i]);
            acc.first_t = Some(
                acc.first_t
                    .map_or(inst.arrival[i], |t| t.min(inst.arrival[i])),
            );
            if m.ret != 0 {
                acc.nccl_errors += 1;
            }
            if let Some(x) = inst.transfer_ns {
                acc.xfer_member_ns += x * n as f64;
                acc.xfer_n += 1;
                acc.xfer_ns += x;
            }
            if i == inst.last && inst.wait.iter().any(|w| *w > 0.0) {
                acc.inflicted += inflicted;
            }
            if is_ref {
                acc.ref_n += 1;
                acc.late_sum += inst.lateness[i];
                acc.host_late_sum += inst.host_lateness[i];
                if let Some(g) = inst.gpu_lateness[i] {
                    acc.gpu_late_sum += g;
                    acc.gpu_n += 1;
                }
                if i == inst.last {
                    acc.last_n += 1;
                }
                acc.pos_sum += if n > 1 {
                    pos[i] as f64 / (n - 1) as f64
                } else {
                    0.0
                };
                let g = self.lateness_gauge.entry(m.rank).or_insert(0.0);
                *g += self.cfg.ewma_alpha * (inst.lateness[i] - *g);
            } else {
                acc.wait_nonref += inst.wait[i];
            }
            if i != inst.last && inst.wait[i] > 0.0 {
                *bucket.edges.entry((m.rank, last_rank)).or_insert(0.0) += inst.wait[i];
            }
        }
    }

    /// Whether adding to iteration `it` would open one bucket too many.
    pub fn full_for(&self, it: u64) -> bool {
        !self.buckets.contains_key(&it) && self.buckets.len() >= self.cfg.max_open_iterations
    }

    /// Removes and returns every iteration up to `through`, oldest first.
    pub fn take_sealed(&mut self, through: u64) -> Vec<(u64, IterBucket)> {
        self.sealed_through = Some(self.sealed_through.map_or(through, |s| s.max(through)));
        let keep = self.buckets.split_off(&(through + 1));
        let sealed = std::mem::replace(&mut self.buckets, keep);
        sealed.into_iter().collect()
    }

    /// Scores every rank of a sealed iteration against its reference peers,
    /// per iteration and over the last few (see [`Self::smoothed`]).
    pub fn score(&mut self, it: u64, bucket: &IterBucket, step_ns: f64) -> Vec<RankScore> {
        let mut out = self.score_iteration(it, bucket, step_ns);
        self.smoothed(it, &mut out);
        out
    }

    /// The smoothed test. In pipelines an instance near an iteration
    /// boundary lands in one iteration for one rank and the next for
    /// another, so a single iteration's waits (and the lateness they
    /// explain away) jump by a whole step; its peers' spread swamps a
    /// persistent straggler's z-score. The median over the last
    /// [`SMOOTH_ITERATIONS`] iterations ignores such jumps while a real
    /// straggler keeps its lateness. A rank is suspicious when its median
    /// unexplained lateness passes the same test against its peers' medians
    /// and it is late in this iteration too, by more than the clock could
    /// explain.
    fn smoothed(&mut self, it: u64, scores: &mut [RankScore]) {
        for s in scores.iter() {
            let q = self.recent.entry(s.rank).or_default();
            q.push_back((it, s.unexplained_ns));
            while q
                .front()
                .is_some_and(|f| f.0 + SMOOTH_ITERATIONS as u64 <= it)
            {
                q.pop_front();
            }
        }
        let med: HashMap<u32, f64> = self
            .recent
            .iter()
            .filter(|(_, q)| q.len() * 2 > SMOOTH_ITERATIONS)
            .filter_map(|(r, q)| {
                let mut v: Vec<f64> = q.iter().map(|x| x.1).collect();
                median(&mut v).map(|m| (*r, m))
            })
            .collect();
        // Every member of a reference communicator has the same peers: one
        // center per communicator, not one per rank (O(n²) at 1,000 ranks).
        let mut centers: HashMap<u64, Option<(f64, f64)>> = HashMap::new();
        for s in scores.iter_mut() {
            let Some(&mine) = med.get(&s.rank) else {
                continue;
            };
            let Some(comm) = self.reference_comm(s.rank) else {
                continue;
            };
            let c = *centers.entry(comm).or_insert_with(|| {
                let v: Vec<f64> = self
                    .peers(s.rank)
                    .iter()
                    .filter_map(|p| med.get(p).copied())
                    .collect();
                (v.len() >= 3).then(|| center_spread(&v))
            });
            let Some((center, spread)) = c else {
                continue;
            };
            if !s.step_ns.is_finite() {
                continue;
            }
            let floor = (0.005 * s.step_ns).max(10_000.0);
            let z = robust_z(mine, center, spread.max(floor));
            // Twice the clock error bound per instance: over several
            // iterations a host whose clock estimate is off by about its
            // bound makes all its ranks steadily "late" by that much, which
            // the median no longer averages away.
            let material = |x: f64| {
                x >= self.cfg.min_step_fraction * s.step_ns
                    && x >= self.cfg.min_late_ns
                    && x > 2.0 * s.err_ns * s.ref_n as f64
            };
            if material(mine) && z >= self.cfg.min_robust_z && s.unexplained_ns > 0.0 {
                s.suspicious = true;
            }
        }
        self.recent.retain(|_, q| {
            q.back()
                .is_some_and(|b| b.0 + SMOOTH_ITERATIONS as u64 > it)
        });
    }

    fn score_iteration(&self, it: u64, bucket: &IterBucket, step_ns: f64) -> Vec<RankScore> {
        let mut out = Vec::with_capacity(bucket.ranks.len());
        // Per reference communicator, the peers' medians.
        let mut peer_cache: HashMap<u64, PeerCenter> = HashMap::new();
        for (&rank, acc) in &bucket.ranks {
            if acc.ref_n == 0 {
                continue;
            }
            let Some(&(_, comm)) = self.rank_ref.get(&rank) else {
                continue;
            };
            let peers = self.peers(rank);
            let c = *peer_cache
                .entry(comm)
                .or_insert_with(|| PeerCenter::of(peers, bucket));
            out.push(self.score_rank(it, rank, acc, &c, peers.len(), step_ns));
        }
        out.sort_by_key(|s| s.rank);
        out
    }

    /// One rank's score in one iteration against its peers' center `c`.
    fn score_rank(
        &self,
        it: u64,
        rank: u32,
        acc: &RankIter,
        c: &PeerCenter,
        peers: usize,
        step_ns: f64,
    ) -> RankScore {
        let (wait_med, unexpl_med, unexpl_mad) = (c.wait_med, c.unexpl_med, c.unexpl_mad);
        let excess_wait = acc.wait_nonref - wait_med;
        // Time in transfers beyond its peers' (a slow NIC on its ring:
        // the all-reduce ends late, so the rank reaches the next
        // collective late) is the transfer's, not its own lateness.
        let excess_xfer = (acc.xfer_ns - c.xfer_med).max(0.0);
        let unexplained = acc.late_sum - excess_wait.max(0.0) - excess_xfer;
        let mad_floor = (0.005 * step_ns).max(10_000.0);
        let z = robust_z(unexplained, unexpl_med, unexpl_mad.max(mad_floor));
        let sync_excess = acc.sync_wait - c.sync_med;
        let suspicious = self.significant(unexplained, z, acc, peers, step_ns)
            || self.host_root(acc, c, peers, step_ns);
        RankScore {
            rank,
            iteration: it,
            ref_n: acc.ref_n,
            late_ns: acc.late_sum,
            host_late_ns: acc.host_late_sum,
            gpu_late_ns: (acc.gpu_n > 0).then_some(acc.gpu_late_sum),
            gpu_n: acc.gpu_n,
            excess_wait_ns: excess_wait,
            unexplained_ns: unexplained,
            sync_excess_ns: sync_excess,
            last_frac: acc.last_n as f64 / acc.ref_n as f64,
            mean_pos: acc.pos_sum / acc.ref_n as f64,
            inflicted_ns: acc.inflicted,
            blame_ns: 0.0,
            blame_excess_ns: 0.0,
            blame_z: 0.0,
            err_ns: acc.err_max,
            step_ns,
            peers,
            suspicious,
            first_t: acc.first_t,
        }
    }

    /// Whether lateness `x` (robust z-score `z`) is material: a share of
    /// the step, above the floor and the clock error, an outlier, among
    /// at least two peers.
    fn significant(&self, x: f64, z: f64, acc: &RankIter, peers: usize, step_ns: f64) -> bool {
        let err_floor = acc.err_max * acc.ref_n as f64;
        step_ns.is_finite()
            && x >= self.cfg.min_step_fraction * step_ns
            && x >= self.cfg.min_late_ns
            && x > err_floor
            && z >= self.cfg.min_robust_z
            && peers >= 2
    }

    /// A host-bound root: when replicas re-synchronise every step
    /// (pipelines coupled through later stages' DP groups, end-of-step
    /// syncs), the slow host sets everyone's pace and its GPU is not
    /// late among its peers — but its host is, and its GPU drained
    /// while the peers' hosts waited in syncs for theirs.
    fn host_root(&self, acc: &RankIter, c: &PeerCenter, peers: usize, step_ns: f64) -> bool {
        let mad_floor = (0.005 * step_ns).max(10_000.0);
        let sync_excess = acc.sync_wait - c.sync_med;
        let host_mean = acc.host_late_sum / acc.ref_n.max(1) as f64;
        let host_z = robust_z(acc.host_late_sum, c.host_med, c.host_mad.max(mad_floor));
        // On a loaded machine host-side arrivals are noisy (a descheduled
        // rank is late by milliseconds in one iteration, another rank in
        // the next), so a MAD-based z-score over the peers is swamped.
        // What noise does not do is persist *and* drain the GPU: the
        // rank is last in most of its reference instances, late on
        // average by a material share of the step, and its GPU syncs
        // are shorter than its peers' by about that lateness (its GPU
        // idled waiting for its host). Persistence across iterations is
        // left to the verdict hysteresis.
        let ordered = acc.last_n as f64 >= 0.5 * acc.ref_n as f64 && peers >= 3;
        let material = step_ns.is_finite()
            && host_mean >= self.cfg.min_host_step_fraction * step_ns
            && host_mean > acc.err_max
            && host_mean >= self.cfg.min_late_ns;
        (self.significant(acc.host_late_sum, host_z, acc, peers, step_ns) || (ordered && material))
            && -sync_excess >= 0.5 * host_mean
    }
}

impl Stats {
    /// Fills in the wait graph's blame and its excess over the reference
    /// peers' median (pipeline bubbles rest equally on every replica of a
    /// stage, so they cancel). Evidence and cost only: as a trigger it is
    /// not yet robust in pipelines, where blame can rest on conduits.
    pub fn judge_blame(&self, scores: &mut [RankScore], blame: &HashMap<u32, f64>) {
        let by_rank: HashMap<u32, usize> = scores
            .iter()
            .enumerate()
            .map(|(i, s)| (s.rank, i))
            .collect();
        let mut excess = vec![0.0; scores.len()];
        let mut z = vec![0.0; scores.len()];
        // Members of one reference communicator share their peers: the
        // peer values and their median/MAD once per communicator.
        let mut groups: HashMap<u64, (Vec<f64>, f64, f64)> = HashMap::new();
        for (i, s) in scores.iter().enumerate() {
            let peers = self.peers(s.rank);
            let Some(comm) = self.reference_comm(s.rank) else {
                continue;
            };
            let (b, m, mad) = &*groups.entry(comm).or_insert_with(|| {
                let b: Vec<f64> = peers
                    .iter()
                    .filter(|p| by_rank.contains_key(p))
                    .map(|p| blame.get(p).copied().unwrap_or(0.0))
                    .collect();
                let m = median(&mut b.clone()).unwrap_or(0.0);
                let mut d: Vec<f64> = b.iter().map(|x| (x - m).abs()).collect();
                let mad = median(&mut d).unwrap_or(0.0);
                (b, m, mad)
            });
            if b.len() < 2 {
                continue;
            }
            let mine = blame.get(&s.rank).copied().unwrap_or(0.0);
            let floor = (0.005 * s.step_ns).max(10_000.0);
            let (center, spread) = if b.len() < 4 {
                let others: Vec<f64> = peers
                    .iter()
                    .filter(|p| **p != s.rank)
                    .map(|p| blame.get(p).copied().unwrap_or(0.0))
                    .collect();
                (
                    others
                        .iter()
                        .copied()
                        .fold(f64::NEG_INFINITY, f64::max)
                        .max(0.0),
                    floor,
                )
            } else {
                (*m, mad.max(floor))
            };
            excess[i] = mine - center;
            z[i] = excess[i] / (MAD_TO_SIGMA * spread);
        }
        for (i, s) in scores.iter_mut().enumerate() {
            s.blame_ns = blame.get(&s.rank).copied().unwrap_or(0.0);
            s.blame_excess_ns = excess[i];
            s.blame_z = z[i];
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct PeerCenter {
    wait_med: f64,
    xfer_med: f64,
    sync_med: f64,
    unexpl_med: f64,
    unexpl_mad: f64,
    host_med: f64,
    host_mad: f64,
}

impl PeerCenter {
    /// The medians (and spreads) of a reference communicator's members in
    /// one iteration: each rank is judged against them.
    fn of(peers: &[u32], bucket: &IterBucket) -> Self {
        let accs: Vec<&RankIter> = peers.iter().filter_map(|p| bucket.ranks.get(p)).collect();
        let mut w: Vec<f64> = accs.iter().map(|a| a.wait_nonref).collect();
        let mut s: Vec<f64> = accs.iter().map(|a| a.sync_wait).collect();
        let mut x: Vec<f64> = accs.iter().map(|a| a.xfer_ns).collect();
        let wm = median(&mut w).unwrap_or(0.0);
        let xm = median(&mut x).unwrap_or(0.0);
        let u: Vec<f64> = accs
            .iter()
            .map(|a| a.late_sum - (a.wait_nonref - wm).max(0.0) - (a.xfer_ns - xm).max(0.0))
            .collect();
        let h: Vec<f64> = accs.iter().map(|a| a.host_late_sum).collect();
        let (um, umad) = center_spread(&u);
        let (hm, hmad) = center_spread(&h);
        PeerCenter {
            wait_med: wm,
            xfer_med: xm,
            sync_med: median(&mut s).unwrap_or(0.0),
            unexpl_med: um,
            unexpl_mad: umad,
            host_med: hm,
            host_mad: hmad,
        }
    }
}

/// Centre and spread of a peer group's values. With fewer than four peers a
/// median and MAD say nothing: the centre is the lowest value (capped at 0)
/// and the spread is left to the caller's floor.
fn center_spread(v: &[f64]) -> (f64, f64) {
    if v.len() < 4 {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        return (if lo.is_finite() { lo.min(0.0) } else { 0.0 }, 0.0);
    }
    let m = median(&mut v.to_vec()).unwrap_or(0.0);
    let mut d: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    (m, median(&mut d).unwrap_or(0.0))
}

/// Spearman rank correlation of two equally long vectors.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|x, y| v[*x].total_cmp(&v[*y]));
        let mut r = vec![0.0; v.len()];
        for (p, i) in idx.iter().enumerate() {
            r[*i] = p as f64;
        }
        r
    }
    let n = a.len();
    if n < 2 || b.len() != n {
        return 0.0;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let d2: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - y).powi(2)).sum();
    let nf = n as f64;
    1.0 - 6.0 * d2 / (nf * (nf * nf - 1.0))
}

#[cfg(test)]
mod tests;
