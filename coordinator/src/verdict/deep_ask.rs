//! Which job-wide deep windows to ask every agent for, and for how long.
//!
//! The deep set (verbs data path, launch counting) is the only evidence
//! that tells a slow GPU from a slow NIC, and the costliest probes there
//! are: a window on every rank of the job. Three reasons open one:
//! - an active verdict that rests on it (compute, communication, a stage
//!   or work imbalance replayed on GPU-side steps): kept on
//!   for as long as the verdict stays active;
//! - the job got slower with nobody named, or a suspicion (a suspect that
//!   only GPU-side times can class): a short window, renewed while the
//!   slowdown or the suspicion lasts, up to a long one.
//!
//! A healthy job's jitter raises a suspicion now and then. With a 30-s
//! window per suspicion, a healthy dp8 job (28-ms steps) had the deep set
//! on for 41 s of its 56 (two suspicions, at 5 s and 45 s), which its
//! agents reported as 2.9–3.0 % of rank time against 0.6 % without
//! (BENCHMARKS.md, 2026-12-05, stop 57). The window is only needed until
//! the suspect is classed, a few of its steps once the probes are on. A
//! slowdown is read from the median of the last three steps, so a
//! two-step hiccup of a healthy job (another process on its cores, a
//! collection pause) raises one too; a 30-s window for each cost the same
//! as a suspicion's did, and a slowdown that lasts keeps its window anyway.
//!
//! A fourth opens once: when the warm-up ends, a window of ten steps (and
//! a second) looks at GPU-side times. A straggler present from the job's
//! first steps leaves no slowdown to see (its steps are the baseline) and,
//! where the host enqueues ahead of its GPU, no host-side lateness either:
//! random 4421-29's rank 5, a GPU 1.21× slower from step 7 to 25 that cost
//! the job 15%, was never suspected. Ten steps of a week-long job are
//! nothing; on the 56-s overhead run (28-ms steps) 1.3 s of the deep set.
//!
//! Windows that name nobody back off: the next one may open one window
//! length after this one began, then 2, 4 … up to 20 long windows (a job
//! slower as a whole — a shared file system, a loaded machine — would
//! otherwise keep the deep set on for good); back to one once a verdict
//! has opened. Pure: every call takes `now`.

use std::time::{Duration, Instant};

/// Steps a suspicion window covers at least: the probes attach, the next
/// device sync anchors the GPU-side counting, and the suspect's class
/// rests on its last few suspicious steps.
pub const SUSPICION_MIN_STEPS: u32 = 10;
/// Renew a window this long before it ends (at most half of it).
const RENEW_MARGIN: Duration = Duration::from_secs(1);
/// The longest back-off, in long windows.
const MAX_BACKOFF_WINDOWS: u32 = 20;

/// Why a window was asked for (the log line says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// An active verdict rests on the deep set.
    Verdict,
    /// The job is slower and nobody is named.
    Slowdown,
    /// A suspect only GPU-side times can class.
    Suspicion,
    /// The warm-up ended: one look for a straggler from the first steps.
    FirstLook,
}

/// One request: every agent's deep set on for `seconds` from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub seconds: u32,
    pub reason: Reason,
    /// Extends the window already running (no new back-off step).
    pub renewal: bool,
}

/// What the analyzer says now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct State {
    /// An active verdict rests on GPU-side or verbs evidence.
    pub active_needs_deep: bool,
    /// The job is slower with nobody named.
    pub slowdown: bool,
    /// A suspect waits for GPU-side times.
    pub suspicion: bool,
    /// Verdicts opened so far (a new one resets the back-off).
    pub verdicts_opened: usize,
    /// The job's step, once known.
    pub step: Option<Duration>,
    /// The warm-up has ended (the steps settled).
    pub warm: bool,
}

#[derive(Debug, Clone)]
pub struct DeepAsk {
    long: Duration,
    suspicion: Duration,
    /// The window running: its end, why, and when it began.
    running: Option<(Instant, Reason, Instant)>,
    /// The last new window: when, the wait before the next, and the
    /// verdicts opened by then.
    last: Option<(Instant, Duration, usize)>,
    /// The first look has been taken (or a window ran when it was due).
    looked: bool,
}

impl DeepAsk {
    /// `long_s` (0: never ask) for verdicts and slowdowns; `suspicion_s`
    /// the shortest suspicion window (at least [`SUSPICION_MIN_STEPS`]
    /// steps, at most `long_s`).
    pub fn new(long_s: u32, suspicion_s: u32) -> Self {
        Self {
            long: Duration::from_secs(u64::from(long_s)),
            suspicion: Duration::from_secs(u64::from(suspicion_s.clamp(1, long_s.max(1)))),
            running: None,
            last: None,
            looked: false,
        }
    }

    /// When the running window ends, if one does after `now`.
    pub fn until(&self, now: Instant) -> Option<Instant> {
        self.running.map(|r| r.0).filter(|u| *u > now)
    }

    fn suspicion_len(&self, step: Option<Duration>) -> Duration {
        let by_steps = step.map_or(Duration::ZERO, |s| {
            s * SUSPICION_MIN_STEPS + Duration::from_secs(1)
        });
        self.suspicion.max(by_steps).min(self.long)
    }

    fn ask(&mut self, now: Instant, len: Duration, reason: Reason, renewal: bool) -> Ask {
        let began = match self.running {
            Some((u, _, b)) if renewal && u > now => {
                // A renewal does not eat into the back-off: the wait
                // before the next window grows by what it added.
                if let Some((t, g, n)) = self.last {
                    self.last = Some((t, g + (now + len).saturating_duration_since(u), n));
                }
                b
            }
            _ => now,
        };
        self.running = Some((now + len, reason, began));
        Ask {
            seconds: len.as_secs_f64().ceil().max(1.0) as u32,
            reason,
            renewal,
        }
    }

    /// A slowdown names the window before a suspicion does (the log says
    /// the bigger news).
    fn reason_of(s: &State) -> Reason {
        if s.slowdown {
            Reason::Slowdown
        } else {
            Reason::Suspicion
        }
    }

    /// The window to ask for now, if any.
    pub fn poll(&mut self, now: Instant, s: &State) -> Option<Ask> {
        if self.long.is_zero() {
            return None;
        }
        let margin = RENEW_MARGIN.min(self.long / 2);
        let running = self.running.filter(|r| r.0 > now);
        let ending = running.is_none_or(|r| r.0 <= now + margin);
        if s.active_needs_deep {
            if !ending {
                return None;
            }
            // A verdict's window counts as a new one for the back-off:
            // the next without a verdict starts at one window again.
            self.last = Some((now, self.long, s.verdicts_opened));
            return Some(self.ask(now, self.long, Reason::Verdict, running.is_some()));
        }
        if running.is_some() && s.warm {
            // A window already running is the first look.
            self.looked = true;
        }
        if let Some((_, reason, began)) = running {
            // A slowdown or a suspicion that lasts keeps its window, up to a
            // long one.
            let len = self.suspicion_len(s.step);
            if ending
                && (s.slowdown || s.suspicion)
                && reason != Reason::Verdict
                && now + len <= began + self.long
            {
                return Some(self.ask(now, len, Self::reason_of(s), true));
            }
            return None;
        }
        if s.warm && !self.looked {
            if let Some(step) = s.step {
                self.looked = true;
                // Ten steps, not the suspicion window's floor: nothing is
                // suspected yet, and a suspicion renews it. No back-off
                // step either: it is no answer to anything.
                let len = (step * SUSPICION_MIN_STEPS + Duration::from_secs(1)).min(self.long);
                return Some(self.ask(now, len, Reason::FirstLook, false));
            }
        }
        if !s.slowdown && !s.suspicion {
            return None;
        }
        if let Some((t, gap, _)) = self.last {
            if now < t + gap {
                return None;
            }
        }
        let (len, reason) = (self.suspicion_len(s.step), Self::reason_of(s));
        let gap = match self.last {
            Some((_, g, before)) if before == s.verdicts_opened => {
                (g * 2).max(len).min(self.long * MAX_BACKOFF_WINDOWS)
            }
            _ => len,
        };
        self.last = Some((now, gap, s.verdicts_opened));
        Some(self.ask(now, len, reason, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn suspicion(step_ms: u64) -> State {
        State {
            suspicion: true,
            step: Some(Duration::from_millis(step_ms)),
            ..State::default()
        }
    }

    fn slowdown(step_ms: u64) -> State {
        State {
            slowdown: true,
            step: Some(Duration::from_millis(step_ms)),
            ..State::default()
        }
    }

    #[test]
    fn a_suspicion_gets_a_short_window_of_at_least_ten_steps() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        let a = d.poll(t0, &suspicion(28)).unwrap();
        assert_eq!(
            (a.seconds, a.reason, a.renewal),
            (5, Reason::Suspicion, false)
        );
        // A 2-s step: 10 steps and a second.
        let mut d = DeepAsk::new(30, 5);
        assert_eq!(d.poll(t0, &suspicion(2000)).unwrap().seconds, 21);
        // Never longer than a long window.
        let mut d = DeepAsk::new(30, 5);
        assert_eq!(d.poll(t0, &suspicion(10_000)).unwrap().seconds, 30);
    }

    #[test]
    fn a_lasting_suspicion_is_renewed_up_to_a_long_window_then_backs_off() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        assert!(d.poll(t0, &suspicion(28)).is_some());
        assert!(d.poll(t0 + 2 * S, &suspicion(28)).is_none(), "running");
        let mut t = t0 + 4 * S + S / 2;
        let mut renewals = 0;
        while t < t0 + 29 * S {
            if let Some(a) = d.poll(t, &suspicion(28)) {
                assert!(a.renewal, "{a:?} at {:?}", t - t0);
                renewals += 1;
            }
            t += S / 2;
        }
        // 5 s, then 5 s more at 4.5, 8.5, … 24.5 while the window stays
        // within 30 s of its start.
        assert_eq!(renewals, 6);
        assert!(d.until(t0 + 29 * S).is_some());
        assert!(d.until(t0 + 30 * S).is_none());
        // The renewals moved the back-off along: the next new window may
        // start when this one ended, and waits twice as long after it.
        assert!(d.poll(t0 + 29 * S, &suspicion(28)).is_none());
        let a = d.poll(t0 + 30 * S, &suspicion(28)).unwrap();
        assert!(!a.renewal);
        let _ = d.poll(t0 + 34 * S + S / 2, &State::default());
        assert!(d.poll(t0 + 60 * S, &suspicion(28)).is_none());
        assert!(d.poll(t0 + 89 * S, &suspicion(28)).is_some());
    }

    #[test]
    fn a_suspicion_that_clears_lets_the_window_end() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        assert!(d.poll(t0, &suspicion(28)).is_some());
        assert!(d.poll(t0 + 4 * S + S / 2, &State::default()).is_none());
        assert!(d.until(t0 + 6 * S).is_none());
    }

    #[test]
    fn windows_that_name_nobody_back_off_and_a_verdict_resets_it() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        let mut opened = Vec::new();
        let mut t = t0;
        while t < t0 + 200 * S {
            // A suspicion each time no window runs, cleared inside it.
            let s = if d.until(t).is_none() {
                suspicion(28)
            } else {
                State::default()
            };
            if let Some(a) = d.poll(t, &s) {
                assert!(!a.renewal);
                opened.push((t - t0).as_secs());
            }
            t += S;
        }
        // Gaps of 5, 10, 20, 40, 80 s from each start.
        assert_eq!(opened, vec![0, 5, 15, 35, 75, 155]);
        // A verdict opened meanwhile: back to one window.
        let mut s = suspicion(28);
        s.verdicts_opened = 1;
        let t = t0 + 400 * S;
        assert!(d.poll(t, &s).is_some());
        let cleared = State {
            verdicts_opened: 1,
            ..State::default()
        };
        assert!(d.poll(t + 4 * S + S / 2, &cleared).is_none());
        assert!(d.poll(t + 5 * S, &s).is_some(), "one window on");
    }

    #[test]
    fn a_slowdown_gets_a_short_window_renewed_while_it_lasts_and_a_verdict_keeps_it_on() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        let slow = slowdown(28);
        let a = d.poll(t0, &slow).unwrap();
        assert_eq!(
            (a.seconds, a.reason, a.renewal),
            (5, Reason::Slowdown, false)
        );
        // Still slower near its end: renewed.
        let a = d.poll(t0 + 4 * S + S / 2, &slow).unwrap();
        assert_eq!(
            (a.seconds, a.reason, a.renewal),
            (5, Reason::Slowdown, true)
        );
        let verdict = State {
            active_needs_deep: true,
            verdicts_opened: 1,
            ..State::default()
        };
        assert!(d.poll(t0 + 6 * S, &verdict).is_none(), "still on");
        let a = d.poll(t0 + 9 * S, &verdict).unwrap();
        assert_eq!(
            (a.seconds, a.reason, a.renewal),
            (30, Reason::Verdict, true)
        );
        assert!(d.until(t0 + 38 * S).is_some());
    }

    #[test]
    fn a_slowdown_that_passes_lets_its_window_end() {
        // A healthy job's two-step hiccup: one short window, not a long one.
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        let slow = slowdown(28);
        assert!(d.poll(t0, &slow).is_some());
        assert!(d.poll(t0 + 4 * S + S / 2, &State::default()).is_none());
        assert!(d.until(t0 + 6 * S).is_none());
    }

    #[test]
    fn the_end_of_the_warm_up_gets_one_look_of_ten_steps() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        let cold = State {
            step: Some(Duration::from_millis(200)),
            ..State::default()
        };
        assert!(d.poll(t0, &cold).is_none(), "not before the warm-up ends");
        let warm = State { warm: true, ..cold };
        let a = d.poll(t0 + S, &warm).unwrap();
        assert_eq!(
            (a.seconds, a.reason, a.renewal),
            (3, Reason::FirstLook, false)
        );
        // Once: a quiet job is not looked at again.
        assert!(d.until(t0 + 5 * S).is_none());
        assert!(d.poll(t0 + 10 * S, &warm).is_none());
        assert!(d.poll(t0 + 100 * S, &warm).is_none());
        // A suspicion within it renews it; the back-off is untouched: the
        // first suspicion after it opens at once.
        let mut d = DeepAsk::new(30, 5);
        assert!(d.poll(t0, &warm).is_some());
        let mut s = suspicion(200);
        s.warm = true;
        let a = d.poll(t0 + 2 * S + S / 2, &s).unwrap();
        assert!(a.renewal && a.reason == Reason::Suspicion, "{a:?}");
        let mut d = DeepAsk::new(30, 5);
        assert!(d.poll(t0, &warm).is_some());
        assert!(d.poll(t0 + 4 * S, &s).is_some_and(|a| !a.renewal));
    }

    #[test]
    fn a_window_running_when_the_warm_up_ends_is_the_first_look() {
        let t0 = Instant::now();
        let mut d = DeepAsk::new(30, 5);
        assert!(d.poll(t0, &suspicion(28)).is_some());
        let s = State {
            warm: true,
            step: Some(Duration::from_millis(28)),
            ..State::default()
        };
        assert!(d.poll(t0 + S, &s).is_none());
        assert!(d.poll(t0 + 10 * S, &s).is_none(), "no look after it");
    }

    #[test]
    fn zero_length_never_asks() {
        let mut d = DeepAsk::new(0, 5);
        let s = State {
            active_needs_deep: true,
            slowdown: true,
            suspicion: true,
            ..State::default()
        };
        assert!(d.poll(Instant::now(), &s).is_none());
    }
}
