use super::detect::marker_period;
use super::*;
use slowrank_synth::Rng;

fn feed(clock: &mut IterationClock, per_step: u64, steps: u64, jitter: f64, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut t = 1_000_000i64;
    let mut seq = 0;
    for _ in 0..steps {
        t += (20_000_000.0 * (1.0 + jitter * rng.sym())) as i64;
        for b in 0..per_step {
            if b > 0 {
                t += (1_500_000.0 * (1.0 + jitter * rng.sym())) as i64;
            }
            clock.observe(1, 8, seq, t, t + 500_000, Marks::default());
            seq += 1;
        }
    }
}

#[test]
fn finds_four_buckets_per_step() {
    let mut c = IterationClock::new(IterationConfig::default());
    feed(&mut c, 4, 40, 0.05, 1);
    let p = c.period().unwrap();
    assert_eq!((p.instances_per_iteration, p.phase), (4, 0));
    assert_eq!(c.iteration_of_seq(11), Some(2));
    assert_eq!(c.sealed_through(), Some(37));
    let s = c.step_ns().unwrap();
    assert!((s - 24_500_000.0).abs() < 2_000_000.0, "{s}");
}

#[test]
fn one_per_step_under_noise_is_period_one() {
    let mut c = IterationClock::new(IterationConfig::default());
    feed(&mut c, 1, 60, 0.05, 2);
    assert_eq!(c.period().unwrap().instances_per_iteration, 1);
}

#[test]
fn one_per_step_whose_length_changed_is_period_one() {
    // 36 steps of 20 ms, then a slowdown: steps of 26 ms ± 15 %. The
    // gaps' spread is over a tenth of their mean, and no pattern.
    let mut c = IterationClock::new(IterationConfig::default());
    let mut rng = Rng::new(11);
    let mut t = 0i64;
    for seq in 0..50u64 {
        let (ms, jitter) = if seq < 36 { (20.0, 0.05) } else { (26.0, 0.15) };
        t += (ms * 1e6 * (1.0 + jitter * rng.sym())) as i64;
        c.observe(1, 4, seq, t, t + 500_000, Marks::default());
    }
    let p = c.period().expect("told after 48 instances");
    assert_eq!(
        (p.instances_per_iteration, p.method),
        (1, Method::EvenSpacing)
    );
}

#[test]
fn a_per_layer_communicator_is_not_one_per_step_before_its_steps_show() {
    // 24 alike instances a step (one per layer and micro-batch), then
    // the optimizer and data loading: after 50 instances (two steps)
    // the step cannot show yet, and must not be read as one instance.
    let mut c = IterationClock::new(IterationConfig::default());
    let mut rng = Rng::new(13);
    let mut t = 0i64;
    for seq in 0..50u64 {
        t += if seq % 24 == 0 {
            30_000_000
        } else {
            (300_000.0 * (1.0 + 0.05 * rng.sym())) as i64
        };
        c.observe(1, 8, seq, t, t + 100_000, Marks::default());
    }
    assert_eq!(c.period(), None);
}

#[test]
fn a_sync_before_every_instance_is_one_per_step_whatever_the_gaps() {
    // One all-reduce a step, a straggler slow three steps in four: the
    // gaps repeat every 4 instances, the step-ending sync every one.
    let mut c = IterationClock::new(IterationConfig::default());
    let mut t = 0i64;
    for seq in 0..60u64 {
        let slow = seq % 4 != 0;
        t += if slow { 56_000_000 } else { 20_000_000 };
        let marks = Marks {
            sync_wait_ns: if slow { 30_000_000 } else { 12_000_000 },
            ..Marks::default()
        };
        c.observe(1, 16, seq, t, t + 500_000, marks);
    }
    let p = c.period().expect("told");
    assert_eq!(
        (p.instances_per_iteration, p.method),
        (1, Method::SyncMarker)
    );
}

#[test]
fn one_per_step_that_became_three_times_longer_is_period_one() {
    // A 2.8x straggler from step 22: the gaps are two groups, and the
    // middle half of them spans both.
    let mut c = IterationClock::new(IterationConfig::default());
    let mut rng = Rng::new(12);
    let mut t = 0i64;
    for seq in 0..50u64 {
        let ms = if seq < 22 { 20.0 } else { 56.0 };
        t += (ms * 1e6 * (1.0 + 0.05 * rng.sym())) as i64;
        c.observe(1, 8, seq, t, t + 500_000, Marks::default());
    }
    let p = c.period().expect("told after 48 instances");
    assert_eq!(
        (p.instances_per_iteration, p.method),
        (1, Method::EvenSpacing)
    );
}

#[test]
fn time_maps_to_the_iteration_it_ends_in() {
    let mut c = IterationClock::new(IterationConfig::default());
    feed(&mut c, 4, 40, 0.0, 3);
    let end5 = c.end_of(5).unwrap();
    assert_eq!(c.iteration_at(end5 - 1_000), Some(5));
    assert_eq!(c.iteration_at(end5 + 1_000), Some(6));
}

/// 3-D job: the 2-member tensor-parallel comm completes 16 instances per
/// step long before the 4-member data-parallel comm's first joins arrive;
/// the clock must wait and lock on the larger one.
#[test]
fn waits_for_a_larger_communicator_already_issuing() {
    let mut c = IterationClock::new(IterationConfig::default());
    // A start-up barrier on the world: not a candidate to wait for.
    c.observe(0x1, 16, 0, 0, 1_000, Marks::default());
    c.observe(0x1, 16, 1, 2_000, 3_000, Marks::default());
    c.note_issued(0xd, 4, 9);
    let step = 150_000_000i64;
    for s in 0..64u64 {
        let t = (s / 16) as i64 * step + (s % 16) as i64 * 5_000_000;
        c.observe(0x7, 2, s, t, t + 1_000_000, Marks::default());
    }
    assert!(c.period().is_none(), "locked on the tensor-parallel comm");
    for k in 0..16u64 {
        for b in 0..4u64 {
            let t = k as i64 * step + 100_000_000 + b as i64 * 8_000_000;
            c.observe(0xd, 4, k * 4 + b, t, t + 2_000_000, Marks::default());
        }
    }
    let p = c.period().expect("locked");
    assert_eq!((p.comm_id, p.instances_per_iteration), (0xd, 4));
}

/// Buckets evenly spaced in time (the gaps alone say "one per step"),
/// but the step-ending sync lands before every fifth: five per step,
/// starting after the sync.
#[test]
fn the_step_ending_sync_tells_the_step_when_gaps_cannot() {
    let mut c = IterationClock::new(IterationConfig::default());
    let mut rng = Rng::new(4);
    for seq in 0..80u64 {
        let t = seq as i64 * 10_000_000 + (2e6 * rng.sym()) as i64;
        let first = seq % 5 == 2;
        let marks = Marks {
            op: 0,
            bytes: 1 << 20,
            launches: if first { 60 } else { 20 },
            sync_wait_ns: if first { 30_000_000 } else { 40_000 },
        };
        c.observe(1, 8, seq, t, t + 1_000_000, marks);
    }
    let p = c.period().unwrap();
    assert_eq!(
        (p.instances_per_iteration, p.phase, p.method),
        (5, 2, Method::SyncMarker)
    );
}

/// Without syncs or launch counts (probes off), a repeating byte
/// pattern still tells the step; the phase comes from the gaps.
#[test]
fn a_bytes_pattern_tells_the_step_without_syncs() {
    let mut c = IterationClock::new(IterationConfig::default());
    let sizes = [25u64 << 20, 25 << 20, 25 << 20, 7 << 20];
    let mut t = 0i64;
    for seq in 0..80u64 {
        t += if seq % 4 == 0 { 20_000_000 } else { 1_500_000 };
        let marks = Marks {
            bytes: sizes[(seq % 4) as usize],
            ..Marks::default()
        };
        c.observe(1, 8, seq, t, t + 500_000, marks);
    }
    let p = c.period().unwrap();
    assert_eq!(p.instances_per_iteration, 4);
    assert_eq!(p.method, Method::OpBytesPattern);
}

/// Noise everywhere and no marker: not a guess dressed as a step.
#[test]
fn nothing_repeating_is_undetermined() {
    let mut c = IterationClock::new(IterationConfig::default());
    let mut rng = Rng::new(5);
    let mut t = 0i64;
    for seq in 0..80u64 {
        t += (10_000_000.0 * (1.0 + 0.9 * rng.sym())) as i64;
        c.observe(1, 8, seq, t, t + 500_000, Marks::default());
    }
    // Not given up on while a longer step could still show...
    assert!(c.period().is_none());
    for seq in 80..400u64 {
        t += (10_000_000.0 * (1.0 + 0.9 * rng.sym())) as i64;
        c.observe(1, 8, seq, t, t + 500_000, Marks::default());
    }
    // ... but said once the patience is spent.
    let p = c.period().unwrap();
    assert_eq!(p.instances_per_iteration, 1);
    assert_eq!(p.method, Method::Undetermined);
}

/// Launches counted only in one sampled window (issue 23): a block of
/// ons amid zeros agrees with itself two instances on almost everywhere
/// but is no step marker. Seen on a random pp2×dp8 spec: the step was
/// read as two of its six buckets (0.9 ms against 333 ms). The gaps
/// tell it.
#[test]
fn a_windowed_launch_count_is_no_step_marker() {
    let mut c = IterationClock::new(IterationConfig::default());
    let mut t = 0i64;
    for seq in 0..96u64 {
        t += if seq % 6 == 0 { 330_000_000 } else { 300_000 };
        let marks = Marks {
            bytes: 64 << 20,
            launches: if (24..42).contains(&seq) {
                [5, 5, 4][(seq % 3) as usize]
            } else {
                0
            },
            ..Marks::default()
        };
        c.observe(1, 8, seq, t, t + 1_000_000, marks);
    }
    let p = c.period().unwrap();
    assert_eq!(
        (p.instances_per_iteration, p.phase, p.method),
        (6, 0, Method::GapPattern)
    );
}

/// A rare marker that fires at random (a sync now and then) matches any
/// period on its offs alone; it must not be taken for one.
#[test]
fn a_rare_random_marker_has_no_period() {
    let mut rng = Rng::new(9);
    let f: Vec<u64> = (0..96).map(|_| u64::from(rng.sym() > 0.9)).collect();
    assert!(f.contains(&1));
    assert_eq!(marker_period(&f), None);
    // ... while one that fires before every fifth instance has one.
    let g: Vec<u64> = (0..96).map(|i| u64::from(i % 5 == 2)).collect();
    assert_eq!(marker_period(&g), Some(5));
}

/// A tensor-parallel group with a collective per layer and micro-batch
/// (24 a step) is the reference of a tp2×pp2×dp2 job: 48 instances are
/// two steps, too few to see the period; the clock waits for more
/// instead of counting each instance as a step (seen on a random spec:
/// a 0.2 ms "step" against 473 ms).
#[test]
fn a_long_step_is_waited_for_not_called_undetermined() {
    let mut c = IterationClock::new(IterationConfig::default());
    let mut rng = Rng::new(11);
    let mut t = 0i64;
    for seq in 0..240u64 {
        t += if seq % 24 == 0 {
            200_000_000
        } else {
            (300_000.0 * (1.0 + 0.8 * rng.sym())) as i64
        };
        c.observe(1, 2, seq, t, t + 200_000, Marks::default());
    }
    let p = c.period().expect("locked");
    assert_eq!(
        (p.instances_per_iteration, p.phase, p.method),
        (24, 0, Method::GapPattern)
    );
}

/// A dp8 job's 4-bucket step beside a CPU hog (an agent-restart run): the
/// step-ending sync waited 6–44 ms (medians over members, as recorded),
/// the buckets' none. Read as 16 buckets a step when a quarter of the
/// longest wait was the cut.
#[test]
fn step_ends_that_wait_unevenly_still_mark_every_step() {
    let waits_us = [
        44269, 18938, 17049, 8071, 12361, 15482, 14785, 14619, 19153, 14857, 15098, 10490, 6258,
        23982, 43298, 24231, 20695,
    ];
    let mut c = IterationClock::new(IterationConfig::default());
    let mut t = 0i64;
    for seq in 0..64u64 {
        let end = seq % 4 == 0 && seq > 0;
        t += if end { 40_000_000 } else { 3_000_000 };
        let marks = Marks {
            op: 1,
            bytes: 26 << 20,
            launches: 20,
            sync_wait_ns: if end {
                waits_us[(seq / 4 - 1) as usize % waits_us.len()] * 1000
            } else {
                0
            },
        };
        c.observe(1, 8, seq, t, t + 500_000, marks);
    }
    let p = c.period().expect("told");
    assert_eq!(
        (p.instances_per_iteration, p.method),
        (4, Method::SyncMarker)
    );
}

/// Each bucket's incidental sync (a D2H copy, 40–60 µs) is not a step's
/// end beside the 10–30 ms one that is.
#[test]
fn incidental_syncs_are_not_step_ends() {
    let mut c = IterationClock::new(IterationConfig::default());
    let mut t = 0i64;
    for seq in 0..64u64 {
        let end = seq % 4 == 0 && seq > 0;
        t += if end { 40_000_000 } else { 3_000_000 };
        let marks = Marks {
            op: 1,
            bytes: 26 << 20,
            launches: 20,
            sync_wait_ns: if end {
                (10 + (seq * 7) % 21) * 1_000_000
            } else {
                (40 + (seq * 3) % 21) * 1_000
            },
        };
        c.observe(1, 8, seq, t, t + 500_000, marks);
    }
    let p = c.period().expect("told");
    assert_eq!(
        (p.instances_per_iteration, p.method),
        (4, Method::SyncMarker)
    );
}

#[test]
fn an_iteration_is_whole_once_its_last_instance_is_seen_before_it_is_sealed() {
    let mut c = IterationClock::new(IterationConfig::default());
    feed(&mut c, 4, 40, 0.0, 1);
    // 40 steps of 4: iterations 0..=39 seen whole, sealed through 37.
    assert_eq!((c.last_ended(), c.sealed_through()), (Some(39), Some(37)));
    let d = c.whole_duration_of(39).expect("39 and 38 are whole");
    assert_eq!(Some(d), c.duration_of(39));
    // Two instances of iteration 40: it has an end, not a final one.
    let t = c.end_of(39).unwrap();
    c.observe(1, 8, 160, t + 20_000_000, t + 20_500_000, Marks::default());
    c.observe(1, 8, 161, t + 22_000_000, t + 22_500_000, Marks::default());
    assert_eq!(c.last_ended(), Some(40));
    assert!(c.duration_of(40).is_some());
    assert_eq!(c.whole_duration_of(40), None);
    // Its last instance: whole.
    c.observe(1, 8, 163, t + 26_000_000, t + 26_500_000, Marks::default());
    assert_eq!(c.whole_duration_of(40), Some(26_500_000.0));
    // An iteration whose predecessor is not whole is not either.
    c.observe(1, 8, 171, t + 60_000_000, t + 60_500_000, Marks::default());
    assert_eq!(c.whole_duration_of(42), None);
}
