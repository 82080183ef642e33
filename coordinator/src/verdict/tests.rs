use std::collections::BTreeMap;

use super::*;
use crate::classify::Classification;

fn obs(kind: Kind) -> Observation {
    let plain = Observation::of(kind, 5);
    Observation {
        classification: Classification {
            evidence: vec!["x".into()],
            ..plain.classification
        },
        host: "node-1".into(),
        clock_error_ns: 1e4,
        late_ns: 1e8,
        lost_ns: 1e9,
        exposure_ns: 1e10,
        saved_ns: Some(1e8),
        step_ns: 1e9,
        ..plain
    }
}

/// `x` a host-side observation, `g` a GPU-side one costing 10%, `c`
/// a GPU-side one costing 5%, `h` one held by standing evidence, anything
/// else clean; `_` an iteration never sealed (nobody could observe it).
fn run(l: &mut Lifecycle, pattern: &str, start: u64) -> Vec<(u64, EventKind)> {
    let mut ev = Vec::new();
    for (i, c) in pattern.chars().enumerate() {
        let it = start + i as u64;
        if c == '_' {
            continue;
        }
        let mut m = BTreeMap::new();
        let mut o = obs(Kind::Compute);
        o.classification.gpu_side = matches!(c, 'g' | 'c');
        if c == 'c' {
            o.lost_ns /= 2.0;
            o.saved_ns = o.saved_ns.map(|x| x / 2.0);
        }
        // `h`: named only by the sequential test's standing evidence.
        o.held = c == 'h';
        o.classification.gpu_side |= o.held;
        if matches!(c, 'x' | 'g' | 'c' | 'h') {
            m.insert(Subject::Rank(5), o);
        }
        ev.extend(l.step(it, m).into_iter().map(|e| (it, e.event)));
    }
    ev
}

#[test]
fn opens_on_six_of_eight_with_first_seen_at_onset() {
    let mut l = Lifecycle::new(LifecycleConfig::default());
    // Four of five (a host descheduled for a few iterations) is not enough.
    assert!(run(&mut l, "xxxx.....", 100).is_empty());
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = run(&mut l, "....x.xxx.xx....", 100);
    assert_eq!(ev, vec![(111, EventKind::Opened)]);
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.first_seen_iteration, 104);
    assert!((v.cost_fraction - 0.1).abs() < 1e-9);
    assert!(v
        .headline()
        .contains("rank 5 on node-1 is compute-slow, costing 10% of the job"));
}

#[test]
fn a_costly_gpu_side_straggler_opens_after_three_in_a_row() {
    let mut l = Lifecycle::new(LifecycleConfig::default());
    assert_eq!(run(&mut l, "..ggg", 100), vec![(104, EventKind::Opened)]);
    assert_eq!(l.verdicts().next().unwrap().first_seen_iteration, 102);
    // Not in a row, cheap, or host-side in between: the 6-of-8 rule.
    for pattern in ["gg.gg.", "ccccc", "ggxgg", "xxxxx"] {
        let mut l = Lifecycle::new(LifecycleConfig::default());
        assert!(run(&mut l, pattern, 100).is_empty(), "{pattern}");
    }
}

#[test]
fn no_flapping_on_borderline_noise() {
    let mut l = Lifecycle::new(LifecycleConfig::default());
    // Suspicious every other iteration: never six of eight.
    assert!(run(&mut l, "x.x.x.x.x.x.x.x.x.x.", 100).is_empty());
    // Open, then short gaps never close it.
    let ev = run(&mut l, "xxxxxxx...x...xx.....x", 120);
    assert_eq!(ev.iter().filter(|e| e.1 == EventKind::Opened).count(), 1);
    assert!(ev.iter().all(|e| e.1 != EventKind::Closed));
}

#[test]
fn closes_after_clean_streak_and_reopens_same_verdict() {
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = run(&mut l, "xxxxxx........xxxxxx", 100);
    assert_eq!(
        ev,
        vec![
            (105, EventKind::Opened),
            (113, EventKind::Closed),
            (119, EventKind::Reopened)
        ]
    );
    assert_eq!(l.verdicts().count(), 1);
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.episodes, 2);
    // Detection latency counts from the first raising, not the reopening.
    assert_eq!((v.first_opened_iteration, v.opened_iteration), (105, 119));
}

#[test]
fn warmup_iterations_never_open_a_verdict() {
    let mut l = Lifecycle::new(LifecycleConfig::default());
    // Slow through the whole warm-up (0..20), then healthy: nothing.
    let pattern = "x".repeat(20) + &".".repeat(10);
    assert!(run(&mut l, &pattern, 0).is_empty());
    // A fault that starts during the warm-up and lasts is raised once the
    // warm-up is over, first seen at its end.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = run(&mut l, &"x".repeat(30), 0);
    assert_eq!(ev, vec![(25, EventKind::Opened)]);
    assert_eq!(l.verdicts().next().unwrap().first_seen_iteration, 20);
}

/// A verdict is costed as its class: the window's minority readings of
/// another class (host-side replays of a GPU the replay cannot time) add
/// nothing, and a class change measures the cost anew.
#[test]
fn a_verdict_is_costed_only_by_readings_of_its_class() {
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let reading = |kind: Kind, saved: Option<f64>| {
        let mut o = obs(kind);
        o.saved_ns = saved;
        BTreeMap::from([(Subject::Rank(5), o)])
    };
    // Two host readings replayed at 10% of the step, then six compute
    // ones the replay cannot time.
    for it in 100..102 {
        l.step(it, reading(Kind::Host, Some(1e8)));
    }
    let mut opened = Vec::new();
    for it in 102..108 {
        opened.extend(l.step(it, reading(Kind::Compute, None)));
    }
    assert_eq!(opened.len(), 1, "{opened:?}");
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.kind, Kind::Compute);
    assert_eq!(v.cost_iterations, 0, "{v:?}");
    assert!(
        v.headline().contains("not measured yet"),
        "{}",
        v.headline()
    );
    // Eight host readings in a row: the verdict is host now, costed anew.
    for it in 108..116 {
        l.step(it, reading(Kind::Host, Some(2e8)));
    }
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.kind, Kind::Host);
    assert!((v.cost_fraction - 0.2).abs() < 1e-9, "{v:?}");
}

/// A rank slow for a few iterations (a descheduled host) is named at once,
/// and once it has kept pace it is a transient; one slow for longer, slow
/// again after its close, or still slow is a straggler.
#[test]
fn a_short_episode_that_ended_is_a_transient() {
    let below = &LifecycleConfig::default();
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = run(&mut l, "gggggg..........", 100);
    assert_eq!(ev[0], (102, EventKind::Opened), "named while it lasts");
    assert!(ev.contains(&(113, EventKind::Closed)));
    let v = l.verdicts().next().unwrap();
    assert!(v.is_transient(below), "6 iterations, then kept pace");

    // Ten iterations: it outlasted the naming window.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "gggggggggg..........", 100);
    let v = l.verdicts().next().unwrap();
    assert!(!v.active && !v.is_transient(below));

    // Still slow at the end: not over, so no transient.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "gggggg", 100);
    assert!(!l.verdicts().next().unwrap().is_transient(below));

    // Two short episodes of one rank: a recurring straggler.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "gggg..........gggg..........", 100);
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.episodes, 2);
    assert!(!v.is_transient(below));
}

/// Sight lost while it was slow (an agent gone: no iteration sealed), then
/// clean once seen again: it may have been slow all along, so it is no
/// transient. A blind stretch too short to have closed it changes nothing,
/// nor does one after it had already kept pace.
#[test]
fn a_blind_stretch_after_a_slow_iteration_is_no_proof_of_a_short_episode() {
    let below = &LifecycleConfig::default();
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = run(&mut l, "gggggg______________________..........", 100);
    assert!(ev.contains(&(135, EventKind::Closed)), "{ev:?}");
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.unobserved_to, Some(127));
    assert_eq!((v.slow_iterations(), v.slow_span_bound()), (6, 28));
    assert!(!v.is_transient(below), "{v:?}");

    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "gggggg____..........", 100);
    let v = l.verdicts().next().unwrap();
    assert_eq!(v.unobserved_to, None, "shorter than close_after");
    assert!(v.is_transient(below));

    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "gggggg..______________________..........", 100);
    let v = l.verdicts().next().unwrap();
    assert_eq!(
        v.unobserved_to, None,
        "it had kept pace before sight was lost"
    );
    assert!(v.is_transient(below));
}

/// The sequential test's standing evidence keeps a lasting straggler named
/// through iterations it kept pace in, but not a short episode: that one
/// closes `close_after` iterations after its rank was last slow on its own.
#[test]
fn standing_evidence_does_not_keep_a_short_episode_open() {
    let below = &LifecycleConfig::default();
    let mut l = Lifecycle::new(LifecycleConfig::default());
    // Held only while its verdict is open: none once it closed.
    let ev = run(&mut l, "gggghhhhhhhh........", 100);
    assert!(ev.contains(&(111, EventKind::Closed)), "{ev:?}");
    let v = l.verdicts().next().unwrap();
    assert!(v.is_transient(below) && v.last_slow_iteration == 103);

    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = run(&mut l, "gggggggggggghhhhhhhhhhhh", 100);
    assert!(!ev.iter().any(|e| e.1 == EventKind::Closed), "{ev:?}");
    assert!(l.verdicts().next().unwrap().active);
}

/// A short episode that had stopped when its rank exited ends with it; one
/// still slow at its rank's last iteration, or a long one, stays open.
#[test]
fn a_short_episode_ends_with_its_ranks_exit() {
    let below = &LifecycleConfig::default();
    // Rank 5 of `run`'s observations; slow 5 iterations, then 2 clean ones
    // before its iterations stopped coming.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "ggggg..", 100);
    assert!(l.verdicts().next().unwrap().active);
    assert!(l.end_with_exits(|r| r != 5).is_empty(), "rank 5 still runs");
    let ev = l.end_with_exits(|_| true);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].event, ev[0].iteration),
        (EventKind::Closed, Some(106))
    );
    assert!(
        ev[0].line.contains("ended with its rank's exit"),
        "{}",
        ev[0].line
    );
    let v = l.verdicts().next().unwrap();
    assert!(!v.active && v.is_transient(below));

    // Slow to its last observed iteration: it may have been cut off.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "ggggg", 100);
    assert!(l.end_with_exits(|_| true).is_empty());
    // Slow for as long as a straggler is given to be named: it stays.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    run(&mut l, "gggggggggggg..", 100);
    assert!(l.end_with_exits(|_| true).is_empty());
    assert!(l.verdicts().next().unwrap().active);
}

/// A modest episode (under `modest_cost` of the step) is given the longer
/// naming window: 12 iterations at 5% then pace is a transient, 30 is not.
#[test]
fn a_modest_episode_has_the_longer_bound() {
    let cfg = &LifecycleConfig::default();
    let mut l = Lifecycle::new(cfg.clone());
    run(
        &mut l,
        &format!("{}{}", "c".repeat(12), ".".repeat(10)),
        100,
    );
    let v = l.verdicts().next().unwrap();
    assert!(v.cost_fraction < cfg.modest_cost, "{}", v.cost_fraction);
    assert_eq!(v.transient_bound(cfg), cfg.transient_below_modest);
    assert!(!v.active && v.is_transient(cfg));

    let mut l = Lifecycle::new(cfg.clone());
    run(
        &mut l,
        &format!("{}{}", "c".repeat(30), ".".repeat(10)),
        100,
    );
    let v = l.verdicts().next().unwrap();
    assert!(
        !v.active && !v.is_transient(cfg),
        "lasted its naming window"
    );

    // Two modest blips 10 iterations apart: one disturbance, inside the
    // window; the same two 30 apart span more and stay a verdict.
    for (gap, transient) in [(10, true), (30, false)] {
        let mut l = Lifecycle::new(cfg.clone());
        let p = format!("cccccc{}cccccc{}", ".".repeat(gap), ".".repeat(10));
        run(&mut l, &p, 100);
        let v = l.verdicts().next().unwrap();
        assert_eq!(
            (v.episodes, v.is_transient(cfg)),
            (2, transient),
            "gap {gap}"
        );
    }

    // As costly as the strict bound's straggler: 12 iterations stay one.
    let mut l = Lifecycle::new(cfg.clone());
    run(
        &mut l,
        &format!("{}{}", "g".repeat(12), ".".repeat(10)),
        100,
    );
    assert!(!l.verdicts().next().unwrap().is_transient(cfg));
}

#[test]
fn an_intermittent_fault_read_in_the_wrong_class_is_corrected_with_an_alert() {
    // Slow 4 iterations in 8: host-side readings (host-slow) open the
    // verdict; from then on every reading says compute. No window of 8
    // is ever full of readings, yet the class changes, once, with an event.
    let mut l = Lifecycle::new(LifecycleConfig::default());
    let ev = play_classes(&mut l, "hhhhhhhh....cccc....cccc....cccc");
    let kinds: Vec<(u64, EventKind)> = ev.iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(
        kinds,
        vec![(105, EventKind::Opened), (115, EventKind::Reclassified)]
    );
    assert!(
        ev[1].2.contains("compute-slow") && ev[1].2.contains("was host-slow"),
        "{}",
        ev[1].2
    );
    let v = l.verdicts().next().unwrap();
    assert_eq!((v.kind, v.active), (Kind::Compute, true));
    // One host reading among compute ones changes nothing back.
    let mut l2 = Lifecycle::new(LifecycleConfig::default());
    let kinds: Vec<EventKind> = play_classes(&mut l2, "cccccccc..h.c..c")
        .into_iter()
        .map(|e| e.1)
        .collect();
    assert_eq!(kinds, vec![EventKind::Opened]);
}

/// Plays rank 5's readings from iteration 100, one character each: `h`
/// host-side, `c` compute, anything else none. Returns (iteration, event,
/// line) of every event.
fn play_classes(l: &mut Lifecycle, readings: &str) -> Vec<(u64, EventKind, String)> {
    let mut ev = Vec::new();
    for (i, c) in readings.chars().enumerate() {
        let it = 100 + i as u64;
        let mut m = BTreeMap::new();
        match c {
            'h' => m.insert(Subject::Rank(5), obs(Kind::Host)),
            'c' => m.insert(Subject::Rank(5), obs(Kind::Compute)),
            _ => None,
        };
        ev.extend(l.step(it, m).into_iter().map(|e| (it, e.event, e.line)));
    }
    ev
}

/// Plays `pattern` as [`run`] does, and on every iteration without an
/// observation accounts a what-if that saves nothing (the rank kept pace),
/// as the analyzer does for an active verdict.
fn run_costed(l: &mut Lifecycle, pattern: &str, start: u64) {
    for (i, c) in pattern.chars().enumerate() {
        let it = start + i as u64;
        run(l, &c.to_string(), it);
        if !matches!(c, 'x' | 'g' | 'c' | 'h') {
            l.account_unobserved(it, Subject::Rank(5), Some(0.0), 1e9, None);
        }
    }
}

#[test]
fn a_closed_verdict_costs_what_its_episode_cost_not_its_clean_tail() {
    // 13 slow iterations at 10 % of the step, then it keeps pace until
    // the verdict closes: its cost is the episode's 10 %, not diluted by
    // the clean iterations before the close (which made a 15 % straggler
    // "7 %" and a transient), and it is a straggler.
    let cfg = LifecycleConfig::default();
    let mut l = Lifecycle::new(cfg.clone());
    run_costed(
        &mut l,
        &format!("{}{}", "g".repeat(13), ".".repeat(12)),
        100,
    );
    let v = l.verdicts().next().unwrap();
    assert!(!v.active, "{v:?}");
    assert!((v.cost_fraction - 0.10).abs() < 1e-9, "{}", v.cost_fraction);
    assert!(!v.is_transient(&cfg), "{v:?}");
    // Slow again after a short pause: the pause was inside the episode
    // and costs its nothing.
    let mut l = Lifecycle::new(cfg.clone());
    run_costed(
        &mut l,
        &format!("{}...{}{}", "g".repeat(8), "g".repeat(4), ".".repeat(12)),
        100,
    );
    let v = l.verdicts().next().unwrap();
    assert!(!v.active, "{v:?}");
    let want = 12.0 * 0.10 / 15.0;
    assert!(
        (v.cost_fraction - want).abs() < 1e-9,
        "{} vs {want}",
        v.cost_fraction
    );
}
