//! One clock: maps each agent host's monotonic clock onto the coordinator's.
//!
//! The model is `coord = agent + offset + drift * (agent - ref)`. It is fitted
//! from round-trip probes: the coordinator sends at `coord_send_ns`, the agent
//! reads its monotonic clock, the reply lands at `coord_recv_ns`. The true
//! offset of a sample lies within `±rtt/2` of the midpoint estimate, and
//! asymmetric queueing only ever *adds* delay, so the minimum-RTT sample of
//! each time bucket is the most trustworthy one; only those are fitted.
//!
//! Collective completions (all-reduce / all-gather end together on every
//! member) give a second, independent estimate. It is applied as a shift
//! clamped to the probe error bound — a refinement inside what the probes
//! allow, never a clock of its own (it would hide a rank slow on exit) — and
//! as a check: a residual larger than the bound is counted as inconsistent
//! and not applied.

use std::collections::BTreeMap;

/// Coordinator-clock nanoseconds (signed, so differences never wrap).
pub type CoordNs = i64;

/// One round-trip clock probe (a plain measurement, defined with the wire
/// types so that test generators can make them without this crate).
pub use slowrank_shared::clock::ClockSample;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClockError {
    #[error("probe answered before it was sent (send {send} ns, recv {recv} ns)")]
    NegativeRtt { send: u64, recv: u64 },
    #[error(
        "agent says it held the probe {hold_ns} ns, longer than the whole {rtt_ns} ns round trip"
    )]
    HoldTooLong { hold_ns: u64, rtt_ns: u64 },
    #[error("probe round trip of {rtt_ns} ns exceeds the {max_ns} ns cap")]
    RttTooLarge { rtt_ns: u64, max_ns: u64 },
}

/// Tuning of the estimator.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockConfig {
    /// Width of a min-RTT bucket on the agent clock.
    pub bucket_ns: u64,
    /// Buckets kept (oldest dropped): bounds memory and lets drift change.
    pub max_buckets: usize,
    /// Probes with a longer round trip are refused outright.
    pub max_rtt_ns: u64,
    /// Error bound assumed when only batch arrival times are known.
    pub one_way_error_ns: u64,
    /// How much a fitted drift may change unseen (ppm): oscillators wander
    /// with temperature. Past the newest probe the bound grows at this rate
    /// plus the slope's own uncertainty, so a host whose probes stop
    /// arriving does not keep a bound it no longer has.
    pub drift_wander_ppm: f64,
    /// Drift assumed possible while none is fitted yet (ppm): the tolerance
    /// of a cheap crystal.
    pub max_drift_ppm: f64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        Self {
            bucket_ns: 1_000_000_000,
            max_buckets: 256,
            max_rtt_ns: 100_000_000,
            one_way_error_ns: 5_000_000,
            drift_wander_ppm: 1.0,
            max_drift_ppm: 200.0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Kept {
    agent_ns: u64,
    /// Midpoint offset `coord - agent` (ns).
    theta: f64,
    rtt_ns: u64,
}

/// A snapshot of one host's agent → coordinator mapping
/// ([`ClockEstimator::map`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockMap {
    fit: Option<ClockFit>,
    shift_ns: f64,
    fallback_offset_ns: f64,
    error_bound_ns: f64,
}

impl ClockMap {
    /// No estimate at all: identity, unbounded error.
    pub const UNKNOWN: ClockMap = ClockMap {
        fit: None,
        shift_ns: 0.0,
        fallback_offset_ns: 0.0,
        error_bound_ns: f64::INFINITY,
    };

    /// Maps an agent monotonic time to coordinator ns.
    pub fn to_coord(&self, agent_ns: u64) -> CoordNs {
        let off = match &self.fit {
            Some(f) => eval(f, agent_ns) + self.shift_ns,
            None => self.fallback_offset_ns,
        };
        (agent_ns as f64 + off).round() as CoordNs
    }

    /// Bound on the error of [`Self::to_coord`] at the newest agent time
    /// seen (ns).
    pub fn error_bound_ns(&self) -> f64 {
        self.error_bound_ns
    }

    /// [`Self::to_coord`] and its bound at that time: wider the further
    /// `agent_ns` lies outside the probes that pinned the line.
    pub fn coord_and_bound(&self, agent_ns: u64) -> (CoordNs, f64) {
        let bound = match &self.fit {
            Some(f) => f.bound_at(agent_ns),
            None => self.error_bound_ns,
        };
        (self.to_coord(agent_ns), bound)
    }
}

/// A fitted line, cached after every change of the kept samples.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClockFit {
    /// Agent ns the offset is given at.
    pub ref_agent_ns: u64,
    /// `coord - agent` at `ref_agent_ns` (ns).
    pub offset_ns: f64,
    /// d(offset)/d(agent), e.g. 30e-6 for 30 ppm.
    pub drift: f64,
    /// Bound on |estimate - truth| (ns) between the oldest and newest
    /// kept probe.
    pub error_bound_ns: f64,
    /// Samples the fit used.
    pub samples_used: usize,
    /// Agent ns of the oldest kept probe (the newest is `ref_agent_ns`).
    pub first_agent_ns: u64,
    /// Growth of the bound per ns outside the probed span: the slope's
    /// uncertainty plus the wander allowed (or the assumed maximum drift
    /// while none is fitted).
    pub extrapolation_rate: f64,
}

impl ClockFit {
    /// Bound on |estimate - truth| at `agent_ns` (ns).
    pub fn bound_at(&self, agent_ns: u64) -> f64 {
        let gap = agent_ns.saturating_sub(self.ref_agent_ns)
            + self.first_agent_ns.saturating_sub(agent_ns);
        self.error_bound_ns + self.extrapolation_rate * gap as f64
    }
}

/// Per-host clock estimator. Not shared across threads by itself; the
/// analyzer keeps one per host in a concurrent map.
#[derive(Debug, Clone)]
pub struct ClockEstimator {
    cfg: ClockConfig,
    buckets: BTreeMap<u64, Kept>,
    fit: Option<ClockFit>,
    /// Lowest `recv - agent` seen from batch arrivals: an upper bound on the
    /// offset, used only while no probe has been answered.
    one_way_min: Option<i128>,
    /// Newest agent time seen (batch cut or probe): where the bound is
    /// quoted, since that is where times are being mapped now.
    newest_agent_ns: u64,
    /// Agent time of the newest answered probe, kept or not.
    newest_probe_agent_ns: Option<u64>,
    samples_seen: u64,
    samples_refused: u64,
    /// Answered through the UDP clock port.
    udp_samples: u64,
    /// Completion-based shift (ns), already clamped to the probe bound.
    completion_shift_ns: f64,
    /// Last completion residual measured against the probe-only clock.
    completion_residual_ns: Option<f64>,
    completion_inconsistent: u64,
    /// `fit` is an earlier life's model ([`ClockSeed`]), not this life's
    /// probes: the first kept probe replaces it.
    seeded: bool,
    /// Seeds found to contradict a batch's arrival, and dropped.
    seeds_dropped: u64,
}

/// One host's clock model as a restarted coordinator keeps it (in `--out`):
/// the fitted line, its bound, and when it was last valid. Both clocks are
/// CLOCK_MONOTONIC, which a restart of either process does not reset.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClockSeed {
    /// Agent ns the offset is given at (the newest probe of the fit).
    pub ref_agent_ns: u64,
    /// `coord - agent` at `ref_agent_ns` (ns).
    pub offset_ns: f64,
    /// d(offset)/d(agent).
    pub drift: f64,
    /// Bound on the error (ns) inside the probed span.
    pub error_bound_ns: f64,
    /// Agent ns of the oldest probe of the fit.
    pub first_agent_ns: u64,
    /// Growth of the bound per ns past the probes (slope uncertainty plus
    /// the wander allowed).
    pub extrapolation_rate: f64,
    pub samples_used: usize,
    /// Coordinator ns at which the fit was estimated (its newest probe).
    pub estimated_coord_ns: u64,
}

impl ClockSeed {
    fn fit(&self) -> ClockFit {
        ClockFit {
            ref_agent_ns: self.ref_agent_ns,
            offset_ns: self.offset_ns,
            drift: self.drift,
            error_bound_ns: self.error_bound_ns,
            samples_used: self.samples_used,
            first_agent_ns: self.first_agent_ns,
            extrapolation_rate: self.extrapolation_rate,
        }
    }
}

impl ClockEstimator {
    pub fn new(cfg: ClockConfig) -> Self {
        Self {
            cfg,
            buckets: BTreeMap::new(),
            fit: None,
            one_way_min: None,
            newest_agent_ns: 0,
            newest_probe_agent_ns: None,
            samples_seen: 0,
            samples_refused: 0,
            udp_samples: 0,
            completion_shift_ns: 0.0,
            completion_residual_ns: None,
            completion_inconsistent: 0,
            seeded: false,
            seeds_dropped: 0,
        }
    }

    /// An estimator that starts from an earlier life's model, at coordinator
    /// time `now_coord_ns`: usable at once, with its bound quoted at the
    /// agent time that has passed since the model was estimated, so it is
    /// widened by the drift uncertainty over that time. `None` when `now`
    /// is before the estimate (not the same boot of the coordinator host).
    pub fn seeded(cfg: ClockConfig, seed: &ClockSeed, now_coord_ns: u64) -> Option<Self> {
        let elapsed = now_coord_ns.checked_sub(seed.estimated_coord_ns)?;
        let finite = seed.offset_ns.is_finite()
            && seed.drift.is_finite()
            && seed.error_bound_ns.is_finite()
            && seed.extrapolation_rate.is_finite();
        if !finite {
            return None;
        }
        let mut c = Self::new(cfg);
        c.fit = Some(seed.fit());
        c.seeded = true;
        // Agent time runs at the coordinator's rate within ppm, far inside
        // the widened bound.
        c.newest_agent_ns = seed.ref_agent_ns.saturating_add(elapsed);
        Some(c)
    }

    /// The model to keep for a later life; `None` before any probe (a
    /// one-way bound from batch arrival is not worth keeping).
    pub fn seed(&self) -> Option<ClockSeed> {
        let f = self.fit?;
        Some(ClockSeed {
            ref_agent_ns: f.ref_agent_ns,
            offset_ns: f.offset_ns,
            drift: f.drift,
            error_bound_ns: f.error_bound_ns,
            first_agent_ns: f.first_agent_ns,
            extrapolation_rate: f.extrapolation_rate,
            samples_used: f.samples_used,
            estimated_coord_ns: (f.ref_agent_ns as f64 + f.offset_ns).round().max(0.0) as u64,
        })
    }

    /// Seeds dropped because a batch's arrival contradicted them.
    pub fn seeds_dropped(&self) -> u64 {
        self.seeds_dropped
    }

    /// Whether the model is still an earlier life's (no probe kept yet).
    pub fn is_seeded(&self) -> bool {
        self.seeded
    }

    /// Adds one round-trip probe; keeps it only if it is the best of its bucket.
    pub fn add_sample(&mut self, s: ClockSample) -> Result<(), ClockError> {
        self.samples_seen += 1;
        if s.coord_recv_ns < s.coord_send_ns {
            self.samples_refused += 1;
            return Err(ClockError::NegativeRtt {
                send: s.coord_send_ns,
                recv: s.coord_recv_ns,
            });
        }
        // NTP's four timestamps: t1 send, t2 agent arrival, t3 = t2 + hold,
        // t4 receipt. The truth lies in [t1 - t2, t4 - t3]; its midpoint is
        // the estimate and its width the round trip.
        let total = s.coord_recv_ns - s.coord_send_ns;
        if s.agent_hold_ns > total {
            self.samples_refused += 1;
            return Err(ClockError::HoldTooLong {
                hold_ns: s.agent_hold_ns,
                rtt_ns: total,
            });
        }
        let hold = s.agent_hold_ns;
        let rtt_ns = total - hold;
        if rtt_ns > self.cfg.max_rtt_ns {
            self.samples_refused += 1;
            return Err(ClockError::RttTooLarge {
                rtt_ns,
                max_ns: self.cfg.max_rtt_ns,
            });
        }
        if s.udp {
            self.udp_samples += 1;
        }
        let sum = s.coord_send_ns as i128 + s.coord_recv_ns as i128
            - (2 * s.agent_mono_ns as i128 + hold as i128);
        let theta = sum as f64 / 2.0;
        self.newest_agent_ns = self.newest_agent_ns.max(s.agent_mono_ns);
        self.newest_probe_agent_ns = self.newest_probe_agent_ns.max(Some(s.agent_mono_ns));
        let kept = Kept {
            agent_ns: s.agent_mono_ns,
            theta,
            rtt_ns,
        };
        let bucket = s.agent_mono_ns / self.cfg.bucket_ns.max(1);
        let replace = match self.buckets.get(&bucket) {
            Some(old) => rtt_ns < old.rtt_ns,
            None => true,
        };
        if replace {
            // A fresh probe outranks the earlier life's model.
            self.seeded = false;
            self.buckets.insert(bucket, kept);
            while self.buckets.len() > self.cfg.max_buckets {
                self.buckets.pop_first();
            }
            self.refit();
        }
        Ok(())
    }

    /// A batch cut at agent `agent_ns` arrived at coordinator `coord_recv_ns`:
    /// the offset is at most `recv - agent`. Only used before any probe.
    pub fn observe_one_way(&mut self, agent_ns: u64, coord_recv_ns: u64) {
        self.newest_agent_ns = self.newest_agent_ns.max(agent_ns);
        let d = coord_recv_ns as i128 - agent_ns as i128;
        // A batch is cut before it arrives: a seed that puts the cut after
        // the arrival by more than its bound is not this host's clock (its
        // agent's host rebooted): forget it rather than map with it.
        if let Some(f) = self.fit.filter(|_| self.seeded) {
            if eval(&f, agent_ns) - f.bound_at(agent_ns) > d as f64 {
                self.fit = None;
                self.seeded = false;
                self.seeds_dropped += 1;
            }
        }
        self.one_way_min = Some(self.one_way_min.map_or(d, |m| m.min(d)));
    }

    fn refit(&mut self) {
        let pts: Vec<Kept> = self.buckets.values().copied().collect();
        let (wander, max_drift) = (
            self.cfg.drift_wander_ppm * 1e-6,
            self.cfg.max_drift_ppm * 1e-6,
        );
        self.fit = fit_line(&pts, wander, max_drift).and_then(|first| {
            // One pass of outlier rejection: a bucket whose best probe was
            // still queued (all probes of that second delayed) bends the line.
            let resid: Vec<f64> = pts
                .iter()
                .map(|k| (k.theta - eval(&first, k.agent_ns)).abs())
                .collect();
            let mad = median(&mut resid.clone()).unwrap_or(0.0);
            let limit = (4.0 * crate::robust::MAD_TO_SIGMA * mad).max(20_000.0);
            let inliers: Vec<Kept> = pts
                .iter()
                .zip(&resid)
                .filter(|(_, r)| **r <= limit)
                .map(|(k, _)| *k)
                .collect();
            if inliers.len() >= 2 && inliers.len() < pts.len() {
                fit_line(&inliers, wander, max_drift)
            } else {
                Some(first)
            }
        });
    }

    /// Probes seen, and how many of them came through the clock port.
    pub fn probe_counts(&self) -> (u64, u64) {
        (self.samples_seen, self.udp_samples)
    }

    /// The probe-only fit, if any probe was kept.
    pub fn fit(&self) -> Option<ClockFit> {
        self.fit
    }

    /// Offset `coord - agent` at `agent_ns` from probes only (no completion shift).
    fn probe_offset(&self, agent_ns: u64) -> Option<f64> {
        self.fit.as_ref().map(|f| eval(f, agent_ns))
    }

    /// Maps an agent monotonic time to coordinator ns.
    pub fn to_coord(&self, agent_ns: u64) -> CoordNs {
        self.map().to_coord(agent_ns)
    }

    /// The current mapping as a value: mapping many times of one host (every
    /// member of a 4,096-rank instance) needs no lookup or lock per time.
    pub fn map(&self) -> ClockMap {
        ClockMap {
            fit: self.fit,
            shift_ns: self.completion_shift_ns,
            // Without probes, the batch arrival bound minus half the assumed
            // one-way error is the best guess; without either, identity.
            fallback_offset_ns: self
                .one_way_min
                .map_or(0.0, |m| m as f64 - self.cfg.one_way_error_ns as f64 / 2.0),
            error_bound_ns: self.error_bound_ns(),
        }
    }

    /// Same, ignoring the completion shift: the clock the check is made against.
    pub fn to_coord_probe_only(&self, agent_ns: u64) -> CoordNs {
        match self.probe_offset(agent_ns) {
            Some(o) => (agent_ns as f64 + o).round() as CoordNs,
            None => self.to_coord(agent_ns),
        }
    }

    /// Bound on the error of [`Self::to_coord`] at the newest agent time
    /// seen (ns): it grows while batches keep coming and probes do not.
    pub fn error_bound_ns(&self) -> f64 {
        match &self.fit {
            Some(f) => f.bound_at(self.newest_agent_ns),
            None if self.one_way_min.is_some() => self.cfg.one_way_error_ns as f64,
            None => f64::INFINITY,
        }
    }

    /// Feeds the completion check: `residual_ns` is how far this host's
    /// collective completions sit from the cross-host median, measured on the
    /// probe-only clock. A positive residual means this host reads late.
    pub fn apply_completion_residual(&mut self, residual_ns: f64) {
        self.completion_residual_ns = Some(residual_ns);
        // The probes' own bound, not the one widened past the last probe: a
        // completion may refine the line only where the probes pin it.
        let bound = match &self.fit {
            Some(f) => f.error_bound_ns,
            None => self.error_bound_ns(),
        };
        if !bound.is_finite() {
            return;
        }
        // Allow a few µs for the true spread of completions across members.
        // Beyond that the completions contradict the probes: they did not
        // end together (a ring's tail, a stand-in's exits), so they refine
        // nothing. With kernel-stamped probes (bounds of a few µs) that is
        // the usual case, and shifting by the bound would only add error.
        if residual_ns.abs() > bound + 20_000.0 {
            self.completion_inconsistent += 1;
            self.completion_shift_ns = 0.0;
        } else {
            self.completion_shift_ns = (-residual_ns).clamp(-bound, bound);
        }
    }

    pub fn summary(&self, host: &str) -> HostClockReport {
        let fit = self.fit;
        HostClockReport {
            host: host.to_string(),
            offset_us: fit.map(|f| f.offset_ns / 1e3),
            reference_agent_ns: fit.map(|f| f.ref_agent_ns),
            // The fit's slope is d(coord - agent)/d(agent); a host clock that
            // runs fast by x ppm has slope -x/(1+x).
            drift_ppm: fit.map(|f| -f.drift / (1.0 + f.drift) * 1e6),
            error_bound_us: {
                let b = self.error_bound_ns();
                b.is_finite().then_some(b / 1e3)
            },
            probe_samples_seen: self.samples_seen,
            probe_samples_refused: self.samples_refused,
            udp_samples: self.udp_samples,
            samples_used: fit.map_or(0, |f| f.samples_used),
            probe_age_ms: self
                .newest_probe_agent_ns
                .map(|p| self.newest_agent_ns.saturating_sub(p) as f64 / 1e6),
            completion_residual_us: self.completion_residual_ns.map(|r| r / 1e3),
            completion_shift_us: self.completion_shift_ns / 1e3,
            completion_inconsistent: self.completion_inconsistent,
            source: if self.seeded {
                "earlier-life"
            } else if fit.is_some() {
                "probes"
            } else if self.one_way_min.is_some() {
                "batch-arrival"
            } else {
                "none"
            }
            .to_owned(),
        }
    }
}

/// One host's clock, as reported.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostClockReport {
    pub host: String,
    pub offset_us: Option<f64>,
    /// Agent monotonic ns at which `offset_us` holds (the fit's reference).
    #[serde(default)]
    pub reference_agent_ns: Option<u64>,
    pub drift_ppm: Option<f64>,
    pub error_bound_us: Option<f64>,
    pub probe_samples_seen: u64,
    pub probe_samples_refused: u64,
    /// Of those, answered through the kernel-stamped UDP clock port (0: the
    /// port is blocked or off, and the less exact control stream is used).
    #[serde(default)]
    pub udp_samples: u64,
    pub samples_used: usize,
    /// Agent time from the newest answered probe to the newest batch (ms): a
    /// large value means probes stopped and the bound is extrapolated.
    #[serde(default)]
    pub probe_age_ms: Option<f64>,
    pub completion_residual_us: Option<f64>,
    pub completion_shift_us: f64,
    pub completion_inconsistent: u64,
    pub source: String,
}

fn eval(f: &ClockFit, agent_ns: u64) -> f64 {
    f.offset_ns + f.drift * (agent_ns as f64 - f.ref_agent_ns as f64)
}

/// Weighted line through the kept probes. `wander` and `max_drift` (as
/// fractions) set how fast the bound grows outside the probed span.
fn fit_line(pts: &[Kept], wander: f64, max_drift: f64) -> Option<ClockFit> {
    let n = pts.len();
    if n == 0 {
        return None;
    }
    let ref_agent_ns = pts[n - 1].agent_ns;
    // Weighted by 1/rtt²: a probe's offset is off by at most half its round
    // trip (the path asymmetry), so a quick probe pins the line far better
    // than a slow one, and a few queued seconds no longer tilt the drift.
    let w: Vec<f64> = pts
        .iter()
        .map(|k| 1.0 / (k.rtt_ns as f64).max(10_000.0).powi(2))
        .collect();
    let sw: f64 = w.iter().sum();
    // Centre x to keep the products small and well conditioned.
    let xs: Vec<f64> = pts
        .iter()
        .map(|k| k.agent_ns as f64 - ref_agent_ns as f64)
        .collect();
    let mean_x = xs.iter().zip(&w).map(|(x, w)| x * w).sum::<f64>() / sw;
    let mean_y = pts.iter().zip(&w).map(|(k, w)| k.theta * w).sum::<f64>() / sw;
    let sxx: f64 = xs
        .iter()
        .zip(&w)
        .map(|(x, w)| w * (x - mean_x).powi(2))
        .sum();
    let span = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        - xs.iter().cloned().fold(f64::INFINITY, f64::min);
    // Drift needs a few seconds of baseline; before that a constant is safer.
    let slope = (n >= 3 && span >= 2e9 && sxx > 0.0)
        .then(|| weighted_slope(pts, &xs, &w, (mean_x, mean_y), sxx));
    // A slope within two standard errors of zero is noise: over a few
    // seconds of jittery probes it tilted a drift-free host by 13 ppm,
    // 50 µs at the line's end. Zero is then the better estimate.
    let drift = match slope {
        Some((d, se)) if d.abs() >= 2.0 * se => d,
        _ => 0.0,
    };
    let offset_ns = mean_y + drift * (0.0 - mean_x);
    let f = ClockFit {
        ref_agent_ns,
        offset_ns,
        drift,
        error_bound_ns: 0.0,
        samples_used: n,
        first_agent_ns: pts[0].agent_ns,
        extrapolation_rate: slope.map_or(max_drift, |(_, se)| 2.0 * se + wander),
    };
    Some(ClockFit {
        error_bound_ns: error_bound(pts, &f),
        ..f
    })
}

/// The weighted least-squares slope through the centred points (`xs`,
/// theta) about their weighted means, and its standard error.
fn weighted_slope(
    pts: &[Kept],
    xs: &[f64],
    w: &[f64],
    (mean_x, mean_y): (f64, f64),
    sxx: f64,
) -> (f64, f64) {
    let n = pts.len();
    let sxy: f64 = xs
        .iter()
        .zip(pts)
        .zip(w)
        .map(|((x, k), w)| w * (x - mean_x) * (k.theta - mean_y))
        .sum();
    let d = sxy / sxx;
    // Standard error of a weighted slope: the weights are 1/rtt², so the
    // residual variance is in units of round trips and sxx matches it.
    let s2 = xs
        .iter()
        .zip(pts)
        .zip(w)
        .map(|((x, k), w)| w * (k.theta - mean_y - d * (x - mean_x)).powi(2))
        .sum::<f64>()
        / (n - 2).max(1) as f64;
    (d, (s2 / sxx).sqrt())
}

/// The fit's error bound at its reference point.
fn error_bound(pts: &[Kept], f: &ClockFit) -> f64 {
    let n = pts.len();
    let (ref_agent_ns, offset_ns) = (f.ref_agent_ns, f.offset_ns);
    let resid_rms = (pts
        .iter()
        .map(|k| (k.theta - eval(f, k.agent_ns)).powi(2))
        .sum::<f64>()
        / n as f64)
        .sqrt();
    // Each kept probe pins the truth within ±rtt/2 of its midpoint. With the
    // fitted slope, the true offset at the reference lies in the intersection
    // of all those intervals, [lo, hi]; the bound is the fit's distance to the
    // far end, plus the slope's own uncertainty. If the intervals do not
    // intersect (drift changed), fall back to the mean half round trip.
    let mut lo = f64::NEG_INFINITY;
    let mut hi = f64::INFINITY;
    for k in pts {
        let shift = f.drift * (k.agent_ns as f64 - ref_agent_ns as f64);
        lo = lo.max(k.theta - shift - k.rtt_ns as f64 / 2.0);
        hi = hi.min(k.theta - shift + k.rtt_ns as f64 / 2.0);
    }
    let mean_half_rtt = pts.iter().map(|k| k.rtt_ns as f64 / 2.0).sum::<f64>() / n as f64;
    let interval = if lo <= hi {
        (offset_ns - lo).max(hi - offset_ns).max(0.0)
    } else {
        mean_half_rtt + resid_rms
    };
    interval + 2.0 * resid_rms / (n as f64).sqrt()
}

pub(crate) use crate::robust::median;

#[cfg(test)]
mod tests;
