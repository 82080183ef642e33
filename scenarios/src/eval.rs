//! Evaluation: many scenario runs (specs × seeds, agent mode) scored against
//! their truth, aggregated into per-class precision/recall, false verdicts
//! per hour of healthy run, a confusion table and detection latency — for
//! slowrank's report and, on the same runs, for two naive baselines computed
//! from the run's own data ([`crate::baseline`]).
//!
//! The metric functions are pure (truth + report-shaped findings in, numbers
//! out) so they are unit-tested with hand-made inputs; [`run_eval`] is the
//! driver that runs the scenarios.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    baseline,
    counterfactual::{NoiseFloor, NoisePair},
    orchestrate::Mode,
    run::{run, RunOptions},
    score::{self, ReportView, Score},
    spec::{FaultKind, Spec},
    steps::StepLog,
    truth::Truth,
};

/// Fault / finding classes in table order.
pub const CLASSES: [&str; 6] = [
    "compute",
    "communication",
    "host",
    "link",
    "hang",
    "structural",
];
/// Row/column for "no fault here" / "nothing reported".
pub const NONE: &str = "none";

/// The specs `--quick` runs (one per class family, plus a healthy run).
pub const QUICK_SPECS: [&str; 4] = [
    "dp8-healthy",
    "dp8-compute-slow",
    "dp8-host-slow-dataloader",
    "dp8-link-slow",
];

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("no spec named {0} among the inputs (needed by --sweep-factors)")]
    NoSweepBase(String),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serialize the spec")]
    Toml(#[from] toml::ser::Error),
    #[error("cannot resume: {0}")]
    Resume(String),
}

/// The class a fault is scored under.
pub fn fault_class(k: FaultKind) -> &'static str {
    match k {
        FaultKind::Compute => "compute",
        FaultKind::Communication => "communication",
        FaultKind::Host => "host",
        FaultKind::Link => "link",
        FaultKind::Hang => "hang",
        FaultKind::StageImbalance | FaultKind::WorkImbalance => "structural",
    }
}

/// The class a verdict reports: its kind, or `link` when it names a link.
pub fn verdict_class(v: &score::VerdictView) -> String {
    if v.kind == "structural" || v.structural.is_some() {
        "structural".into()
    } else if v.link.is_some() {
        "link".into()
    } else {
        v.kind.clone()
    }
}

/// One run scored for one method (slowrank or a baseline).
#[derive(Debug, Clone, Default, Serialize)]
pub struct MethodRun {
    /// (fault class, matched) per injected fault.
    pub faults: Vec<(String, bool)>,
    /// (reported class, true positive) per finding.
    pub findings: Vec<(String, bool)>,
    /// (true class, reported class) pairs; see [`confusion`].
    pub confusion: Vec<(String, String)>,
    /// Onset → first correct finding, in iterations, per matched fault.
    pub latency_iterations: Vec<f64>,
    /// The same in seconds, where the detection iteration has a step time.
    pub latency_seconds: Vec<f64>,
    /// Per scored fault: its measured cost and how soon it was named.
    pub named: Vec<NamedFault>,
    /// Per verdict matching a scored fault: reported against measured cost.
    pub costs: Vec<CostPoint>,
    /// Fault class per verdict matching a scored fault that reported no
    /// cost (not measured): neither right nor wrong, but counted.
    pub not_costed: Vec<String>,
    /// Faults whose measured cost is below the harness's resolution: not
    /// scored (nor the findings matching only them).
    pub below_resolution: u64,
    /// Matching verdicts closed while their fault was still active.
    pub cleared_while_active: u64,
    /// Missed faults, and those of them active during a stretch the report
    /// told as slower than the job's pace: not named, but not hidden.
    pub missed: u64,
    pub missed_told_slower: u64,
}

/// A scored fault: its class, measured cost and time to name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NamedFault {
    pub class: String,
    /// Counterfactual cost fraction (`None`: not measured, e.g. a hang).
    pub measured: Option<f64>,
    pub matched: bool,
    /// Iterations from onset to the first correct finding.
    pub latency_iterations: Option<f64>,
}

/// One verdict's cost claim against the truth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostPoint {
    pub class: String,
    pub reported: f64,
    pub measured: f64,
}

/// Maps the method's iteration numbering onto the truth's, and truth
/// iterations onto wall time.
pub struct Timeline<'a> {
    /// Truth iteration = reported iteration × scale + offset. The scale
    /// (truth iterations / reported iterations) undoes a coordinator that
    /// found the wrong step period; 1 when it found the right one.
    pub offset: i64,
    pub scale: f64,
    pub steps: Option<&'a StepLog>,
}

impl Timeline<'_> {
    /// Truth iteration of reported iteration `it`.
    pub fn to_truth(&self, it: u64) -> u64 {
        ((it as f64 * self.scale).round() as i64 + self.offset).max(0) as u64
    }

    /// Median wall-clock end (ns) of truth iteration `it` over the ranks.
    pub fn wall_end_ns(&self, it: u64) -> Option<u64> {
        let steps = self.steps?;
        let mut w: Vec<u64> = steps
            .steps
            .values()
            .filter(|s| s.iteration == it)
            .map(|s| s.wall_ns)
            .collect();
        w.sort_unstable();
        w.get(w.len() / 2).copied()
    }
}

/// Ranks a finding names: the verdict's rank (or both link ends), a hang's missing ranks.
fn named_ranks(report: &ReportView, what: &str, index: usize) -> Vec<u32> {
    match what {
        "hang" => report.hangs[index].missing_ranks.clone(),
        _ => {
            let v = &report.verdicts[index];
            match &v.link {
                Some(l) => l.ranks.to_vec(),
                None => vec![v.rank],
            }
        }
    }
}

/// Scores one run of one method. `score` is `score::score(truth, report)`.
pub fn method_run(truth: &Truth, report: &ReportView, tl: &Timeline) -> MethodRun {
    let s: Score = score::score(truth, report);
    let mut out = MethodRun::default();
    let mut tp: Vec<(&'static str, usize)> = Vec::new();
    let mut excused: Vec<(&'static str, usize)> = Vec::new();
    for (f, ft) in s.faults.iter().zip(&truth.faults) {
        let class = fault_class(f.kind);
        if ft.windows.is_empty() {
            // Never on (its onset came after a hang stopped the job): nothing to find.
            excused.extend(f.matched_by.iter().map(|b| (b.what, b.index)));
            continue;
        }
        if ft.cost.as_ref().is_some_and(|c| c.below_resolution()) {
            out.below_resolution += 1;
            excused.extend(f.matched_by.iter().map(|b| (b.what, b.index)));
            continue;
        }
        out.faults.push((class.into(), f.matched));
        for b in &f.matched_by {
            tp.push((b.what, b.index));
        }
        let mut named = NamedFault {
            class: class.into(),
            measured: ft.cost.as_ref().map(|c| c.fraction),
            matched: f.matched,
            latency_iterations: None,
        };
        for b in f.matched_by.iter().filter(|b| b.what == "verdict") {
            let v = &report.verdicts[b.index];
            let closed = v.closed_iteration.filter(|_| !v.active);
            if closed.is_some_and(|c| active_in_truth(ft, tl.to_truth(c), truth)) {
                out.cleared_while_active += 1;
            }
        }
        if !f.matched {
            out.missed += 1;
            let told = report.slow_stretches.iter().any(|st| {
                (tl.to_truth(st.from_iteration)..=tl.to_truth(st.to_iteration))
                    .any(|it| active_in_truth(ft, it, truth))
            });
            out.missed_told_slower += u64::from(told);
            out.named.push(named);
            continue;
        }
        // Detection = the earliest raised finding among those that matched.
        let detected = f
            .matched_by
            .iter()
            .filter_map(|b| match b.what {
                "hang" => report.hangs[b.index].iteration,
                _ => {
                    let v = &report.verdicts[b.index];
                    v.first_opened_iteration
                        .or(v.opened_iteration)
                        .or(v.first_seen_iteration)
                }
            })
            .min();
        let (Some(d), Some(w)) = (detected, ft.windows.first()) else {
            out.named.push(named);
            continue;
        };
        let d_truth = tl.to_truth(d);
        let lat = d_truth.saturating_sub(w.onset_iteration) as f64;
        out.latency_iterations.push(lat);
        named.latency_iterations = Some(lat);
        out.named.push(named);
        if let Some(end) = tl.wall_end_ns(d_truth) {
            out.latency_seconds
                .push(end.saturating_sub(w.onset_wall_ns) as f64 / 1e9);
        }
    }
    let faulted: Vec<(&str, &[u32])> = truth
        .faults
        .iter()
        .map(|f| (fault_class(f.kind), f.ranks.as_slice()))
        .collect();
    let all: Vec<(&'static str, usize, String)> = report
        .verdicts
        .iter()
        .enumerate()
        .map(|(i, v)| ("verdict", i, verdict_class(v)))
        .chain((0..report.hangs.len()).map(|i| ("hang", i, "hang".to_string())))
        .collect();
    for (what, i, class) in &all {
        let ok = tp.contains(&(*what, *i));
        if ok || !excused.contains(&(*what, *i)) {
            out.findings.push((class.clone(), ok));
        }
    }
    for c in &s.costs {
        let Some(ft) = c
            .fault
            .and_then(|f| truth.faults.iter().find(|t| t.index == f))
        else {
            continue;
        };
        match (c.reported, c.measured, c.below_resolution) {
            (Some(r), Some(m), false) => out.costs.push(CostPoint {
                class: fault_class(ft.kind).into(),
                reported: r,
                measured: m,
            }),
            (None, Some(_), false) => out.not_costed.push(fault_class(ft.kind).into()),
            _ => {}
        }
    }
    out.confusion = confusion(&faulted, &all, report);
    out
}

/// Was fault `f` active in truth iteration `it`?
fn active_in_truth(f: &crate::truth::FaultTruth, it: u64, truth: &Truth) -> bool {
    crate::counterfactual::active_iterations(f, truth.iterations_completed).contains(&it)
}

/// Confusion pairs: per fault, (its class, the class of every distinct
/// finding naming one of its ranks) or (its class, `none`); per finding
/// naming no faulted rank, (`none`, its class).
fn confusion(
    faulted: &[(&str, &[u32])],
    findings: &[(&'static str, usize, String)],
    report: &ReportView,
) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut on_fault = vec![false; findings.len()];
    for (class, ranks) in faulted {
        let mut seen: Vec<&str> = Vec::new();
        for (j, (what, i, c)) in findings.iter().enumerate() {
            if named_ranks(report, what, *i)
                .iter()
                .any(|r| ranks.contains(r))
            {
                on_fault[j] = true;
                if !seen.contains(&c.as_str()) {
                    seen.push(c);
                }
            }
        }
        if seen.is_empty() {
            pairs.push((class.to_string(), NONE.to_string()));
        }
        for c in seen {
            pairs.push((class.to_string(), c.to_string()));
        }
    }
    for (j, (_, _, c)) in findings.iter().enumerate() {
        if !on_fault[j] {
            pairs.push((NONE.to_string(), c.clone()));
        }
    }
    pairs
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClassMetrics {
    pub faults: u64,
    pub matched: u64,
    /// matched / faults; `None` without faults of the class.
    pub recall: Option<f64>,
    pub findings: u64,
    pub true_findings: u64,
    /// true findings / findings; `None` without findings of the class.
    pub precision: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Quantiles {
    pub n: usize,
    pub median: Option<f64>,
    pub p90: Option<f64>,
}

/// Nearest-rank quantile of `v` (`q` in 0..=1).
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let k = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[k - 1])
}

pub fn quantiles(v: &[f64]) -> Quantiles {
    Quantiles {
        n: v.len(),
        median: quantile(v, 0.5),
        p90: quantile(v, 0.9),
    }
}

/// One method's numbers over many runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub per_class: BTreeMap<String, ClassMetrics>,
    /// `true class` → `reported class` → count.
    pub confusion: BTreeMap<String, BTreeMap<String, u64>>,
    pub healthy_runs: u64,
    pub healthy_hours: f64,
    pub healthy_false_findings: u64,
    /// False findings per hour of healthy (fault-free) run; `None` without healthy runs.
    pub false_per_healthy_hour: Option<f64>,
    /// Every finding that matched no fault, over all runs.
    pub false_findings: u64,
    pub latency_iterations: Quantiles,
    pub latency_seconds: Quantiles,
    /// Class → |reported − measured| cost and reported / measured.
    pub cost_error: BTreeMap<String, CostError>,
    /// Measured-cost bin → faults, named, iterations to name.
    pub time_to_name: BTreeMap<String, TimeToName>,
    /// Faults below the harness's resolution (not scored).
    pub below_resolution: u64,
    /// Matching verdicts closed while their fault was still active.
    pub cleared_while_active: u64,
    /// Missed faults; those of them the report told as a slower stretch.
    pub missed: u64,
    pub missed_told_slower: u64,
}

/// Cost error of one class: distributions of `|reported − measured|` (as
/// fractions of the step) and of `reported / measured`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CostError {
    pub abs: Quantiles,
    pub ratio: Quantiles,
    /// Matching verdicts that reported no cost (not in `abs` nor `ratio`).
    pub not_costed: u64,
}

/// Time to name of the faults in one measured-cost bin.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TimeToName {
    pub faults: u64,
    pub named: u64,
    /// Iterations from onset to the first correct finding (named faults).
    pub iterations: Quantiles,
}

/// Bins of measured cost for time to name (issue 20): below 3 % of the
/// step a fault is barely worth naming, above 10 % it is urgent.
pub const COST_BINS: [(&str, f64); 3] = [("<3%", 0.03), ("3-10%", 0.10), (">10%", f64::INFINITY)];

/// The bin of a measured cost (`unmeasured` without one).
pub fn cost_bin(measured: Option<f64>) -> &'static str {
    match measured {
        None => "unmeasured",
        Some(m) => COST_BINS
            .iter()
            .find(|(_, hi)| m < *hi)
            .map_or(">10%", |(n, _)| n),
    }
}

/// A method's run plus what aggregation needs to know about the run.
pub struct RunInput<'a> {
    pub m: &'a MethodRun,
    /// No fault injected.
    pub healthy: bool,
    /// Length of the run (truth started → ended).
    pub hours: f64,
}

pub fn aggregate(runs: &[RunInput]) -> Metrics {
    let mut m = Metrics::default();
    for c in CLASSES {
        m.per_class.insert(c.into(), ClassMetrics::default());
    }
    let mut lat_i = Vec::new();
    let mut lat_s = Vec::new();
    let mut cost_abs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut cost_ratio: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut not_costed: BTreeMap<String, u64> = BTreeMap::new();
    let mut ttn: BTreeMap<String, (u64, u64, Vec<f64>)> = BTreeMap::new();
    for r in runs {
        m.below_resolution += r.m.below_resolution;
        m.cleared_while_active += r.m.cleared_while_active;
        m.missed += r.m.missed;
        m.missed_told_slower += r.m.missed_told_slower;
        for c in &r.m.not_costed {
            *not_costed.entry(c.clone()).or_default() += 1;
            cost_abs.entry(c.clone()).or_default();
        }
        for c in &r.m.costs {
            cost_abs
                .entry(c.class.clone())
                .or_default()
                .push((c.reported - c.measured).abs());
            if c.measured > 0.0 {
                cost_ratio
                    .entry(c.class.clone())
                    .or_default()
                    .push(c.reported / c.measured);
            }
        }
        for n in &r.m.named {
            let e = ttn.entry(cost_bin(n.measured).into()).or_default();
            e.0 += 1;
            e.1 += u64::from(n.matched);
            e.2.extend(n.latency_iterations);
        }
        for (c, ok) in &r.m.faults {
            let e = m.per_class.entry(c.clone()).or_default();
            e.faults += 1;
            e.matched += u64::from(*ok);
        }
        for (c, ok) in &r.m.findings {
            let e = m.per_class.entry(c.clone()).or_default();
            e.findings += 1;
            e.true_findings += u64::from(*ok);
            if !ok {
                m.false_findings += 1;
                if r.healthy {
                    m.healthy_false_findings += 1;
                }
            }
        }
        for (t, p) in &r.m.confusion {
            *m.confusion
                .entry(t.clone())
                .or_default()
                .entry(p.clone())
                .or_default() += 1;
        }
        if r.healthy {
            m.healthy_runs += 1;
            m.healthy_hours += r.hours;
        }
        lat_i.extend(&r.m.latency_iterations);
        lat_s.extend(&r.m.latency_seconds);
    }
    for e in m.per_class.values_mut() {
        e.recall = (e.faults > 0).then(|| e.matched as f64 / e.faults as f64);
        e.precision = (e.findings > 0).then(|| e.true_findings as f64 / e.findings as f64);
    }
    m.false_per_healthy_hour =
        (m.healthy_hours > 0.0).then(|| m.healthy_false_findings as f64 / m.healthy_hours);
    m.latency_iterations = quantiles(&lat_i);
    m.latency_seconds = quantiles(&lat_s);
    for (c, v) in &cost_abs {
        m.cost_error.insert(
            c.clone(),
            CostError {
                abs: quantiles(v),
                ratio: quantiles(cost_ratio.get(c).map_or(&[][..], |r| &r[..])),
                not_costed: not_costed.get(c).copied().unwrap_or(0),
            },
        );
    }
    m.time_to_name = ttn
        .into_iter()
        .map(|(b, (faults, named, lat))| {
            (
                b,
                TimeToName {
                    faults,
                    named,
                    iterations: quantiles(&lat),
                },
            )
        })
        .collect();
    m
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses the report's RFC 3339 UTC times (`2026-11-23T04:45:00.423151929Z`) to ns.
pub fn parse_rfc3339_ns(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next()??);
    let mut frac_ns = 0i64;
    if !frac.is_empty() {
        let digits: String = frac.chars().take(9).collect();
        frac_ns = digits.parse::<i64>().ok()? * 10i64.pow(9 - digits.len() as u32);
    }
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se;
    u64::try_from(secs * 1_000_000_000 + frac_ns).ok()
}

/// Truth iteration of the coordinator's iteration 0: the first iteration
/// whose (median) end is at or after the report's `job.started`.
pub fn report_offset(report: &ReportView, steps: &StepLog) -> i64 {
    let Some(started) = report
        .job
        .as_ref()
        .and_then(|j| j.started.as_deref())
        .and_then(parse_rfc3339_ns)
    else {
        return 0;
    };
    let tl = Timeline {
        offset: 0,
        scale: 1.0,
        steps: Some(steps),
    };
    let last = steps.steps.keys().map(|k| k.1).max().unwrap_or(0);
    (0..=last)
        .find(|it| tl.wall_end_ns(*it).is_some_and(|w| w >= started))
        .unwrap_or(0) as i64
}

/// Everything kept about one (spec, seed) run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub spec: String,
    pub seed: u64,
    pub dir: PathBuf,
    pub healthy: bool,
    pub hours: f64,
    /// Set when the run or its scoring failed; the run then counts for nothing.
    pub error: Option<String>,
    /// Method name → scored run.
    pub methods: BTreeMap<String, MethodRun>,
    /// The counterfactual runs made (`without-all`, `without-<i>`, ...).
    pub counterfactual: Vec<String>,
    /// Why a fault has no measured cost (a counterfactual run failed).
    pub counterfactual_error: Option<String>,
    /// The report's step time against the job's.
    pub step_time: Option<StepCheck>,
    /// Baseline findings, computed before the run directory is trimmed.
    #[serde(skip)]
    baselines: Vec<(&'static str, ReportView)>,
}

/// How many of the last iterations the report's `job.step_time_ms` is
/// compared over ("median of the last few steps").
pub const STEP_CHECK_ITERATIONS: u64 = 10;

/// The report's step time is right when within this share of the job's
/// measured step (issue 20: a report that counts buckets as steps is off
/// by a factor, not by a few percent).
pub const STEP_TOLERANCE: f64 = 0.05;

/// `job.step_time_ms` against the job's median step over its last
/// [`STEP_CHECK_ITERATIONS`] iterations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepCheck {
    pub reported_ms: f64,
    pub measured_ms: f64,
    /// reported / measured.
    pub ratio: f64,
    /// Within [`STEP_TOLERANCE`].
    pub within: bool,
}

/// Compares a report's step time with the steps of its run.
pub fn step_check(report: &ReportView, steps: &StepLog, completed: u64) -> Option<StepCheck> {
    let reported = report.job.as_ref()?.step_time_ms?;
    let its: Vec<u64> = (completed.saturating_sub(STEP_CHECK_ITERATIONS)..completed).collect();
    let measured = crate::counterfactual::median_step_ms(steps, &its)?;
    let ratio = reported / measured;
    Some(StepCheck {
        reported_ms: reported,
        measured_ms: measured,
        ratio,
        within: (ratio - 1.0).abs() <= STEP_TOLERANCE,
    })
}

pub const SLOWRANK: &str = "slowrank";

/// The baselines' findings from a finished run directory (before its agent
/// records are trimmed).
fn baseline_reports(
    dir: &Path,
    steps: &StepLog,
    completed: u64,
) -> Result<Vec<(&'static str, ReportView)>, String> {
    let longest = baseline::longest_step(steps, baseline::WINDOW, baseline::NEED);
    let colls = baseline::read_agent_collectives(dir).map_err(|e| e.to_string())?;
    let per_iter = baseline::instances_per_iteration(&colls, completed);
    let shortest =
        baseline::shortest_collective(&colls, per_iter, baseline::WINDOW, baseline::NEED);
    Ok(vec![
        (baseline::LONGEST_STEP, longest),
        (baseline::SHORTEST_COLLECTIVE, shortest),
    ])
}

/// Scores a finished run directory for slowrank and the given baselines.
pub fn score_run_dir(
    dir: &Path,
    baselines: &[(&'static str, ReportView)],
) -> Result<BTreeMap<String, MethodRun>, String> {
    let s =
        score::score_dir(dir).map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?;
    drop(s);
    let truth: Truth = read_json(&dir.join("truth.json"))?;
    let report: ReportView = read_json(&dir.join("report.json"))?;
    let steps = StepLog::read_csv(&dir.join("steps.csv")).map_err(|e| format!("steps.csv: {e}"))?;
    let mut out = BTreeMap::new();
    let observed = report.job.as_ref().and_then(|j| j.iterations_observed);
    let tl = Timeline {
        offset: report_offset(&report, &steps),
        scale: match observed {
            Some(n) if n > 0 && truth.iterations_completed > 0 => {
                truth.iterations_completed as f64 / n as f64
            }
            _ => 1.0,
        },
        steps: Some(&steps),
    };
    out.insert(SLOWRANK.to_string(), method_run(&truth, &report, &tl));
    let truth_tl = Timeline {
        offset: 0,
        scale: 1.0,
        steps: Some(&steps),
    };
    for (name, r) in baselines {
        out.insert(name.to_string(), method_run(&truth, r, &truth_tl));
    }
    Ok(out)
}

fn read_json<T: for<'de> serde::Deserialize<'de>>(p: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub specs: Vec<PathBuf>,
    pub seeds: u64,
    pub out: PathBuf,
    pub quick: bool,
    pub iterations: Option<u64>,
    pub sweep_factors: Vec<f64>,
    /// Sweep with the GPU work of one step scaled to about this (ms).
    pub sweep_step_ms: Option<f64>,
    /// Keep every run directory whole (default: keep only truth, report, steps, spec).
    pub keep_runs: bool,
    pub mode: Mode,
    /// `--random N --seed S`: N generated specs instead of spec files.
    pub random: Option<(u64, u64)>,
    pub random_opts: crate::random::RandomOptions,
    /// Every spec's GPU work per step stretched to about this (ms).
    pub step_ms: Option<f64>,
    /// At least this many pairs of identical healthy runs for the noise floor.
    pub noise_pairs: u64,
    /// How the counterfactual and noise runs are made (default: as the
    /// evaluated runs, so the probes' own cost is the same on both sides).
    pub counterfactual_mode: Mode,
    /// Keep specs already finished under `out` (their [`DONE_FILE`]).
    pub resume: bool,
}

impl EvalOptions {
    /// Defaults for `specs` into `out`, agent mode.
    pub fn new(specs: Vec<PathBuf>, out: PathBuf) -> Self {
        Self {
            specs,
            seeds: 1,
            out,
            quick: false,
            iterations: None,
            sweep_factors: Vec::new(),
            sweep_step_ms: None,
            keep_runs: false,
            mode: Mode::WithAgents,
            random: None,
            random_opts: Default::default(),
            step_ms: None,
            noise_pairs: DEFAULT_NOISE_PAIRS,
            counterfactual_mode: Mode::WithAgents,
            resume: false,
        }
    }
}

/// Written into a run directory once every run of its spec has ended:
/// what scoring needs that the trimmed directory no longer holds.
pub const DONE_FILE: &str = "done.json";

/// One spec's finished runs ([`DONE_FILE`]), so that `--resume` can go on
/// after an interruption without running them again.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SpecDone {
    /// The spec as run (TOML): resuming into another plan is refused.
    spec_toml: String,
    hours: f64,
    error: Option<String>,
    counterfactual: Vec<String>,
    counterfactual_error: Option<String>,
    /// The baselines' findings (they read agent records trimming removes).
    baselines: Vec<(String, ReportView)>,
    /// The noise pairs this spec's runs made.
    noise: Vec<NoisePair>,
}

impl SpecDone {
    fn of(rr: &RunResult, spec_toml: String, noise: &[NoisePair]) -> Self {
        Self {
            spec_toml,
            hours: rr.hours,
            error: rr.error.clone(),
            counterfactual: rr.counterfactual.clone(),
            counterfactual_error: rr.counterfactual_error.clone(),
            baselines: rr
                .baselines
                .iter()
                .map(|(n, r)| ((*n).to_owned(), r.clone()))
                .collect(),
            noise: noise.to_vec(),
        }
    }

    /// Back into `rr`; the noise pairs are returned.
    fn restore(self, rr: &mut RunResult) -> Vec<NoisePair> {
        rr.hours = self.hours;
        rr.error = self.error;
        rr.counterfactual = self.counterfactual;
        rr.counterfactual_error = self.counterfactual_error;
        rr.baselines = self
            .baselines
            .into_iter()
            .filter_map(|(n, r)| baseline_name(&n).map(|n| (n, r)))
            .collect();
        self.noise
    }
}

fn baseline_name(n: &str) -> Option<&'static str> {
    [baseline::LONGEST_STEP, baseline::SHORTEST_COLLECTIVE]
        .into_iter()
        .find(|b| *b == n)
}

/// With `--resume`: the spec's finished runs in `dir`, if any. A directory
/// left half-done by the interruption is cleared to be run again.
fn resumed(dir: &Path, spec_toml: &str) -> Result<Option<SpecDone>, EvalError> {
    let path = dir.join(DONE_FILE);
    if !path.exists() {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|source| EvalError::Write {
                path: dir.to_owned(),
                source,
            })?;
        }
        return Ok(None);
    }
    let done: SpecDone = read_json(&path).map_err(EvalError::Resume)?;
    if done.spec_toml != spec_toml {
        return Err(EvalError::Resume(format!(
            "{} holds the runs of another spec than this evaluation's: resume with the \
             options of the first run, or use a fresh --out",
            path.display()
        )));
    }
    Ok(Some(done))
}

/// Pairs of identical healthy runs measured by default: issue 20 asks for
/// at least 10 behind the noise floor.
pub const DEFAULT_NOISE_PAIRS: u64 = 10;

/// The whole evaluation, as written to `DIR/eval.json`.
#[derive(Debug, Clone, Serialize)]
pub struct EvalResult {
    pub schema: &'static str,
    pub command: String,
    pub seeds: u64,
    pub quick: bool,
    /// The harness's noise floor over this evaluation's healthy pairs.
    pub noise: NoiseFloor,
    /// Runs whose report's step time is within [`STEP_TOLERANCE`] of the
    /// job's, of those with a step time; and the ratios' quantiles.
    pub step_time_within: (u64, u64),
    pub step_time_ratio: Quantiles,
    pub runs: Vec<RunResult>,
    /// Method → metrics over all runs.
    pub methods: BTreeMap<String, Metrics>,
    /// Spec → method → metrics (for the sweep: latency per factor).
    pub per_spec: BTreeMap<String, BTreeMap<String, Metrics>>,
}

/// Expands spec files and directories (their `*.toml`) into specs.
pub fn collect_specs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, EvalError> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(|source| EvalError::Io {
                path: p.clone(),
                source,
            })?;
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                .collect();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// `s` with its kernels stretched so one step's GPU work takes about `ms`.
pub fn stretch(s: &mut Spec, ms: f64) {
    let kernels = (s.step.forward_kernels + s.step.backward_kernels).max(1);
    s.step.kernel_us = ms * 1e3 / f64::from(kernels);
}

/// Specs of a latency sweep: `base` with its first fault's factor replaced,
/// and with `step_ms` its kernels stretched so that one step's GPU work
/// takes about that long. The detection costs that are fixed in seconds (a
/// batch flush, an analyzer pass, attaching the deep probes) cost fewer
/// iterations the longer a step is; the sweep can show both.
pub fn sweep_specs(base: &Spec, factors: &[f64], step_ms: Option<f64>) -> Vec<Spec> {
    factors
        .iter()
        .map(|f| {
            let mut s = base.clone();
            s.name = format!("{}-x{f}", base.name);
            if let Some(ms) = step_ms {
                stretch(&mut s, ms);
                s.name = format!("{}-step{ms}ms", s.name);
            }
            if let Some(fault) = s.faults.first_mut() {
                fault.factor = Some(*f);
            }
            s
        })
        .collect()
}

/// Removes the bulky parts of a run directory.
fn trim_run_dir(dir: &Path) {
    for d in ["lib", "sim", "coordinator", "flame"] {
        let _ = std::fs::remove_dir_all(dir.join(d));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".jsonl") || name == "trace.json" {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The specs to run, each with its run directory.
fn eval_plan(opts: &EvalOptions) -> Result<Vec<(PathBuf, Spec)>, EvalError> {
    let mut specs: Vec<Spec> = Vec::new();
    if let Some((n, seed)) = opts.random {
        specs = crate::random::specs(seed, n, &opts.random_opts);
    } else {
        for p in collect_specs(&opts.specs)? {
            specs.push(Spec::load(&p)?);
        }
    }
    if opts.quick {
        specs.retain(|s| QUICK_SPECS.contains(&s.name.as_str()));
    }
    if !opts.sweep_factors.is_empty() {
        let base = specs
            .iter()
            .find(|s| s.name == "dp8-compute-slow")
            .cloned()
            .ok_or_else(|| EvalError::NoSweepBase("dp8-compute-slow".into()))?;
        specs = sweep_specs(&base, &opts.sweep_factors, opts.sweep_step_ms);
    }
    let mut out = Vec::new();
    for (n, spec) in specs.iter().enumerate() {
        let seeds = if opts.random.is_some() {
            1
        } else {
            opts.seeds.max(1)
        };
        for k in 0..seeds {
            let mut s = spec.clone();
            s.seed = spec.seed.wrapping_add(k * 1000);
            if let Some(iters) = opts.iterations {
                s.iterations = iters;
                s.faults.retain(|f| f.start_iteration < iters);
            }
            if let Some(ms) = opts.step_ms {
                stretch(&mut s, ms);
            }
            let dir = if opts.random.is_some() {
                opts.out.join(n.to_string())
            } else {
                opts.out.join(format!("{}-seed{}", s.name, s.seed))
            };
            out.push((dir, s));
        }
    }
    Ok(out)
}

fn run_options(dir: &Path, mode: Mode) -> RunOptions {
    RunOptions {
        out: dir.to_owned(),
        mode,
        trainer: None,
        timeout: None,
        progress: false,
        trace: false,
        netns: true,
    }
}

/// Writes `dir/spec.toml` (so a failing run reruns alone) and runs it.
fn run_spec(
    s: &Spec,
    dir: &Path,
    mode: Mode,
    keep: bool,
) -> Result<crate::run::RunSummary, String> {
    s.validate().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let text = toml::to_string(s).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("spec.toml"), text).map_err(|e| format!("{}: {e}", dir.display()))?;
    let r = run(s, &run_options(dir, mode)).map_err(|e| format!("{e}"));
    if !keep {
        trim_run_dir(dir);
    }
    r
}

/// Counterfactual runs of `s` (faulted run `main`) under `dir/counterfactual/`:
/// writes every fault's cost into `dir/truth.json`. With `pairs` > 0, also
/// runs the fault-free spec `pairs` more times and returns that many noise
/// pairs, each against the same reference: the `without-all` run, or for a
/// healthy spec its own run (another, `healthy-0`, when the counterfactual
/// mode differs from the evaluated run's).
fn counterfactual(
    s: &Spec,
    dir: &Path,
    main: &crate::run::RunSummary,
    opts: &EvalOptions,
    pairs: u64,
) -> Result<(Vec<String>, Vec<NoisePair>), String> {
    use crate::counterfactual as cf;
    let cdir = dir.join("counterfactual");
    let mut made = Vec::new();
    let mut logs: BTreeMap<String, (StepLog, u64)> = BTreeMap::new();
    let mut variants = cf::plan(s);
    let twin = |j: u64| format!("healthy-{j}");
    // A pair is two runs in the same mode: a healthy spec's own run is the
    // reference only when the noise runs are made the same way.
    let own_reference = variants.is_empty() && opts.counterfactual_mode == opts.mode;
    let first = if pairs > 0 && variants.is_empty() && !own_reference {
        0
    } else {
        1
    };
    for j in first..=pairs {
        variants.push(cf::Variant {
            name: twin(j),
            removed: (0..s.faults.len()).collect(),
        });
    }
    for v in &variants {
        if crate::children::interrupted() {
            return Err("interrupted".into());
        }
        let spec = cf::without(s, &v.removed);
        tracing::info!(spec = %s.name, variant = %v.name, "counterfactual run");
        let r = run_spec(
            &spec,
            &cdir.join(&v.name),
            opts.counterfactual_mode,
            opts.keep_runs,
        )
        .map_err(|e| format!("counterfactual {}: {e}", v.name))?;
        logs.insert(v.name.clone(), (r.steps, r.truth.iterations_completed));
        made.push(v.name.clone());
    }
    let completed = main.truth.iterations_completed;
    let mut truth = main.truth.clone();
    for ft in &mut truth.faults {
        let alone = logs.get(&format!("without-{}", ft.index));
        let all = logs.get("without-all");
        let Some((without_it, _)) = alone.or(all) else {
            continue;
        };
        let all_removed = alone.and(all).map(|(l, _)| l);
        ft.cost = cf::cost(ft, completed, &main.steps, without_it, all_removed);
    }
    let path = dir.join("truth.json");
    let text = serde_json::to_string_pretty(&truth).expect("truth serialises");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    let (a, na) = match logs.get("without-all").or(logs.get(&twin(0))) {
        Some((l, n)) => (l, *n),
        None => (&main.steps, completed),
    };
    let noise = (1..=pairs)
        .filter_map(|j| {
            let (b, nb) = &logs[&twin(j)];
            let its = cf::healthy_iterations(s, na.min(*nb));
            cf::median_step_ms(a, &its)
                .zip(cf::median_step_ms(b, &its))
                .map(|(x, y)| NoisePair::new(&s.name, s.seed, x, y))
        })
        .collect();
    Ok((made, noise))
}

/// Writes the noise floor's resolution into every fault cost of a run's truth.
fn set_resolution(dir: &Path, resolution: Option<f64>) -> Result<(), String> {
    let path = dir.join("truth.json");
    let mut truth: Truth = read_json(&path)?;
    for c in truth.faults.iter_mut().filter_map(|f| f.cost.as_mut()) {
        c.resolution = resolution;
    }
    let text = serde_json::to_string_pretty(&truth).expect("truth serialises");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs the evaluation and writes `DIR/eval.json`.
pub fn run_eval(opts: &EvalOptions, command: String) -> Result<EvalResult, EvalError> {
    let plan = eval_plan(opts)?;
    std::fs::create_dir_all(&opts.out).map_err(|source| EvalError::Write {
        path: opts.out.clone(),
        source,
    })?;
    // Spread the noise pairs over the first runs, as few per run as will do.
    let per_run = opts.noise_pairs.div_ceil(plan.len().max(1) as u64);
    let mut runs = Vec::new();
    let mut pairs = Vec::new();
    for (dir, s) in &plan {
        let healthy = s.faults.is_empty();
        let mut rr = RunResult {
            spec: s.name.clone(),
            seed: s.seed,
            dir: dir.clone(),
            healthy,
            hours: 0.0,
            error: None,
            methods: BTreeMap::new(),
            counterfactual: Vec::new(),
            counterfactual_error: None,
            step_time: None,
            baselines: Vec::new(),
        };
        if crate::children::interrupted() {
            break;
        }
        let spec_toml = toml::to_string(s)?;
        if opts.resume {
            if let Some(done) = resumed(dir, &spec_toml)? {
                tracing::info!(spec = %s.name, seed = s.seed, "eval run already done (resumed)");
                pairs.extend(done.restore(&mut rr));
                runs.push(rr);
                continue;
            }
        }
        tracing::info!(spec = %s.name, seed = s.seed, "eval run");
        let pairs_before = pairs.len();
        // Baselines read the agents' records, which trimming removes.
        let main = run_spec(s, dir, opts.mode, true);
        match main {
            Ok(summary) => {
                let t = &summary.truth;
                rr.hours = t.ended_wall_ns.saturating_sub(t.started_wall_ns) as f64 / 3.6e12;
                match baseline_reports(dir, &summary.steps, t.iterations_completed) {
                    Ok(b) => rr.baselines = b,
                    Err(e) => rr.error = Some(e),
                }
                if !opts.keep_runs {
                    trim_run_dir(dir);
                }
                let n = per_run.min(opts.noise_pairs.saturating_sub(pairs.len() as u64));
                match counterfactual(s, dir, &summary, opts, n) {
                    Ok((made, noise)) => {
                        rr.counterfactual = made;
                        pairs.extend(noise);
                    }
                    Err(e) => rr.counterfactual_error = Some(e),
                }
            }
            Err(e) => {
                rr.error = Some(e);
                if !opts.keep_runs {
                    trim_run_dir(dir);
                }
            }
        }
        if let Some(e) = &rr.error {
            tracing::warn!(spec = %s.name, seed = s.seed, "run not scored: {e}");
        }
        if let Some(e) = &rr.counterfactual_error {
            tracing::warn!(spec = %s.name, seed = s.seed, "no measured cost: {e}");
        }
        if crate::children::interrupted() {
            // Its runs were cut short: neither scored nor kept as done.
            pairs.truncate(pairs_before);
            break;
        }
        if dir.exists() {
            let done = SpecDone::of(&rr, spec_toml, &pairs[pairs_before..]);
            let path = dir.join(DONE_FILE);
            let text = serde_json::to_string(&done).expect("serializable");
            std::fs::write(&path, text).map_err(|source| EvalError::Write { path, source })?;
        }
        runs.push(rr);
    }
    if crate::children::interrupted() {
        tracing::warn!(
            "interrupted after {} of {} specs: eval.json scores those; run the same command \
             with --resume to go on",
            runs.len(),
            plan.len()
        );
    }
    let noise = crate::counterfactual::noise_floor(pairs);
    for rr in runs.iter_mut().filter(|r| r.error.is_none()) {
        let scored = set_resolution(&rr.dir, noise.resolution)
            .and_then(|()| score_run_dir(&rr.dir, &rr.baselines));
        match scored {
            Ok(m) => rr.methods = m,
            Err(e) => rr.error = Some(e),
        }
        if let (Ok(report), Ok(steps), Ok(truth)) = (
            read_json::<ReportView>(&rr.dir.join("report.json")),
            StepLog::read_csv(&rr.dir.join("steps.csv")),
            read_json::<Truth>(&rr.dir.join("truth.json")),
        ) {
            rr.step_time = step_check(&report, &steps, truth.iterations_completed);
        }
    }
    let result = summarize(runs, opts, command, noise);
    let path = opts.out.join("eval.json");
    let text = serde_json::to_string_pretty(&result).expect("serializable");
    std::fs::write(&path, text).map_err(|source| EvalError::Write { path, source })?;
    Ok(result)
}

fn metrics_of<'a>(runs: impl Iterator<Item = &'a RunResult>) -> BTreeMap<String, Metrics> {
    let runs: Vec<&RunResult> = runs.filter(|r| r.error.is_none()).collect();
    let names: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.methods.keys()).collect();
    names
        .into_iter()
        .map(|n| {
            let inputs: Vec<RunInput> = runs
                .iter()
                .filter_map(|r| {
                    r.methods.get(n).map(|m| RunInput {
                        m,
                        healthy: r.healthy,
                        hours: r.hours,
                    })
                })
                .collect();
            (n.clone(), aggregate(&inputs))
        })
        .collect()
}

pub fn summarize(
    runs: Vec<RunResult>,
    opts: &EvalOptions,
    command: String,
    noise: NoiseFloor,
) -> EvalResult {
    let methods = metrics_of(runs.iter());
    let checks: Vec<&StepCheck> = runs.iter().filter_map(|r| r.step_time.as_ref()).collect();
    let ratios: Vec<f64> = checks.iter().map(|c| c.ratio).collect();
    let mut per_spec = BTreeMap::new();
    let names: std::collections::BTreeSet<String> = runs.iter().map(|r| r.spec.clone()).collect();
    for n in names {
        per_spec.insert(n.clone(), metrics_of(runs.iter().filter(|r| r.spec == n)));
    }
    EvalResult {
        schema: "slowrank.eval/v1",
        command,
        seeds: opts.seeds,
        quick: opts.quick,
        noise,
        step_time_within: (
            checks.iter().filter(|c| c.within).count() as u64,
            checks.len() as u64,
        ),
        step_time_ratio: quantiles(&ratios),
        runs,
        methods,
        per_spec,
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
}

fn pct1(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn num(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The human tables `eval` prints.
pub fn render(r: &EvalResult) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let ok = r.runs.iter().filter(|x| x.error.is_none()).count();
    let _ = writeln!(o, "{}", r.command);
    let _ = writeln!(o, "{} run(s), {} scored", r.runs.len(), ok);
    let n = &r.noise;
    let _ = writeln!(
        o,
        "harness noise floor: {} of the step (p90 over {} pair(s) of identical healthy runs; median {}); costs below {} are below the harness's resolution",
        pct1(n.floor),
        n.pairs.len(),
        pct1(n.median),
        pct1(n.resolution),
    );
    let _ = writeln!(
        o,
        "report step time within {:.0}% of the job's: {}/{} run(s); reported/measured median {} p90 {}",
        STEP_TOLERANCE * 100.0,
        r.step_time_within.0,
        r.step_time_within.1,
        r.step_time_ratio.median.map_or("-".into(), |v| format!("{v:.2}")),
        r.step_time_ratio.p90.map_or("-".into(), |v| format!("{v:.2}")),
    );
    for x in r.runs.iter().filter(|x| x.counterfactual_error.is_some()) {
        let _ = writeln!(
            o,
            "  no measured cost: {} seed {}: {}",
            x.spec,
            x.seed,
            x.counterfactual_error.as_deref().unwrap_or("")
        );
    }
    for x in r.runs.iter().filter(|x| x.error.is_some()) {
        let _ = writeln!(
            o,
            "  not scored: {} seed {}: {}",
            x.spec,
            x.seed,
            x.error.as_deref().unwrap_or("")
        );
    }
    for (name, m) in &r.methods {
        let _ = writeln!(o, "\n== {name}");
        let _ = writeln!(
            o,
            "{:<14} {:>6} {:>8} {:>7} {:>9} {:>6} {:>9}",
            "class", "faults", "matched", "recall", "findings", "true", "precision"
        );
        for (c, cm) in &m.per_class {
            let _ = writeln!(
                o,
                "{:<14} {:>6} {:>8} {:>7} {:>9} {:>6} {:>9}",
                c,
                cm.faults,
                cm.matched,
                pct(cm.recall),
                cm.findings,
                cm.true_findings,
                pct(cm.precision)
            );
        }
        let _ = writeln!(
            o,
            "false findings: {} in all runs; {} in {} healthy run(s) ({:.4} h) = {} per healthy hour",
            m.false_findings,
            m.healthy_false_findings,
            m.healthy_runs,
            m.healthy_hours,
            num(m.false_per_healthy_hour)
        );
        let _ = writeln!(
            o,
            "detection latency: iterations median {} p90 {} (n={}); seconds median {} p90 {}",
            num(m.latency_iterations.median),
            num(m.latency_iterations.p90),
            m.latency_iterations.n,
            m.latency_seconds
                .median
                .map_or("-".into(), |v| format!("{v:.2}")),
            m.latency_seconds
                .p90
                .map_or("-".into(), |v| format!("{v:.2}")),
        );
        let _ = writeln!(
            o,
            "faults below the harness's resolution (not scored): {}; matching verdicts closed while their fault was active: {}",
            m.below_resolution, m.cleared_while_active
        );
        let _ = writeln!(
            o,
            "missed faults the report told as a SLOWER stretch (no rank named, not hidden): {} of {}",
            m.missed_told_slower, m.missed
        );
        if !m.cost_error.is_empty() {
            let _ = writeln!(
                o,
                "cost error (share of step) {:<14} {:>4} {:>10} {:>10} {:>12} {:>12} {:>10}",
                "class", "n", "|err| med", "|err| p90", "ratio med", "ratio p90", "not costed"
            );
            for (c, e) in &m.cost_error {
                let _ = writeln!(
                    o,
                    "                           {:<14} {:>4} {:>10} {:>10} {:>12} {:>12} {:>10}",
                    c,
                    e.abs.n,
                    pct1(e.abs.median),
                    pct1(e.abs.p90),
                    e.ratio.median.map_or("-".into(), |v| format!("{v:.2}")),
                    e.ratio.p90.map_or("-".into(), |v| format!("{v:.2}")),
                    e.not_costed,
                );
            }
        }
        let _ = writeln!(
            o,
            "time to name by measured cost: {}",
            m.time_to_name
                .iter()
                .map(|(b, t)| format!(
                    "{b}: {}/{} named, median {} p90 {} it",
                    t.named,
                    t.faults,
                    num(t.iterations.median),
                    num(t.iterations.p90)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let mut cols: Vec<String> = CLASSES.iter().map(|c| c.to_string()).collect();
        cols.push(NONE.into());
        let _ = writeln!(o, "confusion (rows: injected, columns: reported)");
        let _ = write!(o, "{:<14}", "");
        for c in &cols {
            let _ = write!(o, " {:>13}", c);
        }
        let _ = writeln!(o);
        for row in &cols {
            let Some(m) = m.confusion.get(row) else {
                continue;
            };
            let _ = write!(o, "{:<14}", row);
            for c in &cols {
                let _ = write!(o, " {:>13}", m.get(c).copied().unwrap_or(0));
            }
            let _ = writeln!(o);
        }
    }
    let _ = writeln!(o, "\n== per spec (slowrank | longest-step | shortest-collective: matched/faults, false, latency median/p90 it)");
    for (spec, ms) in &r.per_spec {
        let cell = |n: &str| {
            ms.get(n).map_or("-".to_string(), |m| {
                let (f, mt) = m
                    .per_class
                    .values()
                    .fold((0, 0), |a, c| (a.0 + c.faults, a.1 + c.matched));
                format!(
                    "{mt}/{f}, {} false, {}/{}",
                    m.false_findings,
                    num(m.latency_iterations.median),
                    num(m.latency_iterations.p90)
                )
            })
        };
        let _ = writeln!(
            o,
            "{:<34} {:<24} | {:<24} | {}",
            spec,
            cell(SLOWRANK),
            cell(baseline::LONGEST_STEP),
            cell(baseline::SHORTEST_COLLECTIVE)
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::REPORT_SCHEMA;
    use serde_json::json;

    fn truth(faults: serde_json::Value) -> Truth {
        serde_json::from_value(json!({
            "version": 1, "scenario": "hand-made", "seed": 0, "run_id": "r",
            "hosts": 2, "ranks_per_host": 4, "world_size": 8,
            "parallel": {"tp": 1, "pp": 1, "dp": 8},
            "iterations": 50, "iterations_completed": 50, "outcome": "completed",
            "reason": "", "started_wall_ns": 0, "ended_wall_ns": 3_600_000_000_000u64,
            "started_mono_ns": 0, "ranks": [], "hosts_clock": [], "faults": faults, "blocked": [],
        }))
        .expect("truth")
    }

    fn fault(index: usize, kind: &str, ranks: &[u32], onset: u64) -> serde_json::Value {
        json!({"index": index, "kind": kind, "ranks": ranks,
               "spec": {"kind": kind, "ranks": ranks, "start_iteration": onset},
               "windows": [{"onset_iteration": onset, "onset_wall_ns": onset * 1_000_000_000, "onset_mono_ns": 0,
                            "end_iteration": null, "end_wall_ns": null, "end_mono_ns": null}]})
    }

    fn verdict(rank: u32, kind: &str, opened: u64, link: Option<[u32; 2]>) -> serde_json::Value {
        json!({"rank": rank, "kind": kind, "opened_iteration": opened, "first_seen_iteration": opened - 2,
               "link": link.map(|l| json!({"ranks": l}))})
    }

    fn report(verdicts: Vec<serde_json::Value>, hangs: serde_json::Value) -> ReportView {
        serde_json::from_value(
            json!({"schema": REPORT_SCHEMA, "verdicts": verdicts, "hangs": hangs}),
        )
        .expect("report")
    }

    /// Steps where iteration i of every rank ends at wall second i + 1.
    fn steps() -> StepLog {
        let mut s = StepLog::default();
        for r in 0..8 {
            for i in 0..50u64 {
                s.add(crate::steps::StepTime {
                    rank: r,
                    iteration: i,
                    start_ns: i * 1_000_000_000,
                    end_ns: (i + 1) * 1_000_000_000,
                    wall_ns: (i + 1) * 1_000_000_000,
                });
            }
        }
        s
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(5.0));
        assert_eq!(quantile(&v, 0.9), Some(9.0));
        assert_eq!(quantile(&[3.0], 0.9), Some(3.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[4.0, 1.0, 2.0], 0.5), Some(2.0));
    }

    #[test]
    fn method_run_counts_hits_false_findings_latency_and_confusion() {
        let t = truth(json!([
            fault(0, "compute", &[5], 10),
            fault(1, "host", &[2], 20)
        ]));
        let r = report(
            vec![
                verdict(5, "compute", 14, None),
                verdict(2, "compute", 25, None), // right rank, wrong class
                verdict(7, "host", 30, None),    // nothing there
            ],
            json!([]),
        );
        let st = steps();
        let tl = Timeline {
            offset: 1,
            scale: 1.0,
            steps: Some(&st),
        };
        let m = method_run(&t, &r, &tl);
        assert_eq!(
            m.faults,
            vec![("compute".into(), true), ("host".into(), false)]
        );
        assert_eq!(
            m.findings,
            vec![
                ("compute".into(), true),
                ("compute".into(), false),
                ("host".into(), false)
            ]
        );
        // opened 14 + offset 1 = truth iteration 15; onset 10 → 5 iterations,
        // iteration 15 ends at 16 s, onset at 10 s → 6 s.
        assert_eq!(m.latency_iterations, vec![5.0]);
        assert_eq!(m.latency_seconds, vec![6.0]);
        let mut c = m.confusion.clone();
        c.sort();
        assert_eq!(
            c,
            vec![
                ("compute".into(), "compute".into()),
                ("host".into(), "compute".into()),
                ("none".into(), "host".into()),
            ]
        );
    }

    #[test]
    fn link_and_hang_classes_and_missed_faults() {
        let t = truth(json!([
            fault(0, "link", &[3, 4], 10),
            fault(1, "hang", &[6], 30),
            fault(2, "communication", &[1], 5)
        ]));
        let r = report(
            vec![verdict(4, "communication", 12, Some([4, 3]))],
            json!([{"communicator": "0x1", "sequence": 9, "missing_ranks": [6], "iteration": 31}]),
        );
        let tl = Timeline {
            offset: 0,
            scale: 1.0,
            steps: None,
        };
        let m = method_run(&t, &r, &tl);
        assert_eq!(
            m.faults,
            vec![
                ("link".into(), true),
                ("hang".into(), true),
                ("communication".into(), false)
            ]
        );
        assert_eq!(
            m.findings,
            vec![("link".into(), true), ("hang".into(), true)]
        );
        assert_eq!(m.latency_iterations, vec![2.0, 1.0]);
        assert!(m.latency_seconds.is_empty(), "no steps, no seconds");
        assert!(m
            .confusion
            .contains(&("communication".into(), "none".into())));
        assert!(m.confusion.contains(&("link".into(), "link".into())));
        assert!(m.confusion.contains(&("hang".into(), "hang".into())));
    }

    #[test]
    fn aggregate_gives_precision_recall_and_false_rate_per_healthy_hour() {
        let hit = MethodRun {
            faults: vec![("compute".into(), true)],
            findings: vec![("compute".into(), true)],
            confusion: vec![("compute".into(), "compute".into())],
            latency_iterations: vec![4.0],
            latency_seconds: vec![0.5],
            named: vec![NamedFault {
                class: "compute".into(),
                measured: Some(0.2),
                matched: true,
                latency_iterations: Some(4.0),
            }],
            costs: vec![CostPoint {
                class: "compute".into(),
                reported: 0.3,
                measured: 0.2,
            }],
            ..Default::default()
        };
        let miss = MethodRun {
            faults: vec![("compute".into(), false)],
            findings: vec![("host".into(), false)],
            confusion: vec![("compute".into(), "host".into())],
            ..Default::default()
        };
        let noisy_healthy = MethodRun {
            findings: vec![("compute".into(), false), ("compute".into(), false)],
            confusion: vec![("none".into(), "compute".into()); 2],
            ..Default::default()
        };
        let m = aggregate(&[
            RunInput {
                m: &hit,
                healthy: false,
                hours: 0.1,
            },
            RunInput {
                m: &miss,
                healthy: false,
                hours: 0.1,
            },
            RunInput {
                m: &noisy_healthy,
                healthy: true,
                hours: 0.5,
            },
        ]);
        let c = &m.per_class["compute"];
        assert_eq!(
            (c.faults, c.matched, c.findings, c.true_findings),
            (2, 1, 3, 1)
        );
        assert_eq!(c.recall, Some(0.5));
        assert!((c.precision.unwrap() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(m.per_class["host"].precision, Some(0.0));
        assert_eq!(m.per_class["host"].recall, None);
        assert_eq!(m.per_class["link"], ClassMetrics::default());
        assert_eq!(m.false_findings, 3);
        assert_eq!(m.healthy_false_findings, 2);
        assert_eq!(m.false_per_healthy_hour, Some(4.0));
        assert_eq!(m.confusion["none"]["compute"], 2);
        assert_eq!(m.confusion["compute"]["host"], 1);
        assert_eq!(m.latency_iterations.median, Some(4.0));
        assert_eq!(m.latency_seconds.n, 1);
    }

    fn with_cost(mut f: serde_json::Value, fraction: f64) -> serde_json::Value {
        f["cost"] = json!({"iterations": 30, "step_with_ms": 100.0,
            "step_without_ms": 100.0 * (1.0 - fraction), "difference_ms": 100.0 * fraction,
            "fraction": fraction, "resolution": 0.02});
        f
    }

    /// A missed fault counts as told when a slow stretch of the report
    /// overlaps it; a stretch elsewhere does not.
    #[test]
    fn a_missed_fault_in_a_slower_stretch_is_counted_as_told() {
        let t = truth(json!([
            with_cost(fault(0, "compute", &[5], 10), 0.2),
            with_cost(fault(1, "compute", &[3], 40), 0.2)
        ]));
        let mut r = report(vec![], json!([]));
        r.slow_stretches = vec![crate::score::StretchView {
            from_iteration: 12,
            to_iteration: 20,
        }];
        let tl = Timeline {
            offset: 0,
            scale: 1.0,
            steps: None,
        };
        let m = method_run(&t, &r, &tl);
        assert_eq!((m.missed, m.missed_told_slower), (2, 1));
        r.slow_stretches[0].to_iteration = 8;
        r.slow_stretches[0].from_iteration = 2;
        let m = method_run(&t, &r, &tl);
        assert_eq!((m.missed, m.missed_told_slower), (2, 0));
    }

    #[test]
    fn costs_time_to_name_resolution_and_clearing() {
        let t = truth(json!([
            with_cost(fault(0, "compute", &[5], 10), 0.2),
            with_cost(fault(1, "host", &[2], 10), 0.01),
            with_cost(fault(2, "compute", &[1], 10), 0.05)
        ]));
        let mut v0 = verdict(5, "compute", 14, None);
        v0["cost_fraction"] = json!(0.3);
        v0["active"] = json!(false);
        v0["closed_iteration"] = json!(30);
        let mut v1 = verdict(2, "host", 12, None);
        v1["cost_fraction"] = json!(0.5);
        let mut v3 = verdict(6, "compute", 12, None);
        v3["cost_fraction"] = json!(0.1);
        let r = report(vec![v0, v1, v3], json!([]));
        let tl = Timeline {
            offset: 0,
            scale: 1.0,
            steps: None,
        };
        let m = method_run(&t, &r, &tl);
        // The 1 % host fault is below the 2 % resolution: not scored, and
        // its verdict is neither true nor false.
        assert_eq!(m.below_resolution, 1);
        assert_eq!(
            m.faults,
            vec![("compute".into(), true), ("compute".into(), false)]
        );
        assert_eq!(
            m.findings,
            vec![("compute".into(), true), ("compute".into(), false)]
        );
        assert_eq!(
            m.costs,
            vec![CostPoint {
                class: "compute".into(),
                reported: 0.3,
                measured: 0.2
            }]
        );
        assert_eq!(m.named.len(), 2);
        assert_eq!(m.named[0].latency_iterations, Some(4.0));
        assert_eq!(
            (m.named[1].matched, m.named[1].measured),
            (false, Some(0.05))
        );
        // Closed at 30 while the fault (open window from 10) was on.
        assert_eq!(m.cleared_while_active, 1);
        let agg = aggregate(&[RunInput {
            m: &m,
            healthy: false,
            hours: 0.1,
        }]);
        let e = &agg.cost_error["compute"];
        assert!((e.abs.median.unwrap() - 0.1).abs() < 1e-9);
        assert!((e.ratio.median.unwrap() - 1.5).abs() < 1e-9);
        assert_eq!(agg.time_to_name[">10%"].named, 1);
        assert_eq!(agg.time_to_name["3-10%"].faults, 1);
        assert_eq!(agg.time_to_name["3-10%"].named, 0);
        assert_eq!(agg.below_resolution, 1);
        assert_eq!(cost_bin(Some(0.029)), "<3%");
        assert_eq!(cost_bin(Some(0.1)), ">10%");
        assert_eq!(cost_bin(None), "unmeasured");
    }

    /// A verdict whose what-if found no iteration to cost says
    /// `cost_iterations: 0` beside a placeholder `cost_fraction: 0`: that is
    /// no claim of "costs nothing", so it is counted apart, not scored.
    #[test]
    fn an_uncosted_verdict_is_not_scored_as_costing_nothing() {
        let t = truth(json!([with_cost(fault(0, "compute", &[5], 10), 0.2)]));
        let mut v = verdict(5, "compute", 14, None);
        v["cost_fraction"] = json!(0.0);
        v["cost_iterations"] = json!(0);
        let tl = Timeline {
            offset: 0,
            scale: 1.0,
            steps: None,
        };
        let m = method_run(&t, &report(vec![v.clone()], json!([])), &tl);
        assert!(m.costs.is_empty(), "{:?}", m.costs);
        assert_eq!(m.not_costed, vec!["compute".to_string()]);
        let agg = aggregate(&[RunInput {
            m: &m,
            healthy: false,
            hours: 0.1,
        }]);
        let e = &agg.cost_error["compute"];
        assert_eq!((e.abs.n, e.not_costed), (0, 1));
        // Estimated from the job's pace instead: the estimate is the claim.
        let mut est = v.clone();
        est["cost_estimate"] = json!({"fraction": 0.18});
        let m = method_run(&t, &report(vec![est], json!([])), &tl);
        assert_eq!(m.costs.len(), 1);
        assert_eq!(m.costs[0].reported, 0.18);
        assert!(m.not_costed.is_empty());
        // Measured in one iteration, the same 0 is a claim and is scored.
        v["cost_iterations"] = json!(1);
        let m = method_run(&t, &report(vec![v], json!([])), &tl);
        assert_eq!(m.costs.len(), 1);
        assert!(m.not_costed.is_empty());
    }

    #[test]
    fn structural_verdicts_score_as_their_own_class() {
        let mut f = fault(0, "stage_imbalance", &[6, 7], 10);
        f["spec"] = json!({"kind": "stage_imbalance", "stage": 1, "start_iteration": 10});
        let t = truth(json!([
            f,
            fault(1, "work_imbalance", &[0, 1, 2, 3, 4, 5, 6, 7], 5)
        ]));
        let mut wrong_stage = verdict(0, "structural", 12, None);
        wrong_stage["structural"] = json!({"cause": "stage_imbalance", "stage": 0});
        let mut right = verdict(0, "structural", 14, None);
        right["structural"] = json!({"cause": "stage_imbalance", "stage": 1});
        let r = report(vec![wrong_stage, right], json!([]));
        let tl = Timeline {
            offset: 0,
            scale: 1.0,
            steps: None,
        };
        let m = method_run(&t, &r, &tl);
        assert_eq!(
            m.faults,
            vec![("structural".into(), true), ("structural".into(), false)]
        );
        assert_eq!(
            m.findings,
            vec![("structural".into(), false), ("structural".into(), true)]
        );
    }

    #[test]
    fn step_check_compares_the_last_steps() {
        let st = steps(); // 1 s steps
        let mut r = report(vec![], json!([]));
        r.job = Some(score::JobView {
            step_time_ms: Some(1030.0),
            ..Default::default()
        });
        let c = step_check(&r, &st, 50).expect("check");
        assert!((c.measured_ms - 1000.0).abs() < 1e-9);
        assert!(c.within);
        r.job.as_mut().unwrap().step_time_ms = Some(250.0);
        assert!(!step_check(&r, &st, 50).unwrap().within);
    }

    #[test]
    fn rfc3339_and_report_offset() {
        assert_eq!(
            parse_rfc3339_ns("1970-01-01T00:00:01Z"),
            Some(1_000_000_000)
        );
        assert_eq!(
            parse_rfc3339_ns("1970-01-02T00:00:00.5Z"),
            Some(86_400_500_000_000)
        );
        assert_eq!(
            parse_rfc3339_ns("2026-11-23T04:45:00.423151929Z"),
            Some(1_795_409_100_423_151_929)
        );
        assert_eq!(parse_rfc3339_ns("not a time"), None);
        let st = steps();
        let mut r = report(vec![], json!([]));
        assert_eq!(report_offset(&r, &st), 0, "no job section");
        r.job = Some(score::JobView {
            started: Some("1970-01-01T00:00:03.5Z".into()),
            iterations_observed: None,
            step_time_ms: None,
        });
        // Iteration 3 ends at 4 s, the first end after 3.5 s.
        assert_eq!(report_offset(&r, &st), 3);
    }

    #[test]
    fn sweep_specs_change_only_the_factor_and_name() {
        let base =
            Spec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/dp8-compute-slow.toml"))
                .expect("spec");
        let v = sweep_specs(&base, &[1.05, 2.0], None);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "dp8-compute-slow-x1.05");
        assert_eq!(v[0].step.kernel_us, base.step.kernel_us);
        assert_eq!(v[0].faults[0].factor, Some(1.05));
        assert_eq!(v[1].faults[0].factor, Some(2.0));
        assert_eq!(
            v[1].faults[0].start_iteration,
            base.faults[0].start_iteration
        );
        v[0].validate().expect("valid");
        let long = sweep_specs(&base, &[1.3], Some(300.0));
        assert_eq!(long[0].name, "dp8-compute-slow-x1.3-step300ms");
        let k = long[0].step.forward_kernels + long[0].step.backward_kernels;
        assert!((long[0].step.kernel_us * f64::from(k) - 300e3).abs() < 1.0);
        long[0].validate().expect("valid");
    }

    /// A spec's finished runs survive the trip through done.json, a
    /// half-done directory is cleared, and another spec's results refuse.
    #[test]
    fn resume_keeps_finished_specs_and_refuses_another_plan() {
        let tmp = crate::scratch::ScratchDir::new("eval-resume").unwrap();
        let dir = tmp.join("0");
        std::fs::create_dir_all(dir.join("counterfactual")).unwrap();
        assert!(resumed(&dir, "a").unwrap().is_none());
        assert!(!dir.exists(), "a half-done spec is run again from scratch");

        let report: ReportView = serde_json::from_value(json!({
            "schema": REPORT_SCHEMA,
            "verdicts": [{"rank": 3, "kind": "compute", "active": true, "cost_fraction": 0.1}],
        }))
        .unwrap();
        let mut rr = RunResult {
            spec: "s".into(),
            seed: 1,
            dir: dir.clone(),
            healthy: false,
            hours: 0.25,
            error: None,
            methods: BTreeMap::new(),
            counterfactual: vec!["without-all".into()],
            counterfactual_error: None,
            step_time: None,
            baselines: vec![(baseline::LONGEST_STEP, report)],
        };
        let noise = [NoisePair::new("s", 1, 100.0, 101.0)];
        std::fs::create_dir_all(&dir).unwrap();
        let done = SpecDone::of(&rr, "a".into(), &noise);
        std::fs::write(dir.join(DONE_FILE), serde_json::to_string(&done).unwrap()).unwrap();

        let back = resumed(&dir, "a").unwrap().expect("finished");
        rr.hours = 0.0;
        rr.baselines.clear();
        let pairs = back.restore(&mut rr);
        // serde_json reads a float back to within an ulp, not always exactly.
        assert_eq!(pairs.len(), 1);
        assert_eq!((pairs[0].step_a_ms, pairs[0].step_b_ms), (100.0, 101.0));
        assert!((pairs[0].relative - noise[0].relative).abs() < 1e-12);
        assert_eq!(rr.hours, 0.25);
        assert_eq!(rr.counterfactual, vec!["without-all".to_string()]);
        assert_eq!(rr.baselines.len(), 1);
        assert_eq!(rr.baselines[0].0, baseline::LONGEST_STEP);
        assert_eq!(rr.baselines[0].1.verdicts[0].rank, 3);
        assert!(matches!(resumed(&dir, "b"), Err(EvalError::Resume(_))));
        assert!(dir.join(DONE_FILE).exists(), "nothing removed on a refusal");
    }
}
