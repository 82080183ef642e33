//! Each subject's cost in one iteration, from the what-if
//! ([`crate::graph::whatif`]): what the verdicts report as "costing N% of the job".
//!
//! In: the iteration's replayable model, the subjects observed in it and
//! the active verdicts' subjects. Out: per subject the iteration time it
//! would have saved (ns), or `None` where the what-if cannot see it, and,
//! for a subject hidden behind a bigger straggler, its saving once that one
//! is fixed. Pure.
//!
//! What the what-if can see:
//! - a rank (host- or compute-slow): its own work replaced by its peers'
//!   median. A compute-slow rank's GPU runs behind while its host enqueues
//!   on time, so host-side arrivals do not show it: its cost is only
//!   measured in iterations where its arrivals are GPU-side (deep set).
//!   A rank with tensor-parallel partners on its host waits for them, and
//!   they for it, over NVLink, where nothing is timed: the replay cannot
//!   tell its work from theirs. Where every rank arrives GPU-side at the
//!   collectives across hosts, it is replayed with those partners, the
//!   group at its peers' pace ([`Iteration::groups`]); its largest lead
//!   at the GPU-side collectives it arrived last at (0 where it was at
//!   them but never last: the what-if of that one collective;
//!   [`crate::classify::align::gpu_leads`]) is the floor, and the cost
//!   where the group has no replay. Without either, it is unmeasured,
//!   never 0;
//! - a host-wide finding: every rank of the host replaced at once;
//! - a slow NIC or link: the replay with its instances' transfers at its
//!   peers' rate ([`WhatIf::transfer_cost`]), which the finder measures
//!   (`Observation::saved_ns` on the way in): each excess once, and only
//!   what the step waited for, never times the members (that is the GPU
//!   time lost, `lost_ns`, not the step's).

use foldhash::HashSet;
use std::collections::BTreeMap;

use crate::classify::Kind;
use crate::classify::{Observation, Subject, OFF_CRITICAL_PATH};
use crate::graph::reference::WorkReference;
use crate::graph::whatif::WhatIf;

/// A replay further than this (share of the step) from the iteration it
/// models does not replay it, and costs nothing in it. A healthy
/// iteration's model is its step to within a percent or two; the models
/// off by more were iterations cut across by a deep window's start or end
/// (host-side and GPU-side arrivals in one chain) and pipelines whose
/// instances went to the wrong iteration (random 9241-11, tp2 × pp2 × dp4:
/// every model 1.79× its step, a 21 % GPU costed 13 %). Such a verdict is
/// costed from its other iterations, or estimated from the job's rise.
pub const UNFAITHFUL: f64 = 0.25;

/// One subject to cost: an active verdict's or an observation's.
#[derive(Debug, Clone)]
pub struct Costed {
    pub subject: Subject,
    pub saved_ns: Option<f64>,
    pub once_fixed: Option<(u32, f64)>,
}

/// The iteration's evidence for costing.
pub struct Iteration<'a> {
    pub model: Option<&'a WhatIf>,
    /// Ranks the replay times on the GPU ([`crate::classify::align::gpu_timed_ranks`]).
    pub gpu_ranks: &'a HashSet<u32>,
    /// Per rank, its largest lead at the GPU-side instances it arrived
    /// last at ([`crate::classify::align::gpu_leads`], ns).
    pub gpu_leads: &'a BTreeMap<u32, f64>,
    /// Per rank with one-host partners (a tensor-parallel group), the
    /// group, where every member arrives GPU-side: a slow GPU holds its
    /// partners back at their untimed NVLink collectives, so the group
    /// arrives late as one, and the replay with the whole group at its
    /// peers' pace is the rank's what-if. Its largest lead at one
    /// collective was about half the measured cost on the fresh random set
    /// 4421 (tp4 × dp4 35.7 % for 64.8 %, tp2 × dp4 25.5 % for 52.3 %,
    /// tp4 × dp2 26.1 % for 55.6 %).
    pub groups: &'a BTreeMap<u32, Vec<u32>>,
    /// The iteration's duration (ns).
    pub step_ns: f64,
    /// Each role's work when nobody is slow: where the peers' work is
    /// censored (they waited for the rank), the replay's floor.
    pub reference: Option<&'a WorkReference>,
    /// A clean iteration's length ([`WorkReference::length`]), of either
    /// basis: no what-if is shorter.
    pub clean_ns: Option<f64>,
}

impl Iteration<'_> {
    /// The model, where it replays the iteration as it ran ([`UNFAITHFUL`]).
    fn faithful(&self) -> Option<&WhatIf> {
        self.model
            .filter(|m| (m.length() - self.step_ns).abs() <= UNFAITHFUL * self.step_ns)
    }

    /// The what-if length with `fixed` at its peers' pace, no shorter
    /// than a clean iteration ([`WorkReference::length`]).
    fn length_with(&self, model: &WhatIf, fixed: &[u32]) -> Option<f64> {
        let floor = |s: &[u64]| self.reference.and_then(|r| r.floor(s));
        let with = model.length_with_floor(fixed, &floor)?;
        Some(
            self.clean_ns
                .map_or(with, |c| with.max(c.min(model.length()))),
        )
    }
}

fn ranks_of(subject: Subject, ranks: &[u32]) -> Vec<u32> {
    match subject {
        Subject::Host(_) if !ranks.is_empty() => ranks.to_vec(),
        Subject::Rank(r) | Subject::Host(r) => vec![r],
        // Structural findings are never replayed as one rank.
        _ => Vec::new(),
    }
}

fn saving(
    it: &Iteration<'_>,
    subject: Subject,
    ranks: &[u32],
    kind: Kind,
    transfer_excess_ns: Option<f64>,
) -> Option<f64> {
    match subject {
        Subject::Nic(_) | Subject::Link(..) => transfer_excess_ns,
        Subject::Unknown | Subject::Stage(_) | Subject::Imbalance => None,
        Subject::Rank(_) | Subject::Host(_) => {
            let model = it.faithful()?;
            let fixed = ranks_of(subject, ranks);
            if kind == Kind::Compute && !fixed.iter().any(|r| it.gpu_ranks.contains(r)) {
                // The replay cannot time this GPU alone: with its one-host
                // group where the group is timed, else the one collective
                // that waited for it at a GPU-side arrival.
                return match subject {
                    Subject::Rank(r) => {
                        let lead = it.gpu_leads.get(&r).copied();
                        // The lead is one collective's what-if, a floor
                        // for the group's; a group without peers (a role
                        // of one) has no replay.
                        let group = it.groups.get(&r).and_then(|g| {
                            let with = it.length_with(model, g)?;
                            tracing::trace!(
                                ?subject,
                                ?g,
                                length_ms = model.length() / 1e6,
                                with_ms = with / 1e6,
                                lead_ms = lead.map(|l| l / 1e6),
                                "what-if of a rank with its one-host group"
                            );
                            Some((model.length() - with).max(0.0))
                        });
                        match (group, lead) {
                            (Some(g), Some(l)) => Some(g.max(l)),
                            (g, l) => g.or(l),
                        }
                    }
                    _ => None,
                };
            }
            let with = it.length_with(model, &fixed)?;
            tracing::trace!(
                ?subject,
                length_ms = model.length() / 1e6,
                with_ms = with / 1e6,
                plain_ms = model.length_with(&fixed).map(|w| w / 1e6),
                clean_ms = it.clean_ns.map(|c| c / 1e6),
                step_ms = it.step_ns / 1e6,
                "what-if of a rank"
            );
            Some((model.length() - with).max(0.0))
        }
    }
}

/// Fills `saved_ns`, `step_ns` and `once_fixed` of every observation, and
/// returns the same for the active subjects `active` (subject, its ranks,
/// its class) that have no observation this iteration.
pub fn apply(
    it: &Iteration<'_>,
    obs: &mut BTreeMap<Subject, Observation>,
    active: &[(Subject, Vec<u32>, Kind)],
) -> Vec<Costed> {
    let mut all: Vec<(Subject, Vec<u32>, Option<f64>)> = Vec::new();
    for (s, o) in obs.iter_mut() {
        o.step_ns = it.step_ns;
        if o.structural.is_some() {
            // Costed where it was found (`structure`); not a rank to replay.
            continue;
        }
        // A compute verdict's rank stays a GPU straggler on an iteration
        // whose host-side evidence reads host-bound: host-side arrivals
        // never time its GPU (they measured it 0 on a tp4 job's slow rank).
        let kind = match active.iter().find(|(a, _, _)| a == s) {
            Some((_, _, Kind::Compute)) => Kind::Compute,
            _ => o.classification.kind,
        };
        o.saved_ns = saving(it, *s, &o.ranks, kind, o.saved_ns);
        all.push((*s, ranks_of(*s, &o.ranks), o.saved_ns));
    }
    let mut unobserved: Vec<Costed> = Vec::new();
    for (s, ranks, kind) in active {
        if obs.contains_key(s) {
            continue;
        }
        let saved = saving(it, *s, ranks, *kind, None);
        all.push((*s, ranks_of(*s, ranks), saved));
        unobserved.push(Costed {
            subject: *s,
            saved_ns: saved,
            once_fixed: None,
        });
    }
    // The biggest straggler hides the rest: each of the others is costed
    // again as if it were fixed.
    let biggest = all
        .iter()
        .filter(|(_, r, s)| !r.is_empty() && s.is_some())
        .max_by(|a, b| a.2.unwrap_or(0.0).total_cmp(&b.2.unwrap_or(0.0)))
        .filter(|(_, _, s)| s.unwrap_or(0.0) >= OFF_CRITICAL_PATH * it.step_ns)
        .map(|(s, r, _)| (*s, r.clone()));
    let once_fixed = |s: Subject, ranks: &[u32], saved: Option<f64>| -> Option<(u32, f64)> {
        let (big, big_ranks) = biggest.as_ref()?;
        let model = it.faithful()?;
        if *big == s || ranks.is_empty() || saved? >= OFF_CRITICAL_PATH * it.step_ns {
            return None;
        }
        let mut both = big_ranks.clone();
        let base = it.length_with(model, &both)?;
        both.extend_from_slice(ranks);
        let ns = (base - it.length_with(model, &both)?).max(0.0);
        Some((big_ranks[0], ns))
    };
    for (s, o) in obs.iter_mut() {
        o.once_fixed = once_fixed(*s, &ranks_of(*s, &o.ranks), o.saved_ns);
    }
    for c in &mut unobserved {
        let ranks = all
            .iter()
            .find(|(s, _, _)| *s == c.subject)
            .map(|(_, r, _)| r.clone())
            .unwrap_or_default();
        c.once_fixed = once_fixed(c.subject, &ranks, c.saved_ns);
    }
    unobserved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Classification;
    use crate::graph::whatif::{Arrival, Event, IterGraph};
    use foldhash::HashSetExt;

    const MS: f64 = 1e6;

    fn one_sync(late: &[(u32, f64)]) -> WhatIf {
        let arrivals: Vec<Arrival> = (0..8)
            .map(|r| Arrival {
                rank: r,
                at: 10.0 * MS + late.iter().find(|l| l.0 == r).map_or(0.0, |l| l.1),
                shape: 1,
                busy: None,
                issued: None,
            })
            .collect();
        let end = arrivals.iter().map(|a| a.at).fold(0.0, f64::max) + MS;
        WhatIf::new(&IterGraph {
            start: 0.0,
            stages: Default::default(),
            events: vec![Event { arrivals, end }],
        })
        .unwrap()
    }

    fn obs(rank: u32, kind: Kind) -> Observation {
        Observation {
            classification: Classification {
                confidence: 1.0,
                ..Observation::of(kind, rank).classification
            },
            ..Observation::of(kind, rank)
        }
    }

    #[test]
    fn no_rank_is_costed_below_a_clean_iterations_length() {
        // Rank 2 arrives 6 ms late; at its peers' pace the replay ends at
        // 11 ms, but clean iterations took 15: only 2 ms were its.
        let model = one_sync(&[(2, 6.0 * MS)]);
        let gpu = HashSet::new();
        let cost = |clean_ns: Option<f64>| {
            let it = Iteration {
                model: Some(&model),
                gpu_ranks: &gpu,
                gpu_leads: &BTreeMap::new(),
                groups: &BTreeMap::new(),
                step_ns: 17.0 * MS,
                reference: None,
                clean_ns,
            };
            let mut o = BTreeMap::new();
            o.insert(Subject::Rank(2), obs(2, Kind::Host));
            apply(&it, &mut o, &[]);
            o[&Subject::Rank(2)].saved_ns.unwrap()
        };
        assert!((cost(None) - 6.0 * MS).abs() < 1.0);
        assert!((cost(Some(15.0 * MS)) - 2.0 * MS).abs() < 1.0);
        // A clean length above this iteration's saves nothing, never less.
        assert_eq!(cost(Some(20.0 * MS)), 0.0);
    }

    #[test]
    fn a_model_that_does_not_replay_its_step_costs_nothing() {
        // The replay ends at 17 ms; the iteration took 17 ms, or 30.
        let model = one_sync(&[(2, 6.0 * MS)]);
        let gpu = HashSet::new();
        let saved = |step_ms: f64| {
            let it = Iteration {
                model: Some(&model),
                gpu_ranks: &gpu,
                gpu_leads: &BTreeMap::new(),
                groups: &BTreeMap::new(),
                step_ns: step_ms * MS,
                reference: None,
                clean_ns: None,
            };
            let mut o = BTreeMap::new();
            o.insert(Subject::Rank(2), obs(2, Kind::Host));
            apply(&it, &mut o, &[]);
            o[&Subject::Rank(2)].saved_ns
        };
        assert!((saved(17.0).unwrap() - 6.0 * MS).abs() < 1.0);
        assert_eq!(saved(30.0), None, "a replay 43 % short of its step");
    }

    #[test]
    fn a_hidden_straggler_is_costed_once_the_big_one_is_fixed() {
        let model = one_sync(&[(2, 6.0 * MS), (5, 2.0 * MS)]);
        let gpu = HashSet::new();
        let it = Iteration {
            model: Some(&model),
            gpu_ranks: &gpu,
            gpu_leads: &BTreeMap::new(),
            groups: &BTreeMap::new(),
            step_ns: 17.0 * MS,
            reference: None,
            clean_ns: None,
        };
        let mut o = BTreeMap::new();
        o.insert(Subject::Rank(2), obs(2, Kind::Host));
        o.insert(Subject::Rank(5), obs(5, Kind::Host));
        apply(&it, &mut o, &[]);
        let big = &o[&Subject::Rank(2)];
        assert!((big.saved_ns.unwrap() - 4.0 * MS).abs() < 1.0);
        assert!(big.once_fixed.is_none());
        let small = &o[&Subject::Rank(5)];
        assert_eq!(small.saved_ns, Some(0.0));
        let (who, ns) = small.once_fixed.unwrap();
        assert_eq!(who, 2);
        assert!((ns - 2.0 * MS).abs() < 1.0);
    }

    #[test]
    fn a_compute_suspect_on_host_side_times_is_unmeasured_not_free() {
        let model = one_sync(&[]);
        let none = HashSet::new();
        let it = Iteration {
            model: Some(&model),
            gpu_ranks: &none,
            gpu_leads: &BTreeMap::new(),
            groups: &BTreeMap::new(),
            step_ns: 12.0 * MS,
            reference: None,
            clean_ns: None,
        };
        let mut o = BTreeMap::new();
        o.insert(Subject::Rank(3), obs(3, Kind::Compute));
        let un = apply(&it, &mut o, &[(Subject::Rank(4), vec![4], Kind::Compute)]);
        assert_eq!(o[&Subject::Rank(3)].saved_ns, None);
        assert_eq!(un.len(), 1);
        assert_eq!(un[0].saved_ns, None);
        let gpu: HashSet<u32> = [3].into_iter().collect();
        let it = Iteration {
            gpu_ranks: &gpu,
            gpu_leads: &BTreeMap::new(),
            groups: &BTreeMap::new(),
            ..it
        };
        apply(&it, &mut o, &[]);
        assert_eq!(o[&Subject::Rank(3)].saved_ns, Some(0.0));
    }

    /// A slow NIC in a 16-rank collective makes it 3 ms longer: the step is
    /// 3 ms longer, though 16 members each lost those 3 ms (48 ms of GPU
    /// time). Its cost is the step's, not the members' sum.
    #[test]
    fn a_slow_nic_costs_its_transfer_excess_once() {
        let model = one_sync(&[]);
        let gpu = HashSet::new();
        let it = Iteration {
            model: Some(&model),
            gpu_ranks: &gpu,
            gpu_leads: &BTreeMap::new(),
            groups: &BTreeMap::new(),
            step_ns: 30.0 * MS,
            reference: None,
            clean_ns: None,
        };
        let mut nic = obs(6, Kind::Communication);
        nic.lost_ns = 48.0 * MS;
        nic.saved_ns = Some(3.0 * MS);
        let mut o = BTreeMap::from([(Subject::Nic(6), nic)]);
        apply(&it, &mut o, &[]);
        assert_eq!(o[&Subject::Nic(6)].saved_ns, Some(3.0 * MS));
        // Applied again (a later tick), it stays what the finder measured.
        apply(&it, &mut o, &[]);
        assert_eq!(o[&Subject::Nic(6)].saved_ns, Some(3.0 * MS));
        // An active NIC verdict without an observation this iteration is
        // not measured in it.
        let mut none = BTreeMap::new();
        let un = apply(
            &it,
            &mut none,
            &[(Subject::Nic(6), vec![6], Kind::Communication)],
        );
        assert_eq!(un[0].saved_ns, None);
    }

    #[test]
    fn a_gpu_its_one_host_partners_wait_for_is_costed_with_them() {
        // Ranks 0 and 1 share a host (tensor-parallel, untimed over
        // NVLink); rank 1's GPU is slow, so both reach the all-reduce
        // across hosts 6 ms late, together: rank 1's lead over the
        // next-to-last (rank 0) is almost nothing. Replayed with its
        // partner at their peers' pace, it saves the 6 ms.
        let model = one_sync(&[(0, 5.9 * MS), (1, 6.0 * MS)]);
        let gpu = HashSet::new();
        let leads = BTreeMap::from([(1, 0.1 * MS)]);
        let cost = |groups: &BTreeMap<u32, Vec<u32>>| {
            let it = Iteration {
                model: Some(&model),
                gpu_ranks: &gpu,
                gpu_leads: &leads,
                groups,
                step_ns: 17.0 * MS,
                reference: None,
                clean_ns: None,
            };
            let mut o = BTreeMap::new();
            o.insert(Subject::Rank(1), obs(1, Kind::Compute));
            apply(&it, &mut o, &[]);
            o[&Subject::Rank(1)].saved_ns.unwrap()
        };
        assert!((cost(&BTreeMap::new()) - 0.1 * MS).abs() < 1.0);
        let groups = BTreeMap::from([(1, vec![0, 1])]);
        assert!((cost(&groups) - 6.0 * MS).abs() < 1.0, "{}", cost(&groups));
    }
}
