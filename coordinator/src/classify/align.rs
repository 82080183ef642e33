//! Aligning one joined instance: its members' arrivals and exits on one
//! clock and one basis, and each member's lateness against the median.
//!
//! An instance's *arrival basis* is GPU-side when every member reported
//! `gpu_arrive_ns`, else host-side entry for all members: mixing the two would
//! make the members with GPU times look late (the host runs ahead of its GPU),
//! so like is compared with like. GPU-side lateness is still computed over the
//! subset that has it, as extra evidence. Lateness is arrival minus the median
//! arrival; each member waits for the last arrival. Anything within the
//! instance's clock error bound (zero when all members share a host clock) is
//! not evidence and is counted as zero.

use std::sync::Arc;

use crate::clock::CoordNs;
use crate::join::{InstanceKey, JoinedInstance};
use crate::robust::median;
use slowrank_shared::wire::CollOp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Basis {
    Gpu,
    Host,
}

#[derive(Debug, Clone)]
pub struct AlignedMember {
    pub rank: u32,
    pub host: Arc<str>,
    pub host_entry: CoordNs,
    pub host_exit: CoordNs,
    pub gpu_arrive: Option<CoordNs>,
    pub gpu_done: Option<CoordNs>,
    pub sync_wait_ns: u64,
    pub launches: u32,
    /// GPU time in the rank's own kernels since its previous collective,
    /// when the source recorded kernels ([`CollectiveRecord`]'s field).
    pub gpu_busy_ns: Option<u64>,
    pub ret: i32,
}

/// One instance on the coordinator's clock, with its lateness and waits.
#[derive(Debug, Clone)]
pub struct AlignedInstance {
    pub comm_id: u64,
    pub key: InstanceKey,
    pub op: CollOp,
    /// Payload (the first member's; every member passes the same count).
    pub bytes: u64,
    pub comm_nranks: u32,
    pub members: Vec<AlignedMember>,
    pub basis: Basis,
    pub arrival: Vec<CoordNs>,
    pub lateness: Vec<f64>,
    pub host_lateness: Vec<f64>,
    pub gpu_lateness: Vec<Option<f64>>,
    pub wait: Vec<f64>,
    pub last: usize,
    /// Largest clock error bound of a member's comparison with the median
    /// (ns).
    pub err_ns: f64,
    /// Per member: clock error bound of its comparison with the median
    /// (its host's bound plus the median host bound; 0 on one host).
    pub member_err: Vec<f64>,
    /// Median arrival.
    pub start: CoordNs,
    /// Median completion if known, else last arrival.
    pub end: CoordNs,
    /// Median completion minus last arrival: the transfer itself.
    pub transfer_ns: Option<f64>,
}

fn med_i(v: &[CoordNs]) -> f64 {
    let mut f: Vec<f64> = v.iter().map(|x| *x as f64).collect();
    median(&mut f).unwrap_or(0.0)
}

/// Quantile of member clock bounds taken as the bound of the median
/// arrival (see `align`).
const MEDIAN_ERR_QUANTILE: f64 = 0.875;

/// The value at quantile `q` (nearest rank, rounded up) of `v`.
fn upper_quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    let k = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    let (_, x, _) = s.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
    *x
}

fn dead_zone(x: f64, err: f64) -> f64 {
    if x.abs() <= err {
        0.0
    } else {
        x
    }
}

/// Each member's error bound against the median arrival.
///
/// Two hosts each off by their bound can disagree by the sum. Member i is
/// compared with the median arrival: its error is its own host's bound plus
/// how far the median can be off. Members whose hosts have worse bounds
/// than the 87.5th percentile are too few to move the median far, so that
/// percentile bounds it: with a few hosts it is the worst host's bound (as
/// strict as it gets), and one host with a bad bound in a 512-host job (a
/// loaded agent's noisy probes) does not blind the comparisons of the 4,088
/// ranks elsewhere. On one host the clocks are the same clock: no error.
fn member_errors(own_err: &[f64], one_host: bool) -> Vec<f64> {
    if one_host {
        return vec![0.0; own_err.len()];
    }
    let median_err = upper_quantile(own_err, MEDIAN_ERR_QUANTILE);
    own_err.iter().map(|e| e + median_err).collect()
}

/// Each member's wait for the last arrival (member `last`). A wait compares
/// two members: both hosts' bounds.
fn waits(arrival: &[CoordNs], own_err: &[f64], one_host: bool, last: usize) -> Vec<f64> {
    let last_arrival = arrival.get(last).copied().unwrap_or(0);
    let last_own = if one_host {
        0.0
    } else {
        own_err.get(last).copied().unwrap_or(0.0)
    };
    arrival
        .iter()
        .zip(own_err)
        // In f64: garbage times aligned to opposite ends of i64 would overflow.
        .map(|(a, e)| {
            let err = if one_host { 0.0 } else { e + last_own };
            dead_zone(last_arrival as f64 - *a as f64, err)
        })
        .collect()
}

/// The instance's members on the coordinator's clock, each one's own
/// clock error bound, and whether they all are on one host.
fn aligned_members(
    inst: &JoinedInstance,
    clock: &impl Fn(&str, u64) -> (CoordNs, f64),
) -> (Vec<AlignedMember>, Vec<f64>, bool) {
    let mut own_err: Vec<f64> = Vec::with_capacity(inst.members.len());
    let mut one_host = true;
    let members: Vec<AlignedMember> = inst
        .members
        .iter()
        .map(|m| {
            let (host_entry, e) = clock(&m.host, m.rec.host_entry_ns);
            own_err.push(e);
            one_host &= inst.members.first().is_some_and(|f| f.host == m.host);
            let al = |t: u64| (t != 0).then(|| clock(&m.host, t).0);
            AlignedMember {
                rank: m.rank,
                host: m.host.clone(),
                host_entry,
                host_exit: al(m.rec.host_exit_ns).unwrap_or(host_entry),
                gpu_arrive: al(m.rec.gpu_arrive_ns),
                gpu_done: al(m.rec.gpu_done_ns),
                sync_wait_ns: m.rec.sync_wait_ns_before,
                launches: m.rec.launches_before,
                gpu_busy_ns: m.rec.gpu_busy_before_ns,
                ret: m.rec.ret,
            }
        })
        .collect();
    (members, own_err, one_host)
}

/// Per member, its host-side and GPU-side lateness against the median of
/// each (within its clock error bound: 0).
fn side_lateness(members: &[AlignedMember], member_err: &[f64]) -> (Vec<f64>, Vec<Option<f64>>) {
    let host_arr: Vec<CoordNs> = members.iter().map(|m| m.host_entry).collect();
    let host_med = med_i(&host_arr);
    let gpus: Vec<CoordNs> = members.iter().filter_map(|m| m.gpu_arrive).collect();
    let gpu_med = (gpus.len() >= 2).then(|| med_i(&gpus));
    let host_lateness = host_arr
        .iter()
        .zip(member_err)
        .map(|(a, e)| dead_zone(*a as f64 - host_med, *e))
        .collect();
    let gpu_lateness = members
        .iter()
        .zip(member_err)
        .map(|(m, e)| match (m.gpu_arrive, gpu_med) {
            (Some(g), Some(gm)) => Some(dead_zone(g as f64 - gm, *e)),
            _ => None,
        })
        .collect();
    (host_lateness, gpu_lateness)
}

/// Aligns an instance; `clock(host, agent_ns)` gives `(coordinator ns, error bound ns)`.
pub fn align(
    inst: &JoinedInstance,
    clock: &impl Fn(&str, u64) -> (CoordNs, f64),
) -> AlignedInstance {
    let (members, own_err, one_host) = aligned_members(inst, clock);
    let member_err = member_errors(&own_err, one_host);
    let err_ns = member_err.iter().copied().fold(0.0, f64::max);
    let all_gpu = members.iter().all(|m| m.gpu_arrive.is_some());
    let basis = if all_gpu { Basis::Gpu } else { Basis::Host };
    let arrival: Vec<CoordNs> = match basis {
        Basis::Gpu => members
            .iter()
            .map(|m| m.gpu_arrive.unwrap_or(m.host_entry))
            .collect(),
        Basis::Host => members.iter().map(|m| m.host_entry).collect(),
    };
    let med = med_i(&arrival);
    let last_arrival = *arrival.iter().max().unwrap_or(&0);
    let last = arrival.iter().position(|a| *a == last_arrival).unwrap_or(0);
    let lateness = arrival
        .iter()
        .zip(&member_err)
        .map(|(a, e)| dead_zone(*a as f64 - med, *e))
        .collect();
    let (host_lateness, gpu_lateness) = side_lateness(&members, &member_err);
    let wait = waits(&arrival, &own_err, one_host, last);
    let dones: Vec<CoordNs> = members.iter().filter_map(|m| m.gpu_done).collect();
    let (end, transfer_ns) = if dones.len() == members.len() && basis == Basis::Gpu {
        let d = med_i(&dones);
        (d as CoordNs, Some((d - last_arrival as f64).max(0.0)))
    } else {
        (last_arrival, None)
    };
    AlignedInstance {
        comm_id: inst.comm_id,
        key: inst.key,
        op: inst.op,
        bytes: inst.members.first().map_or(0, |m| m.rec.bytes),
        comm_nranks: inst.comm_nranks,
        members,
        basis,
        arrival,
        lateness,
        host_lateness,
        gpu_lateness,
        wait,
        last,
        err_ns,
        member_err,
        start: med as CoordNs,
        end,
        transfer_ns,
    }
}

/// Per rank of the iteration's GPU-side instances, its largest lead over
/// the next-to-last arriver (less the comparison's clock error bound) at
/// those it arrived last at, 0 if none (ns): the what-if of that one collective,
/// had the rank arrived with the others. It costs a rank the replay
/// cannot time ([`gpu_timed_ranks`]): a slow GPU of a tensor-parallel
/// group whose data-parallel collectives cross hosts. On random 3119-12
/// (tp2 pp2 dp4 on 8 hosts, rank 2's GPU 2.25× slower) it costed the
/// verdict 40% against 43% measured; the sum over the iteration's
/// instances, counted with the transfers, was 125% (each microbatch's
/// transfer waits on the same delay again). On 3119-2 (same layout) 14%
/// against 28%: the delay also holds the pipeline, which one collective
/// does not show.
pub fn gpu_leads(instances: &[&AlignedInstance]) -> std::collections::BTreeMap<u32, f64> {
    let mut out: std::collections::BTreeMap<u32, f64> = Default::default();
    // Collectives only: at a send/receive the receiver posts early and
    // the sender arrives "last" by its own compute, whoever is slow (on
    // random 3119-11, tp2 pp2 dp2 with only the pipeline across hosts,
    // every rank led its transfers by 70–220 ms at the median).
    for a in instances.iter().filter(|a| {
        a.basis == Basis::Gpu
            && a.members.len() >= 2
            && matches!(a.key, crate::join::InstanceKey::Coll(_))
    }) {
        // Every member of a GPU-side instance has a lead, 0 where it was
        // never last: a rank last in a few iterations of a job whose
        // slowest rank changes (work imbalance) would otherwise be costed
        // on those alone (random 3119-11: 27% for a rank measured at 4.9%).
        for m in &a.members {
            out.entry(m.rank).or_insert(0.0);
        }
        let Some(last) = a.arrival.get(a.last) else {
            continue;
        };
        let next = a
            .arrival
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != a.last)
            .map(|(_, t)| *t)
            .max();
        let Some(next) = next else { continue };
        let lead = ((*last as i128 - next as i128) as f64 - a.err_ns).max(0.0);
        let e = out.entry(a.members[a.last].rank).or_insert(0.0);
        *e = e.max(lead);
    }
    out
}

/// The ranks whose GPU an iteration's instances time: those every instance
/// of which had GPU-side arrivals. A tensor-parallel all-reduce over
/// NVLink has host-side times only, and the replay then saw a slow GPU in
/// a tp4 group as a few percent of a step it doubled (random 3119-0: 2.8%
/// reported, 53% measured). A rank with one-host partners (`blind`) is
/// never GPU-timed: it waits for them, and they for it, over NVLink, where
/// nothing is; an iteration whose tensor-parallel instances fell outside
/// it looked fully timed, and the replay put a 28% straggler of a tp2
/// group at 0 (random 3119-2).
pub fn gpu_timed_ranks(
    instances: &[&AlignedInstance],
    blind: impl Fn(u32) -> bool,
) -> foldhash::HashSet<u32> {
    let mut host_side: foldhash::HashSet<u32> = Default::default();
    let mut gpu_side: foldhash::HashSet<u32> = Default::default();
    for a in instances {
        let set = if a.basis == Basis::Gpu {
            &mut gpu_side
        } else {
            &mut host_side
        };
        set.extend(a.members.iter().map(|m| m.rank));
    }
    gpu_side
        .difference(&host_side)
        .copied()
        .filter(|r| !blind(*r))
        .collect()
}

/// An iteration's GPU-side instances, where what has no GPU-side time is
/// blind only by placement: every host-side instance has all its members
/// on one host (a pipeline's or a replica group's traffic over NVLink,
/// where no verbs probe sees the GPU arrive), and every rank of the
/// iteration arrives GPU-side somewhere. A host-side instance across hosts
/// means the deep window does not cover the iteration, and its times are
/// the hosts' (a host that ran ahead looks like work): `None`. A rank's
/// work then spans the blind instances between its GPU-side arrivals,
/// waits there included, so a rule that reads work from this set must
/// compare ranks that share their blind instances (replicas of one
/// pipeline stage) and see them all slow, not one.
pub fn gpu_side_across_hosts<'a>(
    instances: &[&'a AlignedInstance],
) -> Option<Vec<&'a AlignedInstance>> {
    let mut timed: foldhash::HashSet<u32> = Default::default();
    let mut all: foldhash::HashSet<u32> = Default::default();
    for a in instances {
        all.extend(a.members.iter().map(|m| m.rank));
        if a.basis == Basis::Gpu {
            timed.extend(a.members.iter().map(|m| m.rank));
        } else if a.members.windows(2).any(|w| w[0].host != w[1].host) {
            return None;
        }
    }
    let gpu: Vec<&AlignedInstance> = instances
        .iter()
        .copied()
        .filter(|a| a.basis == Basis::Gpu)
        .collect();
    (!gpu.is_empty() && all.is_subset(&timed)).then_some(gpu)
}

/// A rank's GPU work in an iteration where it is seen whole
/// ([`seen_gpu_work`]), per pair of its instances in a row (in issue
/// order), keyed by the two instances' keys within their communicators:
/// a replica's corresponding pair has the same keys in its own
/// communicators (its own pipeline's sends, numbered alike).
pub type SeenWork = std::collections::BTreeMap<(InstanceKey, InstanceKey), f64>;

/// Each rank's GPU work where it is seen whole: from the completion of one
/// of its GPU-side instances to its GPU-side arrival at the next one it
/// issued. A pair with a blind instance between them is left out: the gap
/// holds the blind instance's wait (a replica group's all-reduce over
/// NVLink waits for its slowest member), and read as work it made the
/// healthy partner of a 1.3× slower GPU look as slow as the rank itself
/// (pp4 × dp2, a stage a host: a false "stage slower on every replica").
/// Pairs follow the rank's issue order (host entry), the order its stream
/// runs them in. A pair is left out too where the GPU may have waited for
/// its host: a host sync between them (the GPU drained and idled while the
/// host loaded the next batch: in pp4 × dp2 a 31-ms gap at the step
/// boundary, 30% of a stage's seen work), or the host issuing the second
/// after the first completed (the kernels between may have come late: a
/// host-slow rank's gap, not its GPU's work).
pub fn seen_gpu_work(instances: &[&AlignedInstance]) -> std::collections::BTreeMap<u32, SeenWork> {
    struct At {
        entry: CoordNs,
        key: InstanceKey,
        gpu: bool,
        arrival: CoordNs,
        done: CoordNs,
        /// No host sync since the rank's previous collective.
        no_sync: bool,
    }
    let mut per: std::collections::BTreeMap<u32, Vec<At>> = Default::default();
    for a in instances {
        for (m, t) in a.members.iter().zip(&a.arrival) {
            per.entry(m.rank).or_default().push(At {
                entry: m.host_entry,
                key: a.key,
                gpu: a.basis == Basis::Gpu,
                arrival: *t,
                done: a.end.max(*t),
                no_sync: m.sync_wait_ns == 0,
            });
        }
    }
    per.into_iter()
        .map(|(r, mut v)| {
            v.sort_by_key(|x| x.entry);
            let seen: SeenWork = v
                .windows(2)
                .filter(|w| w[0].gpu && w[1].gpu && w[1].no_sync && w[1].entry < w[0].done)
                .map(|w| {
                    let work = (w[1].arrival as f64 - w[0].done as f64).max(0.0);
                    ((w[0].key, w[1].key), work)
                })
                .collect();
            (r, seen)
        })
        .collect()
}

/// Pairs two replicas must both see for their work to be compared.
const MIN_SEEN_PAIRS: usize = 3;

/// How much more `a` worked than `b` where both were seen whole: the sum
/// of `a`'s work over `b`'s, on the pairs both see (the same keys: the
/// same work on two replicas; the sum weighs the long segments, where a
/// slower GPU shows). `None` with fewer than [`MIN_SEEN_PAIRS`] pairs in
/// common. Comparing each rank's own total instead named the healthy
/// replica of a slow rank (pp4 × dp2, one GPU 1.38× slower): the slow
/// one's late sends fell into the next iteration, so the two saw
/// different pairs; by position in the iteration they were one apart.
pub fn seen_ratio(a: &SeenWork, b: &SeenWork) -> Option<f64> {
    let (mut sa, mut sb, mut n) = (0.0, 0.0, 0usize);
    for (k, x) in a {
        if let Some(y) = b.get(k) {
            sa += x;
            sb += y;
            n += 1;
        }
    }
    (n >= MIN_SEEN_PAIRS && sb > 0.0).then_some(sa / sb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join::{JoinedInstance, Member};
    use slowrank_shared::wire::CollectiveRecord;

    /// A member: (rank, host, host entry, GPU arrival (0: none), GPU
    /// completion (0: none), sync wait before).
    type M = (u32, &'static str, u64, u64, u64, u64);

    fn inst(members: &[M]) -> AlignedInstance {
        let j = JoinedInstance {
            comm_id: 1,
            key: InstanceKey::Coll(0),
            comm_nranks: members.len() as u32,
            op: CollOp::AllReduce,
            bytes: 0,
            members: members
                .iter()
                .enumerate()
                .map(|(i, (rank, host, entry, gpu, done, sync))| Member {
                    rank: *rank,
                    rank_in_comm: i as u32,
                    host: Arc::from(*host),
                    rec: CollectiveRecord {
                        pid: 0,
                        rank: *rank,
                        comm_id: 1,
                        seq: 0,
                        op: CollOp::AllReduce,
                        bytes: 0,
                        peer: -1,
                        host_entry_ns: *entry,
                        host_exit_ns: *entry,
                        gpu_arrive_ns: *gpu,
                        gpu_done_ns: *done,
                        launches_before: 0,
                        sync_wait_ns_before: *sync,
                        gpu_busy_before_ns: None,
                        ret: 0,
                    },
                })
                .collect(),
        };
        align(&j, &|_, t| (t as i64, 0.0))
    }

    #[test]
    fn blind_instances_within_one_host_leave_the_gpu_side_ones() {
        let across = inst(&[(0, "a", 10, 100, 150, 0), (2, "b", 10, 120, 150, 0)]);
        let within = inst(&[(0, "a", 20, 0, 0, 0), (1, "a", 20, 0, 0, 0)]);
        let other = inst(&[(1, "a", 10, 110, 160, 0), (3, "b", 10, 130, 160, 0)]);
        let got = gpu_side_across_hosts(&[&across, &within, &other]).expect("blind by placement");
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|a| a.basis == Basis::Gpu));
    }

    #[test]
    fn a_host_side_instance_across_hosts_or_an_unseen_rank_is_no_gpu_side_iteration() {
        let across = inst(&[(0, "a", 10, 100, 150, 0), (2, "b", 10, 120, 150, 0)]);
        let host_side_across = inst(&[(0, "a", 20, 0, 0, 0), (2, "b", 20, 0, 0, 0)]);
        assert!(gpu_side_across_hosts(&[&across, &host_side_across]).is_none());
        // Rank 1 is never seen GPU-side.
        let within = inst(&[(0, "a", 20, 0, 0, 0), (1, "a", 20, 0, 0, 0)]);
        assert!(gpu_side_across_hosts(&[&across, &within]).is_none());
    }

    #[test]
    fn seen_work_skips_pairs_around_a_blind_instance_or_a_host_sync() {
        // Rank 0 issues g1, g2, blind, g3, g4 (sync before it), g5; rank 1
        // is its peer in every instance, rank 0 arrives on its own time.
        let g = |entry, arrive, done, sync| AlignedInstance {
            key: InstanceKey::Coll(entry),
            ..inst(&[
                (0, "a", entry, arrive, done, sync),
                (1, "b", entry, arrive, done, 0),
            ])
        };
        let g1 = g(1, 100, 200, 0);
        let g2 = g(2, 1_200, 1_300, 0);
        let blind = AlignedInstance {
            key: InstanceKey::Coll(3),
            ..inst(&[(0, "a", 3, 0, 0, 0), (9, "a", 3, 0, 0, 0)])
        };
        let g3 = g(4, 9_000, 9_100, 0);
        let g4 = g(5, 20_000, 20_100, 5_000);
        let g5 = g(6, 20_600, 20_700, 0);
        // Its host issued g6 only after g5 completed.
        let g6 = g(20_800, 21_000, 21_100, 0);
        let all = [&g5, &g3, &g1, &blind, &g4, &g2, &g6];
        let w = seen_gpu_work(&all);
        // g1→g2 (1,000) and g4→g5 (500); g2→blind→g3 span the blind one,
        // g3→g4 a sync, and g5→g6 may have waited for the host.
        let work: Vec<f64> = w[&0].values().copied().collect();
        assert_eq!(work, vec![1_000.0, 500.0]);
        // Rank 9 is only in the blind instance: nothing seen.
        assert!(w[&9].is_empty());
    }

    #[test]
    fn replicas_compare_on_the_pairs_both_see() {
        let k = |i: u64| (InstanceKey::Coll(i), InstanceKey::Coll(i + 1));
        let work = |v: &[(u64, f64)]| -> SeenWork { v.iter().map(|(i, w)| (k(*i), *w)).collect() };
        let a = work(&[(0, 10.0), (2, 20.0), (3, 30.0), (4, 1.0)]);
        let b = work(&[(0, 8.0), (1, 50.0), (2, 16.0), (3, 24.0)]);
        // Pairs 0, 2, 3: 60 against 48.
        assert_eq!(seen_ratio(&a, &b), Some(1.25));
        // Too few pairs in common: no comparison.
        let c = work(&[(1, 50.0), (2, 16.0), (4, 3.0)]);
        assert_eq!(seen_ratio(&a, &c), None);
    }
}
