//! The verdicts' lifecycle: each sealed iteration's observations open,
//! keep, reopen and close verdicts with hysteresis (the rules are in the
//! stage's doc, [`crate::verdict`]), and account each verdict's cost.

use std::collections::{BTreeMap, VecDeque};

use super::*;

/// Iterations a verdict's tail ([`Verdict::account_tail`]) holds at most:
/// past `close_after` (8) clean ones it closes, so only standing evidence
/// keeps one open this long.
const TAIL_MAX: usize = 64;

#[derive(Debug, Default)]
struct Tracker {
    hist: VecDeque<(u64, Option<Observation>)>,
    clean_streak: u64,
    verdict: Option<u64>,
}

#[derive(Debug)]
pub struct Lifecycle {
    cfg: LifecycleConfig,
    trackers: BTreeMap<Subject, Tracker>,
    verdicts: BTreeMap<u64, Verdict>,
    next_id: u64,
    /// No observation before this iteration counts: the warm-up
    /// (`warmup_iterations` until the analyzer says where it ended, see
    /// [`super::warmup`]), or a resumed coordinator's own.
    hold_until: u64,
    /// The iteration of the last [`Lifecycle::step`].
    last_step: Option<u64>,
}

impl Lifecycle {
    pub fn new(cfg: LifecycleConfig) -> Self {
        Self {
            trackers: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            next_id: 1,
            hold_until: cfg.warmup_iterations,
            cfg,
            last_step: None,
        }
    }

    /// Observations before iteration `k` count as warm-up too.
    pub fn hold_until(&mut self, k: u64) {
        self.hold_until = self.hold_until.max(k);
    }

    /// The warm-up ended at iteration `k` (its steps settled): observations
    /// from it on count.
    pub fn warm_at(&mut self, k: u64) {
        self.hold_until = k;
    }

    pub fn config(&self) -> &LifecycleConfig {
        &self.cfg
    }

    pub fn verdicts(&self) -> impl Iterator<Item = &Verdict> {
        self.verdicts.values()
    }

    pub fn get(&self, id: u64) -> Option<&Verdict> {
        self.verdicts.get(&id)
    }

    pub fn trackers(&self) -> usize {
        self.trackers.len()
    }

    /// Feeds one sealed iteration's observations; subjects not mentioned were clean.
    pub fn step(&mut self, it: u64, mut obs: BTreeMap<Subject, Observation>) -> Vec<VerdictEvent> {
        self.mark_blind_stretch(it);
        let mut events = Vec::new();
        let subjects: Vec<Subject> = self
            .trackers
            .keys()
            .copied()
            .chain(obs.keys().copied())
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for s in subjects {
            if !seen.insert(s) {
                continue;
            }
            let o = obs.remove(&s);
            if let Some(e) = self.observe(s, it, o) {
                events.push(e);
            }
        }
        // Forget subjects with nothing going on.
        self.trackers
            .retain(|_, t| t.verdict.is_some() || t.hist.iter().any(|h| h.1.is_some()));
        while self.verdicts.len() > self.cfg.max_verdicts {
            let Some(old) = self.verdicts.values().find(|v| !v.active).map(|v| v.id) else {
                break;
            };
            self.verdicts.remove(&old);
            for t in self.trackers.values_mut() {
                if t.verdict == Some(old) {
                    t.verdict = None;
                }
            }
        }
        events
    }

    /// Iterations between the last step and `it` were never sealed (no
    /// complete collective: an agent was gone). A stretch long enough to
    /// have closed a verdict had it been clean is marked on each active
    /// verdict that was slow when sight was lost: what came after it is no
    /// proof the episode was brief (a chaos run lost sight of a 150-iteration
    /// straggler 19 iterations after naming it, then saw it clean after its
    /// fault had ended, and called it a transient).
    fn mark_blind_stretch(&mut self, it: u64) {
        let prev = self.last_step.replace(it);
        let Some(prev) = prev.filter(|p| it > p.saturating_add(1)) else {
            return;
        };
        if it - prev - 1 < self.cfg.close_after {
            return;
        }
        for v in self.verdicts.values_mut() {
            if v.active && v.last_slow_iteration == prev {
                v.unobserved_to = Some(it - 1);
            }
        }
    }

    fn observe(&mut self, s: Subject, it: u64, o: Option<Observation>) -> Option<VerdictEvent> {
        let o = o.filter(|_| it >= self.hold_until);
        let t = self.trackers.entry(s).or_default();
        t.hist.push_back((it, o.clone()));
        while t.hist.len() > self.cfg.open_window {
            t.hist.pop_front();
        }
        t.clean_streak = if o.is_some() { 0 } else { t.clean_streak + 1 };
        let active = t
            .verdict
            .and_then(|id| self.verdicts.get(&id))
            .is_some_and(|v| v.active);
        if active {
            let v = self.verdicts.get_mut(&t.verdict.expect("active"))?;
            return update_active(&self.cfg, t, v, it, o);
        }
        let hits: Vec<&Observation> = t.hist.iter().filter_map(|h| h.1.as_ref()).collect();
        let alarm = o.as_ref().is_some_and(|o| o.alarm);
        if o.is_none() || (hits.len() < self.cfg.open_min && !fast(&self.cfg, t) && !alarm) {
            return None;
        }
        let w = window_case(hits)?;
        let (first_it, first) = t
            .hist
            .iter()
            .find_map(|h| h.1.as_ref().map(|o| (h.0, o)))
            .expect("hits");
        let (id, event) = match t.verdict.and_then(|id| self.verdicts.get_mut(&id)) {
            Some(v) => {
                reopen(v, &w, it);
                (v.id, EventKind::Reopened)
            }
            None => {
                let id = self.next_id;
                self.next_id += 1;
                let mut v = new_verdict(
                    id,
                    s,
                    it,
                    w.kind,
                    w.confidence,
                    w.latest,
                    (first_it, first),
                    w.lost_gpu_seconds,
                    w.exposure_ns,
                );
                // Costed as what it is: a window's minority of host-side
                // readings replayed a compute-slow GPU's cost from
                // host-side arrivals (random 5407-16: 4% for 52%).
                account_kind(&mut v, &w);
                self.verdicts.insert(id, v);
                t.verdict = Some(id);
                (id, EventKind::Opened)
            }
        };
        let v = self.verdicts.get(&id)?.clone();
        Some(opened_event(v, event, it))
    }
}

/// What a subject's window of observations says when it opens (or
/// reopens) a verdict.
struct WindowCase<'a> {
    hits: Vec<&'a Observation>,
    /// The majority class over the window.
    kind: Kind,
    /// The latest observation of that class: its evidence speaks.
    latest: &'a Observation,
    /// Mean confidence over the window.
    confidence: f64,
    lost_gpu_seconds: f64,
    exposure_ns: f64,
}

/// Majority class over the window; the latest observation of it speaks.
fn window_case(hits: Vec<&Observation>) -> Option<WindowCase<'_>> {
    let mut votes: BTreeMap<Kind, usize> = BTreeMap::new();
    for h in &hits {
        *votes.entry(h.classification.kind).or_default() += 1;
    }
    let kind = votes.iter().max_by_key(|(_, n)| **n).map(|(k, _)| *k)?;
    let latest = *hits.iter().rev().find(|h| h.classification.kind == kind)?;
    let lost_gpu_seconds: f64 = hits.iter().map(|h| h.lost_ns).sum::<f64>() / 1e9;
    let exposure_ns: f64 = hits.iter().map(|h| h.exposure_ns).sum();
    let confidence = hits
        .iter()
        .map(|h| h.classification.confidence)
        .sum::<f64>()
        / hits.len() as f64;
    Some(WindowCase {
        hits,
        kind,
        latest,
        confidence,
        lost_gpu_seconds,
        exposure_ns,
    })
}

/// A closed verdict of the subject opens again: a new episode, its costs
/// added (measured anew when its class changed).
fn reopen(v: &mut Verdict, w: &WindowCase<'_>, it: u64) {
    v.active = true;
    v.episodes += 1;
    v.closed_iteration = None;
    v.confidence = w.confidence;
    v.evidence = w.latest.classification.evidence.clone();
    v.lost_gpu_seconds += w.lost_gpu_seconds;
    v.exposure_ns += w.exposure_ns;
    if v.kind != w.kind {
        v.reset_cost();
    }
    v.kind = w.kind;
    account_kind(v, w);
    v.last_seen_iteration = it;
    v.last_slow_iteration = it;
    v.opened_iteration = it;
}

/// Accounts the window's readings of the verdict's class (and only
/// those) to its cost.
fn account_kind(v: &mut Verdict, w: &WindowCase<'_>) {
    for h in w.hits.iter().filter(|h| h.classification.kind == w.kind) {
        v.account(h.saved_ns, h.step_ns, h.once_fixed);
    }
}

/// An active verdict's iteration: accounted while observed, closed after
/// `close_after` clean iterations.
fn update_active(
    cfg: &LifecycleConfig,
    t: &Tracker,
    v: &mut Verdict,
    it: u64,
    o: Option<Observation>,
) -> Option<VerdictEvent> {
    // A short episode is over once its rank kept pace on its own for
    // `close_after` iterations. The sequential test's standing evidence
    // outlasts a spike by as long as the spike was tall (a healthy rank
    // descheduled for 4 iterations beside two busy loops was held named 18
    // more, to the end of the run); it keeps lasting stragglers named.
    let short_over = o.as_ref().is_none_or(|o| o.held)
        && v.slow_span_bound() < v.transient_bound(cfg)
        && it.saturating_sub(v.last_slow_iteration) >= cfg.close_after;
    let o = o.filter(|_| !short_over);
    if let Some(o) = o {
        v.last_seen_iteration = it;
        if !o.held {
            v.last_slow_iteration = it;
        }
        v.lost_gpu_seconds += o.lost_ns / 1e9;
        v.exposure_ns += o.exposure_ns;
        v.confidence = 0.8 * v.confidence + 0.2 * o.classification.confidence;
        v.clock_error_us = o.clock_error_ns / 1e3;
        // The class may only change when every reading in the window
        // agrees, and there are at least `fast_open_min` of them; its cost
        // is then measured anew, as what it is now. Iterations without a
        // reading do not vote: an intermittent fault (slow 4 steps in 8)
        // never filled a window, so a verdict opened on the wrong class
        // kept it to the end (random 9241-8: host-slow on host-side
        // readings, compute-slow on every GPU-side one after).
        let readings = t.hist.iter().filter(|h| h.1.is_some()).count();
        let all_same = readings >= cfg.fast_open_min.max(1)
            && t.hist.iter().all(|h| {
                h.1.as_ref()
                    .is_none_or(|x| x.classification.kind == o.classification.kind)
            });
        let was = v.kind;
        if all_same && o.classification.kind != v.kind {
            v.reset_cost();
        }
        if all_same || o.classification.kind == v.kind {
            v.kind = o.classification.kind;
            v.evidence = o.classification.evidence;
        }
        // A minority reading is still costed as the verdict's class
        // (`graph::cost` replays an active compute verdict as compute).
        if o.held {
            v.account_tail(o.saved_ns, o.step_ns, o.once_fixed);
        } else {
            v.fold_tail();
            v.account(o.saved_ns, o.step_ns, o.once_fixed);
        }
        if v.kind != was {
            return Some(reclassified_event(v.clone(), was, it));
        }
    } else if t.clean_streak >= cfg.close_after || short_over {
        return Some(close(cfg, v, it, "cleared"));
    }
    None
}

/// Closes `v` at iteration `it`; `how` says why ("cleared", …).
fn close(cfg: &LifecycleConfig, v: &mut Verdict, it: u64, how: &str) -> VerdictEvent {
    v.active = false;
    // The iterations since its last slow one were not its episode.
    v.tail.clear();
    v.closed_iteration = Some(it);
    VerdictEvent {
        event: EventKind::Closed,
        iteration: Some(it),
        line: format!(
            "CLOSED {} ({}-slow) {how} at iteration {it} after {} iterations; lost {:.1} GPU-s{}{}",
            who(v),
            v.kind.as_str(),
            it.saturating_sub(v.first_seen_iteration),
            v.lost_gpu_seconds,
            match v.unobserved_to {
                Some(to) if to > v.last_slow_iteration => format!(
                    "; unobserved in iterations {}-{to}, it may have stayed slow through them",
                    v.last_slow_iteration + 1
                ),
                _ => String::new(),
            },
            if v.is_transient(cfg) {
                "; a transient (slow only briefly), not a straggler"
            } else {
                ""
            }
        ),
        verdict: Some(v.clone()),
        hang: None,
    }
}

/// A verdict opened at iteration `it` on `latest`, first seen at `first`.
#[allow(clippy::too_many_arguments)] // the one place a verdict is born: each field from its source
fn new_verdict(
    id: u64,
    subject: Subject,
    it: u64,
    kind: Kind,
    conf: f64,
    latest: &Observation,
    (first_it, first): (u64, &Observation),
    lost: f64,
    exposure: f64,
) -> Verdict {
    Verdict {
        id,
        rank: latest.rank,
        host: latest.host.clone(),
        kind,
        confidence: conf,
        first_seen_iteration: first_it,
        active: true,
        lost_gpu_seconds: lost,
        link: latest.link.map(|r| LinkRef { ranks: r }),
        ranks: latest.ranks.clone(),
        evidence: latest.classification.evidence.clone(),
        cost_fraction: 0.0,
        cost_iterations: 0,
        cost_once_fixed: None,
        cost_estimate: None,
        structural: latest.structural.clone(),
        clock_error_us: latest.clock_error_ns / 1e3,
        first_seen: first.wall,
        first_seen_coord_ns: first.at,
        opened_iteration: it,
        first_opened_iteration: it,
        last_seen_iteration: it,
        last_slow_iteration: it,
        unobserved_to: None,
        closed_iteration: None,
        episodes: 1,
        subject,
        exposure_ns: exposure,
        saved_ns: 0.0,
        costed_step_ns: 0.0,
        once_fixed_ns: (None, 0.0, 0.0),
        tail: Vec::new(),
        flamegraph: None,
    }
}

/// The event that says a verdict opened (or opened again).
fn opened_event(v: Verdict, event: EventKind, it: u64) -> VerdictEvent {
    VerdictEvent {
        event,
        iteration: Some(it),
        line: format!(
            "{} {} (confidence {:.2}, since iteration {}{})",
            if event == EventKind::Opened {
                "OPEN"
            } else {
                "REOPEN"
            },
            v.headline(),
            v.confidence,
            v.first_seen_iteration,
            if v.episodes > 1 {
                format!(", episode {}", v.episodes)
            } else {
                String::new()
            }
        ),
        verdict: Some(v),
        hang: None,
    }
}

fn reclassified_event(v: Verdict, was: Kind, it: u64) -> VerdictEvent {
    VerdictEvent {
        event: EventKind::Reclassified,
        iteration: Some(it),
        line: format!(
            "CLASS {} (was {}-slow; confidence {:.2}, since iteration {})",
            v.headline(),
            was.as_str(),
            v.confidence,
            v.first_seen_iteration
        ),
        verdict: Some(v),
        hang: None,
    }
}

/// The last `fast_open_min` iterations were all suspicious, GPU-side and
/// costly (see the module docs).
fn fast(cfg: &LifecycleConfig, t: &Tracker) -> bool {
    let n = cfg.fast_open_min;
    n > 0
        && t.hist.len() >= n
        && t.hist.iter().rev().take(n).all(|(_, o)| {
            o.as_ref().is_some_and(|o| {
                let share = match o.saved_ns {
                    Some(saved) if o.step_ns > 0.0 => saved / o.step_ns,
                    _ if o.exposure_ns > 0.0 => o.lost_ns / o.exposure_ns,
                    _ => 0.0,
                };
                o.classification.gpu_side && share >= cfg.fast_open_cost
            })
        })
}

impl Verdict {
    /// Forgets the cost measured so far (the verdict's class changed).
    fn reset_cost(&mut self) {
        self.saved_ns = 0.0;
        self.costed_step_ns = 0.0;
        self.cost_iterations = 0;
        self.cost_fraction = 0.0;
        self.once_fixed_ns = (None, 0.0, 0.0);
        self.cost_once_fixed = None;
        self.tail.clear();
    }

    /// An iteration after its last slow one: held until the rank is slow
    /// again (then it was inside the episode) or the verdict closes.
    fn account_tail(
        &mut self,
        saved_ns: Option<f64>,
        step_ns: f64,
        once_fixed: Option<(u32, f64)>,
    ) {
        self.tail.push((saved_ns, step_ns, once_fixed));
        // Bounded: a verdict that stays open this long without a slow
        // iteration is held by standing evidence, and that is its episode.
        if self.tail.len() > TAIL_MAX {
            self.fold_tail();
        }
    }

    /// The rank was slow again: the iterations held back were its episode.
    fn fold_tail(&mut self) {
        for (saved, step, once) in std::mem::take(&mut self.tail) {
            self.account(saved, step, once);
        }
    }

    /// Adds one iteration's what-if to the verdict's cost.
    fn account(&mut self, saved_ns: Option<f64>, step_ns: f64, once_fixed: Option<(u32, f64)>) {
        let Some(saved) = saved_ns.filter(|_| step_ns > 0.0 && step_ns.is_finite()) else {
            return;
        };
        self.saved_ns += saved.clamp(0.0, step_ns);
        self.costed_step_ns += step_ns;
        self.cost_iterations += 1;
        self.cost_fraction = (self.saved_ns / self.costed_step_ns).clamp(0.0, 1.0);
        match once_fixed {
            Some((r, ns)) => {
                if self.once_fixed_ns.0 != Some(r) {
                    self.once_fixed_ns = (Some(r), 0.0, 0.0);
                }
                self.once_fixed_ns.1 += ns.clamp(0.0, step_ns);
                self.once_fixed_ns.2 += step_ns;
            }
            None => self.once_fixed_ns = (None, 0.0, 0.0),
        }
        self.cost_once_fixed = match self.once_fixed_ns {
            (Some(rank), ns, step) if step > 0.0 => Some(OnceFixed {
                rank,
                cost_fraction: (ns / step).clamp(0.0, 1.0),
            }),
            _ => None,
        };
    }
}

impl Lifecycle {
    /// Short episodes whose ranks have all exited, after they had stopped
    /// being slow, end with them. Their `close_after` clean iterations
    /// can no longer come: a healthy rank descheduled for 5 iterations just
    /// before its host's collectives stopped being observed (an agent
    /// restarted mid-job, beside two busy loops) stayed "NOW host-slow"
    /// for the 570 iterations that followed. An episode whose rank was slow
    /// to its last observed iteration, or that lasted `transient_below`
    /// iterations (its [`Verdict::transient_bound`]), stays open: it may be a straggler the job's end cut off.
    pub fn end_with_exits(&mut self, exited: impl Fn(u32) -> bool) -> Vec<VerdictEvent> {
        let mut events = Vec::new();
        for t in self.trackers.values() {
            let Some(v) = t.verdict.and_then(|id| self.verdicts.get_mut(&id)) else {
                continue;
            };
            let Some(&(last_it, _)) = t.hist.back() else {
                continue;
            };
            let ranks: Vec<u32> = match (&v.link, v.ranks.is_empty()) {
                (Some(l), _) => l.ranks.to_vec(),
                (None, false) => v.ranks.clone(),
                (None, true) => vec![v.rank],
            };
            if v.active
                && !matches!(v.kind, Kind::Hang | Kind::Structural)
                && v.slow_iterations() < v.transient_bound(&self.cfg)
                && v.last_slow_iteration < last_it
                && ranks.iter().all(|&r| exited(r))
            {
                events.push(close(&self.cfg, v, last_it, "ended with its rank's exit"));
            }
        }
        events
    }

    /// One iteration's what-if for an active verdict that had no
    /// observation in it: a straggler keeps costing while it lasts, even in
    /// an iteration where it was not suspicious enough to be observed, so
    /// the cost is an average over every iteration of its episode, first
    /// sighting to last slow iteration (the ones after it count once the
    /// rank is slow again, and not if the verdict closes first).
    pub fn account_unobserved(
        &mut self,
        it: u64,
        subject: Subject,
        saved_ns: Option<f64>,
        step_ns: f64,
        once_fixed: Option<(u32, f64)>,
    ) {
        let Some(id) = self.trackers.get(&subject).and_then(|t| t.verdict) else {
            return;
        };
        if let Some(v) = self.verdicts.get_mut(&id) {
            if v.active && v.last_seen_iteration != it {
                v.account_tail(saved_ns, step_ns, once_fixed);
            }
        }
    }
}
