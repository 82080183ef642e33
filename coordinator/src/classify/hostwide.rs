//! Host-wide findings: every rank of one host late together is one finding.
//!
//! On a real cluster the commonest straggler is a node, not a rank: its CPUs
//! throttled or shared, its GPUs power-capped, its clock estimate off. Its
//! ranks then all arrive late by similar amounts, and naming each of them
//! (eight verdicts, eight alerts) hides the one thing the on-call engineer
//! needs: drain that node. So when every live rank of a host is flagged in
//! an iteration, and some rank elsewhere is not, the rank observations of
//! that host become one [`Subject::Host`] observation: the costliest rank
//! speaks for it (its class and evidence), the costs add up, and the
//! evidence says which ranks and how late.

use std::collections::BTreeMap;

use crate::classify::fmt_ns;
use crate::classify::{Observation, Subject};

/// Replaces the rank observations of hosts whose every rank is flagged by
/// one host observation. `hosts`: the live ranks of each host.
pub fn merge(obs: &mut BTreeMap<Subject, Observation>, hosts: &BTreeMap<String, Vec<u32>>) {
    let flagged = |r: &u32| obs.contains_key(&Subject::Rank(*r));
    // Somebody must be on time, or there is nothing to compare with.
    let anyone_clean = hosts.values().flatten().any(|r| !flagged(r));
    if !anyone_clean {
        return;
    }
    let whole: Vec<&Vec<u32>> = hosts
        .values()
        .filter(|ranks| ranks.len() >= 2 && ranks.iter().all(flagged))
        .collect();
    for ranks in whole {
        let mut members: Vec<Observation> = ranks
            .iter()
            .filter_map(|r| obs.remove(&Subject::Rank(*r)))
            .collect();
        members.sort_by(|a, b| b.lost_ns.total_cmp(&a.lost_ns));
        let lost: f64 = members.iter().map(|o| o.lost_ns).sum();
        let mut lead = members[0].clone();
        let late: Vec<f64> = members.iter().map(|o| o.late_ns).collect();
        let (lo, hi) = late
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
                (l.min(*x), h.max(*x))
            });
        let mut ranks = ranks.clone();
        ranks.sort_unstable();
        lead.classification.evidence.insert(
            0,
            format!(
                "all {} ranks on {} ({}) arrive late together, {}–{} per iteration: a host-wide cause (the node's CPUs, its GPUs' power or clocks, or its clock estimate, bound {}), not one rank; rank {} costs the most",
                ranks.len(),
                lead.host,
                ranks
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                fmt_ns(lo),
                fmt_ns(hi),
                fmt_ns(lead.clock_error_ns),
                lead.rank
            ),
        );
        // The fast path is for one GPU behind; a node is judged 6 of 8.
        lead.classification.gpu_side = false;
        lead.lost_ns = lost;
        lead.clock_error_ns = members.iter().map(|o| o.clock_error_ns).fold(0.0, f64::max);
        lead.ranks = ranks.clone();
        obs.insert(Subject::Host(ranks[0]), lead);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{Classification, Kind};

    fn o(rank: u32, host: &str, lost_ms: f64) -> Observation {
        let plain = Observation::of(Kind::Host, rank);
        Observation {
            classification: Classification {
                evidence: vec![format!("rank {rank}")],
                gpu_side: true,
                ..plain.classification
            },
            host: host.into(),
            clock_error_ns: 1e5,
            lost_ns: lost_ms * 1e6,
            late_ns: lost_ms * 1e5,
            exposure_ns: 1e9,
            ..plain
        }
    }

    fn hosts() -> BTreeMap<String, Vec<u32>> {
        BTreeMap::from([
            ("node-0".to_string(), vec![0, 1, 2, 3]),
            ("node-1".to_string(), vec![4, 5, 6, 7]),
        ])
    }

    #[test]
    fn every_rank_of_one_host_late_is_one_host_finding() {
        let mut obs: BTreeMap<Subject, Observation> = [4, 5, 6, 7, 1]
            .into_iter()
            .map(|r| {
                let host = if r < 4 { "node-0" } else { "node-1" };
                (Subject::Rank(r), o(r, host, 10.0 + f64::from(r)))
            })
            .collect();
        merge(&mut obs, &hosts());
        let keys: Vec<Subject> = obs.keys().copied().collect();
        assert_eq!(keys, vec![Subject::Rank(1), Subject::Host(4)]);
        let h = &obs[&Subject::Host(4)];
        assert_eq!(h.rank, 7, "the costliest rank speaks for the host");
        assert_eq!(h.ranks, vec![4, 5, 6, 7]);
        assert!((h.lost_ns - 62e6).abs() < 1.0, "costs add up");
        assert!(!h.classification.gpu_side);
        assert!(h.classification.evidence[0].starts_with("all 4 ranks on node-1 (4, 5, 6, 7)"));
    }

    #[test]
    fn part_of_a_host_or_everyone_is_left_alone() {
        // Three of four ranks: each is its own finding.
        let mut obs: BTreeMap<Subject, Observation> = [4, 5, 6]
            .into_iter()
            .map(|r| (Subject::Rank(r), o(r, "node-1", 10.0)))
            .collect();
        merge(&mut obs, &hosts());
        assert_eq!(obs.len(), 3);
        // Every rank everywhere: no host stands out.
        let mut obs: BTreeMap<Subject, Observation> = (0..8)
            .map(|r| (Subject::Rank(r), o(r, "node", 10.0)))
            .collect();
        merge(&mut obs, &hosts());
        assert_eq!(obs.len(), 8);
        // A host with one rank is that rank.
        let one = BTreeMap::from([("a".to_string(), vec![0]), ("b".to_string(), vec![1])]);
        let mut obs = BTreeMap::from([(Subject::Rank(0), o(0, "a", 10.0))]);
        merge(&mut obs, &one);
        assert!(obs.contains_key(&Subject::Rank(0)));
    }
}
