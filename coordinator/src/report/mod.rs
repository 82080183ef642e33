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
pub mod text;
pub mod timeline;
pub mod trace;

pub(crate) use text::{fmt_missing, short_frame};
pub use text::{render_human, stretch_lines};

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
    /// Slow episodes that ended before they lasted
    /// `[lifecycle] transient_below` iterations: alerted when they began,
    /// not stragglers ([`Verdict::is_transient`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transients: Vec<Verdict>,
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
    /// Members whose communicators a restarted agent took over: lined up
    /// with the other members, or their records counted lost
    /// ([`crate::join::realign`]). Absent when no agent restarted.
    #[serde(
        default,
        skip_serializing_if = "crate::join::realign::RealignCounters::is_zero"
    )]
    pub takeover: crate::join::realign::RealignCounters,
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
