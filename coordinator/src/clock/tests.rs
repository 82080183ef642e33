use super::*;
use slowrank_synth::{ClockTruth, Rng};

/// Hosts with ms offsets and tens-of-ppm drift, probes with 50–500 µs
/// asymmetric jitter: the estimate is within 50 µs and within its bound.
#[test]
fn estimate_within_50us_of_truth() {
    let hosts = [
        ClockTruth::new(2_500_000, 30.0, 3_000_000_000_000),
        ClockTruth::new(-7_300_000, -45.0, 9_000_000_000),
        ClockTruth::new(1_500_000, 20.0, 123_000_000_000),
        ClockTruth::new(0, 0.0, 50_000_000_000),
    ];
    let mut rng = Rng::new(11);
    for (h, truth) in hosts.iter().enumerate() {
        let mut est = ClockEstimator::new(ClockConfig::default());
        // 10 probes per second for two minutes.
        for i in 0..1200u64 {
            let t = 10_000_000_000 + i * 100_000_000 + rng.below(1_000_000);
            est.add_sample(truth.probe(t, &mut rng)).unwrap();
        }
        for t in [20_000_000_000u64, 70_000_000_000, 129_000_000_000] {
            let agent = truth.agent_ns(t);
            let err = (est.to_coord(agent) - t as i64).abs() as f64;
            assert!(err < 50_000.0, "host {h}: error {err} ns at t={t}");
            assert!(
                err <= est.error_bound_ns(),
                "host {h}: error {err} ns above bound {}",
                est.error_bound_ns()
            );
        }
        let summary = est.summary("h");
        let drift = summary.drift_ppm.unwrap();
        assert!(
            (drift - truth.drift_ppm).abs() < 2.0,
            "host {h}: drift {drift}"
        );
        assert!(
            summary.error_bound_us.unwrap() < 60.0,
            "host {h}: {summary:?}"
        );
    }
}

/// Two minutes of probes on a drifting host, as an earlier life fitted
/// them; `t` is the coordinator time of the last probe.
fn fitted(truth: &ClockTruth) -> (ClockEstimator, u64) {
    let mut rng = Rng::new(5);
    let mut est = ClockEstimator::new(ClockConfig::default());
    let mut t = 0;
    for i in 0..1200u64 {
        t = 10_000_000_000 + i * 100_000_000;
        est.add_sample(truth.probe(t, &mut rng)).unwrap();
    }
    (est, t)
}

/// A new life seeded 30 s after the model maps at once, within its
/// bound, and the bound is the old one widened by the drift uncertainty
/// over the time elapsed (more so the longer ago).
#[test]
fn seed_maps_at_once_with_a_bound_widened_by_elapsed_time() {
    let truth = ClockTruth::new(2_500_000, 30.0, 3_000_000_000_000);
    let (est, t_end) = fitted(&truth);
    let seed = est.seed().expect("a fitted model seeds");
    // Estimated at its newest kept probe: the best of the last 1 s bucket.
    let since = t_end as f64 - seed.estimated_coord_ns as f64;
    assert!((-1e6..1.1e9).contains(&since), "{since}");
    let now = t_end + 30_000_000_000;
    let new = ClockEstimator::seeded(ClockConfig::default(), &seed, now).expect("seeded");
    assert!(new.is_seeded());
    assert_eq!(new.summary("h").source, "earlier-life");
    let widened =
        seed.error_bound_ns + seed.extrapolation_rate * (now - seed.estimated_coord_ns) as f64;
    assert!(
        (new.error_bound_ns() - widened).abs() < 1_000.0,
        "{} vs {widened}",
        new.error_bound_ns()
    );
    assert!(new.error_bound_ns() > seed.error_bound_ns);
    // Records cut now and a little before (a spool) map within the bound.
    for t in [now - 5_000_000_000, now] {
        let (at, bound) = new.map().coord_and_bound(truth.agent_ns(t));
        let err = (at - t as i64).abs() as f64;
        assert!(err <= bound, "error {err} ns over bound {bound}");
    }
    let later = ClockEstimator::seeded(ClockConfig::default(), &seed, now + 600_000_000_000)
        .expect("seeded");
    assert!(later.error_bound_ns() > new.error_bound_ns());
    // Kept again by a life that got no probe of its own yet.
    assert_eq!(new.seed(), Some(seed));
}

#[test]
fn fresh_probe_replaces_the_seed() {
    let truth = ClockTruth::new(-7_300_000, -45.0, 9_000_000_000);
    let (est, t_end) = fitted(&truth);
    let seed = est.seed().unwrap();
    let now = t_end + 10_000_000_000;
    let mut new = ClockEstimator::seeded(ClockConfig::default(), &seed, now).unwrap();
    new.add_sample(truth.probe(now, &mut Rng::new(9))).unwrap();
    assert!(!new.is_seeded());
    assert_eq!(new.fit().unwrap().samples_used, 1);
    assert_eq!(new.summary("h").source, "probes");
}

/// A seed from before `now` only: a time before its estimate means the
/// coordinator's host rebooted (another CLOCK_MONOTONIC).
#[test]
fn seed_refused_from_another_boot_or_unusable() {
    let truth = ClockTruth::new(0, 0.0, 50_000_000_000);
    let (est, t_end) = fitted(&truth);
    let seed = est.seed().unwrap();
    assert!(ClockEstimator::seeded(ClockConfig::default(), &seed, t_end / 2).is_none());
    let nan = ClockSeed {
        offset_ns: f64::NAN,
        ..seed
    };
    assert!(ClockEstimator::seeded(ClockConfig::default(), &nan, t_end + 1).is_none());
}

/// An agent host that rebooted has another clock: a batch that the seed
/// would place after its own arrival drops the seed.
#[test]
fn seed_contradicted_by_a_batch_arrival_is_dropped() {
    let truth = ClockTruth::new(1_500_000, 20.0, 123_000_000_000);
    let (est, t_end) = fitted(&truth);
    let seed = est.seed().unwrap();
    let now = t_end + 1_000_000_000;
    let mut new = ClockEstimator::seeded(ClockConfig::default(), &seed, now).unwrap();
    // Consistent: cut 1 ms before it arrived.
    new.observe_one_way(truth.agent_ns(now - 1_000_000), now);
    assert!(new.is_seeded());
    // Another boot's clock, a minute ahead: the seed maps the cut a
    // minute after the batch arrived.
    new.observe_one_way(truth.agent_ns(now) + 60_000_000_000, now + 1_000_000);
    assert!(!new.is_seeded());
    assert!(new.fit().is_none());
    assert_eq!(new.seeds_dropped(), 1);
}

#[test]
fn refuses_impossible_probes() {
    let mut est = ClockEstimator::new(ClockConfig::default());
    assert!(matches!(
        est.add_sample(ClockSample {
            coord_send_ns: 10,
            agent_mono_ns: 5,
            agent_hold_ns: 0,
            coord_recv_ns: 9,
            udp: false,
        }),
        Err(ClockError::NegativeRtt { .. })
    ));
    assert!(matches!(
        est.add_sample(ClockSample {
            coord_send_ns: 0,
            agent_mono_ns: 5,
            agent_hold_ns: 0,
            coord_recv_ns: 1_000_000_000,
            udp: false,
        }),
        Err(ClockError::RttTooLarge { .. })
    ));
    assert!(est.fit().is_none());
    assert!(est.error_bound_ns().is_infinite());
}

#[test]
fn completion_shift_stays_inside_probe_bound() {
    let truth = ClockTruth::new(1_000_000, 0.0, 0);
    let mut rng = Rng::new(3);
    let mut est = ClockEstimator::new(ClockConfig::default());
    for i in 0..100u64 {
        est.add_sample(truth.probe(i * 100_000_000, &mut rng))
            .unwrap();
    }
    let bound = est.error_bound_ns();
    let before = est.to_coord(5_000_000_000);
    // A residual inside the bound refines the line…
    est.apply_completion_residual(bound / 2.0);
    let refined = est.to_coord(5_000_000_000);
    assert!(((before - refined) as f64 - bound / 2.0).abs() <= 1.0);
    assert_eq!(est.summary("h").completion_inconsistent, 0);
    // …a wildly wrong one contradicts the probes: counted, not applied.
    est.apply_completion_residual(10_000_000.0);
    let after = est.to_coord(5_000_000_000);
    assert_eq!(before, after);
    assert_eq!(est.summary("h").completion_inconsistent, 1);
}

/// Probes stop, batches keep coming: the quoted bound widens with the
/// gap and still covers the truth; a fresh probe brings it back.
#[test]
fn bound_grows_when_probes_stop() {
    let truth = ClockTruth::new(2_000_000, 35.0, 7_000_000_000);
    let mut rng = Rng::new(5);
    let mut est = ClockEstimator::new(ClockConfig::default());
    for i in 0..300u64 {
        est.add_sample(truth.probe(1_000_000_000 + i * 100_000_000, &mut rng))
            .unwrap();
    }
    let fresh = est.error_bound_ns();
    assert_eq!(est.summary("h").probe_age_ms, Some(0.0));
    // Two minutes of batches, no probe answered.
    let t = 151_000_000_000u64;
    let agent = truth.agent_ns(t);
    est.observe_one_way(agent, t + 300_000);
    let stale = est.error_bound_ns();
    assert!(
        stale >= fresh + 119_000.0,
        "bound {fresh} ns -> {stale} ns after two minutes without probes"
    );
    let err = (est.to_coord(agent) - t as i64).abs() as f64;
    assert!(err <= stale, "error {err} ns above bound {stale}");
    let (_, quoted) = est.map().coord_and_bound(agent);
    assert_eq!(quoted, stale);
    let age = est.summary("h").probe_age_ms.unwrap();
    assert!((age - 120_000.0).abs() < 200.0, "probe age {age} ms");
    // Inside the probed span the bound is the fit's own.
    let (_, inside) = est.map().coord_and_bound(truth.agent_ns(10_000_000_000));
    assert_eq!(inside, est.fit().unwrap().error_bound_ns);
    est.add_sample(truth.probe(t, &mut rng)).unwrap();
    assert!(est.error_bound_ns() < stale);
}

/// Before a drift is fitted, extrapolating assumes the worst drift.
#[test]
fn unfitted_drift_extrapolates_at_the_worst_rate() {
    let truth = ClockTruth::new(0, 40.0, 0);
    let mut rng = Rng::new(9);
    let mut est = ClockEstimator::new(ClockConfig::default());
    for i in 0..10u64 {
        est.add_sample(truth.probe(i * 100_000_000, &mut rng))
            .unwrap();
    }
    assert_eq!(est.fit().unwrap().drift, 0.0);
    let t = 10_000_000_000u64;
    let agent = truth.agent_ns(t);
    let (at, bound) = est.map().coord_and_bound(agent);
    let err = (at - t as i64).abs() as f64;
    assert!(err > 300_000.0, "40 ppm over 10 s moved only {err} ns");
    assert!(err <= bound, "error {err} ns above bound {bound}");
}

#[test]
fn one_way_fallback_before_probes() {
    let mut est = ClockEstimator::new(ClockConfig::default());
    est.observe_one_way(1_000, 5_000_000);
    est.observe_one_way(2_000, 4_000_000);
    assert_eq!(est.error_bound_ns(), 5_000_000.0);
    assert_eq!(est.summary("h").source, "batch-arrival");
}
