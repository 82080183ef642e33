//! Offline analysis: a recorded job fed through the same [`Analyzer`] the
//! live server uses, on a replay clock.
//!
//! ```text
//! source (agent records, Kineto JSON, study parquet)
//!   → importer → Recording { per host: clock fit + agent batches }
//!   → replay(): exact clock samples, ingest at cut + delay, tick every 100 ms
//!   → Report (+ trace, alert lines)
//! ```
//!
//! An importer turns a format into the records an agent ships and nothing
//! more: there is no second analysis. The replay clock is derived from the
//! records alone (no wall clock, no threads), so the same input gives a
//! byte-identical report; the golden tests in `coordinator/tests/golden/`
//! hold the analyzer to that.

pub mod cli;
pub mod kineto;
pub mod records;
pub mod study;
pub mod timeline;

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use slowrank_shared::wire::{Batch, CollOp};

use crate::analyzer::{Analyzer, AnalyzerConfig};
use crate::clock::ClockSample;
use crate::report::Report;

/// How long after its cut (on the coordinator clock) a batch is ingested:
/// a LAN round trip plus decode, as a live coordinator sees it.
pub const INGEST_DELAY_NS: u64 = 2_000_000;

/// Analyzer passes, as `slowrank serve`'s default `--tick-ms`: the same
/// cadence as live, so sealing and hysteresis see what they would live.
pub const TICK_NS: u64 = 100_000_000;

/// Exact clock samples per host, once a second: enough to keep every host's
/// fit current.
pub const CLOCK_SAMPLE_EVERY_NS: u64 = 1_000_000_000;

/// Half round trip of a replayed clock sample when the fit is exact (a live
/// fit, or clocks aligned at source): 10 µs, what a good LAN probe gives, so
/// the stated error bound is never better than a live one would be.
pub const MIN_HALF_RTT_NS: u64 = 10_000;

/// Replay this long past the last batch so timeouts (hangs, stale agents)
/// that a live coordinator would reach are reached here too.
pub const TAIL_NS: u64 = 5_000_000_000;

/// A recording decides the step period after at most half of the instances
/// its reference communicator (the largest one carrying collectives) holds
/// (at least 8, at most the live `detect_instances`): the study's trace-AR
/// keeps 44 steps with one all-worker collective each, fewer than the 48 the
/// live default waits for, and half of them still shows 22 step gaps. A
/// longer recording is judged exactly as live.
pub const DECIDE_PERIOD_AFTER_DIVISOR: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// (The cause follows in the error chain.)
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file that is not what its format says, with where and what.
    #[error("{path}: {what}")]
    Format { path: PathBuf, what: String },
    #[error("nothing to analyze: {0}")]
    Empty(String),
    #[error("the inputs are not one job: {0}")]
    MixedJobs(String),
    #[error("unknown format {0:?} (one of: records, kineto, study)")]
    UnknownFormat(String),
    #[error(transparent)]
    Thresholds(#[from] crate::thresholds::ThresholdsError),
}

impl ReplayError {
    pub fn format(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Self::Format {
            path: path.into(),
            what: what.into(),
        }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// A host's agent clock on the coordinator clock:
/// `coord = agent + offset + slope · (agent − reference)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostFit {
    pub offset_ns: f64,
    pub ref_agent_ns: f64,
    pub slope: f64,
    /// Half the round trip of the replayed clock samples: the error bound
    /// the analyzer then states for this host (≥ 10 µs, a good LAN probe).
    pub half_rtt_ns: u64,
}

impl HostFit {
    /// A host whose clock already is the reference (traces aligned at source).
    pub const IDENTITY: HostFit = HostFit {
        offset_ns: 0.0,
        ref_agent_ns: 0.0,
        slope: 0.0,
        half_rtt_ns: MIN_HALF_RTT_NS,
    };

    /// From a report's clock summary: `offset_us` at `reference_agent_ns`,
    /// and `drift_ppm` as the report states it (−slope / (1 + slope) · 10⁶).
    pub fn from_report(offset_us: f64, reference_agent_ns: f64, drift_ppm: f64) -> Self {
        let x = drift_ppm * 1e-6;
        HostFit {
            offset_ns: offset_us * 1e3,
            ref_agent_ns: reference_agent_ns,
            slope: -x / (1.0 + x),
            half_rtt_ns: MIN_HALF_RTT_NS,
        }
    }

    pub fn coord(&self, agent_ns: u64) -> u64 {
        let a = agent_ns as f64;
        (a + self.offset_ns + self.slope * (a - self.ref_agent_ns)).max(0.0) as u64
    }

    /// The agent time whose coordinator time is `coord` (the inverse of
    /// [`HostFit::coord`]).
    pub fn agent(&self, coord: u64) -> u64 {
        let a =
            (coord as f64 - self.offset_ns + self.slope * self.ref_agent_ns) / (1.0 + self.slope);
        a.max(0.0) as u64
    }
}

/// One host of a recorded job: its clock and its agent's batches in order.
#[derive(Debug, Clone)]
pub struct HostRecording {
    pub host: String,
    pub fit: HostFit,
    pub batches: Vec<Batch>,
}

/// A recorded job, as the agents would have shipped it.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    /// Hosts sorted by name (the replay order of same-time batches).
    pub hosts: Vec<HostRecording>,
    /// World size the source declares (for naming ranks never observed).
    pub world_size: Option<u32>,
    /// What the importer could not use, one line each (shown to the user).
    pub notes: Vec<String>,
    /// Training steps the source shows (study `step`s, `ProfilerStep`s),
    /// when it marks them.
    pub steps: Option<u64>,
    /// Groups of ranks the source's layout names (the study's dp ranks and
    /// stages), costed as one for a comparison with its own answer.
    pub groups: Vec<(String, Vec<u32>)>,
}

impl Recording {
    pub fn records(&self) -> usize {
        self.hosts
            .iter()
            .flat_map(|h| &h.batches)
            .map(|b| b.collectives.len() + b.intervals.len() + b.links.len() + b.comms.len())
            .sum()
    }

    /// Instances of the reference communicator (the largest one carrying
    /// collectives, lowest id on ties, as the iteration clock picks it) that
    /// the recording holds: its lowest member's collective records.
    pub fn reference_instances(&self) -> Option<u64> {
        let mut size: std::collections::BTreeMap<u64, (u32, u32)> = Default::default();
        for c in self
            .hosts
            .iter()
            .flat_map(|h| &h.batches)
            .flat_map(|b| &b.comms)
        {
            let e = size.entry(c.comm_id).or_insert((c.nranks, c.rank));
            e.1 = e.1.min(c.rank);
        }
        let mut count: std::collections::BTreeMap<u64, u64> = Default::default();
        for r in self
            .hosts
            .iter()
            .flat_map(|h| &h.batches)
            .flat_map(|b| &b.collectives)
            .filter(|r| !matches!(r.op, CollOp::Send | CollOp::Recv))
        {
            if size.get(&r.comm_id).is_some_and(|s| s.1 == r.rank) {
                *count.entry(r.comm_id).or_default() += 1;
            }
        }
        count
            .iter()
            .max_by(|a, b| size[a.0].0.cmp(&size[b.0].0).then(b.0.cmp(a.0)))
            .map(|(_, n)| *n)
    }

    /// Ranks of `0..world_size` with no identity record in any batch.
    pub fn unobserved_ranks(&self) -> Vec<u32> {
        let Some(w) = self.world_size else {
            return Vec::new();
        };
        let seen: std::collections::BTreeSet<u32> = self
            .hosts
            .iter()
            .flat_map(|h| &h.batches)
            .flat_map(|b| &b.ranks)
            .map(|r| r.rank)
            .collect();
        (0..w).filter(|r| !seen.contains(r)).collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub config: AnalyzerConfig,
    /// The report's `generated_at`. Replay never reads the wall clock: by
    /// default the report is dated by its data (the last batch's wall time
    /// when the records carry one, else the Unix epoch).
    pub generated_at: Option<DateTime<Utc>>,
}

/// What a replay produced.
#[derive(Debug)]
pub struct Replayed {
    pub report: Report,
    pub trace: serde_json::Value,
    /// The alert lines a live coordinator would have printed, in order.
    pub lines: Vec<String>,
    /// What-if cost of the source's own groups ([`Recording::groups`]).
    pub groups: Vec<crate::analyzer::GroupCost>,
}

/// Feeds `rec` through a fresh [`Analyzer`] on a replay clock and returns
/// its report. `progress` gets the fraction of batches ingested (0..=1), a
/// few hundred times at most.
pub fn replay(
    rec: &Recording,
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(f64),
) -> Result<Replayed, ReplayError> {
    let a = Analyzer::new(replay_config(rec, opts));
    let order = delivery_order(rec);
    let (Some(first), Some(last)) = (order.first().map(|x| x.0), order.last().map(|x| x.0)) else {
        return Err(ReplayError::Empty("no agent batches in the input".into()));
    };
    let mut lines = Vec::new();
    let start = first.saturating_sub(2 * CLOCK_SAMPLE_EVERY_NS);
    let end = last + TAIL_NS;
    let mut next_sample = start;
    let mut next_tick = first;
    let mut next = 0usize;
    let step = (order.len() / 200).max(1);
    let mut t = start;
    while t <= end {
        if t >= next_sample {
            sample_clocks(&a, rec, t);
            next_sample += CLOCK_SAMPLE_EVERY_NS;
        }
        while next < order.len() && order[next].0 <= t {
            let (recv, hi, bi) = order[next];
            a.ingest(&rec.hosts[hi].batches[bi], recv);
            next += 1;
            if next.is_multiple_of(step) {
                progress(next as f64 / order.len() as f64);
            }
        }
        if t >= next_tick {
            lines.extend(a.tick(t as i64).into_iter().map(|e| e.line));
            next_tick += TICK_NS;
        }
        // Jump over idle stretches (a sampled trace has gaps between steps)
        // but never past a tick, a clock sample or a batch.
        let nb = order.get(next).map_or(u64::MAX, |x| x.0);
        t = next_tick.min(next_sample).min(nb).max(t + 1);
    }
    progress(1.0);
    // As `serve` does when it stops: nothing more will come.
    if a.end_of_input(end).accepted > 0 {
        lines.extend(a.tick(end as i64).into_iter().map(|e| e.line));
    }
    let mut report = a.report();
    report.generated_at = opts
        .generated_at
        .unwrap_or_else(|| last_batch_wall_time(rec));
    let trace = a.trace_json();
    Ok(Replayed {
        report,
        trace,
        lines,
        groups: a.group_costs(),
    })
}

/// The analyzer's configuration for `rec`: the options' own, with the
/// source's groups to cost and a step period decided in time for a short
/// recording.
fn replay_config(rec: &Recording, opts: &ReplayOptions) -> AnalyzerConfig {
    let mut cfg = opts.config.clone();
    if let Some(n) = rec.reference_instances() {
        // A short recording must still get a step period: decide it once
        // half of what the recording holds has come in (never later than
        // live).
        let half = usize::try_from(n / DECIDE_PERIOD_AFTER_DIVISOR).unwrap_or(usize::MAX);
        cfg.iteration.detect_instances = cfg.iteration.detect_instances.min(half.max(8));
    }
    cfg.whatif_groups = rec.groups.clone();
    cfg
}

/// Every batch as (coordinator receive time, host index, batch index), in
/// that order: a total order, so same-time batches always go in the same
/// order.
fn delivery_order(rec: &Recording) -> Vec<(u64, usize, usize)> {
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    for (hi, h) in rec.hosts.iter().enumerate() {
        for (bi, b) in h.batches.iter().enumerate() {
            order.push((h.fit.coord(b.mono_ns) + INGEST_DELAY_NS, hi, bi));
        }
    }
    order.sort_unstable();
    order
}

/// One clock probe per host at coordinator time `t`, answered on the
/// host's recorded clock with its recorded half round trip.
fn sample_clocks(a: &Analyzer, rec: &Recording, t: u64) {
    for h in &rec.hosts {
        let ag = h.fit.agent(t);
        // Probes that fail validation are counted by the analyzer.
        let _ = a.add_clock_sample(
            &h.host,
            ClockSample {
                coord_send_ns: t.saturating_sub(h.fit.half_rtt_ns),
                agent_mono_ns: ag,
                agent_hold_ns: 0,
                coord_recv_ns: t + h.fit.half_rtt_ns,
                udp: true,
            },
        );
    }
}

/// The report's time when the options give none: the newest batch's wall
/// clock, so a replay says the same every time.
fn last_batch_wall_time(rec: &Recording) -> DateTime<Utc> {
    let wall = rec
        .hosts
        .iter()
        .flat_map(|h| &h.batches)
        .map(|b| b.wall_ns)
        .max()
        .unwrap_or(0);
    DateTime::<Utc>::from_timestamp_nanos(wall as i64)
}
