//! Each fault class on synthetic jobs: the right rank, the right class, and a
//! first-seen iteration within 10 iterations of onset.

mod common;

use slowrank_coordinator::classify::Kind;
use slowrank_coordinator::{AnalyzerConfig, EventKind, Verdict};
use slowrank_synth::{Fault, FaultKind, GpuTiming, HostPhase, SynthSpec};

fn only(rep: &slowrank_coordinator::Report) -> &Verdict {
    assert_eq!(
        rep.verdicts.len(),
        1,
        "expected one verdict: {}",
        slowrank_coordinator::render_human(rep)
    );
    &rep.verdicts[0]
}

/// `rank` loads each batch `delay_ns` late from `start` on.
fn slow_loader(rank: u32, delay_ns: u64, start: u64) -> Fault {
    Fault::persistent(
        FaultKind::Host {
            rank,
            phase: HostPhase::LoadBatch,
            factor: 1.0,
            delay_ns,
            contention: false,
        },
        start,
    )
}

fn within_10(v: &Verdict, onset: u64) {
    assert!(
        v.first_seen_iteration >= onset.saturating_sub(1) && v.first_seen_iteration <= onset + 10,
        "first seen at {} for onset {onset}",
        v.first_seen_iteration
    );
}

#[test]
fn dp8_compute_slow_1_3x() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 7;
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        40,
    ));
    let r = common::run(spec, 80);
    let rep = r.report();
    let v = only(&rep);
    assert_eq!(
        (v.rank, v.kind, v.host.as_str()),
        (5, Kind::Compute, "node-1")
    );
    within_10(v, 40);
    assert!(v.active && v.confidence > 0.7, "{v:?}");
    assert!(
        v.lost_gpu_seconds > 0.5 && v.cost_fraction > 0.05 && v.cost_fraction < 0.5,
        "{v:?}"
    );
    assert!(v.clock_error_us > 0.0);
    // The alert fired within 10 iterations of onset plus the sealing lag.
    let open = r.opened()[0].iteration.unwrap();
    assert!(open <= 40 + 10, "opened at {open}");
}

/// dp 2×4 without GPU-side times or links, rank 5's GPU 1.3× slow from
/// iteration `from`: a suspect only the deep set can class.
fn host_times_only_compute_slow(from: u64) -> SynthSpec {
    let mut spec = SynthSpec::dp(2, 4);
    spec.gpu_timing = GpuTiming::None;
    spec.links = false;
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        from,
    ));
    spec
}

#[test]
fn dp8_compute_slow_host_times_only_waits_for_the_deep_set() {
    // Without GPU-side times a DP compute-slow rank shows only as a host that
    // starts each step late after waiting longer for its own GPU in the
    // end-of-step synchronize — as a rank behind a slow NIC would. It must
    // not be named (neither host- nor compute-slow) on that guess; the
    // analyzer asks for the deep set instead.
    let run = common::run(host_times_only_compute_slow(40), 80);
    let rep = run.report();
    assert!(rep.verdicts.is_empty(), "{:#?}", rep.verdicts);
    assert!(run.analyzer.confirmation_wanted());
    // Healthy: nothing held, nothing asked.
    let mut spec = SynthSpec::dp(2, 4);
    spec.gpu_timing = GpuTiming::None;
    spec.links = false;
    assert!(!common::run(spec, 80).analyzer.confirmation_wanted());
    // Two slow iterations: the default asks for the deep set at once; with
    // `deep_ask_min` 3 they are not yet a lasting suspicion (see its docs
    // for why the default stays at 1).
    let mut spec = SynthSpec::dp(2, 4);
    spec.gpu_timing = GpuTiming::None;
    spec.links = false;
    let mut f = Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        76,
    );
    f.end_iteration = Some(78);
    spec.faults.push(f);
    assert!(common::run(spec.clone(), 80).analyzer.confirmation_wanted());
    let mut cfg = slowrank_coordinator::analyzer::AnalyzerConfig::default();
    cfg.stats.deep_ask_min = 3;
    assert!(!common::run_with(spec, 80, cfg)
        .analyzer
        .confirmation_wanted());
}

#[test]
fn a_suspect_in_the_warm_up_does_not_ask_for_the_deep_set() {
    // Warm-up steps are no baseline: a suspect there opened a 30-s deep
    // window on every agent 1.5 s into a healthy run. The same fault asks
    // once the warm-up is over. (A warm-up of the full count, as where the
    // steps never settle; settled steps end it sooner.)
    let mut cfg = slowrank_coordinator::analyzer::AnalyzerConfig::default();
    cfg.lifecycle.warmup_settle = 0;
    let warmup = cfg.lifecycle.warmup_iterations;
    let spec = || host_times_only_compute_slow(warmup / 2);
    assert!(!common::run_with(spec(), warmup - 2, cfg.clone())
        .analyzer
        .confirmation_wanted());
    assert!(common::run_with(spec(), warmup + 20, cfg)
        .analyzer
        .confirmation_wanted());
}

#[test]
fn dp8_host_slow_data_loader() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 21;
    spec.faults.push(slow_loader(2, 8_000_000, 30));
    let rep = common::run(spec, 70).report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (2, Kind::Host), "{v:#?}");
    within_10(v, 30);
    assert!(
        v.evidence.iter().any(|e| e.contains("off-CPU")),
        "{:#?}",
        v.evidence
    );
}

#[test]
fn host_slow_1_3x_with_cpu_contention() {
    // A host-bound job (heavy per-layer host work): 1.3× slower host work.
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 22;
    spec.host_ns_per_layer = 3_000_000;
    spec.faults.push(Fault::persistent(
        FaultKind::Host {
            rank: 6,
            phase: HostPhase::All,
            factor: 1.3,
            delay_ns: 0,
            contention: true,
        },
        30,
    ));
    let rep = common::run(spec, 70).report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (6, Kind::Host), "{v:#?}");
    within_10(v, 30);
    assert!(
        v.evidence.iter().any(|e| e.contains("run-queue")),
        "{:#?}",
        v.evidence
    );
}

#[test]
fn host_slow_with_host_times_only() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.gpu_timing = GpuTiming::None;
    spec.links = false;
    spec.faults.push(Fault::persistent(
        FaultKind::Host {
            rank: 1,
            phase: HostPhase::LoadBatch,
            factor: 1.0,
            delay_ns: 8_000_000,
            contention: false,
        },
        30,
    ));
    let rep = common::run(spec, 70).report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (1, Kind::Host));
    within_10(v, 30);
    assert!(v.confidence < 0.81, "less certain without GPU times");
}

#[test]
fn dp8_communication_slow_nic() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 23;
    spec.faults.push(Fault::persistent(
        FaultKind::Communication {
            rank: 6,
            factor: 2.5,
        },
        30,
    ));
    let rep = common::run(spec, 60).report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (6, Kind::Communication), "{v:#?}");
    assert!(v.link.is_none());
    within_10(v, 30);
}

#[test]
fn dp8_link_slow_names_the_pair() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 24;
    spec.faults.push(Fault {
        end_iteration: Some(60),
        ..Fault::persistent(
            FaultKind::Link {
                a: 3,
                b: 4,
                factor: 3.0,
            },
            30,
        )
    });
    let r = common::run(spec, 90);
    let rep = r.report();
    let v = only(&rep);
    assert_eq!(v.kind, Kind::Communication);
    assert_eq!(v.link.as_ref().map(|l| l.ranks), Some([3, 4]));
    within_10(v, 30);
    // The link healed at 60: the verdict closed, once.
    assert!(!v.active);
    let closes: Vec<u64> = r
        .events
        .iter()
        .filter(|e| e.event == EventKind::Closed)
        .filter_map(|e| e.iteration)
        .collect();
    assert_eq!(closes.len(), 1);
    assert!(closes[0] >= 60 && closes[0] <= 75, "{closes:?}");
    let json: serde_json::Value =
        serde_json::from_str(&slowrank_coordinator::render_json(&rep).unwrap()).unwrap();
    assert_eq!(
        json["verdicts"][0]["link"]["ranks"],
        serde_json::json!([3, 4])
    );
}

#[test]
fn tp2_pp2_dp4_compute_root_not_victims() {
    // Rank 9 (stage 1, dp 0, tp 1): its TP partner 8 waits for it in every
    // layer, and stage 0's dp-0 ranks wait for its backward sends; they arrive
    // late in their own DP groups. Only 9 is the root.
    let mut spec = SynthSpec::three_d(2, 2, 4, 4);
    spec.seed = 12;
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 9,
            factor: 1.3,
        },
        30,
    ));
    let rep = common::run(spec, 70).report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (9, Kind::Compute), "{v:#?}");
    within_10(v, 30);
}

#[test]
fn pp4_dp2_host_slow_stage_names_root() {
    // Pipeline chain: the last stage's dp-1 rank is host-slow. Stage 2's
    // dp-1 rank waits for its backward sends and is then late for its own DP
    // peer, and so on up the pipeline: the victims are late in their DP
    // groups, but their lateness is explained by waiting; only the root is
    // named.
    let mut spec = SynthSpec::three_d(1, 4, 2, 2);
    spec.seed = 14;
    spec.host_ns_per_layer = 1_500_000;
    let slow = spec.rank_of(3, 1, 0);
    spec.faults.push(Fault::persistent(
        FaultKind::Host {
            rank: slow,
            phase: HostPhase::Layers,
            factor: 2.0,
            delay_ns: 0,
            contention: false,
        },
        30,
    ));
    let rep = common::run(spec, 70).report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (slow, Kind::Host), "{v:#?}");
    within_10(v, 30);
}

#[test]
fn dp8_hang_names_missing_rank_and_last_completed() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 25;
    spec.faults
        .push(Fault::persistent(FaultKind::Hang { rank: 3 }, 30));
    let mut cfg = AnalyzerConfig::default();
    cfg.join.hang_timeout_ns = 500_000_000;
    let r = common::run_with(spec, 60, cfg);
    let rep = r.report();
    assert!(rep.verdicts.is_empty(), "{:#?}", rep.verdicts);
    assert_eq!(rep.hangs.len(), 1, "{:#?}", rep.hangs);
    let h = &rep.hangs[0];
    assert_eq!(h.missing_ranks, vec![3]);
    assert!(h.active);
    // 4 buckets per iteration: iteration 30 starts at instance 120.
    assert_eq!(h.sequence, 120);
    assert_eq!(h.missing[0].last_completed_seq, Some(119));
    assert_eq!(h.missing[0].host, "node-0");
    assert_eq!(h.present_ranks, vec![0, 1, 2, 4, 5, 6, 7]);
    let ev: Vec<_> = r
        .events
        .iter()
        .filter(|e| e.event == EventKind::HangDetected)
        .collect();
    assert_eq!(ev.len(), 1);
    assert!(
        ev[0]
            .line
            .contains("rank 3 on node-0 (last completed instance 119)"),
        "{}",
        ev[0].line
    );
}

#[test]
fn two_faults_at_once() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 27;
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.4,
        },
        25,
    ));
    spec.faults.push(Fault::persistent(
        FaultKind::Link {
            a: 7,
            b: 0,
            factor: 3.0,
        },
        40,
    ));
    let rep = common::run(spec, 80).report();
    assert_eq!(
        rep.verdicts.len(),
        2,
        "{}",
        slowrank_coordinator::render_human(&rep)
    );
    let c = rep
        .verdicts
        .iter()
        .find(|v| v.kind == Kind::Compute)
        .expect("compute");
    assert_eq!(c.rank, 5);
    within_10(c, 25);
    let l = rep
        .verdicts
        .iter()
        .find(|v| v.kind == Kind::Communication)
        .expect("link");
    assert_eq!(l.link.as_ref().map(|l| l.ranks), Some([0, 7]));
    within_10(l, 40);
}

#[test]
fn intermittent_compute_is_one_verdict_with_episodes() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 26;
    spec.faults.push(Fault {
        period: Some((40, 12)),
        ..Fault::persistent(
            FaultKind::Compute {
                rank: 1,
                factor: 1.5,
            },
            20,
        )
    });
    let r = common::run(spec, 130);
    let rep = r.report();
    let v = only(&rep);
    assert_eq!((v.rank, v.kind), (1, Kind::Compute));
    within_10(v, 20);
    assert_eq!(v.episodes, 3, "{v:#?}");
    let opens = r.opened().len();
    let closes = r
        .events
        .iter()
        .filter(|e| e.event == EventKind::Closed)
        .count();
    assert_eq!((opens, closes), (3, 3));
}

/// Drives a synthetic job; returns the iterations at which the analyzer
/// reported a slowdown with no rank named.
fn slowdown_iterations(spec: SynthSpec, iterations: u64) -> Vec<u64> {
    use slowrank_coordinator::Analyzer;
    use slowrank_synth::Generator;
    let a = Analyzer::new(AnalyzerConfig::default());
    let mut g = Generator::new(spec);
    for (h, s) in g.initial_samples() {
        a.add_clock_sample(&h, s).unwrap();
    }
    let mut at = Vec::new();
    for i in 0..iterations {
        let out = g.next_iteration();
        for (h, s) in &out.samples {
            a.add_clock_sample(h, *s).unwrap();
        }
        for (recv, b) in &out.batches {
            a.ingest(b, *recv);
        }
        a.tick(out.end_ns as i64 + 3_000_000);
        if a.slowdown().is_some() {
            at.push(i);
        }
    }
    at
}

#[test]
fn job_slowed_without_a_named_rank_is_told_healthy_is_not() {
    // Host times only (the default probe set) and a 1.3x slower GPU: the
    // step grows ~20%; the trigger fires within a few iterations of onset
    // (so `serve` can open deep windows), never on the healthy job. Whole
    // iterations count before they are sealed: 2 steps after onset, where
    // sealed ones alone told it at 4.
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 51;
    spec.gpu_timing = GpuTiming::None;
    spec.links = false;
    let healthy = slowdown_iterations(spec.clone(), 120);
    assert!(healthy.is_empty(), "{healthy:?}");
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        60,
    ));
    let slowed = slowdown_iterations(spec, 120);
    let first = *slowed.first().expect("slowdown told");
    assert!((60..=63).contains(&first), "{slowed:?}");
}

#[test]
fn a_slowdown_from_before_the_baseline_filled_is_told_too() {
    // The GPU slows at iteration 25, five warm steps in: the warm steps'
    // median is the slow step, so only the slow stretch against the job's
    // best pace (steps read from the start) shows it. Told while it lasts,
    // so `serve` can open deep windows.
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 52;
    spec.gpu_timing = GpuTiming::None;
    spec.links = false;
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        25,
    ));
    let slowed = slowdown_iterations(spec, 90);
    assert!(
        slowed.iter().any(|i| (40..90).contains(i)),
        "never told: {slowed:?}"
    );
    assert!(
        slowed.iter().all(|i| *i >= 25),
        "told before onset: {slowed:?}"
    );
}

#[test]
fn every_rank_of_one_host_slow_is_one_host_verdict() {
    // A node whose CPUs are shared or throttled: all four of its ranks load
    // their batches 8 ms late. One finding for the node, not four.
    let mut spec = SynthSpec::dp(4, 4);
    spec.seed = 31;
    for rank in 8..12 {
        spec.faults.push(slow_loader(rank, 8_000_000, 30));
    }
    let rep = common::run(spec, 70).report();
    let v = only(&rep);
    assert_eq!(v.ranks, vec![8, 9, 10, 11], "{v:#?}");
    assert_eq!((v.host.as_str(), v.kind), ("node-2", Kind::Host), "{v:#?}");
    assert!((8..12).contains(&v.rank));
    within_10(v, 30);
    assert!(
        v.evidence[0].starts_with("all 4 ranks on node-2 (8, 9, 10, 11) arrive late together"),
        "{:#?}",
        v.evidence
    );
    assert!(v
        .headline()
        .starts_with("host node-2 (ranks 8–11) is host-slow"));
}

/// The analyzer with work imbalance named (off by default).
fn imbalance_on() -> AnalyzerConfig {
    AnalyzerConfig {
        work_imbalance: true,
        ..AnalyzerConfig::default()
    }
}

#[test]
fn work_imbalance_that_moves_is_named_as_such_and_no_rank_is() {
    // dp8 on 8 hosts: every rank's GPU work ×1–2.5 drawn anew each step
    // from iteration 40 on; the slowest rank changes from step to step, and
    // now and then one rank's turn comes twice in a few steps.
    for seed in 1..=6 {
        let mut spec = SynthSpec::dp(8, 1);
        spec.seed = seed;
        spec.faults.push(Fault::persistent(
            FaultKind::WorkImbalance { factor: 4.0 },
            40,
        ));
        let r = common::run_with(spec, 100, imbalance_on());
        let rep = r.report();
        let text = slowrank_coordinator::render_human(&rep);
        let ranks: Vec<&Verdict> = rep
            .verdicts
            .iter()
            .filter(|v| v.structural.is_none())
            .collect();
        assert!(
            ranks.is_empty(),
            "seed {seed}: a rank named for its turns: {text}"
        );
        let v = only(&rep);
        let st = v.structural.as_ref().expect("structural");
        assert_eq!(
            (v.kind, st.cause.as_str()),
            (Kind::Structural, "work_imbalance")
        );
        assert!(
            v.first_seen_iteration >= 40 && v.first_seen_iteration <= 40 + 25,
            "seed {seed}: first seen at {}: {text}",
            v.first_seen_iteration
        );
        assert!(v.cost_fraction > 0.03 && v.cost_fraction < 0.6, "{v:?}");
    }
}

#[test]
fn lateness_that_moves_while_every_rank_waits_for_a_cpu_is_not_work_imbalance() {
    // The moving work of the test above, on hosts whose ranks all wait in
    // the run queue (≈ 8% of wall time each: a CPU hog beside the job).
    // Lateness that moves with the scheduler is the hosts' contention; the
    // same job with the run-queue gate lifted is told "work imbalance",
    // so the gate is what keeps it from being said.
    let job = |seed| {
        let mut spec = SynthSpec::dp(8, 1);
        spec.seed = seed;
        spec.faults.push(Fault::persistent(
            FaultKind::WorkImbalance { factor: 4.0 },
            40,
        ));
        for rank in 0..8 {
            spec.faults.push(Fault::persistent(
                FaultKind::Host {
                    rank,
                    phase: HostPhase::All,
                    factor: 1.0,
                    delay_ns: 500_000,
                    contention: true,
                },
                0,
            ));
        }
        spec
    };
    let imbalance = |rep: &slowrank_coordinator::Report| {
        rep.verdicts.iter().any(|v| {
            v.structural
                .as_ref()
                .is_some_and(|s| s.cause == "work_imbalance")
        })
    };
    for seed in 1..=3 {
        let rep = common::run_with(job(seed), 100, imbalance_on()).report();
        assert!(
            !imbalance(&rep),
            "seed {seed}: {}",
            slowrank_coordinator::render_human(&rep)
        );
    }
    let mut ungated = imbalance_on();
    ungated.structure.max_runq_share = 1.0;
    let named = (1..=3)
        .filter(|seed| imbalance(&common::run_with(job(*seed), 100, ungated.clone()).report()))
        .count();
    assert!(
        named > 0,
        "without the gate the job is not told imbalanced either: the test shows nothing"
    );
}

#[test]
fn a_balanced_job_is_not_told_it_is_imbalanced_nor_a_straggler_its_turns() {
    // The same job without the fault: its jitter is imbalance of its own,
    // at its own pace: nothing to say.
    let mut spec = SynthSpec::dp(8, 1);
    spec.seed = 11;
    spec.jitter = 0.2;
    let r = common::run_with(spec, 100, imbalance_on());
    let rep = r.report();
    assert!(
        rep.verdicts.is_empty(),
        "{}",
        slowrank_coordinator::render_human(&rep)
    );
}

#[test]
fn a_straggler_that_begins_during_work_imbalance_is_still_named() {
    // Work ×1–2.5 moving from iteration 30; rank 3's GPU 2× slower from 50
    // on: it is the slowest step after step, not by turns.
    let mut spec = SynthSpec::dp(8, 1);
    spec.seed = 5;
    spec.faults.push(Fault::persistent(
        FaultKind::WorkImbalance { factor: 2.5 },
        30,
    ));
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 3,
            factor: 2.0,
        },
        50,
    ));
    let r = common::run_with(spec, 110, imbalance_on());
    let rep = r.report();
    let text = slowrank_coordinator::render_human(&rep);
    let v = rep
        .verdicts
        .iter()
        .find(|v| v.structural.is_none() && v.rank == 3)
        .unwrap_or_else(|| panic!("rank 3 not named: {text}"));
    assert_eq!(v.kind, Kind::Compute, "{text}");
    assert!(
        v.first_seen_iteration >= 49 && v.first_seen_iteration <= 50 + 25,
        "first seen at {}: {text}",
        v.first_seen_iteration
    );
    assert!(v.active, "{text}");
    assert!(
        rep.verdicts
            .iter()
            .all(|v| v.structural.is_some() || v.rank == 3),
        "only rank 3 is a slow rank: {text}"
    );
}

#[test]
fn a_whole_job_that_slows_is_not_told_it_is_imbalanced() {
    // Every rank's GPU 1.3× slower from iteration 40 (a slower input for
    // all, a host-wide throttle): the job slows, and its jitter (0.2) is
    // imbalance that balancing would save, as it always was. The slowdown
    // is the job's, not imbalance's: the spread between ranks did not grow.
    for seed in 1..=4 {
        let mut spec = SynthSpec::dp(8, 1);
        spec.seed = seed;
        spec.jitter = 0.2;
        for rank in 0..8 {
            spec.faults.push(Fault::persistent(
                FaultKind::Compute { rank, factor: 1.3 },
                40,
            ));
        }
        let r = common::run_with(spec, 100, imbalance_on());
        let rep = r.report();
        assert!(
            rep.verdicts.is_empty(),
            "seed {seed}: {}",
            slowrank_coordinator::render_human(&rep)
        );
    }
}
