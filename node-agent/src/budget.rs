//! The overhead budget and the launch-counter sampling it governs.
//!
//! The always-on probe set traps per collective and per sync; the launch,
//! memcpy and malloc counters trap per *call*, thousands per step, so they
//! are attached only inside deep windows and in short samples ([`Sampler`]).
//! The share of time the samples run (the duty) is the default
//! ([`DEFAULT_PERIOD_S`], [`DEFAULT_WINDOW_S`]) unless the measured cost
//! would exceed `--max-overhead`: then the duty shrinks to what the budget
//! leaves after the always-on set, possibly to nothing.
//!
//! Samples and the deep windows the coordinator opens draw launch counting
//! from one ledger ([`Sampler::deep_window`]): while counting would cost
//! more than the budget leaves, credit accrues at the share of wall time
//! counting may run and every counted second spends it. Shortening each
//! window "in proportion" did not hold the budget: a healthy dp8 run's
//! suspicion windows counted launches 5 s of its first 32 beside a 2-s
//! sample, 22 % of the time against a planned 3.6 % (stop 63).
//! Pure: every method takes `now` (raw monotonic ns).

use std::time::Duration;

/// Default `--max-overhead`: the design's target for the always-on set
/// (0.5% of a rank's time), which the samples must fit in too.
pub const DEFAULT_MAX_OVERHEAD: f64 = 0.005;
/// Default time between launch samples: a host-slow rank shows a low launch
/// rate for as long as it is slow, so a sample every half minute still
/// catches it, while launches trap only a fifteenth of the time.
pub const DEFAULT_PERIOD_S: u64 = 30;
/// Default length of one launch sample: long enough to span several steps
/// of a slow job (steps of up to ~0.5 s), short next to the period.
pub const DEFAULT_WINDOW_S: u64 = 2;
/// The first sample starts this long after the first CUDA runtime is probed
/// or the first rank is found, whichever comes first: a job is starting.
pub const FIRST_SAMPLE_DELAY: Duration = Duration::from_secs(1);
/// Shortest deep window the budget leaves: attaching the deep probes takes
/// a good part of a second on some kernels, so less would measure nothing.
pub const MIN_DEEP_WINDOW: Duration = Duration::from_secs(1);
/// Weight of the newest interval in the smoothed always-on cost: a few
/// intervals (of 200 ms) decide, one noisy one does not.
const EWMA: f64 = 0.3;
/// Counted time an interval needs before its launch rate is trusted.
const MIN_COUNTED_NS: u64 = 100_000_000;
/// The span the budget holds over: credit for counting is capped at what
/// this long earns, so a job quiet for an hour cannot spend an hour's
/// worth at once, while a suspicion after five quiet minutes gets the
/// launch counts those minutes saved (one window of a few seconds at the
/// duties seen on slow-trap VMs, 2–4 %).
pub const LEDGER_HORIZON: Duration = Duration::from_secs(300);

/// What one interval cost one rank, as the agent observed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostSample {
    /// Fraction of the rank's wall time taken by the always-on probes.
    pub always_on: f64,
    /// Calls the windowed counters counted, and over how much counted time.
    pub counted_calls: u64,
    pub counted_ns: u64,
}

/// The budget's decision, for the log, the wire and the report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Share of time the launch samples may run.
    pub duty: f64,
    /// Below the default duty: the budget narrowed the samples (and the
    /// deep windows).
    pub narrowed: bool,
    /// Estimated cost fraction of the worst rank with this duty.
    pub projected: f64,
}

#[derive(Debug, Clone)]
pub struct Sampler {
    max: f64,
    window_ns: u64,
    base_duty: f64,
    /// Smoothed always-on cost of the most expensive rank.
    always_on: Option<f64>,
    /// Cost fraction the counters add while attached (worst rank).
    counting: Option<f64>,
    entry_ns: f64,
    plan: Plan,
    next_start: Option<u64>,
    on_until: Option<u64>,
    /// Counting time (ns) the budget still grants, while it binds.
    credit_ns: f64,
    /// When the credit was last brought up to date.
    credit_at: Option<u64>,
}

impl Sampler {
    /// `period`/`window` of the default sampling (period 0: never sample);
    /// `entry_ns` is this host's measured cost of one counted call.
    pub fn new(max: f64, period: Duration, window: Duration, entry_ns: f64) -> Self {
        let base_duty = if period.is_zero() {
            0.0
        } else {
            (window.as_secs_f64() / period.as_secs_f64()).min(1.0)
        };
        Self {
            max,
            window_ns: window.as_nanos() as u64,
            base_duty,
            always_on: None,
            counting: None,
            entry_ns,
            plan: Plan {
                duty: base_duty,
                narrowed: false,
                projected: 0.0,
            },
            next_start: None,
            on_until: None,
            // The first sample is always granted: it measures what
            // counting costs on this host.
            credit_ns: window.as_nanos() as f64,
            credit_at: None,
        }
    }

    /// Share of wall time launch counting may run for the job to stay
    /// within the budget; `None` while it does not bind (counting's cost
    /// unmeasured, or cheap enough to run all the time).
    pub fn binding_share(&self) -> Option<f64> {
        let always_on = self.always_on.unwrap_or(0.0);
        let share = match self.counting {
            Some(c) if c > 0.0 => ((self.max - always_on) / c).max(0.0),
            _ if always_on >= self.max => 0.0,
            _ => return None,
        };
        (share < 1.0).then_some(share)
    }

    /// Brings the credit up to `now`, at the current share.
    fn accrue(&mut self, now: u64) {
        let last = self.credit_at.replace(now).unwrap_or(now);
        let Some(share) = self.binding_share() else {
            return;
        };
        let cap = (share * LEDGER_HORIZON.as_nanos() as f64).max(self.window_ns as f64);
        let earned = share * now.saturating_sub(last) as f64;
        // Credit above the cap (granted before the budget bound) is kept,
        // not earned on.
        if self.credit_ns < cap {
            self.credit_ns = (self.credit_ns + earned).min(cap);
        }
    }

    /// Counting time granted now for `want` (all of it while the budget
    /// does not bind), spent from the credit.
    fn spend(&mut self, now: u64, want: u64) -> u64 {
        self.accrue(now);
        if self.binding_share().is_none() {
            return want;
        }
        let got = (want as f64).min(self.credit_ns.max(0.0));
        self.credit_ns -= got;
        got as u64
    }

    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Arms the first sample (a CUDA runtime is probed or a rank found);
    /// later calls change nothing.
    pub fn arm(&mut self, now: u64) {
        if self.next_start.is_none() && self.on_until.is_none() {
            self.next_start = Some(now + FIRST_SAMPLE_DELAY.as_nanos() as u64);
        }
    }

    /// Whether a sample runs at `now`; starts and ends samples.
    pub fn sampling(&mut self, now: u64) -> bool {
        if let Some(end) = self.on_until {
            if now < end {
                return true;
            }
            self.on_until = None;
            self.next_start = self.gap_ns().map(|g| end + g);
        }
        match self.next_start {
            Some(t) if now >= t && self.plan.duty > 0.0 => {
                self.accrue(now);
                if let Some(share) = self.binding_share() {
                    let short = self.window_ns as f64 - self.credit_ns;
                    if short > 0.0 {
                        // Deep windows spent the credit: the sample waits
                        // until the budget has earned it again.
                        let wait = if share > 0.0 { short / share } else { f64::MAX };
                        self.next_start =
                            Some(now.saturating_add(wait.min(u64::MAX as f64 / 2.0) as u64));
                        return false;
                    }
                }
                self.spend(now, self.window_ns);
                self.on_until = Some(now + self.window_ns);
                self.next_start = None;
                true
            }
            Some(_) if self.plan.duty <= 0.0 => {
                // Suspended by the budget: look again a default period on.
                self.next_start = self.base_gap_ns().map(|g| now + g);
                false
            }
            _ => false,
        }
    }

    fn gap_ns(&self) -> Option<u64> {
        (self.plan.duty > 0.0)
            .then(|| (self.window_ns as f64 * (1.0 / self.plan.duty - 1.0)) as u64)
            .or_else(|| self.base_gap_ns())
    }

    fn base_gap_ns(&self) -> Option<u64> {
        (self.base_duty > 0.0)
            .then(|| (self.window_ns as f64 * (1.0 / self.base_duty - 1.0)) as u64)
    }

    /// Feeds one closed interval of every rank; re-plans. Returns the new
    /// plan when it changed from narrowed to not or back (to log).
    pub fn observe(&mut self, samples: &[CostSample]) -> Option<Plan> {
        if samples.is_empty() {
            return None;
        }
        let worst = samples.iter().map(|s| s.always_on).fold(0.0, f64::max);
        self.always_on = Some(match self.always_on {
            Some(a) => a + EWMA * (worst - a),
            None => worst,
        });
        let rate = samples
            .iter()
            .filter(|s| s.counted_ns >= MIN_COUNTED_NS)
            .map(|s| s.counted_calls as f64 / s.counted_ns as f64 * 1e9)
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
        if let Some(rate) = rate {
            self.counting = Some(rate * self.entry_ns / 1e9);
        }
        let before = self.plan.narrowed;
        self.plan = plan(
            self.max,
            self.base_duty,
            self.always_on.unwrap_or(0.0),
            self.counting,
        );
        (self.plan.narrowed != before).then_some(self.plan)
    }

    /// How much of a deep window of `requested` opening at `now` may count
    /// launches: all of it while the budget does not bind; else what the
    /// ledger holds, spent here, and nothing when that is under
    /// [`MIN_DEEP_WINDOW`] (an attach that short measures nothing). The
    /// verbs probes keep the whole window either way.
    pub fn deep_window(&mut self, now: u64, requested: Duration) -> Duration {
        self.accrue(now);
        let want = requested.as_nanos() as u64;
        if self.binding_share().is_some() && self.credit_ns < MIN_DEEP_WINDOW.as_nanos() as f64 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.spend(now, want))
    }

    /// The share of every long window of a deep set kept on for good
    /// (`--deep`) that may count launches: the budget's duty against the
    /// default one, or what it leaves for counting, never under
    /// [`MIN_DEEP_WINDOW`].
    fn lasting_share(&self, requested: Duration) -> Duration {
        let share = if self.base_duty > 0.0 {
            if !self.plan.narrowed {
                return requested;
            }
            self.plan.duty / self.base_duty
        } else {
            match self.counting {
                Some(c) if c > 0.0 => (self.max - self.always_on.unwrap_or(0.0)) / c,
                _ => return requested,
            }
        };
        if share >= 1.0 {
            return requested;
        }
        requested
            .mul_f64(share.clamp(0.0, 1.0))
            .max(MIN_DEEP_WINDOW)
            .min(requested)
    }
}

impl Sampler {
    /// Whether launch counting runs `elapsed` into a deep set kept on for
    /// good (`--deep`): the budget's share of a window of `period`, at the
    /// start of every `period`.
    pub fn counting_in_lasting_deep(&self, elapsed: Duration, period: Duration) -> bool {
        let period_ns = period.as_nanos().max(1);
        elapsed.as_nanos() % period_ns < self.lasting_share(period).as_nanos()
    }
}

/// The duty the budget allows: what `max` leaves after the always-on cost,
/// spent on counting (which costs `counting` of a rank's time while on),
/// capped at the default. Unknown counting cost: the default, until the
/// first sample measures it.
pub fn plan(max: f64, base_duty: f64, always_on: f64, counting: Option<f64>) -> Plan {
    let duty = match counting {
        Some(c) if c > 0.0 => ((max - always_on) / c).clamp(0.0, base_duty),
        _ if always_on >= max => 0.0,
        _ => base_duty,
    };
    Plan {
        duty,
        narrowed: duty < base_duty,
        projected: always_on + duty * counting.unwrap_or(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn plan_keeps_the_default_duty_when_it_fits() {
        let p = plan(0.005, 1.0 / 15.0, 0.001, Some(0.02));
        assert!(!p.narrowed);
        assert!((p.duty - 1.0 / 15.0).abs() < 1e-12);
        assert!(p.projected < 0.005);
    }

    #[test]
    fn plan_narrows_to_what_the_budget_leaves() {
        // Launch storm: counting costs 20% while on, always-on 0.3%.
        let p = plan(0.005, 1.0 / 15.0, 0.003, Some(0.2));
        assert!(p.narrowed);
        assert!((p.duty - 0.01).abs() < 1e-9, "{p:?}");
        assert!((p.projected - 0.005).abs() < 1e-9);
        // The always-on set alone is over: no samples at all.
        let p = plan(0.005, 1.0 / 15.0, 0.006, Some(0.2));
        assert_eq!(p.duty, 0.0);
        assert!(p.narrowed);
        let p = plan(0.005, 1.0 / 15.0, 0.006, None);
        assert_eq!(p.duty, 0.0);
    }

    #[test]
    fn sampler_runs_windows_at_the_planned_duty() {
        let mut s = half_percent_sampler();
        assert!(!s.sampling(0), "not armed");
        s.arm(0);
        assert!(!s.sampling(S / 2));
        assert!(s.sampling(S));
        assert!(s.sampling(2 * S));
        assert!(!s.sampling(3 * S), "window of 2 s ended");
        assert!(!s.sampling(30 * S));
        assert!(s.sampling(31 * S), "next one a period later");
        // A storm: 4,000 counted calls/s at 5 µs = 2% while on, always-on
        // 0.4%: duty (0.5 − 0.4) / 2 = 5%, gap 38 s.
        let changed = s.observe(&[CostSample {
            always_on: 0.004,
            counted_calls: 8_000,
            counted_ns: 2 * S,
        }]);
        assert!(changed.is_some_and(|p| p.narrowed));
        assert!((s.plan().duty - 0.05).abs() < 1e-9);
        assert!(!s.sampling(33 * S));
        assert!(!s.sampling(33 * S + 37 * S));
        assert!(s.sampling(33 * S + 38 * S + S / 1000));
    }

    #[test]
    fn deep_windows_and_samples_draw_from_one_ledger() {
        let mut s = half_percent_sampler();
        s.arm(0);
        assert!(s.sampling(S), "the first sample measures counting's cost");
        assert!(!s.sampling(3 * S));
        // The storm: counting may run 5% of the time. The first sample ran
        // before the budget bound, so the 2 s granted at start are left.
        s.observe(&[storm(0.004)]);
        let secs = |d: Duration| d.as_secs_f64();
        // 10 s in: 2 s + 5% of the 9 s since the first sample began.
        let w = secs(s.deep_window(10 * S, Duration::from_secs(10)));
        assert!((w - 2.45).abs() < 1e-6, "{w}");
        // Spent: the next window, 2 s on, counts nothing at all.
        assert_eq!(
            s.deep_window(12 * S, Duration::from_secs(5)),
            Duration::ZERO
        );
        // 20 s more earn 1 s again.
        let w = secs(s.deep_window(32 * S, Duration::from_secs(5)));
        assert!((w - 1.1).abs() < 1e-6, "{w}");
        // The sample due at 31 s, looked at 71 s: 1.95 s earned, it waits
        // the second the last 0.05 s take.
        assert!(!s.sampling(71 * S));
        assert!(s.sampling(72 * S + S / 1000));
        // Over a long run, windows asked for every 10 s count no more than
        // the budget's 5% of the time since that sample spent the credit.
        let mut counted = 0.0;
        for k in 0..600u64 {
            counted += secs(s.deep_window((200 + 10 * k) * S, Duration::from_secs(5)));
        }
        let budget = 0.05 * (6190.0 - 72.0);
        assert!(
            counted <= budget + 1e-3 && counted > budget - 1.0,
            "{counted} vs {budget}"
        );
    }

    #[test]
    fn credit_is_capped_at_the_horizon() {
        let mut s = half_percent_sampler();
        s.arm(0);
        assert!(s.sampling(S));
        s.observe(&[storm(0.004)]);
        // An hour quiet earns 5% of five minutes, not of an hour.
        let w = s.deep_window(3600 * S, Duration::from_secs(60));
        assert!((w.as_secs_f64() - 15.0).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn cheap_counting_is_never_rationed() {
        // 4,000 calls/s at 0.3 µs: 0.12% while on, all the time fits.
        let mut s = Sampler::new(
            0.005,
            Duration::from_secs(30),
            Duration::from_secs(2),
            300.0,
        );
        s.arm(0);
        assert!(s.sampling(S));
        s.observe(&[storm(0.0001)]);
        assert!(s.binding_share().is_none());
        for k in 0..100u64 {
            assert_eq!(
                s.deep_window((10 + k) * S, Duration::from_secs(30)),
                Duration::from_secs(30)
            );
        }
    }

    #[test]
    fn sampler_suspends_when_the_always_on_set_is_over_budget() {
        let mut s = half_percent_sampler();
        s.arm(0);
        s.observe(&[CostSample {
            always_on: 0.01,
            counted_calls: 0,
            counted_ns: 0,
        }]);
        assert_eq!(s.plan().duty, 0.0);
        assert!(!s.sampling(S));
        assert!(!s.sampling(100 * S));
        // Nothing earned: the 2 s granted at start, then nothing.
        assert_eq!(
            s.deep_window(100 * S, Duration::from_secs(10)),
            2 * MIN_DEEP_WINDOW
        );
        assert_eq!(
            s.deep_window(200 * S, Duration::from_secs(10)),
            Duration::ZERO
        );
    }

    #[test]
    fn sampling_off_by_configuration_is_not_narrowing() {
        let mut s = Sampler::new(0.005, Duration::ZERO, Duration::from_secs(2), 5000.0);
        s.arm(0);
        assert!(!s.sampling(10 * S));
        assert!(s
            .observe(&[CostSample {
                always_on: 0.0,
                counted_calls: 0,
                counted_ns: 0
            }])
            .is_none());
        assert!(!s.plan().narrowed);
        assert_eq!(
            s.deep_window(10 * S, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        // Counting in a deep window costs 2%, the always-on set (smoothed
        // from 0 towards 0.4%) 0.12%: 19% of the time may count. The 2 s
        // granted at start, then 19% of the 100 s since.
        s.observe(&[CostSample {
            always_on: 0.004,
            counted_calls: 8_000,
            counted_ns: 2 * S,
        }]);
        let w = s
            .deep_window(110 * S, Duration::from_secs(40))
            .as_secs_f64();
        assert!((w - 21.0).abs() < 1e-6, "{w}");
        assert_eq!(
            s.deep_window(111 * S, Duration::from_secs(4)),
            Duration::ZERO
        );
    }

    /// A 0.5% budget, samples of 2 s every 30 s, 5 µs a trap.
    fn half_percent_sampler() -> Sampler {
        Sampler::new(
            0.005,
            Duration::from_secs(30),
            Duration::from_secs(2),
            5000.0,
        )
    }

    /// 4,000 counted calls a second (2% of a rank at 5 µs each) beside an
    /// always-on set costing `always_on`.
    fn storm(always_on: f64) -> CostSample {
        CostSample {
            always_on,
            counted_calls: 8_000,
            counted_ns: 2 * S,
        }
    }

    #[test]
    fn a_lasting_deep_set_counts_the_budgets_share_of_every_period() {
        let mut s = half_percent_sampler();
        s.arm(0);
        let p = Duration::from_secs(30);
        // Nothing measured yet: counting throughout.
        assert!(s.counting_in_lasting_deep(Duration::from_secs(29), p));
        // The storm above: 5% of the default 6.7% duty, 22.5 s of every 30.
        s.observe(&[storm(0.004)]);
        assert!(s.counting_in_lasting_deep(Duration::from_secs(22), p));
        assert!(!s.counting_in_lasting_deep(Duration::from_secs(23), p));
        assert!(s.counting_in_lasting_deep(Duration::from_secs(31), p));
        // Over budget before counting: the shortest share, 1 s in 30.
        s.observe(&[storm(0.01)]);
        assert!(s.counting_in_lasting_deep(Duration::from_millis(900), p));
        assert!(!s.counting_in_lasting_deep(Duration::from_secs(2), p));
        assert!(s.counting_in_lasting_deep(Duration::from_millis(60_500), p));
    }
}
