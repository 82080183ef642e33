//! Scoring a run: the coordinator's report (`DIR/report.json`, schema
//! `slowrank.report/v1`) against the ground truth (`DIR/truth.json`).
//!
//! Per injected fault: *matched* when a verdict names the right rank(s) with
//! the right class — a `link` fault by the link's two ranks, a `hang` by a
//! hang whose missing ranks include the hung rank(s) — else *missed*. Every
//! verdict or hang that matches no fault is a *false* finding. A run passes
//! with every fault matched and nothing false.
//!
//! Only the stable v1 fields are read, through this module's own types, so
//! the scorer depends on the report's published shape, not on the
//! coordinator's code.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    spec::FaultKind,
    truth::{FaultTruth, Outcome, Truth},
};

pub const REPORT_SCHEMA: &str = "slowrank.report/v1";

#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON of the expected shape")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} has schema {found:?}; the scorer reads {REPORT_SCHEMA}")]
    Schema { path: PathBuf, found: String },
}

/// The part of `report.json` scoring needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportView {
    pub schema: String,
    #[serde(default)]
    pub verdicts: Vec<VerdictView>,
    #[serde(default)]
    pub hangs: Vec<HangView>,
    #[serde(default)]
    pub job: Option<JobView>,
    /// Stretches the report says the job ran slower than its own pace.
    #[serde(default)]
    pub slow_stretches: Vec<StretchView>,
}

/// A slow stretch of the report (its iteration numbering).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StretchView {
    pub from_iteration: u64,
    pub to_iteration: u64,
}

/// The report's `job` section, as far as evaluation needs it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobView {
    /// The report's step time (median of the last few steps).
    #[serde(default)]
    pub step_time_ms: Option<f64>,
    /// Wall time (RFC 3339) of the first instance the coordinator saw: its iteration 0.
    #[serde(default)]
    pub started: Option<String>,
    /// Iterations the coordinator counted.
    #[serde(default)]
    pub iterations_observed: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerdictView {
    #[serde(default)]
    pub id: Option<u64>,
    /// Absent (0) in a structural verdict, which names no rank.
    #[serde(default)]
    pub rank: u32,
    #[serde(default)]
    pub host: String,
    /// compute | communication | host
    pub kind: String,
    #[serde(default)]
    pub confidence: f64,
    #[serde(default)]
    pub first_seen_iteration: Option<u64>,
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub link: Option<LinkView>,
    /// Iteration the verdict was raised at (the moment of detection).
    #[serde(default)]
    pub opened_iteration: Option<u64>,
    /// First raising of a verdict that was closed and reopened since.
    #[serde(default)]
    pub first_opened_iteration: Option<u64>,
    /// Share of the job's step the verdict says its subject costs.
    #[serde(default)]
    pub cost_fraction: Option<f64>,
    /// Iterations the what-if cost was measured in: 0 means the verdict
    /// carries no cost (its `cost_fraction` 0 is a placeholder, not a claim).
    #[serde(default)]
    pub cost_iterations: Option<u64>,
    /// Where the what-if could not cost it: the job's rise since it began,
    /// as an estimate (`{"fraction": …}`).
    #[serde(default)]
    pub cost_estimate: Option<CostEstimateView>,
    /// When an inactive verdict was closed.
    #[serde(default)]
    pub closed_iteration: Option<u64>,
    /// Structural verdicts (`kind: "structural"`): their cause.
    #[serde(default)]
    pub structural: Option<StructuralView>,
}

/// A verdict's estimated cost (`cost_estimate` in `report.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostEstimateView {
    pub fraction: f64,
}

/// `{"cause": "stage_imbalance", "stage": 3}` / `{"cause": "work_imbalance"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StructuralView {
    pub cause: String,
    #[serde(default)]
    pub stage: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkView {
    pub ranks: [u32; 2],
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HangView {
    #[serde(default)]
    pub communicator: String,
    #[serde(default)]
    pub sequence: u64,
    pub missing_ranks: Vec<u32>,
    /// Iteration of the stuck instance.
    #[serde(default)]
    pub iteration: Option<u64>,
}

/// A finding of the report, as the scorer names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// `verdict` or `hang`.
    pub what: &'static str,
    /// Index in the report's `verdicts` / `hangs`.
    pub index: usize,
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultScore {
    /// Index in the spec's `[[fault]]` list.
    pub index: usize,
    pub kind: FaultKind,
    pub ranks: Vec<u32>,
    pub matched: bool,
    /// The findings that matched it.
    pub matched_by: Vec<Finding>,
    /// Ranks (or link) the report did not name, when missed.
    pub missing: String,
    /// Truth iteration the fault first took effect, when observed.
    pub onset_iteration: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    pub scenario: String,
    pub outcome: Outcome,
    pub faults: Vec<FaultScore>,
    pub false_findings: Vec<Finding>,
    pub passed: bool,
    /// Per verdict: its reported cost against the measured one.
    pub costs: Vec<VerdictCost>,
}

/// A verdict's `cost_fraction` against what its fault really cost the job
/// (`truth.json`'s counterfactual cost, written by `eval`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictCost {
    /// Index in the report's `verdicts`.
    pub verdict: usize,
    /// The fault it matched (spec index), if any.
    pub fault: Option<usize>,
    pub reported: Option<f64>,
    /// The fault's measured cost fraction; 0 for a verdict matching no fault.
    pub measured: Option<f64>,
    /// `|reported − measured|`.
    pub abs_error: Option<f64>,
    /// `reported / measured` (when measured > 0).
    pub ratio: Option<f64>,
    /// The measured cost is below the harness's resolution (twice its
    /// noise floor): neither right nor wrong.
    pub below_resolution: bool,
}

/// Reported against measured cost of every verdict.
fn verdict_costs(truth: &Truth, report: &ReportView, faults: &[FaultScore]) -> Vec<VerdictCost> {
    (0..report.verdicts.len())
        .map(|i| {
            let fault = faults.iter().find(|f| {
                f.matched_by
                    .iter()
                    .any(|b| b.what == "verdict" && b.index == i)
            });
            let cost = fault.and_then(|f| {
                truth
                    .faults
                    .iter()
                    .find(|t| t.index == f.index)
                    .and_then(|t| t.cost.as_ref())
            });
            // A verdict naming nothing real: the job lost nothing to it.
            let measured = match fault {
                Some(_) => cost.map(|c| c.fraction),
                None => Some(0.0),
            };
            let v = &report.verdicts[i];
            // An estimate from the job's pace stands where the what-if
            // measured nothing, or put the rank off the critical path
            // while the step rose with it: it is what the report says the
            // rank costs.
            let reported = v
                .cost_estimate
                .as_ref()
                .map(|e| e.fraction)
                .or(v.cost_fraction.filter(|_| v.cost_iterations != Some(0)));
            VerdictCost {
                verdict: i,
                fault: fault.map(|f| f.index),
                reported,
                measured,
                abs_error: reported.zip(measured).map(|(r, m)| (r - m).abs()),
                ratio: reported
                    .zip(measured)
                    .and_then(|(r, m)| (m > 0.0).then(|| r / m)),
                below_resolution: cost.is_some_and(|c| c.below_resolution()),
            }
        })
        .collect()
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ScoreError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScoreError::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ScoreError::Json {
        path: path.to_owned(),
        source,
    })
}

/// Reads `dir/truth.json` and `dir/report.json` and scores them.
pub fn score_dir(dir: &Path) -> Result<Score, ScoreError> {
    let truth: Truth = read_json(&dir.join("truth.json"))?;
    let report_path = dir.join("report.json");
    let report: ReportView = read_json(&report_path)?;
    if report.schema != REPORT_SCHEMA {
        return Err(ScoreError::Schema {
            path: report_path,
            found: report.schema,
        });
    }
    Ok(score(&truth, &report))
}

fn verdict_finding(i: usize, v: &VerdictView) -> Finding {
    let who = match &v.link {
        Some(l) => format!("link {}↔{}", l.ranks[0], l.ranks[1]),
        None => format!("rank {}", v.rank),
    };
    Finding {
        what: "verdict",
        index: i,
        description: format!(
            "{who}{} {}-slow (confidence {:.2}{}{})",
            if v.host.is_empty() {
                String::new()
            } else {
                format!(" on {}", v.host)
            },
            v.kind,
            v.confidence,
            v.first_seen_iteration
                .map_or(String::new(), |i| format!(", since iteration {i}")),
            if v.active { ", active" } else { ", closed" }
        ),
    }
}

fn hang_finding(i: usize, h: &HangView) -> Finding {
    Finding {
        what: "hang",
        index: i,
        description: format!(
            "hang: ranks {:?} missing from {} #{}",
            h.missing_ranks, h.communicator, h.sequence
        ),
    }
}

fn same_link(a: [u32; 2], b: &[u32]) -> bool {
    b.len() == 2 && ((a[0] == b[0] && a[1] == b[1]) || (a[0] == b[1] && a[1] == b[0]))
}

/// Does verdict `v` name (one of) the ranks of fault `f` with its class?
/// Returns the fault ranks it accounts for.
fn verdict_covers(f: &FaultTruth, v: &VerdictView) -> Vec<u32> {
    let kind = v.kind.as_str();
    match f.kind {
        FaultKind::Compute | FaultKind::Host => {
            let want = if f.kind == FaultKind::Compute {
                "compute"
            } else {
                "host"
            };
            if kind == want && v.link.is_none() && f.ranks.contains(&v.rank) {
                vec![v.rank]
            } else {
                Vec::new()
            }
        }
        // A slow NIC: the rank, without a link, or a link that has it at one end.
        FaultKind::Communication => {
            if kind != "communication" {
                return Vec::new();
            }
            match &v.link {
                None if f.ranks.contains(&v.rank) => vec![v.rank],
                Some(l) => l
                    .ranks
                    .iter()
                    .copied()
                    .filter(|r| f.ranks.contains(r))
                    .collect(),
                None => Vec::new(),
            }
        }
        FaultKind::Link => match &v.link {
            Some(l) if kind == "communication" && same_link(l.ranks, &f.ranks) => f.ranks.clone(),
            _ => Vec::new(),
        },
        FaultKind::Hang => Vec::new(),
        FaultKind::StageImbalance | FaultKind::WorkImbalance => {
            let want = if f.kind == FaultKind::StageImbalance {
                "stage_imbalance"
            } else {
                "work_imbalance"
            };
            match &v.structural {
                Some(st)
                    if kind == "structural"
                        && st.cause == want
                        && (f.kind == FaultKind::WorkImbalance || st.stage == f.spec.stage) =>
                {
                    f.ranks.clone()
                }
                _ => Vec::new(),
            }
        }
    }
}

/// Scores `report` against `truth`.
pub fn score(truth: &Truth, report: &ReportView) -> Score {
    let mut used_v = vec![false; report.verdicts.len()];
    let mut used_h = vec![false; report.hangs.len()];
    let mut faults = Vec::new();
    for f in &truth.faults {
        let mut covered: Vec<u32> = Vec::new();
        let mut by = Vec::new();
        if f.kind == FaultKind::Hang {
            for (i, h) in report.hangs.iter().enumerate() {
                let named: Vec<u32> = f
                    .ranks
                    .iter()
                    .copied()
                    .filter(|r| h.missing_ranks.contains(r))
                    .collect();
                if !named.is_empty() {
                    used_h[i] = true;
                    covered.extend(named);
                    by.push(hang_finding(i, h));
                }
            }
        } else {
            for (i, v) in report.verdicts.iter().enumerate() {
                let named = verdict_covers(f, v);
                if !named.is_empty() {
                    used_v[i] = true;
                    covered.extend(named);
                    by.push(verdict_finding(i, v));
                }
            }
        }
        covered.sort_unstable();
        covered.dedup();
        let missing: Vec<u32> = f
            .ranks
            .iter()
            .copied()
            .filter(|r| !covered.contains(r))
            .collect();
        faults.push(FaultScore {
            index: f.index,
            kind: f.kind,
            ranks: f.ranks.clone(),
            matched: missing.is_empty() && !f.ranks.is_empty(),
            matched_by: by,
            missing: if missing.is_empty() {
                String::new()
            } else if f.kind == FaultKind::Link {
                format!("link {:?} not named", f.ranks)
            } else {
                format!("ranks {missing:?} not named as {:?}", f.kind)
            },
            onset_iteration: f.windows.first().map(|w| w.onset_iteration),
        });
    }
    let mut false_findings: Vec<Finding> = report
        .verdicts
        .iter()
        .enumerate()
        .filter(|(i, _)| !used_v[*i])
        .map(|(i, v)| verdict_finding(i, v))
        .collect();
    false_findings.extend(
        report
            .hangs
            .iter()
            .enumerate()
            .filter(|(i, _)| !used_h[*i])
            .map(|(i, h)| hang_finding(i, h)),
    );
    let passed = faults.iter().all(|f| f.matched) && false_findings.is_empty();
    Score {
        scenario: truth.scenario.clone(),
        outcome: truth.outcome,
        costs: verdict_costs(truth, report, &faults),
        faults,
        false_findings,
        passed,
    }
}

/// The table printed by `slowrank-scenario score`.
pub fn render(s: &Score) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let matched = s.faults.iter().filter(|f| f.matched).count();
    let _ = writeln!(
        out,
        "{}: {} — {}/{} fault(s) matched, {} false finding(s) (run outcome: {:?})",
        s.scenario,
        if s.passed { "PASS" } else { "FAIL" },
        matched,
        s.faults.len(),
        s.false_findings.len(),
        s.outcome
    );
    if !s.faults.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<6} {:<14} {:<10} {:<8} {:<7}  by",
            "fault", "kind", "ranks", "onset", "result"
        );
        for f in &s.faults {
            let ranks = f
                .ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let by = if f.matched {
                f.matched_by
                    .iter()
                    .map(|b| b.description.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            } else {
                f.missing.clone()
            };
            let _ = writeln!(
                out,
                "{:<6} {:<14} {:<10} {:<8} {:<7}  {by}",
                f.index,
                format!("{:?}", f.kind).to_lowercase(),
                ranks,
                f.onset_iteration.map_or("-".into(), |i| i.to_string()),
                if f.matched { "matched" } else { "MISSED" },
            );
        }
    }
    if !s.costs.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<8} {:<6} {:>9} {:>9} {:>8}  (cost: share of the job's step)",
            "verdict", "fault", "reported", "measured", "ratio"
        );
        let p = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}%", v * 100.0));
        for c in &s.costs {
            let _ = writeln!(
                out,
                "{:<8} {:<6} {:>9} {:>9} {:>8}{}",
                c.verdict,
                c.fault.map_or("-".into(), |f| f.to_string()),
                p(c.reported),
                p(c.measured),
                c.ratio.map_or("-".into(), |r| format!("{r:.2}")),
                if c.below_resolution {
                    "  below the harness's resolution"
                } else {
                    ""
                }
            );
        }
    }
    if s.false_findings.is_empty() {
        let _ = writeln!(out, "\nfalse findings: none");
    } else {
        let _ = writeln!(out, "\nfalse findings:");
        for f in &s.false_findings {
            let _ = writeln!(out, "  - {}", f.description);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fault(index: usize, kind: &str, ranks: &[u32]) -> FaultTruth {
        let spec = if ranks.len() == 1 {
            json!({"kind": kind, "rank": ranks[0], "start_iteration": 10})
        } else {
            json!({"kind": kind, "ranks": ranks, "start_iteration": 10})
        };
        serde_json::from_value(json!({
            "index": index,
            "kind": kind,
            "ranks": ranks,
            "spec": spec,
            "windows": [{"onset_iteration": 10, "onset_wall_ns": 0, "onset_mono_ns": 0,
                         "end_iteration": null, "end_wall_ns": null, "end_mono_ns": null}],
        }))
        .expect("fault truth")
    }

    fn truth(faults: Vec<FaultTruth>) -> Truth {
        let mut t: Truth = serde_json::from_value(json!({
            "version": 1, "scenario": "hand-made", "seed": 0, "run_id": "r",
            "hosts": 2, "ranks_per_host": 4, "world_size": 8,
            "parallel": {"tp": 1, "pp": 1, "dp": 8},
            "iterations": 50, "iterations_completed": 50, "outcome": "completed",
            "reason": "", "started_wall_ns": 0, "ended_wall_ns": 0, "started_mono_ns": 0,
            "ranks": [], "hosts_clock": [], "faults": [], "blocked": [],
        }))
        .expect("truth");
        t.faults = faults;
        t
    }

    fn report(v: serde_json::Value) -> ReportView {
        serde_json::from_value(v).expect("report view")
    }

    fn verdict(rank: u32, kind: &str, link: Option<[u32; 2]>) -> serde_json::Value {
        json!({"id": 1, "rank": rank, "host": "node-1", "kind": kind, "confidence": 0.9,
               "first_seen_iteration": 12, "active": true, "lost_gpu_seconds": 1.0,
               "link": link.map(|l| json!({"ranks": l})), "evidence": []})
    }

    #[test]
    fn compute_fault_matched_by_right_rank_and_class() {
        let t = truth(vec![fault(0, "compute", &[5])]);
        let r = report(
            json!({"schema": REPORT_SCHEMA, "verdicts": [verdict(5, "compute", None)], "hangs": []}),
        );
        let s = score(&t, &r);
        assert!(s.passed, "{}", render(&s));
        assert!(s.faults[0].matched);
        assert!(render(&s).contains("PASS"));
    }

    #[test]
    fn wrong_class_is_a_miss_and_a_false_verdict() {
        let t = truth(vec![fault(0, "compute", &[5])]);
        let r = report(json!({"schema": REPORT_SCHEMA, "verdicts": [verdict(5, "host", None)]}));
        let s = score(&t, &r);
        assert!(!s.passed);
        assert!(!s.faults[0].matched);
        assert_eq!(s.false_findings.len(), 1);
        assert!(render(&s).contains("MISSED"));
    }

    #[test]
    fn wrong_rank_is_a_miss() {
        let t = truth(vec![fault(0, "host", &[2])]);
        let r = report(json!({"schema": REPORT_SCHEMA, "verdicts": [verdict(3, "host", None)]}));
        let s = score(&t, &r);
        assert!(!s.passed && !s.faults[0].matched);
        assert_eq!(s.false_findings[0].what, "verdict");
    }

    #[test]
    fn healthy_run_passes_only_without_verdicts() {
        let t = truth(Vec::new());
        let quiet = report(json!({"schema": REPORT_SCHEMA, "verdicts": [], "hangs": []}));
        assert!(score(&t, &quiet).passed);
        let noisy =
            report(json!({"schema": REPORT_SCHEMA, "verdicts": [verdict(1, "compute", None)]}));
        let s = score(&t, &noisy);
        assert!(!s.passed);
        assert_eq!(s.false_findings.len(), 1);
    }

    #[test]
    fn link_fault_matches_by_its_two_ranks_in_any_order() {
        let t = truth(vec![fault(0, "link", &[3, 4])]);
        let ok = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(4, "communication", Some([4, 3]))]}));
        assert!(score(&t, &ok).passed);
        let other_link = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(3, "communication", Some([3, 5]))]}));
        let s = score(&t, &other_link);
        assert!(!s.passed && !s.faults[0].matched);
        // A NIC verdict on one end is not the link.
        let nic = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(3, "communication", None)]}));
        assert!(!score(&t, &nic).passed);
    }

    #[test]
    fn communication_fault_needs_a_communication_verdict_on_the_rank() {
        let t = truth(vec![fault(0, "communication", &[6])]);
        let ok = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(6, "communication", None)]}));
        assert!(score(&t, &ok).passed);
        let wrong = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(6, "compute", None)]}));
        assert!(!score(&t, &wrong).passed);
    }

    #[test]
    fn hang_matches_by_missing_ranks() {
        let t = truth(vec![fault(0, "hang", &[3])]);
        let ok = report(json!({"schema": REPORT_SCHEMA, "verdicts": [],
            "hangs": [{"communicator": "0x1", "sequence": 120, "missing_ranks": [3]}]}));
        assert!(score(&t, &ok).passed);
        let wrong = report(json!({"schema": REPORT_SCHEMA, "verdicts": [],
            "hangs": [{"communicator": "0x1", "sequence": 120, "missing_ranks": [2]}]}));
        let s = score(&t, &wrong);
        assert!(!s.passed);
        assert_eq!(s.false_findings[0].what, "hang");
        let none = report(json!({"schema": REPORT_SCHEMA}));
        assert!(!score(&t, &none).faults[0].matched);
    }

    #[test]
    fn two_faults_need_both_and_extra_verdicts_fail() {
        let t = truth(vec![fault(0, "compute", &[1]), fault(1, "host", &[6])]);
        let both = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(1, "compute", None), verdict(6, "host", None)]}));
        assert!(score(&t, &both).passed);
        let one = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(1, "compute", None)]}));
        let s = score(&t, &one);
        assert!(!s.passed);
        assert_eq!(s.faults.iter().filter(|f| f.matched).count(), 1);
        let extra = report(json!({"schema": REPORT_SCHEMA,
            "verdicts": [verdict(1, "compute", None), verdict(6, "host", None), verdict(2, "compute", None)]}));
        let s = score(&t, &extra);
        assert!(!s.passed);
        assert_eq!(s.false_findings.len(), 1);
        assert!(s.false_findings[0].description.contains("rank 2"));
    }

    #[test]
    fn score_dir_reads_files_and_checks_the_schema() {
        let dir = std::env::temp_dir().join(format!("slowrank-score-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = truth(vec![fault(0, "compute", &[5])]);
        std::fs::write(dir.join("truth.json"), serde_json::to_string(&t).unwrap()).unwrap();
        std::fs::write(
            dir.join("report.json"),
            json!({"schema": REPORT_SCHEMA, "verdicts": [verdict(5, "compute", None)]}).to_string(),
        )
        .unwrap();
        assert!(score_dir(&dir).unwrap().passed);
        std::fs::write(
            dir.join("report.json"),
            json!({"schema": "other/v9"}).to_string(),
        )
        .unwrap();
        assert!(matches!(score_dir(&dir), Err(ScoreError::Schema { .. })));
        std::fs::remove_file(dir.join("report.json")).unwrap();
        assert!(matches!(score_dir(&dir), Err(ScoreError::Io { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
