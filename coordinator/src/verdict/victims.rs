//! Victims, not roots: rules that hand a finding to its cause.
//!
//! The wait graph explains a rank's lateness by the waits it measured. Some
//! waits have no GPU-side time at all (tensor parallel over NVLink, a
//! pipeline receive outside the deep set, a transfer stretched by a slow
//! NIC), so the rank waiting there looks late on its own. These rules run
//! on one iteration's observations, before the verdict lifecycle, and drop
//! such victims — handing their cost to the cause where it is named.

use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;

use crate::classify;
use crate::verdict::{Observation, Subject};

/// Share of the job's GPU time an observation says its subject cost.
pub(crate) fn cost_share(o: &Observation) -> f64 {
    if o.exposure_ns > 0.0 {
        o.lost_ns / o.exposure_ns
    } else {
        0.0
    }
}

/// Each rank's share of the job lost, as observed in this iteration or by
/// its active verdict (the larger), for ranks whose class passes `kind`.
pub(crate) fn rank_costs<'a>(
    obs: &BTreeMap<Subject, Observation>,
    verdicts: impl Iterator<Item = &'a crate::verdict::Verdict>,
    kind: impl Fn(classify::Kind) -> bool,
) -> HashMap<u32, f64> {
    let mut costs: HashMap<u32, f64> = HashMap::new();
    for (k, o) in obs {
        if let (Subject::Rank(r), true) = (*k, kind(o.classification.kind)) {
            costs.insert(r, cost_share(o));
        }
    }
    for v in verdicts {
        if v.active && kind(v.kind) && matches!(v.subject, Subject::Rank(_)) {
            let c = costs.entry(v.rank).or_insert(0.0);
            *c = c.max(v.cost_fraction);
        }
    }
    costs
}

/// A compute-slow rank's GPU reaches each collective late, and its peers'
/// transfers to it wait for it: its links look slow. A link or NIC costing
/// [`PASSED_ALONG_RATIO`] times less than a compute-slow end of it (observed
/// now, or by an active verdict) is that lateness passed into transfers.
/// Unless that end's lateness is its own transfers' (`own_transfers`: its
/// instances' transfers took longer than its peers' by most of its
/// lateness): a rank behind a slow NIC receives and sends late, so its GPU
/// reaches the next collective late and looks compute-slow, and the rule
/// would drop its NIC for the lateness the NIC caused (random 4242-45: a
/// NIC at 13 % bandwidth, the job 12.7 % slower, "no slow rank found").
pub(crate) fn drop_passed_into_transfers<'a>(
    obs: &mut BTreeMap<Subject, Observation>,
    verdicts: impl Iterator<Item = &'a crate::verdict::Verdict>,
    own_transfers: impl Fn(u32) -> bool,
) {
    let mut compute = rank_costs(obs, verdicts, |k| k == classify::Kind::Compute);
    compute.retain(|r, _| !own_transfers(*r));
    obs.retain(|k, o| {
        let ends = match *k {
            Subject::Nic(r) => vec![r],
            Subject::Link(a, b) => vec![a, b],
            _ => return true,
        };
        let keep = !passed_along(
            cost_share(o),
            ends.iter().filter_map(|r| compute.get(r).copied()),
        );
        if !keep {
            tracing::debug!(subject = ?k, "slow transfers of a compute-slow rank: not a link finding");
        }
        keep
    });
}

/// How many times more a pipeline neighbour must cost for a rank's own
/// cost to count as passed along from it.
const PASSED_ALONG_RATIO: f64 = 4.0;

/// Whether a rank costing `mine` only relays the lateness of a pipeline
/// neighbour costing one of `neighbours`.
pub(crate) fn passed_along(mine: f64, mut neighbours: impl Iterator<Item = f64>) -> bool {
    neighbours.any(|c| c > 0.0 && c >= PASSED_ALONG_RATIO * mine)
}

/// A rank on a slow link or NIC finishes its transfers late, and so do the
/// peers it transfers with (a ring all-reduce runs at its slowest link):
/// their GPUs reach the next collectives late, and that lateness is the
/// communication fault's, not a second (compute or host) one. Named links
/// and NICs count whether seen in this iteration or by an active verdict
/// (their verbs evidence comes and goes with the traffic). The GPU time
/// lost to the dropped ranks goes to the NIC or link seen now (the largest
/// one: the victims wait side by side, not one after another). A rank with
/// both faults is named for its link until the link recovers, unless its
/// lateness is measured not to be its transfers' (`not_transfers`: its own
/// transfers took no longer than its peers' by half its lateness, so it is
/// late on its own): a NIC slow in bursts and a host fault on the same rank
/// (random 6317-7) are then both named, and the NIC's verdict does not
/// swallow the host fault between its bursts.
pub(crate) fn relay_transfer_lateness<'a>(
    obs: &mut BTreeMap<Subject, Observation>,
    verdicts: impl Iterator<Item = &'a crate::verdict::Verdict>,
    nic_peers: &HashMap<u32, Vec<u32>>,
    not_transfers: impl Fn(u32) -> bool,
) {
    let own_end = |s: Subject, r: u32| match s {
        Subject::Nic(n) => n == r,
        Subject::Link(a, b) => a == r || b == r,
        _ => false,
    };
    let ends = |s: Subject| -> Vec<u32> {
        match s {
            Subject::Nic(r) => std::iter::once(r)
                .chain(nic_peers.get(&r).into_iter().flatten().copied())
                .collect(),
            Subject::Link(a, b) => vec![a, b],
            _ => Vec::new(),
        }
    };
    let mut owner: HashMap<u32, Subject> = HashMap::new();
    for v in verdicts.filter(|v| v.active) {
        for r in ends(v.subject) {
            owner.insert(r, v.subject);
        }
    }
    for k in obs.keys() {
        for r in ends(*k) {
            owner.insert(r, *k);
        }
    }
    let mut relayed: HashMap<Subject, f64> = HashMap::new();
    obs.retain(|k, o| match *k {
        Subject::Rank(r) => match owner.get(&r) {
            Some(s) if own_end(*s, r) && not_transfers(r) => true,
            Some(s) => {
                let m = relayed.entry(*s).or_default();
                *m = m.max(o.lost_ns);
                false
            }
            None => true,
        },
        _ => true,
    });
    for (s, lost) in relayed {
        if let Some(o) = obs.get_mut(&s) {
            o.lost_ns += lost;
        }
    }
}

/// How one-host partners' waits are told apart (the `[victims]` table of a
/// thresholds file; see [`relay_blind_waits`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VictimsConfig {
    /// Share of the step by which one partner must, on average, arrive
    /// after the other on the one-host communicator they share for that to
    /// tell who waits for whom. Each rank's lateness on its own reference
    /// communicator does not: a rank waiting over NVLink for its slow
    /// partner reaches a data-parallel all-reduce later than its slow
    /// partner reaches its own (random 2027-18, tp4 on one host: the
    /// victims 525 ms late per iteration, the slow rank 48 ms, and the
    /// finding went to a victim).
    pub blind_direction: f64,
    /// Where the shared communicator does not tell: how much later than a
    /// rank (on their own reference communicators) its one-host partner
    /// must be for the rank's own lateness to count as waiting for that
    /// partner. A host slow as a whole keeps its ranks within it of each
    /// other, so they stay for the host-wide merge.
    pub blind_wait_ratio: f64,
    /// How much later than a partner with an active compute verdict a rank
    /// must be to take the finding from it, or to be named beside it: a
    /// named straggler keeps its finding against a victim's noise.
    pub incumbent_ratio: f64,
}

impl Default for VictimsConfig {
    fn default() -> Self {
        Self {
            blind_direction: 0.01,
            blind_wait_ratio: 1.15,
            incumbent_ratio: 1.5,
        }
    }
}

/// What tells a rank's one-host partners apart: who they are, whether one
/// has an active compute verdict, and how much later a partner arrives
/// than the rank on the communicator they share (smoothed, ns; positive:
/// the rank waits for it) — told only where it is at least `clear_ns`.
pub(crate) struct Blind<P, I, G> {
    pub partners: P,
    pub incumbent: I,
    pub gap: G,
    pub clear_ns: f64,
    pub cfg: VictimsConfig,
}

impl<'a, P, I, G> Blind<P, I, G>
where
    P: Fn(u32) -> &'a [u32],
    I: Fn(u32) -> bool,
    G: Fn(u32, u32) -> Option<f64>,
{
    /// How much later `q` arrives than `r` where they meet, when that is
    /// clear (at least `clear_ns` either way).
    fn told(&self, r: u32, q: u32) -> Option<f64> {
        (self.gap)(r, q).filter(|g| g.abs() >= self.clear_ns)
    }

    /// The partner named rank `r` (observed as `o`) waited for, if any:
    /// the one it clearly arrives before where they meet; else, where that
    /// is not clear, one named later on its own; else an incumbent compute
    /// verdict's rank. `late` holds each named rank's lateness.
    fn cause_of(&self, r: u32, o: &Observation, late: &HashMap<u32, f64>) -> Option<u32> {
        let compute = o.classification.kind == classify::Kind::Compute;
        let mine = o.late_ns.max(0.0);
        let partners = (self.partners)(r);
        let waited_for = partners
            .iter()
            .filter_map(|q| self.told(r, *q).filter(|g| *g > 0.0).map(|g| (*q, g)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((q, _)) = waited_for {
            return Some(q);
        }
        let ratio = if compute && (self.incumbent)(r) {
            self.cfg.incumbent_ratio
        } else {
            self.cfg.blind_wait_ratio
        };
        let later = partners
            .iter()
            .filter(|q| self.told(r, **q).is_none())
            .filter_map(|q| late.get(q).map(|l| (*q, *l)))
            .filter(|(_, l)| *l > 0.0 && *l >= ratio * mine)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((q, _)) = later {
            return Some(q);
        }
        if !compute || (self.incumbent)(r) {
            return None;
        }
        partners.iter().copied().find(|q| {
            (self.incumbent)(*q)
                && self.told(r, *q).is_none()
                && late
                    .get(q)
                    .is_none_or(|l| mine < self.cfg.incumbent_ratio * l)
        })
    }
}

/// Tensor-parallel partners inside one host synchronise over NVLink, where
/// no GPU-side time exists: a rank that waited there for a slow partner
/// reaches the next inter-host collective late and looks like a straggler
/// of its own. Who waited for whom shows on the communicator they share:
/// the slow one arrives there after the others (it also runs slow between
/// the syncs). A named rank whose partner clearly arrives after it there
/// (`blind_direction`) is dropped, and the GPU time lost to it goes to
/// that partner — named in its place if nothing else named it. A partner
/// clearly arriving before it is never its cause.
///
/// Where the shared communicator does not tell (the two within noise), a
/// partner named too and later on its own reference communicator
/// (`blind_wait_ratio`) takes the finding; a host slow as a whole keeps its
/// ranks within the ratio of each other, so they stay for the host-wide
/// merge. A partner already named compute-slow by an active verdict keeps
/// the finding unless the other is `incumbent_ratio` later.
pub(crate) fn relay_blind_waits<'a, P, I, G>(
    obs: &mut BTreeMap<Subject, Observation>,
    blind: &Blind<P, I, G>,
) where
    P: Fn(u32) -> &'a [u32],
    I: Fn(u32) -> bool,
    G: Fn(u32, u32) -> Option<f64>,
{
    let late: HashMap<u32, f64> = obs
        .iter()
        .filter_map(|(k, o)| match *k {
            Subject::Rank(r) => Some((r, o.late_ns)),
            _ => None,
        })
        .collect();
    let mut moved: Vec<(u32, u32, f64)> = Vec::new();
    for (k, o) in obs.iter() {
        let Subject::Rank(r) = *k else { continue };
        if let Some(q) = blind.cause_of(r, o, &late) {
            moved.push((r, q, o.lost_ns));
        }
    }
    // The latest of a group keeps its finding: it is later than each of the
    // others, so it is never moved itself.
    for (r, q, lost) in moved {
        let Some(mut o) = obs.remove(&Subject::Rank(r)) else {
            continue;
        };
        match obs.get_mut(&Subject::Rank(q)) {
            Some(t) => t.lost_ns += lost,
            // The partner was not named on its own: its lateness on its
            // reference communicator is its own tail only. It is named with
            // the victim's evidence of what the wait cost.
            None => {
                let Some(gap) = blind.told(r, q) else {
                    continue;
                };
                o.classification.evidence.insert(
                    0,
                    format!(
                        "its one-host partner rank {r} waits for it: rank {q} arrives {:.2} ms \
                         after rank {r} on the communicator they share, and rank {r}'s lateness \
                         elsewhere is this wait passed on",
                        gap / 1e6
                    ),
                );
                o.rank = q;
                obs.insert(Subject::Rank(q), o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observation(kind: classify::Kind, rank: u32, cost: f64) -> Observation {
        Observation {
            lost_ns: cost * 1e9,
            exposure_ns: 1e9,
            ..Observation::of(kind, rank)
        }
    }

    #[test]
    fn links_of_a_much_costlier_compute_straggler_are_its_lateness() {
        use classify::Kind::{Communication, Compute, Host};
        let mut obs = BTreeMap::from([
            (Subject::Rank(5), observation(Compute, 5, 0.30)),
            (Subject::Link(2, 5), observation(Communication, 2, 0.05)),
            (Subject::Link(0, 7), observation(Communication, 0, 0.05)),
            (Subject::Nic(5), observation(Communication, 5, 0.10)),
        ]);
        let before = obs.clone();
        drop_passed_into_transfers(&mut obs, std::iter::empty(), |_| false);
        let keys: Vec<Subject> = obs.keys().copied().collect();
        // 2↔5 at 5% beside 30% goes; 0↔7 does not touch rank 5; the NIC
        // at 10% is not 4× cheaper.
        assert_eq!(
            keys,
            vec![Subject::Rank(5), Subject::Nic(5), Subject::Link(0, 7)]
        );
        // Rank 5 late by its own slow transfers: its links stay.
        let mut obs = before;
        drop_passed_into_transfers(&mut obs, std::iter::empty(), |r| r == 5);
        assert_eq!(obs.len(), 4);
        // A host-slow end does not explain slow transfers.
        let mut obs = BTreeMap::from([
            (Subject::Rank(5), observation(Host, 5, 0.30)),
            (Subject::Link(2, 5), observation(Communication, 2, 0.05)),
        ]);
        drop_passed_into_transfers(&mut obs, std::iter::empty(), |_| false);
        assert_eq!(obs.len(), 2);
    }

    #[test]
    fn ring_neighbours_of_a_slow_nic_are_its_victims() {
        use classify::Kind::{Communication, Compute};
        // tp4-dp4: rank 6's NIC at 30%; its ring neighbours 2 and 10 finish
        // their all-reduces late and looked compute-slow.
        let nic_peers: HashMap<u32, Vec<u32>> = [(6, vec![2, 10])].into_iter().collect();
        let mut obs = BTreeMap::from([
            (Subject::Nic(6), observation(Communication, 6, 0.04)),
            (Subject::Rank(2), observation(Compute, 2, 0.16)),
            (Subject::Rank(10), observation(Compute, 10, 0.14)),
            (Subject::Rank(3), observation(Compute, 3, 0.05)),
        ]);
        relay_transfer_lateness(&mut obs, std::iter::empty(), &nic_peers, |_| false);
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(3), Subject::Nic(6)]);
        assert!((cost_share(&obs[&Subject::Nic(6)]) - 0.20).abs() < 1e-9);
        // An iteration without verbs evidence: the active verdict still
        // speaks for its NIC, so rank 6 itself is not a compute finding.
        let mut lc = crate::verdict::Lifecycle::new(crate::verdict::LifecycleConfig {
            warmup_iterations: 0,
            ..Default::default()
        });
        for it in 0..10 {
            let nic = observation(Communication, 6, 0.04);
            lc.step(it, BTreeMap::from([(Subject::Nic(6), nic)]));
        }
        assert!(lc.verdicts().any(|v| v.active));
        let mut obs = BTreeMap::from([
            (Subject::Rank(6), observation(Compute, 6, 0.2)),
            (Subject::Rank(10), observation(Compute, 10, 0.2)),
        ]);
        relay_transfer_lateness(&mut obs, lc.verdicts(), &nic_peers, |_| false);
        assert!(obs.is_empty());
    }

    #[test]
    fn a_tensor_parallel_partner_of_a_later_rank_only_waited_for_it() {
        // tp2-pp2-dp4: rank 9's GPU is slow; its partner 8 waits for it in
        // every tensor-parallel all-reduce and arrives 132 vs 163 ms late.
        let mut obs = BTreeMap::from([
            late(8, 132.0, 0.12),
            late(9, 163.0, 0.22),
            late(3, 40.0, 0.05),
        ]);
        let partners = |r: u32| -> &'static [u32] {
            match r {
                8 => &[9],
                9 => &[8],
                _ => &[],
            }
        };
        relay_blind_waits(&mut obs, &untold(partners, |_| false));
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(3), Subject::Rank(9)]);
        let nine = &obs[&Subject::Rank(9)];
        assert!(
            (cost_share(nine) - 0.34).abs() < 1e-9,
            "{}",
            cost_share(nine)
        );
        // A host slow as a whole: partners within the ratio both stay.
        let mut obs = BTreeMap::from([late(8, 150.0, 0.2), late(9, 160.0, 0.2)]);
        relay_blind_waits(&mut obs, &untold(partners, |_| false));
        assert_eq!(obs.len(), 2);
        // Rank 9 already has an active compute verdict; later on its partner
        // reaches the sync later by chance (139 vs 101 ms, seen in
        // tp2-pp2-dp4): it stays the relay.
        let mut obs = BTreeMap::from([late(8, 139.0, 0.15), late(9, 101.0, 0.25)]);
        relay_blind_waits(&mut obs, &untold(partners, |r| r == 9));
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(9)]);
        // Named alone while the incumbent is quiet this iteration: still held.
        let mut obs = BTreeMap::from([late(8, 110.0, 0.15)]);
        relay_blind_waits(&mut obs, &untold(partners, |r| r == 9));
        assert!(obs.is_empty());
        // Far later than the incumbent: the finding moves.
        let mut obs = BTreeMap::from([late(8, 160.0, 0.15), late(9, 101.0, 0.25)]);
        relay_blind_waits(&mut obs, &untold(partners, |r| r == 9));
        assert_eq!(obs.len(), 1);
        assert!(obs.contains_key(&Subject::Rank(8)));
    }

    /// A compute observation of `rank`, `late_ms` late, costing `cost`.
    fn late(rank: u32, late_ms: f64, cost: f64) -> (Subject, Observation) {
        let mut o = observation(classify::Kind::Compute, rank, cost);
        o.late_ns = late_ms * 1e6;
        (Subject::Rank(rank), o)
    }

    type Untold = fn(u32, u32) -> Option<f64>;

    /// Partners whose shared communicator tells nothing of who waits.
    fn untold<P, I>(partners: P, incumbent: I) -> Blind<P, I, Untold> {
        Blind {
            partners,
            incumbent,
            gap: |_, _| None,
            clear_ns: 1e6,
            cfg: VictimsConfig::default(),
        }
    }

    #[test]
    fn the_partner_a_rank_waits_for_on_their_shared_communicator_is_its_cause() {
        // tp4 on one host (random 2027-18): rank 2's GPU is slow; ranks 0,
        // 1 and 3 wait for it in every tensor-parallel all-reduce, reach
        // their data-parallel all-reduces 525 ms late, while rank 2 is 48 ms
        // late on its own reference communicator, 24 ms after the others on
        // the shared one.
        let group: &'static [u32] = &[0, 1, 2, 3];
        let partners = |r: u32| -> &'static [u32] {
            match r {
                0..=3 => group,
                _ => &[],
            }
        };
        let arrives = |r: u32| if r == 2 { 24e6 } else { 0.5e6 * f64::from(r) };
        let blind = |incumbent: fn(u32) -> bool| Blind {
            partners,
            incumbent,
            gap: move |r: u32, q: u32| (r != q && r < 4 && q < 4).then(|| arrives(q) - arrives(r)),
            clear_ns: 6.5e6,
            cfg: VictimsConfig::default(),
        };
        let mut obs = BTreeMap::from([
            late(0, 525.0, 0.10),
            late(1, 520.0, 0.10),
            late(3, 521.0, 0.10),
            late(2, 48.0, 0.02),
        ]);
        relay_blind_waits(&mut obs, &blind(|_| false));
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(2)]);
        assert!((cost_share(&obs[&Subject::Rank(2)]) - 0.32).abs() < 1e-9);
        // Not named on its own: named in the victims' place, with why.
        let mut obs = BTreeMap::from([late(0, 525.0, 0.10), late(3, 521.0, 0.10)]);
        relay_blind_waits(&mut obs, &blind(|_| false));
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(2)]);
        let two = &obs[&Subject::Rank(2)];
        assert_eq!(two.rank, 2);
        assert!((cost_share(two) - 0.20).abs() < 1e-9);
        assert!(two.classification.evidence[0].contains("waits for it"));
        // A victim with an active verdict does not hold the finding either:
        // the shared communicator says who waited.
        let mut obs = BTreeMap::from([late(0, 525.0, 0.10), late(2, 48.0, 0.02)]);
        relay_blind_waits(&mut obs, &blind(|r| r == 0));
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(2)]);
        // Within the noise (0.5 ms apart, told from 6.5 ms): the late ratio
        // decides, as before, and ranks 0 and 1 both stay.
        let near = Blind {
            partners,
            incumbent: |_| false,
            gap: |r: u32, q: u32| Some(0.5e6 * (f64::from(q) - f64::from(r))),
            clear_ns: 6.5e6,
            cfg: VictimsConfig::default(),
        };
        let mut obs = BTreeMap::from([late(0, 150.0, 0.2), late(1, 160.0, 0.2)]);
        relay_blind_waits(&mut obs, &near);
        assert_eq!(obs.len(), 2);
        let mut obs = BTreeMap::from([late(0, 150.0, 0.2), late(1, 200.0, 0.2)]);
        relay_blind_waits(&mut obs, &near);
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(1)]);
    }

    #[test]
    fn a_pipeline_neighbour_of_a_much_costlier_rank_only_relays_it() {
        // pp4-dp2: rank 5 host-slow costing 40 % of the job; its next stage
        // waits for its sends and looked "compute-slow" costing 3 %.
        assert!(passed_along(0.03, [0.40].into_iter()));
        // Two real faults of similar cost on neighbouring stages stay two.
        assert!(!passed_along(0.15, [0.40].into_iter()));
        // No neighbour named, or one that costs nothing: nothing to relay.
        assert!(!passed_along(0.03, std::iter::empty()));
        assert!(!passed_along(0.0, [0.0].into_iter()));
    }
}
