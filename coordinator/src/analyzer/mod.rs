//! The facade the ingest path calls.
//!
//! ```text
//! let a = Analyzer::new(AnalyzerConfig::default());      // Send + Sync: share in an Arc
//! a.add_clock_sample("node-5", ClockSample { .. })?;     // from each QUIC clock probe
//! a.ingest(&batch, coord_recv_ns);                       // every decoded Batch
//! for e in a.tick(coord_now_ns) { println!("{}", e.line) } // e.g. every 100 ms
//! let r = a.report(); report::render_json(&r); report::render_human(&r); a.trace_json();
//! ```
//!
//! `ingest` is concurrent (per-communicator and per-host state lives in
//! dashmaps); `tick` runs the reasoning under one lock. All coordinator times
//! are the coordinator's monotonic clock in ns — the clock the probe samples
//! use. Memory stays bounded: the join window, unsealed iterations, link and
//! interval rings, pending instances and trace snapshots are all capped.

use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use slowrank_shared::wire::{
    Batch, CollOp, CollectiveRecord, CommRecord, LinkRecord, RankExit, RankIdentity, RankInterval,
};
use tracing::{info, warn};

use crate::classify;
use crate::classify::intervals::{IntervalObs, IntervalStore};
use crate::classify::links::{LinkConfig, LinkObs, LinkStats};
use crate::classify::stats::{align, AlignedInstance, IterBucket, RankScore, Stats, StatsConfig};
use crate::clock::{
    median, ClockConfig, ClockError, ClockEstimator, ClockMap, ClockSample, CoordNs,
};
use crate::graph::iteration::{IterationClock, IterationConfig};
use crate::graph::{Node, WaitGraph};
use crate::join::park::{ParkConfig, Parking};
use crate::join::realign::Route;
use crate::join::validate::{self, RecordError};
use crate::join::{Expired, HangCandidate, JoinConfig, JoinedInstance, Joiner, Offer};
pub use crate::report::metrics_text::Metrics;
pub use crate::report::IngestCounters;
use crate::report::{self, Report};
use crate::verdict::victims::{
    cost_share, drop_passed_into_transfers, passed_along, rank_costs, relay_blind_waits,
    relay_transfer_lateness, Blind,
};
use crate::verdict::{EventKind, Lifecycle, LifecycleConfig, Observation, Subject, VerdictEvent};
pub use carry::{Baselines, Mark, KEPT_HISTORY};

// One file per phase of the runtime, each an `impl Analyzer` block: a batch
// comes in through `ingest` (a restarted agent's members through `takeover`),
// `tick` drains and seals iterations, `evaluate` judges each sealed one,
// `outputs` renders what is held.
mod carry;
mod evaluate;
mod ingest;
mod outputs;
mod seen;
mod structural;
mod suspects;
mod takeover;
#[cfg(test)]
mod tests;
mod tick;
mod transfers;
mod whatif;

use transfers::{costs_enough, transfer_costs, transfer_excess, transfer_ratio};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalyzerConfig {
    pub clock: ClockConfig,
    pub join: JoinConfig,
    pub iteration: IterationConfig,
    pub stats: StatsConfig,
    pub links: LinkConfig,
    pub lifecycle: LifecycleConfig,
    pub sequential: crate::classify::sequential::SequentialConfig,
    /// Name work imbalance that moves between ranks ([`crate::graph::structure`]).
    /// On by default (stop 62). It was off since a coordinator restart of
    /// a healthy job read as imbalance in CI: beside two busy loops that
    /// job (`faults_coordinator_restart`) was still told "work imbalance"
    /// in 6 of 8 runs with it on, its ranks waiting for a CPU 7–36% of
    /// their time, so lateness moved between them with the scheduler.
    /// With the run-queue gate (`[structure] max_runq_share`), the spread
    /// carried across a restart and compared on the kind of step the
    /// finding reads: 8 of 8. Healthy jitter passes the structural rule
    /// (a healthy dp16 run would save 10% balanced), so the job's
    /// slowdown, and the spread growing with it, is what tells a real
    /// imbalance apart. Figures: BENCHMARKS.md, stop 62.
    pub work_imbalance: bool,
    /// Stage and work imbalance ([`crate::graph::structure`]).
    pub structure: crate::graph::structure::StructureConfig,
    /// The job's pace against its baseline ([`crate::classify::pace`]).
    pub pace: crate::classify::pace::PaceConfig,
    /// Stretches slower than the job's best pace ([`crate::classify::stretches`]).
    pub stretches: crate::classify::stretches::StretchConfig,
    /// Telling one-host partners' waits apart ([`crate::verdict::victims`]).
    pub victims: crate::verdict::victims::VictimsConfig,
    pub limits: Limits,
    /// Named groups of ranks to cost as one, each iteration (fixed
    /// together at their peers' median): a recorded source's own layout
    /// (the study's dp ranks and stages), for comparing with its answer.
    pub whatif_groups: Vec<(String, Vec<u32>)>,
}

impl Default for AnalyzerConfig {
    fn default() -> Self {
        Self {
            clock: Default::default(),
            join: Default::default(),
            iteration: Default::default(),
            stats: Default::default(),
            links: Default::default(),
            lifecycle: Default::default(),
            sequential: Default::default(),
            work_imbalance: true,
            structure: Default::default(),
            pace: Default::default(),
            stretches: Default::default(),
            victims: Default::default(),
            limits: Default::default(),
            whatif_groups: Vec::new(),
        }
    }
}

/// What fixing a group of ranks would have saved, over the iterations
/// it was measured in ([`AnalyzerConfig::whatif_groups`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupCost {
    pub group: String,
    pub ranks: Vec<u32>,
    /// Mean of the per-iteration saving as a share of the step.
    pub share: f64,
    /// Per measured iteration: (iteration, share).
    pub per_iteration: Vec<(u64, f64)>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// How far after the batch timestamp a record time may lie (ns).
    pub future_slack_ns: u64,
    /// Completed instances waiting for the iteration period to be known.
    pub max_pending_instances: usize,
    /// Member entries kept in the recent-instance ring (trace).
    pub recent_member_entries: usize,
    /// Instances copied into a verdict's trace snapshot.
    pub snapshot_instances: usize,
    /// And at most this many member entries (256 instances of a 4,096-rank
    /// communicator would be ≈ 130 MB per verdict).
    pub snapshot_member_entries: usize,
    /// Verdict snapshots kept.
    pub max_snapshots: usize,
    /// Raw link / interval records queued between ticks.
    pub max_queued_records: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            future_slack_ns: 1_000_000_000,
            max_pending_instances: 100_000,
            recent_member_entries: 400_000,
            snapshot_instances: 256,
            snapshot_member_entries: 65_536,
            max_snapshots: 64,
            max_queued_records: 1_000_000,
        }
    }
}

/// What one `ingest` call did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IngestSummary {
    pub accepted: u64,
    pub rejected: u64,
    pub duplicates: u64,
    /// The whole batch was a resend of one already seen.
    pub duplicate_batch: bool,
    /// The whole batch was refused, and why (`RecordError::label`).
    pub batch_rejected: Option<&'static str>,
    /// The refusal in words, with its numbers (for the log).
    #[serde(skip)]
    pub batch_rejected_why: Option<String>,
    /// A reconnection preamble (sequence 0, declarations only): taken in,
    /// but not the agent's batch 0, so not journaled as seen.
    #[serde(skip)]
    pub preamble: bool,
}

#[derive(Debug, Default)]
struct AgentState {
    /// The host of the agent's first accepted batch: an agent never moves.
    host: Option<String>,
    /// The last batch number taken (batch 0 is a batch like any other).
    last_seq: Option<u64>,
    ringbuf_drops: u64,
    spool_drops: u64,
    /// Agent clock at its current connection (0: not told).
    connected_mono_ns: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RankInfo {
    pub rank: u32,
    pub host: String,
    /// The agent reporting it (its batches' cut times say how current we are).
    pub agent_id: String,
    pub pid: u32,
    pub world_size: u32,
    pub job_id: String,
    pub restart_count: u32,
    pub exited_at: Option<CoordNs>,
    /// Agent time up to which the agent must have shipped for the exit to
    /// be final: a reconnection preamble tells of exits ahead of the
    /// spooled batches that hold the rank's records before them.
    #[serde(skip)]
    pub exit_shipped_by: Option<u64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct HangState {
    pub candidate: HangCandidate,
    pub iteration: Option<u64>,
    pub detected_at: CoordNs,
    pub wall: Option<DateTime<Utc>>,
    pub active: bool,
    /// Missing ranks that exited (crash) rather than stalled.
    pub exited: Vec<u32>,
}

/// Where a taken-over member's records begin again: (communicator, rank)
/// → the first sequence number its new agent reported. Instances before
/// it that the member is missing from were not hung: it went on past
/// them while no agent watched ([`crate::join::realign`]).
pub(super) type Resumed = HashMap<(u64, u32), u64>;

#[derive(Debug)]
struct Core {
    iteration: IterationClock,
    /// Non-reference streams' steps, by their own ordinals.
    streams: crate::graph::iteration::streams::StreamSteps,
    stats: Stats,
    links: LinkStats,
    intervals: IntervalStore,
    lifecycle: Lifecycle,
    /// Per-rank sequential test on what-if cost (names and keeps names).
    sequential: crate::classify::sequential::Sequential,
    resumed: Resumed,
    /// Per configured group, its per-iteration what-if share.
    group_shares: Vec<Vec<(u64, f64)>>,
    /// The job's step against its baseline (unexplained slowdowns).
    pace: crate::classify::pace::Pace,
    /// Work imbalance that moves between ranks, over a window.
    imbalance: crate::graph::structure::Imbalance,
    /// Whether the costliest rank moves (holds back its turns' alarms).
    rotation: crate::graph::structure::Rotation,
    /// The costliest rank's share per iteration (does imbalance explain a
    /// slowdown).
    spread: crate::graph::spread::Spread,
    /// Each role's work in iterations nobody was slow in: the what-if
    /// cost's floor where a rank's peers waited for it. One for iterations
    /// timed host-side, one for those with GPU-side arrivals (deep
    /// windows): a host's enqueue gaps are no floor for a GPU's work (the
    /// compute golden's cost fell from 35 % to 18 % against 29 % measured
    /// when they were mixed).
    work_reference: [crate::graph::reference::WorkReference; 2],
    pending: VecDeque<AlignedInstance>,
    pending_dropped: u64,
    recent: VecDeque<(u64, AlignedInstance)>,
    recent_entries: usize,
    snapshots: BTreeMap<u64, Vec<(u64, AlignedInstance)>>,
    score_hist: HashMap<u32, VecDeque<RankScore>>,
    residuals: HashMap<String, VecDeque<f64>>,
    hangs: Vec<HangState>,
    first_t: Option<CoordNs>,
    last_t: Option<CoordNs>,
    last_sealed: Option<u64>,
    lost_by_root: HashMap<u32, f64>,
    /// Slow NIC rank → its verbs peers and the other members of its
    /// collectives between hosts (the last time it was seen): its victims
    /// while its verdict lasts.
    nic_peers: HashMap<u32, Vec<u32>>,
    /// Last iteration a GPU-bound suspect was held for the deep set to
    /// confirm (see [`Analyzer::confirmation_wanted`]).
    held_for_deep: Option<u64>,
    /// Durations of the last sealed iterations (ns), oldest first.
    steps: VecDeque<f64>,
    /// Per-iteration lateness and step time for the report page.
    timeline: crate::report::timeline::Timeline,
    /// A life resumed after a restart that has not evaluated an iteration
    /// yet ([`Analyzer::resumed_life`]).
    resume_pending: bool,
    /// Where this life's warm-up ends: no iteration before it is a
    /// baseline or a finding.
    warmup: crate::verdict::warmup::WarmUp,
    /// An earlier life's learning, applied at this life's first iteration.
    carried: Option<carry::Carried>,
}

/// The coordinator's reasoning core.
#[derive(Debug)]
pub struct Analyzer {
    cfg: AnalyzerConfig,
    clocks: DashMap<String, ClockEstimator>,
    joiner: Joiner,
    agents: DashMap<String, AgentState>,
    /// Hosts with a live agent connection, when the caller tells
    /// ([`Analyzer::host_live`]; `serve` does, offline replays do not).
    live_hosts: crate::net::ownership::LiveHosts,
    ranks: DashMap<u32, RankInfo>,
    /// (world size, restart count) of the job, from the rank identities.
    world: Mutex<Option<(u32, u32)>>,
    counters: Mutex<IngestCounters>,
    batches: AtomicU64,
    accepted: AtomicU64,
    completed: Mutex<Vec<JoinedInstance>>,
    hang_progress: Mutex<Vec<(u64, crate::join::InstanceKey, bool)>>,
    /// Taken-over members lined up since the last tick ([`Resumed`]).
    lined_up: Mutex<Vec<((u64, u32), u64)>>,
    /// Collectives (not p2p) issued per communicator since the last tick:
    /// comm → (members, highest sequence), for the iteration clock's choice.
    issued: Mutex<HashMap<u64, (u32, u64)>>,
    raw_links: Mutex<Vec<(String, LinkRecord)>>,
    /// Every QP endpoint seen, to name the rank at the other end.
    link_peers: Mutex<slowrank_shared::links::LinkPeers>,
    /// Link records whose remote rank is not known yet.
    unnamed_links: Mutex<Vec<(String, LinkRecord)>>,
    raw_intervals: Mutex<Vec<(String, RankInterval)>>,
    /// What the agents say their probes cost each rank.
    overhead: Mutex<crate::overhead::OverheadTally>,
    /// Per agent, the latest batch cut time (agent clock): everything that
    /// agent saw up to then has been ingested.
    watermarks: DashMap<String, u64>,
    wall_offset: Mutex<Option<i64>>,
    /// Collectives waiting for their communicator's membership.
    parking: Mutex<Parking<ParkedRecord>>,
    /// Splits whose size no agent could read, until every member is heard.
    splits: Mutex<crate::join::splits::Splits>,
    /// Members whose communicators a restarted agent took over, lined up
    /// with the other members ([`crate::join::realign`]).
    realign: Mutex<crate::join::realign::Realigner>,
    /// False while nobody was taken over: the ingest of every other job
    /// skips the realigner's lock.
    realigning: std::sync::atomic::AtomicBool,
    /// The communicators with a taken-over member: only their records go
    /// through the realigner's lock (the rest of the job's do not pay for
    /// one host's restart).
    realigned_comms: DashMap<u64, ()>,
    core: Mutex<Core>,
}

/// What the members did before an instance (medians), for telling where
/// steps begin ([`crate::graph::iteration::Marks`]).
fn step_marks(a: &AlignedInstance) -> crate::graph::iteration::Marks {
    let mut l: Vec<u32> = a.members.iter().map(|m| m.launches).collect();
    let mut w: Vec<u64> = a.members.iter().map(|m| m.sync_wait_ns).collect();
    l.sort_unstable();
    w.sort_unstable();
    crate::graph::iteration::Marks {
        op: a.op as u8,
        bytes: a.bytes,
        launches: l.get(l.len() / 2).copied().unwrap_or(0),
        sync_wait_ns: w.get(w.len() / 2).copied().unwrap_or(0),
    }
}

/// Ranks replayed per iteration for the sequential test: the what-if is
/// linear in the iteration's size per rank replayed, and more than a few
/// ranks far behind in one iteration is a host- or job-wide event, not a
/// straggler.
const MAX_REPLAYED: usize = 32;

/// A collective parked until its membership arrives.
#[derive(Debug)]
struct ParkedRecord {
    host: Arc<str>,
    rec: CollectiveRecord,
    /// How it came in (for the replay rule).
    source: Source,
}

/// How a collective record came in, which says what the join refusing it
/// means: a record that came too late to be joined is counted replayed
/// and unjoinable, not rejected ([`Source::replayed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Sent by an agent connected since `connected_at` (its host's
    /// monotonic ns, from its hello; 0 unknown). One from before that was
    /// spooled or held by the agent's fold while it was away.
    Live { connected_at: u64 },
    /// A restarted agent's member lined up with the other members: any of
    /// its records may be older than its instance's closing (the agent saw
    /// them before it could connect).
    LinedUp,
    /// An earlier agent's member released after a later agent's had
    /// already sent on past it (two agent kills seconds apart: the first
    /// one's member waited its patience, and its 36 records came in 600
    /// numbers below the second one's, rejected as going backwards in 1 of
    /// the chaos test's CI runs). Their instances closed without them.
    Superseded,
}

impl Source {
    /// Whether the join's refusal `e` of a record the host entered at
    /// `host_entry_ns` only says it came too late.
    fn replayed(self, e: &RecordError, host_entry_ns: u64) -> bool {
        match (self, e) {
            (Source::Live { connected_at }, RecordError::Late { .. }) => {
                host_entry_ns < connected_at
            }
            (Source::LinedUp | Source::Superseded, RecordError::Late { .. }) => true,
            (Source::Superseded, RecordError::SequenceBackwards { .. }) => true,
            _ => false,
        }
    }
}

/// What offering a run of collectives produced.
#[derive(Default)]
struct Offered {
    completed: Vec<JoinedInstance>,
    progress: Vec<(u64, crate::join::InstanceKey, bool)>,
    nccl_errors: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the coordinator down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Analyzer {
    pub fn new(cfg: AnalyzerConfig) -> Self {
        let core = Core {
            iteration: IterationClock::new(cfg.iteration.clone()),
            streams: crate::graph::iteration::streams::StreamSteps::new(&cfg.iteration),
            stats: Stats::new(cfg.stats.clone()),
            links: LinkStats::new(cfg.links.clone()),
            intervals: IntervalStore::default(),
            lifecycle: Lifecycle::new(cfg.lifecycle.clone()),
            sequential: crate::classify::sequential::Sequential::new(cfg.sequential.clone()),
            resumed: Resumed::new(),
            group_shares: vec![Vec::new(); cfg.whatif_groups.len()],
            pace: crate::classify::pace::Pace::with_config(cfg.pace.clone(), cfg.stretches.clone()),
            imbalance: crate::graph::structure::Imbalance::with_config(cfg.structure.clone()),
            work_reference: Default::default(),
            rotation: crate::graph::structure::Rotation::with_config(cfg.structure.clone()),
            spread: Default::default(),
            pending: VecDeque::new(),
            pending_dropped: 0,
            recent: VecDeque::new(),
            recent_entries: 0,
            snapshots: BTreeMap::new(),
            score_hist: HashMap::new(),
            residuals: HashMap::new(),
            hangs: Vec::new(),
            first_t: None,
            last_t: None,
            last_sealed: None,
            lost_by_root: HashMap::new(),
            nic_peers: HashMap::new(),
            held_for_deep: None,
            resume_pending: false,
            warmup: crate::verdict::warmup::WarmUp::new(0, &cfg.lifecycle),
            carried: None,
            steps: VecDeque::new(),
            timeline: Default::default(),
        };
        Self {
            joiner: Joiner::new(cfg.join.clone()),
            cfg,
            clocks: DashMap::new(),
            agents: DashMap::new(),
            live_hosts: Default::default(),
            ranks: DashMap::new(),
            world: Mutex::new(None),
            counters: Mutex::new(IngestCounters::default()),
            batches: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            completed: Mutex::new(Vec::new()),
            hang_progress: Mutex::new(Vec::new()),
            lined_up: Mutex::new(Vec::new()),
            issued: Mutex::new(HashMap::new()),
            raw_links: Mutex::new(Vec::new()),
            link_peers: Mutex::new(Default::default()),
            unnamed_links: Mutex::new(Vec::new()),
            raw_intervals: Mutex::new(Vec::new()),
            overhead: Mutex::new(Default::default()),
            watermarks: DashMap::new(),
            wall_offset: Mutex::new(None),
            parking: Mutex::new(Parking::new(ParkConfig::default())),
            splits: Mutex::new(crate::join::splits::Splits::default()),
            realign: Mutex::new(Default::default()),
            realigning: std::sync::atomic::AtomicBool::new(false),
            realigned_comms: DashMap::new(),
            core: Mutex::new(core),
        }
    }

    /// Feeds one round-trip clock probe of `host`'s agent.
    pub fn add_clock_sample(&self, host: &str, sample: ClockSample) -> Result<(), ClockError> {
        let r = self
            .clocks
            .entry(host.to_string())
            .or_insert_with(|| ClockEstimator::new(self.cfg.clock.clone()))
            .add_sample(sample);
        if r.is_err() {
            lock(&self.counters).clock_samples_refused += 1;
        }
        r
    }

    /// Every host's clock model worth keeping for a later life.
    pub fn clock_seeds(&self) -> BTreeMap<String, crate::clock::ClockSeed> {
        self.clocks
            .iter()
            .filter_map(|c| Some((c.key().clone(), c.value().seed()?)))
            .collect()
    }

    /// Starts each host's clock from an earlier life's model (at coordinator
    /// time `now`), so records map before this life's first probe answer.
    /// A host with a clock already is left alone; a seed unusable at `now`
    /// is skipped. Returns how many hosts were seeded.
    pub fn seed_clocks(
        &self,
        seeds: &BTreeMap<String, crate::clock::ClockSeed>,
        now: u64,
    ) -> usize {
        let mut n = 0;
        for (host, seed) in seeds {
            if self.clocks.contains_key(host) {
                continue;
            }
            if let Some(c) = ClockEstimator::seeded(self.cfg.clock.clone(), seed, now) {
                self.clocks.insert(host.clone(), c);
                n += 1;
            }
        }
        n
    }

    /// `host` gained (`true`) or lost (`false`) a live agent connection:
    /// a rank moves to another host only once its owner's agent is gone.
    pub fn host_live(&self, host: &str, live: bool) {
        self.live_hosts.set(host, live);
    }

    /// Whether `rank` is known and runs on `host` (evidence about a rank is
    /// taken only from its owner).
    pub fn rank_on_host(&self, rank: u32, host: &str) -> bool {
        self.ranks.get(&rank).is_some_and(|r| r.host == host)
    }

    /// Every rank seen so far, by rank.
    pub fn ranks(&self) -> Vec<RankInfo> {
        let mut v: Vec<RankInfo> = self.ranks.iter().map(|r| r.clone()).collect();
        v.sort_by_key(|r| r.rank);
        v
    }

    /// Agent time of `host` on the coordinator clock, and its error bound (ns).
    pub fn to_coord(&self, host: &str, agent_ns: u64) -> (CoordNs, f64) {
        self.clocks
            .get(host)
            .map_or(ClockMap::UNKNOWN, |c| c.value().map())
            .coord_and_bound(agent_ns)
    }

    /// Every host's clock mapping now, for mapping many times at once.
    fn clock_maps(&self) -> ClockMaps {
        ClockMaps {
            maps: self
                .clocks
                .iter()
                .map(|c| (c.key().clone(), c.value().map()))
                .collect(),
            last: std::cell::RefCell::new(None),
        }
    }

    fn reject(&self, e: RecordError) {
        let mut c = lock(&self.counters);
        *c.records_rejected.entry(e.label().to_owned()).or_default() += 1;
        push_recent(&mut c, &e);
    }

    /// The agent (re)connected with its clock at `mono_ns`.
    pub fn agent_connected(&self, agent_id: &str, mono_ns: u64) {
        self.agents
            .entry(agent_id.to_owned())
            .or_default()
            .connected_mono_ns = mono_ns;
    }

    /// Resumes from an earlier life's ingest journal: each agent's last
    /// ingested batch, so its resends of those are known as duplicates.
    pub fn restore_marks<'a>(&self, marks: impl IntoIterator<Item = &'a Mark>) {
        for m in marks {
            let mut a = self.agents.entry(m.agent_id.clone()).or_default();
            a.host = Some(m.host.clone());
            a.last_seq = Some(a.last_seq.map_or(m.seq, |l| l.max(m.seq)));
            a.ringbuf_drops = a.ringbuf_drops.max(m.ringbuf_drops);
            a.spool_drops = a.spool_drops.max(m.spool_drops);
        }
    }

    /// The iteration period decided so far (for [`crate::resume`]).
    pub fn iteration_period(&self) -> Option<crate::graph::iteration::Period> {
        lock(&self.core).iteration.period()
    }

    /// Resumes with the period an earlier life decided.
    pub fn restore_period(&self, p: crate::graph::iteration::Period) {
        lock(&self.core).iteration.restore_period(p);
    }

    /// This analyzer continues a job an earlier coordinator watched: its
    /// first iterations warm up again, whatever their number. They straddle
    /// the restart (records the earlier life ingested are not here, so an
    /// instance holds some members and an iteration some instances) and
    /// its per-rank statistics start empty. Judged at once, such an
    /// iteration named a rank "93 ms late, costing 61 %" on a healthy job.
    pub fn resumed_life(&self) {
        lock(&self.core).resume_pending = true;
    }
}

fn push_recent(c: &mut IngestCounters, e: &RecordError) {
    c.recent_rejections.push(e.to_string());
    if c.recent_rejections.len() > 16 {
        c.recent_rejections.remove(0);
    }
}

/// Sealed step durations kept for [`Analyzer::slowdown`].
const STEP_HISTORY: usize = 64;
/// Steps compared with the baseline (a median: one noisy step is not a
/// trend, two of three are enough to look closer; a false alarm costs one
/// deep window and backs the next one off).
const SLOWDOWN_RECENT: usize = 3;
/// Baseline steps needed before a slowdown can be told.
const SLOWDOWN_BASELINE_MIN: usize = 15;
/// Relative rise of the recent median over the baseline median.
const SLOWDOWN_RISE: f64 = 0.1;

/// The job slowed down without a named rank (see [`Analyzer::slowdown`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Slowdown {
    pub iteration: u64,
    pub baseline_ms: f64,
    pub recent_ms: f64,
}

/// Active hangs split into roots and consequences. In a pipeline or a 3-D
/// job one stuck rank stops its neighbours, which then never reach their
/// next collectives either: those instances are stuck too, but every rank
/// they miss is itself waiting inside another stuck instance. The roots are
/// the hangs missing some rank that waits nowhere (it stopped, or died).
/// Should every missing rank be waiting somewhere (a cycle), all are roots.
fn split_hangs(hangs: &[HangState]) -> (Vec<&HangState>, Vec<&HangState>) {
    let active: Vec<&HangState> = hangs.iter().filter(|h| h.active).collect();
    let waiting: foldhash::HashSet<u32> = active
        .iter()
        .flat_map(|h| h.candidate.present_ranks.iter().copied())
        .collect();
    let (roots, blocked): (Vec<&HangState>, Vec<&HangState>) = active.iter().partition(|h| {
        h.candidate
            .missing
            .iter()
            .any(|m| !waiting.contains(&m.rank))
    });
    if roots.is_empty() {
        (blocked, Vec::new())
    } else {
        (roots, blocked)
    }
}

fn hang_report(h: &HangState) -> report::HangReport {
    // Past HANG_LIST_MAX absent members the lists hold the first ones and
    // the summary says the rest; below it the report is as it always was.
    let listed = match h.candidate.summary {
        Some(_) => crate::join::HANG_LIST_MAX,
        None => h.candidate.missing.len(),
    };
    let missing: Vec<_> = h.candidate.missing.iter().take(listed).cloned().collect();
    let summary = h.candidate.summary.as_ref();
    report::HangReport {
        communicator: format!("{:#x}", h.candidate.comm_id),
        sequence: h.candidate.key.display_seq(),
        op: crate::join::op_name(h.candidate.op).to_owned(),
        missing_ranks: missing
            .iter()
            .map(|m| m.rank)
            .filter(|r| *r != crate::join::UNKNOWN_RANK)
            .collect(),
        missing_count: summary.map(|s| s.count),
        missing_ranges: summary.map(|s| s.ranges.clone()),
        missing_unlisted: summary.map(|s| s.unlisted),
        missing,
        present_ranks: h.candidate.present_ranks.clone(),
        iteration: h.iteration,
        first_seen: h.wall,
        active: h.active,
        exited_ranks: h.exited.clone(),
    }
}

fn drop_record(c: &Mutex<IngestCounters>, why: &'static str) {
    *lock(c).records_rejected.entry(why.to_owned()).or_default() += 1;
}

/// Clock mappings of every host, taken once per tick. Members of one host
/// usually follow each other in an instance, so the last host looked up is
/// kept: one hash lookup per run of members instead of four per member.
struct ClockMaps {
    maps: HashMap<String, ClockMap>,
    last: std::cell::RefCell<Option<(String, ClockMap)>>,
}

impl ClockMaps {
    fn to_coord(&self, host: &str, agent_ns: u64) -> (CoordNs, f64) {
        let mut last = self.last.borrow_mut();
        let m = match &*last {
            Some((h, m)) if h == host => *m,
            _ => {
                let m = self.maps.get(host).copied().unwrap_or(ClockMap::UNKNOWN);
                *last = Some((host.to_owned(), m));
                m
            }
        };
        m.coord_and_bound(agent_ns)
    }
}

impl crate::verdict::stackstore::HostView for Analyzer {
    fn rank_on_host(&self, rank: u32, host: &str) -> bool {
        Analyzer::rank_on_host(self, rank, host)
    }

    fn to_coord(&self, host: &str, agent_ns: u64) -> (CoordNs, f64) {
        Analyzer::to_coord(self, host, agent_ns)
    }
}

/// A batch that only declares ranks and communicators (what a reconnection
/// preamble holds): ingesting it twice changes nothing.
fn only_declares(b: &Batch) -> bool {
    b.exits.is_empty()
        && b.collectives.is_empty()
        && b.intervals.is_empty()
        && b.links.is_empty()
        && b.probes.is_empty()
        && b.calls.is_empty()
        && b.stacks.is_empty()
}
