//! Evaluate one sealed iteration: score ranks, read the step model,
//! cost each suspect with the what-if replay and move the verdict
//! lifecycle. In: an iteration bucket; out: verdict events.

use super::*;
use crate::verdict::warmup::WarmUp;

/// Share of a rank's lateness its own slower transfers must cover for the
/// lateness to count as theirs (its NIC's or link's): then a compute-slow
/// rank is not a straggler whose peers' transfers merely wait for it (a
/// straggler's own transfers, from the last arrival on, take its peers'
/// time), and a rank beside its slow NIC has no fault of its own.
const TRANSFER_EXPLAINS: f64 = 0.5;

/// What one iteration's judgement needs to know of the iteration itself.
pub(super) struct IterCtx {
    pub(super) k: u64,
    /// The step's length (ns; infinite while none is known).
    pub(super) step: f64,
    /// Where the iteration began and ended on the coordinator's clock
    /// (`MIN` / `MAX` while unknown).
    pub(super) from: CoordNs,
    pub(super) to: CoordNs,
    /// Rank time the iteration exposed: world size × step.
    pub(super) exposure: f64,
    /// Past the warm-up (the job's, and a resumed life's).
    pub(super) warm: bool,
}

/// Why the suspects are suspects: the iteration's blame (ns per node), the
/// ranks in alarm, those a decisive what-if named, and each replayed rank's
/// what-if share of the step.
#[derive(Clone, Copy)]
struct Why<'a> {
    blame: &'a HashMap<Node, f64>,
    alarms: &'a foldhash::HashSet<u32>,
    by_what_if: &'a foldhash::HashSet<u32>,
    /// Named only because an open verdict's sequential evidence stands.
    held: &'a foldhash::HashSet<u32>,
    shares: &'a BTreeMap<u32, f64>,
}

impl Analyzer {
    /// One sealed iteration, in the pipeline's order: step history, rank
    /// scores and wait-graph blame, the what-if model and sequential test,
    /// the suspects' observations (ranks, then NICs and links), the rules
    /// that pass waits along to their cause, structure, cost, lifecycle.
    pub(super) fn evaluate(
        &self,
        core: &mut Core,
        k: u64,
        bucket: &IterBucket,
    ) -> Vec<VerdictEvent> {
        let (step, warm) = self.begin_iteration(core, k);
        let mut scores = core.stats.score(k, bucket, step);
        let d = core.iteration.duration_of(k);
        core.timeline.record(k, d, &scores);
        let blame = Self::blame(core, bucket, &mut scores);
        let it = self.iteration_context(core, k, step, warm, bucket);
        let (model, gpu) = Self::iteration_model(core, k, it.from);
        let (alarms, shares) = Self::sequential_test(core, model.as_ref(), step);
        self.record_group_shares(core, k, model.as_ref(), step);
        self.record_pace(core, k, step, warm, &shares);
        let (alarms, by_what_if, held) = Self::mark_suspects(core, k, &mut scores, &alarms);
        let why = Why {
            blame: &blame,
            alarms: &alarms,
            by_what_if: &by_what_if,
            held: &held,
            shares: &shares,
        };
        let mut obs = self.rank_observations(core, &it, &scores, &why);
        if it.from != CoordNs::MIN && it.to != CoordNs::MAX {
            self.transfer_observations(core, &it, bucket, model.as_ref(), &mut obs);
        }
        let named: Vec<Subject> = obs.keys().copied().collect();
        let own_transfers = Self::late_by_own_transfers(core, bucket, &obs);
        self.pass_waits_to_their_cause(core, &own_transfers, &mut obs);
        if !named.is_empty() {
            tracing::debug!(
                iteration = k,
                observed = ?named,
                kept = ?obs.keys().collect::<Vec<_>>(),
                "observations before and after passing waits to their cause"
            );
        }
        if let Some(m) = model.as_ref().filter(|_| warm) {
            let partial = Self::partly_blind(core, &it);
            self.judge_structure(core, &it, m, &shares, partial.as_ref(), &mut obs);
        }
        let unobserved = Self::what_if(core, model.as_ref(), &gpu, step, &mut obs);
        // Nobody slow in it: what each role's work is, for the what-if's
        // floor (`graph::reference`).
        let clean = warm
            && obs.is_empty()
            && alarms.is_empty()
            && unobserved.is_empty()
            && !core.lifecycle.verdicts().any(|v| v.active)
            // Nor is an iteration of a slow stretch, though nobody is named
            // in it: deep windows open on suspicion, and one run's only
            // GPU-side "clean" iterations were a stretch the whole job ran
            // 10–50 % slow, which capped its fault's cost at 7 % (16 %).
            && Self::job_rise(core).is_none();
        if let Some(m) = model.as_ref().filter(|_| clean) {
            let top = shares.iter().max_by(|a, b| a.1.total_cmp(b.1));
            let max_share = top.map_or(0.0, |t| *t.1);
            let stand_out = top.is_some_and(|(r, _)| !core.rotation.holds(*r));
            core.work_reference[gpu.basis()].learn(k, m, max_share, stand_out);
        }
        let events = core.lifecycle.step(k, obs);
        Self::forget_lagged_clean(core, k, &events, self.cfg.lifecycle.open_window as u64);
        for c in unobserved {
            core.lifecycle
                .account_unobserved(k, c.subject, c.saved_ns, step, c.once_fixed);
        }
        self.snapshot_opened(core, &events);
        events
    }

    /// Iteration `k`'s step (its own duration, else the job's) and whether
    /// it is past warm-up; keeps the warm steps' history.
    fn begin_iteration(&self, core: &mut Core, k: u64) -> (f64, bool) {
        let step = core
            .iteration
            .duration_of(k)
            .or_else(|| core.iteration.step_ns())
            .unwrap_or(f64::INFINITY);
        if std::mem::take(&mut core.resume_pending) {
            // A resumed life warms up from its first iteration (see
            // `Analyzer::resumed_life`).
            core.warmup = WarmUp::new(k, &self.cfg.lifecycle);
            core.lifecycle.hold_until(core.warmup.warm_from());
            self.apply_carried(core);
        }
        // Warm-up steps (allocators, autotuning) are no baseline: with them a
        // healthy job looked 10% slower right after its warm-up.
        let was = core.warmup.warm_from();
        let warm = core.warmup.observe(k, core.iteration.duration_of(k));
        if warm && core.warmup.warm_from() < was {
            core.lifecycle.warm_at(core.warmup.warm_from());
        }
        if let Some(d) = core.iteration.duration_of(k).filter(|_| warm) {
            core.steps.push_back(d);
            while core.steps.len() > STEP_HISTORY {
                core.steps.pop_front();
            }
        }
        (step, warm)
    }

    /// Where iteration `k` lies and how much GPU time the job had in it.
    fn iteration_context(
        &self,
        core: &Core,
        k: u64,
        step: f64,
        warm: bool,
        bucket: &IterBucket,
    ) -> IterCtx {
        let world = self
            .ranks
            .iter()
            .next()
            .map(|r| r.world_size as f64)
            .filter(|w| *w > 0.0)
            .unwrap_or(bucket.ranks.len() as f64);
        IterCtx {
            k,
            step,
            from: k
                .checked_sub(1)
                .and_then(|p| core.iteration.end_of(p))
                .unwrap_or(CoordNs::MIN),
            to: core.iteration.end_of(k).unwrap_or(CoordNs::MAX),
            exposure: if step.is_finite() { world * step } else { 0.0 },
            warm,
        }
    }

    /// The job's pace: the warm step against its baseline, and every step
    /// from the stretches' first for the slow stretches.
    fn record_pace(
        &self,
        core: &mut Core,
        k: u64,
        step: f64,
        warm: bool,
        shares: &BTreeMap<u32, f64>,
    ) {
        if warm {
            core.pace.observe(k, step, shares);
        }
        // A resumed life's first iterations are partial: the stretches
        // read from its own `first_step` on.
        let first = core.warmup.first();
        if let Some(d) = core
            .iteration
            .duration_of(k)
            .filter(|_| k >= first + self.cfg.stretches.first_step)
        {
            core.pace.record_step(k, d);
        }
    }

    fn snapshot_opened(&self, core: &mut Core, events: &[VerdictEvent]) {
        for e in events {
            if let (EventKind::Opened | EventKind::Reopened, Some(v)) = (e.event, &e.verdict) {
                self.snapshot(
                    core,
                    v.id,
                    v.first_seen_iteration,
                    v.link.as_ref().map(|l| l.ranks),
                    v.rank,
                );
            }
        }
    }

    /// Who waited for whom, and where the waiting comes to rest: each rank's
    /// blame (ns), added to its running total and to its score.
    fn blame(core: &mut Core, bucket: &IterBucket, scores: &mut [RankScore]) -> HashMap<Node, f64> {
        let graph = WaitGraph::from_edges(&bucket.edges);
        let mut pass: HashMap<Node, f64> = HashMap::new();
        for s in scores.iter() {
            let p = if s.late_ns > 0.0 {
                (s.excess_wait_ns.max(0.0) / s.late_ns).clamp(0.0, 1.0)
            } else if s.excess_wait_ns > 0.0 {
                1.0
            } else {
                0.0
            };
            pass.insert(Node::Rank(s.rank), p);
        }
        let blame = graph.blame(&pass, 6);
        let mut rank_blame: HashMap<u32, f64> = HashMap::new();
        for (n, b) in &blame {
            if let Node::Rank(r) = n {
                *core.lost_by_root.entry(*r).or_default() += b;
                rank_blame.insert(*r, *b);
            }
        }
        core.stats.judge_blame(scores, &rank_blame);
        blame
    }

    /// The what-if group costs `slowrank analyze` prints (each configured
    /// group of ranks at its peers' speed), one per iteration.
    fn record_group_shares(
        &self,
        core: &mut Core,
        k: u64,
        model: Option<&crate::graph::whatif::WhatIf>,
        step: f64,
    ) {
        let (Some(m), true) = (model, step.is_finite() && step > 0.0) else {
            return;
        };
        for (g, (_, ranks)) in self.cfg.whatif_groups.iter().enumerate() {
            let here: Vec<u32> = ranks
                .iter()
                .copied()
                .filter(|r| m.ranks().any(|x| x == *r))
                .collect();
            if let Some(len) = m.length_with(&here) {
                core.group_shares[g].push((k, (m.length() - len).max(0.0) / step));
            }
        }
    }

    /// One observation per suspect rank, classified over its last few
    /// suspicious iterations; a suspect is held back where its class is a
    /// guess the deep set can settle, or where two ranks leave no majority.
    fn rank_observations(
        &self,
        core: &mut Core,
        it: &IterCtx,
        scores: &[RankScore],
        why: &Why<'_>,
    ) -> BTreeMap<Subject, Observation> {
        let (k, step, from) = (it.k, it.step, it.from);
        let Why {
            blame,
            alarms,
            by_what_if,
            held,
            shares,
        } = *why;
        let mut obs: BTreeMap<Subject, Observation> = BTreeMap::new();
        for s in scores {
            let Some(window) = Self::suspect_window(core, s, k) else {
                continue;
            };
            let (mut c, cpu) = Self::classify_suspect(core, s.rank, &window, it);
            // Said first where it is what named the rank: the lateness
            // lines below then read as "barely late", which is the point.
            if by_what_if.contains(&s.rank) {
                if let Some(x) = shares.get(&s.rank) {
                    c.evidence.insert(0, Self::what_if_named(core, *x, step));
                }
            }
            // Not in the warm-up: its steps are no baseline (allocators,
            // autotuning), and a suspect there opened a 30-s job-wide deep
            // window 1.5 s into a healthy run (dp8, iteration 16 of 20).
            let ask = it.warm
                && (window.len() >= self.cfg.stats.deep_ask_min || alarms.contains(&s.rank));
            if Self::held_back(core, s, &c, &window, cpu.as_ref(), k, ask) {
                continue;
            }
            let at = s.first_t.unwrap_or(from);
            obs.insert(
                Subject::Rank(s.rank),
                Observation {
                    classification: c,
                    rank: s.rank,
                    host: self.host_of(s.rank),
                    link: None,
                    ranks: Vec::new(),
                    clock_error_ns: s.err_ns,
                    late_ns: s.unexplained_ns,
                    lost_ns: blame.get(&Node::Rank(s.rank)).copied().unwrap_or(0.0),
                    exposure_ns: it.exposure,
                    saved_ns: None,
                    step_ns: 0.0,
                    once_fixed: None,
                    alarm: alarms.contains(&s.rank),
                    held: held.contains(&s.rank),
                    structural: None,
                    at,
                    wall: self.wall(at),
                },
            );
        }
        core.score_hist.retain(|_, h| !h.is_empty());
        obs
    }

    /// Keeps the rank's last 5 suspicious scores (dropping those older
    /// than 5 iterations while it is not suspicious); the window to
    /// classify it over, if it is a suspect this iteration.
    fn suspect_window(core: &mut Core, s: &RankScore, k: u64) -> Option<Vec<RankScore>> {
        let hist = core.score_hist.entry(s.rank).or_default();
        if !s.suspicious {
            hist.retain(|h| h.iteration + 5 > k);
            return None;
        }
        hist.push_back(s.clone());
        while hist.len() > 5 {
            hist.pop_front();
        }
        Some(hist.iter().cloned().collect())
    }

    /// A suspect not named this iteration: one only the deep set can
    /// class (asked for when `ask`: the suspicion lasted), or one of two
    /// ranks with nothing saying which is odd.
    #[allow(clippy::too_many_arguments)] // the suspect, its window and what it may ask
    fn held_back(
        core: &mut Core,
        s: &RankScore,
        c: &classify::Classification,
        window: &[RankScore],
        cpu: Option<&classify::intervals::CpuEvidence>,
        k: u64,
        ask: bool,
    ) -> bool {
        // Host-side times say only that this rank's GPU work ran long:
        // kernels or transfers (a slow NIC drains the stream just the
        // same). Where the deep set can tell the two apart, it is asked
        // to, and the rank waits for its answer instead of being named
        // compute-slow on a guess.
        if c.kind == classify::Kind::Compute
            && !c.gpu_side
            && core.stats.gpu_time_missing(s.rank, k)
        {
            tracing::debug!(
                rank = s.rank,
                iteration = k,
                ask,
                "GPU-bound suspect held for the deep set"
            );
            if ask {
                core.held_for_deep = Some(k);
            }
            return true;
        }
        // Two ranks: no majority says who is odd (see `stands_alone`).
        if s.peers < 3 && !classify::stands_alone(c, window, cpu) {
            tracing::debug!(
                rank = s.rank,
                iteration = k,
                kind = c.kind.as_str(),
                "suspect on a two-rank communicator without direct evidence of its class: not named"
            );
            return true;
        }
        false
    }

    /// A suspect's class over its last suspicious iterations (`window`),
    /// with the CPU evidence of its host since the window began.
    fn classify_suspect(
        core: &Core,
        rank: u32,
        window: &[RankScore],
        it: &IterCtx,
    ) -> (
        classify::Classification,
        Option<classify::intervals::CpuEvidence>,
    ) {
        let peers = core.stats.peers(rank).to_vec();
        let first_it = window.first().map_or(it.k, |w| w.iteration);
        let cpu_from = core
            .iteration
            .end_of(first_it.saturating_sub(1))
            .unwrap_or(it.from);
        let cpu = core.intervals.evidence(rank, &peers, cpu_from, it.to);
        let persistence = core
            .stats
            .reference_comm(rank)
            .and_then(|c| core.stats.order_persistence(c));
        let min_frac = core.stats.config().min_step_fraction;
        let c = classify::classify_straggler(window, cpu.as_ref(), persistence, min_frac);
        (c, cpu)
    }

    /// The evidence line of a rank named by a decisive what-if.
    fn what_if_named(core: &Core, share: f64, step: f64) -> String {
        format!(
            "the what-if replay: at its peers' speed this step would have been {:.0}% ({}) shorter, and every one of the last {} steps at least {:.0}% shorter",
            share * 100.0,
            classify::fmt_ns(share * step),
            core.sequential.config().decisive_run,
            core.sequential.config().decisive_share * 100.0
        )
    }

    /// Communication: slow NICs and links judged over the iteration's
    /// window, each costed by the what-if with its transfers at its peers'
    /// rate; one with no measured cost is no finding.
    fn transfer_observations(
        &self,
        core: &mut Core,
        it: &IterCtx,
        bucket: &IterBucket,
        model: Option<&crate::graph::whatif::WhatIf>,
        obs: &mut BTreeMap<Subject, Observation>,
    ) {
        let f = core.links.evaluate(it.from, it.to, |r| self.host_of(r));
        for c in &f.common_mode {
            tracing::debug!(
                host = %c.host,
                slow = c.slow_links,
                measured = c.measured_links,
                "every link this host measures is slow: a host-side cause, no pair named"
            );
        }
        let min_link_cost = self.cfg.links.min_cost_fraction;
        let observe = |c, rank, link, lost_ns, saved_ns| {
            self.transfer_observation(it, c, rank, link, lost_ns, saved_ns)
        };
        let costs = |ranks: &[u32], ratio: f64| transfer_costs(bucket, model, ranks, ratio);
        for n in &f.nics {
            let (lost, saved) = costs(&[n.rank], n.ratio);
            if !costs_enough(lost, it.exposure, min_link_cost) {
                tracing::debug!(
                    rank = n.rank,
                    lost_ns = lost,
                    "slow NIC with no measured cost: not a finding"
                );
                continue;
            }
            let ratio = transfer_ratio(bucket, n.rank);
            let mut peers = n.slow_peers.clone();
            peers.extend(core.stats.inter_host_peers(n.rank));
            peers.sort_unstable();
            peers.dedup();
            core.nic_peers.insert(n.rank, peers);
            let c = classify::classify_nic(n, ratio);
            obs.insert(Subject::Nic(n.rank), observe(c, n.rank, None, lost, saved));
        }
        for l in &f.links {
            let (lost, saved) = costs(&[l.a, l.b], l.ratio);
            if !costs_enough(lost, it.exposure, min_link_cost) {
                tracing::debug!(
                    a = l.a,
                    b = l.b,
                    lost_ns = lost,
                    "slow link with no measured cost: not a finding"
                );
                continue;
            }
            let c = classify::classify_link(l);
            obs.insert(
                Subject::Link(l.a, l.b),
                observe(c, l.a, Some([l.a, l.b]), lost, saved),
            );
        }
    }

    /// A NIC's or link's observation, at the iteration's start.
    fn transfer_observation(
        &self,
        it: &IterCtx,
        classification: classify::Classification,
        rank: u32,
        link: Option<[u32; 2]>,
        lost_ns: f64,
        saved_ns: Option<f64>,
    ) -> Observation {
        Observation {
            classification,
            rank,
            host: self.host_of(rank),
            link,
            ranks: Vec::new(),
            clock_error_ns: self.max_error_ns(),
            late_ns: 0.0,
            lost_ns,
            exposure_ns: it.exposure,
            saved_ns,
            step_ns: 0.0,
            once_fixed: None,
            alarm: false,
            held: false,
            structural: None,
            at: it.from,
            wall: self.wall(it.from),
        }
    }

    /// Each observed rank whose transfers were measured this iteration:
    /// `Some(true)` where its lateness is its own transfers' (they took
    /// longer than its reference peers' by at least [`TRANSFER_EXPLAINS`]
    /// of it), `Some(false)` where it is not and every transfer of the rank
    /// was measured (an unmeasured pipeline send may hold the rest).
    fn late_by_own_transfers(
        core: &Core,
        bucket: &IterBucket,
        obs: &BTreeMap<Subject, Observation>,
    ) -> HashMap<u32, bool> {
        obs.iter()
            .filter_map(|(k, o)| match *k {
                Subject::Rank(r) if o.late_ns > 0.0 => {
                    let (excess, whole) = transfer_excess(bucket, r, core.stats.peers(r))?;
                    tracing::debug!(
                        rank = r,
                        excess_ns = excess,
                        late_ns = o.late_ns,
                        whole,
                        "own transfers against lateness"
                    );
                    let explained = excess >= TRANSFER_EXPLAINS * o.late_ns;
                    (explained || whole).then_some((r, explained))
                }
                _ => None,
            })
            .collect()
    }

    /// Waits that are another subject's, passed along to it: lateness that
    /// a slow transfer explains, a pipeline neighbour's wait for a rank
    /// that costs the job several times more, a blind partner's wait for a
    /// compute-slow rank, and a whole host's ranks merged into one finding.
    fn pass_waits_to_their_cause(
        &self,
        core: &Core,
        own_transfers: &HashMap<u32, bool>,
        obs: &mut BTreeMap<Subject, Observation>,
    ) {
        drop_passed_into_transfers(obs, core.lifecycle.verdicts(), |r| {
            own_transfers.get(&r) == Some(&true)
        });
        relay_transfer_lateness(obs, core.lifecycle.verdicts(), &core.nic_peers, |r| {
            own_transfers.get(&r) == Some(&false)
        });
        // A pipeline neighbour of a rank that costs the job several times
        // more (named now, or by an active verdict) waits for that rank's
        // sends. Outside a deep window (or across NVLink) a receive has no
        // GPU time, so the wait shows as lateness of its own. It is the
        // other rank's, passed along the pipeline.
        // The neighbour's own one-host partners count too: a stage waits
        // for its neighbour, which waited for its tensor-parallel partner.
        let costs = rank_costs(obs, core.lifecycle.verdicts(), |_| true);
        obs.retain(|k, o| match *k {
            Subject::Rank(r) => !passed_along(
                cost_share(o),
                core.stats
                    .p2p_peers(r)
                    .iter()
                    .flat_map(|q| std::iter::once(q).chain(core.stats.blind_partners(*q)))
                    .filter(|q| **q != r)
                    .filter_map(|q| costs.get(q).copied()),
            ),
            _ => true,
        });
        let compute_active: foldhash::HashSet<u32> = core
            .lifecycle
            .verdicts()
            .filter(|v| v.active && v.kind == classify::Kind::Compute)
            .filter(|v| matches!(v.subject, Subject::Rank(_)))
            .map(|v| v.rank)
            .collect();
        let step = core.iteration.step_ns().unwrap_or(f64::INFINITY);
        let elsewhere: HashMap<u32, Vec<u32>> = obs
            .keys()
            .filter_map(|k| match *k {
                Subject::Rank(r) => Some((r, core.stats.blind_partners_elsewhere(r))),
                _ => None,
            })
            .collect();
        relay_blind_waits(
            obs,
            &Blind {
                partners: |r| elsewhere.get(&r).map_or(&[][..], |v| v.as_slice()),
                incumbent: |r| compute_active.contains(&r),
                gap: |r, q| core.stats.blind_gap(r, q),
                clear_ns: (self.cfg.victims.blind_direction * step)
                    .max(core.stats.config().min_late_ns),
                cfg: self.cfg.victims,
            },
        );
        // Only a host whose every rank is flagged merges: two flagged ranks
        // at least, else the per-rank walk of every host is for nothing
        // (a fifth of an iteration's work at 16,384 ranks).
        if obs.len() >= 2 {
            crate::classify::hostwide::merge(obs, &self.live_ranks_by_host());
        }
    }

    pub(super) fn snapshot(
        &self,
        core: &mut Core,
        id: u64,
        first_it: u64,
        link: Option<[u32; 2]>,
        rank: u32,
    ) {
        let lo = first_it.saturating_sub(1);
        let involves = |a: &AlignedInstance| match link {
            Some([x, y]) => {
                a.members.iter().any(|m| m.rank == x) && a.members.iter().any(|m| m.rank == y)
            }
            None => a.members.iter().any(|m| m.rank == rank),
        };
        let mut entries = 0usize;
        let budget = self.cfg.limits.snapshot_member_entries;
        let snap: Vec<(u64, AlignedInstance)> = core
            .recent
            .iter()
            .filter(|(it, a)| *it >= lo && involves(a))
            .take(self.cfg.limits.snapshot_instances)
            .take_while(|(_, a)| {
                let first = entries == 0;
                entries += a.members.len();
                first || entries <= budget
            })
            .cloned()
            .collect();
        core.snapshots.insert(id, snap);
        while core.snapshots.len() > self.cfg.limits.max_snapshots {
            core.snapshots.pop_first();
        }
    }
}
