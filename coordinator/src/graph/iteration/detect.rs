//! Where a training step begins in the reference communicator's instance
//! stream: the period and phase, from the markers every step repeats (the
//! sync that ends it, the forward pass's launch burst, the (op, bytes)
//! sequence) or else from the pattern of the gaps. Pure functions over one
//! run of instances.

use std::collections::BTreeMap;

use super::{CoordNs, Marks, Method};

/// Share of positions where a marker must equal the marker one period
/// later for the period to count: a step that is sometimes odd (a
/// checkpoint, an evaluation pass, a descheduled host that syncs late) must
/// not hide the pattern, a coincidence must not make one.
const MARK_AGREEMENT: f64 = 0.9;

/// Returns `(period, phase, method)` from what every step repeats before
/// the same instance — the sync that ends a step, the forward pass's launch
/// burst, the (op, bytes) sequence — or `None` when no marker varies.
/// Markers are tried in that order; a marker that repeats with a period that
/// another, stronger marker's period is a multiple of defers to it (a
/// two-bucket op/bytes alternation inside a four-bucket step).
pub(super) fn detect_by_marks(
    run: &[(u64, CoordNs, CoordNs, Marks)],
) -> Option<(u64, u64, Method)> {
    let n = run.len();
    if n < 8 {
        return None;
    }
    // A step-ending sync: far longer than a bucket's incidental syncs.
    let floor = step_sync_floor(run.iter().map(|r| r.3.sync_wait_ns));
    let sync: Vec<u64> = run
        .iter()
        .map(|r| u64::from(floor.is_some_and(|f| r.3.sync_wait_ns >= f)))
        .collect();
    // A step-ending sync before (nearly) every instance: one instance per
    // step, whatever pattern the gaps show. An intermittent straggler
    // (slow 3 steps in 4) gives the gaps of a 1-per-step data-parallel
    // all-reduce a period of 4, which a random dp16 spec's step was read as
    // (2.47 s against the job's 0.74 s).
    let synced = sync.iter().filter(|x| **x == 1).count();
    if synced * 10 >= n * 9 {
        return Some((1, 0, Method::SyncMarker));
    }
    let mut launches: Vec<u32> = run.iter().map(|r| r.3.launches).collect();
    launches.sort_unstable();
    let med_launch = launches[n / 2];
    let burst: Vec<u64> = run
        .iter()
        .map(|r| u64::from(r.3.launches > 0 && r.3.launches as f64 >= 1.5 * med_launch as f64))
        .collect();
    let opb: Vec<u64> = run
        .iter()
        .map(|r| (u64::from(r.3.op) << 56) ^ r.3.bytes)
        .collect();
    let found: Vec<(u64, Option<u64>, Method)> = [
        (&sync, Method::SyncMarker, true),
        (&burst, Method::LaunchBurst, true),
        (&opb, Method::OpBytesPattern, false),
    ]
    .into_iter()
    .filter_map(|(f, method, phased)| {
        let p = marker_period(f)?;
        // The instance after the marker's "on" residue starts a step.
        let phase = phased
            .then(|| {
                (0..p).max_by_key(|r| {
                    run.iter()
                        .zip(f.iter())
                        .filter(|(x, on)| x.0 % p == *r && **on == 1)
                        .count()
                })
            })
            .flatten();
        Some((p, phase, method))
    })
    .collect();
    // The longest period; among equals, the first marker (the strongest).
    let best = found.iter().rev().max_by_key(|(p, _, _)| *p).copied()?;
    // Every marker that found a period must agree with the longest one.
    if found.iter().any(|(p, _, _)| best.0 % p != 0) {
        return None;
    }
    let phase = best
        .1
        .or_else(|| {
            found
                .iter()
                .find_map(|(q, o, _)| (*q == best.0).then_some(*o).flatten())
        })
        .unwrap_or_else(|| gap_phase(run, best.0));
    Some((best.0, phase % best.0, best.2))
}

/// The shortest sync wait that counts as a step's end, or `None` when no
/// instance waited. The waits of the instances that waited split where
/// consecutive ones (sorted) differ by the largest factor, when that
/// factor is at least [`SYNC_SPLIT`] (incidental syncs below, the steps'
/// ends above); else, no clear split, every wait of at least a quarter of
/// the longest. Not a quarter of the longest
/// alone: one step's end that waited 44 ms beside a CPU hog, where the
/// others waited 6–24 ms, left half of them "not a step's end", and a
/// dp8 job's 4-bucket step was read as 16 buckets (agent-restart test,
/// 2 of 20 runs).
fn step_sync_floor(waits: impl Iterator<Item = u64>) -> Option<u64> {
    // Among the instances that waited at all: a bucket's incidental sync
    // (µs) is not a step's end, and "none" to "some" is always the widest
    // factor.
    let mut w: Vec<u64> = waits.filter(|w| *w > 0).collect();
    w.sort_unstable();
    w.dedup();
    let (&least, &max) = (w.first()?, w.last()?);
    let split = w
        .windows(2)
        .map(|p| (p[1] as f64 / p[0] as f64, p[1]))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match split {
        Some((factor, above)) if factor >= SYNC_SPLIT => Some(above),
        // No clear split: they are all alike (every one a step's end, or
        // incidental syncs of about a step's end's length, as the old cut
        // of a quarter of the longest also counted them).
        _ => Some(least.min(max.div_ceil(4)).max(1)),
    }
}

/// How much longer than the next shorter wait the shortest step-ending
/// sync must be to mark a split: a quarter was the old fixed cut, and a
/// step's end that waits only 4× a bucket's incidental sync is as faint a
/// marker as we accept.
const SYNC_SPLIT: f64 = 4.0;

/// The residue after the longest mean gap starts a step.
fn gap_phase(run: &[(u64, CoordNs, CoordNs, Marks)], p: u64) -> u64 {
    let mut sum = vec![0.0; p as usize];
    let mut cnt = vec![0usize; p as usize];
    for w in run.windows(2) {
        let g = w[1].1.saturating_sub(w[0].1) as f64;
        sum[(w[1].0 % p) as usize] += g;
        cnt[(w[1].0 % p) as usize] += 1;
    }
    (0..p as usize)
        .max_by(|a, b| {
            let ma = sum[*a] / cnt[*a].max(1) as f64;
            let mb = sum[*b] / cnt[*b].max(1) as f64;
            ma.total_cmp(&mb)
        })
        .unwrap_or(0) as u64
}

/// The smallest period `p ≥ 2` with which `f` repeats, or `None` for a
/// constant or aperiodic marker.
///
/// The marker is compared with its own template: the most common value at
/// each position of the period. The period counts when the template is not
/// constant (the marker varies *within* a step), at least
/// [`MARK_AGREEMENT`] of all positions match it, and so do at least that
/// share of the positions where the marker or the template is not the
/// marker's usual value. The last rule keeps a rare or windowed marker from
/// matching every period: launches are counted only in short sampled
/// windows (issue 23), so "a burst before this instance" is a block of ons
/// amid offs, which agrees with itself two instances later almost
/// everywhere and yet says nothing about where steps begin.
pub(super) fn marker_period(f: &[u64]) -> Option<u64> {
    let n = f.len();
    if f.iter().all(|x| *x == f[0]) {
        return None;
    }
    let usual = most_common(f.iter().copied())?;
    (2..=n / 3).find_map(|p| {
        let template: Vec<u64> = (0..p)
            .map(|r| most_common(f.iter().skip(r).step_by(p).copied()).expect("p ≤ n/3"))
            .collect();
        if template.iter().all(|t| *t == template[0]) {
            return None;
        }
        let mut same = 0usize;
        let (mut telling, mut telling_same) = (0usize, 0usize);
        for (i, v) in f.iter().enumerate() {
            let t = template[i % p];
            let hit = *v == t;
            same += usize::from(hit);
            if *v != usual || t != usual {
                telling += 1;
                telling_same += usize::from(hit);
            }
        }
        let agrees = |k: usize, of: usize| k as f64 >= MARK_AGREEMENT * of as f64;
        (agrees(same, n) && agrees(telling_same, telling)).then_some(p as u64)
    })
}

/// The most common value (the smallest on ties, so the answer does not
/// depend on order).
fn most_common(values: impl Iterator<Item = u64>) -> Option<u64> {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(v, _)| v)
}

/// Consecutive gaps alike: the median change from one gap to the next
/// under `even_jump` of the median gap ([`IterationConfig::even_jump`]),
/// and no gap more than [`STEP_CHANGE`] times longer or shorter than the
/// median. The last keeps a per-layer communicator from passing for one
/// instance per step before three of its steps show: its gaps inside a
/// step are alike too, but the gap between steps (optimizer, data
/// loading) is many of them.
fn alike(gaps: &[(u64, f64)], even_jump: f64) -> bool {
    if gaps.len() < 8 {
        return false;
    }
    let mut g: Vec<f64> = gaps.iter().map(|x| x.1).collect();
    let mut jumps: Vec<f64> = g.windows(2).map(|w| (w[1] - w[0]).abs()).collect();
    let median = crate::robust::midpoint_median(&mut g);
    let jump = crate::robust::midpoint_median(&mut jumps);
    let (shortest, longest) = (g[0], g[g.len() - 1]);
    median > 0.0
        && jump < even_jump * median
        && longest < STEP_CHANGE * median
        && median < STEP_CHANGE * shortest
}

/// The largest change of step length [`alike`] takes for a straggler's
/// onset rather than a step boundary (the random specs' slowest ranks are
/// up to 3× slower).
const STEP_CHANGE: f64 = 4.0;

/// Returns `(period, phase, method)` from the gaps between instances.
pub(super) fn detect_period(
    run: &[(u64, CoordNs, CoordNs, Marks)],
    even_jump: f64,
) -> (u64, u64, Method) {
    let gaps: Vec<(u64, f64)> = run
        .windows(2)
        .map(|w| (w[1].0, w[1].1.saturating_sub(w[0].1) as f64))
        .collect();
    let n = gaps.len();
    if n < 4 {
        return (1, 0, Method::Undetermined);
    }
    let mean = gaps.iter().map(|g| g.1).sum::<f64>() / n as f64;
    let total: f64 = gaps.iter().map(|g| (g.1 - mean).powi(2)).sum();
    // Even gaps: one instance per step.
    if total <= 0.0 || (total / n as f64).sqrt() < 0.1 * mean.abs() {
        return (1, 0, Method::EvenSpacing);
    }
    let mut best: Vec<(u64, f64)> = Vec::new();
    for p in 2..=(n / 3) as u64 {
        let mut sum = vec![0.0; p as usize];
        let mut cnt = vec![0usize; p as usize];
        for (s, g) in &gaps {
            let r = (s % p) as usize;
            sum[r] += g;
            cnt[r] += 1;
        }
        let within: f64 = gaps
            .iter()
            .map(|(s, g)| {
                let r = (s % p) as usize;
                (g - sum[r] / cnt[r] as f64).powi(2)
            })
            .sum();
        let dof = n as f64 - p as f64;
        if dof <= 0.0 {
            continue;
        }
        let adj = 1.0 - (within / dof) / (total / (n as f64 - 1.0));
        best.push((p, adj));
    }
    let top = best.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
    if top < 0.5 {
        // No pattern, but each gap like the one before: one instance per
        // step whose length changed within the run (a straggler's onset,
        // work imbalance), which inflates the spread the even-spacing rule
        // above reads. Seen live on random pp×dp specs whose data-parallel
        // all-reduce came once per step: the step was never told, and the
        // report said "0 iterations observed" for a 60-step job.
        if alike(&gaps, even_jump) {
            return (1, 0, Method::EvenSpacing);
        }
        return (1, 0, Method::Undetermined);
    }
    let p = best.iter().find(|b| b.1 >= top - 0.05).map_or(1, |b| b.0);
    let o = gap_phase(run, p);
    (p, o, Method::GapPattern)
}
