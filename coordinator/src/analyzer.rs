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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use slowrank_shared::wire::{
    Batch, CollOp, CollectiveRecord, CommRecord, LinkRecord, RankExit, RankIdentity, RankInterval,
};
use tracing::warn;

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
use crate::join::validate::{self, RecordError};
use crate::join::{Expired, HangCandidate, JoinConfig, JoinedInstance, Joiner, Offer};
pub use crate::report::metrics_text::Metrics;
pub use crate::report::IngestCounters;
use crate::report::{self, Report};
use crate::verdict::victims::{
    cost_share, drop_passed_into_transfers, passed_along, rank_costs, relay_blind_waits,
    relay_transfer_lateness,
};
use crate::verdict::{EventKind, Lifecycle, LifecycleConfig, Observation, Subject, VerdictEvent};

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AnalyzerConfig {
    pub clock: ClockConfig,
    pub join: JoinConfig,
    pub iteration: IterationConfig,
    pub stats: StatsConfig,
    pub links: LinkConfig,
    pub lifecycle: LifecycleConfig,
    pub sequential: crate::classify::sequential::SequentialConfig,
    /// Name work imbalance that moves between ranks ([`crate::graph::structure`]).
    /// Off by default: its rule has only been checked on hand-built
    /// iterations, and in a chaos run (coordinator killed three times) it
    /// named imbalance beside a compute-slow rank. It stays off until the
    /// random evaluation has scored it.
    pub work_imbalance: bool,
    pub limits: Limits,
    /// Named groups of ranks to cost as one, each iteration (fixed
    /// together at their peers' median): a recorded source's own layout
    /// (the study's dp ranks and stages), for comparing with its answer.
    pub whatif_groups: Vec<(String, Vec<u32>)>,
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

#[derive(Debug, Clone, serde::Serialize)]
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
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IngestSummary {
    pub accepted: u64,
    pub rejected: u64,
    pub duplicates: u64,
    /// The whole batch was a resend of one already seen.
    pub duplicate_batch: bool,
    /// The whole batch was refused, and why (`RecordError::label`).
    pub batch_rejected: Option<&'static str>,
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

#[derive(Debug)]
struct Core {
    iteration: IterationClock,
    stats: Stats,
    links: LinkStats,
    intervals: IntervalStore,
    lifecycle: Lifecycle,
    /// Per-rank sequential test on what-if cost (names and keeps names).
    sequential: crate::classify::sequential::Sequential,
    /// Per configured group, its per-iteration what-if share.
    group_shares: Vec<Vec<(u64, f64)>>,
    /// The job's step against its baseline (unexplained slowdowns).
    pace: crate::classify::pace::Pace,
    /// Work imbalance that moves between ranks, over a window.
    imbalance: crate::graph::structure::Imbalance,
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
    /// Its agent's connection time when it arrived (for the replay rule).
    connected_at: u64,
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
            stats: Stats::new(cfg.stats.clone()),
            links: LinkStats::new(cfg.links.clone()),
            intervals: IntervalStore::default(),
            lifecycle: Lifecycle::new(cfg.lifecycle.clone()),
            sequential: crate::classify::sequential::Sequential::new(cfg.sequential.clone()),
            group_shares: vec![Vec::new(); cfg.whatif_groups.len()],
            pace: crate::classify::pace::Pace::new(),
            imbalance: crate::graph::structure::Imbalance::new(),
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
    pub fn restore_marks<'a>(&self, marks: impl IntoIterator<Item = &'a crate::resume::Mark>) {
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

    /// Ingests one decoded batch received at coordinator time `recv_ns`.
    /// Never panics on bad content: each impossible record is rejected,
    /// counted with its reason, and the rest of the batch is used.
    pub fn ingest(&self, b: &Batch, recv_ns: u64) -> IngestSummary {
        let mut sum = IngestSummary::default();
        self.batches.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.check_batch(b, recv_ns) {
            sum.batch_rejected = Some(e.label());
            let mut c = lock(&self.counters);
            *c.batches_rejected.entry(e.label().to_owned()).or_default() += 1;
            push_recent(&mut c, &e);
            return sum;
        }
        {
            let mut a = self.agents.entry(b.agent_id.clone()).or_default();
            if a.host.is_none() {
                a.host = Some(b.host.clone());
            }
            // Sequence 0 after later batches is the agent's reconnection
            // preamble: it re-declares its ranks and communicators (a
            // restarted coordinator needs them) and is never a resend. So is
            // a record-less sequence 0 at any time: the link may have gone
            // down before the real batch 0 left the agent's spool, and
            // taking the preamble for batch 0 would drop the real one as a
            // duplicate; after batch 0 it must still declare (a restarted
            // life knows batch 0 from its journal, not its communicators).
            let preamble = b.seq == 0 && (only_declares(b) || a.last_seq.is_some_and(|l| l > 0));
            sum.preamble = preamble;
            if !preamble && a.last_seq.is_some_and(|last| b.seq <= last) {
                drop(a);
                lock(&self.counters).duplicate_batches += 1;
                sum.duplicate_batch = true;
                return sum;
            }
            let missing = match a.last_seq {
                Some(last) if !preamble => b.seq - last - 1,
                _ => 0,
            };
            if missing >= validate::MAX_SEQ_GAP {
                let e = RecordError::SeqJump {
                    last: a.last_seq.unwrap_or(0),
                    got: b.seq,
                };
                drop(a);
                sum.batch_rejected = Some(e.label());
                let mut c = lock(&self.counters);
                *c.batches_rejected.entry(e.label().to_owned()).or_default() += 1;
                push_recent(&mut c, &e);
                return sum;
            }
            // A step no agent can make is not believed (nor remembered):
            // one u64::MAX would pin the job-wide sums at their ceiling.
            let step = |now: u64, had: u64| {
                Some(now.saturating_sub(had)).filter(|d| *d <= validate::MAX_COUNTER_STEP)
            };
            let (rd, sd) = (
                step(b.ringbuf_drops, a.ringbuf_drops),
                step(b.spool_drops, a.spool_drops),
            );
            if !preamble {
                a.last_seq = Some(a.last_seq.map_or(b.seq, |l| l.max(b.seq)));
            }
            if rd.is_some() {
                a.ringbuf_drops = a.ringbuf_drops.max(b.ringbuf_drops);
            }
            if sd.is_some() {
                a.spool_drops = a.spool_drops.max(b.spool_drops);
            }
            let (rd, sd) = (rd.unwrap_or(0), sd.unwrap_or(0));
            drop(a);
            // Saturating: a garbage sequence or drop count must not overflow.
            let mut c = lock(&self.counters);
            c.batches += 1;
            c.missing_batches = c.missing_batches.saturating_add(missing);
            c.ringbuf_drops = c.ringbuf_drops.saturating_add(rd);
            c.spool_drops = c.spool_drops.saturating_add(sd);
        }
        let host: Arc<str> = Arc::from(b.host.as_str());
        // A host first heard of in this batch gets a clock only if the batch
        // holds something usable: rejected garbage must not add a host (and
        // its error bound) to the report.
        let clock_known = self.clocks.contains_key(&b.host);
        if clock_known {
            self.observe_batch_clock(b, recv_ns);
        }
        let slack = self.cfg.limits.future_slack_ns;
        for id in &b.ranks {
            if let Err(e) = self.check_identity(id, &b.host) {
                self.reject(e);
                sum.rejected += 1;
                continue;
            }
            self.ranks.insert(
                id.rank,
                RankInfo {
                    rank: id.rank,
                    host: b.host.clone(),
                    agent_id: b.agent_id.clone(),
                    pid: id.pid,
                    world_size: id.world_size,
                    job_id: id.job_id.clone(),
                    restart_count: id.restart_count,
                    exited_at: None,
                },
            );
            sum.accepted += 1;
        }
        for e in &b.exits {
            if let Err(err) = self.check_exit(e, &b.host, b.mono_ns, slack) {
                self.reject(err);
                sum.rejected += 1;
                continue;
            }
            let t = self.to_coord(&b.host, e.exit_ns).0;
            if let Some(mut r) = self.ranks.get_mut(&e.rank) {
                r.exited_at = Some(t);
            }
            sum.accepted += 1;
        }
        let mut announced = Vec::new();
        for c in &b.comms {
            if c.parent_id != 0 {
                // Every split record feeds the split table (a member heard);
                // those without a size are completed by it.
                let deferred = crate::join::splits::Splits::needs_resolving(c);
                let parent =
                    self.joiner
                        .comm_info(c.parent_id)
                        .map(|i| crate::join::splits::Parent {
                            nranks: i.nranks,
                            ranks: i.ranks,
                        });
                let offered = self.check_rank(c.rank, &b.host).and_then(|_| {
                    lock(&self.splits)
                        .offer(&host, c, parent.as_ref())
                        .map_err(RecordError::from)
                });
                match offered {
                    Ok(resolved) => {
                        for (h, rc) in resolved {
                            match self
                                .check_comm_size(&rc)
                                .and_then(|_| self.joiner.register_comm(&h, &rc))
                            {
                                Ok(()) => announced.push(rc.comm_id),
                                Err(e) => self.reject(e),
                            }
                        }
                    }
                    Err(e) if deferred => {
                        self.reject(e);
                        sum.rejected += 1;
                        continue;
                    }
                    // A complete record needs no working out.
                    Err(_) => {}
                }
                if deferred {
                    sum.accepted += 1;
                    continue;
                }
            }
            if let Err(e) = self
                .check_rank(c.rank, &b.host)
                .and_then(|_| validate::check_comm(c))
                .and_then(|_| self.check_comm_size(c))
                .and_then(|_| self.joiner.register_comm(&host, c))
            {
                self.reject(e);
                sum.rejected += 1;
            } else {
                sum.accepted += 1;
                announced.push(c.comm_id);
            }
        }
        let mut out = Offered::default();
        // Records that waited for these memberships go first: they were
        // issued before this batch's.
        self.release_parked(&announced, recv_ns, &mut sum, &mut out);
        // Records from before the agent's current connection: it was away
        // (spooled, or held by its fold) while they happened.
        let connected_at = self
            .agents
            .get(&b.agent_id)
            .map_or(0, |a| a.connected_mono_ns);
        {
            let mut issued = lock(&self.issued);
            for r in b
                .collectives
                .iter()
                .filter(|r| !matches!(r.op, CollOp::Send | CollOp::Recv))
            {
                if let Some(n) = self.joiner.comm_nranks(r.comm_id) {
                    let e = issued.entry(r.comm_id).or_insert((n, 0));
                    e.1 = e.1.max(r.seq);
                }
            }
        }
        for r in &b.collectives {
            match self
                .check_rank(r.rank, &b.host)
                .and_then(|_| validate::check_collective(r, b.mono_ns, slack))
            {
                Ok(()) => self.offer_one(
                    &host,
                    r.clone(),
                    connected_at,
                    None,
                    recv_ns,
                    &mut sum,
                    &mut out,
                ),
                Err(e) => {
                    self.reject(e);
                    sum.rejected += 1;
                }
            }
        }
        let Offered {
            completed,
            progress,
            nccl_errors,
        } = out;
        let cap = self.cfg.limits.max_queued_records;
        {
            let mut q = lock(&self.raw_intervals);
            for i in &b.intervals {
                match self
                    .check_rank(i.rank, &b.host)
                    .and_then(|_| validate::check_interval(i, b.mono_ns, slack))
                {
                    Ok(()) if q.len() < cap => {
                        lock(&self.overhead).add(&b.host, i);
                        q.push((b.host.clone(), i.clone()));
                        sum.accepted += 1;
                    }
                    Ok(()) => {
                        drop_record(&self.counters, "queue_full");
                        sum.rejected += 1;
                    }
                    Err(e) => {
                        self.reject(e);
                        sum.rejected += 1;
                    }
                }
            }
        }
        {
            let mut q = lock(&self.raw_links);
            let mut peers = lock(&self.link_peers);
            let mut unnamed = lock(&self.unnamed_links);
            for l in &b.links {
                let peer_ok = l.peer_rank >= 0 && l.peer_rank <= u32::MAX as i64;
                let res = self
                    .check_rank(l.rank, &b.host)
                    .and_then(|_| validate::check_link(l, b.mono_ns, slack));
                if res.is_ok() {
                    peers.observe(l);
                }
                match res {
                    Ok(()) if peer_ok && q.len() < cap => {
                        q.push((b.host.clone(), l.clone()));
                        sum.accepted += 1;
                    }
                    // The agent cannot name the remote rank of a QP: both
                    // ends' QP numbers and LIDs do, once both were seen
                    // (retried at each tick; bounded).
                    Ok(()) if !peer_ok => {
                        if l.posts > 0 && unnamed.len() < cap {
                            unnamed.push((b.host.clone(), l.clone()));
                        }
                        sum.accepted += 1;
                    }
                    Ok(()) => {
                        drop_record(&self.counters, "queue_full");
                        sum.rejected += 1;
                    }
                    Err(e) => {
                        self.reject(e);
                        sum.rejected += 1;
                    }
                }
            }
        }
        if !completed.is_empty() {
            lock(&self.completed).extend(completed);
        }
        if !progress.is_empty() {
            lock(&self.hang_progress).extend(progress);
        }
        if !clock_known && sum.accepted > 0 {
            self.observe_batch_clock(b, recv_ns);
        }
        // After the records: the batch says its agent is current up to its
        // cut. Not the preamble (sequence 0): re-sent on reconnection ahead
        // of the spooled batches, it carries the latest cut but none of the
        // records before it, and would expire their instances as hangs.
        if b.seq != 0 {
            self.watermarks
                .entry(b.agent_id.clone())
                .and_modify(|w| *w = (*w).max(b.mono_ns))
                .or_insert(b.mono_ns);
        }
        self.accepted.fetch_add(sum.accepted, Ordering::Relaxed);
        let mut c = lock(&self.counters);
        c.records_accepted += sum.accepted;
        c.nccl_errors += nccl_errors;
        sum
    }

    /// Offers one checked collective to the join; one whose communicator
    /// or member is not known yet is parked ([`crate::join::park`]), not refused.
    /// `parked_since`: when it was first parked, for one offered again.
    #[allow(clippy::too_many_arguments)]
    fn offer_one(
        &self,
        host: &Arc<str>,
        r: CollectiveRecord,
        connected_at: u64,
        parked_since: Option<u64>,
        now: u64,
        sum: &mut IngestSummary,
        out: &mut Offered,
    ) {
        match self.joiner.offer(host, r.clone()) {
            Ok(o) => {
                if r.ret != 0 {
                    out.nccl_errors += 1;
                }
                match o {
                    Offer::Completed(i) => out.completed.push(i),
                    Offer::Duplicate => sum.duplicates += 1,
                    Offer::HangProgress {
                        comm_id,
                        key,
                        resolved,
                        completed,
                    } => {
                        out.progress.push((comm_id, key, resolved));
                        out.completed.extend(completed);
                    }
                    Offer::Pending | Offer::Merged => {}
                }
                sum.accepted += 1;
            }
            Err(RecordError::Late { .. }) if r.host_entry_ns < connected_at => {
                lock(&self.counters).replayed_unjoinable += 1;
            }
            Err(
                RecordError::UnknownCommunicator { comm_id }
                | RecordError::NotAMember { comm_id, .. },
            ) => {
                let item = ParkedRecord {
                    host: host.clone(),
                    rec: r,
                    connected_at,
                };
                let bytes = std::mem::size_of::<ParkedRecord>();
                let mut p = lock(&self.parking);
                let res = match parked_since {
                    Some(since) => p.repark(comm_id, item, bytes, since),
                    None => p.park(comm_id, item, bytes, now),
                };
                let n = p.counters().overflow;
                drop(p);
                // Said at 1, 2, 4, 8 … losses: a full parking refuses many.
                if let (Err(e), true) = (res, n.is_power_of_two()) {
                    warn!("{n} collective record(s) lost, the latest of communicator {comm_id:#x}: {e}");
                }
            }
            Err(e) => {
                self.reject(e);
                sum.rejected += 1;
            }
        }
    }

    /// Offers again the records parked for the communicators just announced.
    fn release_parked(&self, comms: &[u64], now: u64, sum: &mut IngestSummary, out: &mut Offered) {
        for &comm_id in comms {
            let released = {
                let mut p = lock(&self.parking);
                if !p.waits_for(comm_id) {
                    continue;
                }
                p.release(comm_id)
            };
            if let (Some(n), Some(top)) = (
                self.joiner.comm_nranks(comm_id),
                released
                    .iter()
                    .filter(|(p, _)| !matches!(p.rec.op, CollOp::Send | CollOp::Recv))
                    .map(|(p, _)| p.rec.seq)
                    .max(),
            ) {
                let mut issued = lock(&self.issued);
                let e = issued.entry(comm_id).or_insert((n, 0));
                e.1 = e.1.max(top);
            }
            for (p, since) in released {
                self.offer_one(&p.host, p.rec, p.connected_at, Some(since), now, sum, out);
            }
        }
    }

    /// The ingest counters, with the parking's.
    fn ingest_counters(&self) -> IngestCounters {
        let mut c = lock(&self.counters).clone();
        c.parking = lock(&self.parking).counters();
        c
    }

    /// Parked records whose membership never came are lost: say so.
    fn expire_parked(&self, now: CoordNs) {
        let lost = lock(&self.parking).expire(now.max(0) as u64);
        if !lost.is_empty() {
            let comms: std::collections::BTreeSet<u64> =
                lost.iter().map(|p| p.rec.comm_id).collect();
            warn!(
                records = lost.len(),
                communicators = ?comms.iter().map(|c| format!("{c:#x}")).collect::<Vec<_>>(),
                "collective records lost: their communicator's membership never arrived within {} s",
                crate::join::park::PARK_TIMEOUT_NS / 1_000_000_000
            );
        }
    }

    fn observe_batch_clock(&self, b: &Batch, recv_ns: u64) {
        // A batch cut before its agent's current connection waited in the
        // spool (a restarted coordinator gets the whole backlog): its
        // arrival bounds the offset by its age, tens of ms too late, which
        // made a restarted coordinator see one host's ranks that much late
        // until the first probe answered.
        let spooled = self
            .agents
            .get(&b.agent_id)
            .is_some_and(|a| b.mono_ns < a.connected_mono_ns);
        let mut clock = self
            .clocks
            .entry(b.host.clone())
            .or_insert_with(|| ClockEstimator::new(self.cfg.clock.clone()));
        if !spooled {
            clock.observe_one_way(b.mono_ns, recv_ns);
        }
        drop(clock);
        if b.wall_ns != 0 {
            let (c, _) = self.to_coord(&b.host, b.mono_ns);
            *lock(&self.wall_offset) = Some((b.wall_ns as i64).saturating_sub(c));
        }
    }

    /// Whole-batch checks, before anything of the batch is used: an agent
    /// that changes host, or a batch cut after it arrived (on the host's
    /// estimated clock), would corrupt the clock and the sequence tracking.
    fn check_batch(&self, b: &Batch, recv_ns: u64) -> Result<(), RecordError> {
        if let Some(a) = self.agents.get(&b.agent_id) {
            if let Some(had) = a.host.as_ref().filter(|h| **h != b.host) {
                return Err(RecordError::HostChanged {
                    agent_id: b.agent_id.clone(),
                    had: had.clone(),
                    got: b.host.clone(),
                });
            }
        }
        // Not on an earlier life's clock: if its host's agent rebooted, the
        // seed is wrong, and the batch's arrival is what shows it (the seed
        // is dropped then, not the batch).
        if let Some(c) = self.clocks.get(&b.host).filter(|c| !c.is_seeded()) {
            let (at, err) = c.value().map().coord_and_bound(b.mono_ns);
            if err.is_finite() {
                let ahead = at as f64 - recv_ns as f64;
                if ahead > self.cfg.limits.future_slack_ns as f64 + err {
                    return Err(RecordError::BatchInFuture {
                        batch_ns: b.mono_ns,
                        ahead_ns: ahead as u64,
                    });
                }
            }
        }
        Ok(())
    }

    /// A rank identity: a sane world, consistent with the job's, and a rank
    /// no other host holds (unless this is a newer elastic restart).
    fn check_identity(&self, id: &RankIdentity, host: &str) -> Result<(), RecordError> {
        if id.world_size > validate::MAX_COMM_RANKS {
            return Err(RecordError::WorldTooLarge(id.world_size));
        }
        if id.world_size != 0 && id.rank >= id.world_size {
            return Err(RecordError::RankOutOfRange {
                rank: id.rank,
                world_size: id.world_size,
            });
        }
        if id.world_size == 0 && id.rank >= validate::MAX_COMM_RANKS {
            return Err(RecordError::WorldTooLarge(id.rank));
        }
        if let Some(r) = self.ranks.get(&id.rank) {
            let owner = crate::net::ownership::Owner {
                host: &r.host,
                exited: r.exited_at.is_some(),
                restart_count: r.restart_count,
            };
            if !crate::net::ownership::may_take(&owner, host, id.restart_count, &self.live_hosts) {
                return Err(RecordError::WrongHost {
                    rank: id.rank,
                    host: host.to_owned(),
                    owner: r.host.clone(),
                });
            }
        }
        if id.world_size != 0 {
            let mut w = lock(&self.world);
            // A new world size needs every other host's ranks gone (exited,
            // or their agent away): one host's claim cannot resize the job
            // under the others.
            let others_live = || {
                self.ranks.iter().any(|r| {
                    r.host != host
                        && r.exited_at.is_none()
                        && self.live_hosts.is_live(&r.host) != Some(false)
                        && self.live_hosts.tracking()
                })
            };
            match *w {
                Some((ws, rc))
                    if ws != id.world_size && (id.restart_count <= rc || others_live()) =>
                {
                    return Err(RecordError::WorldSizeConflict {
                        had: ws,
                        got: id.world_size,
                    });
                }
                Some((_, rc)) if id.restart_count < rc => {}
                _ => *w = Some((id.world_size, id.restart_count)),
            }
        }
        Ok(())
    }

    /// The rank is inside the world (when known) and runs on `host`.
    fn check_rank(&self, rank: u32, host: &str) -> Result<(), RecordError> {
        if let Some((ws, _)) = *lock(&self.world) {
            if rank >= ws {
                return Err(RecordError::RankOutOfRange {
                    rank,
                    world_size: ws,
                });
            }
        }
        if let Some(r) = self.ranks.get(&rank) {
            if r.host != host {
                return Err(RecordError::WrongHost {
                    rank,
                    host: host.to_owned(),
                    owner: r.host.clone(),
                });
            }
        }
        Ok(())
    }

    fn check_comm_size(&self, c: &CommRecord) -> Result<(), RecordError> {
        match *lock(&self.world) {
            Some((ws, _)) if c.nranks > ws => Err(RecordError::CommLargerThanWorld {
                comm_id: c.comm_id,
                nranks: c.nranks,
                world_size: ws,
            }),
            _ => Ok(()),
        }
    }

    /// An exit in time, from the rank's host, of the rank's current process
    /// (a late exit of a process an elastic restart replaced is stale).
    fn check_exit(
        &self,
        e: &RankExit,
        host: &str,
        batch_ns: u64,
        slack: u64,
    ) -> Result<(), RecordError> {
        self.check_rank(e.rank, host)?;
        validate::not_future("exit_ns", e.exit_ns, batch_ns, slack)?;
        if let Some(r) = self.ranks.get(&e.rank) {
            if r.pid != e.pid {
                return Err(RecordError::ExitOfOtherProcess {
                    rank: e.rank,
                    pid: e.pid,
                    current: r.pid,
                });
            }
        }
        Ok(())
    }

    fn wall(&self, t: CoordNs) -> Option<DateTime<Utc>> {
        let off = (*lock(&self.wall_offset))?;
        Some(DateTime::<Utc>::from_timestamp_nanos(t.saturating_add(off)))
    }

    /// The ranks of each host that have not exited.
    fn live_ranks_by_host(&self) -> BTreeMap<String, Vec<u32>> {
        let mut m: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for r in self.ranks.iter() {
            if r.exited_at.is_none() {
                m.entry(r.host.clone()).or_default().push(r.rank);
            }
        }
        m
    }

    fn host_of(&self, rank: u32) -> String {
        self.ranks
            .get(&rank)
            .map_or_else(|| "?".into(), |r| r.host.clone())
    }

    /// Advances the reasoning to coordinator time `now`; returns verdict and
    /// hang events (open, reopen, close) for alerts.
    pub fn tick(&self, now: CoordNs) -> Vec<VerdictEvent> {
        let mut events = Vec::new();
        self.expire_parked(now);
        let completed = std::mem::take(&mut *lock(&self.completed));
        let progress = std::mem::take(&mut *lock(&self.hang_progress));
        let mut raw_links = std::mem::take(&mut *lock(&self.raw_links));
        {
            // Name what can be named now; the rest waits (a few seconds at most).
            let peers = lock(&self.link_peers);
            let mut unnamed = lock(&self.unnamed_links);
            let max_wait = 10_000_000_000;
            unnamed.retain_mut(|(host, l)| match peers.peer_of(l) {
                Some(r) => {
                    l.peer_rank = i64::from(r);
                    raw_links.push((host.clone(), l.clone()));
                    false
                }
                None => now.saturating_sub(self.to_coord(host, l.end_ns).0) < max_wait,
            });
        }
        let raw_intervals = std::mem::take(&mut *lock(&self.raw_intervals));
        let maps = self.clock_maps();
        let clock = |h: &str, t: u64| maps.to_coord(h, t);
        let mut core = lock(&self.core);
        let core = &mut *core;

        for (comm, (nranks, seq)) in std::mem::take(&mut *lock(&self.issued)) {
            core.iteration.note_issued(comm, nranks, seq);
        }
        let mut aligned: Vec<AlignedInstance> =
            completed.iter().map(|i| align(i, &clock)).collect();
        aligned.sort_by_key(|a| a.start);
        for (ji, a) in completed.iter().zip(&aligned) {
            self.completion_check(core, ji, a);
        }
        for a in aligned {
            core.first_t = Some(core.first_t.map_or(a.start, |t| t.min(a.start)));
            core.last_t = Some(core.last_t.map_or(a.end, |t| t.max(a.end)));
            if !a.members.is_empty() && !matches!(a.op, CollOp::Send | CollOp::Recv) {
                if let crate::join::InstanceKey::Coll(seq) = a.key {
                    let marks = step_marks(&a);
                    core.iteration
                        .observe(a.comm_id, a.comm_nranks, seq, a.start, a.end, marks);
                }
            }
            core.pending.push_back(a);
            while core.pending.len() > self.cfg.limits.max_pending_instances {
                core.pending.pop_front();
                core.pending_dropped += 1;
            }
        }
        if core.iteration.period().is_some() {
            while let Some(a) = core.pending.pop_front() {
                let it = self.iteration_of(core, &a);
                // A backlog (a host back from a cut link, a replayed spool)
                // spans more iterations than the stats keep open: score the
                // ones the iteration clock has already sealed to make room,
                // rather than dropping the newer instances.
                if core.stats.full_for(it) {
                    if let Some(through) = core.iteration.sealed_through() {
                        for (k, bucket) in core.stats.take_sealed(through.min(it.saturating_sub(1)))
                        {
                            events.extend(self.evaluate(core, k, &bucket));
                            core.last_sealed = Some(k);
                        }
                    }
                }
                core.stats.add(&a, it);
                self.remember(core, it, a);
            }
        }
        for (host, l) in raw_links {
            let (start, _) = clock(&host, l.start_ns);
            let (end, _) = clock(&host, l.end_ns);
            core.links.add(LinkObs {
                rank: l.rank,
                peer: l.peer_rank as u32,
                start,
                end,
                completions: l.completions,
                latency_sum_ns: l.post_to_completion_ns,
                bytes: l.bytes,
            });
        }
        for (host, i) in raw_intervals {
            core.intervals.add(
                i.rank,
                IntervalObs {
                    start: clock(&host, i.start_ns).0,
                    end: clock(&host, i.end_ns).0,
                    launches: i.launches,
                    launch_counted_ns: i.launch_counted_ns,
                    sync_wait_ns: i.sync_wait_ns,
                    oncpu_ns: i.oncpu_ns,
                    runq_delay_ns: i.runq_delay_ns,
                    offcpu_ns: i.offcpu_ns,
                },
            );
        }
        self.refine_clocks(core);
        events.extend(self.hang_events(core, now, progress));
        if let Some(through) = core.iteration.sealed_through() {
            for (k, bucket) in core.stats.take_sealed(through) {
                events.extend(self.evaluate(core, k, &bucket));
                core.last_sealed = Some(k);
            }
            // How far behind the job the verdicts are (benchmarks read it).
            if let Some(end) = core.iteration.end_of(through) {
                tracing::debug!(target: "slowrank::timing", sealed_through = through,
                    behind_ms = now.saturating_sub(end) as f64 / 1e6, "iterations sealed");
            }
        }
        events
    }

    /// The configured groups' what-if costs so far.
    pub fn group_costs(&self) -> Vec<GroupCost> {
        let core = lock(&self.core);
        self.cfg
            .whatif_groups
            .iter()
            .zip(&core.group_shares)
            .map(|((name, ranks), v)| GroupCost {
                group: name.clone(),
                ranks: ranks.clone(),
                share: if v.is_empty() {
                    0.0
                } else {
                    v.iter().map(|x| x.1).sum::<f64>() / v.len() as f64
                },
                per_iteration: v.clone(),
            })
            .collect()
    }

    fn iteration_of(&self, core: &Core, a: &AlignedInstance) -> u64 {
        let p = core.iteration.period().expect("checked");
        match a.key {
            crate::join::InstanceKey::Coll(seq) if a.comm_id == p.comm_id => {
                core.iteration.iteration_of_seq(seq).unwrap_or(0)
            }
            _ => core.iteration.iteration_at(a.start).unwrap_or(0),
        }
    }

    fn remember(&self, core: &mut Core, it: u64, a: AlignedInstance) {
        core.recent_entries += a.members.len();
        core.recent.push_back((it, a));
        while core.recent_entries > self.cfg.limits.recent_member_entries {
            match core.recent.pop_front() {
                Some((_, old)) => core.recent_entries -= old.members.len(),
                None => break,
            }
        }
    }

    /// Collective completions of all-reduce / all-gather across hosts should
    /// coincide; the per-host offset from the cross-host median, on the
    /// probe-only clock, is the completion residual.
    fn completion_check(&self, core: &mut Core, ji: &JoinedInstance, a: &AlignedInstance) {
        if !matches!(a.op, CollOp::AllReduce | CollOp::AllGather) {
            return;
        }
        if ji.members.iter().any(|m| m.rec.gpu_done_ns == 0) {
            return;
        }
        let mut per_host: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for m in &ji.members {
            let t = match self.clocks.get(&*m.host) {
                Some(c) => c.to_coord_probe_only(m.rec.gpu_done_ns),
                None => return,
            };
            per_host.entry(&m.host).or_default().push(t as f64);
        }
        if per_host.len() < 2 {
            return;
        }
        let meds: Vec<(&str, f64)> = per_host
            .into_iter()
            .map(|(h, mut v)| (h, median(&mut v).unwrap_or(0.0)))
            .collect();
        let mut all: Vec<f64> = meds.iter().map(|m| m.1).collect();
        let center = median(&mut all).unwrap_or(0.0);
        for (h, m) in meds {
            let q = core.residuals.entry(h.to_string()).or_default();
            q.push_back(m - center);
            while q.len() > 64 {
                q.pop_front();
            }
        }
    }

    fn refine_clocks(&self, core: &mut Core) {
        for (h, q) in &core.residuals {
            if q.len() < 16 {
                continue;
            }
            let mut v: Vec<f64> = q.iter().copied().collect();
            if let (Some(r), Some(mut c)) = (median(&mut v), self.clocks.get_mut(h)) {
                c.apply_completion_residual(r);
            }
        }
    }

    fn hang_events(
        &self,
        core: &mut Core,
        now: CoordNs,
        progress: Vec<(u64, crate::join::InstanceKey, bool)>,
    ) -> Vec<VerdictEvent> {
        let mut events = Vec::new();
        for (comm, key, resolved) in progress {
            if !resolved {
                continue;
            }
            for h in core
                .hangs
                .iter_mut()
                .filter(|h| h.active && h.candidate.comm_id == comm && h.candidate.key == key)
            {
                h.active = false;
                events.push(VerdictEvent {
                    event: EventKind::HangResolved,
                    iteration: h.iteration,
                    verdict: None,
                    hang: Some(h.candidate.clone()),
                    line: format!(
                        "RESOLVED hang on communicator {:#x} instance {}: every member arrived",
                        comm,
                        key.display_seq()
                    ),
                });
            }
        }
        let clock = |h: &str, t: u64| self.to_coord(h, t).0;
        // A member's agent is current past `deadline` only on a probed
        // clock, and by more than its error bound: before the first probe
        // answer the clock is a one-way bound from batch arrival, seconds
        // too late for an agent replaying its spool after a coordinator
        // restart, which would expire instances whose records are still in
        // that spool (and reject them as late when they come).
        let current = |rank: u32, host: &str, deadline: CoordNs| {
            let Some(r) = self.ranks.get(&rank) else {
                return false;
            };
            if r.exited_at.is_some() {
                return true;
            }
            let probed = self.clocks.get(host).is_some_and(|c| c.fit().is_some());
            probed
                && self.watermarks.get(&r.agent_id).is_some_and(|w| {
                    let (t, err) = self.to_coord(host, *w);
                    err.is_finite() && t.saturating_sub(err as CoordNs) >= deadline
                })
        };
        for e in self.joiner.expire(now, clock, current) {
            let Expired::Hang(mut c) = e else { continue };
            // Past the list's bound the summary says the rest: a hang is
            // kept here and in every alert event, and 4,095 absent members
            // each made 4,096 kept events ≈ 1.2 GB.
            if c.summary.is_some() {
                c.missing.truncate(crate::join::HANG_LIST_MAX);
            }
            // The instances queued behind a stuck one hang on the same
            // members: one finding per communicator and missing set.
            let same: Vec<u32> = c.missing.iter().map(|m| m.rank).collect();
            if core.hangs.iter().any(|h| {
                h.active
                    && h.candidate.comm_id == c.comm_id
                    && h.candidate
                        .missing
                        .iter()
                        .map(|m| m.rank)
                        .eq(same.iter().copied())
            }) {
                continue;
            }
            let iteration = core.iteration.iteration_at(c.entered_at);
            let exited: Vec<u32> = c
                .missing
                .iter()
                .filter(|m| {
                    self.ranks
                        .get(&m.rank)
                        .is_some_and(|r| r.exited_at.is_some())
                })
                .map(|m| m.rank)
                .collect();
            let missing: Vec<String> = c
                .missing
                .iter()
                .take(crate::join::HANG_LIST_MAX)
                .map(|m| {
                    if m.rank == crate::join::UNKNOWN_RANK {
                        return format!("position {} (no agent announced it)", m.rank_in_comm);
                    }
                    format!(
                        "rank {} on {} (last completed instance {})",
                        m.rank,
                        if m.host.is_empty() { "?" } else { &m.host },
                        m.last_completed_seq
                            .map_or_else(|| "none".into(), |s| s.to_string())
                    )
                })
                .collect();
            // A hang of thousands: the count and ranges, then the first few.
            let (absent, missing) = match &c.summary {
                Some(sm) => (
                    sm.count as usize,
                    format!("{}; the first: {}", sm.describe(), missing.join(", ")),
                ),
                None => (c.missing.len(), missing.join(", ")),
            };
            let line = format!(
                "HANG on communicator {:#x} {} instance {}: {} of {} members entered {} ago; missing {}{}",
                c.comm_id,
                crate::join::op_name(c.op),
                c.key.display_seq(),
                c.present_ranks.len(),
                c.present_ranks.len() + absent,
                classify::fmt_ns(now.saturating_sub(c.entered_at) as f64),
                missing,
                if exited.is_empty() { String::new() } else { format!(" — exited: {exited:?}") }
            );
            let st = HangState {
                wall: self.wall(c.entered_at),
                candidate: c.clone(),
                iteration,
                detected_at: now,
                active: true,
                exited,
            };
            core.hangs.push(st);
            if core.hangs.len() > 256 {
                core.hangs.remove(0);
            }
            events.push(VerdictEvent {
                event: EventKind::HangDetected,
                iteration,
                verdict: None,
                hang: Some(c),
                line,
            });
        }
        events
    }

    fn evaluate(&self, core: &mut Core, k: u64, bucket: &IterBucket) -> Vec<VerdictEvent> {
        let step = core
            .iteration
            .duration_of(k)
            .or_else(|| core.iteration.step_ns())
            .unwrap_or(f64::INFINITY);
        // Warm-up steps (allocators, autotuning) are no baseline: with them a
        // healthy job looked 10% slower right after its warm-up.
        let warm = k >= self.cfg.lifecycle.warmup_iterations;
        if let Some(d) = core.iteration.duration_of(k).filter(|_| warm) {
            core.steps.push_back(d);
            while core.steps.len() > STEP_HISTORY {
                core.steps.pop_front();
            }
        }
        let mut scores = core.stats.score(k, bucket, step);
        let d = core.iteration.duration_of(k);
        core.timeline.record(k, d, &scores);
        let world = self
            .ranks
            .iter()
            .next()
            .map(|r| r.world_size as f64)
            .filter(|w| *w > 0.0)
            .unwrap_or(bucket.ranks.len() as f64);
        let exposure = if step.is_finite() { world * step } else { 0.0 };
        // Who waited for whom, and where the waiting comes to rest.
        let graph = WaitGraph::from_edges(&bucket.edges);
        let mut pass: HashMap<Node, f64> = HashMap::new();
        for s in &scores {
            let p = if s.late_ns > 0.0 {
                (s.excess_wait_ns.max(0.0) / s.late_ns).clamp(0.0, 1.0)
            } else if s.excess_wait_ns > 0.0 {
                1.0
            } else {
                0.0
            };
            pass.insert(Node::Rank(s.rank), p);
        }
        let blame = graph.blame(&pass, 6);
        let mut rank_blame: HashMap<u32, f64> = HashMap::new();
        for (n, b) in &blame {
            if let Node::Rank(r) = n {
                *core.lost_by_root.entry(*r).or_default() += b;
                rank_blame.insert(*r, *b);
            }
        }
        core.stats.judge_blame(&mut scores, &rank_blame);
        let (from, to) = (
            k.checked_sub(1)
                .and_then(|p| core.iteration.end_of(p))
                .unwrap_or(CoordNs::MIN),
            core.iteration.end_of(k).unwrap_or(CoordNs::MAX),
        );
        let (model, gpu_ranks) = Self::iteration_model(core, k, from);
        let (alarms, shares) = Self::sequential_test(core, model.as_ref(), step);
        if let (Some(m), true) = (model.as_ref(), step.is_finite() && step > 0.0) {
            for (g, (_, ranks)) in self.cfg.whatif_groups.iter().enumerate() {
                let here: Vec<u32> = ranks
                    .iter()
                    .copied()
                    .filter(|r| m.ranks().any(|x| x == *r))
                    .collect();
                if let Some(len) = m.length_with(&here) {
                    core.group_shares[g].push((k, (m.length() - len).max(0.0) / step));
                }
            }
        }
        if warm {
            core.pace.observe(k, step, &shares);
        }
        // The sequential test opens a verdict at once on a rank that is also
        // suspicious on its own this iteration (an alarm alone, on a few
        // noisy early steps, is not enough), and keeps an open verdict's
        // rank named while its evidence stands; the class, the two-rank and
        // deep-set rules below still apply.
        // A decisive what-if stands alone (see `sequential`), on a step
        // that was told, not guessed.
        let told = core
            .iteration
            .period()
            .is_some_and(|p| p.method != crate::graph::iteration::Method::Undetermined);
        let mut by_what_if: std::collections::HashSet<u32> = Default::default();
        for s in scores.iter_mut() {
            if told && core.sequential.decisive(s.rank) && !s.suspicious {
                tracing::debug!(rank = s.rank, iteration = k, "named by a decisive what-if");
                s.suspicious = true;
                by_what_if.insert(s.rank);
            }
        }
        let alarms: std::collections::HashSet<u32> = scores
            .iter()
            .filter(|s| {
                s.suspicious
                    && (alarms.contains(&s.rank) || (told && core.sequential.decisive(s.rank)))
            })
            .map(|s| s.rank)
            .collect();
        for s in scores.iter_mut() {
            let active = core
                .lifecycle
                .verdicts()
                .any(|v| v.active && v.rank == s.rank && v.link.is_none());
            if active && core.sequential.standing(s.rank) {
                s.suspicious = true;
            }
        }
        for s in &scores {
            tracing::trace!(
                iteration = k,
                rank = s.rank,
                suspicious = s.suspicious,
                late_us = s.late_ns / 1e3,
                host_late_us = s.host_late_ns / 1e3,
                gpu_late_us = s.gpu_late_ns.map(|g| g / 1e3),
                unexplained_us = s.unexplained_ns / 1e3,
                sync_excess_us = s.sync_excess_ns / 1e3,
                last_frac = s.last_frac,
                step_ms = s.step_ns / 1e6,
                err_us = s.err_ns / 1e3,
                "rank score"
            );
        }
        let min_frac = core.stats.config().min_step_fraction;
        let mut obs: BTreeMap<Subject, Observation> = BTreeMap::new();
        for s in &scores {
            let hist = core.score_hist.entry(s.rank).or_default();
            if s.suspicious {
                hist.push_back(s.clone());
                while hist.len() > 5 {
                    hist.pop_front();
                }
            } else {
                hist.retain(|h| h.iteration + 5 > k);
            }
            if !s.suspicious {
                continue;
            }
            let window: Vec<RankScore> = hist.iter().cloned().collect();
            let peers = core.stats.peers(s.rank).to_vec();
            let first_it = window.first().map_or(k, |w| w.iteration);
            let cpu_from = core
                .iteration
                .end_of(first_it.saturating_sub(1))
                .unwrap_or(from);
            let cpu = core.intervals.evidence(s.rank, &peers, cpu_from, to);
            let persistence = core
                .stats
                .reference_comm(s.rank)
                .and_then(|c| core.stats.order_persistence(c));
            let mut c = classify::classify_straggler(&window, cpu.as_ref(), persistence, min_frac);
            // Said first where it is what named the rank: the lateness
            // lines below then read as "barely late", which is the point.
            if by_what_if.contains(&s.rank) {
                if let Some(x) = shares.get(&s.rank) {
                    c.evidence.insert(
                        0,
                        format!(
                            "the what-if replay: at its peers' speed this step would have been {:.0}% ({}) shorter, and every one of the last {} steps at least {:.0}% shorter",
                            x * 100.0,
                            classify::fmt_ns(x * step),
                            core.sequential.config().decisive_run,
                            core.sequential.config().decisive_share * 100.0
                        ),
                    );
                }
            }
            // Host-side times say only that this rank's GPU work ran long:
            // kernels or transfers (a slow NIC drains the stream just the
            // same). Where the deep set can tell the two apart, it is asked
            // to, and the rank waits for its answer instead of being named
            // compute-slow on a guess.
            if c.kind == classify::Kind::Compute
                && !c.gpu_side
                && core.stats.gpu_time_missing(s.rank, k)
            {
                tracing::debug!(
                    rank = s.rank,
                    iteration = k,
                    "GPU-bound suspect held for the deep set"
                );
                core.held_for_deep = Some(k);
                continue;
            }
            // Two ranks: no majority says who is odd (see `stands_alone`).
            if s.peers < 3 && !classify::stands_alone(&c, &window, cpu.as_ref()) {
                tracing::debug!(
                    rank = s.rank,
                    iteration = k,
                    kind = c.kind.as_str(),
                    "suspect on a two-rank communicator without direct evidence of its class: not named"
                );
                continue;
            }
            let at = s.first_t.unwrap_or(from);
            obs.insert(
                Subject::Rank(s.rank),
                Observation {
                    classification: c,
                    rank: s.rank,
                    host: self.host_of(s.rank),
                    link: None,
                    ranks: Vec::new(),
                    clock_error_ns: s.err_ns,
                    late_ns: s.unexplained_ns,
                    lost_ns: blame.get(&Node::Rank(s.rank)).copied().unwrap_or(0.0),
                    exposure_ns: exposure,
                    saved_ns: None,
                    step_ns: 0.0,
                    once_fixed: None,
                    alarm: alarms.contains(&s.rank),
                    structural: None,
                    at,
                    wall: self.wall(at),
                },
            );
        }
        core.score_hist.retain(|_, h| !h.is_empty());
        // Communication: links judged over this iteration's window.
        if from != CoordNs::MIN && to != CoordNs::MAX {
            let f = core.links.evaluate(from, to, |r| self.host_of(r));
            for c in &f.common_mode {
                tracing::debug!(
                    host = %c.host,
                    slow = c.slow_links,
                    measured = c.measured_links,
                    "every link this host measures is slow: a host-side cause, no pair named"
                );
            }
            let max_err = self.max_error_ns();
            let min_link_cost = self.cfg.links.min_cost_fraction;
            for n in &f.nics {
                let acc = bucket.ranks.get(&n.rank);
                let excess = 1.0 - 1.0 / n.ratio.max(1.0);
                let lost = acc.map_or(0.0, |a| a.xfer_member_ns * excess);
                // The step's share: the what-if with its transfers at its
                // peers' rate (the members' sum above is GPU time lost,
                // not step time).
                let saved = model
                    .as_ref()
                    .and_then(|m| m.transfer_cost(&[n.rank], 1.0 / n.ratio.max(1.0)));
                if !costs_enough(lost, exposure, min_link_cost) {
                    tracing::debug!(
                        rank = n.rank,
                        lost_ns = lost,
                        "slow NIC with no measured cost: not a finding"
                    );
                    continue;
                }
                let ratio = transfer_ratio(bucket, n.rank);
                let mut peers = n.slow_peers.clone();
                peers.extend(core.stats.inter_host_peers(n.rank));
                peers.sort_unstable();
                peers.dedup();
                core.nic_peers.insert(n.rank, peers);
                obs.insert(
                    Subject::Nic(n.rank),
                    Observation {
                        classification: classify::classify_nic(n, ratio),
                        rank: n.rank,
                        host: self.host_of(n.rank),
                        link: None,
                        ranks: Vec::new(),
                        clock_error_ns: max_err,
                        late_ns: 0.0,
                        lost_ns: lost,
                        exposure_ns: exposure,
                        saved_ns: saved,
                        step_ns: 0.0,
                        once_fixed: None,
                        alarm: false,
                        structural: None,
                        at: from,
                        wall: self.wall(from),
                    },
                );
            }
            for l in &f.links {
                let acc = bucket.ranks.get(&l.a);
                let excess = 1.0 - 1.0 / l.ratio.max(1.0);
                let lost = acc.map_or(0.0, |a| a.xfer_member_ns * excess);
                let saved = model
                    .as_ref()
                    .and_then(|m| m.transfer_cost(&[l.a, l.b], 1.0 / l.ratio.max(1.0)));
                if !costs_enough(lost, exposure, min_link_cost) {
                    tracing::debug!(
                        a = l.a,
                        b = l.b,
                        lost_ns = lost,
                        "slow link with no measured cost: not a finding"
                    );
                    continue;
                }
                obs.insert(
                    Subject::Link(l.a, l.b),
                    Observation {
                        classification: classify::classify_link(l),
                        rank: l.a,
                        host: self.host_of(l.a),
                        link: Some([l.a, l.b]),
                        ranks: Vec::new(),
                        clock_error_ns: max_err,
                        late_ns: 0.0,
                        lost_ns: lost,
                        exposure_ns: exposure,
                        saved_ns: saved,
                        step_ns: 0.0,
                        once_fixed: None,
                        alarm: false,
                        structural: None,
                        at: from,
                        wall: self.wall(from),
                    },
                );
            }
        }
        drop_passed_into_transfers(&mut obs, core.lifecycle.verdicts());
        relay_transfer_lateness(&mut obs, core.lifecycle.verdicts(), &core.nic_peers);
        // A pipeline neighbour of a rank that costs the job several times
        // more (named now, or by an active verdict) waits for that rank's
        // sends. Outside a deep window (or across NVLink) a receive has no
        // GPU time, so the wait shows as lateness of its own. It is the
        // other rank's, passed along the pipeline.
        // The neighbour's own one-host partners count too: a stage waits
        // for its neighbour, which waited for its tensor-parallel partner.
        let costs = rank_costs(&obs, core.lifecycle.verdicts(), |_| true);
        obs.retain(|k, o| match *k {
            Subject::Rank(r) => !passed_along(
                cost_share(o),
                core.stats
                    .p2p_peers(r)
                    .iter()
                    .flat_map(|q| std::iter::once(q).chain(core.stats.blind_partners(*q)))
                    .filter(|q| **q != r)
                    .filter_map(|q| costs.get(q).copied()),
            ),
            _ => true,
        });
        let compute_active: std::collections::HashSet<u32> = core
            .lifecycle
            .verdicts()
            .filter(|v| v.active && v.kind == classify::Kind::Compute)
            .filter(|v| matches!(v.subject, Subject::Rank(_)))
            .map(|v| v.rank)
            .collect();
        relay_blind_waits(
            &mut obs,
            |r| core.stats.blind_partners(r),
            |r| compute_active.contains(&r),
        );
        crate::classify::hostwide::merge(&mut obs, &self.live_ranks_by_host());
        if let Some(m) = model.as_ref().filter(|_| warm) {
            // Own work is GPU work only on GPU-side times: on host-side
            // ones a host that ran ahead, or waited, looks like work (and
            // a restarted coordinator's partial iterations look balanced
            // badly). Structure is judged on GPU-side iterations only.
            let gpu_side = core
                .recent
                .iter()
                .filter(|(it, _)| *it == k)
                .all(|(_, a)| a.basis == crate::classify::stats::Basis::Gpu);
            if gpu_side {
                core.imbalance.observe(m, step, &shares);
                self.structural(core, m, step, from, &mut obs);
            }
        }
        let unobserved = Self::what_if(core, model.as_ref(), &gpu_ranks, step, &mut obs);
        let events = core.lifecycle.step(k, obs);
        for c in unobserved {
            core.lifecycle
                .account_unobserved(k, c.subject, c.saved_ns, step, c.once_fixed);
        }
        for e in &events {
            if let (EventKind::Opened | EventKind::Reopened, Some(v)) = (e.event, &e.verdict) {
                self.snapshot(
                    core,
                    v.id,
                    v.first_seen_iteration,
                    v.link.as_ref().map(|l| l.ranks),
                    v.rank,
                );
            }
        }
        events
    }

    /// Structural findings of the iteration ([`crate::graph::structure`]): a stage
    /// slower on every replica, work imbalance that moves. Each replaces
    /// the rank observations it explains (its ranks are not stragglers).
    fn structural(
        &self,
        core: &Core,
        m: &crate::graph::whatif::WhatIf,
        step: f64,
        at: CoordNs,
        obs: &mut BTreeMap<Subject, Observation>,
    ) {
        let mut add = |subject: Subject,
                       ranks: Vec<u32>,
                       saved: f64,
                       evidence: Vec<String>,
                       st: crate::verdict::Structural| {
            for r in &ranks {
                obs.remove(&Subject::Rank(*r));
            }
            obs.insert(
                subject,
                Observation {
                    classification: classify::Classification {
                        kind: classify::Kind::Structural,
                        confidence: 0.9,
                        evidence,
                        gpu_side: false,
                    },
                    rank: ranks.first().copied().unwrap_or(0),
                    host: String::new(),
                    link: None,
                    ranks,
                    clock_error_ns: self.max_error_ns(),
                    late_ns: 0.0,
                    lost_ns: 0.0,
                    exposure_ns: 0.0,
                    saved_ns: Some(saved),
                    step_ns: step,
                    once_fixed: None,
                    alarm: false,
                    structural: Some(st),
                    at,
                    wall: self.wall(at),
                },
            );
        };
        let stage = crate::graph::structure::stage_imbalance(m, step);
        if let Some(f) = stage {
            add(
                Subject::Stage(f.stage),
                f.ranks.clone(),
                f.saved_ns,
                vec![
                    format!(
                        "every replica of stage {} works {:.0}% more per step than the median stage",
                        f.stage,
                        100.0 * (f.ratio - 1.0)
                    ),
                    format!(
                        "with that stage at the median stage's work the step would be {} shorter",
                        classify::fmt_ns(f.saved_ns)
                    ),
                ],
                crate::verdict::Structural {
                    cause: "stage_imbalance".into(),
                    stage: Some(f.stage),
                },
            );
        }
        // Work imbalance is what is left when no rank explains the waiting:
        // not while the sequential test names one, nor while a rank, host,
        // NIC or link verdict is open.
        let named = core
            .lifecycle
            .verdicts()
            .any(|v| v.active && v.structural.is_none());
        if self.cfg.work_imbalance && core.sequential.alarms().is_empty() && !named {
            if let Some(f) = core.imbalance.finding() {
                add(
                    Subject::Imbalance,
                    Vec::new(),
                    f.saved_ns,
                    vec![
                        format!(
                            "over the last {} steps {} different ranks were the one the step waited for; none in more than {:.0}% of them",
                            crate::graph::structure::WINDOW,
                            f.distinct_tops,
                            100.0 * f.top_share
                        ),
                        format!(
                            "with every rank at its peers' median work the step would be {} shorter",
                            classify::fmt_ns(f.saved_ns)
                        ),
                    ],
                    crate::verdict::Structural {
                        cause: "work_imbalance".into(),
                        stage: None,
                    },
                );
            }
        }
    }

    /// Iteration `k` (which began at `from`) as a replayable what-if model,
    /// and the ranks that had GPU-side arrivals in it.
    fn iteration_model(
        core: &Core,
        k: u64,
        from: CoordNs,
    ) -> (
        Option<crate::graph::whatif::WhatIf>,
        std::collections::HashSet<u32>,
    ) {
        if from == CoordNs::MIN {
            return (None, Default::default());
        }
        let instances: Vec<&AlignedInstance> = core
            .recent
            .iter()
            .filter(|(it, _)| *it == k)
            .map(|(_, a)| a)
            .collect();
        let gpu_ranks = instances
            .iter()
            .filter(|a| a.basis == crate::classify::stats::Basis::Gpu)
            .flat_map(|a| a.members.iter().map(|m| m.rank))
            .collect();
        let model = crate::graph::whatif::WhatIf::new(&crate::graph::itergraph::build(
            from,
            instances.into_iter(),
        ));
        (model, gpu_ranks)
    }

    /// Feeds the iteration's what-if savings to the per-rank sequential
    /// test; returns the ranks in alarm. Only an instance's last arriver
    /// can be on the critical path, so only those are replayed (at most
    /// [`MAX_REPLAYED`], the furthest behind first).
    fn sequential_test(
        core: &mut Core,
        model: Option<&crate::graph::whatif::WhatIf>,
        step: f64,
    ) -> (std::collections::HashSet<u32>, BTreeMap<u32, f64>) {
        let mut shares: BTreeMap<u32, f64> = BTreeMap::new();
        if let (Some(m), true) = (model, step.is_finite() && step > 0.0) {
            let mut last: Vec<(u32, f64)> = m.last_arrivers().into_iter().collect();
            last.sort_by(|a, b| b.1.total_cmp(&a.1));
            for (r, _) in last.into_iter().take(MAX_REPLAYED) {
                if let Some(c) = m.cost(r) {
                    shares.insert(r, c / step);
                }
            }
        }
        let alarms = core.sequential.update(&shares).into_iter().collect();
        if let Some((r, x)) = shares.iter().max_by(|a, b| a.1.total_cmp(b.1)) {
            tracing::debug!(
                rank = r,
                share = x,
                cusum = core.sequential.sum(*r),
                "costliest rank of the iteration (what-if)"
            );
        }
        (alarms, shares)
    }

    /// Costs the iteration for every observed subject and active verdict
    /// (`whatif`, `cost`). Returns the active verdicts' costs that have no
    /// observation this iteration.
    fn what_if(
        core: &Core,
        model: Option<&crate::graph::whatif::WhatIf>,
        gpu_ranks: &std::collections::HashSet<u32>,
        step: f64,
        obs: &mut BTreeMap<Subject, Observation>,
    ) -> Vec<crate::graph::cost::Costed> {
        let active: Vec<(Subject, Vec<u32>, classify::Kind)> = core
            .lifecycle
            .verdicts()
            .filter(|v| v.active)
            .map(|v| {
                let ranks = if v.ranks.is_empty() {
                    vec![v.rank]
                } else {
                    v.ranks.clone()
                };
                (v.subject, ranks, v.kind)
            })
            .collect();
        if obs.is_empty() && active.is_empty() {
            return Vec::new();
        }
        let it = crate::graph::cost::Iteration {
            model,
            gpu_ranks,
            step_ns: step,
        };
        crate::graph::cost::apply(&it, obs, &active)
    }

    fn snapshot(&self, core: &mut Core, id: u64, first_it: u64, link: Option<[u32; 2]>, rank: u32) {
        let lo = first_it.saturating_sub(1);
        let involves = |a: &AlignedInstance| match link {
            Some([x, y]) => {
                a.members.iter().any(|m| m.rank == x) && a.members.iter().any(|m| m.rank == y)
            }
            None => a.members.iter().any(|m| m.rank == rank),
        };
        let mut entries = 0usize;
        let budget = self.cfg.limits.snapshot_member_entries;
        let snap: Vec<(u64, AlignedInstance)> = core
            .recent
            .iter()
            .filter(|(it, a)| *it >= lo && involves(a))
            .take(self.cfg.limits.snapshot_instances)
            .take_while(|(_, a)| {
                let first = entries == 0;
                entries += a.members.len();
                first || entries <= budget
            })
            .cloned()
            .collect();
        core.snapshots.insert(id, snap);
        while core.snapshots.len() > self.cfg.limits.max_snapshots {
            core.snapshots.pop_first();
        }
    }

    /// The job got slower while no verdict names a rank: the median of the
    /// last few steps is well above the median of the steps before them.
    /// With the default probe set a compute- or communication-slow rank is
    /// often invisible (calls only enqueue; host-side arrivals match), so
    /// `serve` answers this with a deep-probe window on every agent, whose
    /// GPU-side arrivals and verbs latencies name the rank.
    pub fn slowdown(&self) -> Option<Slowdown> {
        let core = lock(&self.core);
        if core.lifecycle.verdicts().any(|v| v.active) {
            return None;
        }
        let n = core.steps.len();
        if n < SLOWDOWN_RECENT + SLOWDOWN_BASELINE_MIN {
            return None;
        }
        let mut recent: Vec<f64> = core
            .steps
            .iter()
            .skip(n - SLOWDOWN_RECENT)
            .copied()
            .collect();
        let mut base: Vec<f64> = core
            .steps
            .iter()
            .take(n - SLOWDOWN_RECENT)
            .copied()
            .collect();
        let (r, b) = (median(&mut recent)?, median(&mut base)?);
        (r > b * (1.0 + SLOWDOWN_RISE)).then(|| Slowdown {
            iteration: core.last_sealed.unwrap_or(0),
            baseline_ms: b / 1e6,
            recent_ms: r / 1e6,
        })
    }

    /// A GPU-bound suspect was held in the last iterations because only the
    /// deep set can tell a slow GPU from a slow NIC: deep probes are wanted.
    pub fn confirmation_wanted(&self) -> bool {
        let core = lock(&self.core);
        match (core.held_for_deep, core.last_sealed) {
            (Some(h), Some(l)) => h + 3 >= l,
            _ => false,
        }
    }

    /// Verdicts opened so far (active or not).
    pub fn verdicts_opened(&self) -> usize {
        lock(&self.core).lifecycle.verdicts().count()
    }

    /// Whether an active verdict rests on what only the deep set sees: a
    /// GPU or a NIC falling behind (compute, communication). Host-side
    /// times cannot show either, so without the deep set such a verdict
    /// would close as if its fault had gone.
    pub fn active_needs_deep(&self) -> bool {
        lock(&self.core).lifecycle.verdicts().any(|v| {
            v.active
                && matches!(
                    v.kind,
                    classify::Kind::Compute | classify::Kind::Communication
                )
        })
    }

    fn max_error_ns(&self) -> f64 {
        self.clocks
            .iter()
            .map(|c| c.error_bound_ns())
            .filter(|e| e.is_finite())
            .fold(0.0, f64::max)
    }

    /// The cluster report (`report.json` / the human table).
    pub fn report(&self) -> Report {
        let core = lock(&self.core);
        let mut hosts: Vec<crate::clock::HostClock> =
            self.clocks.iter().map(|c| c.summary(c.key())).collect();
        hosts.sort_by(|a, b| a.host.cmp(&b.host));
        let ranks: Vec<RankInfo> = {
            let mut v: Vec<RankInfo> = self.ranks.iter().map(|r| r.clone()).collect();
            v.sort_by_key(|r| r.rank);
            v
        };
        let period = core.iteration.period();
        let elapsed = match (core.first_t, core.last_t) {
            (Some(a), Some(b)) => (b - a) as f64 / 1e9,
            _ => 0.0,
        };
        let mut verdicts: Vec<crate::verdict::Verdict> =
            core.lifecycle.verdicts().cloned().collect();
        verdicts.sort_by(|a, b| {
            b.active
                .cmp(&a.active)
                .then(b.lost_gpu_seconds.total_cmp(&a.lost_gpu_seconds))
        });
        let counters = self.ingest_counters();
        let join = self.joiner.counters();
        let (roots, blocked) = split_hangs(&core.hangs);
        report::Report {
            schema: report::SCHEMA.into(),
            generated_at: Utc::now(),
            job: report::JobInfo {
                job_id: ranks
                    .iter()
                    .map(|r| r.job_id.clone())
                    .find(|j| !j.is_empty()),
                world_size: ranks.first().map_or(0, |r| r.world_size),
                ranks_seen: ranks.len(),
                hosts: hosts.len(),
                reference_communicator: period.map(|p| format!("{:#x}", p.comm_id)),
                instances_per_iteration: period.map(|p| p.instances_per_iteration),
                step_inferred_by: period.map(|p| p.method),
                baseline_step_ms: core.pace.baseline_ms(),
                iterations_observed: core.last_sealed.map_or(0, |k| k + 1),
                step_time_ms: core.iteration.step_ns().map(|s| s / 1e6),
                observed_seconds: elapsed,
                started: core.first_t.and_then(|t| self.wall(t)),
                exited_ranks: ranks
                    .iter()
                    .filter(|r| r.exited_at.is_some())
                    .map(|r| r.rank)
                    .collect(),
            },
            clock: report::ClockInfo {
                max_error_us: {
                    let e = hosts
                        .iter()
                        .filter_map(|h| h.error_bound_us)
                        .fold(0.0, f64::max);
                    if hosts.is_empty() || hosts.iter().any(|h| h.error_bound_us.is_none()) {
                        None
                    } else {
                        Some(e)
                    }
                },
                hosts,
            },
            verdicts,
            hangs: roots.iter().map(|h| hang_report(h)).collect(),
            blocked_hangs: blocked.iter().map(|h| hang_report(h)).collect(),
            resolved_stalls: core
                .hangs
                .iter()
                .filter(|h| !h.active)
                .map(hang_report)
                .collect(),
            ingest: report::IngestInfo {
                counters,
                instances_completed: join.completed,
                instances_evicted: join.evicted,
                instances_incomplete: join.incomplete,
                duplicate_records: join.duplicates,
                merged_records: join.merged,
                dropped_late_for_stats: core.stats.dropped_late,
                dropped_overflow: core.stats.dropped_overflow + core.pending_dropped,
                open_instances: self.joiner.open_instances(),
                transport_rejected: BTreeMap::new(),
                agents_refused: 0,
                agents_refused_by: BTreeMap::new(),
                agents_forgotten: 0,
            },
            agents: Vec::new(),
            slowdown: core.pace.slowing(),
            overhead: lock(&self.overhead).report(),
            resumed: None,
            truncated: None,
        }
    }

    /// Chrome / Perfetto trace (`traceEvents`) of the aligned timeline around
    /// each verdict (or the most recent instances when there is none).
    pub fn trace_json(&self) -> serde_json::Value {
        let core = lock(&self.core);
        let mut sections: Vec<crate::report::trace::Section> = Vec::new();
        for (id, snap) in &core.snapshots {
            if let Some(v) = core.lifecycle.get(*id) {
                sections.push(crate::report::trace::Section {
                    title: v.headline(),
                    focus: match &v.link {
                        Some(l) => l.ranks.to_vec(),
                        None => vec![v.rank],
                    },
                    instances: snap.iter().map(|x| &x.1).collect(),
                });
            }
        }
        if sections.is_empty() {
            let n = core.recent.len();
            sections.push(crate::report::trace::Section {
                title: "recent collectives".into(),
                focus: Vec::new(),
                instances: core
                    .recent
                    .iter()
                    .skip(n.saturating_sub(256))
                    .map(|x| &x.1)
                    .collect(),
            });
        }
        let hosts: HashMap<u32, String> = self
            .ranks
            .iter()
            .map(|r| (r.rank, r.host.clone()))
            .collect();
        crate::report::trace::render(&sections, &hosts)
    }

    /// The per-iteration series of the report page (`timeline.json`).
    pub fn timeline(&self) -> crate::report::timeline::Timeline {
        lock(&self.core).timeline.clone()
    }

    /// Gauges and counters for `/metrics`.
    pub fn metrics(&self) -> Metrics {
        let core = lock(&self.core);
        let mut lateness: Vec<(u32, f64)> = core
            .stats
            .lateness_gauge()
            .iter()
            .map(|(r, l)| (*r, *l))
            .collect();
        lateness.sort_by_key(|x| x.0);
        let mut clock: Vec<(String, f64)> = self
            .clocks
            .iter()
            .map(|c| (c.key().clone(), c.error_bound_ns()))
            .collect();
        clock.sort_by(|a, b| a.0.cmp(&b.0));
        let mut probes: Vec<(String, u64, u64)> = self
            .clocks
            .iter()
            .map(|c| {
                let (seen, udp) = c.probe_counts();
                (c.key().clone(), udp, seen.saturating_sub(udp))
            })
            .collect();
        probes.sort();
        let mut lost: Vec<(u32, f64)> = core
            .lost_by_root
            .iter()
            .map(|(r, l)| (*r, *l / 1e9))
            .collect();
        lost.sort_by_key(|x| x.0);
        // One guard: a second lock() in the literal below would wait for the
        // first, whose temporary lives to the end of the statement.
        let (probe_overhead_percent, job_probe_overhead_percent) = {
            let o = lock(&self.overhead);
            (o.rank_percents(), o.job_percent())
        };
        Metrics {
            rank_lateness_ns: lateness,
            rank_wait_attributed_gpu_seconds: lost,
            verdicts_active: core.lifecycle.verdicts().filter(|v| v.active).count(),
            verdicts_total: core.lifecycle.verdicts().count(),
            hangs_active: core.hangs.iter().filter(|h| h.active).count(),
            clock_error_ns: clock,
            clock_probes: probes,
            ingest: self.ingest_counters(),
            open_instances: self.joiner.open_instances(),
            evicted_instances: self.joiner.counters().evicted,
            iterations_sealed: core.last_sealed.map_or(0, |k| k + 1),
            verdict_trackers: core.lifecycle.trackers(),
            pending_instances: core.pending.len(),
            recent_instances: core.recent.len(),
            probe_overhead_percent,
            job_probe_overhead_percent,
            step_ns: core.iteration.step_ns(),
            verdicts: core
                .lifecycle
                .verdicts()
                .map(crate::report::metrics_text::VerdictRow::of)
                .collect(),
        }
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
    let waiting: std::collections::HashSet<u32> = active
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

/// Whether a link or NIC finding's cost in one iteration (`lost` GPU-ns of
/// `exposure`) is worth naming. Without a known step (exposure 0) any
/// measured cost is.
fn costs_enough(lost: f64, exposure: f64, min_fraction: f64) -> bool {
    lost > 0.0 && (exposure <= 0.0 || lost >= min_fraction * exposure)
}

/// Mean transfer of instances containing `rank` vs all instances, this iteration.
fn transfer_ratio(bucket: &IterBucket, rank: u32) -> Option<f64> {
    let mine = bucket.ranks.get(&rank).filter(|a| a.xfer_n > 0)?;
    let mut others: Vec<f64> = bucket
        .ranks
        .iter()
        .filter(|(r, a)| **r != rank && a.xfer_n > 0)
        .map(|(_, a)| a.xfer_member_ns / a.xfer_n as f64)
        .collect();
    let m = median(&mut others)?;
    (m > 0.0).then(|| (mine.xfer_member_ns / mine.xfer_n as f64) / m)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join::{InstanceKey, MissingMember};

    fn hang(comm: u64, present: &[u32], missing: &[u32]) -> HangState {
        HangState {
            candidate: HangCandidate {
                comm_id: comm,
                key: InstanceKey::Coll(1),
                op: CollOp::AllReduce,
                comm_nranks: (present.len() + missing.len()) as u32,
                entered_at: 0,
                first_host: "a".into(),
                first_agent_ns: 0,
                present_ranks: present.to_vec(),
                missing: missing
                    .iter()
                    .map(|r| MissingMember {
                        rank: *r,
                        rank_in_comm: 0,
                        host: "a".into(),
                        last_seq_seen: None,
                        last_completed_seq: None,
                    })
                    .collect(),
                summary: None,
            },
            iteration: None,
            detected_at: 0,
            wall: None,
            active: true,
            exited: Vec::new(),
        }
    }

    #[test]
    fn hangs_behind_a_hang_are_consequences() {
        // Rank 13 stopped: its TP partner 12 waits for it; 12's pipeline
        // neighbour 4 then waits for 12, which never comes.
        let h = [hang(1, &[12], &[13]), hang(2, &[4], &[12])];
        let (roots, blocked) = split_hangs(&h);
        assert_eq!(roots.len(), 1);
        assert_eq!(roots[0].candidate.comm_id, 1);
        assert_eq!(blocked[0].candidate.comm_id, 2);
        // A cycle (everyone missing somewhere waits elsewhere): all stay.
        let c = [hang(1, &[1], &[2]), hang(2, &[2], &[1])];
        assert_eq!(split_hangs(&c).0.len(), 2);
    }

    /// Feeds 8 iterations of a 2-host job; host 1's membership (its comm
    /// records) is held back until iteration `announce_at` (never: None).
    /// Returns the analyzer and the last iteration's end.
    fn feed_with_late_membership(announce_at: Option<u64>) -> (Analyzer, u64) {
        use crate::synth::{Generator, SynthSpec};
        let a = Analyzer::new(AnalyzerConfig::default());
        let mut g = Generator::new(SynthSpec::dp(2, 4));
        for (h, s) in g.initial_samples() {
            a.add_clock_sample(&h, s).unwrap();
        }
        let mut held = Vec::new();
        let mut end = 0;
        for it in 0..8u64 {
            let out = g.next_iteration();
            for (h, s) in &out.samples {
                a.add_clock_sample(h, *s).unwrap();
            }
            for (recv, mut b) in out.batches {
                if b.host == "node-1" {
                    held.append(&mut b.comms);
                    if Some(it) == announce_at {
                        b.comms = std::mem::take(&mut held);
                    }
                }
                a.ingest(&b, recv);
            }
            end = out.end_ns;
            a.tick(end as i64 + 3_000_000);
        }
        (a, end)
    }

    #[test]
    fn records_before_their_membership_are_parked_then_joined() {
        let (a, _) = feed_with_late_membership(Some(3));
        let (base, _) = feed_with_late_membership(Some(0));
        let r = a.report();
        assert!(
            r.ingest.counters.records_rejected.is_empty(),
            "{:?}",
            r.ingest.counters.records_rejected
        );
        let p = r.ingest.counters.parking;
        assert!(p.parked > 0 && p.released == p.parked, "{p:?}");
        assert_eq!((p.expired, p.overflow, p.held), (0, 0, 0), "{p:?}");
        // Joined as live data: every instance completes, as when nothing waited.
        assert_eq!(
            r.ingest.instances_completed,
            base.report().ingest.instances_completed
        );
        assert_eq!(base.report().ingest.counters.parking.parked, 0);
    }

    #[test]
    fn records_whose_membership_never_comes_expire_as_lost() {
        let (a, end) = feed_with_late_membership(None);
        a.tick(end as i64 + 3_000_000);
        let held = a.report().ingest.counters.parking;
        assert!(held.held > 0 && held.expired == 0, "{held:?}");
        a.tick((end + crate::join::park::PARK_TIMEOUT_NS) as i64 + 1_000_000_000);
        let p = a.report().ingest.counters.parking;
        assert_eq!((p.held, p.held_bytes), (0, 0), "{p:?}");
        assert_eq!(p.expired, held.held, "{p:?}");
        assert!(a.report().ingest.counters.records_rejected.is_empty());
        assert!(a
            .metrics()
            .to_prometheus()
            .contains("slowrank_parked_records_total{outcome=\"expired\"}"));
    }

    #[test]
    fn a_preamble_before_batch_zero_does_not_swallow_it() {
        use crate::synth::{Generator, SynthSpec};
        let a = Analyzer::new(AnalyzerConfig::default());
        let mut g = Generator::new(SynthSpec::dp(2, 4));
        for (h, s) in g.initial_samples() {
            a.add_clock_sample(&h, s).unwrap();
        }
        let out = g.next_iteration();
        let (recv, mut first) = out
            .batches
            .iter()
            .find(|(_, b)| b.host == "node-1")
            .cloned()
            .expect("node-1's first batch");
        // Numbered as a live agent numbers it (the generator starts at 1).
        first.seq = 0;
        assert!(!first.collectives.is_empty());
        // The link went down before batch 0 left: on reconnection the
        // preamble (sequence 0, declarations only) arrives first.
        let preamble = Batch {
            exits: Vec::new(),
            collectives: Vec::new(),
            intervals: Vec::new(),
            links: Vec::new(),
            probes: Vec::new(),
            calls: Vec::new(),
            stacks: Vec::new(),
            ..first.clone()
        };
        let p = a.ingest(&preamble, recv);
        assert!(!p.duplicate_batch && p.batch_rejected.is_none(), "{p:?}");
        assert!(p.preamble);
        let real = a.ingest(&first, recv);
        assert!(
            !real.duplicate_batch,
            "the real batch 0 was dropped: {real:?}"
        );
        assert!(!real.preamble);
        assert!(real.accepted > preamble.ranks.len() as u64, "{real:?}");
        // Once batch 0 is in, a second copy of it is a resend; a preamble
        // still declares (a restarted life knows batch 0 from its journal).
        assert!(a.ingest(&first, recv).duplicate_batch);
        let again = a.ingest(&preamble, recv);
        assert!(again.preamble && !again.duplicate_batch, "{again:?}");
        assert_eq!(a.report().ingest.counters.missing_batches, 0);
    }
}
