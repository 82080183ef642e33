//! Unit tests of the link statistics, on hand-built and recorded intervals.
use super::*;

/// One interval; tests add three ([`add3`]) since a link is slow only
/// when each of its last three intervals is.
fn obs(rank: u32, peer: u32, lat: u64) -> LinkObs {
    LinkObs {
        rank,
        peer,
        start: 0,
        end: 100,
        completions: 8,
        latency_sum_ns: 8 * lat,
        bytes: 8 * 65536,
    }
}

/// `o` in interval `i` (interval 0 is `[0, 100]`).
fn at(o: LinkObs, i: i64) -> LinkObs {
    LinkObs {
        start: 101 * i,
        end: 101 * i + 100,
        ..o
    }
}

/// `o` in the two intervals before its own, then in its own.
fn add3(s: &mut LinkStats, o: LinkObs) {
    s.add(at(o, -2));
    s.add(at(o, -1));
    s.add(o);
}

fn slow_links(f: &LinkFindings) -> Vec<(u32, u32)> {
    f.links.iter().map(|l| (l.a, l.b)).collect()
}

/// Ranks 0..8 in a ring; `lat(r)` is rank r's link to r + 1 in interval i.
fn ring_interval(s: &mut LinkStats, i: i64, lat: impl Fn(u32) -> u64) -> LinkFindings {
    for r in 0..8u32 {
        s.add(at(obs(r, (r + 1) % 8, lat(r)), i));
    }
    s.evaluate(101 * i, 101 * i + 100, |r| format!("host-{r}"))
}

#[test]
fn a_link_is_slow_once_three_of_its_last_four_intervals_are() {
    // 1.6×: two slow intervals among five do not reach 1.5× in all, so
    // the second rule (bursts) does not name it sooner.
    let mut s = LinkStats::new(LinkConfig::default());
    for i in -2..=0 {
        ring_interval(&mut s, i, |_| 50_000);
    }
    for i in 1..=3 {
        let f = ring_interval(&mut s, i, |r| if r == 2 { 80_000 } else { 50_000 });
        let want = if i == 3 { vec![(2, 3)] } else { vec![] };
        assert_eq!(slow_links(&f), want, "interval {i}: {f:#?}");
    }
    let l = &ring_interval(&mut s, 4, |r| if r == 2 { 80_000 } else { 50_000 }).links[0];
    assert_eq!(
        (l.latency_ns, l.baseline_ns, l.ratio),
        (80_000.0, 50_000.0, 1.6)
    );
}

/// A NIC cut to a fraction of its bandwidth slows only the intervals
/// that move much data: 5× in two of every five, never three in four.
/// Over eight intervals it took 2.6× what its class took: slow. Healthy
/// noise, one or two intervals at 1.8× among eight, is not.
#[test]
fn a_link_slow_in_recurring_bursts_is_slow() {
    let mut s = LinkStats::new(LinkConfig::default());
    let mut found = Vec::new();
    for i in 0..10i64 {
        let burst = i % 5 == 1 || i % 5 == 2;
        let f = ring_interval(&mut s, i, |r| match r {
            2 if burst => 250_000,
            5 if i == 3 || i == 7 => 90_000,
            _ => 50_000,
        });
        found.push(slow_links(&f));
    }
    // Intervals 0–2 hold too few to judge (four); from interval 3 on the
    // bursts of 2↔3 add up; 5↔6's two spikes never do.
    let want: Vec<Vec<(u32, u32)>> = (0..10)
        .map(|i| if i >= 3 { vec![(2, 3)] } else { vec![] })
        .collect();
    assert_eq!(found, want);
}

/// A weak fault (30 % bandwidth on one NIC) runs 1.3–2.5× from interval
/// to interval: one dip below 1.5× in four neither delays nor clears it
/// once three intervals were slow.
#[test]
fn one_dip_in_four_intervals_keeps_a_link_slow() {
    let mut s = LinkStats::new(LinkConfig::default());
    let slow = [80_000, 70_000, 90_000, 85_000, 80_000, 70_000];
    let mut found = Vec::new();
    for (i, l) in slow.iter().enumerate() {
        let f = ring_interval(&mut s, i as i64, |r| if r == 2 { *l } else { 50_000 });
        found.push(!f.links.is_empty());
    }
    assert_eq!(found, [false, false, false, true, true, true]);
}

/// The pattern of a false link verdict seen in CI on a healthy run: a
/// load wave lifted every link for two intervals and then eased, one
/// link a little more than the rest. Against the latest interval's
/// median it is 1.6–1.9× slow in all three; against its own moments it
/// never is.
#[test]
fn a_past_interval_is_judged_against_the_links_of_its_own_span() {
    let mut s = LinkStats::new(LinkConfig::default());
    for r in 0..8u32 {
        let (wave, now) = if r == 2 {
            (950_000, 800_000)
        } else {
            (700_000, 500_000)
        };
        s.add(at(obs(r, (r + 1) % 8, wave), -2));
        s.add(at(obs(r, (r + 1) % 8, wave), -1));
        s.add(obs(r, (r + 1) % 8, now));
    }
    let f = s.evaluate(0, 100, |r| format!("host-{r}"));
    assert!(f.links.is_empty() && f.nics.is_empty(), "{f:#?}");
    assert_eq!(f.median_latency_ns, 500_000.0);
}

#[test]
fn nic_versus_single_link() {
    let mut s = LinkStats::new(LinkConfig::default());
    for r in 0..8u32 {
        for d in [1, 2] {
            let q = (r + d) % 8;
            let slow = r == 6 || q == 6 || (r.min(q), r.max(q)) == (1, 2);
            add3(&mut s, obs(r, q, if slow { 120_000 } else { 50_000 }));
        }
    }
    let f = s.evaluate(0, 100, |r| format!("host-{}", r / 4));
    assert_eq!(f.nics.iter().map(|n| n.rank).collect::<Vec<_>>(), vec![6]);
    assert_eq!(f.links.len(), 1);
    assert_eq!((f.links[0].a, f.links[0].b), (1, 2));
}

/// Rank 6's NIC slow now and then: in the last four intervals one of its
/// four links was slow in three (a bad cable, by itself), the other three
/// only in the two where it was too. Slow at the same moments, they are
/// its NIC. Links of rank 6 slow at other moments are not.
#[test]
fn links_slow_at_the_same_moments_are_one_nic() {
    let run = |others_slow_in: [i64; 2]| {
        let mut s = LinkStats::new(LinkConfig::default());
        for i in 0..4i64 {
            for r in 0..8u32 {
                for d in [1, 2] {
                    let q = (r + d) % 8;
                    let slow = match (r.min(q), r.max(q)) {
                        (6, 7) => i < 3,
                        (a, b) if a == 6 || b == 6 => others_slow_in.contains(&i),
                        _ => false,
                    };
                    s.add(at(obs(r, q, if slow { 150_000 } else { 50_000 }), i));
                }
            }
        }
        s.evaluate(303, 403, |r| format!("host-{r}"))
    };
    let f = run([1, 2]);
    assert_eq!(
        f.nics.iter().map(|n| n.rank).collect::<Vec<_>>(),
        vec![6],
        "{f:#?}"
    );
    assert_eq!(f.nics[0].slow_peers, vec![0, 4, 5, 7]);
    assert!(f.links.is_empty(), "{f:#?}");

    let f = run([3, 3]);
    assert!(f.nics.is_empty(), "{f:#?}");
    assert_eq!(slow_links(&f), vec![(6, 7)]);
}

#[test]
fn uniform_links_find_nothing() {
    let mut s = LinkStats::new(LinkConfig::default());
    for r in 0..8u32 {
        add3(&mut s, obs(r, (r + 1) % 8, 50_000 + r as u64 * 500));
    }
    let f = s.evaluate(0, 100, |r| format!("host-{}", r / 4));
    assert!(f.nics.is_empty() && f.links.is_empty());
}

/// dp8 on two hosts, rail-optimised: host 0 = ranks 0–3, host 1 = 4–7;
/// member j of a host sends to member j+1 of the other. Three of the
/// four QPs host 1 measures are slow (its polls run late): no pair is
/// named.
/// One slow QP among them is still a pair.
#[test]
fn one_host_measuring_every_link_slow_names_no_pair() {
    let host_of = |r: u32| format!("host-{}", r / 4);
    let send_peer = |r: u32| {
        let other = if r < 4 { 4 } else { 0 };
        other + (r % 4 + 1) % 4
    };
    let mut s = LinkStats::new(LinkConfig::default());
    for r in 0..8u32 {
        add3(
            &mut s,
            obs(r, send_peer(r), if r >= 5 { 700_000 } else { 350_000 }),
        );
    }
    let f = s.evaluate(0, 100, host_of);
    assert!(f.links.is_empty() && f.nics.is_empty(), "{f:#?}");
    assert_eq!(
        f.common_mode,
        vec![CommonModeHost {
            host: "host-1".into(),
            slow_links: 3,
            measured_links: 4
        }]
    );

    let mut s = LinkStats::new(LinkConfig::default());
    for r in 0..8u32 {
        add3(
            &mut s,
            obs(r, send_peer(r), if r == 3 { 1_500_000 } else { 350_000 }),
        );
    }
    let f = s.evaluate(0, 100, host_of);
    assert!(f.common_mode.is_empty(), "{f:#?}");
    assert_eq!(
        f.links.iter().map(|l| (l.a, l.b)).collect::<Vec<_>>(),
        vec![(3, 4)]
    );
}

/// Two traffic classes (pipeline sends of 64 KiB chunks, rings of
/// 512 KiB): the bigger chunks take longer everywhere; judged against
/// all links they would all look slow. Each is judged within its class,
/// where only the one truly slow link stands out.
#[test]
fn links_are_judged_within_their_chunk_size_class() {
    let mut s = LinkStats::new(LinkConfig::default());
    for r in 0..8u32 {
        add3(
            &mut s,
            obs(r, (r + 1) % 8, if r == 2 { 900_000 } else { 400_000 }),
        );
        let mut big = obs(
            r,
            (r + 4) % 8 + 8,
            if r == 5 { 2_400_000 } else { 1_000_000 },
        );
        big.bytes = 8 * 512 * 1024;
        add3(&mut s, big);
    }
    let f = s.evaluate(0, 100, |r| format!("host-{r}"));
    assert!(f.nics.is_empty(), "{f:#?}");
    assert_eq!(
        f.links.iter().map(|l| (l.a, l.b)).collect::<Vec<_>>(),
        vec![(2, 3), (5, 9)],
        "{f:#?}"
    );
    assert_eq!(f.links[1].baseline_ns, 1_000_000.0);
}

/// Records of a real run (`coordinator/tests/data`, its first line says
/// which), added as their intervals end and judged every 30 ms, as the
/// analyzer judges each iteration's window. Returns the onset if the
/// file names one.
fn replay(csv: &str, mut each: impl FnMut(CoordNs, &LinkFindings)) -> Option<CoordNs> {
    let mut onset = None;
    let mut obs = Vec::new();
    for line in csv.lines() {
        if let Some(v) = line.strip_prefix("# onset_ns=") {
            onset = v.parse().ok();
        }
        let f: Vec<i64> = line.split(',').filter_map(|x| x.parse().ok()).collect();
        if let [rank, peer, start, end, completions, latency_sum_ns, bytes] = f[..] {
            obs.push(LinkObs {
                rank: rank as u32,
                peer: peer as u32,
                start,
                end,
                completions: completions as u64,
                latency_sum_ns: latency_sum_ns as u64,
                bytes: bytes as u64,
            });
        }
    }
    assert!(obs.len() > 100, "fixture not read");
    obs.sort_by_key(|o| o.end);
    let last = obs.last().map_or(0, |o| o.end);
    let mut s = LinkStats::new(LinkConfig::default());
    let (mut next, mut t) = (0, obs[0].end);
    while t <= last {
        while next < obs.len() && obs[next].end <= t {
            s.add(obs[next]);
            next += 1;
        }
        each(
            t,
            &s.evaluate(t - 30_000_000, t, |r| format!("host-{}", r / 4)),
        );
        t += 30_000_000;
    }
    onset
}

/// The healthy stretch of the CI run that failed on a false "link 1↔6
/// is slow" (single intervals up to 1.8× its class, never three in four).
#[test]
fn recorded_healthy_noisy_links_name_nothing() {
    let csv = include_str!("../../../tests/data/links-healthy-noisy-dp8.csv");
    let mut judged = 0;
    replay(csv, |t, f| {
        judged += f.links_judged;
        assert!(f.links.is_empty() && f.nics.is_empty(), "at {t} ns: {f:#?}");
    });
    assert!(judged > 0);
}

/// A weak fault, recorded: rank 6's NIC at 30 % bandwidth makes its two
/// QPs 1.3–2.5× slower from interval to interval. It is named within a
/// second of the onset, nothing is named before it, and nothing not
/// touching rank 6 after it.
#[test]
fn recorded_weak_nic_fault_is_named_within_a_second() {
    let csv = include_str!("../../../tests/data/links-slow-nic-tp4-dp4.csv");
    let mut named = Vec::new();
    let onset = replay(csv, |t, f| {
        let ranks: Vec<u32> = f
            .nics
            .iter()
            .map(|n| n.rank)
            .chain(f.links.iter().flat_map(|l| [l.a, l.b]))
            .collect();
        if !ranks.is_empty() {
            named.push((t, ranks, f.nics.iter().any(|n| n.rank == 6)));
        }
    })
    .expect("fixture names its onset");
    let first_nic = named.iter().find(|n| n.2).map(|n| n.0);
    assert!(
        first_nic.is_some_and(|t| t - onset < 1_000_000_000),
        "NIC 6 first named at {first_nic:?}, onset {onset}"
    );
    for (t, ranks, _) in &named {
        assert!(*t > onset && ranks.contains(&6), "at {t}: {ranks:?}");
    }
}
