//! Healthy noisy jobs get no verdict; the clock is right; memory stays bounded.

mod common;

use slowrank_synth::{Fault, FaultKind, GpuTiming, SynthSpec};

fn assert_quiet(spec: SynthSpec, iterations: u64) {
    let r = common::run(spec, iterations);
    let rep = r.report();
    assert!(
        rep.verdicts.is_empty() && rep.hangs.is_empty() && r.events.is_empty(),
        "{}",
        slowrank_coordinator::render_human(&rep)
    );
    assert!(
        rep.job.iterations_observed + 3 >= iterations,
        "{:?}",
        rep.job
    );
}

#[test]
fn healthy_dp8_with_5pct_jitter_has_no_verdict() {
    for seed in [1, 2, 3, 4, 5] {
        let mut spec = SynthSpec::dp(2, 4);
        spec.seed = seed;
        assert_quiet(spec, 120);
    }
}

/// Verbs latencies say a pair is slow, but no transfer it took part in was
/// measured (no GPU-side completions: the deep probes just attached, or its
/// members do not all post): the cost is unknown, and a verdict must say
/// what it costs, so none opens (the 30-minute soak opened three such,
/// "costing 0%", each while a deep window was starting).
#[test]
fn slow_link_latency_without_measured_transfers_names_no_link() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 25;
    spec.gpu_timing = GpuTiming::None;
    spec.faults.push(Fault::persistent(
        FaultKind::Link {
            a: 3,
            b: 4,
            factor: 3.0,
        },
        20,
    ));
    let r = common::run(spec, 80);
    let rep = r.report();
    assert!(
        rep.verdicts.iter().all(|v| v.link.is_none()),
        "{}",
        slowrank_coordinator::render_human(&rep)
    );
}

#[test]
fn healthy_dp16_and_host_bound_have_no_verdict() {
    let mut spec = SynthSpec::dp(4, 4);
    spec.seed = 16;
    assert_quiet(spec, 100);
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 17;
    spec.host_ns_per_layer = 3_000_000;
    assert_quiet(spec, 100);
}

#[test]
fn healthy_3d_layouts_have_no_verdict() {
    let mut spec = SynthSpec::three_d(2, 2, 4, 4);
    spec.seed = 31;
    assert_quiet(spec, 100);
    let mut spec = SynthSpec::three_d(1, 4, 2, 2);
    spec.seed = 32;
    spec.host_ns_per_layer = 1_500_000;
    assert_quiet(spec, 100);
}

#[test]
fn healthy_with_partial_or_no_gpu_times_has_no_verdict() {
    for timing in [GpuTiming::None, GpuTiming::InterHostOnly] {
        let mut spec = SynthSpec::three_d(2, 2, 4, 4);
        spec.seed = 33;
        spec.gpu_timing = timing;
        assert_quiet(spec, 80);
        let mut spec = SynthSpec::dp(2, 4);
        spec.seed = 34;
        spec.gpu_timing = timing;
        assert_quiet(spec, 80);
    }
}

#[test]
fn iteration_count_matches_the_stream() {
    let r = common::run(SynthSpec::dp(2, 4), 50);
    let rep = r.report();
    assert_eq!(rep.job.instances_per_iteration, Some(4));
    assert_eq!(rep.job.iterations_observed, 48); // two in the sealing lag
    let r = common::run(SynthSpec::three_d(2, 2, 4, 4), 50);
    assert_eq!(r.report().job.instances_per_iteration, Some(4));
}

#[test]
fn clock_offsets_within_50us_of_truth() {
    let spec = SynthSpec::three_d(2, 2, 4, 4);
    let r = common::run(spec, 40);
    let truth = r.generator.truth().clocks.clone();
    let rep = r.report();
    assert_eq!(rep.clock.hosts.len(), 4);
    for (h, t) in truth.iter().enumerate() {
        let name = format!("node-{h}");
        for true_ns in [r.now as u64 - 500_000_000, r.now as u64] {
            let (est, bound) = r.analyzer.to_coord(&name, t.agent_ns(true_ns));
            let err = (est - true_ns as i64).abs() as f64;
            assert!(err < 50_000.0, "{name}: {err} ns");
            assert!(err <= bound, "{name}: {err} ns above bound {bound}");
        }
        let hc = rep.clock.hosts.iter().find(|x| x.host == name).unwrap();
        // 13 s of probes pin drift to a few ppm; the offset is what matters.
        assert!((hc.drift_ppm.unwrap() - t.drift_ppm).abs() < 6.0, "{hc:?}");
    }
    assert!(rep.clock.max_error_us.unwrap() < 100.0);
}

#[test]
fn memory_stays_bounded_over_a_long_run() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.faults.push(slowrank_synth::Fault {
        period: Some((30, 10)),
        ..slowrank_synth::Fault::persistent(
            slowrank_synth::FaultKind::Compute {
                rank: 2,
                factor: 1.5,
            },
            10,
        )
    });
    let r = common::run(spec, 600);
    let m = r.analyzer.metrics();
    assert!(m.open_instances < 64, "{m:?}");
    assert!(m.pending_instances == 0);
    assert!(m.verdicts_total == 1 && m.verdict_trackers <= 2, "{m:?}");
    assert!(m.recent_instances <= 400_000 / 8);
    assert_eq!(m.iterations_sealed, 598);
    let prom = m.to_prometheus();
    assert!(prom.contains("slowrank_rank_lateness_seconds{rank=\"2\"}"));
    assert!(prom.contains("slowrank_verdicts_opened_total 1"));
}

#[test]
fn a_host_whose_data_arrives_late_is_not_hung() {
    // Host 1's agent ships its batches 2.5 s late (an overloaded machine, a
    // slow uplink) and the hang timeout is 1 s: its ranks' records of the
    // newest instances are missing for longer than the timeout, but its
    // batches say how far they reach, so nothing is declared hung — not
    // even as a resolved stall.
    use slowrank_coordinator::{Analyzer, AnalyzerConfig};
    use slowrank_synth::Generator;
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 41;
    let mut cfg = AnalyzerConfig::default();
    cfg.join.hang_timeout_ns = 1_000_000_000;
    let a = Analyzer::new(cfg);
    let mut g = Generator::new(spec);
    for (h, s) in g.initial_samples() {
        a.add_clock_sample(&h, s).unwrap();
    }
    let mut held: std::collections::VecDeque<(u64, slowrank_shared::wire::Batch)> =
        Default::default();
    let mut events = Vec::new();
    for _ in 0..400 {
        let out = g.next_iteration();
        for (h, s) in &out.samples {
            a.add_clock_sample(h, *s).unwrap();
        }
        for (recv, b) in out.batches {
            if b.host == "node-1" {
                held.push_back((recv + 2_500_000_000, b));
            } else {
                a.ingest(&b, recv);
            }
        }
        let now = out.end_ns + 3_000_000;
        while held.front().is_some_and(|h| h.0 <= now) {
            let (recv, b) = held.pop_front().unwrap();
            a.ingest(&b, recv);
        }
        events.extend(a.tick(now as i64));
    }
    let rep = a.report();
    assert!(
        rep.hangs.is_empty() && rep.resolved_stalls.is_empty() && rep.verdicts.is_empty(),
        "{}",
        slowrank_coordinator::render_human(&rep)
    );
    assert!(
        rep.job.iterations_observed > 200,
        "{:?} {:?}",
        rep.job,
        rep.ingest
    );
}
