//! Slowdowns that are not a slow rank (DESIGN.md §5): a pipeline stage
//! slower on every replica (partition imbalance), and per-iteration work
//! imbalance whose slowest rank changes from one iteration to the next
//! (sequence lengths). Both are as common in production as a slow worker,
//! and naming one rank for either would send the on-call engineer to the
//! wrong machine.
//!
//! In: each sealed iteration's what-if model ([`crate::graph::whatif::WhatIf`]).
//! Out: per iteration, at most one stage finding (the stage, its work
//! against the other stages', and what balancing it would save) and, over a
//! window, a work-imbalance finding. Pure.

use std::collections::{BTreeMap, VecDeque};

use crate::graph::whatif::WhatIf;

/// The structural rules' thresholds (the `[structure]` table of a
/// thresholds file).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StructureConfig {
    /// A stage's replicas must work this much more than the median stage's
    /// (per rank, per iteration) to be a finding: below it, stages differ by
    /// what they compute (an embedding, a loss) and nobody repartitions a
    /// model for it.
    pub stage_excess: f64,
    /// Smallest saving (share of the step) worth a structural finding.
    pub min_cost: f64,
    /// Iterations a work-imbalance finding looks back over. Its
    /// iterations must be GPU-side, which they are only in deep windows,
    /// and those open once the job slowed: in random 1127-32 moved to an
    /// onset at 30 (dp8 on 4 hosts, work ×1.22) the window opened at
    /// iteration 37 and 18 GPU-side steps followed to the end, too few for
    /// 20. 12 finds it; a straggler is kept apart by `max_top_share` and
    /// `max_persistence`, and by any rank verdict, which comes first.
    pub window: usize,
    /// Work imbalance moves: no rank may be the costliest in more than this
    /// share of the window (a rank that is, is a straggler, and the
    /// sequential test's business). Over 12 steps of 8 ranks taking turns
    /// at random one rank's turns reached 5 (1127-32 at 30: 0.42): half.
    pub max_top_share: f64,
    /// Work imbalance moves: no rank's mean excess work over the window may
    /// reach this share of the mean per-iteration largest excess. A slow
    /// rank or a slow host has the same ranks in excess every iteration
    /// (ratio ≈ 1; on a slow host the costliest of its equally late ranks
    /// rotates, so `max_top_share` alone would take it for imbalance);
    /// imbalance spread over n ranks has less, though more than 1/n over a
    /// 20-step window: random 1127-32 (dp8, work ×1.22 drawn anew every
    /// step) read 0.37–0.48 over 20 steps, 0.43–0.65 over 12, so at the
    /// first choice, 0.4, its finding flickered and never opened. 0.7
    /// sits between that and a fixed slow rank's ≈ 1 (chosen on seed 1127;
    /// BENCHMARKS.md).
    pub max_persistence: f64,
    /// Recent iterations the rotation gate looks back over
    /// ([`Rotation`]): short, so that a rank is held back from the first
    /// iterations of an imbalance on, long before `window` fills.
    pub rotation_window: usize,
    /// A rank's what-if share that makes it the iteration's costliest in
    /// the rotation gate's eyes: the sequential test's allowance, below
    /// which a rank builds no evidence either (healthy runs' costliest
    /// ranks stay under 2%).
    pub rotation_min_share: f64,
    /// Distinct costliest ranks in the rotation window that make the
    /// slowest rank "move": two can be two stragglers taking turns, three
    /// is what no fixed set of slow ranks does.
    pub rotation_distinct: usize,
    /// While work imbalance is named, a rank must have been the costliest
    /// in half of this many recent steps' costly ones to be a suspect: 8
    /// ranks taking turns at random give one of them 4 turns of 6 now and
    /// then (a synthetic dp8 job with work ×1–4 named rank 1 so, for 30
    /// steps), rarely half of 24.
    pub rotation_hold_window: usize,
    /// Where no step is wholly GPU-side (partners on one host), work
    /// imbalance is read from the rotation alone: at least this many of the
    /// last `rotation_hold_window` steps must have had a costliest rank
    /// (random 1127-7, tp2 dp4 on 4 hosts, work ×1.3: 9 of its last 25
    /// steps; the healthy runs of seeds 1127 and 2027 replayed: none).
    pub rotation_min_costly: usize,
    /// Work imbalance is said only of a slowdown it explains
    /// ([`crate::graph::spread`]): the median balanced saving (what every
    /// rank at its role's median work would save, share of the step) over
    /// this many iterations before the slowdown began...
    pub spread_before: usize,
    /// ...of which at least this many, of the kind the finding is read on
    /// (GPU-side steps for the replayed imbalance): the warm-up's first
    /// look gives about 10 GPU-side steps (random 6211-2: iterations
    /// 13–22), the only ones before a slowdown where no deep window was
    /// open; fewer, and the rise alone decides...
    pub spread_min_before: usize,
    /// ...against its median over this many recent ones (`window`'s 12)...
    pub spread_recent: usize,
    /// ...must have grown by at least this share of the step: `min_cost`,
    /// the smallest saving worth a structural finding. Not a share of the
    /// rise: moving work also raises every rank's mean work (work ×1–4
    /// drawn anew per step doubles it on average), and that part of the
    /// rise is no rank's; its spread grew from 0.3% to 9–18% of the step.
    /// A job that slowed as a whole keeps its spread (a synthetic dp8 job,
    /// every GPU 1.3× slower, jitter 0.2).
    pub spread_min_growth: f64,
    /// Work imbalance is GPU work that moves between ranks. Where the
    /// ranks' main threads wait for a CPU (their median run-queue delay
    /// over the finding's steps is at least this share of wall time),
    /// lateness moves between ranks with the scheduler, and that is the
    /// hosts' contention, not the work's: `faults_coordinator_restart`
    /// (a healthy dp8 job beside two busy loops on 2 vCPUs) read 7–36%
    /// and was told "work imbalance, costing 25%" in 1 of 8 runs; the
    /// random specs' runs (tuning seed 6211) read 0–0.7%.
    pub max_runq_share: f64,
}

impl StructureConfig {
    /// The spread rule's knobs.
    pub fn spread(&self) -> crate::graph::spread::SpreadConfig {
        crate::graph::spread::SpreadConfig {
            before: self.spread_before,
            min_before: self.spread_min_before,
            recent: self.spread_recent,
            min_growth: self.spread_min_growth,
        }
    }
}

impl Default for StructureConfig {
    fn default() -> Self {
        Self {
            stage_excess: 0.15,
            min_cost: 0.03,
            window: 12,
            max_top_share: 0.5,
            max_persistence: 0.7,
            rotation_window: 8,
            rotation_min_share: 0.05,
            rotation_distinct: 3,
            rotation_hold_window: 24,
            rotation_min_costly: 6,
            spread_before: 24,
            spread_min_before: 8,
            spread_recent: 12,
            spread_min_growth: 0.03,
            max_runq_share: 0.05,
        }
    }
}

/// One iteration's stage imbalance.
#[derive(Debug, Clone, PartialEq)]
pub struct StageFinding {
    pub stage: u32,
    pub ranks: Vec<u32>,
    /// Its replicas' work over the median stage's.
    pub ratio: f64,
    /// What the iteration would have saved with that stage at the median
    /// stage's work (ns).
    pub saved_ns: f64,
}

/// Work imbalance over the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ImbalanceFinding {
    /// Mean saving per iteration had every rank worked at its peers'
    /// median (ns).
    pub saved_ns: f64,
    /// Distinct ranks that were the costliest in the window.
    pub distinct_tops: usize,
    /// The costliest rank's share of the window.
    pub top_share: f64,
}

/// The stage whose replicas all work ≥ `stage_excess` more than the median
/// stage's, if balancing it saves ≥ `min_cost` of the step.
pub fn stage_imbalance(
    model: &WhatIf,
    step_ns: f64,
    cfg: &StructureConfig,
) -> Option<StageFinding> {
    let mut by_stage: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for r in model.ranks() {
        if let Some(s) = model.stage_of(r) {
            by_stage.entry(s).or_default().push(r);
        }
    }
    if by_stage.len() < 2 {
        return None;
    }
    // Per stage: the least-working replica (every replica must be slow).
    let floor: BTreeMap<u32, f64> = by_stage
        .iter()
        .filter_map(|(s, rs)| {
            let w = rs
                .iter()
                .filter_map(|r| model.work_total(*r))
                .fold(f64::INFINITY, f64::min);
            w.is_finite().then_some((*s, w))
        })
        .collect();
    // Every stage must be in the comparison: an iteration whose stage 0
    // ranks had no work in the model (cut at the iteration's edge) left
    // three stages, and the median of two others set the bar (a healthy
    // pp4 × dp2 job, one rank a host: stage 1 at 1.21× for 10 iterations
    // in a row, a false finding). Stages are numbered from 0.
    let stages = floor.keys().next_back().map_or(0, |s| *s as usize + 1);
    if floor.len() < stages.max(2) {
        tracing::debug!(?floor, "a stage has no work in the model: no comparison");
        return None;
    }
    let mut all: Vec<f64> = floor.values().copied().collect();
    all.sort_by(f64::total_cmp);
    let median = all[all.len() / 2].max(all[(all.len() - 1) / 2]);
    let (&stage, &w) = floor.iter().max_by(|a, b| a.1.total_cmp(b.1))?;
    let typical = {
        let others: Vec<f64> = floor
            .iter()
            .filter(|(s, _)| **s != stage)
            .map(|(_, w)| *w)
            .collect();
        let mut o = others;
        o.sort_by(f64::total_cmp);
        if o.is_empty() {
            median
        } else {
            o[o.len() / 2]
        }
    };
    tracing::debug!(
        ?floor,
        stage,
        typical,
        "the least-working replica's work per stage (ns)"
    );
    if typical <= 0.0 || w < (1.0 + cfg.stage_excess) * typical {
        return None;
    }
    let ranks = by_stage[&stage].clone();
    let saved = (model.length() - model.length_scaled(&ranks, typical / w)).max(0.0);
    (step_ns.is_finite() && saved >= cfg.min_cost * step_ns).then_some(StageFinding {
        stage,
        ranks,
        ratio: w / typical,
        saved_ns: saved,
    })
}

/// Whether a stage's replicas work alike where their work is seen whole
/// (`seen`, [`crate::classify::align::seen_ratio`]): none more than
/// `stage_excess` over another, the margin a stage must exceed the others
/// by. Where a replica group's all-reduce is blind (over NVLink), a
/// healthy replica waits there for a slow one and its work between
/// GPU-side arrivals looks as long as the straggler's (pp4 × dp2 on 4
/// hosts, one GPU 1.3× slower: both replicas 1.4× the other stages'); its
/// seen work does not. Replicas that cannot be compared are not even.
pub fn replicas_even(
    seen: &BTreeMap<u32, crate::classify::align::SeenWork>,
    ranks: &[u32],
    cfg: &StructureConfig,
) -> bool {
    let mut hi: f64 = 1.0;
    for a in ranks {
        for b in ranks.iter().filter(|b| *b != a) {
            let r = seen
                .get(a)
                .zip(seen.get(b))
                .and_then(|(x, y)| crate::classify::align::seen_ratio(x, y));
            match r {
                Some(r) => hi = hi.max(r),
                None => {
                    tracing::debug!(?ranks, a, b, "replicas' seen work not comparable");
                    return false;
                }
            }
        }
    }
    let even = hi <= 1.0 + cfg.stage_excess;
    tracing::debug!(
        ?ranks,
        hi,
        even,
        "the stage's replicas' seen work, most against least"
    );
    even
}

/// A stage looks slower on every replica when one of its ranks is a
/// straggler its replicas all wait for (their data-parallel all-reduce
/// across the stage): random 3119-19 (pp2 × dp8, rank 12's GPU 1.61×
/// slower) named "stage 1 slower on every replica", and the stage finding
/// took rank 12's place. A stage of which some ranks, fewer than half, are
/// `named` (observed as stragglers, or under an active rank verdict) is
/// theirs to explain; in a real imbalance no replica stands out from its
/// stage's others, or they all do.
pub fn stragglers_explain(stage: &[u32], named: impl Fn(u32) -> bool) -> bool {
    let n = stage.iter().filter(|r| named(**r)).count();
    let explained = n > 0 && 2 * n < stage.len();
    if explained {
        tracing::debug!(
            ?stage,
            named = n,
            "stage slower on every replica, but some of its ranks are stragglers: not a stage finding"
        );
    }
    explained
}

/// Work imbalance read from the rotation alone ([`Rotation::moving`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RotationFinding {
    /// Steps of the window that had a costliest rank.
    pub costly: usize,
    /// Different ranks that were.
    pub distinct: usize,
    /// The most turns any one of them had.
    pub most: usize,
}

/// The rotation gate: a straggler is the iteration's costliest rank again
/// and again; under work imbalance the costliest rank changes from one
/// iteration to the next, and a rank whose turn came twice in a short
/// while adds up the sequential test's evidence like a straggler (random
/// 5407-34, dp8, work ×2.32: five ranks named compute-slow in turn). The
/// gate holds a rank back from a *new* verdict while the costliest rank
/// moves and it is not the costliest in at least half of the recent
/// iterations that had one; and a one-iteration spike (one costly turn)
/// is no alarm until the rank is the costliest a second time. An active
/// verdict is never held: a straggler named before an imbalance began
/// stays named. Pure.
#[derive(Debug, Clone, Default)]
pub struct Rotation {
    cfg: StructureConfig,
    /// Per recent iteration, its costliest rank if it cost at least
    /// `rotation_min_share` of the step.
    tops: VecDeque<Option<u32>>,
}

impl Rotation {
    pub fn with_config(cfg: StructureConfig) -> Self {
        Self {
            cfg,
            tops: VecDeque::new(),
        }
    }

    /// One iteration's what-if shares (share of the step per rank).
    pub fn observe(&mut self, shares: &BTreeMap<u32, f64>) {
        let top = shares
            .iter()
            .filter(|(_, x)| **x >= self.cfg.rotation_min_share && **x <= 1.0)
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(r, _)| *r);
        self.tops.push_back(top);
        let keep = self
            .cfg
            .rotation_window
            .max(self.cfg.rotation_hold_window)
            .max(self.cfg.window)
            .max(1);
        while self.tops.len() > keep {
            self.tops.pop_front();
        }
    }

    /// The last `window` iterations' costliest ranks (costly ones only).
    fn recent(&self, window: usize) -> impl Iterator<Item = u32> + Clone + '_ {
        let skip = self.tops.len().saturating_sub(window);
        self.tops.iter().skip(skip).flatten().copied()
    }

    /// Times `rank` was the costliest in the last `window` iterations, and
    /// how many of them had a costliest rank at all.
    fn turns(&self, rank: u32, window: usize) -> (usize, usize) {
        let costly = self.recent(window);
        let n = costly.clone().count();
        (costly.filter(|r| *r == rank).count(), n)
    }

    /// Whether the costliest rank moves: at least `rotation_distinct`
    /// different ranks were the costliest in the window.
    pub fn rotating(&self) -> bool {
        let distinct: std::collections::BTreeSet<u32> =
            self.recent(self.cfg.rotation_window).collect();
        distinct.len() >= self.cfg.rotation_distinct.max(2)
    }

    /// Whether a new verdict on `rank` is held back: the costliest rank
    /// moves and `rank` was the costliest in fewer than half of the
    /// window's costly iterations.
    pub fn holds(&self, rank: u32) -> bool {
        let (mine, n) = self.turns(rank, self.cfg.rotation_window);
        self.rotating() && 2 * mine < n
    }

    /// While work imbalance is named: whether `rank` does not stand out
    /// of the turns, over the short window or the longer
    /// `rotation_hold_window`.
    pub fn holds_during_imbalance(&self, rank: u32) -> bool {
        let (mine, n) = self.turns(rank, self.cfg.rotation_hold_window);
        self.holds(rank) || 2 * mine < n
    }

    /// Work imbalance as the rotation alone shows it, over the last
    /// `rotation_hold_window` steps (a mild imbalance makes a costly step
    /// one in three: over 12 the count flickered around its floor and the
    /// finding never held 6 steps of 8): at least `rotation_min_costly`
    /// had a costliest rank,
    /// `rotation_distinct` different ones, none the costliest in half of
    /// them, and not all of one pipeline stage (`stage_of`: a slower
    /// stage's replicas take turns too, and that is a stage's business).
    pub fn moving(&self, stage_of: impl Fn(u32) -> Option<u32>) -> Option<RotationFinding> {
        let tops: Vec<u32> = self.recent(self.cfg.rotation_hold_window).collect();
        let mut turns: BTreeMap<u32, usize> = BTreeMap::new();
        for r in &tops {
            *turns.entry(*r).or_default() += 1;
        }
        let most = turns.values().copied().max().unwrap_or(0);
        let stages: std::collections::BTreeSet<Option<u32>> =
            turns.keys().map(|r| stage_of(*r)).collect();
        let one_stage = stages.len() == 1 && stages.iter().next().is_some_and(|s| s.is_some());
        (tops.len() >= self.cfg.rotation_min_costly.max(1)
            && turns.len() >= self.cfg.rotation_distinct.max(2)
            && 2 * most < tops.len()
            && !one_stage)
            .then_some(RotationFinding {
                costly: tops.len(),
                distinct: turns.len(),
                most,
            })
    }

    /// Whether the sequential test's alarm on `rank` may open a verdict:
    /// not on one costly turn (the first iteration of an imbalance looks
    /// like a straggler's), nor while the gate holds it.
    pub fn confirms(&self, rank: u32) -> bool {
        self.turns(rank, self.cfg.rotation_window).0 >= 2 && !self.holds(rank)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Imbalance {
    cfg: StructureConfig,
    /// (costliest rank, its saving share, balanced saving ns, step ns).
    window: VecDeque<(Option<u32>, f64, f64, f64)>,
    /// Per iteration, each rank's own work beyond its role's median (ns,
    /// only ranks above it).
    excess: VecDeque<BTreeMap<u32, f64>>,
}

/// What the iteration would have saved (ns, ≥ 0) had every rank with peers
/// worked at its role's median.
pub fn balanced_saving(model: &WhatIf) -> f64 {
    (model.length() - model.length_balanced()).max(0.0)
}

/// Each rank's own work beyond the median of its role (ranks above only).
fn excess(model: &WhatIf) -> BTreeMap<u32, f64> {
    let mut out = BTreeMap::new();
    for role in model.roles() {
        if role.len() < 2 {
            continue;
        }
        let mut w: Vec<(u32, f64)> = role
            .iter()
            .filter_map(|r| model.work_total(*r).map(|w| (*r, w)))
            .collect();
        let mut v: Vec<f64> = w.iter().map(|x| x.1).collect();
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        w.retain(|x| x.1 > med);
        out.extend(w.into_iter().map(|(r, x)| (r, x - med)));
    }
    out
}

impl Imbalance {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_config(cfg: StructureConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    /// Iterations the finding looks back over.
    pub fn window(&self) -> usize {
        self.cfg.window
    }

    /// One iteration: its model, its balanced saving (ns,
    /// [`balanced_saving`]) and each measured rank's what-if share.
    pub fn observe(
        &mut self,
        model: &WhatIf,
        step_ns: f64,
        balanced: f64,
        shares: &BTreeMap<u32, f64>,
    ) {
        if !step_ns.is_finite() || step_ns <= 0.0 {
            return;
        }
        let top = shares
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .filter(|(_, x)| **x > 0.0)
            .map(|(r, x)| (*r, *x));
        self.window.push_back((
            top.map(|t| t.0),
            top.map_or(0.0, |t| t.1),
            balanced,
            step_ns,
        ));
        self.excess.push_back(excess(model));
        while self.window.len() > self.cfg.window {
            self.window.pop_front();
            self.excess.pop_front();
        }
    }

    /// Mean balanced saving over the window, as a share of the step.
    fn share(&self) -> f64 {
        let n = self.window.len().max(1) as f64;
        self.window.iter().map(|w| w.2 / w.3).sum::<f64>() / n
    }

    /// The most persistent rank's mean excess over the mean per-iteration
    /// largest excess (see [`StructureConfig::max_persistence`]).
    fn persistence(&self) -> f64 {
        let n = self.excess.len().max(1) as f64;
        let peak: f64 = self
            .excess
            .iter()
            .map(|e| e.values().copied().fold(0.0, f64::max))
            .sum::<f64>()
            / n;
        let mut per_rank: BTreeMap<u32, f64> = BTreeMap::new();
        for e in &self.excess {
            for (r, x) in e {
                *per_rank.entry(*r).or_default() += x / n;
            }
        }
        let top = per_rank.values().copied().fold(0.0, f64::max);
        if peak > 0.0 {
            top / peak
        } else {
            1.0
        }
    }

    /// Work imbalance over the window: balancing would save ≥ `min_cost`
    /// on average, and the costliest rank keeps changing. A healthy job
    /// is imbalanced too (random 2027-15, dp16, no fault: balancing would
    /// have saved 10% of every step, with 8–12 different costliest ranks):
    /// the analyzer says it only of a job that slowed.
    pub fn finding(&self) -> Option<ImbalanceFinding> {
        if self.window.len() < self.cfg.window {
            return None;
        }
        let n = self.window.len() as f64;

        let share = self.share();
        let saved: f64 = self.window.iter().map(|w| w.2).sum::<f64>() / n;
        let mut tops: BTreeMap<u32, usize> = BTreeMap::new();
        for w in &self.window {
            if let Some(r) = w.0 {
                *tops.entry(r).or_default() += 1;
            }
        }
        let top_share = tops.values().copied().max().unwrap_or(0) as f64 / n;
        tracing::debug!(
            share,
            top_share,
            distinct = tops.len(),
            persistence = self.persistence(),
            "work imbalance over the window"
        );
        (share >= self.cfg.min_cost
            && top_share <= self.cfg.max_top_share
            && tops.len() >= 3
            && self.persistence() <= self.cfg.max_persistence)
            .then_some(ImbalanceFinding {
                saved_ns: saved,
                distinct_tops: tops.len(),
                top_share,
            })
    }
}

#[cfg(test)]
mod tests;
