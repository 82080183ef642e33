use std::sync::Arc;

use slowrank_shared::wire::CollOp;

use crate::join::JoinedInstance;

use super::*;
use crate::join::Member;
use slowrank_shared::wire::CollectiveRecord;

fn inst(arrivals: &[(u32, &str, u64, u64)]) -> JoinedInstance {
    JoinedInstance {
        comm_id: 1,
        key: InstanceKey::Coll(0),
        comm_nranks: arrivals.len() as u32,
        op: CollOp::AllReduce,
        bytes: 0,
        members: arrivals
            .iter()
            .enumerate()
            .map(|(i, (rank, host, host_entry, gpu))| Member {
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
                    host_entry_ns: *host_entry,
                    host_exit_ns: *host_entry,
                    gpu_arrive_ns: *gpu,
                    gpu_done_ns: 0,
                    launches_before: 0,
                    sync_wait_ns_before: 0,
                    gpu_busy_before_ns: None,
                    ret: 0,
                },
            })
            .collect(),
    }
}

#[test]
fn host_basis_when_any_member_lacks_gpu_time() {
    let i = inst(&[(0, "a", 100, 900), (1, "a", 110, 0), (2, "a", 120, 1000)]);
    let a = align(&i, &|_, t| (t as i64, 0.0));
    assert_eq!(a.basis, Basis::Host);
    assert_eq!(a.last, 2);
    assert_eq!(a.wait, vec![20.0, 10.0, 0.0]);
    assert_eq!(a.gpu_lateness[0], Some(-50.0));
    assert_eq!(a.gpu_lateness[1], None);
}

#[test]
fn lateness_within_clock_error_is_not_evidence() {
    let i = inst(&[(0, "a", 1_000, 0), (1, "b", 1_030, 0), (2, "b", 5_000, 0)]);
    // Hosts a and b each ±20 ns: comparisons across them ±40 ns.
    let a = align(&i, &|_, t| (t as i64, 20.0));
    assert_eq!(a.err_ns, 40.0);
    assert_eq!(a.lateness[0], 0.0); // -30 is within the bound
    assert_eq!(a.lateness[2], 3_970.0);
}

#[test]
fn each_member_is_judged_with_its_own_host_bound_plus_the_median_bound() {
    let bound = |h: &str| match h {
        "a" => 10.0,
        "b" => 30.0,
        "c" => 20.0,
        _ => 5.0,
    };
    let i = inst(&[
        (0, "a", 1, 0),
        (1, "b", 1, 0),
        (2, "b", 1, 0),
        (3, "a", 1, 0),
        (4, "c", 1, 0),
        (5, "b", 1, 0),
        (6, "d", 1, 0),
    ]);
    let a = align(&i, &|h, t| (t as i64, bound(h)));
    // Seven members: the 87.5th percentile is the largest bound, 30.
    assert_eq!(a.member_err, vec![40.0, 60.0, 60.0, 40.0, 50.0, 60.0, 35.0]);
    assert_eq!(a.err_ns, 60.0);
    let i = inst(&[(0, "b", 1, 0), (1, "b", 1, 0)]);
    assert_eq!(align(&i, &|h, t| (t as i64, bound(h))).err_ns, 0.0);
}

#[test]
fn one_host_with_a_bad_clock_bound_does_not_hide_a_late_rank_elsewhere() {
    // 64 ranks on 16 hosts; host 15 has a 2 ms bound, the others
    // 10 µs; rank 9 (host 2) is 500 µs late.
    let hosts: Vec<String> = (0..16).map(|h| format!("h{h}")).collect();
    let arr: Vec<(u32, &str, u64, u64)> = (0..64u32)
        .map(|r| {
            let t = if r == 9 { 1_500_000 } else { 1_000_000 };
            (r, hosts[(r / 4) as usize].as_str(), t, 0)
        })
        .collect();
    let bound = |h: &str| if h == "h15" { 2_000_000.0 } else { 10_000.0 };
    let a = align(&inst(&arr), &|h, t| (t as i64, bound(h)));
    assert_eq!(a.lateness[9], 500_000.0);
    assert_eq!(a.member_err[9], 20_000.0);
    assert_eq!(a.member_err[63], 2_010_000.0);
    // With two hosts the median can be off by the worse one's bound.
    let i = inst(&[
        (0, "h0", 1, 0),
        (1, "h0", 1, 0),
        (2, "h15", 1, 0),
        (3, "h15", 1, 0),
    ]);
    let a = align(&i, &|h, t| (t as i64, bound(h)));
    assert_eq!(a.member_err[0], 2_010_000.0);
}

/// Eight ranks, four instances; per-instance host lateness (µs) of each
/// rank and its sync wait before the first instance.
fn noisy_iteration(late_us: &[[i64; 4]; 8], sync_us: &[u64; 8]) -> (Stats, IterBucket) {
    let mut st = Stats::new(StatsConfig::default());
    for b in 0..4u64 {
        let mut i = inst(
            &(0..8u32)
                .map(|r| {
                    (
                        r,
                        "a",
                        (1_000_000 + late_us[r as usize][b as usize] * 1_000) as u64,
                        0,
                    )
                })
                .collect::<Vec<_>>(),
        );
        i.key = InstanceKey::Coll(b);
        for m in &mut i.members {
            m.rec.sync_wait_ns_before = if b == 0 {
                sync_us[m.rank as usize] * 1_000
            } else {
                0
            };
        }
        st.add(&align(&i, &|_, t| (t as i64, 0.0)), 0);
    }
    let b = st.take_sealed(0).remove(0).1;
    (st, b)
}

#[test]
fn host_root_is_found_through_scheduling_noise() {
    // Peers jump by up to 20 ms (descheduled hosts on a loaded machine),
    // so a MAD z-score cannot single rank 2 out; but it is last every
    // time, 9 ms late on average (20% of a 45 ms step) and its GPU
    // drained: syncs 9 ms shorter than its peers'.
    let late = [
        [-7_000, -8_000, -6_000, -9_000],
        [-20_000, -1_000, 500, 2_000],
        [9_000, 9_500, 8_500, 9_200],
        [3_000, -15_000, 1_000, -4_000],
        [6_000, 2_000, -3_000, 4_000],
        [-2_000, 5_000, 6_000, -12_000],
        [1_000, 3_000, -9_000, 5_000],
        [-4_000, 1_000, 2_000, 1_000],
    ];
    let sync = [
        25_000, 24_000, 16_000, 26_000, 25_000, 24_500, 25_500, 25_000,
    ];
    let (mut st, b) = noisy_iteration(&late, &sync);
    let s = st.score(0, &b, 45e6);
    let sus: Vec<u32> = s.iter().filter(|x| x.suspicious).map(|x| x.rank).collect();
    assert_eq!(sus, vec![2], "{s:#?}");
    // The same lateness with a GPU still busy (syncs as long as the
    // peers'): its host ran ahead of a busy GPU, nobody waited on it.
    let (mut st, b) = noisy_iteration(&late, &[25_000; 8]);
    let s = st.score(0, &b, 45e6);
    assert!(s.iter().all(|x| !x.suspicious), "{s:#?}");
}

#[test]
fn extreme_aligned_times_do_not_overflow() {
    // Found by the analyzer_ingest fuzz target: one member aligned far
    // below zero, another saturated at i64::MAX.
    let i = inst(&[(0, "a", 1, 0), (1, "a", u64::MAX, 0)]);
    let a = align(&i, &|_, t| {
        (if t == 1 { i64::MIN + 5 } else { i64::MAX }, 0.0)
    });
    assert_eq!(a.last, 1);
    assert!(a.wait[0] > 1e18 && a.wait[1] == 0.0, "{:?}", a.wait);
}

#[test]
fn spearman_extremes() {
    assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-9);
    assert!((spearman(&[1.0, 2.0, 3.0], &[30.0, 20.0, 10.0]) + 1.0).abs() < 1e-9);
}

/// tp2 × dp2 inside one host: rank 1 arrives 5 ms after rank 0 on their
/// tensor-parallel communicator; the data-parallel ones (the reference
/// communicators, by comm id) are compared directly.
#[test]
fn one_host_partners_are_told_apart_on_the_communicator_they_share() {
    let mut s = Stats::new(StatsConfig::default());
    let on = |comm: u64, ranks: [(u32, u64); 2]| {
        let mut i = inst(&[
            (ranks[0].0, "a", ranks[0].1, 0),
            (ranks[1].0, "a", ranks[1].1, 0),
        ]);
        i.comm_id = comm;
        align(&i, &|_, t| (t as i64, 0.0))
    };
    for k in 0..10 {
        let t = 1_000_000_000 * k;
        // Data parallel: {0, 2} and {1, 3}, comm ids 1 and 2.
        s.add(&on(1, [(0, t + 40_000_000), (2, t)]), k);
        s.add(&on(2, [(1, t + 45_000_000), (3, t)]), k);
        // Tensor parallel: {0, 1} and {2, 3}, comm ids 7 and 8.
        s.add(&on(7, [(0, t), (1, t + 5_000_000)]), k);
        s.add(&on(8, [(2, t), (3, t)]), k);
    }
    assert_eq!(s.peers(0), &[0, 2]);
    assert_eq!(s.blind_partners_elsewhere(0), vec![1]);
    assert_eq!(s.blind_partners_elsewhere(2), vec![3]);
    let gap = s.blind_gap(0, 1).expect("they share comm 7");
    assert!((gap - 5e6).abs() < 1.0, "{gap}");
    assert_eq!(s.blind_gap(1, 0), Some(-gap));
    assert_eq!(s.blind_gap(0, 3), None);
}

/// A rank is GPU-timed in an iteration only if all its instances were:
/// its tensor-parallel all-reduce inside one host has host-side times.
#[test]
fn a_rank_with_one_host_side_instance_is_not_gpu_timed() {
    let clock = |_: &str, t: u64| (t as i64, 0.0);
    // Data parallel across hosts, every member GPU-timed.
    let dp = align(&inst(&[(0, "a", 100, 150), (2, "b", 100, 160)]), &clock);
    let dp2 = align(&inst(&[(1, "a", 100, 150), (3, "b", 100, 160)]), &clock);
    // Tensor parallel {0, 1} inside host a: host-side only.
    let tp = align(&inst(&[(0, "a", 100, 0), (1, "a", 100, 0)]), &clock);
    assert_eq!(dp.basis, Basis::Gpu);
    assert_eq!(tp.basis, Basis::Host);
    let timed = |insts: &[&AlignedInstance], blind: &[u32]| {
        let mut v: Vec<u32> = super::super::align::gpu_timed_ranks(insts, |r| blind.contains(&r))
            .into_iter()
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(timed(&[&dp, &dp2, &tp], &[]), vec![2, 3]);
    assert_eq!(timed(&[&dp, &dp2], &[]), vec![0, 1, 2, 3]);
    // The iteration holds no tensor-parallel instance of ranks 0 and 1, but
    // they have one-host partners: still not timed.
    assert_eq!(timed(&[&dp, &dp2], &[0, 1]), vec![2, 3]);
}

/// A rank's lead is read at the GPU-side instances it arrived last at:
/// the largest one, over the next-to-last arriver; a member never last
/// leads by 0; host-side instances say nothing.
#[test]
fn a_ranks_gpu_lead_is_its_largest_over_the_next_to_last() {
    let clock = |_: &str, t: u64| (t as i64, 0.0);
    let dp = align(
        &inst(&[(0, "a", 100, 150), (2, "b", 100, 190), (4, "c", 100, 160)]),
        &clock,
    );
    let dp2 = align(
        &inst(&[(0, "a", 100, 440), (2, "b", 100, 420), (4, "c", 100, 300)]),
        &clock,
    );
    let dp3 = align(
        &inst(&[(0, "a", 100, 500), (2, "b", 100, 510), (4, "c", 100, 480)]),
        &clock,
    );
    // Rank 1 arrives 800 ns after rank 0, host-side.
    let tp = align(&inst(&[(0, "a", 100, 0), (1, "a", 900, 0)]), &clock);
    assert_eq!(tp.basis, Basis::Host);
    let leads = super::super::align::gpu_leads(&[&dp, &dp2, &dp3, &tp]);
    // Rank 4 was never last: it leads by 0, measured. Rank 1 (host-side
    // only) has no lead.
    assert_eq!(
        leads.keys().copied().collect::<Vec<_>>(),
        vec![0, 2, 4],
        "{leads:?}"
    );
    assert!((leads[&2] - 30.0).abs() < 1e-9, "{leads:?}");
    assert!((leads[&0] - 20.0).abs() < 1e-9, "{leads:?}");
    assert_eq!(leads[&4], 0.0);
}
