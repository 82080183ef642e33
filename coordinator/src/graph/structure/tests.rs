use super::*;
use crate::graph::whatif::{Arrival, Event, IterGraph};

fn costliest(r: u32, x: f64) -> BTreeMap<u32, f64> {
    [(r, x)].into()
}

#[test]
fn a_rank_costliest_once_in_turn_is_held_a_straggler_is_not() {
    let mut moving = Rotation::with_config(StructureConfig::default());
    for r in [3, 5, 1, 3, 6, 2, 7, 0] {
        moving.observe(&costliest(r, 0.3));
    }
    assert!(moving.rotating());
    // Rank 3 was the costliest twice in 8: its turn, not a straggler.
    assert!(moving.holds(3));
    assert!(!moving.confirms(3));

    let mut straggler = Rotation::with_config(StructureConfig::default());
    for r in [4, 4, 1, 4, 4, 6, 4, 4] {
        straggler.observe(&costliest(r, 0.2));
    }
    assert!(straggler.rotating(), "noise tops beside it");
    assert!(!straggler.holds(4));
    assert!(straggler.confirms(4));
    // The others' occasional turns are held.
    assert!(straggler.holds(6));
}

#[test]
fn turns_that_move_are_imbalance_turns_within_one_stage_are_not() {
    let mut g = Rotation::with_config(StructureConfig::default());
    let turns = [3u32, 5, 1, 3, 6, 2, 7, 0, 4, 1, 5, 2];
    for (k, r) in turns.iter().chain(&turns).enumerate() {
        // Costly every other step.
        g.observe(&costliest(*r, if k % 2 == 0 { 0.2 } else { 0.01 }));
    }
    let f = g.moving(|_| None).expect("moving");
    assert_eq!((f.costly, f.distinct, f.most), (12, 6, 2));
    // The same turns, all ranks of pipeline stage 1: a stage.
    assert_eq!(g.moving(|_| Some(1)), None);
    // A straggler with others' occasional turns is not.
    let mut s = Rotation::with_config(StructureConfig::default());
    for r in [4, 4, 1, 4, 4, 6, 4, 4, 2, 4, 4, 4].repeat(2) {
        s.observe(&costliest(r, 0.2));
    }
    assert_eq!(s.moving(|_| None), None);
    // Too few costly steps: noise.
    let mut q = Rotation::with_config(StructureConfig::default());
    for r in [1, 2, 3, 4, 5] {
        q.observe(&costliest(r, 0.2));
    }
    for _ in 0..19 {
        q.observe(&BTreeMap::new());
    }
    assert_eq!(q.moving(|_| None), None);
}

#[test]
fn one_costly_turn_is_no_alarm_and_small_shares_are_not_turns() {
    let mut g = Rotation::with_config(StructureConfig::default());
    // A healthy job: its costliest ranks cost under the allowance.
    for r in 0..8 {
        g.observe(&costliest(r, 0.02));
    }
    assert!(!g.rotating());
    assert!(!g.holds(5));
    // The first iteration of an imbalance, or of a big straggler.
    g.observe(&costliest(5, 0.6));
    assert!(!g.confirms(5), "one turn");
    g.observe(&costliest(5, 0.6));
    assert!(g.confirms(5), "a second turn in a row");
    // Two stragglers taking turns are not a rotation.
    let mut two = Rotation::with_config(StructureConfig::default());
    for r in [1, 6, 1, 6, 6, 1, 1, 6] {
        two.observe(&costliest(r, 0.2));
    }
    assert!(!two.rotating());
    assert!(two.confirms(1) && two.confirms(6));
}

#[test]
fn a_stage_with_a_few_named_ranks_is_theirs_to_explain() {
    let stage: Vec<u32> = (8..16).collect();
    assert!(stragglers_explain(&stage, |r| r == 12));
    assert!(stragglers_explain(&stage, |r| r == 12 || r == 9 || r == 15));
    // None named, or half and more: the stage is slower as a whole.
    assert!(!stragglers_explain(&stage, |_| false));
    assert!(!stragglers_explain(&stage, |r| r < 12));
    assert!(!stragglers_explain(&stage, |_| true));
}

const MS: f64 = 1e6;

/// pp2 × dp2 forward only: stage 0 (ranks 0, 2) works `w0`, sends to
/// stage 1 (ranks 1, 3), which works `w1`; the dp groups then
/// all-reduce. Per-rank extra work in `extra`.
fn pipeline(w0: f64, w1: f64, extra: &[(u32, f64)]) -> WhatIf {
    WhatIf::new(&pipeline_graph(w0, w1, extra)).unwrap()
}

/// [`pipeline`]'s iteration graph.
fn pipeline_graph(w0: f64, w1: f64, extra: &[(u32, f64)]) -> IterGraph {
    let x = |r: u32| extra.iter().find(|e| e.0 == r).map_or(0.0, |e| e.1);
    let mut events = Vec::new();
    for (s0, s1) in [(0u32, 1u32), (2, 3)] {
        let ts = w0 + x(s0);
        events.push(Event {
            arrivals: vec![
                Arrival {
                    rank: s0,
                    at: ts,
                    shape: 7,
                    busy: None,
                    issued: None,
                },
                Arrival {
                    rank: s1,
                    at: 0.0,
                    shape: 8,
                    busy: None,
                    issued: None,
                },
            ],
            end: ts,
        });
    }
    let e0 = events[0].end.max(events[1].end);
    let ar = |a: u32, b: u32, shape: u64, ta: f64, tb: f64| Event {
        arrivals: vec![
            Arrival {
                rank: a,
                at: ta,
                shape,
                busy: None,
                issued: None,
            },
            Arrival {
                rank: b,
                at: tb,
                shape,
                busy: None,
                issued: None,
            },
        ],
        end: ta.max(tb) + MS,
    };
    events.push(ar(0, 2, 2, w0 + x(0) + 0.1 * MS, w0 + x(2) + 0.1 * MS));
    events.push(ar(
        1,
        3,
        3,
        events[0].end + w1 + x(1),
        events[1].end + w1 + x(3),
    ));
    let _ = e0;
    IterGraph {
        start: 0.0,
        events,
        stages: [(0, 0), (2, 0), (1, 1), (3, 1)].into(),
    }
}

#[test]
fn a_stage_slower_on_every_replica_is_a_stage_finding() {
    let m = pipeline(10.0 * MS, 15.0 * MS, &[]);
    let f = stage_imbalance(&m, m.length(), &StructureConfig::default()).expect("stage 1 is 1.5x");
    assert_eq!(f.stage, 1);
    assert_eq!(f.ranks, vec![1, 3]);
    // Stage 0 also works 0.1 ms before its all-reduce: 15 / 10.1.
    assert!((f.ratio - 15.0 / 10.1).abs() < 0.01, "{f:?}");
    assert!((f.saved_ns - 4.9 * MS).abs() < 0.01 * MS, "{f:?}");
}

#[test]
fn a_stage_missing_from_the_iteration_leaves_no_comparison() {
    // The same 1.5× stage, numbered as if stage 0 had not been seen.
    let m = pipeline(10.0 * MS, 15.0 * MS, &[]);
    let renumbered = WhatIf::new(&IterGraph {
        stages: [(0, 2), (2, 2), (1, 1), (3, 1)].into(),
        ..pipeline_graph(10.0 * MS, 15.0 * MS, &[])
    })
    .unwrap();
    assert!(stage_imbalance(&m, m.length(), &StructureConfig::default()).is_some());
    assert_eq!(
        stage_imbalance(
            &renumbered,
            renumbered.length(),
            &StructureConfig::default()
        ),
        None
    );
}

#[test]
fn replicas_that_work_alike_where_seen_are_even() {
    use crate::classify::align::SeenWork;
    use crate::join::InstanceKey;
    let w = |v: &[f64]| -> SeenWork {
        v.iter()
            .enumerate()
            .map(|(i, x)| {
                (
                    (InstanceKey::Coll(i as u64), InstanceKey::Coll(i as u64 + 1)),
                    *x,
                )
            })
            .collect()
    };
    let cfg = StructureConfig::default();
    let seen: BTreeMap<u32, SeenWork> = [
        (6, w(&[7.0, 7.0, 13.0])),
        (7, w(&[7.1, 6.9, 13.2])),
        // A slow replica's partner: 1.3× apart where seen.
        (2, w(&[7.0, 7.0, 13.0])),
        (3, w(&[9.1, 9.1, 16.9])),
    ]
    .into_iter()
    .collect();
    assert!(replicas_even(&seen, &[6, 7], &cfg));
    assert!(!replicas_even(&seen, &[2, 3], &cfg));
    // A replica never seen whole cannot vouch for its stage.
    assert!(!replicas_even(&seen, &[6, 7, 9], &cfg));
}

#[test]
fn one_slow_replica_is_not_a_stage() {
    let m = pipeline(10.0 * MS, 10.0 * MS, &[(3, 5.0 * MS)]);
    assert_eq!(
        stage_imbalance(&m, m.length(), &StructureConfig::default()),
        None
    );
}

#[test]
fn balanced_stages_are_nothing() {
    let m = pipeline(10.0 * MS, 10.5 * MS, &[]);
    assert_eq!(
        stage_imbalance(&m, m.length(), &StructureConfig::default()),
        None
    );
}

fn dp(slow: u32, by: f64) -> WhatIf {
    let arrivals: Vec<Arrival> = (0..8)
        .map(|r| Arrival {
            rank: r,
            at: 10.0 * MS + if r == slow { by } else { 0.0 },
            shape: 1,
            busy: None,
            issued: None,
        })
        .collect();
    let end = 10.0 * MS + by + MS;
    WhatIf::new(&IterGraph {
        start: 0.0,
        stages: Default::default(),
        events: vec![Event { arrivals, end }],
    })
    .unwrap()
}

#[test]
fn a_moving_slowest_rank_is_work_imbalance_a_fixed_one_is_not() {
    let mut moving = Imbalance::new();
    let mut fixed = Imbalance::new();
    for k in 0..StructureConfig::default().window as u32 {
        let m = dp(k % 8, 2.0 * MS);
        moving.observe(
            &m,
            m.length(),
            balanced_saving(&m),
            &[(k % 8, 2.0 / 13.0)].into(),
        );
        let m = dp(5, 2.0 * MS);
        fixed.observe(
            &m,
            m.length(),
            balanced_saving(&m),
            &[(5, 2.0 / 13.0)].into(),
        );
    }
    let f = moving.finding().expect("moving imbalance");
    assert_eq!(f.distinct_tops, 8);
    assert!((f.saved_ns - 2.0 * MS).abs() < 1.0);
    assert_eq!(fixed.finding(), None, "one rank: a straggler");
}

#[test]
fn a_slow_host_whose_costliest_rank_rotates_is_not_imbalance() {
    // Ranks 4-7 are all 2 ms late every iteration (a slow host); which
    // of them is the very last rotates.
    let mut host = Imbalance::new();
    for k in 0..StructureConfig::default().window as u32 {
        let arrivals: Vec<Arrival> = (0..8)
            .map(|r| Arrival {
                rank: r,
                at: 10.0 * MS
                    + if r >= 4 { 2.0 * MS } else { 0.0 }
                    + if r == 4 + k % 4 { 0.1 * MS } else { 0.0 },
                shape: 1,
                busy: None,
                issued: None,
            })
            .collect();
        let end = 12.1 * MS + MS;
        let m = WhatIf::new(&IterGraph {
            start: 0.0,
            stages: Default::default(),
            events: vec![Event { arrivals, end }],
        })
        .unwrap();
        host.observe(
            &m,
            m.length(),
            balanced_saving(&m),
            &[(4 + k % 4, 0.01)].into(),
        );
    }
    assert_eq!(host.finding(), None);
}
