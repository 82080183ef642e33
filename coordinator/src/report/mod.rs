//! **Stage: report.** In: an immutable snapshot (verdicts, hangs, clock,
//! ingest). Out: what users read — text and `report.json` (this module),
//! [`html`] page, [`trace`] (Perfetto), [`timeline`] series, `/metrics`
//! ([`metrics_text`] over [`prom`]), [`alert`] lines and hooks, and the files
//! [`outputs`] keeps current in `--out`. Rendering never reaches into live
//! state.
//!
//! The cluster report: `report.json` (schema `slowrank.report/v1`, documented
//! in `docs/report-schema.md`) and the human table.

pub mod alert;
pub mod html;
pub mod metrics_text;
pub mod outputs;
pub mod prom;
pub mod timeline;
pub mod trace;

use chrono::{DateTime, Utc};

use crate::clock::HostClockReport;

/// Probe silence (ms) worth a line in the human report: probes go out
/// several times a second, so ten seconds means they stopped.
const STALE_PROBE_MS: f64 = 10_000.0;
use crate::join::{MissingMember, UNKNOWN_RANK};
use crate::verdict::Verdict;

pub const SCHEMA: &str = "slowrank.report/v1";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub schema: String,
    pub generated_at: DateTime<Utc>,
    pub job: JobInfo,
    pub clock: ClockInfo,
    pub verdicts: Vec<Verdict>,
    /// Hung instances still stuck (every member that never arrived named).
    pub hangs: Vec<HangReport>,
    /// Instances that looked hung past the timeout but whose missing members
    /// arrived later (a long stall, not a hang); `active` is false.
    #[serde(default)]
    pub resolved_stalls: Vec<HangReport>,
    /// Stuck instances whose missing ranks are themselves waiting inside a
    /// hung instance: consequences of the hangs above, not causes.
    #[serde(default)]
    pub blocked_hangs: Vec<HangReport>,
    pub ingest: IngestInfo,
    /// Every agent that connected, and whether it is still there (filled by
    /// `slowrank serve`; empty for an analyzer used on its own).
    #[serde(default)]
    pub agents: Vec<AgentReport>,
    /// The job's step is slower than its baseline beyond noise (with the
    /// ranks the recent iterations waited for most), whether or not a
    /// verdict explains it; null while it keeps its pace.
    #[serde(default)]
    pub slowdown: Option<crate::classify::pace::Slowing>,
    /// Stretches of the run whose step was slower than the job's own best
    /// pace, ended ones included ([`crate::classify::stretches`]): a
    /// slowdown over before the report, or under way before a baseline
    /// could be learned, is told here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slow_stretches: Vec<crate::classify::stretches::Stretch>,
    /// What slowrank's own probes cost the job, per rank and host, from the
    /// agents' measured trap cost and hit counts (absent: no interval yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<crate::overhead::OverheadReport>,
    /// Set when this report spans several coordinator lives (restarts on
    /// the same `--out`): how many, and what the earlier ones counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<ResumeInfo>,
    /// Set when the report was cut to fit [`MAX_REPORT_BYTES`]: the bound
    /// and how many entries of each list were left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncation>,
}

/// `report.json` written by `slowrank serve` is at most this long. A
/// 4,096-rank job's report is a few MiB (per-rank overhead, per-host
/// clocks, 8,192 agents at most); 16 MiB leaves room for that and keeps
/// rewriting it every few seconds cheap, whatever agents send (a 2^20-rank
/// hang once made a 206 MB report).
pub const MAX_REPORT_BYTES: usize = 16 << 20;

/// What [`Report::bound_size`] left out.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Truncation {
    /// The bound on `report.json`, in bytes.
    pub bound_bytes: u64,
    /// Entries left out, by list (`resolved_stalls`, `agents`, ...).
    pub left_out: std::collections::BTreeMap<String, u64>,
}

/// Removes entries from `list` (from its end, or its front when
/// `oldest_first`) worth about `excess` bytes of JSON, at least one;
/// returns how many.
fn cut<T: serde::Serialize>(list: &mut Vec<T>, excess: usize, oldest_first: bool) -> u64 {
    if list.is_empty() {
        return 0;
    }
    let bytes = serde_json::to_string_pretty(list).map_or(0, |j| j.len());
    let per = (bytes / list.len()).max(1);
    let n = excess.div_ceil(per).clamp(1, list.len());
    if oldest_first {
        list.drain(..n);
    } else {
        list.truncate(list.len() - n);
    }
    n as u64
}

/// Cuts from `list` only the entries `cuttable` says may go, keeping the
/// order of the rest.
fn cut_where<T: serde::Serialize>(
    list: &mut Vec<T>,
    excess: usize,
    cuttable: impl Fn(&T) -> bool,
) -> u64 {
    let (mut may, keep): (Vec<T>, Vec<T>) = std::mem::take(list).into_iter().partition(cuttable);
    let n = cut(&mut may, excess, true);
    *list = keep;
    list.append(&mut may);
    n
}

impl Report {
    /// Cuts the least important lists until the JSON is at most
    /// `max_bytes`, saying in [`Report::truncated`] what was left out:
    /// stalls that resolved, hangs that are consequences of others, agents
    /// gone, per-rank overhead, exited ranks, then agents still here, past
    /// verdicts, hangs and per-host clocks. Verdicts still active are
    /// never cut. False when it still does not fit.
    pub fn bound_size(&mut self, max_bytes: usize) -> bool {
        let size = |r: &Report| render_json(r).map_or(usize::MAX, |j| j.len());
        let mut len = size(self);
        if len <= max_bytes {
            return true;
        }
        let mut t = self.truncated.take().unwrap_or_default();
        t.bound_bytes = max_bytes as u64;
        // The note itself takes room: a few hundred bytes.
        let room = max_bytes.saturating_sub(512);
        type Step = fn(&mut Report, usize) -> u64;
        let steps: [(&str, Step); 9] = [
            ("resolved_stalls", |r, x| {
                cut(&mut r.resolved_stalls, x, true)
            }),
            ("blocked_hangs", |r, x| cut(&mut r.blocked_hangs, x, false)),
            ("agents_gone", |r, x| {
                cut_where(&mut r.agents, x, |a| !a.connected)
            }),
            ("overhead_ranks", |r, x| {
                r.overhead
                    .as_mut()
                    .map_or(0, |o| cut(&mut o.ranks, x, false))
            }),
            ("exited_ranks", |r, x| {
                cut(&mut r.job.exited_ranks, x, false)
            }),
            ("agents", |r, x| cut(&mut r.agents, x, false)),
            ("verdicts_past", |r, x| {
                cut_where(&mut r.verdicts, x, |v| !v.active)
            }),
            ("hangs", |r, x| cut(&mut r.hangs, x, false)),
            ("clock_hosts", |r, x| cut(&mut r.clock.hosts, x, false)),
        ];
        for (name, step) in steps {
            while len > room {
                let n = step(self, len - room);
                if n == 0 {
                    break;
                }
                *t.left_out.entry(name.to_owned()).or_default() += n;
                len = size(self);
            }
        }
        self.truncated = Some(t);
        size(self) <= max_bytes
    }
}

/// One agent connection as seen by `slowrank serve`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentReport {
    pub agent_id: String,
    pub host: String,
    pub connected: bool,
    pub connected_at: DateTime<Utc>,
    pub disconnected_at: Option<DateTime<Utc>>,
    /// Why it went away ("closed by peer: agent done", "timed out", ...).
    pub reason: Option<String>,
    pub batches: u64,
    /// Ranks on its host that had not exited when it went away: no longer observed.
    pub ranks_unobserved: Vec<u32>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobInfo {
    pub job_id: Option<String>,
    pub world_size: u32,
    pub ranks_seen: usize,
    pub hosts: usize,
    pub reference_communicator: Option<String>,
    pub instances_per_iteration: Option<u64>,
    /// How the step was told (`iteration::Method`); `undetermined`: each
    /// instance counted as a step, and per-iteration figures are per
    /// instance.
    #[serde(default)]
    pub step_inferred_by: Option<crate::graph::iteration::Method>,
    /// Median step over the first steps after warm-up (the pace the job is
    /// compared with).
    #[serde(default)]
    pub baseline_step_ms: Option<f64>,
    pub iterations_observed: u64,
    pub step_time_ms: Option<f64>,
    pub observed_seconds: f64,
    pub started: Option<DateTime<Utc>>,
    /// Ranks whose process exited (crash or end of job) while observed.
    #[serde(default)]
    pub exited_ranks: Vec<u32>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ClockInfo {
    /// Largest per-host error bound; null while some host has no clock.
    pub max_error_us: Option<f64>,
    pub hosts: Vec<HostClockReport>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HangReport {
    pub communicator: String,
    pub sequence: u64,
    pub op: String,
    /// The absent members' ranks; with `missing_count` set, the first
    /// [`crate::join::HANG_LIST_MAX`] only.
    pub missing_ranks: Vec<u32>,
    /// Set when more than [`crate::join::HANG_LIST_MAX`] members are
    /// absent: how many in all (`missing_ranks` and `missing` then list the
    /// first ones, by position in the communicator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_count: Option<u64>,
    /// With `missing_count`: every absent member's rank as inclusive
    /// `[first, last]` ranges (at most [`crate::join::MAX_MISSING_RANGES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_ranges: Option<Vec<[u32; 2]>>,
    /// With `missing_count`: absent members in none of the ranges (never
    /// announced by any agent, so of unknown rank, or past the range cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_unlisted: Option<u64>,
    pub missing: Vec<MissingMember>,
    pub present_ranks: Vec<u32>,
    pub iteration: Option<u64>,
    pub first_seen: Option<DateTime<Utc>>,
    pub active: bool,
    pub exited_ranks: Vec<u32>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IngestInfo {
    #[serde(flatten)]
    pub counters: IngestCounters,
    pub instances_completed: u64,
    pub instances_evicted: u64,
    pub instances_incomplete: u64,
    pub duplicate_records: u64,
    pub merged_records: u64,
    pub dropped_late_for_stats: u64,
    pub dropped_overflow: u64,
    pub open_instances: usize,
    /// Whole batches rejected by the QUIC ingest before decoding, by reason
    /// (`truncated`, `invalid_archive`, `oversized`, ...); filled by `serve`.
    /// Named apart from `batches_rejected` (the analyzer's, flattened in
    /// from the counters) so the JSON has no duplicate key.
    #[serde(default)]
    pub transport_rejected: std::collections::BTreeMap<String, u64>,
    /// Connections refused (bad token, malformed hello); filled by `serve`.
    #[serde(default)]
    pub agents_refused: u64,
    /// The same refusals by reason (`invalid_token`, `hello_timeout`,
    /// `preauth_per_address`, `host_in_use`, ...); filled by `serve`.
    #[serde(default)]
    pub agents_refused_by: std::collections::BTreeMap<String, u64>,
    /// Agents that had gone and were dropped from `agents` to keep the
    /// report bounded (the oldest departures first); filled by `serve`.
    #[serde(default)]
    pub agents_forgotten: u64,
}

/// `report.json`, pretty-printed.
pub fn render_json(r: &Report) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(r)
}

/// The table a tired on-call engineer reads: one line per finding first,
/// details after.
pub fn render_human(r: &Report) -> String {
    let mut s = String::new();
    human_headline(&mut s, r);
    human_slowdown(&mut s, r);
    human_stretches(&mut s, r);
    human_findings(&mut s, r);
    if !r.verdicts.is_empty() {
        human_verdict_table(&mut s, r);
        for v in &r.verdicts {
            human_verdict_details(&mut s, v);
        }
    }
    human_hangs(&mut s, r);
    human_footer(&mut s, r);
    s
}

/// The job in one line, and what to make of a report with nothing in it.
fn human_headline(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "slowrank report — job {} · {} ranks on {} hosts · {} iterations observed{}",
        r.job.job_id.as_deref().unwrap_or("?"),
        r.job.world_size,
        r.job.hosts,
        r.job.iterations_observed,
        r.job
            .step_time_ms
            .map_or(String::new(), |t| format!(" · step {t:.1} ms"))
    );
    let _ = writeln!(s);
    if r.job.ranks_seen == 0 {
        let _ = writeln!(
            s,
            "No rank observed yet: no agent has reported a rank process ({} agent(s) seen).",
            r.agents.len()
        );
    } else if r.verdicts.is_empty() && r.hangs.is_empty() && r.slowdown.is_none() {
        match r.job.baseline_step_ms {
            // Not "kept its pace": it did not, for a while (SLOWER below).
            _ if !r.slow_stretches.is_empty() => {
                let _ = writeln!(
                    s,
                    "No slow rank found, but the job ran slower than its own pace for a while (SLOWER below)."
                );
            }
            Some(b) => {
                let _ = writeln!(
                    s,
                    "No slow rank found: the job kept its pace (step {:.1} ms, baseline {b:.1} ms).",
                    r.job.step_time_ms.unwrap_or(b)
                );
            }
            // "Kept its pace" is a claim about a baseline: without one the
            // job may have slowed from its first steps on.
            None => {
                let _ = writeln!(
                    s,
                    "No slow rank found, but too few steps were observed after warm-up to tell whether the job slowed (a baseline needs about {} steps).",
                    crate::classify::pace::MIN_BASELINE_STEPS * 3 / 2
                );
            }
        }
    }
}

/// A slowdown the verdicts do not explain, with its leading candidates.
fn human_slowdown(s: &mut String, r: &Report) {
    use std::fmt::Write;
    if let Some(sd) = &r.slowdown {
        let explained: f64 = r
            .verdicts
            .iter()
            .filter(|v| v.active)
            .map(|v| {
                v.cost_estimate
                    .as_ref()
                    .map_or(v.cost_fraction, |e| e.fraction)
            })
            .sum();
        // The verdicts explain the slowdown when their costs add up to
        // most of it (rise is against the baseline; cost against the
        // slower step: convert).
        let needed = sd.rise / (1.0 + sd.rise);
        // A verdict whose cost the what-if could not measure (a GPU with no
        // GPU-side times) is not evidence that something else is wrong.
        let unmeasured: Vec<u32> = r
            .verdicts
            .iter()
            .filter(|v| v.active && v.cost_iterations == 0 && v.cost_estimate.is_none())
            .map(|v| v.rank)
            .collect();
        if explained < 0.5 * needed {
            let _ = writeln!(
                s,
                "UNEXPLAINED SLOWDOWN: the job's step is {:.1} ms against {:.1} ms before (+{:.0}%) since iteration {}, {}.",
                sd.recent_step_ms,
                sd.baseline_step_ms,
                100.0 * sd.rise,
                sd.since_iteration,
                match (unmeasured.is_empty(), r.verdicts.iter().any(|v| v.active)) {
                    (false, _) => format!(
                        "which {} named below may explain: {} cost is not measured (no GPU-side times to replay)",
                        fmt_ranks(&unmeasured),
                        if unmeasured.len() == 1 { "its" } else { "their" }
                    ),
                    (true, true) => "more than the verdicts below explain".to_string(),
                    (true, false) => "and no rank is named".to_string(),
                }
            );
            for c in &sd.candidates {
                let _ = writeln!(
                    s,
                    "  leading candidate: rank {} (the recent steps waited for it: {:.1}% of the step on average)",
                    c.rank,
                    100.0 * c.cost_fraction
                );
            }
        }
    }
}

/// The stretches of the run slower than the job's own pace, and what was
/// named meanwhile: an ongoing one the slowdown above already tells is
/// not repeated.
fn human_stretches(s: &mut String, r: &Report) {
    use std::fmt::Write;
    for line in stretch_lines(r) {
        let _ = writeln!(s, "SLOWER {line}");
    }
}

/// One line per slow stretch (text and page), without its tag. A stretch
/// wholly within one verdict's time is that verdict's, which the lines
/// below it tell (a fault near the stretches' floor comes and goes in
/// several stretches: the demo's data loader made three); `report.json`
/// keeps every stretch.
pub fn stretch_lines(r: &Report) -> Vec<String> {
    let within_a_verdict = |st: &crate::classify::stretches::Stretch| {
        r.verdicts.iter().any(|v| {
            v.first_seen_iteration <= st.from_iteration
                && v.closed_iteration.is_none_or(|c| c >= st.to_iteration)
        })
    };
    r.slow_stretches
        .iter()
        .filter(|st| !(st.ongoing && r.slowdown.is_some()))
        .filter(|st| !within_a_verdict(st))
        .map(|st| {
            let during: Vec<String> = r
                .verdicts
                .iter()
                .filter(|v| {
                    v.first_seen_iteration <= st.to_iteration
                        && v.closed_iteration.is_none_or(|c| c >= st.from_iteration)
                })
                .map(|v| match &v.structural {
                    Some(x) => match x.stage {
                        Some(stage) => format!("stage {stage} ({})", x.cause.replace('_', " ")),
                        None => x.cause.replace('_', " "),
                    },
                    None => format!("rank {} ({})", v.rank, v.kind.as_str()),
                })
                .collect();
            let why = if !during.is_empty() {
                format!("named meanwhile: {}", during.join(", "))
            } else if r.job.hosts == 1 {
                "no rank was named: on one host every collective runs over NVLink or shared memory, which gives slowrank no GPU-side times, so a slower GPU, pipeline stage or uneven work there is not told apart".to_string()
            } else {
                "no rank was named".to_string()
            };
            format!(
                "iterations {}–{}{}{}: step {:.1} ms against the job's best pace of {:.1} ms (+{:.0}%); {why}.",
                st.from_iteration,
                st.to_iteration,
                if st.from_first_step { " (slow already at the first step read)" } else { "" },
                if st.ongoing { " (to the last step seen)" } else { "" },
                st.step_ms,
                st.pace_ms,
                100.0 * st.rise
            )
        })
        .collect()
}

/// One line per finding: agents gone, exits, a cut report, hangs,
/// stalls, then the verdicts now and before.
fn human_findings(s: &mut String, r: &Report) {
    use std::fmt::Write;
    for a in r
        .agents
        .iter()
        .filter(|a| !a.connected && !a.ranks_unobserved.is_empty())
    {
        let _ = writeln!(
            s,
            "GONE  agent {} on {} went away{} ({}); {} no longer observed",
            a.agent_id,
            a.host,
            a.disconnected_at
                .map_or(String::new(), |t| format!(" at {}", t.format("%H:%M:%S"))),
            a.reason.as_deref().unwrap_or("?"),
            fmt_ranks(&a.ranks_unobserved)
        );
    }
    if !r.job.exited_ranks.is_empty() {
        let _ = writeln!(s, "EXIT  {} exited", fmt_ranks(&r.job.exited_ranks));
    }
    if let Some(t) = &r.truncated {
        let left: Vec<String> = t.left_out.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(
            s,
            "CUT   report cut to {} bytes: left out {}",
            t.bound_bytes,
            left.join(", ")
        );
    }
    for h in r.hangs.iter().filter(|h| h.active) {
        let _ = writeln!(
            s,
            "HANG  {} of communicator {} instance {} never arrived (stuck since iteration {})",
            fmt_missing(h),
            h.communicator,
            h.sequence,
            h.iteration.map_or("?".into(), |i| i.to_string())
        );
    }
    if !r.blocked_hangs.is_empty() {
        let _ = writeln!(
            s,
            "      {} more stuck instance(s) wait only on ranks blocked by the hang above",
            r.blocked_hangs.len()
        );
    }
    if !r.resolved_stalls.is_empty() {
        let mut ranks: Vec<u32> = r
            .resolved_stalls
            .iter()
            .flat_map(|h| h.missing_ranks.iter().copied())
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let _ = writeln!(
            s,
            "STALL {} instance(s) waited past the hang timeout for {}, which arrived later (not a hang)",
            r.resolved_stalls.len(),
            fmt_ranks(&ranks)
        );
    }
    for v in r.verdicts.iter().filter(|v| v.active) {
        let _ = writeln!(s, "NOW   {}", v.headline());
    }
    for v in r.verdicts.iter().filter(|v| !v.active) {
        let _ = writeln!(
            s,
            "WAS   {} (cleared at iteration {})",
            v.headline(),
            v.closed_iteration.map_or("?".into(), |i| i.to_string())
        );
    }
}

/// Every verdict as one row of a table.
fn human_verdict_table(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<6} {:<12} {:<14} {:>5} {:>10} {:>8} {:>7} {:>10}  link / whole host / stage",
        "rank", "host", "kind", "conf", "since iter", "active", "cost", "lost GPU-s"
    );
    for v in &r.verdicts {
        let cost = v.cost_cell();
        let _ = writeln!(
            s,
            "{:<6} {:<12} {:<14} {:>5.2} {:>10} {:>8} {:>7} {:>10.2}  {}",
            if v.structural.is_some() {
                "-".to_string()
            } else {
                v.rank.to_string()
            },
            v.host,
            v.kind.as_str(),
            v.confidence,
            v.first_seen_iteration,
            if v.active { "yes" } else { "no" },
            cost,
            v.lost_gpu_seconds,
            match &v.link {
                Some(l) => format!("{}↔{}", l.ranks[0], l.ranks[1]),
                None if !v.ranks.is_empty() => crate::verdict::span(&v.ranks),
                None => String::new(),
            }
        );
    }
}

/// One verdict's evidence and where its flame graph differs.
fn human_verdict_details(s: &mut String, v: &Verdict) {
    use std::fmt::Write;
    let _ = writeln!(s);
    if let Some(st) = &v.structural {
        let _ = match st.stage {
            Some(stage) => {
                writeln!(s, "pipeline stage {stage} (structural: stage imbalance):")
            }
            None => writeln!(s, "work imbalance (structural):"),
        };
    } else if v.ranks.is_empty() {
        let _ = writeln!(s, "rank {} ({}):", v.rank, v.kind.as_str());
    } else {
        let _ = writeln!(
            s,
            "host {}, {} ({}; rank {} costs the most):",
            v.host,
            crate::verdict::span(&v.ranks),
            v.kind.as_str(),
            v.rank
        );
    }
    for e in &v.evidence {
        let _ = writeln!(s, "  - {e}");
    }
    if let Some(f) = &v.flamegraph {
        let _ = writeln!(
            s,
            "  where it differs ({} view, against rank {}; {}):",
            f.view, f.reference_rank, f.diff_svg
        );
        // The training thread's own differences first (on-CPU,
        // then what it waited in); the whole list when unsplit.
        let parts: Vec<_> = f.views.iter().filter(|p| p.part != "all-threads").collect();
        let lists: Vec<(String, &[crate::verdict::flame::FrameDiff])> = if parts.is_empty() {
            vec![(String::new(), &f.top_frames[..])]
        } else {
            parts
                .iter()
                .map(|p| {
                    let head = format!(
                        "    {} ({:.0}% of the thread's time vs {:.0}%):",
                        p.title,
                        100.0 * p.flagged_share,
                        100.0 * p.reference_share
                    );
                    (head, &p.top_frames[..])
                })
                .collect()
        };
        for (head, frames) in lists {
            if !head.is_empty() {
                let _ = writeln!(s, "{head}");
            }
            for t in frames.iter().take(3) {
                let _ = writeln!(
                    s,
                    "    {:>5.1}% vs {:>5.1}%  {}",
                    t.flagged_share * 100.0,
                    t.reference_share * 100.0,
                    short_frame(&t.frame)
                );
            }
        }
    }
}

/// Each hang: who arrived, who is missing and where they stopped.
fn human_hangs(s: &mut String, r: &Report) {
    use std::fmt::Write;
    for h in &r.hangs {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "hang on {} ({} #{}), {}:",
            h.communicator,
            h.op,
            h.sequence,
            if h.active { "active" } else { "resolved" }
        );
        let _ = writeln!(s, "  - arrived: {}", fmt_ranks(&h.present_ranks));
        if let Some(n) = h.missing_count {
            let _ = writeln!(
                s,
                "  - missing: {}; the first {} of them:",
                fmt_missing(h),
                h.missing.len().min(n as usize)
            );
        }
        for m in &h.missing {
            let _ = writeln!(
                s,
                "  - missing rank {} on {}: last issued #{}, last completed #{}",
                m.rank,
                m.host,
                m.last_seq_seen.map_or("none".into(), |x| x.to_string()),
                m.last_completed_seq
                    .map_or("none".into(), |x| x.to_string())
            );
        }
        if !h.exited_ranks.is_empty() {
            let _ = writeln!(s, "  - exited: {}", fmt_ranks(&h.exited_ranks));
        }
    }
}

/// Clock quality, ingest counters and slowrank's own overhead.
fn human_footer(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "clock: max error {} over {} hosts",
        r.clock
            .max_error_us
            .map_or("unknown".into(), |e| format!("{e:.0} µs")),
        r.clock.hosts.len()
    );
    // A host whose probes stopped keeps being mapped on an extrapolated
    // line; say so, since its bound (and every verdict near it) widens.
    for h in &r.clock.hosts {
        if h.probe_samples_seen >= 100 && h.udp_samples == 0 {
            let _ = writeln!(
                s,
                "  - {}: clock probes never answered on the clock port (UDP, `serve --clock-port`); the QUIC fallback is tens of µs less exact",
                h.host
            );
        }
        if let Some(age) = h.probe_age_ms.filter(|a| *a >= STALE_PROBE_MS) {
            let _ = writeln!(
                s,
                "  - {}: no clock probe answered for {:.0} s; bound widened to {}",
                h.host,
                age / 1e3,
                h.error_bound_us
                    .map_or("unknown".into(), |e| format!("{e:.0} µs"))
            );
        }
    }
    let rejected: u64 = r.ingest.counters.records_rejected.values().sum();
    let batches_rejected: u64 = r.ingest.transport_rejected.values().sum();
    if batches_rejected > 0 || r.ingest.agents_refused > 0 {
        let _ = writeln!(
            s,
            "transport: {} batches rejected ({}), {} agent connections refused",
            batches_rejected,
            r.ingest
                .transport_rejected
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.ingest.agents_refused
        );
    }
    let _ = writeln!(
        s,
        "ingest: {} batches, {} records, {} rejected, {} batches missing, {} ring-buffer drops",
        r.ingest.counters.batches,
        r.ingest.counters.records_accepted,
        rejected,
        r.ingest.counters.missing_batches,
        r.ingest.counters.ringbuf_drops
    );
    if r.ingest.counters.replayed_unjoinable > 0 {
        let _ = writeln!(
            s,
            "        {} replayed records belong to instances split by a coordinator restart (not joinable here)",
            r.ingest.counters.replayed_unjoinable
        );
    }
    if let Some(o) = &r.overhead {
        let _ = writeln!(s, "overhead: {}", o.summary);
    }
}

/// A hang's absent members: its ranks, or past the list's bound the
/// count with ranges.
pub(crate) fn fmt_missing(h: &HangReport) -> String {
    match (h.missing_count, &h.missing_ranges) {
        (Some(count), Some(ranges)) => crate::join::MissingSummary {
            count,
            ranges: ranges.clone(),
            unlisted: h.missing_unlisted.unwrap_or(0),
        }
        .describe(),
        _ => {
            // Members no agent announced have no rank to name.
            let unknown = h.missing.iter().filter(|m| m.rank == UNKNOWN_RANK).count();
            match (h.missing_ranks.is_empty(), unknown) {
                (_, 0) => fmt_ranks(&h.missing_ranks),
                (true, n) => format!("{n} member(s) no agent announced"),
                (false, n) => format!(
                    "{} and {n} member(s) no agent announced",
                    fmt_ranks(&h.missing_ranks)
                ),
            }
        }
    }
}

fn fmt_ranks(r: &[u32]) -> String {
    match r {
        [one] => format!("rank {one}"),
        _ => format!(
            "ranks {}",
            r.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The function name without its module path and generic noise, so the
/// table stays readable (the JSON keeps the full name).
pub(crate) fn short_frame(frame: &str) -> &str {
    let cut = frame.rfind(">::").map(|i| i + 3).or_else(|| {
        // `a::b::c` → `c`, but keep `GPU:kernel` whole.
        frame.rfind("::").map(|i| i + 2)
    });
    cut.map_or(frame, |i| &frame[i..])
}

/// Ingest counters, for the report and `/metrics`.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IngestCounters {
    pub batches: u64,
    pub duplicate_batches: u64,
    pub missing_batches: u64,
    pub records_accepted: u64,
    pub records_rejected: std::collections::BTreeMap<String, u64>,
    /// Whole batches refused (claiming another host, cut in the future).
    pub batches_rejected: std::collections::BTreeMap<String, u64>,
    pub recent_rejections: Vec<String>,
    pub ringbuf_drops: u64,
    pub spool_drops: u64,
    pub nccl_errors: u64,
    pub clock_samples_refused: u64,
    /// Records from before their agent's current connection (replayed from
    /// its spool) whose instance had already been closed here: after a coordinator
    /// restart, the instances that straddle it had their other members'
    /// records go to the previous coordinator. Not an error.
    pub replayed_unjoinable: u64,
    /// Records that came before their communicator's membership and were
    /// held until it arrived ([`crate::join::park`]); `expired` and `overflow`
    /// are the ones lost.
    #[serde(default)]
    pub parking: crate::join::park::ParkCounters,
}

/// How the report shows that it spans several coordinator lives.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResumeInfo {
    /// Coordinator lives that wrote this `--out` (1: never restarted).
    pub lives: u32,
    /// When each later life started.
    pub restarted_at: Vec<chrono::DateTime<chrono::Utc>>,
    /// Verdicts carried over from earlier lives (merged ones included).
    pub verdicts_carried: usize,
    /// The ingest counters of the earlier lives, summed (this life's are in
    /// `ingest`).
    pub earlier_ingest: IngestCounters,
}

#[cfg(test)]
mod tests;
