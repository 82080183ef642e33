use super::*;

const MS: f64 = 1e6;

fn at(rank: u32, t: f64, shape: u64) -> Arrival {
    Arrival {
        rank,
        at: t,
        shape,
        busy: None,
        issued: None,
    }
}

/// A data-parallel iteration: `n` ranks, `k` synchronous all-reduces;
/// rank `r` works `work(r, j)` before its `j`-th, each all-reduce
/// takes `x` after the last arrival.
fn sync_dp(n: u32, k: usize, x: f64, work: impl Fn(u32, usize) -> f64) -> IterGraph {
    let mut events = Vec::new();
    let mut ready = vec![0.0; n as usize];
    for j in 0..k {
        let arrivals: Vec<Arrival> = (0..n)
            .map(|r| at(r, ready[r as usize] + work(r, j), 1))
            .collect();
        let last = arrivals.iter().map(|a| a.at).fold(0.0, f64::max);
        let end = last + x;
        ready.fill(end);
        events.push(Event { arrivals, end });
    }
    IterGraph {
        start: 0.0,
        stages: Default::default(),
        events,
    }
}

#[test]
fn a_late_rank_costs_its_lateness_once_not_per_collective() {
    // Rank 2 is 6 ms late at the first of 5 buckets only (data loading);
    // everybody waits once. A sum of waits would say 7 × 6 ms.
    let it = sync_dp(8, 5, 1.0 * MS, |r, j| {
        8.0 * MS + if r == 2 && j == 0 { 6.0 * MS } else { 0.0 }
    });
    let w = WhatIf::new(&it).unwrap();
    assert!((w.length() - (5.0 * 9.0 + 6.0) * MS).abs() < 1.0);
    assert!((w.cost(2).unwrap() - 6.0 * MS).abs() < 1.0);
    assert_eq!(w.cost(3).unwrap(), 0.0);
}

#[test]
fn a_slow_gpu_costs_its_excess_at_every_sync() {
    // Rank 5 is 25% slower at every bucket: 2 ms × 4.
    let it = sync_dp(
        8,
        4,
        0.5 * MS,
        |r, _| if r == 5 { 10.0 * MS } else { 8.0 * MS },
    );
    let w = WhatIf::new(&it).unwrap();
    assert!((w.cost(5).unwrap() - 8.0 * MS).abs() < 1.0);
}

#[test]
fn noise_among_the_rest_is_not_saved_by_fixing_the_straggler() {
    // Rank 1 is 3 ms late, rank 4 is 1 ms late: fixing 1 saves 2 ms
    // (4 becomes the last), fixing both saves 3.
    let it = sync_dp(6, 1, 0.0, |r, _| {
        10.0 * MS
            + match r {
                1 => 3.0 * MS,
                4 => 1.0 * MS,
                _ => 0.0,
            }
    });
    let w = WhatIf::new(&it).unwrap();
    assert!((w.cost(1).unwrap() - 2.0 * MS).abs() < 1.0);
    assert_eq!(w.cost(4).unwrap(), 0.0, "hidden behind rank 1");
    assert!((w.cost_once_fixed(4, &[1]).unwrap() - 1.0 * MS).abs() < 1.0);
}

#[test]
fn a_delay_absorbed_by_slack_costs_nothing() {
    // Two independent pairs (two communicators); the iteration ends
    // when the slower pair finishes. Rank 0 is 2 ms slower, but its
    // pair finishes 5 ms before the other pair: no cost now.
    let ev = |shape, a: (u32, f64), b: (u32, f64)| Event {
        end: a.1.max(b.1),
        arrivals: vec![at(a.0, a.1, shape), at(b.0, b.1, shape)],
    };
    let it = IterGraph {
        start: 0.0,
        stages: Default::default(),
        events: vec![
            ev(1, (0, 12.0 * MS), (1, 10.0 * MS)),
            ev(1, (2, 17.0 * MS), (3, 17.0 * MS)),
        ],
    };
    let w = WhatIf::new(&it).unwrap();
    assert_eq!(w.peers(0), vec![1, 2, 3]);
    assert_eq!(w.cost(0).unwrap(), 0.0);
    // Ranks 2 and 3 are both slower than the median: fixing one alone
    // saves nothing, fixing both does.
    assert_eq!(w.cost(2).unwrap(), 0.0);
    assert!(w.length_with(&[2, 3]).unwrap() < w.length());
}

#[test]
fn a_pipeline_stage_is_compared_with_its_own_replicas_only() {
    // pp2 × dp2: stage 0 (ranks 0, 2) sends to stage 1 (ranks 1, 3);
    // stage 1 does twice the work of stage 0 on every replica. Nobody
    // is slower than its peers: no rank costs anything.
    // The two ends of a send/recv are different roles.
    let send = |s: u32, r: u32, ts: f64, tr: f64| Event {
        end: ts.max(tr),
        arrivals: vec![at(s, ts, 7), at(r, tr, 8)],
    };
    let ar = |a: (u32, f64), b: (u32, f64), shape| Event {
        end: a.1.max(b.1) + MS,
        arrivals: vec![at(a.0, a.1, shape), at(b.0, b.1, shape)],
    };
    let it = IterGraph {
        start: 0.0,
        stages: Default::default(),
        events: vec![
            send(0, 1, 5.0 * MS, 0.0),
            send(2, 3, 5.0 * MS, 0.0),
            ar((0, 6.0 * MS), (2, 6.0 * MS), 2),
            ar((1, 15.0 * MS), (3, 15.0 * MS), 3),
        ],
    };
    let w = WhatIf::new(&it).unwrap();
    assert_eq!(w.peers(1), vec![3]);
    assert_eq!(w.peers(0), vec![2]);
    for r in 0..4 {
        assert_eq!(w.cost(r).unwrap(), 0.0, "rank {r}");
    }
}

#[test]
fn a_rank_without_a_peer_of_its_role_has_no_cost() {
    let it = IterGraph {
        start: 0.0,
        stages: Default::default(),
        events: vec![Event {
            arrivals: vec![at(0, 1.0, 1)],
            end: 2.0,
        }],
    };
    let w = WhatIf::new(&it).unwrap();
    assert_eq!(w.cost(0), None);
    assert_eq!(w.cost(9), None);
    assert!(WhatIf::new(&IterGraph::default()).is_none());
}

#[test]
fn asynchronous_buckets_keep_their_overlap() {
    // A rank that arrives at bucket j+1 before bucket j completed did
    // not wait for it; its own work runs from its previous arrival.
    // Rank 0's second bucket is 4 ms late; bucket 1's transfer (3 ms)
    // overlaps its work, so the saving is 4 ms, not 4 + 3.
    let it = IterGraph {
        start: 0.0,
        stages: Default::default(),
        events: vec![
            Event {
                arrivals: vec![at(0, 2.0 * MS, 1), at(1, 2.0 * MS, 1), at(2, 2.0 * MS, 1)],
                end: 5.0 * MS,
            },
            Event {
                arrivals: vec![at(0, 8.0 * MS, 1), at(1, 4.0 * MS, 1), at(2, 4.0 * MS, 1)],
                end: 11.0 * MS,
            },
        ],
    };
    let w = WhatIf::new(&it).unwrap();
    assert!((w.length() - 11.0 * MS).abs() < 1.0);
    // Its peers arrived before bucket 0 completed: the role does not
    // wait for it, so rank 0's lateness is its own work.
    assert!((w.cost(0).unwrap() - 4.0 * MS).abs() < 1.0);
}

/// A slow NIC on rank 2 makes every all-reduce's transfer 3× longer.
/// Synchronous (3 ms instead of 1), each of the 4 is waited for:
/// 4 × 2 ms. When the ranks work on while the transfers run (gradient
/// buckets overlapping the backward pass: 6 ms instead of 2, a bucket
/// every 5 ms), only the last one is waited for: 4 ms.
#[test]
fn a_slow_transfer_costs_what_the_step_waits_for() {
    let sync = WhatIf::new(&sync_dp(4, 4, 3.0 * MS, |_, _| 5.0 * MS)).unwrap();
    let c = sync.transfer_cost(&[2], 1.0 / 3.0).unwrap();
    assert!((c - 8.0 * MS).abs() < 1.0, "{c}");
    // A link: only instances with both ends; none has rank 9.
    assert!((sync.transfer_cost(&[1, 2], 1.0 / 3.0).unwrap() - 8.0 * MS).abs() < 1.0);
    assert_eq!(sync.transfer_cost(&[2, 9], 0.5), None);

    // Overlapped: each rank arrives 5 ms after its previous arrival,
    // not after the previous transfer ended.
    let mut events = Vec::new();
    for j in 0..4 {
        let t = 5.0 * MS * (j as f64 + 1.0);
        let arrivals = (0..4).map(|r| at(r, t, 1)).collect();
        events.push(Event {
            arrivals,
            end: t + 6.0 * MS,
        });
    }
    let overlap = WhatIf::new(&IterGraph {
        start: 0.0,
        stages: Default::default(),
        events,
    })
    .unwrap();
    assert!((overlap.length() - 26.0 * MS).abs() < 1.0);
    let c = overlap.transfer_cost(&[2], 1.0 / 3.0).unwrap();
    assert!((c - 4.0 * MS).abs() < 1.0, "{c}");
}

#[test]
fn a_straggler_whose_gpu_reorders_its_calls_keeps_its_peers() {
    // Every rank issues a send (shape 2) and then an all-reduce (shape 1).
    // On the GPU the healthy ranks reach the send at 5 ms and the
    // all-reduce at 8 ms; slow rank 3 reaches the all-reduce at 16 ms and
    // its send only at 20 ms (another stream). In arrival order its chain
    // is all-reduce, send: no rank shares it. In issue order it has peers
    // and a cost.
    let arrival = |rank: u32, t: f64, shape: u64, issued: f64| Arrival {
        issued: Some(issued),
        ..at(rank, t, shape)
    };
    let mut events: Vec<Event> = (0..4)
        .map(|r| {
            let t = if r == 3 { 20.0 } else { 5.0 } * MS;
            Event {
                arrivals: vec![arrival(r, t, 2, 1.0 * MS)],
                end: t + 0.5 * MS,
            }
        })
        .collect();
    events.push(Event {
        arrivals: (0..4)
            .map(|r| arrival(r, if r == 3 { 16.0 } else { 8.0 } * MS, 1, 2.0 * MS))
            .collect(),
        end: 17.0 * MS,
    });
    let it = IterGraph {
        start: 0.0,
        stages: Default::default(),
        events,
    };
    let w = WhatIf::new(&it).unwrap();
    assert_eq!(w.peers(3), vec![0, 1, 2]);
    assert!(w.cost(3).unwrap() > 5.0 * MS, "{:?}", w.cost(3));
    let unordered = IterGraph {
        events: it
            .events
            .iter()
            .map(|e| Event {
                arrivals: e
                    .arrivals
                    .iter()
                    .map(|a| Arrival { issued: None, ..*a })
                    .collect(),
                end: e.end,
            })
            .collect(),
        ..it.clone()
    };
    assert!(WhatIf::new(&unordered).unwrap().peers(3).is_empty());
}

#[test]
fn a_rank_issuing_in_one_order_and_running_in_another_replays_as_it_ran() {
    // A data-parallel bucket (shape 1) issued first, then two
    // tensor-parallel all-reduces (shape 2); on the GPU the first
    // all-reduce runs before the bucket (another stream). Chained in
    // issue order, the all-reduce was replayed after the bucket and the
    // iteration came out 18 ms long against the 13 ms it took.
    let ev = |t: f64, issued: f64, shape: u64, end: f64| Event {
        arrivals: (0..2)
            .map(|r| Arrival {
                issued: Some(issued * MS),
                ..at(r, t * MS, shape)
            })
            .collect(),
        end: end * MS,
    };
    let it = IterGraph {
        start: 0.0,
        stages: Default::default(),
        events: vec![
            ev(10.0, 1.0, 1, 11.0),
            ev(5.0, 2.0, 2, 6.0),
            ev(12.0, 3.0, 2, 13.0),
        ],
    };
    let w = WhatIf::new(&it).unwrap();
    assert!((w.length() - 13.0 * MS).abs() < 1.0, "{}", w.length() / MS);
    assert_eq!(w.cost(0).unwrap(), 0.0);
}
