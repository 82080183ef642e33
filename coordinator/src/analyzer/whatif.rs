//! The iteration's what-if (DESIGN.md §5): its replayable model, each
//! last arriver's share of the step for the sequential test, the costs of
//! the iteration's observations, and the clean pace they are costed
//! against. In: an iteration's aligned instances; out: savings (ns).

use super::*;

impl Analyzer {
    /// Keeps the instances of each verdict that opened, for its evidence.
    /// A verdict opened (or reopened) at `k`: the `lag` iterations before
    /// it were its own detection's, slow already though nobody was named
    /// in them, so no pace is learned from them
    /// ([`crate::graph::reference::WorkReference::forget_from`]). The
    /// lag is the window rule's (`open_window`): the sequential test names
    /// a costly straggler sooner.
    pub(super) fn forget_lagged_clean(core: &mut Core, k: u64, events: &[VerdictEvent], lag: u64) {
        let opened = events.iter().any(|e| {
            matches!(e.event, EventKind::Opened | EventKind::Reopened) && e.verdict.is_some()
        });
        if opened {
            for r in &mut core.work_reference {
                r.forget_from(k.saturating_sub(lag));
            }
        }
    }

    /// Iteration `k` (which began at `from`) as a replayable what-if model,
    /// and what its GPU-side arrivals time.
    pub(super) fn iteration_model(
        core: &Core,
        k: u64,
        from: CoordNs,
    ) -> (Option<crate::graph::whatif::WhatIf>, GpuTiming) {
        if from == CoordNs::MIN {
            return (None, GpuTiming::default());
        }
        let instances: Vec<&AlignedInstance> = core
            .recent
            .iter()
            .filter(|(it, _)| *it == k)
            .map(|(_, a)| a)
            .collect();
        let ranks = crate::classify::align::gpu_timed_ranks(&instances, |r| {
            !core.stats.blind_partners(r).is_empty()
        });
        let gpu = GpuTiming {
            groups: one_host_groups(&instances, &ranks, |r| core.stats.blind_partners(r)),
            ranks,
            leads: crate::classify::align::gpu_leads(&instances),
        };
        let model = crate::graph::whatif::WhatIf::new(&crate::graph::itergraph::build(
            from,
            instances.into_iter(),
        ));
        match &model {
            None => tracing::debug!(iteration = k, "no what-if model for the iteration"),
            Some(m) => {
                tracing::trace!(iteration = k, length_ms = m.length() / 1e6, "what-if model")
            }
        }
        (model, gpu)
    }

    /// Feeds the iteration's what-if savings to the per-rank sequential
    /// test; returns the ranks in alarm. Only an instance's last arriver
    /// can be on the critical path, so only those are replayed (at most
    /// [`MAX_REPLAYED`], the furthest behind first).
    pub(super) fn sequential_test(
        core: &mut Core,
        model: Option<&crate::graph::whatif::WhatIf>,
        step: f64,
    ) -> (foldhash::HashSet<u32>, BTreeMap<u32, f64>) {
        let shares = model.map_or_else(BTreeMap::new, |m| what_if_shares(m, step));
        let alarms = core.sequential.update(&shares).into_iter().collect();
        if model.is_some() {
            core.rotation.observe(&shares);
        }
        if let Some((r, x)) = shares.iter().max_by(|a, b| a.1.total_cmp(b.1)) {
            tracing::debug!(
                rank = r,
                share = x,
                cusum = core.sequential.sum(*r),
                "costliest rank of the iteration (what-if)"
            );
        }
        (alarms, shares)
    }

    /// Costs the iteration for every observed subject and active verdict
    /// (`whatif`, `cost`). Returns the active verdicts' costs that have no
    /// observation this iteration.
    pub(super) fn what_if(
        core: &Core,
        model: Option<&crate::graph::whatif::WhatIf>,
        gpu: &GpuTiming,
        step: f64,
        obs: &mut BTreeMap<Subject, Observation>,
    ) -> Vec<crate::graph::cost::Costed> {
        let active: Vec<(Subject, Vec<u32>, classify::Kind)> = core
            .lifecycle
            .verdicts()
            .filter(|v| v.active)
            .map(|v| {
                let ranks = if v.ranks.is_empty() {
                    vec![v.rank]
                } else {
                    v.ranks.clone()
                };
                (v.subject, ranks, v.kind)
            })
            .collect();
        if obs.is_empty() && active.is_empty() {
            return Vec::new();
        }
        let reference = &core.work_reference[gpu.basis()];
        // A clean iteration's length is the job's pace whatever timed it:
        // a deep window first opened by the fault itself has no clean
        // GPU-side iteration, and without this bound the peers' censored
        // work costed a 1.3x GPU 48% of the job against 22% measured
        // (latency sweep, seed 7).
        let clean_ns = reference
            .length()
            .or_else(|| core.work_reference[1 - gpu.basis()].length());
        let it = crate::graph::cost::Iteration {
            model,
            gpu_ranks: &gpu.ranks,
            gpu_leads: &gpu.leads,
            groups: &gpu.groups,
            step_ns: step,
            reference: Some(reference),
            clean_ns,
        };
        crate::graph::cost::apply(&it, obs, &active)
    }
}

/// Each of the iteration's last arrivers' what-if saving, as a share of
/// the step (at most [`MAX_REPLAYED`], the furthest behind first): only a
/// last arriver can be on the critical path.
fn what_if_shares(m: &crate::graph::whatif::WhatIf, step: f64) -> BTreeMap<u32, f64> {
    let mut shares = BTreeMap::new();
    if step.is_finite() && step > 0.0 {
        let mut last: Vec<(u32, f64)> = m.last_arrivers().into_iter().collect();
        last.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (r, _) in last.into_iter().take(MAX_REPLAYED) {
            if let Some(c) = m.cost(r) {
                shares.insert(r, c / step);
            }
        }
    }
    shares
}

/// What an iteration's GPU-side arrivals time: the ranks the replay times
/// ([`crate::classify::align::gpu_timed_ranks`]) and each rank's largest
/// lead where it arrived last ([`crate::classify::align::gpu_leads`]).
#[derive(Debug, Default)]
pub(super) struct GpuTiming {
    ranks: foldhash::HashSet<u32>,
    leads: BTreeMap<u32, f64>,
    /// Blind ranks → their one-host group ([`crate::graph::cost::Iteration::groups`]).
    groups: BTreeMap<u32, Vec<u32>>,
}

/// A rank the replay cannot time alone (its one-host partners wait for it
/// over NVLink, untimed; not in `timed`) → its group (itself and those
/// partners), where every rank of the iteration arrives GPU-side at every
/// collective across hosts (the deep window covers the iteration); empty
/// otherwise.
fn one_host_groups<'a>(
    instances: &[&AlignedInstance],
    timed: &foldhash::HashSet<u32>,
    partners: impl Fn(u32) -> &'a [u32],
) -> BTreeMap<u32, Vec<u32>> {
    if crate::classify::align::gpu_side_across_hosts(instances).is_none() {
        return BTreeMap::new();
    }
    let mut all: Vec<u32> = instances
        .iter()
        .flat_map(|a| a.members.iter().map(|m| m.rank))
        .collect();
    all.sort_unstable();
    all.dedup();
    all.into_iter()
        .filter(|r| !timed.contains(r))
        .filter_map(|r| {
            let p = partners(r);
            (!p.is_empty()).then(|| {
                let mut g: Vec<u32> = p.to_vec();
                g.push(r);
                g.sort_unstable();
                (r, g)
            })
        })
        .collect()
}

impl GpuTiming {
    /// Which of `Core::work_reference` the iteration learns from and is
    /// costed against: 1 where its arrivals are GPU-side, 0 host-side.
    pub(super) fn basis(&self) -> usize {
        usize::from(!self.ranks.is_empty())
    }
}
