//! `slowrank serve` as a library: the QUIC ingest feeding the [`Analyzer`],
//! ticks, alerts, hooks, `/metrics` and the report files, until shutdown.
//!
//! One task owns the loop: ingest events (batches, clock samples, agents
//! coming and going) are applied as they arrive; every `tick_every` the
//! analyzer reasons and verdict events become alert lines and hook calls;
//! every `write_every` (and at shutdown) the report files are replaced.
//! Hooks run on their own thread and `/metrics` on another, so neither can
//! stall ingest. The analyzer's CPU work (ingest, tick, rendering the
//! report) runs on the blocking pool, one call at a time and in arrival
//! order, so the async workers stay free for QUIC — clock probes measure
//! round trips, and a worker busy reasoning would skew them.

use std::{
    collections::BTreeMap,
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use chrono::Utc;
use slowrank_shared::wire::{Batch, Control, StackView};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{
    net::control::{coord_now_ns, ProbeSchedule},
    net::ingest::{Ack, Ingest, IngestError, IngestEvent, IngestStats},
    net::metrics_http::{HttpStats, MetricsError, MetricsServer},
    net::tls::Identity,
    report::alert::{self, HookConfig, HookStats, Hooks},
    report::outputs::{self, OutputError},
    report::{AgentReport, Report},
    verdict::stackstore::StackStore,
    verdict::EventKind,
    Analyzer, AnalyzerConfig, CoordNs, VerdictEvent,
};

mod calls;
mod deep;
mod files;

use calls::print_calls;

use files::{build_report, journal_marks, live_page, render_metrics, write_failures_metrics};

/// Most batches ingested in one hop to the blocking pool (bounds how long
/// a tick waits behind ingest).
const MAX_BATCHES_PER_RUN: usize = 256;

/// The report files being written in the background.
type Writer = tokio::task::JoinHandle<Result<(), OutputError>>;

/// A batch ready for the analyzer, with its pending answer.
type QueuedBatch = (String, Box<Batch>, Ack);

/// `first` and the batches already queued behind it (at most
/// [`MAX_BATCHES_PER_RUN`]), in order; an event of another kind ends the run
/// and is returned, to be handled after the batches that came before it.
fn take_run(
    first: IngestEvent,
    rx: &mut mpsc::Receiver<IngestEvent>,
) -> (Vec<QueuedBatch>, Option<IngestEvent>) {
    let mut run = Vec::new();
    let mut next = Some(first);
    while let Some(ev) = next.take() {
        match ev {
            IngestEvent::Batch {
                agent_id,
                batch,
                ack,
            } => {
                run.push((agent_id, batch, ack));
                if run.len() < MAX_BATCHES_PER_RUN {
                    next = rx.try_recv().ok();
                }
            }
            ev => return (run, Some(ev)),
        }
    }
    (run, None)
}

/// Decoded batches queued between the connections and the analyzer.
const MAX_QUEUED_BATCHES: usize = 512;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub token: String,
    /// Directory for report.json, report.txt, trace.json, timeline.json and
    /// report.html.
    pub out_dir: Option<PathBuf>,
    pub write_every: Duration,
    pub tick_every: Duration,
    pub hooks: HookConfig,
    pub metrics_listen: Option<SocketAddr>,
    /// Stop once every agent that connected has gone (and one did).
    pub exit_when_idle: bool,
    /// Print every raw probed call (generic `--probe` agents).
    pub print_calls: bool,
    /// Print alert lines on stdout.
    pub print_alerts: bool,
    /// Ask the suspect's agent for a deep-probe window of this many seconds
    /// when a verdict opens (0: never).
    pub deep_window_s: u32,
    /// The shortest job-wide window opened on a suspicion alone (no
    /// slowdown, no verdict yet): at least 10 steps, renewed while the
    /// suspicion lasts, up to `deep_window_s` ([`crate::verdict::deep_ask`]).
    pub suspicion_window_s: u32,
    /// Let a compute-slow suspect's deep window record launch sites too
    /// (its flame graph becomes the launch view). Off by default: every
    /// launch of the probed ranks then traps, which perturbs what is judged.
    pub launch_sites: bool,
    pub probes: ProbeSchedule,
    pub analyzer: AnalyzerConfig,
}

impl ServeConfig {
    pub fn new(listen: SocketAddr, token: impl Into<String>) -> Self {
        Self {
            listen,
            token: token.into(),
            out_dir: None,
            write_every: Duration::from_secs(3),
            tick_every: Duration::from_millis(100),
            hooks: HookConfig {
                webhook: None,
                exec: None,
                timeout: Duration::from_secs(5),
            },
            metrics_listen: None,
            exit_when_idle: false,
            print_calls: false,
            print_alerts: true,
            deep_window_s: 30,
            suspicion_window_s: 5,
            launch_sites: false,
            probes: ProbeSchedule::default(),
            analyzer: AnalyzerConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot start the QUIC ingest")]
    Ingest(#[from] IngestError),
    #[error("cannot start /metrics")]
    Metrics(#[from] MetricsError),
    #[error("cannot write the report files")]
    Output(#[from] OutputError),
    #[error("cannot read the listening address")]
    Addr(#[source] std::io::Error),
    #[error("cannot resume from the earlier coordinator's state in --out")]
    Resume(#[from] crate::resume::ResumeError),
}

/// What a finished serve did.
#[derive(Debug, Clone)]
pub struct ServeSummary {
    pub report: Report,
    pub events: Vec<VerdictEvent>,
    pub batches: u64,
    pub batches_rejected: u64,
    pub agents_refused: u64,
    pub clock_samples: u64,
}

/// A bound coordinator, ready to [`Server::run`].
pub struct Server {
    cfg: ServeConfig,
    ingest: Arc<Ingest>,
    analyzer: Arc<Analyzer>,
    hooks: Hooks,
    metrics: Option<MetricsServer>,
    agents: Arc<std::sync::Mutex<BTreeMap<String, AgentReport>>>,
    stacks: Arc<StackStore>,
    /// The HTML report last written (served live at `/`).
    page: Arc<std::sync::Mutex<Option<String>>>,
    /// Which job-wide deep windows to ask for, and when the last one ends.
    deep_ask: std::sync::Mutex<crate::verdict::deep_ask::DeepAsk>,
    /// What earlier lives left in `--out`, merged into every report.
    earlier: Arc<crate::resume::Earlier>,
    started: chrono::DateTime<Utc>,
    /// The ingest journal (with `--out`): appended before batches are acked.
    journal: Option<Arc<std::sync::Mutex<crate::resume::Journal>>>,
    /// Failed writes of the report files and of the journal.
    write_failures: Arc<WriteFailures>,
}

/// Failed writes to `--out` (a full or read-only disk): counted, logged,
/// and retried at the next write.
#[derive(Debug, Default)]
pub struct WriteFailures {
    pub outputs: std::sync::atomic::AtomicU64,
    pub journal: std::sync::atomic::AtomicU64,
}

/// Drops the agents that left longest ago until at most `max` remain
/// (connected ones are never dropped); returns how many went.
fn forget_gone_agents(agents: &mut BTreeMap<String, AgentReport>, max: usize) -> u64 {
    let mut forgot = 0;
    while agents.len() > max {
        let oldest = agents
            .values()
            .filter(|a| !a.connected)
            .min_by_key(|a| a.disconnected_at)
            .map(|a| a.agent_id.clone());
        let Some(id) = oldest else { break };
        agents.remove(&id);
        forgot += 1;
    }
    forgot
}

/// What an earlier coordinator left in `dir`, restored into `analyzer`
/// (verdict marks, the iteration period, clock models from the same boot),
/// and the journal reopened for this life.
fn resume(
    dir: &std::path::Path,
    analyzer: &Analyzer,
    started: chrono::DateTime<Utc>,
) -> Result<(crate::resume::Earlier, crate::resume::Journal), ServeError> {
    let e = crate::resume::load(dir)?;
    if e.report.is_some() || !e.marks.is_empty() {
        analyzer.resumed_life();
        let mut b = e.baselines.clone().unwrap_or_default();
        // An earlier life killed before its first warm step kept no
        // baselines, but its page series is the job's all the same.
        b.job_id = b
            .job_id
            .or_else(|| e.report.as_ref().and_then(|r| r.job.job_id.clone()));
        analyzer.carry_over(b, e.timeline.clone());
        info!(
            dir = %dir.display(),
            agents = e.marks.len(),
            verdicts = e.report.as_ref().map_or(0, |r| r.verdicts.len()),
            torn_lines = e.bad_lines,
            "resuming from an earlier coordinator's state"
        );
    }
    analyzer.restore_marks(e.marks.values());
    if let Some(p) = e.period {
        analyzer.restore_period(p);
    }
    let seeds = crate::resume::clock_seeds(&e, crate::resume::boot_id().as_deref());
    if !seeds.is_empty() {
        let n = analyzer.seed_clocks(&seeds, coord_now_ns());
        info!(
            hosts = n,
            "clock models seeded from the earlier coordinator's"
        );
    }
    let j = crate::resume::Journal::open(dir, &e, started)?;
    Ok((e, j))
}

/// Serves `/metrics` (and the live page at `/`) on `addr`.
#[allow(clippy::too_many_arguments)] // each shared handle the two routes read
fn start_metrics(
    addr: SocketAddr,
    analyzer: &Arc<Analyzer>,
    ingest: &Ingest,
    hooks: &Hooks,
    agents: &Arc<std::sync::Mutex<BTreeMap<String, AgentReport>>>,
    stacks: &Arc<StackStore>,
    write_failures: &Arc<WriteFailures>,
    page: &Arc<std::sync::Mutex<Option<String>>>,
) -> Result<MetricsServer, ServeError> {
    let (a, i, h, ag, st, wf) = (
        analyzer.clone(),
        ingest.stats(),
        hooks.stats(),
        agents.clone(),
        stacks.clone(),
        write_failures.clone(),
    );
    let (a2, i2, ag2, pg) = (
        analyzer.clone(),
        ingest.stats(),
        agents.clone(),
        page.clone(),
    );
    let http = Arc::new(HttpStats::default());
    let ht = http.clone();
    Ok(MetricsServer::start_with(
        addr,
        crate::net::metrics_http::Routes {
            metrics: Arc::new(move || {
                let mut s = render_metrics(&a, &i, &h, &ag, &st, &ht);
                write_failures_metrics(&mut s, &wf);
                s
            }),
            page: Some(Arc::new(move || live_page(&a2, &i2, &ag2, &pg))),
        },
        http,
    )?)
}

impl Server {
    /// Binds the QUIC socket (and `/metrics` when asked).
    pub fn bind(cfg: ServeConfig, identity: &Identity) -> Result<Self, ServeError> {
        let ingest = Arc::new(Ingest::bind_with(
            cfg.listen, identity, &cfg.token, cfg.probes,
        )?);
        let analyzer = Arc::new(Analyzer::new(cfg.analyzer.clone()));
        let started = Utc::now();
        let (earlier, journal) = match &cfg.out_dir {
            Some(dir) => {
                let (e, j) = resume(dir, &analyzer, started)?;
                (e, Some(Arc::new(std::sync::Mutex::new(j))))
            }
            None => (Default::default(), None),
        };
        let write_failures = Arc::new(WriteFailures::default());
        let hooks = Hooks::start(cfg.hooks.clone());
        let agents = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let page = Arc::new(std::sync::Mutex::new(None));
        let stacks = Arc::new(StackStore::default());
        let metrics = match cfg.metrics_listen {
            Some(addr) => Some(start_metrics(
                addr,
                &analyzer,
                &ingest,
                &hooks,
                &agents,
                &stacks,
                &write_failures,
                &page,
            )?),
            None => None,
        };
        let deep_ask = std::sync::Mutex::new(crate::verdict::deep_ask::DeepAsk::new(
            cfg.deep_window_s,
            cfg.suspicion_window_s,
        ));
        Ok(Self {
            cfg,
            ingest,
            analyzer,
            hooks,
            metrics,
            agents,
            stacks,
            page,
            deep_ask,
            earlier: Arc::new(earlier),
            started,
            journal,
            write_failures,
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.ingest.local_addr().map_err(ServeError::Addr)
    }

    /// Where the UDP clock port listens, if it is on.
    pub fn clock_port_addr(&self) -> Option<SocketAddr> {
        self.ingest.clock_port_addr()
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    pub fn analyzer(&self) -> Arc<Analyzer> {
        self.analyzer.clone()
    }

    pub fn ingest_stats(&self) -> Arc<IngestStats> {
        self.ingest.stats()
    }

    /// The analyzer's report plus what only `serve` knows (agents, transport
    /// rejections).
    pub fn report(&self) -> Report {
        let mut r = build_report(&self.analyzer, &self.ingest.stats(), &self.agents);
        self.earlier.merge_into(&mut r, self.started);
        r
    }

    /// `Analyzer::tick` on the blocking pool.
    async fn tick(&self) -> Vec<VerdictEvent> {
        let a = self.analyzer.clone();
        tokio::task::spawn_blocking(move || {
            let t0 = std::time::Instant::now();
            let events = a.tick(coord_now_ns() as CoordNs);
            debug!(target: "slowrank::timing", ms = t0.elapsed().as_secs_f64() * 1e3, "analyzer tick");
            events
        })
        .await
            .unwrap_or_else(|e| {
                warn!("analyzer tick failed: {e}");
                Vec::new()
            })
    }

    /// `Analyzer::ingest` of a run of batches on the blocking pool, in
    /// arrival order (awaited, so batches keep their order). One hop to the
    /// pool per run, not per batch: at 4,096 ranks agents send ≈ 5,000
    /// batches a second, and a thread hand-off each was a fifth of the
    /// coordinator's CPU.
    async fn ingest_batches(&self, run: Vec<QueuedBatch>) {
        if run.is_empty() {
            return;
        }
        if self.cfg.print_calls {
            for (_, b, _) in &run {
                print_calls(b);
            }
        }
        let a = self.analyzer.clone();
        let st = self.stacks.clone();
        let (journal, failures) = (self.journal.clone(), self.write_failures.clone());
        let recv_ns = coord_now_ns();
        let done = match tokio::task::spawn_blocking(move || {
            let t0 = std::time::Instant::now();
            let n = run.len();
            let done: Vec<_> = run.into_iter()
                .map(|(agent_id, batch, ack)| {
                    let sum = a.ingest(&batch, recv_ns);
                    // Stacks only from a batch the analyzer took.
                    if sum.batch_rejected.is_none() && !sum.duplicate_batch {
                        st.add(&batch, a.as_ref());
                    }
                    if sum.duplicate_batch {
                        // Host and size: the fault tests count a killed life's unlogged batches by it.
                        debug!(agent = %agent_id, host = %batch.host, seq = batch.seq,
                            collectives = batch.collectives.len(), "duplicate batch ignored");
                    }
                    (agent_id, batch, ack, sum)
                })
                .collect();
            debug!(target: "slowrank::timing", batches = n, ms = t0.elapsed().as_secs_f64() * 1e3, "batches ingested");
            // Journaled before the answers leave: a restarted coordinator
            // then knows these batches and ignores their resends.
            if let Some(j) = &journal {
                journal_marks(j, &done, &failures);
                if let (Some(p), Ok(mut j)) = (a.iteration_period(), j.lock()) {
                    if j.note_period(p).is_err() {
                        failures.journal.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // One line per batch, once journaled (the fault tests count on
            // it): logged first, a life killed in between had logged batches
            // the next one ingested again. Killed after the journal, the next
            // life logs the resend as a duplicate. A refused batch (not
            // re-sent) is never said to be ingested.
            for (agent_id, batch, _, sum) in &done {
                if let Some(why) = &sum.batch_rejected_why {
                    warn!(agent = %agent_id, host = %batch.host, seq = batch.seq,
                        collectives = batch.collectives.len(), "batch rejected: {why}");
                } else if !sum.duplicate_batch {
                    debug!(agent = %agent_id, host = %batch.host, seq = batch.seq,
                        collectives = batch.collectives.len(), accepted = sum.accepted,
                        "batch ingested");
                }
            }
            done
        })
        .await
        {
            Ok(x) => x,
            Err(e) => {
                // Unacknowledged: the agents keep these batches and resend.
                warn!("ingest task failed: {e}");
                return;
            }
        };
        for (agent_id, batch, ack, sum) in done {
            if sum.rejected > 0 {
                warn!(agent = %agent_id, seq = batch.seq, rejected = sum.rejected, accepted = sum.accepted,
                    "records rejected (reasons in report.json ingest.records_rejected)");
            }
            // Logged, journaled and in the analyzer: now the agent may drop it.
            ack.done();
            if let Ok(mut a) = self.agents.lock() {
                if let Some(a) = a.get_mut(&agent_id) {
                    a.batches += 1;
                }
            }
        }
    }

    fn alert(&self, events: Vec<VerdictEvent>, log: &mut Vec<VerdictEvent>) {
        let now = Utc::now();
        for e in events {
            if self.cfg.print_alerts {
                println!("{}", alert::format_line(&e, now));
            }
            if matches!(e.event, EventKind::Opened | EventKind::Reopened) {
                self.request_deep_window(&e);
            }
            self.hooks.send(&e);
            if log.len() < MAX_LOGGED_EVENTS {
                log.push(trim_for_log(e));
            }
        }
    }

    fn on_event(&self, ev: IngestEvent, clock_samples: &mut u64) -> Option<String> {
        match ev {
            IngestEvent::AgentUp {
                agent_id,
                host,
                connected_mono_ns,
            } => {
                self.agent_up(agent_id, host, connected_mono_ns);
                None
            }
            IngestEvent::Clock { host, sample, .. } => {
                *clock_samples += 1;
                if let Err(e) = self.analyzer.add_clock_sample(&host, sample) {
                    debug!(%host, "clock sample refused: {e}");
                }
                None
            }
            IngestEvent::Batch {
                agent_id,
                batch,
                ack,
            } => {
                // Normally taken by `run`; kept correct for any other caller.
                let sum = self.analyzer.ingest(&batch, coord_now_ns());
                debug!(agent = %agent_id, ?sum, "batch ingested inline");
                ack.done();
                None
            }
            IngestEvent::AgentDown { agent_id, reason } => {
                self.agent_down(&agent_id, reason);
                Some(agent_id)
            }
        }
    }

    /// An agent connected: the analyzer hears of it and the report lists
    /// it (forgetting the longest gone past the cap).
    fn agent_up(&self, agent_id: String, host: String, connected_mono_ns: u64) {
        info!(agent = %agent_id, %host, "agent up");
        self.analyzer.agent_connected(&agent_id, connected_mono_ns);
        self.analyzer.host_live(&host, true);
        if self.cfg.print_alerts {
            println!(
                "{} agent {agent_id} on {host} connected",
                Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
        }
        if let Ok(mut a) = self.agents.lock() {
            let e = a.entry(agent_id.clone()).or_insert_with(|| AgentReport {
                agent_id,
                host,
                connected: true,
                connected_at: Utc::now(),
                disconnected_at: None,
                reason: None,
                batches: 0,
                ranks_unobserved: Vec::new(),
            });
            e.connected = true;
            e.disconnected_at = None;
            e.reason = None;
            let forgot = forget_gone_agents(&mut a, crate::net::ingest::MAX_AGENTS_REMEMBERED);
            self.ingest
                .stats()
                .agents_forgotten
                .fetch_add(forgot, Ordering::Relaxed);
        }
    }

    /// An agent went away: said (with the ranks no longer observed, when
    /// no other agent on its host is left), and marked in the report.
    fn agent_down(&self, agent_id: &str, reason: String) {
        let host = self
            .agents
            .lock()
            .ok()
            .and_then(|a| a.get(agent_id).map(|a| a.host.clone()))
            .unwrap_or_default();
        let unobserved = self.unobserved_ranks(agent_id, &host);
        let line = format!(
            "{} agent {agent_id} on {host} went away ({reason}){}",
            Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            if unobserved.is_empty() {
                String::new()
            } else {
                format!("; ranks {:?} on {host} are no longer observed", unobserved)
            }
        );
        if unobserved.is_empty() {
            info!("{line}");
        } else {
            warn!("{line}");
        }
        if self.cfg.print_alerts {
            println!("{line}");
        }
        self.analyzer.host_live(&host, false);
        if let Ok(mut a) = self.agents.lock() {
            if let Some(a) = a.get_mut(agent_id) {
                a.connected = false;
                a.disconnected_at = Some(Utc::now());
                a.reason = Some(reason);
                a.ranks_unobserved = unobserved;
            }
        }
    }

    /// Ranks of `host` still running that nobody observes once `agent_id`
    /// has gone: none while another agent on the host is connected.
    fn unobserved_ranks(&self, agent_id: &str, host: &str) -> Vec<u32> {
        let still_connected = self
            .agents
            .lock()
            .map(|a| {
                a.values()
                    .any(|o| o.connected && o.host == host && o.agent_id != agent_id)
            })
            .unwrap_or(false);
        if still_connected {
            Vec::new()
        } else {
            self.analyzer
                .ranks()
                .into_iter()
                .filter(|r| r.host == host && r.exited_at.is_none())
                .map(|r| r.rank)
                .collect()
        }
    }

    fn connected(&self) -> usize {
        self.agents
            .lock()
            .map(|a| a.values().filter(|a| a.connected).count())
            .unwrap_or(0)
    }

    /// Serves until `shutdown` resolves, or — with `exit_when_idle` — every
    /// agent has gone; then writes the final outputs.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<ServeSummary, ServeError> {
        // Decoded batches waiting for the analyzer. Beyond this the
        // connections wait (and QUIC flow control holds the agents, whose
        // spools keep the data): a longer queue only bought memory, ≈ 0.5 GB
        // of queued batches in the 4,096-rank flood while the analyzer caught up.
        let (tx, mut rx) = mpsc::channel(MAX_QUEUED_BATCHES);
        let accept = {
            let ingest = self.ingest.clone();
            tokio::spawn(async move { ingest.run(tx).await })
        };
        let mut tick = tokio::time::interval(self.cfg.tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut write = tokio::time::interval(self.cfg.write_every);
        write.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut log = Vec::new();
        let mut clock_samples = 0u64;
        let mut seen_agent = false;
        let mut writer: Option<Writer> = None;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { break };
                    let (run, other) = take_run(ev, &mut rx);
                    self.ingest_batches(run).await;
                    let Some(ev) = other else { continue };
                    seen_agent |= matches!(ev, IngestEvent::AgentUp { .. });
                    let down = self.on_event(ev, &mut clock_samples).is_some();
                    if down && self.cfg.exit_when_idle && seen_agent && self.connected() == 0 {
                        info!("every agent has gone; finishing");
                        break;
                    }
                }
                _ = tick.tick() => {
                    let events = self.tick().await;
                    // A verdict opened or closed is on disk at once, not up to
                    // `write_every` later: a coordinator killed meanwhile
                    // would leave it out of the history the next life resumes.
                    if !events.is_empty() {
                        self.write_unless_writing(&mut writer).await;
                    }
                    self.alert(events, &mut log);
                    self.deep_window_on_slowdown();
                }
                _ = write.tick() => {
                    self.write_unless_writing(&mut writer).await;
                }
                _ = &mut shutdown => {
                    info!("shutting down");
                    break;
                }
            }
        }
        self.ingest.close();
        accept.abort();
        self.finish(rx, writer, log, clock_samples).await
    }

    /// Starts writing the report files unless a write is still going (one
    /// write at a time; a slow disk skips ticks, not batches); the finished
    /// one's failure is logged.
    async fn write_unless_writing(&self, writer: &mut Option<Writer>) {
        if writer.as_ref().is_none_or(|h| h.is_finished()) {
            if let Some(h) = writer.take() {
                if let Err(e) = Self::writer_result(h.await) {
                    warn!("writing the report files: {e}: {}", alert::source_chain(&e));
                }
            }
            *writer = self.spawn_write_outputs();
        }
    }

    /// After the loop: what was already received, the records held for a line-up (nothing more comes), a last tick, the final outputs, the hooks' last deliveries.
    async fn finish(
        self,
        mut rx: mpsc::Receiver<IngestEvent>,
        mut writer: Option<Writer>,
        mut log: Vec<VerdictEvent>,
        mut clock_samples: u64,
    ) -> Result<ServeSummary, ServeError> {
        let t0 = std::time::Instant::now();
        // What was already received still counts.
        while let Ok(ev) = rx.try_recv() {
            let (run, other) = take_run(ev, &mut rx);
            self.ingest_batches(run).await;
            if let Some(ev) = other {
                self.on_event(ev, &mut clock_samples);
            }
        }
        self.analyzer.end_of_input(coord_now_ns());
        let events = self.tick().await;
        self.alert(events, &mut log);
        // The periodic write may still be going; the final one replaces it.
        if let Some(h) = writer.take() {
            let _ = h.await;
        }
        self.write_outputs().await?;
        // A supervisor that kills the coordinator before this line leaves
        // the last periodic report, without the end of the input.
        info!(
            seconds = format!("{:.2}", t0.elapsed().as_secs_f64()),
            "final outputs written"
        );
        let report = self.report();
        let stats = self.ingest.stats();
        let summary = ServeSummary {
            report,
            events: log,
            batches: stats.batches_ok.load(Ordering::Relaxed),
            batches_rejected: stats.rejected_total(),
            agents_refused: stats.refused_agents.load(Ordering::Relaxed),
            clock_samples,
        };
        let Server { hooks, metrics, .. } = self;
        drop(metrics);
        // Hooks get their bounded time to deliver the last events.
        let _ = tokio::task::spawn_blocking(move || hooks.finish()).await;
        Ok(summary)
    }
}

/// Verdict events the serve summary keeps at most (the first ones). Every
/// event was kept, each hang with its full absent list (up to 4,096
/// members, ≈ 256 KiB): a token holder whose instances on thousands of
/// 4,096-rank communicators expired as hangs grew the coordinator by GiBs
/// (BENCHMARKS.md, 2026-11-27). 4,096 trimmed events are a few MiB.
pub const MAX_LOGGED_EVENTS: usize = 4_096;

/// `e` with a hang's lists cut to [`crate::join::HANG_LIST_MAX`] (its
/// summary still counts every absent member), as the summary keeps it.
fn trim_for_log(mut e: VerdictEvent) -> VerdictEvent {
    if let Some(h) = &mut e.hang {
        h.missing.truncate(crate::join::HANG_LIST_MAX);
        h.missing.shrink_to_fit();
        h.present_ranks.truncate(crate::join::HANG_LIST_MAX);
        h.present_ranks.shrink_to_fit();
    }
    e
}
