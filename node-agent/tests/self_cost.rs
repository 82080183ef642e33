//! The agent's own cost accounting against the real kernel: every trap of a
//! followed process is counted in `FOLLOWED`, an attached probe traps even
//! when its program returns at once (so the windowed counters must really be
//! detached), a detached one does not, and the start-up calibration yields a
//! trap cost.
//!
//! Needs root; under CI a missing root is a failure (see support).

use std::path::PathBuf;

use slowrank_agent::{
    probes::{Attach, Probes},
    selfcost,
};
use slowrank_shared::probe::cuda_count;

mod support;
use support::root_or_skip;

#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_selfcost_target(a: u64) -> u64 {
    std::hint::black_box(a.rotate_left(13) ^ 0x5a5a)
}

fn exe() -> PathBuf {
    std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe")
}

/// (entry hits, return hits) of `pid`; the verbs data path's apart.
fn hits_of(probes: &Probes, pid: u32) -> (u64, u64) {
    let h = all_hits_of(probes, pid);
    (h[0], h[1])
}

/// [entry, return, data-path entry, data-path return] hits of `pid`.
fn all_hits_of(probes: &Probes, pid: u32) -> [u64; 4] {
    probes
        .followed_hits()
        .expect("read FOLLOWED")
        .into_iter()
        .find(|r| r.0 == pid)
        .map_or([0; 4], |r| r.1)
}

#[test]
fn followed_process_hits_are_counted_per_kind_and_detach_stops_the_trap() {
    if !root_or_skip("followed_process_hits_are_counted_per_kind_and_detach_stops_the_trap") {
        return;
    }
    const N: u64 = 500;
    let me = std::process::id();
    let mut probes = Probes::load().expect("load eBPF object");
    // Limited to this process: other tests' threads are this process too,
    // but none calls this function.
    let pair = probes
        .attach_own(&exe(), "slowrank_selfcost_target", Attach::Call, me)
        .expect("attach pair");
    probes.follow(me, Some(0)).expect("follow self");
    for i in 0..N {
        slowrank_selfcost_target(i);
    }
    assert_eq!(
        hits_of(&probes, me),
        (N, N),
        "one entry and one return hit per call"
    );
    probes.detach(pair);

    // Entry-only counter: entry hits only, and the counted calls match.
    let count = probes
        .attach_own(
            &exe(),
            "slowrank_selfcost_target",
            Attach::Count {
                class: cuda_count::MEMCPY,
            },
            me,
        )
        .expect("attach counter");
    for i in 0..N {
        slowrank_selfcost_target(i);
    }
    assert_eq!(all_hits_of(&probes, me), [2 * N, N, 0, 0]);
    let counted = probes
        .cuda_counts()
        .expect("counts")
        .into_iter()
        .find(|c| c.0 == me)
        .map(|c| c.1[cuda_count::MEMCPY as usize]);
    assert_eq!(counted, Some(N));

    probes.detach(count);

    // The verbs data path's programs (NCCL's proxy threads take them):
    // counted in the totals and apart. Their reads of a bogus `qp`/`wr`
    // fault harmlessly (0).
    let post = probes
        .attach_own(
            &exe(),
            "slowrank_selfcost_target",
            Attach::VerbsPostSend,
            me,
        )
        .expect("attach post_send program");
    for i in 0..N {
        slowrank_selfcost_target(i);
    }
    assert_eq!(all_hits_of(&probes, me), [3 * N, N, N, 0]);
    probes.detach(post);
    let poll = probes
        .attach_own(&exe(), "slowrank_selfcost_target", Attach::VerbsPollCq, me)
        .expect("attach poll_cq pair");
    for i in 0..N {
        slowrank_selfcost_target(i);
    }
    assert_eq!(all_hits_of(&probes, me), [4 * N, 2 * N, 2 * N, N]);
    probes.detach(poll);
    let count = probes
        .attach_own(
            &exe(),
            "slowrank_selfcost_target",
            Attach::Count {
                class: cuda_count::MEMCPY,
            },
            me,
        )
        .expect("attach counter again");

    // Unfollowed, the program returns at once, but the probe still traps:
    // the kernel's unfollowed-hit counter sees every call.
    probes.unfollow(me).expect("unfollow");
    let before = probes.counters().expect("counters").unfollowed_hits;
    for i in 0..N {
        slowrank_selfcost_target(i);
    }
    let trapped = probes.counters().expect("counters").unfollowed_hits - before;
    assert_eq!(
        trapped, N,
        "an attached probe traps whatever its program does"
    );

    // Detached: no trap at all.
    probes.detach(count);
    let before = probes.counters().expect("counters").unfollowed_hits;
    for i in 0..N {
        slowrank_selfcost_target(i);
    }
    assert_eq!(
        probes.counters().expect("counters").unfollowed_hits - before,
        0,
        "a detached probe must not trap"
    );
}

#[test]
fn calibration_measures_a_trap_cost_and_leaves_nothing_behind() {
    if !root_or_skip("calibration_measures_a_trap_cost_and_leaves_nothing_behind") {
        return;
    }
    let me = std::process::id();
    let mut probes = Probes::load().expect("load eBPF object");
    let t = selfcost::measure(&mut probes).expect("calibration");
    // Both probes trapped: a trap is a kernel round trip, far above a
    // plain call on any host. How a pair compares with its entry is a
    // figure for the overhead benchmark, not this test: on 2 vCPUs beside
    // another trapping test, or a CPU hog, every round is preempted and
    // the entry read slower than the pair in 4 of 20 runs (12.6 µs
    // against 10.1 µs in CI; 81 µs against 40–68 µs under a hog).
    assert!(
        t.entry_ns > 50.0 && t.entry_ns.is_finite(),
        "uprobe cost {t:?}"
    );
    assert!(t.pair_ns > 50.0 && t.pair_ns.is_finite(), "pair cost {t:?}");
    assert!(t.bare_ns < t.entry_ns.min(t.pair_ns), "{t:?}");
    assert!(
        probes
            .followed_hits()
            .expect("FOLLOWED")
            .iter()
            .all(|r| r.0 != me),
        "the agent still follows itself"
    );
    let mut left = Vec::new();
    probes.drain_raw(&mut left);
    assert!(left.is_empty(), "calibration left {} events", left.len());
    println!(
        "trap cost: uprobe {:.0} ns, uprobe+uretprobe {:.0} ns, unprobed call {:.1} ns",
        t.entry_ns, t.pair_ns, t.bare_ns
    );
}
